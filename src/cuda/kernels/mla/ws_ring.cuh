/// @file kernels/mla/ws_ring.cuh
/// @brief The shared memory and the producer of the wgmma MLA decode kernel (internal): the
///        layout of a tile of 576-column bf16 rows as the tensor cores read it (`mla_ws_offset`),
///        the CTA's shared memory (`MlaWsSmem`: the query tile, the K/V ring and its "full" /
///        "empty" mbarriers, the probabilities and the rows' factors) and the producer warpgroup
///        (`mla_ws_produce`: both parts of each token of a 64-key tile into one row of the ring,
///        with `cp.async`; an fp8 cache's bytes copied into the stage, then converted to bf16
///        there). Parts of `mla_decode_ws_kernel`, inlined there.
///
/// A tile of rows (64 query rows, or 64 tokens) is 9 parts of 64 columns (8 latent, 1 rotary),
/// each part 64 rows of 128 bytes, 16-byte chunk `c % 8` of row `r` at `(c % 8) ^ (r % 8)` (the
/// 128-byte swizzle of the `wgmma` operands): K-major for the scores (8-row groups 1024 bytes
/// apart), and the first 8 parts are V MN-major for `P V` (64-column parts 8 KiB apart).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/wgmma.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/paged_kv.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

using catalog::kMlaWsStages;
using catalog::kMlaWsTileKeys;
using catalog::kMlaWsWarps;
using catalog::mla_ws_smem_bytes;

/// Threads of a wgmma MLA CTA: consumer warpgroups 0 and 1, then the producer warpgroup.
constexpr int kMlaWsThreads = kMlaWsWarps * 32;
/// Bytes of one 64-column part of a tile of 64 rows, and of a whole tile.
constexpr std::uint32_t kMlaWsPartBytes = 64 * 128;
constexpr std::uint32_t kMlaWsTileBytes = (kMlaHeadDim / 64) * kMlaWsPartBytes;
static_assert(kMlaTileRows == 64 && kMlaWsTileKeys == 64, "tiles of 64 rows");
/// Registers per thread of the producer warpgroup (fp8: its conversions hold two passes of
/// loads) and of the consumers after `setmaxnreg` (what the producer leaves of the CTA's 168).
template <bool kFp8>
constexpr int kMlaWsProducerRegs = kFp8 ? 56 : 56;
template <bool kFp8>
constexpr int kMlaWsConsumerRegs = (168 * 3 - kMlaWsProducerRegs<kFp8>) / 2 / 8 * 8;
/// Named barriers of the consumers: the probabilities published (warpgroup 0 → 1), read
/// (1 → 0), and the epilogue's barrier of both consumer warpgroups.
constexpr int kMlaWsBarPFull = 1;
constexpr int kMlaWsBarPEmpty = 2;
constexpr int kMlaWsBarEpilogue = 3;

/// Byte offset of 16-byte chunk `c` (0..71) of row `r` (0..63) in a tile.
__device__ __forceinline__ std::uint32_t mla_ws_offset(int r, int c) {
  return static_cast<std::uint32_t>((c >> 3) * kMlaWsPartBytes + r * 128 +
                                    (((c & 7) ^ (r & 7)) << 4));
}

/// The shared memory of a wgmma MLA CTA (1024-byte aligned): the query tile `q`, the K/V ring
/// `kv` [stage], the probabilities `p` (bf16, one part of 64 rows × 64 keys, swizzled as the
/// tiles), the rows' rescale factors `alpha` [64], the rows' base-2 LSEs `lse` [64], the mbarriers
/// ("full" [stage]: the producer's four warps arrived; "empty" [stage]: the eight consumer warps
/// arrived) and the ticket flag `is_last`; the epilogue's normalised `o` [64][512] (fp32) over the
/// query tile and the ring.
struct MlaWsSmem {
  unsigned char* q;
  unsigned char* kv;
  unsigned char* p;
  float* alpha;
  float* lse;
  std::uint32_t full0;
  std::uint32_t empty0;
  int* is_last;
  float* o;

  __device__ __forceinline__ explicit MlaWsSmem(unsigned char* raw) {
    unsigned char* base = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<std::uintptr_t>(raw) + 1023) & ~static_cast<std::uintptr_t>(1023));
    q = base;
    kv = q + kMlaWsTileBytes;
    p = kv + kMlaWsStages * kMlaWsTileBytes;
    alpha = reinterpret_cast<float*>(p + kMlaTileRows * kMlaWsTileKeys * 2);
    lse = alpha + kMlaTileRows;
    full0 = arch::smem_addr(lse + kMlaTileRows);
    empty0 = full0 + 8 * kMlaWsStages;
    is_last = reinterpret_cast<int*>(lse + kMlaTileRows + 4 * kMlaWsStages);
    o = reinterpret_cast<float*>(base);
  }
  /// The bytes after the carve-up (`kMlaWsCarveBytes` from the unaligned base), which the narrow
  /// and balanced kernels' catalog sizes extend for their exchange buffers (fp32).
  __device__ __forceinline__ float* tail() const { return reinterpret_cast<float*>(is_last + 4); }
  /// Shared address of stage `st` of the ring.
  __device__ __forceinline__ std::uint32_t stage(int st) const {
    return arch::smem_addr(kv) + static_cast<std::uint32_t>(st) * kMlaWsTileBytes;
  }
  /// By one thread, before a block barrier.
  __device__ __forceinline__ void init_barriers() const {
#pragma unroll
    for (int s = 0; s < kMlaWsStages; ++s) {
      arch::mbar_init(full0 + 8 * s, 4);
      arch::mbar_init(empty0 + 8 * s, 8);
    }
    arch::fence_mbar_init();
  }
};
/// Bytes of `MlaWsSmem`'s carve-up, its worst-case alignment of the base included.
constexpr std::int64_t kMlaWsCarveBytes = 1024 + (kMlaWsStages + 1) * kMlaWsTileBytes +
                                          kMlaTileRows * kMlaWsTileKeys * 2 + 2 * kMlaTileRows * 4 +
                                          16 * kMlaWsStages + 16;
static_assert(kMlaWsCarveBytes <= catalog::mla_ws_smem_bytes(),
              "the carve-up within the catalog's shared memory");

/// The layout of the wgmma kernel's tiles (`mla_ws_offset`), for `mla_load_queries`.
struct MlaWsLayout {
  __device__ static __forceinline__ std::uint32_t at(int r, int c) { return mla_ws_offset(r, c); }
};

/// Keys of a tile a producer thread handles: `pt / 8 + 16 i`.
constexpr int kMlaWsThreadKeys = kMlaWsTileKeys / 16;
/// Pages of at least this many tokens have a ring of several stages read a tile's page ids ahead
/// (`mla_ws_tile_pages`); smaller pages, and the one-stage ring of the two-CTA kernel, read each
/// key's page in front of its copies (the read-ahead measured slower there: bench/RESULTS.md,
/// session 29).
constexpr int kMlaWsPagesAheadMinPage = 16;

/// The pages of producer thread `pt`'s keys of the tile from `t0` (-1: at or past `end`): the
/// tile's page-table reads issued together, before the copies of the tile ahead that need them,
/// rather than one dependent read per key in front of that key's copies.
__device__ __forceinline__ void mla_ws_tile_pages(const MlaParams& p, const MlaCta& c, int pt,
                                                  int t0, int end,
                                                  std::int32_t (&page)[kMlaWsThreadKeys]) {
#pragma unroll
  for (int i = 0; i < kMlaWsThreadKeys; ++i) {
    const int pos = t0 + pt / 8 + 16 * i;
    // (a page id of the table is an int32, so the clamped one is too)
    page[i] = pos < end ? static_cast<std::int32_t>(mla_token_page(p, c, pos)) : -1;
  }
}

/// `a[i]` (`i` in `[0, N)`) by selects: a loop the producer keeps rolled, to spare its registers,
/// would otherwise index the array in local memory.
template <class T, int N>
__device__ __forceinline__ T mla_ws_pick(const T (&a)[N], int i) {
  T v = a[0];
#pragma unroll
  for (int u = 1; u < N; ++u)
    if (i == u) v = a[u];
  return v;
}

/// Producer thread `pt`'s chunks `pt % 8 + 8 j` of key `k` of a tile (its parts `ckv`, `kpe`;
/// zero-filled unless `valid`) into the stage at `dst` (128 contiguous bytes per 8 threads).
__device__ __forceinline__ void mla_ws_copy_key(int pt, int k, const unsigned char* ckv,
                                                const unsigned char* kpe, bool valid,
                                                std::uint32_t dst, std::uint64_t policy) {
  const int bytes = valid ? 16 : 0;
#pragma unroll
  for (int j = 0; j < kMlaRowChunks / 8; ++j) {
    const int col = pt % 8 + 8 * j;
    const unsigned char* src =
        col < kMlaLatentChunks ? ckv + 16 * col : kpe + 16 * (col - kMlaLatentChunks);
    tile::kv_copy_16(dst + mla_ws_offset(k, col), src, bytes, policy);
  }
}

/// A bf16 cache: producer thread `pt` (0..127) copies its chunks of the tile of keys from `t0`
/// (on the pages `page` of `mla_ws_tile_pages`; those at or past the end zero-filled) into the
/// stage at `dst`: tokens `pt / 8 + 16 i`, chunks `pt % 8 + 8 j` of each (128 contiguous bytes
/// per 8 threads).
__device__ __forceinline__ void mla_ws_copy_tile(const MlaParams& p, int pt, int t0,
                                                 const std::int32_t (&page)[kMlaWsThreadKeys],
                                                 std::uint32_t dst, std::uint64_t policy) {
#pragma unroll 1
  for (int i = 0; i < kMlaWsThreadKeys; ++i) {
    const int k = pt / 8 + 16 * i;
    const std::int32_t pg = mla_ws_pick(page, i);
    const bool valid = pg >= 0;
    const unsigned char* ckv = p.ckv;
    const unsigned char* kpe = p.kpe;
    if (valid) mla_slot_parts(p, pg, (t0 + k) % p.page_size, ckv, kpe);
    mla_ws_copy_key(pt, k, ckv, kpe, valid, dst, policy);
  }
}

/// `mla_ws_copy_tile` with each key's page read in front of its copies (from `t0`; keys at or past
/// `end` zero-filled).
__device__ __forceinline__ void mla_ws_copy_tile_keys(const MlaParams& p, const MlaCta& c, int pt,
                                                      int t0, int end, std::uint32_t dst,
                                                      std::uint64_t policy) {
#pragma unroll 1
  for (int i = 0; i < kMlaWsThreadKeys; ++i) {
    const int k = pt / 8 + 16 * i;
    const bool valid = t0 + k < end;
    const unsigned char* ckv = p.ckv;
    const unsigned char* kpe = p.kpe;
    if (valid) mla_token_parts(p, c, t0 + k, ckv, kpe);
    mla_ws_copy_key(pt, k, ckv, kpe, valid, dst, policy);
  }
}

/// An fp8 cache's tile of keys from `t0` into the stage at `dst` (bf16, keys at or past `end`
/// zero), by producer thread `pt`: first every copy of the tile in flight at once (`cp.async`,
/// one round trip a tile, as over bf16): of its tokens `pt / 8 + 16 i`, the latent part's stored
/// chunks `c = pt % 8 + 8 q` (16 fp8 values each) into the stage's bf16 chunk `2 c + 1` of the
/// token's row, a bf16 rotary part's chunk `pt % 8` where it belongs, an fp8 one's chunk `pt % 8`
/// (`pt % 8 < 4`) into bf16 chunk `64 + 2 (pt % 8) + 1`, and with `kBlock` the token's 4 block
/// scales (one 16-byte load into registers); then, once they landed, each stored chunk converted
/// in place to bf16 chunks `2 c` and `2 c + 1` (the thread's own bytes, read before its own two
/// stores: no other thread's), times its block's scale with `kBlock` (128 columns a block).
template <int kKv, bool kBlock = false>
__device__ __forceinline__ void mla_ws_fp8_tile(const MlaParams& p, const MlaCta& c, int pt, int t0,
                                                int end, std::uint32_t dst, std::uint64_t policy) {
  constexpr int kChunks = kMlaLoraRank / 16 / 8;  // stored chunks of a token per thread
  static_assert(kChunks == kMlaBlocks && kMlaBlockCols == 8 * 16,
                "a thread's q-th latent chunk lies in block q");
  const int j = pt % 8;
  // the block scales (fp32 bits), with kBlock (written and read by selects: the loops stay
  // rolled, to spare the producer's registers)
  uint4 s[kMlaWsThreadKeys];
#pragma unroll 1
  for (int i = 0; i < kMlaWsThreadKeys; ++i) {
    const int k = pt / 8 + 16 * i;
    const bool valid = t0 + k < end;
    const int bytes = valid ? 16 : 0;
    const unsigned char* ckv = p.ckv;
    const unsigned char* kpe = p.kpe;
    const unsigned char* bs = nullptr;
    if (valid) mla_token_parts(p, c, t0 + k, ckv, kpe, kBlock ? &bs : nullptr);
#pragma unroll
    for (int q = 0; q < kChunks; ++q)
      tile::kv_copy_16(dst + mla_ws_offset(k, 2 * (j + 8 * q) + 1), ckv + 16 * (j + 8 * q), bytes,
                       policy);
    if (!p.kpe_fp8)
      tile::kv_copy_16(dst + mla_ws_offset(k, kMlaLatentChunks + j), kpe + 16 * j, bytes, policy);
    else if (j < kMlaRopeDim / 16)
      tile::kv_copy_16(dst + mla_ws_offset(k, kMlaLatentChunks + 2 * j + 1), kpe + 16 * j, bytes,
                       policy);
    if constexpr (kBlock) {
      const uint4 v = valid ? arch::ld_global_nc_no_allocate(bs) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int u = 0; u < kMlaWsThreadKeys; ++u)
        if (i == u) s[u] = v;
    }
  }
  arch::cp_async_commit();
  arch::cp_async_wait<0>();
#pragma unroll 1
  for (int i = 0; i < kMlaWsThreadKeys; ++i) {
    const int k = pt / 8 + 16 * i;
    const uint4 si = kBlock ? mla_ws_pick(s, i) : make_uint4(0u, 0u, 0u, 0u);
    const std::uint32_t sc[kMlaBlocks] = {si.x, si.y, si.z, si.w};
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int cs = j + 8 * q;
      const uint4 w = arch::ld_shared_v4(dst + mla_ws_offset(k, 2 * cs + 1));
      uint4 lo, hi;
      if constexpr (kBlock)
        fp8x16_to_bf16<kKv, true>(w, lo, hi, __uint_as_float(sc[q]));
      else
        fp8x16_to_bf16<kKv>(w, lo, hi);
      arch::st_shared_v4(dst + mla_ws_offset(k, 2 * cs), lo);
      arch::st_shared_v4(dst + mla_ws_offset(k, 2 * cs + 1), hi);
    }
    if (p.kpe_fp8 && j < kMlaRopeDim / 16) {
      const std::uint32_t at = dst + mla_ws_offset(k, kMlaLatentChunks + 2 * j + 1);
      uint4 lo, hi;
      fp8x16_to_bf16<kKv>(arch::ld_shared_v4(at), lo, hi);
      arch::st_shared_v4(dst + mla_ws_offset(k, kMlaLatentChunks + 2 * j), lo);
      arch::st_shared_v4(at, hi);
    }
  }
}

/// The producer warpgroup (thread `pt` 0..127, lane `lane`): the split's `n_tiles` tiles from
/// `begin` (keys at or past `end` zero) into the ring, each stage refilled once its "empty"
/// completed (the copies of one tile in flight while the consumers compute the other). bf16:
/// `cp.async` (a ring of several stages over pages of at least `kMlaWsPagesAheadMinPage` tokens
/// with the tile's page ids read ahead, `mla_ws_tile_pages`), then the tile's "full" arrival (one
/// per warp, after the async-proxy fence); fp8: the tile's bytes copied into the stage and
/// converted there (`mla_ws_fp8_tile`, with the block scales when `kBlock`), then the "full"
/// arrival. `Smem` (`full0`, `empty0`, `stage(st)`) holds a ring of
/// `kStages` stages (the two-CTA narrow kernel's: one).
template <int kKv, bool kBlock = false, int kStages = kMlaWsStages, class Smem = MlaWsSmem>
__device__ __forceinline__ void mla_ws_produce(const MlaParams& p, const MlaCta& c, const Smem& sm,
                                               int pt, int lane, int begin, int end, int n_tiles) {
  const auto arrive_full = [&](int t) {
    arch::fence_proxy_async();  // generic-proxy writes (cp.async, stores) → read by wgmma
    __syncwarp();
    if (lane == 0) arch::mbar_arrive(sm.full0 + 8 * (t % kStages));
  };
  const auto wait_empty = [&](int t) {
    if (t >= kStages) arch::mbar_wait(sm.empty0 + 8 * (t % kStages), ((t / kStages) - 1) & 1);
  };
  if constexpr (kKv == tile::kKvSame) {
    const std::uint64_t policy = arch::l2_evict_first_policy();
    if (kStages > 1 && p.page_size >= kMlaWsPagesAheadMinPage) {
      std::int32_t page[kMlaWsThreadKeys];
      mla_ws_tile_pages(p, c, pt, begin, end, page);
#pragma unroll 1
      for (int t = 0; t < n_tiles; ++t) {
        const int t0 = begin + t * kMlaWsTileKeys;
        wait_empty(t);
        mla_ws_copy_tile(p, pt, t0, page, sm.stage(t % kStages), policy);
        arch::cp_async_commit();
        // the next tile's pages read while this one's copies fly; tile t landed (this thread's
        // copies), then its arrival: never held back by the next tile's "empty", which the
        // consumers may complete only after this "full" (warpgroup 0 releases tile t - 1 once
        // it has issued the scores of tile t)
        if (t + 1 < n_tiles) mla_ws_tile_pages(p, c, pt, t0 + kMlaWsTileKeys, end, page);
        arch::cp_async_wait<0>();
        arrive_full(t);
      }
      return;
    }
#pragma unroll 1
    for (int t = 0; t < n_tiles; ++t) {
      wait_empty(t);
      mla_ws_copy_tile_keys(p, c, pt, begin + t * kMlaWsTileKeys, end, sm.stage(t % kStages),
                            policy);
      arch::cp_async_commit();
      arch::cp_async_wait<0>();
      arrive_full(t);
    }
  } else {
    const std::uint64_t policy = arch::l2_evict_first_policy();
#pragma unroll 1
    for (int t = 0; t < n_tiles; ++t) {
      wait_empty(t);
      mla_ws_fp8_tile<kKv, kBlock>(p, c, pt, begin + t * kMlaWsTileKeys, end, sm.stage(t % kStages),
                                   policy);
      arrive_full(t);
    }
  }
}

/// The wgmma descriptors of the scores' k-step `ks` over the query tile and the K tile of ring
/// stage `st` (both K-major, 128-byte swizzled, 64-column parts `kMlaWsPartBytes` apart), as two
/// words: the low one the start address >> 4 and the leading byte offset (16 bytes: unused by the
/// swizzled K-major layout), plus the k-step's offset >> 4 (no carry: shared addresses are below
/// 2^18; k-step ks: 16 columns of part ks / 4, 32 bytes into its 128-byte rows); the high one the
/// 8-row groups' stride (1024 bytes) and the 128-byte swizzle. `key0` (a multiple of 8): the K
/// tile's rows read from that key on (the balanced kernel's half of a tile).
struct MlaWsScoreDescs {
  static constexpr std::uint32_t kHi = (1024u >> 4) | (1u << 30);
  std::uint32_t q_lo, k_lo;
  __device__ __forceinline__ MlaWsScoreDescs(const MlaWsSmem& sm, int st, int key0 = 0)
      : q_lo(((arch::smem_addr(sm.q) & 0x3FFFFu) >> 4) | (1u << 16)),
        k_lo((((sm.stage(st) + static_cast<std::uint32_t>(key0) * 128) & 0x3FFFFu) >> 4) |
             (1u << 16)) {}
  __device__ static __forceinline__ std::uint32_t off(int ks) {
    return ((ks >> 2) * kMlaWsPartBytes + (ks & 3) * 32) >> 4;
  }
  __device__ __forceinline__ std::uint64_t q(int ks) const {
    return arch::desc_join(q_lo + off(ks), kHi);
  }
  __device__ __forceinline__ std::uint64_t k(int ks) const {
    return arch::desc_join(k_lo + off(ks), kHi);
  }
};

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
