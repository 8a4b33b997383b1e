/// @file kernels/cascade/launch.cuh
/// @brief Host launchers of the cascade kernels: the one place where the runtime head_dim,
///        dtype and row tile become template parameters (the compiled variants are listed here).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <string>
#include <type_traits>

#include "attnstate/core/error.hpp"
#include "attnstate/cuda/check.hpp"
#include "cuda/kernels/cascade/level.cuh"
#include "cuda/kernels/cascade/level_wgmma.cuh"
#include "cuda/kernels/cascade/level_ws.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Head dims with compiled cascade kernels.
inline bool cascade_head_dim_supported(long long d) { return d == 64 || d == 128; }
/// Row tiles with compiled cascade kernels.
inline bool cascade_tile_supported(int rows) { return rows == 16 || rows == 64 || rows == 128; }

/// Launches the level kernel of storage type `T` (one instantiation file per dtype).
template <class T>
void launch_cascade_level(const CascadeLevelParams& p, int tile_rows, int head_dim, bool wgmma,
                          dim3 grid, bool pdl, cudaStream_t stream);

/// True when the code the runtime loaded for the current device was built for sm_90a, so the
/// `wgmma` level kernels have their bodies (a build for plain `90`, or for an older architecture
/// run on Hopper, has only the `mma.sync` kernels). Defined in cascade_level_bf16.cu.
bool sm90a_code_loaded();

/// Launches the bf16 level kernel (defined in cascade_level_bf16.cu).
void launch_cascade_level_bf16(const CascadeLevelParams& p, int tile_rows, int head_dim, bool wgmma,
                               dim3 grid, bool pdl, cudaStream_t stream);
/// Launches the f16 level kernel (defined in cascade_level_f16.cu).
void launch_cascade_level_f16(const CascadeLevelParams& p, int tile_rows, int head_dim, bool wgmma,
                              dim3 grid, bool pdl, cudaStream_t stream);

/// Warp-specialised level kernel variants (bf16, head_dim 128; tiles of 64 or 128 rows).
enum class CascadeWsVariant : int {
  kKv128 = 1,       ///< KV tiles of 128 keys, 3 stages; warpgroups issue freely (the default).
  kKv128Turns = 2,  ///< kKv128 with the two warpgroups issuing in turns (ping-pong).
  kKv64 = 3,        ///< KV tiles of 64 keys, 4 stages; warpgroups issue freely.
  kKv64Turns = 4,   ///< kKv64 with the two warpgroups issuing in turns.
};

/// Launches the warp-specialised bf16 level kernel (defined in cascade_level_ws_bf16.cu):
/// `maps` the pool's tensor maps (boxes of `p.tma_box` keys), `tile_rows` 64 or 128.
void launch_cascade_level_ws_bf16(const CascadeLevelParams& p, const CascadeTmaMaps& maps,
                                  int tile_rows, CascadeWsVariant variant, dim3 grid, bool pdl,
                                  cudaStream_t stream);

/// Launches `kernel` with the arguments `p, extra...` on `stream`; with `pdl` as a programmatic
/// dependent launch (it may start while the previous kernel of the stream runs; see
/// detail::PdlScope).
template <class... Extra>
void launch_level_kernel(void (*kernel)(CascadeLevelParams, Extra...), const CascadeLevelParams& p,
                         dim3 grid, int threads, int smem, bool pdl, cudaStream_t stream,
                         const char* name, const Extra&... extra) {
  ATTNSTATE_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<std::size_t>(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  ATTNSTATE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p, extra...));
  ATTNSTATE_CHECK_LAUNCH(stream, name);
}

/// Launches one mma.sync tile variant.
template <class T, class Tile>
void launch_cascade_tile(const CascadeLevelParams& p, dim3 grid, bool pdl, cudaStream_t stream) {
  launch_level_kernel(cascade_level_kernel<T, Tile>, p, grid, Tile::kThreads, Tile::smem_bytes(),
                      pdl, stream, "cascade_level_kernel");
}

/// Launches one wgmma tile variant.
template <class T, class Tile>
void launch_cascade_wgmma_tile(const CascadeLevelParams& p, dim3 grid, bool pdl,
                               cudaStream_t stream) {
  launch_level_kernel(cascade_level_wgmma_kernel<T, Tile>, p, grid, Tile::kThreads,
                      Tile::smem_bytes(), pdl, stream, "cascade_level_wgmma_kernel");
}

template <class T, int D>
void launch_cascade_head_dim(const CascadeLevelParams& p, int tile_rows, bool wgmma, dim3 grid,
                             bool pdl, cudaStream_t stream) {
  // wgmma variants: bf16 at head_dim 128 only (the configurations validated on the H200)
  if constexpr (std::is_same_v<T, __nv_bfloat16> && D == 128) {
    if (wgmma && tile_rows == 64)
      return launch_cascade_wgmma_tile<T, CascadeWgmmaTile<D, 1>>(p, grid, pdl, stream);
    if (wgmma && tile_rows == 128)
      return launch_cascade_wgmma_tile<T, CascadeWgmmaTile<D, 2>>(p, grid, pdl, stream);
  }
  switch (tile_rows) {
    case 16:
      if (p.small_stages == 3)
        return launch_cascade_tile<T, CascadeTile<D, 1, 4, 3, 2>>(p, grid, pdl, stream);
      return launch_cascade_tile<T, CascadeTile<D, 1, 4, 2, 4>>(p, grid, pdl, stream);
    case 64:
      return launch_cascade_tile<T, CascadeTile<D, 4, 1>>(p, grid, pdl, stream);
    case 128:
      return launch_cascade_tile<T, CascadeTile<D, 8, 1>>(p, grid, pdl, stream);
    default:
      ::attnstate::detail::throw_argument("attnstate::cuda::cascade", "tile_rows", "16, 64 or 128",
                                          std::to_string(tile_rows), Status::kNotSupported);
  }
}

template <class T>
void launch_cascade_level(const CascadeLevelParams& p, int tile_rows, int head_dim, bool wgmma,
                          dim3 grid, bool pdl, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_cascade_head_dim<T, 64>(p, tile_rows, wgmma, grid, pdl, stream);
    case 128:
      return launch_cascade_head_dim<T, 128>(p, tile_rows, wgmma, grid, pdl, stream);
    default:
      ::attnstate::detail::throw_argument("attnstate::cuda::cascade", "head_dim", "64 or 128",
                                          std::to_string(head_dim), Status::kNotSupported);
  }
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
