/// @file test_cpu_sink.cpp
/// @brief Attention sinks as states (core/sink.hpp) on the CPU: merging make_sink_state once
///        into the merged state of all keys equals the softmax with the sink term in its
///        denominator (double reference), in either base and every `o` dtype; an empty row
///        becomes `(0, s)`; a sink merged into each partial instead is counted twice (so a test
///        of "once" can fail); bad arguments are named.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/cpu/merge.hpp"

namespace attnstate {
namespace {

constexpr double kLn2 = 0.69314718055994530942;

/// Keys of one row: scores (natural base) and values.
struct Keys {
  std::vector<double> score;
  std::vector<std::vector<double>> value;
};

/// (o, lse) in double of the keys [lo, hi) of `k`, with an optional sink logit `s`.
void reference(const Keys& k, std::size_t lo, std::size_t hi, const double* s, int d,
               std::vector<double>* o, double* lse) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t j = lo; j < hi; ++j) m = std::max(m, k.score[j]);
  if (s != nullptr) m = std::max(m, *s);
  double sum = 0;
  o->assign(static_cast<std::size_t>(d), 0.0);
  for (std::size_t j = lo; j < hi; ++j) {
    const double w = std::exp(k.score[j] - m);
    sum += w;
    for (int e = 0; e < d; ++e) (*o)[static_cast<std::size_t>(e)] += w * k.value[j][e];
  }
  if (s != nullptr) sum += std::exp(*s - m);
  for (double& x : *o) x /= sum;
  *lse = m + std::log(sum);
}

struct Rows {
  int tokens, heads, d;
  std::vector<Keys> keys;  // [tokens * heads]
};

Rows draw(std::mt19937& rng, int tokens, int heads, int d, int n_keys) {
  std::normal_distribution<double> nd(0.0, 2.0);
  Rows r{tokens, heads, d, {}};
  for (int i = 0; i < tokens * heads; ++i) {
    Keys k;
    for (int j = 0; j < n_keys; ++j) {
      k.score.push_back(nd(rng));
      std::vector<double> v(static_cast<std::size_t>(d));
      for (double& x : v) x = nd(rng);
      k.value.push_back(v);
    }
    r.keys.push_back(k);
  }
  return r;
}

/// fp32 state (o, lse in `base`) of the keys [lo, hi) of every row.
void partial(const Rows& r, std::size_t lo, std::size_t hi, LseBase base, std::vector<float>* o,
             std::vector<float>* lse) {
  o->assign(static_cast<std::size_t>(r.tokens * r.heads * r.d), 0.f);
  lse->assign(static_cast<std::size_t>(r.tokens * r.heads), 0.f);
  for (int i = 0; i < r.tokens * r.heads; ++i) {
    std::vector<double> ro;
    double l = 0;
    reference(r.keys[static_cast<std::size_t>(i)], lo, hi, nullptr, r.d, &ro, &l);
    for (int e = 0; e < r.d; ++e)
      (*o)[static_cast<std::size_t>(i * r.d + e)] =
          static_cast<float>(ro[static_cast<std::size_t>(e)]);
    (*lse)[static_cast<std::size_t>(i)] =
        static_cast<float>(lo == hi ? -INFINITY : (base == LseBase::kBase2 ? l / kLn2 : l));
  }
}

TEST(SinkState, MergedOnceEqualsTheSoftmaxWithTheSinkTerm) {
  std::mt19937 rng(7);
  const int tokens = 5, heads = 3, d = 8, n_keys = 12;
  const Rows r = draw(rng, tokens, heads, d, n_keys);
  std::normal_distribution<double> nd(0.0, 2.0);
  std::vector<double> sink(static_cast<std::size_t>(heads));
  for (double& s : sink) s = nd(rng);
  for (LseBase out_base : {LseBase::kNatural, LseBase::kBase2})
    for (LseBase sink_base : {LseBase::kNatural, LseBase::kBase2})
      for (DType zeros_dt : {DType::kF32, DType::kF16, DType::kBF16}) {
        // two partials over disjoint keys, merged, then the sink once
        std::vector<float> oa, la, ob, lb;
        partial(r, 0, 5, out_base, &oa, &la);
        partial(r, 5, n_keys, out_base, &ob, &lb);
        std::vector<float> o(oa.size(), NAN), lse(la.size(), NAN);
        const StateView out =
            make_state_view(o.data(), DType::kF32, lse.data(), tokens, heads, d, out_base);
        cpu::merge_state(
            make_const_state_view(oa.data(), DType::kF32, la.data(), tokens, heads, d, out_base),
            make_const_state_view(ob.data(), DType::kF32, lb.data(), tokens, heads, d, out_base),
            out);
        std::vector<float> sink_lse(static_cast<std::size_t>(heads));
        for (int h = 0; h < heads; ++h)
          sink_lse[static_cast<std::size_t>(h)] = static_cast<float>(
              sink_base == LseBase::kBase2 ? sink[static_cast<std::size_t>(h)] / kLn2
                                           : sink[static_cast<std::size_t>(h)]);
        const std::vector<std::uint32_t> zeros(static_cast<std::size_t>(d), 0u);  // any dtype
        cpu::merge_state_inplace(out, make_sink_state(sink_lse.data(), zeros.data(), zeros_dt,
                                                      tokens, heads, d, sink_base));
        for (int t = 0; t < tokens; ++t)
          for (int h = 0; h < heads; ++h) {
            const int i = t * heads + h;
            std::vector<double> ro;
            double rl = 0;
            reference(r.keys[static_cast<std::size_t>(i)], 0, n_keys,
                      &sink[static_cast<std::size_t>(h)], d, &ro, &rl);
            const double got_lse = out_base == LseBase::kBase2 ? lse[i] * kLn2 : lse[i];
            EXPECT_NEAR(got_lse, rl, 1e-5 * (1 + std::abs(rl))) << t << "," << h;
            for (int e = 0; e < d; ++e)
              EXPECT_NEAR(o[static_cast<std::size_t>(i * d + e)], ro[static_cast<std::size_t>(e)],
                          2e-5 * (1 + std::abs(ro[static_cast<std::size_t>(e)])))
                  << t << "," << h << "," << e;
          }
      }
}

TEST(SinkState, AnEmptyRowBecomesTheSinkStateAndASinkPerPartialCountsTwice) {
  const int heads = 2, d = 4;
  std::vector<float> o(static_cast<std::size_t>(heads * d), 0.f);  // empty rows: (0, -inf)
  std::vector<float> lse(static_cast<std::size_t>(heads), -INFINITY);
  const StateView out =
      make_state_view(o.data(), DType::kF32, lse.data(), 1, heads, d, LseBase::kNatural);
  const std::vector<float> sink_lse = {0.5f, -3.f};
  const std::vector<float> zeros(static_cast<std::size_t>(d), 0.f);
  const ConstStateView sink =
      make_sink_state(sink_lse.data(), zeros.data(), DType::kF32, 1, heads, d, LseBase::kNatural);
  cpu::merge_state_inplace(out, sink);
  for (int h = 0; h < heads; ++h) {
    EXPECT_EQ(lse[static_cast<std::size_t>(h)], sink_lse[static_cast<std::size_t>(h)]);
    for (int e = 0; e < d; ++e) EXPECT_EQ(o[static_cast<std::size_t>(h * d + e)], 0.f);
  }
  // merged again (as if a second partial had carried it): the sink's mass doubles, log 2 more
  cpu::merge_state_inplace(out, sink);
  for (int h = 0; h < heads; ++h)
    EXPECT_NEAR(lse[static_cast<std::size_t>(h)],
                sink_lse[static_cast<std::size_t>(h)] + std::log(2.0), 1e-6);
}

TEST(SinkState, BadArgumentsAreNamed) {
  const float s[1] = {0.f};
  const float z[4] = {0.f, 0.f, 0.f, 0.f};
  auto expect = [](const char* arg, auto&& f) {
    try {
      f();
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("'") + arg + "'"), std::string::npos)
          << e.what();
    }
  };
  expect("sink_lse", [&] { make_sink_state(nullptr, z, DType::kF32, 1, 1, 4, LseBase::kNatural); });
  expect("zeros", [&] { make_sink_state(s, nullptr, DType::kF32, 1, 1, 4, LseBase::kNatural); });
  expect("tokens", [&] { make_sink_state(s, z, DType::kF32, -1, 1, 4, LseBase::kNatural); });
  expect("heads", [&] { make_sink_state(s, z, DType::kF32, 1, 0, 4, LseBase::kNatural); });
  expect("head_dim", [&] { make_sink_state(s, z, DType::kF32, 1, 1, 0, LseBase::kNatural); });
}

}  // namespace
}  // namespace attnstate
