/// @file prop_testing_kit.cpp
/// @brief RapidCheck properties of the testing kit itself (its unit tests: tests/testing):
///        partitions and disjoint pairs are what they promise; the double reference obeys the
///        algebra (the merge of the parts' states is the whole's, rebasing round-trips, per-token
///        rows are their own keys' states), merges each row's sink once after the keys, and
///        restricts a windowed row to its window's keys (positions kept by `select_keys`, the
///        split/merge law with windows and caps).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "attnstate/core/variant.hpp"
#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/reference.hpp"
#include "kit_test_utils.hpp"

namespace {

using namespace attnstate::testing;  // NOLINT(google-build-using-namespace): test file
using attnstate::kNoWindow;
using attnstate::LseBase;

constexpr double kTight = 1e-12;

// --- generators ----------------------------------------------------------------------------------

RC_GTEST_PROP(KitGenerators, PartitionIsDisjointAndCoversAllKeys, ()) {
  const auto n = *rc::gen::inRange<std::int64_t>(0, 60);
  const auto max_parts = *rc::gen::inRange(1, 8);
  const auto parts = *gen_partition(n, max_parts);
  RC_ASSERT(parts.size() >= 1u);
  RC_ASSERT(static_cast<int>(parts.size()) <= max_parts);
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  for (const auto& part : parts) {
    RC_ASSERT(std::is_sorted(part.begin(), part.end()));
    for (std::int64_t k : part) {
      RC_ASSERT(k >= 0 && k < n);
      ++seen[static_cast<std::size_t>(k)];
    }
  }
  for (int c : seen) RC_ASSERT(c == 1);
}

RC_GTEST_PROP(KitGenerators, DisjointPairIsDisjoint, ()) {
  const auto n = *rc::gen::inRange<std::int64_t>(0, 60);
  const auto pair = *gen_disjoint_pair(n);
  std::set<std::int64_t> a(pair.first.begin(), pair.first.end());
  for (std::int64_t k : pair.second) RC_ASSERT(a.count(k) == 0u);
  for (std::int64_t k : pair.first) RC_ASSERT(k >= 0 && k < n);
  for (std::int64_t k : pair.second) RC_ASSERT(k >= 0 && k < n);
}

// --- reference -----------------------------------------------------------------------------------

std::string compare_refs(const ReferenceState& a, const ReferenceState& b) {
  for (std::size_t i = 0; i < a.lse.size(); ++i) {
    if (!(std::fabs(a.lse[i] - b.lse[i]) <= kTight * (1 + std::fabs(b.lse[i]))) &&
        !(a.lse[i] == b.lse[i])) {
      return "lse[" + std::to_string(i) + "] " + std::to_string(a.lse[i]) + " vs " +
             std::to_string(b.lse[i]);
    }
  }
  for (std::size_t i = 0; i < a.o.size(); ++i) {
    if (!(std::fabs(a.o[i] - b.o[i]) <= kTight)) {
      return "o[" + std::to_string(i) + "] " + std::to_string(a.o[i]) + " vs " +
             std::to_string(b.o[i]);
    }
  }
  return {};
}

RC_GTEST_PROP(KitReference, MergeOfPartsEqualsStateOfWhole, ()) {
  const PartitionedProblem pp = *gen_partitioned_problem(ProblemGenOptions{}, 5);
  const AttentionProblem& p = pp.problem;
  std::vector<ReferenceState> parts;
  for (const auto& part : pp.parts) {
    parts.push_back(reference_state(p, part, *rc::gen::arbitrary<LseBase>()));
  }
  const ReferenceState whole = reference_state(p, all_keys(p.num_keys()));
  const std::string msg = compare_refs(reference_merge(parts, p.base), whole);
  RC_ASSERT(msg.empty());
}

RC_GTEST_PROP(KitReference, RebaseRoundTrips, ()) {
  const HostState s = *gen_state();
  const ReferenceState r = to_reference(s);
  const ReferenceState back = rebased(rebased(r, LseBase::kBase2), LseBase::kNatural);
  const ReferenceState want = rebased(r, LseBase::kNatural);
  for (std::size_t i = 0; i < r.lse.size(); ++i) {
    RC_ASSERT(back.lse[i] == want.lse[i] ||
              std::fabs(back.lse[i] - want.lse[i]) <= kTight * (1 + std::fabs(want.lse[i])));
  }
}

RC_GTEST_PROP(KitReference, PerTokenRowsAreTheStatesOfTheirOwnKeys, ()) {
  const AttentionProblem p = *gen_attention_problem();
  std::vector<std::vector<std::int64_t>> keys;
  for (std::int64_t t = 0; t < p.tokens(); ++t) keys.push_back(*gen_key_subset(p.num_keys()));
  const LseBase base = *rc::gen::arbitrary<LseBase>();
  const ReferenceState r = reference_state_per_token(p, keys, base);
  RC_ASSERT(r.tokens == p.tokens());
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    // Bit for bit the row of the one-key-set reference: the same computation.
    const ReferenceState one = reference_state(p, keys[static_cast<std::size_t>(t)], base);
    for (std::int64_t h = 0; h < p.heads_q(); ++h) {
      const double a = r.lse_at(t, h), b = one.lse_at(t, h);
      RC_ASSERT((a == b || (std::isnan(a) && std::isnan(b))));
      for (std::int64_t d = 0; d < p.head_dim(); ++d) {
        const std::size_t i = static_cast<std::size_t>((t * p.heads_q() + h) * p.head_dim() + d);
        RC_ASSERT((r.o[i] == one.o[i] || (std::isnan(r.o[i]) && std::isnan(one.o[i]))));
        RC_ASSERT((r.o_magnitude[i] == one.o_magnitude[i] ||
                   (std::isnan(r.o_magnitude[i]) && std::isnan(one.o_magnitude[i]))));
      }
    }
  }
}

// --- sinks ---------------------------------------------------------------------------------------

ProblemGenOptions sink_options() {
  ProblemGenOptions o = variant_problem_options(sink_problem_options());
  o.sink_percent = 100;
  o.max_keys = 60;
  o.max_tokens = 4;
  return o;
}

RC_GTEST_PROP(KitSinks, TheSinkIsMergedOnceAfterThePartials, ()) {
  const PartitionedProblem pp = *gen_partitioned_problem(sink_options(), 4);
  const AttentionProblem& p = pp.problem;
  RC_ASSERT(p.has_sinks());
  std::vector<ReferenceState> partials, sunk_partials;
  for (const auto& part : pp.parts) {
    partials.push_back(reference_state(without_sinks(p), part, LseBase::kNatural));
    sunk_partials.push_back(reference_state(p, part, LseBase::kNatural));
  }
  const ReferenceState whole = reference_state(p, all_keys(p.num_keys()), LseBase::kNatural);
  const ReferenceState once = apply_sinks(reference_merge(partials, LseBase::kNatural), p.sinks);
  for (std::size_t i = 0; i < whole.lse.size(); ++i) {
    RC_ASSERT(std::fabs(once.lse[i] - whole.lse[i]) <= 1e-9 * (1 + std::fabs(whole.lse[i])));
  }
  for (std::size_t i = 0; i < whole.o.size(); ++i) {
    RC_ASSERT(std::fabs(once.o[i] - whole.o[i]) <= 1e-9);
    RC_ASSERT(std::fabs(once.o_magnitude[i] - whole.o_magnitude[i]) <= 1e-9);
  }
  // A sink merged into every partial counts once per partial: the LSE grows by
  // log1p((n - 1) · share), share the sink's weight in the whole row.
  const ReferenceState per_part = reference_merge(sunk_partials, LseBase::kNatural);
  const double n = static_cast<double>(pp.parts.size());
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    for (std::int64_t h = 0; h < p.heads_q(); ++h) {
      const double share = std::exp(p.sinks[static_cast<std::size_t>(h)] - whole.lse_at(t, h));
      const double grows = per_part.lse_at(t, h) - whole.lse_at(t, h);
      RC_ASSERT(std::fabs(grows - std::log1p((n - 1) * share)) <= 1e-9);
    }
  }
}

RC_GTEST_PROP(KitSinks, PerTokenKeysMergeTheSinkOncePerRow, ()) {
  const AttentionProblem p = *gen_attention_problem(sink_options());
  const auto keys = *gen_key_subset(p.num_keys());
  const std::vector<std::vector<std::int64_t>> per_row(static_cast<std::size_t>(p.tokens()), keys);
  const ReferenceState a = reference_state(p, keys, LseBase::kBase2);
  const ReferenceState b = reference_state_per_token(p, per_row, LseBase::kBase2);
  RC_ASSERT(a.lse == b.lse);
  RC_ASSERT(a.o == b.o);
}

// --- variants ------------------------------------------------------------------------------------

/// The keys of `keys` at positions in `[max(0, p - w), p]` (w = kNoWindow: `[0, p]`), computed
/// here from the definition, apart from the kit's `visible_keys`.
std::vector<std::int64_t> in_window(const AttentionProblem& pr, std::int64_t t,
                                    const std::vector<std::int64_t>& keys) {
  std::vector<std::int64_t> out;
  const std::int64_t p = pr.positions[static_cast<std::size_t>(t)];
  const std::int64_t w = pr.variant.window_left;
  for (std::int64_t key : keys) {
    const std::int64_t at =
        pr.key_positions.empty() ? key : pr.key_positions[static_cast<std::size_t>(key)];
    if (at <= p && (w == kNoWindow || at >= p - w)) out.push_back(key);
  }
  return out;
}

ProblemGenOptions windowed_options() {
  ProblemGenOptions o;
  o.window_percent = 100;
  o.soft_cap_percent = 50;
  o.max_keys = 60;
  o.max_tokens = 4;
  return o;
}

/// Exact agreement of two double references (the same terms in the same order).
void expect_same(const ReferenceState& a, const ReferenceState& b) {
  RC_ASSERT(a.o.size() == b.o.size());
  for (std::size_t i = 0; i < a.lse.size(); ++i) {
    RC_ASSERT((a.lse[i] == b.lse[i]) || (std::isnan(a.lse[i]) && std::isnan(b.lse[i])));
  }
  for (std::size_t i = 0; i < a.o.size(); ++i) RC_ASSERT(a.o[i] == b.o[i]);
}

RC_GTEST_PROP(KitVariants, AWindowRestrictsTheKeySet, ()) {
  // The state over a windowed problem is the plain state over the keys inside each row's window.
  const AttentionProblem p = *gen_attention_problem(windowed_options());
  RC_ASSERT(p.has_positions());
  const auto keys = *gen_key_subset(p.num_keys());
  std::vector<std::vector<std::int64_t>> per_row;
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    per_row.push_back(in_window(p, t, keys));
    RC_ASSERT(visible_keys(p, t, keys) == per_row.back());
  }
  AttentionProblem plain = p;
  plain.positions.clear();
  plain.variant.window_left = kNoWindow;
  expect_same(reference_state(p, keys, LseBase::kNatural),
              reference_state_per_token(plain, per_row, LseBase::kNatural));
  // ... and per-token key lists are windowed the same way
  std::vector<std::vector<std::int64_t>> all(static_cast<std::size_t>(p.tokens()), keys);
  expect_same(reference_state_per_token(p, all, LseBase::kNatural),
              reference_state_per_token(plain, per_row, LseBase::kNatural));
}

RC_GTEST_PROP(KitVariants, SelectKeysKeepsTheKeysPositions, ()) {
  const AttentionProblem p = *gen_attention_problem(windowed_options());
  const auto keys = *gen_key_subset(p.num_keys());
  const AttentionProblem sub = select_keys(p, keys);
  RC_ASSERT(sub.variant.window_left == p.variant.window_left);
  RC_ASSERT(sub.variant.logits_soft_cap == p.variant.logits_soft_cap);
  RC_ASSERT(sub.positions == p.positions);
  RC_ASSERT(sub.key_positions == keys);  // key i of p is at position i
  expect_same(reference_state(sub, all_keys(sub.num_keys())), reference_state(p, keys));
  // selecting again composes the positions
  const auto again = *gen_key_subset(sub.num_keys());
  std::vector<std::int64_t> composed;
  for (std::int64_t i : again) composed.push_back(keys[static_cast<std::size_t>(i)]);
  RC_ASSERT(select_keys(sub, again).key_positions == composed);
}

RC_GTEST_PROP(KitVariants, TheStatesOfAPartitionMergeToTheWhole, ()) {
  // The split/merge law of the reference itself with windows and caps: a window is a per-key
  // restriction and the cap a per-score transform.
  const PartitionedProblem pp = *gen_partitioned_problem(windowed_options(), 4);
  std::vector<ReferenceState> parts;
  for (const auto& part : pp.parts) parts.push_back(reference_state(pp.problem, part));
  const ReferenceState merged = reference_merge(parts, LseBase::kNatural);
  const ReferenceState whole =
      reference_state(pp.problem, all_keys(pp.problem.num_keys()), LseBase::kNatural);
  for (std::size_t i = 0; i < whole.lse.size(); ++i) {
    if (std::isinf(whole.lse[i])) {
      RC_ASSERT(merged.lse[i] == whole.lse[i]);
    } else {
      RC_ASSERT(std::fabs(merged.lse[i] - whole.lse[i]) <= 1e-9 * (1 + std::fabs(whole.lse[i])));
    }
  }
  for (std::size_t i = 0; i < whole.o.size(); ++i) {
    RC_ASSERT(std::fabs(merged.o[i] - whole.o[i]) <= 1e-9);
  }
}

}  // namespace
