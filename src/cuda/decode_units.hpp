/// @file decode_units.hpp
/// @brief The decode's instantiation units: the launch and occupancy entry points of one catalog
///        group of decode kernels (plain split, variant split, fp8 split and its variant, streamed,
///        fp8 streamed) at one head dim, by kernel id (`catalog::find_id`). Each is defined in its
///        own translation unit, which CMake generates from `cmake/decode_unit.cu.in` (one per head
///        dim × group, `src/CMakeLists.txt`), so the kernels compile in parallel; `decode.cu` holds
///        the launch table that maps a kernel id to its unit (never in a unit: taking the entry
///        points' addresses there would instantiate every unit's kernels).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "catalog/catalog.hpp"
#include "cuda/kernels/decode/params.cuh"
#include "plan/decode_plan.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// The groups of decode kernels, one instantiation unit each per head dim (the catalog's decode
/// groups: `catalog/catalog.hpp`).
enum class DecodeUnit : int {
  kSplit = 0,       ///< The split kernel over 16-bit caches (both depths).
  kVariant = 1,     ///< Its variant instance (window, soft cap).
  kFp8 = 2,         ///< The split kernel over fp8 caches.
  kStream = 3,      ///< The streamed kernel (plain and variant instances).
  kFp8Variant = 4,  ///< The split kernel's variant instance over fp8 caches.
  kStreamFp8 = 5,   ///< The streamed kernel over fp8 caches (plain and variant instances).
};

/// The group whose unit compiles a decode row's kernel.
constexpr DecodeUnit unit_of(const catalog::Row& r) {
  if (r.family == catalog::Family::kDecodeStream)
    return is_fp8(r.kv) ? DecodeUnit::kStreamFp8 : DecodeUnit::kStream;
  const bool variant = (r.variants & (catalog::kWindow | catalog::kSoftCap)) != 0;
  if (is_fp8(r.kv)) return variant ? DecodeUnit::kFp8Variant : DecodeUnit::kFp8;
  return variant ? DecodeUnit::kVariant : DecodeUnit::kSplit;
}

/// What a run resolved: the launch of the kernel the plan records.
struct DecodeLaunch {
  bool streamed = false;  ///< The streamed kernel (else the split kernel).
  int stages = kDecodeStages;
  std::int64_t grid = 0;  ///< CTAs of the split kernel (items of the streamed kernel).
  int num_sms = 1;        ///< The plan's SMs (the streamed kernel's CTAs, at most).
  bool pdl = false;       ///< A programmatic dependent launch.
  /// The variant (a window, a soft cap: the split or streamed kernel's variant instance).
  catalog::Variants variants = catalog::kPlain;
};

/// Clusters of each size (index 2..8) of a split kernel resident at once.
using ResidentClusters = std::array<int, plan::kMaxCluster + 1>;

/// Launches the kernel of catalog row `id` (a decode row of unit `U` at head dim `D`) for the
/// launch `l`.
template <int D, DecodeUnit U>
void decode_unit_launch(int id, const DecodeParams& p, const DecodeLaunch& l, cudaStream_t stream);

/// The resident clusters of split row `id`'s kernel (of unit `U` at head dim `D`) on the current
/// device, queried once per device.
template <int D, DecodeUnit U>
const ResidentClusters& decode_unit_clusters(int id);

#if ATTNSTATE_PROBES
/// Probe builds only: folds unit `U`'s per-CTA timeline stamps (8 per CTA, `ctas` CTAs) into
/// `host` (the larger value; a unit whose kernels did not run holds zeros) and clears them.
template <int D, DecodeUnit U>
void decode_unit_timeline(unsigned long long* host, int ctas);
#endif

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
