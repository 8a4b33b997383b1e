/// @file kernels/merge/ragged.cuh
/// @brief Kernel of `merge_states_ragged`:
///        `out[t, h] = ⊕_{r ∈ [indptr[t], indptr[t+1])} rows[r, h]`, `indptr` read (and clamped)
///        on the device.
#pragma once

#include <cstdint>

#include "cuda/kernels/merge/launch.cuh"
#include "cuda/kernels/merge/stack.cuh"
#include "cuda/tile/merge_row.cuh"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// One row `(token, head)` per `1 << row_shift` threads, grid-stride. Row offsets are clamped
/// to `[0, in.tokens]` (and `end ≥ begin`), so a bad `indptr` never reads out of bounds; a token
/// with no rows gets the empty state `(0, -inf)`.
template <class TIn, class TO>
__global__ void __launch_bounds__(kMergeBlock, kRowsMinBlocks) merge_ragged_kernel(RowsArgs args) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t heads = args.out.heads;
  const int per_row_mask = (1 << args.row_shift) - 1;
  const std::int64_t total = (args.out.tokens * heads) << args.row_shift;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t num_rows = args.in.tokens;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i - lane < total; i += stride) {  // warp-uniform trip count
    const bool active = i < total;
    const std::int64_t row = i >> args.row_shift;
    const int chunk = static_cast<int>(i) & per_row_mask;
    const std::int64_t token = active ? row / heads : 0;
    const std::int64_t head = active ? row - token * heads : 0;
    std::int64_t begin = 0;
    std::int64_t end = 0;
    if (active) {
      begin = min(max(static_cast<std::int64_t>(args.indptr[token]), std::int64_t{0}), num_rows);
      end = min(max(static_cast<std::int64_t>(args.indptr[token + 1]), begin), num_rows);
    }
    const int count = static_cast<int>(end - begin);
    RowInputs<TIn> rows;
    rows.o = static_cast<const TIn*>(args.in.o) + args.in.o_offset(begin, head) + chunk * kChunk;
    rows.o_step = args.in.o_stride_token;
    rows.lse = args.in.lse + args.in.lse_offset(begin, head);
    rows.lse_step = args.in.lse_stride_token;
    rows.count = count;
    rows.count_max = static_cast<int>(__reduce_max_sync(0xffffffffu, static_cast<unsigned>(count)));
    rows.in_base = args.in.base;
    rows.n = chunk_elems(args.out.head_dim, chunk);
    float acc[kChunk];
    const math::MergeResult r = merge_row(rows, args.out.base, args.group, args.aligned, acc);
    if (active) store_row<TO>(args.out, token, head, chunk, args.aligned, acc, r, rows.n);
  }
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
