/// @file kernels/cascade/launch.cuh
/// @brief Host launchers of the cascade level kernels, one per kernel template instance: the
///        mma.sync, wgmma and warp-specialised tiles. Which instances exist, and which one a
///        level runs, is the catalog's (`cuda/cascade_unit.cuh`, one generated translation unit
///        per family × head dim).
#pragma once

#include <cuda_runtime_api.h>

#include "attnstate/cuda/check.hpp"
#include "cuda/kernels/cascade/level.cuh"
#include "cuda/kernels/cascade/level_wgmma.cuh"
#include "cuda/kernels/cascade/level_ws.cuh"
#include "cuda/launch.hpp"

namespace attnstate {
namespace cuda {
namespace kernels {

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

/// Launches one mma.sync tile instance (`kVar`: the variant one: soft cap, window; `kKv`: the KV
/// loader policy, 16-bit or fp8 with the pool's scales `k_scale`, `v_scale`).
template <class T, class Tile, bool kVar, int kKv = tile::kKvSame>
void launch_cascade_tile(const CascadeLevelParams& p, dim3 grid, bool pdl, cudaStream_t stream,
                         const KvScale& k_scale = {}, const KvScale& v_scale = {}) {
  if constexpr (kKv == tile::kKvSame)
    launch_level_kernel(cascade_level_kernel<T, Tile, kVar>, p, grid, Tile::kThreads,
                        Tile::smem_bytes(), pdl, stream, "cascade_level_kernel");
  else
    launch_level_kernel(cascade_level_fp8_kernel<T, Tile, kVar, kKv>, p, grid, Tile::kThreads,
                        cascade_level_smem_bytes<Tile, kKv>(), pdl, stream,
                        "cascade_level_fp8_kernel", k_scale, v_scale);
}

/// Launches one wgmma tile instance (`kVar`: the variant one: soft cap, window; `kKv`: the KV
/// loader policy, 16-bit or fp8 with the pool's scales `k_scale`, `v_scale`).
template <class T, class Tile, bool kVar, int kKv = tile::kKvSame>
void launch_cascade_wgmma_tile(const CascadeLevelParams& p, dim3 grid, bool pdl,
                               cudaStream_t stream, const KvScale& k_scale = {},
                               const KvScale& v_scale = {}) {
  if constexpr (kKv == tile::kKvSame)
    launch_level_kernel(cascade_level_wgmma_kernel<T, Tile, kVar>, p, grid, Tile::kThreads,
                        Tile::smem_bytes(), pdl, stream, "cascade_level_wgmma_kernel");
  else
    launch_level_kernel(cascade_level_wgmma_fp8_kernel<T, Tile, kVar, kKv>, p, grid, Tile::kThreads,
                        cascade_level_wgmma_smem_bytes<Tile, kKv>(), pdl, stream,
                        "cascade_level_wgmma_fp8_kernel", k_scale, v_scale);
}

/// Launches one warp-specialised tile instance over the pool's tensor maps (an fp8 tile, with
/// the pool's scales `k_scale`, `v_scale`).
template <class Tile>
void launch_cascade_ws_tile(const CascadeLevelParams& p, const CascadeTmaMaps& maps, dim3 grid,
                            bool pdl, cudaStream_t stream, const KvScale& k_scale = {},
                            const KvScale& v_scale = {}) {
  if constexpr (!Tile::kFp8)
    launch_level_kernel(cascade_level_ws_kernel<Tile>, p, grid, Tile::kThreads, Tile::smem_bytes(),
                        pdl, stream, "cascade_level_ws_kernel", maps.k, maps.v, maps.k_run,
                        maps.v_run);
  else
    launch_level_kernel(cascade_level_ws_fp8_kernel<Tile>, p, grid, Tile::kThreads,
                        Tile::smem_bytes(), pdl, stream, "cascade_level_ws_fp8_kernel", maps.k,
                        maps.v, maps.k_run, maps.v_run, k_scale, v_scale);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
