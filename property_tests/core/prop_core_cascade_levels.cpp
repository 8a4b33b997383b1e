/// @file prop_core_cascade_levels.cpp
/// @brief RapidCheck property of `build_cascade_levels` over random forests of shared prefixes
///        (prompts, blocks shared by groups, forks, requests ending inside others' prefixes,
///        duplicates, partial final pages, empty requests) on shuffled page pools with random
///        page sizes, query lengths, options and table forms: the levels are exact (every
///        position's segments concatenate to its request's tokens, the level rules hold), the
///        CSR and block tables give the same levels, the order is the identity when the table
///        lists the requests in prefix-tree order, with every prefix kept each distinct token is
///        read once, and `cpu::cascade_attention` over the levels equals `cpu::decode` over the
///        table to rounding, for q_len 1 and more, with and without a sliding window.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "attnstate/core/cascade_levels.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "cascade_levels_case.hpp"
#include "rc_defaults.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=300");

namespace {

using attnstate::build_cascade_levels;
using attnstate::CascadeLevels;
using attnstate::CascadeLevelsOptions;
using I32 = std::vector<std::int32_t>;

/// A random batch: logical page ids (0, 1, ... in creation order) per request and its tokens.
struct Forest {
  std::vector<I32> pages;
  I32 lens;
  std::int32_t next_id = 0;
};

/// Adds the requests below a node whose path so far is `prefix` (`depth` nodes deep): the
/// node's own pages, sometimes a request ending with them (whose last page may be partial, or
/// a duplicate), then 0 to 3 child nodes, or, for a leaf, 1 to 3 requests with own tails.
void grow(Forest& f, I32 prefix, int depth, std::int64_t ps) {
  const int own = *rc::gen::inRange(depth == 0 ? 0 : 1, 4);
  for (int i = 0; i < own; ++i) prefix.push_back(f.next_id++);
  const auto add = [&](I32 pages) {
    std::int64_t len = static_cast<std::int64_t>(pages.size()) * ps;
    if (len > 0 && *rc::gen::inRange(0, 3) == 0) len -= *rc::gen::inRange<std::int64_t>(0, ps);
    f.pages.push_back(pages);
    f.lens.push_back(static_cast<std::int32_t>(len));
    if (*rc::gen::inRange(0, 6) == 0) {  // the same request again
      f.pages.push_back(pages);
      f.lens.push_back(static_cast<std::int32_t>(len));
    }
  };
  if (!prefix.empty() && *rc::gen::inRange(0, 4) == 0) add(prefix);
  const int kids = depth < 3 ? *rc::gen::inRange(0, 4) : 0;
  if (kids == 0) {
    for (int r = *rc::gen::inRange(1, 4); r > 0; --r) {
      I32 pages = prefix;
      for (int t = *rc::gen::inRange(0, 4); t > 0; --t) pages.push_back(f.next_id++);
      add(pages);
    }
  }
  for (int k = 0; k < kids; ++k) grow(f, prefix, depth + 1, ps);
}

/// The (page, tokens) keys of the first pages of request `b`, one prefix per page.
std::vector<std::vector<std::int64_t>> prefixes(const attnstate_test::PageTableCase& c,
                                                std::int64_t b) {
  std::vector<std::vector<std::int64_t>> out;
  std::vector<std::int64_t> key;
  for (std::int64_t d = 0; d * c.page_size < c.lens[b]; ++d) {
    const std::int64_t n = std::min<std::int64_t>(c.page_size, c.lens[b] - d * c.page_size);
    key.push_back(std::int64_t{c.pages[b][d]} * (c.page_size + 1) + n);
    out.push_back(key);
  }
  return out;
}

/// Tokens of the distinct prefixes of all the requests: what a cascade that keeps every shared
/// prefix reads (each distinct prefix once).
std::int64_t distinct_prefix_tokens(const attnstate_test::PageTableCase& c) {
  std::map<std::vector<std::int64_t>, std::int64_t> tokens;
  for (std::int64_t b = 0; b < c.batch(); ++b)
    for (const auto& p : prefixes(c, b)) tokens[p] = p.back() % (c.page_size + 1);
  std::int64_t total = 0;
  for (const auto& kv : tokens) total += kv.second;
  return total;
}

/// True when the requests sharing any prefix are listed contiguously (prefix-tree order).
bool in_prefix_tree_order(const attnstate_test::PageTableCase& c) {
  std::map<std::vector<std::int64_t>, std::vector<std::int64_t>> holders;
  for (std::int64_t b = 0; b < c.batch(); ++b)
    for (const auto& p : prefixes(c, b)) holders[p].push_back(b);
  for (const auto& kv : holders)
    if (kv.second.back() - kv.second.front() + 1 != static_cast<std::int64_t>(kv.second.size()))
      return false;
  return true;
}

RC_GTEST_PROP(CascadeLevelsProperty, LevelsAreExactAndTheCascadeEqualsDecode, ()) {
  const std::int64_t ps = *rc::gen::element<std::int64_t>(1, 2, 3, 4, 5, 8, 16);
  const std::int64_t q_len = *rc::gen::element<std::int64_t>(1, 1, 2, 3, 8);
  Forest f;
  for (int roots = *rc::gen::inRange(1, 4); roots > 0; --roots) grow(f, {}, 0, ps);
  for (int e = *rc::gen::inRange(0, 3) == 0 ? *rc::gen::inRange(1, 3) : 0; e > 0; --e) {
    f.pages.push_back({});  // empty requests, at the end: the order stays a prefix-tree order
    f.lens.push_back(0);
  }
  if (f.lens.size() > 24) {  // keep the double work small
    f.pages.resize(24);
    f.lens.resize(24);
  }
  // room for the new tokens: every request holds at least q_len - 1
  for (std::size_t b = 0; b < f.lens.size(); ++b) {
    while (static_cast<std::int64_t>(f.pages[b].size()) * ps < q_len - 1)
      f.pages[b].push_back(f.next_id++);
    f.lens[b] = std::max<std::int32_t>(f.lens[b], static_cast<std::int32_t>(q_len - 1));
  }
  // a shuffled pool with spare pages; the requests shuffled or in the forest's order
  const std::int32_t num_pages = f.next_id + *rc::gen::inRange(0, 4);
  std::mt19937 rng(*rc::gen::arbitrary<std::uint32_t>());
  I32 ids(static_cast<std::size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (I32& list : f.pages)
    for (std::int32_t& id : list) id = ids[id];
  if (*rc::gen::arbitrary<bool>()) {
    std::vector<std::size_t> perm(f.lens.size());
    std::iota(perm.begin(), perm.end(), std::size_t{0});
    std::shuffle(perm.begin(), perm.end(), rng);
    Forest g;
    for (std::size_t i : perm) {
      g.pages.push_back(f.pages[i]);
      g.lens.push_back(f.lens[i]);
    }
    f.pages = g.pages;
    f.lens = g.lens;
  }
  for (I32& list : f.pages)  // a page past the request's tokens is never read
    if (*rc::gen::inRange(0, 4) == 0) list.push_back(-1);
  const attnstate_test::PageTableCase c(ps, num_pages, f.pages, f.lens, q_len,
                                        *rc::gen::arbitrary<std::uint32_t>());

  CascadeLevelsOptions o;
  o.min_shared_tokens = *rc::gen::element<std::int64_t>(0, 0, 1, ps, 16, 2 * ps + 1);
  o.max_levels = *rc::gen::element(1, 2, 3, 5, attnstate::kMaxCascadeLevels);
  o.q_len = q_len;
  const bool block = *rc::gen::arbitrary<bool>();
  const CascadeLevels lv = build_cascade_levels(c.table(block), o);
  RC_LOG() << to_string(lv) << "\n";
  RC_ASSERT(attnstate_test::levels_are_exact(c, lv, o));

  const CascadeLevels other = build_cascade_levels(c.table(!block), o);
  RC_ASSERT(other.order() == lv.order());
  RC_ASSERT(other.num_levels() == lv.num_levels());
  for (int l = 0; l < lv.num_levels(); ++l) {
    RC_ASSERT(other.arrays(l).request_indptr == lv.arrays(l).request_indptr);
    RC_ASSERT(other.arrays(l).page_indices == lv.arrays(l).page_indices);
    RC_ASSERT(other.arrays(l).seg_lens == lv.arrays(l).seg_lens);
  }
  if (in_prefix_tree_order(c)) RC_ASSERT(lv.identity_order());
  RC_TAG(lv.identity_order() ? "identity order" : "reordered", lv.num_levels());
  // every shared prefix kept (at most 5 nested ones: 4 forest levels and a duplicate or an
  // ending request): each distinct token is read once
  if (o.min_shared_tokens == 0 && o.max_levels == attnstate::kMaxCascadeLevels && q_len == 1)
    RC_ASSERT(lv.keys_read() == distinct_prefix_tokens(c));
  RC_ASSERT(lv.keys_read() <= lv.keys_total());

  const std::int64_t window = *rc::gen::element<std::int64_t>(-1, -1, -1, 0, 3, 20);
  RC_ASSERT(attnstate_test::cascade_equals_decode(c, lv, window));
}

}  // namespace
