/// @file dispatch.hpp
/// @brief The one dispatch from runtime values to template instances: a runtime head dim (or row
///        tile) or dtype becomes a compile-time constant of a compile-time list, and a generic
///        callable runs with it. Host-only; every family's launcher (merges, decode, cascade)
///        calls it with a list of `common/compiled.hpp`.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"

namespace attnstate {
namespace compiled {

/// A compile-time list of integers (head dims, row tiles).
template <int... V>
using IntList = std::integer_sequence<int, V...>;

/// A compile-time list of dtypes.
template <DType... T>
struct DTypeList {};

/// The storage type of a dtype (float, half_t, bfloat16_t, float8_e4m3_t or float8_e5m2_t).
template <DType T>
using StorageOf = std::conditional_t<
    T == DType::kF16, half_t,
    std::conditional_t<
        T == DType::kBF16, bfloat16_t,
        std::conditional_t<T == DType::kE4M3, float8_e4m3_t,
                           std::conditional_t<T == DType::kE5M2, float8_e5m2_t, float>>>>;

/// True when `v` is in the list.
template <int... V>
constexpr bool contains(IntList<V...>, std::int64_t v) {
  return ((v == V) || ...);
}
/// True when `v` is in the list.
template <DType... T>
constexpr bool contains(DTypeList<T...>, DType v) {
  return ((v == T) || ...);
}

/// "a, b or c" of `items` ("none" when empty).
inline std::string or_list(std::initializer_list<std::string> items) {
  std::string s;
  std::size_t i = 0;
  for (const std::string& item : items) {
    s += std::string(i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + item;
    ++i;
  }
  return items.size() == 0 ? "none" : s;
}

/// The list's entries as "64, 128 or 256" (the `expected` of the errors).
template <int... V>
std::string list_string(IntList<V...>) {
  return or_list({std::to_string(V)...});
}
/// The list's entries as "f16 or bf16".
template <DType... T>
std::string list_string(DTypeList<T...>) {
  return or_list({std::string(to_string(T))...});
}

/// Calls `f(std::integral_constant<int, V>{})` for the entry `V == value` of the list; throws
/// `Status::kNotSupported` naming `fn` and `name`, the list and `value` when none is.
template <int... V, class F>
void dispatch(const char* fn, const char* name, std::int64_t value, IntList<V...> list, F&& f) {
  const bool found = ((value == V ? (f(std::integral_constant<int, V>{}), true) : false) || ...);
  if (!found)
    attnstate::detail::throw_argument(fn, name, list_string(list), std::to_string(value),
                                      Status::kNotSupported);
}

/// Calls `f(std::integral_constant<DType, T>{})` for the entry `T == value` of the list; throws
/// like the integer `dispatch`.
template <DType... T, class F>
void dispatch(const char* fn, const char* name, DType value, DTypeList<T...> list, F&& f) {
  const bool found = ((value == T ? (f(std::integral_constant<DType, T>{}), true) : false) || ...);
  if (!found)
    attnstate::detail::throw_argument(fn, name, list_string(list), to_string(value),
                                      Status::kNotSupported);
}

/// `dispatch` of a dtype calling `f(StorageOf<T>{})`.
template <class List, class F>
void dispatch_storage(const char* fn, const char* name, DType value, List list, F&& f) {
  dispatch(fn, name, value, list, [&](auto t) { f(StorageOf<decltype(t)::value>{}); });
}

}  // namespace compiled
}  // namespace attnstate
