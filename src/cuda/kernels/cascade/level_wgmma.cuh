/// @file kernels/cascade/level_wgmma.cuh
/// @brief The cascade level kernel on Hopper's warpgroup MMA (sm_90a `wgmma`): the same work and
///        numerics as level.cuh (one CTA = a tile of stacked query rows × one KV split of a
///        segment, online softmax in fp32, partial state to the workspace), with `QKᵀ` and `PV` as
///        `wgmma.mma_async` (A = queries / probabilities from registers, B = K / V tiles read by
///        the tensor cores straight from 128-byte-swizzled shared memory). 64 query rows per
///        warpgroup; the KV tiles stream through the same cp.async pipeline.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/wgmma.cuh"
#include "cuda/kernels/cascade/level.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {
namespace detail {

/// The `wgmma` shapes of this kernel for operands `T` (bf16 or f16), accumulating.
template <class T>
struct WgmmaType {
  /// S += A Bᵀ: m64n64k16, B K-major (keys × head_dim rows).
  __device__ static __forceinline__ void mma_s(float (&d)[8][4], const std::uint32_t (&a)[4],
                                               std::uint64_t desc_b) {
    arch::Wgmma<T>::template mma_s64<1>(d, a, desc_b);
  }
  /// O += P V: m64n128k16, B MN-major (V rows = keys).
  __device__ static __forceinline__ void mma_o128(float (&d)[16][4], const std::uint32_t (&a)[4],
                                                  std::uint64_t desc_b) {
    arch::Wgmma<T>::template mma_o128<1>(d, a, desc_b);
  }
  /// O += P V: m64n64k16, B MN-major (head_dim 64).
  __device__ static __forceinline__ void mma_o64(float (&d)[8][4], const std::uint32_t (&a)[4],
                                                 std::uint64_t desc_b) {
    arch::Wgmma<T>::template mma_o64<1>(d, a, desc_b);
  }
};

}  // namespace detail

/// Tile configuration of the wgmma kernel: `NWG` warpgroups of 64 rows; `D` the head dim.
template <int D_, int NWG_>
struct CascadeWgmmaTile {
  static constexpr int D = D_;
  static constexpr int NWG = NWG_;
  static constexpr int BM = 64 * NWG;
  static constexpr int BN = catalog::kCascadeKvTile;
  static constexpr int kStages = 3;
  static constexpr int kThreads = 128 * NWG;
  static constexpr int kChunks = D / 8;
  /// Register cap: leaves room on an SM for a CTA of the 16-row kernel beside one of these (so
  /// a unique-suffix level can overlap a shared-prefix level), and 2 CTAs of 64 rows.
  static constexpr int kMaxRegs = NWG >= 2 ? 192 : 224;
  /// Dynamic shared memory in bytes (+1 KiB to align the swizzle atoms to 1024 bytes).
  static constexpr int smem_bytes() { return (BM + 2 * kStages * BN) * D * 2 + 1024; }
  /// Dynamic shared memory in bytes of the fp8 loader policy: the query tile, one 16-bit K and V
  /// tile, the stages of stored fp8 rows.
  static constexpr int smem_bytes_fp8() {
    return (BM + 2 * BN) * D * 2 + 2 * kStages * BN * D + 1024;
  }
  static_assert(D == 64 || D == 128, "wgmma path: head_dim 64 or 128");
};

/// Dynamic shared memory of the wgmma level kernel of tile `Tile` under KV loader policy `kKv`.
template <class Tile, int kKv>
constexpr int cascade_level_wgmma_smem_bytes() {
  return kKv == tile::kKvSame ? Tile::smem_bytes() : Tile::smem_bytes_fp8();
}

/// One CTA: (segment, row tile, split) from `blockIdx.x`, KV head `blockIdx.y`. `kVar`: the
/// variant instance, which applies `p.soft_cap` to the scaled scores and the window
/// `p.window_left` (`tile::VariantScores`, `tile::level_variant`). `kKv`: the KV loader policy,
/// K/V of the queries' dtype or fp8 converted per tile into the 128-byte-swizzled 16-bit tiles
/// the tensor cores read (`tile::LevelLoader::convert`), with their dequantisation scales
/// `k_scale_of` (joining the score scale) and `v_scale_of` (on the output).
template <class T, class Tile, bool kVar, int kKv>
__device__ __forceinline__ void cascade_level_wgmma_body(const CascadeLevelParams& p,
                                                         const KvScale& k_scale_of,
                                                         const KvScale& v_scale_of) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Tile::D, BM = Tile::BM, BN = Tile::BN;
  constexpr int kStages = Tile::kStages, kThreads = Tile::kThreads;
  constexpr bool kFp8 = kKv != tile::kKvSame;
  using Wg = detail::WgmmaType<T>;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem_al = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~static_cast<std::uintptr_t>(1023));
  // 16-bit K/V: the stages; fp8: one converted K and V tile, then the stages of stored rows
  T* s_q = reinterpret_cast<T*>(smem_al);
  using Loader =
      tile::LevelLoader<T, D, BN, kThreads, kStages,
                        std::conditional_t<kFp8, tile::Fp8Rows<D>, tile::Swizzle128<BN>>, kKv>;
  const typename Loader::Smem kv = Loader::smem(s_q + BM * D);
  T* s_k = kv.tile_k;
  T* s_v = kv.tile_v;

  const tile::PdlScope pdl;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h_kv = blockIdx.y;
  tile::LevelBlock lb;
  if (!lb.locate(p, BM, BN)) return;
  tile::VariantScores var;  // (the kVar instance only)
  if constexpr (kVar) {
    if (!tile::level_variant(p, lb, warp * 16, lane, BN, var)) return;
  }
  // fp8: K's dequantisation scale joins the score scale
  const float s2_scale = tile::level_score_scale<kFp8, kVar>(p, k_scale_of, h_kv, var);
  const Loader ld(p, lb, kv.stage_k, kv.stage_v, h_kv, tid);
  int pg[Loader::kLoadIters];
  ld.template start_with_q<BM>(s_q, tid, pg);
  // --- per-thread rows: g = lane/4 and g + 8 of the warp's 16; their key limits (causal)
  int limit[2];
  ld.causal_limits(warp * 16, lane, limit);
  const int kv_begin = lb.kv_begin, n_tiles = lb.n_tiles;
  std::uint32_t qf[D / 16][4];
  ld.q_frags(qf, s_q, warp * 16, lane);

  float acc[D / 8][4];
  tile::zero_frags(acc);
  math::OnlineSoftmax os[2];

  for (int kt = 0; kt < n_tiles; ++kt) {
    arch::cp_async_wait<kStages - 2>();
    arch::fence_proxy_async();
    __syncthreads();
    ld.advance(kt, pg);
    const std::uint32_t k_base = arch::smem_addr(s_k + (kFp8 ? 0 : (kt % kStages) * BN * D));
    const std::uint32_t v_base = arch::smem_addr(s_v + (kFp8 ? 0 : (kt % kStages) * BN * D));
    if constexpr (kFp8) {  // the converted tiles, written by threads, read by the tensor cores
      ld.template convert<tile::Swizzle128<BN>>(kt % kStages, s_k, s_v);
      arch::fence_proxy_async();
      __syncthreads();
    }

    // S = Q Kᵀ (64 rows of this warpgroup × 64 keys)
    float s[BN / 8][4];
    tile::zero_frags(s);
    arch::fence_regs(s);
    arch::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const std::uint32_t addr = k_base + (ks >> 2) * (BN * 128) + (ks & 3) * 32;
      Wg::mma_s(s, qf[ks], arch::wgmma_desc(addr, 16, 1024));
    }
    arch::wgmma_commit();
    arch::wgmma_wait<0>();
    arch::fence_regs(s);

    // scale, mask, online softmax (rows g and g + 8)
    if constexpr (kVar)
      tile::online_softmax_step<BN, D>(s, s, acc, os, limit, kv_begin + kt * BN, s2_scale, lane,
                                       var);
    else
      tile::online_softmax_step<BN, D>(s, s, acc, os, limit, kv_begin + kt * BN, s2_scale, lane);

    // O += P V (P from registers, V MN-major in shared memory)
    std::uint32_t pf[BN / 16][4];
    tile::pack_p<T, BN>(s, pf);
    arch::fence_regs(acc);
    arch::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const std::uint64_t desc = arch::wgmma_desc(v_base + kk * 16 * 128, BN * 128, 1024);
      if constexpr (D == 128)
        Wg::mma_o128(acc, pf[kk], desc);
      else
        Wg::mma_o64(acc, pf[kk], desc);
    }
    arch::wgmma_commit();
    arch::wgmma_wait<0>();
    arch::fence_regs(acc);
  }
  arch::cp_async_wait<0>();
  tile::quad_row_sums(os);

  // fp8: V's dequantisation scale on the output
  if constexpr (kFp8) tile::scale_frags(acc, v_scale_of.at(h_kv));
  lb.store_partial<D>(p, h_kv, warp * 16, acc, os);
#elif defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the plan never picks it (DeviceFacts::wgmma())
#endif
}

/// The wgmma level kernel over K/V of the queries' dtype (`cascade_level_wgmma_body`).
template <class T, class Tile, bool kVar = false>
__global__ void __maxnreg__(Tile::kMaxRegs) cascade_level_wgmma_kernel(const CascadeLevelParams p) {
  cascade_level_wgmma_body<T, Tile, kVar, tile::kKvSame>(p, KvScale{}, KvScale{});
}

/// The wgmma level kernel over fp8 K/V (`kKv`: e4m3 or e5m2) with their dequantisation scales
/// (`cascade_level_wgmma_body`).
template <class T, class Tile, bool kVar, int kKv>
__global__ void __maxnreg__(Tile::kMaxRegs)
    cascade_level_wgmma_fp8_kernel(const CascadeLevelParams p, const KvScale k_scale,
                                   const KvScale v_scale) {
  static_assert(kKv != tile::kKvSame, "an fp8 loader policy");
  cascade_level_wgmma_body<T, Tile, kVar, kKv>(p, k_scale, v_scale);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
