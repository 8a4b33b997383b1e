/// @file test_core_cascade_levels.cpp
/// @brief `build_cascade_levels` (core/cascade_levels.hpp) on hand-made page tables: no sharing,
///        everything shared, a 3-level tree, forks, partial pages, prefixes of other requests,
///        one-token and empty requests, unsorted requests, the options, block tables against
///        CSR, determinism, `to_string`, the gather/scatter helpers and every argument check.
///        Each result is checked exactly (its arrays, and each position's segments against its
///        request's tokens) and, through the CPU cascade, against the CPU decode of the table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attnstate/core/cascade_levels.hpp"
#include "attnstate/core/error.hpp"
#include "cascade_levels_case.hpp"

namespace {

using attnstate::build_cascade_levels;
using attnstate::CascadeLevels;
using attnstate::CascadeLevelsOptions;
using attnstate::Error;
using attnstate::Status;
using attnstate_test::PageTableCase;
using I32 = std::vector<std::int32_t>;

/// A case of page size `ps` whose pool has two pages more than the largest id.
PageTableCase make_case(std::int64_t ps, std::vector<I32> pages, I32 lens, std::int64_t q_len = 1) {
  std::int32_t max_id = 0;
  for (const I32& l : pages)
    for (std::int32_t id : l) max_id = std::max(max_id, id);
  return PageTableCase(ps, max_id + 2, std::move(pages), std::move(lens), q_len);
}

CascadeLevelsOptions opts(std::int64_t min_shared, int max_levels = attnstate::kMaxCascadeLevels,
                          std::int64_t q_len = 1) {
  CascadeLevelsOptions o;
  o.min_shared_tokens = min_shared;
  o.max_levels = max_levels;
  o.q_len = q_len;
  return o;
}

/// Expects level `l` of `lv` to hold exactly these arrays.
void expect_level(const CascadeLevels& lv, int l, const I32& req, const I32& pind, const I32& ids,
                  const I32& lens) {
  const CascadeLevels::Arrays& a = lv.arrays(l);
  EXPECT_EQ(a.request_indptr, req) << "level " << l;
  EXPECT_EQ(a.page_indptr, pind) << "level " << l;
  EXPECT_EQ(a.page_indices, ids) << "level " << l;
  EXPECT_EQ(a.seg_lens, lens) << "level " << l;
}

/// Builds the levels of `c` with `o` from its CSR table, checks them exactly and against the
/// decode, and checks that its block table gives the same levels.
CascadeLevels build_and_check(const PageTableCase& c, const CascadeLevelsOptions& o) {
  const CascadeLevels lv = build_cascade_levels(c.table(), o);
  EXPECT_TRUE(attnstate_test::levels_are_exact(c, lv, o));
  EXPECT_TRUE(attnstate_test::cascade_equals_decode(c, lv));
  const CascadeLevels bt = build_cascade_levels(c.table(/*block=*/true), o);
  EXPECT_EQ(bt.order(), lv.order());
  EXPECT_EQ(bt.num_levels(), lv.num_levels());
  for (int l = 0; l < std::min(bt.num_levels(), lv.num_levels()); ++l) {
    EXPECT_EQ(bt.arrays(l).request_indptr, lv.arrays(l).request_indptr) << "level " << l;
    EXPECT_EQ(bt.arrays(l).page_indices, lv.arrays(l).page_indices) << "level " << l;
    EXPECT_EQ(bt.arrays(l).seg_lens, lv.arrays(l).seg_lens) << "level " << l;
  }
  return lv;
}

TEST(CascadeLevels, NoSharingGivesOneLevelOfWholeLists) {
  const PageTableCase c = make_case(4, {{0, 1}, {2}, {3, 4, 5}}, {7, 4, 9});
  const CascadeLevels lv = build_and_check(c, opts(0));
  ASSERT_EQ(lv.num_levels(), 1);
  EXPECT_TRUE(lv.identity_order());
  expect_level(lv, 0, {0, 1, 2, 3}, {0, 2, 3, 6}, {0, 1, 2, 3, 4, 5}, {7, 4, 9});
  EXPECT_EQ(lv.keys_read(), 20);
  EXPECT_EQ(lv.keys_total(), 20);
}

TEST(CascadeLevels, EverythingSharedLeavesEmptyRemainders) {
  const PageTableCase c =
      make_case(16, {{5, 6, 7}, {5, 6, 7}, {5, 6, 7}, {5, 6, 7}}, {40, 40, 40, 40});
  const CascadeLevels lv = build_and_check(c, opts(16));
  ASSERT_EQ(lv.num_levels(), 2);
  EXPECT_TRUE(lv.identity_order());  // identical requests keep their index order
  expect_level(lv, 0, {0, 4}, {0, 3}, {5, 6, 7}, {40});
  expect_level(lv, 1, {0, 1, 2, 3, 4}, {0, 0, 0, 0, 0}, {}, {0, 0, 0, 0});
  EXPECT_EQ(lv.keys_read(), 40);
  EXPECT_EQ(lv.keys_total(), 160);
}

TEST(CascadeLevels, QueryLengthMovesTrailingSharedPagesIntoTheRemainders) {
  // 3 new tokens need 2 in each remainder: the last page (8 tokens) moves down
  const PageTableCase c =
      make_case(16, {{5, 6, 7}, {5, 6, 7}, {5, 6, 7}, {5, 6, 7}}, {40, 40, 40, 40}, 3);
  const CascadeLevels lv = build_and_check(c, opts(16, 8, 3));
  ASSERT_EQ(lv.num_levels(), 2);
  expect_level(lv, 0, {0, 4}, {0, 2}, {5, 6}, {32});
  expect_level(lv, 1, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {7, 7, 7, 7}, {8, 8, 8, 8});
  // a last page of one token is not enough: two pages move
  const PageTableCase d =
      make_case(16, {{5, 6, 7}, {5, 6, 7}, {5, 6, 7}, {5, 6, 7}}, {33, 33, 33, 33}, 3);
  const CascadeLevels lw = build_and_check(d, opts(16, 8, 3));
  ASSERT_EQ(lw.num_levels(), 2);
  expect_level(lw, 0, {0, 4}, {0, 1}, {5}, {16});
  EXPECT_EQ(lw.arrays(1).seg_lens, (I32{17, 17, 17, 17}));
  // what is left shared falls below min_shared_tokens: no shared level
  const CascadeLevels lx = build_and_check(d, opts(17, 8, 3));
  EXPECT_EQ(lx.num_levels(), 1);
}

// A system prompt shared by all, few-shot blocks shared by two groups, own suffixes; the last
// request ends with its group's block (its list is a prefix of the others').
PageTableCase three_level_case(std::int64_t q_len = 1) {
  return make_case(
      4, {{0, 1, 2, 3, 10}, {0, 1, 2, 3, 11, 12}, {0, 1, 4, 13}, {0, 1, 4, 14}, {0, 1, 4}},
      {19, 21, 14, 16, 12}, q_len);
}

TEST(CascadeLevels, ThreeLevelTreeOfPromptBlocksAndSuffixes) {
  const PageTableCase c = three_level_case();
  const CascadeLevels lv = build_and_check(c, opts(4));
  ASSERT_EQ(lv.num_levels(), 3);
  EXPECT_TRUE(lv.identity_order());
  expect_level(lv, 0, {0, 5}, {0, 2}, {0, 1}, {8});
  expect_level(lv, 1, {0, 2, 5}, {0, 2, 3}, {2, 3, 4}, {8, 4});
  expect_level(lv, 2, {0, 1, 2, 3, 4, 5}, {0, 1, 3, 4, 5, 5}, {10, 11, 12, 13, 14},
               {3, 5, 2, 4, 0});
  EXPECT_EQ(lv.keys_read(), 8 + 12 + 14);
  EXPECT_EQ(lv.keys_total(), 82);
  EXPECT_EQ(to_string(lv),
            "cascade levels: batch 5, page_size 4, 3 levels, order identity, keys read 34 of 82; "
            "level 0: 1 shared (5 requests, 8 tokens); level 1: 2 shared (2..3 requests, 4..8 "
            "tokens, 12 in all); level 2 (own): 5 (0..5 tokens, 14 in all)");
}

// A conversation A and its forks: X continues A, Z forks X, Y forks A earlier. Listed X, Y, Z, A.
PageTableCase forks_case(std::int64_t q_len = 1) {
  return make_case(4, {{0, 1, 2, 3, 4, 5}, {0, 1, 6}, {0, 1, 2, 3, 4, 7}, {0, 1, 2, 3}},
                   {22, 11, 23, 16}, q_len);
}

TEST(CascadeLevels, ForksOfOneConversation) {
  const PageTableCase c = forks_case();
  const CascadeLevels lv = build_and_check(c, opts(4));
  ASSERT_EQ(lv.num_levels(), 4);
  EXPECT_EQ(lv.order(), (I32{0, 2, 3, 1}));  // X, Z, A (which X and Z continue), then Y
  expect_level(lv, 0, {0, 4}, {0, 2}, {0, 1}, {8});
  expect_level(lv, 1, {0, 3, 4}, {0, 2, 2}, {2, 3}, {8, 0});
  expect_level(lv, 2, {0, 2, 4}, {0, 1, 1}, {4}, {4, 0});
  expect_level(lv, 3, {0, 1, 2, 3, 4}, {0, 1, 2, 2, 3}, {5, 7, 6}, {2, 3, 0, 3});
  EXPECT_NE(to_string(lv).find("order permuted (3 moved)"), std::string::npos) << to_string(lv);
  EXPECT_NE(to_string(lv).find("level 1: 1 shared (3 requests, 8 tokens), 1 empty"),
            std::string::npos)
      << to_string(lv);
}

TEST(CascadeLevels, ForksWithTwoNewTokensGiveTheEndedConversationAPage) {
  // A needs one token of its own: the last page of the segment above it (shared by X, Z, A)
  // moves into A's remainder and into the segment below for X and Z
  const PageTableCase c = forks_case(2);
  const CascadeLevels lv = build_and_check(c, opts(4, 8, 2));
  ASSERT_EQ(lv.num_levels(), 4);
  expect_level(lv, 1, {0, 3, 4}, {0, 1, 1}, {2}, {4, 0});
  expect_level(lv, 2, {0, 2, 4}, {0, 2, 2}, {3, 4}, {8, 0});
  expect_level(lv, 3, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {5, 7, 3, 6}, {2, 3, 4, 3});
}

TEST(CascadeLevels, PartialPagesAreSharedOnlyForTheTokensAllHold) {
  // page 1 holds 2 tokens of A and all 4 of B: only page 0 is shared
  {
    const PageTableCase c = make_case(4, {{0, 1}, {0, 1, 2}}, {6, 10});
    const CascadeLevels lv = build_and_check(c, opts(0));
    ASSERT_EQ(lv.num_levels(), 2);
    expect_level(lv, 0, {0, 2}, {0, 1}, {0}, {4});
    expect_level(lv, 1, {0, 1, 2}, {0, 1, 3}, {1, 1, 2}, {2, 6});
  }
  // the same partial final page with the same tokens in both: shared whole
  {
    const PageTableCase c = make_case(4, {{0, 1}, {0, 1}}, {6, 6});
    const CascadeLevels lv = build_and_check(c, opts(0));
    ASSERT_EQ(lv.num_levels(), 2);
    expect_level(lv, 0, {0, 2}, {0, 2}, {0, 1}, {6});
    expect_level(lv, 1, {0, 1, 2}, {0, 0, 0}, {}, {0, 0});
  }
  // final pages of 2 and 3 tokens: each request re-reads its own
  {
    const PageTableCase c = make_case(4, {{0, 1}, {0, 1}}, {6, 7});
    const CascadeLevels lv = build_and_check(c, opts(0));
    ASSERT_EQ(lv.num_levels(), 2);
    expect_level(lv, 0, {0, 2}, {0, 1}, {0}, {4});
    expect_level(lv, 1, {0, 1, 2}, {0, 1, 2}, {1, 1}, {2, 3});
  }
  // A holds 2 tokens of page 1, B and C all of it: A leaves after page 0, B and C share page 1
  {
    const PageTableCase c = make_case(4, {{0, 1}, {0, 1, 2}, {0, 1, 3}}, {6, 12, 10});
    const CascadeLevels lv = build_and_check(c, opts(0));
    ASSERT_EQ(lv.num_levels(), 3);
    EXPECT_TRUE(lv.identity_order());
    expect_level(lv, 0, {0, 3}, {0, 1}, {0}, {4});
    expect_level(lv, 1, {0, 1, 3}, {0, 0, 1}, {1}, {0, 4});
    expect_level(lv, 2, {0, 1, 2, 3}, {0, 1, 2, 3}, {1, 2, 3}, {2, 4, 2});
  }
}

TEST(CascadeLevels, RequestWhoseListIsAPrefixOfAnother) {
  const PageTableCase c = make_case(16, {{0, 1}, {0, 1, 2}}, {32, 40});
  const CascadeLevels lv = build_and_check(c, opts(16));
  ASSERT_EQ(lv.num_levels(), 2);
  expect_level(lv, 0, {0, 2}, {0, 2}, {0, 1}, {32});
  expect_level(lv, 1, {0, 1, 2}, {0, 0, 1}, {2}, {0, 8});
  // two new tokens: the shorter request needs one of its own
  const PageTableCase d = make_case(16, {{0, 1}, {0, 1, 2}}, {32, 40}, 2);
  const CascadeLevels lw = build_and_check(d, opts(16, 8, 2));
  ASSERT_EQ(lw.num_levels(), 2);
  expect_level(lw, 0, {0, 2}, {0, 1}, {0}, {16});
  expect_level(lw, 1, {0, 1, 2}, {0, 1, 3}, {1, 1, 2}, {16, 24});
}

TEST(CascadeLevels, OneTokenRequests) {
  const PageTableCase c = make_case(16, {{4}, {4}, {4}}, {1, 1, 1});
  // one shared token is below the default minimum: no shared level
  const CascadeLevels lv = build_and_check(c, CascadeLevelsOptions{});
  ASSERT_EQ(lv.num_levels(), 1);
  expect_level(lv, 0, {0, 1, 2, 3}, {0, 1, 2, 3}, {4, 4, 4}, {1, 1, 1});
  const CascadeLevels lw = build_and_check(c, opts(1));
  ASSERT_EQ(lw.num_levels(), 2);
  expect_level(lw, 0, {0, 3}, {0, 1}, {4}, {1});
  // one token of a page another request fills is not shared, whatever the minimum
  const PageTableCase d = make_case(16, {{4}, {4, 5}}, {1, 20});
  EXPECT_EQ(build_and_check(d, opts(0)).num_levels(), 1);
}

TEST(CascadeLevels, EmptyRequests) {
  // B and D share two pages; the empty requests A and C share nothing and C moves after D
  const PageTableCase c = make_case(4, {{}, {0, 1}, {}, {0, 1, 2}}, {0, 8, 0, 9});
  const CascadeLevels lv = build_and_check(c, opts(4));
  ASSERT_EQ(lv.num_levels(), 2);
  EXPECT_EQ(lv.order(), (I32{0, 1, 3, 2}));
  expect_level(lv, 0, {0, 1, 3, 4}, {0, 0, 2, 2}, {0, 1}, {0, 8, 0});
  expect_level(lv, 1, {0, 1, 2, 3, 4}, {0, 0, 0, 1, 1}, {2}, {0, 0, 1, 0});
  // a batch of empty requests, and an empty batch
  const PageTableCase e = make_case(4, {{}, {}, {}}, {0, 0, 0});
  const CascadeLevels le = build_and_check(e, opts(0));
  ASSERT_EQ(le.num_levels(), 1);
  expect_level(le, 0, {0, 1, 2, 3}, {0, 0, 0, 0}, {}, {0, 0, 0});
  const PageTableCase z = make_case(4, {}, {});
  const CascadeLevels lz = build_cascade_levels(z.table(), opts(0));
  ASSERT_EQ(lz.num_levels(), 1);
  EXPECT_EQ(lz.batch(), 0);
  expect_level(lz, 0, {0, 0}, {0, 0}, {}, {0});
  EXPECT_TRUE(attnstate_test::cascade_equals_decode(z, lz));
}

TEST(CascadeLevels, UnsortedRequestsAreGroupedAndGatheredBack) {
  // two prompts P = {0, 1} and Q = {2, 3}, their requests interleaved
  const PageTableCase c =
      make_case(4, {{0, 1, 10}, {2, 3, 11}, {0, 1, 12}, {2, 3, 13}}, {9, 10, 11, 12});
  const CascadeLevels lv = build_and_check(c, opts(8));
  ASSERT_EQ(lv.num_levels(), 2);
  EXPECT_EQ(lv.order(), (I32{0, 2, 1, 3}));
  expect_level(lv, 0, {0, 2, 4}, {0, 2, 4}, {0, 1, 2, 3}, {8, 8});
  expect_level(lv, 1, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {10, 12, 11, 13}, {1, 3, 2, 4});
  // listed in prefix-tree order, the same requests need no reordering
  const PageTableCase d =
      make_case(4, {{0, 1, 10}, {0, 1, 12}, {2, 3, 11}, {2, 3, 13}}, {9, 11, 10, 12});
  EXPECT_TRUE(build_and_check(d, opts(8)).identity_order());
}

TEST(CascadeLevels, ShortSharedRunsFoldIntoTheSegmentsBelow) {
  // page 0 (4 tokens) is shared by all, {1, 2} by the first two, {3} by the last two
  const PageTableCase c =
      make_case(4, {{0, 1, 2, 10}, {0, 1, 2, 11}, {0, 3, 12}, {0, 3, 13}}, {13, 14, 9, 12});
  const CascadeLevels all = build_and_check(c, opts(4));
  EXPECT_EQ(all.num_levels(), 3);
  // 8 tokens at least: page 0 joins each group's segment
  const CascadeLevels lv = build_and_check(c, opts(8));
  ASSERT_EQ(lv.num_levels(), 2);
  expect_level(lv, 0, {0, 2, 4}, {0, 3, 5}, {0, 1, 2, 0, 3}, {12, 8});
  expect_level(lv, 1, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {10, 11, 12, 13}, {1, 2, 1, 4});
  // 12 at least: the second group reads its 8 shared tokens itself
  const CascadeLevels lw = build_and_check(c, opts(12));
  ASSERT_EQ(lw.num_levels(), 2);
  expect_level(lw, 0, {0, 2, 4}, {0, 3, 3}, {0, 1, 2}, {12, 0});
  expect_level(lw, 1, {0, 1, 2, 3, 4}, {0, 1, 2, 5, 8}, {10, 11, 0, 3, 12, 0, 3, 13},
               {1, 2, 9, 12});
}

TEST(CascadeLevels, MaxLevelsFoldsDeeperStructureIntoTheRemainders) {
  // nested groups: {0} shared by 5, {1} by 4, {2} by 3, {3} by 2
  const PageTableCase c =
      make_case(4, {{0, 10}, {0, 1, 11}, {0, 1, 2, 12}, {0, 1, 2, 3, 13}, {0, 1, 2, 3, 14}},
                {8, 12, 16, 20, 20});
  EXPECT_EQ(build_and_check(c, opts(4)).num_levels(), 5);
  const CascadeLevels lv = build_and_check(c, opts(4, 3));
  ASSERT_EQ(lv.num_levels(), 3);
  expect_level(lv, 0, {0, 5}, {0, 1}, {0}, {4});
  expect_level(lv, 1, {0, 1, 5}, {0, 0, 1}, {1}, {0, 4});
  expect_level(lv, 2, {0, 1, 2, 3, 4, 5}, {0, 1, 2, 4, 7, 10}, {10, 11, 2, 12, 2, 3, 13, 2, 3, 14},
               {4, 4, 8, 12, 12});
  const CascadeLevels one = build_and_check(c, opts(4, 1));
  ASSERT_EQ(one.num_levels(), 1);
  EXPECT_EQ(one.keys_read(), one.keys_total());
}

TEST(CascadeLevels, BlockTableAndCsrAgreeWithExtraPagesIgnored) {
  // the CSR lists hold pages past each request's tokens (-1: never read); the block table's
  // spare columns hold -1 too
  PageTableCase c = three_level_case();
  for (I32& l : c.pages) l.push_back(-1);
  const PageTableCase d(c.page_size, c.num_pages, c.pages, c.lens);
  const CascadeLevels a = build_and_check(d, opts(4));
  const CascadeLevels b = build_and_check(three_level_case(), opts(4));
  for (int l = 0; l < a.num_levels(); ++l)
    EXPECT_EQ(a.arrays(l).page_indices, b.arrays(l).page_indices);
}

TEST(CascadeLevels, DeterministicAndCopiesViewTheirOwnArrays) {
  const PageTableCase c = forks_case();
  const CascadeLevels a = build_cascade_levels(c.table(), opts(4));
  const CascadeLevels b = build_cascade_levels(c.table(), opts(4));
  EXPECT_EQ(to_string(a), to_string(b));
  EXPECT_EQ(a.order(), b.order());
  CascadeLevels copy = a;
  CascadeLevels assigned;
  assigned = b;
  CascadeLevels moved = std::move(copy);
  for (const CascadeLevels* x : {&assigned, &moved}) {
    ASSERT_EQ(x->num_levels(), a.num_levels());
    EXPECT_TRUE(attnstate_test::levels_are_exact(c, *x, opts(4)));
    for (int l = 0; l < a.num_levels(); ++l) {
      EXPECT_EQ(x->arrays(l).page_indices, a.arrays(l).page_indices);
      EXPECT_NE(x->levels()[l].seg_lens, a.levels()[l].seg_lens);  // its own arrays
    }
  }
}

// --- argument checks --------------------------------------------------------------------------

/// The message of the `Error` `f` throws (status `kInvalidArgument`), or "" when none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument) << e.what();
    return e.what();
  }
  return "";
}

/// Expects `f` to throw naming the argument `arg`.
void expect_names(const std::function<void()>& f, const std::string& arg) {
  const std::string msg = error_of(f);
  EXPECT_NE(msg.find("argument '" + arg + "'"), std::string::npos)
      << "expected an error naming " << arg << ", got: " << msg;
}

TEST(CascadeLevels, ChecksTheTable) {
  const PageTableCase c = three_level_case();
  const auto build = [](attnstate::PagedKvCache kv, CascadeLevelsOptions o = {}) {
    return [kv, o] { (void)build_cascade_levels(kv, o); };
  };
  attnstate::PagedKvCache kv = c.table();
  kv.space = attnstate::MemorySpace::kDevice;
  expect_names(build(kv), "table.space");
  for (std::int64_t ps : {std::int64_t{0}, std::int64_t{-3}, std::int64_t{1} << 31}) {
    kv = c.table();
    kv.page_size = ps;
    expect_names(build(kv), "table.page_size");
  }
  kv = c.table();
  kv.num_pages = -1;
  expect_names(build(kv), "table.num_pages");
  kv = c.table();
  kv.batch = -1;
  expect_names(build(kv), "table.batch");
  kv.batch = (std::int64_t{1} << 30) + 1;
  expect_names(build(kv), "table.batch");
  kv = c.table();
  kv.seq_lens = nullptr;
  expect_names(build(kv), "table.seq_lens");
  kv = c.table();
  kv.block_table = c.block_table.data();
  expect_names(build(kv), "table.block_table");  // both tables
  kv.page_indptr = nullptr;
  kv.page_indices = nullptr;
  kv.block_table = nullptr;
  expect_names(build(kv), "table.block_table");  // neither
  kv = c.table();
  kv.page_indices = nullptr;
  expect_names(build(kv), "table.page_indices");
  kv = c.table();
  kv.page_indptr = nullptr;
  expect_names(build(kv), "table.page_indptr");
  kv = c.table(true);
  kv.block_table_stride = -1;
  expect_names(build(kv), "table.block_table_stride");
  kv.block_table_stride = std::int64_t{1} << 61;  // 5 rows of it pass 2^62 bytes
  expect_names(build(kv), "table.block_table_stride");
  // a misaligned length array
  std::vector<std::int32_t> lens_buf(c.lens.size() + 1);
  kv = c.table();
  kv.seq_lens =
      reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(lens_buf.data()) + 1);
  expect_names(build(kv), "table.seq_lens");
}

TEST(CascadeLevels, ChecksTheTableContents) {
  const PageTableCase c = three_level_case();
  const auto build = [](const attnstate::PagedKvCache& kv, CascadeLevelsOptions o = {}) {
    return [kv, o] { (void)build_cascade_levels(kv, o); };
  };
  // offsets: [0] not 0, a decrease
  I32 indptr = c.indptr;
  indptr[0] = 1;
  attnstate::PagedKvCache kv = c.table();
  kv.page_indptr = indptr.data();
  expect_names(build(kv), "table.page_indptr[0]");
  indptr = c.indptr;
  indptr[2] = indptr[1] - 1;
  kv.page_indptr = indptr.data();
  expect_names(build(kv), "table.page_indptr[2]");
  // lengths: negative, past the request's pages (CSR and block table), shorter than q_len - 1
  for (const bool block : {false, true}) {
    I32 lens = c.lens;
    kv = c.table(block);
    kv.seq_lens = lens.data();
    lens[1] = -1;
    expect_names(build(kv), "table.seq_lens[1]");
    lens[1] = block ? static_cast<std::int32_t>(c.stride * c.page_size + 1) : 25;
    expect_names(build(kv), "table.seq_lens[1]");
    lens = c.lens;
    lens[4] = 2;
    kv.seq_lens = lens.data();
    CascadeLevelsOptions o;
    o.q_len = 4;
    expect_names(build(kv, o), "table.seq_lens[4]");
    o.q_len = 3;
    EXPECT_EQ(error_of(build(kv, o)), "");
  }
  // page ids outside the pool, in either table
  I32 ids = c.indices;
  kv = c.table();
  kv.page_indices = ids.data();
  ids[3] = static_cast<std::int32_t>(c.num_pages);
  expect_names(build(kv), "table.page_indices[3]");
  ids[3] = -1;
  expect_names(build(kv), "table.page_indices[3]");
  I32 bt = c.block_table;
  kv = c.table(true);
  kv.block_table = bt.data();
  bt[c.stride + 2] = -5;
  expect_names(build(kv), "table.block_table[" + std::to_string(c.stride + 2) + "]");
  bt = c.block_table;
  kv.block_table = bt.data();
  kv.num_pages = 0;
  expect_names(build(kv), "table.block_table[0]");
}

TEST(CascadeLevels, ChecksTheOptions) {
  const PageTableCase c = three_level_case();
  const auto build = [&](CascadeLevelsOptions o) {
    return [&c, o] { (void)build_cascade_levels(c.table(), o); };
  };
  expect_names(build(opts(-1)), "options.min_shared_tokens");
  expect_names(build(opts(4, 0)), "options.max_levels");
  expect_names(build(opts(4, attnstate::kMaxCascadeLevels + 1)), "options.max_levels");
  expect_names(build(opts(4, 8, 0)), "options.q_len");
  expect_names(build(opts(4, 8, attnstate::kMaxCascadeQueryLen + 1)), "options.q_len");
  const CascadeLevels lv = build_cascade_levels(c.table(), opts(4));
  expect_names([&] { (void)lv.arrays(-1); }, "level");
  expect_names([&] { (void)lv.arrays(lv.num_levels()); }, "level");
}

TEST(CascadeLevels, ChecksTheGatherAndScatterViews) {
  using namespace attnstate;
  const PageTableCase c = forks_case();
  const CascadeLevels lv = build_cascade_levels(c.table(), opts(4));
  const std::int64_t bytes = static_cast<std::int64_t>(c.q.size() * sizeof(float));
  std::vector<float> dst(c.q.size() + 1);
  expect_names([&] { (void)gather_queries(lv, c.query(), dst.data(), bytes - 4); }, "dst_bytes");
  expect_names([&] { (void)gather_queries(lv, c.query(), nullptr, bytes); }, "dst");
  expect_names(
      [&] { (void)gather_queries(lv, c.query(), reinterpret_cast<char*>(dst.data()) + 2, bytes); },
      "dst");
  std::vector<float> q_copy = c.q;
  const ConstTensorView q_over =
      make_tensor_view(q_copy.data(), DType::kF32, {c.batch(), c.q_len, c.heads_q, c.head_dim});
  expect_names([&] { (void)gather_queries(lv, q_over, q_copy.data() + 4, bytes); }, "dst");
  const ConstTensorView q3 =
      make_tensor_view(c.q.data(), DType::kF32, {c.batch() - 1, c.q_len, c.heads_q, c.head_dim});
  expect_names([&] { (void)gather_queries(lv, q3, dst.data(), bytes); }, "q.shape[0]");
  // the copy itself: position i is request order[i]
  const ConstTensorView g = gather_queries(lv, c.query(), dst.data(), bytes);
  const std::int64_t per = c.q_len * c.heads_q * c.head_dim;
  for (std::int64_t i = 0; i < c.batch(); ++i)
    for (std::int64_t e = 0; e < per; ++e)
      ASSERT_EQ(static_cast<const float*>(g.data)[i * per + e], c.q[lv.order()[i] * per + e]);

  const std::int64_t tokens = c.batch() * c.q_len, rows = tokens * c.heads_q;
  std::vector<float> so(static_cast<std::size_t>(rows * c.head_dim)), sl(rows), dop(so.size()),
      dl(sl.size());
  for (std::size_t i = 0; i < so.size(); ++i) so[i] = static_cast<float>(i);
  for (std::size_t i = 0; i < sl.size(); ++i) sl[i] = static_cast<float>(i);
  const ConstStateView src = make_const_state_view(so.data(), DType::kF32, sl.data(), tokens,
                                                   c.heads_q, c.head_dim, LseBase::kBase2);
  StateView out = make_state_view(dop.data(), DType::kF32, dl.data(), tokens, c.heads_q, c.head_dim,
                                  LseBase::kNatural);
  scatter_state(lv, src, out);
  for (std::int64_t i = 0; i < c.batch(); ++i)
    for (std::int64_t h = 0; h < c.heads_q; ++h) {
      const std::int64_t from = i * c.heads_q + h, to = lv.order()[i] * c.heads_q + h;
      EXPECT_EQ(dop[to * c.head_dim + 3], so[from * c.head_dim + 3]);
      EXPECT_FLOAT_EQ(dl[to], sl[from] * std::log(2.f));  // written in out's base
    }
  StateView bad = make_state_view(dop.data(), DType::kF32, dl.data(), tokens - 1, c.heads_q,
                                  c.head_dim, LseBase::kNatural);
  expect_names([&] { scatter_state(lv, src, bad); }, "dst.tokens");
  ConstStateView odd = src;
  odd.tokens = tokens - 1;
  bad.tokens = tokens - 1;
  expect_names([&] { scatter_state(lv, odd, bad); }, "src.tokens");
  bad = out;
  bad.dtype = DType::kF16;
  expect_names([&] { scatter_state(lv, src, bad); }, "dst.dtype");
  bad = make_state_view(so.data(), DType::kF32, dl.data(), tokens, c.heads_q, c.head_dim,
                        LseBase::kNatural);
  expect_names([&] { scatter_state(lv, src, bad); }, "dst.o");
  bad = out;
  bad.space = MemorySpace::kDevice;
  expect_names([&] { scatter_state(lv, src, bad); }, "dst.space");
}

}  // namespace
