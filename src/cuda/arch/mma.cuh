/// @file mma.cuh
/// @brief PTX wrappers of the warp-level tensor-core path (sm_80): `ldmatrix` fragments from
///        shared memory and the `mma.sync` m16n8k16 product (bf16 or f16 operands, fp32
///        accumulators), with the packing of two floats into one b16x2 operand register.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace attnstate {
namespace cuda {
namespace arch {

/// The 16-bit operand type: `__nv_bfloat16` when `kBF16`, else `__half`.
template <bool kBF16>
using B16 = std::conditional_t<kBF16, __nv_bfloat16, __half>;

/// Four 8×8 b16 matrices from shared memory (lane `l` gives the row address of matrix `l/8`).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t* r, std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
/// As `ldmatrix_x4`, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t* r, std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The body of `Mma16816::mma` for operand type `TY` ("bf16" or "f16"); local to this header.
#define ATTNSTATE_MMA_M16N8K16(TY)                                                      \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY                       \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

/// `mma.sync` m16n8k16 for 16-bit operands `T` (`__nv_bfloat16` or `__half`).
template <class T>
struct Mma16816 {
  static constexpr bool kBF16 = std::is_same<T, __nv_bfloat16>::value;
  static_assert(kBF16 || std::is_same<T, __half>::value, "bf16 or f16 operands");

  /// Two floats as one b16x2 register (round to nearest even), `lo` in the low half.
  __device__ static __forceinline__ std::uint32_t pack(float lo, float hi) {
    if constexpr (kBF16) {
      __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<std::uint32_t*>(&v);
    } else {
      __half2 v = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<std::uint32_t*>(&v);
    }
  }
  /// `c += a · b` on a 16×8×16 tile (A row-major, B column-major), fp32 accumulators.
  __device__ static __forceinline__ void mma(float* c, const std::uint32_t* a, std::uint32_t b0,
                                             std::uint32_t b1) {
    if constexpr (kBF16)
      ATTNSTATE_MMA_M16N8K16("bf16");
    else
      ATTNSTATE_MMA_M16N8K16("f16");
  }
};

#undef ATTNSTATE_MMA_M16N8K16

}  // namespace arch
}  // namespace cuda
}  // namespace attnstate
