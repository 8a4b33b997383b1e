/// @file kernels/merge/stack.cuh
/// @brief Kernel of `merge_states`: `out[t, h] = ⊕_s states[t, s, h]` over a dense or strided
///        stack of `S` states.
#pragma once

#include <cstdint>

#include "attnstate/core/state_view.hpp"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/tile/fp8.cuh"
#include "cuda/tile/merge_row.cuh"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Resident blocks per SM the n-ary kernels are compiled for (at most 80 registers a thread).
constexpr int kRowsMinBlocks = 3;

/// Arguments of the n-ary kernels (`merge_stack_kernel`, `merge_ragged_kernel`).
struct RowsArgs {
  ConstStateStackView in;      ///< The inputs (a stack; for ragged rows, `num_states` is unused).
  StateView out;               ///< Output `(tokens, heads, head_dim)`.
  const std::int32_t* indptr;  ///< Ragged offsets `(out.tokens + 1)` (ragged kernel only).
  /// log2 of the threads per row: the chunks of a row (`ceil(head_dim / kChunk)`) rounded up to
  /// a power of two; threads past the last chunk share the LSE work and load no `o`.
  int row_shift;
  int group;     ///< Lanes sharing a row's LSE work: min(threads per row, 32).
  bool aligned;  ///< Every `o` view allows vector access of whole chunks.
};

/// Writes the merged chunk (its `n` elements; none past the row's end) and, from the row's
/// first thread, the LSE (unless the output has none).
template <class TO>
__device__ __forceinline__ void store_row(const StateView& out, std::int64_t token,
                                          std::int64_t head, int chunk, bool aligned,
                                          const float (&acc)[kChunk], math::MergeResult r,
                                          int n = kChunk) {
  const bool all_empty = math::is_empty_lse(r.lse);  // (0, -inf), never -0 from the accumulator
  float v[kChunk];
#pragma unroll
  for (int k = 0; k < kChunk; ++k) v[k] = all_empty ? 0.f : acc[k] * r.inv_sum;
  if (n > 0) {
    store_o_chunk(static_cast<TO*>(out.o) + out.o_offset(token, head) + chunk * kChunk, v, aligned,
                  out.o_scale, n);
  }
  if (chunk == 0 && out.lse != nullptr) out.lse[out.lse_offset(token, head)] = r.lse;
}

/// One row `(token, head)` per `1 << row_shift` threads (one chunk each), grid-stride.
template <class TIn, class TO>
__global__ void __launch_bounds__(kMergeBlock, kRowsMinBlocks) merge_stack_kernel(RowsArgs args) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t heads = args.out.heads;
  const int per_row_mask = (1 << args.row_shift) - 1;
  const std::int64_t total = (args.out.tokens * heads) << args.row_shift;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const int num_states = static_cast<int>(args.in.num_states);
  // The inputs of the row that thread index `j` merges (count 0 past the end).
  const auto row_inputs = [&](std::int64_t j) {
    const bool active = j < total;
    const std::int64_t row = j >> args.row_shift;
    const int chunk = static_cast<int>(j) & per_row_mask;
    const std::int64_t token = active ? row / heads : 0;
    const std::int64_t head = active ? row - token * heads : 0;
    RowInputs<TIn> r;
    r.o = static_cast<const TIn*>(args.in.o) + args.in.o_offset(token, head) + chunk * kChunk;
    r.o_step = args.in.o_stride_state;
    r.lse = args.in.lse + args.in.lse_offset(token, head);
    r.lse_step = args.in.lse_stride_state;
    r.count = active ? num_states : 0;
    r.count_max = num_states;
    r.in_base = args.in.base;
    r.o_scale = args.in.o_scale;
    r.n = chunk_elems(args.out.head_dim, chunk);
    return r;
  };
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i - lane < total; i += stride) {  // warp-uniform trip count
    const bool active = i < total;
    const RowInputs<TIn> rows = row_inputs(i);
    float acc[kChunk];
    const math::MergeResult r = merge_row(rows, args.out.base, args.group, args.aligned, acc);
    if (active) {
      const std::int64_t row = i >> args.row_shift;
      const std::int64_t token = row / heads;
      const int chunk = static_cast<int>(i) & per_row_mask;
      store_row<TO>(args.out, token, row - token * heads, chunk, args.aligned, acc, r, rows.n);
    }
  }
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
