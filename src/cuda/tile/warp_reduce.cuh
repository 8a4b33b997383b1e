/// @file tile/warp_reduce.cuh
/// @brief Warp reductions whose result every lane uses, as butterfly shuffles through CCCL's
///        `cuda::device::warp_shuffle_xor`. Used where the kernels' machine code stays
///        byte-identical to the `__shfl_xor_sync` loops they replace; the other reductions stay
///        written out, and none uses `cub::WarpReduce`, whose result is defined in the logical
///        warp's first lane only (docs/internals.md, "Warp reductions and CUB", has the
///        instruction counts).
#pragma once

#include <cuda/warp>

namespace attnstate {
namespace cuda {
namespace tile {

/// `op` over the aligned group of `2 · max(kFirst, kLast)` lanes that holds this lane, in every
/// lane of the group: butterfly shuffles at the lane offsets kFirst, ..., kLast (powers of two,
/// doubling or halving), each step `v = op(v, partner's v)`. A commutative `op` leaves the same
/// bits in every lane of the group; the order of the offsets fixes the rounding of a sum. Every
/// lane of the warp calls it.
template <int kFirst, int kLast, class Op>
__device__ __forceinline__ float butterfly_reduce(float v, Op op) {
  static_assert(kFirst > 0 && kLast > 0 && kFirst <= 16 && kLast <= 16 &&
                    (kFirst & (kFirst - 1)) == 0 && (kLast & (kLast - 1)) == 0,
                "lane offsets are powers of two in [1, 16]");
  if constexpr (kFirst <= kLast) {
#pragma unroll
    for (int off = kFirst; off <= kLast; off *= 2)
      v = op(v, ::cuda::device::warp_shuffle_xor(v, off));
  } else {
#pragma unroll
    for (int off = kFirst; off >= kLast; off /= 2)
      v = op(v, ::cuda::device::warp_shuffle_xor(v, off));
  }
  return v;
}

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
