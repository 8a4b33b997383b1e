/// @file test_cpu_sinks.cpp
/// @brief Attention sinks fused into the CPU decode's and cascade's final merge
///        (`cpu::decode(q, kv, options, sinks, out)`, `cpu::cascade_attention(..., sinks, out)`),
///        outputs poisoned with NaN first: equal to the sink-free call followed by one
///        `merge_state_inplace` with `make_sink_state`, for every split policy and count, ragged
///        lengths with an empty request (its rows become `(0, s_h)`), q_len > 1, f32/bf16 `o`,
///        natural/base-2 LSEs, heads_q > heads_kv; split counts 1 and many agree and match the
///        double reference of the keys plus the sink mass (so a sink carried by a partial fails);
///        1-3 cascade levels; windows and soft caps; the sink-free overloads bitwise unchanged;
///        bad logits and overlaps named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/variant.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"
#include "attnstate/cpu/merge.hpp"
#include "cascade_case.hpp"
#include "cpu_test_utils.hpp"
#include "decode_problem.hpp"
#include "variant_reference.hpp"

namespace {

using namespace attnstate;  // NOLINT(google-build-using-namespace): test file
using attnstate_test::CascadeCase;
using attnstate_test::CaseSpec;
using attnstate_test::DecodeConfig;
using attnstate_test::DecodeProblemHost;
using attnstate_test::SegmentSpec;
using attnstate_test::show;
using attnstate_test::variant;
namespace kit = attnstate::testing;

/// A split policy of `cpu::decode`'s options.
struct Policy {
  const char* name;
  SplitPolicy policy;
  int value;  ///< num_splits or split_size
};
constexpr Policy kPolicies[] = {
    {"fixed_count 1", SplitPolicy::kFixedCount, 1},
    {"fixed_count 3", SplitPolicy::kFixedCount, 3},
    {"fixed_count 8", SplitPolicy::kFixedCount, 8},
    {"fixed_size 16", SplitPolicy::kFixedSize, 16},
    {"auto", SplitPolicy::kAuto, 0},
};

DecodeOptions options_of(const Policy& p, const AttentionVariant& v = AttentionVariant{}) {
  DecodeOptions o;
  o.policy = p.policy;
  if (p.policy == SplitPolicy::kFixedCount) o.num_splits = p.value;
  if (p.policy == SplitPolicy::kFixedSize) o.split_size = p.value;
  o.variant = v;
  return o;
}

/// `heads` fresh natural-base sink logits in [-3, 5] (of the order of the keys' LSEs, so the
/// sink's share of the softmax is neither negligible nor everything).
std::vector<float> draw_logits(std::int64_t heads, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-3.f, 5.f);
  std::vector<float> s(static_cast<std::size_t>(heads));
  for (float& x : s) x = u(rng);
  return s;
}

/// The double reference of the keys plus the sink mass: every row `(t, h)` of `ref` (natural
/// base) merged with `(0, s_h)` in double; an empty row becomes `(0, s_h)`, a NaN row stays NaN.
kit::ReferenceState plus_sinks(kit::ReferenceState ref, const std::vector<float>& sinks) {
  for (std::int64_t t = 0; t < ref.tokens; ++t)
    for (std::int64_t h = 0; h < ref.heads; ++h) {
      const std::size_t i = static_cast<std::size_t>(t * ref.heads + h);
      const double s = sinks[static_cast<std::size_t>(h)], l = ref.lse[i];
      if (std::isnan(l)) continue;
      double w = 0;  // weight of the keys' o
      if (l == -std::numeric_limits<double>::infinity()) {
        ref.lse[i] = s;
      } else {
        const double m = std::max(l, s);
        ref.lse[i] = m + std::log(std::exp(l - m) + std::exp(s - m));
        w = std::exp(l - ref.lse[i]);
      }
      for (std::int64_t d = 0; d < ref.head_dim; ++d) {
        const std::size_t e = i * static_cast<std::size_t>(ref.head_dim) + d;
        ref.o[e] *= w;
        if (ref.has_o_magnitude()) ref.o_magnitude[e] *= w;
      }
    }
  return ref;
}

/// The sinks of `logits` (none when it is empty).
AttentionSinks sinks_of(const std::vector<float>& logits) {
  AttentionSinks s;
  s.logits = logits.empty() ? nullptr : logits.data();
  return s;
}

/// The CPU decode of `p` into a NaN-poisoned output (no sinks for an empty `sinks`).
attnstate_test::HostState run_decode(const DecodeProblemHost& p, const DecodeOptions& o,
                                     const std::vector<float>& sinks, DType dt, LseBase base) {
  attnstate_test::HostState out(p.tokens(), p.cfg.heads_q, p.cfg.head_dim, dt, base);
  cpu::decode(p.q_view(), p.kv_view(), o, sinks_of(sinks), out.view);
  return out;
}

/// `out` ⊕ the sink state, by the public merge (what a caller without the fused overload does).
void merge_sinks(const attnstate_test::HostState& out, const std::vector<float>& sinks) {
  const std::vector<float> zeros(static_cast<std::size_t>(out.view.head_dim), 0.f);
  cpu::merge_state_inplace(out.view,
                           make_sink_state(sinks.data(), zeros.data(), DType::kF32, out.view.tokens,
                                           out.view.heads, out.view.head_dim, LseBase::kNatural));
}

/// The fused result against the unfused one (both rounded to `dt`; the unfused one twice, so a
/// 16-bit `o` may differ by its double rounding, at most one unit in the last place).
std::string compare_unfused(const attnstate_test::HostState& fused,
                            const attnstate_test::HostState& unfused, DType dt) {
  kit::Tolerance t = kit::Tolerance::absolute(1e-6, 0, 1e-6, 1);
  t.o_rel = dt == DType::kF32 ? 1e-6 : std::ldexp(1.0, -7);
  return kit::compare_states(kit::HostState::from_view(fused.view),
                             kit::HostState::from_view(unfused.view), t);
}

/// Compares with a reference (natural base) within the decode tests' bounds.
std::string compare_reference(const attnstate_test::HostState& out, const kit::ReferenceState& ref,
                              DType dt) {
  const double o_tol = dt == DType::kBF16 ? 8e-3 : dt == DType::kF16 ? 1e-3 : 2e-5;
  return attnstate_test::compare_decode(ref, out.o.data(), dt, out.lse.data(), out.view.base,
                                        attnstate_test::decode_tolerance(o_tol, 1e-5));
}

/// Rows of request `b` (all its `q_len` tokens) are exactly the sink state `(0, s_h)`.
void expect_sink_rows(const attnstate_test::HostState& out, std::int64_t b, std::int64_t q_len,
                      const std::vector<float>& sinks, const std::string& what) {
  const StateView& v = out.view;
  for (std::int64_t t = b * q_len; t < (b + 1) * q_len; ++t)
    for (std::int64_t h = 0; h < v.heads; ++h) {
      EXPECT_EQ(v.lse[v.lse_offset(t, h)],
                math::convert_lse(sinks[static_cast<std::size_t>(h)], LseBase::kNatural, v.base))
          << what << " token " << t << " head " << h;
      for (std::int64_t d = 0; d < v.head_dim; ++d)
        EXPECT_EQ(attnstate_test::get(v.o, v.dtype, v.o_offset(t, h) + d), 0.0)
            << what << " token " << t << " head " << h << " d " << d;
    }
}

DecodeConfig ragged_config(std::int64_t q_len, std::int64_t heads_q, std::int64_t heads_kv) {
  DecodeConfig cfg;
  cfg.q_len = q_len;
  cfg.heads_q = heads_q;
  cfg.heads_kv = heads_kv;
  cfg.head_dim = 32;
  cfg.page_size = 16;
  cfg.q_gain = 3.f;
  cfg.seq_lens = {37, 0, 130, 5, 200, 16};  // request 1 has no key
  return cfg;
}

TEST(CpuSinksDecode, EqualsTheSinkFreeDecodeThenOneMergeWithTheSinkState) {
  std::uint64_t seed = 1;
  const std::pair<int, int> shapes[] = {{8, 2}, {4, 4}, {6, 1}};  // (heads_q, heads_kv)
  for (std::int64_t q_len : {1, 3})
    for (const auto& [hq, hkv] : shapes) {
      const DecodeProblemHost p =
          attnstate_test::make_decode_problem(ragged_config(q_len, hq, hkv), seed++);
      const std::vector<float> sinks = draw_logits(hq, seed++);
      for (const Policy& pol : kPolicies)
        for (DType dt : {DType::kF32, DType::kBF16})
          for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
            const std::string what = std::string(pol.name) + " q_len " + std::to_string(q_len) +
                                     " hq " + std::to_string(hq) + " hkv " + std::to_string(hkv) +
                                     " " + to_string(dt) + (base == LseBase::kBase2 ? " b2" : "");
            const attnstate_test::HostState fused = run_decode(p, options_of(pol), sinks, dt, base);
            const attnstate_test::HostState unfused = run_decode(p, options_of(pol), {}, dt, base);
            merge_sinks(unfused, sinks);
            EXPECT_EQ(compare_unfused(fused, unfused, dt), "") << what;
            expect_sink_rows(fused, 1, q_len, sinks, what);  // the request with no key
          }
    }
}

TEST(CpuSinksDecode, SplitCountsAgreeAndMatchTheReferenceOfTheKeysPlusTheSink) {
  // A sink merged into each split's partial instead of once would count n times for a request
  // of n splits: the results of 1 and 8 splits would differ and miss the reference.
  std::uint64_t seed = 20;
  for (std::int64_t q_len : {1, 4}) {
    const DecodeProblemHost p =
        attnstate_test::make_decode_problem(ragged_config(q_len, 8, 2), seed++);
    const std::vector<float> sinks = draw_logits(8, seed++);
    const float scale = 1.f / std::sqrt(32.f);
    const kit::ReferenceState ref = plus_sinks(attnstate_test::reference_decode(p, scale), sinks);
    for (DType dt : {DType::kF32, DType::kBF16})
      for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
        const attnstate_test::HostState one =
            run_decode(p, options_of(kPolicies[0]), sinks, dt, base);
        EXPECT_EQ(compare_reference(one, ref, dt), "") << "1 split";
        for (const Policy& pol : kPolicies) {
          const attnstate_test::HostState many = run_decode(p, options_of(pol), sinks, dt, base);
          EXPECT_EQ(compare_reference(many, ref, dt), "") << pol.name << " " << to_string(dt);
          kit::Tolerance t = kit::Tolerance::absolute(dt == DType::kF32 ? 1e-5 : 8e-3, 0, 1e-5, 1);
          EXPECT_EQ(kit::compare_states(kit::HostState::from_view(many.view),
                                        kit::HostState::from_view(one.view), t),
                    "")
              << pol.name << " vs 1 split, " << to_string(dt);
        }
      }
  }
}

TEST(CpuSinksDecode, TheReferenceCheckCatchesASinkCountedTwice) {
  // The bounds above are tight enough to see a sink merged twice (as two partials carrying it).
  const DecodeProblemHost p = attnstate_test::make_decode_problem(ragged_config(2, 4, 2), 31);
  const std::vector<float> sinks = draw_logits(4, 32);
  const kit::ReferenceState ref =
      plus_sinks(attnstate_test::reference_decode(p, 1.f / std::sqrt(32.f)), sinks);
  attnstate_test::HostState out =
      run_decode(p, options_of(kPolicies[2]), sinks, DType::kF32, LseBase::kNatural);
  ASSERT_EQ(compare_reference(out, ref, DType::kF32), "");
  merge_sinks(out, sinks);
  EXPECT_NE(compare_reference(out, ref, DType::kF32), "");
}

TEST(CpuSinksDecode, WithWindowsAndSoftCaps) {
  std::uint64_t seed = 40;
  const DecodeProblemHost p = attnstate_test::make_decode_problem(ragged_config(3, 8, 2), seed++);
  const std::vector<float> sinks = draw_logits(8, seed++);
  const float scale = 1.f / std::sqrt(32.f);
  for (const AttentionVariant& v : {variant(0, 0.f), variant(7, 0.f), variant(kNoWindow, 5.f),
                                    variant(20, 30.f), variant(100, 2.f)}) {
    const kit::ReferenceState ref =
        plus_sinks(attnstate_test::decode_reference(p, scale, v), sinks);
    for (const Policy& pol : kPolicies)
      for (DType dt : {DType::kF32, DType::kBF16}) {
        const attnstate_test::HostState out =
            run_decode(p, options_of(pol, v), sinks, dt, LseBase::kBase2);
        EXPECT_EQ(compare_reference(out, ref, dt), "") << pol.name << ", " << show(v);
        const attnstate_test::HostState unfused =
            run_decode(p, options_of(pol, v), {}, dt, LseBase::kBase2);
        merge_sinks(unfused, sinks);
        EXPECT_EQ(compare_unfused(out, unfused, dt), "") << pol.name << ", " << show(v);
      }
  }
}

TEST(CpuSinksDecode, NoSinksIsBitwiseTheSinkFreeOverload) {
  const DecodeProblemHost p = attnstate_test::make_decode_problem(ragged_config(2, 8, 2), 50);
  for (const Policy& pol : kPolicies)
    for (DType dt : {DType::kF32, DType::kBF16}) {
      attnstate_test::HostState a(p.tokens(), 8, 32, dt, LseBase::kBase2);
      cpu::decode(p.q_view(), p.kv_view(), options_of(pol), a.view);
      const attnstate_test::HostState b = run_decode(p, options_of(pol), {}, dt, LseBase::kBase2);
      EXPECT_EQ(kit::compare_bitwise(kit::HostState::from_view(a.view),
                                     kit::HostState::from_view(b.view)),
                "")
          << pol.name;
    }
}

TEST(CpuSinksDecode, AnEmptyBatchWritesNothing) {
  DecodeConfig cfg = ragged_config(1, 4, 2);
  cfg.seq_lens = {};
  const DecodeProblemHost p = attnstate_test::make_decode_problem(cfg, 60);
  const std::vector<float> sinks = draw_logits(4, 61);
  const attnstate_test::HostState out =
      run_decode(p, options_of(kPolicies[0]), sinks, DType::kF32, LseBase::kNatural);
  EXPECT_TRUE(std::isnan(out.lse[0]));
}

// --- cascade ------------------------------------------------------------------------------------

/// Cascades of 1, 2 and 3 levels over 4 requests, request 2 without any key.
CaseSpec cascade_spec(int levels, int q_len, std::uint64_t seed) {
  CaseSpec s;
  s.q_len = q_len;
  s.heads_q = 8;
  s.heads_kv = 2;
  s.head_dim = 32;
  s.q_amp = 3.f;
  s.seed = seed;
  s.nan_outside = true;
  s.causal = false;  // every row at the last key: request 2's rows see no key at any q_len
  if (levels == 1) {
    s.levels = {{{1, 40}, {1, 77}, {1, 0}, {1, 16}}};
  } else if (levels == 2) {
    s.levels = {{{2, 48}, {2, 0}}, {{1, 20}, {1, 1}, {1, 0}, {1, 45}}};
  } else {
    s.levels = {{{2, 64}, {1, 0}, {1, 30}},
                {{1, 33}, {1, 20}, {1, 0}, {1, 9}},
                {{1, 5}, {1, 17}, {1, 0}, {1, 70}}};
  }
  return s;
}

attnstate_test::HostState run_cascade(const CascadeCase& c, const CascadeOptions& o,
                                      const std::vector<float>& sinks, DType dt, LseBase base) {
  attnstate_test::HostState out(c.tokens(), c.spec.heads_q, c.spec.head_dim, dt, base);
  const auto levels = c.host_levels();
  cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                         c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost), levels.data(),
                         static_cast<int>(levels.size()), o, sinks_of(sinks), out.view);
  return out;
}

TEST(CpuSinksCascade, OneTwoAndThreeLevelsMatchTheReferenceAndTheUnfusedMerge) {
  std::uint64_t seed = 100;
  for (int levels : {1, 2, 3})
    for (int q_len : {1, 3}) {
      const CascadeCase c(cascade_spec(levels, q_len, seed++));
      const std::vector<float> sinks = draw_logits(c.spec.heads_q, seed++);
      const kit::ReferenceState ref = plus_sinks(c.reference, sinks);
      for (DType dt : {DType::kF32, DType::kBF16})
        for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
          const std::string what = std::to_string(levels) + " levels, q_len " +
                                   std::to_string(q_len) + " " + to_string(dt) +
                                   (base == LseBase::kBase2 ? " b2" : "");
          const attnstate_test::HostState out = run_cascade(c, c.options(), sinks, dt, base);
          EXPECT_EQ(compare_reference(out, ref, dt), "") << what;
          const attnstate_test::HostState unfused = run_cascade(c, c.options(), {}, dt, base);
          merge_sinks(unfused, sinks);
          EXPECT_EQ(compare_unfused(out, unfused, dt), "") << what;
          expect_sink_rows(out, 2, q_len, sinks, what);
        }
    }
}

TEST(CpuSinksCascade, WithWindowsAndSoftCaps) {
  std::uint64_t seed = 200;
  for (int levels : {2, 3}) {
    CaseSpec s = cascade_spec(levels, 2, seed++);
    s.causal = true;
    for (auto& seg : s.levels.back())
      if (seg.len == 0) seg.len = 1;  // causal rows of q_len 2 need a key of the last level
    const CascadeCase c(s);
    const std::vector<float> sinks = draw_logits(c.spec.heads_q, seed++);
    for (const AttentionVariant& v :
         {variant(0, 0.f), variant(10, 0.f), variant(kNoWindow, 5.f), variant(40, 30.f)}) {
      CascadeOptions o = c.options();
      o.variant = v;
      const kit::ReferenceState ref = plus_sinks(attnstate_test::cascade_reference(c, v), sinks);
      const attnstate_test::HostState out = run_cascade(c, o, sinks, DType::kF32, LseBase::kBase2);
      EXPECT_EQ(compare_reference(out, ref, DType::kF32), "") << levels << " levels, " << show(v);
      const attnstate_test::HostState unfused = run_cascade(c, o, {}, DType::kF32, LseBase::kBase2);
      merge_sinks(unfused, sinks);
      EXPECT_EQ(compare_unfused(out, unfused, DType::kF32), "") << levels << " levels, " << show(v);
    }
  }
}

TEST(CpuSinksCascade, TheCudaSinkCasesMatchTheReferenceAndAnEmptyCausalRemainderIsRefused) {
  // The cases of the CUDA cascade's sinks test (a last level at causal q_len 2 whose 1-key
  // segments give row 0 no key of it); with one of those segments empty the level is refused (a
  // causal last-level segment holds q_len - 1 keys), as plan_cascade refuses it on the GPU.
  const std::vector<CaseSpec> specs = attnstate_test::sink_cascade_specs();
  std::uint64_t seed = 6300;
  for (const CaseSpec& spec : specs) {
    const CascadeCase c(spec);
    const std::vector<float> sinks = draw_logits(spec.heads_q, seed++);
    const attnstate_test::HostState out =
        run_cascade(c, c.options(), sinks, DType::kBF16, LseBase::kBase2);
    EXPECT_EQ(compare_reference(out, plus_sinks(c.reference, sinks), DType::kBF16), "")
        << spec.levels.size() << " levels";
    const attnstate_test::HostState bare =
        run_cascade(c, c.options(), {}, DType::kBF16, LseBase::kBase2);
    EXPECT_EQ(compare_reference(bare, c.reference, DType::kBF16), "")
        << spec.levels.size() << " levels, no sinks";
  }
  CaseSpec three = specs[1];
  three.levels.back()[1].len = 0;
  const CascadeCase empty(three);
  try {
    run_cascade(empty, empty.options(), draw_logits(three.heads_q, seed), DType::kBF16,
                LseBase::kBase2);
    ADD_FAILURE() << "an empty causal last-level segment at q_len 2 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("argument 'levels[2].seg_lens'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("q_len - 1 = 1"), std::string::npos) << e.what();
  }
}

TEST(CpuSinksCascade, NoSinksIsBitwiseTheSinkFreeOverload) {
  const CascadeCase c(cascade_spec(3, 2, 300));
  for (DType dt : {DType::kF32, DType::kBF16}) {
    attnstate_test::HostState a(c.tokens(), c.spec.heads_q, c.spec.head_dim, dt, LseBase::kNatural);
    const auto levels = c.host_levels();
    cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                           c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost),
                           levels.data(), static_cast<int>(levels.size()), c.options(), a.view);
    const attnstate_test::HostState b = run_cascade(c, c.options(), {}, dt, LseBase::kNatural);
    EXPECT_EQ(
        kit::compare_bitwise(kit::HostState::from_view(a.view), kit::HostState::from_view(b.view)),
        "");
  }
}

// --- argument checks ----------------------------------------------------------------------------

TEST(CpuSinksArgs, NonFiniteLogitsAreNamed) {
  const DecodeProblemHost p = attnstate_test::make_decode_problem(ragged_config(1, 8, 2), 400);
  const CascadeCase c(cascade_spec(2, 1, 401));
  const auto levels = c.host_levels();
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    float x;
    const char* got;
  } bad[] = {
      {std::numeric_limits<float>::quiet_NaN(), "got nan"}, {inf, "got inf"}, {-inf, "got -inf"}};
  for (const auto& b : bad) {
    std::vector<float> sinks = draw_logits(8, 402);
    sinks[3] = b.x;
    attnstate_test::HostState out(p.tokens(), 8, 32, DType::kF32, LseBase::kNatural);
    attnstate_test::HostState cout(c.tokens(), 8, 32, DType::kF32, LseBase::kNatural);
    AttentionSinks s;
    s.logits = sinks.data();
    const auto decode = [&] { cpu::decode(p.q_view(), p.kv_view(), DecodeOptions{}, s, out.view); };
    const auto cascade = [&] {
      cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                             c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost),
                             levels.data(), static_cast<int>(levels.size()), c.options(), s,
                             cout.view);
    };
    for (const auto& call : {std::function<void()>(decode), std::function<void()>(cascade)}) {
      attnstate::test::expect_arg_error(call, "sinks.logits[3]");
      try {
        call();
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("expected a finite logit"), std::string::npos) << msg;
        EXPECT_NE(msg.find(b.got), std::string::npos) << msg;
        if (b.x == -inf) {
          EXPECT_NE(msg.find("none()"), std::string::npos) << msg;
        }
      }
    }
    EXPECT_TRUE(std::isnan(out.lse[0]));  // nothing written
    EXPECT_TRUE(std::isnan(cout.lse[0]));
  }
}

TEST(CpuSinksArgs, MisalignedLogitsAndOverlapsWithOutAreNamed) {
  const DecodeProblemHost p = attnstate_test::make_decode_problem(ragged_config(1, 8, 2), 410);
  const CascadeCase c(cascade_spec(1, 1, 411));
  const auto levels = c.host_levels();
  std::vector<float> buf(static_cast<std::size_t>(p.tokens() * 8) + 16, 0.5f);
  attnstate_test::HostState out(p.tokens(), 8, 32, DType::kF32, LseBase::kNatural);
  attnstate_test::HostState cout(c.tokens(), 8, 32, DType::kF32, LseBase::kNatural);
  const auto decode = [&](const AttentionSinks& s, StateView v) {
    cpu::decode(p.q_view(), p.kv_view(), DecodeOptions{}, s, v);
  };
  const auto cascade = [&](const AttentionSinks& s, StateView v) {
    cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                           c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost),
                           levels.data(), static_cast<int>(levels.size()), c.options(), s, v);
  };
  AttentionSinks misaligned;
  misaligned.logits = reinterpret_cast<const float*>(reinterpret_cast<const char*>(buf.data()) + 2);
  attnstate::test::expect_arg_error([&] { decode(misaligned, out.view); }, "sinks.logits");
  attnstate::test::expect_arg_error([&] { cascade(misaligned, cout.view); }, "sinks.logits");
  // out.lse over the logits: the logits in the LSE buffer of the output
  AttentionSinks in_lse;
  in_lse.logits = out.lse.data() + 5;
  std::fill(out.lse.begin(), out.lse.end(), 1.f);  // finite logits, so only the overlap is bad
  attnstate::test::expect_arg_error([&] { decode(in_lse, out.view); }, "out.lse");
  in_lse.logits = cout.lse.data() + 5;
  std::fill(cout.lse.begin(), cout.lse.end(), 1.f);
  attnstate::test::expect_arg_error([&] { cascade(in_lse, cout.view); }, "out.lse");
  // out.o over the logits (an f32 o of finite values)
  std::vector<float> o(static_cast<std::size_t>(p.tokens() * 8 * 32), 0.25f);
  std::vector<float> lse(static_cast<std::size_t>(p.tokens() * 8));
  const StateView ov =
      make_state_view(o.data(), DType::kF32, lse.data(), p.tokens(), 8, 32, LseBase::kNatural);
  AttentionSinks in_o;
  in_o.logits = o.data() + 40;
  attnstate::test::expect_arg_error([&] { decode(in_o, ov); }, "out.o");
  EXPECT_EQ(o[0], 0.25f);  // nothing written
}

}  // namespace
