/// @file kernels/merge/pair.cuh
/// @brief Kernel of the pairwise merge `out = a ⊕ b` (and the masked in-place merge).
#pragma once

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/state_view.hpp"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/tile/fp8.cuh"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Most chunks per thread of a row (head_dim 512 with 32 threads per row).
constexpr int kMaxChunks = 2;

/// Arguments of `merge_pair_kernel`.
struct PairArgs {
  ConstStateView a;          ///< First input.
  ConstStateView b;          ///< Second input.
  StateView out;             ///< Output; may alias `a` or `b` exactly.
  const std::uint8_t* mask;  ///< Optional per-token mask; tokens with 0 are not written.
  RowSplit split;            ///< Threads and chunks per row.
  bool aligned;              ///< All `o` views allow vector access of chunks (`chunk_aligned`).
};

/// `out[t, h] = a[t, h] ⊕ b[t, h]`, one row per `split.group` lanes, grid-stride over rows.
/// All lanes read their row's LSEs before any lane writes, so `out` may alias an input.
template <class TA, class TB, class TO>
__global__ void __launch_bounds__(kMergeBlock) merge_pair_kernel(PairArgs args) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int group = args.split.group;
  const int g = lane & (group - 1);
  const std::int64_t heads = args.out.heads;
  const std::int64_t total = args.out.tokens * heads * group;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const LseBase base = args.out.base;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i - lane < total; i += stride) {  // warp-uniform trip count
    const std::int64_t row = i >> args.split.shift;
    const std::int64_t token = row / heads;
    const std::int64_t head = row - token * heads;
    bool active = i < total;
    if (active && args.mask != nullptr) active = args.mask[token] != 0;
    const TA* oa = static_cast<const TA*>(args.a.o) + args.a.o_offset(token, head);
    const TB* ob = static_cast<const TB*>(args.b.o) + args.b.o_offset(token, head);
    // o is loaded together with the LSEs (one memory round trip); an empty side's chunk is
    // loaded but never used as a factor. Each thread reads only the elements it writes.
    Chunk<TA> ca[kMaxChunks];
    Chunk<TB> cb[kMaxChunks];
    float la = math::neg_inf();
    float lb = math::neg_inf();
    if (active) {
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        if (c < args.split.chunks) {
          const int e = (g + c * group) * kChunk;
          load_chunk(ca[c], oa + e, args.aligned);
          load_chunk(cb[c], ob + e, args.aligned);
        }
      }
      la = math::convert_lse(args.a.lse[args.a.lse_offset(token, head)], args.a.base, base);
      lb = math::convert_lse(args.b.lse[args.b.lse_offset(token, head)], args.b.base, base);
    }
    __syncwarp();  // every lane has read its LSEs before lane 0 of a row may overwrite one
    if (!active) continue;
    const math::PairWeights p = math::pair_weights(base, la, lb);
    TO* oo = static_cast<TO*>(args.out.o) + args.out.o_offset(token, head);
#pragma unroll
    for (int c = 0; c < kMaxChunks; ++c) {
      if (c >= args.split.chunks) break;
      const int e = (g + c * group) * kChunk;
      float v[kChunk];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const float fa = p.a_empty ? 0.f : o_value(ca[c], k, args.a.o_scale);
        const float fb = p.b_empty ? 0.f : o_value(cb[c], k, args.b.o_scale);
        v[k] = math::pair_combine(p, fa, fb);
      }
      store_o_chunk(oo + e, v, args.aligned, args.out.o_scale);
    }
    if (g == 0) args.out.lse[args.out.lse_offset(token, head)] = p.lse;
  }
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
