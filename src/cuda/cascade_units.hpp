/// @file cascade_units.hpp
/// @brief The cascade level kernels' instantiation units: the launch entry point of one catalog
///        family of level kernels (mma.sync, wgmma, warp-specialised) at one head dim. Each is
///        defined in its own translation unit, which CMake generates from
///        `cmake/cascade_unit.cu.in` (one per build head dim × family, `src/CMakeLists.txt`), so
///        the kernels compile in parallel; `cascade.cu` picks the unit and calls it.
#pragma once

#include <cuda_runtime_api.h>

#include "attnstate/core/dtype.hpp"
#include "catalog/catalog.hpp"
#include "cuda/kernels/cascade/params.cuh"
#include "plan/cascade_plan.hpp"

namespace attnstate {
namespace cuda {
namespace kernels {
struct CascadeTmaMaps;
}  // namespace kernels
namespace detail {

/// What a level run resolved: the kernel instance of the unit and its launch.
struct CascadeLevelLaunch {
  DType dtype = DType::kBF16;  ///< The queries' and the cache's dtype.
  int tile_rows = 0;           ///< Query rows of a CTA tile.
  /// The warp-specialised kernel's variant (its KV tile and stages).
  plan::CascadeWsVariant ws_variant = plan::CascadeWsVariant::kKv128;
  const kernels::CascadeTmaMaps* maps = nullptr;  ///< The pool's tensor maps (warp-specialised).
  dim3 grid;
  bool pdl = false;  ///< A programmatic dependent launch.
};

/// Launches the level kernel of family `F` (`kCascadeMma`, `kCascadeWgmma` or `kCascadeWs`) at
/// head dim `D` that the catalog holds for `l` (its dtype, tile and, on mma.sync, `p.soft_cap`
/// and `p.small_stages`); throws `Status::kNotSupported` naming the catalog's rows when it holds
/// none.
template <int D, catalog::Family F>
void cascade_unit_launch(const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                         cudaStream_t stream);

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
