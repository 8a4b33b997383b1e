/// @file decode_validate.hpp
/// @brief Argument checks shared by the CPU and CUDA decode entry points (internal, host only):
///        shapes, strides, dtypes, memory spaces and table presence. Contents of host tables are
///        checked by the CPU backend only (device tables are clamped on the device).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"
#include "common/validate.hpp"

namespace attnstate {
namespace detail {

inline std::string decode_str(std::int64_t v) { return std::to_string(v); }

/// Checks the page table fields of a paged cache `kv` named "kv" (a `PagedKvCache` or an
/// `MlaKvCache`: the same field names): `batch >= 0`; for `batch > 0` non-null `seq_lens`, exactly
/// one of a CSR table (both pointers) and a block table (`block_table_stride >= 0`), tables whose
/// size fits in 2^62 bytes, every pointer aligned to 4 bytes. Their contents are checked by the
/// CPU backend (`validate_tables` in cpu/page_table.hpp).
template <class Cache>
void validate_page_tables(const char* fn, const Cache& kv) {
  if (kv.batch < 0) throw_argument(fn, "kv.batch", ">= 0", decode_str(kv.batch));
  if (kv.batch > 0) {
    if (kv.seq_lens == nullptr) throw_argument(fn, "kv.seq_lens", "non-null", "null");
    const bool csr = kv.page_indptr != nullptr || kv.page_indices != nullptr;
    const bool bt = kv.block_table != nullptr;
    if (csr == bt)
      throw_argument(fn, "kv.block_table", "exactly one of a CSR table and a block table",
                     csr ? "both" : "neither");
    if (csr && (kv.page_indptr == nullptr || kv.page_indices == nullptr))
      throw_argument(fn, kv.page_indptr == nullptr ? "kv.page_indptr" : "kv.page_indices",
                     "non-null with a CSR table", "null");
    if (bt && kv.block_table_stride < 0)
      throw_argument(fn, "kv.block_table_stride", ">= 0", decode_str(kv.block_table_stride));
    std::int64_t table = 0;
    if (!checked_add(kv.batch, 1, &table) || !checked_mul(table, 4, &table))  // lens, indptr
      throw_argument(fn, "kv.batch", "a batch whose tables fit in 2^62 bytes",
                     decode_str(kv.batch));
    if (bt &&
        (!checked_mul(kv.batch, kv.block_table_stride, &table) || !checked_mul(table, 4, &table))) {
      const bool batch = kv.batch > kv.block_table_stride;  // the factor out of proportion
      throw_argument(fn, batch ? "kv.batch" : "kv.block_table_stride",
                     "batch * block_table_stride within 2^62 bytes",
                     decode_str(batch ? kv.batch : kv.block_table_stride) + " (with " +
                         (batch ? "block_table_stride " : "batch ") +
                         decode_str(batch ? kv.block_table_stride : kv.batch) + ")");
    }
    check_aligned(fn, "kv.seq_lens", kv.seq_lens, sizeof(std::int32_t));
    check_aligned(fn, "kv.page_indptr", kv.page_indptr, sizeof(std::int32_t));
    check_aligned(fn, "kv.page_indices", kv.page_indices, sizeof(std::int32_t));
    check_aligned(fn, "kv.block_table", kv.block_table, sizeof(std::int32_t));
  }
}

/// Throws naming `out_name.o` / `.lse` unless the output `out` is disjoint from the page tables
/// and lengths of `kv` (validated by `validate_page_tables`); the CSR page ids' extent is known
/// on the host only.
template <class Cache>
void check_disjoint_from_tables(const char* fn, const char* out_name, const ConstStateView& out,
                                const Cache& kv, MemorySpace space) {
  if (kv.batch > 0) {
    const std::int64_t b4 = kv.batch * 4;
    check_disjoint(fn, out_name, out, "kv.seq_lens", kv.seq_lens, b4, kv.page_indptr, b4 + 4);
    check_disjoint(fn, out_name, out, "kv.block_table", kv.block_table,
                   kv.block_table != nullptr ? kv.batch * kv.block_table_stride * 4 : 0, nullptr,
                   0);
    if (space == MemorySpace::kHost && kv.page_indices != nullptr && kv.page_indptr[kv.batch] > 0)
      check_disjoint(fn, out_name, out, "kv.page_indices", kv.page_indices,
                     std::int64_t{kv.page_indptr[kv.batch]} * 4, nullptr, 0);
  }
}

/// Checks `q`, `kv` and `out` of a decode call against each other and against `space`: `out` is
/// an output state (`check_output_state`: valid strides whose span fits, pairwise-disjoint
/// `(token, head)` rows) of shape `(batch·q_len, heads_q, head_dim)` whose memory is disjoint
/// from `q`.
/// Returns the bytes of each KV pool (`check_kv_pool`).
inline std::int64_t validate_decode_args(const char* fn, const ConstTensorView& q,
                                         const PagedKvCache& kv, const StateView& out,
                                         MemorySpace space) {
  const std::string sp = to_string(space);
  // kv: the pool (its size overflow-checked), then the tables
  const std::int64_t pool_bytes = check_kv_pool(fn, kv, space);
  validate_page_tables(fn, kv);
  // q
  if (q.space != space) throw_argument(fn, "q.space", sp, to_string(q.space));
  if (q.rank != 4)
    throw_argument(fn, "q.rank", "4 (batch, q_len, heads_q, head_dim)", decode_str(q.rank));
  check_query_dtype(fn, q.dtype);
  if (q.shape[0] != kv.batch)
    throw_argument(fn, "q.shape[0]", "kv.batch = " + decode_str(kv.batch), decode_str(q.shape[0]));
  if (q.shape[1] < 1 || q.shape[1] > 8)
    throw_argument(fn, "q.shape[1]", "q_len in 1..8", decode_str(q.shape[1]));
  if (q.shape[2] < 1 || q.shape[2] % kv.heads_kv != 0)
    throw_argument(fn, "q.shape[2]",
                   "heads_q, a positive multiple of kv.heads_kv = " + decode_str(kv.heads_kv),
                   decode_str(q.shape[2]));
  if (q.shape[3] != kv.head_dim)
    throw_argument(fn, "q.shape[3]", "kv.head_dim = " + decode_str(kv.head_dim),
                   decode_str(q.shape[3]));
  if (q.stride[3] != 1) throw_argument(fn, "q.stride[3]", "1", decode_str(q.stride[3]));
  for (int d = 0; d < 3; ++d)
    if (q.stride[d] < 0)
      throw_argument(fn, ("q.stride[" + decode_str(d) + "]").c_str(), ">= 0",
                     decode_str(q.stride[d]));
  const std::int64_t q_bytes = check_tensor_span(fn, "q", q);
  const std::int64_t tokens = q.shape[0] * q.shape[1];  // both small: q's span fits
  if (tokens > 0 && q.data == nullptr) throw_argument(fn, "q.data", "non-null", "null");
  check_aligned(fn, "q.data", q.data, size_of(q.dtype));
  // out: its shape first (a wrong head count is reported as such, not as overlapping rows), then
  // the state of every (token, head) row, rows pairwise disjoint (each is written by one task),
  // in `space`, and disjoint from q (read while out is written)
  if (out.tokens != tokens)
    throw_argument(fn, "out.tokens", "batch*q_len = " + decode_str(tokens), decode_str(out.tokens));
  if (out.heads != q.shape[2])
    throw_argument(fn, "out.heads", "heads_q = " + decode_str(q.shape[2]), decode_str(out.heads));
  if (out.head_dim != kv.head_dim)
    throw_argument(fn, "out.head_dim", "kv.head_dim = " + decode_str(kv.head_dim),
                   decode_str(out.head_dim));
  check_output_state(fn, "out", out, out.o, out.lse, space);
  check_disjoint(fn, "out", out, "q", q.data, q_bytes, nullptr, 0);
  // and from the cache and the tables it reads (the CSR page ids' extent is known on the host)
  check_disjoint_from_pool(fn, "out", out, kv, pool_bytes);
  check_disjoint_from_tables(fn, "out", out, kv, space);
  return pool_bytes;
}

/// Checks a split layout.
inline void validate_split_layout(const char* fn, const SplitLayout& s) {
  if (s.max_splits < 1 || s.max_splits > kMaxSplits)
    throw_argument(fn, "splits.max_splits", "1.." + decode_str(kMaxSplits),
                   decode_str(s.max_splits));
  if (s.policy == SplitPolicy::kFixedCount) {
    if (s.num_splits < 1 || s.num_splits > kMaxSplits)
      throw_argument(fn, "splits.num_splits", "1.." + decode_str(kMaxSplits),
                     decode_str(s.num_splits));
  } else if (s.policy == SplitPolicy::kFixedSize) {
    if (s.split_size <= 0 || s.split_size % kSplitGranularity != 0)
      throw_argument(fn, "splits.split_size", "a positive multiple of 16",
                     decode_str(s.split_size));
  } else {
    throw_argument(fn, "splits.policy", "kFixedCount or kFixedSize (a planned layout)", "kAuto");
  }
}

}  // namespace detail
}  // namespace attnstate
