/// @file test_testing_mla.cpp
/// @brief The kit's MLA problems: the reference equals that of the equivalent attention problem
///        (one KV head of width rank + rope, values the latent columns), fp8 parts read as
///        stored × scale, the split law over `select_keys` with the sink merged once, the
///        tolerance model, the generator's draws and every argument error naming the field.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/testing/mla.hpp"
#include "attnstate/testing/problem.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace {

using namespace attnstate;
using namespace attnstate::testing;

/// A random MLA problem of the given shape and dtypes (stored values uniform in [-1, 1]).
MlaProblem random_mla(std::int64_t tokens, std::int64_t heads, std::int64_t L, std::int64_t R,
                      std::int64_t keys, DType q, DType ckv, DType kpe, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const auto draw = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = u(rng);
    return v;
  };
  return make_mla_problem(tokens, heads, L, R, keys, q, ckv, kpe, draw(tokens * heads * L),
                          draw(tokens * heads * R), draw(keys * L), draw(keys * R),
                          1.f / std::sqrt(static_cast<float>(L + R)), DType::kF32,
                          LseBase::kNatural);
}

/// The attention problem of `p`: queries `[q_nope, q_pe]`, one KV head with keys `[ckv, kpe]`
/// and values `[ckv, 0]` (real values, exact in f32 here), head_dim `rank + rope`.
AttentionProblem as_attention(const MlaProblem& p) {
  const std::int64_t L = p.kv_lora_rank(), R = p.rope_dim(), K = L + R;
  const std::int64_t rows = p.tokens() * p.heads(), keys = p.num_keys();
  std::vector<float> q(static_cast<std::size_t>(rows * K)), k(static_cast<std::size_t>(keys * K));
  std::vector<float> v(k.size(), 0.f);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t d = 0; d < L; ++d) q[r * K + d] = p.q_nope.get(r * L + d);
    for (std::int64_t d = 0; d < R; ++d) q[r * K + L + d] = p.q_pe.get(r * R + d);
  }
  for (std::int64_t i = 0; i < keys; ++i) {
    for (std::int64_t d = 0; d < L; ++d) {
      k[i * K + d] = p.ckv.get(i * L + d) * p.ckv_scale;
      v[i * K + d] = k[i * K + d];
    }
    for (std::int64_t d = 0; d < R; ++d) k[i * K + L + d] = p.kpe.get(i * R + d) * p.kpe_scale;
  }
  AttentionProblem a = make_problem(p.tokens(), p.heads(), 1, K, keys, DType::kF32, q, k, v,
                                    p.scale, p.out_dtype, p.base);
  a.sinks = p.sinks;
  return a;
}

/// Max |difference| of `m` and the first `rank` columns of `a` (o), and of their LSEs.
double max_diff(const ReferenceState& m, const ReferenceState& a) {
  double worst = 0;
  for (std::int64_t t = 0; t < m.tokens; ++t)
    for (std::int64_t h = 0; h < m.heads; ++h) {
      const double lm = m.lse_at(t, h), la = a.lse_at(t, h);
      if (!(std::isinf(lm) && lm == la)) worst = std::max(worst, std::fabs(lm - la));
      for (std::int64_t d = 0; d < m.head_dim; ++d)
        worst = std::max(worst, std::fabs(m.o_at(t, h, d) - a.o_at(t, h, d)));
    }
  return std::isnan(worst) ? INFINITY : worst;
}

TEST(MlaKit, ReferenceEqualsTheEquivalentAttentionProblem) {
  std::uint64_t seed = 3;
  for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    MlaProblem p = random_mla(3, 4, 32, 8, 40, dt, dt, dt, seed++);
    p.sinks = {0.5f, -INFINITY, 3.f, -1.f};
    const std::vector<std::int64_t> keys = {0, 5, 7, 39, 12};
    const ReferenceState m = reference_mla_state(p, keys, LseBase::kBase2);
    const ReferenceState a = reference_state(as_attention(p), keys, LseBase::kBase2);
    ASSERT_EQ(m.head_dim, 32);
    EXPECT_LT(max_diff(m, a), 1e-12) << to_string(dt);
    // o_magnitude too (the values' columns)
    for (std::int64_t d = 0; d < 32; ++d)
      EXPECT_NEAR(m.o_magnitude[static_cast<std::size_t>(d)],
                  a.o_magnitude[static_cast<std::size_t>(d)], 1e-12);
  }
}

TEST(MlaKit, Fp8PartsReadAsStoredTimesScale) {
  // power-of-two scales: the real values are exact in the f32 attention problem
  MlaProblem p = random_mla(2, 3, 16, 8, 30, DType::kBF16, DType::kE4M3, DType::kBF16, 11);
  p.ckv_scale = 0x1p-6f;
  const ReferenceState m = reference_mla_state(p, all_keys(30), LseBase::kNatural);
  EXPECT_LT(max_diff(m, reference_state(as_attention(p), all_keys(30), LseBase::kNatural)), 1e-12);
  // and the scale matters: another scale, another state
  MlaProblem q = p;
  q.ckv_scale = 0x1p-5f;
  EXPECT_GT(max_diff(m, reference_mla_state(q, all_keys(30), LseBase::kNatural)), 1e-3);
}

TEST(MlaKit, SplitLawOverSelectedKeysWithTheSinkOnce) {
  MlaProblem p = random_mla(2, 2, 16, 4, 25, DType::kF32, DType::kF32, DType::kF32, 5);
  p.sinks = {1.f, -2.f};
  const std::vector<std::int64_t> a = {0, 3, 4, 10}, b = {1, 2, 24}, c = {};
  std::vector<std::int64_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  const MlaProblem partial = without_sinks(p);
  std::vector<ReferenceState> parts;
  for (const auto* keys : {&a, &b, &c}) {
    const MlaProblem sel = select_keys(partial, *keys);
    ASSERT_EQ(sel.num_keys(), static_cast<std::int64_t>(keys->size()));
    parts.push_back(reference_mla_state(sel, all_keys(sel.num_keys()), LseBase::kNatural));
  }
  const ReferenceState merged = apply_sinks(reference_merge(parts, LseBase::kNatural), p.sinks);
  EXPECT_LT(max_diff(merged, reference_mla_state(p, all, LseBase::kNatural)), 1e-12);
  // an empty key set with sinks is the sink state
  const ReferenceState none = reference_mla_state(p, {}, LseBase::kNatural);
  EXPECT_EQ(none.lse_at(1, 1), -2.0);
  EXPECT_EQ(none.o_at(1, 1, 3), 0.0);
}

TEST(MlaKit, ToleranceIsTheAttentionModelAtWidthRankPlusRope) {
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    MlaProblem p = random_mla(2, 3, 32, 8, 50, dt, dt, dt, 17);
    p.out_dtype = DType::kBF16;
    p.base = LseBase::kBase2;
    AttentionProblem a = as_attention(p);
    a.q = HostTensor::from_floats(dt, a.q.shape(), a.q.to_floats());
    a.k = HostTensor::from_floats(dt, a.k.shape(), a.k.to_floats());
    a.v = HostTensor::from_floats(dt, a.v.shape(), a.v.to_floats());
    for (const bool rounded : {false, true}) {
      const Tolerance tm = tolerance_for(p, rounded), ta = tolerance_for(a, rounded);
      EXPECT_DOUBLE_EQ(tm.o_abs, ta.o_abs);
      EXPECT_DOUBLE_EQ(tm.o_magnitude_rel, ta.o_magnitude_rel);
      EXPECT_DOUBLE_EQ(tm.lse_abs, ta.lse_abs);
      EXPECT_DOUBLE_EQ(tm.o_magnitude_default, ta.o_magnitude_default);
    }
    EXPECT_DOUBLE_EQ(max_abs_score(p), max_abs_score(a));
  }
}

TEST(MlaKit, GeneratorDrawsWithinItsOptions) {
  MlaGenOptions o;
  o.max_tokens = 3;
  o.max_keys = 40;
  o.heads = {2, 5};
  o.kv_lora_ranks = {16};
  o.rope_dims = {8};
  o.ckv_dtypes = {DType::kE4M3};
  o.sink_percent = 100;
  bool saw_large_scale = false;
  const auto gen = gen_mla_problem(o);
  for (int i = 0; i < 50; ++i) {
    const MlaProblem p = gen(rc::Random(static_cast<std::uint64_t>(i)), 50).value();
    EXPECT_GE(p.tokens(), 1);
    EXPECT_LE(p.tokens(), 3);
    EXPECT_TRUE(p.heads() == 2 || p.heads() == 5);
    EXPECT_EQ(p.kv_lora_rank(), 16);
    EXPECT_EQ(p.rope_dim(), 8);
    EXPECT_LE(p.num_keys(), 40);
    EXPECT_EQ(p.ckv.dtype(), DType::kE4M3);
    EXPECT_EQ(p.kpe.dtype(), DType::kBF16);  // FlashMLA's fp8 layout keeps rope in bf16
    EXPECT_EQ(p.kpe_scale, 1.f);
    EXPECT_EQ(p.sinks.size(), static_cast<std::size_t>(p.heads()));
    if (p.ckv_scale == 0x1p8f) saw_large_scale = true;
    // every drawn problem is consistent: its reference and output state build
    EXPECT_NO_THROW(reference_mla_state(p, all_keys(p.num_keys()), p.base));
    EXPECT_EQ(make_output_state(p).head_dim(), 16);
  }
  EXPECT_TRUE(saw_large_scale);
}

/// Expects `f` to throw an `Error` whose message names `arg`.
template <class F>
void expect_names(F&& f, const std::string& arg) {
  try {
    f();
    ADD_FAILURE() << "no error for " << arg;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument '" + arg + "'"), std::string::npos)
        << "expected " << arg << ", got: " << e.what();
  }
}

TEST(MlaKit, ArgumentErrorsNameTheField) {
  const MlaProblem p = random_mla(2, 2, 8, 4, 5, DType::kF32, DType::kF32, DType::kF32, 1);
  expect_names([&] { select_keys(p, {0, 5}); }, "keys[1]");
  MlaProblem bad = p;
  bad.kpe = HostTensor(DType::kF32, {5, 3});
  expect_names([&] { reference_mla_state(bad, {}, LseBase::kNatural); }, "problem.kpe.shape[1]");
  bad = p;
  bad.ckv_scale = 2.f;  // not fp8
  expect_names([&] { tolerance_for(bad); }, "problem.ckv_scale");
  bad = p;
  bad.sinks = {1.f};
  expect_names([&] { make_output_state(bad); }, "problem.sinks.size()");
  bad = p;
  bad.q_pe = HostTensor(DType::kBF16, {2, 2, 4});
  expect_names([&] { max_abs_score(bad); }, "problem.q_pe.dtype");
  expect_names([&] { reference_mla_state_per_token(p, {{0}}, LseBase::kNatural); },
               "keys_per_token");
  expect_names(
      [&] {
        make_mla_problem(1, 1, 8, 4, 1, DType::kE4M3, DType::kF32, DType::kF32, {}, {}, {}, {}, 1.f,
                         DType::kF32, LseBase::kNatural);
      },
      "q_dtype");
  MlaGenOptions o;
  o.heads = {};
  expect_names([&] { gen_mla_problem(o); }, "options.heads");
  o = MlaGenOptions{};
  o.min_keys = 5;
  o.max_keys = 4;
  expect_names([&] { gen_mla_problem(o); }, "options.min_keys");
}

}  // namespace
