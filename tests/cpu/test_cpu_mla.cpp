/// @file test_cpu_mla.cpp
/// @brief CPU MLA decode against the testing kit's double reference: cache dtypes (bf16, f16, f32,
///        fp8 with bf16 or fp8 rope), page sizes, CSR and block tables, q_len 1..4, 16 and 128
///        heads, both LSE bases; split layouts and key shards merged with `merge_states` against
///        the one-pass state; sinks folded once; the two peer layouts of the cache; argument
///        errors naming the argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attnstate/core/context_parallel.hpp"
#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/cpu/context_parallel.hpp"
#include "attnstate/cpu/merge.hpp"
#include "attnstate/cpu/mla.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/mla.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "mla_kit_kernel.hpp"
#include "mla_problem.hpp"
#include "split_layouts.hpp"

namespace {

using attnstate_test::fixed_count;
using attnstate_test::fixed_size;

using namespace attnstate;
using attnstate::testing::HostState;
using attnstate_test::make_mla_host;
using attnstate_test::MlaConfig;
using attnstate_test::MlaHost;

/// An output for `h`, poisoned with NaN (an unwritten value fails every comparison).
HostState poisoned(const MlaHost& h, DType dtype, LseBase base) {
  HostState out(h.tokens(), h.cfg.heads, h.cfg.kv_lora_rank, dtype, base);
  out.poison();
  return out;
}

/// Runs the MLA decode of `h` with `layout` and compares it with the kit's reference (sinks of
/// `h.problem` included) at the kit's tolerance for fp32 probabilities: "" when it matches.
std::string run_and_compare(const MlaHost& h, const SplitLayout& layout, DType out_dtype,
                            LseBase base, bool one_pool = false, HostState* keep = nullptr) {
  HostState out = poisoned(h, out_dtype, base);
  cpu::mla_decode(h.q_nope_view(), h.q_pe_view(), h.kv_view(one_pool), layout, h.problem.scale,
                  h.problem.attention_sinks(), out.view());
  attnstate::testing::MlaProblem p = h.problem;
  p.out_dtype = out_dtype;
  p.base = base;
  const std::string diff = attnstate::testing::compare_states(
      out, h.reference(base), attnstate::testing::tolerance_for(p, false));
  if (keep) *keep = out;
  return diff;
}

TEST(MlaCpu, MatchesReferenceAcrossDtypesPagesAndTables) {
  struct Case {
    DType ckv, kpe, q, out;
    std::int64_t page, q_len, heads;
    bool bt;
    LseBase base;
  };
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const DType e4 = DType::kE4M3, e5 = DType::kE5M2;
  const LseBase ln = LseBase::kNatural, b2 = LseBase::kBase2;
  const Case cases[] = {
      {bf, bf, bf, f32, 16, 1, 16, false, ln},   {bf, bf, bf, bf, 64, 2, 16, true, b2},
      {f16, f16, f16, f16, 1, 3, 16, false, b2}, {f32, f32, f32, f32, 7, 4, 16, true, ln},
      {e4, bf, bf, f32, 64, 1, 16, true, ln},    {e4, e4, bf, bf, 16, 2, 16, false, b2},
      {e5, e5, f16, f32, 33, 3, 16, false, ln},  {e4, bf, bf, f32, 1, 4, 16, true, b2},
      {bf, bf, bf, f32, 16, 1, 128, true, b2},   {e4, bf, bf, bf, 64, 2, 128, false, ln},
  };
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    MlaConfig cfg;
    cfg.q_dtype = c.q;
    cfg.ckv_dtype = c.ckv;
    cfg.kpe_dtype = c.kpe;
    cfg.page_size = c.page;
    cfg.q_len = c.q_len;
    cfg.heads = c.heads;
    cfg.block_table = c.bt;
    if (is_fp8(c.ckv)) {
      cfg.kv_amp = c.ckv == e4 ? 224.f : 2.f;
      cfg.ckv_scale = 0x1p-7f;
      cfg.kpe_scale = 0.37f;
      cfg.scale_pointer = seed % 2 == 0;
    }
    // lengths: empty, shorter than q_len, a page ± 1, a few pages
    cfg.seq_lens = {0, 2, static_cast<std::int32_t>(c.page + 1), 45};
    if (c.heads > 16) cfg.seq_lens = {static_cast<std::int32_t>(c.page), 19};
    const MlaHost h = make_mla_host(cfg, seed++);
    for (const SplitLayout& l : {fixed_count(1), fixed_count(3), fixed_size(16, 3)}) {
      EXPECT_EQ(run_and_compare(h, l, c.out, c.base), "")
          << cfg.name() << " splits " << l.num_splits << "/" << l.split_size;
    }
  }
}

TEST(MlaCpu, LargeLogitsAndSmallWidths) {
  // scores in the hundreds (max subtraction), and widths other than 512/64
  const std::vector<std::pair<std::int64_t, std::int64_t>> widths = {{512, 64}, {32, 8}};
  for (const auto& [rank, rope] : widths) {
    MlaConfig cfg;
    cfg.kv_lora_rank = rank;
    cfg.rope_dim = rope;
    cfg.q_dtype = DType::kF32;
    cfg.ckv_dtype = cfg.kpe_dtype = DType::kF32;
    cfg.q_gain = 40.f;
    cfg.q_len = 2;
    cfg.seq_lens = {70, 33};
    const MlaHost h = make_mla_host(cfg, 5);
    for (int n : {1, 4})
      EXPECT_EQ(run_and_compare(h, fixed_count(n), DType::kF32, LseBase::kNatural), "")
          << cfg.name() << " splits " << n;
  }
}

TEST(MlaCpu, EmptyRowsAreTheIdentity) {
  MlaConfig cfg;
  cfg.q_len = 3;
  cfg.heads = 2;
  cfg.seq_lens = {0, 1, 2};
  const MlaHost h = make_mla_host(cfg, 9);
  HostState out;
  EXPECT_EQ(run_and_compare(h, fixed_count(2), DType::kF32, LseBase::kNatural, false, &out), "");
  // request 0 (empty): every row (0, -inf); request 1 (len 1): rows 0, 1 empty, row 2 not
  for (std::int64_t hd = 0; hd < cfg.heads; ++hd) {
    for (std::int64_t t : {0, 1, 2, 3, 4}) {
      EXPECT_EQ(out.lse(t, hd), -INFINITY) << t;
      EXPECT_EQ(out.o(t, hd, 0), 0.f) << t;
    }
    EXPECT_TRUE(std::isfinite(out.lse(5, hd)));
  }
}

TEST(MlaCpu, TheTwoPeerLayoutsGiveTheSameBits) {
  // FlashInfer's two pools and FlashMLA's one interleaved pool (here with an fp8 latent part and a
  // bf16 rotary part in one row of 512 + 128 bytes) are views of one cache: the same arithmetic
  for (const DType ckv : {DType::kBF16, DType::kE4M3}) {
    MlaConfig cfg;
    cfg.ckv_dtype = ckv;
    cfg.kpe_dtype = DType::kBF16;
    cfg.q_len = 2;
    cfg.page_size = 64;
    cfg.block_table = true;
    if (is_fp8(ckv)) cfg.ckv_scale = 0.5f;
    cfg.seq_lens = {130, 3, 64};
    const MlaHost h = make_mla_host(cfg, 21);
    HostState a, b;
    EXPECT_EQ(run_and_compare(h, fixed_count(2), DType::kBF16, LseBase::kBase2, false, &a), "");
    EXPECT_EQ(run_and_compare(h, fixed_count(2), DType::kBF16, LseBase::kBase2, true, &b), "");
    EXPECT_EQ(attnstate::testing::compare_bitwise(a, b), "") << cfg.name();
  }
}

TEST(MlaCpu, SplitLayoutsEqualOneSplitToRounding) {
  MlaConfig cfg;
  cfg.q_dtype = DType::kF32;
  cfg.q_len = 2;
  cfg.seq_lens = {200, 17, 64, 1};
  const MlaHost h = make_mla_host(cfg, 4);
  HostState one, split;
  ASSERT_EQ(run_and_compare(h, fixed_count(1), DType::kF32, LseBase::kNatural, false, &one), "");
  for (const SplitLayout& l : {fixed_count(2), fixed_count(7), fixed_size(16, 13)}) {
    ASSERT_EQ(run_and_compare(h, l, DType::kF32, LseBase::kNatural, false, &split), "");
    EXPECT_EQ(attnstate::testing::compare_states(
                  split, one, attnstate::testing::Tolerance::absolute(1e-5, 1e-5, 1e-6)),
              "")
        << l.num_splits << "/" << l.split_size;
  }
}

TEST(MlaCpu, DecodeOptionsOverloadPlansTheSplits) {
  MlaConfig cfg;
  cfg.q_len = 4;
  cfg.seq_lens = {300, 5};
  MlaHost h = make_mla_host(cfg, 8);
  h.problem.sinks.assign(static_cast<std::size_t>(cfg.heads), 0.f);
  for (std::size_t i = 0; i < h.problem.sinks.size(); ++i)
    h.problem.sinks[i] = static_cast<float>(i) - 4.f;  // some dominate, some barely count
  for (const SplitPolicy policy : {SplitPolicy::kAuto, SplitPolicy::kFixedSize}) {
    DecodeOptions o;
    o.policy = policy;
    o.split_size = 32;
    o.scale = h.problem.scale;
    HostState out = poisoned(h, DType::kF32, LseBase::kBase2);
    cpu::mla_decode(h.q_nope_view(), h.q_pe_view(), h.kv_view(), o, h.problem.attention_sinks(),
                    out.view());
    attnstate::testing::MlaProblem p = h.problem;
    p.base = LseBase::kBase2;
    EXPECT_EQ(attnstate::testing::compare_states(out, h.reference(LseBase::kBase2),
                                                 attnstate::testing::tolerance_for(p, false)),
              "");
  }
  // scale 0 means 1/sqrt(kv_lora_rank + rope_dim)
  DecodeOptions o;
  HostState a = poisoned(h, DType::kF32, LseBase::kNatural);
  HostState b = poisoned(h, DType::kF32, LseBase::kNatural);
  cpu::mla_decode(h.q_nope_view(), h.q_pe_view(), h.kv_view(), o, a.view());
  o.scale = 1.f / 24.f;
  cpu::mla_decode(h.q_nope_view(), h.q_pe_view(), h.kv_view(), o, b.view());
  EXPECT_EQ(attnstate::testing::compare_bitwise(a, b), "");
}

/// The cache of `h` restricted to each request's tokens `[begin_b, end_b)` (page-aligned begins):
/// a block table of those pages, lengths `end_b - begin_b`.
struct Shard {
  std::vector<std::int32_t> table, lens;
  std::int64_t stride = 1;
  MlaKvCache view(const MlaHost& h) const {
    MlaKvCache kv = h.kv_view();
    kv.page_indptr = nullptr;
    kv.page_indices = nullptr;
    kv.block_table = table.data();
    kv.block_table_stride = stride;
    kv.seq_lens = lens.data();
    return kv;
  }
};

Shard make_shard(const MlaHost& h, const std::vector<std::int32_t>& begin,
                 const std::vector<std::int32_t>& end) {
  Shard s;
  const std::int64_t P = h.cfg.page_size;
  for (std::int64_t b = 0; b < h.batch; ++b)
    s.stride = std::max<std::int64_t>(s.stride, (end[b] - begin[b] + P - 1) / P);
  s.table.assign(static_cast<std::size_t>(h.batch * s.stride), 0);
  for (std::int64_t b = 0; b < h.batch; ++b) {
    s.lens.push_back(end[b] - begin[b]);
    for (std::int64_t p = 0; p * P < end[b] - begin[b]; ++p)
      s.table[b * s.stride + p] = static_cast<std::int32_t>(h.page(b, begin[b] / P + p));
  }
  return s;
}

TEST(MlaCpu, KeyShardsMergedWithMergeStatesEqualTheOnePassState) {
  // Each request's keys cut at page boundaries into three shards (as context parallelism cuts
  // them across GPUs); every shard's state is sink-free, merged with merge_states, then the sink
  // merged once: equal to the one-pass state with sinks, to rounding. One new token per request:
  // a shard's call applies the causal rule to its own length, so with q_len > 1 its first rows
  // would miss its last keys (the split layouts inside one call cover q_len > 1).
  for (const std::int64_t q_len : {1}) {
    MlaConfig cfg;
    cfg.q_dtype = DType::kF32;
    cfg.q_len = q_len;
    cfg.page_size = 16;
    cfg.seq_lens = {100, 40, 3};
    MlaHost h = make_mla_host(cfg, 30 + q_len);
    std::vector<float> sinks(static_cast<std::size_t>(cfg.heads));
    for (std::size_t i = 0; i < sinks.size(); ++i) sinks[i] = 0.5f * static_cast<float>(i) - 2.f;
    // cuts at page multiples
    const std::vector<std::int32_t> c0 = {0, 0, 0}, c1 = {32, 16, 0}, c2 = {64, 32, 0};
    const std::vector<std::int32_t> c3 = {100, 40, 3};
    const Shard shards[3] = {make_shard(h, c0, c1), make_shard(h, c1, c2), make_shard(h, c2, c3)};
    const std::int64_t T = h.tokens(), H = cfg.heads, L = cfg.kv_lora_rank;
    std::vector<float> o(static_cast<std::size_t>(3 * T * H * L), NAN);
    std::vector<float> lse(static_cast<std::size_t>(3 * T * H), NAN);
    for (int s = 0; s < 3; ++s) {
      StateView part = make_state_view(&o[s * T * H * L], DType::kF32, &lse[s * T * H], T, H, L,
                                       s == 1 ? LseBase::kBase2 : LseBase::kNatural);
      cpu::mla_decode(h.q_nope_view(), h.q_pe_view(), shards[s].view(h), fixed_count(2),
                      h.problem.scale, part);
    }
    // merge_states takes one base per stack: shard 1 was written in base 2, rebased here
    std::vector<float> lse_nat = lse;
    for (std::int64_t i = T * H; i < 2 * T * H; ++i) lse_nat[i] = lse[i] * 0.6931471805599453f;
    HostState merged(T, H, L, DType::kF32, LseBase::kNatural);
    merged.poison();
    cpu::merge_states(make_state_stack(o.data(), DType::kF32, lse_nat.data(),
                                       StackOrder::kStatesMajor, T, 3, H, L, LseBase::kNatural),
                      merged.view());
    std::vector<float> sink_lse(static_cast<std::size_t>(T * H));
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t hd = 0; hd < H; ++hd) sink_lse[t * H + hd] = sinks[hd];
    const std::vector<float> zeros(static_cast<std::size_t>(L), 0.f);
    ConstStateView sink = make_const_state_view(zeros.data(), DType::kF32, sink_lse.data(), T, H, L,
                                                LseBase::kNatural);
    sink.o_stride_token = 0;
    sink.o_stride_head = 0;
    cpu::merge_state_inplace(merged.view(), sink);
    // the one pass, with the sinks fused
    h.problem.sinks = sinks;
    HostState one;
    ASSERT_EQ(run_and_compare(h, fixed_count(1), DType::kF32, LseBase::kNatural, false, &one), "");
    EXPECT_EQ(attnstate::testing::compare_states(
                  merged, one, attnstate::testing::Tolerance::absolute(1e-5, 1e-5, 1e-6)),
              "")
        << "q_len " << q_len;
    // and both against the reference
    attnstate::testing::MlaProblem p = h.problem;
    EXPECT_EQ(attnstate::testing::compare_states(merged, h.reference(LseBase::kNatural),
                                                 attnstate::testing::tolerance_for(p, false)),
              "");
  }
}

TEST(MlaCpu, RanksMergedByTheContextParallelMergeEqualTheOnePassState) {
  // Three ranks each hold a page-aligned shard of every request's keys (one new token per
  // request) and decode it alone; the CPU simulation of the context-parallel merge (all-to-all,
  // replicated output, the sinks merged once after the ranks) gives every rank the one-pass
  // state with sinks.
  MlaConfig cfg;
  cfg.q_dtype = DType::kF32;
  cfg.heads = 16;
  cfg.page_size = 16;
  cfg.seq_lens = {100, 40, 3, 0};
  MlaHost h = make_mla_host(cfg, 44);
  const std::vector<std::int32_t> c0 = {0, 0, 0, 0}, c1 = {48, 16, 0, 0}, c2 = {64, 16, 0, 0};
  const Shard shards[3] = {make_shard(h, c0, c1), make_shard(h, c1, c2),
                           make_shard(h, c2, cfg.seq_lens)};
  const std::int64_t T = h.tokens(), H = cfg.heads, L = cfg.kv_lora_rank;
  std::vector<HostState> locals, outs;
  std::vector<CpMergePlan> plans;
  for (int r = 0; r < 3; ++r) {
    locals.emplace_back(T, H, L, DType::kF32, r == 1 ? LseBase::kBase2 : LseBase::kNatural);
    locals.back().poison();
    cpu::mla_decode(h.q_nope_view(), h.q_pe_view(), shards[r].view(h), fixed_count(2),
                    h.problem.scale, locals.back().view());
    outs.emplace_back(T, H, L, DType::kF32, LseBase::kBase2);
    outs.back().poison();
    CpMergeShape shape;
    shape.world_size = 3;
    shape.rank = r;
    shape.tokens = T;
    shape.heads = H;
    shape.head_dim = L;
    shape.dtype = shape.out_dtype = DType::kF32;
    shape.output = CpOutput::kReplicated;
    plans.push_back(plan_cp_merge(shape));
  }
  std::vector<float> sinks(static_cast<std::size_t>(H));
  for (std::size_t i = 0; i < sinks.size(); ++i) sinks[i] = 0.25f * static_cast<float>(i) - 1.f;
  AttentionSinks s;
  s.logits = sinks.data();
  std::vector<ConstStateView> in;
  std::vector<StateView> out;
  for (int r = 0; r < 3; ++r) {
    in.push_back(locals[r].view());
    out.push_back(outs[r].view());
  }
  cpu::cp_merge_simulated(plans, in, out, s);
  h.problem.sinks = sinks;
  attnstate::testing::MlaProblem p = h.problem;
  p.base = LseBase::kBase2;
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(attnstate::testing::compare_states(outs[r], h.reference(LseBase::kBase2),
                                                 attnstate::testing::tolerance_for(p, false)),
              "")
        << "rank " << r;
}

// --- the kit's check of an MLA kernel, on the CPU MLA decode -------------------------------

/// The CPU MLA decode as a kit kernel (mla_kit_kernel.hpp); `drop_rope` zeroes the rotary
/// queries and `natural_only` writes natural-base LSEs whatever base is asked for: the bugs the
/// laws must catch.
HostState cpu_mla_kernel(const attnstate::testing::MlaProblem& all,
                         const std::vector<std::int64_t>& keys, bool drop_rope = false,
                         bool natural_only = false) {
  attnstate_test::MlaKitBugs bugs;
  bugs.drop_rope = drop_rope;
  bugs.natural_only = natural_only;
  return attnstate_test::cpu_mla_kit_kernel(all, keys, bugs);
}

attnstate::testing::MlaKernelCheckOptions kit_options() {
  attnstate::testing::MlaKernelCheckOptions o;
  o.num_tests = 25;
  o.problems.max_keys = 80;
  o.problems.ckv_dtypes = {DType::kBF16, DType::kF32, DType::kE4M3, DType::kE5M2};
  o.problems.sink_percent = 50;
  o.p_rounded_to_input = false;  // the CPU keeps P in fp32
  return o;
}

TEST(MlaCpuKit, TheCpuDecodePassesEveryLawOfTheKit) {
  const attnstate::testing::KernelCheckReport report = attnstate::testing::check_mla_kernel(
      [](const attnstate::testing::MlaProblem& p, const std::vector<std::int64_t>& keys) {
        return cpu_mla_kernel(p, keys);
      },
      kit_options());
  EXPECT_TRUE(report.passed()) << report.summary();
  EXPECT_EQ(report.laws.size(), attnstate::testing::all_laws().size());
}

TEST(MlaCpuKit, TheKitCatchesAKernelWithoutRopeOrWithTheWrongBase) {
  const attnstate::testing::KernelCheckReport rope = attnstate::testing::check_mla_kernel(
      [](const attnstate::testing::MlaProblem& p, const std::vector<std::int64_t>& keys) {
        return cpu_mla_kernel(p, keys, /*drop_rope=*/true);
      },
      kit_options());
  EXPECT_TRUE(rope.failed(attnstate::testing::Law::kExactness)) << rope.summary();
  EXPECT_NE(rope.summary().find("MlaKernelCheckOptions::seed"), std::string::npos);
  attnstate::testing::MlaKernelCheckOptions o = kit_options();
  o.laws = {attnstate::testing::Law::kDeclaredBase};
  const attnstate::testing::KernelCheckReport base = attnstate::testing::check_mla_kernel(
      [](const attnstate::testing::MlaProblem& p, const std::vector<std::int64_t>& keys) {
        return cpu_mla_kernel(p, keys, false, /*natural_only=*/true);
      },
      o);
  EXPECT_TRUE(base.failed(attnstate::testing::Law::kDeclaredBase)) << base.summary();
  EXPECT_NE(base.summary().find("mixed-base"), std::string::npos) << base.summary();
}

// --- argument errors: each names the argument -------------------------------------------------

/// Expects `f` to throw an `Error` of `status` whose message names `arg` (as `argument 'arg'`).
template <class F>
void expect_names(F&& f, const std::string& arg, Status status = Status::kInvalidArgument) {
  try {
    f();
    ADD_FAILURE() << "no error for " << arg;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find("argument '" + arg + "'"), std::string::npos)
        << "expected " << arg << ", got: " << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("attnstate::cpu::mla_decode", 0), 0u) << e.what();
  }
}

struct ErrorCase {
  MlaHost h;
  HostState out;
  ErrorCase() {
    MlaConfig cfg;
    cfg.heads = 4;
    cfg.kv_lora_rank = 32;
    cfg.rope_dim = 8;
    cfg.q_len = 2;
    cfg.seq_lens = {20, 5};
    h = make_mla_host(cfg, 77);
    out = HostState(h.tokens(), 4, 32, DType::kF32, LseBase::kNatural);
  }
  void run(const ConstTensorView& qn, const ConstTensorView& qp, const MlaKvCache& kv,
           StateView o) const {
    cpu::mla_decode(qn, qp, kv, fixed_count(2), 0.f, o);
  }
};

TEST(MlaCpuErrors, Queries) {
  ErrorCase c;
  const MlaKvCache kv = c.h.kv_view();
  auto qn = c.h.q_nope_view(), qp = c.h.q_pe_view();
  auto bad = qn;
  bad.shape[3] = 31;
  expect_names([&] { c.run(bad, qp, kv, c.out.view()); }, "q_nope.shape[3]");
  bad = qp;
  bad.shape[2] = 3;
  expect_names([&] { c.run(qn, bad, kv, c.out.view()); }, "q_pe.shape[2]");
  bad = qn;
  bad.shape[1] = 9;
  expect_names([&] { c.run(bad, qp, kv, c.out.view()); }, "q_nope.shape[1]");
  bad = qp;
  bad.dtype = DType::kF16;
  expect_names([&] { c.run(qn, bad, kv, c.out.view()); }, "q_pe.dtype");
  bad = qn;
  bad.dtype = DType::kE4M3;
  expect_names([&] { c.run(bad, qp, kv, c.out.view()); }, "q_nope.dtype", Status::kNotSupported);
  bad = qp;
  bad.stride[3] = 2;
  expect_names([&] { c.run(qn, bad, kv, c.out.view()); }, "q_pe.stride[3]");
  bad = qn;
  bad.shape[0] = 3;
  expect_names([&] { c.run(bad, qp, kv, c.out.view()); }, "q_nope.shape[0]");
}

TEST(MlaCpuErrors, CacheParts) {
  ErrorCase c;
  const auto qn = c.h.q_nope_view(), qp = c.h.q_pe_view();
  auto expect_kv = [&](auto edit, const std::string& arg) {
    MlaKvCache kv = c.h.kv_view();
    edit(kv);
    expect_names([&] { c.run(qn, qp, kv, c.out.view()); }, arg);
  };
  expect_kv([](MlaKvCache& kv) { kv.ckv_token_stride = 31; }, "kv.ckv_token_stride");
  expect_kv([](MlaKvCache& kv) { kv.kpe_page_stride = 3; }, "kv.kpe_page_stride");
  expect_kv([](MlaKvCache& kv) { kv.kpe_scale = KvScale::per_tensor(2.f); }, "kv.kpe_scale");
  expect_kv([](MlaKvCache& kv) { kv.ckv_dtype = static_cast<DType>(77); }, "kv.ckv_dtype");
  expect_kv([](MlaKvCache& kv) { kv.kpe = nullptr; }, "kv.kpe");
  expect_kv([](MlaKvCache& kv) { kv.page_size = 0; }, "kv.page_size");
  expect_kv([](MlaKvCache& kv) { kv.kv_lora_rank = 0; }, "kv.kv_lora_rank");
  expect_kv([](MlaKvCache& kv) { kv.space = MemorySpace::kDevice; }, "kv.space");
  expect_kv(
      [](MlaKvCache& kv) {
        kv.ckv_dtype = DType::kE4M3;
        kv.ckv_scale = KvScale::per_tensor(0.f);
      },
      "kv.ckv_scale.value");
  expect_kv(
      [](MlaKvCache& kv) {
        kv.num_pages = std::int64_t{1} << 61;
        kv.ckv_page_stride = 1 << 20;
      },
      "kv.num_pages");
}

TEST(MlaCpuErrors, Tables) {
  ErrorCase c;
  const auto qn = c.h.q_nope_view(), qp = c.h.q_pe_view();
  std::vector<std::int32_t> lens = {20, 500};  // past its pages
  MlaKvCache kv = c.h.kv_view();
  kv.seq_lens = lens.data();
  expect_names([&] { c.run(qn, qp, kv, c.out.view()); }, "kv.seq_lens");
  std::vector<std::int32_t> ids = c.h.indices;
  ids[0] = 1000;
  kv = c.h.kv_view();
  kv.page_indices = ids.data();
  expect_names([&] { c.run(qn, qp, kv, c.out.view()); }, "kv.page_indices");
  kv = c.h.kv_view();
  kv.block_table = c.h.block_table.data();
  expect_names([&] { c.run(qn, qp, kv, c.out.view()); }, "kv.block_table");
  kv = c.h.kv_view();
  kv.seq_lens = nullptr;
  expect_names([&] { c.run(qn, qp, kv, c.out.view()); }, "kv.seq_lens");
}

TEST(MlaCpuErrors, OutputShapeAndOverlap) {
  ErrorCase c;
  const auto qn = c.h.q_nope_view(), qp = c.h.q_pe_view();
  const MlaKvCache kv = c.h.kv_view();
  HostState wrong(c.h.tokens(), 4, 40, DType::kF32, LseBase::kNatural);
  expect_names([&] { c.run(qn, qp, kv, wrong.view()); }, "out.head_dim");
  HostState heads(c.h.tokens(), 3, 32, DType::kF32, LseBase::kNatural);
  expect_names([&] { c.run(qn, qp, kv, heads.view()); }, "out.heads");
  // an output over the cache, over the queries, over the tables
  std::vector<float> lse(static_cast<std::size_t>(c.h.tokens() * 4));
  StateView over = make_state_view(const_cast<unsigned char*>(c.h.ckv.data()), DType::kBF16,
                                   lse.data(), c.h.tokens(), 4, 32, LseBase::kNatural);
  expect_names([&] { c.run(qn, qp, kv, over); }, "out.o");
  over.o = const_cast<unsigned char*>(c.h.q.data()) + 64;  // inside q_pe's span
  expect_names([&] { c.run(qn, qp, kv, over); }, "out.o");
  StateView lse_over = c.out.view();
  lse_over.lse = reinterpret_cast<float*>(const_cast<std::int32_t*>(c.h.indices.data()));
  expect_names([&] { c.run(qn, qp, kv, lse_over); }, "out.lse");
}

TEST(MlaCpuErrors, OptionsSplitsScaleAndSinks) {
  ErrorCase c;
  const auto qn = c.h.q_nope_view(), qp = c.h.q_pe_view();
  const MlaKvCache kv = c.h.kv_view();
  DecodeOptions o;
  o.variant.logits_soft_cap = 30.f;
  expect_names([&] { cpu::mla_decode(qn, qp, kv, o, c.out.view()); }, "options.variant",
               Status::kNotSupported);
  o = DecodeOptions{};
  o.policy = SplitPolicy::kFixedSize;
  o.split_size = 10;
  expect_names([&] { cpu::mla_decode(qn, qp, kv, o, c.out.view()); }, "options.split_size");
  o = DecodeOptions{};
  o.scale = INFINITY;
  expect_names([&] { cpu::mla_decode(qn, qp, kv, o, c.out.view()); }, "options.scale");
  expect_names([&] { cpu::mla_decode(qn, qp, kv, fixed_count(0), 0.f, c.out.view()); },
               "splits.max_splits");
  expect_names([&] { cpu::mla_decode(qn, qp, kv, fixed_count(1), NAN, c.out.view()); }, "scale");
  const std::vector<float> sinks = {0.f, NAN, 0.f, 0.f};
  AttentionSinks s;
  s.logits = sinks.data();
  expect_names([&] { cpu::mla_decode(qn, qp, kv, DecodeOptions{}, s, c.out.view()); },
               "sinks.logits[1]");
}

}  // namespace
