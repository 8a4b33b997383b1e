/// @file cascade_levels.hpp
/// @brief Cascade levels from a page table: the shared prefixes of a batch's page lists, found at
///        any depth as a trie over page ids, returned as `CascadeLevel`s and per-request
///        remainders for `cpu::cascade_attention` and `cuda::plan_cascade` / `run_cascade`.
///
/// Host C++, defined in the component `attnstate::cascade_levels`, which `attnstate::cpu` and
/// `attnstate::cuda` link. See docs/cascade.md, "Levels from a page table".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {

/// Options of `build_cascade_levels`.
struct CascadeLevelsOptions {
  /// Fewest tokens a shared segment must hold to be a segment of its own: a shorter shared run
  /// is folded into the segments below it (each group under it, or each request, then reads it
  /// itself). 0 takes every shared page. At least 0.
  std::int64_t min_shared_tokens = 16;
  /// Most levels, the level of the requests' own remainders included:
  /// `1..kMaxCascadeLevels`. Shared structure deeper than `max_levels - 1` levels is folded into
  /// the remainders (1: no shared level at all).
  int max_levels = kMaxCascadeLevels;
  /// New tokens per request of the causal cascade the levels are for (`1..kMaxCascadeQueryLen`):
  /// every remainder then holds at least `q_len - 1` tokens (`CascadeOptions::causal`), and every
  /// request must have that many. A non-causal cascade needs no such room: pass 1.
  std::int64_t q_len = 1;
};

/// The levels of a cascade found in a page table, owning their host arrays.
///
/// Requests are reordered so that the requests of every segment are contiguous: position `i` of
/// the levels is request `order()[i]` of the page table. The order is the depth-first order of
/// the trie with the branches of a node taken by their smallest request index, so it is the
/// identity whenever the table already lists the requests of every shared prefix contiguously
/// (`identity_order()`), and it depends on nothing but the table. The queries must be given to
/// the cascade in this order and its output read back in it: `gather_queries`, `scatter_state`.
///
/// The last level holds each request's own remainder (segment `i` is position `i`, possibly
/// empty; the new tokens of a causal cascade); the levels before it hold shared segments, each
/// serving the positions of one shared prefix, and empty segments for the positions without one
/// at that depth.
class CascadeLevels {
 public:
  /// The host arrays of one level (see `CascadeLevel`).
  struct Arrays {
    std::vector<std::int32_t> request_indptr;  ///< `(num_segments + 1)` position offsets.
    std::vector<std::int32_t> page_indptr;     ///< `(num_segments + 1)` page offsets.
    std::vector<std::int32_t> page_indices;    ///< Page ids of the segments, in order.
    std::vector<std::int32_t> seg_lens;        ///< `(num_segments)` tokens per segment.
  };

  /// The levels of an empty batch: one level with one empty segment serving no request.
  CascadeLevels();
  /// A copy whose views point into its own arrays.
  CascadeLevels(const CascadeLevels& other);
  /// Copies `other`; the views then point into this object's arrays.
  CascadeLevels& operator=(const CascadeLevels& other);
  /// Takes `other`'s arrays (the views stay valid: they move with them).
  CascadeLevels(CascadeLevels&& other) noexcept = default;
  /// Takes `other`'s arrays (the views stay valid: they move with them).
  CascadeLevels& operator=(CascadeLevels&& other) noexcept = default;

  /// Levels, `1..kMaxCascadeLevels` (the remainders' level included).
  int num_levels() const { return static_cast<int>(views_.size()); }
  /// `num_levels()` level views into this object's arrays (valid while it lives unchanged).
  const CascadeLevel* levels() const { return views_.data(); }
  /// The arrays of level `level` (`0..num_levels() - 1`).
  /// @throws Error `kInvalidArgument` naming `level` outside that range.
  const Arrays& arrays(int level) const;
  /// Requests of the batch.
  std::int64_t batch() const { return batch_; }
  /// Tokens per page of the table the levels were built from.
  std::int64_t page_size() const { return page_size_; }
  /// `order()[i]`: the request of the page table at position `i` of the levels.
  const std::vector<std::int32_t>& order() const { return order_; }
  /// True when `order()[i] == i` for every position (no gathering needed).
  bool identity_order() const;
  /// Tokens of all the requests (the keys a plain decode reads per KV head).
  std::int64_t keys_total() const { return keys_total_; }
  /// Tokens of all the segments serving at least one request, each counted once (the keys the
  /// cascade reads per KV head when each segment is read once).
  std::int64_t keys_read() const;

 private:
  friend CascadeLevels build_cascade_levels(const PagedKvCache& table,
                                            const CascadeLevelsOptions& options);
  void refresh_views();

  std::int64_t batch_ = 0;
  std::int64_t page_size_ = 1;
  std::int64_t keys_total_ = 0;
  std::vector<Arrays> arrays_;
  std::vector<CascadeLevel> views_;
  std::vector<std::int32_t> order_;
};

/// Finds the shared prefixes of the requests of a page table and returns them as cascade levels.
///
/// Token `t` of request `b` is slot `t % page_size` of its page `pages(b)[t / page_size]`; two
/// requests share a prefix where they hold the same tokens, i.e. the same page ids in the same
/// places with the same tokens in each. A page id shared by several requests counts as shared
/// only when every one of them holds the same tokens in it: all of the page, or, for the final
/// page of each of them, the same count. Otherwise the page (and what follows) goes into the
/// segments below (each re-reads it: the same tokens, so results are exact). Every segment
/// starts at a page boundary of its requests. Shared runs shorter than
/// `options.min_shared_tokens` are folded into the segments below them, structure deeper than
/// `options.max_levels - 1` into the remainders, and the trailing pages of the shared segments
/// above a remainder shorter than `options.q_len - 1` tokens move into it (for every request
/// below that segment). `cpu::cascade_attention` over the result, with the queries in
/// `order()`, equals `cpu::decode` over the table, to rounding.
///
/// Time and memory `O(batch + total pages)`: every page id is read once to check it, the trie
/// holds a node only where two requests agree (the tail of a request that shares no more with
/// any other is not stored in it), and each output page is written once.
///
/// @param table    the page table: `page_size`, `num_pages`, `batch`, `seq_lens` and either a
///                 CSR table (`page_indptr`, `page_indices`) or a block table (`block_table`,
///                 `block_table_stride`), in host memory (`space`); the pools (`k`, `v`) and
///                 their shape fields are not read. Request `b` owns pages
///                 `pages(b)[0 .. ceil(seq_lens[b] / page_size))`; pages past those are ignored.
/// @param options  minimum shared tokens, maximum levels and the query length.
/// @return the levels, their request order and their arrays.
/// @throws Error `kInvalidArgument` naming the argument: `table.space` not host; `page_size`
///         outside `1..2^31 - 1`; `num_pages` or `batch` negative, `batch` above 2^30; a null
///         `seq_lens` or table pointer, both tables or neither; a misaligned pointer; a
///         negative `block_table_stride` or a block table past 2^62 bytes; `page_indptr[0] != 0`
///         or decreasing; a negative length, a length past the request's pages or shorter than
///         `options.q_len - 1`; a page id outside `[0, num_pages)`; more than 2^31 - 1 pages in
///         all; an option out of range.
CascadeLevels build_cascade_levels(const PagedKvCache& table,
                                   const CascadeLevelsOptions& options = CascadeLevelsOptions{});

/// One line describing the levels for logs: batch, page size, levels, the order, and per level
/// its shared and empty segments with their requests and tokens, and the keys read.
/// @param levels  the levels.
/// @return e.g. `"cascade levels: batch 6, page_size 16, 2 levels, order identity, keys read 1100
///         of 6100; level 0: 1 shared (6 requests, 1000 tokens); level 1 (own): 6 (..)"`.
std::string to_string(const CascadeLevels& levels);

/// Copies queries into the order of the levels: position `i` of the copy is request
/// `levels.order()[i]` of `q`.
/// @param levels     the levels.
/// @param q          host queries `(batch, q_len, heads_q, head_dim)` in request order, f32, f16
///                   or bf16, non-negative strides, last dim contiguous.
/// @param dst        host memory for the copy, contiguous, of `q`'s dtype, aligned to it and
///                   disjoint from `q`.
/// @param dst_bytes  bytes at `dst`: at least `batch · q_len · heads_q · head_dim` elements.
/// @return a contiguous view of `dst` in `q`'s shape and dtype, for the cascade.
/// @throws Error `kInvalidArgument` naming the argument on a bad view, `q.shape[0]` other than
///         `levels.batch()`, a null, small, misaligned or overlapping `dst`.
ConstTensorView gather_queries(const CascadeLevels& levels, const ConstTensorView& q, void* dst,
                               std::int64_t dst_bytes);

/// Copies a state written in the order of the levels (token `i · q_len + t` belongs to request
/// `levels.order()[i]`; a cascade's output) into request order (token `order()[i] · q_len + t`).
/// `o` is copied as stored; the LSE is written in `dst`'s base.
/// @param levels  the levels.
/// @param src     host state `(batch · q_len, heads, head_dim)` in the levels' order.
/// @param dst     host state of the same shape, dtype and `o_scale`, disjoint from `src`.
/// @throws Error `kInvalidArgument` naming the argument on a bad view, `src.tokens` not a
///         multiple of the batch (`0` for an empty batch), a shape, dtype or scale mismatch, or
///         an overlap.
void scatter_state(const CascadeLevels& levels, const ConstStateView& src, StateView dst);

}  // namespace attnstate
