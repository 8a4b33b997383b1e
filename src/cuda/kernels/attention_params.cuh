/// @file kernels/attention_params.cuh
/// @brief The argument fields every attention kernel reads (the decode's and the cascade levels'
///        parameter blocks begin with them), and their one host-side fill.
#pragma once

#include <cstdint>

#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace cuda {

/// The queries, the paged K/V, the shape and the score map of an attention launch.
struct AttentionParams {
  const void* q;            ///< Queries `(batch, q_len, heads_q, D)`.
  std::int64_t q_stride_b;  ///< Elements between requests.
  std::int64_t q_stride_t;  ///< Elements between new tokens.
  std::int64_t q_stride_h;  ///< Elements between heads.
  const void* k;            ///< K pool.
  const void* v;            ///< V pool.
  std::int64_t page_elems;  ///< Elements between pages.
  std::int64_t num_pages;   ///< Pages in the pool (page ids are clamped to it).
  std::int32_t page_size;   ///< Tokens per page.
  std::int32_t heads_kv;    ///< KV heads.
  std::int32_t layout_hnd;  ///< 1 for the HND page layout, 0 for NHD.
  /// CSR page ranges of the launch's work units (the decode's requests, a level's segments) and
  /// their page ids.
  const std::int32_t* page_indptr;
  const std::int32_t* page_indices;
  std::int32_t batch;    ///< Requests.
  std::int32_t q_len;    ///< New tokens per request.
  std::int32_t heads_q;  ///< Query heads.
  std::int32_t group;    ///< Query heads per KV head.
  float s2_scale;        ///< `scale · log2(e)`.
  /// The variant instances' score map and window: the softmax scale and the logits soft cap of
  /// `cap · tanh(dot · scale / cap)` (0: none), and `window_left` (-1: none).
  float scale;
  float soft_cap;
  std::int32_t window_left = -1;
};

/// Fills `a` from the queries `q`, the cache `kv` (its CSR page table: a launch over other work
/// units sets its own) and the score map (`scale`, `soft_cap`; a window past any 32-bit length
/// is none).
void fill_attention_params(AttentionParams& a, const ConstTensorView& q, const PagedKvCache& kv,
                           std::int64_t batch, std::int64_t q_len, std::int64_t heads_q,
                           float scale, float soft_cap, std::int64_t window_left);

}  // namespace cuda
}  // namespace attnstate
