/// @file kernels/cascade/merge.cuh
/// @brief The cascade merge kernel: folds the partial states of every level and split of a query
///        row (fp32 workspace, base-2 LSEs) with the max-subtracted merge and writes the output
///        state in its dtype and base, with the attention sinks merged in last when
///        there are any. One warp per (request, new token, query head). It may be
///        a programmatic dependent launch: it waits for the previous kernel before any read.
#pragma once

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/merge_math.hpp"
#include "catalog/kernel_shapes.hpp"
#include "cuda/arch/grid_dependency.cuh"
#include "cuda/tile/split_merge.cuh"
#include "cuda/tile/warp_reduce.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Arguments of the merge launch.
struct CascadeMergeParams {
  const float* ws_o;            ///< Partial outputs `(slots, rows, D)`.
  const float* ws_lse;          ///< Partial base-2 LSEs `(slots, rows)`.
  std::int64_t rows;            ///< `batch · q_len · heads_q`.
  int num_slots;                ///< Partial states per row.
  int heads_q;                  ///< Query heads (row = token · heads_q + head).
  void* out_o;                  ///< Output `o`, of the output dtype.
  float* out_lse;               ///< Output LSE.
  std::int64_t o_stride_token;  ///< Output strides (elements).
  std::int64_t o_stride_head;
  std::int64_t lse_stride_token;
  std::int64_t lse_stride_head;
  LseBase base;  ///< Output base.
  /// Attention sinks: `heads_q` natural-base logits, each row merged once with `(0, sinks[h])`
  /// after its slots; null = none.
  const float* sinks;
};

/// Rows per CTA of the merge (one warp each).
using catalog::kCascadeMergeWarps;

template <int D, class TOut>
__global__ void __launch_bounds__(32 * kCascadeMergeWarps)
    cascade_merge_kernel(const CascadeMergeParams p) {
  static_assert(D % 32 == 0, "whole columns per lane");
  constexpr int kPer = D / 32;  // elements per lane
  constexpr int kUnroll = 8;    // partial states whose loads are in flight together
  const int lane = threadIdx.x & 31;
  // a programmatic dependent launch: the partial states come from the kernels before (a no-op
  // after an ordinary launch)
  arch::wait_on_dependent_grids();
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kCascadeMergeWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  // m = max of the LSEs: lanes read the slots in parallel, then a butterfly reduction
  float m = math::neg_inf();
  for (int s = lane; s < p.num_slots; s += 32) m = math::nan_max(m, p.ws_lse[s * p.rows + row]);
  m = tile::butterfly_reduce<16, 1>(m, math::nan_max);

  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.f;
  float sum = 0.f;  // this lane's share of the weight sum
  for (int base = 0; base < p.num_slots; base += 32) {
    // lane k holds the LSE and weight of slot base + k
    const int s_lane = base + lane;
    const float lse_lane = s_lane < p.num_slots ? p.ws_lse[s_lane * p.rows + row] : math::neg_inf();
    const bool empty_lane = math::is_empty_lse(lse_lane);
    const float w_lane = empty_lane ? 0.f : math::merge_weight(LseBase::kBase2, lse_lane, m);
    sum += w_lane;
    const int n = min(32, p.num_slots - base);
    for (int k0 = 0; k0 < n; k0 += kUnroll) {
      float v[kUnroll][kPer];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // loads first (an empty state's o may be garbage)
        const int s = base + min(k0 + u, n - 1);
        const float* src = p.ws_o + (s * p.rows + row) * D + lane * kPer;
        if constexpr (kPer == 4) {
          const float4 x = *reinterpret_cast<const float4*>(src);
          v[u][0] = x.x;
          v[u][1] = x.y;
          v[u][2] = x.z;
          v[u][3] = x.w;
        } else {
#pragma unroll
          for (int i = 0; i < kPer; ++i) v[u][i] = src[i];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int k = k0 + u;
        const float w = __shfl_sync(0xffffffffu, w_lane, k & 31);
        const bool empty = __shfl_sync(0xffffffffu, empty_lane ? 1 : 0, k & 31) != 0;
        if (k < n && !empty) {  // never read an empty state's o as a factor
#pragma unroll
          for (int i = 0; i < kPer; ++i) acc[i] += w * v[u][i];
        }
      }
    }
  }
  sum = tile::butterfly_reduce<16, 1>(sum, [](float a, float b) { return a + b; });
  const math::MergeResult r = math::merge_finalize(LseBase::kBase2, m, sum);
  const std::int64_t token = row / p.heads_q, head = row % p.heads_q;
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] *= r.inv_sum;
  float lse = r.lse;
  if (p.sinks != nullptr) lse = tile::merge_sink(acc, lse, p.sinks[head]);
  TOut* dst =
      static_cast<TOut*>(p.out_o) + token * p.o_stride_token + head * p.o_stride_head + lane * kPer;
#pragma unroll
  for (int i = 0; i < kPer; ++i) dst[i] = from_float<TOut>(acc[i]);
  if (lane == 0)
    p.out_lse[token * p.lse_stride_token + head * p.lse_stride_head] =
        math::convert_lse(lse, LseBase::kBase2, p.base);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
