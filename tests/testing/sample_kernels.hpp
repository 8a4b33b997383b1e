/// @file sample_kernels.hpp
/// @brief Small attention kernels written the way a user would, one correct and three with
///        classic defects, used to check that the testing kit tells them apart.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "attnstate/core/online_softmax.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/problem.hpp"

namespace attnstate_test {

using attnstate::LseBase;
using attnstate::testing::AttentionProblem;
using attnstate::testing::HostState;

/// The defect a sample kernel carries.
enum class Defect {
  kNone,                  ///< Correct: max-subtracted, empty set gives (0, -inf), LSE in the
                          ///< requested base.
  kNoMaxSubtraction,      ///< Exponentiates raw scores: overflows for scores above ~88.
  kEmptyZeroOverZero,     ///< Normalises an empty key set by 0/0 (NaN in o).
  kBase2DeclaredNatural,  ///< Always computes a base-2 LSE but declares the requested base.
};

/// A direct fp32 implementation of attention over `keys` with the given defect.
inline HostState sample_kernel(const AttentionProblem& p, const std::vector<std::int64_t>& keys,
                               Defect defect) {
  HostState out = attnstate::testing::make_output_state(p);
  const std::int64_t dim = p.head_dim();
  std::vector<float> s(keys.size());
  std::vector<float> acc(static_cast<std::size_t>(dim));
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    for (std::int64_t h = 0; h < p.heads_q(); ++h) {
      const std::int64_t g = h / p.group_size();
      float m = -INFINITY;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        float dot = 0.f;
        for (std::int64_t d = 0; d < dim; ++d) {
          dot += p.q.get((t * p.heads_q() + h) * dim + d) *
                 p.k.get((keys[i] * p.heads_kv() + g) * dim + d);
        }
        s[i] = dot * p.scale;
        m = std::fmax(m, s[i]);
      }
      if (defect == Defect::kNoMaxSubtraction) m = 0.f;
      float sum = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const float w = std::exp(s[i] - m);
        sum += w;
        for (std::int64_t d = 0; d < dim; ++d) {
          acc[static_cast<std::size_t>(d)] += w * p.v.get((keys[i] * p.heads_kv() + g) * dim + d);
        }
      }
      const bool empty = keys.empty();
      for (std::int64_t d = 0; d < dim; ++d) {
        float o = acc[static_cast<std::size_t>(d)] / sum;  // 0/0 when empty
        if (empty && defect != Defect::kEmptyZeroOverZero) o = 0.f;
        out.set_o(t, h, d, o);
      }
      float lse_natural = empty ? -INFINITY : m + std::log(sum);
      float lse =
          p.base == LseBase::kBase2 ? lse_natural * attnstate::constants::kLog2e : lse_natural;
      if (defect == Defect::kBase2DeclaredNatural) lse = lse_natural * attnstate::constants::kLog2e;
      out.set_lse(t, h, lse);
    }
  }
  return out;
}

}  // namespace attnstate_test
