/// @file kernels/cascade/level_ws.cuh
/// @brief The warp-specialised cascade level kernel (sm_90a, bf16, head_dim 128): the work and
///        the results of level_wgmma.cuh (one CTA = a tile of stacked query rows × one KV
///        split of a segment, online softmax in fp32, the partial state to the workspace), laid
///        out as a FlashAttention-3 style pipeline. One producer warp fills a ring of K/V stages
///        with bulk tensor copies (TMA, completing on the stage's "full" mbarrier: one box per
///        page granule holding both halves of head_dim for its keys, or one per run of
///        consecutive pages; the tile laid out in groups of 8 keys, `detail::kv_tile_offset`, so
///        that a box is one contiguous piece of it); one or two consumer warpgroups of 64 rows each
///        wait on "full", issue `QKᵀ` of tile t and `PV` of tile t-1 back to back (`wgmma`, queries
///        and probabilities from registers), run the softmax of tile t while `PV` runs on the
///        tensor cores, and release the stage on its "empty" mbarrier; with two warpgroups one's
///        softmax overlaps the other's matrix products (optionally in strict turns through named
///        barriers, `ws_pingpong`). No block-wide barrier in the main loop.
///
///        Numerics as everywhere in the library: fp32 scores and accumulators, max-subtracted
///        base-2 online softmax (`math::OnlineSoftmax`), the accumulator rescaled between two
///        tiles' `PV` exactly as in the sequential loop (`kWsRescaleLate`: after the previous
///        `PV` completed, the same operations in the same order), probabilities rounded to bf16
///        as the `PV` operand. With `kWsFastExp` (the 128-key tiles) a probability is one FFMA
///        and one `ex2.approx.ftz`, `2^{fma(s, |scale|, -m)}` on the raw score `s` (the running
///        max `m` is the scaled max of the raw scores; masked keys -inf give 0, a row still at
///        -inf gives 0, NaN scores make the row NaN); a negative scale negates the queries
///        instead (exact in bf16). With `kWsFlatStats` the row max and the rescale factor take
///        no branch (`max.NaN`, the factor `2^{m_old - m_new}` on `ex2.approx.ftz`: 0 from an
///        empty row, 1 while nothing was seen). The last, partial tile of a split is copied with
///        `cp.async` and its keys past the end zero-filled, so nothing past a segment's length is
///        ever read as a factor.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/special.cuh"
#include "cuda/arch/tma.cuh"
#include "cuda/arch/wgmma.cuh"
#include "cuda/kernels/cascade/level_wgmma.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// The tensor maps of a pool's K and V, seen as 5-D tensors whose boxes land in shared memory in
/// the layout of a KV tile (`kv_tile_offset`): groups of 8 keys, each both 64-wide halves of
/// head_dim × 8 keys, 128-byte swizzled. Dims (innermost first, `CascadeLevelParams::tma_coords`):
/// 0 (NHD) `(64 of head_dim, 8 slots, KV head · 2 + half, slot / 8, page)`; 1 (unpadded HND)
/// `(64, 8 slots, half, slot / 8, page · heads_kv + KV head)`; 2 (padded HND) `(64, slot, half,
/// KV head, page)`. A box holds `tma_box` keys of one page and both halves.
struct CascadeTmaMaps {
  CUtensorMap k;  ///< K pool.
  CUtensorMap v;  ///< V pool.
  /// K pool, boxes of `CascadeLevelParams::tma_run` keys (consecutive whole pages: the page dim
  /// of the box is `tma_run / tma_box`), for granules whose pages are consecutive in the pool.
  CUtensorMap k_run;
  CUtensorMap v_run;  ///< V pool, boxes of `tma_run` keys (as `k_run`).
};

namespace detail {
/// KV tile layout in shared memory (head_dim 128, 16-bit): groups of 8 keys, each the first then
/// the second 64-wide half of head_dim for its 8 keys (rows of 128 bytes, 128-byte swizzled).
constexpr std::uint32_t kKvHalfBytes = 8 * 128;            ///< One half of a group.
constexpr std::uint32_t kKvGroupBytes = 2 * kKvHalfBytes;  ///< One group of 8 keys.
/// Byte offset of 16-byte chunk `c` (0..15) of key `r` in a KV tile.
__device__ __forceinline__ std::uint32_t kv_tile_offset(int r, int c) {
  return static_cast<std::uint32_t>((r >> 3) * kKvGroupBytes + (c >> 3) * kKvHalfBytes +
                                    (r & 7) * 128 + (((c & 7) ^ (r & 7)) << 4));
}
}  // namespace detail

/// Options of the warp-specialised kernel (bit flags, the `Opt` of `CascadeWsTile`).
enum CascadeWsOpt : int {
  /// Probabilities as `2^{fma(s, |scale|, -m)}` on `ex2.approx.ftz` (one FFMA and one MUFU per
  /// score instead of a scale, a subtraction and the subnormal-safe `exp2f`); a negative scale
  /// runs as its magnitude on negated queries (exact in bf16).
  kWsFastExp = 1,
  /// wgmma descriptors from one base per ring stage plus constant offsets per k-step (shared
  /// addresses are below 2^18, so the 14-bit address field never carries into the next field).
  kWsDescPre = 2,
  /// Row max and rescale factor without branches (`max.NaN`; the factor on `ex2.approx.ftz`);
  /// required with kWsFastExp.
  kWsFlatStats = 4,
  /// The accumulator is rescaled after the previous `PV` completed instead of before issuing
  /// it (the same operations in the same order on the accumulator).
  kWsRescaleLate = 8,
  /// Diagnostic only, wrong results (instantiated by probe builds, ATTNSTATE_CASCADE_WS_PROBE):
  /// after the first ring's worth of tiles the producer copies nothing and only signals the
  /// stages (the consumers re-read stale tiles), to time the pipeline without the copies.
  kWsDiagNoCopy = 16,
};

/// Tile configuration: `NWG` consumer warpgroups of 64 rows, `BN` keys per KV tile, `Stages`
/// K/V stages in the ring, the options `Opt` (`CascadeWsOpt` flags); head_dim 128.
template <int NWG_, int BN_, int Stages_, int Opt_ = 0>
struct CascadeWsTile {
  static constexpr int D = 128;
  static constexpr int NWG = NWG_;
  static constexpr int BM = 64 * NWG;  ///< Query rows per CTA.
  static constexpr int BN = BN_;       ///< Keys per KV tile.
  static constexpr int kStages = Stages_;
  static constexpr int kOpt = Opt_;                           ///< The option flags.
  static constexpr bool kFastExp = (Opt_ & kWsFastExp) != 0;  ///< Option kWsFastExp.
  static constexpr int kConsumers = 128 * NWG;
  /// + one producer warpgroup (one warp copies; its registers go to the consumers).
  static constexpr int kThreads = kConsumers + 128;
  /// Registers per thread after `setmaxnreg`: the launch gives every thread
  /// 65536 / kThreads (rounded down to 8); the producer warpgroup drops to kProducerRegs and the
  /// consumers take the rest.
  static constexpr int kProducerRegs = 56;
  static constexpr int kConsumerRegs =
      ((65536 / kThreads / 8 * 8 * kThreads - 128 * kProducerRegs) / kConsumers) / 8 * 8 > 240
          ? 240
          : ((65536 / kThreads / 8 * 8 * kThreads - 128 * kProducerRegs) / kConsumers) / 8 * 8;
  static constexpr int kTileBytes = BN * D * 2;  ///< One K (or V) tile in shared memory.
  /// Dynamic shared memory: 1 KiB of alignment slack, Q, the K and V rings, the mbarriers.
  static constexpr int smem_bytes() {
    return 1024 + BM * D * 2 + 2 * kStages * kTileBytes + 2 * kStages * 8;
  }
  static_assert(BN == 64 || BN == 128, "KV tile of 64 or 128 keys");
  static_assert(NWG == 1 || NWG == 2, "one or two consumer warpgroups");
  static_assert(!kFastExp || (Opt_ & kWsFlatStats) != 0,
                "the fast exponent runs with the branch-free row statistics");
};

/// One CTA: (segment, row tile, split) from `blockIdx.x`, KV head `blockIdx.y`. Threads: the
/// consumer warpgroups first, the producer warpgroup last (with two consumer warpgroups the
/// registers move from the producer to the consumers with `setmaxnreg`).
template <class Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    cascade_level_ws_kernel(const CascadeLevelParams p, const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v,
                            const __grid_constant__ CUtensorMap tm_k_run,
                            const __grid_constant__ CUtensorMap tm_v_run) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = __nv_bfloat16;
  using Wg = arch::Wgmma<__nv_bfloat16>;
  constexpr int D = Tile::D, BM = Tile::BM, BN = Tile::BN, NWG = Tile::NWG;
  constexpr int kStages = Tile::kStages, kConsumers = Tile::kConsumers;
  constexpr bool kFast = Tile::kFastExp;
  constexpr int kChunks = D / 8;
  constexpr std::uint32_t kTileBytes = Tile::kTileBytes;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem_al = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~static_cast<std::uintptr_t>(1023));
  T* s_q = reinterpret_cast<T*>(smem_al);
  T* s_k = s_q + BM * D;
  T* s_v = s_k + kStages * BN * D;
  const std::uint32_t q_smem = arch::smem_addr(s_q);
  const std::uint32_t k_smem = arch::smem_addr(s_k), v_smem = arch::smem_addr(s_v);
  // mbarriers, kStages × 8 bytes each: a stage's K and V landed ("full"), were read ("empty")
  const std::uint32_t full0 = arch::smem_addr(s_v + kStages * BN * D);
  const std::uint32_t empty0 = full0 + kStages * 8;

  const tile::PdlScope pdl;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h_kv = blockIdx.y;
  tile::LevelBlock lb;
  if (!lb.locate(p, BM, BN)) return;
  const int r0 = lb.r0, rows_per_req = lb.rows_per_req;
  const int nrows = lb.nrows, row0 = lb.row0, pbeg = lb.pbeg, len = lb.len;
  const int kv_begin = lb.kv_begin, kv_end = lb.kv_end, n_tiles = lb.n_tiles;

  const T* q = static_cast<const T*>(p.q);
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      arch::mbar_init(full0 + 8 * s, 1);
      arch::mbar_init(empty0 + 8 * s, 4 * NWG);
    }
    arch::fence_mbar_init();
  }
  // --- queries → shared memory, in the 128-byte swizzled layout of the K tiles: each consumer
  // warpgroup copies its own 64 rows (zero past the segment's rows)
  if (tid < kConsumers) {
    const int wg = tid >> 7, t = tid & 127;
    for (int i = t; i < 64 * kChunks; i += 128) {
      const int r = wg * 64 + i / kChunks, c = i % kChunks;
      const int R = row0 + r;
      const T* src = q;
      int bytes = 0;
      if (R < nrows) {
        const int req = r0 + R / rows_per_req, rem = R % rows_per_req;
        const int tt = rem / p.group, g = rem % p.group;
        src = q + req * p.q_stride_b + tt * p.q_stride_t + (h_kv * p.group + g) * p.q_stride_h +
              c * 8;
        bytes = 16;
      }
      arch::cp_async_16_zfill(q_smem + 2 * tile::swz128<BM>(r, c), src, bytes);
    }
    arch::cp_async_commit();
  }
  __syncthreads();  // the mbarriers are initialised

  if (warp >= 4 * NWG) {
    // ================= producer warpgroup: one warp fills the K/V ring =================
    if constexpr (NWG == 2) arch::setmaxnreg_dec<Tile::kProducerRegs>();
    if (warp != 4 * NWG || n_tiles == 0) return;
    const T* kpool = static_cast<const T*>(p.k);
    const T* vpool = static_cast<const T*>(p.v);
    const int G = p.tma_box;        // keys per box (8-64): divides BN and the page size (or is 64)
    const int nb = BN / G;          // boxes per tile and tensor (a power of two ≤ 16)
    const int b = lane & (nb - 1);  // the box this lane copies (lanes below nb)
    const int per_win = 32 / nb;    // tiles per window of 32 boxes
    if (lane == 0) {
      arch::tma_prefetch_map(&tm_k);
      arch::tma_prefetch_map(&tm_v);
      if (p.tma_run) {
        arch::tma_prefetch_map(&tm_k_run);
        arch::tma_prefetch_map(&tm_v_run);
      }
    }
    // page ids by windows of 32 boxes, one per lane, loaded a window ahead of their copies
    auto load_window = [&](int w) {
      const int j = kv_begin + (w * 32 + lane) * G;
      std::int64_t pg = 0;
      if (j < kv_end) pg = p.page_indices[pbeg + tile::page_of(p, j)];
      // tile::clamp_page written out (here and in copy_partial): through the helper ptxas emits
      // other code for this kernel, and it is kept as measured (bench/RESULTS.md, 2026-12-01)
      pg = pg < 0 ? 0 : (pg >= p.num_pages ? p.num_pages - 1 : pg);
      return static_cast<int>(pg);
    };
    // runs: granules of R = p.tma_run keys (several whole pages, R / G boxes) whose pages are
    // consecutive in the pool, one bit per box of the window, set for the boxes of such granules
    const int per_run = p.tma_run > G ? p.tma_run / G : 1;  // boxes per run granule
    auto runs_of = [&](int win) -> unsigned {
      const int first = __shfl_sync(0xffffffffu, win, lane & ~(per_run - 1));
      return __ballot_sync(0xffffffffu, win == first + (lane & (per_run - 1)));
    };
    // the boxes of one whole tile of K or V (`tm`) into the stage at `dst`, completing on `full`:
    // lane b < nb copies box b (G keys, both halves of head_dim); a granule that is a run (`run`,
    // the same for its lanes): one box of R keys from `tm_run` by its first lane, the same bytes
    // in the same places
    auto copy_boxes = [&](std::uint32_t dst, const CUtensorMap* tm, const CUtensorMap* tm_run,
                          bool run, std::uint32_t full, int j0, int page) {
      if (lane >= nb || (run && (b & (per_run - 1)) != 0)) return;
      const int slot = tile::slot_of(p, j0 + b * G);
      int c1 = 0, c2 = 2 * h_kv, c3 = slot >> 3, c4 = page;  // NHD
      if (p.tma_coords == 1) {                               // unpadded HND
        c2 = 0;
        c4 = page * p.heads_kv + h_kv;
      } else if (p.tma_coords == 2) {  // padded HND (boxes of 8 slots)
        c1 = slot;
        c2 = 0;
        c3 = h_kv;
      }
      arch::tma_load_5d(dst + b * G * 256, run ? tm_run : tm, full, 0, c1, c2, c3, c4);
    };
    // the split's last, partial tile: cp.async, keys past the end zero-filled
    auto copy_partial = [&](std::uint32_t dk, std::uint32_t dv, int j0, std::uint32_t full) {
      for (int r = lane; r < BN; r += 32) {
        const int j = j0 + r;
        std::int64_t off = 0;
        int bytes = 0;
        if (j < kv_end) {
          std::int64_t page = p.page_indices[pbeg + tile::page_of(p, j)];
          page = page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
          const int sl = tile::slot_of(p, j);
          off =
              page * p.page_elems + (p.hnd ? (static_cast<std::int64_t>(h_kv) * p.page_size + sl)
                                           : (static_cast<std::int64_t>(sl) * p.heads_kv + h_kv)) *
                                        D;
          bytes = 16;
        }
#pragma unroll 4
        for (int c = 0; c < kChunks; ++c) {
          const std::uint32_t o = detail::kv_tile_offset(r, c);
          arch::cp_async_16_zfill(dk + o, kpool + off + c * 8, bytes);
          arch::cp_async_16_zfill(dv + o, vpool + off + c * 8, bytes);
        }
      }
      arch::cp_async_commit();
      arch::cp_async_wait<0>();
      arch::fence_proxy_async();  // generic-proxy writes → read by wgmma (async proxy)
      __syncwarp();
      if (lane == 0) arch::mbar_arrive(full);
    };
    int win_cur = load_window(0);
    int win_next = load_window(1);
    unsigned runs = p.tma_run ? runs_of(win_cur) : 0u;
    // this lane's granule: its boxes' bits within a tile
    const unsigned granule_bits = ((1u << per_run) - 1u) << (b & ~(per_run - 1));
    for (int kt = 0; kt < n_tiles; ++kt) {
      if (kt > 0 && kt % per_win == 0) {
        win_cur = win_next;
        win_next = load_window(kt / per_win + 1);
        if (p.tma_run) runs = runs_of(win_cur);
      }
      const int page = __shfl_sync(0xffffffffu, win_cur, (kt % per_win) * nb + b);
      const int st = kt % kStages;
      if (kt >= kStages) arch::mbar_wait(empty0 + 8 * st, ((kt / kStages) - 1) & 1);
      const std::uint32_t full = full0 + 8 * st;
      const std::uint32_t dk = k_smem + st * kTileBytes, dv = v_smem + st * kTileBytes;
      const int j0 = kv_begin + kt * BN;
      if ((Tile::kOpt & kWsDiagNoCopy) != 0 && kt >= kStages) {
        if (lane == 0) arch::mbar_arrive(full);  // (diagnostic: the stale tile is re-read)
      } else if (j0 + BN <= kv_end) {
        // a whole tile: the boxes of K, then of V; one mbarrier transaction of K + V bytes
        const unsigned bits = granule_bits << ((kt % per_win) * nb);
        const bool run = per_run > 1 && (runs & bits) == bits;
        if (lane == 0) arch::mbar_arrive_expect_tx(full, 2 * kTileBytes);
        __syncwarp();
        copy_boxes(dk, &tm_k, &tm_k_run, run, full, j0, page);
        copy_boxes(dv, &tm_v, &tm_v_run, run, full, j0, page);
      } else {
        copy_partial(dk, dv, j0, full);
      }
    }
    return;
  }

  // ================= consumer warpgroups =================
  if constexpr (NWG == 2) arch::setmaxnreg_inc<Tile::kConsumerRegs>();
  constexpr int kOpt = Tile::kOpt;
  constexpr bool kDescPre = (kOpt & kWsDescPre) != 0;
  constexpr bool kFlat = kFast;  // the fast exponent comes with the branch-free row statistics
  constexpr bool kLate = (kOpt & kWsRescaleLate) != 0;
  const int wg = warp >> 2, wl = warp & 3;
  // with the fast exponent a negative scale runs as |scale| on negated queries (exact)
  const bool negate_q = kFast && p.s2_scale < 0.f;
  const float sc = kFast ? fabsf(p.s2_scale) : p.s2_scale;
  arch::cp_async_wait<0>();
  arch::named_sync(1 + wg, 128);  // this warpgroup's query rows are in shared memory
  std::uint32_t qf[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int r = wg * 64 + wl * 16 + (lane & 15);
    const int c = ks * 2 + (lane >> 4);
    arch::ldmatrix_x4(qf[ks], q_smem + 2 * tile::swz128<BM>(r, c));
    if (negate_q)
#pragma unroll
      for (int i = 0; i < 4; ++i) qf[ks][i] ^= 0x80008000u;
  }

  // per-thread rows: lane/4 and lane/4 + 8 of the warp's 16; their key limits (causal)
  int limit[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int R = row0 + wg * 64 + wl * 16 + (lane >> 2) + rr * 8;
    limit[rr] = kv_end;
    if (p.causal_tail && R < nrows) {
      const int t = (R % rows_per_req) / p.group;
      limit[rr] = min(kv_end, len - (p.q_len - 1 - t));
    }
  }
  const int limit_min = min(limit[0], limit[1]);

  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  math::OnlineSoftmax os[2];
  float alpha[2] = {1.f, 1.f};
  float s[BN / 8][4];
  std::uint32_t pf[BN / 16][4];

  // descriptors (kWsDescPre): low words of stage 0 (+ a stage's bytes >> 4 per stage, + the
  // k-step's offset >> 4), high words constant (groups of 8 keys 2048 bytes apart, 128-byte
  // swizzle)
  constexpr std::uint32_t kDescHi = (detail::kKvGroupBytes >> 4) | (1u << 30);
  const std::uint32_t kdesc0 = ((k_smem & 0x3FFFFu) >> 4) | (1u << 16);
  const std::uint32_t vdesc0 = ((v_smem & 0x3FFFFu) >> 4) | ((detail::kKvHalfBytes >> 4) << 16);

  // S = Q Kᵀ of the tile in stage `st` (64 rows × BN keys), committed as one wgmma group
  auto issue_s = [&](int st) {
    const std::uint32_t kb = k_smem + st * kTileBytes;
    const std::uint32_t kd = kdesc0 + st * (kTileBytes >> 4);
    arch::fence_regs(s);
    arch::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      // k-step ks: 16 of head_dim, in half ks / 4 (the groups of 8 keys kKvGroupBytes apart)
      const std::uint32_t koff = (ks >> 2) * detail::kKvHalfBytes + (ks & 3) * 32;
      const std::uint64_t desc = kDescPre ? arch::desc_join(kd + (koff >> 4), kDescHi)
                                          : arch::wgmma_desc(kb + koff, 16, detail::kKvGroupBytes);
      if constexpr (BN == 64) {
        if (ks == 0)
          Wg::mma_s64<0>(s, qf[ks], desc);
        else
          Wg::mma_s64<1>(s, qf[ks], desc);
      } else {
        if (ks == 0)
          Wg::mma_s128<0>(s, qf[ks], desc);
        else
          Wg::mma_s128<1>(s, qf[ks], desc);
      }
    }
    arch::wgmma_commit();
  };
  // O += P V of the tile in stage `st`, committed as one wgmma group
  auto issue_pv = [&](int st) {
    const std::uint32_t vb = v_smem + st * kTileBytes;
    const std::uint32_t vd = vdesc0 + st * (kTileBytes >> 4);
    arch::fence_regs(acc);
    arch::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      Wg::mma_o128<1>(acc, pf[kk],
                      // k-step kk: keys 16 kk.. (two groups of 8), the halves kKvHalfBytes apart
                      kDescPre
                          ? arch::desc_join(vd + kk * ((2 * detail::kKvGroupBytes) >> 4), kDescHi)
                          : arch::wgmma_desc(vb + kk * 2 * detail::kKvGroupBytes,
                                             detail::kKvHalfBytes, detail::kKvGroupBytes));
    arch::wgmma_commit();
  };
  // scale, mask, online softmax of tile kt in `s` (scores → unnormalised probabilities); returns
  // whether some row of the warp moved its max (the accumulator then needs `alpha`)
  auto softmax = [&](int kt) {
    const int t0 = kv_begin + kt * BN;
    const int jb = t0 + 2 * (lane & 3);
    const bool masked = t0 + BN > limit_min;
    bool moved = false;
    if constexpr (kFlat) {
      // both rows' maxima first (independent chains), then both rows' factors, no branches
      if (masked) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
          for (int n = 0; n < BN / 8; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& sv = s[n][2 * rr + e];
              sv = jb + n * 8 + e < limit[rr] ? sv : math::neg_inf();
            }
      }
      float bmax[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        float bm[4] = {math::neg_inf(), math::neg_inf(), math::neg_inf(), math::neg_inf()};
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            bm[(n & 1) * 2 + e] = fmaxf(bm[(n & 1) * 2 + e], s[n][2 * rr + e]);
        bmax[rr] = fmaxf(fmaxf(bm[0], bm[1]), fmaxf(bm[2], bm[3]));
      }
      // (a NaN score is left out of the max but its probability is NaN: the row ends NaN;
      // arch::max_nan is math::nan_max in one instruction, for this per-tile row max)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr)
        bmax[rr] = arch::max_nan(bmax[rr], __shfl_xor_sync(0xffffffffu, bmax[rr], 1));
#pragma unroll
      for (int rr = 0; rr < 2; ++rr)
        bmax[rr] = arch::max_nan(bmax[rr], __shfl_xor_sync(0xffffffffu, bmax[rr], 2));
      float nm[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        // OnlineSoftmax::rescale: a factor 1 while nothing was seen, 0 from an empty row
        // (2^-inf), NaN once a max is NaN
        const float m_old = os[rr].m;
        const float m_new = arch::max_nan(m_old, bmax[rr] * sc);
        const bool none = m_new == math::neg_inf();
        alpha[rr] = none ? 1.f : arch::ex2_approx_ftz(m_old - m_new);
        os[rr].l *= alpha[rr];
        os[rr].m = m_new;
        moved |= alpha[rr] != 1.f;
        nm[rr] = none ? 0.f : -m_new;
      }
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        float ps[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& sv = s[n][2 * rr + e];
            sv = arch::ex2_approx_ftz(fmaf(sv, sc, nm[rr]));
            ps[e] += sv;
          }
        os[rr].add(ps[0] + ps[1]);
      }
    } else {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        float bmax = math::neg_inf();
        if (masked) {
#pragma unroll
          for (int n = 0; n < BN / 8; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& sv = s[n][2 * rr + e];
              sv = jb + n * 8 + e < limit[rr] ? sv * sc : math::neg_inf();
              bmax = fmaxf(bmax, sv);
            }
        } else {
#pragma unroll
          for (int n = 0; n < BN / 8; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& sv = s[n][2 * rr + e];
              sv *= sc;
              bmax = fmaxf(bmax, sv);
            }
        }
        // (a NaN score is left out of the max but its probability is NaN: the row ends NaN;
        // arch::max_nan is math::nan_max in one instruction, for this per-tile row max)
        bmax = math::nan_max(bmax, __shfl_xor_sync(0xffffffffu, bmax, 1));
        bmax = math::nan_max(bmax, __shfl_xor_sync(0xffffffffu, bmax, 2));
        alpha[rr] = os[rr].rescale(bmax);
        moved |= alpha[rr] != 1.f;
        // OnlineSoftmax::prob: 2^{s - m}, and 0 for -inf scores, also while m is still -inf
        const float m = os[rr].m == math::neg_inf() ? 0.f : os[rr].m;
        float psum = 0.f;
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& sv = s[n][2 * rr + e];
            sv = exp2f(sv - m);
            psum += sv;
          }
        os[rr].add(psum);
      }
    }
    return __any_sync(0xffffffffu, moved) != 0;
  };
  // the probabilities in `s` → bf16 A fragments of PV
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pf[kk][0] = arch::Mma16816<T>::pack(s[2 * kk][0], s[2 * kk][1]);
      pf[kk][1] = arch::Mma16816<T>::pack(s[2 * kk][2], s[2 * kk][3]);
      pf[kk][2] = arch::Mma16816<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pf[kk][3] = arch::Mma16816<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  };
  auto rescale_acc = [&] {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
  };

  if (n_tiles > 0) {
    // Ping-pong: warpgroup w issues its products after barrier 3 + w, then lets the other go.
    const bool pp = NWG == 2 && p.ws_pingpong != 0 && n_tiles >= 2;
    if (pp && wg == 1) arch::named_arrive(3, 2 * 128);  // warpgroup 0 goes first
    // tile 0: S, softmax (the accumulator is still 0: no rescale)
    arch::mbar_wait(full0, 0);
    issue_s(0);
    arch::wgmma_wait<0>();
    arch::fence_regs(s);
    softmax(0);
    pack_p();
    bool resc = false;
    int st = 0, ph = 0;  // stage and phase of tile kt
    for (int kt = 1; kt < n_tiles; ++kt) {
      int stp;
      if constexpr (kDescPre) {
        stp = st;
        if (++st == kStages) {
          st = 0;
          ph ^= 1;
        }
      } else {
        st = kt % kStages;
        stp = (kt - 1) % kStages;
        ph = (kt / kStages) & 1;
      }
      arch::mbar_wait(full0 + 8 * st, ph);
      if (pp) arch::named_sync(3 + wg, 2 * 128);
      issue_s(st);                        // S_t = Q K_tᵀ
      if (!kLate && resc) rescale_acc();  // O *= alpha_{t-1}
      issue_pv(stp);                      // O += P_{t-1} V_{t-1}
      // the other warpgroup's turn (warpgroup 1 gives no turn after its last products, so
      // every arrival is matched by a wait)
      if (pp && !(wg == 1 && kt == n_tiles - 1)) arch::named_arrive(3 + (wg ^ 1), 2 * 128);
      arch::wgmma_wait<1>();  // S_t is done (PV still runs)
      arch::fence_regs(s);
      resc = softmax(kt);
      arch::fence_regs(s);    // (ptxas still hoists the wait to where P packing may start)
      arch::wgmma_wait<0>();  // PV_{t-1} is done: stage t-1 is free, P may be overwritten
      arch::fence_regs(acc);
      if (lane == 0) arch::mbar_arrive(empty0 + 8 * stp);
      if (kLate && resc) rescale_acc();  // O *= alpha_t
      pack_p();
    }
    const int stl = (n_tiles - 1) % kStages;
    if (!kLate && resc) rescale_acc();
    issue_pv(stl);
    arch::wgmma_wait<0>();
    arch::fence_regs(acc);
    if (lane == 0) arch::mbar_arrive(empty0 + 8 * stl);
  }

  // full row sums across the quad
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = os[rr].l;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    os[rr].l = l;
    // a NaN score whose row saw no other score: make the state NaN, not empty
    if (os[rr].m == math::neg_inf() && l != l) os[rr].m = l;
  }

  // partial state → workspace slot (slot_offset + split); later slots of this segment are empty
  lb.store_partial<D>(p, h_kv, wg * 64 + wl * 16, acc, os);
#elif defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the host never launches it (kernels::sm90a_code_loaded)
#endif
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
