/// @file tile/partial_state.cuh
/// @brief The partial attention state of a warp (its online softmax over its own tiles of 16
///        query rows): its store from the accumulator fragments into shared memory, where the
///        CTA's warps are merged, and that merge (`merge_warp_columns`).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/tile/split_merge.cuh"

namespace attnstate {
namespace cuda {
namespace tile {

/// Stores warp `warp`'s state of 16 rows (`o_acc`: its m16n8k16 accumulator fragments of D / 8
/// n-tiles, unnormalised; `os`: rows lane/4 and lane/4 + 8, row sums already reduced over the
/// quad) into shared memory: `ow` [warp][16 rows][kOw floats], `mw` / `lw` [warp][16 rows]
/// (running max and sum).
template <int D, int kOw>
__device__ __forceinline__ void store_warp_state(float* ow, float* mw, float* lw, int warp,
                                                 int lane, const float (&o_acc)[D / 8][4],
                                                 const math::OnlineSoftmax (&os)[2]) {
  constexpr int kRows = 16;
  float* mine = ow + warp * kRows * kOw;
  const int r = lane >> 2;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    const int d = j * 8 + 2 * (lane & 3);
    *reinterpret_cast<float2*>(mine + r * kOw + d) = make_float2(o_acc[j][0], o_acc[j][1]);
    *reinterpret_cast<float2*>(mine + (r + 8) * kOw + d) = make_float2(o_acc[j][2], o_acc[j][3]);
  }
  if ((lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mw[warp * kRows + r + 8 * h] = os[h].m;
      lw[warp * kRows + r + 8 * h] = os[h].l;
    }
  }
}

/// Sums each row's softmax sum (`os[h].l`, rows lane/4 and lane/4 + 8) over the quad of lanes
/// that hold the row's columns.
__device__ __forceinline__ void quad_reduce_row_sums(math::OnlineSoftmax (&os)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = os[h].l;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    os[h].l = l;
  }
}

/// Merges the `kWarps` warps' states stored by `store_warp_state` for four columns (from
/// `4 · d4`) of row `r`, in warp order: the max of the warps' maxes, each warp's factor
/// `2^(m_w − m)` (0 for an empty warp), the sum of the factored sums, then the factored columns.
template <int kWarps, int kOw>
__device__ __forceinline__ MergedColumns merge_warp_columns(const float* ow, const float* mw,
                                                            const float* lw, int r, int d4) {
  constexpr int kRows = 16;
  float m = math::neg_inf();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m = math::nan_max(m, mw[w * kRows + r]);
  float f[kWarps];
  float sum = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float mwv = mw[w * kRows + r];
    f[w] = math::is_empty_lse(mwv) ? 0.f : math::merge_weight(LseBase::kBase2, mwv, m);
    sum += f[w] * lw[w * kRows + r];
  }
  const math::MergeResult res = math::merge_finalize(LseBase::kBase2, m, sum);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (!math::is_empty_lse(mw[w * kRows + r])) {
      const float4 x = *reinterpret_cast<const float4*>(ow + (w * kRows + r) * kOw + 4 * d4);
      acc.x += f[w] * x.x;
      acc.y += f[w] * x.y;
      acc.z += f[w] * x.z;
      acc.w += f[w] * x.w;
    }
  }
  MergedColumns mc;
  mc.o = make_float4(acc.x * res.inv_sum, acc.y * res.inv_sum, acc.z * res.inv_sum,
                     acc.w * res.inv_sum);
  mc.lse = res.lse;
  return mc;
}

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
