/// @file special.cuh
/// @brief PTX wrappers of single instructions with no portable intrinsic: the flush-to-zero
///        `ex2.approx` and `rcp.approx`, the NaN-propagating `max.NaN` and the nanosecond global
///        timer.
#pragma once

namespace attnstate {
namespace cuda {
namespace arch {

/// `2^x` on the special-function unit, subnormal results flushed to zero (`ex2.approx.ftz`):
/// `2^-inf` = 0, NaN stays NaN.
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// `1 / x` on the special-function unit, subnormal results flushed to zero (`rcp.approx.ftz`):
/// `1 / inf` = 0, NaN stays NaN.
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// `max(a, b)`, NaN when either is NaN, in one instruction (`max.NaN`): the value of core's
/// `math::nan_max` for whatever GPU arithmetic produces (its NaNs are all the one canonical NaN,
/// which `max.NaN` returns too); only `max(+0, -0)` may differ in the sign of the zero. Kernels use
/// `math::nan_max`, and this form only where the branch-free one is measurably faster
/// (bench/RESULTS.md, 2026-12-01).
__device__ __forceinline__ float max_nan(float a, float b) {
  float y;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

/// The GPU's global nanosecond timer (`%globaltimer`).
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
/// As `globaltimer`, read once `dep` is available (the read waits on that register).
__device__ __forceinline__ unsigned long long globaltimer_after(int dep) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(dep));
  return t;
}

}  // namespace arch
}  // namespace cuda
}  // namespace attnstate
