/// @file cascade_level_ws_bf16.cu
/// @brief The instantiations and the launcher of the warp-specialised bf16 cascade level kernel
///        (own file: it compiles in parallel with the other level kernels).
#include "cuda/kernels/cascade_launch.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {
namespace {

template <class Tile>
void launch_ws_tile(const CascadeLevelParams& p, const CascadeTmaMaps& maps, dim3 grid, bool pdl,
                    cudaStream_t stream) {
  auto kernel = cascade_level_ws_kernel<Tile>;
  ATTNSTATE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            Tile::smem_bytes()));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(static_cast<unsigned>(Tile::kThreads));
  cfg.dynamicSmemBytes = static_cast<std::size_t>(Tile::smem_bytes());
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  ATTNSTATE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p, maps.k, maps.v));
  ATTNSTATE_CHECK_LAUNCH(stream, "cascade_level_ws_kernel");
}

}  // namespace

void launch_cascade_level_ws_bf16(const CascadeLevelParams& p, const CascadeTmaMaps& maps,
                                  int tile_rows, CascadeWsVariant variant, dim3 grid, bool pdl,
                                  cudaStream_t stream) {
  const bool kv64 = variant == CascadeWsVariant::kKv64 || variant == CascadeWsVariant::kKv64Turns;
  // 128-key tiles (the default): the fast exponent; 64-key tiles: the plain one
  if (tile_rows == 64) {
    if (kv64) return launch_ws_tile<CascadeWsTile<1, 64, 4>>(p, maps, grid, pdl, stream);
    return launch_ws_tile<CascadeWsTile<1, 128, 3, kWsFastExp>>(p, maps, grid, pdl, stream);
  }
  if (kv64) return launch_ws_tile<CascadeWsTile<2, 64, 4>>(p, maps, grid, pdl, stream);
  return launch_ws_tile<CascadeWsTile<2, 128, 3, kWsFastExp>>(p, maps, grid, pdl, stream);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
