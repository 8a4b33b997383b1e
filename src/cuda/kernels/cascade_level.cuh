/// @file cascade_level.cuh
/// @brief The cascade level kernel: the partial attention state of a tile of stacked query rows
///        (every request sharing a segment × new tokens × the GQA group) over one KV split of the
///        segment, on tensor cores (mma.sync m16n8k16, fp32 accumulation), KV streamed through a
///        multi-stage cp.async pipeline with swizzled shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/grid_dependency.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/mma.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Arguments of one level launch (a small POD passed by value).
struct CascadeLevelParams {
  const void* q;            ///< Queries `(batch, q_len, heads_q, D)`.
  std::int64_t q_stride_b;  ///< Elements between requests.
  std::int64_t q_stride_t;  ///< Elements between new tokens.
  std::int64_t q_stride_h;  ///< Elements between heads.
  const void* k;            ///< K pool.
  const void* v;            ///< V pool.
  std::int64_t page_elems;  ///< Elements between pages.
  std::int64_t num_pages;   ///< Pages in the pool (page ids are clamped to it).
  int page_size;            ///< Tokens per page.
  int page_shift;           ///< log2(page_size) when a power of two, else -1.
  int prefetch_pages;       ///< 1: fetch a KV tile's page ids one tile ahead of its copies.
  int heads_kv;             ///< KV heads.
  int hnd;                  ///< 1 for the HND page layout.
  const std::int32_t* request_indptr;  ///< `(num_segments + 1)`.
  const std::int32_t* page_indptr;     ///< `(num_segments + 1)`.
  const std::int32_t* page_indices;    ///< Page ids.
  const std::int32_t* seg_lens;        ///< `(num_segments)`.
  int num_segments;                    ///< Segments of the level.
  int batch;                           ///< Requests.
  int q_len;                           ///< New tokens per request.
  int group;                           ///< Query heads per KV head.
  int heads_q;                         ///< Query heads.
  int chunk;                           ///< KV tokens per split.
  int max_splits;                      ///< Splits per segment in the grid.
  int max_tiles;                       ///< Row tiles per segment in the grid.
  int causal_tail;                     ///< 1 when the causal mask applies (last level, causal).
  float s2_scale;                      ///< `scale · log2(e)`.
  float* ws_o;                         ///< Partial outputs `(slots, rows_total, D)`.
  float* ws_lse;                       ///< Partial base-2 LSEs `(slots, rows_total)`.
  std::int64_t rows_total;             ///< `batch · q_len · heads_q`.
  int slot_offset;                     ///< This level's first slot.
  int tma_box;     ///< Warp-specialised kernel: keys per bulk-copy box (divides 64 and pages).
  int tma_coords;  ///< Warp-specialised kernel: the tensor maps' dims (`CascadeTmaMaps`).
  /// Warp-specialised kernel: keys per run box (several whole pages, a multiple of `tma_box`
  /// dividing the KV tile; `CascadeTmaMaps::k_run` / `v_run`): a granule of that many keys whose
  /// pages are consecutive in the pool is copied with one box; 0 never.
  int tma_run;
  int ws_pingpong;   ///< Warp-specialised kernel: 1 to alternate the warpgroups' matrix products.
  int small_stages;  ///< cp.async stages of the 16-row tile (2 or 3).
};

namespace detail {

/// Programmatic dependent launch: on entry a CTA lets the next kernel of the stream start
/// (`griddepcontrol.launch_dependents`); on exit the first CTA of the grid waits for the previous
/// kernel to complete (`griddepcontrol.wait`). So a level kernel launched with programmatic
/// serialization runs beside the one before it (its other CTAs come and go freely) but its grid
/// never completes before that one, and the merge launched after it sees every level's writes.
/// Both are no-ops without such a launch.
struct PdlScope {
  __device__ __forceinline__ PdlScope() { arch::launch_dependent_grids(); }
  __device__ __forceinline__ ~PdlScope() {
    if (blockIdx.x == 0 && blockIdx.y == 0) arch::wait_on_dependent_grids();
  }
};

/// Page (within the segment) of token `j`.
__device__ __forceinline__ int page_of(const CascadeLevelParams& p, int j) {
  return p.page_shift >= 0 ? (j >> p.page_shift) : (j / p.page_size);
}
/// Slot within its page of token `j`.
__device__ __forceinline__ int slot_of(const CascadeLevelParams& p, int j) {
  return p.page_shift >= 0 ? (j & (p.page_size - 1)) : (j % p.page_size);
}

/// The work of one level CTA, decoded from `blockIdx.x` = (segment, row tile, split) and the
/// level arrays (clamped: nothing is ever read out of bounds). `locate` returns false when the
/// CTA has nothing to do (a segment, row tile or split past the level's); the kernel then returns.
struct LevelBlock {
  int split;         ///< This CTA's KV split of the segment.
  int last;          ///< The segment's last split (0 when it has no keys).
  int r0;            ///< The segment's first request.
  int rows_per_req;  ///< Query rows per request (`q_len · group`).
  int nrows;         ///< Query rows of the segment (requests × rows_per_req).
  int row0;          ///< This CTA's first row (`row tile · BM`).
  int pbeg;          ///< The segment's first entry in `page_indices`.
  int len;           ///< Keys of the segment (at most its pages hold).
  int kv_begin;      ///< First key of this split.
  int kv_end;        ///< One past the last key of this split.
  int n_tiles;       ///< KV tiles of `bn` keys in the split.

  /// Decodes the CTA with `bm` query rows and KV tiles of `bn` keys.
  __device__ __forceinline__ bool locate(const CascadeLevelParams& p, int bm, int bn) {
    int x = blockIdx.x;
    split = x % p.max_splits;
    x /= p.max_splits;
    const int tile = x % p.max_tiles;
    const int seg = x / p.max_tiles;
    if (seg >= p.num_segments) return false;
    // (the five level-array loads first: one memory round trip, not a chain of them)
    const int ri0 = p.request_indptr[seg], ri1 = p.request_indptr[seg + 1];
    const int pi0 = p.page_indptr[seg], pi1 = p.page_indptr[seg + 1], sl0 = p.seg_lens[seg];
    r0 = min(max(ri0, 0), p.batch);
    const int r1 = min(max(ri1, r0), p.batch);
    rows_per_req = p.q_len * p.group;
    nrows = (r1 - r0) * rows_per_req;
    row0 = tile * bm;
    if (row0 >= nrows) return false;
    pbeg = max(pi0, 0);
    // a level run without page ids (allowed when it was planned without pages) has no keys,
    // whatever its device lengths have become since
    const int npages = p.page_indices != nullptr ? max(pi1 - pbeg, 0) : 0;
    len = static_cast<int>(min(static_cast<std::int64_t>(max(sl0, 0)),
                               static_cast<std::int64_t>(npages) * p.page_size));
    const int nsplit = len == 0 ? 0 : min((len + p.chunk - 1) / p.chunk, p.max_splits);
    last = max(nsplit, 1) - 1;
    if (split > last) return false;
    kv_begin = nsplit == 0 ? 0 : split * p.chunk;
    kv_end = nsplit == 0 ? 0 : (split == last ? len : kv_begin + p.chunk);
    n_tiles = (kv_end - kv_begin + bn - 1) / bn;
    return true;
  }

  /// Writes this thread's two rows of a warp's 16-row accumulator (`acc[n][0..1]`: row
  /// `rbase + lane/4`, `acc[n][2..3]`: 8 rows below, columns `8n + 2·(lane % 4)` and the next;
  /// `rbase` counts from this CTA's first row) with their softmax sums `os` (full row sums) as the
  /// partial state of workspace slot `slot_offset + split`: o normalised, LSE in base 2. The
  /// segment's last split also marks the row's later slots empty. Rows past the segment's are
  /// skipped.
  template <int D>
  __device__ __forceinline__ void store_partial(const CascadeLevelParams& p, int h_kv, int rbase,
                                                const float (&acc)[D / 8][4],
                                                const math::OnlineSoftmax (&os)[2]) const {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int R = row0 + rbase + (lane >> 2) + rr * 8;
      if (R >= nrows) continue;
      const int req = r0 + R / rows_per_req, rem = R % rows_per_req;
      const int t = rem / p.group, g = rem % p.group;
      const std::int64_t row =
          (static_cast<std::int64_t>(req) * p.q_len + t) * p.heads_q + h_kv * p.group + g;
      const float inv = os[rr].inv_sum();
      float* dst = p.ws_o +
                   (static_cast<std::int64_t>(p.slot_offset + split) * p.rows_total + row) * D +
                   2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) =
            make_float2(acc[n][2 * rr] * inv, acc[n][2 * rr + 1] * inv);
      if ((lane & 3) == 0) {
        p.ws_lse[static_cast<std::int64_t>(p.slot_offset + split) * p.rows_total + row] =
            os[rr].lse(LseBase::kBase2);
        if (split == last)
          for (int k = split + 1; k < p.max_splits; ++k)
            p.ws_lse[static_cast<std::int64_t>(p.slot_offset + k) * p.rows_total + row] =
                math::neg_inf();
      }
    }
  }
};

/// Element offset of 16-byte chunk `c` of row `r` in a swizzled `[rows][D]` 16-bit tile.
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  return r * D + ((c ^ (r & 7)) << 3);
}

}  // namespace detail

/// Tile configuration: `WM` warps along the rows (16 rows each), `WN` warps splitting the keys
/// of each 64-token KV tile; `D` the head dim.
template <int D_, int WM_, int WN_, int Stages_ = 3, int MinBlocks_ = (WM_ * WN_ >= 8 ? 1 : 2)>
struct CascadeTile {
  static constexpr int D = D_;
  static constexpr int WM = WM_;
  static constexpr int WN = WN_;
  static constexpr int BM = 16 * WM;       ///< Query rows per CTA.
  static constexpr int BN = 64;            ///< Keys per KV tile.
  static constexpr int BNW = BN / WN;      ///< Keys per warp per KV tile.
  static constexpr int kStages = Stages_;  ///< cp.async pipeline depth.
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kChunks = D / 8;          ///< 16-byte chunks per row.
  static constexpr int kMinBlocks = MinBlocks_;  ///< CTAs per SM the registers must allow.
  /// Dynamic shared memory in bytes.
  static constexpr int smem_bytes() { return (BM + 2 * kStages * BN) * D * 2; }
  static_assert(BNW % 16 == 0, "each warp needs whole 16-key steps");
  static_assert(D % 16 == 0 && D >= 64, "head_dim must be a multiple of 16, at least 64");
};

/// One CTA: (segment, row tile, split) from `blockIdx.x`, KV head `blockIdx.y`.
template <class T, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    cascade_level_kernel(const CascadeLevelParams p) {
  constexpr int D = Tile::D, WM = Tile::WM, WN = Tile::WN, BM = Tile::BM, BN = Tile::BN;
  constexpr int BNW = Tile::BNW, kStages = Tile::kStages, kThreads = Tile::kThreads;
  constexpr int kChunks = Tile::kChunks;
  using Mma = arch::Mma16816<T>;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* s_q = reinterpret_cast<T*>(smem_raw);
  T* s_k = s_q + BM * D;
  T* s_v = s_k + kStages * BN * D;

  const detail::PdlScope pdl;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp % WM, wn = warp / WM;
  const int h_kv = blockIdx.y;
  detail::LevelBlock lb;
  if (!lb.locate(p, BM, BN)) return;
  const int r0 = lb.r0, rows_per_req = lb.rows_per_req;
  const int nrows = lb.nrows, row0 = lb.row0, pbeg = lb.pbeg, len = lb.len;
  const int kv_begin = lb.kv_begin, kv_end = lb.kv_end, n_tiles = lb.n_tiles;

  const T* q = static_cast<const T*>(p.q);
  const T* kpool = static_cast<const T*>(p.k);
  const T* vpool = static_cast<const T*>(p.v);

  // --- query tile → shared memory (rows past the segment's rows are zero)
  for (int i = tid; i < BM * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int R = row0 + r;
    const T* src = q;
    int bytes = 0;
    if (R < nrows) {
      const int req = r0 + R / rows_per_req, rem = R % rows_per_req;
      const int t = rem / p.group, g = rem % p.group;
      src = q + req * p.q_stride_b + t * p.q_stride_t + (h_kv * p.group + g) * p.q_stride_h + c * 8;
      bytes = 16;
    }
    arch::cp_async_16_zfill(arch::smem_addr(s_q + detail::swz<D>(r, c)), src, bytes);
  }
  arch::cp_async_commit();

  // KV tile loads: thread `tid` copies 16-byte chunk `c_ld` of rows `r_ld + it * kRowStep`.
  // The page ids of a tile are fetched one tile ahead of its copies (`pg`), so the dependent
  // page-table loads overlap the math instead of stalling every copy.
  constexpr int kLoadIters = BN * kChunks / kThreads;
  constexpr int kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && (BN * kChunks) % kThreads == 0, "load mapping");
  const int c_ld = tid % kChunks, r_ld = tid / kChunks;
  auto fetch_pages = [&](int kt, int(&pg)[kLoadIters]) {
    const int jb = kv_begin + kt * BN + r_ld;
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      const int j = jb + it * kRowStep;
      pg[it] = j < kv_end ? p.page_indices[pbeg + detail::page_of(p, j)] : 0;
    }
  };
  auto issue_kv = [&](int kt, int stage, const int(&pg)[kLoadIters]) {
    T* dk = s_k + stage * BN * D;
    T* dv = s_v + stage * BN * D;
    const int jb = kv_begin + kt * BN;
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      const int r = r_ld + it * kRowStep, c = c_ld;
      const int j = jb + r;
      const T* ks = kpool;
      const T* vs = vpool;
      int bytes = 0;
      if (j < kv_end) {
        std::int64_t page = pg[it];
        page = page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
        const int slot = detail::slot_of(p, j);
        const std::int64_t off = page * p.page_elems +
                                 (p.hnd ? (static_cast<std::int64_t>(h_kv) * p.page_size + slot)
                                        : (static_cast<std::int64_t>(slot) * p.heads_kv + h_kv)) *
                                     D +
                                 c * 8;
        ks = kpool + off;
        vs = vpool + off;
        bytes = 16;
      }
      arch::cp_async_16_zfill(arch::smem_addr(dk + detail::swz<D>(r, c)), ks, bytes);
      arch::cp_async_16_zfill(arch::smem_addr(dv + detail::swz<D>(r, c)), vs, bytes);
    }
  };

  int pg[kLoadIters];
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles) {
      fetch_pages(st, pg);
      issue_kv(st, st, pg);
    }
    arch::cp_async_commit();
  }
  if (p.prefetch_pages && kStages - 1 < n_tiles) fetch_pages(kStages - 1, pg);

  // --- per-thread rows: g = lane/4 and g + 8 of the warp's 16; their key limits (causal)
  int limit[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int R = row0 + wm * 16 + (lane >> 2) + rr * 8;
    limit[rr] = kv_end;
    if (p.causal_tail && R < nrows) {
      const int t = (R % rows_per_req) / p.group;
      limit[rr] = min(kv_end, len - (p.q_len - 1 - t));
    }
  }

  arch::cp_async_wait<kStages - 1>();
  __syncthreads();
  std::uint32_t qf[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int r = wm * 16 + (lane & 15);
    const int c = ks * 2 + (lane >> 4);
    arch::ldmatrix_x4(qf[ks], arch::smem_addr(s_q + detail::swz<D>(r, c)));
  }

  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  math::OnlineSoftmax os[2];

  for (int kt = 0; kt < n_tiles; ++kt) {
    arch::cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      const int nt = kt + kStages - 1;
      if (nt < n_tiles) {
        if (!p.prefetch_pages) fetch_pages(nt, pg);
        issue_kv(nt, nt % kStages, pg);
      }
      arch::cp_async_commit();
      if (p.prefetch_pages && nt + 1 < n_tiles) fetch_pages(nt + 1, pg);
    }
    const T* ks_tile = s_k + (kt % kStages) * BN * D;
    const T* vs_tile = s_v + (kt % kStages) * BN * D;

    // S = Q Kᵀ over this warp's BNW keys
    float s[BNW / 8][4];
#pragma unroll
    for (int n = 0; n < BNW / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
      for (int np = 0; np < BNW / 16; ++np) {
        const int mi = lane >> 3;
        const int key = wn * BNW + np * 16 + (mi >> 1) * 8 + (lane & 7);
        const int c = ks * 2 + (mi & 1);
        std::uint32_t b[4];
        arch::ldmatrix_x4(b, arch::smem_addr(ks_tile + detail::swz<D>(key, c)));
        Mma::mma(s[2 * np], qf[ks], b[0], b[1]);
        Mma::mma(s[2 * np + 1], qf[ks], b[2], b[3]);
      }
    }

    // scale, mask, online softmax (rows g and g + 8)
    const int jb = kv_begin + kt * BN + wn * BNW + 2 * (lane & 3);
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float bmax = math::neg_inf();
#pragma unroll
      for (int n = 0; n < BNW / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = jb + n * 8 + e;
          float& sv = s[n][2 * rr + e];
          sv = j < limit[rr] ? sv * p.s2_scale : math::neg_inf();
          bmax = math::nan_max(bmax, sv);
        }
      bmax = math::nan_max(bmax, __shfl_xor_sync(0xffffffffu, bmax, 1));
      bmax = math::nan_max(bmax, __shfl_xor_sync(0xffffffffu, bmax, 2));
      const float alpha = os[rr].rescale(bmax);
      // Multiplying by 1 is the identity: skip the rescale when no row of the warp's max moved
      // (the common case after the first tiles), bitwise the same result.
      if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          acc[n][2 * rr] *= alpha;
          acc[n][2 * rr + 1] *= alpha;
        }
      }
      float psum = 0.f;
#pragma unroll
      for (int n = 0; n < BNW / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& sv = s[n][2 * rr + e];
          sv = os[rr].prob(sv);
          psum += sv;
        }
      os[rr].add(psum);
    }

    // O += P V
#pragma unroll
    for (int kk = 0; kk < BNW / 16; ++kk) {
      std::uint32_t a[4];
      a[0] = Mma::pack(s[2 * kk][0], s[2 * kk][1]);
      a[1] = Mma::pack(s[2 * kk][2], s[2 * kk][3]);
      a[2] = Mma::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = Mma::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        const int mi = lane >> 3;
        const int key = wn * BNW + kk * 16 + (mi & 1) * 8 + (lane & 7);
        const int c = dp * 2 + (mi >> 1);
        std::uint32_t b[4];
        arch::ldmatrix_x4_trans(b, arch::smem_addr(vs_tile + detail::swz<D>(key, c)));
        Mma::mma(acc[2 * dp], a, b[0], b[1]);
        Mma::mma(acc[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }
  arch::cp_async_wait<0>();

  // full row sums across the quad
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = os[rr].l;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    os[rr].l = l;
  }

  // warps that split the keys of a tile: merge their states into the wn == 0 warp
  if constexpr (WN > 1) {
    __syncthreads();  // every warp is done with the KV stages: reuse them
    float* red_o = reinterpret_cast<float*>(s_k);  // [WN][WM][16][D]
    float* red_ml = red_o + WN * WM * 16 * D;      // [WN][WM][16][2]
    if (wn > 0) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int r = (lane >> 2) + rr * 8;
        float* dst = red_o + ((wn * WM + wm) * 16 + r) * D + 2 * (lane & 3);
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          dst[n * 8] = acc[n][2 * rr];
          dst[n * 8 + 1] = acc[n][2 * rr + 1];
        }
        if ((lane & 3) == 0) {
          red_ml[((wn * WM + wm) * 16 + r) * 2] = os[rr].m;
          red_ml[((wn * WM + wm) * 16 + r) * 2 + 1] = os[rr].l;
        }
      }
    }
    __syncthreads();
    if (wn > 0) return;
#pragma unroll
    for (int w = 1; w < WN; ++w)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int r = (lane >> 2) + rr * 8;
        math::OnlineSoftmax other;
        other.m = red_ml[((w * WM + wm) * 16 + r) * 2];
        other.l = red_ml[((w * WM + wm) * 16 + r) * 2 + 1];
        const math::OnlineSoftmax::Factors f = os[rr].merge(other);
        const float* src = red_o + ((w * WM + wm) * 16 + r) * D + 2 * (lane & 3);
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          acc[n][2 * rr] = acc[n][2 * rr] * f.self + (f.other != 0.f ? src[n * 8] * f.other : 0.f);
          acc[n][2 * rr + 1] =
              acc[n][2 * rr + 1] * f.self + (f.other != 0.f ? src[n * 8 + 1] * f.other : 0.f);
        }
      }
  }

  // partial state → workspace slot (slot_offset + split); later slots of this segment are empty
  lb.store_partial<D>(p, h_kv, wm * 16, acc, os);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
