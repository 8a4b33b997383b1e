/// @file kernels/cascade/params.cuh
/// @brief The arguments of one cascade level launch (shared by the host launchers, the tile
///        parts and the three level kernels).
#pragma once

#include <cstdint>

#include "cuda/kernels/attention_params.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Arguments of one level launch (a small POD passed by value): the attention fields
/// (`AttentionParams`: queries, paged K/V with the level's per-segment CSR page table, shape,
/// score map), then the level's own.
struct CascadeLevelParams : AttentionParams {
  int page_shift;                      ///< log2(page_size) when a power of two, else -1.
  int prefetch_pages;                  ///< 1: fetch a KV tile's page ids one tile ahead.
  const std::int32_t* request_indptr;  ///< `(num_segments + 1)`.
  const std::int32_t* seg_lens;        ///< `(num_segments)`.
  int num_segments;                    ///< Segments of the level.
  int chunk;                           ///< KV tokens per split.
  int max_splits;                      ///< Splits per segment in the grid.
  int max_tiles;                       ///< Row tiles per segment in the grid.
  int causal_tail;                     ///< 1 when the causal mask applies (last level, causal).
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
  int ws_pingpong;  ///< Warp-specialised kernel: 1 to alternate the warpgroups' matrix products.
  /// The window's positions (`window_left` of `AttentionParams`): a row sees the keys from
  /// `pos - window_left` on, `pos` its position counted from the segment's first key,
  /// `tails[req] - q_len + t` with `causal_pos` (else `tails[req] - 1`).
  int causal_pos;
  /// Keys from the segment's first to its request's last, per request (the window only; written
  /// by `cascade_tails_kernel` before the levels run).
  const std::int32_t* tails;
};

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
