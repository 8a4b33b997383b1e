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

/// Where row `row` of a pairwise merge stands: its token and head, whether the call writes it
/// (`active`) and whether `b` takes part (`take_b`; else `b` is the empty state, never read).
struct PairRow {
  std::int64_t token;
  std::int64_t head;
  bool active;
  bool take_b;
};

/// `PairRow` of row `row` (`in_range`: the row exists; lanes past the last row still take part
/// in the warp's barriers).
__device__ __forceinline__ PairRow pair_row(const PairArgs& args, std::int64_t row, bool in_range) {
  const std::int64_t heads = args.out.heads;
  PairRow r;
  // 32-bit division where the rows allow it (always in practice).
  r.token = row < 0x7fffffff && heads < 0x7fffffff
                ? static_cast<std::int64_t>(static_cast<std::uint32_t>(row) /
                                            static_cast<std::uint32_t>(heads))
                : row / heads;
  r.head = row - r.token * heads;
  r.active = in_range;
  r.take_b = in_range;
  if (in_range && args.mask.data != nullptr) {
    r.take_b = args.mask.selected(r.token);
    r.active = r.take_b || !args.in_place;
  }
  return r;
}

/// Stores chunk `ca ⊕ cb` of a row merged with weights `p` at `dst` (the first `n` elements when
/// not `aligned`); an empty side's chunk is never read.
template <class TA, class TB, class TO>
__device__ __forceinline__ void store_pair_chunk(const Chunk<TA>& ca, const Chunk<TB>& cb,
                                                 const math::PairWeights& p, const PairArgs& args,
                                                 TO* dst, bool aligned, int n = kChunk) {
  float v[kChunk];
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    const float fa = p.a_empty ? 0.f : o_value(ca, k, args.a.o_scale);
    const float fb = p.b_empty ? 0.f : o_value(cb, k, args.b.o_scale);
    v[k] = math::pair_combine(p, fa, fb);
  }
  store_o_chunk(dst, v, aligned, args.out.o_scale, n);
}

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
    const PairRow r = pair_row(args, i >> args.split.shift, i < total);
    const std::int64_t token = r.token;
    const std::int64_t head = r.head;
    const bool active = r.active;
    const bool take_b = r.take_b;
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
        store_pair_chunk(ca[c], cb[c], p, args, oo + chunk * kChunk, args.aligned, n);
      }
    }
    if (g == 0 && args.out.lse != nullptr) args.out.lse[args.out.lse_offset(token, head)] = p.lse;
  }
}

/// Chunks per thread of the whole-row pairwise kernel: rows of `group · kC` whole chunks with
/// `group` a power of two (head dims 64 · 2^k with 2, 96 · 2^k with 3), so no lane idles.
constexpr int kWholeChunks[] = {2, 3};
static_assert(kWholeChunks[0] == catalog::kMergeWholeChunks[0] &&
                  kWholeChunks[1] == catalog::kMergeWholeChunks[1] &&
                  sizeof(kWholeChunks) == sizeof(catalog::kMergeWholeChunks),
              "the instances the catalog's whole-row rows name");

/// `merge_pair_kernel` for rows of whole chunks that every view allows to access as vectors
/// (`PairArgs::aligned`), split into exactly `split.group` threads of `kC` chunks each (no partial
/// chunk, no idle lane), over a grid covering every row (one row per thread group, no loop): each
/// thread issues all its loads at once, together with the row's LSEs. `kStream`: `out.o` aliases
/// neither input's `o`, which is then loaded without allocating in L1 (`load_chunk_stream`).
/// The operations per element are those of `merge_pair_kernel`: the same bits.
template <class TA, class TB, class TO, int kC, bool kStream>
__global__ void __launch_bounds__(kMergeBlock) merge_pair_whole_kernel(PairArgs args) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int shift = args.split.shift;
  const int group = 1 << shift;
  const int g = lane & (group - 1);
  const std::int64_t heads = args.out.heads;
  const std::int64_t total = (args.out.tokens * heads) << shift;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i - lane >= total) return;  // whole warps past the end (warp-uniform)
  const PairRow r = pair_row(args, i >> shift, i < total);
  const std::int64_t token = r.token;
  const std::int64_t head = r.head;
  const bool active = r.active;
  const bool take_b = r.take_b;
  const TA* oa = static_cast<const TA*>(args.a.o) + args.a.o_offset(token, head) + g * kChunk;
  const TB* ob = static_cast<const TB*>(args.b.o) + args.b.o_offset(token, head) + g * kChunk;
  Chunk<TA> ca[kC];
  Chunk<TB> cb[kC];
  float la = math::neg_inf();
  float lb = math::neg_inf();
  if (active) {
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      if constexpr (kStream) {
        load_chunk_stream(ca[c], oa + c * group * kChunk, true);
        if (take_b) load_chunk_stream(cb[c], ob + c * group * kChunk, true);
      } else {
        load_chunk(ca[c], oa + c * group * kChunk, true);
        if (take_b) load_chunk(cb[c], ob + c * group * kChunk, true);
      }
    }
    la = math::convert_lse(args.a.lse[args.a.lse_offset(token, head)], args.a.base, args.out.base);
    if (take_b)
      lb =
          math::convert_lse(args.b.lse[args.b.lse_offset(token, head)], args.b.base, args.out.base);
  }
  __syncwarp();  // every lane has read its LSEs before lane 0 of a row may overwrite one
  if (!active) return;
  const math::PairWeights p = math::pair_weights(args.out.base, la, lb);
  TO* oo = static_cast<TO*>(args.out.o) + args.out.o_offset(token, head) + g * kChunk;
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    store_pair_chunk(ca[c], cb[c], p, args, oo + c * group * kChunk, true);
  }
  if (g == 0 && args.out.lse != nullptr) args.out.lse[args.out.lse_offset(token, head)] = p.lse;
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
