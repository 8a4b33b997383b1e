/// @file tile/paged_kv.cuh
/// @brief Device parts of paged K/V addressing shared by the decode and cascade kernels.
#pragma once

#include <cstdint>

#include "cuda/arch/memory.cuh"

namespace attnstate {
namespace cuda {
namespace tile {

/// A page id read from a page table, clamped into the pool `[0, num_pages)` (`num_pages` ≥ 1):
/// whatever a table holds, no copy reads outside the pool.
__device__ __forceinline__ std::int64_t clamp_page(std::int64_t id, std::int64_t num_pages) {
  if (id < 0) id = 0;
  if (id >= num_pages) id = num_pages - 1;
  return id;
}

/// Element offset, inside a page, of key slot `slot` of KV head `hkv` (NHD or HND): `p` holds
/// the pool's `layout_hnd` (1 HND, 0 NHD), `page_size` and `heads_kv`.
template <int D, class P>
__device__ __forceinline__ std::int64_t kv_in_page(const P& p, int hkv, std::int64_t slot) {
  return p.layout_hnd ? (static_cast<std::int64_t>(hkv) * p.page_size + slot) * D
                      : (slot * p.heads_kv + hkv) * static_cast<std::int64_t>(D);
}

/// 16-byte copy global → shared, marked evict-first in the L2 (the cache is streamed once).
__device__ __forceinline__ void kv_copy_16(std::uint32_t dst, const void* src, int bytes,
                                           std::uint64_t policy) {
  arch::cp_async_16_zfill_policy(dst, src, bytes, policy);
}

/// Copies one `kRows`-key K/V tile that lies in one page into the XOR-swizzled stage at `kd` (K)
/// and `vd` (V) (16-byte chunk `c` of row `r` at `c ^ (r & 7)`): lane `l` copies column
/// `l % (D / 8)` of rows `l / (D / 8) + i · (32 / (D / 8))`, whose source offsets are `base` plus
/// multiples of `row_stride`; keys at or past `end` (`t0` is the tile's first) are zero-filled.
template <int D, int kRows>
__device__ __forceinline__ void copy_kv_tile_in_page(std::uint32_t kd, std::uint32_t vd,
                                                     const std::uint16_t* kpool,
                                                     const std::uint16_t* vpool, std::int64_t base,
                                                     std::int64_t row_stride, int t0, int end,
                                                     std::uint64_t policy) {
  constexpr int kCpr = D / 8;
  // A warp's 32 lanes cover whole rows (`kRowStep` of them) and the tile's rows are whole steps:
  // otherwise some chunks of every tile would never be copied (D = 192: 24 chunks a row).
  static_assert(D % 8 == 0 && 32 % kCpr == 0, "a row's 16-byte chunks divide a warp's lanes");
  static_assert(kRows % (32 / kCpr) == 0, "the tile's rows are whole lane steps");
  // the swizzle `c ^ (r & 7)` stays inside a row of at least 8 chunks
  static_assert(kCpr % 8 == 0, "rows of a multiple of 8 chunks (the swizzle)");
  constexpr int kRowStep = 32 / kCpr;
  constexpr int kChunksPerLane = kRows * kCpr / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int lane_r0 = lane / kCpr;
  const int lane_col = lane % kCpr;
#pragma unroll
  for (int i = 0; i < kChunksPerLane; ++i) {
    const int r = lane_r0 + i * kRowStep;
    const bool valid = t0 + r < end;
    const std::int64_t off = valid ? base + i * kRowStep * row_stride : 0;
    const int sw = (r * kCpr + (lane_col ^ (r & 7))) * 8;
    kv_copy_16(kd + 2 * sw, kpool + off, valid ? 16 : 0, policy);
    kv_copy_16(vd + 2 * sw, vpool + off, valid ? 16 : 0, policy);
  }
}

/// The element offset a lane contributes to a tile at key `t0` that may span pages (any page
/// size): lane `l` computes the pool offset of key `t0 + l % kRows` (its page id times
/// `page_elems` plus `in_page(slot)`; 0 at or past `end`), so the tile's page ids arrive in one
/// parallel load, and the page arithmetic is done once per key, by the caller a tile ahead of the
/// copy (`copy_kv_tile_any_page` shuffles each chunk's offset from the lane of its row).
template <int kRows, class P, class PageId, class InPage>
__device__ __forceinline__ std::int64_t lane_row_offset(const P& p, PageId& page_id,
                                                        InPage& in_page, int lane, int t0,
                                                        int end) {
  const int t = t0 + (lane & (kRows - 1));
  if (t >= end) return 0;
  const std::int64_t page = t / p.page_size;
  return page_id(page) * p.page_elems + in_page(t - page * p.page_size);
}

/// As `copy_kv_tile_in_page` for a tile at key `t0` in any pages: `lane_off` is this lane's
/// `lane_row_offset` of the tile (row `r`'s offset is lane `r`'s, shuffled: no lookup or page
/// arithmetic on the copy's path). Every lane of the warp takes part (the shuffles).
template <int D, int kRows>
__device__ __forceinline__ void copy_kv_tile_any_page(std::uint32_t kd, std::uint32_t vd,
                                                      const std::uint16_t* const& kpool,
                                                      const std::uint16_t* const& vpool,
                                                      const std::uint64_t& policy,
                                                      std::int64_t lane_off, const int& lane,
                                                      int t0, const int& end) {
  static_assert(kRows <= 32, "one lane per row of the tile");
  constexpr int kCpr = D / 8;
  // every lane copies the same number of chunks, and the swizzle stays inside a row
  static_assert(D % 8 == 0 && (kRows * kCpr) % 32 == 0, "the tile's chunks divide a warp's lanes");
  static_assert(kCpr % 8 == 0, "rows of a multiple of 8 chunks (the swizzle)");
  constexpr int kChunksPerLane = kRows * kCpr / 32;
#pragma unroll
  for (int i = 0; i < kChunksPerLane; ++i) {
    const int c = lane + 32 * i;
    const int r = c / kCpr;
    const int col = c % kCpr;
    const bool valid = t0 + r < end;
    const std::int64_t row = __shfl_sync(0xffffffffu, lane_off, r);
    const std::int64_t off = valid ? row + col * 8 : 0;
    const int sw = (r * kCpr + (col ^ (r & 7))) * 8;
    kv_copy_16(kd + 2 * sw, kpool + off, valid ? 16 : 0, policy);
    kv_copy_16(vd + 2 * sw, vpool + off, valid ? 16 : 0, policy);
  }
}

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
