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
  bool copy_o;        ///< False when `out` is `in` itself: `o` is rewritten for empty rows only.
  bool aligned;       ///< Both `o` views allow vector access of whole chunks.
};

/// One row per `split.group` lanes, grid-stride. Each element is read and written by the same
/// thread, and every lane of a row reads the row's LSE before lane 0 writes it, so `out` may be
/// `in`. An empty row (LSE `-inf`) is written as `(0, -inf)`, whatever its `o` held.
template <class TI, class TO>
__global__ void __launch_bounds__(kMergeBlock) rebase_kernel(RebaseArgs args) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int group = args.split.group;
  const int g = lane & (group - 1);
  const std::int64_t heads = args.out.heads;
  const std::int64_t dim = args.out.head_dim;
  const std::int64_t total = (args.out.tokens * heads) << args.split.shift;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i - lane < total; i += stride) {  // warp-uniform trip count
    const bool active = i < total;
    const std::int64_t row = i >> args.split.shift;
    const std::int64_t token = active ? row / heads : 0;
    const std::int64_t head = active ? row - token * heads : 0;
    float lse = 0.f;
    if (active) {
      lse = math::convert_lse(args.in.lse[args.in.lse_offset(token, head)], args.in.base,
                              args.out.base);
    }
    __syncwarp();  // every lane has read its row's LSE before lane 0 may overwrite it
    if (!active) continue;
    const bool empty = math::is_empty_lse(lse);
    if (args.copy_o || empty) {
      const TI* src = static_cast<const TI*>(args.in.o) + args.in.o_offset(token, head);
      TO* dst = static_cast<TO*>(args.out.o) + args.out.o_offset(token, head);
      for (int c = 0; c < args.split.chunks; ++c) {
        const int chunk = g + c * group;
        const int n = chunk_elems(dim, chunk);
        if (n == 0) break;
        float v[kChunk];
        if (empty) {
#pragma unroll
          for (int k = 0; k < kChunk; ++k) v[k] = 0.f;
        } else {
          Chunk<TI> ch;
          load_chunk(ch, src + chunk * kChunk, args.aligned, n);
#pragma unroll
          for (int k = 0; k < kChunk; ++k) v[k] = chunk_at(ch, k);
        }
        store_chunk(dst + chunk * kChunk, v, args.aligned, n);
      }
    }
    if (g == 0) args.out.lse[args.out.lse_offset(token, head)] = lse;
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
