/// @file decode_unit.cuh
/// @brief The definitions behind `decode_units.hpp`: one unit's kernels, the catalog's decode
///        rows of its head dim and group, each row mapped to its kernel's template arguments, with
///        their launches and occupancy queries by kernel id. Included only by the generated units
///        (`cmake/decode_unit.cu.in`), each of which instantiates one head dim × group with
///        `ATTNSTATE_DECODE_UNIT`.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cuda/check.hpp"
#include "catalog/catalog.hpp"
#include "cuda/decode_units.hpp"
#include "cuda/device_cache.hpp"
#include "cuda/kernels/decode/split_kv.cuh"
#include "cuda/kernels/decode/stream.cuh"
#include "cuda/launch.hpp"

namespace attnstate {
namespace cuda {
namespace detail {
namespace decode_unit {

constexpr const char* kFn = "attnstate::cuda::run_decode";

/// True when catalog row `I` is a decode row of unit `U` at head dim `D`.
template <int D, DecodeUnit U, std::size_t I>
constexpr bool in_unit() {
  constexpr catalog::Row r = catalog::kRows[I];
  return (r.family == catalog::Family::kDecodeSplit ||
          r.family == catalog::Family::kDecodeStream) &&
         r.head_dim == D && unit_of(r) == U;
}

/// Clusters of each size (index 2..8) of one split-kernel instance resident at once on the
/// current device: its dynamic shared-memory limit raised, then one occupancy query per size,
/// once per device.
template <int D, bool kBF16, int kStages, int kKv, int kKeys>
const std::array<int, plan::kMaxCluster + 1>& resident_clusters() {
  constexpr auto kernel = decode_split_kv_kernel<D, kBF16, kStages, false, kKv, kKeys>;
  static PerDevice<std::array<int, plan::kMaxCluster + 1>> cache;
  return cache.current([](int) {
    const int smem = static_cast<int>(decode_smem_bytes(D, kStages, kKv == tile::kKvSame ? 2 : 1));
    raise_smem_limit<kernel>(smem);  // the largest carveout, so the planned CTAs fit
    std::array<int, plan::kMaxCluster + 1> n{};
    RelaxedCaptureMode relaxed;  // occupancy queries, not stream operations
    for (int c = 2; c <= plan::kMaxCluster; ++c) {
      LaunchConfig lc;
      lc.grid = dim3(static_cast<unsigned>(c));
      lc.block = dim3(kDecodeWarps * 32);
      lc.smem = static_cast<std::size_t>(smem);
      lc.cluster = static_cast<unsigned>(c);
      cudaLaunchAttribute attrs[2];
      const cudaLaunchConfig_t cfg = to_cuda(lc, attrs);
      ATTNSTATE_CUDA_CHECK(
          cudaOccupancyMaxActiveClusters(&n[static_cast<std::size_t>(c)], kernel, &cfg));
    }
    return n;
  });
}

/// The split kernel on `grid` CTAs (clusters of `p.cluster`), `kKeys` keys a warp's step.
template <int D, bool kBF16, int kStages, bool kVariant, int kKv, int kKeys>
void launch_split(const DecodeParams& p, const DecodeLaunch& l, cudaStream_t stream) {
  constexpr auto kernel = decode_split_kv_kernel<D, kBF16, kStages, kVariant, kKv, kKeys>;
  const int smem = static_cast<int>(decode_smem_bytes(D, kStages, kKv == tile::kKvSame ? 2 : 1));
  raise_smem_limit<kernel>(smem);  // on the device of this run (cached per device)
  LaunchConfig c;
  c.grid = dim3(static_cast<unsigned>(l.grid));
  c.block = dim3(kDecodeWarps * 32);
  c.smem = static_cast<std::size_t>(smem);
  c.cluster = p.cluster > 1 ? static_cast<unsigned>(p.cluster) : 1u;
  // Prior states come from the previous kernel of the stream: this one may start while that
  // one finishes (programmatic dependent launch); it waits before reading them. Beside the
  // previous kernel: it reads nothing that kernel writes; its last CTA holds the grid.
  // Programmatic (the plan's choice): every CTA waits for that kernel before its first read.
  c.pdl = l.pdl;
  c.stream = stream;
  launch_kernel(c, kernel, "decode_split_kv_kernel", p);
}

/// The streamed kernel (`kVariant`: its variant instance; `kKv`: its K/V policy): one CTA per SM
/// (fewer when there are fewer items).
template <int D, bool kBF16, bool kVariant, int kKv>
void launch_stream(const DecodeParams& p, const DecodeLaunch& l, cudaStream_t stream) {
  constexpr auto kernel = decode_stream_kernel<D, kBF16, kVariant, kKv>;
  const int smem = static_cast<int>(stream_smem_bytes(D));
  raise_smem_limit<kernel>(smem);
  LaunchConfig c;
  c.grid = dim3(static_cast<unsigned>(std::min<std::int64_t>(l.grid, l.num_sms)));
  c.block = dim3(stream_warps(D) * 32);
  c.smem = static_cast<std::size_t>(smem);
  c.pdl = l.pdl;  // as in launch_split
  c.stream = stream;
  launch_kernel(c, kernel, "decode_stream_kernel", p);
}

/// Launches row `I`'s kernel when `id` is `I` and the row is the unit's (else false).
template <int D, DecodeUnit U, std::size_t I>
bool launch_row(int id, const DecodeParams& p, const DecodeLaunch& l, cudaStream_t stream) {
  if constexpr (in_unit<D, U, I>()) {
    if (id != static_cast<int>(I)) return false;
    constexpr catalog::Row r = catalog::kRows[I];
    constexpr bool kBF16 = r.q == DType::kBF16;
    constexpr bool kVariant = (r.variants & (catalog::kWindow | catalog::kSoftCap)) != 0;
    if constexpr (r.family == catalog::Family::kDecodeStream)
      launch_stream<D, kBF16, kVariant, tile::kv_policy(r.kv)>(p, l, stream);
    else
      launch_split<D, kBF16, r.stages, kVariant, tile::kv_policy(r.kv), r.tile_keys>(p, l, stream);
    return true;
  } else {
    return false;
  }
}

/// The resident clusters of row `I`'s kernel when `id` is `I` and it is one of the unit's
/// plain split rows (else null).
template <int D, DecodeUnit U, std::size_t I>
const ResidentClusters* clusters_row(int id) {
  if constexpr (in_unit<D, U, I>() && (U == DecodeUnit::kSplit || U == DecodeUnit::kFp8)) {
    if (id != static_cast<int>(I)) return nullptr;
    constexpr catalog::Row r = catalog::kRows[I];
    return &resident_clusters<D, r.q == DType::kBF16, r.stages, tile::kv_policy(r.kv),
                              r.tile_keys>();
  } else {
    return nullptr;
  }
}

/// Throws for a kernel id that is not the unit's (the table sends every id to its own unit).
[[noreturn]] inline void not_in_unit(int id, int head_dim) {
  attnstate::detail::throw_argument(kFn, "kernel id",
                                    "a row of the unit at head dim " + std::to_string(head_dim),
                                    std::to_string(id), Status::kInternal);
}

template <int D, DecodeUnit U, std::size_t... I>
void launch_id(int id, const DecodeParams& p, const DecodeLaunch& l, cudaStream_t stream,
               std::index_sequence<I...>) {
  if (!(launch_row<D, U, I>(id, p, l, stream) || ...)) not_in_unit(id, D);
}

template <int D, DecodeUnit U, std::size_t... I>
const ResidentClusters& clusters_id(int id, std::index_sequence<I...>) {
  const ResidentClusters* n = nullptr;
  ((n = n != nullptr ? n : clusters_row<D, U, I>(id)), ...);
  if (n == nullptr) not_in_unit(id, D);
  return *n;
}

}  // namespace decode_unit

template <int D, DecodeUnit U>
void decode_unit_launch(int id, const DecodeParams& p, const DecodeLaunch& l, cudaStream_t stream) {
  decode_unit::launch_id<D, U>(id, p, l, stream, std::make_index_sequence<catalog::kNumRows>{});
}

template <int D, DecodeUnit U>
const ResidentClusters& decode_unit_clusters(int id) {
  return decode_unit::clusters_id<D, U>(id, std::make_index_sequence<catalog::kNumRows>{});
}

#if ATTNSTATE_PROBES
template <int D, DecodeUnit U>
void decode_unit_timeline(unsigned long long* host, int ctas) {
  // this unit's copy of the stamps (each translation unit's kernels write their own)
  const std::size_t n = static_cast<std::size_t>(std::min(ctas, kDecodeTimelineCtas)) * 8;
  std::vector<unsigned long long> mine(n);
  ATTNSTATE_CUDA_CHECK(cudaMemcpyFromSymbol(mine.data(), g_decode_timeline, n * 8));
  for (std::size_t i = 0; i < n; ++i) host[i] = std::max(host[i], mine[i]);
  void* addr = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaGetSymbolAddress(&addr, g_decode_timeline));
  ATTNSTATE_CUDA_CHECK(cudaMemset(addr, 0, sizeof(g_decode_timeline)));
}
#define ATTNSTATE_DECODE_UNIT_TIMELINE(D, U) \
  template void decode_unit_timeline<D, DecodeUnit::U>(unsigned long long*, int);
#else
#define ATTNSTATE_DECODE_UNIT_TIMELINE(D, U)
#endif

/// The explicit instantiations of one unit (head dim `D`, group `U`).
#define ATTNSTATE_DECODE_UNIT(D, U)                                                      \
  template void decode_unit_launch<D, DecodeUnit::U>(int, const DecodeParams&,           \
                                                     const DecodeLaunch&, cudaStream_t); \
  template const ResidentClusters& decode_unit_clusters<D, DecodeUnit::U>(int);          \
  ATTNSTATE_DECODE_UNIT_TIMELINE(D, U)

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
