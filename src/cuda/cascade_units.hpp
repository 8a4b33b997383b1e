/// @file cascade_units.hpp
/// @brief The cascade level kernels' instantiation units: the launch entry point of one unit of
///        level kernels (mma.sync, wgmma, warp-specialised, each over 16-bit or fp8 caches) at one
///        head dim. Each is defined in its own translation unit, which CMake generates from
///        `cmake/cascade_unit.cu.in` (one per build head dim × unit, `src/CMakeLists.txt`), so
///        the kernels compile in parallel; `cascade.cu` calls the unit of a plan's kernel id.
#pragma once

#include <cuda_runtime_api.h>

#include "attnstate/core/paged_kv.hpp"
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
  KvScale k_scale;   ///< An fp8 pool's dequantisation scales (the fp8 rows' kernels).
  KvScale v_scale;
};

/// The instantiation units of the level kernels at a head dim: the catalog families, the rows
/// over fp8 caches of each in their own unit (so the units compile in parallel).
enum class CascadeUnit : int {
  kNone = 0,  ///< Not a level row.
  kMma,       ///< `kCascadeMma` over 16-bit caches.
  kMmaFp8,    ///< `kCascadeMma` over fp8 caches.
  kWgmma,     ///< `kCascadeWgmma` over 16-bit caches.
  kWs,        ///< `kCascadeWs`.
  kWgmmaFp8,  ///< `kCascadeWgmma` over fp8 caches.
  kWsFp8,     ///< `kCascadeWs` over fp8 caches.
};

/// The unit that compiles catalog row `r`.
constexpr CascadeUnit unit_of(const catalog::Row& r) {
  switch (r.family) {
    case catalog::Family::kCascadeMma:
      return is_fp8(r.kv) ? CascadeUnit::kMmaFp8 : CascadeUnit::kMma;
    case catalog::Family::kCascadeWgmma:
      return is_fp8(r.kv) ? CascadeUnit::kWgmmaFp8 : CascadeUnit::kWgmma;
    case catalog::Family::kCascadeWs:
      return is_fp8(r.kv) ? CascadeUnit::kWsFp8 : CascadeUnit::kWs;
    default:
      return CascadeUnit::kNone;
  }
}

/// Launches the kernel of catalog row `id`, a row of unit `U` at head dim `D`: the unit's launch
/// table, keyed by kernel id. Throws `Status::kInternal` for an id that is no row of the unit.
template <int D, CascadeUnit U>
void cascade_unit_launch(int id, const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                         cudaStream_t stream);

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
