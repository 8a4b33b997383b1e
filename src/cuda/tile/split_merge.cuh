/// @file tile/split_merge.cuh
/// @brief The merge of split states, four output columns of a query row at a time, in split
///        order with the core max-subtracted merge: `split_merge` over states read through
///        accessors (the decode reads its cluster peers' distributed shared memory) and
///        `split_finalize`.
///
/// The merge takes the max over all the splits' LSEs (base 2), then adds `w = 2^(lse − m)` to the
/// weight sum and `w · o` to the columns in split order, then `split_finalize`. The decode's
/// workspace merge runs the same operations with each row's weights computed once; the sequence
/// of floating-point operations per output element is the same, so every path gives bitwise the
/// same result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/merge_math.hpp"

namespace attnstate {
namespace cuda {
namespace tile {

/// Merged columns of one row: `o` normalised, `lse` in base 2.
struct MergedColumns {
  float4 o;
  float lse;
};

/// The merged state from the max and the weighted sums.
__device__ __forceinline__ MergedColumns split_finalize(float m, float sum, float4 acc) {
  const math::MergeResult r = math::merge_finalize(LseBase::kBase2, m, sum);
  MergedColumns out;
  out.o = make_float4(acc.x * r.inv_sum, acc.y * r.inv_sum, acc.z * r.inv_sum, acc.w * r.inv_sum);
  out.lse = r.lse;
  return out;
}

/// Merges splits `[0, n)`, `1 ≤ n ≤ N`, whose base-2 LSEs are `lse_at(i)` and four normalised
/// columns `o_at(i)`: every split's LSE and the columns of the first `B` splits are requested at
/// once (one round trip when `n ≤ B`, further batches of `B` columns after), then the max, then in
/// split order `w = 2^(lse − m)`, `sum += w`, `acc += w · o` over the non-empty splits (an empty
/// split's columns are loaded but never used).
template <int N, int B, class LseAt, class OAt>
__device__ __forceinline__ MergedColumns split_merge(int n, LseAt&& lse_at, OAt&& o_at) {
  static_assert(N % B == 0, "whole batches");
  float l[N];
  float4 v[B];
#pragma unroll
  for (int u = 0; u < N; ++u) l[u] = lse_at(u < n ? u : n - 1);
#pragma unroll
  for (int u = 0; u < B; ++u) v[u] = o_at(u < n ? u : n - 1);
  float m = math::neg_inf();
#pragma unroll
  for (int u = 0; u < N; ++u)
    if (u < n) m = math::nan_max(m, l[u]);
  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int u0 = 0; u0 < N; u0 += B) {
    if (u0 >= n) break;
    if (u0 > 0) {
#pragma unroll
      for (int u = 0; u < B; ++u) v[u] = o_at(u0 + u < n ? u0 + u : n - 1);
    }
#pragma unroll
    for (int u = 0; u < B; ++u) {
      if (u0 + u < n && !math::is_empty_lse(l[u0 + u])) {
        const float w = math::merge_weight(LseBase::kBase2, l[u0 + u], m);
        sum += w;
        acc.x += w * v[u].x;
        acc.y += w * v[u].y;
        acc.z += w * v[u].z;
        acc.w += w * v[u].w;
      }
    }
  }
  return split_finalize(m, sum, acc);
}

/// Merges a row's normalised state (elements `x` of its `o`, base-2 `lse`) with its head's sink
/// state `(0, sink)`, `sink` a natural-base logit (an attention sink: mass in the softmax
/// denominator, no value): scales `x` by the row's share `e^lse / (e^lse + e^sink)` and returns
/// the merged base-2 LSE; an empty row becomes `(0, sink)`. The core pairwise merge
/// (`math::pair_weights`), so a NaN on either side gives NaN.
template <int N>
__device__ __forceinline__ float merge_sink(float (&x)[N], float lse, float sink) {
  const math::PairWeights w = math::pair_weights(
      LseBase::kBase2, lse, math::convert_lse(sink, LseBase::kNatural, LseBase::kBase2));
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = math::pair_combine(w, x[i], 0.f);
  return w.lse;
}

/// `merge_sink` of merged columns.
__device__ __forceinline__ MergedColumns merge_sink(MergedColumns mc, float sink) {
  float x[4] = {mc.o.x, mc.o.y, mc.o.z, mc.o.w};
  mc.lse = merge_sink(x, mc.lse, sink);
  mc.o = make_float4(x[0], x[1], x[2], x[3]);
  return mc;
}

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
