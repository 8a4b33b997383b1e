/// @file test_cpu_mla_block_scale.cpp
/// @brief CPU MLA decode and cascade over fp8 latent caches with per-token block scales
///        (FlashMLA's 656-byte rows as views of one pool) against an independent double
///        computation, with a control showing that the scales of a wrong block would fail;
///        argument errors naming the block-scale fields.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/cpu/mla.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/mla.hpp"
#include "attnstate/testing/reference.hpp"
#include "cpu_test_utils.hpp"
#include "mla_block_scale.hpp"
#include "mla_kit_kernel.hpp"
#include "split_layouts.hpp"

namespace {

using namespace attnstate;
using attnstate::testing::HostState;
using attnstate_test::BlockScaleConfig;
using attnstate_test::BlockScaleHost;
using attnstate_test::make_block_scale_host;

// fp32 on the CPU: products rounded once, fp32 sums of a few hundred terms
constexpr double kAtol = 2e-4;
constexpr double kRtol = 2e-4;

/// The error of `out` against the double reference of `h` (block shift `shift`), in tolerances.
double error_of(const BlockScaleHost& h, const HostState& out, std::int64_t shift = 0) {
  return attnstate_test::block_scale_state_error(h, out, kAtol, kRtol, shift);
}

HostState poisoned(const BlockScaleHost& h) {
  HostState out(h.tokens(), h.cfg.heads, h.cfg.kv_lora_rank, DType::kF32, LseBase::kNatural);
  out.poison();
  return out;
}

HostState run_decode(const BlockScaleHost& h, const SplitLayout& layout) {
  HostState out = poisoned(h);
  cpu::mla_decode(h.query(h.q_nope.data(), h.cfg.kv_lora_rank, MemorySpace::kHost),
                  h.query(h.q_pe.data(), h.cfg.rope_dim, MemorySpace::kHost), h.view(), layout,
                  h.scale, out.view());
  return out;
}

struct Shape {
  std::int64_t rank, rope, block_cols, page, q_len, heads;
  std::vector<std::int32_t> lens;
};

TEST(MlaCpuBlockScale, DecodeMatchesAnIndependentDoubleComputation) {
  const std::vector<Shape> shapes = {
      {512, 64, 128, 64, 1, 16, {200, 1, 64, 130}},  // FlashMLA's rows: 656 bytes
      {512, 64, 128, 16, 3, 4, {40, 3, 17}},
      {512, 64, 128, 1, 2, 2, {9, 5}},
      {256, 32, 64, 7, 1, 3, {30, 8}},  // other block sizes (the CPU takes any divisor)
      {96, 16, 32, 5, 4, 2, {23, 4}},
      {64, 8, 64, 3, 1, 2, {11}},  // one block a token
  };
  std::uint64_t seed = 11;
  for (const Shape& s : shapes) {
    BlockScaleConfig cfg;
    cfg.kv_lora_rank = s.rank;
    cfg.rope_dim = s.rope;
    cfg.block_cols = s.block_cols;
    cfg.page_size = s.page;
    cfg.q_len = s.q_len;
    cfg.heads = s.heads;
    cfg.seq_lens = s.lens;
    const BlockScaleHost h = make_block_scale_host(cfg, seed++);
    SCOPED_TRACE("rank " + std::to_string(s.rank) + " block " + std::to_string(s.block_cols) +
                 " page " + std::to_string(s.page) + " q_len " + std::to_string(s.q_len));
    for (const SplitLayout& layout :
         {attnstate_test::fixed_count(1), attnstate_test::fixed_count(3),
          attnstate_test::fixed_size(16, 16)}) {
      const HostState out = run_decode(h, layout);
      EXPECT_LE(error_of(h, out), 1.0);
      // the control: the scales of the next block give a state far outside the tolerance (a
      // wrong block index fails), unless a token has one block
      if (h.blocks > 1) {
        EXPECT_GT(error_of(h, out, 1), 100.0);
      }
    }
  }
}

TEST(MlaCpuBlockScale, PerTensorFp8IsTheCaseOfEqualBlockScales) {
  // every block scale of every token 0.375: the same bits as the per-tensor scale 0.375
  BlockScaleConfig cfg;
  cfg.seq_lens = {70, 33};
  cfg.heads = 4;
  cfg.page_size = 16;
  BlockScaleHost h = make_block_scale_host(cfg, 5);
  const float s = 0.375f;
  for (std::int64_t b = 0; b < h.batch; ++b)
    for (std::int64_t t = 0; t < cfg.seq_lens[static_cast<std::size_t>(b)]; ++t)
      for (std::int64_t j = 0; j < h.blocks; ++j)
        std::memcpy(const_cast<unsigned char*>(h.row(b, t)) + h.scale_offset() + 4 * j, &s, 4);
  const HostState blocks = run_decode(h, attnstate_test::fixed_count(2));
  MlaKvCache kv = h.view();
  kv.ckv_block_scale = MlaBlockScale{};
  kv.ckv_scale = KvScale::per_tensor(s);
  HostState tensor = poisoned(h);
  cpu::mla_decode(h.query(h.q_nope.data(), 512, MemorySpace::kHost),
                  h.query(h.q_pe.data(), 64, MemorySpace::kHost), kv,
                  attnstate_test::fixed_count(2), h.scale, tensor.view());
  for (std::int64_t t = 0; t < h.tokens(); ++t)
    for (std::int64_t hd = 0; hd < cfg.heads; ++hd) {
      // the per-tensor scale multiplies the output and the dot products: equal to rounding
      EXPECT_NEAR(blocks.lse(t, hd), tensor.lse(t, hd), 1e-4);
      for (std::int64_t d = 0; d < 512; d += 37)
        EXPECT_NEAR(blocks.o(t, hd, d), tensor.o(t, hd, d),
                    1e-4 * (1 + std::abs(tensor.o(t, hd, d))));
    }
  EXPECT_LE(error_of(h, blocks), 1.0);
}

TEST(MlaCpuBlockScale, CascadeWithASharedPrefixMatchesTheDoubleComputation) {
  for (const std::int64_t q_len : {1, 3}) {
    BlockScaleConfig cfg;
    cfg.page_size = 16;
    cfg.q_len = q_len;
    cfg.heads = 8;
    cfg.seq_lens = {70, 50, 90, 49};
    BlockScaleHost h = make_block_scale_host(cfg, 40 + static_cast<std::uint64_t>(q_len));
    const attnstate_test::BlockScaleLevels lv = attnstate_test::share_prefix(h, 2);
    const std::vector<CascadeLevel> levels = lv.levels();
    MlaKvCache pool = h.view();
    pool.block_table = nullptr;
    pool.block_table_stride = 0;
    pool.seq_lens = nullptr;
    pool.batch = 0;
    HostState out = poisoned(h);
    CascadeOptions options;
    options.scale = h.scale;
    cpu::mla_cascade(h.query(h.q_nope.data(), 512, MemorySpace::kHost),
                     h.query(h.q_pe.data(), 64, MemorySpace::kHost), pool, levels.data(), 2,
                     options, out.view());
    SCOPED_TRACE("q_len " + std::to_string(q_len));
    EXPECT_LE(error_of(h, out), 1.0);
    EXPECT_GT(error_of(h, out, 2), 100.0);
  }
}

// --- the testing kit's MLA problems with block scales ------------------------------------------

/// The CPU MLA decode as a kit kernel (mla_kit_kernel.hpp), the latent part's block scales as
/// `ckv_block_scale` beside the values; `ignore_blocks` drops them (the bug the kit must catch).
HostState cpu_block_kernel(const attnstate::testing::MlaProblem& all,
                           const std::vector<std::int64_t>& keys, bool ignore_blocks = false) {
  attnstate_test::MlaKitBugs bugs;
  bugs.ignore_blocks = ignore_blocks;
  return attnstate_test::cpu_mla_kit_kernel(all, keys, bugs);
}

attnstate::testing::MlaKernelCheckOptions block_kit_options() {
  attnstate::testing::MlaKernelCheckOptions o;
  o.num_tests = 25;
  o.problems.max_keys = 60;
  o.problems.kv_lora_ranks = {512, 96};
  o.problems.rope_dims = {64, 8};
  o.problems.ckv_dtypes = {DType::kE4M3, DType::kE5M2};
  o.problems.block_scale_percent = 100;
  o.problems.block_cols = {128, 32, 64};
  o.problems.sink_percent = 30;
  o.p_rounded_to_input = false;  // the CPU keeps P in fp32
  return o;
}

TEST(MlaCpuBlockScaleKit, TheCpuDecodePassesEveryLawOnBlockScaledProblems) {
  const attnstate::testing::KernelCheckReport report = attnstate::testing::check_mla_kernel(
      [](const attnstate::testing::MlaProblem& p, const std::vector<std::int64_t>& keys) {
        return cpu_block_kernel(p, keys);
      },
      block_kit_options());
  EXPECT_TRUE(report.passed()) << report.summary();
}

TEST(MlaCpuBlockScaleKit, TheKitCatchesAKernelIgnoringTheBlockScales) {
  attnstate::testing::MlaKernelCheckOptions o = block_kit_options();
  o.problems.min_keys = 1;
  const attnstate::testing::KernelCheckReport report = attnstate::testing::check_mla_kernel(
      [](const attnstate::testing::MlaProblem& p, const std::vector<std::int64_t>& keys) {
        return cpu_block_kernel(p, keys, /*ignore_blocks=*/true);
      },
      o);
  EXPECT_FALSE(report.passed());
  EXPECT_TRUE(report.failed(attnstate::testing::Law::kExactness)) << report.summary();
}

TEST(MlaCpuBlockScaleKit, ProblemFieldsAreChecked) {
  attnstate::testing::MlaProblem p = attnstate::testing::make_mla_problem(
      1, 2, 64, 8, 3, DType::kBF16, DType::kE4M3, DType::kBF16, std::vector<float>(128, 0.5f),
      std::vector<float>(16, 0.5f), std::vector<float>(192, 1.f), std::vector<float>(24, 1.f), 0.1f,
      DType::kF32, LseBase::kNatural);
  p.ckv_block_cols = 32;
  p.ckv_block_scales = {1.f, 2.f, 0.5f, 0.25f, 4.f, 8.f};  // 3 keys x 2 blocks
  // the kept keys' block scales follow them
  const attnstate::testing::MlaProblem two = attnstate::testing::select_keys(p, {2, 0});
  EXPECT_EQ(two.ckv_block_scales, (std::vector<float>{4.f, 8.f, 1.f, 2.f}));
  // the double reference reads them: key 2 alone, its values 1 x (4 | 8)
  const attnstate::testing::ReferenceState r =
      attnstate::testing::reference_mla_state(p, {2}, LseBase::kNatural);
  EXPECT_EQ(r.o[0], 4.0);
  EXPECT_EQ(r.o[40], 8.0);
  auto expect_field = [&](auto edit, const std::string& arg) {
    attnstate::testing::MlaProblem bad = p;
    edit(bad);
    attnstate::test::expect_arg_error([&] { attnstate::testing::select_keys(bad, {0}); }, arg);
  };
  expect_field([](auto& b) { b.ckv_block_scales.pop_back(); }, "problem.ckv_block_scales.size()");
  expect_field([](auto& b) { b.ckv_block_cols = 48; }, "problem.ckv_block_cols");
  expect_field([](auto& b) { b.ckv_scale = 2.f; }, "problem.ckv_scale");
  expect_field([](auto& b) { b.ckv_block_scales[3] = -1.f; }, "problem.ckv_block_scales[3]");
}

// --- argument errors: each names the argument ---------------------------------------------------

TEST(MlaCpuBlockScaleErrors, EachFieldIsNamed) {
  BlockScaleConfig cfg;
  cfg.seq_lens = {20, 5};
  cfg.heads = 2;
  cfg.page_size = 8;
  const BlockScaleHost h = make_block_scale_host(cfg, 3);
  const auto qn = h.query(h.q_nope.data(), 512, MemorySpace::kHost);
  const auto qp = h.query(h.q_pe.data(), 64, MemorySpace::kHost);
  HostState out = poisoned(h);
  auto expect_kv = [&](auto edit, const std::string& arg) {
    MlaKvCache kv = h.view();
    edit(kv);
    attnstate::test::expect_arg_error(
        [&] { cpu::mla_decode(qn, qp, kv, attnstate_test::fixed_count(1), 0.f, out.view()); }, arg);
  };
  expect_kv([](MlaKvCache& kv) { kv.ckv_dtype = DType::kBF16; }, "kv.ckv_block_scale.data");
  expect_kv([](MlaKvCache& kv) { kv.ckv_scale = KvScale::per_tensor(2.f); }, "kv.ckv_scale");
  expect_kv([](MlaKvCache& kv) { kv.ckv_block_scale.block_cols = 0; },
            "kv.ckv_block_scale.block_cols");
  expect_kv([](MlaKvCache& kv) { kv.ckv_block_scale.block_cols = 100; },
            "kv.ckv_block_scale.block_cols");
  expect_kv([](MlaKvCache& kv) { kv.ckv_block_scale.token_stride = 3; },
            "kv.ckv_block_scale.token_stride");
  expect_kv([](MlaKvCache& kv) { kv.ckv_block_scale.token_stride = -4; },
            "kv.ckv_block_scale.token_stride");
  expect_kv([](MlaKvCache& kv) { kv.ckv_block_scale.page_stride = 5; },
            "kv.ckv_block_scale.page_stride");
  expect_kv(
      [](MlaKvCache& kv) {
        kv.ckv_block_scale.data =
            reinterpret_cast<const float*>(static_cast<const unsigned char*>(kv.ckv) + 2);
      },
      "kv.ckv_block_scale.data");
  expect_kv(
      [](MlaKvCache& kv) {
        kv.ckv_block_scale.token_stride = std::int64_t{1} << 61;
        kv.ckv_block_scale.page_stride = 0;
      },
      "kv.ckv_block_scale.token_stride");
  expect_kv([](MlaKvCache& kv) { kv.ckv_block_scale.page_stride = std::int64_t{1} << 59; },
            "kv.ckv_block_scale.page_stride");
  // fields without data: the defaults only
  expect_kv(
      [](MlaKvCache& kv) {
        kv.ckv_block_scale.data = nullptr;
        kv.ckv_block_scale.token_stride = 164;
      },
      "kv.ckv_block_scale.token_stride");
  expect_kv(
      [](MlaKvCache& kv) {
        kv.ckv_block_scale.data = nullptr;
        kv.ckv_block_scale.block_cols = 64;
      },
      "kv.ckv_block_scale.block_cols");
  // the output over the scales
  {
    MlaKvCache kv = h.view();
    HostState small(h.tokens(), cfg.heads, 512, DType::kF32, LseBase::kNatural);
    StateView o = small.view();
    kv.ckv_block_scale.data = static_cast<const float*>(o.o);
    kv.ckv_block_scale.token_stride = kv.ckv_block_scale.page_stride = 0;
    attnstate::test::expect_arg_error(
        [&] { cpu::mla_decode(qn, qp, kv, attnstate_test::fixed_count(1), 0.f, o); }, "out.o");
  }
}

}  // namespace
