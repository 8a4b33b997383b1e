/// @file tma.cuh
/// @brief PTX wrappers of the bulk tensor copy engine (TMA, sm_90): a 5-D box global → shared
///        completing on an mbarrier, and the tensor-map prefetch.
#pragma once

#include <cstdint>

namespace attnstate {
namespace cuda {
namespace arch {

/// Bulk tensor copy of one box of the 5-D tensor map `tmap` at coordinates (c0..c4) into shared
/// memory at `dst`, completing `bytes` of transaction on the mbarrier `bar`.
__device__ __forceinline__ void tma_load_5d(std::uint32_t dst, const void* tmap, std::uint32_t bar,
                                            int c0, int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(tmap)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(c4)
      : "memory");
}
/// Prefetches a tensor map (kernel parameter) into the descriptor cache.
__device__ __forceinline__ void tma_prefetch_map(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(tmap))
               : "memory");
}

}  // namespace arch
}  // namespace cuda
}  // namespace attnstate
