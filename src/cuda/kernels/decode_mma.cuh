/// @file decode_mma.cuh
/// @brief Warp-level PTX helpers of the decode kernel: cp.async, ldmatrix, the m16n8k16
///        tensor-core MMA (bf16 or f16 operands, fp32 accumulation), the acquire-release ticket
///        atomic, and the thread-block-cluster barrier and distributed-shared-memory accesses of
///        the split merges. Internal.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace attnstate {
namespace cuda {
namespace detail {

/// Shared-memory address of a generic pointer.
__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte asynchronous copy global → shared; `bytes` 0 zero-fills the destination.
/// `kPrefetch` (256 or 128) asks the L2 to fetch the whole block of that size around the address.
template <int kPrefetch = 256>
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int bytes) {
  if constexpr (kPrefetch == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes)
                 : "memory");
  } else if constexpr (kPrefetch == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
  }
}
/// As `cp_async_16` without prefetch, with an L2 cache policy (from `l2_evict_first_policy`).
__device__ __forceinline__ void cp_async_16_policy(std::uint32_t dst, const void* src, int bytes,
                                                   std::uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(bytes), "l"(policy)
               : "memory");
}
/// An L2 cache policy that evicts the lines it covers first.
__device__ __forceinline__ std::uint64_t l2_evict_first_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// Four 8×8 b16 matrices from shared memory (lane `l` gives the row address of matrix `l/8`).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t r[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
/// As `ldmatrix_x4`, transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t r[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// `c += a · b` on a 16×8×16 tile, fp32 accumulators; `kBF16` selects bf16 or f16 operands.
template <bool kBF16>
__device__ __forceinline__ void mma_16816(float c[4], const std::uint32_t a[4], std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// Packs two floats into a b16x2 register (round to nearest even), `lo` in the low half.
template <bool kBF16>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (kBF16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
}

/// `atomicAdd` on a global int at GPU scope with acquire-release semantics: the writes that
/// precede it (in this thread, or in the CTA before a barrier) are released with it, and the
/// writes released by earlier additions are visible to what follows it. Returns the old value.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* addr, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(addr), "r"(v)
               : "memory");
  return old;
}

/// Cluster-wide barrier: every thread of every CTA of the cluster arrives (release) and waits
/// (acquire), so shared-memory writes before it are visible to the cluster's CTAs after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/// The first half of a cluster barrier without memory ordering: signals that this thread runs
/// (the CTA's shared memory exists); `cluster_wait` completes the phase.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
/// Waits until every thread of the cluster has arrived at the current barrier phase.
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}
/// Address in CTA `rank` of the cluster of the shared-memory location `addr` of this CTA.
__device__ __forceinline__ std::uint32_t cluster_map(std::uint32_t addr, std::uint32_t rank) {
  std::uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
/// Loads from distributed shared memory (an address from `cluster_map`).
__device__ __forceinline__ float ld_cluster(std::uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
/// Stores to distributed shared memory (an address from `cluster_map`).
__device__ __forceinline__ void st_cluster(std::uint32_t addr, int v) {
  asm volatile("st.shared::cluster.s32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
/// As `ld_cluster`, four consecutive floats (16-byte aligned).
__device__ __forceinline__ float4 ld_cluster4(std::uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
