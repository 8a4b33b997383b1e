/// @file kernels/decode/split_prologue.cuh
/// @brief The scheduler and the prologue of the split decode kernel (internal): the CTA's shared
///        memory (`SplitSmem`), which (request, KV head, row tile, split) it takes (`SplitCta`),
///        the loads that start its critical chain (the speculative page ids of a warp's first
///        tiles, from `split_spec_t0`; the page count, the CSR base and the length:
///        `split_pages`, clamped by `split_length`), the token range of its split
///        (`split_window_start`, `split_range`), and the queries: loaded into registers before
///        the length is known (`split_load_queries`) and staged into shared memory once the CTA
///        has keys to read (`split_stage_queries`). Parts of the kernel's composition
///        (`decode_split_kv_kernel`), inlined there.
///
/// The parts keep the kernel's machine code as it was when their code was written in the kernel
/// (`scripts/cubin-diff.sh`): some take their values by value, others by reference, and some
/// declare their variables in a given order, because the register order that the compiler gives
/// their values, and so the machine code, depends on it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/decode_split.hpp"
#include "cuda/kernels/decode/common.cuh"
#include "cuda/kernels/decode/params.cuh"
#include "cuda/tile/fp8_kv.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// The scheduler's answer for one CTA: split `s` of row tile `mt` (query rows `row0` to
/// `row0 + rows_here` of the tile's `q_len × group` rows) of request `b`, KV head `hkv`.
struct SplitCta {
  int s;
  int hkv;
  int mt;
  int b;
  int row0;
  int rows_here;
};

/// The token where warp `warp`'s first tile starts in split `s` of the fixed split size (where
/// the speculative page-id loads assume it starts, before the length is known).
__device__ __forceinline__ std::uint32_t split_spec_t0(const DecodeParams& p, int s, int warp) {
  return static_cast<std::uint32_t>(s) * static_cast<std::uint32_t>(p.splits.split_size) +
         static_cast<std::uint32_t>(warp * kDecodeTileRows);
}

/// The split kernel's shared memory (`decode_smem_bytes`): the query tile `q_s` [row][D] (16-bit,
/// XOR-swizzled), then the body: the warps' cp.async rings (`pipe`) during the mainloop, reused
/// after it by the warp merge (`ow` [warp][row][kOw], `mw`, `lw` [warp][row]) and the published
/// split state of the cluster merge (`pub_o` [row][D], `pub_lse` [row], base 2), or by the
/// workspace merge (every split's LSE, then its weight, from the body's start: `st_w`
/// [split][row]; at the body's end the merged columns of the items, `acc_s` and `sum_s` [item],
/// and each row's max, `row_m`); after the body a ticket flag per CTA of a cluster group
/// (`is_last`) and each row's score factor over an fp8 cache (`row_s2`).
struct SplitSmem {
  std::uint16_t* q_s;
  std::uint16_t* pipe;
  float* ow;
  float* mw;
  float* lw;
  float* pub_o;
  float* pub_lse;
  float* st_w;
  float4* acc_s;
  float* sum_s;
  float* row_m;
  int* is_last;
  float* row_s2;
};

/// The `SplitSmem` pointers of the kernel for head dim `D`, pipeline depth `kStages` and K/V
/// elements of `kKvBytes` bytes, from the dynamic shared memory `smem` and its `body` (after the
/// query tile).
template <int D, int kStages, int kKvBytes>
__device__ __forceinline__ SplitSmem split_smem(unsigned char* smem, unsigned char* body) {
  constexpr int kRows = kDecodeTileRows;
  constexpr int kD4 = D / 4;  // float4 columns of a row
  constexpr std::int64_t kBodyBytes = decode_body_bytes(D, kStages, kKvBytes);
  SplitSmem m;
  m.q_s = reinterpret_cast<std::uint16_t*>(smem);
  m.pipe = reinterpret_cast<std::uint16_t*>(body);
  m.ow = reinterpret_cast<float*>(body);
  m.mw = m.ow + kDecodeWarps * kRows * decode_ow_stride(D);
  m.lw = m.mw + kDecodeWarps * kRows;
  m.pub_o = m.lw + kDecodeWarps * kRows;
  m.pub_lse = m.pub_o + kRows * D;
  m.st_w = reinterpret_cast<float*>(body);
  // the workspace merge's running sums: [item] float4 and weight sum, then [row] max
  constexpr std::int64_t kStateBytes = std::int64_t{kRows} * kD4 * 24;
  float* merge_state = reinterpret_cast<float*>(body + kBodyBytes - kStateBytes);
  m.acc_s = reinterpret_cast<float4*>(merge_state);
  m.sum_s = merge_state + 4 * kRows * kD4;
  m.row_m = m.sum_s + kRows * kD4;
  static_assert(kBodyBytes - kStateBytes >= std::int64_t{kMaxSplits} * kRows * 4,
                "every split's LSEs fit before the merged columns");
  m.is_last = reinterpret_cast<int*>(body + kBodyBytes);  // [cluster rank]
  m.row_s2 = reinterpret_cast<float*>(m.is_last + kDecodeMaxWsGroup);
  static_assert(kDecodeMaxCluster <= kDecodeMaxWsGroup, "a flag per CTA of a cluster");
  return m;
}

/// The CTA's coordinates from `blockIdx.x`: the splits (`S` per tile) of a tile are consecutive
/// blocks (a cluster when the merge runs in one), then the KV heads, the row tiles and the
/// requests.
__device__ __forceinline__ SplitCta split_schedule(const DecodeParams& p, std::int64_t S) {
  SplitCta c;
  unsigned bid = blockIdx.x;  // the grid has at most 2^31 - 1 CTAs
  c.s = static_cast<int>(bid % static_cast<unsigned>(S));
  bid /= static_cast<unsigned>(S);
  c.hkv = static_cast<int>(bid % static_cast<unsigned>(p.heads_kv));
  bid /= static_cast<unsigned>(p.heads_kv);
  c.mt = static_cast<int>(bid % static_cast<unsigned>(p.row_tiles));
  c.b = static_cast<int>(bid / static_cast<unsigned>(p.row_tiles));
  c.row0 = c.mt * kDecodeTileRows;
  c.rows_here = min(kDecodeTileRows, p.rows - c.row0);
  return c;
}

/// The request's page count (`pages`; its block-table row, or its CSR range of page ids from
/// `csr_base`: none when the range is invalid) and its length as stored (`len64`).
struct SplitPages {
  std::int64_t pages;
  std::int64_t csr_base;
  std::int64_t len64;
};

/// Loads `SplitPages` for the request of CTA `c`.
__device__ __forceinline__ SplitPages split_pages(const DecodeParams& p, const SplitCta& c) {
  SplitPages q;
  q.csr_base = 0;
  if (p.block_table != nullptr) {
    q.pages = p.block_table_stride;
  } else {
    q.csr_base = p.page_indptr[c.b];
    q.pages = static_cast<std::int64_t>(p.page_indptr[c.b + 1]) - q.csr_base;
    if (q.pages < 0 || q.csr_base < 0) q.pages = 0;  // an invalid range of page ids: no keys
    if (q.csr_base < 0) q.csr_base = 0;
  }
  q.len64 = p.seq_lens[c.b];
  return q;
}

/// The request's length, clamped to the pages it owns.
__device__ __forceinline__ std::int32_t split_length(const DecodeParams& p, std::int64_t len64,
                                                     std::int64_t pages) {
  if (len64 < 0) len64 = 0;
  if (len64 > pages * p.page_size) len64 = pages * p.page_size;
  return static_cast<std::int32_t>(len64);
}

/// The token range of split `s` of a request of `len` tokens whose splits cut [`w0`, `len`)
/// (empty when `s` is past the request's splits).
__device__ __forceinline__ TokenRange split_range(const DecodeParams& p, std::int32_t len, int w0,
                                                  int s) {
  TokenRange r = p.splits.range(len - w0, s);
  r.begin += w0;
  r.end += w0;
  return r;
}

/// Where the splits of a request of `len` tokens start: 0, or with a sliding window (`kVariant`)
/// the first row's window start rounded down to a tile (keys before it are never read; the rows'
/// own starts are masked in the scores).
template <bool kVariant>
__device__ __forceinline__ int split_window_start(const DecodeParams& p, std::int32_t len) {
  int w0 = 0;
  if constexpr (kVariant) {
    if (p.window_left >= 0) {
      const std::int64_t first = static_cast<std::int64_t>(len) - p.q_len - p.window_left;
      w0 = first > 0 ? static_cast<int>(first) & ~(kDecodeTileRows - 1) : 0;
    }
  }
  return w0;
}

/// Query chunk `ch` of the CTA's tile (16 bytes: 8 elements of a row; zero beyond the tile's
/// rows) into `q` (members `x`, `y`, `z`, `w`).
template <int D, class Words>
__device__ __forceinline__ void split_query_chunk(const DecodeParams& p, const SplitCta& c, int ch,
                                                  Words& q) {
  using Elem = std::uint16_t;
  constexpr int kCpr = D / 8;  // 16-byte chunks per row
  const int r = ch / kCpr;
  const int col = ch % kCpr;
  q.x = q.y = q.z = q.w = 0;
  if (r < c.rows_here) {
    const int rg = c.row0 + r;
    const int qi = rg / p.group;
    const int hq = c.hkv * p.group + rg % p.group;
    const Elem* src = static_cast<const Elem*>(p.q) + c.b * p.q_stride_b + qi * p.q_stride_t +
                      hq * p.q_stride_h + col * 8;
    if (p.q_vec) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(src));
      q.x = v.x;
      q.y = v.y;
      q.z = v.z;
      q.w = v.w;
    } else {
      Elem e[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) e[j] = src[j];
      q.x = e[0] | (e[1] << 16);
      q.y = e[2] | (e[3] << 16);
      q.z = e[4] | (e[5] << 16);
      q.w = e[6] | (e[7] << 16);
    }
  }
}

/// The 16-byte chunks of the CTA's query tile that thread `tid` loads (chunks `tid`,
/// `tid + threads`, ...; rows beyond the tile are zero) into `qreg`: they do not depend on the
/// length, so they load while it arrives.
template <int D, int kQChunks>
__device__ __forceinline__ void split_load_queries(const DecodeParams& p, const SplitCta& c,
                                                   const int& tid, uint4 (&qreg)[kQChunks]) {
  constexpr int kThreads = kDecodeWarps * 32;
  // the query tile loads whole chunks per thread, and the fragments span whole 16-column k-steps
  static_assert(D % 64 == 0 && (kDecodeTileRows * (D / 8)) % kThreads == 0,
                "head dims of whole 64 columns");
  static_assert(kQChunks == kDecodeTileRows * (D / 8) / kThreads, "every chunk of the tile");
  if constexpr (kQChunks == 1) {
    // (one chunk per thread: the words in an array, for the register order, and so the machine
    // code, of the load when it was written in the kernel)
    std::uint32_t q[4];
    struct {
      std::uint32_t &x, &y, &z, &w;
    } r{q[0], q[1], q[2], q[3]};
    split_query_chunk<D>(p, c, tid, r);
    qreg[0] = make_uint4(q[0], q[1], q[2], q[3]);
  } else {
#pragma unroll
    for (int i = 0; i < kQChunks; ++i) split_query_chunk<D>(p, c, tid + i * kThreads, qreg[i]);
  }
}

/// Stores thread `tid`'s query chunks `qreg` into `q_s` as XOR-swizzled 16-byte chunks [row][D].
/// Over an fp8 cache (`kFp8`) as f16 in the column order of `tile::attention_tile_fp8`, each
/// row's factor on its dot products in `row_s2` [row]: the head's K scale over the row's
/// power-of-two scaling, with the score scale folded in (plain) or alone, for the variant's
/// scores to map the true dot product (soft cap, window).
template <int D, bool kBF16, bool kFp8, bool kVariant, int kQChunks>
__device__ __forceinline__ void split_stage_queries(const DecodeParams& p, const int& tid,
                                                    const int& hkv, uint4 (&qreg)[kQChunks],
                                                    std::uint16_t* q_s, float* row_s2) {
  constexpr int kThreads = kDecodeWarps * 32;
  constexpr int kCpr = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = 0; i < kQChunks; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kCpr;
    const int col = c % kCpr;
    if constexpr (kFp8) {
      const float f = tile::queries_to_f16<kBF16, kCpr>(qreg[i]);  // 2^k: the row's scaling
      qreg[i] = tile::permute_q_columns(qreg[i], col);
      if (col == 0) {
        if constexpr (kVariant)
          row_s2[r] = p.k_scale.at(hkv) / f;
        else
          row_s2[r] = p.s2_scale * p.k_scale.at(hkv) / f;
      }
    }
    *reinterpret_cast<uint4*>(q_s + r * D + ((col ^ (r & 7)) << 3)) = qreg[i];
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
