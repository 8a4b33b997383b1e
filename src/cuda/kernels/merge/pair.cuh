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

/// Chunks a thread holds in registers at once (head_dim 512 with 32 threads per row); rows of
/// more chunks per thread are merged in rounds of this many.
constexpr int kMaxChunks = 2;

/// Arguments of `merge_pair_kernel`.
struct PairArgs {
  ConstStateView a;  ///< First input.
  ConstStateView b;  ///< Second input.
  StateView out;     ///< Output; may alias `a` or `b` exactly. `out.lse` may be null (not written).
  TokenMask mask;    ///< Tokens to merge (`data` null: all).
  bool in_place;     ///< Tokens the mask leaves out are not written (else they get `a ⊕ empty`).
  RowSplit split;    ///< Threads and chunks per row.
  bool aligned;      ///< Every `o` view allows vector access of whole chunks.
};

/// `out[t, h] = a[t, h] ⊕ b[t, h]`, one row per `split.group` lanes, grid-stride over rows.
/// All lanes read their row's LSEs before any lane writes, so `out` may alias an input; each
/// thread reads only the elements it writes. Where the mask leaves a token out, `b` is the empty
/// state (its memory is not read) and, in place, nothing is written.
template <class TA, class TB, class TO>
__global__ void __launch_bounds__(kMergeBlock) merge_pair_kernel(PairArgs args) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int group = args.split.group;
  const int g = lane & (group - 1);
  const std::int64_t heads = args.out.heads;
  const std::int64_t dim = args.out.head_dim;
  const std::int64_t total = args.out.tokens * heads * group;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const LseBase base = args.out.base;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i - lane < total; i += stride) {  // warp-uniform trip count
    const std::int64_t row = i >> args.split.shift;
    const std::int64_t token = row / heads;
    const std::int64_t head = row - token * heads;
    bool active = i < total;
    bool take_b = active;
    if (active && args.mask.data != nullptr) {
      take_b = args.mask.selected(token);
      active = take_b || !args.in_place;
    }
    const TA* oa = static_cast<const TA*>(args.a.o) + args.a.o_offset(token, head);
    const TB* ob = static_cast<const TB*>(args.b.o) + args.b.o_offset(token, head);
    // The first round of o is loaded together with the LSEs (one memory round trip); an empty
    // side's chunk may be loaded but is never used as a factor.
    Chunk<TA> ca[kMaxChunks];
    Chunk<TB> cb[kMaxChunks];
    float la = math::neg_inf();
    float lb = math::neg_inf();
    if (active) {
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        const int chunk = g + c * group;
        const int n = chunk_elems(dim, chunk);
        if (c < args.split.chunks && n > 0) {
          load_chunk(ca[c], oa + chunk * kChunk, args.aligned, n);
          if (take_b) load_chunk(cb[c], ob + chunk * kChunk, args.aligned, n);
        }
      }
      la = math::convert_lse(args.a.lse[args.a.lse_offset(token, head)], args.a.base, base);
      if (take_b)
        lb = math::convert_lse(args.b.lse[args.b.lse_offset(token, head)], args.b.base, base);
    }
    __syncwarp();  // every lane has read its LSEs before lane 0 of a row may overwrite one
    if (!active) continue;
    const math::PairWeights p = math::pair_weights(base, la, lb);
    TO* oo = static_cast<TO*>(args.out.o) + args.out.o_offset(token, head);
    for (int c0 = 0; c0 < args.split.chunks; c0 += kMaxChunks) {
      if (c0 > 0) {  // rows of more than kMaxChunks chunks per thread: the next round
#pragma unroll
        for (int c = 0; c < kMaxChunks; ++c) {
          const int chunk = g + (c0 + c) * group;
          const int n = chunk_elems(dim, chunk);
          if (c0 + c < args.split.chunks && n > 0) {
            if (!p.a_empty) load_chunk(ca[c], oa + chunk * kChunk, args.aligned, n);
            if (!p.b_empty) load_chunk(cb[c], ob + chunk * kChunk, args.aligned, n);
          }
        }
      }
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        const int chunk = g + (c0 + c) * group;
        const int n = chunk_elems(dim, chunk);
        if (c0 + c >= args.split.chunks || n == 0) break;
        float v[kChunk];
#pragma unroll
        for (int k = 0; k < kChunk; ++k) {
          const float fa = p.a_empty ? 0.f : o_value(ca[c], k, args.a.o_scale);
          const float fb = p.b_empty ? 0.f : o_value(cb[c], k, args.b.o_scale);
          v[k] = math::pair_combine(p, fa, fb);
        }
        store_o_chunk(oo + chunk * kChunk, v, args.aligned, args.out.o_scale, n);
      }
    }
    if (g == 0 && args.out.lse != nullptr) args.out.lse[args.out.lse_offset(token, head)] = p.lse;
  }
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
