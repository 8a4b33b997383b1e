/// @file kernels/mla/loader.cuh
/// @brief The scheduler, the prologue and the loads of the MLA decode kernel (internal): which
///        (request, row tile, split) a CTA takes (`MlaCta`), its shared memory (`MlaSmem`), the
///        request's pages and clamped length (`mla_length`), the query tile's copies
///        (`mla_load_queries`), a K/V tile's copies (`mla_load_tile`: both parts of each token
///        into one row of 576 bf16 columns, or the stored bytes of an fp8 part into a staging
///        row) and the fp8 conversion in shared memory (`mla_convert_tile`). Parts of
///        `mla_decode_kernel`, inlined there.
///
/// Rows in shared memory (a query row or a token) are 576 bf16 columns (72 chunks of 16 bytes:
/// 64 latent, then 8 rotary), chunk `c` of row `r` stored at `c ^ (r & 7)` (the swizzle of the
/// decode's tiles, `tile::LdmatrixLanes`), so the tensor-core fragments load without bank
/// conflicts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/arch/memory.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/paged_kv.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// One CTA's work: split `s` of row tile `mt` (request rows `row0` to `row0 + rows_here`) of
/// request `b`, and the request's page table (its CSR base, or its block-table row).
struct MlaCta {
  int s;
  int mt;
  int b;
  int row0;
  int rows_here;
  std::int64_t csr_base;
  std::int64_t pages;
};

/// The CTA's coordinates from `blockIdx.x` (the splits of a tile consecutive, then the row tiles,
/// then the requests) and its request's page range (none when a CSR range is invalid).
__device__ __forceinline__ MlaCta mla_schedule(const MlaParams& p) {
  MlaCta c;
  const unsigned S = static_cast<unsigned>(p.splits.max_splits);
  unsigned bid = blockIdx.x;  // the grid has at most 2^31 - 1 CTAs
  c.s = static_cast<int>(bid % S);
  bid /= S;
  c.mt = static_cast<int>(bid % static_cast<unsigned>(p.row_tiles));
  c.b = static_cast<int>(bid / static_cast<unsigned>(p.row_tiles));
  c.row0 = c.mt * kMlaTileRows;
  c.rows_here = min(kMlaTileRows, p.rows - c.row0);
  c.csr_base = 0;
  if (p.block_table != nullptr) {
    c.pages = p.block_table_stride;
  } else {
    c.csr_base = p.page_indptr[c.b];
    c.pages = static_cast<std::int64_t>(p.page_indptr[c.b + 1]) - c.csr_base;
    if (c.pages < 0 || c.csr_base < 0) c.pages = 0;  // an invalid range of page ids: no keys
    if (c.csr_base < 0) c.csr_base = 0;
  }
  return c;
}

/// The request's length, clamped to the pages it owns.
__device__ __forceinline__ std::int32_t mla_length(const MlaParams& p, const MlaCta& c) {
  std::int64_t len = p.seq_lens[c.b];
  if (len < 0) len = 0;
  if (len > c.pages * p.page_size) len = c.pages * p.page_size;
  return static_cast<std::int32_t>(len);
}

/// The shared memory of the kernel over a cache of `kKv` (`tile::Fp8Kv`): the query tile `q`
/// [64 rows], the K/V stages `kv` [stage][32 tokens] (bf16 rows, swizzled), over an fp8 cache the
/// stored bytes `raw` [stage][32 tokens][576 bytes: 512 latent, 64 rotary when fp8], the score
/// exchange `s_x` [row group][16 rows][32 keys] (fp32) and the rows' base-2 LSEs `lse` [64]; the
/// epilogue's normalised `o` [64][512] (fp32) over the query tile and the stages, the ticket flag
/// `is_last`, and with block scales (`kBlock`) each thread's 4 scales of its token `bscale`
/// [stage][thread][4] (after the rest: the other offsets do not move).
struct MlaSmem {
  unsigned char* q;
  unsigned char* kv;
  unsigned char* raw;
  float* s_x;
  float* lse;
  float* o;
  int* is_last;
  float* bscale;
};

template <int kKv, bool kBlock = false>
__device__ __forceinline__ MlaSmem mla_smem(unsigned char* smem) {
  constexpr int kStageBytes = kMlaTileKeys * kMlaRowBytes;
  constexpr int kRawStageBytes = kKv == tile::kKvSame ? 0 : kMlaTileKeys * kMlaHeadDim;
  MlaSmem m;
  m.q = smem;
  m.kv = m.q + kMlaTileRows * kMlaRowBytes;
  m.raw = m.kv + kMlaStages * kStageBytes;
  m.s_x = reinterpret_cast<float*>(m.raw + kMlaStages * kRawStageBytes);
  m.lse = m.s_x + kMlaTileRows * kMlaTileKeys;
  m.is_last = reinterpret_cast<int*>(m.lse + kMlaTileRows);
  m.bscale = kBlock ? reinterpret_cast<float*>(m.is_last + 4) : nullptr;
  m.o = reinterpret_cast<float*>(smem);
  return m;
}

/// Shared-memory byte offset of chunk `c` of row `r` of a swizzled tile.
__device__ __forceinline__ std::uint32_t mla_chunk(int r, int c) {
  return static_cast<std::uint32_t>(r * kMlaRowBytes + ((c ^ (r & 7)) << 4));
}

/// The row-swizzled layout of the mma.sync kernel's tiles (`mla_chunk`).
struct MlaRowLayout {
  __device__ static __forceinline__ std::uint32_t at(int r, int c) { return mla_chunk(r, c); }
};

/// Copies the CTA's query rows into the query tile at `q_s` (shared address; chunk `c` of row `r`
/// at `Layout::at(r, c)`) with the CTA's `kThreads` threads: row `r` is head `(row0 + r) % group`
/// of token `(row0 + r) / group`, its 64 latent chunks from `q_nope`, its 8 rotary ones from
/// `q_pe`; rows past the request's are zero-filled (a tile of `kRows` rows).
template <int kThreads = kMlaThreads, class Layout = MlaRowLayout, int kRows = kMlaTileRows>
__device__ __forceinline__ void mla_load_queries(const MlaParams& p, const MlaCta& c, int tid,
                                                 std::uint32_t q_s) {
  constexpr int kChunks = kRows * kMlaRowChunks;
#pragma unroll 1
  for (int i = tid; i < kChunks; i += kThreads) {
    const int r = i / kMlaRowChunks;
    const int col = i % kMlaRowChunks;
    const int rg = c.row0 + r;
    const bool valid = r < c.rows_here;
    const int t = valid ? rg / p.group : 0;
    const int h = valid ? rg % p.group : 0;
    const std::uint16_t* src =
        col < kMlaLatentChunks
            ? p.q_nope + c.b * p.qn_stride_b + t * p.qn_stride_t + h * p.qn_stride_h + col * 8
            : p.q_pe + c.b * p.qp_stride_b + t * p.qp_stride_t + h * p.qp_stride_h +
                  (col - kMlaLatentChunks) * 8;
    arch::cp_async_16_zfill(q_s + Layout::at(r, col), src, valid ? 16 : 0);
  }
}

/// The page holding token `pos` of the CTA's request (one page-table read; the id clamped to the
/// pool), apart from `mla_slot_parts` so that a loop can issue a tile's reads ahead of its copies.
__device__ __forceinline__ std::int64_t mla_token_page(const MlaParams& p, const MlaCta& c,
                                                       int pos) {
  const std::int64_t pidx = pos / p.page_size;
  const std::int64_t id = p.block_table != nullptr
                              ? p.block_table[c.b * p.block_table_stride + pidx]
                              : p.page_indices[c.csr_base + pidx];
  return tile::clamp_page(id, p.num_pages);
}

/// The stored rows of slot `slot` of page `page`: its latent part `ckv`, its rotary part `kpe`
/// and (when asked) its block scales `*bscale`.
__device__ __forceinline__ void mla_slot_parts(const MlaParams& p, std::int64_t page,
                                               std::int64_t slot, const unsigned char*& ckv,
                                               const unsigned char*& kpe,
                                               const unsigned char** bscale = nullptr) {
  ckv = p.ckv + page * p.ckv_page_bytes + slot * p.ckv_token_bytes;
  kpe = p.kpe + page * p.kpe_page_bytes + slot * p.kpe_token_bytes;
  if (bscale != nullptr)
    *bscale = p.ckv_bscale + page * p.bscale_page_bytes + slot * p.bscale_token_bytes;
}

/// The stored rows of token `pos` of the CTA's request (one page-table read): `mla_slot_parts`
/// of its page and slot.
__device__ __forceinline__ void mla_token_parts(const MlaParams& p, const MlaCta& c, int pos,
                                                const unsigned char*& ckv,
                                                const unsigned char*& kpe,
                                                const unsigned char** bscale = nullptr) {
  const std::int64_t slot = pos % p.page_size;  // (beside the page's division: one of both)
  mla_slot_parts(p, mla_token_page(p, c, pos), slot, ckv, kpe, bscale);
}

/// Copies the K/V tile of the keys from `t0` (those at or past `end` zero-filled) into stage
/// `kv_s` (bf16 rows; shared address) or, for an fp8 part, its stored bytes into the staging
/// rows at `raw_s`: thread `tid` copies token `tid / 8`, its chunks `tid % 8 + 8 i`, after one
/// page-table read; with block scales (`kBlock`) also the token's 4 scales, into its own slot
/// at `bscale_s` (zero for keys at or past `end`).
template <int kKv, bool kBlock = false>
__device__ __forceinline__ void mla_load_tile(const MlaParams& p, const MlaCta& c, int tid, int t0,
                                              int end, std::uint32_t kv_s, std::uint32_t raw_s,
                                              std::uint64_t policy, std::uint32_t bscale_s = 0) {
  const int k = tid >> 3;
  const int j = tid & 7;
  const int pos = t0 + k;
  const bool valid = pos < end;
  const unsigned char* ckv = p.ckv;
  const unsigned char* kpe = p.kpe;
  const unsigned char* bs = p.ckv_bscale;
  if (valid) mla_token_parts(p, c, pos, ckv, kpe, kBlock ? &bs : nullptr);
  const int bytes = valid ? 16 : 0;
  if constexpr (kBlock) tile::kv_copy_16(bscale_s + 16 * tid, bs, bytes, policy);
  if constexpr (kKv == tile::kKvSame) {
#pragma unroll
    for (int i = 0; i < kMlaRowChunks / 8; ++i) {
      const int col = j + 8 * i;
      const unsigned char* src =
          col < kMlaLatentChunks ? ckv + 16 * col : kpe + 16 * (col - kMlaLatentChunks);
      tile::kv_copy_16(kv_s + mla_chunk(k, col), src, bytes, policy);
    }
  } else {
    const std::uint32_t raw_row = raw_s + static_cast<std::uint32_t>(k * kMlaHeadDim);
#pragma unroll
    for (int i = 0; i < kMlaLoraRank / 16 / 8; ++i)  // 32 stored chunks of 16 fp8 values
      tile::kv_copy_16(raw_row + 16 * (j + 8 * i), ckv + 16 * (j + 8 * i), bytes, policy);
    if (p.kpe_fp8) {
      if (j < kMlaRopeDim / 16)
        tile::kv_copy_16(raw_row + kMlaLoraRank + 16 * j, kpe + 16 * j, bytes, policy);
    } else {
      tile::kv_copy_16(kv_s + mla_chunk(k, kMlaLatentChunks + j), kpe + 16 * j, bytes, policy);
    }
  }
}

/// 16 fp8 values of format `kKv` as 16 bf16 (two chunks; exact: every e4m3 and e5m2 value is a
/// bf16); with `kScaled`, each value times `scale` (fp32, then rounded once to bf16).
template <int kKv, bool kScaled = false>
__device__ __forceinline__ void fp8x16_to_bf16(uint4 w, uint4& lo, uint4& hi, float scale = 1.f) {
  const std::uint32_t in[4] = {w.x, w.y, w.z, w.w};
  std::uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const std::uint32_t h2 = tile::fp8x2_to_f16x2<kKv>(in[i / 2] >> (16 * (i % 2)));
    __half2 h = *reinterpret_cast<const __half2*>(&h2);
    float2 f = __half22float2(h);
    if constexpr (kScaled) {
      f.x *= scale;
      f.y *= scale;
    }
    const __nv_bfloat162 b = __float22bfloat162_rn(f);
    out[i] = *reinterpret_cast<const std::uint32_t*>(&b);
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

/// Converts this thread's stored fp8 chunks of a tile (`raw`, staged by its own copies of
/// `mla_load_tile`, complete) into the bf16 stage `kv` (generic pointers): the latent part's
/// (with block scales, `kBlock`: stored chunk `j + 8 i` times its token's scale `i`, read from
/// the thread's slot of `bscale`), and the rotary part's when it is fp8.
template <int kKv, bool kBlock = false>
__device__ __forceinline__ void mla_convert_tile(const MlaParams& p, int tid,
                                                 const unsigned char* raw, unsigned char* kv,
                                                 const float* bscale = nullptr) {
  const int k = tid >> 3;
  const int j = tid & 7;
  const unsigned char* raw_row = raw + k * kMlaHeadDim;
  float sc[kMlaBlocks] = {1.f, 1.f, 1.f, 1.f};
  if constexpr (kBlock) {
    const float4 s = *reinterpret_cast<const float4*>(bscale + 4 * tid);
    sc[0] = s.x;
    sc[1] = s.y;
    sc[2] = s.z;
    sc[3] = s.w;
  }
  // stored chunk → bf16 chunks col, col + 1; `scaled`: times `scale`
  auto convert = [&](int stored, int col, bool scaled, float scale) {
    uint4 lo, hi;
    const uint4 w = *reinterpret_cast<const uint4*>(raw_row + 16 * stored);
    if (kBlock && scaled)
      fp8x16_to_bf16<kKv, true>(w, lo, hi, scale);
    else
      fp8x16_to_bf16<kKv>(w, lo, hi);
    *reinterpret_cast<uint4*>(kv + mla_chunk(k, col)) = lo;
    *reinterpret_cast<uint4*>(kv + mla_chunk(k, col + 1)) = hi;
  };
  // stored chunk j + 8 i holds latent columns 16 (j + 8 i) .. + 15, in block i of 128 columns
  static_assert(kMlaBlockCols == 8 * 16, "a thread's i-th latent chunk lies in block i");
#pragma unroll
  for (int i = 0; i < kMlaLoraRank / 16 / 8; ++i) convert(j + 8 * i, 2 * (j + 8 * i), true, sc[i]);
  if (p.kpe_fp8 && j < kMlaRopeDim / 16)
    convert(kMlaLoraRank / 16 + j, kMlaLatentChunks + 2 * j, false, 1.f);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
