/// @file test_cpu_mla_cascade.cpp
/// @brief CPU MLA cascade (`cpu::mla_cascade`) against the one-pass MLA decode over each request's
///        concatenated keys (`cpu::mla_decode`) and the testing kit's double reference: 2 and 3
///        levels, 16 and 128 heads, q_len 1..4, pages of 1, 16 and 64 tokens, bf16 and fp8
///        caches, sinks, empty segments, without causal masking; argument errors naming the
///        argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/cpu/mla.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/mla.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "cpu_test_utils.hpp"
#include "mla_cascade_problem.hpp"
#include "random_sinks.hpp"
#include "split_layouts.hpp"

namespace {

using namespace attnstate;
using attnstate::testing::HostState;
using attnstate_test::make_mla_cascade_host;
using attnstate_test::MlaCascadeConfig;
using attnstate_test::MlaCascadeHost;
using attnstate_test::MlaSegment;

/// An output for `h`, poisoned with NaN (an unwritten value fails every comparison).
HostState poisoned(const MlaCascadeHost& h, DType dtype, LseBase base) {
  HostState out(h.tokens(), h.cfg.mla.heads, h.cfg.mla.kv_lora_rank, dtype, base);
  out.poison();
  return out;
}

CascadeOptions options_of(const MlaCascadeHost& h) {
  CascadeOptions o;
  o.scale = h.problem().scale;
  o.causal = h.cfg.causal;
  return o;
}

/// Runs the cascade of `h` into `out` (its own dtype and base).
void run_cascade(const MlaCascadeHost& h, HostState& out) {
  const std::vector<CascadeLevel> lv = h.levels();
  cpu::mla_cascade(h.keys.q_nope_view(), h.keys.q_pe_view(), h.pool_view(), lv.data(),
                   static_cast<int>(lv.size()), options_of(h), h.problem().attention_sinks(),
                   out.view());
}

/// The cascade of `h` against the kit's reference at the tolerance for fp32 probabilities, and
/// against the one-pass decode over the concatenated keys (fp32 states of both: equal to fp32
/// rounding, the levels' merge being the only difference): "" when both match.
std::string check(const MlaCascadeHost& h, DType out_dtype, LseBase base) {
  HostState out = poisoned(h, out_dtype, base);
  run_cascade(h, out);
  attnstate::testing::MlaProblem p = h.problem();
  p.out_dtype = out_dtype;
  p.base = base;
  std::string diff = attnstate::testing::compare_states(
      out, h.reference(base), attnstate::testing::tolerance_for(p, false));
  if (!diff.empty()) return "reference: " + diff;
  if (!h.cfg.causal) return "";  // the decode is causal: the reference alone checks this case
  HostState cas = poisoned(h, DType::kF32, base);
  HostState dec = poisoned(h, DType::kF32, base);
  run_cascade(h, cas);
  cpu::mla_decode(h.keys.q_nope_view(), h.keys.q_pe_view(), h.concat_view(),
                  attnstate_test::fixed_count(1), h.problem().scale, h.problem().attention_sinks(),
                  dec.view());
  for (std::int64_t t = 0; t < h.tokens(); ++t)
    for (std::int64_t hd = 0; hd < h.cfg.mla.heads; ++hd) {
      const float la = cas.lse(t, hd), lb = dec.lse(t, hd);
      if (!(la == lb || std::fabs(la - lb) <= 1e-5f * (1.f + std::fabs(lb))))
        return "decode: lse of token " + std::to_string(t) + " head " + std::to_string(hd) + ": " +
               std::to_string(la) + " vs " + std::to_string(lb);
      for (std::int64_t d = 0; d < h.cfg.mla.kv_lora_rank; ++d) {
        const float a = cas.o(t, hd, d), b = dec.o(t, hd, d);
        if (!(std::fabs(a - b) <= 2e-5f * (1.f + std::fabs(b))))
          return "decode: o of token " + std::to_string(t) + " head " + std::to_string(hd) +
                 " column " + std::to_string(d) + ": " + std::to_string(a) + " vs " +
                 std::to_string(b);
      }
    }
  return "";
}

MlaCascadeConfig config(std::int64_t q_len, std::int64_t heads, std::int64_t page,
                        std::vector<std::vector<MlaSegment>> levels) {
  MlaCascadeConfig c;
  c.mla.q_len = q_len;
  c.mla.heads = heads;
  c.mla.page_size = page;
  c.levels = std::move(levels);
  return c;
}

TEST(MlaCascadeCpu, EqualsTheDecodeOverTheConcatenatedKeys) {
  struct Case {
    std::int64_t q_len, heads, page;
    DType ckv, kpe, out;
    LseBase base;
    bool sinks;
    std::vector<std::vector<MlaSegment>> levels;
  };
  const DType bf = DType::kBF16, f32 = DType::kF32, e4 = DType::kE4M3, e5 = DType::kE5M2;
  const LseBase ln = LseBase::kNatural, b2 = LseBase::kBase2;
  // clang-format off
  const Case cases[] = {
      // 2 levels: one prefix shared by all requests, then each request's own suffix
      {1, 16, 16, bf, bf, f32, ln, false, {{{6, 100}}, {{1, 5}, {1, 17}, {1, 1}, {1, 40}, {1, 3}, {1, 16}}}},
      {2, 16, 1, bf, bf, bf, b2, true, {{{5, 37}}, {{1, 2}, {1, 9}, {1, 1}, {1, 30}, {1, 4}}}},
      {3, 16, 64, e4, bf, f32, b2, false, {{{4, 130}}, {{1, 70}, {1, 2}, {1, 64}, {1, 3}}}},
      {4, 16, 16, e5, e5, f32, ln, true, {{{3, 33}}, {{1, 3}, {1, 20}, {1, 5}}}},
      {1, 128, 64, bf, bf, f32, b2, true, {{{3, 65}}, {{1, 1}, {1, 80}, {1, 7}}}},
      {2, 128, 16, e4, e4, bf, ln, false, {{{2, 50}}, {{1, 1}, {1, 18}}}},
      // 3 levels: a system prompt, two conversations, then the requests' suffixes; empty
      // segments (an empty prefix, an empty conversation, an empty suffix at q_len 1)
      {1, 16, 16, bf, bf, f32, ln, true, {{{7, 48}}, {{4, 0}, {3, 29}}, {{1, 4}, {1, 0}, {1, 9}, {1, 1}, {1, 2}, {1, 0}, {1, 33}}}},
      {2, 16, 64, e4, bf, f32, b2, false, {{{5, 0}}, {{2, 77}, {3, 64}}, {{1, 1}, {1, 2}, {1, 65}, {1, 3}, {1, 1}}}},
      {4, 128, 1, bf, bf, bf, b2, true, {{{2, 21}}, {{1, 0}, {1, 13}}, {{1, 3}, {1, 6}}}},
      {3, 16, 16, e5, e5, f32, ln, false, {{{6, 17}}, {{3, 40}, {3, 1}}, {{2, 2}, {1, 5}, {3, 16}}}},
  };
  // clang-format on
  std::uint64_t seed = 100;
  for (const Case& c : cases) {
    MlaCascadeConfig cfg = config(c.q_len, c.heads, c.page, c.levels);
    cfg.mla.ckv_dtype = c.ckv;
    cfg.mla.kpe_dtype = c.kpe;
    if (is_fp8(c.ckv)) {
      cfg.mla.kv_amp = c.ckv == e4 ? 224.f : 2.f;
      cfg.mla.ckv_scale = 0x1p-7f;
      cfg.mla.kpe_scale = 0.37f;
      cfg.mla.scale_pointer = seed % 2 == 0;
    }
    MlaCascadeHost h = make_mla_cascade_host(cfg, seed);
    if (c.sinks) h.keys.problem.sinks = attnstate_test::random_sinks(c.heads, -4.f, 8.f, seed);
    ++seed;
    EXPECT_EQ(check(h, c.out, c.base), "") << cfg.name();
  }
}

TEST(MlaCascadeCpu, WithoutCausalMaskingEveryRowSeesEveryKey) {
  MlaCascadeConfig cfg = config(3, 16, 16, {{{4, 40}}, {{2, 0}, {1, 1}, {1, 25}}});
  cfg.causal = false;
  const MlaCascadeHost h = make_mla_cascade_host(cfg, 7);
  EXPECT_EQ(check(h, DType::kF32, LseBase::kNatural), "") << cfg.name();
}

TEST(MlaCascadeCpu, RequestsWithoutKeysAreTheIdentityOrTheSink) {
  // request 1 has no key at any level: (0, -inf) without sinks, (0, sink) with them
  MlaCascadeConfig cfg = config(1, 16, 16, {{{1, 20}, {1, 0}}, {{1, 3}, {1, 0}}});
  MlaCascadeHost h = make_mla_cascade_host(cfg, 8);
  for (const bool sinks : {false, true}) {
    if (sinks) h.keys.problem.sinks = attnstate_test::random_sinks(16, -4.f, 8.f, 3);
    HostState out = poisoned(h, DType::kF32, LseBase::kNatural);
    run_cascade(h, out);
    for (std::int64_t hd = 0; hd < 16; ++hd) {
      const float want = sinks ? h.problem().sinks[static_cast<std::size_t>(hd)] : -INFINITY;
      EXPECT_EQ(out.lse(1, hd), want) << hd;
      EXPECT_EQ(out.o(1, hd, 0), 0.f) << hd;
    }
    EXPECT_EQ(check(h, DType::kF32, LseBase::kNatural), "");
  }
}

TEST(MlaCascadeCpu, ScaleZeroMeansOneOverSqrtKeyWidth) {
  const MlaCascadeHost h =
      make_mla_cascade_host(config(1, 16, 16, {{{2, 30}}, {{1, 3}, {1, 9}}}), 9);
  const std::vector<CascadeLevel> lv = h.levels();
  HostState a = poisoned(h, DType::kF32, LseBase::kNatural);
  HostState b = poisoned(h, DType::kF32, LseBase::kNatural);
  CascadeOptions o;
  cpu::mla_cascade(h.keys.q_nope_view(), h.keys.q_pe_view(), h.pool_view(), lv.data(), 2, o,
                   a.view());
  o.scale = 1.f / 24.f;
  cpu::mla_cascade(h.keys.q_nope_view(), h.keys.q_pe_view(), h.pool_view(), lv.data(), 2, o,
                   b.view());
  EXPECT_EQ(attnstate::testing::compare_bitwise(a, b), "");
}

// --- argument errors: each names the argument -------------------------------------------------

/// Expects `f` to throw an `Error` of `status` naming `arg` (`expect_arg_error`), raised by
/// `cpu::mla_cascade` itself.
template <class F>
void expect_names(F&& f, const std::string& arg, Status status = Status::kInvalidArgument) {
  attnstate::test::expect_arg_error(
      [&] {
        try {
          f();
        } catch (const Error& e) {
          EXPECT_EQ(std::string(e.what()).rfind("attnstate::cpu::mla_cascade", 0), 0u) << e.what();
          throw;
        }
      },
      arg, status);
}

TEST(MlaCascadeCpu, ArgumentErrorsNameTheArgument) {
  MlaCascadeConfig cfg = config(2, 16, 16, {{{2, 30}}, {{1, 3}, {1, 9}}});
  cfg.mla.kv_lora_rank = 32;
  cfg.mla.rope_dim = 8;
  MlaCascadeHost h = make_mla_cascade_host(cfg, 10);
  HostState out(h.tokens(), 16, 32, DType::kF32, LseBase::kNatural);
  const auto run = [&](std::vector<CascadeLevel> lv, int n, CascadeOptions o, const MlaKvCache& kv,
                       StateView v, const AttentionSinks& s) {
    cpu::mla_cascade(h.keys.q_nope_view(), h.keys.q_pe_view(), kv, lv.data(), n, o, s, v);
  };
  const CascadeOptions opt = options_of(h);
  const MlaKvCache kv = h.pool_view();
  expect_names([&] { run(h.levels(), 0, opt, kv, out.view(), {}); }, "num_levels");
  expect_names(
      [&] {
        cpu::mla_cascade(h.keys.q_nope_view(), h.keys.q_pe_view(), kv, nullptr, 2, opt, out.view());
      },
      "levels");
  {
    auto bad = h.arrays;
    bad[1].request_indptr.back() = 1;
    MlaCascadeHost hb = h;
    hb.arrays = bad;
    expect_names([&] { run(hb.levels(), 2, opt, kv, out.view(), {}); }, "levels[1].request_indptr");
  }
  {
    MlaCascadeHost hb = h;
    hb.arrays[0].page_indices[0] = static_cast<std::int32_t>(h.num_pages);
    expect_names([&] { run(hb.levels(), 2, opt, kv, out.view(), {}); }, "levels[0].page_indices");
  }
  {
    MlaCascadeHost hb = h;
    hb.arrays[1].seg_lens[0] = 0;  // q_len 2, causal: the last level needs >= 1 token
    expect_names([&] { run(hb.levels(), 2, opt, kv, out.view(), {}); }, "levels[1].seg_lens");
    hb.arrays[1].seg_lens[0] = 17;  // more than its one page
    expect_names([&] { run(hb.levels(), 2, opt, kv, out.view(), {}); }, "levels[1].seg_lens");
  }
  CascadeOptions win = opt;
  win.variant.window_left = 8;
  expect_names([&] { run(h.levels(), 2, win, kv, out.view(), {}); }, "options.variant",
               Status::kNotSupported);
  CascadeOptions nan_scale = opt;
  nan_scale.scale = NAN;
  expect_names([&] { run(h.levels(), 2, nan_scale, kv, out.view(), {}); }, "options.scale");
  HostState wide(h.tokens(), 16, 40, DType::kF32, LseBase::kNatural);
  expect_names([&] { run(h.levels(), 2, opt, kv, wide.view(), {}); }, "out.head_dim");
  MlaKvCache fp8_scaled = kv;
  fp8_scaled.ckv_scale = KvScale::per_tensor(2.f);  // a scale on a bf16 part
  expect_names([&] { run(h.levels(), 2, opt, fp8_scaled, out.view(), {}); }, "kv.ckv_scale");
  std::vector<float> logits(16, 0.f);
  logits[3] = INFINITY;
  expect_names([&] { run(h.levels(), 2, opt, kv, out.view(), AttentionSinks{logits.data()}); },
               "sinks.logits[3]");
  // the levels' arrays are inputs: an output over them is refused
  std::vector<float> lse_over(static_cast<std::size_t>(h.tokens() * 16));
  MlaCascadeHost ho = h;
  StateView over = out.view();
  over.lse = reinterpret_cast<float*>(ho.arrays[0].seg_lens.data());
  expect_names([&] { run(ho.levels(), 2, opt, kv, over, {}); }, "out.lse");
}

}  // namespace
