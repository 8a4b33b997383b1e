/// @file tile/paged_kv.cuh
/// @brief Device parts of paged K/V addressing shared by the decode and cascade kernels.
#pragma once

#include <cstdint>

namespace attnstate {
namespace cuda {
namespace tile {

/// A page id read from a page table, clamped into the pool `[0, num_pages)` (`num_pages` ≥ 1):
/// whatever a table holds, no copy reads outside the pool.
__device__ __forceinline__ std::int64_t clamp_page(std::int64_t id, std::int64_t num_pages) {
  if (id < 0) id = 0;
  if (id >= num_pages) id = num_pages - 1;
  return id;
}

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
