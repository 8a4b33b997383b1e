/// @file decode_units.hpp
/// @brief The decode's instantiation units: the launch and occupancy entry points of one catalog
///        group of decode kernels (plain split, variant split, fp8 split, streamed) at one head
///        dim. Each is defined in its own translation unit, which CMake generates from
///        `cmake/decode_unit.cu.in` (one per head dim × group, `src/CMakeLists.txt`), so the
///        kernels compile in parallel; `decode.cu` picks the unit and calls it.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "cuda/kernels/decode/params.cuh"
#include "plan/decode_plan.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// The groups of decode kernels, one instantiation unit each per head dim (the catalog's decode
/// groups: `catalog/catalog.hpp`).
enum class DecodeUnit : int {
  kSplit = 0,    ///< The split kernel over 16-bit caches (both depths).
  kVariant = 1,  ///< Its variant instance (window, soft cap).
  kFp8 = 2,      ///< The split kernel over fp8 caches.
  kStream = 3,   ///< The streamed kernel.
};

/// What a run resolved: the launch of the kernel the plan records.
struct DecodeLaunch {
  bool streamed = false;  ///< The streamed kernel (else the split kernel).
  int stages = kDecodeStages;
  std::int64_t grid = 0;  ///< CTAs of the split kernel (items of the streamed kernel).
  int num_sms = 1;        ///< The plan's SMs (the streamed kernel's CTAs, at most).
  bool pdl = false;       ///< A programmatic dependent launch.
  bool variant = false;   ///< The variant kernel (a window or a soft cap; never streamed).
};

/// Launches unit `U`'s kernel at head dim `D` for the queries' and the cache's dtypes and the
/// launch `l` (its depth); throws `Status::kNotSupported` when the unit compiles none at `D`.
template <int D, DecodeUnit U>
void decode_unit_launch(const DecodeParams& p, DType q_dtype, DType kv_dtype, const DecodeLaunch& l,
                        cudaStream_t stream);

/// Fills `f.resident_clusters` for unit `U`'s split kernel at head dim `D` (`kSplit` or `kFp8`)
/// on the current device (`[1]`, the short-split depth, where it exists).
template <int D, DecodeUnit U>
void decode_unit_occupancy(DType q_dtype, DType kv_dtype, plan::DecodeFacts& f);

#if ATTNSTATE_PROBES
/// Probe builds only: folds unit `U`'s per-CTA timeline stamps (8 per CTA, `ctas` CTAs) into
/// `host` (the larger value; a unit whose kernels did not run holds zeros) and clears them.
template <int D, DecodeUnit U>
void decode_unit_timeline(unsigned long long* host, int ctas);
#endif

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
