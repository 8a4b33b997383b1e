/// @file cascade.hpp
/// @brief The backend-neutral description of a cascade (shared-prefix) attention: levels of KV
///        segments and the options, taken by the CPU and CUDA backends alike.
///
/// A cascade splits each request's KV into *levels*. Every level is a set of KV segments in one
/// paged pool; each request uses exactly one segment of each level (possibly an empty one), and
/// many requests may share a segment. Typical: level 0 = a system prompt shared by the whole
/// batch, level 1 = each request's own suffix. The result for a request equals plain attention
/// over the concatenation of its segments in level order, to rounding:
/// `state(q, L0 ∪ L1 ∪ ...) = state(q, L0) ⊕ state(q, L1) ⊕ ...`.
#pragma once

#include <cstdint>

#include "attnstate/core/variant.hpp"

namespace attnstate {

/// Most levels a cascade may have.
constexpr int kMaxCascadeLevels = 8;
/// Most new query tokens per request (speculative decode).
constexpr int kMaxCascadeQueryLen = 8;

/// One level of a cascade: `num_segments` KV segments of a paged pool and the requests that use
/// each of them.
///
/// Requests are grouped contiguously: segment `s` serves requests
/// `[request_indptr[s], request_indptr[s+1])`, with `request_indptr[0] == 0` and
/// `request_indptr[num_segments] == batch`, so every request uses exactly one segment per level
/// (a request with nothing at this level uses a segment of length 0). Segment `s` holds
/// `seg_lens[s]` tokens in pages `page_indices[page_indptr[s] .. page_indptr[s+1])` in order:
/// token `i` lives in page `page_indices[page_indptr[s] + i / page_size]`, slot `i % page_size`.
///
/// All pointers are in the memory of the call that takes the level (host for the CPU backend and
/// for CUDA plans, device for CUDA runs).
struct CascadeLevel {
  std::int64_t num_segments = 0;                 ///< Segments of this level (≥ 1).
  const std::int32_t* request_indptr = nullptr;  ///< `(num_segments + 1)` request offsets.
  const std::int32_t* page_indptr = nullptr;     ///< `(num_segments + 1)` page offsets, [0] = 0.
  const std::int32_t* page_indices = nullptr;    ///< Page ids `(page_indptr[num_segments])`.
  const std::int32_t* seg_lens = nullptr;        ///< `(num_segments)` tokens per segment (≥ 0).
};

/// Options of a cascade call.
struct CascadeOptions {
  float scale = 0.f;  ///< Softmax scale; 0 means `1/sqrt(head_dim)`.
  /// Causal masking among the new tokens (matters for `q_len > 1` only). The new tokens are the
  /// last `q_len` keys of the request's LAST-level segment: query row `t` sees the last-level
  /// keys `j < len - (q_len - 1 - t)` and every key of the earlier levels. Requires every
  /// last-level segment to hold at least `q_len - 1` tokens.
  bool causal = true;
  /// Sliding window and logits soft cap (default: plain attention). Positions count the keys of
  /// a request's concatenated segments in level order (`total` of them): with `causal`, row `t`
  /// is at `p = total - q_len + t`; without it, every row is at `p = total - 1` (the last key).
  /// Row `t` sees the keys at positions `[max(0, p - window_left), p]` across all the levels, so
  /// a shared segment entirely before a row's window contributes the empty state to it.
  AttentionVariant variant;
};

}  // namespace attnstate
