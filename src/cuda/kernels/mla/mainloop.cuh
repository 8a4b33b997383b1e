/// @file kernels/mla/mainloop.cuh
/// @brief The mainloop of the MLA decode kernel (internal): the split's 32-key tiles through a
///        double-buffered cp.async pipeline, each tile's scores (`mla_scores`: a warp's 16 rows ×
///        16 of the tile's keys over all 576 columns, shared with its partner warp through shared
///        memory), the online softmax (`tile::online_softmax_step`, base 2) and `O += P V` over
///        the warp's 256 output columns (`tile::pv_accumulate`). A part of `mla_decode_kernel`,
///        inlined there.
///
/// Warp `w` owns rows `16 (w % 4) ..` of the tile (its row group) and output columns
/// `256 (w / 4) ..`; the two warps of a row group compute the scores of one half of the keys
/// each and both read all 32, so they run the same softmax on the same values (bitwise the same
/// running max and sums).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/tile/attention_tile.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// The rows' scores of the tile in stage `kv_s` (shared address) for row group `rg`, keys
/// `16 half ..` of the tile: `ckv_k · (q_nope · ckv) + kpe_k · (q_pe · kpe)` (the parts' K
/// scales, 1 unless fp8, applied to their own dot products), stored in `s_x` [row][32 keys].
__device__ __forceinline__ void mla_scores(std::uint32_t q_s, std::uint32_t kv_s, int rg, int half,
                                           int lane, float ckv_k, float kpe_k, float* s_x) {
  using Mma = arch::Mma16816<__nv_bfloat16>;
  const tile::LdmatrixLanes ln(lane);
  const std::uint32_t q_lane =
      q_s + static_cast<std::uint32_t>((16 * rg + ln.a_row) * kMlaRowBytes);
  const std::uint32_t k_lane =
      kv_s + static_cast<std::uint32_t>((16 * half + ln.b_row) * kMlaRowBytes);
  float sn[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};  // latent part
  float sp[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};  // rotary part
  auto step = [&](int kk, float(&acc)[2][4]) {
    std::uint32_t a[4], bk[4];
    arch::ldmatrix_x4(a, q_lane + ((32u * kk) ^ ln.a_x));
    arch::ldmatrix_x4(bk, k_lane + ((32u * kk) ^ ln.b_x));
    Mma::mma(acc[0], a, bk[0], bk[1]);
    Mma::mma(acc[1], a, bk[2], bk[3]);
  };
#pragma unroll 8
  for (int kk = 0; kk < kMlaLoraRank / 16; ++kk) step(kk, sn);
#pragma unroll
  for (int kk = kMlaLoraRank / 16; kk < kMlaHeadDim / 16; ++kk) step(kk, sp);
  float* rows = s_x + (16 * rg + (lane >> 2)) * kMlaTileKeys + 16 * half + 2 * (lane & 3);
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(rows + 8 * h * kMlaTileKeys + 8 * n) =
          make_float2(ckv_k * sn[n][2 * h] + kpe_k * sp[n][2 * h],
                      ckv_k * sn[n][2 * h + 1] + kpe_k * sp[n][2 * h + 1]);
}

/// The online softmax over the tile's 32 scores of the warp's rows (from `s_x`; keys from `t0`,
/// those at or past `lim[h]` masked) and `O += P V` over the warp's columns `256 half ..` of the
/// stage at `kv_s`, into `o_acc` and `os`.
__device__ __forceinline__ void mla_softmax_pv(const float* s_x, std::uint32_t kv_s, int rg,
                                               int half, int lane, int t0, const int (&lim)[2],
                                               float s2_scale, float (&o_acc)[kMlaWarpCols / 8][4],
                                               math::OnlineSoftmax (&os)[2]) {
  constexpr int kN = kMlaTileKeys / 8;  // n-tiles of 8 keys
  float s[kN][4], pr[kN][4];
  const float* rows = s_x + (16 * rg + (lane >> 2)) * kMlaTileKeys + 2 * (lane & 3);
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 v = *reinterpret_cast<const float2*>(rows + 8 * h * kMlaTileKeys + 8 * n);
      s[n][2 * h] = v.x;
      s[n][2 * h + 1] = v.y;
    }
  tile::online_softmax_step<kMlaTileKeys, kMlaWarpCols>(s, pr, o_acc, os, lim, t0, s2_scale, lane);
  const tile::LdmatrixLanes ln(lane);
#pragma unroll
  for (int ks = 0; ks < kMlaTileKeys / 16; ++ks) {
    const float(&p16)[2][4] = *reinterpret_cast<const float(*)[2][4]>(&pr[2 * ks]);
    const std::uint32_t v_lane =
        kv_s +
        static_cast<std::uint32_t>((16 * ks + ln.a_row) * kMlaRowBytes + half * kMlaWarpCols * 2);
    tile::pv_accumulate<kMlaWarpCols, true>(p16, v_lane, ln.a_x, o_acc);
  }
}

/// The CTA's split `[begin, end)` of keys: every 32-key tile copied (two stages: the next tile's
/// copies in flight while the current one is computed; an fp8 part converted in shared memory as
/// it lands), scored by the warps of each row group, then folded into each warp's accumulator
/// `o_acc` (zeroed here) and softmax `os` (rows lane/4 and lane/4 + 8 of its group). The query
/// tile's copies were issued by the caller (their group completes with the first tile's). `lim`:
/// this thread's rows' exclusive key ends. `kBlock`: the fp8 latent part has block scales
/// (`MlaParams::ckv_bscale`), staged with each tile and applied by the conversion.
template <int kKv, bool kBlock = false>
__device__ __forceinline__ void mla_mainloop(const MlaParams& p, const MlaCta& c, const MlaSmem& sm,
                                             int tid, int warp, int lane, int begin, int end,
                                             const int (&lim)[2],
                                             float (&o_acc)[kMlaWarpCols / 8][4],
                                             math::OnlineSoftmax (&os)[2]) {
  constexpr bool kFp8 = kKv != tile::kKvSame;
  constexpr std::uint32_t kStageBytes = kMlaTileKeys * kMlaRowBytes;
  constexpr std::uint32_t kRawStageBytes = kMlaTileKeys * kMlaHeadDim;
  const int rg = warp & 3;
  const int half = warp >> 2;
  const std::uint32_t q_s = arch::smem_addr(sm.q);
  const std::uint32_t kv0 = arch::smem_addr(sm.kv);
  const std::uint32_t raw0 = arch::smem_addr(sm.raw);
  constexpr std::uint32_t kScaleStageBytes = kMlaThreads * 16;
  const std::uint32_t bscale0 = kBlock ? arch::smem_addr(sm.bscale) : 0u;
  const std::uint64_t policy = arch::l2_evict_first_policy();
  // the K scales of the parts (read once: a pointed-to scale is read on the device)
  const float ckv_k = kFp8 ? p.ckv_scale.at(0) : 1.f;
  const float kpe_k = kFp8 && p.kpe_fp8 ? p.kpe_scale.at(0) : 1.f;
#pragma unroll
  for (int j = 0; j < kMlaWarpCols / 8; ++j)
    o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.f;

  const int n_tiles = (end - begin + kMlaTileKeys - 1) / kMlaTileKeys;
  auto load = [&](int it) {
    const std::uint32_t st = static_cast<std::uint32_t>(it % kMlaStages);
    mla_load_tile<kKv, kBlock>(p, c, tid, begin + it * kMlaTileKeys, end, kv0 + st * kStageBytes,
                               raw0 + st * kRawStageBytes, policy, bscale0 + st * kScaleStageBytes);
  };
  if (n_tiles > 0) load(0);
  arch::cp_async_commit();  // the query tile and the first K/V tile
#pragma unroll 1
  for (int it = 0; it < n_tiles; ++it) {
    if (it + 1 < n_tiles) load(it + 1);  // its stage was released by the last barrier
    arch::cp_async_commit();
    arch::cp_async_wait<1>();  // this thread's copies of tile `it` (and the queries) landed
    const int st = it % kMlaStages;
    if constexpr (kFp8)
      mla_convert_tile<kKv, kBlock>(p, tid, sm.raw + st * kRawStageBytes, sm.kv + st * kStageBytes,
                                    kBlock ? sm.bscale + st * (kScaleStageBytes / 4) : nullptr);
    __syncthreads();  // the tile (and the queries) in shared memory for every warp
    const std::uint32_t kv_s = kv0 + static_cast<std::uint32_t>(st) * kStageBytes;
    mla_scores(q_s, kv_s, rg, half, lane, ckv_k, kpe_k, sm.s_x);
    __syncthreads();  // both halves of every row group's scores
    mla_softmax_pv(sm.s_x, kv_s, rg, half, lane, begin + it * kMlaTileKeys, lim, p.s2_scale, o_acc,
                   os);
    __syncthreads();  // the stage and the scores are free for the next tile
  }
  arch::cp_async_wait<0>();
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
