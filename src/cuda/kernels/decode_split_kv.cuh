/// @file decode_split_kv.cuh
/// @brief The split-KV decode kernel (internal): one CTA per (request, KV head, row tile, split).
///
/// - The CTA's query rows (`q_len × group` rows of one KV head, up to 16) form the M of
///   m16n8k16 tensor-core MMAs, so each K/V byte is read once for the whole GQA group.
/// - Each of the 4 warps streams its own 16-token tiles of the split (tiles w, w+4, ...) through
///   a 3-stage cp.async pipeline of 16-byte chunks into XOR-swizzled shared memory, computes
///   `S = Q Kᵀ` and `O += P V` on tensor cores and keeps its own online softmax
///   (`math::OnlineSoftmax`, base 2) for its two rows per thread.
/// - The warps' states are merged in warp order in shared memory; a request with one split
///   writes the output directly, otherwise the CTA writes a partial state (fp32 `o`, base-2
///   `lse`) to the workspace and takes an integer ticket; the last CTA of a (request, KV head,
///   row tile) merges all splits in split order (max-subtracted, empty splits skipped) and
///   resets the ticket.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/kernels/decode_mma.cuh"
#include "cuda/kernels/decode_params.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// Shared-memory bytes of the decode kernel for head dim `D` and `max_splits` splits:
/// queries, then the pipeline (aliased by the merge and combine scratch) and a flag.
__host__ __device__ constexpr std::int64_t decode_smem_bytes(int D, int max_splits) {
  const std::int64_t q_bytes = std::int64_t{kDecodeTileRows} * D * 2;
  const std::int64_t pipe =
      std::int64_t{kDecodeWarps} * kDecodeStages * 2 * kDecodeTileRows * D * 2;
  const std::int64_t merge =
      std::int64_t{kDecodeWarps} * kDecodeTileRows * (D + 2) * 4 + kDecodeTileRows * 8 * 4;
  const std::int64_t combine = std::int64_t{kDecodeTileRows} * (2 * max_splits + 4) * 4;
  std::int64_t body = pipe > merge ? pipe : merge;
  body = body > combine ? body : combine;
  return q_bytes + body + 16;
}

/// Stores one fp32 value as `dt` at element `off` of `base`.
__device__ __forceinline__ void store_as(void* base, DType dt, std::int64_t off, float x) {
  switch (dt) {
    case DType::kF32:
      static_cast<float*>(base)[off] = x;
      break;
    case DType::kF16:
      static_cast<half_t*>(base)[off] = from_float<half_t>(x);
      break;
    default:
      static_cast<bfloat16_t*>(base)[off] = from_float<bfloat16_t>(x);
      break;
  }
}

/// Split-KV decode kernel for head dim `D`; `kBF16` selects bf16 (else f16) queries and KV.
template <int D, bool kBF16>
__global__ void __launch_bounds__(kDecodeWarps * 32, kDecodeMinBlocks)
    decode_split_kv_kernel(const DecodeParams p) {
  using Elem = std::uint16_t;
  constexpr int kRows = kDecodeTileRows;
  constexpr int kThreads = kDecodeWarps * 32;
  constexpr int kCpr = D / 8;  // 16-byte chunks per row
  constexpr int kChunksPerLane = kRows * kCpr / 32;
  constexpr int kTileElems = kRows * D;  // one K or V tile of 16 tokens
  constexpr int kNT = D / 8;             // n-tiles of the output

  extern __shared__ __align__(128) unsigned char smem[];
  Elem* q_s = reinterpret_cast<Elem*>(smem);
  unsigned char* body = smem + kRows * D * 2;
  Elem* pipe = reinterpret_cast<Elem*>(body);

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  // ---- which (request, KV head, row tile, split) ----
  const std::int64_t S = p.splits.max_splits;
  std::int64_t bid = blockIdx.x;
  const int s = static_cast<int>(bid % S);
  bid /= S;
  const int hkv = static_cast<int>(bid % p.heads_kv);
  bid /= p.heads_kv;
  const int mt = static_cast<int>(bid % p.row_tiles);
  const int b = static_cast<int>(bid / p.row_tiles);

  // ---- queries → registers first (they do not depend on the lengths) ----
  const int row0 = mt * kRows;
  const int rows_here = min(kRows, p.rows - row0);
  constexpr int kQPerThread = kRows * D / kThreads;
  Elem qreg[kQPerThread];
  {
    const Elem* q = static_cast<const Elem*>(p.q);
#pragma unroll
    for (int i = 0; i < kQPerThread; ++i) {
      const int e = tid + i * kThreads;
      const int r = e / D;
      const int d = e % D;
      qreg[i] = 0;
      if (r < rows_here) {
        const int rg = row0 + r;
        const int qi = rg / p.group;
        const int hq = hkv * p.group + rg % p.group;
        qreg[i] = q[b * p.q_stride_b + qi * p.q_stride_t + hq * p.q_stride_h + d];
      }
    }
  }

  // ---- speculative page id of this CTA's first tile (block table, fixed split size: the split
  //      start does not depend on the length), loaded alongside the length ----
  std::int64_t spec_pid = -1;
  const std::int64_t spec_t0 =
      static_cast<std::int64_t>(s) * p.splits.split_size + static_cast<std::int64_t>(warp) * kRows;
  if (p.block_table != nullptr && p.splits.policy == SplitPolicy::kFixedSize &&
      p.page_size % kRows == 0 && spec_t0 / p.page_size < p.block_table_stride)
    spec_pid = p.block_table[b * p.block_table_stride + spec_t0 / p.page_size];

  // ---- length, clamped to the pages the request owns ----
  std::int64_t pages;
  std::int64_t csr_base = 0;
  if (p.block_table != nullptr) {
    pages = p.block_table_stride;
  } else {
    csr_base = p.page_indptr[b];
    pages = static_cast<std::int64_t>(p.page_indptr[b + 1]) - csr_base;
    if (pages < 0) pages = 0;
  }
  std::int64_t len64 = p.seq_lens[b];
  if (len64 < 0) len64 = 0;
  if (len64 > pages * p.page_size) len64 = pages * p.page_size;
  const std::int32_t len = static_cast<std::int32_t>(len64);
  const int n_splits = p.splits.splits_for(len);
  if (s >= n_splits) return;
  const TokenRange range = p.splits.range(len, s);

  // ---- queries → shared, XOR-swizzled 16-byte chunks (rows beyond the tile are zero) ----
#pragma unroll
  for (int i = 0; i < kQPerThread; ++i) {
    const int e = tid + i * kThreads;
    const int r = e / D;
    const int d = e % D;
    const int c = d >> 3;
    q_s[r * D + ((c ^ (r & 7)) << 3) + (d & 7)] = qreg[i];
  }

  // ---- per-thread row limits (exclusive token end) for rows lane/4 and lane/4 + 8 ----
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = (lane >> 2) + 8 * h;
    if (r < rows_here) {
      const int qi = (row0 + r) / p.group;
      const int e = len - p.q_len + qi + 1;
      lim[h] = min(range.end, e);
    } else {
      lim[h] = 0;
    }
  }
  __syncthreads();

  // ---- this warp's tiles of the split ----
  const int n_tiles = (range.end - range.begin + kRows - 1) / kRows;
  const int my_tiles = n_tiles > warp ? (n_tiles - warp + kDecodeWarps - 1) / kDecodeWarps : 0;
  Elem* kbuf = pipe + static_cast<std::int64_t>(warp) * kDecodeStages * 2 * kTileElems;
  const Elem* kpool = static_cast<const Elem*>(p.k);
  const Elem* vpool = static_cast<const Elem*>(p.v);
  const bool tile_in_page = (p.page_size % kRows) == 0;

  auto page_id = [&](std::int64_t pidx) -> std::int64_t {
    std::int64_t id = p.block_table != nullptr ? p.block_table[b * p.block_table_stride + pidx]
                                               : p.page_indices[csr_base + pidx];
    if (id < 0) id = 0;
    if (id >= p.num_pages) id = p.num_pages - 1;
    return id;
  };
  auto in_page = [&](std::int64_t slot) -> std::int64_t {
    return p.layout_hnd ? (static_cast<std::int64_t>(hkv) * p.page_size + slot) * D
                        : (slot * p.heads_kv + hkv) * static_cast<std::int64_t>(D);
  };
  // Page id of this warp's tile `it` when a tile lies in one page (else unused).
  auto tile_pid = [&](int it) -> std::int64_t {
    const int t0 = range.begin + (warp + kDecodeWarps * it) * kRows;
    if (!tile_in_page || it >= my_tiles) return 0;
    if (it == 0 && spec_pid >= 0 && t0 == spec_t0)
      return spec_pid < p.num_pages ? spec_pid : p.num_pages - 1;
    return page_id(t0 / p.page_size);
  };
  // Per-lane constants of the chunk addressing: lane l copies column `l % kCpr` of rows
  // `l / kCpr + i · kRowStep` (kCpr ≤ 32 divides 32), so inside one page its source offsets are
  // one base plus compile-time multiples of the row stride.
  constexpr int kRowStep = 32 / kCpr;
  const int lane_r0 = lane / kCpr;
  const int lane_col = lane % kCpr;
  const std::int64_t row_stride =
      p.layout_hnd ? std::int64_t{D} : static_cast<std::int64_t>(p.heads_kv) * D;
  auto load_tile = [&](int it, int stage, std::int64_t pid) {
    const int t0 = range.begin + (warp + kDecodeWarps * it) * kRows;
    Elem* kd = kbuf + stage * 2 * kTileElems;
    Elem* vd = kd + kTileElems;
    const std::int64_t tile_page_base = pid * p.page_elems;
    const int slot0 = tile_in_page ? t0 % p.page_size : 0;
#if ATTNSTATE_DECODE_FAST_ADDR
    if (tile_in_page) {
      const std::int64_t base = tile_page_base + in_page(slot0 + lane_r0) + lane_col * 8;
#pragma unroll
      for (int i = 0; i < kChunksPerLane; ++i) {
        const int r = lane_r0 + i * kRowStep;
        const bool valid = t0 + r < range.end;
        const std::int64_t off = valid ? base + i * kRowStep * row_stride : 0;
        const int sw = (r * kCpr + (lane_col ^ (r & 7))) * 8;
        cp_async_16(smem_addr(kd + sw), kpool + off, valid ? 16 : 0);
        cp_async_16(smem_addr(vd + sw), vpool + off, valid ? 16 : 0);
      }
      return;
    }
#endif
#pragma unroll
    for (int i = 0; i < kChunksPerLane; ++i) {
      const int c = lane + 32 * i;
      const int r = c / kCpr;
      const int col = c % kCpr;
      const int t = t0 + r;
      const bool valid = t < range.end;
      std::int64_t off = 0;
      if (valid) {
        if (tile_in_page) {
          off = tile_page_base + in_page(slot0 + r);
        } else {
          off = page_id(t / p.page_size) * p.page_elems + in_page(t % p.page_size);
        }
        off += col * 8;
      }
      const int sw = (r * kCpr + (col ^ (r & 7))) * 8;
      cp_async_16(smem_addr(kd + sw), kpool + off, valid ? 16 : 0);
      cp_async_16(smem_addr(vd + sw), vpool + off, valid ? 16 : 0);
    }
  };

  float o_acc[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.f;
  math::OnlineSoftmax os[2];

#pragma unroll
  for (int st = 0; st < kDecodeStages - 1; ++st) {
    if (st < my_tiles) load_tile(st, st, tile_pid(st));
    cp_async_commit();
  }
  // The page id of the next tile to load is fetched one iteration ahead (off the critical path).
  std::int64_t pid_next = tile_pid(kDecodeStages - 1);

  for (int it = 0; it < my_tiles; ++it) {
    const int nxt = it + kDecodeStages - 1;
    if (nxt < my_tiles) load_tile(nxt, nxt % kDecodeStages, pid_next);
    pid_next = tile_pid(nxt + 1);
    cp_async_commit();
    cp_async_wait<kDecodeStages - 1>();
    __syncwarp();

    const int stage = it % kDecodeStages;
    const Elem* ks = kbuf + stage * 2 * kTileElems;
    const Elem* vs = ks + kTileElems;
    const int t0 = range.begin + (warp + kDecodeWarps * it) * kRows;

    // S = Q Kᵀ : 16 rows × 16 tokens (two n-tiles of 8 tokens).
    float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[4], bk[4];
      {
        const int r = lane & 15;
        const int c = kk * 2 + (lane >> 4);
        ldmatrix_x4(a, smem_addr(q_s + r * D + ((c ^ (r & 7)) << 3)));
      }
      {
        const int mi = lane >> 3;
        const int r = ((mi >> 1) << 3) + (lane & 7);
        const int c = kk * 2 + (mi & 1);
        ldmatrix_x4(bk, smem_addr(ks + r * D + ((c ^ (r & 7)) << 3)));
      }
      mma_16816<kBF16>(sc[0], a, bk[0], bk[1]);
      mma_16816<kBF16>(sc[1], a, bk[2], bk[3]);
    }

    // Online softmax over the tile (base 2), rows lane/4 (h = 0) and lane/4 + 8 (h = 1).
    float pr[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float bm = math::neg_inf();
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = t0 + j * 8 + 2 * (lane & 3) + e;
          float v = sc[j][2 * h + e] * p.s2_scale;
          if (t >= lim[h]) v = math::neg_inf();
          sc[j][2 * h + e] = v;
          bm = math::nan_max(bm, v);
        }
      }
      bm = math::nan_max(bm, __shfl_xor_sync(0xffffffffu, bm, 1));
      bm = math::nan_max(bm, __shfl_xor_sync(0xffffffffu, bm, 2));
      const float alpha = os[h].rescale(bm);
      // Multiplying by 1 is the identity: skip the rescale when no row of the warp's max moved
      // (the common case after the first tiles), bitwise the same result.
      if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          o_acc[j][2 * h] *= alpha;
          o_acc[j][2 * h + 1] *= alpha;
        }
      }
      float psum = 0.f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = os[h].prob(sc[j][2 * h + e]);
          pr[j][2 * h + e] = pv;
          psum += pv;
        }
      }
      os[h].add(psum);
    }

    // O += P V : P (16 × 16 tokens) from the score registers, V via transposed ldmatrix.
    std::uint32_t pa[4];
    pa[0] = pack2<kBF16>(pr[0][0], pr[0][1]);
    pa[1] = pack2<kBF16>(pr[0][2], pr[0][3]);
    pa[2] = pack2<kBF16>(pr[1][0], pr[1][1]);
    pa[3] = pack2<kBF16>(pr[1][2], pr[1][3]);
#pragma unroll
    for (int jj = 0; jj < D / 16; ++jj) {
      std::uint32_t bv[4];
      const int r = lane & 15;
      const int c = jj * 2 + (lane >> 4);
      ldmatrix_x4_trans(bv, smem_addr(vs + r * D + ((c ^ (r & 7)) << 3)));
      mma_16816<kBF16>(o_acc[2 * jj], pa, bv[0], bv[1]);
      mma_16816<kBF16>(o_acc[2 * jj + 1], pa, bv[2], bv[3]);
    }
    __syncwarp();
  }
  cp_async_wait<0>();

  // ---- merge the 4 warps' states (fixed warp order) ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = os[h].l;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    os[h].l = l;
  }
  __syncthreads();                              // every warp is done with the pipeline buffers
  float* ow = reinterpret_cast<float*>(body);   // [warp][row][D]
  float* mw = ow + kDecodeWarps * kRows * D;    // [warp][row]
  float* lw = mw + kDecodeWarps * kRows;        // [warp][row]
  float* fac = lw + kDecodeWarps * kRows;       // [warp][row]
  float* row_inv = fac + kDecodeWarps * kRows;  // [row]
  float* row_lse = row_inv + kRows;             // [row] base 2
  {
    float* mine = ow + warp * kRows * D;
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const int d = j * 8 + 2 * (lane & 3);
      const int r = lane >> 2;
      mine[r * D + d] = o_acc[j][0];
      mine[r * D + d + 1] = o_acc[j][1];
      mine[(r + 8) * D + d] = o_acc[j][2];
      mine[(r + 8) * D + d + 1] = o_acc[j][3];
    }
    if ((lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (lane >> 2) + 8 * h;
        mw[warp * kRows + r] = os[h].m;
        lw[warp * kRows + r] = os[h].l;
      }
    }
  }
  __syncthreads();
  if (tid < kRows) {
    const int r = tid;
    float m = math::neg_inf();
    for (int w = 0; w < kDecodeWarps; ++w) m = math::nan_max(m, mw[w * kRows + r]);
    float sum = 0.f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float mwv = mw[w * kRows + r];
      const float f = math::is_empty_lse(mwv) ? 0.f : math::merge_weight(LseBase::kBase2, mwv, m);
      fac[w * kRows + r] = f;
      sum += f * lw[w * kRows + r];
    }
    const math::MergeResult res = math::merge_finalize(LseBase::kBase2, m, sum);
    row_inv[r] = res.inv_sum;
    row_lse[r] = res.lse;
  }
  __syncthreads();

  const bool single = n_splits == 1;
  const std::int64_t tile_id = (static_cast<std::int64_t>(b) * p.heads_kv + hkv) * p.row_tiles + mt;
  const std::int64_t part0 = (tile_id * S + s) * kRows;
  for (int e = tid; e < rows_here * D; e += kThreads) {
    const int r = e / D;
    const int d = e % D;
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      if (!math::is_empty_lse(mw[w * kRows + r]))
        acc += fac[w * kRows + r] * ow[(w * kRows + r) * D + d];
    }
    const float o = acc * row_inv[r];
    if (single) {
      const int rg = row0 + r;
      const std::int64_t token = static_cast<std::int64_t>(b) * p.q_len + rg / p.group;
      const std::int64_t hq = static_cast<std::int64_t>(hkv) * p.group + rg % p.group;
      store_as(p.out_o, p.out_dtype, token * p.o_stride_token + hq * p.o_stride_head + d, o);
      if (d == 0)
        p.out_lse[token * p.lse_stride_token + hq * p.lse_stride_head] =
            math::convert_lse(row_lse[r], LseBase::kBase2, p.out_base);
    } else {
      p.ws_o[(part0 + r) * D + d] = o;
      if (d == 0) p.ws_lse[part0 + r] = row_lse[r];
    }
  }
  if (single || p.skip_combine) return;

  // ---- ticket: the last CTA of this (request, KV head, row tile) merges the splits ----
  int* is_last = reinterpret_cast<int*>(smem + decode_smem_bytes(D, static_cast<int>(S)) - 16);
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int ticket = atomicAdd(p.tickets + tile_id, 1);
    const int last = ticket == n_splits - 1;
    if (last) p.tickets[tile_id] = 0;
    *is_last = last;
  }
  __syncthreads();
  if (!*is_last) return;
  __threadfence();

  const std::int64_t split0 = tile_id * S * kRows;  // partial (split 0, row 0)
  float* lse_s = reinterpret_cast<float*>(body);    // [row][n_splits]
  float* w_s = lse_s + kRows * n_splits;            // [row][n_splits]
  float* c_inv = w_s + kRows * n_splits;            // [row]
  float* c_lse = c_inv + kRows;                     // [row]
  __syncthreads();  // the warp-merge scratch above is dead; reuse it
  for (int r = warp; r < rows_here; r += kDecodeWarps) {
    float m = math::neg_inf();
    for (int sp = lane; sp < n_splits; sp += 32) {
      const float l = __ldcg(p.ws_lse + split0 + static_cast<std::int64_t>(sp) * kRows + r);
      lse_s[r * n_splits + sp] = l;
      m = math::nan_max(m, l);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = math::nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.f;
    for (int sp = lane; sp < n_splits; sp += 32) {
      const float l = lse_s[r * n_splits + sp];
      const float w = math::is_empty_lse(l) ? 0.f : math::merge_weight(LseBase::kBase2, l, m);
      w_s[r * n_splits + sp] = w;
      sum += w;
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      const math::MergeResult res = math::merge_finalize(LseBase::kBase2, m, sum);
      c_inv[r] = res.inv_sum;
      c_lse[r] = res.lse;
    }
  }
  __syncthreads();
  for (int e = tid; e < rows_here * (D / 4); e += kThreads) {
    const int r = e / (D / 4);
    const int d4 = e % (D / 4);
    const float4* src = reinterpret_cast<const float4*>(p.ws_o + (split0 + r) * D) + d4;
    const std::int64_t step = std::int64_t{kRows} * D / 4;  // float4s between splits
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    constexpr int kU = 16;  // loads in flight per thread; the sum stays in split order
    for (int s0 = 0; s0 < n_splits; s0 += kU) {
      float4 v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (s0 + u < n_splits) v[u] = __ldcg(src + (s0 + u) * step);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int sp = s0 + u;
        if (sp < n_splits && !math::is_empty_lse(lse_s[r * n_splits + sp])) {
          const float w = w_s[r * n_splits + sp];
          acc.x += w * v[u].x;
          acc.y += w * v[u].y;
          acc.z += w * v[u].z;
          acc.w += w * v[u].w;
        }
      }
    }
    const float inv = c_inv[r];
    const int rg = row0 + r;
    const std::int64_t token = static_cast<std::int64_t>(b) * p.q_len + rg / p.group;
    const std::int64_t hq = static_cast<std::int64_t>(hkv) * p.group + rg % p.group;
    const std::int64_t ob = token * p.o_stride_token + hq * p.o_stride_head + d4 * 4;
    store_as(p.out_o, p.out_dtype, ob + 0, acc.x * inv);
    store_as(p.out_o, p.out_dtype, ob + 1, acc.y * inv);
    store_as(p.out_o, p.out_dtype, ob + 2, acc.z * inv);
    store_as(p.out_o, p.out_dtype, ob + 3, acc.w * inv);
    if (d4 == 0)
      p.out_lse[token * p.lse_stride_token + hq * p.lse_stride_head] =
          math::convert_lse(c_lse[r], LseBase::kBase2, p.out_base);
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
