/// @file kernels/cascade/launch.cuh
/// @brief Host launchers of the cascade level kernels: the runtime head_dim and row tile become
///        template parameters through the one dispatch (`common/dispatch.hpp`) on the lists of
///        `common/compiled.hpp`; the dtype picks the instantiation file (`cascade.cu`).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <string>
#include <type_traits>

#include "attnstate/core/error.hpp"
#include "attnstate/cuda/check.hpp"
#include "common/compiled.hpp"
#include "cuda/kernels/cascade/level.cuh"
#include "cuda/kernels/cascade/level_wgmma.cuh"
#include "cuda/kernels/cascade/level_ws.cuh"
#include "cuda/launch.hpp"
#include "plan/cascade_plan.hpp"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Launches the level kernel of storage type `T` (one instantiation file per dtype).
template <class T>
void launch_cascade_level(const CascadeLevelParams& p, int tile_rows, int head_dim, bool wgmma,
                          dim3 grid, bool pdl, cudaStream_t stream);

/// Launches the bf16 level kernel (defined in cascade_level_bf16.cu).
void launch_cascade_level_bf16(const CascadeLevelParams& p, int tile_rows, int head_dim, bool wgmma,
                               dim3 grid, bool pdl, cudaStream_t stream);
/// Launches the f16 level kernel (defined in cascade_level_f16.cu).
void launch_cascade_level_f16(const CascadeLevelParams& p, int tile_rows, int head_dim, bool wgmma,
                              dim3 grid, bool pdl, cudaStream_t stream);

/// Warp-specialised level kernel variants (`CascadeLevelPlan::ws_variant`).
using CascadeWsVariant = plan::CascadeWsVariant;

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
  cuda::detail::LaunchConfig cfg;
  cfg.grid = grid;
  cfg.block = dim3(static_cast<unsigned>(threads));
  cfg.smem = static_cast<std::size_t>(smem);
  cfg.pdl = pdl;
  cfg.stream = stream;
  cuda::detail::launch_kernel(cfg, kernel, name, p, extra...);
}

/// Launches one mma.sync tile variant (its soft-capped instance when `p.soft_cap` is set).
template <class T, class Tile>
void launch_cascade_tile(const CascadeLevelParams& p, dim3 grid, bool pdl, cudaStream_t stream) {
  if (p.soft_cap != 0.f)
    return launch_level_kernel(cascade_level_kernel<T, Tile, true>, p, grid, Tile::kThreads,
                               Tile::smem_bytes(), pdl, stream, "cascade_level_kernel");
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
  // wgmma instances: bf16 at the head dims of `compiled::CascadeWgmmaHeadDims` (the catalog's
  // wgmma rows; a soft-capped level runs on mma.sync: the plan never takes wgmma for one)
  if constexpr (std::is_same_v<T, __nv_bfloat16> &&
                compiled::contains(compiled::CascadeWgmmaHeadDims{}, D)) {
    if (wgmma && tile_rows == 64)
      return launch_cascade_wgmma_tile<T, CascadeWgmmaTile<D, 1>>(p, grid, pdl, stream);
    if (wgmma && tile_rows == 128)
      return launch_cascade_wgmma_tile<T, CascadeWgmmaTile<D, 2>>(p, grid, pdl, stream);
  }
  compiled::dispatch(
      "attnstate::cuda::cascade", "tile_rows", tile_rows, compiled::CascadeTileRows{}, [&](auto r) {
        constexpr int kRows = decltype(r)::value;
        if constexpr (kRows == 16) {
          if (p.small_stages == 3)
            return launch_cascade_tile<T, CascadeTile<D, 1, 4, 3, 2>>(p, grid, pdl, stream);
          return launch_cascade_tile<T, CascadeTile<D, 1, 4, 2, 4>>(p, grid, pdl, stream);
        } else {
          launch_cascade_tile<T, CascadeTile<D, kRows / 16, 1>>(p, grid, pdl, stream);
        }
      });
}

template <class T>
void launch_cascade_level(const CascadeLevelParams& p, int tile_rows, int head_dim, bool wgmma,
                          dim3 grid, bool pdl, cudaStream_t stream) {
  compiled::dispatch(
      "attnstate::cuda::cascade", "head_dim", head_dim, compiled::CascadeHeadDims{}, [&](auto d) {
        launch_cascade_head_dim<T, decltype(d)::value>(p, tile_rows, wgmma, grid, pdl, stream);
      });
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
