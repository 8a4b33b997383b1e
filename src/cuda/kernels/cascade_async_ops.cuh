/// @file cascade_async_ops.cuh
/// @brief Hopper building blocks of the cascade level kernels: shared-memory mbarriers (arrive /
///        expect-tx / parity wait), the bulk tensor copy (TMA) of a 5-D box completing on an
///        mbarrier, named barriers, and the bf16 / f16 `wgmma` shapes (`m64n64k16` / `m64n128k16`,
///        A from registers, the accumulator scale a template flag so the first k-step of a tile
///        overwrites instead of adding), the flush-to-zero `ex2.approx`, `max.NaN`, a descriptor
///        from its two 32-bit halves, used by the warp-specialised kernel and by the bf16
///        shapes of cascade_level_wgmma.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace attnstate {
namespace cuda {
namespace kernels {
namespace detail {

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

/// Bulk tensor copy of one box of the 5-D tensor map `tmap` at coordinates (c0..c4) into shared
/// memory at `dst`, completing `bytes` of transaction on the mbarrier `bar`.
__device__ __forceinline__ void tma_load_5d(std::uint32_t dst, const void* tmap, std::uint32_t bar,
                                            int c0, int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(tmap)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(c4)
      : "memory");
}
/// Prefetches a tensor map (kernel parameter) into the descriptor cache.
__device__ __forceinline__ void tma_prefetch_map(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(tmap))
               : "memory");
}

/// Named barrier `id` (1..15; 0 is `__syncthreads`) over `threads` threads: wait for all.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// Named barrier `id` over `threads` threads: arrive without waiting.
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// Lowers this warpgroup's registers per thread to `N` (returns them to the CTA's pool).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
/// Raises this warpgroup's registers per thread to `N` (waits for them in the CTA's pool).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/// Waits until at most `N` committed wgmma groups of this thread are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Operand lists and bodies of the `wgmma` wrappers below (local to this header): 32 or 64 fp32
// accumulators, the A fragment from registers, B's descriptor, the accumulator-scale and
// B-transpose immediates; `TY` is the operand type (`"bf16"` or `"f16"`).
#define ATTNSTATE_WGMMA_ACC32                                                                   \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])
#define ATTNSTATE_WGMMA_ACC64                                                                     \
  ATTNSTATE_WGMMA_ACC32, "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),              \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
      "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),             \
      "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),             \
      "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),             \
      "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),             \
      "+f"(d[15][2]), "+f"(d[15][3])
#define ATTNSTATE_WGMMA_M64N64(TY)                                                              \
  asm volatile(                                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                              \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                   \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                      \
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                           \
      : ATTNSTATE_WGMMA_ACC32                                                                   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kScaleD), "n"(kTransB))
#define ATTNSTATE_WGMMA_M64N128(TY)                                                                \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                                     \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "    \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
      "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, " \
      "%55, %56, %57, %58, %59, %60, %61, %62, %63}, "                                             \
      "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"                                              \
      : ATTNSTATE_WGMMA_ACC64                                                                      \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kScaleD), "n"(kTransB))

/// The `wgmma` shapes of the cascade kernels for bf16 or f16 operands `T` (fp32 accumulators, A
/// from registers; `kScaleD` 0 makes the instruction overwrite the accumulator instead of adding
/// to it; `kTransB` 0 reads B K-major as in `S = Q Kᵀ`, 1 MN-major as in `O = P V`).
template <class T>
struct Wgmma {
  static constexpr bool kF16 = std::is_same<T, __half>::value;
  /// D (+)= A B, m64n64k16.
  template <int kScaleD, int kTransB>
  __device__ static __forceinline__ void mma_n64(float (&d)[8][4], const std::uint32_t (&a)[4],
                                                 std::uint64_t desc_b) {
    if constexpr (kF16)
      ATTNSTATE_WGMMA_M64N64("f16");
    else
      ATTNSTATE_WGMMA_M64N64("bf16");
  }
  /// D (+)= A B, m64n128k16.
  template <int kScaleD, int kTransB>
  __device__ static __forceinline__ void mma_n128(float (&d)[16][4], const std::uint32_t (&a)[4],
                                                  std::uint64_t desc_b) {
    if constexpr (kF16)
      ATTNSTATE_WGMMA_M64N128("f16");
    else
      ATTNSTATE_WGMMA_M64N128("bf16");
  }
  /// S (+)= A Bᵀ, m64n64k16: A (queries) from registers, B (keys) K-major in shared memory.
  template <int kScaleD>
  __device__ static __forceinline__ void mma_s64(float (&d)[8][4], const std::uint32_t (&a)[4],
                                                 std::uint64_t desc_b) {
    mma_n64<kScaleD, 0>(d, a, desc_b);
  }
  /// S (+)= A Bᵀ, m64n128k16: A from registers, B K-major.
  template <int kScaleD>
  __device__ static __forceinline__ void mma_s128(float (&d)[16][4], const std::uint32_t (&a)[4],
                                                  std::uint64_t desc_b) {
    mma_n128<kScaleD, 0>(d, a, desc_b);
  }
  /// O (+)= P V, m64n128k16: A (probabilities) from registers, B (values) MN-major.
  template <int kScaleD>
  __device__ static __forceinline__ void mma_o128(float (&d)[16][4], const std::uint32_t (&a)[4],
                                                  std::uint64_t desc_b) {
    mma_n128<kScaleD, 1>(d, a, desc_b);
  }
  /// O (+)= P V, m64n64k16 (head_dim 64): B (values) MN-major.
  template <int kScaleD>
  __device__ static __forceinline__ void mma_o64(float (&d)[8][4], const std::uint32_t (&a)[4],
                                                 std::uint64_t desc_b) {
    mma_n64<kScaleD, 1>(d, a, desc_b);
  }
};

#undef ATTNSTATE_WGMMA_M64N128
#undef ATTNSTATE_WGMMA_M64N64
#undef ATTNSTATE_WGMMA_ACC64
#undef ATTNSTATE_WGMMA_ACC32

/// The bf16 shapes of the warp-specialised kernel.
using WsWgmmaBf16 = Wgmma<__nv_bfloat16>;

/// `2^x` on the special-function unit, subnormal results flushed to zero (`ex2.approx.ftz`):
/// `2^-inf` = 0, NaN stays NaN.
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// A 64-bit wgmma descriptor from its two 32-bit halves (`lo`: start address >> 4 and leading
/// byte offset >> 4; `hi`: stride byte offset >> 4 and the swizzle mode).
__device__ __forceinline__ std::uint64_t desc_join(std::uint32_t lo, std::uint32_t hi) {
  std::uint64_t d;
  asm("mov.b64 %0, {%1, %2};\n" : "=l"(d) : "r"(lo), "r"(hi));
  return d;
}

/// `max(a, b)`, NaN when either is NaN (`max.NaN`, no branch).
__device__ __forceinline__ float max_nan(float a, float b) {
  float y;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

}  // namespace detail
}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
