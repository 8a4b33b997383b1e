/// @file cascade_unit.cuh
/// @brief The definition behind `cascade_units.hpp`: one unit's level kernels, the catalog's
///        rows (`catalog/catalog.hpp`) of its unit and head dim, each row mapped to its kernel's
///        template instance by its fields, with their launches by kernel id. Included only by the
///        generated units (`cmake/cascade_unit.cu.in`), each of which instantiates one head dim ×
///        unit (`CascadeUnit`) with `ATTNSTATE_CASCADE_UNIT`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "attnstate/core/error.hpp"
#include "catalog/catalog.hpp"
#include "cuda/cascade_units.hpp"
#include "cuda/kernels/cascade/launch.cuh"

namespace attnstate {
namespace cuda {
namespace detail {
namespace cascade_unit {

constexpr const char* kFn = "attnstate::cuda::run_cascade";

using catalog::Family;

/// True when catalog row `I` is a level row of unit `U` at head dim `D` (the unit's).
template <int D, CascadeUnit U, std::size_t I>
constexpr bool in_unit() {
  constexpr catalog::Row r = catalog::kRows[I];
  return unit_of(r) == U && r.head_dim == D;
}

/// The storage type of a row's dtype.
template <DType T>
using Storage = std::conditional_t<T == DType::kBF16, __nv_bfloat16, __half>;

/// True when a row is the variant instance of its tile (it takes a soft cap or a window).
constexpr bool variant_instance(const catalog::Row& r) {
  return (r.variants & (catalog::kSoftCap | catalog::kWindow)) != 0;
}

/// The option flags of a warp-specialised row's tile: on 128-key tiles the fast exponent,
/// precomputed descriptors, branch-free row statistics and the accumulator rescaled after the
/// previous PV; on 64-key tiles the plain options; f16 operands and the variant instance as the
/// row says.
constexpr int ws_options(const catalog::Row& r) {
  return (r.tile_keys == catalog::kCascadeWsKvTile
              ? kernels::kWsFastExp | kernels::kWsDescPre | kernels::kWsFlatStats |
                    kernels::kWsRescaleLate
              : 0) |
         (r.q == DType::kF16 ? kernels::kWsF16 : 0) |
         (variant_instance(r) ? kernels::kWsVariant : 0) |
         (r.kv == DType::kE4M3   ? kernels::kWsE4M3
          : r.kv == DType::kE5M2 ? kernels::kWsE5M2
                                 : 0);
}

#if defined(ATTNSTATE_CASCADE_WS_PROBE)
// Probe builds only (-DATTNSTATE_BUILD_PROBES=ON, off by default): the bf16 128-key tiles of 64
// and 128 rows with the option set picked at run time by the environment variable
// ATTNSTATE_PROBE_CASCADE_WS_OPT (an id below; unset or another id: the row's), for A/B runs.
inline int probe_opt() {
  static const int v = [] {
    const char* e = std::getenv("ATTNSTATE_PROBE_CASCADE_WS_OPT");
    return e != nullptr ? std::atoi(e) : -1;
  }();
  return v;
}

template <int NWG>
bool launch_ws_probe(const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                     cudaStream_t stream) {
  using kernels::CascadeWsTile;
  constexpr int kF = kernels::kWsFastExp, kP = kernels::kWsDescPre, kL = kernels::kWsFlatStats;
  constexpr int kR = kernels::kWsRescaleLate, kN = kernels::kWsDiagNoCopy;
  const auto& maps = *l.maps;
  switch (probe_opt()) {
#define ATTNSTATE_WS_PROBE_CASE(id, stages, opt)                                             \
  case id:                                                                                   \
    kernels::launch_cascade_ws_tile<CascadeWsTile<NWG, 128, stages, (opt)>>(p, maps, l.grid, \
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

/// Launches row `I`'s kernel when `id` is `I` and the row is the unit's (else false): its
/// template instance from the row's fields (dtype, K/V dtype, tile rows, K/V tile, stages, CTAs
/// per SM, variant instance).
template <int D, CascadeUnit U, std::size_t I>
bool launch_row(int id, const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                cudaStream_t stream) {
  if constexpr (in_unit<D, U, I>()) {
    if (id != static_cast<int>(I)) return false;
    constexpr catalog::Row r = catalog::kRows[I];
    constexpr Family F = r.family;
    using T = Storage<r.q>;
    constexpr bool kVar = variant_instance(r);
    if constexpr (F == Family::kCascadeMma) {
      // warps of 16 rows, the 16-row tile's keys split over four; the registers fit the row's
      // CTAs per SM
      using Tile =
          kernels::CascadeTile<D, r.tile_rows / 16, catalog::cascade_mma_key_warps(r.tile_rows),
                               r.stages, r.ctas_per_sm>;
      static_assert(Tile::BM == r.tile_rows && Tile::BN == r.tile_keys, "the row's tile");
      kernels::launch_cascade_tile<T, Tile, kVar, tile::kv_policy(r.kv)>(p, l.grid, l.pdl, stream,
                                                                         l.k_scale, l.v_scale);
    } else if constexpr (F == Family::kCascadeWgmma) {
      using Tile = kernels::CascadeWgmmaTile<D, r.tile_rows / 64>;
      static_assert(Tile::BM == r.tile_rows && Tile::BN == r.tile_keys && Tile::kStages == r.stages,
                    "the row's tile");
      static_assert(Tile::kMaxRegs * Tile::kThreads * r.ctas_per_sm <= 65536,
                    "the registers of the row's CTAs per SM");
      kernels::launch_cascade_wgmma_tile<T, Tile, kVar, tile::kv_policy(r.kv)>(
          p, l.grid, l.pdl, stream, l.k_scale, l.v_scale);
    } else {
      static_assert(F == Family::kCascadeWs, "a cascade level family");
      using Tile = kernels::CascadeWsTile<r.tile_rows / 64, r.tile_keys, r.stages, ws_options(r),
                                          static_cast<int>(r.head_dim)>;
      static_assert(Tile::D == D && Tile::BM == r.tile_rows, "the row's tile");
      static_assert(std::is_same_v<typename Tile::T, T> && Tile::kKv == tile::kv_policy(r.kv),
                    "the tile's operand type and K/V policy");
      static_assert(r.ctas_per_sm == 1, "one CTA per SM (its launch bounds)");
#if defined(ATTNSTATE_CASCADE_WS_PROBE)
      if constexpr (D == 128 && r.q == DType::kBF16 && !kVar &&
                    r.tile_keys == catalog::kCascadeWsKvTile)
        if (launch_ws_probe<Tile::NWG>(p, l, stream)) return true;
#endif
      kernels::launch_cascade_ws_tile<Tile>(p, *l.maps, l.grid, l.pdl, stream, l.k_scale,
                                            l.v_scale);
    }
    return true;
  } else {
    return false;
  }
}

/// Throws for a kernel id that is not the unit's (`cascade.cu` sends every id to its own unit).
[[noreturn]] inline void not_in_unit(int id, int unit, int head_dim) {
  attnstate::detail::throw_argument(
      kFn, "kernel id",
      "a row of level unit " + std::to_string(unit) + " at head dim " + std::to_string(head_dim),
      std::to_string(id), Status::kInternal);
}

template <int D, CascadeUnit U, std::size_t... I>
void launch_id(int id, const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
               cudaStream_t stream, std::index_sequence<I...>) {
  if (!(launch_row<D, U, I>(id, p, l, stream) || ...)) not_in_unit(id, static_cast<int>(U), D);
}

}  // namespace cascade_unit

template <int D, CascadeUnit U>
void cascade_unit_launch(int id, const kernels::CascadeLevelParams& p, const CascadeLevelLaunch& l,
                         cudaStream_t stream) {
  static_assert(U != CascadeUnit::kNone, "a cascade level unit");
  cascade_unit::launch_id<D, U>(id, p, l, stream, std::make_index_sequence<catalog::kNumRows>{});
}

/// The explicit instantiation of one unit (head dim `D`, unit `U`).
#define ATTNSTATE_CASCADE_UNIT(D, U)                                                            \
  template void cascade_unit_launch<D, CascadeUnit::U>(int, const kernels::CascadeLevelParams&, \
                                                       const CascadeLevelLaunch&, cudaStream_t);

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
