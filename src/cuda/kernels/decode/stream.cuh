/// @file kernels/decode/stream.cuh
/// @brief The streamed decode kernel (internal): single-split plans with many short requests.
///
/// - Each warp takes whole items — (request, KV head, row tile) — in turn: item `w`, `w + W`,
///   `w + 2W`, ... for warp `w` of the `W` warps of the grid (one CTA per SM, one wave; warp `i`
///   of CTA `c` is `w = i · gridDim + c`, so consecutive items go to different SMs).
/// - The warp streams its items' 16-token K/V tiles through its own cp.async ring (16-byte
///   copies, evict-first), and the ring does not drain between items: the copies of the next
///   item's first tiles are issued while the current item's last tiles are computed. The next
///   item's query fragments are loaded from global memory straight into registers, and its
///   length and page-table start, when the current item starts; its first 32 page ids one tile
///   later (one per lane: a tile's page id is a shuffle, so no page-table load stands between
///   two tiles' copies). The per-request start-up of the split kernel (length → page id → first
///   bytes) is paid once per warp instead of once per CTA.
/// - Per tile: `S = Q Kᵀ` and `O += P V` on tensor cores (m16n8k16, the item's query rows as
///   M) and the online softmax (base 2): the split kernel's `decode_tile`; the whole item is one
///   warp's state, so there is no merge between warps: at the item's end each thread stores its
///   rows' normalised columns from its accumulator fragments.
/// - A warp computes one tile at a time with little instruction-level parallelism, so several
///   warps share each SM (8) and hide each other's latency; the shared memory is all ring.
/// - The variant instance (`kVariant`) applies a sliding window and a soft cap as the split
///   kernel's does (`tile::VariantScores` per tile), and starts each item at the tile of its
///   request's first row's window start: the tiles wholly before it are never copied.
/// - Requirements (else the launcher uses the split kernel): one split per request, head dim 64
///   or 128 (fp8 caches: 128), page sizes that are multiples of 16, 16-byte aligned query rows, no
///   prior states.
///
/// The kernel's body is a composition of inlined parts (the machine code is the one of the single
/// function they were cut from; `scripts/cubin-diff.sh` shows it):
/// - scheduler: `stream_first_items`, then per item `stream_next_item`;
/// - producer: the load cursor (the next tile to copy is tile `ld_t` of the current item,
///   `ld_sel` 0, or of the next one, 1; 2: none until the next item), stepped by `stream_issue`
///   (`stream_load_tile`, `stream_normalize`); its page-id windows, `ld_pids` for the cursor's
///   item and `nxt_pids` for the next item's first tile once `nxt_ready` (loaded one tile after
///   the item is fetched, when its length and page-table start have arrived, or when the cursor
///   needs it first: `ensure_nxt`, `stream_next_pids`; `stream_win_of`);
/// - mainloop: per item `stream_item_queries` (fp8), `stream_item_rows` (the scores policy) and
///   `stream_zero`, then per tile `stream_wait` (its commit group) and `stream_tile`;
/// - epilogue: `stream_store_rows`.
/// The cursor's hand-over between items and the ring stage's step stay in the body: as parts of
/// their own, they changed the machine code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/variant.hpp"
#include "cuda/kernels/decode/scores.cuh"
#include "cuda/kernels/decode/split_kv.cuh"
#include "cuda/kernels/decode/tile_step.cuh"
#include "cuda/tile/attention_tile.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

// The streamed kernel's shape (`catalog/kernel_shapes.hpp`, read by the planner too).
using catalog::kDecodeStreamStages;
using catalog::kDecodeStreamWarps;
using catalog::stream_smem_bytes;
using catalog::stream_warps;
static_assert(stream_smem_bytes(64) <= 227 * 1024 && stream_smem_bytes(128) <= 227 * 1024,
              "one CTA fits an SM");

/// Stores two consecutive values as `dt` at element `off` of `base` (one aligned store when
/// `vec`); rounds like `store_as`.
__device__ __forceinline__ void store2_as(void* base, DType dt, std::int64_t off, float x, float y,
                                          bool vec) {
  if (vec) {
    switch (dt) {
      case DType::kF32:
        *reinterpret_cast<float2*>(static_cast<float*>(base) + off) = make_float2(x, y);
        return;
      case DType::kF16:
        *reinterpret_cast<std::uint32_t*>(static_cast<half_t*>(base) + off) = bits2<half_t>(x, y);
        return;
      default:
        *reinterpret_cast<std::uint32_t*>(static_cast<bfloat16_t*>(base) + off) =
            bits2<bfloat16_t>(x, y);
        return;
    }
  }
  store_as(base, dt, off, x);
  store_as(base, dt, off + 1, y);
}

/// Waits until at most `n` (0 ≤ n ≤ N) of this thread's most recent cp.async groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  if constexpr (N > 0) {
    if (n >= N) {
      arch::cp_async_wait<N>();
      return;
    }
    cp_async_wait_upto<N - 1>(n);
  } else {
    arch::cp_async_wait<0>();
  }
}

/// One item of a warp: a (request, KV head, row tile) and what its loads need.
struct StreamItem {
  int b = 0, hkv = 0, row0 = 0, rows = 0;
  int len = 0;          // keys (clamped to the pages the request owns)
  int tiles = -1;       // 16-token tiles (0 until fetched); -1: past the last item
  std::int64_t pt = 0;  // first page-table entry of the request (block-table row or CSR start)
};

/// Item `x`'s coordinates (`tiles` 0 until `stream_fetch` sets the length; -1 past the last of
/// the `items`). (`items`, like `lane` below, is taken by reference as the kernel's lambdas
/// captured it: so the machine code stays the same.)
__device__ __forceinline__ StreamItem stream_coords(const DecodeParams& p,
                                                    const std::int64_t& items, std::int64_t x) {
  constexpr int kRows = kDecodeTileRows;
  StreamItem it;
  if (x >= items) return it;
  const int mt = static_cast<int>(x % p.row_tiles);
  const int bh = static_cast<int>(x / p.row_tiles);
  it.hkv = bh % p.heads_kv;
  it.b = bh / p.heads_kv;
  it.row0 = mt * kRows;
  it.rows = min(kRows, p.rows - it.row0);
  it.tiles = 0;
  return it;
}

/// The item's length (clamped to its pages), tiles and page-table start.
__device__ __forceinline__ void stream_fetch(const DecodeParams& p, StreamItem& it) {
  constexpr int kRows = kDecodeTileRows;
  if (it.tiles < 0) return;
  std::int64_t pages;
  if (p.block_table != nullptr) {
    it.pt = static_cast<std::int64_t>(it.b) * p.block_table_stride;
    pages = p.block_table_stride;
  } else {
    it.pt = p.page_indptr[it.b];
    pages = static_cast<std::int64_t>(p.page_indptr[it.b + 1]) - it.pt;
    if (pages < 0 || it.pt < 0) pages = 0;  // an invalid range of page ids: no keys
    if (it.pt < 0) it.pt = 0;
  }
  std::int64_t len = p.seq_lens[it.b];
  if (len < 0) len = 0;
  if (len > pages * p.page_size) len = pages * p.page_size;
  it.len = static_cast<int>(len);
  it.tiles = (it.len + kRows - 1) / kRows;
}

/// The item's first tile to read: 0, or with a sliding window (`kVariant`) the tile of its
/// request's first row's window start (that row's position `len - q_len` minus `window_left`,
/// rounded down to a tile, as the split kernel's `w0`): the tiles before it are masked for every
/// row.
template <bool kVariant>
__device__ __forceinline__ int stream_first_tile(const DecodeParams& p, const StreamItem& it) {
  if constexpr (kVariant) {
    if (p.window_left >= 0) {
      const std::int64_t first = static_cast<std::int64_t>(it.len) - p.q_len - p.window_left;
      if (first > 0) return static_cast<int>(first / kDecodeTileRows);
    }
  }
  return 0;
}

/// The scores policy of item `it` for this thread's rows lane/4 and lane/4 + 8: their exclusive
/// key ends `lim` and, in the variant instance, their window starts (`decode_window_rows`).
/// Returns the item's first tile (`stream_first_tile`). (References, as the kernel's code used
/// the values in place: so the machine code stays the same.)
template <bool kVariant, class Scores>
__device__ __forceinline__ int stream_item_rows(const DecodeParams& p, const int& lane,
                                                const StreamItem& it, int (&lim)[2],
                                                Scores& scores) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = (lane >> 2) + 8 * h;
    lim[h] = r < it.rows ? min(it.len, it.len - p.q_len + (it.row0 + r) / p.group + 1) : 0;
  }
  int t_begin = 0;
  if constexpr (kVariant) {
    t_begin = stream_first_tile<kVariant>(p, it);
    decode_window_rows(p, lane, it.rows, it.row0, it.len, scores);
  }
  return t_begin;
}

/// The A fragments of the item's query rows (rows lane/4 and lane/4 + 8, two columns per
/// register, as ldmatrix would give them), straight from global memory; rows past the item's
/// are zero. Only the item's coordinates are needed: no load stands before these. Over an fp8
/// cache (`kFp8`) in the column order of `tile::attention_tile_fp8`: k-slots 2c, 2c + 1 and
/// 2c + 8, 2c + 9 of lane c = lane % 4 hold the 4 consecutive columns 4c .. 4c + 3 of the
/// k-step (one 8-byte load; converted to f16 when the item starts, `stream_item_queries`).
template <int D, bool kFp8 = false>
__device__ __forceinline__ void stream_load_q(const DecodeParams& p, const int& lane,
                                              const StreamItem& it,
                                              std::uint32_t (&qf)[D / 16][4]) {
  constexpr int kKS = D / 16;
  if (it.tiles < 0) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = (lane >> 2) + 8 * h;
    const int rg = it.row0 + r;
    const std::uint32_t* src = static_cast<const std::uint32_t*>(p.q);
    if (r < it.rows) {
      const std::int64_t e = it.b * p.q_stride_b + (rg / p.group) * p.q_stride_t +
                             (it.hkv * p.group + rg % p.group) * p.q_stride_h +
                             (kFp8 ? 4 : 2) * (lane & 3);
      src += e / 2;
    }
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk) {
      if constexpr (kFp8) {
        const uint2 x =
            r < it.rows ? __ldg(reinterpret_cast<const uint2*>(src + 8 * kk)) : make_uint2(0, 0);
        qf[kk][h] = x.x;
        qf[kk][h + 2] = x.y;
      } else {
        qf[kk][h] = r < it.rows ? __ldg(src + 8 * kk) : 0u;
        qf[kk][h + 2] = r < it.rows ? __ldg(src + 8 * kk + 4) : 0u;
      }
    }
  }
}

/// Over an fp8 cache: the current item's query fragments `qa` (`stream_load_q`'s column order) as
/// f16 (bf16 rows scaled by a power of two into the f16 range, `tile::bf16_rows_to_f16`), and
/// each of this thread's rows' factor on its dot products `s2` (`tile::RowScaledScores`; the
/// score scale folded in unless `kVariant`, whose scores map the dot product themselves). Every
/// lane of the warp must call this.
template <int D, bool kBF16, bool kVariant>
__device__ __forceinline__ void stream_item_queries(const DecodeParams& p, const StreamItem& it,
                                                    std::uint32_t (&qa)[D / 16][4],
                                                    float (&s2)[2]) {
  constexpr int kKS = D / 16;
  const float k_scale = p.k_scale.at(it.hkv) * (kVariant ? 1.f : p.s2_scale);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float f = 1.f;
    if constexpr (kBF16) {
      std::uint32_t w[2 * kKS];
#pragma unroll
      for (int kk = 0; kk < kKS; ++kk) {
        w[2 * kk] = qa[kk][h];
        w[2 * kk + 1] = qa[kk][h + 2];
      }
      f = tile::bf16_rows_to_f16<2 * kKS, 1, 4>(w);  // the row is spread over the quad
#pragma unroll
      for (int kk = 0; kk < kKS; ++kk) {
        qa[kk][h] = w[2 * kk];
        qa[kk][h + 2] = w[2 * kk + 1];
      }
    }
    s2[h] = k_scale / f;
  }
}

/// The page-id window (of 32 pages, `stream_pid_window`) that holds tile `t` of an item.
__device__ __forceinline__ int stream_win_of(const DecodeParams& p, int t) {
  return static_cast<int>(static_cast<std::int64_t>(t) * kDecodeTileRows / p.page_size) >> 5;
}

/// The page ids of pages [32·w, 32·w + 32) of item `it`, one per lane (0 past the item's
/// pages), from `table` (the block table, or the CSR page ids). (References, as the kernel's
/// lambda captured them: so the machine code stays the same.)
__device__ __forceinline__ int stream_pid_window(const DecodeParams& p,
                                                 const std::int32_t* const& table, const int& lane,
                                                 const StreamItem& it, int w) {
  const int idx = 32 * w + lane;
  const int n_pages = it.tiles > 0 ? (it.len - 1) / p.page_size + 1 : 0;
  return idx < n_pages ? table[it.pt + idx] : 0;
}

/// Copies tile `t` of item `it` (page `pid`) into stage `stage` of the warp's ring at `ring`
/// (keys past the item's length zero-filled; the lane's chunk addressing `lane_r0`, `lane_col`,
/// `row_stride` of `tile::copy_kv_tile_in_page`, L2 `policy`). (References, as the kernel's
/// lambda captured them: so the machine code stays the same.)
template <int D, int kKvBytes = 2>
__device__ __forceinline__ void stream_load_tile(const DecodeParams& p, const std::uint32_t& ring,
                                                 const std::uint16_t* const& kpool,
                                                 const std::uint16_t* const& vpool,
                                                 const int& lane_r0, const int& lane_col,
                                                 const std::int64_t& row_stride,
                                                 const std::uint64_t& policy, const StreamItem& it,
                                                 int t, int stage, std::int64_t pid) {
  constexpr int kRows = kDecodeTileRows;
  constexpr std::uint32_t kTileBytes = kRows * D * kKvBytes;
  constexpr std::uint32_t kStageBytes = 2 * kTileBytes;
  const int t0 = t * kRows;
  const std::uint32_t kd = ring + static_cast<std::uint32_t>(stage) * kStageBytes;
  if constexpr (kKvBytes == 2) {
    const std::int64_t base = pid * p.page_elems +
                              tile::kv_in_page<D>(p, it.hkv, t0 % p.page_size + lane_r0) +
                              lane_col * 8;
    tile::copy_kv_tile_in_page<D, kRows>(kd, kd + kTileBytes, kpool, vpool, base, row_stride, t0,
                                         it.len, policy);
  } else {
    // fp8 rows of D bytes moved as D / 2 16-bit units (every fp8 offset is even)
    const std::int64_t base =
        ((pid * p.page_elems + tile::kv_in_page<D>(p, it.hkv, t0 % p.page_size + lane_r0)) >> 1) +
        lane_col * 8;
    tile::copy_kv_tile_in_page<D / 2, kRows>(kd, kd + kTileBytes, kpool, vpool, base, row_stride,
                                             t0, it.len, policy);
  }
}

/// Moves the load cursor on when the current item has no more tiles to copy (`ld_sel` 0 → 1: the
/// next item's first tile, `ld_t` 0 or, in the variant instance, its window's first tile by
/// `nxt_first`, and its page-id window, `ensure_nxt`) or the next item neither (1 → 2: none
/// until the next item). (References, as the kernel's lambda captured them: so the machine code
/// stays the same.)
template <class EnsureNext, class NextFirst>
__device__ __forceinline__ void stream_normalize(const StreamItem& cur, const StreamItem& nxt,
                                                 int& ld_sel, int& ld_t, int& ld_win, int& ld_pids,
                                                 const int& nxt_pids, EnsureNext& ensure_nxt,
                                                 NextFirst& nxt_first) {
  if (ld_sel == 0 && ld_t >= cur.tiles) {
    ensure_nxt();
    ld_sel = 1;
    ld_t = 0;
    ld_pids = nxt_pids;
    ld_win = 0;
    nxt_first();
  }
  if (ld_sel == 1 && ld_t >= nxt.tiles) ld_sel = 2;
}

/// The load cursor's step (the streamed kernel's mainloop producer): when there is a tile to
/// copy (`ld_sel` 0: tile `ld_t` of the current item `cur`, 1: of the next item `nxt`; 2: none
/// until the next item) it copies that tile into ring stage `ld_stage` as one commit group
/// (`load_tile`; its page id shuffled from the lanes' page-id window `ld_pids`, window `ld_win`,
/// reloaded when the item's tiles move to the next window) and moves the cursor (`normalize`).
/// Nothing to copy: no group (a tile's group is then found by the count `loaded`).
/// (References, as the kernel's lambda captured them: so the machine code stays the same.)
template <int kStages, class LoadTile, class Normalize>
__device__ __forceinline__ void stream_issue(const DecodeParams& p,
                                             const std::int32_t* const& table, const int& lane,
                                             const StreamItem& cur, const StreamItem& nxt,
                                             int& ld_sel, int& ld_t, int& ld_win, int& ld_pids,
                                             int& ld_stage, int& loaded, LoadTile& load_tile,
                                             Normalize& normalize) {
  if (ld_sel < 2) {
    const StreamItem it = ld_sel == 0 ? cur : nxt;
    const int pidx =
        static_cast<int>(static_cast<std::int64_t>(ld_t) * kDecodeTileRows / p.page_size);
    if ((pidx >> 5) != ld_win) {  // the next window of a long item (warp-uniform)
      ld_win = pidx >> 5;
      ld_pids = stream_pid_window(p, table, lane, it, ld_win);
    }
    const std::int64_t pid =
        tile::clamp_page(__shfl_sync(0xffffffffu, ld_pids, pidx & 31), p.num_pages);
    load_tile(it, ld_t, ld_stage, pid);
    arch::cp_async_commit();
    ++loaded;
    ld_stage = ld_stage + 1 == kStages ? 0 : ld_stage + 1;
    ++ld_t;
    normalize();
  }
}

/// The scheduler's start of a warp: its first item (index `x_cur`) and the one `stride` items
/// after it, their query fragments (`qa`, `qn`), lengths and page-table starts requested.
template <int D, bool kFp8 = false>
__device__ __forceinline__ void stream_first_items(const DecodeParams& p, const int& lane,
                                                   const std::int64_t& items,
                                                   const std::int64_t& stride,
                                                   const std::int64_t& x_cur, StreamItem& cur,
                                                   StreamItem& nxt, std::uint32_t (&qa)[D / 16][4],
                                                   std::uint32_t (&qn)[D / 16][4]) {
  cur = stream_coords(p, items, x_cur);
  nxt = stream_coords(p, items, x_cur + stride);
  stream_load_q<D, kFp8>(p, lane, cur, qa);
  stream_load_q<D, kFp8>(p, lane, nxt, qn);
  stream_fetch(p, cur);
  stream_fetch(p, nxt);
}

/// The scheduler's step of a warp: the next item (`nxt`, its query fragments `qn`) becomes the
/// current one (`cur`, `qa`), and the item `stride` items after it (`x_cur` the current item's
/// index) becomes the next one, its query fragments, length and page-table start requested.
/// (References, as the kernel's code used the values in place: so the machine code stays the
/// same.)
template <int D, bool kFp8 = false>
__device__ __forceinline__ void stream_next_item(const DecodeParams& p, const int& lane,
                                                 const std::int64_t& items,
                                                 const std::int64_t& stride, std::int64_t& x_cur,
                                                 StreamItem& cur, StreamItem& nxt,
                                                 std::uint32_t (&qa)[D / 16][4],
                                                 std::uint32_t (&qn)[D / 16][4]) {
  constexpr int kKS = D / 16;
  cur = nxt;
  x_cur += stride;
#pragma unroll
  for (int kk = 0; kk < kKS; ++kk)
#pragma unroll
    for (int u = 0; u < 4; ++u) qa[kk][u] = qn[kk][u];
  nxt = stream_coords(p, items, x_cur + stride);
  stream_load_q<D, kFp8>(p, lane, nxt, qn);
  stream_fetch(p, nxt);
}

/// Stores the item's state: each thread its two rows' normalised columns from its accumulator
/// fragments and their LSEs (the split kernel's warp merge with one warp). Over an fp8 cache
/// (`kFp8`) the fragments are in the column order of `tile::attention_tile_fp8` (n-tiles 2g and
/// 2g + 1: the even and odd columns of 16g + 4 (lane % 4) .. + 3) and V's scale multiplies them.
template <int D, bool kFp8 = false>
__device__ __forceinline__ void stream_store_rows(const DecodeParams& p, const int& lane,
                                                  const StreamItem& cur,
                                                  const float (&o_acc)[D / 8][4],
                                                  const math::OnlineSoftmax (&os)[2]) {
  constexpr int kNT = D / 8;
  // element pair j of this thread's row h: columns `col(j)`, `col(j) + 1`, from `acc(j, h, e)`
  auto col = [&](int j) {
    return kFp8 ? 16 * (j / 2) + 4 * (lane & 3) + 2 * (j % 2) : j * 8 + 2 * (lane & 3);
  };
  auto acc = [&](int j, int h, int e) {
    return kFp8 ? o_acc[2 * (j / 2) + e][2 * h + j % 2] : o_acc[j][2 * h + e];
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = os[h].l;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = (lane >> 2) + 8 * h;
    if (r >= cur.rows) continue;
    const float m = os[h].m;
    const bool empty = math::is_empty_lse(m);
    const float f = empty ? 0.f : math::merge_weight(LseBase::kBase2, m, m);
    const math::MergeResult res = math::merge_finalize(LseBase::kBase2, m, f * l);
    const float fo = kFp8 ? f * p.v_scale.at(cur.hkv) : f;  // (V's scale joins the weight)
    const int rg = cur.row0 + r;
    const std::int64_t token = static_cast<std::int64_t>(cur.b) * p.q_len + rg / p.group;
    const std::int64_t hq = static_cast<std::int64_t>(cur.hkv) * p.group + rg % p.group;
    const std::int64_t o_row = token * p.o_stride_token + hq * p.o_stride_head;
    float lse = res.lse;
    if (p.sinks == nullptr) {
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const float x = empty ? 0.f : fo * acc(j, h, 0);
        const float y = empty ? 0.f : fo * acc(j, h, 1);
        store2_as(p.out_o, p.out_dtype, o_row + col(j), x * res.inv_sum, y * res.inv_sum,
                  p.out_vec4);
      }
    } else {
      // the head's sink merged into the normalised row, once (tile::merge_sink)
      float x[2 * kNT];
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        x[2 * j] = (empty ? 0.f : fo * acc(j, h, 0)) * res.inv_sum;
        x[2 * j + 1] = (empty ? 0.f : fo * acc(j, h, 1)) * res.inv_sum;
      }
      lse = tile::merge_sink(x, lse, p.sinks[hq]);
#pragma unroll
      for (int j = 0; j < kNT; ++j)
        store2_as(p.out_o, p.out_dtype, o_row + col(j), x[2 * j], x[2 * j + 1], p.out_vec4);
    }
    if ((lane & 3) == 0)
      p.out_lse[token * p.lse_stride_token + hq * p.lse_stride_head] =
          math::convert_lse(lse, LseBase::kBase2, p.out_base);
  }
}

/// The K/V row stride of `p`'s layout in the copies' 16-bit units (an fp8 row is D / 2 of them).
template <int D, int kKvBytes>
__device__ __forceinline__ std::int64_t stream_row_stride(const DecodeParams& p) {
  return (p.layout_hnd ? std::int64_t{D} : static_cast<std::int64_t>(p.heads_kv) * D) >>
         (2 - kKvBytes);
}

/// The streamed kernel's scores policy: the variant's (`kVariant`) or the plain one, over fp8
/// caches (`kFp8`) after each row's factor (`stream_item_queries`).
template <bool kFp8, bool kVariant>
using StreamScores = std::conditional_t<
    kFp8, std::conditional_t<kVariant, tile::RowScaledVariantScores, tile::RowScaledScores>,
    std::conditional_t<kVariant, tile::VariantScores, tile::PlainScores>>;

/// One tile of the streamed kernel's mainloop: `S = Q Kᵀ`, the scores policy and `O += P V` on
/// tensor cores from the K/V stage at shared-memory address `ks` (keys from `t0`, the rows'
/// exclusive key ends `lim`) with the item's query fragments `qa`, into `o_acc` and `os`:
/// `decode_tile`, or `tile::attention_tile_fp8` over an fp8 cache (`kKv`); then the warp's sync
/// before its ring stage is copied into again. (References, as the kernel's code used the values
/// in place: so the machine code stays the same.)
template <int D, bool kBF16, bool kVariant, int kKv, class Scores>
__device__ __forceinline__ void stream_tile(const DecodeParams& p,
                                            const std::uint32_t (&qa)[D / 16][4],
                                            const std::uint32_t& ks, const int& t0,
                                            const tile::LdmatrixLanes& ldm, const int (&lim)[2],
                                            math::OnlineSoftmax (&os)[2], float (&o_acc)[D / 8][4],
                                            Scores& scores) {
  constexpr bool kFp8 = kKv != tile::kKvSame;
  constexpr std::uint32_t kTileBytes = kDecodeTileRows * D * (kFp8 ? 1 : 2);
  auto q_frag = [&](int kk, std::uint32_t(&a)[4]) {
#pragma unroll
    for (int u = 0; u < 4; ++u) a[u] = qa[kk][u];
  };
  if constexpr (kFp8)
    tile::attention_tile_fp8<D, kKv>(q_frag, ks, ks + kTileBytes, t0, lim, p.s2_scale, os, o_acc,
                                     scores);
  else
    decode_tile<D, kBF16, kVariant>(q_frag, ks, ldm.a_row, ldm.b_row, ldm.a_x, ldm.b_x, t0, lim,
                                    p.s2_scale, os, o_acc, scores);
  __syncwarp();
}

/// The streamed kernel's mainloop: waits for the copies of the next tile to compute (the commit
/// group after `computed` of the `loaded` ones: complete when at most `loaded - 1 - computed`
/// groups committed after it, fewer than `kStages`, are pending), counts it computed, and syncs
/// the warp (the copies of every lane have landed).
__device__ __forceinline__ void stream_wait(const int& loaded, int& computed) {
  cp_async_wait_upto<kDecodeStreamStages - 1>(loaded - 1 - computed);
  ++computed;
  __syncwarp();
}

/// The streamed kernel's mainloop at an item's start: its accumulator fragments `o_acc` zeroed.
template <int D>
__device__ __forceinline__ void stream_zero(float (&o_acc)[D / 8][4]) {
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.f;
}

/// The page ids of the window of item `nxt`'s first tile (`stream_pid_window`; `win_of`: the
/// window of a tile). (References, as the kernel's lambda captured them: so the machine code
/// stays the same.)
template <bool kVariant, class WinOf>
__device__ __forceinline__ int stream_next_pids(const DecodeParams& p,
                                                const std::int32_t* const& table, const int& lane,
                                                const StreamItem& nxt, WinOf& win_of) {
  int w = 0;
  if constexpr (kVariant) w = win_of(stream_first_tile<kVariant>(p, nxt));
  return stream_pid_window(p, table, lane, nxt, w);
}

/// Streamed decode kernel for head dim `D` (64 or 128); `kBF16` selects bf16 (else f16) queries,
/// and KV of the same dtype unless `kKv` names an fp8 format (the split kernel's fp8 tile,
/// `tile::attention_tile_fp8`, with the queries in f16 and the scales of `p.k_scale` /
/// `p.v_scale`); `kVariant` applies `p`'s sliding window and soft cap (the items then start at
/// their window's first tile, `stream_first_tile`).
template <int D, bool kBF16, bool kVariant = false, int kKv = tile::kKvSame>
__global__ void __launch_bounds__(stream_warps(D) * 32, 1)
    decode_stream_kernel(const DecodeParams p) {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  constexpr bool kFp8 = kKv != tile::kKvSame;
  static_assert(!kFp8 || D == 128, "fp8 rows of at least 8 chunks (the tile's swizzle)");
  constexpr int kKvBytes = kFp8 ? 1 : 2;
  using Elem = std::uint16_t;
  constexpr int kWarps = stream_warps(D);
  constexpr int kStages = kDecodeStreamStages;
  constexpr int kRows = kDecodeTileRows;
  constexpr int kCpr = D * kKvBytes / 16;  // 16-byte chunks per K/V row
  constexpr int kNT = D / 8;               // n-tiles of the output
  constexpr int kKS = D / 16;              // k-steps of Q Kᵀ
  constexpr std::uint32_t kTileBytes = kRows * D * kKvBytes;
  constexpr std::uint32_t kStageBytes = 2 * kTileBytes;

  extern __shared__ __align__(128) unsigned char smem[];
  decode_grid_dependency(p);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const std::uint32_t ring = arch::smem_addr(smem) + static_cast<std::uint32_t>(warp) * kStages *
                                                         kStageBytes;  // [stage][K, V][16][D]

  const std::int64_t items = static_cast<std::int64_t>(p.batch) * p.heads_kv * p.row_tiles;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kWarps;
  const Elem* kpool = static_cast<const Elem*>(p.k);
  const Elem* vpool = static_cast<const Elem*>(p.v);
  const std::uint64_t policy = arch::l2_evict_first_policy();  // the cache is streamed once

  const std::int32_t* table = p.block_table != nullptr ? p.block_table : p.page_indices;
  auto win_of = [&](int t) -> int { return stream_win_of(p, t); };
  // Per-lane parts of the chunk addressing (see `copy_kv_tile_in_page`).
  const int lane_r0 = lane / kCpr;
  const int lane_col = lane % kCpr;
  const std::int64_t row_stride = stream_row_stride<D, kKvBytes>(p);
  auto load_tile = [&](const StreamItem& it, int t, int stage, std::int64_t pid) {
    stream_load_tile<D, kKvBytes>(p, ring, kpool, vpool, lane_r0, lane_col, row_stride, policy, it,
                                  t, stage, pid);
  };

  // ---- scheduler: the warp's first two items; the producer's load cursor (see above) ----
  std::int64_t x_cur = static_cast<std::int64_t>(warp) * gridDim.x + blockIdx.x;
  std::uint32_t qa[kKS][4], qn[kKS][4];  // query fragments of the current and the next item
  StreamItem cur, nxt;
  stream_first_items<D, kFp8>(p, lane, items, stride, x_cur, cur, nxt, qa, qn);
  int ld_sel = 0, ld_t = 0, ld_win = 0;
  if constexpr (kVariant) {  // (the variant's items start at their window's first tile)
    ld_t = stream_first_tile<kVariant>(p, cur);
    ld_win = win_of(ld_t);
  }
  // page-id windows: the cursor's (`ld_win`) in `ld_pids`, the next item's in `nxt_pids`
  int ld_pids = stream_pid_window(p, table, lane, cur, ld_win);
  int nxt_pids = 0;
  bool nxt_ready = false;
  auto ensure_nxt = [&]() {
    if (!nxt_ready) {
      nxt_pids = stream_next_pids<kVariant>(p, table, lane, nxt, win_of);
      nxt_ready = true;
    }
  };
  // the cursor's first tile of the next item and its window (after `ld_t = 0`, `ld_win = 0`)
  auto nxt_first = [&]() {
    if constexpr (kVariant) {
      ld_t = stream_first_tile<kVariant>(p, nxt);
      ld_win = win_of(ld_t);
    }
  };
  auto normalize = [&]() {
    stream_normalize(cur, nxt, ld_sel, ld_t, ld_win, ld_pids, nxt_pids, ensure_nxt, nxt_first);
  };
  normalize();
  int ld_stage = 0;
  int loaded = 0;  // tiles copied so far (one commit group each), `computed` computed
  int computed = 0;
  auto issue = [&]() {  // the tile at the cursor, if any, then the cursor moves
    stream_issue<kStages>(p, table, lane, cur, nxt, ld_sel, ld_t, ld_win, ld_pids, ld_stage, loaded,
                          load_tile, normalize);
  };

#pragma unroll 1
  for (int st = 0; st < kStages - 1; ++st) issue();

  // ---- mainloop over the warp's items (each ending in its epilogue) ----
  const tile::LdmatrixLanes ldm(lane);  // ldmatrix lane addressing, as in the split kernel
  int stage = 0;
  StreamScores<kFp8, kVariant> scores;  // (the variant's window starts: set per item)
  if constexpr (kVariant) scores.set_map(p.scale, p.soft_cap);
#pragma unroll 1
  while (cur.tiles >= 0) {
    int lim[2];
    if constexpr (kFp8) stream_item_queries<D, kBF16, kVariant>(p, cur, qa, scores.s2);
    const int t_begin = stream_item_rows<kVariant>(p, lane, cur, lim, scores);
    float o_acc[kNT][4];
    stream_zero<D>(o_acc);
    math::OnlineSoftmax os[2];

#pragma unroll 1
    for (int t = t_begin; t < cur.tiles; ++t) {
      issue();
      stream_wait(loaded, computed);  // this tile's copies
      const std::uint32_t ks = ring + static_cast<std::uint32_t>(stage) * kStageBytes;
      stage = stage + 1 == kStages ? 0 : stage + 1;
      stream_tile<D, kBF16, kVariant, kKv>(p, qa, ks, t * kRows, ldm, lim, os, o_acc, scores);
      ensure_nxt();  // (after the first tile: the next item's fetch has arrived)
    }

    stream_store_rows<D, kFp8>(p, lane, cur, o_acc, os);  // ---- epilogue ----

    // ---- the next item becomes current; the one after it is fetched ----
    stream_next_item<D, kFp8>(p, lane, items, stride, x_cur, cur, nxt, qa, qn);
    nxt_ready = false;
    if (ld_sel == 1) {
      ld_sel = 0;
    } else if (ld_sel == 2) {  // the cursor waited for this item: on to the new next one
      ensure_nxt();
      ld_sel = 1;
      ld_t = 0;
      ld_pids = nxt_pids;
      ld_win = 0;
      nxt_first();
      if (ld_t >= nxt.tiles) ld_sel = 2;
    }
  }
  arch::cp_async_wait<0>();
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
