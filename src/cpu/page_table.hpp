/// @file page_table.hpp
/// @brief The page table of a host paged cache in the CPU backend (internal): the pages of a
///        request, a page id, and the check of the tables' contents. Templates over the cache
///        (`PagedKvCache`, `MlaKvCache`: the same table fields).
#pragma once

#include <cstdint>

#include "common/decode_validate.hpp"

namespace attnstate {
namespace cpu {
namespace detail {

/// Pages owned by request `b`.
template <class Cache>
inline std::int64_t pages_of(const Cache& kv, std::int64_t b) {
  if (kv.block_table != nullptr) return kv.block_table_stride;
  return static_cast<std::int64_t>(kv.page_indptr[b + 1]) - kv.page_indptr[b];
}

/// Page id of the `p`-th page of request `b`.
template <class Cache>
inline std::int64_t page_id(const Cache& kv, std::int64_t b, std::int64_t p) {
  if (kv.block_table != nullptr) return kv.block_table[b * kv.block_table_stride + p];
  return kv.page_indices[kv.page_indptr[b] + p];
}

/// Checks the contents of the host page table and lengths (the fields checked by
/// `validate_page_tables`): CSR offsets from 0 and non-decreasing, every length ≥ 0 and within
/// its request's pages, every page id a request reads inside `[0, num_pages)`.
template <class Cache>
void validate_tables(const char* fn, const Cache& kv) {
  using attnstate::detail::decode_str;
  using attnstate::detail::throw_argument;
  if (kv.block_table == nullptr) {
    if (kv.page_indptr[0] != 0)
      throw_argument(fn, "kv.page_indptr[0]", "0", decode_str(kv.page_indptr[0]));
    for (std::int64_t b = 0; b < kv.batch; ++b)
      if (kv.page_indptr[b + 1] < kv.page_indptr[b])
        throw_argument(fn, "kv.page_indptr", "non-decreasing offsets",
                       "a decrease at request " + decode_str(b));
  }
  for (std::int64_t b = 0; b < kv.batch; ++b) {
    const std::int64_t len = kv.seq_lens[b];
    if (len < 0) throw_argument(fn, "kv.seq_lens", "lengths >= 0", decode_str(len));
    const std::int64_t need = (len + kv.page_size - 1) / kv.page_size;
    if (need > pages_of(kv, b))
      throw_argument(fn, "kv.seq_lens", "at most the pages of the request times page_size",
                     decode_str(len) + " tokens with " + decode_str(pages_of(kv, b)) +
                         " pages for request " + decode_str(b));
    for (std::int64_t p = 0; p < need; ++p) {
      const std::int64_t id = page_id(kv, b, p);
      if (id < 0 || id >= kv.num_pages)
        throw_argument(fn, kv.block_table ? "kv.block_table" : "kv.page_indices",
                       "page ids in [0, num_pages = " + decode_str(kv.num_pages) + ")",
                       decode_str(id));
    }
  }
}

}  // namespace detail
}  // namespace cpu
}  // namespace attnstate
