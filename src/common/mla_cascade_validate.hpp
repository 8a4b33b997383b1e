/// @file mla_cascade_validate.hpp
/// @brief Argument checks of the MLA cascade entry points (internal, host only), shared by the
///        CPU and CUDA backends: the queries, the latent pool (its page-table fields ignored:
///        the levels hold the pages), the output and the options, through the MLA decode's and
///        the cascade's checks.
#pragma once

#include <cstdint>
#include <string>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"
#include "common/mla_validate.hpp"
#include "common/validate.hpp"

namespace attnstate {
namespace detail {

/// `kv` as the MLA decode's checks take it for a cascade of `batch` requests: its pools,
/// dtypes, strides and scales, no page table.
inline MlaKvCache mla_cascade_pool(const MlaKvCache& kv, std::int64_t batch) {
  MlaKvCache pool = kv;
  pool.batch = batch;
  pool.page_indptr = nullptr;
  pool.page_indices = nullptr;
  pool.block_table = nullptr;
  pool.block_table_stride = 0;
  pool.seq_lens = nullptr;
  return pool;
}

/// The pool's geometry as the cascade's level checks read it (`page_size`, `num_pages`).
inline PagedKvCache mla_level_geometry(const MlaKvCache& kv) {
  PagedKvCache g;
  g.page_size = kv.page_size;
  g.num_pages = kv.num_pages;
  return g;
}

/// Checks the queries, the pool and `out` of an MLA cascade in `space` (`validate_mla_args`
/// without tables, the batch taken from `q_nope`) and that `options.variant` is plain; returns
/// the pool with the batch set.
inline MlaKvCache validate_mla_cascade_args(const char* fn, const ConstTensorView& q_nope,
                                            const ConstTensorView& q_pe, const MlaKvCache& kv,
                                            const CascadeOptions& options, const StateView& out,
                                            MemorySpace space) {
  const std::int64_t batch = q_nope.rank == 4 ? q_nope.shape[0] : 0;
  if (batch < 0) throw_argument(fn, "q_nope.shape[0]", "batch >= 0", decode_str(batch));
  const MlaKvCache pool = mla_cascade_pool(kv, batch);
  validate_mla_args(fn, q_nope, q_pe, pool, out, space, false);
  if (!options.variant.is_plain())
    throw_argument(fn, "options.variant",
                   "plain attention (the MLA cascade takes no window or soft cap)",
                   "window_left " + std::to_string(options.variant.window_left) +
                       ", logits_soft_cap " + std::to_string(options.variant.logits_soft_cap),
                   Status::kNotSupported);
  return pool;
}

}  // namespace detail
}  // namespace attnstate
