/// @file kernels/mla/ws_balanced.cuh
/// @brief The consumer warpgroups of the balanced wgmma MLA decode kernel (internal): each of the
///        two computes the scores of half of every 64-key tile (warpgroup `wg`: keys `32 wg ..`,
///        `S = Q Kᵀ` over the 576 columns in 36 k-steps of `wgmma` m64n32k16, both operands in
///        shared memory), the two exchange their rows' block maxima through shared memory so
///        that both raise every row's running max alike (the online softmax stays exact: the
///        same max, the same rescale factors in both; each keeps the sum of its own keys'
///        probabilities, added in the epilogue), each publishes its probabilities (bf16) in the
///        buffer of the wgmma kernel and reads the other's half back (`ldmatrix`), then each adds
///        `P V` of all 64 keys over its 256 output columns (m64n256k16, P from registers). As in
///        the wgmma kernel, each tile's `P V` completes and its stage is released before the
///        next tile's scores. Part of `mla_decode_ws_balanced_kernel`, inlined there.
///
/// Per tile, two named barriers of both warpgroups: the block maxima written (`kMlaWsBarMax`),
/// the probabilities written (`kMlaWsBarP`). Each buffer's next write comes after the other
/// barrier, which the reader reaches only once it has read: no barrier for "read".
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/arch/wgmma.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/kernels/mla/ws_consumer.cuh"
#include "cuda/kernels/mla/ws_ring.cuh"
#include "cuda/tile/cascade_level_block.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// Named barriers of the balanced kernel's consumers (both warpgroups): the rows' block maxima
/// written, the probabilities written (the wgmma kernel's ids; the epilogue's is its own).
constexpr int kMlaWsBarMax = kMlaWsBarPEmpty;
constexpr int kMlaWsBarP = kMlaWsBarPFull;
/// Keys of a tile whose scores one warpgroup computes.
constexpr int kMlaWsHalfKeys = kMlaWsTileKeys / 2;

/// The rows' block maxima `[warpgroup][64 rows]` (fp32): the wgmma kernel's tail
/// (`MlaWsSmem::tail`).
static_assert(kMlaWsCarveBytes + 2 * kMlaTileRows * 4 <= catalog::mla_ws_balanced_smem_bytes(),
              "the maxima's buffer within the catalog's shared memory");

/// A consumer warpgroup of the balanced kernel (warp `w.wl` of warpgroup `w.wg`): the split's
/// `n_tiles` (> 0) tiles from `begin`: the scores of its half of each, the online softmax of its
/// rows (their key limits: `tile::causal_row_limits`) into `os` (the running max of all the
/// tile's keys; the sum of its own keys' probabilities), the probabilities exchanged, `P V` over
/// its columns.
template <int kKv>
__device__ __forceinline__ void mla_ws_balanced_loop(const MlaParams& p, MlaWsWarp& w, int begin,
                                                     int n_tiles, math::OnlineSoftmax (&os)[2]) {
  constexpr bool kFp8 = kKv != tile::kKvSame;
  constexpr int kHalf = kMlaWsHalfKeys;
  constexpr int kN = kHalf / 8;
  static_assert(kHalf / 16 == 2, "a warpgroup's own probabilities are two k-steps of P V");
  const int lane = w.lane;
  int lim[2];  // exclusive key ends of this thread's rows, counted from `begin`
  mla_ws_row_limits(p, w.wl, lane, begin, lim);
  // the K scales of the parts (fp8; read once: a pointed-to scale is read on the device)
  const float ckv_k = kFp8 ? p.ckv_scale.at(0) : 1.f;
  const float kpe_k = kFp8 && p.kpe_fp8 ? p.kpe_scale.at(0) : 1.f;
  float sn[kN][4], sp[kN][4];  // (the softmax leaves the probabilities in sn)
  float al[2] = {1.f, 1.f};    // the rows' factors of the last softmax step
  const int r0 = 16 * w.wl + (lane >> 2);
  const int key0 = kHalf * w.wg;  // the warpgroup's keys in a tile
  float* const red = w.sm.tail();
  // the softmax of tile t (scores in sn, sp): each row's block max over both halves (through
  // `red`: both warpgroups read both in the same order, so that their maxima are the same bits),
  // the probabilities in sn, the factors in al
  const auto softmax = [&](int t) {
    if constexpr (kFp8) mla_ws_join_parts<kHalf>(sn, sp, ckv_k, kpe_k);
    float bm[2];
    mla_ws_flat_max<kHalf>(sn, lim, t * kMlaWsTileKeys + key0, p.s2_scale, lane, bm);
    if ((lane & 3) == 0) {
      red[kMlaTileRows * w.wg + r0] = bm[0];
      red[kMlaTileRows * w.wg + r0 + 8] = bm[1];
    }
    arch::named_sync(kMlaWsBarMax, 2 * 128);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      bm[h] = arch::max_nan(red[r0 + 8 * h], red[kMlaTileRows + r0 + 8 * h]);
    mla_ws_flat_probs<kHalf>(sn, os, bm, al);
  };
  // this warpgroup's probabilities into pf[0..1] and the buffer, the other's from the buffer
  // into pf[2..3]
  const std::uint32_t store_base =
      mla_ws_p_store_base(w.sm, r0, lane) ^ (static_cast<std::uint32_t>(w.wg) << 6);
  const std::uint32_t load_base =
      mla_ws_p_load_base(w.sm, w.wl, lane) ^ (static_cast<std::uint32_t>(1 - w.wg) << 6);
  const auto publish = [&]() {
    std::uint32_t own[kHalf / 16][4];
    tile::pack_p<__nv_bfloat16, kHalf>(sn, own);
#pragma unroll
    for (int kk = 0; kk < kHalf / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) w.pf[kk][i] = own[kk][i];
    mla_ws_store_p(store_base, own);
    arch::named_sync(kMlaWsBarP, 2 * 128);
#pragma unroll
    for (int kk = 0; kk < kHalf / 16; ++kk)
      arch::ldmatrix_x4(w.pf[kHalf / 16 + kk], load_base ^ (32u * kk));
  };

#pragma unroll 1
  for (int t = 0; t < n_tiles; ++t) {
    const int st = t % kMlaWsStages;
    arch::mbar_wait(w.sm.full0 + 8 * st, (t / kMlaWsStages) & 1);
    mla_ws_issue_s<kFp8, kHalf>(w.sm, st, sn, sp, key0);  // S_t (this warpgroup's half)
    arch::wgmma_wait<0>();
    arch::fence_regs(sn);
    if constexpr (kFp8) arch::fence_regs(sp);
    softmax(t);
    publish();
    w.rescale(al);          // O *= alpha_t
    w.issue_pv<true>(st);   // O += P_t V_t
    arch::wgmma_wait<0>();  // its stage is free, pf may be rewritten
    arch::fence_regs(w.acc);
    w.release(st);
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
