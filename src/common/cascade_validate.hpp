/// @file cascade_validate.hpp
/// @brief Argument checks of the cascade API shared by the CPU and CUDA backends (private).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/error.hpp"
#include "common/validate.hpp"

namespace attnstate {
namespace detail {

inline std::string cascade_str(std::int64_t v) { return std::to_string(v); }

/// Level-indexed argument name, e.g. "levels[1].seg_lens".
inline std::string cascade_level_arg(int l, const char* field) {
  return "levels[" + std::to_string(l) + "]." + field;
}

/// Checks the KV pool (`check_kv_pool`) and returns the bytes of each of its two pools.
inline std::int64_t check_cascade_pool(const char* func, const PagedKvCache& kv,
                                       MemorySpace space) {
  return check_kv_pool(func, kv, space);
}

/// Checks the query view `(batch, q_len, H_q, head_dim)` against the pool.
inline void check_cascade_query(const char* func, const ConstTensorView& q, const PagedKvCache& kv,
                                MemorySpace space) {
  if (q.data == nullptr && q.shape[0] > 0)
    throw_argument(func, "q.data", "a non-null pointer", "nullptr");
  if (q.space != space) throw_argument(func, "q.space", to_string(space), to_string(q.space));
  check_query_dtype(func, q.dtype);
  if (q.rank != 4)
    throw_argument(func, "q.rank", "4 (batch, q_len, H_q, head_dim)", cascade_str(q.rank));
  if (q.shape[0] < 0) throw_argument(func, "q.shape[0]", "batch >= 0", cascade_str(q.shape[0]));
  if (q.shape[1] < 1 || q.shape[1] > kMaxCascadeQueryLen)
    throw_argument(func, "q.shape[1]", "q_len in 1.." + cascade_str(kMaxCascadeQueryLen),
                   cascade_str(q.shape[1]));
  if (q.shape[2] < 1 || q.shape[2] % kv.heads_kv != 0)
    throw_argument(func, "q.shape[2]",
                   "H_q, a positive multiple of kv.heads_kv = " + cascade_str(kv.heads_kv),
                   cascade_str(q.shape[2]));
  if (q.shape[3] != kv.head_dim)
    throw_argument(func, "q.shape[3]", "head_dim = kv.head_dim = " + cascade_str(kv.head_dim),
                   cascade_str(q.shape[3]));
  if (q.stride[3] != 1) throw_argument(func, "q.stride[3]", "1", cascade_str(q.stride[3]));
  for (int d = 0; d < 3; ++d)
    if (q.stride[d] < 0)
      throw_argument(func, ("q.stride[" + cascade_str(d) + "]").c_str(), ">= 0",
                     cascade_str(q.stride[d]));
  check_tensor_span(func, "q", q);
  check_aligned(func, "q.data", q.data, size_of(q.dtype));
}

/// Checks the output state view `(batch · q_len, H_q, head_dim)`: an output state
/// (`check_output_state`: valid strides whose span fits, pairwise-disjoint `(token, head)` rows)
/// in `space`; with `q` (already checked by `check_cascade_query`), also memory disjoint from it.
inline void check_cascade_out(const char* func, const StateView& out, std::int64_t tokens,
                              std::int64_t heads, std::int64_t head_dim, MemorySpace space,
                              const ConstTensorView* q = nullptr) {
  // the shape first: a wrong head count is reported as such, not as overlapping rows
  if (out.tokens != tokens)
    throw_argument(func, "out.tokens", "batch * q_len = " + cascade_str(tokens),
                   cascade_str(out.tokens));
  if (out.heads != heads)
    throw_argument(func, "out.heads", "H_q = " + cascade_str(heads), cascade_str(out.heads));
  if (out.head_dim != head_dim)
    throw_argument(func, "out.head_dim", cascade_str(head_dim), cascade_str(out.head_dim));
  check_output_state(func, "out", out, out.o, out.lse, space);
  if (q != nullptr) check_disjoint(func, "out", out, "q", q->data, tensor_bytes(*q), nullptr, 0);
}

/// Checks a finite scale and returns the effective one (0 means `1/sqrt(head_dim)`).
inline float cascade_scale(const char* func, const CascadeOptions& options, std::int64_t head_dim) {
  return resolve_scale(func, "options.scale", options.scale, head_dim);
}

/// Throws naming `levels[l].<array>` when one of the level's offset or length arrays is null
/// (`page_indices` too when `need_pages`).
inline void check_level_arrays(const char* func, int l, const CascadeLevel& lv,
                               bool need_pages = false) {
  const auto non_null = [&](const char* field, const void* p) {
    if (p == nullptr)
      throw_argument(func, cascade_level_arg(l, field).c_str(), "a non-null pointer", "nullptr");
  };
  non_null("request_indptr", lv.request_indptr);
  non_null("page_indptr", lv.page_indptr);
  non_null("seg_lens", lv.seg_lens);
  if (need_pages) non_null("page_indices", lv.page_indices);
}

/// Checks the level descriptions (host arrays) against the batch, the pool and the query length.
/// When `pages_optional` is true, a level whose `page_indices` is null is not checked against
/// the pool (a CUDA plan need not see the page ids).
inline void check_cascade_levels(const char* func, const CascadeLevel* levels, int num_levels,
                                 std::int64_t batch, std::int64_t q_len, bool causal,
                                 const PagedKvCache& kv, bool pages_optional) {
  if (levels == nullptr) throw_argument(func, "levels", "a non-null pointer", "nullptr");
  if (num_levels < 1 || num_levels > kMaxCascadeLevels)
    throw_argument(func, "num_levels", "1.." + cascade_str(kMaxCascadeLevels),
                   cascade_str(num_levels));
  for (int l = 0; l < num_levels; ++l) {
    const CascadeLevel& lv = levels[l];
    const std::int64_t ns = lv.num_segments;
    if (ns < 1 || ns > (std::int64_t{1} << 30))
      throw_argument(func, cascade_level_arg(l, "num_segments").c_str(), "1..2^30",
                     cascade_str(ns));
    check_level_arrays(func, l, lv);
    if (lv.request_indptr[0] != 0)
      throw_argument(func, cascade_level_arg(l, "request_indptr").c_str(), "[0] == 0",
                     cascade_str(lv.request_indptr[0]));
    if (lv.request_indptr[ns] != batch)
      throw_argument(func, cascade_level_arg(l, "request_indptr").c_str(),
                     "[num_segments] == batch = " + cascade_str(batch),
                     cascade_str(lv.request_indptr[ns]));
    if (lv.page_indptr[0] != 0)
      throw_argument(func, cascade_level_arg(l, "page_indptr[0]").c_str(), "0",
                     cascade_str(lv.page_indptr[0]));
    for (std::int64_t s = 0; s < ns; ++s) {
      if (lv.request_indptr[s + 1] < lv.request_indptr[s])
        throw_argument(func, cascade_level_arg(l, "request_indptr").c_str(),
                       "non-decreasing offsets", "a decrease at segment " + cascade_str(s));
      if (lv.page_indptr[s + 1] < lv.page_indptr[s])
        throw_argument(func, cascade_level_arg(l, "page_indptr").c_str(), "non-decreasing offsets",
                       "a decrease at segment " + cascade_str(s));
      const std::int64_t len = lv.seg_lens[s];
      const std::int64_t pages = lv.page_indptr[s + 1] - lv.page_indptr[s];
      if (len < 0 || len > pages * kv.page_size)
        throw_argument(func, cascade_level_arg(l, "seg_lens").c_str(),
                       "0 <= seg_lens[s] <= pages * page_size = " +
                           cascade_str(pages * kv.page_size) + " at segment " + cascade_str(s),
                       cascade_str(len));
      const bool used = lv.request_indptr[s + 1] > lv.request_indptr[s];
      if (causal && q_len > 1 && l == num_levels - 1 && used && len < q_len - 1)
        throw_argument(func, cascade_level_arg(l, "seg_lens").c_str(),
                       "a last-level segment of >= q_len - 1 = " + cascade_str(q_len - 1) +
                           " tokens when causal (segment " + cascade_str(s) + ")",
                       cascade_str(len));
    }
    const std::int64_t used_pages = lv.page_indptr[ns];
    if (used_pages > 0 && !(pages_optional && lv.page_indices == nullptr)) {
      if (lv.page_indices == nullptr)
        throw_argument(func, cascade_level_arg(l, "page_indices").c_str(), "a non-null pointer",
                       "nullptr");
      for (std::int64_t s = 0; s < ns; ++s) {
        const std::int64_t need = (lv.seg_lens[s] + kv.page_size - 1) / kv.page_size;
        for (std::int64_t p = lv.page_indptr[s]; p < lv.page_indptr[s] + need; ++p)
          if (lv.page_indices[p] < 0 || lv.page_indices[p] >= kv.num_pages)
            throw_argument(func, cascade_level_arg(l, "page_indices").c_str(),
                           "page ids in [0, kv.num_pages = " + cascade_str(kv.num_pages) + ")",
                           cascade_str(lv.page_indices[p]) + " at position " + cascade_str(p));
      }
    }
  }
}

/// Throws naming `name` unless the bytes `[p, p + bytes)` a call writes (its output or its
/// workspace) are disjoint from the offset and length arrays of level `l`, whose extents
/// follow from `num_segments` (the page ids' extent is known only for host levels: `host`).
inline void check_disjoint_from_level(const char* func, const char* name, const void* p,
                                      std::int64_t bytes, int l, const CascadeLevel& lv,
                                      bool host) {
  const std::int64_t ns = lv.num_segments;
  const auto disjoint = [&](const char* field, const void* in, std::int64_t in_bytes) {
    check_buffer_disjoint(func, name, p, bytes, cascade_level_arg(l, field).c_str(), in, in_bytes);
  };
  disjoint("request_indptr", lv.request_indptr, (ns + 1) * 4);
  disjoint("page_indptr", lv.page_indptr, (ns + 1) * 4);
  disjoint("seg_lens", lv.seg_lens, ns * 4);
  if (host) disjoint("page_indices", lv.page_indices, std::int64_t{lv.page_indptr[ns]} * 4);
}

/// Throws unless the output `out` is disjoint from the arrays of the (checked) levels (host
/// levels: their page ids too): an output over a page table or a length array would change
/// what the call reads.
inline void check_out_disjoint_from_levels(const char* func, const ConstStateView& out,
                                           const CascadeLevel* levels, int num_levels, bool host) {
  for (int l = 0; l < num_levels; ++l) {
    check_disjoint_from_level(func, "out.o", out.o, o_bytes(out), l, levels[l], host);
    check_disjoint_from_level(func, "out.lse", out.lse, lse_bytes(out), l, levels[l], host);
  }
}

}  // namespace detail
}  // namespace attnstate
