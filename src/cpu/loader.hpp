/// @file loader.hpp
/// @brief Loading stored f32/f16/bf16 elements as fp32 in the CPU backend (internal).
#pragma once

#include <cstdint>
#include <vector>

#include "attnstate/core/dtype.hpp"

namespace attnstate {
namespace cpu {
namespace detail {

/// `to_float` of all 65536 f16 bit patterns, tabulated once.
inline const float* half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (std::uint32_t u = 0; u < 65536; ++u)
      t[u] = to_float(half_t{static_cast<std::uint16_t>(u)});
    return t;
  }();
  return table.data();
}

/// Loads a stored element as fp32 through `to_float`. For f16 the results of `to_float` are
/// looked up in `half_table()`: bit-identical, and much faster than converting each element
/// with the portable bit manipulation, which does not vectorise.
template <class T>
struct Loader {
  /// The element as fp32.
  float operator()(T x) const { return to_float(x); }
};

/// @copydoc Loader
template <>
struct Loader<half_t> {
  const float* table = half_table();  ///< `to_float` of every f16 bit pattern.
  /// The element as fp32.
  float operator()(half_t x) const { return table[x.bits]; }
};

}  // namespace detail
}  // namespace cpu
}  // namespace attnstate
