/// @file kernels/mla/params.cuh
/// @brief Parameters of the MLA decode kernel (internal, shared by the launcher and the kernel):
///        the shape read from the catalog and the argument block.
#pragma once

#include <cstdint>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "catalog/kernel_shapes.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

// The kernel's shape (`catalog/kernel_shapes.hpp`: one source for the kernel, the catalog's rows
// and the planner).
using catalog::kMlaHeadDim;
using catalog::kMlaLoraRank;
using catalog::kMlaRopeDim;
using catalog::kMlaStages;
using catalog::kMlaTileKeys;
using catalog::kMlaTileRows;
using catalog::kMlaWarps;
using catalog::mla_smem_bytes;

/// Threads of an MLA CTA.
constexpr int kMlaThreads = kMlaWarps * 32;
/// Bytes of one row (a query row or a latent token) of the bf16 tiles in shared memory.
constexpr int kMlaRowBytes = kMlaHeadDim * 2;
/// 16-byte chunks of such a row: 64 latent, then 8 rotary.
constexpr int kMlaRowChunks = kMlaRowBytes / 16;
constexpr int kMlaLatentChunks = kMlaLoraRank * 2 / 16;
/// Output columns of one warp (each warp owns one half of the latent columns).
constexpr int kMlaWarpCols = kMlaLoraRank / 2;
static_assert(kMlaTileRows == 16 * (kMlaWarps / 2), "4 row groups of 16 rows");
static_assert(kMlaThreads == 8 * kMlaTileKeys, "8 threads copy each token of a tile");
static_assert(kMlaRowChunks == 9 * 8, "a token is 9 chunks for each of its 8 threads");
/// Latent columns per block scale the kernels take (FlashMLA's fp8 rows), and the scales of a
/// token (one 16-byte load).
constexpr int kMlaBlockCols = 128;
constexpr int kMlaBlocks = kMlaLoraRank / kMlaBlockCols;
static_assert(kMlaBlocks == 4, "a token's block scales are one 16-byte vector");
/// Extra shared memory of the mma.sync kernels with block scales: each thread's 4 scales of its
/// token of each stage.
constexpr int kMlaBlockScaleSmem = kMlaStages * kMlaThreads * 16;
static_assert(mla_smem_bytes(true) + kMlaBlockScaleSmem <= 227 * 1024,
              "within an sm_90 CTA's shared memory");

/// Everything the MLA decode kernel reads besides its template argument.
struct MlaParams {
  // queries (bf16, 16-byte aligned rows): element strides of (request, token, head)
  const std::uint16_t* q_nope;
  const std::uint16_t* q_pe;
  std::int64_t qn_stride_b, qn_stride_t, qn_stride_h;
  std::int64_t qp_stride_b, qp_stride_t, qp_stride_h;
  // the latent cache, addressed in bytes: token `slot` of page `page` at `page · page_bytes +
  // slot · token_bytes` of each part
  const unsigned char* ckv;
  const unsigned char* kpe;
  std::int64_t ckv_token_bytes, ckv_page_bytes, kpe_token_bytes, kpe_page_bytes;
  bool kpe_fp8;  // the rotary part is of the latent part's fp8 format (else bf16)
  KvScale ckv_scale;
  KvScale kpe_scale;
  // page table: a block table, else CSR; the requests' lengths
  const std::int32_t* page_indptr;
  const std::int32_t* page_indices;
  const std::int32_t* block_table;
  std::int64_t block_table_stride;
  const std::int32_t* seq_lens;
  std::int64_t num_pages;
  std::int32_t page_size;
  // shape: `group` query heads per token (the name `tile::causal_row_limits` reads), `rows` =
  // q_len · group rows per request in `row_tiles` tiles
  std::int32_t q_len, group, rows, row_tiles;
  SplitLayout splits;
  float s2_scale;  // softmax scale · log2 e
  // output state
  void* out_o;
  float* out_lse;
  std::int64_t o_stride_token, o_stride_head, lse_stride_token, lse_stride_head;
  DType out_dtype;
  LseBase out_base;
  bool out_vec4;  // 4 consecutive o elements can be stored as one aligned vector
  // split merge through the workspace: partial states [(b, row tile, split, row)] and a ticket
  // per (b, row tile); or, with `stack_rows > 0` (the stacked merge), the partial states of
  // every split (the empty state past a request's) in a stack [split][stack_rows][512] that
  // `merge_states` folds after the kernel, no ticket
  float* ws_o;
  float* ws_lse;
  std::int32_t* tickets;
  std::int64_t stack_rows;
  // attention sinks: `group` natural-base logits merged once into each output row; null = none
  const float* sinks;
  // (last: the fields above keep their offsets) per-token block scales of an fp8 latent part (null:
  // none): the 4 fp32 scales of token `slot` of page `page` (one per 128 latent columns, 16-byte
  // aligned) at `page · bscale_page_bytes + slot · bscale_token_bytes`
  const unsigned char* ckv_bscale;
  std::int64_t bscale_token_bytes, bscale_page_bytes;
};

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
