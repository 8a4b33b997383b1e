/// @file tile/cascade_ws_ring.cuh
/// @brief Device parts of the warp-specialised cascade level kernel (kernels/cascade/level_ws.cuh):
///        the layout of a KV tile in shared memory, the CTA's shared memory (queries, the K/V ring
///        and its "full"/"empty" mbarriers), and the producer warp that fills the ring with bulk
///        tensor copies.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/tma.cuh"
#include "cuda/kernels/cascade/params.cuh"
#include "cuda/tile/cascade_level_block.cuh"
#include "cuda/tile/fp8_kv.cuh"

namespace attnstate {
namespace cuda {
namespace tile {

/// KV tile layout in shared memory (16-bit, head_dim `D` = 64, 128 or 256): groups of 8 keys, each
/// the 64-wide parts ("halves") of head_dim in order for its 8 keys (rows of 128 bytes, 128-byte
/// swizzled).
constexpr std::uint32_t kKvHalfBytes = 8 * 128;  ///< One 64-wide part of a group.
/// One group of 8 keys.
template <int D>
constexpr std::uint32_t kv_group_bytes() {
  static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
  return (D / 64) * kKvHalfBytes;
}
/// Byte offset of 16-byte chunk `c` (0..D/8-1) of key `r` in a KV tile.
template <int D>
__device__ __forceinline__ std::uint32_t kv_tile_offset(int r, int c) {
  return static_cast<std::uint32_t>((r >> 3) * kv_group_bytes<D>() + (c >> 3) * kKvHalfBytes +
                                    (r & 7) * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/// A stored fp8 KV tile (head_dim 128) as the bulk copies lay it out: the same groups of 8 keys
/// and halves of head_dim, each half of a key 64 bytes, unswizzled (the converter reads it in
/// order, each 16-byte chunk once).
constexpr std::uint32_t kFp8HalfBytes = 8 * 64;              ///< One half of a group.
constexpr std::uint32_t kFp8GroupBytes = 2 * kFp8HalfBytes;  ///< One group of 8 keys.
/// Byte offset of 16-byte chunk `c` (0..7: head-dim elements 16 c..) of key `r` in a stored fp8
/// tile.
__device__ __forceinline__ std::uint32_t fp8_tile_offset(int r, int c) {
  return static_cast<std::uint32_t>((r >> 3) * kFp8GroupBytes + (c >> 2) * kFp8HalfBytes +
                                    (r & 7) * 64 + ((c & 3) << 4));
}

/// The shared memory of a warp-specialised level CTA (`Tile`: a `kernels::CascadeWsTile`),
/// 1024-byte aligned: the query tile, the K and V rings of `kStages` tiles, (fp8) the K and V
/// rings of `kFp8Stages` stored tiles, then per stage an mbarrier "full" (its K and V landed, or
/// were converted) and one "empty" (its K and V were read), (fp8) then per stored stage the
/// same two.
template <class Tile>
struct WsSmem {
  std::uint32_t q_smem;    ///< Shared address of the query tile.
  std::uint32_t k_smem;    ///< Shared address of the K ring.
  std::uint32_t v_smem;    ///< Shared address of the V ring.
  std::uint32_t full0;     ///< The "full" mbarriers, 8 bytes a stage.
  std::uint32_t empty0;    ///< The "empty" mbarriers.
  std::uint32_t k8_smem;   ///< fp8: the stored K ring.
  std::uint32_t v8_smem;   ///< fp8: the stored V ring.
  std::uint32_t full8_0;   ///< fp8: the stored stages' "full" mbarriers (the copies landed).
  std::uint32_t empty8_0;  ///< fp8: their "empty" mbarriers (every producer warp converted).

  __device__ __forceinline__ explicit WsSmem(unsigned char* smem_raw) {
    unsigned char* smem_al = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~static_cast<std::uintptr_t>(1023));
    using T = typename Tile::T;
    T* s_q = reinterpret_cast<T*>(smem_al);
    T* s_k = s_q + Tile::BM * Tile::D;
    T* s_v = s_k + Tile::kStages * Tile::BN * Tile::D;
    q_smem = arch::smem_addr(s_q);
    k_smem = arch::smem_addr(s_k);
    v_smem = arch::smem_addr(s_v);
    k8_smem = arch::smem_addr(s_v + Tile::kStages * Tile::BN * Tile::D);
    v8_smem = k8_smem + Tile::kFp8Stages * Tile::kStoredTileBytes;
    full0 = v8_smem + Tile::kFp8Stages * Tile::kStoredTileBytes;
    empty0 = full0 + Tile::kStages * 8;
    full8_0 = empty0 + Tile::kStages * 8;
    empty8_0 = full8_0 + Tile::kFp8Stages * 8;
  }

  /// Initialises the mbarriers ("full": the producer's one arrival and the copies' bytes, fp8:
  /// one arrival per producer warp; "empty": one arrival per consumer warp; the stored stages'
  /// "full": the copying warp's arrival and the bytes, "empty": one arrival per producer warp);
  /// by one thread, before a block barrier.
  __device__ __forceinline__ void init_barriers() const {
#pragma unroll
    for (int s = 0; s < Tile::kStages; ++s) {
      arch::mbar_init(full0 + 8 * s, Tile::kFp8 ? 4 : 1);
      arch::mbar_init(empty0 + 8 * s, 4 * Tile::NWG);
    }
#pragma unroll
    for (int s = 0; s < Tile::kFp8Stages; ++s) {
      arch::mbar_init(full8_0 + 8 * s, 1);
      arch::mbar_init(empty8_0 + 8 * s, 4);
    }
    arch::fence_mbar_init();
  }
};

/// The producer warp: fills the K/V ring tile by tile (waiting on a stage's "empty" before it
/// refills it), each whole tile with bulk tensor copies completing on the stage's "full", the
/// split's last, partial tile with `cp.async`.
template <class Tile>
struct WsProducer {
  using T = typename Tile::T;
  using KvStore = typename Tile::KvStore;
  static constexpr int D = Tile::D, BN = Tile::BN, kStages = Tile::kStages;
  static constexpr bool kFp8 = Tile::kFp8;
  static_assert(!kFp8 || D == 128, "the stored fp8 layout: head_dim 128");
  /// 16-byte chunks of a stored key, and its bytes.
  static constexpr int kChunks = D * static_cast<int>(sizeof(KvStore)) / 16;
  static constexpr int kKeyBytes = D * static_cast<int>(sizeof(KvStore));
  static constexpr int kChunkElems = 16 / static_cast<int>(sizeof(KvStore));  ///< Per chunk.
  static constexpr std::uint32_t kTileBytes = Tile::kTileBytes;
  static constexpr std::uint32_t kStoredBytes = Tile::kStoredTileBytes;

  const kernels::CascadeLevelParams& p;
  const LevelBlock& lb;
  int h_kv;
  int lane;
  const KvStore* kpool;
  const KvStore* vpool;
  int G;                        ///< Keys per box (8-64): divides BN and the page size (or is 64).
  int nb;                       ///< Boxes per tile and tensor (a power of two ≤ 16).
  int b;                        ///< The box this lane copies (lanes below nb).
  int per_win;                  ///< Tiles per window of 32 boxes.
  int per_run;                  ///< Boxes per run granule (1 without runs).
  const CUtensorMap* tm_k;      ///< Boxes of `tma_box` keys of K (`kernels::CascadeTmaMaps`).
  const CUtensorMap* tm_v;      ///< Of V.
  const CUtensorMap* tm_k_run;  ///< Boxes of `tma_run` keys of K.
  const CUtensorMap* tm_v_run;  ///< Of V.

  /// Also prefetches the tensor maps (`tm_*_run` only with runs).
  __device__ __forceinline__ WsProducer(const kernels::CascadeLevelParams& p_,
                                        const LevelBlock& lb_, int h_kv_, int lane_,
                                        const CUtensorMap* tm_k_, const CUtensorMap* tm_v_,
                                        const CUtensorMap* tm_k_run_, const CUtensorMap* tm_v_run_)
      : p(p_),
        lb(lb_),
        h_kv(h_kv_),
        lane(lane_),
        kpool(static_cast<const KvStore*>(p_.k)),
        vpool(static_cast<const KvStore*>(p_.v)),
        G(p_.tma_box),
        nb(BN / G),
        b(lane_ & (nb - 1)),
        per_win(32 / nb),
        tm_k(tm_k_),
        tm_v(tm_v_),
        tm_k_run(tm_k_run_),
        tm_v_run(tm_v_run_) {
    if (lane == 0) {
      arch::tma_prefetch_map(tm_k);
      arch::tma_prefetch_map(tm_v);
      if (p.tma_run) {
        arch::tma_prefetch_map(tm_k_run);
        arch::tma_prefetch_map(tm_v_run);
      }
    }
    per_run = p.tma_run > G ? p.tma_run / G : 1;
  }

  /// Page ids by windows of 32 boxes, one per lane (window `w`), loaded a window ahead of their
  /// copies.
  __device__ __forceinline__ int load_window(int w) const {
    const int j = lb.kv_begin + (w * 32 + lane) * G;
    std::int64_t pg = 0;
    if (j < lb.kv_end) pg = p.page_indices[lb.pbeg + page_of(p, j)];
    // clamp_page written out (here and in copy_partial): through the helper ptxas emits other
    // code for this kernel, and it is kept as measured (bench/RESULTS.md, 2026-12-01)
    pg = pg < 0 ? 0 : (pg >= p.num_pages ? p.num_pages - 1 : pg);
    return static_cast<int>(pg);
  }

  /// Runs: granules of R = p.tma_run keys (several whole pages, R / G boxes) whose pages are
  /// consecutive in the pool; one bit per box of the window `win`, set for the boxes of such
  /// granules.
  __device__ __forceinline__ unsigned runs_of(int win) const {
    const int first = __shfl_sync(0xffffffffu, win, lane & ~(per_run - 1));
    return __ballot_sync(0xffffffffu, win == first + (lane & (per_run - 1)));
  }

  /// The boxes of one whole tile of K or V (`tm`) into the stage at `dst` (fp8: the stored
  /// stage), completing on `full`: lane b < nb copies box b (G keys, both halves of head_dim); a
  /// granule that is a run (`run`,
  /// the same for its lanes): one box of R keys from `tm_run` by its first lane, the same bytes
  /// in the same places.
  __device__ __forceinline__ void copy_boxes(std::uint32_t dst, const CUtensorMap* tm,
                                             const CUtensorMap* tm_run, bool run,
                                             std::uint32_t full, int j0, int page) const {
    if (lane >= nb || (run && (b & (per_run - 1)) != 0)) return;
    const int slot = slot_of(p, j0 + b * G);
    int c1 = 0, c2 = (D / 64) * h_kv, c3 = slot >> 3, c4 = page;  // NHD
    if (p.tma_coords == 1) {                                      // unpadded HND
      c2 = 0;
      c4 = page * p.heads_kv + h_kv;
    } else if (p.tma_coords == 2) {  // padded HND (boxes of 8 slots)
      c1 = slot;
      c2 = 0;
      c3 = h_kv;
    }
    arch::tma_load_5d(dst + b * G * kKeyBytes, run ? tm_run : tm, full, 0, c1, c2, c3, c4);
  }

  /// The split's last, partial tile (keys `j0..`) into the stages at `dk`, `dv` (fp8: the stored
  /// stages): cp.async, keys past the end zero-filled; then the stage's "full" arrival.
  __device__ __forceinline__ void copy_partial(std::uint32_t dk, std::uint32_t dv, int j0,
                                               std::uint32_t full) const {
    for (int r = lane; r < BN; r += 32) {
      const int j = j0 + r;
      std::int64_t off = 0;
      int bytes = 0;
      if (j < lb.kv_end) {
        std::int64_t page = p.page_indices[lb.pbeg + page_of(p, j)];
        page = page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
        const int sl = slot_of(p, j);
        off = page * p.page_elems + (p.layout_hnd
                                         ? (static_cast<std::int64_t>(h_kv) * p.page_size + sl)
                                         : (static_cast<std::int64_t>(sl) * p.heads_kv + h_kv)) *
                                        D;
        bytes = 16;
      }
#pragma unroll 4
      for (int c = 0; c < kChunks; ++c) {
        const std::uint32_t o = kFp8 ? fp8_tile_offset(r, c) : kv_tile_offset<D>(r, c);
        arch::cp_async_16_zfill(dk + o, kpool + off + c * kChunkElems, bytes);
        arch::cp_async_16_zfill(dv + o, vpool + off + c * kChunkElems, bytes);
      }
    }
    arch::cp_async_commit();
    arch::cp_async_wait<0>();
    // 16-bit: generic-proxy writes → read by wgmma (async proxy); fp8: read by the converters
    if constexpr (!kFp8) arch::fence_proxy_async();
    __syncwarp();
    if (lane == 0) arch::mbar_arrive(full);
  }

  /// Fills the ring of `sm` with the split's `lb.n_tiles` (> 0) tiles.
  __device__ __forceinline__ void run(const WsSmem<Tile>& sm) const {
    const int n_tiles = lb.n_tiles;
    int win_cur = load_window(0);
    int win_next = load_window(1);
    unsigned runs = p.tma_run ? runs_of(win_cur) : 0u;
    // this lane's granule: its boxes' bits within a tile
    const unsigned granule_bits = ((1u << per_run) - 1u) << (b & ~(per_run - 1));
    for (int kt = 0; kt < n_tiles; ++kt) {
      if (kt > 0 && kt % per_win == 0) {
        win_cur = win_next;
        win_next = load_window(kt / per_win + 1);
        if (p.tma_run) runs = runs_of(win_cur);
      }
      const int page = __shfl_sync(0xffffffffu, win_cur, (kt % per_win) * nb + b);
      const int st = kt % kStages;
      if (kt >= kStages) arch::mbar_wait(sm.empty0 + 8 * st, ((kt / kStages) - 1) & 1);
      const std::uint32_t full = sm.full0 + 8 * st;
      const std::uint32_t dk = sm.k_smem + st * kTileBytes, dv = sm.v_smem + st * kTileBytes;
      const int j0 = lb.kv_begin + kt * BN;
      if (Tile::kDiagNoCopy && kt >= kStages) {
        if (lane == 0) arch::mbar_arrive(full);  // (diagnostic: the stale tile is re-read)
      } else if (j0 + BN <= lb.kv_end) {
        // a whole tile: the boxes of K, then of V; one mbarrier transaction of K + V bytes
        const unsigned bits = granule_bits << ((kt % per_win) * nb);
        const bool run = per_run > 1 && (runs & bits) == bits;
        if (lane == 0) arch::mbar_arrive_expect_tx(full, 2 * kTileBytes);
        __syncwarp();
        copy_boxes(dk, tm_k, tm_k_run, run, full, j0, page);
        copy_boxes(dv, tm_v, tm_v_run, run, full, j0, page);
      } else {
        copy_partial(dk, dv, j0, full);
      }
    }
  }

  /// fp8: the 16 stored bytes of chunk `c` (head-dim elements 16 c..) of key `j` (zero past
  /// the split's end) straight from the pool: the split's last, partial tile.
  __device__ __forceinline__ void load_partial_chunk(int j, int c, uint4& k8, uint4& v8) const {
    k8 = v8 = make_uint4(0u, 0u, 0u, 0u);
    if (j >= lb.kv_end) return;
    std::int64_t page = p.page_indices[lb.pbeg + page_of(p, j)];
    page = page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
    const int sl = slot_of(p, j);
    const std::int64_t off = page * p.page_elems +
                             (p.layout_hnd ? (static_cast<std::int64_t>(h_kv) * p.page_size + sl)
                                           : (static_cast<std::int64_t>(sl) * p.heads_kv + h_kv)) *
                                 D +
                             c * kChunkElems;
    k8 = *reinterpret_cast<const uint4*>(kpool + off);
    v8 = *reinterpret_cast<const uint4*>(vpool + off);
  }

  /// fp8: producer warp `pw` (0..3) converts its quarter of tile `kt` into the 16-bit stage the
  /// consumers read, once they released it: a whole tile from its stored stage once it landed
  /// (then the stored stage's "empty" arrival), the split's last, partial tile straight from the
  /// pool (it takes no stored stage, so the stored ring only ever holds bulk copies); then the
  /// 16-bit stage's "full" arrival. Each 16-byte chunk of the stored tile (16 head-dim elements
  /// of one key, read in order) becomes chunks 2c, 2c + 1 of its key in the swizzled layout
  /// (`kv_tile_offset`; 8 consecutive lanes write two keys' even or odd chunks: distinct banks).
  __device__ __forceinline__ void convert(const WsSmem<Tile>& sm, int kt, int pw) const {
    constexpr int F = Tile::kFp8Stages;
    constexpr int kIters = static_cast<int>(kStoredBytes) / 16 / 128;
    static_assert(kIters * 16 * 128 == static_cast<int>(kStoredBytes), "chunks per thread");
    const int fs = kt % F, st = kt % kStages;
    const int j0 = lb.kv_begin + kt * BN;
    const bool whole = j0 + BN <= lb.kv_end;
    if (whole) arch::mbar_wait(sm.full8_0 + 8 * fs, (kt / F) & 1);
    if (kt >= kStages) arch::mbar_wait(sm.empty0 + 8 * st, ((kt / kStages) - 1) & 1);
    const std::uint32_t sk = sm.k8_smem + fs * kStoredBytes, sv = sm.v8_smem + fs * kStoredBytes;
    const std::uint32_t dk = sm.k_smem + st * kTileBytes, dv = sm.v_smem + st * kTileBytes;
    const int t = pw * 32 + lane;
    // chunk q of the stored layout: group q / 64, half (q / 32) % 2, key (q / 4) % 8 of its
    // group, chunk q % 4 of the half (fp8_tile_offset)
    const auto key_of = [](int q) { return (q >> 6) * 8 + ((q >> 2) & 7); };
    const auto chunk_of = [](int q) { return ((q >> 5) & 1) * 4 + (q & 3); };
    const auto put = [](std::uint32_t dst, int r, int c, const uint4& w) {
      uint4 a, b;
      fp8x4_to<T, Tile::kKv>(w.x, a.x, a.y);
      fp8x4_to<T, Tile::kKv>(w.y, a.z, a.w);
      fp8x4_to<T, Tile::kKv>(w.z, b.x, b.y);
      fp8x4_to<T, Tile::kKv>(w.w, b.z, b.w);
      arch::st_shared_v4(dst + kv_tile_offset<D>(r, 2 * c), a);
      arch::st_shared_v4(dst + kv_tile_offset<D>(r, 2 * c + 1), b);
    };
    // batches of chunks of K and of V in flight (the registers the producer warpgroup keeps)
    constexpr int kBatch = kIters < Tile::kConvertBatch ? kIters : Tile::kConvertBatch;
    static_assert(kIters % kBatch == 0, "whole batches");
#pragma unroll
    for (int i0 = 0; i0 < kIters; i0 += kBatch) {
      uint4 k8[kBatch], v8[kBatch];
      if (whole) {
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          k8[i] = arch::ld_shared_v4(sk + 16 * ((i0 + i) * 128 + t));
          v8[i] = arch::ld_shared_v4(sv + 16 * ((i0 + i) * 128 + t));
        }
      } else {
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int q = (i0 + i) * 128 + t;
          load_partial_chunk(j0 + key_of(q), chunk_of(q), k8[i], v8[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int q = (i0 + i) * 128 + t;
        put(dk, key_of(q), chunk_of(q), k8[i]);
        put(dv, key_of(q), chunk_of(q), v8[i]);
      }
    }
    arch::fence_proxy_async();  // generic-proxy writes → read by wgmma (async proxy)
    __syncwarp();
    if (lane == 0) {
      arch::mbar_arrive(sm.full0 + 8 * st);
      if (whole) arch::mbar_arrive(sm.empty8_0 + 8 * fs);
    }
  }

  /// fp8 (`Tile::kFp8`): the split's `lb.n_tiles` (> 0) tiles, as producer warp `pw` (0..3) of
  /// the group. Warp 0 keeps the bulk copies of the whole tiles into the stored ring
  /// `kFp8Stages - 1` tiles ahead of the conversions; every warp converts its quarter of each
  /// tile (`convert`).
  __device__ __forceinline__ void run_fp8(const WsSmem<Tile>& sm, int pw) const {
    static_assert(kFp8, "the fp8 loader policy");
    constexpr int F = Tile::kFp8Stages;
    const int n_tiles = lb.n_tiles;
    // the tiles that are whole (the last one may be partial: it takes no copy)
    const int n_whole = lb.kv_begin + n_tiles * BN <= lb.kv_end ? n_tiles : n_tiles - 1;
    int ki = 0;  // warp 0: the next tile to copy, its window of page ids and runs
    int win_cur = 0, win_next = 0;
    unsigned runs = 0u;
    const unsigned granule_bits = ((1u << per_run) - 1u) << (b & ~(per_run - 1));
    if (pw == 0) {
      win_cur = load_window(0);
      win_next = load_window(1);
      runs = p.tma_run ? runs_of(win_cur) : 0u;
    }
    for (int kt = 0; kt < n_tiles; ++kt) {
      // warp 0: the copies up to tile kt + F - 1, whose stored stage tile kt - 1's conversion
      // released
      for (; pw == 0 && ki < n_whole && ki < kt + F; ++ki) {
        if (ki > 0 && ki % per_win == 0) {
          win_cur = win_next;
          win_next = load_window(ki / per_win + 1);
          if (p.tma_run) runs = runs_of(win_cur);
        }
        const int page = __shfl_sync(0xffffffffu, win_cur, (ki % per_win) * nb + b);
        const int fs = ki % F;
        if (ki >= F) arch::mbar_wait(sm.empty8_0 + 8 * fs, ((ki / F) - 1) & 1);
        const std::uint32_t full = sm.full8_0 + 8 * fs;
        const unsigned bits = granule_bits << ((ki % per_win) * nb);
        const bool run = per_run > 1 && (runs & bits) == bits;
        const int j0 = lb.kv_begin + ki * BN;
        if (lane == 0) arch::mbar_arrive_expect_tx(full, 2 * kStoredBytes);
        __syncwarp();
        copy_boxes(sm.k8_smem + fs * kStoredBytes, tm_k, tm_k_run, run, full, j0, page);
        copy_boxes(sm.v8_smem + fs * kStoredBytes, tm_v, tm_v_run, run, full, j0, page);
      }
      convert(sm, kt, pw);
    }
  }
};

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
