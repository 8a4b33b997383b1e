/// @file kernels/mla/segment.cuh
/// @brief The segment scheduler and the level epilogue of the MLA cascade's level kernel
///        (internal): which (segment, tile of 64 rows of the segment's requests, split) a CTA
///        takes (`mla_segment_schedule`, over the decode's `mla_schedule` with the level's
///        tables as the requests'), the query tile of rows of several requests
///        (`mla_load_segment_queries`), the rows' key limits (`mla_segment_row_limits`: causal in
///        the last level) and the partial states written to the workspace stack
///        (`mla_write_level_rows`, the empty state past the segment's splits). Parts of
///        `mla_cascade_level_kernel`, inlined there.
///
/// The rows of a segment are its requests' `q_len × heads` rows, one request after the other, so
/// the requests sharing a prefix share the CTA's K/V tiles (with 16 heads at q_len 1, four
/// requests a tile). Row `r` of request `b` is row `b · q_len · heads + r` of the partial states,
/// a dense fp32 stack `[slot][batch · q_len][heads][512]` (LSEs base 2) that `merge_states` folds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "cuda/arch/memory.cuh"
#include "cuda/kernels/mla/epilogue.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/params.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// Everything a level kernel reads: the decode's parameters with the level's tables in place of
/// the requests' (`page_indptr`, `page_indices`, `seq_lens` indexed by segment; `row_tiles` the
/// row tiles of the largest segment; `splits` the level's layout; the output fields unused),
/// the segments' requests and where the level's partial states go.
struct MlaSegmentParams {
  MlaParams mla;
  const std::int32_t* request_indptr;  ///< `(num_segments + 1)` request offsets of the level.
  bool causal;                         ///< The last level with causal masking.
  std::int64_t slot0;                  ///< First slot of the level's splits in the stack.
  std::int64_t stack_rows;             ///< Rows of a slot: `batch · q_len · heads`.
  float* stack_o;                      ///< `[slot][stack_rows][512]` fp32.
  float* stack_lse;                    ///< `[slot][stack_rows]` base 2.
};

/// The CTA's segment (`c.b`), row tile (`c.mt`), split (`c.s`) and the segment's page range, with
/// `c.row0` and `c.rows_here` over the segment's rows; `req0` its first request. `rows_here` ≤ 0:
/// a tile past the segment's rows (the CTA has no work).
__device__ __forceinline__ MlaCta mla_segment_schedule(const MlaSegmentParams& sp, int* req0) {
  MlaCta c = mla_schedule(sp.mla);
  const std::int32_t r0 = sp.request_indptr[c.b];
  const std::int64_t n = static_cast<std::int64_t>(sp.request_indptr[c.b + 1]) - r0;
  const std::int64_t seg_rows = n > 0 ? n * sp.mla.rows : 0;
  const std::int64_t left = seg_rows - c.row0;
  c.rows_here = left < kMlaTileRows ? static_cast<int>(left < 0 ? 0 : left) : kMlaTileRows;
  *req0 = r0;
  return c;
}

/// Copies the CTA's query rows into the query tile at `q_s` (shared address): tile row `r` is
/// segment row `row0 + r`, i.e. request `req0 + (row0 + r) / rows`, its row `(row0 + r) % rows`
/// (token-major: head fastest); rows past the segment's are zero-filled.
__device__ __forceinline__ void mla_load_segment_queries(const MlaParams& p, const MlaCta& c,
                                                         int req0, int tid, std::uint32_t q_s) {
  constexpr int kChunks = kMlaTileRows * kMlaRowChunks;
#pragma unroll 1
  for (int i = tid; i < kChunks; i += kMlaThreads) {
    const int r = i / kMlaRowChunks;
    const int col = i % kMlaRowChunks;
    const bool valid = r < c.rows_here;
    const int sr = valid ? c.row0 + r : 0;
    const std::int64_t b = req0 + sr / p.rows;
    const int t = (sr % p.rows) / p.group;
    const int h = sr % p.group;
    const std::uint16_t* src =
        col < kMlaLatentChunks
            ? p.q_nope + b * p.qn_stride_b + t * p.qn_stride_t + h * p.qn_stride_h + col * 8
            : p.q_pe + b * p.qp_stride_b + t * p.qp_stride_t + h * p.qp_stride_h +
                  (col - kMlaLatentChunks) * 8;
    arch::cp_async_16_zfill(q_s + mla_chunk(r, col), valid ? src : p.q_nope, valid ? 16 : 0);
  }
}

/// The exclusive key ends of this thread's rows (lane/4 and lane/4 + 8 of row group `rg`): with
/// `sp.causal`, row `i` of a request (its `i`-th new token) sees the segment's keys up to
/// `len − q_len + i`; otherwise every key of the split. Rows past the tile's see none.
__device__ __forceinline__ void mla_segment_row_limits(const MlaSegmentParams& sp, const MlaCta& c,
                                                       int lane, int rg, int len, int end,
                                                       int (&lim)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * rg + (lane >> 2) + 8 * h;
    if (r < c.rows_here) {
      const int qi = ((c.row0 + r) % sp.mla.rows) / sp.mla.group;
      lim[h] = sp.causal ? min(end, len - sp.mla.q_len + qi + 1) : end;
    } else {
      lim[h] = 0;
    }
  }
}

/// The CTA's rows from shared memory (`o` [64][512], `lse` [64]) into slot `slot0 + c.s` of the
/// stack, rows `req0 · rows + row0 ..`; with `o` null (a split past the segment's), the empty
/// state `(0, -inf)` (`mla_write_stack_rows`).
__device__ __forceinline__ void mla_write_level_rows(const MlaSegmentParams& sp, const MlaCta& c,
                                                     int req0, int tid, const float* o,
                                                     const float* lse) {
  const std::int64_t first =
      (sp.slot0 + c.s) * sp.stack_rows + static_cast<std::int64_t>(req0) * sp.mla.rows + c.row0;
  mla_write_stack_rows(sp.stack_o, sp.stack_lse, first, c.rows_here, tid, o, lse);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
