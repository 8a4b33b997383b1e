/// @file kernels/merge/ring.cuh
/// @brief Fast kernel of `merge_states` for stacks whose rows of `o` allow 16-byte access: each
///        thread copies the chunks of `o` and the LSEs of its next rows into its own ring of
///        shared-memory stages (`cp.async`), stages ahead of the row it merges from shared
///        memory. So many bytes are in flight without holding registers, and a row costs no
///        memory round trip of its own.
///
/// A row `(token, head)` is merged by `head_dim / (8 * chunks)` threads, each holding `chunks`
/// 16-byte chunks of `o` per state, grid-stride over rows (token and head advanced without
/// divisions). The numerics are those of `merge_row` (tile/merge_row.cuh) operation for operation:
/// the LSE work is split over `group = min(head_dim / 8, 32)` *virtual lanes* exactly as
/// merge_row splits it over real lanes (lane `v` takes inputs `v, v + group, ...`, its max by
/// math::nan_max and weight sum by math::merge_weight, then the same butterfly), a thread
/// playing one or two virtual lanes; `o` is accumulated in fp32 in input order from -0, empty
/// inputs never read as factors; math::merge_finalize. So the result is bitwise the one of
/// `merge_stack_kernel`.
///
/// The kernel's body is a composition of inlined parts (the machine code is the one of the single
/// function they were cut from; `scripts/cubin-diff.sh` shows it):
/// - scheduler: this thread's rows, `first_row + j * step` for `j < rows` (`ring_block_first`,
///   `ring_step`, `ring_row_count`; the same count for the whole warp, so shuffles stay
///   warp-uniform), and the row cursors (`RowCursor`);
/// - producer: `ring_issue`, `kStages - 1` items ahead of the consumer (the commit group and the
///   cursor's advance in the kernel's lambda);
/// - mainloop: per item, a row's LSE work `ring_row_weights` and `ring_zero` at its first item,
///   then the weighted sum of the item's states (in the kernel: as a part of its own, it changed
///   the machine code);
/// - epilogue: `ring_store_row` at the row's last item.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/cuda/check.hpp"
#include "catalog/catalog.hpp"
#include "common/compiled.hpp"
#include "cuda/arch/memory.cuh"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/kernels/merge/stack.cuh"
#include "cuda/tile/merge_row.cuh"
#include "cuda/tile/merge_smem.cuh"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// LSE slots per virtual lane and stage (so at most `group * kRingLsePerLane` states).
constexpr int kRingLsePerLane = catalog::kMergeLsePerLane;
/// Most states the ring kernel merges (more go to `merge_stack_kernel`).
constexpr int kRingMaxStates = catalog::kMergeRingMaxStates;

/// Compile-time shape of the ring kernel.
template <int kThreadsT, int kStagesT, int kBatchT, int kChunksT, int kMinBlocksT, int kWavesT = 0>
struct RingShape {
  static constexpr int kThreads = kThreadsT;      ///< Threads per block.
  static constexpr int kStages = kStagesT;        ///< Stages in each thread's ring.
  static constexpr int kBatch = kBatchT;          ///< States per stage for 16-bit `o` (half: f32).
  static constexpr int kChunks = kChunksT;        ///< Chunks per thread where a row has enough.
  static constexpr int kMinBlocks = kMinBlocksT;  ///< Blocks per SM the registers are sized for.
  /// Grid: 0, one wave of resident blocks looping over all rows; W > 0, about W waves of blocks
  /// of consecutive rows each; -K, blocks of K rows per thread. Many short blocks let the
  /// hardware balance SMs that stream at different rates.
  static constexpr int kWaves = kWavesT;
};

/// The shape `merge_states` uses: threads per block, stages, states per stage (16-bit `o`),
/// chunks per thread, blocks per SM, and the grid field (`RingShape::kWaves`; -1: each thread
/// merges one row and the grid covers every row).
using DefaultRingShape =
    RingShape<catalog::kMergeRingThreads, 1, 8, catalog::kMergeRingChunks, 6, -1>;

/// How the ring kernel of `Shape` lays a row of `kHeadDim` elements of `TIn` over threads.
template <class TIn, int kHeadDim, class Shape>
struct RingGeometry {
  static constexpr int kBatch =
      Shape::kBatch * 2 / static_cast<int>(sizeof(TIn));  ///< States per stage.
  static constexpr int kPerRow = kHeadDim / kChunk;       ///< Chunks of a row.
  /// Chunks per thread: Shape::kChunks unless a row would then have fewer than kBatch threads.
  static constexpr int kChunks = kPerRow / Shape::kChunks >= kBatch ? Shape::kChunks : 1;
  static constexpr int kThreadsPerRow = kPerRow / kChunks;    ///< Threads of a row.
  static constexpr int kGroup = kPerRow < 32 ? kPerRow : 32;  ///< merge_row's lanes of LSE work.
  /// Virtual lanes per thread (2 when a thread holds chunks of two of merge_row's lanes).
  static constexpr int kVirtual = kGroup > kThreadsPerRow ? kGroup / kThreadsPerRow : 1;
  /// Lanes of a warp that one row's threads span.
  static constexpr int kSpan = kThreadsPerRow < 32 ? kThreadsPerRow : 32;
  static constexpr int kWords = Chunk<TIn>::kWords;  ///< 16-byte words per chunk.
  /// Bytes of `o` in one stage of all rings of a block.
  static constexpr int kOStage = kBatch * kChunks * kWords * Shape::kThreads * 16;
  /// Bytes of LSEs in one stage of all rings of a block.
  static constexpr int kLStage = kVirtual * kRingLsePerLane * Shape::kThreads * 4;
  /// Dynamic shared memory of a block.
  static constexpr int kSmem = Shape::kStages * (kOStage + kLStage);
  static_assert(kVirtual == 1 || kVirtual * kThreadsPerRow == kGroup, "virtual lanes");
  static_assert(kSpan % kBatch == 0, "a stage's states must belong to one slot of one thread");
  static_assert(Shape::kThreads % kThreadsPerRow == 0, "whole rows per block");
};

/// Position of a thread's row in the grid-stride loop: its index in the loop and its token and
/// head, advanced by `step` rows (`step_tokens` tokens and `step_heads` heads) without divisions.
struct RowCursor {
  std::int64_t index = 0;  ///< Loop iteration.
  std::int64_t token = 0;
  std::int64_t head = 0;
  __device__ __forceinline__ void advance(std::int64_t step_tokens, std::int64_t step_heads,
                                          std::int64_t heads) {
    ++index;
    token += step_tokens;
    head += step_heads;
    if (head >= heads) {
      head -= heads;
      ++token;
    }
  }
};

/// A row's LSE work on one thread: its inputs' weights per virtual lane (`w[r][k]`, -1 for an
/// empty or absent input) and the merged LSE and weight sum per virtual lane, by merge_row's
/// butterfly over the group (its top level pairs a thread's two virtual lanes, the rest are
/// shuffles). `lse_at(r, k)` reads slot `k` of virtual lane `r` from the thread's stage.
template <class G, class LseAt>
__device__ __forceinline__ void ring_row_weights(const LseAt& lse_at, int gl, int count,
                                                 LseBase in_base, LseBase base,
                                                 float (&w)[G::kVirtual][kRingLsePerLane],
                                                 math::MergeResult (&res)[G::kVirtual]) {
  constexpr int kR = G::kVirtual;
  constexpr int kL = kRingLsePerLane;
  constexpr int kP = G::kThreadsPerRow;
  constexpr int kV = G::kGroup;
  float l[kR][kL];
  float m[kR];
  float sum[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    m[r] = math::neg_inf();
#pragma unroll
    for (int k = 0; k < kL; ++k) {
      l[r][k] = math::neg_inf();
      if (gl + r * kP + k * kV < count) {
        l[r][k] = math::convert_lse(lse_at(r, k), in_base, base);
        m[r] = math::nan_max(m[r], l[r][k]);
      }
    }
  }
  if (kR == 2) {
    const float m0 = math::nan_max(m[0], m[kR - 1]);
    m[kR - 1] = math::nan_max(m[kR - 1], m[0]);
    m[0] = m0;
  }
#pragma unroll
  for (int off = (kR == 2 ? kP : kV) / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int r = 0; r < kR; ++r)
      m[r] = math::nan_max(m[r], __shfl_xor_sync(0xffffffffu, m[r], off));
  }
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    sum[r] = 0.f;
#pragma unroll
    for (int k = 0; k < kL; ++k) {
      w[r][k] = -1.f;
      if (gl + r * kP + k * kV < count && !math::is_empty_lse(l[r][k])) {
        w[r][k] = math::merge_weight(base, l[r][k], m[r]);
        sum[r] += w[r][k];
      }
    }
  }
  if (kR == 2) {
    const float s0 = sum[0] + sum[kR - 1];
    sum[kR - 1] = sum[kR - 1] + sum[0];
    sum[0] = s0;
  }
#pragma unroll
  for (int off = (kR == 2 ? kP : kV) / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int r = 0; r < kR; ++r) sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], off);
  }
#pragma unroll
  for (int r = 0; r < kR; ++r) res[r] = math::merge_finalize(base, m[r], sum[r]);
}

/// The ring kernel's scheduler (see `merge_ring_kernel`): the first row of a block, with
/// `block_steps == 0` (the grid loops over all rows) or of `block_steps` steps of
/// `kThreads / kThreadsPerRow` consecutive rows each.
template <class G, class Shape>
__device__ __forceinline__ std::int64_t ring_block_first(std::int64_t block_steps) {
  constexpr int kRowsPerStep = Shape::kThreads / G::kThreadsPerRow;
  return block_steps == 0 ? static_cast<std::int64_t>(blockIdx.x) * kRowsPerStep
                          : static_cast<std::int64_t>(blockIdx.x) * kRowsPerStep * block_steps;
}

/// The ring kernel's scheduler: the rows between two rows of a thread (`ring_block_first`).
template <class G, class Shape>
__device__ __forceinline__ std::int64_t ring_step(std::int64_t block_steps) {
  constexpr int kRowsPerStep = Shape::kThreads / G::kThreadsPerRow;
  return block_steps == 0 ? static_cast<std::int64_t>(gridDim.x) * kRowsPerStep : kRowsPerStep;
}

/// The ring kernel's scheduler: the rows of each thread of a warp whose first row is
/// `warp_first_row` (of `total_rows`, `step` apart; at most `block_steps` when not 0).
__device__ __forceinline__ std::int64_t ring_row_count(std::int64_t block_steps,
                                                       std::int64_t total_rows,
                                                       std::int64_t warp_first_row,
                                                       std::int64_t step) {
  std::int64_t rows =
      warp_first_row < total_rows ? (total_rows - warp_first_row + step - 1) / step : 0;
  if (block_steps > 0 && rows > block_steps) rows = block_steps;
  return rows;
}

/// The ring kernel's producer: copies the next item of a thread (row cursor `issued`, its batch
/// `issue_b`) into stage `issue_p` of its ring at `ring` (nothing past the thread's rows): the
/// chunks (the thread's `g` of the row) of up to `batch` states and, for a row's first item, the
/// LSE slots of virtual lanes `gl + r * kThreadsPerRow`. `o_word` / `l_float` are the stage's
/// word and float offsets (see `merge_ring_kernel`). (References, as the kernel's lambda
/// captured them: so the machine code stays the same.)
template <class TIn, class G, class Shape, class OWord, class LFloat>
__device__ __forceinline__ void ring_issue(const RowsArgs& args, const std::uint32_t& ring,
                                           const int& g, const int& gl,
                                           const std::int64_t& first_row, const std::int64_t& step,
                                           const std::int64_t& rows, const std::int64_t& total_rows,
                                           const int& num_states, const OWord& o_word,
                                           const LFloat& l_float, const RowCursor& issued,
                                           const int& issue_b, const int& issue_p) {
  constexpr int kP = G::kThreadsPerRow;
  constexpr int kLBase = Shape::kStages * G::kOStage;  // bytes before the LSE area
  const std::int64_t row = first_row + issued.index * step;
  if (issued.index < rows && row < total_rows) {
    const TIn* o = static_cast<const TIn*>(args.in.o) +
                   args.in.o_offset(issued.token, issued.head) + g * kChunk;
    const int first = issue_b * G::kBatch;
#pragma unroll
    for (int u = 0; u < G::kBatch; ++u) {
      if (first + u < num_states) {
        const TIn* src = o + (first + u) * args.in.o_stride_state;
#pragma unroll
        for (int c = 0; c < G::kChunks; ++c) {
#pragma unroll
          for (int x = 0; x < G::kWords; ++x) {
            arch::cp_async_16(ring + 16 * o_word(issue_p, u, c, x),
                              reinterpret_cast<const uint4*>(src + c * kP * kChunk) + x);
          }
        }
      }
    }
    if (issue_b == 0) {
      const float* l = args.in.lse + args.in.lse_offset(issued.token, issued.head);
#pragma unroll
      for (int r = 0; r < G::kVirtual; ++r) {
#pragma unroll
        for (int k = 0; k < kRingLsePerLane; ++k) {
          const int s = gl + r * kP + k * G::kGroup;
          if (s < num_states) {
            arch::cp_async_4(ring + kLBase + 4 * l_float(issue_p, r, k),
                             l + s * args.in.lse_stride_state);
          }
        }
      }
    }
  }
}

/// The ring kernel's mainloop at a row's first item: the accumulators `acc` of this thread's
/// chunks set to -0 (the sum in input order starts from -0, as `merge_row`'s).
template <class G>
__device__ __forceinline__ void ring_zero(float (&acc)[G::kChunks][kChunk]) {
#pragma unroll
  for (int c = 0; c < G::kChunks; ++c) {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) acc[c][e] = -0.f;
  }
}

/// The ring kernel's epilogue: stores row `cur`'s merged chunks (this thread's `g` of the row,
/// `acc` normalised by `res`, the result of the chunk's virtual lane where a thread plays two,
/// through `v`) and, from the row's first thread, its LSE (unless the output has none). (`v`
/// is the kernel's, declared there: so the machine code stays the same.)
template <class TO, class G>
__device__ __forceinline__ void ring_store_row(const RowsArgs& args, const RowCursor& cur,
                                               const int& g, const float (&acc)[G::kChunks][kChunk],
                                               const math::MergeResult (&res)[G::kVirtual],
                                               float (&v)[kChunk]) {
  constexpr int kC = G::kChunks;
  constexpr int kP = G::kThreadsPerRow;
  constexpr int kR = G::kVirtual;
  TO* out = static_cast<TO*>(args.out.o) + args.out.o_offset(cur.token, cur.head);
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const math::MergeResult& rc = res[kR == 2 ? c : 0];
    const bool all_empty = math::is_empty_lse(rc.lse);  // (0, -inf), never -0
#pragma unroll
    for (int e = 0; e < kChunk; ++e) v[e] = all_empty ? 0.f : acc[c][e] * rc.inv_sum;
    store_chunk(out + (g + c * kP) * kChunk, v, args.aligned);
  }
  if (g == 0 && args.out.lse != nullptr)  // an output without an LSE
    args.out.lse[args.out.lse_offset(cur.token, cur.head)] = res[0].lse;
}

/// `out[t, h] = ⊕_s in[t, s, h]` (see the file comment). Each row is `ceil(S / batch)` items; a
/// thread's items go round its ring of `kStages` stages, one item per stage (its chunks of up
/// to `batch` states and, for a row's first item, the thread's LSE slots of the row). Shared
/// memory: per stage `o` as `[state][chunk][word][thread]` 16-byte words, then the LSEs as
/// `[virtual lane][slot][thread]` floats, so a warp's accesses are consecutive.
template <class TIn, class TO, int kHeadDim, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    merge_ring_kernel(RowsArgs args, std::int64_t block_steps) {
  using G = RingGeometry<TIn, kHeadDim, Shape>;
  constexpr int kStages = Shape::kStages;
  constexpr int kThreads = Shape::kThreads;
  constexpr int kBatch = G::kBatch;
  constexpr int kC = G::kChunks;
  constexpr int kP = G::kThreadsPerRow;
  constexpr int kV = G::kGroup;
  constexpr int kR = G::kVirtual;
  constexpr int kW = G::kWords;
  constexpr int kL = kRingLsePerLane;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t ring = arch::smem_addr(smem);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int g = tid & (kP - 1);             // thread within its row
  const int src0 = lane & ~(G::kSpan - 1);  // first lane of the row within the warp
  const int gl = lane - src0;               // virtual lane of slot 0 (== g when kP <= 32)
  // ---- scheduler ----
  const std::int64_t heads = args.out.heads;
  const std::int64_t total_rows = args.out.tokens * heads;
  const std::int64_t block_first = ring_block_first<G, Shape>(block_steps);
  const std::int64_t step = ring_step<G, Shape>(block_steps);
  const std::int64_t first_row = block_first + tid / kP;
  const std::int64_t warp_first_row = block_first + (tid - lane) / kP;
  const std::int64_t rows = ring_row_count(block_steps, total_rows, warp_first_row, step);
  const int num_states = static_cast<int>(args.in.num_states);
  const int batches = (num_states + kBatch - 1) / kBatch;
  const std::int64_t items = rows * batches;
  const std::int64_t step_tokens = step / heads;
  const std::int64_t step_heads = step - step_tokens * heads;
  RowCursor start;
  start.token = first_row / heads;
  start.head = first_row - start.token * heads;

  // Shared-memory word and float offsets of stage p.
  const auto o_word = [&](int p, int u, int c, int x) {
    return (((p * kBatch + u) * kC + c) * kW + x) * kThreads + tid;
  };
  const auto l_float = [&](int p, int r, int k) {
    return p * (G::kLStage / 4) + (r * kL + k) * kThreads + tid;
  };
  constexpr int kLBase = kStages * G::kOStage;  // bytes before the LSE area

  // ---- producer: the next item into its stage, then a commit group (empty past the end) ----
  RowCursor issued = start;
  int issue_b = 0;
  int issue_p = 0;
  const auto issue_next = [&]() {
    ring_issue<TIn, G, Shape>(args, ring, g, gl, first_row, step, rows, total_rows, num_states,
                              o_word, l_float, issued, issue_b, issue_p);
    arch::cp_async_commit();
    if (++issue_b == batches) {
      issue_b = 0;
      issued.advance(step_tokens, step_heads, heads);
    }
    if (++issue_p == kStages) issue_p = 0;
  };
#pragma unroll
  for (int q = 0; q < kStages - 1; ++q) issue_next();

  // ---- mainloop, and the epilogue at a row's last item ----
  const uint4* o_ring = reinterpret_cast<const uint4*>(smem);
  const float* l_ring = reinterpret_cast<const float*>(smem + kLBase);
  const LseBase base = args.out.base;
  float w[kR][kL];  // weights of virtual lane r's inputs (-1: empty or absent)
  float acc[kC][kChunk];
  math::MergeResult res[kR];
  float v[kChunk];  // the epilogue's normalised chunk (declared here: the machine code)
  RowCursor cur = start;
  int b = 0;
  int p = 0;
  for (std::int64_t q = 0; q < items; ++q) {
    issue_next();
    arch::cp_async_wait<kStages - 1>();  // this item's copies (this thread's own) have landed
    const std::int64_t row = first_row + cur.index * step;
    const int count = row < total_rows ? num_states : 0;
    if (b == 0) {
      ring_row_weights<G>([&](int r, int k) { return l_ring[l_float(p, r, k)]; }, gl, count,
                          args.in.base, base, w, res);
      ring_zero<G>(acc);
    }
    // This stage's states s = first + u: the weight of s sits on virtual lane s % kV, i.e. on
    // slot (s % kV) / kP of lane src0 + s % kSpan, as weight number s / kV.
    const int first = b * kBatch;
    const int n = min(kBatch, num_states - first);
    const int slot = (first % kV) / kP;
    const int k_of = first / kV;
    float wsel = w[0][0];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
#pragma unroll
      for (int k = 0; k < kL; ++k) {
        if (r == slot && k == k_of) wsel = w[r][k];
      }
    }
    const int owner0 = src0 + first % G::kSpan;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (u >= n) break;  // warp-uniform
      const float wv = __shfl_sync(0xffffffffu, wsel, owner0 + u);
      if (wv < 0.f) continue;  // empty (NaN weights go through and propagate); also no row
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        Chunk<TIn> ch;
#pragma unroll
        for (int x = 0; x < kW; ++x) ch.w[x] = o_ring[o_word(p, u, c, x)];
#pragma unroll
        for (int e = 0; e < kChunk; ++e) acc[c][e] += wv * chunk_at(ch, e);
      }
    }
    if (b == batches - 1) {  // ---- epilogue ----
      if (count > 0) ring_store_row<TO, G>(args, cur, g, acc, res, v);
      cur.advance(step_tokens, step_heads, heads);
      b = 0;
    } else {
      ++b;
    }
    if (++p == kStages) p = 0;
  }
  arch::cp_async_wait<0>();
}

/// Calls `f(std::integral_constant<int, D>{})` for the head dim `D == head_dim` of
/// `compiled::MergeHeadDims` (through the one dispatch, `common/dispatch.hpp`).
template <class F>
void dispatch_head_dim(std::int64_t head_dim, F&& f) {
  compiled::dispatch("attnstate::cuda::merge_states", "out.head_dim", head_dim,
                     compiled::MergeHeadDims{}, f);
}

/// The run-time needs of the catalog's ring rows (`catalog::Family::kMergeRing`: a head dim of
/// `compiled::MergeHeadDims`, 1 to `catalog::merge_slot_states` states) that the merge of `args`
/// (built by `rows_args` of the stack) meets with the kernel of `Shape`: 16-byte access to every
/// `o` view (`kNeedsChunkedRows`), then at least `min_blocks` blocks of work (`kNeedsFullGrid`),
/// then its shared memory granted: a device of sm_80 or newer and a kernel built for one
/// (`kNeedsSmemFit`).
template <class TIn, class TO, class Shape>
catalog::Needs ring_needs(const RowsArgs& args, std::int64_t min_blocks) {
  catalog::Needs met = catalog::kNeedsNothing;
  if (!args.aligned) return met;
  met |= catalog::kNeedsChunkedRows;
  dispatch_head_dim(args.out.head_dim, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    using G = RingGeometry<TIn, kD, Shape>;
    static_assert(
        std::min(G::kGroup * kRingLsePerLane, kRingMaxStates) == catalog::merge_slot_states(kD),
        "the states of the catalog's ring rows");
    const std::int64_t threads = args.out.tokens * args.out.heads * G::kThreadsPerRow;
    if (threads < min_blocks * Shape::kThreads) return;
    met |= catalog::kNeedsFullGrid;
    if (G::kSmem <= smem_limits().per_block &&
        prepare_smem_kernel<merge_ring_kernel<TIn, TO, kD, Shape>>(Shape::kThreads, 80).usable) {
      met |= catalog::kNeedsSmemFit;
    }
  });
  return met;
}

/// Launches the ring kernel on `stream` (after ring_needs met every need of its row): at most as
/// many blocks as are resident at once.
template <class TIn, class TO, class Shape>
void launch_ring(const RowsArgs& args, cudaStream_t stream) {
  dispatch_head_dim(args.out.head_dim, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    using G = RingGeometry<TIn, kD, Shape>;
    const auto kernel = merge_ring_kernel<TIn, TO, kD, Shape>;
    const std::int64_t per_sm = smem_blocks_per_sm(
        prepare_smem_kernel<merge_ring_kernel<TIn, TO, kD, Shape>>(Shape::kThreads, 80).resident,
        G::kSmem);
    const std::int64_t threads = args.out.tokens * args.out.heads * G::kThreadsPerRow;
    constexpr std::int64_t kRowsPerStep = Shape::kThreads / G::kThreadsPerRow;
    const std::int64_t total_rows = args.out.tokens * args.out.heads;
    const std::int64_t steps = (total_rows + kRowsPerStep - 1) / kRowsPerStep;
    const std::int64_t resident = sm_count() * per_sm;
    std::int64_t block_steps = 0;  // one wave looping over all rows
    std::int64_t blocks = std::max<std::int64_t>(
        1, std::min((threads + Shape::kThreads - 1) / Shape::kThreads, resident));
    if (Shape::kWaves != 0) {
      block_steps = Shape::kWaves < 0
                        ? -Shape::kWaves
                        : std::max<std::int64_t>(1, (steps + resident * Shape::kWaves - 1) /
                                                        (resident * Shape::kWaves));
      block_steps = std::max<std::int64_t>(block_steps, (steps + 0x7fffffff - 1) / 0x7fffffff);
      blocks = (steps + block_steps - 1) / block_steps;
    }
    kernel<<<static_cast<unsigned>(blocks), Shape::kThreads, G::kSmem, stream>>>(args, block_steps);
    ATTNSTATE_CHECK_LAUNCH(stream, "merge_ring_kernel");
  });
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
