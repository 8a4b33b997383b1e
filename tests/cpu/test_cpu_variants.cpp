/// @file test_cpu_variants.cpp
/// @brief Sliding window and logits soft cap on the CPU (decode, cascade, attention_state)
///        against the testing kit's double reference, outputs poisoned with NaN first: every
///        split policy, page sizes 1/3/16, ragged batches, q_len > 1, every dtype; windows of 0
///        keys, larger than the context, rows that see no key, NaN keys outside the windows
///        never read; a cascade level outside some rows' windows; the cap on the scaled score;
///        bad variants named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/variant.hpp"
#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"
#include "cascade_case.hpp"
#include "cpu_test_utils.hpp"
#include "decode_problem.hpp"
#include "variant_reference.hpp"

namespace {

using namespace attnstate;  // NOLINT(google-build-using-namespace): test file
using attnstate_test::cascade_reference;
using attnstate_test::CascadeCase;
using attnstate_test::CaseSpec;
using attnstate_test::decode_reference;
using attnstate_test::DecodeConfig;
using attnstate_test::DecodeProblemHost;
using attnstate_test::SegmentSpec;
using attnstate_test::show;
using attnstate_test::variant;
namespace kit = attnstate::testing;

constexpr DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

double o_tol(DType out) { return out == DType::kBF16 ? 8e-3 : out == DType::kF16 ? 1e-3 : 2e-4; }

/// How a decode is called.
struct Splits {
  const char* name;
  SplitPolicy policy;
  int count_or_size;
  bool explicit_layout;  ///< Through `decode(q, kv, SplitLayout, scale, variant, out)`.
};
constexpr Splits kSplits[] = {
    {"auto", SplitPolicy::kAuto, 0, false},
    {"fixed_count 1", SplitPolicy::kFixedCount, 1, false},
    {"fixed_count 3", SplitPolicy::kFixedCount, 3, false},
    {"fixed_size 16", SplitPolicy::kFixedSize, 16, false},
    {"layout fixed_size 48", SplitPolicy::kFixedSize, 48, true},
    {"layout fixed_count 5", SplitPolicy::kFixedCount, 5, true},
};

/// Runs the CPU decode of `p` with `v` into a NaN-poisoned output.
attnstate_test::HostState run_decode(const DecodeProblemHost& p, const Splits& sp,
                                     const AttentionVariant& v, DType out_dtype, LseBase base,
                                     float scale) {
  attnstate_test::HostState out(p.tokens(), p.cfg.heads_q, p.cfg.head_dim, out_dtype, base);
  if (sp.explicit_layout) {
    SplitLayout l;
    l.policy = sp.policy;
    std::int32_t longest = 0;
    for (std::int32_t len : p.seq_lens) longest = std::max(longest, len);
    if (sp.policy == SplitPolicy::kFixedCount) {
      l.num_splits = l.max_splits = sp.count_or_size;
    } else {
      l.split_size = sp.count_or_size;
      l.max_splits = std::max(1, (longest + sp.count_or_size - 1) / sp.count_or_size);
    }
    cpu::decode(p.q_view(), p.kv_view(), l, scale, v, out.view);
  } else {
    DecodeOptions o;
    o.scale = scale;
    o.policy = sp.policy;
    if (sp.policy == SplitPolicy::kFixedCount) o.num_splits = sp.count_or_size;
    if (sp.policy == SplitPolicy::kFixedSize) o.split_size = sp.count_or_size;
    o.variant = v;
    cpu::decode(p.q_view(), p.kv_view(), o, out.view);
  }
  return out;
}

std::string check_decode(const DecodeProblemHost& p, const Splits& sp, const AttentionVariant& v,
                         DType out_dtype, LseBase base, float scale = 0.f) {
  const float s = scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(p.cfg.head_dim));
  const attnstate_test::HostState out = run_decode(p, sp, v, out_dtype, base, scale);
  return attnstate_test::compare_decode(decode_reference(p, s, v), out.o.data(), out_dtype,
                                        out.lse.data(), base,
                                        attnstate_test::decode_tolerance(o_tol(out_dtype), 1e-5));
}

TEST(CpuVariantsDecode, EveryWindowAndCapWithEverySplitPolicy) {
  DecodeConfig cfg;
  cfg.q_len = 3;
  cfg.heads_q = 4;
  cfg.heads_kv = 2;
  cfg.head_dim = 32;
  cfg.page_size = 16;
  cfg.q_gain = 4.f;  // scores of a few units: the caps bend them
  cfg.seq_lens = {0, 1, 2, 17, 64, 130, 5};
  const DecodeProblemHost p = attnstate_test::make_decode_problem(cfg, 5);
  for (std::int64_t w : {kNoWindow, std::int64_t{0}, std::int64_t{1}, std::int64_t{5},
                         std::int64_t{37}, std::int64_t{129}, std::int64_t{1000}})
    for (float cap : {0.f, 5.f, 30.f})
      for (const Splits& sp : kSplits) {
        EXPECT_EQ(check_decode(p, sp, variant(w, cap), DType::kF32, LseBase::kNatural), "")
            << sp.name << ", " << show(variant(w, cap));
      }
}

TEST(CpuVariantsDecode, EveryDtypePageSizeAndLayout) {
  std::uint64_t seed = 100;
  for (DType in : kDtypes)
    for (DType out : kDtypes)
      for (std::int64_t page : {1, 3, 16})
        for (bool bt : {false, true}) {
          DecodeConfig cfg = attnstate_test::shape_config(
              2, 8, 2, 64, page, bt ? KvLayout::kHND : KvLayout::kNHD, bt, in, in);
          cfg.q_gain = 3.f;
          cfg.seq_lens = {40, 0, 3, 71};
          const DecodeProblemHost p = attnstate_test::make_decode_problem(cfg, seed++);
          for (const AttentionVariant& v :
               {variant(7, 0.f), variant(0, 50.f), variant(kNoWindow, 5.f), variant(20, 30.f)}) {
            const Splits& sp = kSplits[seed % 6];
            EXPECT_EQ(check_decode(p, sp, v, out, LseBase::kBase2), "")
                << cfg.name() << " out " << to_string(out) << ", " << sp.name << ", " << show(v);
          }
        }
}

TEST(CpuVariantsDecode, LongRequestWithSmallWindowOverManySplits) {
  DecodeConfig cfg = attnstate_test::shape_config(4, 8, 1, 64, 16, KvLayout::kNHD, false,
                                                  DType::kBF16, DType::kBF16);
  cfg.seq_lens = {3000, 12, 1700};
  const DecodeProblemHost p = attnstate_test::make_decode_problem(cfg, 9);
  for (std::int64_t w : {0, 3, 15, 16, 17, 100})
    for (const Splits& sp : kSplits) {
      EXPECT_EQ(check_decode(p, sp, variant(w, 0.f), DType::kF32, LseBase::kNatural), "")
          << sp.name << " window " << w;
    }
}

TEST(CpuVariantsDecode, AWindowAsLongAsTheContextIsPlainDecodeBitForBit) {
  DecodeConfig cfg;
  cfg.q_len = 2;
  cfg.seq_lens = {100, 1, 0, 33};
  const DecodeProblemHost p = attnstate_test::make_decode_problem(cfg, 21);
  for (const Splits& sp : kSplits) {
    const auto plain = run_decode(p, sp, AttentionVariant{}, DType::kF32, LseBase::kNatural, 0.f);
    for (std::int64_t w : {std::int64_t{99}, std::int64_t{100}, std::int64_t{1} << 20,
                           std::numeric_limits<std::int64_t>::max() / 2}) {
      const auto win = run_decode(p, sp, variant(w, 0.f), DType::kF32, LseBase::kNatural, 0.f);
      EXPECT_EQ(win.o, plain.o) << sp.name << " window " << w;
      EXPECT_EQ(std::memcmp(win.lse.data(), plain.lse.data(), win.lse.size() * 4), 0)
          << sp.name << " window " << w;
    }
  }
}

TEST(CpuVariantsDecode, WindowZeroSeesOnlyTheKeyAtItsPosition) {
  DecodeConfig cfg =
      attnstate_test::shape_config(3, 2, 1, 8, 3, KvLayout::kNHD, false, DType::kF32, DType::kF32);
  cfg.seq_lens = {10, 2};
  const DecodeProblemHost p = attnstate_test::make_decode_problem(cfg, 4);
  const auto out = run_decode(p, kSplits[3], variant(0, 0.f), DType::kF32, LseBase::kNatural, 0.f);
  const float scale = 1.f / std::sqrt(8.f);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t i = 0; i < cfg.q_len; ++i) {
      const std::int64_t pos = p.seq_lens[b] - cfg.q_len + i, tok = b * cfg.q_len + i;
      for (std::int64_t h = 0; h < cfg.heads_q; ++h) {
        const float lse = out.lse[tok * cfg.heads_q + h];
        if (pos < 0) {  // request 1's first row is before position 0: it sees no key
          EXPECT_EQ(lse, -INFINITY);
          continue;
        }
        double dot = 0;
        for (std::int64_t d = 0; d < 8; ++d) {
          dot += attnstate_test::get(p.q.data(), DType::kF32, (tok * cfg.heads_q + h) * 8 + d) *
                 attnstate_test::get(p.k.data(), DType::kF32, p.kv_offset(b, pos, 0) + d);
        }
        EXPECT_NEAR(lse, scale * dot, 1e-5);  // one key: lse is its score, o its value
        for (std::int64_t d = 0; d < 8; ++d) {
          EXPECT_EQ(attnstate_test::get(out.o.data(), DType::kF32, (tok * cfg.heads_q + h) * 8 + d),
                    attnstate_test::get(p.v.data(), DType::kF32, p.kv_offset(b, pos, 0) + d));
        }
      }
    }
}

TEST(CpuVariantsDecode, KeysOutsideTheWindowAreNeverRead) {
  // NaN in every key and value outside the rows' windows: a window that leaked a key, or a
  // split outside every window that was folded, would make its rows NaN.
  DecodeConfig cfg =
      attnstate_test::shape_config(2, 4, 2, 32, 3, KvLayout::kHND, true, DType::kF16, DType::kF16);
  cfg.seq_lens = {300, 90, 2};
  DecodeProblemHost p = attnstate_test::make_decode_problem(cfg, 8);
  const std::int64_t w = 10;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t t = 0; t < p.seq_lens[b] - cfg.q_len - w; ++t)
      for (std::int64_t h = 0; h < cfg.heads_kv; ++h)
        for (std::int64_t d = 0; d < cfg.head_dim; ++d) {
          attnstate_test::put(p.k, cfg.kv_dtype, p.kv_offset(b, t, h) + d, nan);
          attnstate_test::put(p.v, cfg.kv_dtype, p.kv_offset(b, t, h) + d, nan);
        }
  for (const Splits& sp : kSplits)
    for (float cap : {0.f, 30.f}) {
      EXPECT_EQ(check_decode(p, sp, variant(w, cap), DType::kF16, LseBase::kNatural), "")
          << sp.name << " cap " << cap;
    }
}

TEST(CpuVariantsDecode, RowsBeforeTheFirstKeyAreEmpty) {
  DecodeConfig cfg;
  cfg.q_len = 6;
  cfg.heads_q = 2;
  cfg.heads_kv = 1;
  cfg.head_dim = 16;
  cfg.seq_lens = {2, 0, 4};  // rows at positions < 0 see nothing, whatever the window
  const DecodeProblemHost p = attnstate_test::make_decode_problem(cfg, 12);
  for (std::int64_t w : {kNoWindow, std::int64_t{0}, std::int64_t{1}, std::int64_t{50}}) {
    const auto out = run_decode(p, kSplits[2], variant(w, 5.f), DType::kBF16, LseBase::kBase2, 0);
    int empty = 0;
    for (std::int64_t tok = 0; tok < p.tokens(); ++tok) empty += out.lse[tok * 2] == -INFINITY;
    EXPECT_EQ(empty, (6 - 2) + 6 + (6 - 4)) << w;
    EXPECT_EQ(check_decode(p, kSplits[2], variant(w, 5.f), DType::kBF16, LseBase::kBase2), "");
  }
}

TEST(CpuVariantsDecode, AHugeCapIsPlainAttentionToRounding) {
  DecodeConfig cfg;
  cfg.q_len = 2;
  cfg.q_gain = 10.f;
  cfg.q_dtype = cfg.kv_dtype = DType::kF32;
  cfg.seq_lens = {77, 300};
  const DecodeProblemHost p = attnstate_test::make_decode_problem(cfg, 31);
  for (const Splits& sp : kSplits) {
    const auto plain = run_decode(p, sp, AttentionVariant{}, DType::kF32, LseBase::kNatural, 0);
    const auto capped =
        run_decode(p, sp, variant(kNoWindow, 1e7f), DType::kF32, LseBase::kNatural, 0);
    const std::int64_t n = p.tokens() * cfg.heads_q * cfg.head_dim;
    EXPECT_LE(attnstate_test::max_abs_diff(plain.o.data(), capped.o.data(), DType::kF32, n), 1e-5)
        << sp.name;
    for (std::size_t i = 0; i < plain.lse.size(); ++i) {
      EXPECT_NEAR(capped.lse[i], plain.lse[i], 1e-5 * (1 + std::fabs(plain.lse[i])));
    }
    // ... while cap 5 changes it: the cap is applied, not ignored
    const auto small =
        run_decode(p, sp, variant(kNoWindow, 5.f), DType::kF32, LseBase::kNatural, 0);
    EXPECT_GT(attnstate_test::max_abs_diff(plain.o.data(), small.o.data(), DType::kF32, n), 1e-2);
  }
}

/// `(o, natural lse)` of the softmax of `logits` over `values`, in double.
std::pair<double, double> softmax(const std::vector<double>& logits,
                                  const std::vector<double>& values) {
  double m = -INFINITY, sum = 0, o = 0;
  for (double s : logits) m = std::max(m, s);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    sum += std::exp(logits[i] - m);
    o += std::exp(logits[i] - m) * values[i];
  }
  return {o / sum, m + std::log(sum)};
}

/// A one-request, one-head, head_dim-1 problem: q = 1, raw scores `dots`, values `vals`; the
/// cap on the scaled score and the cap on the raw score (scaled after) give different states.
struct ScalarCase {
  std::vector<float> dots = {8.f, 16.f, 24.f, -4.f};
  std::vector<float> vals = {1.f, -0.5f, 0.25f, 2.f};
  float scale = 0.25f, cap = 2.f;
  std::pair<double, double> expected(bool cap_scaled) const {
    std::vector<double> s, v(vals.begin(), vals.end());
    for (float d : dots) {
      s.push_back(cap_scaled ? cap * std::tanh(scale * static_cast<double>(d) / cap)
                             : scale * cap * std::tanh(static_cast<double>(d) / cap));
    }
    return softmax(s, v);
  }
};

TEST(CpuVariantsSoftCap, AppliesToTheScaledScoreInEveryProducer) {
  const ScalarCase c;
  const auto right = c.expected(true), wrong = c.expected(false);
  ASSERT_GT(std::fabs(right.second - wrong.second), 0.1);  // the two rules are told apart
  const std::int32_t n = static_cast<std::int32_t>(c.dots.size());
  const float one = 1.f;
  const std::vector<std::int32_t> lens = {n}, indptr = {0, 1}, pages = {0}, seg_len = {n},
                                  req = {0, 1};
  const auto check = [&](const float* o, const float* lse, const char* who) {
    EXPECT_NEAR(*o, right.first, 1e-5) << who;
    EXPECT_NEAR(*lse, right.second, 1e-5) << who;
  };
  float o = NAN, lse = NAN;
  const StateView out = make_state_view(&o, DType::kF32, &lse, 1, 1, 1, LseBase::kNatural);
  // decode: one page holding the keys
  PagedKvCache kv;
  kv.k = c.dots.data();
  kv.v = c.vals.data();
  kv.dtype = DType::kF32;
  kv.num_pages = 1;
  kv.page_size = n;
  kv.heads_kv = 1;
  kv.head_dim = 1;
  kv.page_indptr = indptr.data();
  kv.page_indices = pages.data();
  kv.seq_lens = lens.data();
  kv.batch = 1;
  const ConstTensorView q = make_tensor_view(&one, DType::kF32, {1, 1, 1, 1});
  DecodeOptions dopt;
  dopt.scale = c.scale;
  dopt.variant.logits_soft_cap = c.cap;
  cpu::decode(q, kv, dopt, out);
  check(&o, &lse, "decode");
  // cascade: one level of one segment
  o = lse = NAN;
  CascadeLevel lv;
  lv.num_segments = 1;
  lv.request_indptr = req.data();
  lv.page_indptr = indptr.data();
  lv.page_indices = pages.data();
  lv.seg_lens = seg_len.data();
  CascadeOptions copt;
  copt.scale = c.scale;
  copt.variant.logits_soft_cap = c.cap;
  cpu::cascade_attention(q, kv, &lv, 1, copt, out);
  check(&o, &lse, "cascade");
  // attention_state
  o = lse = NAN;
  cpu::attention_state(make_tensor_view(&one, DType::kF32, {1, 1, 1}),
                       make_tensor_view(c.dots.data(), DType::kF32, {n, 1, 1}),
                       make_tensor_view(c.vals.data(), DType::kF32, {n, 1, 1}), c.scale,
                       variant(kNoWindow, c.cap), out);
  check(&o, &lse, "attention_state");
}

TEST(CpuVariantsSoftCap, AttentionStateMatchesTheReference) {
  for (DType in : kDtypes)
    for (DType out_dtype : kDtypes)
      for (float cap : {5.f, 30.f, 50.f}) {
        std::mt19937_64 rng(static_cast<std::uint64_t>(cap) * 7 + static_cast<int>(in));
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        const std::int64_t tokens = 3, hq = 4, hkv = 2, dim = 16, keys = 150;
        std::vector<float> q(tokens * hq * dim), k(keys * hkv * dim), v(k.size());
        for (float& x : q) x = 20.f * u(rng);  // scores up to ~80: large logits capped
        for (float& x : k) x = u(rng);
        for (float& x : v) x = u(rng);
        kit::AttentionProblem p = kit::make_problem(tokens, hq, hkv, dim, keys, in, q, k, v, 0.25f,
                                                    out_dtype, LseBase::kBase2);
        p.variant.logits_soft_cap = cap;
        kit::HostState s = kit::make_output_state(p);
        cpu::attention_state(p.q.view(), p.k.view(), p.v.view(), p.scale, p.variant, s.view());
        const std::string msg = kit::compare_states(s, kit::reference_state(p, kit::all_keys(keys)),
                                                    kit::tolerance_for(p));
        EXPECT_EQ(msg, "") << to_string(in) << " -> " << to_string(out_dtype) << " cap " << cap;
      }
}

/// Spec of a three-level cascade of 6 requests: a prefix shared by all, a middle level shared by
/// pairs (one of its segments empty), ragged own suffixes; pool slots of no key are NaN.
CaseSpec three_levels(int q_len, bool causal, DType dtype, int page, std::uint64_t seed) {
  CaseSpec s;
  s.q_len = q_len;
  s.causal = causal;
  s.dtype = dtype;
  s.page_size = page;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim = 32;
  s.q_amp = 3.f;
  s.seed = seed;
  s.nan_outside = true;
  s.levels.push_back({SegmentSpec{6, 40}});
  s.levels.push_back({SegmentSpec{2, 9}, SegmentSpec{2, 0}, SegmentSpec{2, 25}});
  std::vector<SegmentSpec> own;
  for (int len : {q_len - 1, 3, 30, 70, 8, 100}) own.push_back(SegmentSpec{1, std::max(len, 0)});
  if (!causal) own[0].len = 0;
  s.levels.push_back(own);
  return s;
}

std::string check_cascade(const CascadeCase& c, const AttentionVariant& v, DType out_dtype) {
  attnstate_test::HostState out(c.tokens(), c.spec.heads_q, c.spec.head_dim, out_dtype,
                                LseBase::kNatural);
  CascadeOptions o = c.options();
  o.variant = v;
  const auto levels = c.host_levels();
  cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                         c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost), levels.data(),
                         static_cast<int>(levels.size()), o, out.view);
  return attnstate_test::compare_decode(cascade_reference(c, v), out.o.data(), out_dtype,
                                        out.lse.data(), LseBase::kNatural,
                                        attnstate_test::decode_tolerance(o_tol(out_dtype), 1e-5));
}

TEST(CpuVariantsCascade, WindowsAcrossLevelsAndCaps) {
  std::uint64_t seed = 1;
  for (int q_len : {1, 3})
    for (bool causal : {true, false})
      for (int page : {1, 3, 16}) {
        const CascadeCase c(three_levels(q_len, causal, DType::kBF16, page, seed++));
        for (std::int64_t w : {kNoWindow, std::int64_t{0}, std::int64_t{1}, std::int64_t{7},
                               std::int64_t{30}, std::int64_t{60}, std::int64_t{1000}})
          for (float cap : {0.f, 5.f, 50.f}) {
            EXPECT_EQ(check_cascade(c, variant(w, cap), DType::kF32), "")
                << "q_len " << q_len << (causal ? " causal" : " full") << " page " << page << ", "
                << show(variant(w, cap));
          }
      }
}

TEST(CpuVariantsCascade, EveryDtype) {
  std::uint64_t seed = 50;
  for (DType in : kDtypes)
    for (DType out : kDtypes) {
      const CascadeCase c(three_levels(2, true, in, 3, seed++));
      for (const AttentionVariant& v : {variant(12, 0.f), variant(45, 30.f), variant(0, 5.f)}) {
        EXPECT_EQ(check_cascade(c, v, out), "")
            << to_string(in) << " -> " << to_string(out) << ", " << show(v);
      }
    }
}

TEST(CpuVariantsCascade, ASharedLevelOutsideEveryWindowIsNeverRead) {
  // Level 0 (shared by all) holds NaN keys; every request's own suffix is longer than the window
  // plus q_len, so no row sees the shared level: it must contribute the empty state unread.
  CaseSpec s;
  s.q_len = 2;
  s.heads_q = 2;
  s.heads_kv = 1;
  s.head_dim = 16;
  s.page_size = 4;
  s.dtype = DType::kF32;
  s.nan_key = 0;
  s.levels.push_back({SegmentSpec{3, 30}});
  s.levels.push_back({SegmentSpec{1, 20}, SegmentSpec{1, 12}, SegmentSpec{1, 40}});
  const CascadeCase c(s);
  EXPECT_EQ(check_cascade(c, variant(10, 0.f), DType::kF32), "");
  EXPECT_EQ(check_cascade(c, variant(10, 30.f), DType::kF32), "");
  // a window reaching into the shared level of request 1 (suffix 12: row 0 at position 40 sees
  // back to 29, the prefix's last key) reads the NaN key only where the reference does: key 0
  // is outside, so every row stays finite
  EXPECT_EQ(check_cascade(c, variant(11, 0.f), DType::kF32), "");
  // and a window over the whole prefix makes request 1's rows NaN, as the reference says
  attnstate_test::HostState out(c.tokens(), 2, 16, DType::kF32, LseBase::kNatural);
  CascadeOptions o = c.options();
  o.variant.window_left = 45;
  const auto levels = c.host_levels();
  cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                         c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost), levels.data(),
                         2, o, out.view);
  EXPECT_TRUE(std::isnan(out.lse[1 * 2 * 2]));  // request 1, row 0, head 0 reaches key 0
  EXPECT_EQ(check_cascade(c, variant(45, 0.f), DType::kF32), "");
}

TEST(CpuVariantsArgs, BadVariantsAreNamed) {
  DecodeConfig cfg;
  cfg.seq_lens = {5};
  const DecodeProblemHost p = attnstate_test::make_decode_problem(cfg, 1);
  attnstate_test::HostState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32,
                                LseBase::kNatural);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const AttentionVariant bad_windows[] = {variant(-2, 0.f), variant(-100, 0.f)};
  const AttentionVariant bad_caps[] = {variant(kNoWindow, -1.f), variant(3, inf), variant(3, -inf),
                                       variant(kNoWindow, nan)};
  SplitLayout layout;
  layout.policy = SplitPolicy::kFixedCount;
  layout.num_splits = layout.max_splits = 1;
  const auto decode_opt = [&](const AttentionVariant& v) {
    DecodeOptions o;
    o.variant = v;
    cpu::decode(p.q_view(), p.kv_view(), o, out.view);
  };
  const auto decode_layout = [&](const AttentionVariant& v) {
    cpu::decode(p.q_view(), p.kv_view(), layout, 0.f, v, out.view);
  };
  for (const AttentionVariant& v : bad_windows) {
    attnstate::test::expect_arg_error([&] { decode_opt(v); }, "options.variant.window_left");
    attnstate::test::expect_arg_error([&] { decode_layout(v); }, "variant.window_left");
  }
  for (const AttentionVariant& v : bad_caps) {
    attnstate::test::expect_arg_error([&] { decode_opt(v); }, "options.variant.logits_soft_cap");
    attnstate::test::expect_arg_error([&] { decode_layout(v); }, "variant.logits_soft_cap");
  }

  const CascadeCase c(three_levels(1, true, DType::kBF16, 16, 3));
  const auto levels = c.host_levels();
  attnstate_test::HostState cout(c.tokens(), c.spec.heads_q, c.spec.head_dim, DType::kF32,
                                 LseBase::kNatural);
  const auto cascade = [&](const AttentionVariant& v) {
    CascadeOptions o = c.options();
    o.variant = v;
    cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                           c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost),
                           levels.data(), static_cast<int>(levels.size()), o, cout.view);
  };
  for (const AttentionVariant& v : bad_windows)
    attnstate::test::expect_arg_error([&] { cascade(v); }, "options.variant.window_left");
  for (const AttentionVariant& v : bad_caps)
    attnstate::test::expect_arg_error([&] { cascade(v); }, "options.variant.logits_soft_cap");

  kit::AttentionProblem ap =
      kit::make_problem(1, 1, 1, 2, 3, DType::kF32, {1, 2}, {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6},
                        1.f, DType::kF32, LseBase::kNatural);
  kit::HostState s = kit::make_output_state(ap);
  const auto attend = [&](const AttentionVariant& v) {
    cpu::attention_state(ap.q.view(), ap.k.view(), ap.v.view(), 1.f, v, s.view());
  };
  // a window needs positions, which attention_state has not: rejected, even 0 or huge
  for (std::int64_t w : {std::int64_t{0}, std::int64_t{5}, std::int64_t{1} << 40, std::int64_t{-2}})
    attnstate::test::expect_arg_error([&] { attend(variant(w, 0.f)); }, "variant.window_left");
  for (const AttentionVariant& v : bad_caps) {
    AttentionVariant no_window = v;
    no_window.window_left = kNoWindow;
    attnstate::test::expect_arg_error([&] { attend(no_window); }, "variant.logits_soft_cap");
  }
  // nothing was written by the rejected calls
  EXPECT_TRUE(std::isnan(s.lse(0, 0)));
}

}  // namespace
