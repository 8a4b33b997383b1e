/// @file decode_unit.cuh
/// @brief The definitions behind `decode_units.hpp`: one unit's dtype × depth dispatch (the one
///        dispatch, `common/dispatch.hpp`, on the lists of `common/compiled.hpp`), its launches
///        and occupancy queries. Included only by the generated units (`cmake/decode_unit.cu.in`),
///        each of which instantiates one head dim × group with `ATTNSTATE_DECODE_UNIT`.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cuda/check.hpp"
#include "common/compiled.hpp"
#include "cuda/decode_units.hpp"
#include "cuda/device_cache.hpp"
#include "cuda/kernels/decode/split_kv.cuh"
#include "cuda/kernels/decode/stream.cuh"
#include "cuda/launch.hpp"

namespace attnstate {
namespace cuda {
namespace detail {
namespace decode_unit {

/// The head dims unit `U` compiles (the catalog's rows of its group).
template <DecodeUnit U>
using HeadDims =
    std::conditional_t<U == DecodeUnit::kFp8, compiled::DecodeFp8HeadDims,
                       std::conditional_t<U == DecodeUnit::kStream, compiled::DecodeStreamHeadDims,
                                          compiled::DecodeHeadDims>>;

constexpr const char* kFn = "attnstate::cuda::run_decode";

/// Calls `f(kBF16, kStages, kKv)` (integral constants) for unit `U`'s split instance at head dim
/// `D`: the queries' and the cache's dtypes (`q`, `kv`; over fp8, `kKv` the `tile::Fp8Kv`
/// format), at the default depth, or at the short-split depth at its head dim.
template <int D, DecodeUnit U, class F>
void with_instance(DType q, DType kv, int stages, F&& f) {
  const auto at_depth = [&](auto bf16, auto kv_c) {
    if constexpr (D == plan::kDecodeShortHeadDim) {
      if (stages == kDecodeShortStages)
        return f(bf16, std::integral_constant<int, kDecodeShortStages>{}, kv_c);
    }
    f(bf16, std::integral_constant<int, kDecodeStages>{}, kv_c);
  };
  if constexpr (U == DecodeUnit::kFp8) {
    compiled::dispatch(kFn, "plan.problem.kv_dtype", kv, compiled::DecodeFp8DTypes{}, [&](auto k) {
      compiled::dispatch(kFn, "plan.problem.q_dtype", q, compiled::DecodeDTypes{}, [&](auto t) {
        at_depth(std::bool_constant<decltype(t)::value == DType::kBF16>{},
                 std::integral_constant < int,
                 decltype(k)::value == DType::kE4M3 ? tile::kKvE4M3 : tile::kKvE5M2 > {});
      });
    });
  } else {
    compiled::dispatch(kFn, "plan.problem.kv_dtype", kv, compiled::DecodeDTypes{}, [&](auto t) {
      at_depth(std::bool_constant<decltype(t)::value == DType::kBF16>{},
               std::integral_constant<int, tile::kKvSame>{});
    });
  }
}

/// Clusters of each size (index 2..8) of one split-kernel instance resident at once on the
/// current device: its dynamic shared-memory limit raised, then one occupancy query per size,
/// once per device.
template <int D, bool kBF16, int kStages, int kKv>
const std::array<int, plan::kMaxCluster + 1>& resident_clusters() {
  constexpr auto kernel = decode_split_kv_kernel<D, kBF16, kStages, false, kKv>;
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

/// The split kernel on `grid` CTAs (clusters of `p.cluster`).
template <int D, bool kBF16, int kStages, bool kVariant, int kKv>
void launch_split(const DecodeParams& p, const DecodeLaunch& l, cudaStream_t stream) {
  constexpr auto kernel = decode_split_kv_kernel<D, kBF16, kStages, kVariant, kKv>;
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

/// The streamed kernel: one CTA per SM (fewer when there are fewer items).
template <int D, bool kBF16>
void launch_stream(const DecodeParams& p, const DecodeLaunch& l, cudaStream_t stream) {
  constexpr auto kernel = decode_stream_kernel<D, kBF16>;
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

/// Throws `Status::kNotSupported` for a head dim unit `U` does not compile.
template <DecodeUnit U>
[[noreturn]] void not_compiled(int head_dim) {
  attnstate::detail::throw_argument(kFn, "plan.problem.head_dim",
                                    compiled::list_string(HeadDims<U>{}), std::to_string(head_dim),
                                    Status::kNotSupported);
}

}  // namespace decode_unit

template <int D, DecodeUnit U>
void decode_unit_launch(const DecodeParams& p, DType q_dtype, DType kv_dtype, const DecodeLaunch& l,
                        cudaStream_t stream) {
  using namespace decode_unit;
  if constexpr (!compiled::contains(HeadDims<U>{}, D)) {
    not_compiled<U>(D);
  } else if constexpr (U == DecodeUnit::kStream) {
    compiled::dispatch(
        kFn, "plan.problem.kv_dtype", kv_dtype, compiled::DecodeDTypes{},
        [&](auto t) { launch_stream<D, decltype(t)::value == DType::kBF16>(p, l, stream); });
  } else {
    with_instance<D, U>(q_dtype, kv_dtype, l.stages, [&](auto bf16, auto stages, auto kv) {
      launch_split<D, decltype(bf16)::value, decltype(stages)::value, U == DecodeUnit::kVariant,
                   decltype(kv)::value>(p, l, stream);
    });
  }
}

template <int D, DecodeUnit U>
void decode_unit_occupancy(DType q_dtype, DType kv_dtype, plan::DecodeFacts& f) {
  using namespace decode_unit;
  if constexpr (!compiled::contains(HeadDims<U>{}, D) ||
                (U != DecodeUnit::kSplit && U != DecodeUnit::kFp8)) {
    not_compiled<U>(D);
  } else {
    const auto copy = [&](int row, const std::array<int, plan::kMaxCluster + 1>& n) {
      for (int c = 0; c <= plan::kMaxCluster; ++c) f.resident_clusters[row][c] = n[c];
    };
    with_instance<D, U>(q_dtype, kv_dtype, kDecodeStages, [&](auto bf16, auto, auto kv) {
      constexpr bool kBF16 = decltype(bf16)::value;
      constexpr int kKv = decltype(kv)::value;
      copy(0, resident_clusters<D, kBF16, kDecodeStages, kKv>());
      if constexpr (D == plan::kDecodeShortHeadDim)
        copy(1, resident_clusters<D, kBF16, kDecodeShortStages, kKv>());
    });
  }
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
#define ATTNSTATE_DECODE_UNIT(D, U)                                                        \
  template void decode_unit_launch<D, DecodeUnit::U>(const DecodeParams&, DType, DType,    \
                                                     const DecodeLaunch&, cudaStream_t);   \
  template void decode_unit_occupancy<D, DecodeUnit::U>(DType, DType, plan::DecodeFacts&); \
  ATTNSTATE_DECODE_UNIT_TIMELINE(D, U)

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
