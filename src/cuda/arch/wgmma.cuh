/// @file wgmma.cuh
/// @brief PTX wrappers of Hopper's warpgroup MMA (sm_90a): the `wgmma.mma_async` shapes of the
///        cascade kernels (`m64n64k16`, `m64n128k16`, `m64n256k16`; bf16 or f16 operands, A from
///        registers, or from a shared-memory descriptor, B from a shared-memory descriptor), the
///        narrow MLA decode's `m64n16k16` / `m64n32k16` (both from descriptors, A transposable),
///        their fence / commit / wait, the register and async-proxy fences around them,
///        descriptors, and `setmaxnreg`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace attnstate {
namespace cuda {
namespace arch {

/// Orders this warpgroup's register accesses before the `wgmma` that follow.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
/// Closes the group of `wgmma` issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/// Waits until at most `N` committed wgmma groups of this thread are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Pins accumulator registers at this point of the program: the compiler may not move their
/// reads or writes across it (used around wgmma issue and wait, whose register effects it does
/// not see).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(r[i][j])::"memory");
}
/// Makes this thread's generic-proxy shared-memory writes visible to the async proxy (wgmma,
/// bulk copies).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/// A wgmma shared-memory matrix descriptor with 128-byte swizzling.
__device__ __forceinline__ std::uint64_t wgmma_desc(std::uint32_t smem_addr, std::uint32_t lbo,
                                                    std::uint32_t sbo) {
  std::uint64_t d = 0;
  d |= static_cast<std::uint64_t>((smem_addr & 0x3FFFFu) >> 4);
  d |= static_cast<std::uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
  d |= static_cast<std::uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
  d |= static_cast<std::uint64_t>(1) << 62;  // 128-byte swizzle
  return d;
}

/// A 64-bit wgmma descriptor from its two 32-bit halves (`lo`: start address >> 4 and leading
/// byte offset >> 4; `hi`: stride byte offset >> 4 and the swizzle mode).
__device__ __forceinline__ std::uint64_t desc_join(std::uint32_t lo, std::uint32_t hi) {
  std::uint64_t d;
  asm("mov.b64 %0, {%1, %2};\n" : "=l"(d) : "r"(lo), "r"(hi));
  return d;
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

#define ATTNSTATE_WGMMA_ACC128                                                           \
  ATTNSTATE_WGMMA_ACC64, "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), \
      "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]),    \
      "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]),    \
      "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]),    \
      "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),    \
      "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]),    \
      "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]),    \
      "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]),    \
      "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),    \
      "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]),    \
      "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]),    \
      "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]),    \
      "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
#define ATTNSTATE_WGMMA_M64N256(TY)                                                                \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY                                     \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "    \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
      "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, " \
      "%55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, " \
      "%73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, " \
      "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, "    \
      "%107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, " \
      "%122, %123, %124, %125, %126, %127}, "                                                      \
      "{%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"                                        \
      : ATTNSTATE_WGMMA_ACC128                                                                     \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kScaleD), "n"(kTransB))
#define ATTNSTATE_WGMMA_M64N64_SS(TY)                                                           \
  asm volatile(                                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                              \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                   \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                      \
      "%32, %33, p, 1, 1, 0, 0;\n}\n"                                                           \
      : ATTNSTATE_WGMMA_ACC32                                                                   \
      : "l"(desc_a), "l"(desc_b), "n"(kScaleD))

#define ATTNSTATE_WGMMA_M64N128_SS(TY)                                                             \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                                     \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "    \
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
      "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, " \
      "%55, %56, %57, %58, %59, %60, %61, %62, %63}, "                                             \
      "%64, %65, p, 1, 1, 0, 0;\n}\n"                                                              \
      : ATTNSTATE_WGMMA_ACC64                                                                      \
      : "l"(desc_a), "l"(desc_b), "n"(kScaleD))

// The narrow shapes (m64n16k16, m64n32k16) with both operands in shared memory: 8 or 16 fp32
// accumulators, A's and B's descriptors, the accumulator-scale and A-transpose immediates (B
// K-major).
#define ATTNSTATE_WGMMA_ACC8                                                                \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
      "+f"(d[1][2]), "+f"(d[1][3])
#define ATTNSTATE_WGMMA_ACC16                                                                      \
  ATTNSTATE_WGMMA_ACC8, "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), \
      "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
#define ATTNSTATE_WGMMA_M64N16_SS(TY)                         \
  asm volatile(                                               \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"            \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY \
      " {%0, %1, %2, %3, %4, %5, %6, %7}, "                   \
      "%8, %9, p, 1, 1, %11, 0;\n}\n"                         \
      : ATTNSTATE_WGMMA_ACC8                                  \
      : "l"(desc_a), "l"(desc_b), "n"(kScaleD), "n"(kTransA))
#define ATTNSTATE_WGMMA_M64N32_SS(TY)                                             \
  asm volatile(                                                                   \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY                     \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
      "%16, %17, p, 1, 1, %19, 0;\n}\n"                                           \
      : ATTNSTATE_WGMMA_ACC16                                                     \
      : "l"(desc_a), "l"(desc_b), "n"(kScaleD), "n"(kTransA))

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
  /// D (+)= A B, m64n256k16.
  template <int kScaleD, int kTransB>
  __device__ static __forceinline__ void mma_n256(float (&d)[32][4], const std::uint32_t (&a)[4],
                                                  std::uint64_t desc_b) {
    if constexpr (kF16)
      ATTNSTATE_WGMMA_M64N256("f16");
    else
      ATTNSTATE_WGMMA_M64N256("bf16");
  }
  /// S (+)= A Bᵀ, m64n64k16 with A too from shared memory (`desc_a`, K-major): for tiles whose
  /// queries do not fit in registers beside the accumulator (head_dim 256).
  template <int kScaleD>
  __device__ static __forceinline__ void mma_s64_ss(float (&d)[8][4], std::uint64_t desc_a,
                                                    std::uint64_t desc_b) {
    if constexpr (kF16)
      ATTNSTATE_WGMMA_M64N64_SS("f16");
    else
      ATTNSTATE_WGMMA_M64N64_SS("bf16");
  }
  /// S (+)= A Bᵀ, m64n128k16 with A too from shared memory (as `mma_s64_ss`).
  template <int kScaleD>
  __device__ static __forceinline__ void mma_s128_ss(float (&d)[16][4], std::uint64_t desc_a,
                                                     std::uint64_t desc_b) {
    if constexpr (kF16)
      ATTNSTATE_WGMMA_M64N128_SS("f16");
    else
      ATTNSTATE_WGMMA_M64N128_SS("bf16");
  }
  /// O (+)= P V, m64n256k16 (head_dim 256): B (values) MN-major.
  template <int kScaleD>
  __device__ static __forceinline__ void mma_o256(float (&d)[32][4], const std::uint32_t (&a)[4],
                                                  std::uint64_t desc_b) {
    mma_n256<kScaleD, 1>(d, a, desc_b);
  }
  /// O (+)= P V, m64n64k16 (head_dim 64): B (values) MN-major.
  template <int kScaleD>
  __device__ static __forceinline__ void mma_o64(float (&d)[8][4], const std::uint32_t (&a)[4],
                                                 std::uint64_t desc_b) {
    mma_n64<kScaleD, 1>(d, a, desc_b);
  }
  /// D (+)= A B, m64nNk16 for N = 16 or 32 (`d` [N / 8][4]), both operands in shared memory: B
  /// K-major; A K-major (`kTransA` 0: the keys of `Sᵀ = K Qᵀ`) or MN-major (`kTransA` 1: the
  /// values read as Vᵀ in `Oᵀ = Vᵀ Pᵀ`).
  template <int kScaleD, int kTransA, int kN>
  __device__ static __forceinline__ void mma_narrow_ss(float (&d)[kN / 8][4], std::uint64_t desc_a,
                                                       std::uint64_t desc_b) {
    static_assert(kN == 16 || kN == 32, "the narrow shapes are n16 and n32");
    if constexpr (kN == 16) {
      if constexpr (kF16)
        ATTNSTATE_WGMMA_M64N16_SS("f16");
      else
        ATTNSTATE_WGMMA_M64N16_SS("bf16");
    } else {
      if constexpr (kF16)
        ATTNSTATE_WGMMA_M64N32_SS("f16");
      else
        ATTNSTATE_WGMMA_M64N32_SS("bf16");
    }
  }
};

#undef ATTNSTATE_WGMMA_M64N32_SS
#undef ATTNSTATE_WGMMA_M64N16_SS
#undef ATTNSTATE_WGMMA_ACC16
#undef ATTNSTATE_WGMMA_ACC8

#undef ATTNSTATE_WGMMA_M64N64_SS
#undef ATTNSTATE_WGMMA_M64N128_SS
#undef ATTNSTATE_WGMMA_M64N256
#undef ATTNSTATE_WGMMA_M64N128
#undef ATTNSTATE_WGMMA_M64N64
#undef ATTNSTATE_WGMMA_ACC64
#undef ATTNSTATE_WGMMA_ACC32
#undef ATTNSTATE_WGMMA_ACC128

}  // namespace arch
}  // namespace cuda
}  // namespace attnstate
