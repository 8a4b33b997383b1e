/// @file test_cpu_merge.cpp
/// @brief cpu/merge.hpp against a double-precision reference: merge_state, merge_state_inplace,
///        merge_states (both dense layouts, any strides), merge_states_ragged and rebase, over
///        dtype and base combinations, strided views and NaN-poisoned outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/cpu/merge.hpp"
#include "cpu_test_utils.hpp"

namespace attnstate {
namespace {

using test::OwnedState;
using test::RefState;

const DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

struct Shape {
  std::int64_t tokens, heads, head_dim;
};
const Shape kShapes[] = {{1, 1, 1}, {1, 128, 64}, {7, 3, 5}, {33, 8, 128}, {2, 5, 200}};

std::string describe(const Shape& s, DType a, DType b, DType o) {
  return std::to_string(s.tokens) + "x" + std::to_string(s.heads) + "x" +
         std::to_string(s.head_dim) + " " + to_string(a) + "+" + to_string(b) + "->" + to_string(o);
}

TEST(MergeState, MatchesDoubleReferenceForEveryDtypeAndBase) {
  std::mt19937 rng(101);
  for (const Shape& s : kShapes)
    for (DType da : kDTypes)
      for (DType db : kDTypes)
        for (DType dout : kDTypes) {
          OwnedState a = test::make_state(s.tokens, s.heads, s.head_dim, da, test::random_base(rng),
                                          test::random_padding(rng));
          OwnedState b = test::make_state(s.tokens, s.heads, s.head_dim, db, test::random_base(rng),
                                          test::random_padding(rng));
          OwnedState out = test::make_state(s.tokens, s.heads, s.head_dim, dout,
                                            test::random_base(rng), test::random_padding(rng));
          test::fill_random(a, rng, -6, 6, 0.2);
          test::fill_random(b, rng, -6, 6, 0.2);
          cpu::merge_state(a.cview(), b.cview(), out.view());
          RefState ref = test::ref_merge({&a, &b});
          test::expect_matches(out, ref, test::o_tolerance(dout), describe(s, da, db, dout));
        }
}

TEST(MergeState, OutputMayAliasEitherInputExactly) {
  std::mt19937 rng(102);
  for (int which = 0; which < 2; ++which) {
    OwnedState a = test::make_state(9, 4, 32, DType::kF32, LseBase::kNatural);
    OwnedState b = test::make_state(9, 4, 32, DType::kBF16, LseBase::kBase2, {1, 2, 0, 1, true});
    test::fill_random(a, rng, -3, 3, 0.25);
    test::fill_random(b, rng, -3, 3, 0.25);
    OwnedState expect = test::make_state(9, 4, 32, DType::kF32, LseBase::kNatural);
    cpu::merge_state(a.cview(), b.cview(), expect.view());
    RefState ref = test::ref_merge({&a, &b});
    test::expect_matches(expect, ref, test::o_tolerance(DType::kF32), "not aliased");
    if (which == 0) {
      cpu::merge_state(a.cview(), b.cview(), a.view());
      EXPECT_TRUE(test::bitwise_equal(a, expect));
    } else {
      OwnedState c = test::make_state(9, 4, 32, DType::kF32, LseBase::kNatural);
      test::fill_random(c, rng, -3, 3, 0.25);
      OwnedState expect_c = test::make_state(9, 4, 32, DType::kF32, LseBase::kNatural);
      cpu::merge_state(a.cview(), c.cview(), expect_c.view());
      RefState ref_c = test::ref_merge({&a, &c});
      test::expect_matches(expect_c, ref_c, test::o_tolerance(DType::kF32), "not aliased (c)");
      cpu::merge_state(a.cview(), c.cview(), c.view());
      EXPECT_TRUE(test::bitwise_equal(c, expect_c));
    }
  }
}

TEST(MergeState, EmptyStateWithNaNOutputIsBitwiseIdentity) {
  std::mt19937 rng(103);
  for (DType dt : kDTypes)
    for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
      OwnedState a = test::make_state(5, 6, 17, dt, base);
      OwnedState empty = test::make_state(5, 6, 17, DType::kF16, LseBase::kBase2);
      test::fill_random(a, rng, -50, 50, 0.0);
      test::fill_random(empty, rng, 0, 0, 1.0);  // every row (NaN, -inf)
      OwnedState out1 = test::make_state(5, 6, 17, dt, base);
      OwnedState out2 = test::make_state(5, 6, 17, dt, base);
      cpu::merge_state(a.cview(), empty.cview(), out1.view());
      cpu::merge_state(empty.cview(), a.cview(), out2.view());
      EXPECT_TRUE(test::bitwise_equal(out1, a)) << to_string(dt) << " " << to_string(base);
      EXPECT_TRUE(test::bitwise_equal(out2, a)) << to_string(dt) << " " << to_string(base);
    }
}

TEST(MergeState, NaNInNonEmptyInputPropagates) {
  std::mt19937 rng(104);
  OwnedState a = test::make_state(2, 2, 8, DType::kF32, LseBase::kNatural);
  OwnedState b = test::make_state(2, 2, 8, DType::kF32, LseBase::kNatural);
  test::fill_random(a, rng);
  test::fill_random(b, rng);
  a.set_lse(0, 1, NAN);   // NaN lse in a non-empty input
  b.set_o(1, 0, 3, NAN);  // NaN o in a non-empty input
  OwnedState out = test::make_state(2, 2, 8, DType::kF32, LseBase::kNatural);
  cpu::merge_state(a.cview(), b.cview(), out.view());
  EXPECT_TRUE(std::isnan(out.lse_at(0, 1)));
  EXPECT_TRUE(std::isnan(out.o_at(0, 1, 0)));
  EXPECT_TRUE(std::isnan(out.o_at(1, 0, 3)));
  EXPECT_FALSE(std::isnan(out.o_at(1, 0, 2)));
  EXPECT_FALSE(std::isnan(out.lse_at(1, 1)));
  EXPECT_FALSE(std::isnan(out.o_at(0, 0, 0)));
}

TEST(MergeState, InvalidLseBesideAnEmptyStateGivesANaNRowLikeMergeStates) {
  // +inf (FlashAttention's row without keys, not mapped to -inf) or NaN LSE beside an empty
  // state: the whole row is NaN, in o too, as the n-ary merge gives; never passed through.
  for (float bad : {INFINITY, NAN}) {
    std::mt19937 rng(105);
    OwnedState a = test::make_state(2, 2, 8, DType::kBF16, LseBase::kBase2);
    OwnedState b = test::make_state(2, 2, 8, DType::kF32, LseBase::kBase2);
    test::fill_random(a, rng);
    test::fill_random(b, rng);
    a.set_lse(0, 1, bad);
    b.set_lse(0, 1, -INFINITY);  // empty
    b.set_lse(1, 0, bad);
    a.set_lse(1, 0, -INFINITY);  // empty, the invalid side second
    OwnedState out = test::make_state(2, 2, 8, DType::kF32, LseBase::kBase2);
    cpu::merge_state(a.cview(), b.cview(), out.view());
    for (int t = 0; t < 2; ++t)
      for (int h = 0; h < 2; ++h) {
        EXPECT_EQ(std::isnan(out.lse_at(t, h)), (t == 0 && h == 1) || (t == 1 && h == 0));
        for (int d = 0; d < 8; ++d)
          EXPECT_EQ(std::isnan(out.o_at(t, h, d)), (t == 0 && h == 1) || (t == 1 && h == 0))
              << t << "," << h << "," << d;
      }
    cpu::merge_state_inplace(a.view(), b.cview(), nullptr);
    for (int d = 0; d < 8; ++d) {
      EXPECT_TRUE(std::isnan(a.o_at(0, 1, d)));
      EXPECT_TRUE(std::isnan(a.o_at(1, 0, d)));
    }
  }
}

TEST(MarkEmptyRows, PositiveInfinityBecomesTheEmptyStateOnAHeadMajorView) {
  // FlashAttention varlen: LSE [heads, total_q], +inf for a row without keys
  std::mt19937 rng(106);
  const std::int64_t T = 5, H = 3, D = 8;
  OwnedState other = test::make_state(T, H, D, DType::kF32, LseBase::kNatural);
  test::fill_random(other, rng);
  std::vector<float> o(T * H * D, 0.f), lse(H * T);
  for (std::size_t i = 0; i < lse.size(); ++i) lse[i] = 0.5f * static_cast<float>(i);
  const StateView fa = with_head_major_lse(
      make_state_view(o.data(), DType::kF32, lse.data(), T, H, D, LseBase::kNatural), T);
  fa.lse[fa.lse_offset(2, 1)] = INFINITY;
  fa.lse[fa.lse_offset(4, 0)] = INFINITY;
  const std::vector<float> before = lse;
  OwnedState bad = test::make_state(T, H, D, DType::kF32, LseBase::kNatural);
  cpu::merge_state(fa, other.cview(), bad.view());
  EXPECT_TRUE(std::isnan(bad.o_at(2, 1, 0)));  // +inf is invalid input until marked
  cpu::mark_empty_rows(fa);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h) {
      const float l = fa.lse[fa.lse_offset(t, h)];
      if ((t == 2 && h == 1) || (t == 4 && h == 0))
        EXPECT_EQ(l, -INFINITY);
      else
        EXPECT_EQ(l, before[h * T + t]);
    }
  OwnedState out = test::make_state(T, H, D, DType::kF32, LseBase::kNatural);
  cpu::merge_state(fa, other.cview(), out.view());
  for (std::int64_t d = 0; d < D; ++d) EXPECT_EQ(out.o_at(2, 1, d), other.o_at(2, 1, d));
  EXPECT_EQ(out.lse_at(4, 0), other.lse_at(4, 0));
  StateView null_lse = fa;
  null_lse.lse = nullptr;
  test::expect_arg_error([&] { cpu::mark_empty_rows(null_lse); }, "state.lse");
}

TEST(MergeStateInplace, MaskedTokensUntouchedOthersMatchReference) {
  std::mt19937 rng(105);
  for (DType dacc : kDTypes)
    for (DType dother : kDTypes) {
      OwnedState acc =
          test::make_state(20, 6, 48, dacc, test::random_base(rng), test::random_padding(rng));
      OwnedState other =
          test::make_state(20, 6, 48, dother, test::random_base(rng), test::random_padding(rng));
      test::fill_random(acc, rng, -4, 4, 0.2);
      test::fill_random(other, rng, -4, 4, 0.2);
      std::vector<std::uint8_t> mask(20);
      for (auto& m : mask) m = static_cast<std::uint8_t>(rng() % 3);  // 0, 1 or 2 (non-zero)
      const OwnedState before = acc;
      cpu::merge_state_inplace(acc.view(), other.cview(), mask.data());
      RefState ref = test::ref_merge({&before, &other});
      OwnedState checked = acc;
      const std::int64_t es = static_cast<std::int64_t>(size_of(dacc));
      for (std::int64_t t = 0; t < 20; ++t) {
        if (mask[t]) continue;
        for (std::int64_t h = 0; h < 6; ++h) {
          // A masked-off row is bitwise what it was; then neutralise it for the comparison.
          const StateLayout& l = acc.layout;
          EXPECT_EQ(0,
                    std::memcmp(&acc.lse[l.lse_offset(t, h)], &before.lse[l.lse_offset(t, h)], 4));
          EXPECT_EQ(0, std::memcmp(&acc.o[l.o_offset(t, h) * es], &before.o[l.o_offset(t, h) * es],
                                   48 * es));
          test::ref_lse(ref, t, h) = 0;
          checked.set_lse(t, h, 0.f);
          for (std::int64_t d = 0; d < 48; ++d) {
            test::ref_o(ref, t, h, d) = 0;
            checked.set_o(t, h, d, 0.f);
          }
        }
      }
      test::expect_matches(checked, ref, test::o_tolerance(dacc),
                           std::string(to_string(dacc)) + "+=" + to_string(dother));
    }
}

TEST(MergeStateInplace, NullMaskMergesEveryToken) {
  std::mt19937 rng(106);
  OwnedState acc = test::make_state(11, 3, 64, DType::kBF16, LseBase::kBase2);
  OwnedState other = test::make_state(11, 3, 64, DType::kF32, LseBase::kNatural);
  test::fill_random(acc, rng, -2, 2, 0.3);
  test::fill_random(other, rng, -2, 2, 0.3);
  RefState ref = test::ref_merge({&acc, &other});
  cpu::merge_state_inplace(acc.view(), other.cview());
  test::expect_matches(acc, ref, test::o_tolerance(DType::kBF16), "null mask");
}

/// An owned dense stack (tokens, S, heads, D) in either layout, or with custom padded strides.
struct OwnedStack {
  std::vector<OwnedState> parts;  // per-state views for the reference
  std::vector<unsigned char> o;
  std::vector<float> lse;
  ConstStateStackView view;
};

/// Builds a stack with random contents; `order` 0/1 = dense layouts, 2 = padded custom strides.
OwnedStack make_stack(std::int64_t tokens, std::int64_t states, std::int64_t heads,
                      std::int64_t dim, DType dt, LseBase base, int order, std::mt19937& rng,
                      double lse_lo = -5, double lse_hi = 5, double p_empty = 0.2) {
  OwnedStack st;
  const std::int64_t es = static_cast<std::int64_t>(size_of(dt));
  if (order < 2) {
    const std::int64_t n = tokens * states * heads;
    st.o.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, n * dim * es)), 0xFF);
    st.lse.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, n)), NAN);
    st.view = make_state_stack(st.o.data(), dt, st.lse.data(),
                               order == 0 ? StackOrder::kTokensMajor : StackOrder::kStatesMajor,
                               tokens, states, heads, dim, base);
  } else {  // [heads, S, tokens, D] with padding everywhere
    ConstStateStackView& v = st.view;
    v.tokens = tokens;
    v.num_states = states;
    v.heads = heads;
    v.head_dim = dim;
    v.dtype = dt;
    v.base = base;
    v.o_stride_token = dim + 3;
    v.o_stride_state = tokens * v.o_stride_token + 5;
    v.o_stride_head = states * v.o_stride_state + 1;
    v.lse_stride_token = 2;
    v.lse_stride_state = tokens * 2 + 1;
    v.lse_stride_head = states * v.lse_stride_state + 3;
    st.o.assign(static_cast<std::size_t>(heads * v.o_stride_head * es), 0xFF);
    st.lse.assign(static_cast<std::size_t>(heads * v.lse_stride_head), NAN);
    v.o = st.o.data();
    v.lse = st.lse.data();
  }
  // Random contents through per-state views aliasing the stack.
  for (std::int64_t s = 0; s < states; ++s) {
    OwnedState part = test::make_state(tokens, heads, dim, dt, base);
    test::fill_random(part, rng, lse_lo, lse_hi, p_empty);
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t h = 0; h < heads; ++h) {
        const StateStackLayout& l = st.view;
        st.lse[s * l.lse_stride_state + l.lse_offset(t, h)] = part.lse_at(t, h);
        std::memcpy(&st.o[(s * l.o_stride_state + l.o_offset(t, h)) * es],
                    &part.o[part.layout.o_offset(t, h) * es], dim * es);
      }
    st.parts.push_back(std::move(part));
  }
  return st;
}

RefState ref_of_stack(const OwnedStack& st) {
  std::vector<const OwnedState*> in;
  for (const auto& p : st.parts) in.push_back(&p);
  return test::ref_merge(in);
}

TEST(MergeStates, BothDenseLayoutsAndCustomStridesMatchReference) {
  std::mt19937 rng(107);
  const std::int64_t kStates[] = {1, 2, 3, 8, 33};
  for (int order = 0; order < 3; ++order)
    for (std::int64_t S : kStates)
      for (DType din : kDTypes) {
        const DType dout = kDTypes[rng() % 3];
        const std::int64_t tokens = 1 + rng() % 9, heads = 1 + rng() % 6;
        const std::int64_t dim = (rng() % 2) ? 128 : 1 + rng() % 70;
        OwnedStack st = make_stack(tokens, S, heads, dim, din, test::random_base(rng), order, rng);
        OwnedState out = test::make_state(tokens, heads, dim, dout, test::random_base(rng),
                                          test::random_padding(rng));
        cpu::merge_states(st.view, out.view());
        RefState ref = ref_of_stack(st);
        test::expect_matches(out, ref, test::o_tolerance(dout) * (din == DType::kF32 ? 1 : 1),
                             "order " + std::to_string(order) + " S " + std::to_string(S) + " " +
                                 to_string(din) + "->" + to_string(dout));
      }
}

TEST(MergeStates, ManyHeadsAndOneToken) {
  std::mt19937 rng(108);
  OwnedStack st = make_stack(1, 4, 128, 128, DType::kBF16, LseBase::kBase2, 0, rng);
  OwnedState out = test::make_state(1, 128, 128, DType::kF32, LseBase::kNatural);
  cpu::merge_states(st.view, out.view());
  RefState ref = ref_of_stack(st);
  test::expect_matches(out, ref, test::o_tolerance(DType::kF32), "1x128 heads");
}

TEST(MergeStates, SingleStatePassesThroughBitwise) {
  std::mt19937 rng(109);
  for (DType dt : kDTypes) {
    OwnedStack st = make_stack(6, 1, 5, 40, dt, LseBase::kBase2, 0, rng, -100, 100, 0.3);
    OwnedState out = test::make_state(6, 5, 40, dt, LseBase::kBase2);
    cpu::merge_states(st.view, out.view());
    // Empty rows come out as (0, -inf), not the input's NaN o.
    OwnedState expect = st.parts[0];
    for (std::int64_t t = 0; t < 6; ++t)
      for (std::int64_t h = 0; h < 5; ++h)
        if (expect.lse_at(t, h) == -INFINITY)
          for (std::int64_t d = 0; d < 40; ++d) expect.set_o(t, h, d, 0.f);
    EXPECT_TRUE(test::bitwise_equal(out, expect)) << to_string(dt);
  }
}

TEST(MergeStates, AllEmptyGivesZeroAndNegInf) {
  std::mt19937 rng(110);
  OwnedStack st = make_stack(3, 5, 2, 16, DType::kF16, LseBase::kNatural, 1, rng, 0, 0, 1.0);
  OwnedState out = test::make_state(3, 2, 16, DType::kF32, LseBase::kBase2);
  cpu::merge_states(st.view, out.view());
  for (std::int64_t t = 0; t < 3; ++t)
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(out.lse_at(t, h), -INFINITY);
      for (std::int64_t d = 0; d < 16; ++d) EXPECT_EQ(out.o_at(t, h, d), 0.0);
    }
}

TEST(MergeStates, StableAtLseOfTenThousand) {
  std::mt19937 rng(111);
  for (double centre : {1e4, -1e4}) {
    OwnedStack st = make_stack(4, 6, 3, 32, DType::kF32, LseBase::kNatural, 0, rng, centre - 20,
                               centre + 20, 0.1);
    OwnedState out = test::make_state(4, 3, 32, DType::kF32, LseBase::kBase2);
    cpu::merge_states(st.view, out.view());
    RefState ref = ref_of_stack(st);
    for (std::int64_t t = 0; t < 4; ++t)
      for (std::int64_t h = 0; h < 3; ++h) {
        ASSERT_TRUE(std::isfinite(out.lse_at(t, h)));
        for (std::int64_t d = 0; d < 32; ++d) ASSERT_TRUE(std::isfinite(out.o_at(t, h, d)));
      }
    // LSE ~1e4 carries ~1e-3 absolute rounding in fp32; the o weights inherit it.
    test::expect_matches(out, ref, 5e-3, "centre " + std::to_string(centre));
  }
}

TEST(MergeStates, ResultIndependentOfThreadCount) {
  std::mt19937 rng(112);
  OwnedStack st = make_stack(64, 7, 8, 64, DType::kBF16, LseBase::kNatural, 1, rng);
  OwnedState ref = test::make_state(64, 8, 64, DType::kF16, LseBase::kBase2);
  cpu::set_num_threads(1);
  cpu::merge_states(st.view, ref.view());
  // The one-thread result against the double reference: outputs only compared with each other
  // would agree on a row no thread count writes (NaN).
  RefState want = ref_of_stack(st);
  test::expect_matches(ref, want, test::o_tolerance(DType::kF16), "1 thread");
  for (int n : {2, 3, 7}) {
    cpu::set_num_threads(n);
    EXPECT_EQ(cpu::num_threads(), n);
    OwnedState out = test::make_state(64, 8, 64, DType::kF16, LseBase::kBase2);
    cpu::merge_states(st.view, out.view());
    EXPECT_TRUE(test::bitwise_equal(out, ref)) << n << " threads";
  }
  cpu::set_num_threads(0);
  EXPECT_GE(cpu::num_threads(), 1);
}

TEST(MergeStates, AgreesWithPairwiseMergeState) {
  std::mt19937 rng(113);
  OwnedStack st = make_stack(5, 4, 3, 24, DType::kF32, LseBase::kNatural, 0, rng);
  OwnedState stacked = test::make_state(5, 3, 24, DType::kF32, LseBase::kNatural);
  cpu::merge_states(st.view, stacked.view());
  OwnedState acc = st.parts[0];
  for (std::size_t s = 1; s < st.parts.size(); ++s)
    cpu::merge_state_inplace(acc.view(), st.parts[s].cview());
  const RefState as_ref = test::widened(acc);
  test::expect_matches(stacked, as_ref, 1e-5, "pairwise vs stacked");
  // And against the double reference (pairwise and stacked alone could agree on a bad row).
  RefState ref = ref_of_stack(st);
  test::expect_matches(stacked, ref, test::o_tolerance(DType::kF32), "stacked vs reference");
}

TEST(MergeStatesRagged, EmptySegmentsAndOffsetsMatchReference) {
  std::mt19937 rng(114);
  for (DType din : kDTypes) {
    const std::int64_t heads = 4, dim = 36;
    // Segment sizes with empty ones; indptr starts past row 0 and leaves unused rows at the end.
    const std::vector<std::int32_t> sizes = {0, 1, 3, 0, 7, 2, 0};
    std::vector<std::int32_t> indptr = {2};
    for (std::int32_t s : sizes) indptr.push_back(indptr.back() + s);
    const std::int64_t total = indptr.back() + 3;
    OwnedState rows =
        test::make_state(total, heads, dim, din, test::random_base(rng), test::random_padding(rng));
    test::fill_random(rows, rng, -5, 5, 0.2);
    const std::int64_t tokens = static_cast<std::int64_t>(sizes.size());
    const DType dout = kDTypes[rng() % 3];
    OwnedState out = test::make_state(tokens, heads, dim, dout, test::random_base(rng),
                                      test::random_padding(rng));
    cpu::merge_states_ragged(rows.cview(), indptr.data(), out.view());
    const RefState ref = test::ref_merge_ragged(rows, indptr);
    test::expect_matches(out, ref, test::o_tolerance(dout),
                         std::string("ragged ") + to_string(din));
  }
}

TEST(MergeStatesRagged, ZeroTokensIsANoOp) {
  OwnedState rows = test::make_state(3, 2, 8, DType::kF32, LseBase::kNatural);
  OwnedState out = test::make_state(0, 2, 8, DType::kF32, LseBase::kNatural);
  const std::int32_t indptr[1] = {0};
  EXPECT_NO_THROW(cpu::merge_states_ragged(rows.cview(), indptr, out.view()));
}

TEST(Rebase, EveryDtypeAndBasePairMatchesReference) {
  std::mt19937 rng(115);
  for (DType din : kDTypes)
    for (DType dout : kDTypes)
      for (LseBase bin : {LseBase::kNatural, LseBase::kBase2})
        for (LseBase bout : {LseBase::kNatural, LseBase::kBase2}) {
          OwnedState in = test::make_state(6, 5, 20, din, bin, test::random_padding(rng));
          OwnedState out = test::make_state(6, 5, 20, dout, bout, test::random_padding(rng));
          test::fill_random(in, rng, -30, 30, 0.0);
          in.set_lse(1, 1, -INFINITY);
          cpu::rebase(in.cview(), out.view());
          RefState ref = test::widened(in);
          test::ref_lse(ref, 1, 1) = 1;                                         // compared below
          for (std::int64_t d = 0; d < 20; ++d) test::ref_o(ref, 1, 1, d) = 0;  // (0, -inf)
          OwnedState checked = out;
          checked.set_lse(1, 1, test::from_natural(1, bout));
          test::expect_matches(checked, ref, test::o_tolerance(dout),
                               std::string(to_string(din)) + to_string(bin) + "->" +
                                   to_string(dout) + to_string(bout));
          EXPECT_EQ(out.lse_at(1, 1), -INFINITY);
          if (bin == bout) {
            for (std::int64_t t = 0; t < 6; ++t)
              for (std::int64_t h = 0; h < 5; ++h)
                EXPECT_EQ(0, std::memcmp(&out.lse[out.layout.lse_offset(t, h)],
                                         &in.lse[in.layout.lse_offset(t, h)], 4));
          }
        }
}

TEST(Rebase, InPlaceRewritesOnlyTheLse) {
  std::mt19937 rng(116);
  OwnedState s = test::make_state(4, 3, 10, DType::kF16, LseBase::kNatural, {1, 1, 1, 1, false});
  test::fill_random(s, rng);
  const OwnedState before = s;
  StateView out = s.view();
  out.base = LseBase::kBase2;
  cpu::rebase(s.cview(), out);
  EXPECT_EQ(s.o, before.o);
  EXPECT_TRUE(s.padding_untouched());
  for (std::int64_t t = 0; t < 4; ++t)
    for (std::int64_t h = 0; h < 3; ++h)
      EXPECT_EQ(s.lse_at(t, h),
                math::convert_lse(before.lse_at(t, h), LseBase::kNatural, LseBase::kBase2));
}

TEST(Rebase, Base2MergeThenRebaseEqualsNaturalMerge) {
  std::mt19937 rng(117);
  OwnedStack st = make_stack(8, 5, 4, 32, DType::kF32, LseBase::kBase2, 0, rng);
  OwnedState in2 = test::make_state(8, 4, 32, DType::kF32, LseBase::kBase2);
  OwnedState nat = test::make_state(8, 4, 32, DType::kF32, LseBase::kNatural);
  OwnedState direct = test::make_state(8, 4, 32, DType::kF32, LseBase::kNatural);
  cpu::merge_states(st.view, in2.view());
  cpu::rebase(in2.cview(), nat.view());
  cpu::merge_states(st.view, direct.view());
  const RefState ref = test::widened(direct);
  test::expect_matches(nat, ref, 1e-5, "base2 + rebase vs natural");
  // And the natural merge against the double reference (both outputs start poisoned: two merges
  // compared only with each other could agree on a row neither wrote).
  RefState want = ref_of_stack(st);
  test::expect_matches(direct, want, test::o_tolerance(DType::kF32), "natural vs reference");
}

/// FlashAttention's LSE layout `[heads, tokens]` read through `with_head_major_lse`: the same
/// merge, bitwise, as the tokens-major copy of the same values; the output written head-major too.
TEST(MergeState, HeadMajorLseViewsMatchTheTokensMajorLayout) {
  std::mt19937 rng(131);
  const std::int64_t T = 5, H = 3, D = 16;
  std::uniform_real_distribution<float> uni(-4.f, 4.f);
  std::vector<float> oa(T * H * D), ob(T * H * D), la(T * H), lb(T * H), la_hm(T * H);
  for (float& x : oa) x = uni(rng);
  for (float& x : ob) x = uni(rng);
  for (std::int64_t i = 0; i < T * H; ++i) {
    la[i] = uni(rng);
    lb[i] = uni(rng);
  }
  la[1 * H + 2] = -INFINITY;  // one empty row
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h) la_hm[h * T + t] = la[t * H + h];
  const ConstStateView a =
      make_const_state_view(oa.data(), DType::kF32, la.data(), T, H, D, LseBase::kNatural);
  const ConstStateView a_hm = with_head_major_lse(
      make_const_state_view(oa.data(), DType::kF32, la_hm.data(), T, H, D, LseBase::kNatural));
  EXPECT_EQ(a_hm.lse_stride_token, 1);
  EXPECT_EQ(a_hm.lse_stride_head, T);
  EXPECT_EQ(with_head_major_lse(a, 40).lse_stride_head, 40);  // varlen: total_q
  const ConstStateView b =
      make_const_state_view(ob.data(), DType::kF32, lb.data(), T, H, D, LseBase::kBase2);
  std::vector<float> o1(T * H * D, NAN), l1(T * H, NAN), o2(T * H * D, NAN), l2(T * H, NAN);
  cpu::merge_state(a, b,
                   make_state_view(o1.data(), DType::kF32, l1.data(), T, H, D, LseBase::kNatural));
  cpu::merge_state(a_hm, b,
                   with_head_major_lse(make_state_view(o2.data(), DType::kF32, l2.data(), T, H, D,
                                                       LseBase::kNatural)));
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)), 0);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h) {
      ASSERT_FALSE(std::isnan(l1[t * H + h]));
      EXPECT_EQ(l1[t * H + h], l2[h * T + t]) << t << " " << h;
    }
  for (float x : o1) ASSERT_FALSE(std::isnan(x));
}

// --- what the serving engines' merge tests ask for (masks of any stride, the masked
//     out-of-place merge, outputs without an LSE, stacks of no states, rebase of empty rows) ---

/// `count` flags `stride` bytes apart (one flag for stride 0), random 0 / non-zero.
std::vector<std::uint8_t> random_mask(std::mt19937& rng, std::int64_t count, std::int64_t stride) {
  std::vector<std::uint8_t> m(static_cast<std::size_t>(stride == 0 ? 1 : count * stride), 0xCD);
  for (std::int64_t t = 0; t < (stride == 0 ? 1 : count); ++t)
    m[static_cast<std::size_t>(t * stride)] = static_cast<std::uint8_t>(rng() % 3);
  return m;
}

TEST(MergeState, MaskedFormPassesTheFirstStateThroughWhereTheMaskIsZero) {
  // vLLM's prefill with context: out = a ⊕ b where the mask is set, else a (converted).
  std::mt19937 rng(131);
  for (std::int64_t stride : {1, 4, 0, 0})
    for (DType da : kDTypes) {
      const DType dout = kDTypes[rng() % 3];
      OwnedState a = test::make_state(13, 3, 40, da, test::random_base(rng));
      OwnedState b = test::make_state(13, 3, 40, DType::kBF16, test::random_base(rng));
      test::fill_random(a, rng, -4, 4, 0.2);
      test::fill_random(b, rng, -4, 4, 0.2);
      const std::vector<std::uint8_t> mask = random_mask(rng, 13, stride);
      OwnedState out = test::make_state(13, 3, 40, dout, test::random_base(rng));
      out.poison();
      cpu::merge_state(a.cview(), b.cview(), out.view(), TokenMask(mask.data(), stride));
      // the reference: a ⊕ b, with b made empty where the mask is 0
      OwnedState b_masked = b;
      for (std::int64_t t = 0; t < 13; ++t)
        if (mask[static_cast<std::size_t>(t * stride)] == 0)
          for (std::int64_t h = 0; h < 3; ++h) b_masked.set_lse(t, h, -INFINITY);
      test::expect_matches(out, test::ref_merge({&a, &b_masked}), test::o_tolerance(dout),
                           "stride " + std::to_string(stride) + " " + to_string(da));
      // bitwise: a row left out is the rebase of a's row
      OwnedState a_only = test::make_state(13, 3, 40, dout, out.layout.base);
      cpu::rebase(a.cview(), a_only.view());
      for (std::int64_t t = 0; t < 13; ++t) {
        if (mask[static_cast<std::size_t>(t * stride)] != 0) continue;
        for (std::int64_t h = 0; h < 3; ++h) {
          EXPECT_EQ(out.lse_at(t, h), a_only.lse_at(t, h));
          for (std::int64_t d = 0; d < 40; ++d) EXPECT_EQ(out.o_at(t, h, d), a_only.o_at(t, h, d));
        }
      }
    }
}

TEST(MergeStateInplace, StridedAndBroadcastMasks) {
  std::mt19937 rng(132);
  for (std::int64_t stride : {1, 2, 7, 0, 0}) {
    OwnedState acc = test::make_state(9, 2, 24, DType::kF16, LseBase::kBase2);
    OwnedState other = test::make_state(9, 2, 24, DType::kF32, LseBase::kNatural);
    test::fill_random(acc, rng, -3, 3, 0.2);
    test::fill_random(other, rng, -3, 3, 0.2);
    const std::vector<std::uint8_t> mask = random_mask(rng, 9, stride);
    // the same call with the mask spelled out contiguously
    std::vector<std::uint8_t> dense(9);
    for (std::int64_t t = 0; t < 9; ++t) dense[t] = mask[static_cast<std::size_t>(t * stride)];
    OwnedState want = acc;
    cpu::merge_state_inplace(want.view(), other.cview(), dense.data());
    cpu::merge_state_inplace(acc.view(), other.cview(), TokenMask(mask.data(), stride));
    EXPECT_TRUE(test::bitwise_equal(acc, want)) << "stride " << stride;
  }
}

TEST(MergeState, OutputsWithoutAnLseWriteTheSameO) {
  // vLLM's and SGLang's output_lse=None; merge_state, merge_states and the ragged merge.
  std::mt19937 rng(133);
  OwnedState a = test::make_state(6, 4, 33, DType::kBF16, LseBase::kNatural);
  OwnedState b = test::make_state(6, 4, 33, DType::kF32, LseBase::kBase2);
  test::fill_random(a, rng, -4, 4, 0.2);
  test::fill_random(b, rng, -4, 4, 0.2);
  OwnedState with = test::make_state(6, 4, 33, DType::kF16, LseBase::kNatural);
  OwnedState without = test::make_state(6, 4, 33, DType::kF16, LseBase::kNatural);
  with.poison();
  without.poison();
  StateView no_lse = without.view();
  no_lse.lse = nullptr;
  cpu::merge_state(a.cview(), b.cview(), with.view());
  cpu::merge_state(a.cview(), b.cview(), no_lse);
  EXPECT_EQ(with.o, without.o);
  for (float x : without.lse) EXPECT_TRUE(std::isnan(x));  // never written

  OwnedStack st = make_stack(6, 3, 4, 33, DType::kBF16, LseBase::kBase2, 0, rng);
  with.poison();
  cpu::merge_states(st.view, with.view());
  cpu::merge_states(st.view, no_lse);
  EXPECT_EQ(with.o, without.o);

  const std::vector<std::int32_t> indptr = {0, 1, 1, 3, 4, 5, 6};
  with.poison();
  cpu::merge_states_ragged(a.cview(), indptr.data(), with.view());
  cpu::merge_states_ragged(a.cview(), indptr.data(), no_lse);
  EXPECT_EQ(with.o, without.o);
  for (float x : without.lse) EXPECT_TRUE(std::isnan(x));

  // an in-place accumulator's LSE is an input too: required
  StateView acc = a.view();
  acc.lse = nullptr;
  test::expect_arg_error([&] { cpu::merge_state_inplace(acc, b.cview()); }, "acc.lse");
}

TEST(MergeStates, NoStatesGiveTheEmptyState) {
  // FlashInfer's merge_states of S = 0 returns the empty state; a stack of no states has no
  // memory, so its pointers may be null.
  for (const StackOrder order : {StackOrder::kTokensMajor, StackOrder::kStatesMajor}) {
    const ConstStateStackView none =
        make_state_stack(nullptr, DType::kBF16, nullptr, order, 5, 0, 3, 17, LseBase::kBase2);
    OwnedState out = test::make_state(5, 3, 17, DType::kF32, LseBase::kNatural);
    out.poison();
    cpu::merge_states(none, out.view());
    for (std::int64_t t = 0; t < 5; ++t)
      for (std::int64_t h = 0; h < 3; ++h) {
        EXPECT_EQ(out.lse_at(t, h), -INFINITY);
        for (std::int64_t d = 0; d < 17; ++d) EXPECT_EQ(out.o_at(t, h, d), 0.0);
      }
  }
}

TEST(Rebase, EmptyRowsBecomeTheEmptyStateInAndOutOfPlace) {
  // docs/numerics.md: all-empty input gives exactly (0, -inf), whatever the empty o held.
  std::mt19937 rng(134);
  OwnedState in = test::make_state(10, 3, 12, DType::kBF16, LseBase::kBase2);
  test::fill_random(in, rng, -4, 4, 0.4);  // empty rows hold NaN
  OwnedState out = test::make_state(10, 3, 12, DType::kF32, LseBase::kNatural);
  out.poison();
  cpu::rebase(in.cview(), out.view());
  StateView same = in.view();
  same.base = LseBase::kNatural;
  cpu::rebase(in.cview(), same);
  int empty = 0;
  for (std::int64_t t = 0; t < 10; ++t)
    for (std::int64_t h = 0; h < 3; ++h) {
      if (out.lse_at(t, h) != -INFINITY) continue;
      ++empty;
      EXPECT_EQ(in.lse_at(t, h), -INFINITY);
      for (std::int64_t d = 0; d < 12; ++d) {
        EXPECT_EQ(out.o_at(t, h, d), 0.0);
        EXPECT_EQ(in.o_at(t, h, d), 0.0);
      }
    }
  EXPECT_GT(empty, 0);
}

TEST(MergeState, BadMasksAreNamed) {
  OwnedState a = test::make_state(4, 2, 8, DType::kF32, LseBase::kNatural);
  OwnedState out = test::make_state(4, 2, 8, DType::kF32, LseBase::kNatural);
  std::vector<std::uint8_t> m(4, 1);
  test::expect_arg_error(
      [&] { cpu::merge_state(a.cview(), a.cview(), out.view(), TokenMask(m.data(), -2)); },
      "mask.stride");
  test::expect_arg_error(
      [&] {
        cpu::merge_state(a.cview(), a.cview(), out.view(),
                         TokenMask(reinterpret_cast<const std::uint8_t*>(out.o.data()), 1));
      },
      "mask");
  test::expect_arg_error(
      [&] {
        cpu::merge_state_inplace(out.view(), a.cview(),
                                 TokenMask(reinterpret_cast<const std::uint8_t*>(out.lse.data()),
                                           std::int64_t{1} << 61));
      },
      "mask.stride");
}

}  // namespace
}  // namespace attnstate
