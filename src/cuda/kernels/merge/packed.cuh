/// @file kernels/merge/packed.cuh
/// @brief Kernel of `merge_states` for rows whose chunk count is not a power of two (head dims
///        such as 48, 80, 96, 112, 160, 192, 576 or not a multiple of 8): the rows' chunks are
///        packed over consecutive threads (thread `i` merges chunk `i mod per_row` of row
///        `i / per_row`), so no lane idles, and each thread does its row's LSE work on its own.
///
/// The kernels that split a row over a power of two of lanes (`merge_row`, the few-states and
/// ring kernels) leave the lanes past the last chunk idle: a quarter to three eighths of them at
/// head dims 96, 192 and 80. Here the LSEs of a row (a few bytes, read by every thread of the row
/// from L1) are reduced by each thread in input order: `m` by math::nan_max, the weights by
/// math::merge_weight, their sum in input order, `o` accumulated in fp32 in input order from -0
/// (a lone input passes through bitwise), empty inputs never read; math::merge_finalize. It is
/// the one kernel of those head dims, aligned views or not and any dtypes, so their results do
/// not depend on which kernel runs.
#pragma once

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/kernels/merge/stack.cuh"
#include "cuda/tile/fp8.cuh"
#include "cuda/tile/merge_row.cuh"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// `out[t, h] = ⊕_s in[t, s, h]`, one chunk per thread, rows packed over `per_row` consecutive
/// threads, grid-stride (see the file comment).
template <class TIn, class TO>
__global__ void __launch_bounds__(kMergeBlock) merge_packed_kernel(RowsArgs args, int per_row) {
  constexpr int kBatch = in_flight<TIn>();  // 128 bytes of o in flight per thread
  const std::int64_t heads = args.out.heads;
  const std::int64_t dim = args.out.head_dim;
  const std::int64_t total = args.out.tokens * heads * per_row;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const int num_states = static_cast<int>(args.in.num_states);
  const LseBase base = args.out.base;
  const LseBase in_base = args.in.base;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t row = div_index(i, per_row);
    const int chunk = static_cast<int>(i - row * per_row);
    const std::int64_t token = div_index(row, heads);
    const std::int64_t head = row - token * heads;
    const int n = chunk_elems(dim, chunk);
    const TIn* o = static_cast<const TIn*>(args.in.o) + args.in.o_offset(token, head) +
                   static_cast<std::int64_t>(chunk) * kChunk;
    const float* lse = args.in.lse + args.in.lse_offset(token, head);
    // 1. The row's max LSE.
    float m = math::neg_inf();
    for (int s = 0; s < num_states; ++s)
      m = math::nan_max(m, math::convert_lse(lse[s * args.in.lse_stride_state], in_base, base));
    // 2. Weights and o, a batch of inputs in flight at a time (an empty input's o is not read).
    float sum = 0.f;
    float acc[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) acc[k] = -0.f;
    for (int s0 = 0; s0 < num_states; s0 += kBatch) {
      Chunk<TIn> c[kBatch];
      float w[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        w[u] = -1.f;  // absent or empty
        if (s0 + u < num_states) {
          const float l =
              math::convert_lse(lse[(s0 + u) * args.in.lse_stride_state], in_base, base);
          if (!math::is_empty_lse(l)) {
            w[u] = math::merge_weight(base, l, m);
            sum += w[u];
            load_chunk_stream(c[u], o + (s0 + u) * args.in.o_stride_state, args.aligned, n);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (w[u] < 0.f) continue;  // empty or absent (NaN weights go through and propagate)
#pragma unroll
        for (int k = 0; k < kChunk; ++k) acc[k] += w[u] * o_value(c[u], k, args.in.o_scale);
      }
    }
    store_row<TO>(args.out, token, head, chunk, args.aligned, acc,
                  math::merge_finalize(base, m, sum), n);
  }
}

/// True when `merge_states` takes the packed kernel: rows whose chunk count is not a power of
/// two (every call at such a head dim, so its results never depend on the kernel).
inline bool use_packed(std::int64_t head_dim) {
  const std::int64_t per_row = (head_dim + kChunk - 1) / kChunk;
  return (per_row & (per_row - 1)) != 0 || head_dim % kChunk != 0;
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
