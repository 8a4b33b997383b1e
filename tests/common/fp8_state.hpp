/// @file fp8_state.hpp
/// @brief Helpers of the fp8 merge tests (CPU and GPU): host states of any dtype with an `o`
///        scale, random fills of real values, the double-precision merge over the stored
///        (dequantised) values, and the comparison with the fp8 rounding tolerance.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace fp8_test {

/// Every dtype of `o`.
inline const std::vector<DType>& every_dtype() {
  static const std::vector<DType> v = {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3,
                                       DType::kE5M2};
  return v;
}

/// The real value of element `i` of `p` (dtype `dt`, fp8 scale `scale`), in double.
inline double real_value(const void* p, DType dt, float scale, std::int64_t i) {
  return dispatch_dtype_with_fp8(dt, [&](auto tag) -> double {
    using T = decltype(tag);
    const double x = to_float(static_cast<const T*>(p)[i]);
    return kIsFp8<T> ? static_cast<double>(static_cast<float>(x) * scale) : x;
  });
}

/// Stores the real value `x` as element `i` of `p` (an fp8 `o` holds `x / scale`, rounded).
inline void store_real(void* p, DType dt, float scale, std::int64_t i, float x) {
  dispatch_dtype_with_fp8(dt, [&](auto tag) {
    using T = decltype(tag);
    static_cast<T*>(p)[i] = from_float<T>(kIsFp8<T> ? x / scale : x);
  });
}

/// A contiguous host state `(tokens, heads, head_dim)` of any dtype, with its `o` scale.
struct HostState {
  StateLayout layout;
  std::vector<std::uint8_t> o;
  std::vector<float> lse;

  HostState(std::int64_t tokens, std::int64_t heads, std::int64_t dim, DType dt, LseBase base,
            float scale = 1.f) {
    const StateView v = make_state_view(nullptr, dt, nullptr, tokens, heads, dim, base);
    layout = v;
    layout.o_scale = is_fp8(dt) ? scale : 1.f;
    o.assign(
        static_cast<std::size_t>(std::max<std::int64_t>(1, tokens * heads * dim)) * size_of(dt),
        0xFF);  // NaN in every dtype
    lse.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, tokens * heads)), NAN);
  }
  StateView view() {
    StateView v;
    static_cast<StateLayout&>(v) = layout;
    v.o = o.data();
    v.lse = lse.data();
    return v;
  }
  std::int64_t rows() const { return layout.tokens * layout.heads; }
  std::int64_t dim() const { return layout.head_dim; }
  double value(std::int64_t row, std::int64_t d) const {
    return real_value(o.data(), layout.dtype, layout.o_scale, row * dim() + d);
  }
  void set(std::int64_t row, std::int64_t d, float x) {
    store_real(o.data(), layout.dtype, layout.o_scale, row * dim() + d, x);
  }
  std::uint8_t byte(std::int64_t i) const { return o[static_cast<std::size_t>(i)]; }
  /// Real values of `o` uniform in `[-amp, amp)`, LSEs in `[-6, 6)`, each row empty with
  /// probability `p_empty` (its `o` then NaN, never to be read).
  void fill(std::mt19937_64& gen, float amp, double p_empty = 0.15) {
    std::uniform_real_distribution<float> u(-1.f, 1.f), l(-6.f, 6.f);
    std::bernoulli_distribution empty(p_empty);
    for (std::int64_t r = 0; r < rows(); ++r) {
      const bool e = empty(gen);
      lse[r] = e ? -INFINITY : l(gen);
      for (std::int64_t d = 0; d < dim(); ++d) set(r, d, e ? NAN : amp * u(gen));
    }
  }
};

/// The exact merge of `n` inputs of one row `(lse_i natural, o_i real)`, in double: all-empty
/// gives `(0, -inf)`, a NaN or `+inf` LSE a NaN row.
inline void reference_row(const std::vector<double>& lse, const std::vector<const double*>& o,
                          std::int64_t dim, double* out_o, double* out_lse) {
  double m = -INFINITY;
  bool nan = false;
  for (double l : lse) {
    nan = nan || std::isnan(l) || l == INFINITY;
    if (!std::isnan(l)) m = std::max(m, l);
  }
  if (nan) {
    std::fill(out_o, out_o + dim, NAN);
    *out_lse = NAN;
    return;
  }
  std::fill(out_o, out_o + dim, 0.0);
  if (m == -INFINITY) {
    *out_lse = -INFINITY;
    return;
  }
  double sum = 0;
  for (std::size_t i = 0; i < lse.size(); ++i) {
    if (lse[i] == -INFINITY) continue;
    const double w = std::exp(lse[i] - m);
    sum += w;
    for (std::int64_t d = 0; d < dim; ++d) out_o[d] += w * o[i][d];
  }
  for (std::int64_t d = 0; d < dim; ++d) out_o[d] /= sum;
  *out_lse = m + std::log(sum);
}

/// Natural-log value of a stored LSE.
inline double natural(float lse, LseBase base) {
  return base == LseBase::kBase2 ? static_cast<double>(lse) * 0.69314718055994530942 : lse;
}

/// Tolerance of one rounding to the dtype `dt` of scale `scale`: `rel · |e| + abs`. For fp8,
/// half an ulp: `2^-4` relative for e4m3 (3 mantissa bits), `2^-3` for e5m2 (2 bits), and below
/// the normals half the subnormal step times the scale (`2^-10 · scale`, `2^-17 · scale`). For
/// the other dtypes the half ulp of the format. An fp32 slack (`1e-5` of the magnitude `mag` of
/// the inputs) covers the fp32 weights and sums before the rounding.
struct RoundingTolerance {
  double rel;
  double abs;
};
inline RoundingTolerance rounding_tolerance(DType dt, float scale, double mag) {
  const double slack = 1e-5 * mag;
  switch (dt) {
    case DType::kE4M3:
      return {0.0625, std::ldexp(1.0, -10) * scale + slack};
    case DType::kE5M2:
      return {0.125, std::ldexp(1.0, -17) * scale + slack};
    case DType::kF16:
      return {std::ldexp(1.0, -11), std::ldexp(1.0, -25) + slack};
    case DType::kBF16:
      return {std::ldexp(1.0, -8), slack};
    default:
      return {0.0, slack};
  }
}

/// Largest finite real value an output of dtype `dt` and scale `scale` holds.
inline double max_finite(DType dt, float scale) {
  switch (dt) {
    case DType::kE4M3:
      return 448.0 * scale;
    case DType::kE5M2:
      return 57344.0 * scale;
    case DType::kF16:
      return 65504.0;
    default:
      return 3.4e38;
  }
}

}  // namespace fp8_test
}  // namespace attnstate
