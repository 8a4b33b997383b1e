/// @file kernels/merge/odd.cuh
/// @brief Kernel of `merge_states` for rows whose chunks of `o` are not a power of two in number
///        (the head dims of `compiled::MergeOddHeadDims`: 96 = 12 chunks, 192 = 24) and allow
///        16-byte access: a row is merged by a power of two of threads, each an odd count of
///        its chunks (96: 4 threads x 3 chunks, 192: 8 x 3; the kernel also takes 80 = 2 x 5,
///        measured slower there than the general kernel), so no thread idles, where the general
///        kernel rounds a row up to a power of two of one-chunk lanes (4 of 16 idle at 96). Each
///        thread copies its chunks of `o` and its share of the row's LSEs into its own shared
///        memory together (`cp.async`, one memory round trip per batch of states), then merges from
///        there.
///
/// The numerics are those of `merge_row` (tile/merge_row.cuh) operation for operation, so the
/// result is bitwise the one of `merge_stack_kernel`: the LSE work is split over the general
/// kernel's `group = min(pow2_ceil(head_dim / 8), 32)` lanes as *virtual lanes* (virtual lane
/// `v` takes inputs `v, v + group, ...`, its max by math::nan_max and weights by
/// math::merge_weight in input order, then merge_row's butterfly: its levels of offset at least
/// the threads per row pair a thread's own virtual lanes, the others are shuffles); a thread
/// plays `group / threads_per_row` virtual lanes, and its chunk `c` (chunk `g + c * threads` of
/// the row) takes the result of virtual lane `c mod (group / threads)`, the lane of the general
/// kernel that holds that chunk. An input's weight, computed once by its virtual lane, is
/// written over its LSE in shared memory and read from there by the row's threads (merge_row
/// broadcasts it by a shuffle). `o` is accumulated in fp32 in input order from -0, empty inputs
/// never read as factors; math::merge_finalize; an all-empty row is written (0, -inf).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/cuda/check.hpp"
#include "catalog/catalog.hpp"
#include "common/compiled.hpp"
#include "cuda/arch/memory.cuh"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/kernels/merge/ring.cuh"
#include "cuda/kernels/merge/stack.cuh"
#include "cuda/tile/merge_smem.cuh"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Most threads per block of the odd-row kernel (the launch picks 32, 64 or this).
constexpr int kOddMaxThreads = catalog::kMergeOddThreads;
/// Blocks of kOddMaxThreads per SM its registers are sized for (at most 128 registers a thread:
/// shared memory, not registers, bounds its residency).
constexpr int kOddMinBlocks = 4;

/// The smallest power of two `>= n` (n >= 1), at compile time.
constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }

/// How the odd-row kernel lays a row of `kHeadDim` elements of `TIn` over threads.
template <class TIn, int kHeadDim>
struct OddGeometry {
  static constexpr int kPerRow = kHeadDim / kChunk;  ///< Chunks of a row.
  /// Threads of a row: the largest power of two dividing kPerRow, at most 32.
  static constexpr int kThreadsPerRow = (kPerRow & -kPerRow) < 32 ? (kPerRow & -kPerRow) : 32;
  static constexpr int kChunks = kPerRow / kThreadsPerRow;  ///< Chunks per thread.
  /// merge_row's lanes of LSE work in the general kernel (`RowsArgs::group`).
  static constexpr int kGroup = pow2_at_least(kPerRow) < 32 ? pow2_at_least(kPerRow) : 32;
  static constexpr int kVirtual = kGroup / kThreadsPerRow;  ///< Virtual lanes per thread.
  /// States per batch (one stage of shared memory): 128 bytes of `o` per chunk of a thread.
  static constexpr int kBatch = 16 / static_cast<int>(sizeof(TIn));
  static constexpr int kWords = Chunk<TIn>::kWords;  ///< 16-byte words per chunk.
  /// Most states (LSE slots of a row: kGroup * kRingLsePerLane, at most kRingMaxStates).
  static constexpr int kMaxStates =
      kGroup * kRingLsePerLane < kRingMaxStates ? kGroup * kRingLsePerLane : kRingMaxStates;
  /// Shared-memory bytes of one thread: its chunks of a batch, then its LSE slots.
  static constexpr int kOBytesPerThread = kBatch * kChunks * kWords * 16;
  static constexpr int kLBytesPerThread = kVirtual * kRingLsePerLane * 4;
  static_assert(kHeadDim % kChunk == 0 && (kPerRow & (kPerRow - 1)) != 0,
                "rows of whole chunks, not a power of two of them");
  static_assert(kChunks * kThreadsPerRow == kPerRow && kVirtual * kThreadsPerRow == kGroup,
                "each thread an equal share of chunks and virtual lanes");
};

/// merge_row's butterfly over a row's virtual lanes (`v = lane + r * kP` holds `x[r]`), `op`
/// applied as `op(mine, partner)`: offsets of at least kP within the thread, then shuffles.
template <int kP, int kR, class Op>
__device__ __forceinline__ void odd_butterfly(float (&x)[kR], Op op) {
#pragma unroll
  for (int j = kR / 2; j >= 1; j /= 2) {
    float t[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) t[r] = op(x[r], x[r ^ j]);
#pragma unroll
    for (int r = 0; r < kR; ++r) x[r] = t[r];
  }
#pragma unroll
  for (int off = kP / 2; off > 0; off /= 2) {
#pragma unroll
    for (int r = 0; r < kR; ++r) x[r] = op(x[r], __shfl_xor_sync(0xffffffffu, x[r], off));
  }
}

/// A row's LSE work on one thread (lane `g` of the row): reads the LSEs of its virtual lanes
/// from `slots` (slot `(r, k)` at `slots[(r * kRingLsePerLane + k) * stride]`: input
/// `g + r * kP + k * kGroup`), writes each input's weight over its LSE (-1 for an empty input or
/// one past `count`), and returns the merged LSE and normaliser per virtual lane.
template <class G>
__device__ __forceinline__ void odd_row_weights(float* slots, int stride, int g, int count,
                                                int num_states, LseBase in_base, LseBase base,
                                                math::MergeResult (&res)[G::kVirtual]) {
  constexpr int kR = G::kVirtual;
  constexpr int kL = kRingLsePerLane;
  constexpr int kP = G::kThreadsPerRow;
  constexpr int kV = G::kGroup;
  float m[kR];
  float sum[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    m[r] = math::neg_inf();
#pragma unroll
    for (int k = 0; k < kL; ++k) {
      if (g + r * kP + k * kV < count) {
        m[r] = math::nan_max(m[r], math::convert_lse(slots[(r * kL + k) * stride], in_base, base));
      }
    }
  }
  odd_butterfly<kP>(m, NanMaxOp{});
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    sum[r] = 0.f;
#pragma unroll
    for (int k = 0; k < kL; ++k) {
      const int s = g + r * kP + k * kV;
      if (s < num_states) {
        float w = -1.f;  // empty or past count: never a factor
        if (s < count) {
          const float l = math::convert_lse(slots[(r * kL + k) * stride], in_base, base);
          if (!math::is_empty_lse(l)) {
            w = math::merge_weight(base, l, m[r]);
            sum[r] += w;
          }
        }
        slots[(r * kL + k) * stride] = w;
      }
    }
  }
  odd_butterfly<kP>(sum, SumOp{});
#pragma unroll
  for (int r = 0; r < kR; ++r) res[r] = math::merge_finalize(base, m[r], sum[r]);
}

/// `out[t, h] = ⊕_s in[t, s, h]` (see the file comment): block `b` merges rows
/// `[b * steps * rows_per_block, (b + 1) * steps * rows_per_block)`, `rows_per_block =
/// blockDim.x / kP`, one row per kP threads at a time. Shared memory per thread (`blockDim.x`
/// threads, interleaved so a warp's accesses are consecutive): `o` as
/// `[state][chunk][word][thread]` 16-byte words, then the LSE slots as `[r][k][thread]` floats.
template <class TIn, class TO, int kHeadDim>
__global__ void __launch_bounds__(kOddMaxThreads, kOddMinBlocks)
    merge_odd_kernel(RowsArgs args, std::int64_t steps) {
  using G = OddGeometry<TIn, kHeadDim>;
  constexpr int kP = G::kThreadsPerRow;
  constexpr int kC = G::kChunks;
  constexpr int kV = G::kGroup;
  constexpr int kR = G::kVirtual;
  constexpr int kW = G::kWords;
  constexpr int kL = kRingLsePerLane;
  constexpr int kBatch = G::kBatch;
  extern __shared__ __align__(128) unsigned char smem[];
  const int threads = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int g = tid & (kP - 1);  // thread within its row
  const int row_tid = tid - g;   // the row's first thread
  const std::uint32_t o_base = arch::smem_addr(smem);
  const uint4* o_smem = reinterpret_cast<const uint4*>(smem);
  const std::size_t l_offset = static_cast<std::size_t>(G::kOBytesPerThread) * threads;
  float* l_smem = reinterpret_cast<float*>(smem + l_offset);
  const std::uint32_t l_base = o_base + static_cast<std::uint32_t>(l_offset);
  const auto o_word = [&](int u, int c, int x) { return ((u * kC + c) * kW + x) * threads + tid; };
  const std::int64_t heads = args.out.heads;
  const std::int64_t total_rows = args.out.tokens * heads;
  const std::int64_t rows_per_block = threads / kP;
  const int num_states = static_cast<int>(args.in.num_states);
  const int batches = (num_states + kBatch - 1) / kBatch;
  const LseBase base = args.out.base;
  for (std::int64_t step = 0; step < steps; ++step) {  // block-uniform
    const std::int64_t row =
        (static_cast<std::int64_t>(blockIdx.x) * steps + step) * rows_per_block + tid / kP;
    const bool active = row < total_rows;
    const int count = active ? num_states : 0;
    // 32-bit division where the rows allow it (always in practice).
    const std::int64_t token = !active ? 0
                               : row < 0x7fffffff && heads < 0x7fffffff
                                   ? static_cast<std::int64_t>(static_cast<std::uint32_t>(row) /
                                                               static_cast<std::uint32_t>(heads))
                                   : row / heads;
    const std::int64_t head = active ? row - token * heads : 0;
    const TIn* o = static_cast<const TIn*>(args.in.o) + args.in.o_offset(token, head) + g * kChunk;
    const float* lse = args.in.lse + args.in.lse_offset(token, head);
    float acc[kC][kChunk];
#pragma unroll
    for (int c = 0; c < kC; ++c) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) acc[c][e] = -0.f;  // a lone input passes through bitwise
    }
    math::MergeResult res[kR];
    __syncwarp();  // the row's threads have read this thread's weights of the previous row
    for (int b = 0; b < batches; ++b) {  // block-uniform
      const int first = b * kBatch;
      // This batch's chunks, and for the first batch the LSEs, in one group of copies (an empty
      // input's chunks are copied, being inside the view, but never used as factors).
      // (Loops over states not unrolled: a thread then holds no batch of addresses.)
      if (active) {
        const int n_issue = min(kBatch, num_states - first);
#pragma unroll 1
        for (int u = 0; u < n_issue; ++u) {
          const TIn* src = o + (first + u) * args.in.o_stride_state;
#pragma unroll
          for (int c = 0; c < kC; ++c) {
#pragma unroll
            for (int x = 0; x < kW; ++x) {
              arch::cp_async_16(o_base + 16 * o_word(u, c, x),
                                reinterpret_cast<const uint4*>(src + c * kP * kChunk) + x);
            }
          }
        }
        if (b == 0) {
          // This thread's inputs s = g (mod kP): virtual lane s % kV, slot ((s % kV) / kP, s / kV).
#pragma unroll 1
          for (int s = g; s < num_states; s += kP) {
            arch::cp_async_4(l_base + 4 * ((((s % kV) / kP) * kL + s / kV) * threads + tid),
                             lse + s * args.in.lse_stride_state);
          }
        }
      }
      arch::cp_async_commit();
      arch::cp_async_wait<0>();
      if (b == 0) {
        odd_row_weights<G>(l_smem + tid, threads, g, count, num_states, args.in.base, base, res);
        __syncwarp();  // the weights are visible to the row's threads
      }
      // Input s's weight sits on virtual lane s % kV: slot ((s % kV) / kP, s / kV) of the row's
      // thread s % kP.
      const int n = min(kBatch, num_states - first);
#pragma unroll 1
      for (int u = 0; u < n; ++u) {  // block-uniform
        const int s = first + u;
        const float w = l_smem[(((s % kV) / kP) * kL + s / kV) * threads + row_tid + s % kP];
        if (w < 0.f) continue;  // empty (NaN weights go through and propagate); also no row
        Chunk<TIn> ch[kC];      // every chunk of the input read first: kC loads in flight
#pragma unroll
        for (int c = 0; c < kC; ++c) {
#pragma unroll
          for (int x = 0; x < kW; ++x) ch[c].w[x] = o_smem[o_word(u, c, x)];
        }
#pragma unroll
        for (int c = 0; c < kC; ++c) {
#pragma unroll
          for (int e = 0; e < kChunk; ++e) acc[c][e] += w * chunk_at(ch[c], e);
        }
      }
    }
    if (active) {
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        store_row<TO>(args.out, token, head, g + c * kP, true, acc[c], res[c % kR]);
      }
    }
  }
}

/// Calls `f(std::integral_constant<int, D>{})` for the head dim `D == head_dim` of
/// `compiled::MergeOddHeadDims`.
template <class F>
void dispatch_odd_head_dim(std::int64_t head_dim, F&& f) {
  compiled::dispatch("attnstate::cuda::merge_states", "out.head_dim", head_dim,
                     compiled::MergeOddHeadDims{}, f);
}

/// Block size and shared memory of a launch of the odd-row kernel.
struct OddLaunch {
  int threads;       ///< Threads per block.
  std::size_t smem;  ///< Dynamic shared memory per block, bytes.
  bool usable;       ///< The kernel runs on this device (sm_80 or newer, built for one).
};

/// The launch of `merge_odd_kernel<TIn, TO, kD>` on the current device: of 128, 64 or 32 threads
/// per block, the one that keeps the most bytes of `o` in flight per SM (blocks resident by
/// shared memory and by registers), the largest on ties.
template <class TIn, class TO, int kD>
OddLaunch odd_launch() {
  using G = OddGeometry<TIn, kD>;
  const SmemKernelInfo info =
      prepare_smem_kernel<merge_odd_kernel<TIn, TO, kD>>(kOddMaxThreads, 80);
  OddLaunch best{kOddMaxThreads, 0, info.usable};
  long long best_bytes = -1;
  for (int t = kOddMaxThreads; t >= 32; t /= 2) {
    const std::size_t smem =
        static_cast<std::size_t>(G::kOBytesPerThread + G::kLBytesPerThread) * t;
    if (smem > static_cast<std::size_t>(smem_limits().per_block)) continue;
    // Resident by registers and threads: as many threads as kOddMaxThreads-blocks (at most 32
    // blocks of an SM).
    const int by_threads = std::min(32, info.resident * (kOddMaxThreads / t));
    const long long bytes =
        static_cast<long long>(smem_blocks_per_sm(by_threads, smem)) * t * G::kOBytesPerThread;
    if (bytes > best_bytes) {
      best_bytes = bytes;
      best.threads = t;
      best.smem = smem;
    }
  }
  best.usable = best.usable && best_bytes > 0;
  return best;
}

/// The run-time needs of the catalog's odd-row rows (`catalog::Family::kMergeOdd`: a head dim of
/// `compiled::MergeOddHeadDims`, 1 to `catalog::merge_slot_states` states) that the merge of
/// `args` (built by `rows_args` of the stack, so split as the general kernel splits it,
/// `args.group`) meets: 16-byte access to every `o` view (`kNeedsChunkedRows`), then at least
/// `min_blocks` blocks of kOddMaxThreads threads of work (`kNeedsFullGrid`), then its shared
/// memory granted: a device of sm_80 or newer and a kernel built for one (`kNeedsSmemFit`).
template <class TIn, class TO>
catalog::Needs odd_needs(const RowsArgs& args, std::int64_t min_blocks) {
  catalog::Needs met = catalog::kNeedsNothing;
  if (!args.aligned) return met;
  met |= catalog::kNeedsChunkedRows;
  dispatch_odd_head_dim(args.out.head_dim, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    using G = OddGeometry<TIn, kD>;
    static_assert(
        G::kMaxStates == catalog::merge_slot_states(kD) && G::kChunks == catalog::kMergeOddChunks,
        "the states and chunks of the catalog's odd-row rows");
    const std::int64_t threads = args.out.tokens * args.out.heads * G::kThreadsPerRow;
    if (args.group != G::kGroup || threads < min_blocks * kOddMaxThreads) return;
    met |= catalog::kNeedsFullGrid;
    if (odd_launch<TIn, TO, kD>().usable) met |= catalog::kNeedsSmemFit;
  });
  return met;
}

/// Launches the odd-row kernel on `stream` (after odd_needs met every need of its row): a grid
/// covering every row, each block `steps` times its rows (1 unless the grid would pass 2^31 - 1
/// blocks).
template <class TIn, class TO>
void launch_odd(const RowsArgs& args, cudaStream_t stream) {
  dispatch_odd_head_dim(args.out.head_dim, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    using G = OddGeometry<TIn, kD>;
    const OddLaunch l = odd_launch<TIn, TO, kD>();
    const std::int64_t rows_per_block = l.threads / G::kThreadsPerRow;
    const std::int64_t total_rows = args.out.tokens * args.out.heads;
    const std::int64_t row_blocks = (total_rows + rows_per_block - 1) / rows_per_block;
    const std::int64_t steps =
        std::max<std::int64_t>(1, (row_blocks + 0x7fffffff - 1) / 0x7fffffff);
    const std::int64_t blocks = (row_blocks + steps - 1) / steps;
    merge_odd_kernel<TIn, TO, kD>
        <<<static_cast<unsigned>(blocks), l.threads, l.smem, stream>>>(args, steps);
    ATTNSTATE_CHECK_LAUNCH(stream, "merge_odd_kernel");
  });
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
