/// @file kernels/decode/tile_step.cuh
/// @brief One K/V tile of a decode mainloop (internal): a warp's 16 keys in a ring stage of
///        shared memory, `S = Q Kᵀ`, the scores policy and `O += P V` on tensor cores
///        (`tile::attention_tile`). Shared by the split and the streamed kernel, inlined there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"
#include "cuda/kernels/decode/params.cuh"
#include "cuda/tile/attention_tile.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// The tile of keys from `t0` in the ring stage at shared-memory address `ks` (K, then V: 16
/// rows of D 16-bit elements each, XOR-swizzled), with the query fragments of `q_frag`, the
/// lanes' ldmatrix rows and chunk XORs (`tile::LdmatrixLanes`), the rows' key ends `lim` and,
/// when `kVariant`, the variant's `scores` (else plain scores of `s2_scale`), into the warp's
/// accumulator `o_acc` and softmax state `os`. (References, as the kernels' code used the values
/// in place: so the machine code stays the same.)
template <int D, bool kBF16, bool kVariant, class QFrag, class Scores>
__device__ __forceinline__ void decode_tile(QFrag& q_frag, const std::uint32_t& ks,
                                            const int& a_row, const int& b_row,
                                            const std::uint32_t& a_x, const std::uint32_t& b_x,
                                            const int& t0, const int (&lim)[2],
                                            const float& s2_scale, math::OnlineSoftmax (&os)[2],
                                            float (&o_acc)[D / 8][4], const Scores& scores) {
  constexpr std::uint32_t kTileBytes = kDecodeTileRows * D * 2;
  const std::uint32_t k_lane = ks + static_cast<std::uint32_t>(b_row * D * 2);
  const std::uint32_t v_lane = ks + kTileBytes + static_cast<std::uint32_t>(a_row * D * 2);
  if constexpr (kVariant)
    tile::attention_tile<D, kBF16>(q_frag, k_lane, v_lane, a_x, b_x, t0, lim, s2_scale, os, o_acc,
                                   scores);
  else
    tile::attention_tile<D, kBF16>(q_frag, k_lane, v_lane, a_x, b_x, t0, lim, s2_scale, os, o_acc);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
