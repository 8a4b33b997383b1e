/// @file merge_cp_async.cuh
/// @brief Per-thread asynchronous global-to-shared copies (`cp.async`, sm_80) with commit
///        groups, as used by the ring kernel of `merge_states`.
#pragma once

#include <cstdint>

namespace attnstate {
namespace cuda {
namespace kernels {

/// True in device code compiled for sm_80 or newer (per-thread `cp.async` exists).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define ATTNSTATE_MERGE_CP_ASYNC 1
#else
#define ATTNSTATE_MERGE_CP_ASYNC 0
#endif

/// Shared-memory address of `p` (for the `.shared` operands of the copies).
__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned), bypassing L1.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src) {
#if ATTNSTATE_MERGE_CP_ASYNC
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
#endif
}

/// Copies 4 bytes from global `src` to shared `dst` (both 4-byte aligned).
__device__ __forceinline__ void cp_async_4(std::uint32_t dst, const void* src) {
#if ATTNSTATE_MERGE_CP_ASYNC
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
#endif
}

/// Closes this thread's current group of `cp.async` copies (possibly empty).
__device__ __forceinline__ void cp_async_commit() {
#if ATTNSTATE_MERGE_CP_ASYNC
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

/// Waits until at most `N` of this thread's most recent groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if ATTNSTATE_MERGE_CP_ASYNC
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
