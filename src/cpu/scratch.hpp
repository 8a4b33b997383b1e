/// @file scratch.hpp
/// @brief Scratch buffers of the CPU backend, sized from (checked) arguments: the size is
///        overflow-checked and a failed allocation is an `attnstate::Error`, never
///        `std::bad_alloc` or a wrapped size (internal).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <new>
#include <string>
#include <vector>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"

namespace attnstate {
namespace cpu {
namespace detail {

/// A zero-filled fp32 buffer of the product of `extents` elements for the call `func`.
/// @throws Error (`kResourceExhausted`) when the product passes `kMaxSize` bytes or the host
///         cannot allocate it.
inline std::vector<float> scratch_floats(const char* func,
                                         std::initializer_list<std::int64_t> extents) {
  std::int64_t n = checked_product(extents.begin(), static_cast<int>(extents.size()));
  std::int64_t bytes = 0;
  if (n < 0 || !checked_mul(n, 4, &bytes))
    throw Error(Status::kResourceExhausted,
                std::string(func) + ": a scratch buffer of more than 2^62 bytes");
  try {
    return std::vector<float>(static_cast<std::size_t>(n));
  } catch (const std::bad_alloc&) {
    throw Error(Status::kResourceExhausted, std::string(func) + ": could not allocate " +
                                                std::to_string(bytes) + " bytes of scratch");
  }
}

}  // namespace detail
}  // namespace cpu
}  // namespace attnstate
