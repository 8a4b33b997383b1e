/// @file cascade_levels_case.hpp
/// @brief Test support for `build_cascade_levels`: a batch of page lists over a random pool (as a
///        CSR table or a block table), the exact checks of a result (every position's segments
///        concatenate to its request's tokens; the level rules) and the numeric one
///        (`cpu::cascade_attention` over the levels against `cpu::decode` over the table).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attnstate/core/cascade_levels.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace attnstate_test {

/// A batch of page lists over a pool of random f32 K/V and random f32 queries.
struct PageTableCase {
  std::int64_t page_size = 16;
  std::int64_t num_pages = 0;
  std::int64_t heads_kv = 1, heads_q = 2, head_dim = 16, q_len = 1;
  std::vector<std::vector<std::int32_t>> pages;  ///< Per request: its page ids (may be longer
                                                 ///< than its tokens need).
  std::vector<std::int32_t> lens;                ///< Per request: its tokens.
  std::vector<float> k, v, q;
  std::vector<std::int32_t> indptr, indices, block_table;
  std::int64_t stride = 0;

  /// The table of `pages`/`lens` over `num_pages` pages; pool and queries from `seed`. Unused
  /// block-table entries and a CSR entry past the last request hold -1 (never read).
  PageTableCase(std::int64_t ps, std::int64_t pool_pages, std::vector<std::vector<std::int32_t>> p,
                std::vector<std::int32_t> l, std::int64_t new_tokens = 1, std::uint32_t seed = 1)
      : page_size(ps),
        num_pages(pool_pages),
        q_len(new_tokens),
        pages(std::move(p)),
        lens(std::move(l)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    k.resize(static_cast<std::size_t>(num_pages * page_size * heads_kv * head_dim));
    v.resize(k.size());
    for (float& x : k) x = uni(rng);
    for (float& x : v) x = uni(rng);
    q.resize(static_cast<std::size_t>(batch() * q_len * heads_q * head_dim));
    for (float& x : q) x = uni(rng);
    indptr.push_back(0);
    for (const auto& list : pages) {
      indices.insert(indices.end(), list.begin(), list.end());
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
      stride = std::max<std::int64_t>(stride, static_cast<std::int64_t>(list.size()));
    }
    indices.push_back(-1);  // past every request (and never a null array)
    stride += 1;            // a spare column, never read
    block_table.assign(static_cast<std::size_t>(batch() * stride), -1);
    for (std::int64_t b = 0; b < batch(); ++b)
      std::copy(pages[b].begin(), pages[b].end(), block_table.begin() + b * stride);
  }

  std::int64_t batch() const { return static_cast<std::int64_t>(lens.size()); }

  /// The pool with the CSR table (`block = false`) or the block table.
  attnstate::PagedKvCache table(bool block = false) const {
    attnstate::PagedKvCache kv;
    kv.k = k.data();
    kv.v = v.data();
    kv.dtype = attnstate::DType::kF32;
    kv.num_pages = num_pages;
    kv.page_size = page_size;
    kv.heads_kv = heads_kv;
    kv.head_dim = head_dim;
    kv.seq_lens = lens.data();
    kv.batch = batch();
    if (block) {
      kv.block_table = block_table.data();
      kv.block_table_stride = stride;
    } else {
      kv.page_indptr = indptr.data();
      kv.page_indices = indices.data();
    }
    return kv;
  }
  attnstate::ConstTensorView query() const {
    return attnstate::make_tensor_view(q.data(), attnstate::DType::kF32,
                                       {batch(), q_len, heads_q, head_dim});
  }
  /// Tokens of request `b` as (page id, slot) pairs, in order.
  std::vector<std::pair<std::int32_t, std::int64_t>> tokens_of(std::int64_t b) const {
    std::vector<std::pair<std::int32_t, std::int64_t>> t;
    for (std::int64_t i = 0; i < lens[b]; ++i)
      t.emplace_back(pages[b][i / page_size], i % page_size);
    return t;
  }
};

/// Tokens of position `i` over the levels (its segment at each level, concatenated).
inline std::vector<std::pair<std::int32_t, std::int64_t>> tokens_at(
    const attnstate::CascadeLevels& lv, std::int64_t i) {
  std::vector<std::pair<std::int32_t, std::int64_t>> t;
  for (int l = 0; l < lv.num_levels(); ++l) {
    const attnstate::CascadeLevels::Arrays& a = lv.arrays(l);
    std::size_t s = 0;
    while (!(a.request_indptr[s] <= i && i < a.request_indptr[s + 1])) ++s;
    for (std::int64_t j = 0; j < a.seg_lens[s]; ++j)
      t.emplace_back(a.page_indices[a.page_indptr[s] + j / lv.page_size()], j % lv.page_size());
  }
  return t;
}

/// The exact checks of levels built from `c` with `o`: `order()` a permutation; views that match
/// the arrays; `1..o.max_levels` levels; per level offsets from 0 to the batch and to its pages,
/// each segment within its pages; shared levels' segments serving 2+ positions with at least
/// `o.min_shared_tokens` tokens or none at all; the last level one segment per position of at
/// least `q_len - 1` tokens; every position's segments concatenating to its request's tokens.
inline ::testing::AssertionResult levels_are_exact(const PageTableCase& c,
                                                   const attnstate::CascadeLevels& lv,
                                                   const attnstate::CascadeLevelsOptions& o) {
  const std::int64_t B = c.batch();
  if (lv.batch() != B) return ::testing::AssertionFailure() << "batch " << lv.batch();
  std::vector<std::int32_t> sorted = lv.order();
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < B; ++i)
    if (static_cast<std::int64_t>(sorted.size()) != B || sorted[i] != i)
      return ::testing::AssertionFailure() << "order is not a permutation";
  if (lv.num_levels() < 1 || lv.num_levels() > o.max_levels)
    return ::testing::AssertionFailure() << lv.num_levels() << " levels";
  for (int l = 0; l < lv.num_levels(); ++l) {
    const auto& a = lv.arrays(l);
    const attnstate::CascadeLevel& view = lv.levels()[l];
    const std::size_t ns = a.seg_lens.size();
    const bool last = l == lv.num_levels() - 1;
    if (view.num_segments != static_cast<std::int64_t>(ns) ||
        view.request_indptr != a.request_indptr.data() || view.seg_lens != a.seg_lens.data() ||
        view.page_indptr != a.page_indptr.data())
      return ::testing::AssertionFailure() << "level " << l << ": views differ from the arrays";
    if (ns < 1 || a.request_indptr.size() != ns + 1 || a.page_indptr.size() != ns + 1 ||
        a.request_indptr[0] != 0 || a.request_indptr[ns] != B || a.page_indptr[0] != 0 ||
        a.page_indptr[ns] != static_cast<std::int32_t>(a.page_indices.size()))
      return ::testing::AssertionFailure() << "level " << l << ": bad offsets";
    if (last && static_cast<std::int64_t>(ns) != B)
      return ::testing::AssertionFailure() << "last level: " << ns << " segments";
    for (std::size_t s = 0; s < ns; ++s) {
      const std::int64_t reqs = a.request_indptr[s + 1] - a.request_indptr[s];
      const std::int64_t np = a.page_indptr[s + 1] - a.page_indptr[s], len = a.seg_lens[s];
      if (reqs < 0 || np < 0 || len < 0 || len > np * c.page_size ||
          (np > 0 && len <= (np - 1) * c.page_size))
        return ::testing::AssertionFailure() << "level " << l << " segment " << s << ": " << len
                                             << " tokens in " << np << " pages";
      if (last && (reqs != 1 || len < c.q_len - 1))
        return ::testing::AssertionFailure()
               << "remainder " << s << ": " << reqs << " requests, " << len << " tokens";
      if (!last && len > 0 && (reqs < 2 || len < o.min_shared_tokens))
        return ::testing::AssertionFailure() << "level " << l << " segment " << s << ": " << reqs
                                             << " requests, " << len << " tokens";
    }
  }
  for (std::int64_t i = 0; i < B; ++i)
    if (tokens_at(lv, i) != c.tokens_of(lv.order()[i]))
      return ::testing::AssertionFailure()
             << "position " << i << " (request " << lv.order()[i] << "): other tokens";
  return ::testing::AssertionSuccess();
}

/// `cpu::cascade_attention` over `lv` (queries gathered into its order, the state scattered
/// back) against `cpu::decode` over the table of `c`, both f32 in natural log, causal, with the
/// window `window_left`: equal within 1e-4 on `o` and 4e-4 on the LSE (fp32 sums in another
/// order: twice the cascade property's bounds against the double reference), empty rows alike.
inline ::testing::AssertionResult cascade_equals_decode(const PageTableCase& c,
                                                        const attnstate::CascadeLevels& lv,
                                                        std::int64_t window_left = -1) {
  using namespace attnstate;
  const std::int64_t tokens = c.batch() * c.q_len, rows = tokens * c.heads_q;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dec_o(static_cast<std::size_t>(rows * c.head_dim), nan);
  std::vector<float> dec_lse(static_cast<std::size_t>(rows), nan);
  const PagedKvCache kv = c.table();
  DecodeOptions dopt;
  dopt.variant.window_left = window_left;
  const StateView dec = make_state_view(dec_o.data(), DType::kF32, dec_lse.data(), tokens,
                                        c.heads_q, c.head_dim, LseBase::kNatural);
  cpu::decode(c.query(), kv, dopt, dec);

  std::vector<float> q_lv(c.q.size() + 1);  // + 1: never empty
  const ConstTensorView q = gather_queries(lv, c.query(), q_lv.data(),
                                           static_cast<std::int64_t>(q_lv.size() * sizeof(float)));
  std::vector<float> lv_o(dec_o.size(), nan), lv_lse(dec_lse.size(), nan);
  std::vector<float> cas_o(dec_o.size(), nan), cas_lse(dec_lse.size(), nan);
  CascadeOptions copt;
  copt.variant.window_left = window_left;
  cpu::cascade_attention(q, kv, lv.levels(), lv.num_levels(), copt,
                         make_state_view(lv_o.data(), DType::kF32, lv_lse.data(), tokens, c.heads_q,
                                         c.head_dim, LseBase::kBase2));
  const StateView cas = make_state_view(cas_o.data(), DType::kF32, cas_lse.data(), tokens,
                                        c.heads_q, c.head_dim, LseBase::kNatural);
  scatter_state(lv,
                make_const_state_view(lv_o.data(), DType::kF32, lv_lse.data(), tokens, c.heads_q,
                                      c.head_dim, LseBase::kBase2),
                cas);
  const std::string mismatch = attnstate::testing::compare_states(
      attnstate::testing::HostState::from_view(cas), attnstate::testing::HostState::from_view(dec),
      attnstate::testing::Tolerance::absolute(5e-5, 2e-4).scaled(2));
  if (mismatch.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatch << "\n" << to_string(lv);
}

}  // namespace attnstate_test
