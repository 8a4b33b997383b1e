/// @file special.cuh
/// @brief PTX wrappers of single instructions with no portable intrinsic: the flush-to-zero
///        `ex2.approx` and the nanosecond global timer.
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
