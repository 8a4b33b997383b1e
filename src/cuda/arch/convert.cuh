/// @file convert.cuh
/// @brief PTX wrappers of conversions the cuda_fp8.h intrinsics do not express as one
///        instruction each: four fp8 values to two f16x2 registers with no shift of the upper
///        pair (sm_89 and later read a register's upper half in place).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace attnstate {
namespace cuda {
namespace arch {

/// The four fp8 values of `x` (e4m3 when `kE4M3`, else e5m2) as two f16x2 registers: bytes 0
/// and 1 in `lo`, bytes 2 and 3 in `hi` (the lower byte in the lower half), each pair one
/// `cvt.rn.f16x2.e4m3x2` (`e5m2x2`) of one 16-bit half of `x`. Exact: every fp8 value is an f16.
/// The values of `__nv_cvt_fp8x2_to_halfraw2` on each half.
template <bool kE4M3>
__device__ __forceinline__ void fp8x4_to_f16x2x2(std::uint32_t x, std::uint32_t& lo,
                                                 std::uint32_t& hi) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
  if constexpr (kE4M3)
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
        " cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
  else
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e5m2x2 %0, l;\n"
        " cvt.rn.f16x2.e5m2x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
#else
  constexpr __nv_fp8_interpretation_t kind = kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw a =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xFFFFu), kind);
  const __half2_raw b =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x >> 16), kind);
  lo = static_cast<std::uint32_t>(a.x) | (static_cast<std::uint32_t>(a.y) << 16);
  hi = static_cast<std::uint32_t>(b.x) | (static_cast<std::uint32_t>(b.y) << 16);
#endif
}

}  // namespace arch
}  // namespace cuda
}  // namespace attnstate
