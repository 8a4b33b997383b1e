/// @file kernels/decode/split_loader.cuh
/// @brief The split decode kernel's loader (internal): where a warp's K/V tiles of its split
///        lie in the paged cache and their copies into the warp's cp.async ring (16-bit K/V, or
///        fp8 moved as 16-bit units). Parts of the kernel's mainloop, inlined there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/decode_split.hpp"
#include "cuda/kernels/decode/params.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/paged_kv.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// The id of page `pidx` of request `b` (its block-table row, or its CSR page ids from
/// `csr_base`), clamped to the pool. (References, as the kernel's lambda captured them: so the
/// machine code stays the same.)
__device__ __forceinline__ std::int64_t split_page_id(const DecodeParams& p, const int& b,
                                                      const std::int64_t& csr_base,
                                                      std::int64_t pidx) {
  return tile::clamp_page(p.block_table != nullptr ? p.block_table[b * p.block_table_stride + pidx]
                                                   : p.page_indices[csr_base + pidx],
                          p.num_pages);
}

/// Where warp `warp`'s tile `it` of the token `range` lies (0 past its `my_tiles` tiles): its
/// one page's id (`page_id` of its page index) when pages hold whole tiles (`tile_in_page`),
/// else this lane's `lane_row_offset` (the tile's page ids in one parallel load, shuffled by the
/// copy). (References, as the kernel's lambda captured them: so the machine code stays the
/// same.)
template <class PageId, class InPage>
__device__ __forceinline__ std::int64_t split_tile_pid(const DecodeParams& p,
                                                       const TokenRange& range, const int& warp,
                                                       const int& lane, const int& my_tiles,
                                                       const bool& tile_in_page, PageId& page_id,
                                                       InPage& in_page, int it) {
  constexpr int kRows = kDecodeTileRows;
  const int t0 = range.begin + (warp + kDecodeWarps * it) * kRows;
  if (it >= my_tiles) return 0;
  if (!tile_in_page) return tile::lane_row_offset<kRows>(p, page_id, in_page, lane, t0, range.end);
  return page_id(t0 / p.page_size);
}

/// As `split_tile_pid` (`tile_pid`) for one of the warp's first `kSpec` tiles, from the
/// speculative load `spec_pid` when it applies (the split starts at `spec_t0`, where the
/// speculation assumed; the id clamped like `page_id`).
template <int kSpec, class TilePid>
__device__ __forceinline__ std::int64_t split_first_pid(
    const DecodeParams& p, const TokenRange& range, const int& warp, const int& my_tiles,
    const bool& tile_in_page, const std::int32_t (&spec_pid)[kSpec], const std::uint32_t& spec_t0,
    TilePid& tile_pid, int it) {
#pragma unroll
  for (int k = 0; k < kSpec; ++k) {
    if (k == it && tile_in_page && it < my_tiles && spec_pid[k] >= 0 &&
        static_cast<std::uint32_t>(range.begin + warp * kDecodeTileRows) == spec_t0) {
      const std::int64_t id = spec_pid[k];  // >= 0: only the upper clamp can apply
      return id < p.num_pages ? id : p.num_pages - 1;
    }
  }
  return tile_pid(it);
}

/// Copies tile `it` of warp `warp`'s tiles of the token `range` (page `pid`, or over pages
/// smaller than a tile this lane's row offset, `lane_row_offset`) into ring stage `stage` of its
/// ring at `ring`: from one page by the lane's precomputed chunk addressing (`lane_r0`,
/// `lane_col`, `row_stride`; `in_page`, `units`: the in-page offset and the copies' 16-bit
/// units), else chunk by chunk (keys past the range zero-filled, L2 `policy`). (References, as
/// the kernel's lambda captured them: so the machine code stays the same.)
template <int D, int kStages, int kKv, class InPage, class Units>
__device__ __forceinline__ void split_load_tile(
    const DecodeParams& p, const TokenRange& range, const int& warp, const int& lane,
    const std::uint32_t& ring, const bool& tile_in_page, InPage& in_page, Units& units,
    const int& lane_r0, const int& lane_col, const std::uint16_t* const& kpool,
    const std::uint16_t* const& vpool, const std::int64_t& row_stride, const std::uint64_t& policy,
    int it, int stage, std::int64_t pid) {
  constexpr int kRows = kDecodeTileRows;
  constexpr int kKvBytes = kKv != tile::kKvSame ? 1 : 2;
  constexpr int kDu = D * kKvBytes / 2;  // a row in the copies' 16-bit units
  constexpr std::uint32_t kTileBytes = kRows * D * kKvBytes;
  constexpr std::uint32_t kStageBytes = 2 * kTileBytes;
  const int t0 = range.begin + (warp + kDecodeWarps * it) * kRows;
  const std::uint32_t kd = ring + static_cast<std::uint32_t>(stage) * kStageBytes;
  const std::uint32_t vd = kd + kTileBytes;
  if (tile_in_page) {  // per-lane source offsets precomputed: one page holds the tile
    const std::int64_t base =
        units(pid * p.page_elems + in_page(t0 % p.page_size + lane_r0)) + lane_col * 8;
    tile::copy_kv_tile_in_page<kDu, kRows>(kd, vd, kpool, vpool, base, row_stride, t0, range.end,
                                           policy);
    return;
  }
  // Any page size: each chunk's offset from the lane of its row.
  tile::copy_kv_tile_any_page<kDu, kRows>(kd, vd, kpool, vpool, policy, units(pid), lane, t0,
                                          range.end);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
