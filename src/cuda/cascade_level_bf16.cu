/// @file cascade_level_bf16.cu
/// @brief The bf16 instantiations of the cascade level kernel (one file per dtype so they compile
///        in parallel).
#include "cuda/kernels/cascade/launch.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

void launch_cascade_level_bf16(const CascadeLevelParams& p, int tile_rows, int head_dim, bool wgmma,
                               dim3 grid, bool pdl, cudaStream_t stream) {
  launch_cascade_level<__nv_bfloat16>(p, tile_rows, head_dim, wgmma, grid, pdl, stream);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
