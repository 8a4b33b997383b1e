/// @file cascade_units.hpp
/// @brief The cascade level kernels' instantiation units: the launch entry point of one catalog
///        family of level kernels (mma.sync, wgmma, warp-specialised) at one head dim. Each is
///        defined in its own translation unit, which CMake generates from
///        `cmake/cascade_unit.cu.in` (one per build head dim × family, `src/CMakeLists.txt`), so
///        the kernels compile in parallel; `cascade.cu` calls the unit of a plan's kernel id.
#pragma once

#include <cuda_runtime_api.h>

#include "catalog/catalog.hpp"
#include "cuda/kernels/cascade/params.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {
struct CascadeTmaMaps;
}  // namespace kernels
namespace detail {

/// How a level kernel launches (its instance is the catalog row's: the kernel id).
struct CascadeLevelLaunch {
  const kernels::CascadeTmaMaps* maps = nullptr;  ///< The pool's tensor maps (warp-specialised).
  dim3 grid;
  bool pdl = false;  ///< A programmatic dependent launch.
};

/// Launches the kernel of catalog row `id`, a row of family `F` (`kCascadeMma`, `kCascadeWgmma`
/// or `kCascadeWs`) at head dim `D`: the unit's launch table, keyed by kernel id. Throws
/// `Status::kInternal` for an id that is no row of the unit.
template <int D, catalog::Family F>
void cascade_unit_launch(int id, const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                         cudaStream_t stream);

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
