/// @file tile/merge_row.cuh
/// @brief The n-ary merge of one row `(token, head)` on the GPU, shared by the stack and the
///        ragged kernels: all LSEs first (max and weights once per row, spread over the row's
///        lanes), then `o` streamed in batches of 16-byte loads, the first batch issued together
///        with the LSE loads and each next batch of the row prefetched into L2.
#pragma once

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/tile/fp8.cuh"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// NaN-propagating max, as a functor for `group_reduce`.
struct NanMaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const {
    return math::nan_max(a, b);
  }
};
/// Sum, as a functor for `group_reduce`.
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

/// Where the inputs of one row live and how many there are.
template <class TIn>
struct RowInputs {
  const TIn* o;           ///< This thread's chunk of `o` of input 0.
  std::int64_t o_step;    ///< Elements between the `o` of consecutive inputs.
  const float* lse;       ///< LSE of input 0.
  std::int64_t lse_step;  ///< Elements between the LSEs of consecutive inputs.
  int count;              ///< Inputs of this row (0 for a lane without a row).
  int count_max;          ///< Largest `count` over the warp (warp-uniform).
  LseBase in_base;        ///< Base of the input LSEs.
  float o_scale = 1.f;    ///< Scale of an fp8 `o` (unused for the other dtypes).
  /// Elements of this thread's chunk: `kChunk`, fewer for the partial last chunk of a row, 0
  /// for a lane past its row's last chunk (it shares the LSE work, loads no `o`).
  int n = kChunk;
};

/// Chunks of `o` a thread loads per batch (128 bytes: 8 chunks of 16-bit data, 4 of f32, 16 of
/// fp8).
template <class TIn>
constexpr int in_flight() {
  return 16 / static_cast<int>(sizeof(TIn));
}

/// Prefetches into L2 the chunks of inputs `[start, start + in_flight)` of `r` (those that exist).
template <class TIn>
__device__ __forceinline__ void prefetch_batch(const RowInputs<TIn>& r, int start) {
#pragma unroll
  for (int u = 0; u < in_flight<TIn>(); ++u) {
    if (start + u < r.count && r.n == kChunk) prefetch_chunk_l2(r.o + (start + u) * r.o_step);
  }
}

/// Merges the `count` inputs of this thread's row. `group` lanes (a power of two ≤ 32, aligned
/// within the warp) share the row's LSE work; every lane of the warp must call this (the loops
/// over inputs are warp-uniform). Returns the chunk `acc` (to be scaled by `inv_sum`; all-empty
/// rows must be written as 0) and the merged LSE in `base`, via math::merge_weight and
/// math::merge_finalize.
///
/// Rows of more than one batch prefetch the next batch into L2 while one is loaded (measured
/// faster on the H200 at S = 32); prefetching the next row as well was measured slower.
template <class TIn>
__device__ __forceinline__ math::MergeResult merge_row(const RowInputs<TIn>& in, LseBase base,
                                                       int group, bool aligned,
                                                       float (&acc)[kChunk]) {
  constexpr int kInFlight = in_flight<TIn>();
  constexpr int kKeep = 2;  // LSE tiles kept in registers between the two passes
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane & (group - 1);
  const int src0 = lane - g;

  // 0. The first batch of `o` chunks is loaded right away, together with the LSEs, so a row with
  //    few inputs costs one memory round trip. An empty input's `o` may be loaded here (it lies
  //    inside the view) but is never used as a factor. The batch after it is prefetched.
  Chunk<TIn> c[kInFlight];
#pragma unroll
  for (int u = 0; u < kInFlight; ++u) {
    if (u < in.count && in.n > 0) load_chunk_stream(c[u], in.o + u * in.o_step, aligned, in.n);
  }
  if (in.count_max > kInFlight) prefetch_batch(in, kInFlight);

  // 1. The maximum LSE of the row, each lane taking inputs g, g + group, ...
  float m = math::neg_inf();
  float keep[kKeep];  // this lane's LSEs of the first kKeep tiles, reused in step 2
#pragma unroll
  for (int j = 0; j < kKeep; ++j) {
    keep[j] = math::neg_inf();
    const int s = g + j * group;
    if (s < in.count) {
      keep[j] = math::convert_lse(in.lse[s * in.lse_step], in.in_base, base);
      m = math::nan_max(m, keep[j]);
    }
  }
  for (int s = g + kKeep * group; s < in.count; s += group) {
    m = math::nan_max(m, math::convert_lse(in.lse[s * in.lse_step], in.in_base, base));
  }
  m = group_reduce(m, group, NanMaxOp{});

  // 2. Weights once per input (by the lane that owns it), broadcast by shuffles while `o` is
  //    streamed. An empty input gets the marker -1 and its `o` is never read as a factor.
  //    The accumulator starts at -0 so that a lone input passes through bitwise (-0 + x == x).
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kChunk; ++k) acc[k] = -0.f;
  for (int tile = 0, j = 0; tile < in.count_max; tile += group, ++j) {
    const int mine = tile + g;
    float w_mine = -1.f;
    if (mine < in.count) {
      float l = keep[kKeep - 1];
#pragma unroll
      for (int jj = kKeep - 2; jj >= 0; --jj) {
        if (j == jj) l = keep[jj];
      }
      if (j >= kKeep) l = math::convert_lse(in.lse[mine * in.lse_step], in.in_base, base);
      if (!math::is_empty_lse(l)) {
        w_mine = math::merge_weight(base, l, m);
        sum += w_mine;
      }
    }
    const int n = min(group, in.count_max - tile);
    for (int k = 0; k < n; k += kInFlight) {
      const int start = tile + k;
      const bool loaded = start == 0;  // the batch loaded in step 0
      if (!loaded) {
        // Loaded before the weights are known (an empty input's chunk is loaded, never used).
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          if (start + u < in.count && in.n > 0)
            load_chunk_stream(c[u], in.o + (start + u) * in.o_step, aligned, in.n);
        }
        if (start + kInFlight < in.count_max) prefetch_batch(in, start + kInFlight);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (k + u >= n) break;  // warp-uniform
        const float w = __shfl_sync(0xffffffffu, w_mine, src0 + k + u);
        if (w < 0.f) continue;  // empty (NaN weights go through and propagate)
#pragma unroll
        for (int e = 0; e < kChunk; ++e) acc[e] += w * o_value(c[u], e, in.o_scale);
      }
    }
  }
  sum = group_reduce(sum, group, SumOp{});
  return math::merge_finalize(base, m, sum);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
