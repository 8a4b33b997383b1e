/// @file kernels/decode/scores.cuh
/// @brief The decode kernels' scores policy for a tile of query rows (internal): each thread's
///        causal key ends and, in the variant instances, the sliding window's start of its two
///        rows. Shared by the split and the streamed kernel, inlined there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/variant.hpp"
#include "cuda/kernels/decode/params.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// The window starts (`scores.lo`) of rows lane/4 and lane/4 + 8 of the `rows` query rows from
/// `row0` of a request of `len` keys, and whether the upper rows exist (`scores.hi_rows`,
/// uniform: the warp then skips the padding rows' scores). (References, as the kernels' code
/// used the values in place: so the machine code stays the same.)
__device__ __forceinline__ void decode_window_rows(const DecodeParams& p, const int& lane,
                                                   const int& rows, const int& row0, const int& len,
                                                   tile::VariantScores& scores) {
  scores.hi_rows = rows > 8;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qi = (row0 + (lane >> 2) + 8 * h) / p.group;
    const std::int64_t pos = static_cast<std::int64_t>(len) - p.q_len + qi;
    scores.lo[h] = static_cast<int>(window_begin(pos, p.window_left));
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
