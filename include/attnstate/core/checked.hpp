/// @file checked.hpp
/// @brief Overflow-checked size arithmetic: every size, span or byte count computed from caller
///        values goes through these before it is used.
///
/// The operands are the non-negative 64-bit extents, strides and counts of the public API. A
/// result is valid only when it stays at or below `kMaxSize` (2^62): sizes in elements or bytes
/// then fit in `std::int64_t` with room for one further addition, and pointer offsets derived
/// from them cannot wrap. A negative operand or a result past `kMaxSize` is reported as failure
/// (`false`, or -1 for the span helpers); nothing here can overflow itself.
#pragma once

#include <cstdint>

#include "attnstate/core/config.hpp"

namespace attnstate {

/// The largest size (in elements or bytes) any computation of the library accepts: 2^62.
inline constexpr std::int64_t kMaxSize = std::int64_t{1} << 62;

/// `*r = a + b` when both are in `[0, kMaxSize]` and so is the sum; otherwise false.
ATTNSTATE_HOST_DEVICE constexpr bool checked_add(std::int64_t a, std::int64_t b, std::int64_t* r) {
  if (a < 0 || b < 0 || a > kMaxSize || b > kMaxSize - a) return false;
  *r = a + b;
  return true;
}

/// `*r = a * b` when both are non-negative and the product is at most `kMaxSize`; otherwise false.
ATTNSTATE_HOST_DEVICE constexpr bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t* r) {
  if (a < 0 || b < 0) return false;
  if (a != 0 && b > kMaxSize / a) return false;
  *r = a * b;
  return true;
}

/// `*r = a * b + c` for non-negative operands when every step stays at most `kMaxSize`.
ATTNSTATE_HOST_DEVICE constexpr bool checked_mul_add(std::int64_t a, std::int64_t b, std::int64_t c,
                                                     std::int64_t* r) {
  std::int64_t p = 0;
  return checked_mul(a, b, &p) && checked_add(p, c, r);
}

/// The product of `n` extents, or -1 when one is negative or the product passes `kMaxSize`.
ATTNSTATE_HOST_DEVICE constexpr std::int64_t checked_product(const std::int64_t* extents, int n) {
  std::int64_t p = 1;
  for (int i = 0; i < n; ++i)
    if (!checked_mul(p, extents[i], &p)) return -1;
  return p;
}

/// Elements spanned by `n` items `stride` apart, each an `inner`-element block:
/// `(n - 1) * stride + inner` (0 when `n <= 0`), or -1 on overflow or a negative operand.
ATTNSTATE_HOST_DEVICE constexpr std::int64_t checked_span(std::int64_t n, std::int64_t stride,
                                                          std::int64_t inner) {
  if (n <= 0) return 0;
  std::int64_t r = 0;
  return checked_mul_add(n - 1, stride, inner, &r) ? r : -1;
}

}  // namespace attnstate
