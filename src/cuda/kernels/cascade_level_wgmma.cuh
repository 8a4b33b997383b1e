/// @file cascade_level_wgmma.cuh
/// @brief The cascade level kernel on Hopper's warpgroup MMA (sm_90a `wgmma`): the same work and
///        numerics as cascade_level.cuh (one CTA = a tile of stacked query rows × one KV split of a
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
#include "cuda/kernels/cascade_level.cuh"

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

/// Element offset of 16-byte chunk `c` of KV row `r` in the 128B-swizzled layout the tensor
/// cores read: `[D / 64][rows][64]`, chunk `c % 8` XOR `r % 8` inside each 128-byte row.
template <int Rows>
__device__ __forceinline__ int swz128(int r, int c) {
  return (c >> 3) * Rows * 64 + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

}  // namespace detail

/// Tile configuration of the wgmma kernel: `NWG` warpgroups of 64 rows; `D` the head dim.
template <int D_, int NWG_>
struct CascadeWgmmaTile {
  static constexpr int D = D_;
  static constexpr int NWG = NWG_;
  static constexpr int BM = 64 * NWG;
  static constexpr int BN = 64;
  static constexpr int kStages = 3;
  static constexpr int kThreads = 128 * NWG;
  static constexpr int kChunks = D / 8;
  /// Register cap: leaves room on an SM for a CTA of the 16-row kernel beside one of these (so
  /// a unique-suffix level can overlap a shared-prefix level), and 2 CTAs of 64 rows.
  static constexpr int kMaxRegs = NWG >= 2 ? 192 : 224;
  /// Dynamic shared memory in bytes (+1 KiB to align the swizzle atoms to 1024 bytes).
  static constexpr int smem_bytes() { return (BM + 2 * kStages * BN) * D * 2 + 1024; }
  static_assert(D == 64 || D == 128, "wgmma path: head_dim 64 or 128");
};

/// One CTA: (segment, row tile, split) from `blockIdx.x`, KV head `blockIdx.y`.
template <class T, class Tile>
__global__ void __maxnreg__(Tile::kMaxRegs) cascade_level_wgmma_kernel(const CascadeLevelParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Tile::D, BM = Tile::BM, BN = Tile::BN;
  constexpr int kStages = Tile::kStages, kThreads = Tile::kThreads, kChunks = Tile::kChunks;
  using Wg = detail::WgmmaType<T>;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem_al = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~static_cast<std::uintptr_t>(1023));
  T* s_q = reinterpret_cast<T*>(smem_al);
  T* s_k = s_q + BM * D;
  T* s_v = s_k + kStages * BN * D;

  const detail::PdlScope pdl;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h_kv = blockIdx.y;
  detail::LevelBlock lb;
  if (!lb.locate(p, BM, BN)) return;
  const int r0 = lb.r0, rows_per_req = lb.rows_per_req;
  const int nrows = lb.nrows, row0 = lb.row0, pbeg = lb.pbeg, len = lb.len;
  const int kv_begin = lb.kv_begin, kv_end = lb.kv_end, n_tiles = lb.n_tiles;

  const T* q = static_cast<const T*>(p.q);
  const T* kpool = static_cast<const T*>(p.k);
  const T* vpool = static_cast<const T*>(p.v);

  for (int i = tid; i < BM * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int R = row0 + r;
    const T* src = q;
    int bytes = 0;
    if (R < nrows) {
      const int req = r0 + R / rows_per_req, rem = R % rows_per_req;
      const int t = rem / p.group, g = rem % p.group;
      src = q + req * p.q_stride_b + t * p.q_stride_t + (h_kv * p.group + g) * p.q_stride_h + c * 8;
      bytes = 16;
    }
    arch::cp_async_16_zfill(arch::smem_addr(s_q + detail::swz<D>(r, c)), src, bytes);
  }
  arch::cp_async_commit();

  // KV tile loads: thread `tid` copies 16-byte chunk `c_ld` of rows `r_ld + it * kRowStep`.
  // The page ids of a tile are fetched one tile ahead of its copies (`pg`), so the dependent
  // page-table loads overlap the math instead of stalling every copy.
  constexpr int kLoadIters = BN * kChunks / kThreads;
  constexpr int kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && (BN * kChunks) % kThreads == 0, "load mapping");
  const int c_ld = tid % kChunks, r_ld = tid / kChunks;
  auto fetch_pages = [&](int kt, int(&pg)[kLoadIters]) {
    const int jb = kv_begin + kt * BN + r_ld;
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      const int j = jb + it * kRowStep;
      pg[it] = j < kv_end ? p.page_indices[pbeg + detail::page_of(p, j)] : 0;
    }
  };
  auto issue_kv = [&](int kt, int stage, const int(&pg)[kLoadIters]) {
    T* dk = s_k + stage * BN * D;
    T* dv = s_v + stage * BN * D;
    const int jb = kv_begin + kt * BN;
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      const int r = r_ld + it * kRowStep, c = c_ld;
      const int j = jb + r;
      const T* ks = kpool;
      const T* vs = vpool;
      int bytes = 0;
      if (j < kv_end) {
        std::int64_t page = pg[it];
        page = page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
        const int slot = detail::slot_of(p, j);
        const std::int64_t off = page * p.page_elems +
                                 (p.hnd ? (static_cast<std::int64_t>(h_kv) * p.page_size + slot)
                                        : (static_cast<std::int64_t>(slot) * p.heads_kv + h_kv)) *
                                     D +
                                 c * 8;
        ks = kpool + off;
        vs = vpool + off;
        bytes = 16;
      }
      arch::cp_async_16_zfill(arch::smem_addr(dk + detail::swz128<BN>(r, c)), ks, bytes);
      arch::cp_async_16_zfill(arch::smem_addr(dv + detail::swz128<BN>(r, c)), vs, bytes);
    }
  };

  int pg[kLoadIters];
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles) {
      fetch_pages(st, pg);
      issue_kv(st, st, pg);
    }
    arch::cp_async_commit();
  }
  if (p.prefetch_pages && kStages - 1 < n_tiles) fetch_pages(kStages - 1, pg);

  int limit[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int R = row0 + warp * 16 + (lane >> 2) + rr * 8;
    limit[rr] = kv_end;
    if (p.causal_tail && R < nrows) {
      const int t = (R % rows_per_req) / p.group;
      limit[rr] = min(kv_end, len - (p.q_len - 1 - t));
    }
  }

  arch::cp_async_wait<kStages - 1>();
  __syncthreads();
  std::uint32_t qf[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int r = warp * 16 + (lane & 15);
    const int c = ks * 2 + (lane >> 4);
    arch::ldmatrix_x4(qf[ks], arch::smem_addr(s_q + detail::swz<D>(r, c)));
  }

  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  math::OnlineSoftmax os[2];

  for (int kt = 0; kt < n_tiles; ++kt) {
    arch::cp_async_wait<kStages - 2>();
    arch::fence_proxy_async();
    __syncthreads();
    {
      const int nt = kt + kStages - 1;
      if (nt < n_tiles) {
        if (!p.prefetch_pages) fetch_pages(nt, pg);
        issue_kv(nt, nt % kStages, pg);
      }
      arch::cp_async_commit();
      if (p.prefetch_pages && nt + 1 < n_tiles) fetch_pages(nt + 1, pg);
    }
    const std::uint32_t k_base = arch::smem_addr(s_k + (kt % kStages) * BN * D);
    const std::uint32_t v_base = arch::smem_addr(s_v + (kt % kStages) * BN * D);

    // S = Q Kᵀ (64 rows of this warpgroup × 64 keys)
    float s[BN / 8][4];
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
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

    const int jb = kv_begin + kt * BN + 2 * (lane & 3);
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float bmax = math::neg_inf();
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = jb + n * 8 + e;
          float& sv = s[n][2 * rr + e];
          sv = j < limit[rr] ? sv * p.s2_scale : math::neg_inf();
          bmax = math::nan_max(bmax, sv);
        }
      bmax = math::nan_max(bmax, __shfl_xor_sync(0xffffffffu, bmax, 1));
      bmax = math::nan_max(bmax, __shfl_xor_sync(0xffffffffu, bmax, 2));
      const float alpha = os[rr].rescale(bmax);
      // Multiplying by 1 is the identity: skip the rescale when no row of the warp's max moved
      // (the common case after the first tiles), bitwise the same result.
      if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          acc[n][2 * rr] *= alpha;
          acc[n][2 * rr + 1] *= alpha;
        }
      }
      float psum = 0.f;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& sv = s[n][2 * rr + e];
          sv = os[rr].prob(sv);
          psum += sv;
        }
      os[rr].add(psum);
    }

    // O += P V (P from registers, V MN-major in shared memory)
    std::uint32_t pf[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pf[kk][0] = arch::Mma16816<T>::pack(s[2 * kk][0], s[2 * kk][1]);
      pf[kk][1] = arch::Mma16816<T>::pack(s[2 * kk][2], s[2 * kk][3]);
      pf[kk][2] = arch::Mma16816<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pf[kk][3] = arch::Mma16816<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
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

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = os[rr].l;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    os[rr].l = l;
  }

  lb.store_partial<D>(p, h_kv, warp * 16, acc, os);
#elif defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the host never launches it (kernels::sm90a_code_loaded)
#endif
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
