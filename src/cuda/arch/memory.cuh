/// @file memory.cuh
/// @brief PTX wrappers of memory instructions: shared-memory addresses, per-thread asynchronous
///        copies global → shared (`cp.async`, sm_80, with commit groups, zero fill and L2
///        hints), non-allocating vector loads, L2 prefetch, the acquire-release atomic, and
///        distributed shared memory of a thread-block cluster (sm_90).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace attnstate {
namespace cuda {
namespace arch {

/// Shared-memory address of a generic pointer (for the `.shared` operands below).
__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Per-thread cp.async exists from sm_80; below it the copies and their waits are no-ops (no
// kernel that relies on them runs there).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define ATTNSTATE_ARCH_CP_ASYNC 1
#else
#define ATTNSTATE_ARCH_CP_ASYNC 0
#endif

/// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned), bypassing L1.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src) {
#if ATTNSTATE_ARCH_CP_ASYNC
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
#endif
}

/// Copies 4 bytes from global `src` to shared `dst` (both 4-byte aligned), through L1.
__device__ __forceinline__ void cp_async_4(std::uint32_t dst, const void* src) {
#if ATTNSTATE_ARCH_CP_ASYNC
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
#endif
}

/// As `cp_async_16`, reading only the first `bytes` (0 or 16) of `src` and zero-filling the
/// rest (`bytes` 0 writes zeros without reading). `kL2Prefetch` 256 or 128 asks the L2 to fetch
/// the whole block of that size around the address; 0 adds no hint.
template <int kL2Prefetch = 0>
__device__ __forceinline__ void cp_async_16_zfill(std::uint32_t dst, const void* src, int bytes) {
  static_assert(kL2Prefetch == 0 || kL2Prefetch == 128 || kL2Prefetch == 256, "an L2 block");
#if ATTNSTATE_ARCH_CP_ASYNC
  if constexpr (kL2Prefetch == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes)
                 : "memory");
  } else if constexpr (kL2Prefetch == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
  }
#endif
}

/// As `cp_async_16_zfill` without prefetch, with an L2 cache policy (`l2_evict_first_policy`).
__device__ __forceinline__ void cp_async_16_zfill_policy(std::uint32_t dst, const void* src,
                                                         int bytes, std::uint64_t policy) {
#if ATTNSTATE_ARCH_CP_ASYNC
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(bytes), "l"(policy)
               : "memory");
#endif
}

/// An L2 cache policy that evicts the lines it covers first.
__device__ __forceinline__ std::uint64_t l2_evict_first_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

/// Closes this thread's current group of `cp.async` copies (possibly empty).
__device__ __forceinline__ void cp_async_commit() {
#if ATTNSTATE_ARCH_CP_ASYNC
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// Waits until at most `N` of this thread's most recent groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if ATTNSTATE_ARCH_CP_ASYNC
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#undef ATTNSTATE_ARCH_CP_ASYNC

/// 16 bytes of read-only global memory (not written by the running kernel), 16-byte aligned,
/// loaded without allocating them in L1 (streamed data does not evict what a thread reuses).
/// Not volatile: the compiler may merge or move it like an ordinary load.
__device__ __forceinline__ uint4 ld_global_nc_no_allocate(const void* p) {
  uint4 w;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
      : "l"(p));
  return w;
}

/// 16 bytes of shared memory at shared address `addr` (16-byte aligned). Volatile: the
/// producer warps read what mbarriers ordered, which the compiler cannot see.
__device__ __forceinline__ uint4 ld_shared_v4(std::uint32_t addr) {
  uint4 w;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
               : "r"(addr)
               : "memory");
  return w;
}

/// Stores 16 bytes to shared memory at shared address `addr` (16-byte aligned).
__device__ __forceinline__ void st_shared_v4(std::uint32_t addr, uint4 w) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(w.x), "r"(w.y),
               "r"(w.z), "r"(w.w)
               : "memory");
}

/// Stores 4 bytes to shared memory at shared address `addr` (4-byte aligned).
__device__ __forceinline__ void st_shared_b32(std::uint32_t addr, std::uint32_t w) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(w) : "memory");
}

/// Asks the L2 to fetch the line of `p` (no registers held while it is in flight).
__device__ __forceinline__ void prefetch_global_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
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
/// As `ld_cluster`, four consecutive floats (16-byte aligned).
__device__ __forceinline__ float4 ld_cluster4(std::uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
/// Stores to distributed shared memory (an address from `cluster_map`).
__device__ __forceinline__ void st_cluster(std::uint32_t addr, int v) {
  asm volatile("st.shared::cluster.s32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

}  // namespace arch
}  // namespace cuda
}  // namespace attnstate
