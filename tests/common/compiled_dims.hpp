/// @file compiled_dims.hpp
/// @brief The head dims this build compiles, for the tests' parameter lists: the kernel catalog's
///        rows of a family (src/catalog/catalog.hpp), so that a build with fewer
///        `ATTNSTATE_CUDA_HEAD_DIMS` never asks for an uncompiled one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "attnstate/cuda/cascade_plan.hpp"
#include "catalog/catalog.hpp"
#include "common/compiled.hpp"

namespace attnstate_test {

/// The head dims of the catalog's rows of `family`, ascending.
inline std::vector<std::int64_t> catalog_head_dims(attnstate::catalog::Family family) {
  std::vector<std::int64_t> dims;
  for (const attnstate::catalog::Row& r : attnstate::catalog::kRows)
    if (r.family == family && std::find(dims.begin(), dims.end(), r.head_dim) == dims.end())
      dims.push_back(r.head_dim);
  std::sort(dims.begin(), dims.end());
  return dims;
}

/// Head dims of the split-KV decode, of the streamed decode and of the cascade.
inline std::vector<std::int64_t> decode_head_dims() {
  return catalog_head_dims(attnstate::catalog::Family::kDecodeSplit);
}
inline std::vector<std::int64_t> stream_head_dims() {
  return catalog_head_dims(attnstate::catalog::Family::kDecodeStream);
}
inline std::vector<std::int64_t> cascade_head_dims() {
  return catalog_head_dims(attnstate::catalog::Family::kCascadeMma);
}
/// The entries of a compile-time list (the list itself, not an array of unknown bound: nvcc
/// takes it in .cu tests too).
template <int... V>
std::vector<std::int64_t> list_values(attnstate::compiled::IntList<V...>) {
  return {V...};
}

/// Head dims of the merge kernels specialised on the head dim: the ring kernel's rows (the
/// merges take every head dim through their other kernels).
inline std::vector<std::int64_t> merge_head_dims() {
  return catalog_head_dims(attnstate::catalog::Family::kMergeRing);
}
/// Head dims of the odd-row kernel of `merge_states` (rows not a power of two of chunks).
inline std::vector<std::int64_t> merge_odd_head_dims() {
  return catalog_head_dims(attnstate::catalog::Family::kMergeOdd);
}

/// The entries of `xs` (a literal list, repeats kept: they weight a draw) that `dims` holds.
inline std::vector<std::int64_t> only_compiled(std::initializer_list<std::int64_t> xs,
                                               const std::vector<std::int64_t>& dims) {
  std::vector<std::int64_t> out;
  for (std::int64_t x : xs)
    if (std::find(dims.begin(), dims.end(), x) != dims.end()) out.push_back(x);
  return out;
}

/// True for a cascade level row (mma.sync, wgmma, warp-specialised).
inline bool is_cascade_level(const attnstate::catalog::Row& r) {
  using attnstate::catalog::Family;
  return r.family == Family::kCascadeMma || r.family == Family::kCascadeWgmma ||
         r.family == Family::kCascadeWs;
}

/// The tuning that plans a shared cascade level onto level row `r`: its kernel family, tile rows,
/// a split size of its depth (the 16-row tile's 2 stages are those of short splits) and its
/// warp-specialised KV tile; no decode last level. (The tests of every level row:
/// PlanCascade.TuningReachesEveryLevelRowOfTheCatalog, CudaCascade.EveryCatalogLevelRowMatches.)
inline attnstate::cuda::CascadeTuning tuning_for_level_row(const attnstate::catalog::Row& r) {
  using attnstate::catalog::Family;
  attnstate::cuda::CascadeTuning t;
  t.tile_rows = r.tile_rows;
  t.decode_last_level = false;
  t.chunk = r.tile_rows == 16 && r.stages == 2 ? 448 : 1024;
  t.kernel = r.family == Family::kCascadeMma ? attnstate::cuda::CascadeKernel::kMma
                                             : attnstate::cuda::CascadeKernel::kWgmma;
  t.ws_variant = r.family != Family::kCascadeWs ? 0 : r.tile_keys == 128 ? 1 : 3;
  return t;
}

}  // namespace attnstate_test
