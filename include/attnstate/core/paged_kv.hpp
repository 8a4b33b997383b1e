/// @file paged_kv.hpp
/// @brief Description of a paged KV cache and of decode problems over it (shared by the CPU and
///        CUDA backends).
#pragma once

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/core/variant.hpp"

namespace attnstate {

/// Order of the dimensions inside one KV page.
enum class KvLayout : std::uint8_t {
  kNHD = 0,  ///< Pool `[pages, page_size, H_kv, head_dim]`.
  kHND = 1,  ///< Pool `[pages, H_kv, page_size, head_dim]`.
};

/// A paged KV cache: two page pools (K and V) of the same shape, a page table and per-request
/// sequence lengths. A contiguous `[batch, T, H_kv, D]` cache is the case `page_size = T` with
/// page `b` holding request `b`.
///
/// The page table is either CSR (`page_indptr` `(batch + 1)` and `page_indices`) or a dense
/// block table `(batch, block_table_stride)`; exactly one of the two is set. Request `b` owns
/// pages `pages(b)[0 .. ceil(seq_lens[b] / page_size))` in order; token `i` of request `b` lives
/// in page `pages(b)[i / page_size]` at slot `i % page_size`.
///
/// All pointers live in `space` (device memory for the CUDA backend). Element offsets are 64-bit.
struct PagedKvCache {
  const void* k = nullptr;           ///< K pool, of type `dtype`.
  const void* v = nullptr;           ///< V pool, same shape and strides as `k`.
  DType dtype = DType::kBF16;        ///< Element type of the pools (f16 or bf16 for decode).
  KvLayout layout = KvLayout::kNHD;  ///< Dimension order inside a page.
  std::int64_t num_pages = 0;        ///< Pages in each pool.
  std::int64_t page_size = 0;        ///< Tokens per page.
  std::int64_t heads_kv = 0;         ///< KV heads (H_kv).
  std::int64_t head_dim = 0;         ///< Elements per head.
  std::int64_t page_stride = 0;  ///< Elements between consecutive pages (≥ page_size·H_kv·D;
                                 ///< 0 means exactly that, i.e. a dense pool).
  const std::int32_t* page_indptr = nullptr;   ///< CSR offsets `(batch + 1)`, [0] = 0, or null.
  const std::int32_t* page_indices = nullptr;  ///< CSR page ids, or null.
  const std::int32_t* block_table = nullptr;   ///< Dense `(batch, block_table_stride)`, or null.
  std::int64_t block_table_stride = 0;         ///< Columns of `block_table`.
  const std::int32_t* seq_lens = nullptr;      ///< `(batch)` tokens per request (≥ 0).
  std::int64_t batch = 0;                      ///< Number of requests.
  MemorySpace space = MemorySpace::kHost;      ///< Where the pools and tables live.

  /// Elements between consecutive pages (resolves `page_stride == 0`).
  ATTNSTATE_HOST_DEVICE std::int64_t page_elems() const {
    return page_stride != 0 ? page_stride : page_size * heads_kv * head_dim;
  }
  /// Element offset of token slot `slot` of KV head `h` inside a page.
  ATTNSTATE_HOST_DEVICE std::int64_t in_page_offset(std::int64_t slot, std::int64_t h) const {
    return layout == KvLayout::kNHD ? (slot * heads_kv + h) * head_dim
                                    : (h * page_size + slot) * head_dim;
  }
};

/// How split-KV decode partitions each request's keys.
enum class SplitPolicy : std::uint8_t {
  kAuto = 0,        ///< Chosen from shapes, lengths and the SM count (wave-efficiency heuristic).
  kFixedCount = 1,  ///< Exactly `DecodeOptions::num_splits` splits of equal size per request.
  kFixedSize = 2,   ///< Splits of `DecodeOptions::split_size` tokens: a row's result depends only
                    ///< on its own request, never on the rest of the batch.
};

/// Options of a decode call.
struct DecodeOptions {
  float scale = 0.f;                        ///< Softmax scale; 0 means `1/sqrt(head_dim)`.
  SplitPolicy policy = SplitPolicy::kAuto;  ///< Split policy.
  int num_splits = 0;                       ///< For `kFixedCount`.
  int split_size = 0;  ///< For `kFixedSize`, in tokens: a positive multiple of 16
                       ///< (`kSplitGranularity`, core/decode_split.hpp) giving at most
                       ///< `kMaxSplits` splits for the longest request; any `page_size`.
  /// Sliding window and logits soft cap (default: plain attention). Row `i` of request `b` is at
  /// position `p = seq_lens[b] - q_len + i` and sees the keys `[max(0, p - window_left), p]`.
  AttentionVariant variant;
};

}  // namespace attnstate
