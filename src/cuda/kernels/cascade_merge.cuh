/// @file cascade_merge.cuh
/// @brief The cascade merge kernel: folds the partial states of every level and split of a query
///        row (fp32 workspace, base-2 LSEs) with the max-subtracted merge and writes the output
///        state in its dtype and base. One warp per (request, new token, query head).
#pragma once

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/merge_math.hpp"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Arguments of the merge launch.
struct CascadeMergeParams {
  const float* ws_o;             ///< Partial outputs `(slots, rows, D)`.
  const float* ws_lse;           ///< Partial base-2 LSEs `(slots, rows)`.
  std::int64_t rows;             ///< `batch · q_len · heads_q`.
  int num_slots;                 ///< Partial states per row.
  int heads_q;                   ///< Query heads (row = token · heads_q + head).
  void* out_o;                   ///< Output `o`, of the output dtype.
  float* out_lse;                ///< Output LSE.
  std::int64_t o_stride_token;   ///< Output strides (elements).
  std::int64_t o_stride_head;
  std::int64_t lse_stride_token;
  std::int64_t lse_stride_head;
  LseBase base;                  ///< Output base.
};

/// Rows per CTA of the merge (one warp each).
constexpr int kCascadeMergeWarps = 4;

template <int D, class TOut>
__global__ void __launch_bounds__(32 * kCascadeMergeWarps)
    cascade_merge_kernel(const CascadeMergeParams p) {
  constexpr int kPer = D / 32;  // elements per lane
  const int lane = threadIdx.x & 31;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kCascadeMergeWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  float m = math::neg_inf();
  for (int s = 0; s < p.num_slots; ++s) m = math::nan_max(m, p.ws_lse[s * p.rows + row]);
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.f;
  float sum = 0.f;
  for (int s = 0; s < p.num_slots; ++s) {
    const float lse = p.ws_lse[s * p.rows + row];
    if (math::is_empty_lse(lse)) continue;  // an empty state's o is never read
    const float w = math::merge_weight(LseBase::kBase2, lse, m);
    sum += w;
    const float* src = p.ws_o + (s * p.rows + row) * D + lane * kPer;
    if constexpr (kPer == 4) {
      const float4 v = *reinterpret_cast<const float4*>(src);
      acc[0] += w * v.x;
      acc[1] += w * v.y;
      acc[2] += w * v.z;
      acc[3] += w * v.w;
    } else {
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] += w * src[i];
    }
  }
  const math::MergeResult r = math::merge_finalize(LseBase::kBase2, m, sum);
  const std::int64_t token = row / p.heads_q, head = row % p.heads_q;
  TOut* dst = static_cast<TOut*>(p.out_o) + token * p.o_stride_token + head * p.o_stride_head +
              lane * kPer;
#pragma unroll
  for (int i = 0; i < kPer; ++i) dst[i] = from_float<TOut>(acc[i] * r.inv_sum);
  if (lane == 0)
    p.out_lse[token * p.lse_stride_token + head * p.lse_stride_head] =
        math::convert_lse(r.lse, LseBase::kBase2, p.base);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
