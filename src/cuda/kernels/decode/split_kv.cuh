/// @file kernels/decode/split_kv.cuh
/// @brief The split-KV decode kernel (internal): one CTA per (request, KV head, row tile, split).
///
/// - The CTA's query rows (`q_len × group` rows of one KV head, up to 16) form the M of
///   m16n8k16 tensor-core MMAs, so each K/V byte is read once for the whole GQA group.
/// - Each of the 4 warps streams its own 16-token tiles of the split (tiles w, w + 4, ...)
///   through a cp.async pipeline (`kStages` deep: 3, or 2 in the short-split configuration that
///   fits one more CTA per SM) of 16-byte chunks into XOR-swizzled shared memory, computes
///   `S = Q Kᵀ` and `O += P V` on tensor cores and keeps its own online softmax
///   (`math::OnlineSoftmax`, base 2) for its two rows per thread.
/// - The warps' states are merged in warp order through shared memory. A request with one split
///   writes the output directly. Otherwise the split states are merged in split order with the
///   core max-subtracted merge (`split_merge` / `split_finalize`), either
///   - inside a thread-block cluster (one CTA per split, `p.cluster` = the split count): each
///     CTA publishes its state in its shared memory, and after a cluster barrier each CTA merges
///     a share of the output columns reading its peers' states through distributed shared
///     memory; or
///   - through the workspace: each CTA writes a partial state (fp32 `o`, base-2 `lse`) and takes
///     an integer ticket (an acquire-release atomic); the CTA with the last ticket of a (request,
///     KV head, row tile) copies the splits' LSEs into its shared memory while each thread loads
///     the first batch of its columns' `o` into registers, computes each row's max and the
///     splits' weights (8 threads per row), merges the columns (the weight sum in the same loop,
///     16 splits' loads in flight per batch) and resets the ticket. When a one-wave grid allows
///     it, groups of `p.cluster` consecutive splits share a cluster: the CTAs of a group tell
///     each other their tickets through distributed shared memory (after a barrier phase that
///     every CTA of the cluster entered at its start), and every CTA of the group holding the
///     last ticket merges a share of the columns (the merge spread over several SMs).
///   Both run the same sequence of floating-point operations per output element (max, then
///   `w = 2^(lse − m)`, `sum += w`, `acc += w · o` in split order), so the result does not
///   depend on the path.
/// - The code is kept compact (rolled loops off the hot path): small launches are dominated by
///   instruction fetch from a cold cache.
/// - The page ids of a warp's first tiles are loaded speculatively together with the length
///   (block table, fixed split size), so that the first tiles' copies start when it arrives.
/// - Probe builds (`ATTNSTATE_PROBES=1`, never shipped) stamp per-CTA globaltimer
///   values at the phases of the kernel (read with `bench_decode --timeline`).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/grid_dependency.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/arch/special.cuh"
#include "cuda/kernels/decode/common.cuh"
#include "cuda/kernels/decode/epilogue.cuh"
#include "cuda/kernels/decode/params.cuh"
#include "cuda/kernels/decode/scores.cuh"
#include "cuda/kernels/decode/split_loader.cuh"
#include "cuda/kernels/decode/split_merge.cuh"
#include "cuda/kernels/decode/tile_step.cuh"
#include "cuda/tile/attention_tile.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/paged_kv.cuh"
#include "cuda/tile/partial_state.cuh"
#include "cuda/tile/softmax_step.cuh"
#include "cuda/tile/warp_reduce.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// Split-KV decode kernel for head dim `D` and pipeline depth `kStages`; `kBF16` selects bf16
/// (else f16) queries, and KV of the same dtype unless `kKv` names an fp8 format
/// (`tile::Fp8Kv`: then the tile is `tile::attention_tile_fp8`, on f16 tensor cores, with the
/// queries in f16 — bf16 rows scaled by a power of two into the f16 range — and the
/// dequantisation scales of `p.k_scale` / `p.v_scale`); `kVariant` applies `p`'s sliding window
/// and soft cap (the splits then cover each request's keys from its first row's window on).
template <int D, bool kBF16, int kStages, bool kVariant = false, int kKv = tile::kKvSame>
__global__ void __launch_bounds__(kDecodeWarps * 32,
                                  decode_ctas_per_sm(D, kStages, kKv == tile::kKvSame ? 2 : 1))
    decode_split_kv_kernel(const DecodeParams p) {
  using Elem = std::uint16_t;
  constexpr bool kFp8 = kKv != tile::kKvSame;
  constexpr int kKvBytes = kFp8 ? 1 : 2;
  constexpr int kWarps = kDecodeWarps;
  constexpr int kRows = kDecodeTileRows;
  constexpr int kThreads = kWarps * 32;
  constexpr int kCpr = D / 8;            // 16-byte chunks per row
  constexpr int kTileElems = kRows * D;  // one K or V tile of 16 tokens
  constexpr int kNT = D / 8;             // n-tiles of the output
  constexpr int kD4 = D / 4;             // float4 columns of a row
  constexpr int kOw = decode_ow_stride(D);
  constexpr std::int64_t kBodyBytes = decode_body_bytes(D, kStages, kKvBytes);
  // the query tile loads whole chunks per thread, and the fragments span whole 16-column k-steps
  static_assert(D % 64 == 0 && (kRows * kCpr) % kThreads == 0, "head dims of whole 64 columns");

  extern __shared__ __align__(128) unsigned char smem[];
  Elem* q_s = reinterpret_cast<Elem*>(smem);
  unsigned char* body = smem + kRows * D * 2;
  Elem* pipe = reinterpret_cast<Elem*>(body);
  constexpr std::int64_t kStateBytes = std::int64_t{kRows} * kD4 * 24;  // workspace merge
  // [item] float4 running sums of the workspace merge, then [row] (max, weight sum)
  float* merge_state = reinterpret_cast<float*>(body + kBodyBytes - kStateBytes);
  static_assert(kBodyBytes - kStateBytes >= std::int64_t{kMaxSplits} * kRows * 4,
                "every split's LSEs fit before the merged columns");
  int* is_last = reinterpret_cast<int*>(body + kBodyBytes);               // [cluster rank]
  float* row_s2 = reinterpret_cast<float*>(is_last + kDecodeMaxWsGroup);  // [row] (fp8 only)
  static_assert(kDecodeMaxCluster <= kDecodeMaxWsGroup, "a flag per CTA of a cluster");
  decode_grid_dependency(p);

  ATTNSTATE_DECODE_MARK(0);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  // ---- which (request, KV head, row tile, split); the splits of a tile are consecutive blocks
  //      (a cluster when the merge runs in one) ----
  const std::int64_t S = p.splits.max_splits;
  unsigned bid = blockIdx.x;  // the grid has at most 2^31 - 1 CTAs
  const int s = static_cast<int>(bid % static_cast<unsigned>(S));
  bid /= static_cast<unsigned>(S);
  const int hkv = static_cast<int>(bid % static_cast<unsigned>(p.heads_kv));
  bid /= static_cast<unsigned>(p.heads_kv);
  const int mt = static_cast<int>(bid % static_cast<unsigned>(p.row_tiles));
  const int b = static_cast<int>(bid / static_cast<unsigned>(p.row_tiles));
  const int row0 = mt * kRows;
  const int rows_here = min(kRows, p.rows - row0);

  // ---- the loads that start the critical chain first: the length and the speculative page ids
  //      of this warp's first tiles (block table, fixed split size: the split start does not
  //      depend on the length; entries inside the table's row, whatever the length) ----
  constexpr int kSpec = kDecodeSpecTiles < kStages ? kDecodeSpecTiles : kStages;
  std::int32_t spec_pid[kSpec];
  const std::uint32_t spec_t0 =
      static_cast<std::uint32_t>(s) * static_cast<std::uint32_t>(p.splits.split_size) +
      static_cast<std::uint32_t>(warp * kRows);
  const bool spec = p.block_table != nullptr && p.splits.policy == SplitPolicy::kFixedSize &&
                    p.page_size % kRows == 0;
#pragma unroll
  for (int k = 0; k < kSpec; ++k) {
    const int off = (warp + k * kWarps) * kRows;  // the tile's start in the split
    const std::uint32_t page = (spec_t0 + static_cast<std::uint32_t>(k * kWarps * kRows)) /
                               static_cast<std::uint32_t>(p.page_size);
    spec_pid[k] = -1;
    if (spec && off < p.splits.split_size && page < p.block_table_stride)
      spec_pid[k] = p.block_table[b * p.block_table_stride + page];
  }
  std::int64_t pages;
  std::int64_t csr_base = 0;
  if (p.block_table != nullptr) {
    pages = p.block_table_stride;
  } else {
    csr_base = p.page_indptr[b];
    pages = static_cast<std::int64_t>(p.page_indptr[b + 1]) - csr_base;
    if (pages < 0 || csr_base < 0) pages = 0;  // an invalid range of page ids: no keys
    if (csr_base < 0) csr_base = 0;
  }
  std::int64_t len64 = p.seq_lens[b];

  // ---- queries → registers, 16-byte chunks (they do not depend on the length) ----
  constexpr int kQChunks = kRows * kCpr / kThreads;  // chunks per thread
  uint4 qreg[kQChunks];
#pragma unroll
  for (int i = 0; i < kQChunks; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kCpr;
    const int col = c % kCpr;
    qreg[i] = make_uint4(0, 0, 0, 0);
    if (r < rows_here) {
      const int rg = row0 + r;
      const int qi = rg / p.group;
      const int hq = hkv * p.group + rg % p.group;
      const Elem* src = static_cast<const Elem*>(p.q) + b * p.q_stride_b + qi * p.q_stride_t +
                        hq * p.q_stride_h + col * 8;
      if (p.q_vec) {
        qreg[i] = __ldg(reinterpret_cast<const uint4*>(src));
      } else {
        Elem e[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) e[j] = src[j];
        qreg[i] = make_uint4(e[0] | (e[1] << 16), e[2] | (e[3] << 16), e[4] | (e[5] << 16),
                             e[6] | (e[7] << 16));
      }
    }
  }

  // ---- length, clamped to the pages the request owns ----
  if (len64 < 0) len64 = 0;
  if (len64 > pages * p.page_size) len64 = pages * p.page_size;
  const std::int32_t len = static_cast<std::int32_t>(len64);
  ATTNSTATE_DECODE_MARK_DEP(4, len);
  // A sliding window: keys before the first row's window are never read; the splits cut
  // [w0, len), w0 rounded down to a tile (the rows' own starts are masked in the scores).
  int w0 = 0;
  if constexpr (kVariant) {
    if (p.window_left >= 0) {
      const std::int64_t first = static_cast<std::int64_t>(len) - p.q_len - p.window_left;
      w0 = first > 0 ? static_cast<int>(first) & ~(kRows - 1) : 0;
    }
  }
  const int n_splits = p.splits.splits_for(len - w0);
  const bool single = n_splits == 1;
  // In a cluster (the tile's splits merged in distributed shared memory, or a group of the
  // workspace merge) every CTA takes part in the cluster barriers, those past the request's
  // splits with an empty range.
  const bool in_cluster = p.cluster > 1 && !single;
  const bool clustered = in_cluster && p.cluster == S;  // distributed shared-memory merge
  // A cluster group of the workspace merge: every CTA signals that it runs (its shared memory
  // exists) before any peer writes its ticket flag there (`cluster_wait` in the ticket step).
  const bool grouped = in_cluster && !clustered;
  if (grouped) arch::cluster_arrive_relaxed();
  if (s >= n_splits && !in_cluster) return;
  const bool active = s < n_splits;
  const TokenRange range = [&] {  // empty when s ≥ n_splits
    TokenRange r = p.splits.range(len - w0, s);
    r.begin += w0;
    r.end += w0;
    return r;
  }();

  float* ow = reinterpret_cast<float*>(body);  // [warp][row][kOw]   (after the main loop)
  float* mw = ow + kWarps * kRows * kOw;       // [warp][row]
  float* lw = mw + kWarps * kRows;             // [warp][row]
  float* pub_o = lw + kWarps * kRows;          // [row][D]  published split state (cluster)
  float* pub_lse = pub_o + kRows * D;          // [row] base 2
  const std::int64_t tile_id = (static_cast<std::int64_t>(b) * p.heads_kv + hkv) * p.row_tiles + mt;

  // Stores the merged columns (r, d4) of this tile's row r as the output state (see
  // `store_row_columns`).
  auto store_merged = [&](int r, int d4, MergedColumns mc, bool grouped = false) {
    store_row_columns<D>(p, b, hkv, row0 + r, d4, mc, grouped);
  };

  if (active) {
    // ---- queries → shared, XOR-swizzled 16-byte chunks (rows beyond the tile are zero); over
    //      an fp8 cache as f16 in the column order of `attention_tile_fp8`, each row's score
    //      factor beside them ----
#pragma unroll
    for (int i = 0; i < kQChunks; ++i) {
      const int c = tid + i * kThreads;
      const int r = c / kCpr;
      const int col = c % kCpr;
      if constexpr (kFp8) {
        const float f = tile::queries_to_f16<kBF16, kCpr>(qreg[i]);  // 2^k: the row's scaling
        qreg[i] = tile::permute_q_columns(qreg[i], col);
        // the row's factor on its dot products: with the score scale folded in (plain), or
        // alone, for the variant's scores to map the true dot product (soft cap, window)
        if (col == 0) {
          if constexpr (kVariant)
            row_s2[r] = p.k_scale.at(hkv) / f;
          else
            row_s2[r] = p.s2_scale * p.k_scale.at(hkv) / f;
        }
      }
      *reinterpret_cast<uint4*>(q_s + r * D + ((col ^ (r & 7)) << 3)) = qreg[i];
    }

    int lim[2];  // exclusive key ends of rows lane/4 and lane/4 + 8
    tile::causal_row_limits(p, lane, rows_here, row0, len, range.end, lim);
    tile::VariantScores scores;  // (the variant kernel only)
    if constexpr (kVariant) {
      scores.set_map(p.scale, p.soft_cap);
      decode_window_rows(p, lane, rows_here, row0, len, scores);
    }

    // ---- this warp's tiles of the split ----
    const int n_tiles = (range.end - range.begin + kRows - 1) / kRows;
    const int my_tiles = n_tiles > warp ? (n_tiles - warp + kWarps - 1) / kWarps : 0;
    unsigned char* kbuf = reinterpret_cast<unsigned char*>(pipe) +
                          static_cast<std::int64_t>(warp) * kStages * 2 * kTileElems * kKvBytes;
    const Elem* kpool = static_cast<const Elem*>(p.k);
    const Elem* vpool = static_cast<const Elem*>(p.v);
    const bool tile_in_page = (p.page_size % kRows) == 0;
    const std::uint64_t policy = arch::l2_evict_first_policy();

    auto page_id = [&](std::int64_t pidx) { return split_page_id(p, b, csr_base, pidx); };
    auto in_page = [&](std::int64_t slot) { return tile::kv_in_page<D>(p, hkv, slot); };
    auto tile_pid = [&](int it) -> std::int64_t {
      return split_tile_pid(p, range, warp, lane, my_tiles, tile_in_page, page_id, in_page, it);
    };
    auto first_pid = [&](int it) -> std::int64_t {
      return split_first_pid(p, range, warp, my_tiles, tile_in_page, spec_pid, spec_t0, tile_pid,
                             it);
    };
    // Per-lane constants of the chunk addressing (see `copy_kv_tile_in_page`): inside one page a
    // lane's source offsets are one base plus compile-time multiples of the row stride. The
    // copies move 16-bit units: an fp8 row of D elements is D / 2 of them (`kDu`), its offsets
    // halved (every fp8 offset is even: rows of D elements, D a multiple of 16).
    constexpr int kDu = D * kKvBytes / 2;
    constexpr int kCpu = kDu / 8;  // 16-byte chunks per row
    const int lane_r0 = lane / kCpu;
    const int lane_col = lane % kCpu;
    auto units = [](std::int64_t elems) {  // an element offset in the copies' 16-bit units
      if constexpr (kFp8) return elems >> 1;
      return elems;
    };
    const std::int64_t row_stride =
        units(p.layout_hnd ? std::int64_t{D} : static_cast<std::int64_t>(p.heads_kv) * D);
    // Shared-memory byte addresses: the warp's ring of K/V tiles, and the per-lane parts of the
    // ldmatrix addresses (row, and the XOR of the 16-byte chunk index with the row, so that the
    // chunk of k-step kk is `(32 · kk) ^ x`).
    constexpr std::uint32_t kTileBytes = kTileElems * kKvBytes;
    constexpr std::uint32_t kStageBytes = 2 * kTileBytes;
    const std::uint32_t ring = arch::smem_addr(kbuf);
    const int a_row = lane & 15;  // Q fragments (A) and V (transposed B)
    const std::uint32_t a_x = static_cast<std::uint32_t>(((lane >> 4) ^ (lane & 7)) << 4);
    const int b_row = ((lane >> 4) << 3) + (lane & 7);  // K (B)
    const std::uint32_t b_x = static_cast<std::uint32_t>((((lane >> 3) & 1) ^ (lane & 7)) << 4);
    const std::uint32_t q_lane = arch::smem_addr(q_s) + static_cast<std::uint32_t>(a_row * D * 2);
    auto load_tile = [&](int it, int stage, std::int64_t pid) {
      split_load_tile<D, kStages, kKv>(p, range, warp, lane, ring, tile_in_page, in_page, units,
                                       lane_r0, lane_col, kpool, vpool, row_stride, policy, it,
                                       stage, pid);
    };

    float o_acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.f;
    math::OnlineSoftmax os[2];

    // The first tiles' copies (one code path with the main loop's: rolled).
#pragma unroll 1
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < my_tiles) load_tile(st, st, first_pid(st));
      arch::cp_async_commit();
    }
    // The page ids (or row offsets) of the next tiles to load are fetched two iterations ahead:
    // a page-table read that misses L2 then has two tiles of work to arrive in, not one (pages
    // smaller than a tile need a fresh read per tile).
    std::int64_t pid_next = first_pid(kStages - 1);
    std::int64_t pid_after = first_pid(kStages);
    __syncthreads();  // queries in shared memory
    // the fp8 kernel's scores: each row's factor (`row_s2`), then the variant's map
    std::conditional_t<kVariant, tile::RowScaledVariantScores, tile::RowScaledScores> row_scores;
    if constexpr (kFp8) {
      if constexpr (kVariant) static_cast<tile::VariantScores&>(row_scores) = scores;
#pragma unroll
      for (int h = 0; h < 2; ++h) row_scores.s2[h] = row_s2[(lane >> 2) + 8 * h];
    }

    for (int it = 0; it < my_tiles; ++it) {
      const int nxt = it + kStages - 1;
      if (nxt < my_tiles) load_tile(nxt, nxt % kStages, pid_next);
      pid_next = pid_after;
      pid_after = tile_pid(nxt + 2);
      arch::cp_async_commit();
      arch::cp_async_wait<kStages - 1>();
      __syncwarp();
#if ATTNSTATE_PROBES
      if (it == 0) ATTNSTATE_DECODE_MARK(5);
#endif

      const std::uint32_t ks = ring + static_cast<std::uint32_t>(it % kStages) * kStageBytes;
      const int t0 = range.begin + (warp + kWarps * it) * kRows;
      auto q_frag = [&](int kk, std::uint32_t(&a)[4]) {
        arch::ldmatrix_x4(a, q_lane + ((32u * kk) ^ a_x));
      };
      if constexpr (kFp8)
        tile::attention_tile_fp8<D, kKv>(q_frag, ks, ks + kTileBytes, t0, lim, p.s2_scale, os,
                                         o_acc, row_scores);
      else
        decode_tile<D, kBF16, kVariant>(q_frag, ks, a_row, b_row, a_x, b_x, t0, lim, p.s2_scale, os,
                                        o_acc, scores);
      __syncwarp();
    }
    arch::cp_async_wait<0>();
    ATTNSTATE_DECODE_MARK(6);

    // ---- merge the warps' states (fixed warp order) into the split's slot ----
    split_warp_merge<D, kOw, kFp8>(p, tid, warp, lane, hkv, rows_here, o_acc, os, ow, mw, lw,
                                   tile_id, S, s, SplitSlot{single, clustered, pub_o, pub_lse},
                                   store_merged);
  }
  ATTNSTATE_DECODE_MARK(1);
  if (single) return;
  if (p.skip_combine) {
    if (grouped) arch::cluster_wait();  // the barrier phase completes in every CTA of the cluster
    return;
  }

  const int items = rows_here * kD4;

  if (clustered) {
    split_cluster_merge<D>(p, tid, s, n_splits, items, pub_o, pub_lse, store_merged);
    return;
  }

  // ---- tickets: every CTA of the request's splits takes one (acquire-release: its partial
  //      state is released with it, the others' are acquired); the CTA with the last one, or
  //      every CTA of the cluster group holding it, merges the splits (a group's CTAs share the
  //      columns) ----
  int e_begin = 0, e_end = items;
  if (!split_ticket(p, tid, s, n_splits, active, tile_id, is_last, items, e_begin, e_end)) return;

  // Shared memory: every split's LSE, then its weight (-1: empty) [split][16 rows]; at the
  // body's end the merged columns of the items and each row's max. The splits' `o` columns are
  // loaded straight into registers (measured faster than staging them in shared memory by
  // 16-byte cp.async or by bulk copies, which issue slowly).
  constexpr int kB = D <= 64 ? kDecodeDirectBatch64 : kDecodeDirectBatch;
  const int n = n_splits;
  const int ne = e_end - e_begin;
  if (ne <= 0) return;
  const std::int64_t split0 = tile_id * S * kRows;  // partial (split 0, row 0)
  float* st_w = reinterpret_cast<float*>(body);
  float4* acc_s = reinterpret_cast<float4*>(merge_state);  // [item]
  float* sum_s = merge_state + 4 * kRows * kD4;            // [item]
  float* row_m = sum_s + kRows * kD4;                      // [row]
  const int cap = n;                                       // (one chunk of splits)
  // The batch of columns in flight (item `it`, splits [i0, i0 + kB) clamped to the last split;
  // the first batch of this thread's first item is requested before the weights).
  float4 v[kB];
  auto load_batch = [&](int it, int i0) {
    split_load_batch<D, kB>(p, split0, e_begin, n, v, it, i0);
  };
  ATTNSTATE_DECODE_MARK_CLOCK(4);
  // The LSEs, and the first batch of this thread's first item, in flight together.
#pragma unroll 1
  for (int c = tid; c < n * (kRows / 4); c += kThreads)
    arch::cp_async_16_zfill<0>(arch::smem_addr(st_w + 4 * c), p.ws_lse + split0 + 4 * c, 16);
  arch::cp_async_commit();
  if (tid < ne) load_batch(tid, 0);
  ATTNSTATE_DECODE_MARK_CLOCK(5);
  arch::cp_async_wait<0>();
  __syncthreads();
  ATTNSTATE_DECODE_MARK_CLOCK(6);
  // Each row's max over the splits' LSEs and every split's weight in place of its LSE (-1 marks
  // an empty split; merge weights are never negative): 8 threads per row, each a stride of the
  // splits, the max by shuffles.
  static_assert(kThreads == 8 * kRows, "8 threads per row");
  {
    const int r = tid >> 3;
    const int j = tid & 7;
    float m = math::neg_inf();
#pragma unroll 1
    for (int i = j; i < n; i += 8) m = math::nan_max(m, st_w[i * kRows + r]);
    m = tile::butterfly_reduce<4, 1>(m, math::nan_max);
    if (r < rows_here) {
#pragma unroll 1
      for (int i = j; i < n; i += 8) {
        const float l = st_w[i * kRows + r];
        st_w[i * kRows + r] =
            math::is_empty_lse(l) ? -1.f : math::merge_weight(LseBase::kBase2, l, m);
      }
      if (j == 0) row_m[r] = m;
    }
  }
  ATTNSTATE_DECODE_MARK_CLOCK(7);
#pragma unroll 1
  for (int c0 = 0; c0 < n; c0 += cap) {
    const int c1 = min(n, c0 + cap);
    __syncthreads();  // the weights of every split are in place
#pragma unroll 1
    for (int it = tid; it < ne; it += kThreads) {  // this thread's own items
      const int r = (e_begin + it) / kD4;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      float sum = 0.f;
      if (c0 > 0) {
        acc = acc_s[it];
        sum = sum_s[it];
      }
      // batches of splits: every load of a batch in flight before the adds (in split order)
#pragma unroll 1
      for (int i0 = c0; i0 < c1; i0 += kB) {
        float w[kB];
        if (i0 > 0 || it != tid) load_batch(it, i0);
#pragma unroll
        for (int u = 0; u < kB; ++u) {
          const int i = i0 + u < c1 ? i0 + u : c1 - 1;
          w[u] = i0 + u < c1 ? st_w[i * kRows + r] : -1.f;
        }
#pragma unroll
        for (int u = 0; u < kB; ++u) {
          if (w[u] != -1.f) {
            sum += w[u];
            acc.x += w[u] * v[u].x;
            acc.y += w[u] * v[u].y;
            acc.z += w[u] * v[u].z;
            acc.w += w[u] * v[u].w;
          }
        }
      }
      if (c1 == n) {
        const MergedColumns mc = split_finalize(row_m[r], sum, acc);
        acc = mc.o;
        sum = mc.lse;
      }
      acc_s[it] = acc;
      sum_s[it] = sum;
    }
  }
  // The outputs (after the loops: little state lives across the output calls).
#pragma unroll 1
  for (int it = tid; it < ne; it += kThreads) {
    const int e = e_begin + it;
    MergedColumns mc;
    mc.o = acc_s[it];
    mc.lse = sum_s[it];
    store_merged(e / kD4, e % kD4, mc);
  }
  ATTNSTATE_DECODE_MARK(3);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
