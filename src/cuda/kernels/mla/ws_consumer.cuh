/// @file kernels/mla/ws_consumer.cuh
/// @brief The consumer warpgroups of the wgmma MLA decode kernel (internal). Warpgroup 0 computes
///        each tile's scores `S = Q Kᵀ` (64 rows × 64 keys over the 576 columns: 36 k-steps of
///        `wgmma` m64n64k16, both operands in shared memory), the online softmax of its rows
///        (`mla_ws_flat_max`, `mla_ws_flat_probs`: base 2, branch-free, the probabilities on
///        `ex2.approx.ftz`; the rescale factors kept for later), and
///        publishes the probabilities (bf16) and the factors in shared memory; both warpgroups
///        then add `P V` over their 256 output columns (m64n256k16, P from registers, V the
///        tile's first 512 columns read MN-major). Each tile's `P V` completes and its stage is
///        released before the next tile's scores are issued (`mla_ws_scores_loop`). Parts of
///        `mla_decode_ws_kernel`, inlined there.
///
/// The accumulator fragments of a warp of a warpgroup (warp `wl` of 4: rows `16 wl + lane / 4`
/// and `+ 8`, columns `8 j + 2 (lane % 4)`) are those of the mma.sync kernel's warp of row group
/// `wl` and half `wg`, so its epilogue (`epilogue.cuh`) takes them as they are.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/arch/special.cuh"
#include "cuda/arch/wgmma.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/kernels/mla/ws_ring.cuh"
#include "cuda/tile/cascade_level_block.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// A consumer warp's state (the kernel's locals, held by reference): its warpgroup `wg` and warp
/// `wl` in it, the accumulator over its 256 output columns and the probabilities' fragments.
struct MlaWsWarp {
  const MlaWsSmem& sm;
  int wg, wl, lane;
  float (&acc)[kMlaWarpCols / 8][4];
  std::uint32_t (&pf)[kMlaWsTileKeys / 16][4];

  /// O += P V over the warpgroup's columns of the tile in stage `st`, one wgmma group.
  /// `kBalanced` (the balanced kernel): `pf[0..1]` hold keys `32 wg ..` (the warpgroup's own
  /// probabilities), `pf[2..3]` keys `32 (1 - wg) ..` (the other's); else `pf[kk]` keys `16 kk ..`.
  template <bool kBalanced = false>
  __device__ __forceinline__ void issue_pv(int st) {
    using Wg = arch::Wgmma<__nv_bfloat16>;
    // columns 256 wg..: parts 4 wg.. (8 KiB apart: the leading byte offset); keys 16 kk..: two
    // 8-key groups (1024 bytes apart: the stride byte offset)
    // (descriptor words as in `mla_ws_issue_s`, the leading byte offset the parts' 8 KiB)
    constexpr std::uint32_t kHi = (1024u >> 4) | (1u << 30);
    const std::uint32_t vb = sm.stage(st) + static_cast<std::uint32_t>(wg) * 4 * kMlaWsPartBytes;
    const std::uint32_t v_lo = ((vb & 0x3FFFFu) >> 4) | ((kMlaWsPartBytes >> 4) << 16);
    // (the warpgroup's own 32 keys: 4096 bytes >> 4 per warpgroup)
    const std::uint32_t own = kBalanced ? static_cast<std::uint32_t>(wg) * (4096u >> 4) : 0u;
    arch::fence_regs(acc);
    arch::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kMlaWsTileKeys / 16; ++kk) {
      const std::uint32_t k_off =
          kBalanced ? (kk < 2 ? own : (4096u >> 4) - own) + (kk & 1) * (2048u >> 4)
                    : kk * (2048u >> 4);
      Wg::mma_o256<1>(acc, pf[kk], arch::desc_join(v_lo + k_off, kHi));
    }
    arch::wgmma_commit();
  }

  /// O *= alpha of this thread's two rows (skipped when the warp's rows all keep theirs: the
  /// same bits).
  __device__ __forceinline__ void rescale(const float (&al)[2]) {
    if (!__any_sync(0xffffffffu, al[0] != 1.f || al[1] != 1.f)) return;
#pragma unroll
    for (int j = 0; j < kMlaWarpCols / 8; ++j) {
      acc[j][0] *= al[0];
      acc[j][1] *= al[0];
      acc[j][2] *= al[1];
      acc[j][3] *= al[1];
    }
  }

  /// Stage `st`'s release by this warp, once its products are done.
  __device__ __forceinline__ void release(int st) {
    if (lane == 0) arch::mbar_arrive(sm.empty0 + 8 * st);
  }
};

/// One k-step of the scores of `kN` keys (64: m64n64k16; 32: m64n32k16), both operands in
/// shared memory (K-major).
template <int kScaleD, int kN>
__device__ __forceinline__ void mla_ws_mma_s(float (&d)[kN / 8][4], std::uint64_t qd,
                                             std::uint64_t kd) {
  using Wg = arch::Wgmma<__nv_bfloat16>;
  if constexpr (kN == kMlaWsTileKeys)
    Wg::mma_s64_ss<kScaleD>(d, qd, kd);
  else
    Wg::mma_narrow_ss<kScaleD, 0, kN>(d, qd, kd);
}

/// The scores of the tile in stage `st` for all 64 rows over its `kN` keys from `key0` (64:
/// warpgroup 0 of the wgmma kernel; 32: a warpgroup's half in the balanced kernel): the latent
/// columns into `sn`, the rotary ones into `sp` (`kSplit`: an fp8 cache, whose parts have their
/// own K scales; else all into `sn`), one wgmma group.
template <bool kSplit, int kN = kMlaWsTileKeys>
__device__ __forceinline__ void mla_ws_issue_s(const MlaWsSmem& sm, int st, float (&sn)[kN / 8][4],
                                               float (&sp)[kN / 8][4], int key0 = 0) {
  const MlaWsScoreDescs d(sm, st, key0);
  arch::fence_regs(sn);
  if constexpr (kSplit) arch::fence_regs(sp);
  arch::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kMlaHeadDim / 16; ++ks) {
    const std::uint64_t qd = d.q(ks);
    const std::uint64_t kd = d.k(ks);
    constexpr int kRope = kMlaLoraRank / 16;
    if (ks == 0 || (kSplit && ks == kRope)) {
      if (kSplit && ks == kRope)
        mla_ws_mma_s<0, kN>(sp, qd, kd);
      else
        mla_ws_mma_s<0, kN>(sn, qd, kd);
    } else if (kSplit && ks > kRope) {
      mla_ws_mma_s<1, kN>(sp, qd, kd);
    } else {
      mla_ws_mma_s<1, kN>(sn, qd, kd);
    }
  }
  arch::wgmma_commit();
}

/// The exclusive key ends of this thread's rows (warp `wl` of a consumer warpgroup), counted from
/// the split's first key `begin` (`tile::causal_row_limits`; one register less than absolute).
__device__ __forceinline__ void mla_ws_row_limits(const MlaParams& p, int wl, int lane, int begin,
                                                  int (&lim)[2]) {
  const MlaCta c = mla_schedule(p);
  const std::int32_t len = mla_length(p, c);
  tile::causal_row_limits(p, lane, c.rows_here - 16 * wl, c.row0 + 16 * wl, len,
                          p.splits.range(len, c.s).end, lim);
  lim[0] -= begin;
  lim[1] -= begin;
}

/// An fp8 cache's scores of `kN` keys: the latent part's (`sn`) and the rotary part's (`sp`)
/// times their K scales, into `sn`.
template <int kN>
__device__ __forceinline__ void mla_ws_join_parts(float (&sn)[kN / 8][4],
                                                  const float (&sp)[kN / 8][4], float ckv_k,
                                                  float kpe_k) {
#pragma unroll
  for (int n = 0; n < kN / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) sn[n][i] = ckv_k * sn[n][i] + kpe_k * sp[n][i];
}

/// The first half of the consumers' online-softmax step (branch-free, as the cascade's
/// `kWsFlatStats`): this thread's `kN` scores of rows `h` (lane / 4 + 8 h; n-tile j: keys
/// `t0 + 8 j + 2 (lane % 4) + e`, counted as `lim`) scaled to base 2 by `s2_scale` in place, keys
/// at or past `lim[h]` set to -inf (skipped when no key of the warp's is), and the rows' block
/// maxima reduced over the quad into `bm`. The thread's maxima are `fmaxf` trees (a NaN score is
/// left out of them, but its probability is NaN: the row ends NaN), the quad's `max.NaN`.
template <int kN>
__device__ __forceinline__ void mla_ws_flat_max(float (&s)[kN / 8][4], const int (&lim)[2], int t0,
                                                float s2_scale, int lane, float (&bm)[2]) {
  const int k = t0 + 2 * (lane & 3);
  if (__all_sync(0xffffffffu, t0 + kN <= min(lim[0], lim[1]))) {
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) s[j][q] *= s2_scale;
  } else {
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        s[j][q] = k + 8 * j + (q & 1) < lim[q >> 1] ? s[j][q] * s2_scale : math::neg_inf();
  }
  tile::flat_block_max<kN>(s, bm);
}

/// The second half (branch-free): each row's running max raised to cover its block max `bm[h]`
/// and its factor `al[h]` (`tile::flat_rescale`), then the probabilities `2^{s - m_new}` in
/// place (`ex2.approx.ftz`: -inf gives 0, as does a row still at -inf) and their sum added.
template <int kN>
__device__ __forceinline__ void mla_ws_flat_probs(float (&s)[kN / 8][4],
                                                  math::OnlineSoftmax (&os)[2],
                                                  const float (&bm)[2], float (&al)[2]) {
  float nm[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) al[h] = tile::flat_rescale(os[h], bm[h], nm[h]);
  tile::flat_probs<kN, false>(s, os, nm, 1.f);
}

/// The probabilities' buffer (`MlaWsSmem::p`: 64 rows of 64 keys, bf16, swizzled as the tiles):
/// the store base of this thread's rows `r0` and `r0 + 8`. Word i of the A fragment of k-step kk
/// (row r0 + 8 (i % 2), keys 16 kk + 8 (i / 2) + 2 (lane % 4)) is chunk c = 2 kk + i / 2 of the
/// row at (c ^ (r0 % 8)) · 16, i.e. the base (bits 4..6 clear) with (r0 % 8) · 16 added, XOR
/// c · 16: one register, an immediate per store (`mla_ws_store_p`).
__device__ __forceinline__ std::uint32_t mla_ws_p_store_base(const MlaWsSmem& sm, int r0,
                                                             int lane) {
  return (arch::smem_addr(sm.p) + r0 * 128 + 4 * (lane & 3)) + ((r0 & 7) << 4);
}
/// The A fragments `pf` of `kSteps` k-steps into the probabilities' buffer at the store base
/// `base` (`mla_ws_p_store_base`, XOR the first k-step's chunk · 16).
template <int kSteps>
__device__ __forceinline__ void mla_ws_store_p(std::uint32_t base,
                                               const std::uint32_t (&pf)[kSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::uint32_t a = (base ^ ((2 * kk + (i >> 1)) << 4)) + 1024 * (i & 1);
      arch::st_shared_b32(a, pf[kk][i]);
    }
}
/// The `ldmatrix` base of thread `lane` of warp `wl` in the probabilities' buffer: its row
/// r = 16 wl + lane % 16, chunk 2 kk + lane / 16 at ((2 kk + lane / 16) ^ (r % 8)) · 16, i.e. the
/// base XOR 32 kk (as `mla_ws_store_p` stores them).
__device__ __forceinline__ std::uint32_t mla_ws_p_load_base(const MlaWsSmem& sm, int wl, int lane) {
  const int lr = 16 * wl + (lane & 15);
  return arch::smem_addr(sm.p) + lr * 128 + ((((lane >> 4) ^ lr) & 7) << 4);
}

/// Warpgroup 0 (warp `w.wl`): the split's `n_tiles` (> 0) tiles from `begin`: scores, the online
/// softmax of its rows (their key limits: `tile::causal_row_limits`) into `os`, the probabilities
/// and the rows' factors published for warpgroup 1 (named barriers: `kMlaWsBarPEmpty` before a
/// write, `kMlaWsBarPFull` after it), and its own `P V`, done before the next tile's scores.
template <int kKv>
__device__ __forceinline__ void mla_ws_scores_loop(const MlaParams& p, MlaWsWarp& w, int begin,
                                                   int n_tiles, math::OnlineSoftmax (&os)[2]) {
  constexpr bool kFp8 = kKv != tile::kKvSame;
  constexpr int kN = kMlaWsTileKeys / 8;
  const int lane = w.lane;
  int lim[2];  // exclusive key ends of this thread's rows, counted from `begin`
  mla_ws_row_limits(p, w.wl, lane, begin, lim);
  // the K scales of the parts (fp8; read once: a pointed-to scale is read on the device)
  const float ckv_k = kFp8 ? p.ckv_scale.at(0) : 1.f;
  const float kpe_k = kFp8 && p.kpe_fp8 ? p.kpe_scale.at(0) : 1.f;
  float sn[kN][4], sp[kN][4];  // (the step leaves the probabilities in sn)
  float al[2] = {1.f, 1.f};    // the rows' factors of the last softmax step
  const int r0 = 16 * w.wl + (lane >> 2);
  // the softmax of tile t (scores in sn, sp): the probabilities in sn, the factors in al
  const auto softmax = [&](int t) {
    if constexpr (kFp8) mla_ws_join_parts<kMlaWsTileKeys>(sn, sp, ckv_k, kpe_k);
    float bm[2];
    mla_ws_flat_max<kMlaWsTileKeys>(sn, lim, t * kMlaWsTileKeys, p.s2_scale, lane, bm);
    mla_ws_flat_probs<kMlaWsTileKeys>(sn, os, bm, al);
  };
  // P and the rows' factors into shared memory for warpgroup 1
  const auto publish = [&](int t) {
    tile::pack_p<__nv_bfloat16, kMlaWsTileKeys>(sn, w.pf);
    if (t > 0) arch::named_sync(kMlaWsBarPEmpty, 2 * 128);  // warpgroup 1 read P of t - 1
    mla_ws_store_p(mla_ws_p_store_base(w.sm, r0, lane), w.pf);
    if ((lane & 3) == 0) {
      w.sm.alpha[r0] = al[0];
      w.sm.alpha[r0 + 8] = al[1];
    }
    arch::named_arrive(kMlaWsBarPFull, 2 * 128);
  };

  arch::mbar_wait(w.sm.full0, 0);
  mla_ws_issue_s<kFp8>(w.sm, 0, sn, sp);
  arch::wgmma_wait<0>();
  arch::fence_regs(sn);
  if constexpr (kFp8) arch::fence_regs(sp);
  softmax(0);
  publish(0);
#pragma unroll 1
  for (int t = 1; t < n_tiles; ++t) {
    const int st = t % kMlaWsStages, stp = (t - 1) % kMlaWsStages;
    // P V of tile t - 1 completes (its stage released) before the scores of tile t are issued:
    // with two stages, a stage held through the next tile's scores would leave the producer no
    // tile ahead to load while the consumers compute
    w.rescale(al);
    w.issue_pv(stp);
    arch::wgmma_wait<0>();
    arch::fence_regs(w.acc);
    w.release(stp);
    arch::mbar_wait(w.sm.full0 + 8 * st, (t / kMlaWsStages) & 1);
    mla_ws_issue_s<kFp8>(w.sm, st, sn, sp);
    arch::wgmma_wait<0>();
    arch::fence_regs(sn);
    if constexpr (kFp8) arch::fence_regs(sp);
    softmax(t);
    publish(t);
  }
  const int stl = (n_tiles - 1) % kMlaWsStages;
  w.rescale(al);
  w.issue_pv(stl);
  arch::wgmma_wait<0>();
  arch::fence_regs(w.acc);
  w.release(stl);
}

/// Warpgroup 1: for each of the `n_tiles` tiles, P and the rows' factors from shared memory
/// (once warpgroup 0 published them), the accumulator rescaled, then `P V` over its columns.
__device__ __forceinline__ void mla_ws_pv_loop(MlaWsWarp& w, int n_tiles) {
  const int lane = w.lane;
  const int r0 = 16 * w.wl + (lane >> 2);
  const std::uint32_t pbase = mla_ws_p_load_base(w.sm, w.wl, lane);
#pragma unroll 1
  for (int t = 0; t < n_tiles; ++t) {
    const int st = t % kMlaWsStages;
    // P_{t-1} V_{t-1} is done: pf may be rewritten, its stage freed (the wait on every path:
    // the compiler then keeps the products of a tile in flight together)
    arch::wgmma_wait<0>();
    arch::fence_regs(w.acc);
    if (t > 0) w.release((t - 1) % kMlaWsStages);
    arch::named_sync(kMlaWsBarPFull, 2 * 128);
#pragma unroll
    for (int kk = 0; kk < kMlaWsTileKeys / 16; ++kk)
      arch::ldmatrix_x4(w.pf[kk], pbase ^ (32u * kk));
    const float al[2] = {w.sm.alpha[r0], w.sm.alpha[r0 + 8]};
    // P of tile t is read (no arrival after the last: every arrival meets a wait)
    if (t + 1 < n_tiles) arch::named_arrive(kMlaWsBarPEmpty, 2 * 128);
    w.rescale(al);
    arch::mbar_wait(w.sm.full0 + 8 * st, (t / kMlaWsStages) & 1);
    w.issue_pv(st);
  }
  arch::wgmma_wait<0>();  // (on every path: the compiler sees the accumulator complete)
  arch::fence_regs(w.acc);
  if (n_tiles > 0) w.release((n_tiles - 1) % kMlaWsStages);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
