/// @file tile/cascade_level_block.cuh
/// @brief Device parts of the cascade level kernels: the CTA's work (segment, row tile, split),
///        its grid-dependency scope, token → page addressing, the swizzled tile layouts, the
///        partial-state store, the query/KV copies of the cp.async kernels, and the fragment-level
///        steps of a warp's 16 rows (query fragments, the probabilities as 16-bit operands, the
///        row sums; the online-softmax step is tile/softmax_step.cuh's).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "cuda/arch/grid_dependency.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/kernels/cascade/params.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/paged_kv.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace tile {

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
__device__ __forceinline__ int page_of(const kernels::CascadeLevelParams& p, int j) {
  return p.page_shift >= 0 ? (j >> p.page_shift) : (j / p.page_size);
}
/// Slot within its page of token `j`.
__device__ __forceinline__ int slot_of(const kernels::CascadeLevelParams& p, int j) {
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
  __device__ __forceinline__ bool locate(const kernels::CascadeLevelParams& p, int bm, int bn) {
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

  /// The first key (from the segment's first) each of this thread's rows `rbase + lane/4` and 8
  /// rows below sees under the window `p.window_left` (>= 0), in `lo`: `pos - window_left` at
  /// least 0, `pos` the row's position (`p.tails`); a row past the segment's gets INT_MAX.
  __device__ __forceinline__ void window_starts(const kernels::CascadeLevelParams& p, int rbase,
                                                int lane, int (&lo)[2]) const {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int R = row0 + rbase + (lane >> 2) + rr * 8;
      lo[rr] = 0x7FFFFFFF;
      if (R < nrows) {
        const int req = r0 + R / rows_per_req, t = (R % rows_per_req) / p.group;
        const long long tail = p.tails[req];
        const long long pos = p.causal_pos ? tail - p.q_len + t : tail - 1;
        lo[rr] = static_cast<int>(min(max(pos - p.window_left, 0ll), static_cast<long long>(len)));
      }
    }
  }

  /// Narrows this CTA's split to the keys its rows' window reaches: the splits of `p.chunk`
  /// keys cover `[lo_r, len)`, `lo_r` the KV tile (of `bn` keys) holding `lo_min` (the least first
  /// key of the CTA's rows), the last split to `len` whatever the planned split count. Returns
  /// false when this split holds none of those keys (the last one marked the later slots empty).
  __device__ __forceinline__ bool narrow_to_window(const kernels::CascadeLevelParams& p, int lo_min,
                                                   int bn) {
    const int lo_r = min(lo_min, len) / bn * bn;
    const int live = len - lo_r;
    const int nsplit = live == 0 ? 0 : min((live + p.chunk - 1) / p.chunk, p.max_splits);
    last = max(nsplit, 1) - 1;
    if (split > last) return false;
    kv_begin = nsplit == 0 ? len : lo_r + split * p.chunk;
    kv_end = nsplit == 0 ? len : (split == last ? len : kv_begin + p.chunk);
    n_tiles = (kv_end - kv_begin + bn - 1) / bn;
    return true;
  }

  /// The source of 16-byte chunk `c` of query row `R` (< `nrows`, counted from the segment's
  /// first row) of KV head `h_kv`'s group in the queries `q`.
  template <class T>
  __device__ __forceinline__ const T* q_src(const kernels::CascadeLevelParams& p, const T* q,
                                            int h_kv, int R, int c) const {
    const int req = r0 + R / rows_per_req, rem = R % rows_per_req;
    const int t = rem / p.group, g = rem % p.group;
    return q + req * p.q_stride_b + t * p.q_stride_t + (h_kv * p.group + g) * p.q_stride_h + c * 8;
  }

  /// Writes this thread's two rows of a warp's 16-row accumulator (`acc[n][0..1]`: row
  /// `rbase + lane/4`, `acc[n][2..3]`: 8 rows below, columns `8n + 2·(lane % 4)` and the next;
  /// `rbase` counts from this CTA's first row) with their softmax sums `os` (full row sums) as the
  /// partial state of workspace slot `slot_offset + split`: o normalised, LSE in base 2. The
  /// segment's last split also marks the row's later slots empty. Rows past the segment's are
  /// skipped.
  template <int D>
  __device__ __forceinline__ void store_partial(const kernels::CascadeLevelParams& p, int h_kv,
                                                int rbase, const float (&acc)[D / 8][4],
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

/// The variant instances' scores and split: the soft cap of `p` in `vs`; with a window, the first
/// key of each of this thread's rows (warp rows `rbase..`) in `vs.lo` and the split narrowed to
/// the keys the CTA's rows see (`LevelBlock::narrow_to_window` on their least first key, a
/// block-wide minimum: every thread of the block calls this). Returns false when the split holds
/// none of them (the whole block returns).
__device__ __forceinline__ bool level_variant(const kernels::CascadeLevelParams& p, LevelBlock& lb,
                                              int rbase, int lane, int bn, VariantScores& vs) {
  vs.set_map(p.scale, p.soft_cap);
  vs.lo[0] = vs.lo[1] = 0;
  if (p.window_left < 0) return true;
  __shared__ int s_lo;
  if (threadIdx.x == 0) s_lo = 0x7FFFFFFF;
  __syncthreads();
  lb.window_starts(p, rbase, lane, vs.lo);
  atomicMin(&s_lo, min(vs.lo[0], vs.lo[1]));
  __syncthreads();
  return lb.narrow_to_window(p, s_lo, bn);
}

/// The base-2 score scale of a level CTA of KV head `h_kv`: `p.s2_scale`, with an fp8 pool's K
/// dequantisation scale `k_scale` folded in (`kFp8`; in the variant's map too, `kVar`).
template <bool kFp8, bool kVar>
__device__ __forceinline__ float level_score_scale(const kernels::CascadeLevelParams& p,
                                                   const KvScale& k_scale, int h_kv,
                                                   VariantScores& var) {
  float s2_scale = p.s2_scale;
  if constexpr (kFp8) {
    const float k = k_scale.at(h_kv);
    s2_scale *= k;
    if constexpr (kVar) var.set_map(p.scale * k, p.soft_cap);
  }
  return s2_scale;
}

/// Multiplies an accumulator fragment by `s` (an fp8 pool's V dequantisation scale).
template <int N>
__device__ __forceinline__ void scale_frags(float (&f)[N][4], float s) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) f[n][e] *= s;
}

/// Element offset of 16-byte chunk `c` of row `r` in a swizzled `[rows][D]` 16-bit tile.
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  static_assert(D % 64 == 0, "rows of a multiple of 8 chunks: the XOR stays inside the row");
  return r * D + ((c ^ (r & 7)) << 3);
}

/// Element offset of 16-byte chunk `c` of KV row `r` in the 128B-swizzled layout the tensor
/// cores read: `[D / 64][rows][64]`, chunk `c % 8` XOR `r % 8` inside each 128-byte row.
template <int Rows>
__device__ __forceinline__ int swz128(int r, int c) {
  return (c >> 3) * Rows * 64 + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

/// The shared-memory layout of a `[rows][D]` 16-bit tile with 16-byte chunks XOR-swizzled by row
/// (`swz`), as the `mma.sync` kernels read it.
template <int D>
struct RowSwizzle {
  __device__ static __forceinline__ int at(int r, int c) { return swz<D>(r, c); }
};
/// The 128-byte-swizzled layout of a KV tile of `Rows` keys that the `wgmma` B operand reads
/// (`swz128`).
template <int Rows>
struct Swizzle128 {
  __device__ static __forceinline__ int at(int r, int c) { return swz128<Rows>(r, c); }
};

/// Zeroes an accumulator fragment.
template <int N>
__device__ __forceinline__ void zero_frags(float (&f)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) f[n][0] = f[n][1] = f[n][2] = f[n][3] = 0.f;
}

/// The A fragments (`ldmatrix`) of the queries of a warp's 16 rows `rbase..` from the
/// row-swizzled query tile `s_q`, one per 16 of head_dim.
template <int D, class T>
__device__ __forceinline__ void load_q_frags(std::uint32_t (&qf)[D / 16][4], const T* s_q,
                                             int rbase, int lane) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int r = rbase + (lane & 15);
    const int c = ks * 2 + (lane >> 4);
    arch::ldmatrix_x4(qf[ks], arch::smem_addr(s_q + swz<D>(r, c)));
  }
}

/// The probabilities of a warp's `NK` keys (`s`, as `online_softmax_step` leaves them) as 16-bit A
/// fragments of `P V`, one per 16 keys.
template <class T, int NK>
__device__ __forceinline__ void pack_p(const float (&s)[NK / 8][4],
                                       std::uint32_t (&pf)[NK / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < NK / 16; ++kk) {
    pf[kk][0] = arch::Mma16816<T>::pack(s[2 * kk][0], s[2 * kk][1]);
    pf[kk][1] = arch::Mma16816<T>::pack(s[2 * kk][2], s[2 * kk][3]);
    pf[kk][2] = arch::Mma16816<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pf[kk][3] = arch::Mma16816<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

/// The full row sums of this thread's two rows: the quad's partial sums added.
__device__ __forceinline__ void quad_row_sums(math::OnlineSoftmax (&os)[2]) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = os[rr].l;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    os[rr].l = l;
  }
}

/// The layout of a stage of fp8 K/V rows as stored (`D` bytes a row, 16-byte chunk `c` of row `r`
/// at byte `r · D + 16 c`): only the thread that copied a chunk reads it back (`LevelLoader::
/// convert`), so no swizzle is needed.
template <int D>
struct Fp8Rows {
  __device__ static __forceinline__ int at(int r, int c) { return r * D + c * 16; }
};

/// Four fp8 values of `x` (format `kKv`, lowest byte first) as four `T` (f16 or bf16) in two
/// 32-bit words: exact, every e4m3 and e5m2 value being an f16 and a bf16 value.
template <class T, int kKv>
__device__ __forceinline__ void fp8x4_to(std::uint32_t x, std::uint32_t& lo, std::uint32_t& hi) {
  const std::uint32_t a = fp8x2_to_f16x2<kKv>(x & 0xFFFFu), b = fp8x2_to_f16x2<kKv>(x >> 16);
  if constexpr (std::is_same_v<T, __half>) {
    lo = a;
    hi = b;
  } else {
    const auto bf = [](std::uint32_t h2) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
      const __nv_bfloat162 r = __float22bfloat162_rn(f);
      return *reinterpret_cast<const std::uint32_t*>(&r);
    };
    lo = bf(a);
    hi = bf(b);
  }
}

/// The copies of a cp.async level kernel (`mma.sync` and `wgmma`): the query tile, the KV tiles
/// of `BN` keys through a `kStages`-deep pipeline into `KvLayout`-swizzled stages, with their page
/// ids fetched one tile ahead of the copies (so the dependent page-table loads overlap the math
/// instead of stalling every copy), and the rows' causal key limits. Thread `tid` of `kThreads`
/// copies 16-byte chunk `c_ld` of rows `r_ld + it · kRowStep` of each KV tile.
///
/// The KV loader policy `kKv`: K/V of the queries' dtype `T` (`kKvSame`), or fp8 (`kKvE4M3`,
/// `kKvE5M2`, with `KvLayout` = `Fp8Rows<D>`): the stages then hold the stored bytes, and
/// `convert` turns a landed stage into the 16-bit row-swizzled tiles the matrix steps read.
template <class T, int D, int BN, int kThreads, int kStages, class KvLayout, int kKv = kKvSame>
struct LevelLoader {
  static constexpr bool kFp8 = kKv != kKvSame;
  /// An element of the K/V stages and pools.
  using KvStore = std::conditional_t<kFp8, unsigned char, T>;
  static constexpr int kChunks = D / 8;  ///< 16-byte chunks per query row.
  static constexpr int kKvChunks = D * static_cast<int>(sizeof(KvStore)) / 16;  ///< Per KV row.
  static constexpr int kKvChunkElems = 16 / static_cast<int>(sizeof(KvStore));
  static constexpr int kLoadIters = BN * kKvChunks / kThreads;
  static constexpr int kRowStep = kThreads / kKvChunks;
  static_assert(kThreads % kKvChunks == 0 && (BN * kKvChunks) % kThreads == 0, "load mapping");
  static_assert(!kFp8 || sizeof(T) == 2, "fp8 K/V under 16-bit queries");

  const kernels::CascadeLevelParams& p;
  const LevelBlock& lb;
  KvStore* s_k;  ///< The K stages, `kStages × BN × D`.
  KvStore* s_v;  ///< The V stages.
  int h_kv;      ///< This CTA's KV head.
  int c_ld;      ///< This thread's chunk of a KV row.
  int r_ld;      ///< This thread's first KV row.

  /// The K/V shared memory of a level kernel from `base` (after its query tile): 16-bit K/V, the
  /// K then the V stages, which the matrix steps read (`tile_k` = `stage_k`); fp8, one converted
  /// 16-bit K and V tile (`tile_k`, `tile_v`), then the K and V stages of stored rows.
  struct Smem {
    T* tile_k;
    T* tile_v;
    KvStore* stage_k;
    KvStore* stage_v;
  };
  __device__ static __forceinline__ Smem smem(T* base) {
    Smem m;
    m.tile_k = base;
    m.tile_v = base + (kFp8 ? 1 : kStages) * BN * D;
    m.stage_k =
        reinterpret_cast<KvStore*>(kFp8 ? reinterpret_cast<unsigned char*>(m.tile_v + BN * D)
                                        : reinterpret_cast<unsigned char*>(m.tile_k));
    m.stage_v = m.stage_k + kStages * BN * D;
    return m;
  }

  __device__ __forceinline__ LevelLoader(const kernels::CascadeLevelParams& p_,
                                         const LevelBlock& lb_, KvStore* s_k_, KvStore* s_v_,
                                         int h_kv_, int tid)
      : p(p_),
        lb(lb_),
        s_k(s_k_),
        s_v(s_v_),
        h_kv(h_kv_),
        c_ld(tid % kKvChunks),
        r_ld(tid / kKvChunks) {}

  /// Issues the copies of the query tile of `BM` rows into `s_q` (row-swizzled; rows past the
  /// segment's are zero) and commits them as one group.
  template <int BM>
  __device__ __forceinline__ void load_q(T* s_q, int tid) const {
    const T* q = static_cast<const T*>(p.q);
    for (int i = tid; i < BM * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const int R = lb.row0 + r;
      const T* src = q;
      int bytes = 0;
      if (R < lb.nrows) {
        src = lb.q_src(p, q, h_kv, R, c);
        bytes = 16;
      }
      arch::cp_async_16_zfill(arch::smem_addr(s_q + swz<D>(r, c)), src, bytes);
    }
    arch::cp_async_commit();
  }

  /// This thread's page ids of KV tile `kt`.
  __device__ __forceinline__ void fetch_pages(int kt, int (&pg)[kLoadIters]) const {
    const int jb = lb.kv_begin + kt * BN + r_ld;
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      const int j = jb + it * kRowStep;
      pg[it] = j < lb.kv_end ? p.page_indices[lb.pbeg + page_of(p, j)] : 0;
    }
  }

  /// Issues this thread's copies of KV tile `kt` into stage `stage` (keys past the split's end
  /// zero-filled).
  __device__ __forceinline__ void issue(int kt, int stage, const int (&pg)[kLoadIters]) const {
    const KvStore* kpool = static_cast<const KvStore*>(p.k);
    const KvStore* vpool = static_cast<const KvStore*>(p.v);
    KvStore* dk = s_k + stage * BN * D;
    KvStore* dv = s_v + stage * BN * D;
    const int jb = lb.kv_begin + kt * BN;
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      const int r = r_ld + it * kRowStep, c = c_ld;
      const int j = jb + r;
      const KvStore* ks = kpool;
      const KvStore* vs = vpool;
      int bytes = 0;
      if (j < lb.kv_end) {
        const std::int64_t page = clamp_page(pg[it], p.num_pages);
        const int slot = slot_of(p, j);
        const std::int64_t off =
            page * p.page_elems +
            (p.layout_hnd ? (static_cast<std::int64_t>(h_kv) * p.page_size + slot)
                          : (static_cast<std::int64_t>(slot) * p.heads_kv + h_kv)) *
                D +
            c * kKvChunkElems;
        ks = kpool + off;
        vs = vpool + off;
        bytes = 16;
      }
      arch::cp_async_16_zfill(arch::smem_addr(dk + KvLayout::at(r, c)), ks, bytes);
      arch::cp_async_16_zfill(arch::smem_addr(dv + KvLayout::at(r, c)), vs, bytes);
    }
  }

  /// fp8 only: converts this thread's chunks of stage `stage` (its own copies: landed once its
  /// wait for the stage returned) into the 16-bit K and V tiles `dk`, `dv` of `BN` keys in the
  /// layout the matrix steps read (`DstLayout`: `RowSwizzle<D>` for mma.sync, `Swizzle128<BN>`
  /// for wgmma; free: every warp is past its reads of the previous tile).
  template <class DstLayout = RowSwizzle<D>>
  __device__ __forceinline__ void convert(int stage, T* dk, T* dv) const {
    static_assert(kFp8, "the fp8 loader policy");
    const KvStore* sk = s_k + stage * BN * D;
    const KvStore* sv = s_v + stage * BN * D;
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      const int r = r_ld + it * kRowStep, c = c_ld;
      const uint4 k8 = *reinterpret_cast<const uint4*>(sk + KvLayout::at(r, c));
      const uint4 v8 = *reinterpret_cast<const uint4*>(sv + KvLayout::at(r, c));
      uint4 k0, k1, v0, v1;
      fp8x4_to<T, kKv>(k8.x, k0.x, k0.y);
      fp8x4_to<T, kKv>(k8.y, k0.z, k0.w);
      fp8x4_to<T, kKv>(k8.z, k1.x, k1.y);
      fp8x4_to<T, kKv>(k8.w, k1.z, k1.w);
      fp8x4_to<T, kKv>(v8.x, v0.x, v0.y);
      fp8x4_to<T, kKv>(v8.y, v0.z, v0.w);
      fp8x4_to<T, kKv>(v8.z, v1.x, v1.y);
      fp8x4_to<T, kKv>(v8.w, v1.z, v1.w);
      *reinterpret_cast<uint4*>(dk + DstLayout::at(r, 2 * c)) = k0;
      *reinterpret_cast<uint4*>(dk + DstLayout::at(r, 2 * c + 1)) = k1;
      *reinterpret_cast<uint4*>(dv + DstLayout::at(r, 2 * c)) = v0;
      *reinterpret_cast<uint4*>(dv + DstLayout::at(r, 2 * c + 1)) = v1;
    }
  }

  /// The pipeline's start: the first `kStages - 1` tiles issued, one commit group each, and
  /// (prefetching) the page ids of the next.
  __device__ __forceinline__ void start(int (&pg)[kLoadIters]) const {
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < lb.n_tiles) {
        fetch_pages(st, pg);
        issue(st, st, pg);
      }
      arch::cp_async_commit();
    }
    if (p.prefetch_pages && kStages - 1 < lb.n_tiles) fetch_pages(kStages - 1, pg);
  }

  /// The kernel's first copies: the query tile of `BM` rows (`load_q`), then `start`.
  template <int BM>
  __device__ __forceinline__ void start_with_q(T* s_q, int tid, int (&pg)[kLoadIters]) const {
    load_q<BM>(s_q, tid);
    start(pg);
  }

  /// At KV tile `kt` of the main loop (its stage landed, the previous stage free): issues tile
  /// `kt + kStages - 1` (one commit group, empty past the split) and fetches the page ids after.
  __device__ __forceinline__ void advance(int kt, int (&pg)[kLoadIters]) const {
    const int nt = kt + kStages - 1;
    if (nt < lb.n_tiles) {
      if (!p.prefetch_pages) fetch_pages(nt, pg);
      issue(nt, nt % kStages, pg);
    }
    arch::cp_async_commit();
    if (p.prefetch_pages && nt + 1 < lb.n_tiles) fetch_pages(nt + 1, pg);
  }

  /// Key limits of this thread's two rows (`rbase + lane/4` and 8 below, counted from the CTA's
  /// first row): the split's end, and on a causal last level the row's new token's position.
  __device__ __forceinline__ void causal_limits(int rbase, int lane, int (&limit)[2]) const {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int R = lb.row0 + rbase + (lane >> 2) + rr * 8;
      limit[rr] = lb.kv_end;
      if (p.causal_tail && R < lb.nrows) {
        const int t = (R % lb.rows_per_req) / p.group;
        limit[rr] = min(lb.kv_end, lb.len - (p.q_len - 1 - t));
      }
    }
  }
  /// Once the query tile landed (the first commit group; the block waits for it), the query
  /// fragments of a warp's 16 rows `rbase..` (`load_q_frags`).
  __device__ __forceinline__ void q_frags(std::uint32_t (&qf)[D / 16][4], const T* s_q, int rbase,
                                          int lane) const {
    arch::cp_async_wait<kStages - 1>();
    __syncthreads();
    load_q_frags<D>(qf, s_q, rbase, lane);
  }
};

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
