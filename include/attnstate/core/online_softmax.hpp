/// @file online_softmax.hpp
/// @brief The online-softmax accumulator that turns a stream of scores into an attention state.
#pragma once

#include <cmath>

#include "attnstate/core/config.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/merge_math.hpp"

namespace attnstate {
namespace math {

/// Running max and running sum of the online softmax, in base 2.
///
/// Scores enter pre-multiplied by `scale · log2(e)` (so `2^{s2} = e^{scale · q·k}`). For each
/// block of scores a producer calls `rescale(block_max)`, multiplies its output accumulator by
/// the returned factor, adds `prob(s2) · v` for every score, and `add(Σ prob)`. At the end,
/// `o = acc · inv_sum()` and `lse(base)` give the state. An accumulator that saw no score gives
/// the empty state `(0, -inf)`. NaN scores propagate.
struct OnlineSoftmax {
  float m = -INFINITY;  ///< Running max of the base-2 scores seen so far.
  float l = 0.f;        ///< Running Σ 2^{s2 - m}.

  /// Raises the running max to cover `block_max` and returns the factor by which every
  /// accumulator must be multiplied (1 when the max did not change, 0 when nothing was seen).
  ATTNSTATE_HOST_DEVICE float rescale(float block_max) {
    const float m_new = nan_max(m, block_max);
    if (m_new == -INFINITY) return 1.f;  // still nothing seen
    const float alpha = (m == -INFINITY) ? 0.f : exp_in(LseBase::kBase2, m - m_new);
    l *= alpha;
    m = m_new;
    return alpha;
  }
  /// `2^{s2 - m}`: the unnormalised probability of a score after `rescale` (0 for `-inf`).
  ATTNSTATE_HOST_DEVICE float prob(float s2) const {
    return s2 == -INFINITY ? 0.f : exp_in(LseBase::kBase2, s2 - m);
  }
  /// Adds the sum of a block's probabilities.
  ATTNSTATE_HOST_DEVICE void add(float p_sum) { l += p_sum; }

  /// Merges another partial accumulator (e.g. of another warp). Returns the factors for this
  /// accumulator's and the other's output sums: `acc = acc * f.first + other_acc * f.second`.
  struct Factors {
    float self;   ///< Factor for this accumulator's output sum.
    float other;  ///< Factor for the other's output sum.
  };
  /// @copydoc Factors
  ATTNSTATE_HOST_DEVICE Factors merge(const OnlineSoftmax& o) {
    const float m_new = nan_max(m, o.m);
    if (m_new == -INFINITY) return Factors{1.f, 0.f};
    const float fs = (m == -INFINITY) ? 0.f : exp_in(LseBase::kBase2, m - m_new);
    const float fo = (o.m == -INFINITY) ? 0.f : exp_in(LseBase::kBase2, o.m - m_new);
    l = l * fs + o.l * fo;
    m = m_new;
    return Factors{fs, fo};
  }

  /// True when no score was seen (the state is empty).
  ATTNSTATE_HOST_DEVICE bool empty() const { return l == 0.f && m == -INFINITY; }
  /// Factor that normalises the output sum (0 for the empty state).
  ATTNSTATE_HOST_DEVICE float inv_sum() const { return m == -INFINITY ? 0.f : 1.f / l; }
  /// The state's LSE in `base` (`-inf` for the empty state).
  ATTNSTATE_HOST_DEVICE float lse(LseBase base) const {
    if (m == -INFINITY) return -INFINITY;
    return convert_lse(m + log_in(LseBase::kBase2, l), LseBase::kBase2, base);
  }
};

/// Multiplier that turns a raw score `q·k` into the base-2 score the accumulator takes.
ATTNSTATE_HOST_DEVICE float base2_score_scale(float softmax_scale) {
  return softmax_scale * constants::kLog2e;
}

}  // namespace math
}  // namespace attnstate
