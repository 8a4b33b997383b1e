/// @file tile/softmax_step.cuh
/// @brief The fragment-level online-softmax step of a warp's 16 query rows (m16n8k16 C
///        fragments: rows lane/4 and lane/4 + 8), built on the core accumulator
///        (`math::OnlineSoftmax`) with an exp/max policy, and the rows' causal key limits.
#pragma once

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/variant.hpp"
#include "cuda/arch/special.cuh"

namespace attnstate {
namespace cuda {
namespace tile {

/// The exp/max policy of the online softmax: the core's base-2 accumulator (`State`: rescale,
/// prob and add exponentiate in base 2) and its NaN-propagating max for the block maxima.
struct Base2NanMax {
  using State = math::OnlineSoftmax;
  __device__ static __forceinline__ float max(float a, float b) { return math::nan_max(a, b); }
};

/// As `Base2NanMax`, the block maxima in one instruction each (`arch::max_nan`, no branch): the
/// value of `math::nan_max` but for the sign of a zero max, which no exponential, rescale or LSE
/// computed from it tells apart (`2^(s - m)` and `m + log2 l` are the same for `m = ±0`).
struct Base2MaxNanInsn {
  using State = math::OnlineSoftmax;
  __device__ static __forceinline__ float max(float a, float b) { return arch::max_nan(a, b); }
};

/// `math::OnlineSoftmax::rescale` without branches (the wgmma consumers' flat statistics): the
/// row's running max raised to cover `block_max` (`max.NaN`), the returned factor
/// `2^{m_old - m_new}` on `ex2.approx.ftz` (1 while nothing was seen, 0 from an empty row, NaN
/// once the max is NaN) applied to the row's sum, and in `neg_m` the exponent offset of its
/// probabilities `2^{s + neg_m}` (`-m_new`; 0 for a row still at -inf, whose scores are all -inf).
__device__ __forceinline__ float flat_rescale(math::OnlineSoftmax& os, float block_max,
                                              float& neg_m) {
  const float m_old = os.m;
  const float m_new = arch::max_nan(m_old, block_max);
  const bool none = m_new == math::neg_inf();
  const float alpha = none ? 1.f : arch::ex2_approx_ftz(m_old - m_new);
  os.l *= alpha;
  os.m = m_new;
  neg_m = none ? 0.f : -m_new;
  return alpha;
}

/// The block maxima of the rows of a thread's m16 accumulator fragment (`kN` keys: n-tile j,
/// word q of row q / 2) into `bm`: `fmaxf` trees over the thread's keys (a NaN score is left out,
/// but its probability is NaN: the row ends NaN), then `max.NaN` over the quad.
template <int kN>
__device__ __forceinline__ void flat_block_max(const float (&s)[kN / 8][4], float (&bm)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m[4] = {math::neg_inf(), math::neg_inf(), math::neg_inf(), math::neg_inf()};
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) m[(j & 1) * 2 + e] = fmaxf(m[(j & 1) * 2 + e], s[j][2 * h + e]);
    bm[h] = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) bm[h] = arch::max_nan(bm[h], __shfl_xor_sync(0xffffffffu, bm[h], 1));
#pragma unroll
  for (int h = 0; h < 2; ++h) bm[h] = arch::max_nan(bm[h], __shfl_xor_sync(0xffffffffu, bm[h], 2));
}

/// The probabilities of the same fragment in place (`ex2.approx.ftz`: -inf gives 0) and their
/// sums added to the rows' statistics: `2^{fma(s, sc, neg_m)}` of raw scores with `kScale`, else
/// `2^{s + neg_m}` of scores already scaled to base 2 (`sc` unused); `neg_m` from `flat_rescale`.
template <int kN, bool kScale>
__device__ __forceinline__ void flat_probs(float (&s)[kN / 8][4], math::OnlineSoftmax (&os)[2],
                                           const float (&neg_m)[2], float sc) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float ps[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = s[j][2 * h + e];
        v = arch::ex2_approx_ftz(kScale ? fmaf(v, sc, neg_m[h]) : v + neg_m[h]);
        ps[e] += v;
      }
    os[h].add(ps[0] + ps[1]);
  }
}

/// Exclusive key limits of this thread's rows lane/4 and lane/4 + 8 of a tile whose first row
/// is query row `row0` (`rows` valid rows): a query token (`p.group` rows each, `p.q_len`
/// tokens) sees the keys up to its own position at the end of the `len` keys, and none at or
/// past `end`. `p` is read where the values are used (as the kernels' own code did).
template <class P>
__device__ __forceinline__ void causal_row_limits(const P& p, int lane, int rows, int row0, int len,
                                                  int end, int (&lim)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = (lane >> 2) + 8 * h;
    if (r < rows) {
      const int qi = (row0 + r) / p.group;
      const int e = len - p.q_len + qi + 1;
      lim[h] = min(end, e);
    } else {
      lim[h] = 0;
    }
  }
}

/// Plain scores: the base-2 score of a dot product is the dot times `s2_scale`.
struct PlainScores {
  __device__ __forceinline__ float operator()(float dot, float s2_scale, int, int) const {
    return dot * s2_scale;
  }
};

/// Scores of an attention variant (core/variant.hpp): the soft cap on the scaled score,
/// `cap · tanh(dot · scale / cap)` in base 2 as `math::ScoreMap` defines it, and each row's
/// sliding-window start `lo[h]` (keys before it masked), rows lane/4 (h = 0) and lane/4 + 8
/// (h = 1).
struct VariantScores {
  float s2_scale = 0.f;  ///< `scale · log2 e` (no cap).
  float cap_in = 0.f;    ///< `2 log2 e · scale / cap`.
  float cap_out = 0.f;   ///< `cap · log2 e`; 0: no cap.
  int lo[2];
  /// Rows lane/4 + 8 exist (false: the warp skips their scores, which are masked anyway).
  bool hi_rows = true;

  /// The scores of softmax scale `scale` and soft cap `cap` (0: none).
  __device__ __forceinline__ void set_map(float scale, float cap) {
    s2_scale = math::base2_score_scale(scale);
    if (cap != 0.f) {
      cap_in = 2.f * constants::kLog2e * (scale / cap);
      cap_out = cap * constants::kLog2e;
    }
  }
  /// The capped base-2 score of `dot` (`cap_out` ≠ 0): with `x = dot · scale / cap`,
  /// `(cap · log2 e) · tanh(x) = cap_out − 2 cap_out / (1 + 2^(2x log2 e))`, one FMUL, two
  /// special-function operations (`ex2.approx`, `rcp.approx`), one FADD and one FFMA: absolute
  /// error within a few `cap · 2^-22`; ±`cap_out` for large |x| (the reciprocal of +inf is 0),
  /// NaN stays NaN.
  __device__ __forceinline__ float capped(float dot) const {
    const float r = arch::rcp_approx_ftz(1.f + arch::ex2_approx_ftz(dot * cap_in));
    return fmaf(-2.f * cap_out, r, cap_out);
  }
  __device__ __forceinline__ float operator()(float dot, float, int t, int h) const {
    if ((h == 1 && !hi_rows) || t < lo[h]) return math::neg_inf();
    return cap_out == 0.f ? dot * s2_scale : capped(dot);
  }
};

/// The first half of an online-softmax step (`online_softmax_runs`) for row `h` of this thread
/// (lane/4 + 8 h): scores `s` of the block (`NK` keys in runs of `kRunKeys` from `t0`) scaled by
/// `scale` (base 2) through `scores`, keys at or past `lim[h]` masked, in place; returns the
/// row's block max reduced over the quad (`Policy::max`).
template <int NK, int kRunKeys, class Policy, class Scores>
__device__ __forceinline__ float softmax_block_max(float (&s)[NK / 8][4], const int (&lim)[2],
                                                   const int (&t0)[NK / kRunKeys], float scale,
                                                   int lane, const Scores& scores, int h) {
  static_assert(kRunKeys % 8 == 0 && NK % kRunKeys == 0, "runs of whole n-tiles");
  constexpr int kRunTiles = kRunKeys / 8;
  float bm = math::neg_inf();
#pragma unroll
  for (int j = 0; j < NK / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = t0[j / kRunTiles] + (j % kRunTiles) * 8 + 2 * (lane & 3) + e;
      float v = scores(s[j][2 * h + e], scale, t, h);
      if (t >= lim[h]) v = math::neg_inf();
      s[j][2 * h + e] = v;
      bm = Policy::max(bm, v);
    }
  }
  bm = Policy::max(bm, __shfl_xor_sync(0xffffffffu, bm, 1));
  bm = Policy::max(bm, __shfl_xor_sync(0xffffffffu, bm, 2));
  return bm;
}

/// The second half of an online-softmax step for row `h`: the row's running max raised to cover
/// its block max `bm`, the row's accumulator `acc` (D / 8 n-tiles) rescaled when any row of the
/// warp's max moved, the unnormalised probabilities of the masked scores `s` into `pr`, their
/// sum added to the state.
template <int NK, int D, class Policy>
__device__ __forceinline__ void softmax_block_probs(float (&s)[NK / 8][4], float (&pr)[NK / 8][4],
                                                    float (&acc)[D / 8][4],
                                                    typename Policy::State (&os)[2], float bm,
                                                    int h) {
  const float alpha = os[h].rescale(bm);
  // Multiplying by 1 is the identity: skip the rescale when no row of the warp's max moved
  // (the common case after the first tiles), bitwise the same result.
  if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      acc[j][2 * h] *= alpha;
      acc[j][2 * h + 1] *= alpha;
    }
  }
  float psum = 0.f;
#pragma unroll
  for (int j = 0; j < NK / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float pv = os[h].prob(s[j][2 * h + e]);
      pr[j][2 * h + e] = pv;
      psum += pv;
    }
  }
  os[h].add(psum);
}

/// One online-softmax step over a score block of `NK` keys made of runs of `kRunKeys`
/// consecutive keys (`s`: the raw scores `q·k`, two columns per n-tile of 8 keys; n-tile `n`
/// holds key `t0[n / (kRunKeys / 8)] + 8 (n % (kRunKeys / 8)) + 2(lane % 4) + e`): scales them
/// by `scale` (base 2), masks keys at or past `lim[h]`, raises each row's running max (the block
/// max reduced over the quad), rescales the rows' accumulator `acc` (D / 8 n-tiles) when any row
/// of the warp's max moved, and leaves the unnormalised probabilities in `pr`, their sum added to
/// the state. `lane`: this thread's lane (the caller's, so that it is computed once). The block
/// maxima go through `Policy::max`; the exponentials are the state's (`rescale`, `prob`).
/// `scores` maps a dot product to its base-2 score (`PlainScores`: times `scale`;
/// `VariantScores`).
template <int NK, int D, int kRunKeys, class Policy = Base2NanMax, class Scores = PlainScores>
__device__ __forceinline__ void online_softmax_runs(float (&s)[NK / 8][4], float (&pr)[NK / 8][4],
                                                    float (&acc)[D / 8][4],
                                                    typename Policy::State (&os)[2],
                                                    const int (&lim)[2],
                                                    const int (&t0)[NK / kRunKeys], float scale,
                                                    int lane, const Scores& scores = Scores()) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float bm =
        softmax_block_max<NK, kRunKeys, Policy, Scores>(s, lim, t0, scale, lane, scores, h);
    softmax_block_probs<NK, D, Policy>(s, pr, acc, os, bm, h);
  }
}

/// `online_softmax_runs` over `NK` consecutive keys from `t0`.
template <int NK, int D, class Policy = Base2NanMax, class Scores = PlainScores>
__device__ __forceinline__ void online_softmax_step(float (&s)[NK / 8][4], float (&pr)[NK / 8][4],
                                                    float (&acc)[D / 8][4],
                                                    typename Policy::State (&os)[2],
                                                    const int (&lim)[2], int t0, float scale,
                                                    int lane, const Scores& scores = Scores()) {
  const int t0s[1] = {t0};
  online_softmax_runs<NK, D, NK, Policy, Scores>(s, pr, acc, os, lim, t0s, scale, lane, scores);
}

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
