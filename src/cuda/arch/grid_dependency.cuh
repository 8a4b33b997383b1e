/// @file grid_dependency.cuh
/// @brief PTX wrappers of grid-dependency control (programmatic dependent launch, sm_90): both
///        are no-ops below sm_90 and in a kernel not launched programmatically.
#pragma once

namespace attnstate {
namespace cuda {
namespace arch {

/// Lets the next kernel of the stream start (`griddepcontrol.launch_dependents`).
__device__ __forceinline__ void launch_dependent_grids() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Waits until the grids this one depends on have completed and their writes are visible
/// (`griddepcontrol.wait`).
__device__ __forceinline__ void wait_on_dependent_grids() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace arch
}  // namespace cuda
}  // namespace attnstate
