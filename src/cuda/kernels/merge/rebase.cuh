/// @file kernels/merge/rebase.cuh
/// @brief Kernel of `rebase`: copies a state converting the LSE base and the dtype of `o`.
#pragma once

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/state_view.hpp"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Arguments of `rebase_kernel`.
struct RebaseArgs {
  ConstStateView in;  ///< Input.
  StateView out;      ///< Output; may be `in` itself.
  RowSplit split;     ///< Threads and chunks per row.
  bool copy_o;        ///< False when `out` is `in` itself: only the LSEs are rewritten.
  bool aligned;       ///< Both `o` views allow 16-byte vector access.
};

/// One row per `split.group` lanes, grid-stride. Each element is read and written by the same
/// thread, so `out` may be `in`.
template <class TI, class TO>
__global__ void __launch_bounds__(kMergeBlock) rebase_kernel(RebaseArgs args) {
  const int group = args.split.group;
  const int g = static_cast<int>(threadIdx.x) & (group - 1);
  const std::int64_t heads = args.out.heads;
  const std::int64_t total = (args.out.tokens * heads) << args.split.shift;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t row = i >> args.split.shift;
    const std::int64_t token = row / heads;
    const std::int64_t head = row - token * heads;
    if (args.copy_o) {
      const TI* src = static_cast<const TI*>(args.in.o) + args.in.o_offset(token, head);
      TO* dst = static_cast<TO*>(args.out.o) + args.out.o_offset(token, head);
      for (int c = 0; c < args.split.chunks; ++c) {
        const int e = (g + c * group) * kChunk;
        Chunk<TI> ch;
        load_chunk(ch, src + e, args.aligned);
        float v[kChunk];
#pragma unroll
        for (int k = 0; k < kChunk; ++k) v[k] = chunk_at(ch, k);
        store_chunk(dst + e, v, args.aligned);
      }
    }
    if (g == 0) {
      args.out.lse[args.out.lse_offset(token, head)] = math::convert_lse(
          args.in.lse[args.in.lse_offset(token, head)], args.in.base, args.out.base);
    }
  }
}

/// `mark_empty_rows`: each LSE of `+inf` becomes `-inf` (one thread per row, grid-stride).
__global__ void __launch_bounds__(kMergeBlock) mark_empty_rows_kernel(StateView state) {
  const std::int64_t heads = state.heads;
  const std::int64_t total = state.tokens * heads;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t token = i / heads;
    float* l = state.lse + state.lse_offset(token, i - token * heads);
    if (*l == INFINITY) *l = -INFINITY;
  }
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
