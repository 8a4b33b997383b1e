/// @file barrier.cuh
/// @brief PTX wrappers of synchronisation: shared-memory mbarriers (init, arrive, expect-tx,
///        parity wait; sm_90), named barriers, and the thread-block-cluster barrier (sm_90).
#pragma once

#include <cstdint>

namespace attnstate {
namespace cuda {
namespace arch {

/// Initialises the mbarrier at shared address `bar` for `count` arrivals per phase.
__device__ __forceinline__ void mbar_init(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/// Makes mbarrier initialisations visible to the other threads and to the async proxy.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/// One arrival that also expects `bytes` of asynchronous (TMA) writes in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
/// One arrival (release semantics: this thread's prior writes are visible to the waiters).
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/// Waits (acquire) until the phase of parity `parity` of the mbarrier has completed.
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

/// Named barrier `id` (1..15; 0 is `__syncthreads`) over `threads` threads: wait for all.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// Named barrier `id` over `threads` threads: arrive without waiting.
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
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

}  // namespace arch
}  // namespace cuda
}  // namespace attnstate
