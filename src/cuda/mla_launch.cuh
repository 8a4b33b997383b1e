/// @file cuda/mla_launch.cuh
/// @brief The launch tables of the MLA kernel families (internal): for a family `K` (the MLA
///        decode's, the MLA cascade's levels), each catalog row's launch, keyed by its kernel id,
///        which raises the row's shared-memory limit (once per device) and launches it.
///
/// `K` gives `Params` (the kernel's argument), `kFamily` (its catalog family), `kName` (for
/// launch errors), `kernel<kKv, kBlock>()` (the `__global__` instance over a latent part of `kKv`,
/// with block scales or not) and `mla(params)` (the cache fields of the argument).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "catalog/catalog.hpp"
#include "cuda/device_cache.hpp"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/launch.hpp"
#include "cuda/tile/fp8_kv.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// The launch of `kernel` on `grid` CTAs of `threads` threads and `smem` bytes of shared memory
/// (its limit raised once per device) on `stream`; `name` for launch errors.
template <auto kernel, class Params>
void launch_mla_kernel(const Params& p, std::int64_t grid, int threads, int smem,
                       cudaStream_t stream, const char* name) {
  raise_smem_limit<kernel>(smem);
  LaunchConfig c;
  c.grid = dim3(static_cast<unsigned>(grid));
  c.block = dim3(static_cast<unsigned>(threads));
  c.smem = static_cast<std::size_t>(smem);
  c.stream = stream;
  launch_kernel(c, kernel, name, p);
}

/// The launch of `K`'s row over `kKv` (with the latent part's block scales: `kBlock`) on `grid`
/// CTAs on `stream` (`kMlaThreads` threads, or the wgmma decodes' `kMlaWsWarps` warps, and the
/// family's shared memory: the mma.sync kernels stage the block scales besides, the balanced
/// wgmma decode exchanges its rows' maxima besides; the narrow
/// decodes' families, `K::narrow_kernel<kKv, kBlock, kN>()`, its instance of 16 or 32 rows).
template <class K, int kKv, bool kBlock>
void launch_mla_instance(const typename K::Params& p, std::int64_t grid, cudaStream_t stream) {
  constexpr bool kBalanced = K::kFamily == catalog::Family::kMlaDecodeWsBalanced;
  constexpr bool kWs = K::kFamily == catalog::Family::kMlaDecodeWs || kBalanced;  // (its CTA)
  if constexpr (K::kFamily == catalog::Family::kMlaDecodeNarrow ||
                K::kFamily == catalog::Family::kMlaDecodeNarrow2) {
    // the narrow decodes: products of 16 rows where the request's rows fit them, else 32
    const int smem = static_cast<int>(K::kFamily == catalog::Family::kMlaDecodeNarrow2
                                          ? catalog::mla_narrow2_smem_bytes()
                                          : catalog::mla_narrow_smem_bytes());
    if (K::mla(p).rows <= 16)
      launch_mla_kernel<K::template narrow_kernel<kKv, kBlock, 16>()>(
          p, grid, catalog::kMlaNarrowWarps * 32, smem, stream, K::kName);
    else
      launch_mla_kernel<K::template narrow_kernel<kKv, kBlock, 32>()>(
          p, grid, catalog::kMlaNarrowWarps * 32, smem, stream, K::kName);
  } else {
    const int smem = static_cast<int>(kBalanced ? catalog::mla_ws_balanced_smem_bytes()
                                      : kWs     ? catalog::mla_ws_smem_bytes()
                                                : catalog::mla_smem_bytes(kKv != tile::kKvSame) +
                                                  (kBlock ? kMlaBlockScaleSmem : 0));
    launch_mla_kernel<K::template kernel<kKv, kBlock>()>(
        p, grid, kWs ? catalog::kMlaWsWarps * 32 : kMlaThreads, smem, stream, K::kName);
  }
}

/// The launch of `K`'s row over `kKv`: the instance with block scales when an fp8 cache has them.
template <class K, int kKv>
void launch_mla_row(const typename K::Params& p, std::int64_t grid, cudaStream_t stream) {
  if constexpr (kKv != tile::kKvSame) {
    if (K::mla(p).ckv_bscale != nullptr) {
      launch_mla_instance<K, kKv, true>(p, grid, stream);
      return;
    }
  }
  launch_mla_instance<K, kKv, false>(p, grid, stream);
}

/// A row's launch (null for the rows of other families).
template <class K>
using MlaRowLaunch = void (*)(const typename K::Params&, std::int64_t, cudaStream_t);

template <class K, std::size_t I>
constexpr MlaRowLaunch<K> mla_row_entry() {
  constexpr catalog::Row r = catalog::kRows[I];
  if constexpr (r.family == K::kFamily) {
    return &launch_mla_row<K, tile::kv_policy(r.kv)>;
  } else {
    return nullptr;
  }
}

template <class K, std::size_t... I>
constexpr std::array<MlaRowLaunch<K>, catalog::kNumRows> mla_launch_table(
    std::index_sequence<I...>) {
  return {mla_row_entry<K, I>()...};
}

/// `K`'s launch table: every row of its family, keyed by kernel id.
template <class K>
inline constexpr std::array<MlaRowLaunch<K>, catalog::kNumRows> kMlaLaunchTable =
    mla_launch_table<K>(std::make_index_sequence<catalog::kNumRows>{});

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
