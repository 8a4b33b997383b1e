/// @file kernels/cascade/tails.cuh
/// @brief The keys each request holds from a level's segment on (its "tail" there): what a
///        windowed level needs to place its rows (`CascadeLevelParams::tails`), computed on the
///        device from every level's arrays before the levels run, so a plan replayed with other
///        lengths (a captured graph) places them by the lengths of that run.
#pragma once

#include <cstdint>

#include "attnstate/core/cascade.hpp"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Arguments of `cascade_tails_kernel`: the device arrays of every level (`num_levels`).
struct CascadeTailsParams {
  const std::int32_t* request_indptr[kMaxCascadeLevels];
  const std::int32_t* page_indptr[kMaxCascadeLevels];
  const std::int32_t* seg_lens[kMaxCascadeLevels];
  int num_segments[kMaxCascadeLevels];
  int has_pages[kMaxCascadeLevels];  ///< 0: a level run without page ids (no keys).
  int num_levels;
  int batch;
  int page_size;
  std::int32_t* tails;  ///< `(num_levels, batch)`.
};

/// Threads per block of `cascade_tails_kernel`.
inline constexpr int kCascadeTailsThreads = 128;

/// One thread per request: walks the levels from the last, finds the request's segment in each
/// (a binary search of its request offsets; none: no keys) and writes the running sum of the
/// segments' keys as the level's tail. A segment's keys are its length clamped as the level
/// kernels clamp it (`tile::LevelBlock::locate`: at least 0, at most its pages hold), and the
/// sum saturates at 2^31 - 1, so nothing read from the arrays can overflow it.
__global__ void __launch_bounds__(kCascadeTailsThreads)
    cascade_tails_kernel(const CascadeTailsParams p) {
  const int b = blockIdx.x * kCascadeTailsThreads + threadIdx.x;
  if (b >= p.batch) return;
  long long tail = 0;
  for (int l = p.num_levels - 1; l >= 0; --l) {
    const std::int32_t* ri = p.request_indptr[l];
    int lo = 0, hi = p.num_segments[l];  // the last segment s with ri[s] <= b, in [lo, hi)
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (ri[mid] <= b)
        lo = mid;
      else
        hi = mid;
    }
    if (p.num_segments[l] > 0 && ri[lo] <= b && b < ri[lo + 1]) {
      const long long pages =
          p.has_pages[l] ? max(p.page_indptr[l][lo + 1] - max(p.page_indptr[l][lo], 0), 0) : 0;
      tail += min(static_cast<long long>(max(p.seg_lens[l][lo], 0)), pages * p.page_size);
      tail = min(tail, 0x7FFFFFFFll);
    }
    p.tails[static_cast<std::int64_t>(l) * p.batch + b] = static_cast<std::int32_t>(tail);
  }
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
