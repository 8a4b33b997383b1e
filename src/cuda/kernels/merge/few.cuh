/// @file kernels/merge/few.cuh
/// @brief Kernel of `merge_states` for stacks of a few states (S ≤ `kFewMaxStates`) whose rows
///        of `o` allow 16-byte access: one thread per one or two 16-byte chunks of a row, all its
///        chunks and LSEs loaded at once, the row's max and weight sum computed by every thread on
///        its own (no shuffles), and a grid that covers every chunk (many short blocks, no loop).
///
/// A merge of two or three states moves little data per row, so what bounds the other kernels
/// there is their per-row work (index arithmetic, the LSE work shared between lanes, the stages
/// of the ring kernel): this kernel spends a few instructions per byte and holds few registers,
/// so an SM keeps many rows in flight.
///
/// The numerics are those of `merge_row` (tile/merge_row.cuh) operation for operation, so the
/// result is bitwise the one of `merge_stack_kernel`: there, for S ≤ 4 inputs, lane `v` of a row's
/// `group ≥ 8` lanes holds input `v`, and the butterflies over the group leave every lane with
/// `max = nan_max(nan_max(l0, l2), nan_max(l1, l3))` and `sum = (w0 + w2) + (w1 + w3)` (absent or
/// empty inputs contribute `-inf` to the max and `+0` to the sum, which change nothing); `o` is
/// accumulated in fp32 in input order from `-0`, empty inputs never read as factors;
/// math::merge_finalize.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/cuda/check.hpp"
#include "common/compiled.hpp"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/kernels/merge/stack.cuh"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Most states the few-states kernel merges (the closed form of the butterflies above holds for
/// at most 4 inputs on groups of at least 4 lanes).
constexpr int kFewMaxStates = catalog::kMergeFewMaxStates;
/// Threads per block of the few-states kernel.
constexpr int kFewBlock = catalog::kMergeFewBlock;

/// Chunks of a row each thread of the few-states kernel merges for `S` states: two for S ≤ 2
/// (half the per-row work — index arithmetic, LSEs, max and weights — per byte), one above, as
/// measured (bench/RESULTS.md).
constexpr int few_chunks(int states) { return catalog::merge_few_chunks(states); }

/// `out[t, h] = ⊕_s in[t, s, h]` for `S = args.in.num_states ≤ kS`: thread `g` of a row's
/// `2^row_shift / few_chunks(kS)` threads merges its chunks `g + c · threads` that exist (see the
/// file comment). `args.aligned` must hold.
template <class TIn, class TO, int kS>
__global__ void __launch_bounds__(kFewBlock) merge_few_kernel(RowsArgs args) {
  static_assert(kS >= 1 && kS <= kFewMaxStates, "a few states");
  constexpr int kC = few_chunks(kS);
  const std::int64_t heads = args.out.heads;
  const int shift = args.row_shift - (kC == 2 ? 1 : 0);  // log2(threads per row)
  const int per_row = 1 << shift;
  const std::int64_t total = (args.out.tokens * heads) << shift;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const int num_states = static_cast<int>(args.in.num_states);
  const int row_chunks = static_cast<int>(args.out.head_dim / kChunk);  // whole chunks (aligned)
  const LseBase base = args.out.base;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t row = i >> shift;
    const int g = static_cast<int>(i) & (per_row - 1);
    // 32-bit division where the rows allow it (always in practice).
    const std::int64_t token = row < 0x7fffffff && heads < 0x7fffffff
                                   ? static_cast<std::int64_t>(static_cast<std::uint32_t>(row) /
                                                               static_cast<std::uint32_t>(heads))
                                   : row / heads;
    const std::int64_t head = row - token * heads;
    const TIn* o = static_cast<const TIn*>(args.in.o) + args.in.o_offset(token, head) + g * kChunk;
    const float* lse = args.in.lse + args.in.lse_offset(token, head);
    // 0. Every chunk and LSE at once (one memory round trip). An empty input's chunks are loaded
    //    (they lie inside the view) but never used as factors.
    Chunk<TIn> ch[kS][kC];
    float l[kFewMaxStates];
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      if (s < num_states) {
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          if (g + c * per_row < row_chunks)
            load_chunk_stream(ch[s][c], o + s * args.in.o_stride_state + c * per_row * kChunk,
                              true);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kFewMaxStates; ++s) {
      l[s] = math::neg_inf();
      if (s < kS && s < num_states) {
        l[s] = math::convert_lse(lse[s * args.in.lse_stride_state], args.in.base, base);
      }
    }
    // 1. The max and the weights, as merge_row's butterflies leave them (file comment).
    const float m = math::nan_max(math::nan_max(l[0], l[2]), math::nan_max(l[1], l[3]));
    float w[kFewMaxStates];  // -1: empty or absent
    float part[kFewMaxStates];
#pragma unroll
    for (int s = 0; s < kFewMaxStates; ++s) {
      w[s] = -1.f;
      part[s] = 0.f;
      if (s < kS && s < num_states && !math::is_empty_lse(l[s])) {
        w[s] = math::merge_weight(base, l[s], m);
        part[s] += w[s];
      }
    }
    const float sum = (part[0] + part[2]) + (part[1] + part[3]);
    const math::MergeResult r = math::merge_finalize(base, m, sum);
    // 2. o in input order from -0 (a lone input passes through bitwise).
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      if (g + c * per_row >= row_chunks) break;  // a row of chunks not a power of two
      float acc[kChunk];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) acc[k] = -0.f;
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        if (s >= num_states || w[s] < 0.f) continue;  // empty (NaN weights go through)
#pragma unroll
        for (int k = 0; k < kChunk; ++k) acc[k] += w[s] * chunk_at(ch[s][c], k);
      }
      store_row<TO>(args.out, token, head, g + c * per_row, true, acc, r);
    }
  }
}

/// Launches the few-states kernel for `args` (S ≤ kFewMaxStates, `args.aligned`) on `stream`:
/// one thread per `few_chunks(S)` chunks of a row, in blocks of `kFewBlock` (smaller for small
/// problems).
template <class TIn, class TO>
void launch_few(const RowsArgs& args, cudaStream_t stream) {
  const int states = static_cast<int>(args.in.num_states);
  const std::int64_t threads =
      (args.out.tokens * args.out.heads) << args.row_shift >> (few_chunks(states) == 2 ? 1 : 0);
  int block = kFewBlock;
  while (block > kMinBlock && threads < sm_count() * static_cast<std::int64_t>(block)) block /= 2;
  const std::int64_t blocks =
      std::min<std::int64_t>((threads + block - 1) / block, std::int64_t{0x7fffffff});
  const auto launch = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(blocks), block, 0, stream>>>(args);
    ATTNSTATE_CHECK_LAUNCH(stream, "merge_few_kernel");
  };
  // one instance per state count, 1..kFewMaxStates (pick_kernel sends no other)
  static_assert(kFewMaxStates == 4, "the state counts below");
  compiled::dispatch("attnstate::cuda::merge_states", "states.num_states", states,
                     compiled::IntList<1, 2, 3, 4>{},
                     [&](auto n) { launch(merge_few_kernel<TIn, TO, decltype(n)::value>); });
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
