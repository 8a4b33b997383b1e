/// @file merge_math.hpp
/// @brief The numerics core: the ⊕ merge of attention states, the empty state, rebase and the
///        online-softmax accumulator, as `ATTNSTATE_HOST_DEVICE` functions. Every backend and
///        every kernel of the library computes through these functions.
///
/// Contract (see the numerics section of the docs):
/// - merges use the max-subtracted form `m = max lse_i`, `w_i = exp_b(lse_i - m)`,
///   `o = Σ w_i o_i / Σ w_i`, `lse = m + log_b Σ w_i`; an LSE is never exponentiated directly;
/// - the empty state is `(o = 0, lse = -inf)`; an empty input's `o` is never read as a factor,
///   so garbage or NaN there contributes nothing; all-empty input gives `(0, -inf)`;
/// - NaN in a non-empty input (in `lse` or `o`) propagates to the output;
/// - `lse = +inf` is invalid input: any merge that includes it gives NaN (never hidden), also
///   when every other input is empty; so does a NaN `lse`;
/// - all arithmetic is fp32.
#pragma once

#include <cmath>
#include <cstdint>

#include "attnstate/core/config.hpp"
#include "attnstate/core/lse_base.hpp"

namespace attnstate {
namespace math {

/// -inf as a float (the LSE of the empty state).
ATTNSTATE_HOST_DEVICE float neg_inf() { return -INFINITY; }

/// True for the LSE of an empty state.
ATTNSTATE_HOST_DEVICE bool is_empty_lse(float lse) { return lse == -INFINITY; }

/// `b^x` for the base `b` of an LSE (exp or exp2).
ATTNSTATE_HOST_DEVICE float exp_in(LseBase base, float x) {
#if ATTNSTATE_DEVICE_PASS
  return base == LseBase::kBase2 ? exp2f(x) : expf(x);
#else
  return base == LseBase::kBase2 ? std::exp2(x) : std::exp(x);
#endif
}

/// `log_b(x)` for the base `b` of an LSE.
ATTNSTATE_HOST_DEVICE float log_in(LseBase base, float x) {
#if ATTNSTATE_DEVICE_PASS
  return base == LseBase::kBase2 ? log2f(x) : logf(x);
#else
  return base == LseBase::kBase2 ? std::log2(x) : std::log(x);
#endif
}

/// Converts an LSE from base `from` to base `to` (exact identity when the bases agree;
/// ±inf and NaN are preserved).
ATTNSTATE_HOST_DEVICE float convert_lse(float lse, LseBase from, LseBase to) {
  if (from == to) return lse;
  return from == LseBase::kNatural ? lse * constants::kLog2e : lse * constants::kLn2;
}

/// NaN-propagating maximum: if either argument is NaN the result is NaN.
ATTNSTATE_HOST_DEVICE float nan_max(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

/// Running reduction of an n-ary merge: feed the LSEs (all in one base) to find `m`, then the
/// weights, then finalize. Callers skip an input's `o` when `weight()` reports it empty.
///
/// Usage, for inputs `(o_i, lse_i)` in base `base`:
/// @code
///   float m = math::neg_inf();
///   for (i) m = math::nan_max(m, lse_i);
///   float sum = 0; acc[:] = 0;
///   for (i) if (!math::is_empty_lse(lse_i)) { float w = math::merge_weight(base, lse_i, m);
///                                             sum += w; acc[:] += w * o_i[:]; }
///   math::MergeResult r = math::merge_finalize(base, m, sum);   // o = acc * r.inv_sum
/// @endcode
struct MergeResult {
  float lse;      ///< The merged LSE in the working base (`-inf` if every input was empty).
  float inv_sum;  ///< Factor that turns the weighted sum into `o` (0 if every input was empty).
};

/// Weight `b^(lse - m)` of one non-empty input; `m` is the max over all inputs' LSEs.
ATTNSTATE_HOST_DEVICE float merge_weight(LseBase base, float lse, float m) {
  return exp_in(base, lse - m);
}

/// Turns the max `m` and the weight sum into the merged LSE and the normalising factor.
ATTNSTATE_HOST_DEVICE MergeResult merge_finalize(LseBase base, float m, float sum) {
  if (m == -INFINITY) return MergeResult{-INFINITY, 0.f};  // all inputs empty
  if (m == INFINITY) return MergeResult{NAN, NAN};         // invalid input: +inf LSE
  return MergeResult{m + log_in(base, sum), 1.f / sum};
}

/// Normalised weights of a pairwise merge `a ⊕ b` and the merged LSE, all in one base.
struct PairWeights {
  float wa;      ///< Weight of `o_a` (0 and never applied when `a` is empty).
  float wb;      ///< Weight of `o_b` (0 and never applied when `b` is empty).
  float lse;     ///< The merged LSE.
  bool a_empty;  ///< `a` contributes nothing; do not read `o_a`.
  bool b_empty;  ///< `b` contributes nothing; do not read `o_b`.
};

/// Weights of the pairwise merge of two states whose LSEs are in the same base.
/// When one side is empty the other passes through exactly (weight 1, LSE unchanged), unless
/// its LSE is NaN or +inf: then, as in the n-ary merge, the weights and the LSE are NaN and
/// neither side is marked empty (so the combined value is NaN).
ATTNSTATE_HOST_DEVICE PairWeights pair_weights(LseBase base, float lse_a, float lse_b) {
  PairWeights p;
  p.a_empty = lse_a == -INFINITY;
  p.b_empty = lse_b == -INFINITY;
  if (p.a_empty || p.b_empty) {
    p.wa = p.a_empty ? 0.f : 1.f;
    p.wb = p.a_empty && !p.b_empty ? 1.f : 0.f;
    p.lse = p.a_empty ? lse_b : lse_a;
    if (p.lse != p.lse || p.lse == INFINITY) {  // invalid input: both sides weighted by NaN
      p.a_empty = p.b_empty = false;
      p.wa = p.wb = p.lse = NAN;
    }
    return p;
  }
  const float m = nan_max(lse_a, lse_b);
  if (m == INFINITY) {  // invalid input: +inf LSE
    p.wa = p.wb = p.lse = NAN;
    return p;
  }
  const float ea = exp_in(base, lse_a - m);
  const float eb = exp_in(base, lse_b - m);
  const float sum = ea + eb;
  const float inv = 1.f / sum;
  p.wa = ea * inv;
  p.wb = eb * inv;
  p.lse = m + log_in(base, sum);
  return p;
}

/// Applies pair weights to one element pair. Reads neither side's value as a factor when that
/// side is empty; both empty gives 0.
ATTNSTATE_HOST_DEVICE float pair_combine(const PairWeights& p, float oa, float ob) {
  if (p.b_empty) return p.a_empty ? 0.f : oa;
  if (p.a_empty) return ob;
  return p.wa * oa + p.wb * ob;
}

/// The merged LSE of `n` states and the weight that takes one of them, `self`, to its share of
/// the merged `o` (`o_merged = Σ_i weight_i · o_i`): the rescale step of a context-parallel
/// merge that sums the rescaled outputs of the ranks (`CpAlgorithm::kAllGatherLse`).
struct RescaleResult {
  float lse;     ///< The merged LSE (`-inf` when every state is empty).
  float weight;  ///< `base^(lse_self − lse)`; 0 when `self` is empty (its `o` is never a factor).
};

/// The merged LSE of the `n` LSEs `lses[i · stride]` (one base) and the weight of `lse_self`
/// (one of them) in it, in the max-subtracted form of `merge_weight` / `merge_finalize`. A NaN
/// or `+inf` among the LSEs makes both NaN.
ATTNSTATE_HOST_DEVICE RescaleResult rescale_weight(LseBase base, const float* lses, std::int64_t n,
                                                   std::int64_t stride, float lse_self) {
  float m = neg_inf();
  for (std::int64_t i = 0; i < n; ++i) m = nan_max(m, lses[i * stride]);
  float sum = 0.f;
  for (std::int64_t i = 0; i < n; ++i) {
    const float l = lses[i * stride];
    if (!is_empty_lse(l)) sum += merge_weight(base, l, m);
  }
  const MergeResult r = merge_finalize(base, m, sum);
  if (r.lse != r.lse) return RescaleResult{r.lse, r.lse};
  const float w = is_empty_lse(lse_self) ? 0.f : merge_weight(base, lse_self, m) * r.inv_sum;
  return RescaleResult{r.lse, w};
}

}  // namespace math
}  // namespace attnstate
