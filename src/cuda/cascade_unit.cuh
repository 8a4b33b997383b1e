/// @file cascade_unit.cuh
/// @brief The definition behind `cascade_units.hpp`: one unit's level kernels, the instances the
///        catalog (`catalog/catalog.hpp`) holds for its family and head dim, each mapped to its
///        tile type, and the launch of the one a level asks for. Included only by the generated
///        units (`cmake/cascade_unit.cu.in`), each of which instantiates one head dim × family
///        with `ATTNSTATE_CASCADE_UNIT`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "attnstate/core/error.hpp"
#include "catalog/catalog.hpp"
#include "common/compiled.hpp"
#include "cuda/cascade_units.hpp"
#include "cuda/kernels/cascade/launch.cuh"

namespace attnstate {
namespace cuda {
namespace detail {
namespace cascade_unit {

constexpr const char* kFn = "attnstate::cuda::run_cascade";

using catalog::Family;

/// The catalog query of a level kernel of family `F` at head dim `D` for the dtype, tile (0: any
/// `stages` or `keys`) and variants.
template <Family F, int D>
constexpr catalog::Query query(DType dtype, int rows, int stages, int keys,
                               catalog::Variants variants) {
  catalog::Query q;
  q.family = F;
  q.head_dim = D;
  q.q = catalog::mask(dtype);
  q.kv = catalog::mask(dtype);
  q.tile_rows = rows;
  q.stages = stages;
  q.tile_keys = keys;
  q.variants = variants;
  return q;
}

/// True when the catalog holds that kernel.
template <Family F, int D>
constexpr bool holds(DType dtype, int rows, int stages, int keys, catalog::Variants variants) {
  return catalog::compiled(query<F, D>(dtype, rows, stages, keys, variants));
}

/// The storage type of a level kernel's dtype.
template <DType T>
using Storage = std::conditional_t<T == DType::kBF16, __nv_bfloat16, __half>;

/// Throws `Status::kNotSupported` for a level the catalog holds no kernel of family `F` for.
template <Family F, int D>
[[noreturn]] void not_compiled(const CascadeLevelLaunch& l, catalog::Variants variants) {
  attnstate::detail::throw_argument(
      kFn, "plan.levels",
      catalog::not_supported_message(query<F, D>(l.dtype, l.tile_rows, 0, 0, variants)),
      std::string(catalog::to_string(F)) + " at head dim " + std::to_string(D) + ", " +
          to_string(l.dtype) + ", " + std::to_string(l.tile_rows) + " rows, " +
          catalog::variants_string(variants),
      Status::kNotSupported);
}

/// The variants a level launch asks for (its soft cap and window).
inline catalog::Variants variants_of(const kernels::CascadeLevelParams& p) {
  return catalog::variants_of(p.window_left, p.soft_cap);
}

/// One mma.sync tile: its variant instance when `p` has a soft cap or a window.
template <DType T, int D, class Tile>
void launch_mma(const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                cudaStream_t stream) {
  constexpr int kKeys = Tile::BN, kRows = Tile::BM, kStages = Tile::kStages;
  constexpr catalog::Variants kVar = catalog::kSoftCap | catalog::kWindow;
  if (const catalog::Variants v = variants_of(p); v != catalog::kPlain) {
    if constexpr (holds<Family::kCascadeMma, D>(T, kRows, kStages, kKeys, kVar))
      return kernels::launch_cascade_tile<Storage<T>, Tile, true>(p, l.grid, l.pdl, stream);
    not_compiled<Family::kCascadeMma, D>(l, v);
  }
  if constexpr (holds<Family::kCascadeMma, D>(T, kRows, kStages, kKeys, catalog::kPlain))
    return kernels::launch_cascade_tile<Storage<T>, Tile, false>(p, l.grid, l.pdl, stream);
  not_compiled<Family::kCascadeMma, D>(l, catalog::kPlain);
}

/// The mma.sync tiles: 16 rows at the level's depth (3 or 2 stages), 64 and 128 rows.
template <DType T, int D>
void launch_mma(const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                cudaStream_t stream) {
  using kernels::CascadeTile;
  switch (l.tile_rows) {
    case 16:
      if (p.small_stages == 3) return launch_mma<T, D, CascadeTile<D, 1, 4, 3, 2>>(p, l, stream);
      return launch_mma<T, D, CascadeTile<D, 1, 4, 2, 4>>(p, l, stream);
    case 64:
      return launch_mma<T, D, CascadeTile<D, 4, 1>>(p, l, stream);
    case 128:
      return launch_mma<T, D, CascadeTile<D, 8, 1>>(p, l, stream);
    default:
      not_compiled<Family::kCascadeMma, D>(l, catalog::kPlain);
  }
}

/// One wgmma tile: its variant instance when `p` has a soft cap or a window.
template <DType T, int D, int kWarpgroups>
void launch_wgmma(const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                  cudaStream_t stream) {
  // (the tile type is named only where the catalog holds it: it asserts its head dims)
  constexpr int kRows = 64 * kWarpgroups, kKeys = catalog::kCascadeKvTile;
  constexpr catalog::Variants kVar = catalog::kSoftCap | catalog::kWindow;
  using Tile = kernels::CascadeWgmmaTile<D, kWarpgroups>;
  if (const catalog::Variants v = variants_of(p); v != catalog::kPlain) {
    if constexpr (holds<Family::kCascadeWgmma, D>(T, kRows, 0, kKeys, kVar))
      return kernels::launch_cascade_wgmma_tile<Storage<T>, Tile, true>(p, l.grid, l.pdl, stream);
    not_compiled<Family::kCascadeWgmma, D>(l, v);
  }
  if constexpr (holds<Family::kCascadeWgmma, D>(T, kRows, 0, kKeys, catalog::kPlain))
    return kernels::launch_cascade_wgmma_tile<Storage<T>, Tile, false>(p, l.grid, l.pdl, stream);
  not_compiled<Family::kCascadeWgmma, D>(l, catalog::kPlain);
}

/// One warp-specialised tile of dtype `T` (its plain or variant instance, `kVar`).
template <DType T, int D, bool kVar, class Tile>
void launch_ws(const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
               cudaStream_t stream) {
  constexpr catalog::Variants kAsked =
      kVar ? catalog::kSoftCap | catalog::kWindow : catalog::kPlain;
  if constexpr (holds<Family::kCascadeWs, D>(T, Tile::BM, Tile::kStages, Tile::BN, kAsked)) {
    static_assert(Tile::D == D, "the warp-specialised tile's head dim");
    static_assert(std::is_same_v<typename Tile::T, Storage<T>>, "the tile's operand type");
    return kernels::launch_cascade_ws_tile<Tile>(p, *l.maps, l.grid, l.pdl, stream);
  }
  not_compiled<Family::kCascadeWs, D>(l, kAsked);
}

#if defined(ATTNSTATE_CASCADE_WS_PROBE)
// Probe builds only (-DATTNSTATE_BUILD_PROBES=ON, off by default): the 128-key tiles of 64 and
// 128 rows with the option set picked at run time by the environment variable
// ATTNSTATE_PROBE_CASCADE_WS_OPT (an id below; unset or another id: the default), for A/B runs.
inline int probe_opt() {
  static const int v = [] {
    const char* e = std::getenv("ATTNSTATE_PROBE_CASCADE_WS_OPT");
    return e != nullptr ? std::atoi(e) : -1;
  }();
  return v;
}

template <int D>
bool launch_ws_probe(const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                     cudaStream_t stream) {
  using kernels::CascadeWsTile;
  constexpr int kF = kernels::kWsFastExp, kP = kernels::kWsDescPre, kL = kernels::kWsFlatStats;
  constexpr int kR = kernels::kWsRescaleLate, kN = kernels::kWsDiagNoCopy;
  const auto& maps = *l.maps;
  switch (probe_opt()) {
#define ATTNSTATE_WS_PROBE_CASE(id, stages, opt)                                             \
  case id:                                                                                   \
    if (l.tile_rows == 64)                                                                   \
      kernels::launch_cascade_ws_tile<CascadeWsTile<1, 128, stages, (opt)>>(p, maps, l.grid, \
                                                                            l.pdl, stream);  \
    else                                                                                     \
      kernels::launch_cascade_ws_tile<CascadeWsTile<2, 128, stages, (opt)>>(p, maps, l.grid, \
                                                                            l.pdl, stream);  \
    return true;
    ATTNSTATE_WS_PROBE_CASE(2, 3, kF | kL)
    ATTNSTATE_WS_PROBE_CASE(5, 3, kF | kP | kL)
    ATTNSTATE_WS_PROBE_CASE(7, 3, kF | kP | kL | kR)
    ATTNSTATE_WS_PROBE_CASE(15, 3, kF | kP | kL | kR | kN)
#undef ATTNSTATE_WS_PROBE_CASE
    default:
      return false;
  }
}
#endif

/// The warp-specialised tiles of dtype `T`: 64 or 128 rows; 128-key tiles (the default: the
/// fast exponent, precomputed descriptors, branch-free row statistics, the accumulator rescaled
/// after the previous PV) or 64-key tiles (4 stages, the plain options); the variant instance
/// when `p` has a soft cap or a window.
template <DType T, int D, bool kVar>
void launch_ws(const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
               cudaStream_t stream) {
  using kernels::CascadeWsTile;
  using plan::CascadeWsVariant;
  const bool kv64 =
      l.ws_variant == CascadeWsVariant::kKv64 || l.ws_variant == CascadeWsVariant::kKv64Turns;
  constexpr int kX = (T == DType::kF16 ? kernels::kWsF16 : 0) | (kVar ? kernels::kWsVariant : 0);
  constexpr int kDefault = kernels::kWsFastExp | kernels::kWsDescPre | kernels::kWsFlatStats |
                           kernels::kWsRescaleLate | kX;
#if defined(ATTNSTATE_CASCADE_WS_PROBE)
  if constexpr (T == DType::kBF16 && !kVar &&
                holds<Family::kCascadeWs, D>(DType::kBF16, 0, 0, 0, catalog::kPlain))
    if (!kv64 && launch_ws_probe<D>(p, l, stream)) return;
#endif
  if (l.tile_rows == 64) {
    if (kv64) return launch_ws<T, D, kVar, CascadeWsTile<1, 64, 4, kX>>(p, l, stream);
    return launch_ws<T, D, kVar, CascadeWsTile<1, 128, 3, kDefault>>(p, l, stream);
  }
  if (l.tile_rows == 128) {
    if (kv64) return launch_ws<T, D, kVar, CascadeWsTile<2, 64, 4, kX>>(p, l, stream);
    return launch_ws<T, D, kVar, CascadeWsTile<2, 128, 3, kDefault>>(p, l, stream);
  }
  not_compiled<Family::kCascadeWs, D>(
      l, kVar ? catalog::kSoftCap | catalog::kWindow : catalog::kPlain);
}

}  // namespace cascade_unit

template <int D, catalog::Family F>
void cascade_unit_launch(const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                         cudaStream_t stream) {
  using namespace cascade_unit;
  static_assert(F == Family::kCascadeMma || F == Family::kCascadeWgmma || F == Family::kCascadeWs,
                "a cascade level family");
  compiled::dispatch(kFn, "plan.shape.dtype", l.dtype, compiled::CascadeDTypes{}, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    if constexpr (F == Family::kCascadeWs) {
      if (variants_of(p) != catalog::kPlain) return launch_ws<T, D, true>(p, l, stream);
      launch_ws<T, D, false>(p, l, stream);
    } else if constexpr (F == Family::kCascadeMma) {
      launch_mma<T, D>(p, l, stream);
    } else {
      if (l.tile_rows == 64) return launch_wgmma<T, D, 1>(p, l, stream);
      if (l.tile_rows == 128) return launch_wgmma<T, D, 2>(p, l, stream);
      not_compiled<F, D>(l, catalog::kPlain);
    }
  });
}

/// The explicit instantiation of one unit (head dim `D`, catalog family `F`).
#define ATTNSTATE_CASCADE_UNIT(D, F)                        \
  template void cascade_unit_launch<D, catalog::Family::F>( \
      const kernels::CascadeLevelParams&, const CascadeLevelLaunch&, cudaStream_t);

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
