/// @file sink_reference.hpp
/// @brief Test support: attention sinks applied to a double reference state, as the definition
///        says (the merge of each row with the sink state `(0, s_h)`, in double precision).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "attnstate/testing/reference.hpp"

namespace attnstate_test {

/// Merges every row `(t, h)` of `ref` with `(0, sinks[h])` (natural-base logits): the LSE
/// becomes `log(e^lse + e^s)` and `o` (and its magnitudes) is scaled by `e^lse / (e^lse + e^s)`;
/// an empty row becomes `(0, s)`, a NaN row stays NaN. Keeps `ref.base`.
inline void apply_sinks(attnstate::testing::ReferenceState& ref, const std::vector<float>& sinks) {
  const double to_nat = ref.base == attnstate::LseBase::kBase2 ? std::log(2.0) : 1.0;
  for (std::int64_t t = 0; t < ref.tokens; ++t)
    for (std::int64_t h = 0; h < ref.heads; ++h) {
      const std::size_t row = static_cast<std::size_t>(t * ref.heads + h);
      const double lse = ref.lse[row] * to_nat;
      const double s = sinks[static_cast<std::size_t>(h)];
      double merged = 0, factor = 0;
      if (std::isnan(lse)) {
        merged = factor = std::numeric_limits<double>::quiet_NaN();
      } else if (lse == -std::numeric_limits<double>::infinity()) {
        merged = s;
      } else {
        const double m = std::max(lse, s);
        merged = m + std::log(std::exp(lse - m) + std::exp(s - m));
        factor = std::exp(lse - merged);
      }
      ref.lse[row] = merged / to_nat;
      for (std::int64_t d = 0; d < ref.head_dim; ++d) {
        const std::size_t i = row * static_cast<std::size_t>(ref.head_dim) + d;
        ref.o[i] = std::isnan(factor) ? factor : ref.o[i] * factor;
        if (ref.has_o_magnitude()) ref.o_magnitude[i] *= std::isnan(factor) ? 1.0 : factor;
      }
    }
}

/// `heads` random sink logits, uniform in `[lo, hi]` (a wide range: some heads' sinks dominate
/// their rows, some barely count).
inline std::vector<float> random_sinks(std::int64_t heads, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> s(static_cast<std::size_t>(heads));
  for (float& x : s) x = u(rng);
  return s;
}

}  // namespace attnstate_test
