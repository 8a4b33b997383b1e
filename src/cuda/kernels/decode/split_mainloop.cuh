/// @file kernels/decode/split_mainloop.cuh
/// @brief The mainloop of the split decode kernel (internal): a warp's 16-token tiles of its
///        split (tiles w, w + 4, ...) through its cp.async ring in shared memory (`kStages`
///        deep), each tile's `S = Q Kᵀ`, scores policy and `O += P V` on tensor cores
///        (`decode_tile`, or `tile::attention_tile_fp8` over an fp8 cache; in the paired fp8
///        configuration two tiles a step, `tile::attention_pair_fp8`) into the warp's
///        accumulator and online softmax. A part of the kernel's composition
///        (`decode_split_kv_kernel`), inlined there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/kernels/decode/common.cuh"
#include "cuda/kernels/decode/params.cuh"
#include "cuda/kernels/decode/scores.cuh"
#include "cuda/kernels/decode/split_loader.cuh"
#include "cuda/kernels/decode/split_prologue.cuh"
#include "cuda/kernels/decode/tile_step.cuh"
#include "cuda/tile/attention_tile.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/paged_kv.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// The fp8 kernel's scores `rs`: each row's factor (`row_s2`, rows lane / 4 and lane / 4 + 8),
/// then the variant's map (`scores`). Nothing for a 16-bit cache.
template <bool kFp8, bool kVariant, class RowScores>
__device__ __forceinline__ void set_row_scores(RowScores& rs, const tile::VariantScores& scores,
                                               const float* row_s2, int lane) {
  if constexpr (kFp8) {
    if constexpr (kVariant) static_cast<tile::VariantScores&>(rs) = scores;
#pragma unroll
    for (int h = 0; h < 2; ++h) rs.s2[h] = row_s2[(lane >> 2) + 8 * h];
  }
}

/// Warp `warp`'s tiles of the token `range` of CTA `c` (request length `len`; page ids from the
/// block table or from the CSR page ids at `csr_base`, those of its first tiles from the
/// speculative loads `spec_pid`, made for a split starting at `spec_t0`) against the queries in
/// `q_s` (fp8: each row's score factor in `row_s2`), accumulated into `o_acc` (zeroed here) and
/// `os` (two rows per thread: lane / 4 and lane / 4 + 8). The warp's ring is its share of
/// `pipe`. The first tiles' copies are issued before the barrier that publishes the queries in
/// shared memory. `kKeys`: keys a step, one tile or (fp8, `kDecodePairKeys`) two.
template <int D, bool kBF16, int kStages, bool kVariant, int kKv, int kKeys, int kSpec>
__device__ __forceinline__ void split_mainloop(
    const DecodeParams& p, const SplitCta& c, const int& warp, const int& lane, const int& len,
    const TokenRange& range, const std::int64_t& csr_base, const std::int32_t (&spec_pid)[kSpec],
    const std::uint32_t& spec_t0, const std::uint16_t* q_s, std::uint16_t* pipe,
    const float* row_s2, float (&o_acc)[D / 8][4], math::OnlineSoftmax (&os)[2]) {
  using Elem = std::uint16_t;
  constexpr bool kFp8 = kKv != tile::kKvSame;
  constexpr int kKvBytes = kFp8 ? 1 : 2;
  constexpr int kWarps = kDecodeWarps;
  constexpr int kRows = kDecodeTileRows;
  constexpr int kTileElems = kRows * D;  // one K or V tile of 16 tokens
  constexpr int kNT = D / 8;             // n-tiles of the output
  // the fp8 kernel's scores (`set_row_scores`)
  using RowScores =
      std::conditional_t<kVariant, tile::RowScaledVariantScores, tile::RowScaledScores>;
  // paired steps: fp8 only, whole steps in the ring
  static_assert(kKeys == kRows || (kKeys == kDecodePairKeys && kFp8 && kStages % 2 == 0),
                "16-key steps, or paired fp8 steps over a ring of whole steps");

  int lim[2];  // exclusive key ends of rows lane/4 and lane/4 + 8
  tile::causal_row_limits(p, lane, c.rows_here, c.row0, len, range.end, lim);
  // (the variant kernel only; value-initialised: the register order, and so the machine code, of
  // this code when it was written in the kernel)
  tile::VariantScores scores{};
  if constexpr (kVariant) {
    scores.set_map(p.scale, p.soft_cap);
    decode_window_rows(p, lane, c.rows_here, c.row0, len, scores);
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

  auto page_id = [&](std::int64_t pidx) { return split_page_id(p, c.b, csr_base, pidx); };
  auto in_page = [&](std::int64_t slot) { return tile::kv_in_page<D>(p, c.hkv, slot); };
  auto tile_pid = [&](int it) -> std::int64_t {
    return split_tile_pid(p, range, warp, lane, my_tiles, tile_in_page, page_id, in_page, it);
  };
  auto first_pid = [&](int it) -> std::int64_t {
    return split_first_pid(p, range, warp, my_tiles, tile_in_page, spec_pid, spec_t0, tile_pid, it);
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
                                     lane_r0, lane_col, kpool, vpool, row_stride, policy, it, stage,
                                     pid);
  };

#pragma unroll
  for (int j = 0; j < kNT; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.f;

  if constexpr (kKeys != kRows) {
    // Paired steps: the warp's tiles two at a time (tiles it and it + 1 of the warp, keys 64
    // apart), from ring slots `it % kStages` and the next, one copy group per step. A warp with
    // an odd tile count also loads the tile after its last (keys past the range: zero-filled,
    // never read from memory), so that its last step's second tile holds zeros, not stale or
    // uninitialised bytes (`0 · NaN` would reach the output).
    const int pair_tiles = (my_tiles + 1) & ~1;
    // The first steps' copies (rolled, as the 16-key loop's: one copy code path).
#pragma unroll 1
    for (int st = 0; st < kStages - 2; ++st) {
      if (st < pair_tiles) load_tile(st, st, first_pid(st));
      if (st % 2 == 1) arch::cp_async_commit();
    }
    // page ids (or row offsets) two tiles ahead, as below
    std::int64_t pid_next = first_pid(kStages - 2);
    std::int64_t pid_after = first_pid(kStages - 1);
    __syncthreads();  // queries in shared memory
    RowScores row_scores;
    set_row_scores<kFp8, kVariant>(row_scores, scores, row_s2, lane);

    auto q_frag = [&](int kk, std::uint32_t(&a)[4]) {
      arch::ldmatrix_x4(a, q_lane + ((32u * kk) ^ a_x));
    };
    for (int it = 0; it < my_tiles; it += 2) {
      // the copies of the step `kStages / 2 - 1` ahead, then this step's wait
      const int nxt = it + kStages - 2;
#pragma unroll 1
      for (int u = nxt; u < nxt + 2; ++u) {
        if (u < pair_tiles) load_tile(u, u % kStages, pid_next);
        pid_next = pid_after;
        pid_after = tile_pid(u + 2);
      }
      arch::cp_async_commit();
      arch::cp_async_wait<kStages / 2 - 1>();
      __syncwarp();
#if ATTNSTATE_PROBES
      if (it == 0) ATTNSTATE_DECODE_MARK(5);
#endif
      const std::uint32_t ka = ring + static_cast<std::uint32_t>(it % kStages) * kStageBytes;
      const std::uint32_t kb = ring + static_cast<std::uint32_t>((it + 1) % kStages) * kStageBytes;
      const std::uint32_t k_stage[2] = {ka, kb};
      const std::uint32_t v_stage[2] = {ka + kTileBytes, kb + kTileBytes};
      const int t0a = range.begin + (warp + kWarps * it) * kRows;
      const int t0[2] = {t0a, t0a + kWarps * kRows};
      tile::attention_pair_fp8<D, kKv>(q_frag, k_stage, v_stage, t0, lim, p.s2_scale, os, o_acc,
                                       row_scores);
      __syncwarp();
    }
  } else {
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
    RowScores row_scores;
    set_row_scores<kFp8, kVariant>(row_scores, scores, row_s2, lane);

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
  }
  arch::cp_async_wait<0>();
  ATTNSTATE_DECODE_MARK(6);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
