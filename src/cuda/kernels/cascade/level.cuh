/// @file kernels/cascade/level.cuh
/// @brief The cascade level kernel: the partial attention state of a tile of stacked query rows
///        (every request sharing a segment × new tokens × the GQA group) over one KV split of the
///        segment, on tensor cores (mma.sync m16n8k16, fp32 accumulation), KV streamed through a
///        multi-stage cp.async pipeline with swizzled shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "catalog/kernel_shapes.hpp"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/kernels/cascade/params.cuh"
#include "cuda/tile/cascade_level_block.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Tile configuration: `WM` warps along the rows (16 rows each), `WN` warps splitting the keys
/// of each 64-token KV tile; `D` the head dim.
template <int D_, int WM_, int WN_, int Stages_ = 3, int MinBlocks_ = (WM_ * WN_ >= 8 ? 1 : 2)>
struct CascadeTile {
  static constexpr int D = D_;
  static constexpr int WM = WM_;
  static constexpr int WN = WN_;
  static constexpr int BM = 16 * WM;                  ///< Query rows per CTA.
  static constexpr int BN = catalog::kCascadeKvTile;  ///< Keys per KV tile.
  static constexpr int BNW = BN / WN;                 ///< Keys per warp per KV tile.
  static constexpr int kStages = Stages_;             ///< cp.async pipeline depth.
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kChunks = D / 8;          ///< 16-byte chunks per row.
  static constexpr int kMinBlocks = MinBlocks_;  ///< CTAs per SM the registers must allow.
  /// Dynamic shared memory in bytes.
  static constexpr int smem_bytes() { return (BM + 2 * kStages * BN) * D * 2; }
  /// Dynamic shared memory in bytes of the fp8 loader policy: the query tile, one 16-bit K and V
  /// tile, and the stages of stored fp8 rows.
  static constexpr int smem_bytes_fp8() { return (BM + 2 * BN) * D * 2 + 2 * kStages * BN * D; }
  static_assert(BNW % 16 == 0, "each warp needs whole 16-key steps");
  static_assert(D % 16 == 0 && D >= 64, "head_dim must be a multiple of 16, at least 64");
};

namespace detail {

/// S = Q Kᵀ of a warp's 16 rows (A fragments `qf`) over its `BNW` keys `key0..` of the
/// row-swizzled K tile `ks_tile` (`mma.sync`, fp32).
template <class T, int D, int BNW>
__device__ __forceinline__ void level_qk(float (&s)[BNW / 8][4],
                                         const std::uint32_t (&qf)[D / 16][4], const T* ks_tile,
                                         int key0, int lane) {
  using Mma = arch::Mma16816<T>;
  tile::zero_frags(s);
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < BNW / 16; ++np) {
      const int mi = lane >> 3;
      const int key = key0 + np * 16 + (mi >> 1) * 8 + (lane & 7);
      const int c = ks * 2 + (mi & 1);
      std::uint32_t b[4];
      arch::ldmatrix_x4(b, arch::smem_addr(ks_tile + tile::swz<D>(key, c)));
      Mma::mma(s[2 * np], qf[ks], b[0], b[1]);
      Mma::mma(s[2 * np + 1], qf[ks], b[2], b[3]);
    }
  }
}

/// `level_qk` with the query fragments read from the row-swizzled query tile `s_q` (the warp's
/// rows `rbase..`) at each 16 of head_dim instead of held in registers: at head dim 256 those
/// would be 64 registers a thread.
template <class T, int D, int BNW>
__device__ __forceinline__ void level_qk_smem(float (&s)[BNW / 8][4], const T* s_q, int rbase,
                                              const T* ks_tile, int key0, int lane) {
  using Mma = arch::Mma16816<T>;
  tile::zero_frags(s);
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    std::uint32_t qf[4];
    arch::ldmatrix_x4(
        qf, arch::smem_addr(s_q + tile::swz<D>(rbase + (lane & 15), ks * 2 + (lane >> 4))));
#pragma unroll
    for (int np = 0; np < BNW / 16; ++np) {
      const int mi = lane >> 3;
      const int key = key0 + np * 16 + (mi >> 1) * 8 + (lane & 7);
      const int c = ks * 2 + (mi & 1);
      std::uint32_t b[4];
      arch::ldmatrix_x4(b, arch::smem_addr(ks_tile + tile::swz<D>(key, c)));
      Mma::mma(s[2 * np], qf, b[0], b[1]);
      Mma::mma(s[2 * np + 1], qf, b[2], b[3]);
    }
  }
}

/// O += P V of a warp's 16 rows: the probabilities `s` of its `BNW` keys `key0..` times the
/// row-swizzled V tile `vs_tile` (`mma.sync`, the B fragments transposed by `ldmatrix`).
template <class T, int D, int BNW>
__device__ __forceinline__ void level_pv(float (&acc)[D / 8][4], const float (&s)[BNW / 8][4],
                                         const T* vs_tile, int key0, int lane) {
  using Mma = arch::Mma16816<T>;
#pragma unroll
  for (int kk = 0; kk < BNW / 16; ++kk) {
    std::uint32_t a[4];
    a[0] = Mma::pack(s[2 * kk][0], s[2 * kk][1]);
    a[1] = Mma::pack(s[2 * kk][2], s[2 * kk][3]);
    a[2] = Mma::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = Mma::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      const int mi = lane >> 3;
      const int key = key0 + kk * 16 + (mi & 1) * 8 + (lane & 7);
      const int c = dp * 2 + (mi >> 1);
      std::uint32_t b[4];
      arch::ldmatrix_x4_trans(b, arch::smem_addr(vs_tile + tile::swz<D>(key, c)));
      Mma::mma(acc[2 * dp], a, b[0], b[1]);
      Mma::mma(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

/// The warps that split the keys of a tile (`wn` of `WN`, for warp row `wm` of `WM`) merge their
/// states into the `wn == 0` warp through the shared memory at `red` (the KV stages, free once
/// every warp is done with them). Returns false for the other warps (they are done).
template <int D, int WM, int WN>
__device__ __forceinline__ bool level_merge_key_split(float (&acc)[D / 8][4],
                                                      math::OnlineSoftmax (&os)[2], void* red,
                                                      int wm, int wn, int lane) {
  __syncthreads();  // every warp is done with the KV stages: reuse them
  float* red_o = reinterpret_cast<float*>(red);  // [WN][WM][16][D]
  float* red_ml = red_o + WN * WM * 16 * D;      // [WN][WM][16][2]
  if (wn > 0) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = (lane >> 2) + rr * 8;
      float* dst = red_o + ((wn * WM + wm) * 16 + r) * D + 2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        dst[n * 8] = acc[n][2 * rr];
        dst[n * 8 + 1] = acc[n][2 * rr + 1];
      }
      if ((lane & 3) == 0) {
        red_ml[((wn * WM + wm) * 16 + r) * 2] = os[rr].m;
        red_ml[((wn * WM + wm) * 16 + r) * 2 + 1] = os[rr].l;
      }
    }
  }
  __syncthreads();
  if (wn > 0) return false;
#pragma unroll
  for (int w = 1; w < WN; ++w)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = (lane >> 2) + rr * 8;
      math::OnlineSoftmax other;
      other.m = red_ml[((w * WM + wm) * 16 + r) * 2];
      other.l = red_ml[((w * WM + wm) * 16 + r) * 2 + 1];
      const math::OnlineSoftmax::Factors f = os[rr].merge(other);
      const float* src = red_o + ((w * WM + wm) * 16 + r) * D + 2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        acc[n][2 * rr] = acc[n][2 * rr] * f.self + (f.other != 0.f ? src[n * 8] * f.other : 0.f);
        acc[n][2 * rr + 1] =
            acc[n][2 * rr + 1] * f.self + (f.other != 0.f ? src[n * 8 + 1] * f.other : 0.f);
      }
    }
  return true;
}

}  // namespace detail

/// Dynamic shared memory of the `mma.sync` level kernel of tile `Tile` under KV loader policy
/// `kKv`.
template <class Tile, int kKv>
constexpr int cascade_level_smem_bytes() {
  return kKv == tile::kKvSame ? Tile::smem_bytes() : Tile::smem_bytes_fp8();
}

/// One CTA: (segment, row tile, split) from `blockIdx.x`, KV head `blockIdx.y`. `kVar`: the
/// variant instance, which applies `p.soft_cap` to the scaled scores and the window
/// `p.window_left` (`tile::VariantScores`, `tile::level_variant`). `kKv`: the KV loader policy,
/// K/V of the queries' dtype or fp8 (e4m3, e5m2) converted per tile (`tile::LevelLoader`), their
/// dequantisation scales `k_scale` (joining the score scale) and `v_scale` (on the output).
template <class T, class Tile, bool kVar, int kKv>
__device__ __forceinline__ void cascade_level_body(const CascadeLevelParams& p,
                                                   const KvScale& k_scale_of,
                                                   const KvScale& v_scale_of) {
  constexpr int D = Tile::D, WM = Tile::WM, WN = Tile::WN, BM = Tile::BM, BN = Tile::BN;
  constexpr int BNW = Tile::BNW, kStages = Tile::kStages, kThreads = Tile::kThreads;
  constexpr bool kFp8 = kKv != tile::kKvSame;
  // the key-split warps' merge reuses the K/V shared memory
  static_assert(
      WN == 1 || cascade_level_smem_bytes<Tile, kKv>() - BM * D * 2 >= WN * WM * 16 * (D + 2) * 4,
      "the key-split merge fits the K/V shared memory");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  // 16-bit K/V: the stages; fp8: one converted K and V tile, then the stages of stored rows
  T* s_q = reinterpret_cast<T*>(smem_raw);
  using Loader =
      tile::LevelLoader<T, D, BN, kThreads, kStages,
                        std::conditional_t<kFp8, tile::Fp8Rows<D>, tile::RowSwizzle<D>>, kKv>;
  const typename Loader::Smem kv = Loader::smem(s_q + BM * D);
  T* s_k = kv.tile_k;
  T* s_v = kv.tile_v;

  const tile::PdlScope pdl;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp % WM, wn = warp / WM;
  const int h_kv = blockIdx.y;
  tile::LevelBlock lb;
  if (!lb.locate(p, BM, BN)) return;
  tile::VariantScores var;  // (the kVar instance only)
  if constexpr (kVar) {
    if (!tile::level_variant(p, lb, wm * 16, lane, BN, var)) return;
  }
  // fp8: K's dequantisation scale joins the score scale
  const float s2_scale = tile::level_score_scale<kFp8, kVar>(p, k_scale_of, h_kv, var);
  const Loader ld(p, lb, kv.stage_k, kv.stage_v, h_kv, tid);
  int pg[Loader::kLoadIters];
  ld.template start_with_q<BM>(s_q, tid, pg);
  // --- per-thread rows: g = lane/4 and g + 8 of the warp's 16; their key limits (causal)
  int limit[2];
  ld.causal_limits(wm * 16, lane, limit);
  const int kv_begin = lb.kv_begin, n_tiles = lb.n_tiles;
  // query fragments in registers up to head dim 128; past it read from shared memory per use
  constexpr bool kQInRegs = D <= 128;
  std::uint32_t qf[kQInRegs ? D / 16 : 1][4];
  if constexpr (kQInRegs) {
    ld.q_frags(qf, s_q, wm * 16, lane);
  } else {
    arch::cp_async_wait<kStages - 1>();  // the query tile (the first commit group) landed
    __syncthreads();
  }

  float acc[D / 8][4];
  tile::zero_frags(acc);
  math::OnlineSoftmax os[2];

  for (int kt = 0; kt < n_tiles; ++kt) {
    arch::cp_async_wait<kStages - 2>();
    __syncthreads();
    ld.advance(kt, pg);
    const T* ks_tile = s_k + (kFp8 ? 0 : (kt % kStages) * BN * D);
    const T* vs_tile = s_v + (kFp8 ? 0 : (kt % kStages) * BN * D);
    if constexpr (kFp8) {
      ld.convert(kt % kStages, s_k, s_v);
      __syncthreads();
    }

    float s[BNW / 8][4];  // S = Q Kᵀ over this warp's BNW keys
    if constexpr (kQInRegs)
      detail::level_qk<T, D, BNW>(s, qf, ks_tile, wn * BNW, lane);
    else
      detail::level_qk_smem<T, D, BNW>(s, s_q, wm * 16, ks_tile, wn * BNW, lane);
    // scale, mask, online softmax (rows g and g + 8)
    const int t0 = kv_begin + kt * BN + wn * BNW;
    if constexpr (kVar)
      tile::online_softmax_step<BNW, D>(s, s, acc, os, limit, t0, s2_scale, lane, var);
    else
      tile::online_softmax_step<BNW, D>(s, s, acc, os, limit, t0, s2_scale, lane);
    detail::level_pv<T, D, BNW>(acc, s, vs_tile, wn * BNW, lane);  // O += P V
  }
  arch::cp_async_wait<0>();
  tile::quad_row_sums(os);

  // warps that split the keys of a tile: merge their states into the wn == 0 warp
  if constexpr (WN > 1) {
    if (!detail::level_merge_key_split<D, WM, WN>(acc, os, s_k, wm, wn, lane)) return;
  }

  // fp8: V's dequantisation scale on the output
  if constexpr (kFp8) tile::scale_frags(acc, v_scale_of.at(h_kv));
  // partial state → workspace slot (slot_offset + split); later slots of this segment are empty
  lb.store_partial<D>(p, h_kv, wm * 16, acc, os);
}

/// The level kernel over K/V of the queries' dtype (`cascade_level_body`).
template <class T, class Tile, bool kVar = false>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    cascade_level_kernel(const CascadeLevelParams p) {
  cascade_level_body<T, Tile, kVar, tile::kKvSame>(p, KvScale{}, KvScale{});
}

/// The level kernel over fp8 K/V (`kKv`: e4m3 or e5m2) with their dequantisation scales
/// (`cascade_level_body`).
template <class T, class Tile, bool kVar, int kKv>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    cascade_level_fp8_kernel(const CascadeLevelParams p, const KvScale k_scale,
                             const KvScale v_scale) {
  static_assert(kKv != tile::kKvSame, "an fp8 loader policy");
  cascade_level_body<T, Tile, kVar, kKv>(p, k_scale, v_scale);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
