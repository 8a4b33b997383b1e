/// @file cascade_level_ws_bf16.cu
/// @brief The instantiations and the launcher of the warp-specialised bf16 cascade level kernel
///        (own file: it compiles in parallel with the other level kernels).
#include <cstdlib>

#include "cuda/kernels/cascade/launch.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {
namespace {

/// The head dims of the warp-specialised kernel this build compiles (the catalog's rows): 128,
/// its only one, when the cascade's list has it.
using WsHeadDims = compiled::CascadeWgmmaHeadDims;

template <class Tile>
void launch_ws_tile(const CascadeLevelParams& p, const CascadeTmaMaps& maps, dim3 grid, bool pdl,
                    cudaStream_t stream) {
  launch_level_kernel(cascade_level_ws_kernel<Tile>, p, grid, Tile::kThreads, Tile::smem_bytes(),
                      pdl, stream, "cascade_level_ws_kernel", maps.k, maps.v, maps.k_run,
                      maps.v_run);
}

#if defined(ATTNSTATE_CASCADE_WS_PROBE)
// Probe builds only (-DATTNSTATE_BUILD_PROBES=ON, off by default): the 128-key tiles of 64 and
// 128 rows with the option set picked at run time by the environment variable
// ATTNSTATE_PROBE_CASCADE_WS_OPT (an id below; unset or another id: the default), for A/B runs.
constexpr int kF = kWsFastExp, kP = kWsDescPre, kL = kWsFlatStats;
constexpr int kR = kWsRescaleLate, kN = kWsDiagNoCopy;

int probe_opt() {
  static const int v = [] {
    const char* e = std::getenv("ATTNSTATE_PROBE_CASCADE_WS_OPT");
    return e != nullptr ? std::atoi(e) : -1;
  }();
  return v;
}

bool launch_probe(const CascadeLevelParams& p, const CascadeTmaMaps& maps, int tile_rows, dim3 grid,
                  bool pdl, cudaStream_t stream) {
  switch (probe_opt()) {
#define ATTNSTATE_WS_PROBE_CASE(id, stages, opt)                                        \
  case id:                                                                              \
    if (tile_rows == 64)                                                                \
      launch_ws_tile<CascadeWsTile<1, 128, stages, (opt)>>(p, maps, grid, pdl, stream); \
    else                                                                                \
      launch_ws_tile<CascadeWsTile<2, 128, stages, (opt)>>(p, maps, grid, pdl, stream); \
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

/// The launch at head dim `D` (128): instantiated only when the build compiles it.
template <int D>
void launch_ws(const CascadeLevelParams& p, const CascadeTmaMaps& maps, int tile_rows,
               CascadeWsVariant variant, dim3 grid, bool pdl, cudaStream_t stream) {
  static_assert(D == 128, "the warp-specialised kernel's head dim");
  const bool kv64 = variant == CascadeWsVariant::kKv64 || variant == CascadeWsVariant::kKv64Turns;
  // 128-key tiles (the default): the fast exponent, precomputed descriptors, branch-free row
  // statistics, the accumulator rescaled after the previous PV; 64-key tiles: the plain options
  constexpr int kDefault = kWsFastExp | kWsDescPre | kWsFlatStats | kWsRescaleLate;
#if defined(ATTNSTATE_CASCADE_WS_PROBE)
  if (!kv64 && launch_probe(p, maps, tile_rows, grid, pdl, stream)) return;
#endif
  if (tile_rows == 64) {
    if (kv64) return launch_ws_tile<CascadeWsTile<1, 64, 4>>(p, maps, grid, pdl, stream);
    return launch_ws_tile<CascadeWsTile<1, 128, 3, kDefault>>(p, maps, grid, pdl, stream);
  }
  if (kv64) return launch_ws_tile<CascadeWsTile<2, 64, 4>>(p, maps, grid, pdl, stream);
  return launch_ws_tile<CascadeWsTile<2, 128, 3, kDefault>>(p, maps, grid, pdl, stream);
}

}  // namespace

void launch_cascade_level_ws_bf16(const CascadeLevelParams& p, const CascadeTmaMaps& maps,
                                  int tile_rows, CascadeWsVariant variant, dim3 grid, bool pdl,
                                  cudaStream_t stream) {
  compiled::dispatch(
      "attnstate::cuda::run_cascade", "shape.head_dim", 128, WsHeadDims{}, [&](auto d) {
        launch_ws<decltype(d)::value>(p, maps, tile_rows, variant, grid, pdl, stream);
      });
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
