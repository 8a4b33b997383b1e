/// @file kernels/mla/mla_decode_narrow.cuh
/// @brief The narrow MLA decode kernel on Hopper `wgmma` (internal, sm_90a): requests of at most
///        `kMlaNarrowRows` query rows (`heads · q_len`), one CTA per (request, split), 8 warps: a
///        consumer warpgroup and the wgmma kernel's producer warpgroup (`mla_ws_produce`, its
///        two-stage ring of 64-key tiles in `MlaWsSmem`).
///
/// The products are transposed so that the 64 keys (or 64 latent columns), not the few rows,
/// are the instruction's M and the rows its N (`kN`: 16 or 32):
/// - scores `Sᵀ = K Qᵀ` (m64nNk16, 36 k-steps): A = the K tile, K-major, as the wgmma kernel's
///   scores read their A (the query tile); B = the query tile (its first `kN` rows), K-major;
/// - the online softmax of each row, i.e. of each column of `Sᵀ`: a thread holds keys
///   `16 wl + lane / 4` and `+ 8` of rows `8 j + 2 (lane % 4)` and `+ 1`; a row's tile maximum
///   over the warp's 16 keys by shuffles (lanes `^ 4, 8, 16`), over the 4 warps through shared
///   memory (`red`); its sum kept per thread (every factor is the row's own) until the end;
/// - the probabilities as `P` [row][key] (bf16, one 128-byte swizzled row per query row, one
///   buffer), the async-proxy fence and the warpgroup's barrier;
/// - `Oᵀ = Vᵀ Pᵀ` in 8 slices of 64 latent columns (m64nNk16, 4 k-steps each): A = Vᵀ, the V
///   tile read MN-major (`tnspA`: each part's 64 latent columns are the contiguous 128 bytes of
///   a token's row, 8-token groups 1024 bytes apart: the layout the wgmma kernel's `P V` reads as
///   its MN-major B); B = `Pᵀ`, `P` read K-major (a row's 64 keys contiguous).
/// Each tile's `P V` completes and its stage is released before the next tile's scores
/// (`mla_narrow_consume`). The epilogue is the mma.sync kernel's (`epilogue.cuh`)
/// by all 256 threads (`kMlaThreads`): the producer waits there for the consumer's state.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/special.cuh"
#include "cuda/arch/wgmma.cuh"
#include "cuda/kernels/mla/epilogue.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/kernels/mla/ws_ring.cuh"
#include "cuda/tile/cascade_level_block.cuh"
#include "cuda/tile/fp8_kv.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

using catalog::kMlaNarrowRows;
using catalog::kMlaNarrowWarps;

/// Threads of a narrow CTA: the consumer warpgroup, then the producer warpgroup; all of them run
/// the epilogue, which counts `kMlaThreads`.
constexpr int kMlaNarrowThreads = kMlaNarrowWarps * 32;
static_assert(kMlaNarrowThreads == kMlaThreads, "the epilogue's threads are the CTA's");
/// The consumer warpgroup's named barrier (the row maxima exchanged, the probabilities stored).
constexpr int kMlaNarrowBar = 1;
/// Latent columns per `Oᵀ` slice (one part of a tile).
constexpr int kMlaNarrowSlices = kMlaLoraRank / 64;

/// The row exchange buffer `red` [4 warps][kMlaNarrowRows]: the wgmma kernel's tail
/// (`MlaWsSmem::tail`).
static_assert(kMlaWsCarveBytes + 4 * kMlaNarrowRows * 4 <= catalog::mla_narrow_smem_bytes(),
              "the exchange buffer within the catalog's shared memory");

/// The consumer's state of its `kN / 4` rows (row `i = 2 j + e`: `8 j + 2 (lane % 4) + e`): the
/// key limits (exclusive, counted from the split's first key), the running statistics (sums
/// still per thread), the factors of the last step, the output accumulator `Oᵀ` [slice].
template <int kN>
struct MlaNarrowRows {
  static constexpr int kR = kN / 4;
  int lim[kR];
  math::OnlineSoftmax os[kR];
  float al[kR];
  float acc[kMlaNarrowSlices][kN / 8][4];
};

/// `Sᵀ` of the tile of the descriptors `d` (`k(ks)`, `q(ks)`: a K tile and the query tile, as
/// `MlaWsScoreDescs`): the latent columns into `sn`, the rotary ones into `sp` (`kSplit`: an fp8
/// cache, whose parts have their own K scales; else all into `sn`), one group.
template <bool kSplit, int kN, class Descs>
__device__ __forceinline__ void mla_narrow_issue_s(const Descs& d, float (&sn)[kN / 8][4],
                                                   float (&sp)[kN / 8][4]) {
  using Wg = arch::Wgmma<__nv_bfloat16>;
  arch::fence_regs(sn);
  if constexpr (kSplit) arch::fence_regs(sp);
  arch::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kMlaHeadDim / 16; ++ks) {
    const std::uint64_t kd = d.k(ks);
    const std::uint64_t qd = d.q(ks);
    constexpr int kRope = kMlaLoraRank / 16;
    if (ks == 0 || (kSplit && ks == kRope)) {
      if (kSplit && ks == kRope)
        Wg::mma_narrow_ss<0, 0, kN>(sp, kd, qd);
      else
        Wg::mma_narrow_ss<0, 0, kN>(sn, kd, qd);
    } else if (kSplit && ks > kRope) {
      Wg::mma_narrow_ss<1, 0, kN>(sp, kd, qd);
    } else {
      Wg::mma_narrow_ss<1, 0, kN>(sn, kd, qd);
    }
  }
  arch::wgmma_commit();
}

/// `Oᵀ += Vᵀ Pᵀ` of the tile in stage `st` with the probabilities at `pb`, one group: slice `s`
/// (latent columns `64 s ..`) from part `s` read MN-major (leading byte offset: the parts'
/// 8 KiB, unused by an M of one part; stride byte offset: 8-token groups, 1024 bytes); `P`
/// K-major (k-step `kk`: 32 bytes into its 128-byte rows; 8-row groups 1024 bytes apart).
template <int kN, class Smem>
__device__ __forceinline__ void mla_narrow_issue_pv(const Smem& sm, int st, std::uint32_t pb,
                                                    MlaNarrowRows<kN>& r) {
  using Wg = arch::Wgmma<__nv_bfloat16>;
  constexpr std::uint32_t kHi = (1024u >> 4) | (1u << 30);
  const std::uint32_t v_lo = ((sm.stage(st) & 0x3FFFFu) >> 4) | ((kMlaWsPartBytes >> 4) << 16);
  const std::uint32_t p_lo = ((pb & 0x3FFFFu) >> 4) | (1u << 16);
#pragma unroll
  for (int s = 0; s < kMlaNarrowSlices; ++s) arch::fence_regs(r.acc[s]);
  arch::wgmma_fence();
#pragma unroll
  for (int s = 0; s < kMlaNarrowSlices; ++s)
#pragma unroll
    for (int kk = 0; kk < kMlaWsTileKeys / 16; ++kk)
      Wg::mma_narrow_ss<1, 1, kN>(
          r.acc[s], arch::desc_join(v_lo + ((s * kMlaWsPartBytes + kk * 2048u) >> 4), kHi),
          arch::desc_join(p_lo + kk * (32u >> 4), kHi));
  arch::wgmma_commit();
}

/// The accumulator's waits: `Oᵀ` complete as the compiler sees it.
template <int kN>
__device__ __forceinline__ void mla_narrow_fence_acc(MlaNarrowRows<kN>& r) {
#pragma unroll
  for (int s = 0; s < kMlaNarrowSlices; ++s) arch::fence_regs(r.acc[s]);
}

/// `Oᵀ *= alpha` of this thread's rows (skipped when the warp's rows all keep theirs).
template <int kN>
__device__ __forceinline__ void mla_narrow_rescale(MlaNarrowRows<kN>& r) {
  bool keep = true;
#pragma unroll
  for (int i = 0; i < MlaNarrowRows<kN>::kR; ++i) keep = keep && r.al[i] == 1.f;
  if (__all_sync(0xffffffffu, keep)) return;
#pragma unroll
  for (int s = 0; s < kMlaNarrowSlices; ++s)
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) r.acc[s][j][q] *= r.al[2 * j + (q & 1)];
}

/// The softmax of tile `t` (scores `sn` in `Sᵀ`'s fragment, `t · 64` keys past the split's first)
/// by consumer warp `wl`: the rows' maxima exchanged through `red`, the statistics and factors
/// in `r`, the probabilities stored as `P` [row][key] at `pb` (bf16, swizzled), fenced for the
/// async proxy, and the warpgroup's barrier (`P` complete for the `P V` of any warp).
template <int kN>
__device__ __forceinline__ void mla_narrow_softmax(float (&sn)[kN / 8][4], MlaNarrowRows<kN>& r,
                                                   float* red, std::uint32_t pb, int t, int wl,
                                                   int lane, float s2_scale) {
  constexpr int kR = MlaNarrowRows<kN>::kR;
  const int k0 = 16 * wl + (lane >> 2);  // this thread's keys k0 and k0 + 8 of the tile
  const int kt = t * kMlaWsTileKeys + k0;
  float mx[kR];
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = 2 * j + (q & 1);
      const float s = sn[j][q] * s2_scale;
      sn[j][q] = kt + 8 * (q >> 1) < r.lim[i] ? s : math::neg_inf();
    }
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    // (`max.NaN`: `math::nan_max` in one instruction, no branch)
    float m = arch::max_nan(sn[i / 2][i & 1], sn[i / 2][2 + (i & 1)]);
    m = arch::max_nan(m, __shfl_xor_sync(0xffffffffu, m, 4));
    m = arch::max_nan(m, __shfl_xor_sync(0xffffffffu, m, 8));
    m = arch::max_nan(m, __shfl_xor_sync(0xffffffffu, m, 16));
    mx[i] = m;
  }
  // row c of the thread's i: 8 (i / 2) + 2 (lane % 4) + i % 2; lanes 0..3 hold the warp's maxima
  if (lane < 4) {
#pragma unroll
    for (int i = 0; i < kR; ++i) red[wl * kN + 8 * (i / 2) + 2 * lane + (i & 1)] = mx[i];
  }
  arch::named_sync(kMlaNarrowBar, 128);
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const int c = 8 * (i / 2) + 2 * (lane & 3) + (i & 1);
    const float m = arch::max_nan(arch::max_nan(red[c], red[kN + c]),
                                  arch::max_nan(red[2 * kN + c], red[3 * kN + c]));
    r.al[i] = r.os[i].rescale(m);
    const float p0 = r.os[i].prob(sn[i / 2][i & 1]);
    const float p1 = r.os[i].prob(sn[i / 2][2 + (i & 1)]);
    r.os[i].add(p0 + p1);
    sn[i / 2][i & 1] = p0;
    sn[i / 2][2 + (i & 1)] = p1;
  }
  // P [row][key]: the thread's (key k, rows c, c + 1) and its partner's (lane ^ 4: key k ^ 1)
  // paired along the keys, one 32-bit store each: an even key k stores row c, keys k, k + 1;
  // an odd one row c + 1, keys k - 1, k (128 bytes a row, chunk `key / 8 ^ row % 8`)
  const int odd = (lane >> 2) & 1;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float v0 = sn[j][2 * h], v1 = sn[j][2 * h + 1];
      const float x = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
      const __nv_bfloat162 w = odd ? __floats2bfloat162_rn(x, v1) : __floats2bfloat162_rn(v0, x);
      const int row = 8 * j + 2 * (lane & 3) + odd;
      const int key = k0 + 8 * h - odd;
      arch::st_shared_b32(pb + row * 128 + ((((key >> 3) ^ row) & 7) << 4) + 2 * (key & 7),
                          *reinterpret_cast<const std::uint32_t*>(&w));
    }
  arch::fence_proxy_async();  // P (generic-proxy stores) → read by wgmma
  arch::named_sync(kMlaNarrowBar, 128);
}

/// The consumer warpgroup (warp `wl`): the split's `n_tiles` (> 0) tiles in order over a ring of
/// `kStages` stages of `Smem` (`full0`, `empty0`, `p`; `Descs(sm, st)`: the scores' descriptors
/// of stage `st`), each one's scores, softmax (its probabilities into the one buffer `p`: every
/// warp waited the previous tile's `P V` before this softmax's maxima exchange, through `red`)
/// and `P V`, then its stage released (one arrival per warp). A stage is held only while its own
/// tile is computed: the producer loads the next tiles meanwhile.
template <int kKv, int kN, int kStages, class Descs, class Smem>
__device__ __forceinline__ void mla_narrow_consume(const MlaParams& p, const Smem& sm, float* red,
                                                   MlaNarrowRows<kN>& r, int n_tiles, int wl,
                                                   int lane) {
  constexpr bool kFp8 = kKv != tile::kKvSame;
  const float ckv_k = kFp8 ? p.ckv_scale.at(0) : 1.f;
  const float kpe_k = kFp8 && p.kpe_fp8 ? p.kpe_scale.at(0) : 1.f;
  const std::uint32_t pb = arch::smem_addr(sm.p);
  float sn[kN / 8][4], sp[kN / 8][4];
#pragma unroll 1
  for (int t = 0; t < n_tiles; ++t) {
    const int st = t % kStages;
    arch::mbar_wait(sm.full0 + 8 * st, (t / kStages) & 1);
    mla_narrow_issue_s<kFp8, kN>(Descs(sm, st), sn, sp);
    arch::wgmma_wait<0>();
    arch::fence_regs(sn);
    if constexpr (kFp8) {
      arch::fence_regs(sp);
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) sn[j][q] = ckv_k * sn[j][q] + kpe_k * sp[j][q];
    }
    mla_narrow_softmax<kN>(sn, r, red, pb, t, wl, lane, p.s2_scale);
    mla_narrow_rescale(r);               // Oᵀ *= alpha_t
    mla_narrow_issue_pv(sm, st, pb, r);  // += P_t V_t
    arch::wgmma_wait<0>();
    mla_narrow_fence_acc(r);
    if (lane == 0) arch::mbar_arrive(sm.empty0 + 8 * st);
  }
}

/// The consumer's normalised state (V's scale `v_scale` applied) into `o` [64][512] and the rows'
/// base-2 LSEs into `lse`: the rows' sums reduced over the lanes and the 4 warps (`red`).
template <int kN>
__device__ __forceinline__ void mla_narrow_state_to_smem(MlaNarrowRows<kN>& r, float* red, int wl,
                                                         int lane, float v_scale, float* o,
                                                         float* lse) {
  constexpr int kR = MlaNarrowRows<kN>::kR;
  float l[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    l[i] = r.os[i].l;
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 4);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 8);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 16);
  }
  arch::named_sync(kMlaNarrowBar, 128);  // the last softmax's reads of `red` are done
  if (lane < 4) {
#pragma unroll
    for (int i = 0; i < kR; ++i) red[wl * kN + 8 * (i / 2) + 2 * lane + (i & 1)] = l[i];
  }
  arch::named_sync(kMlaNarrowBar, 128);
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const int c = 8 * (i / 2) + 2 * (lane & 3) + (i & 1);
    r.os[i].l = (red[c] + red[kN + c]) + (red[2 * kN + c] + red[3 * kN + c]);
    const float f = r.os[i].inv_sum() * v_scale;
    if (wl == 0 && lane < 4) lse[c] = r.os[i].lse(LseBase::kBase2);
#pragma unroll
    for (int s = 0; s < kMlaNarrowSlices; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        o[c * kMlaLoraRank + 64 * s + 16 * wl + (lane >> 2) + 8 * h] =
            r.acc[s][i / 2][2 * h + (i & 1)] * f;
  }
}

/// A narrow CTA's work: its coordinates, its request's clamped length, its split's keys and their
/// `n_tiles` 64-key tiles (none past the request's splits).
struct MlaNarrowWork {
  MlaCta c;
  std::int32_t len;
  TokenRange range;
  int n_tiles;
};

/// The CTA prologue of both narrow kernels (`kStages`: the ring's stages; `QLayout`, `kRows`: the
/// query tile's layout and rows, as `mla_load_queries`): the schedule and split into `w`, the
/// ring's mbarriers, the query tile, then a block barrier. False, before any barrier, for a CTA
/// past the request's splits with no stacked rows to write (the wgmma kernel's early exit):
/// every thread of it returns.
template <int kStages, class QLayout, int kRows, class Smem>
__device__ __forceinline__ bool mla_narrow_prologue(const MlaParams& p, const Smem& sm, int tid,
                                                    MlaNarrowWork& w) {
  w.c = mla_schedule(p);
  w.len = mla_length(p, w.c);
  const bool past = w.c.s >= p.splits.splits_for(w.len);
  if (past && p.stack_rows == 0) return false;
  // (branches, not `?:`: the `?:` form compiled the kernels to other register numbers)
  if (past) {
    w.range = TokenRange{0, 0};
  } else {
    w.range = p.splits.range(w.len, w.c.s);
  }
  w.n_tiles = (w.range.end - w.range.begin + kMlaWsTileKeys - 1) / kMlaWsTileKeys;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      arch::mbar_init(sm.full0 + 8 * s, 4);   // the producer's warps
      arch::mbar_init(sm.empty0 + 8 * s, 4);  // the consumer's warps
    }
    arch::fence_mbar_init();
  }
  mla_load_queries<kMlaNarrowThreads, QLayout, kRows>(p, w.c, tid, arch::smem_addr(sm.q));
  arch::cp_async_commit();
  arch::cp_async_wait<0>();
  arch::fence_proxy_async();  // the query tile (cp.async) → read by wgmma
  __syncthreads();
  return true;
}

/// The consumer's rows before the first tile: each row's key limit (its token's causal end
/// within the split; 0 for a row past the request's), fresh statistics, unit factors and a zero
/// `Oᵀ`.
template <int kN>
__device__ __forceinline__ void mla_narrow_rows_init(const MlaParams& p, const MlaNarrowWork& w,
                                                     int lane, MlaNarrowRows<kN>& r) {
#pragma unroll
  for (int i = 0; i < kN / 4; ++i) {
    const int row = 8 * (i / 2) + 2 * (lane & 3) + (i & 1);
    const int e = w.len - p.q_len + (w.c.row0 + row) / p.group + 1;  // causal end of its token
    r.lim[i] = row < w.c.rows_here ? min(w.range.end, e) - w.range.begin : 0;
    r.os[i] = math::OnlineSoftmax{};
    r.al[i] = 1.f;
  }
#pragma unroll
  for (int s = 0; s < kMlaNarrowSlices; ++s) tile::zero_frags(r.acc[s]);
}

/// The narrow wgmma MLA decode kernel over a latent part of `kKv` (`kBlock`: with its block
/// scales), `kN` (16 or 32) the rows of its products (the request's rows, at most `kN`).
template <int kKv, bool kBlock, int kN>
__global__ void __launch_bounds__(kMlaNarrowThreads, 1)
    mla_decode_narrow_kernel(const MlaParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kN == 16 || kN == 32, "products of 16 or 32 rows");
  constexpr bool kFp8 = kKv != tile::kKvSame;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const MlaWsSmem sm(smem_raw);
  const int tid = threadIdx.x;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // (uniform: the branches below)
  const int lane = tid & 31;
  MlaNarrowRows<kN> r;
  {
    MlaNarrowWork w;
    if (!mla_narrow_prologue<kMlaWsStages, MlaWsLayout, kMlaTileRows>(p, sm, tid, w)) return;
    if (warp >= 4) {
      mla_ws_produce<kKv, kBlock>(p, w.c, sm, tid - 128, lane, w.range.begin, w.range.end,
                                  w.n_tiles);
    } else {
      mla_narrow_rows_init(p, w, lane, r);
      if (w.n_tiles > 0)
        mla_narrow_consume<kKv, kN, kMlaWsStages, MlaWsScoreDescs>(p, sm, sm.tail(), r, w.n_tiles,
                                                                   warp, lane);
      mla_narrow_state_to_smem(r, sm.tail(), warp, lane, kFp8 ? p.ckv_scale.at(0) : 1.f, sm.o,
                               sm.lse);
    }
  }
  // ---- epilogue (the mma.sync kernel's, all 256 threads) ----
  __syncthreads();  // the state in shared memory; the producer's last copies landed long before
  mla_rows_out(p, tid, sm.o, sm.lse, sm.is_last, 0);
#elif defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the run never launches it (DeviceFacts::wgmma())
#endif
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
