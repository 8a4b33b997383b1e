/// @file cascade_level_bf16.cu
/// @brief The bf16 instantiations of the cascade level kernel (one file per dtype so they compile
///        in parallel).
#include "cuda/kernels/cascade/launch.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

namespace {

/// Compiled like every level kernel; its static shared memory shows the host which code the
/// runtime loaded for the current device: 16 bytes only in code built for sm_90a, the target of
/// the `wgmma` kernels (elsewhere those compile to a trap).
__global__ void sm90a_code_probe_kernel(int* out) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ int s[4];
  s[threadIdx.x & 3] = static_cast<int>(threadIdx.x);
  __syncthreads();
  if (out != nullptr) out[threadIdx.x] = s[(threadIdx.x + 1) & 3];
#else
  (void)out;
#endif
}

}  // namespace

bool sm90a_code_loaded() {
  cudaFuncAttributes fa{};
  ATTNSTATE_CUDA_CHECK(cudaFuncGetAttributes(&fa, sm90a_code_probe_kernel));
  return fa.sharedSizeBytes > 0;
}

void launch_cascade_level_bf16(const CascadeLevelParams& p, int tile_rows, int head_dim, bool wgmma,
                               dim3 grid, bool pdl, cudaStream_t stream) {
  launch_cascade_level<__nv_bfloat16>(p, tile_rows, head_dim, wgmma, grid, pdl, stream);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
