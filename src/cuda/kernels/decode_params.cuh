/// @file decode_params.cuh
/// @brief Parameters of the split-KV decode kernel (internal, shared by the launcher and the
///        kernel), and the workspace layout.
#pragma once

#include <cstdint>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/lse_base.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// Query rows of one CTA tile (the M of the tensor-core MMAs).
constexpr int kDecodeTileRows = 16;
/// Warps per CTA (each streams its own 16-token tiles of the split).
constexpr int kDecodeWarps = 4;
/// cp.async pipeline depth per warp (build-time knob for tuning experiments).
#ifndef ATTNSTATE_DECODE_STAGES
#define ATTNSTATE_DECODE_STAGES 3
#endif
constexpr int kDecodeStages = ATTNSTATE_DECODE_STAGES;
/// Minimum resident CTAs per SM requested from the compiler (caps registers per thread).
#ifndef ATTNSTATE_DECODE_MIN_BLOCKS
#define ATTNSTATE_DECODE_MIN_BLOCKS 1
#endif
constexpr int kDecodeMinBlocks = ATTNSTATE_DECODE_MIN_BLOCKS;
/// Tiles that lie in one page use per-lane precomputed source offsets (build-time knob, 1).
#ifndef ATTNSTATE_DECODE_FAST_ADDR
#define ATTNSTATE_DECODE_FAST_ADDR 1
#endif

/// Everything the decode kernel reads besides its template arguments.
struct DecodeParams {
  // queries (batch, q_len, heads_q, head_dim), element strides
  const void* q;
  std::int64_t q_stride_b, q_stride_t, q_stride_h;
  // paged KV
  const void* k;
  const void* v;
  std::int64_t page_elems;
  std::int64_t num_pages;
  std::int32_t page_size;
  std::int32_t heads_kv;
  std::int32_t layout_hnd;  // 1 for HND, 0 for NHD
  const std::int32_t* page_indptr;
  const std::int32_t* page_indices;
  const std::int32_t* block_table;
  std::int64_t block_table_stride;
  const std::int32_t* seq_lens;
  // shape
  std::int32_t batch, q_len, heads_q, group, rows, row_tiles;
  SplitLayout splits;
  float s2_scale;  // softmax scale · log2(e)
  // output state
  void* out_o;
  float* out_lse;
  std::int64_t o_stride_token, o_stride_head, lse_stride_token, lse_stride_head;
  DType out_dtype;
  LseBase out_base;
  // workspace: partial states [(b, hkv, row tile, split, row)] and tickets [(b, hkv, row tile)]
  float* ws_o;
  float* ws_lse;
  std::int32_t* tickets;
  bool skip_combine;
};

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
