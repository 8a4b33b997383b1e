/// @file tile/partial_state.cuh
/// @brief The partial attention state of a warp (its online softmax over its own tiles of 16
///        query rows): its store from the accumulator fragments into shared memory, where the
///        CTA's warps are merged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"

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

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
