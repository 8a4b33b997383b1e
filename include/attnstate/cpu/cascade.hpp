/// @file cascade.hpp
/// @brief Cascade (shared-prefix) attention: the level description shared by every backend, and
///        the CPU implementation (the reference).
///
/// A cascade splits each request's KV into *levels*. Every level is a set of KV segments in one
/// paged pool; each request uses exactly one segment of each level (possibly an empty one), and
/// many requests may share a segment. Typical: level 0 = a system prompt shared by the whole
/// batch, level 1 = each request's own suffix. The result for a request equals plain attention
/// over the concatenation of its segments in level order, to rounding:
/// `state(q, L0 ∪ L1 ∪ ...) = state(q, L0) ⊕ state(q, L1) ⊕ ...`.
#pragma once

#include <cstdint>

#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"

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
  const std::int32_t* page_indptr = nullptr;     ///< `(num_segments + 1)` page offsets.
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
};

namespace cpu {

/// Cascade attention on the CPU: for every request `b`, new token `t` and query head `h`, the
/// state of `q[b, t, h]` over the concatenation of the request's segments at every level, each
/// level computed as its own state and the levels merged with ⊕ (fp32 accumulation).
///
/// @param q           queries `(batch, q_len, H_q, head_dim)`, f32/f16/bf16, host memory, last
///                    dim contiguous; `1 ≤ q_len ≤ kMaxCascadeQueryLen`, `H_q % H_kv == 0`.
/// @param kv          the paged pool: `k`, `v`, `dtype` (f32/f16/bf16), `layout`, `num_pages`,
///                    `page_size`, `heads_kv`, `head_dim`, `page_stride` are read; its page-table
///                    fields (`page_indptr`, `block_table`, `seq_lens`, `batch`) are ignored.
/// @param levels      `num_levels` level descriptions (host arrays), see `CascadeLevel`.
/// @param num_levels  `1 ≤ num_levels ≤ kMaxCascadeLevels`.
/// @param options     scale and causal masking.
/// @param out         state `(batch · q_len, H_q, head_dim)`, token `b · q_len + t`; written in
///                    its own dtype and base. A request with no keys gets `(0, -inf)`. Its
///                    memory must be disjoint from `q`, both KV pools and every level array.
///                    A batch of 0 requests is a no-op (the levels are not read).
/// @throws Error `kInvalidArgument` naming the argument on a null pointer, a shape or stride
///         mismatch, a non-monotone or out-of-range indptr, a page index outside the pool, a
///         segment longer than its pages, or a non-host view.
void cascade_attention(const ConstTensorView& q, const PagedKvCache& kv, const CascadeLevel* levels,
                       int num_levels, const CascadeOptions& options, StateView out);

}  // namespace cpu
}  // namespace attnstate
