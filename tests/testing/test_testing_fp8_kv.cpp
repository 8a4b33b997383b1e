/// @file test_testing_fp8_kv.cpp
/// @brief The kit's fp8 keys and values: `HostTensor` in e4m3/e5m2, the problem's scales (one per
///        tensor or per KV head), `real_keys`/`real_values`, `quantize_kv`, the double reference
///        over the dequantised values, the generators' fp8 caches (formats, scales, per-head
///        scales, extremes, queries scaled to the keys), the conformance check telling a kernel
///        that applies the scales from one that ignores them, and the named errors.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "kit_test_utils.hpp"
#include "sample_kernels.hpp"

namespace {

using namespace attnstate::testing;  // NOLINT(google-build-using-namespace): test file
using attnstate::DType;
using attnstate::LseBase;
using attnstate::Status;
using attnstate_test::invalid_argument_message;

/// Runs `call`, which must throw `attnstate::Error` with `status`; returns its message.
std::string error_message(const std::function<void()>& call, Status status) {
  try {
    call();
  } catch (const attnstate::Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

/// Two query rows, 4 heads on 2 KV heads, head_dim 4, `n` keys, bf16, values in [-1, 1].
AttentionProblem small_problem(std::int64_t n, std::uint32_t seed = 3) {
  std::vector<float> q(2 * 4 * 4), k(static_cast<std::size_t>(n * 2 * 4)), v(k.size());
  std::uint32_t x = seed;
  const auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(x >> 8) / static_cast<float>(1u << 23) - 1.f;
  };
  for (float& e : q) e = next();
  for (float& e : k) e = next();
  for (float& e : v) e = next();
  return make_problem(2, 4, 2, 4, n, DType::kBF16, q, k, v, 0.5f, DType::kF32, LseBase::kNatural);
}

/// `p` with its keys and values replaced by their real values in f32 (exact for power-of-two
/// scales) and no scales.
AttentionProblem as_f32(const AttentionProblem& p) {
  AttentionProblem f32 = p;
  const std::vector<double> k = real_keys(p), v = real_values(p);
  f32.k = HostTensor::from_floats(DType::kF32, p.k.shape(), std::vector<float>(k.begin(), k.end()));
  f32.v = HostTensor::from_floats(DType::kF32, p.v.shape(), std::vector<float>(v.begin(), v.end()));
  f32.k_scale.clear();
  f32.v_scale.clear();
  return f32;
}

TEST(KitFp8Kv, HostTensorStoresFp8ValuesRoundedAndSaturated) {
  const HostTensor e4 =
      HostTensor::from_floats(DType::kE4M3, {5}, {1.f, 0.3f, 1000.f, -1e-6f, NAN});
  EXPECT_EQ(e4.get(0), 1.f);
  EXPECT_EQ(e4.get(1), 0.3125f);  // to nearest (3 mantissa bits)
  EXPECT_EQ(e4.get(2), 448.f);    // saturated
  EXPECT_EQ(e4.get(3), 0.f);
  EXPECT_TRUE(std::isnan(e4.get(4)));
  EXPECT_EQ(static_cast<const std::uint8_t*>(e4.data())[0], 0x38);
  const HostTensor e5 = HostTensor::from_floats(DType::kE5M2, {2}, {1e9f, 0x1p-16f});
  EXPECT_EQ(e5.get(0), 57344.f);
  EXPECT_EQ(e5.get(1), 0x1p-16f);
  EXPECT_EQ(e5.view().dtype, DType::kE5M2);
}

TEST(KitFp8Kv, RealValuesAreStoredTimesTheScaleOfTheirKvHead) {
  AttentionProblem p = quantize_kv(small_problem(3), DType::kE4M3, {0.5f, 2.f}, {0x1p-10f});
  ASSERT_TRUE(p.has_fp8_kv());
  const std::vector<double> k = real_keys(p), v = real_values(p);
  ASSERT_EQ(k.size(), static_cast<std::size_t>(3 * 2 * 4));
  for (std::int64_t i = 0; i < p.k.numel(); ++i) {
    const std::int64_t g = (i / 4) % 2;
    EXPECT_EQ(k[static_cast<std::size_t>(i)], static_cast<double>(p.k.get(i)) * (g ? 2.0 : 0.5));
    EXPECT_EQ(v[static_cast<std::size_t>(i)], static_cast<double>(p.v.get(i)) * 0x1p-10);
  }
  EXPECT_EQ(p.k_scale_at(1), 2.f);
  EXPECT_EQ(p.v_scale_at(1), 0x1p-10f);
  // the stored value is the real value divided by the scale, rounded once to e4m3
  const AttentionProblem src = small_problem(3);
  for (std::int64_t i = 0; i < p.v.numel(); ++i)
    EXPECT_EQ(p.v.get(i), attnstate::to_float(attnstate::from_float<attnstate::float8_e4m3_t>(
                              src.v.get(i) * 1024.f)));
  // select_keys keeps the scales; the problem prints its formats and scales
  const AttentionProblem s = select_keys(p, {2, 0});
  EXPECT_EQ(s.k_scale, p.k_scale);
  EXPECT_EQ(s.v_scale, p.v_scale);
  std::ostringstream os;
  os << p;
  EXPECT_NE(os.str().find("q bf16, kv e4m3, k_scale {0.5, 2}"), std::string::npos) << os.str();
}

TEST(KitFp8Kv, TheReferenceIsOverTheDequantisedValues) {
  // Power-of-two scales: the real values are f32 values, so an f32 problem holding them has the
  // same reference, bit for bit.
  for (DType fmt : {DType::kE4M3, DType::kE5M2}) {
    const AttentionProblem p = quantize_kv(small_problem(9, 7), fmt, {0x1p8f, 0.25f}, {0x1p-10f});
    const AttentionProblem f32 = as_f32(p);
    const ReferenceState a = reference_state(p, {0, 3, 4, 8});
    const ReferenceState b = reference_state(f32, {0, 3, 4, 8});
    EXPECT_EQ(a.o, b.o);
    EXPECT_EQ(a.lse, b.lse);
    EXPECT_EQ(a.o_magnitude, b.o_magnitude);
    EXPECT_EQ(max_abs_score(p), max_abs_score(f32));
    // and differs from the stored values taken as they are
    AttentionProblem unscaled = p;
    unscaled.k_scale.clear();
    unscaled.v_scale.clear();
    EXPECT_NE(reference_state(unscaled, {0, 3, 4, 8}).o, a.o);
  }
}

TEST(KitFp8Kv, TheToleranceUsesTheRealValuesAndTheQueriesDtype) {
  AttentionProblem p = quantize_kv(small_problem(20), DType::kE5M2, {1.f}, {1.f});
  p.v_scale = {0x1p8f};  // real values up to 2^8
  const AttentionProblem f32 = as_f32(p);
  // the real |v| (up to 2^8) scales o_abs as for an f32 problem of the same values; P may be
  // rounded to the queries' bf16
  const Tolerance a = tolerance_for(p, true), b = tolerance_for(f32, false);
  EXPECT_EQ(a.o_abs, b.o_abs);
  EXPECT_EQ(a.o_magnitude_default, b.o_magnitude_default);
  EXPECT_GT(a.o_magnitude_default, 100.0);
  EXPECT_EQ(a.o_magnitude_rel, 2 * (0x1p-8 + 0x1p-24));
  EXPECT_EQ(tolerance_for(p, false).o_magnitude_rel, 2 * 0x1p-24);
}

TEST(KitFp8Kv, BadFp8ProblemsAreNamed) {
  AttentionProblem p = small_problem(3);
  p.k_scale = {2.f};  // scales on bf16 keys
  EXPECT_NE(invalid_argument_message([&] { reference_state(p, {0}); }).find("'problem.k_scale'"),
            std::string::npos);
  AttentionProblem f = quantize_kv(small_problem(3), DType::kE4M3, {}, {});
  f.v_scale = {1.f, 2.f, 3.f};  // neither 1 nor H_kv = 2
  EXPECT_NE(invalid_argument_message([&] { real_values(f); }).find("'problem.v_scale'"),
            std::string::npos);
  f.v_scale = {1.f, 0.f};
  EXPECT_NE(invalid_argument_message([&] { tolerance_for(f); }).find("'problem.v_scale[1]'"),
            std::string::npos);
  f.v_scale = {NAN};
  EXPECT_NE(invalid_argument_message([&] { f.v_scale_at(0); }).find("'v_scale[0]'"),
            std::string::npos);
  f.v_scale.clear();
  EXPECT_NE(invalid_argument_message([&] { f.k_scale_at(2); }).find("'g'"), std::string::npos);
  EXPECT_NE(invalid_argument_message([&] {
              quantize_kv(small_problem(1), DType::kBF16, {}, {});
            }).find("'kv_dtype'"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([&] {
              quantize_kv(small_problem(1), DType::kE5M2, {-1.f}, {});
            }).find("'k_scale[0]'"),
            std::string::npos);
  // fp8 queries, an fp8 o: not supported (the kit holds no scale for them)
  EXPECT_NE(error_message(
                [] {
                  make_problem(1, 1, 1, 1, 0, DType::kE4M3, {0.f}, {}, {}, 1.f, DType::kF32,
                               LseBase::kNatural);
                },
                Status::kNotSupported)
                .find("'dtype'"),
            std::string::npos);
  AttentionProblem q8 = f;
  q8.q = HostTensor::from_floats(DType::kE4M3, q8.q.shape(), q8.q.to_floats());
  EXPECT_NE(invalid_argument_message([&] { reference_state(q8, {}); }).find("'problem.q'"),
            std::string::npos);
  EXPECT_NE(error_message([] { HostState(1, 1, 1, DType::kE5M2, LseBase::kNatural); },
                          Status::kNotSupported)
                .find("'dtype'"),
            std::string::npos);
}

TEST(KitFp8Kv, GeneratorOptionsForFp8AreChecked) {
  ProblemGenOptions o = fp8_kv_problem_options();
  o.kv_scales.clear();
  EXPECT_NE(invalid_argument_message([&] { gen_attention_problem(o); }).find("'options.kv_scales'"),
            std::string::npos);
  o = fp8_kv_problem_options();
  o.kv_scales = {1.f, INFINITY};
  EXPECT_NE(
      invalid_argument_message([&] { gen_attention_problem(o); }).find("'options.kv_scales[1]'"),
      std::string::npos);
  o = fp8_kv_problem_options();
  o.kv_dtypes.push_back(static_cast<DType>(9));
  EXPECT_NE(
      invalid_argument_message([&] { gen_attention_problem(o); }).find("'options.kv_dtypes[2]'"),
      std::string::npos);
  o = fp8_kv_problem_options();
  o.per_head_scale_percent = 101;
  EXPECT_NE(invalid_argument_message([&] {
              gen_attention_problem(o);
            }).find("'options.per_head_scale_percent'"),
            std::string::npos);
  o = fp8_kv_problem_options();
  o.fp8_extremes_percent = -1;
  EXPECT_NE(invalid_argument_message([&] {
              gen_attention_problem(o);
            }).find("'options.fp8_extremes_percent'"),
            std::string::npos);
  o = ProblemGenOptions{};
  o.input_dtypes = {DType::kE4M3};
  EXPECT_NE(error_message([&] { gen_attention_problem(o); }, Status::kNotSupported)
                .find("'options.input_dtypes[0]'"),
            std::string::npos);
  // a list of scales is not needed without an fp8 dtype
  o = ProblemGenOptions{};
  o.kv_scales.clear();
  o.kv_dtypes = {DType::kF16};
  EXPECT_NO_THROW(gen_attention_problem(o));
}

TEST(KitFp8Kv, GeneratedFp8CachesCoverFormatsScalesAndExtremes) {
  const std::vector<AttentionProblem> ps =
      attnstate_test::sample_values(gen_attention_problem(fp8_kv_problem_options()), 300, 5);
  std::set<DType> formats;
  std::set<float> scales;
  int per_head = 0, per_tensor = 0, extremes = 0, large_amp = 0;
  for (const AttentionProblem& p : ps) {
    ASSERT_TRUE(p.has_fp8_kv());
    EXPECT_TRUE(p.q.dtype() == DType::kF16 || p.q.dtype() == DType::kBF16);
    formats.insert(p.k.dtype());
    ASSERT_EQ(p.k_scale.size(), p.v_scale.size());
    if (p.heads_kv() > 1) (p.k_scale.size() == 1 ? per_tensor : per_head) += 1;
    if (p.k_scale.size() != 1) {
      EXPECT_EQ(static_cast<std::int64_t>(p.k_scale.size()), p.heads_kv());
    }
    for (float s : p.k_scale) scales.insert(s);
    const float max = p.k.dtype() == DType::kE4M3 ? 448.f : 57344.f;
    bool at_max = false, big = false;
    for (const HostTensor* t : {&p.k, &p.v})
      for (std::int64_t i = 0; i < t->numel(); ++i) {
        at_max = at_max || std::fabs(t->get(i)) == max;
        big = big || std::fabs(t->get(i)) > 64.f;
      }
    extremes += at_max;
    large_amp += big;
    // the queries scaled to the keys: |q_d · k_d| <= 1 (up to the rounding of q), x40 large
    double k_max = 0, q_max = 0, v_max = 0;
    for (double x : real_keys(p)) k_max = std::max(k_max, std::fabs(x));
    for (double x : real_values(p)) v_max = std::max(v_max, std::fabs(x));
    for (float x : p.q.to_floats()) q_max = std::max(q_max, static_cast<double>(std::fabs(x)));
    if (k_max > 1.0 / 256) {
      EXPECT_LE(q_max * k_max, 45.0) << p;
    }
    if (v_max > 65504) {
      EXPECT_NE(p.out_dtype, DType::kF16) << p;
    }
  }
  EXPECT_EQ(formats.size(), 2u);
  EXPECT_EQ(scales, (std::set<float>{1.f, 0x1p-10f, 0x1p8f}));
  EXPECT_GT(per_head, 15);  // of the problems with 2 KV heads
  EXPECT_GT(per_tensor, 15);
  EXPECT_GT(extremes, 20);
  EXPECT_GT(large_amp, 60);
  // without kv_dtypes nothing is drawn for them: the keys take the queries' dtype
  for (const AttentionProblem& p :
       attnstate_test::sample_values(gen_attention_problem(decode_problem_options()), 20, 5)) {
    EXPECT_EQ(p.k.dtype(), p.q.dtype());
    EXPECT_TRUE(p.k_scale.empty());
  }
}

/// The sample fp32 kernel over the problem's real keys and values (it reads `k`, `v` as f32).
HostState dequantising_kernel(const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
  return attnstate_test::sample_kernel(as_f32(p), keys, attnstate_test::Defect::kNone);
}

TEST(KitFp8Kv, TheConformanceCheckTellsAKernelThatIgnoresTheScales) {
  KernelCheckOptions o;
  o.problems = fp8_kv_problem_options();
  o.problems.max_keys = 40;
  o.num_tests = 60;
  o.p_rounded_to_input = false;
  o.seed = 17;
  const KernelCheckReport good = check_state_kernel(dequantising_kernel, o);
  EXPECT_TRUE(good.passed()) << good.summary();
  // the same kernel reading the stored values as they are (no scale)
  const KernelCheckReport bad = check_state_kernel(
      [](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        return attnstate_test::sample_kernel(p, keys, attnstate_test::Defect::kNone);
      },
      o);
  EXPECT_TRUE(bad.failed(Law::kExactness)) << bad.summary();
}

}  // namespace
