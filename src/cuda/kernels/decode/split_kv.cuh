/// @file kernels/decode/split_kv.cuh
/// @brief The split-KV decode kernel (internal): one CTA per (request, KV head, row tile, split).
///
/// - The CTA's query rows (`q_len × group` rows of one KV head, up to 16) form the M of
///   m16n8k16 tensor-core MMAs, so each K/V byte is read once for the whole GQA group.
/// - Each of the 4 warps streams its own 16-token tiles of the split (tiles w, w + 4, ...)
///   through a cp.async pipeline (`kStages` deep: 3, or 2 in the short-split configuration that
///   fits one more CTA per SM) of 16-byte chunks into XOR-swizzled shared memory, computes
///   `S = Q Kᵀ` and `O += P V` on tensor cores and keeps its own online softmax
///   (`math::OnlineSoftmax`, base 2) for its two rows per thread. Over fp8 caches the paired
///   configuration (`kKeys = kDecodePairKeys`, a ring of 4 or 6 tiles) takes the warp's tiles two
///   at a time, their chains side by side and one softmax update per 32 keys.
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
///
/// The kernel body is a composition of named parts, inlined (the machine code is the one of the
/// single function they were cut from; `scripts/cubin-diff.sh` shows it):
/// - scheduler (`split_prologue.cuh`): `split_schedule` (the CTA's `SplitCta`) and `split_smem`
///   (its shared memory, `SplitSmem`);
/// - prologue (`split_prologue.cuh`): the speculative page ids (in the kernel, from
///   `split_spec_t0`), `split_pages` and `split_length` (page count, CSR base, clamped length),
///   `split_load_queries` (queries into registers), `split_window_start` and `split_range` (the
///   split's keys), `split_stage_queries` (queries into shared memory, fp8 row factors);
/// - mainloop (`split_mainloop.cuh`): `split_mainloop`, the warp's cp.async pipeline over its
///   tiles (`split_loader.cuh`) with `decode_tile` / `tile::attention_tile_fp8`;
/// - epilogues (`epilogue.cuh`): `split_warp_merge` (into the split's slot, or the output),
///   `split_cluster_merge`, and `split_ticket` followed by the workspace merge (the LSE copy and
///   the loops in the kernel, over `split_load_batch`, `split_ws_row_max`, `split_ws_weight`,
///   `split_ws_sum_splits` and `split_ws_store`).
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
#include "cuda/kernels/decode/split_mainloop.cuh"
#include "cuda/kernels/decode/split_merge.cuh"
#include "cuda/kernels/decode/split_prologue.cuh"
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
/// and soft cap (the splits then cover each request's keys from its first row's window on);
/// `kKeys`: keys a warp takes per step, one 16-key tile or, over fp8, two
/// (`kDecodePairKeys`: `tile::attention_pair_fp8`, `kStages` then an even ring of tiles).
template <int D, bool kBF16, int kStages, bool kVariant = false, int kKv = tile::kKvSame,
          int kKeys = kDecodeTileRows>
__global__ void __launch_bounds__(kDecodeWarps * 32,
                                  decode_ctas_per_sm(D, kStages, kKv == tile::kKvSame ? 2 : 1))
    decode_split_kv_kernel(const DecodeParams p) {
  constexpr bool kFp8 = kKv != tile::kKvSame;
  constexpr int kWarps = kDecodeWarps;
  constexpr int kRows = kDecodeTileRows;
  constexpr int kThreads = kWarps * 32;
  constexpr int kD4 = D / 4;  // float4 columns of a row
  constexpr int kOw = decode_ow_stride(D);
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* body = smem + kRows * D * 2;  // after the query tile
  const SplitSmem sm = split_smem<D, kStages, (kFp8 ? 1 : 2)>(smem, body);
  float* ow = reinterpret_cast<float*>(body);  // `sm.ow`, derived here: the warp merge's code
  decode_grid_dependency(p);
  ATTNSTATE_DECODE_MARK(0);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  // ---- scheduler: which (request, KV head, row tile, split) ----
  const std::int64_t S = p.splits.max_splits;
  const SplitCta cta = split_schedule(p, S);

  // ---- prologue: the loads that start the critical chain first (the speculative page ids of
  //      this warp's first tiles, then the page count and the length: `split_pages`) ----
  constexpr int kSpec = kDecodeSpecTiles < kStages ? kDecodeSpecTiles : kStages;
  std::int32_t spec_pid[kSpec];
  const std::uint32_t spec_t0 = split_spec_t0(p, cta.s, warp);
  const bool spec = p.block_table != nullptr && p.splits.policy == SplitPolicy::kFixedSize &&
                    p.page_size % kRows == 0;
#pragma unroll
  for (int k = 0; k < kSpec; ++k) {
    const int off = (warp + k * kWarps) * kRows;  // the tile's start in the split
    const std::uint32_t page = (spec_t0 + static_cast<std::uint32_t>(k * kWarps * kRows)) /
                               static_cast<std::uint32_t>(p.page_size);
    spec_pid[k] = -1;
    if (spec && off < p.splits.split_size && page < p.block_table_stride)
      spec_pid[k] = p.block_table[cta.b * p.block_table_stride + page];
  }
  SplitPages pg = split_pages(p, cta);
  // the queries → registers (they do not depend on the length), then the length
  constexpr int kQChunks = kRows * D / 8 / kThreads;  // 16-byte chunks per thread
  uint4 qreg[kQChunks];
  split_load_queries<D>(p, cta, tid, qreg);
  const std::int32_t len = split_length(p, pg.len64, pg.pages);
  ATTNSTATE_DECODE_MARK_DEP(4, len);
  // the splits cut [w0, len) (w0: the first row's window start, rounded down to a tile)
  const int w0 = split_window_start<kVariant>(p, len);
  const int n_splits = p.splits.splits_for(len - w0);
  const bool single = n_splits == 1;
  // in a cluster every CTA takes part in the barriers, those past the request's splits empty
  const bool in_cluster = p.cluster > 1 && !single;
  const bool clustered = in_cluster && p.cluster == S;  // distributed shared-memory merge
  // a workspace-merge group: each CTA signals that it runs before peers write its ticket flag
  const bool grouped = in_cluster && !clustered;
  if (grouped) arch::cluster_arrive_relaxed();
  if (cta.s >= n_splits && !in_cluster) return;
  const bool active = cta.s < n_splits;
  const TokenRange range = split_range(p, len, w0, cta.s);
  const std::int64_t tile_id =
      (static_cast<std::int64_t>(cta.b) * p.heads_kv + cta.hkv) * p.row_tiles + cta.mt;
  // Stores the merged columns (r, d4) of this tile's row r as the output state (the coordinates
  // captured as locals: the machine code).
  const int b = cta.b, hkv = cta.hkv, row0 = cta.row0;
  auto store_merged = [&](int r, int d4, MergedColumns mc, bool grouped = false) {
    store_row_columns<D>(p, b, hkv, row0 + r, d4, mc, grouped);
  };

  if (active) {
    split_stage_queries<D, kBF16, kFp8, kVariant>(p, tid, cta.hkv, qreg, sm.q_s, sm.row_s2);
    // ---- mainloop: this warp's tiles of the split ----
    float o_acc[D / 8][4];  // [n-tile of the output]
    math::OnlineSoftmax os[2];
    split_mainloop<D, kBF16, kStages, kVariant, kKv, kKeys>(p, cta, warp, lane, len, range,
                                                            pg.csr_base, spec_pid, spec_t0, sm.q_s,
                                                            sm.pipe, sm.row_s2, o_acc, os);
    // ---- epilogue: the warps' states merged (fixed warp order) into the split's slot ----
    split_warp_merge<D, kOw, kFp8>(
        p, tid, warp, lane, cta.hkv, cta.rows_here, o_acc, os, ow, sm.mw, sm.lw, tile_id, S, cta.s,
        SplitSlot{single, clustered, sm.pub_o, sm.pub_lse}, store_merged);
  }
  ATTNSTATE_DECODE_MARK(1);
  if (single) return;
  if (p.skip_combine) {
    if (grouped) arch::cluster_wait();  // the barrier phase completes in every CTA of the cluster
    return;
  }
  const int items = cta.rows_here * kD4;

  // ---- epilogue: the cluster merge ----
  if (clustered) {
    split_cluster_merge<D>(p, tid, cta.s, n_splits, items, sm.pub_o, sm.pub_lse, store_merged);
    return;
  }

  // ---- epilogue: the tickets, then the workspace merge in the CTA(s) holding the last one ----
  int e_begin = 0, e_end = items;
  if (!split_ticket(p, tid, cta.s, n_splits, active, tile_id, sm.is_last, items, e_begin, e_end))
    return;
  constexpr int kB = D <= 64 ? kDecodeDirectBatch64 : kDecodeDirectBatch;
  const int ne = e_end - e_begin;
  if (ne <= 0) return;
  const std::int64_t split0 = tile_id * S * kRows;  // partial (split 0, row 0)
  float4 v[kB];  // the batch of `o` columns in flight (`split_load_batch`)
  ATTNSTATE_DECODE_MARK_CLOCK(4);
  // The LSEs, and the first batch of this thread's first item, in flight together.
#pragma unroll 1
  for (int c = tid; c < n_splits * (kRows / 4); c += kThreads)
    arch::cp_async_16_zfill<0>(arch::smem_addr(sm.st_w + 4 * c), p.ws_lse + split0 + 4 * c, 16);
  arch::cp_async_commit();
  if (tid < ne) split_load_batch<D, kB>(p, split0, e_begin, n_splits, v, tid, 0);
  ATTNSTATE_DECODE_MARK_CLOCK(5);
  arch::cp_async_wait<0>();
  __syncthreads();
  ATTNSTATE_DECODE_MARK_CLOCK(6);
  // each row's max, and every split's weight in place of its LSE: 8 threads per row
  static_assert(kThreads == 8 * kRows, "8 threads per row");
  const int r = tid >> 3, j = tid & 7;
  const float m = split_ws_row_max(j, r, n_splits, sm.st_w);
  if (r < cta.rows_here) {
#pragma unroll 1
    for (int i = j; i < n_splits; i += 8) split_ws_weight(i, r, m, sm.st_w);
    if (j == 0) sm.row_m[r] = m;
  }
  ATTNSTATE_DECODE_MARK_CLOCK(7);
#pragma unroll 1
  for (int c0 = 0; c0 < n_splits; c0 += n_splits) {  // (one chunk of splits)
    const int c1 = min(n_splits, c0 + n_splits);
    __syncthreads();  // the weights of every split are in place
#pragma unroll 1
    for (int it = tid; it < ne; it += kThreads) {  // this thread's own items
      float4 acc;  // (the kernel's variables: the register order, and so the machine code)
      float sum;
      float w[kB];
      split_ws_sum_splits<D, kB>(p, split0, it, tid, c0, c1, n_splits, e_begin, sm.st_w, sm.acc_s,
                                 sm.sum_s, v, acc, sum, w);
      if (c1 == n_splits) {
        const MergedColumns mc = split_finalize(sm.row_m[(e_begin + it) / kD4], sum, acc);
        acc = mc.o;
        sum = mc.lse;
      }
      sm.acc_s[it] = acc;
      sm.sum_s[it] = sum;
    }
  }
  split_ws_store<D>(tid, ne, e_begin, sm.acc_s, sm.sum_s, store_merged);
  ATTNSTATE_DECODE_MARK(3);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
