/// @file test_cuda_mla_cascade.cu
/// @brief CUDA MLA cascade (`cuda::run_mla_cascade`) against the testing kit's double reference,
///        the reference `cpu::mla_cascade` is checked against in the same test, on fresh random
///        cascades: 2 and 3 levels, segments shared by 1 to 9 requests (one and several row
///        tiles), empty segments, 16, 64 and 128 heads, q_len 1..4, pages of 1, 16 and 64
///        tokens, bf16 and fp8 latent caches, sinks, every state dtype and base, outputs
///        poisoned with NaN first; a plan made for longer segments replayed on the real lengths;
///        the plan's levels and workspace; argument errors naming the argument. GPU tests skip
///        without a GPU; the planner's tests (host only) run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/cpu/mla.hpp"
#include "attnstate/cuda/mla_cascade.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/mla.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "cuda_test_utils.hpp"
#include "mla_cascade_problem.hpp"
#include "mla_device.hpp"
#include "random_sinks.hpp"

namespace {

using namespace attnstate;
using attnstate::testing::HostState;
using attnstate_test::DeviceBuffer;
using attnstate_test::DeviceState;
using attnstate_test::expect_named_error;
using attnstate_test::make_mla_cascade_host;
using attnstate_test::MlaCascadeConfig;
using attnstate_test::MlaCascadeHost;
using attnstate_test::MlaSegment;
using attnstate_test::moved;
using attnstate_test::upload;

constexpr const char* kPlanFn = "attnstate::cuda::plan_mla_cascade";
constexpr const char* kRunFn = "attnstate::cuda::run_mla_cascade";

/// An MLA cascade copied to the device: queries, the pool, the levels' arrays, scales, sinks.
struct DeviceCascade {
  DeviceBuffer<unsigned char> q, ckv, kpe;
  DeviceBuffer<float> scales, sinks;
  std::vector<DeviceBuffer<std::int32_t>> arrays;  // per level: requests, page offsets, ids, lens
  explicit DeviceCascade(const MlaCascadeHost& h)
      : q(upload(h.keys.q)),
        ckv(upload(h.ckv)),
        kpe(upload(h.kpe)),
        scales(upload(h.keys.scale_mem)),
        sinks(upload(h.problem().sinks)) {
    for (const auto& a : h.arrays)
      for (const auto* v : {&a.request_indptr, &a.page_indptr, &a.page_indices, &a.seg_lens})
        arrays.push_back(upload(*v));
  }
  MlaKvCache kv(const MlaCascadeHost& h) const {
    MlaKvCache c = h.pool_view();
    c.ckv = moved(c.ckv, h.ckv, ckv);
    c.kpe = moved(c.kpe, h.kpe, kpe);
    if (c.ckv_scale.data != nullptr) c.ckv_scale.data = scales.get();
    if (c.kpe_scale.data != nullptr) c.kpe_scale.data = scales.get() + 1;
    c.space = MemorySpace::kDevice;
    return c;
  }
  std::vector<CascadeLevel> levels(const MlaCascadeHost& h) const {
    std::vector<CascadeLevel> v = h.levels();
    for (std::size_t l = 0; l < v.size(); ++l) {
      v[l].request_indptr = arrays[4 * l].get();
      v[l].page_indptr = arrays[4 * l + 1].get();
      v[l].page_indices = arrays[4 * l + 2].get();
      v[l].seg_lens = arrays[4 * l + 3].get();
    }
    return v;
  }
  ConstTensorView query(ConstTensorView t, const MlaCascadeHost& h) const {
    t.data = moved(t.data, h.keys.q, q);
    t.space = MemorySpace::kDevice;
    return t;
  }
  AttentionSinks attention_sinks(const MlaCascadeHost& h) const {
    AttentionSinks s;
    if (h.problem().has_sinks()) s.logits = sinks.get();
    return s;
  }
};

cuda::MlaCascadeProblem problem_of(const MlaCascadeHost& h) {
  cuda::MlaCascadeProblem pr;
  pr.mla.batch = h.batch;
  pr.mla.q_len = h.cfg.mla.q_len;
  pr.mla.heads = h.cfg.mla.heads;
  pr.mla.q_dtype = h.cfg.mla.q_dtype;
  pr.mla.ckv_dtype = h.cfg.mla.ckv_dtype;
  pr.mla.kpe_dtype = h.cfg.mla.kpe_dtype;
  pr.page_size = h.cfg.mla.page_size;
  pr.num_pages = h.num_pages;
  return pr;
}

CascadeOptions options_of(const MlaCascadeHost& h) {
  CascadeOptions o;
  o.scale = h.problem().scale;
  o.causal = h.cfg.causal;
  return o;
}

cuda::MlaCascadePlan plan_of(const MlaCascadeHost& h) {
  const std::vector<CascadeLevel> lv = h.levels();
  return cuda::plan_mla_cascade(problem_of(h), lv.data(), static_cast<int>(lv.size()),
                                options_of(h), attnstate_test::device_sms());
}

/// Plans and runs the CUDA cascade of `h` into a fresh poisoned output; returns it on the host.
/// With `plan` given, runs that plan (made for other host lengths) instead of one of `h`'s.
HostState run_cuda(const MlaCascadeHost& h, const DeviceCascade& d, DType out_dtype, LseBase base,
                   const cuda::MlaCascadePlan* given = nullptr) {
  const cuda::MlaCascadePlan plan = given != nullptr ? *given : plan_of(h);
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  ws.poison();  // nothing of the workspace is read before it is written
  DeviceState out(h.tokens(), h.cfg.mla.heads, h.cfg.mla.kv_lora_rank, out_dtype, base);
  const std::vector<CascadeLevel> lv = d.levels(h);
  cuda::run_mla_cascade(plan, d.query(h.keys.q_nope_view(), h), d.query(h.keys.q_pe_view(), h),
                        d.kv(h), lv.data(), static_cast<int>(lv.size()), d.attention_sinks(h),
                        out.view, ws.get(), ws.bytes());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

/// The kit's double reference of `h` at `out`'s dtype and base, at the tolerance of a kernel
/// that rounds P to 16 bits (`p_rounded`; the CPU reference does not): "" when `out` matches.
std::string compare_with_reference(const MlaCascadeHost& h, const HostState& out, bool p_rounded) {
  attnstate::testing::MlaProblem p = h.problem();
  p.out_dtype = out.dtype();
  p.base = out.base();
  return attnstate::testing::compare_states(out, h.reference(out.base()),
                                            attnstate::testing::tolerance_for(p, p_rounded));
}

/// The CUDA cascade and the CPU one (`cpu::mla_cascade`) against the kit's reference.
std::string check(const MlaCascadeHost& h, DType out_dtype, LseBase base) {
  const DeviceCascade d(h);
  const HostState gpu = run_cuda(h, d, out_dtype, base);
  const std::string g = compare_with_reference(h, gpu, true);
  if (!g.empty()) return "cuda: " + g;
  HostState cpu(h.tokens(), h.cfg.mla.heads, h.cfg.mla.kv_lora_rank, out_dtype, base);
  cpu.poison();
  const std::vector<CascadeLevel> lv = h.levels();
  cpu::mla_cascade(h.keys.q_nope_view(), h.keys.q_pe_view(), h.pool_view(), lv.data(),
                   static_cast<int>(lv.size()), options_of(h), h.problem().attention_sinks(),
                   cpu.view());
  const std::string c = compare_with_reference(h, cpu, false);
  return c.empty() ? "" : "cpu: " + c;
}

struct Case {
  std::int64_t q_len, heads, page;
  DType ckv, kpe, out;
  LseBase base;
  bool sinks;
  std::vector<std::vector<MlaSegment>> levels;
};

MlaCascadeHost host_of(const Case& c, std::uint64_t seed) {
  MlaCascadeConfig cfg;
  cfg.mla.q_len = c.q_len;
  cfg.mla.heads = c.heads;
  cfg.mla.page_size = c.page;
  cfg.mla.ckv_dtype = c.ckv;
  cfg.mla.kpe_dtype = c.kpe;
  if (is_fp8(c.ckv)) {
    cfg.mla.kv_amp = c.ckv == DType::kE4M3 ? 224.f : 2.f;
    cfg.mla.ckv_scale = 0x1p-7f;
    cfg.mla.kpe_scale = is_fp8(c.kpe) ? 0.37f : 1.f;
    cfg.mla.scale_pointer = seed % 2 == 0;
  }
  cfg.levels = c.levels;
  MlaCascadeHost h = make_mla_cascade_host(cfg, seed);
  if (c.sinks) h.keys.problem.sinks = attnstate_test::random_sinks(c.heads, -4.f, 8.f, seed);
  return h;
}

/// A small bf16 cascade of two requests (for the argument errors).
MlaCascadeHost small_host(std::uint64_t seed) {
  const Case c{2,
               16,
               16,
               DType::kBF16,
               DType::kBF16,
               DType::kF32,
               LseBase::kNatural,
               false,
               {{{2, 30}}, {{1, 3}, {1, 9}}}};
  return host_of(c, seed);
}

// (tests named *Large* are skipped under compute-sanitizer by scripts/gpu-check.sh;
// `EveryPathOnASmallProblem` is its coverage of every kernel path)
TEST(MlaCascadeCuda, LargeMatrixMatchesTheReference) {
  ATTNSTATE_REQUIRE_GPU();
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const DType e4 = DType::kE4M3, e5 = DType::kE5M2;
  const LseBase ln = LseBase::kNatural, b2 = LseBase::kBase2;
  // clang-format off
  const Case cases[] = {
      // 2 levels: a long prefix shared by the batch (several splits), each request's suffix
      {1, 16, 16, bf, bf, f32, ln, false, {{{9, 2000}}, {{1, 5}, {1, 17}, {1, 1}, {1, 40}, {1, 3}, {1, 16}, {1, 0}, {1, 300}, {1, 64}}}},
      {2, 16, 1, bf, bf, bf, b2, true, {{{5, 37}}, {{1, 2}, {1, 9}, {1, 1}, {1, 30}, {1, 4}}}},
      {3, 16, 64, e4, bf, f32, b2, false, {{{4, 700}}, {{1, 70}, {1, 2}, {1, 64}, {1, 3}}}},
      {4, 16, 16, e5, e5, f16, ln, true, {{{3, 33}}, {{1, 3}, {1, 20}, {1, 5}}}},
      {1, 64, 16, bf, bf, f32, b2, false, {{{6, 129}}, {{1, 1}, {1, 80}, {1, 7}, {1, 33}, {1, 2}, {1, 0}}}},
      {1, 128, 64, bf, bf, f32, b2, true, {{{3, 1100}}, {{1, 1}, {1, 80}, {1, 7}}}},
      {2, 128, 16, e4, e4, bf, ln, false, {{{2, 50}}, {{1, 1}, {1, 18}}}},
      // 3 levels: a system prompt, conversations, the requests' suffixes; empty segments
      {1, 16, 16, bf, bf, f32, ln, true, {{{7, 480}}, {{4, 0}, {3, 29}}, {{1, 4}, {1, 0}, {1, 9}, {1, 1}, {1, 2}, {1, 0}, {1, 33}}}},
      {2, 16, 64, e4, bf, f32, b2, false, {{{5, 0}}, {{2, 77}, {3, 64}}, {{1, 1}, {1, 2}, {1, 65}, {1, 3}, {1, 1}}}},
      {4, 128, 1, bf, bf, bf, b2, true, {{{2, 21}}, {{1, 0}, {1, 13}}, {{1, 3}, {1, 6}}}},
      {3, 16, 16, e5, e5, f32, ln, false, {{{6, 17}}, {{3, 40}, {3, 1}}, {{2, 2}, {1, 5}, {3, 16}}}},
  };
  // clang-format on
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    const MlaCascadeHost h = host_of(c, seed++);
    EXPECT_EQ(check(h, c.out, c.base), "") << h.cfg.name() << (c.sinks ? " sinks" : "");
  }
}

TEST(MlaCascadeCuda, EveryPathOnASmallProblem) {
  ATTNSTATE_REQUIRE_GPU();
  // each row (bf16, e4m3, e5m2 latent parts), one split and several (a prefix of 300 tokens),
  // a segment of 5 requests (80 rows: two row tiles), an empty segment, sinks and none, no
  // causal masking: small enough for memcheck and racecheck
  const DType bf = DType::kBF16, e4 = DType::kE4M3, e5 = DType::kE5M2;
  const std::vector<std::vector<MlaSegment>> levels = {
      {{5, 300}}, {{2, 0}, {3, 20}}, {{1, 1}, {1, 4}, {1, 2}, {1, 9}, {1, 1}}};
  // clang-format off
  const Case cases[] = {
      {2, 16, 16, bf, bf, DType::kF32, LseBase::kNatural, true, levels},
      {1, 16, 16, e4, e4, DType::kBF16, LseBase::kBase2, false, levels},
      {2, 16, 16, e5, bf, DType::kF16, LseBase::kBase2, true, levels},
  };
  // clang-format on
  std::uint64_t seed = 51;
  for (const Case& c : cases) {
    const MlaCascadeHost h = host_of(c, seed++);
    EXPECT_EQ(check(h, c.out, c.base), "") << h.cfg.name();
  }
  MlaCascadeConfig cfg;
  cfg.causal = false;
  cfg.mla.q_len = 3;
  cfg.levels = {{{4, 40}}, {{2, 0}, {1, 1}, {1, 25}}};
  const MlaCascadeHost h = make_mla_cascade_host(cfg, 60);
  EXPECT_EQ(check(h, DType::kF32, LseBase::kNatural), "") << h.cfg.name();
}

TEST(MlaCascadeCuda, ReplaysAPlanMadeForLongerSegments) {
  ATTNSTATE_REQUIRE_GPU();
  // the plan sees every segment filling its pages (a prefix of 320 tokens: several splits); the
  // device lengths are the real, shorter ones: each segment's splits follow its device length
  Case c{2,
         16,
         64,
         DType::kBF16,
         DType::kBF16,
         DType::kF32,
         LseBase::kBase2,
         true,
         {{{6, 300}}, {{2, 70}, {4, 5}}, {{1, 3}, {1, 60}, {1, 1}, {1, 129}, {1, 2}, {1, 7}}}};
  const MlaCascadeHost h = host_of(c, 80);
  MlaCascadeHost full = h;
  for (auto& a : full.arrays)
    for (std::size_t s = 0; s < a.seg_lens.size(); ++s)
      a.seg_lens[s] = (a.page_indptr[s + 1] - a.page_indptr[s]) * 64;
  const cuda::MlaCascadePlan plan = plan_of(full);
  const DeviceCascade d(h);
  const HostState out = run_cuda(h, d, DType::kF32, LseBase::kBase2, &plan);
  EXPECT_EQ(compare_with_reference(h, out, true), "") << plan.to_string();
}

TEST(MlaCascadeCuda, PlanErrorsNameTheArgument) {
  // host only: runs without a GPU
  const MlaCascadeHost h = small_host(70);
  const std::vector<CascadeLevel> lv = h.levels();
  const auto plan = [&](cuda::MlaCascadeProblem pr, const CascadeLevel* levels, int n,
                        CascadeOptions o,
                        int sms) { cuda::plan_mla_cascade(pr, levels, n, o, sms); };
  const cuda::MlaCascadeProblem pr = problem_of(h);
  const CascadeOptions o = options_of(h);
  cuda::MlaCascadeProblem bad = pr;
  bad.mla.heads = 24;
  expect_named_error([&] { plan(bad, lv.data(), 2, o, 4); }, Status::kNotSupported,
                     "problem.mla.heads", kPlanFn);
  bad = pr;
  bad.mla.q_len = 5;
  expect_named_error([&] { plan(bad, lv.data(), 2, o, 4); }, Status::kNotSupported,
                     "problem.mla.q_len", kPlanFn);
  bad = pr;
  bad.page_size = 0;
  expect_named_error([&] { plan(bad, lv.data(), 2, o, 4); }, Status::kInvalidArgument,
                     "problem.page_size", kPlanFn);
  expect_named_error([&] { plan(pr, lv.data(), 2, o, 0); }, Status::kInvalidArgument, "num_sms",
                     kPlanFn);
  expect_named_error([&] { plan(pr, lv.data(), 9, o, 4); }, Status::kInvalidArgument, "num_levels",
                     kPlanFn);
  CascadeOptions win = o;
  win.variant.logits_soft_cap = 30.f;
  expect_named_error([&] { plan(pr, lv.data(), 2, win, 4); }, Status::kNotSupported,
                     "options.variant", kPlanFn);
  MlaCascadeHost hb = h;
  hb.arrays[1].request_indptr[1] = 3;  // past the batch of 2
  const std::vector<CascadeLevel> lb = hb.levels();
  expect_named_error([&] { plan(pr, lb.data(), 2, o, 4); }, Status::kInvalidArgument,
                     "levels[1].request_indptr", kPlanFn);
  hb = h;
  hb.arrays[0].page_indices[0] = static_cast<std::int32_t>(h.num_pages);
  const std::vector<CascadeLevel> lp = hb.levels();
  expect_named_error([&] { plan(pr, lp.data(), 2, o, 4); }, Status::kInvalidArgument,
                     "levels[0].page_indices", kPlanFn);
}

TEST(MlaCascadeCuda, PlanRecordsEachLevelAndTheWorkspace) {
  // host only: a long prefix shared by 64 requests is split over the SMs, the suffixes planned
  // apart; the stack holds one slot per split of each level
  cuda::MlaCascadeProblem pr;
  pr.mla.batch = 64;
  pr.mla.heads = 16;
  pr.page_size = 64;
  pr.num_pages = 64 + 64 + 1;
  std::vector<std::int32_t> req0 = {0, 64}, pages0 = {0, 64}, lens0 = {4096};
  std::vector<std::int32_t> req1, pages1, lens1(64, 40);
  for (std::int32_t b = 0; b <= 64; ++b) {
    req1.push_back(b);
    pages1.push_back(b);
  }
  CascadeLevel lv[2];
  lv[0] = CascadeLevel{1, req0.data(), pages0.data(), nullptr, lens0.data()};
  lv[1] = CascadeLevel{64, req1.data(), pages1.data(), nullptr, lens1.data()};
  const cuda::MlaCascadePlan plan = cuda::plan_mla_cascade(pr, lv, 2, CascadeOptions{}, 132);
  EXPECT_EQ(plan.num_levels(), 2);
  EXPECT_GT(plan.splits(0).max_splits, 1) << plan.to_string();
  EXPECT_EQ(plan.num_slots(), plan.splits(0).max_splits + plan.splits(1).max_splits);
  EXPECT_FLOAT_EQ(plan.scale(), 1.f / 24.f);
  const auto round256 = [](std::size_t x) { return (x + 255) / 256 * 256; };
  const std::size_t rows = 64 * 16, slots = static_cast<std::size_t>(plan.num_slots());
  EXPECT_EQ(plan.workspace_bytes(), round256(rows * slots * 2048) + round256(rows * slots * 4) +
                                        round256(rows * 2048) + round256(rows * 4) +
                                        round256(2048));
  EXPECT_NE(plan.to_string().find("MLA cascade"), std::string::npos);
  expect_named_error([&] { plan.splits(2); }, Status::kInvalidArgument, "l");
  EXPECT_EQ(cuda::MlaCascadePlan{}.workspace_bytes(), 0u);
}

TEST(MlaCascadeCuda, RunErrorsNameTheArgument) {
  ATTNSTATE_REQUIRE_GPU();
  const MlaCascadeHost h = small_host(71);
  const DeviceCascade d(h);
  const cuda::MlaCascadePlan plan = plan_of(h);
  DeviceBuffer<unsigned char> ws(plan.workspace_bytes());
  DeviceState out(h.tokens(), 16, 512, DType::kF32, LseBase::kNatural);
  const std::vector<CascadeLevel> lv = d.levels(h);
  const ConstTensorView qn = d.query(h.keys.q_nope_view(), h);
  const ConstTensorView qp = d.query(h.keys.q_pe_view(), h);
  const MlaKvCache kv = d.kv(h);
  const auto run = [&](const cuda::MlaCascadePlan& p, const MlaKvCache& k,
                       const CascadeLevel* levels, int n, StateView o, std::size_t bytes,
                       AttentionSinks s = {}) {
    cuda::run_mla_cascade(p, qn, qp, k, levels, n, s, o, ws.get(), bytes);
  };
  expect_named_error([&] { run(cuda::MlaCascadePlan{}, kv, lv.data(), 2, out.view, ws.bytes()); },
                     Status::kInvalidArgument, "plan", kRunFn);
  expect_named_error([&] { run(plan, kv, lv.data(), 1, out.view, ws.bytes()); },
                     Status::kInvalidArgument, "num_levels", kRunFn);
  expect_named_error([&] { run(plan, kv, nullptr, 2, out.view, ws.bytes()); },
                     Status::kInvalidArgument, "device_levels", kRunFn);
  std::vector<CascadeLevel> fewer = lv;
  fewer[1].num_segments = 1;
  expect_named_error([&] { run(plan, kv, fewer.data(), 2, out.view, ws.bytes()); },
                     Status::kInvalidArgument, "levels[1].num_segments", kRunFn);
  MlaKvCache host_kv = kv;
  host_kv.space = MemorySpace::kHost;
  expect_named_error([&] { run(plan, host_kv, lv.data(), 2, out.view, ws.bytes()); },
                     Status::kInvalidArgument, "kv.space", kRunFn);
  MlaKvCache paged = kv;
  paged.page_size = 64;
  expect_named_error([&] { run(plan, paged, lv.data(), 2, out.view, ws.bytes()); },
                     Status::kInvalidArgument, "kv.page_size", kRunFn);
  expect_named_error([&] { run(plan, kv, lv.data(), 2, out.view, ws.bytes() - 1); },
                     Status::kWorkspaceTooSmall, "workspace_bytes", kRunFn);
  DeviceState wide(h.tokens(), 16, 256, DType::kF32, LseBase::kNatural);
  expect_named_error([&] { run(plan, kv, lv.data(), 2, wide.view, ws.bytes()); },
                     Status::kInvalidArgument, "out.head_dim", kRunFn);
  std::vector<float> host_sinks(16, 0.f);
  expect_named_error(
      [&] { run(plan, kv, lv.data(), 2, out.view, ws.bytes(), {host_sinks.data()}); },
      Status::kInvalidArgument, "sinks.logits", kRunFn);
  // the output over the workspace
  StateView over = out.view;
  over.lse = reinterpret_cast<float*>(ws.get());
  expect_named_error([&] { run(plan, kv, lv.data(), 2, over, ws.bytes()); },
                     Status::kInvalidArgument, "out.lse", kRunFn);
}

}  // namespace
