/// @file test_cuda_decode.cpp
/// @brief CUDA split-KV decode against the double-precision reference and the CPU decode, on
///        fresh random inputs with the output poisoned (NaN) first: shapes, dtypes, layouts, page
///        sizes, split policies, length edges, ragged batches, large logits, graph replay,
///        repeatability, batch independence, 64-bit offsets and argument errors.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/cpu/decode.hpp"
#include "attnstate/cuda/decode.hpp"
#include "compiled_dims.hpp"
#include "cuda_test_utils.hpp"
#include "decode_device_problem.hpp"
#include "decode_problem.hpp"
#include "plan/decode_plan.hpp"
#include "plan/decode_plan_access.hpp"
#include "random_sinks.hpp"

namespace {

using namespace attnstate;
using namespace attnstate_test;

int num_sms() { return device_sms(); }

/// A device output state, poisoned with NaN.
struct DeviceState {
  DeviceBuffer<unsigned char> o;
  DeviceBuffer<float> lse;
  StateView view;
  DeviceState(std::int64_t tokens, std::int64_t heads, std::int64_t dim, DType dt, LseBase base)
      : o(std::max<std::int64_t>(1, tokens * heads * dim) * size_of(dt)),
        lse(std::max<std::int64_t>(1, tokens * heads)) {
    o.poison();
    lse.poison();
    view = make_state_view(o.get(), dt, lse.get(), tokens, heads, dim, base, MemorySpace::kDevice);
  }
};

struct GpuOut {
  std::vector<unsigned char> o;
  std::vector<float> lse;
  cuda::DecodePlan plan;
};

/// Runs `plan` (possibly adjusted by hand) on the problem into a poisoned output, with the
/// attention sinks `sinks` (device logits) when there are any.
GpuOut run_plan(const DecodeProblemHost& p, const cuda::DecodePlan& plan, DType od, LseBase base,
                const AttentionSinks& sinks = {}) {
  DeviceProblem d(p);
  GpuOut r;
  r.plan = plan;
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, r.plan.workspace_bytes()));
  ws.poison();
  cuda::init_decode_workspace(r.plan, ws.get(), ws.bytes());
  DeviceState out(p.tokens(), p.cfg.heads_q, p.cfg.head_dim, od, base);
  if (sinks.none())
    cuda::run_decode(r.plan, d.qv(p), d.kv(p), out.view, ws.get(), ws.bytes());
  else
    cuda::run_decode(r.plan, d.qv(p), d.kv(p), sinks, out.view, ws.get(), ws.bytes());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  r.o = out.o.download();
  r.lse = out.lse.download();
  return r;
}

GpuOut run_gpu(const DecodeProblemHost& p, const DecodeOptions& opt, DType od, LseBase base) {
  return run_plan(p, cuda::plan_decode(p.problem(), p.seq_lens.data(), opt, num_sms()), od, base);
}

/// Replays a captured decode graph after uploading new lengths `lens` (also set in `p`) with the
/// output poisoned first; returns the downloaded output.
GpuOut replay(cudaGraphExec_t exec, cudaStream_t stream, const cuda::DecodePlan& plan,
              DecodeProblemHost& p, DeviceProblem& d, DeviceState& out,
              const std::vector<std::int32_t>& lens) {
  p.seq_lens = lens;
  d.lens.upload(lens);
  out.o.poison();
  out.lse.poison();
  ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
  GpuOut g;
  g.plan = plan;
  g.o = out.o.download();
  g.lse = out.lse.download();
  return g;
}

double o_tol(DType kv, DType od) {
  double t = kv == DType::kBF16 ? 1.2e-2 : 3e-3;
  if (od == DType::kBF16) t += 8e-3;
  if (od == DType::kF16) t += 1e-3;
  return t;
}

void expect_matches_reference(const DecodeProblemHost& p, const GpuOut& g, DType od, LseBase base,
                              const std::string& what) {
  EXPECT_EQ(compare_decode(reference_decode(p, g.plan.scale()), g.o.data(), od, g.lse.data(), base,
                           decode_tolerance(o_tol(p.cfg.kv_dtype, od), 5e-5)),
            "")
      << what;
}

DecodeOptions count_opts(int n) {
  DecodeOptions o;
  o.policy = SplitPolicy::kFixedCount;
  o.num_splits = n;
  return o;
}

TEST(CudaDecode, MatchesReferenceAcrossShapes) {
  ATTNSTATE_REQUIRE_GPU();
  struct Case {
    std::int64_t q_len, hq, hkv, D, page;
    KvLayout layout;
    bool bt;
    DType dt, od;
    LseBase base;
  };
  const Case cases[] = {
      {1, 32, 8, 128, 16, KvLayout::kNHD, false, DType::kBF16, DType::kBF16, LseBase::kNatural},
      {1, 64, 8, 128, 16, KvLayout::kNHD, true, DType::kBF16, DType::kF32, LseBase::kBase2},
      {1, 4, 4, 64, 1, KvLayout::kHND, false, DType::kF16, DType::kF32, LseBase::kNatural},
      {1, 16, 1, 256, 64, KvLayout::kNHD, true, DType::kF16, DType::kF16, LseBase::kNatural},
      {2, 16, 2, 64, 256, KvLayout::kHND, true, DType::kBF16, DType::kF32, LseBase::kBase2},
      {8, 16, 8, 128, 16, KvLayout::kHND, false, DType::kF16, DType::kF32, LseBase::kNatural},
      {8, 64, 4, 64, 16, KvLayout::kNHD, false, DType::kBF16, DType::kF32, LseBase::kNatural},
      {3, 12, 3, 256, 1, KvLayout::kNHD, true, DType::kBF16, DType::kF32, LseBase::kNatural},
      {1, 8, 8, 128, 64, KvLayout::kHND, false, DType::kBF16, DType::kF32, LseBase::kNatural},
      {4, 32, 2, 128, 5, KvLayout::kNHD, false, DType::kF16, DType::kBF16, LseBase::kBase2},
  };
  const std::vector<std::int64_t> dims = attnstate_test::decode_head_dims();
  std::uint64_t seed = 100;
  for (const Case& c : cases) {
    if (attnstate_test::only_compiled({c.D}, dims).empty()) continue;  // not in this build
    DecodeConfig cfg = shape_config(c.q_len, c.hq, c.hkv, c.D, c.page, c.layout, c.bt, c.dt, c.dt);
    cfg.seq_lens = {static_cast<std::int32_t>(c.page + 1), 0, 300, 3, 1029};
    const DecodeProblemHost p = make_decode_problem(cfg, seed++);
    for (int n : {1, 3}) {
      const GpuOut g = run_gpu(p, count_opts(n), c.od, c.base);
      expect_matches_reference(p, g, c.od, c.base, cfg.name() + " splits " + std::to_string(n));
    }
  }
}

TEST(CudaDecode, StreamedKernelMatchesReference) {
  // The streamed kernel (each warp takes whole items in turn, its copies running on into the
  // next item): every dtype, layout, page size, head dim, group and q_len of the shape table,
  // batches of ragged lengths (0, 1, page edges, several hundred keys), planned for 1 and 3 SMs
  // (each warp then takes many items: short ones, empty ones and long ones in a row) and for the
  // device. Page sizes that are not multiples of 16 fall back to the split kernel; head dim 256,
  // which has no streamed kernel, is refused at plan time by name.
  ATTNSTATE_REQUIRE_GPU();
  struct Case {
    std::int64_t q_len, hq, hkv, D, page;
    KvLayout layout;
    bool bt;
    DType dt, od;
  };
  const Case cases[] = {
      {1, 32, 8, 128, 16, KvLayout::kNHD, true, DType::kBF16, DType::kBF16},
      {1, 64, 8, 128, 16, KvLayout::kHND, false, DType::kF16, DType::kF32},
      {1, 4, 4, 64, 64, KvLayout::kHND, false, DType::kF16, DType::kF32},
      {1, 16, 1, 256, 64, KvLayout::kNHD, true, DType::kF16, DType::kF16},
      {2, 16, 2, 64, 256, KvLayout::kHND, true, DType::kBF16, DType::kF32},
      {8, 16, 8, 128, 16, KvLayout::kHND, false, DType::kF16, DType::kF32},
      {8, 64, 4, 64, 16, KvLayout::kNHD, false, DType::kBF16, DType::kF32},
      {3, 12, 3, 256, 32, KvLayout::kNHD, true, DType::kBF16, DType::kF32},
      {4, 32, 2, 128, 5, KvLayout::kNHD, false, DType::kF16, DType::kBF16},
  };
  std::uint64_t seed = 150;
  const std::vector<std::int64_t> decode_dims = attnstate_test::decode_head_dims();
  const std::vector<std::int64_t> stream_dims = attnstate_test::stream_head_dims();
  const auto has = [](const std::vector<std::int64_t>& v, std::int64_t x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  for (const Case& c : cases) {
    if (!has(decode_dims, c.D)) continue;  // a build of fewer head dims
    DecodeConfig cfg = shape_config(c.q_len, c.hq, c.hkv, c.D, c.page, c.layout, c.bt, c.dt, c.dt);
    const std::int32_t pg = static_cast<std::int32_t>(c.page);
    cfg.seq_lens = {pg + 1, 0, 300, 3, 700, 1, pg - 1, pg, 0, 16, 17, 2 * pg + 1, 15, 481, 33};
    const DecodeProblemHost p = make_decode_problem(cfg, seed++);
    for (int sms : {1, 3, num_sms()}) {
      DecodeOptions o = count_opts(1);
      o.kernel = DecodeKernel::kStreamed;
      if (!has(stream_dims, c.D)) {  // the catalog holds no streamed kernel there: refused
        try {
          cuda::plan_decode(p.problem(), p.seq_lens.data(), o, sms);
          ADD_FAILURE() << cfg.name() << ": kStreamed planned without a streamed kernel";
        } catch (const attnstate::Error& e) {
          EXPECT_EQ(e.status(), Status::kNotSupported) << e.what();
          EXPECT_NE(std::string(e.what()).find("options.kernel"), std::string::npos) << e.what();
        }
        continue;
      }
      const cuda::DecodePlan plan = cuda::plan_decode(p.problem(), p.seq_lens.data(), o, sms);
      const GpuOut g = run_plan(p, plan, c.od, LseBase::kNatural);
      expect_matches_reference(
          p, g, c.od, LseBase::kNatural,
          cfg.name() + " streamed, planned for " + std::to_string(sms) + " SMs");
    }
  }
}

TEST(CudaDecode, StreamedPlanIsChosenAutomaticallyAndReplaysInAGraph) {
  // The automatic policy picks the streamed kernel for many short requests (more items than one
  // wave of the split kernel); a captured graph of the maximum plan serves shorter and empty
  // requests, bitwise the same on every replay of the same lengths.
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.heads_q = 32;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.block_table = true;
  const int sms = num_sms();
  cfg.seq_lens.assign(static_cast<std::size_t>(sms), 200);  // 8 items per SM
  DecodeProblemHost p = make_decode_problem(cfg, 850);
  DeviceProblem d(p);
  const cuda::DecodePlan plan =
      cuda::plan_decode(p.problem(), p.seq_lens.data(), DecodeOptions{}, sms);
  ASSERT_EQ(plan.splits().max_splits, 1);
  ASSERT_TRUE(plan.kernel() == DecodeKernel::kStreamed);
  EXPECT_EQ(plan.workspace_bytes(), 0u);
  DeviceState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  cudaStream_t stream;
  ATTNSTATE_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cuda::run_decode(plan, d.qv(p), d.kv(p), out.view, nullptr, 0, stream);
  ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<std::int32_t> shorter = p.seq_lens;
  for (std::size_t i = 0; i < shorter.size(); ++i)
    shorter[i] = static_cast<std::int32_t>((i * 37) % 201);  // 0..200
  const std::vector<std::vector<std::int32_t>> all_lens = {p.seq_lens, shorter};
  for (const auto& l : all_lens) {
    std::vector<unsigned char> first_o;
    for (int rep = 0; rep < 2; ++rep) {
      const GpuOut g = replay(exec, stream, plan, p, d, out, l);
      expect_matches_reference(
          p, g, DType::kF32, LseBase::kNatural,
          "replay " + std::to_string(rep) + ", lens[1] " + std::to_string(l[1]));
      if (rep == 0)
        first_o = g.o;
      else
        EXPECT_EQ(0, std::memcmp(first_o.data(), g.o.data(), g.o.size()));
    }
  }
  ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ATTNSTATE_CUDA_CHECK(cudaGraphDestroy(graph));
  ATTNSTATE_CUDA_CHECK(cudaStreamDestroy(stream));
  // Not chosen: split requests, or a fixed split policy.
  cfg.seq_lens = {32000};
  const DecodeProblemHost one = make_decode_problem(cfg, 851);
  EXPECT_FALSE(
      cuda::plan_decode(one.problem(), one.seq_lens.data(), DecodeOptions{}, sms).kernel() ==
      DecodeKernel::kStreamed);
  EXPECT_FALSE(cuda::plan_decode(p.problem(), p.seq_lens.data(), count_opts(1), sms).kernel() ==
               DecodeKernel::kStreamed);
}

TEST(CudaDecodePlan, StreamedKernelForManyShortSingleSplitRequests) {
  ATTNSTATE_REQUIRE_GPU();  // plan_decode queries the device's occupancy for split requests
  // 132 SMs (the rules alone: tests/plan/test_plan_decode.cpp): the automatic policy runs many
  // short requests (one split each, at least 6 items per SM) on the streamed kernel, and keeps the
  // split kernel for split requests, head dim 256, requests longer than 2048 keys, fewer items, and
  // the fixed policies.
  auto plan = [](std::int64_t batch, std::int32_t len, std::int64_t D, const DecodeOptions& o) {
    DecodeProblem pr;
    pr.batch = batch;
    pr.heads_q = 32;
    pr.heads_kv = 8;
    pr.head_dim = D;
    const std::vector<std::int32_t> lens(static_cast<std::size_t>(batch), len);
    return cuda::plan_decode(pr, lens.data(), o, 132);
  };
  const DecodeOptions autom;
  for (std::int64_t D : attnstate_test::stream_head_dims()) {
    const cuda::DecodePlan a = plan(128, 256, D, autom);
    EXPECT_EQ(a.splits().max_splits, 1);
    EXPECT_TRUE(a.kernel() == DecodeKernel::kStreamed) << "head dim " << D;
    EXPECT_EQ(a.workspace_bytes(), 0u);
  }
  EXPECT_TRUE(plan(256, 2048, 128, autom).kernel() == DecodeKernel::kStreamed);
  EXPECT_FALSE(plan(256, 2049, 128, autom).kernel() ==
               DecodeKernel::kStreamed);  // longer than the streamed kernel's cap
  if (!attnstate_test::only_compiled({256}, attnstate_test::decode_head_dims()).empty()) {
    EXPECT_FALSE(plan(128, 256, 256, autom).kernel() == DecodeKernel::kStreamed);  // head dim 256
  }
  EXPECT_FALSE(plan(64, 256, 128, autom).kernel() ==
               DecodeKernel::kStreamed);  // 512 items: under 6 per SM
  EXPECT_FALSE(plan(98, 256, 128, autom).kernel() == DecodeKernel::kStreamed);   // 784 items
  EXPECT_TRUE(plan(99, 256, 128, autom).kernel() == DecodeKernel::kStreamed);    // 792 items
  EXPECT_FALSE(plan(1, 32768, 128, autom).kernel() == DecodeKernel::kStreamed);  // split
  EXPECT_FALSE(plan(128, 256, 128, count_opts(1)).kernel() == DecodeKernel::kStreamed);
  DecodeOptions fixed;
  fixed.policy = SplitPolicy::kFixedSize;
  fixed.split_size = 4096;
  EXPECT_FALSE(plan(128, 256, 128, fixed).kernel() == DecodeKernel::kStreamed);
}

/// True when the build compiles the streamed (and so the split) kernel at head dim 128.
bool has_stream_128() {
  const std::vector<std::int64_t> dims = stream_head_dims();
  return std::find(dims.begin(), dims.end(), 128) != dims.end();
}

/// A bf16 problem of `batch` requests at head dim 128.
DecodeProblem problem_128(std::int64_t batch, std::int64_t heads_q, std::int64_t heads_kv) {
  DecodeProblem pr;
  pr.batch = batch;
  pr.heads_q = heads_q;
  pr.heads_kv = heads_kv;
  pr.head_dim = 128;
  return pr;
}

TEST(CudaDecodePlan, RunRefusesAPlanOfAnotherCatalogByName) {
  // No GPU needed: single-split plans make no device query, and a run checks the plan's catalog
  // fingerprint before anything else.
  if (!has_stream_128()) GTEST_SKIP() << "needs the streamed kernel at head dim 128";
  const DecodeProblem pr = problem_128(2, 8, 2);
  const std::vector<std::int32_t> lens = {100, 50};
  const cuda::DecodePlan plan = cuda::plan_decode(pr, lens.data(), count_opts(1), 132);
  ConstTensorView q{};
  PagedKvCache kv{};
  StateView out{};
  const auto refused = [&](const cuda::DecodePlan& pl, const char* got) {
    try {
      cuda::run_decode(pl, q, kv, out, nullptr, 0);
      ADD_FAILURE() << "no error for " << got;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.status(), Status::kInvalidArgument) << what;
      EXPECT_NE(what.find("attnstate::cuda::run_decode"), std::string::npos) << what;
      EXPECT_NE(what.find("plan"), std::string::npos) << what;
      EXPECT_NE(what.find("kernel catalog fingerprint"), std::string::npos) << what;
      EXPECT_NE(what.find(got), std::string::npos) << what;
    }
  };
  cuda::DecodePlan forged = plan;
  cuda::detail::DecodePlanAccess::data(forged).catalog_fingerprint ^= 0x10;
  refused(forged, "another kernel catalog");
  refused(cuda::DecodePlan{}, "default-constructed");
  try {  // the workspace's initialisation refuses it too
    cuda::init_decode_workspace(forged, nullptr, 0);
    ADD_FAILURE() << "init_decode_workspace took a forged plan";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another kernel catalog"), std::string::npos);
  }
}

TEST(CudaDecodePlan, KernelChoiceInWordsAndHandChoicesThroughOptions) {
  // No GPU needed: single-split plans make no device query.
  if (!has_stream_128()) GTEST_SKIP() << "needs the streamed kernel at head dim 128";
  const DecodeProblem pr = problem_128(200, 32, 8);
  const std::vector<std::int32_t> lens(200, 200);
  const cuda::DecodePlan a = cuda::plan_decode(pr, lens.data(), DecodeOptions{}, 132);
  ASSERT_EQ(a.kernel(), DecodeKernel::kStreamed);
  EXPECT_GE(a.kernel_id(), 0);
  const std::string sa = a.to_string();
  EXPECT_EQ(sa.find("streamed decode"), 0u) << sa;
  EXPECT_NE(sa.find("the automatic policy"), std::string::npos) << sa;
  EXPECT_NE(sa.find("kernel " + std::to_string(a.kernel_id())), std::string::npos) << sa;
  EXPECT_NE(sa.find("split-KV decode"), std::string::npos) << sa;  // its fallback
  DecodeOptions o;
  o.kernel = DecodeKernel::kSplit;
  o.programmatic_launch = true;
  const cuda::DecodePlan b = cuda::plan_decode(pr, lens.data(), o, 132);
  EXPECT_EQ(b.kernel(), DecodeKernel::kSplit);
  EXPECT_TRUE(b.programmatic_launch());
  EXPECT_NE(b.kernel_id(), a.kernel_id());
  const std::string sb = b.to_string();
  EXPECT_EQ(sb.find("split-KV decode"), 0u) << sb;
  EXPECT_NE(sb.find("options.kernel = kSplit"), std::string::npos) << sb;
  EXPECT_EQ(cuda::DecodePlan{}.to_string().find("no plan"), 0u);
  // refused at plan time, by name
  o = count_opts(1);
  o.split_stages = 7;
  try {
    cuda::plan_decode(pr, lens.data(), o, 132);
    ADD_FAILURE() << "options.split_stages = 7 taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attnstate::cuda::plan_decode"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("options.split_stages"), std::string::npos) << e.what();
  }
}

TEST(CudaDecode, SplitCountsAndLengthEdges) {
  ATTNSTATE_REQUIRE_GPU();
  for (std::int64_t page : {16, 64}) {
    DecodeConfig cfg;
    cfg.heads_q = 32;
    cfg.heads_kv = 8;
    cfg.head_dim = 128;
    cfg.page_size = page;
    const std::int32_t pg = static_cast<std::int32_t>(page);
    cfg.seq_lens = {0, 1, pg - 1, pg, pg + 1, 95, 96, 97, 191, 192, 193, 287, 288, 289};
    const DecodeProblemHost p = make_decode_problem(cfg, 200 + page);
    for (int n : {1, 2, 3, kMaxSplits}) {
      const GpuOut g = run_gpu(p, count_opts(n), DType::kF32, LseBase::kNatural);
      expect_matches_reference(p, g, DType::kF32, LseBase::kNatural,
                               "page " + std::to_string(page) + " splits " + std::to_string(n));
    }
    for (int size : {16, 96}) {
      DecodeOptions o;
      o.policy = SplitPolicy::kFixedSize;
      o.split_size = size;
      const GpuOut g = run_gpu(p, o, DType::kF32, LseBase::kBase2);
      expect_matches_reference(p, g, DType::kF32, LseBase::kBase2,
                               "split_size " + std::to_string(size));
    }
    const GpuOut g = run_gpu(p, DecodeOptions{}, DType::kF32, LseBase::kNatural);
    expect_matches_reference(p, g, DType::kF32, LseBase::kNatural, "auto");
  }
}

TEST(CudaDecode, RaggedPagedSplitTogether) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.q_len = 3;
  cfg.heads_q = 64;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.page_size = 16;
  cfg.layout = KvLayout::kHND;
  cfg.block_table = true;
  cfg.seq_lens = {0, 1, 4000, 15, 16, 17, 1023, 2049, 0, 2};
  const DecodeProblemHost p = make_decode_problem(cfg, 300);
  for (int n : {7, 64}) {
    const GpuOut g = run_gpu(p, count_opts(n), DType::kF32, LseBase::kNatural);
    expect_matches_reference(p, g, DType::kF32, LseBase::kNatural, "splits " + std::to_string(n));
  }
  const GpuOut g = run_gpu(p, DecodeOptions{}, DType::kBF16, LseBase::kNatural);
  expect_matches_reference(p, g, DType::kBF16, LseBase::kNatural, "auto");
}

TEST(CudaDecode, EveryPageSizeMatchesReference) {
  // Pages of 1..128 tokens (powers of two and others), both layouts, both page tables: tiles
  // that span pages gather their page ids a tile ahead and shuffle them to the copies.
  ATTNSTATE_REQUIRE_GPU();
  std::uint64_t seed = 3000;
  // pages of 5 at head dim 64 where the build has it
  const std::int64_t small_d =
      attnstate_test::only_compiled({64}, attnstate_test::decode_head_dims()).empty() ? 128 : 64;
  for (std::int64_t page : {1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 64, 128}) {
    for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
      DecodeConfig cfg = shape_config(page % 3 == 0 ? 2 : 1, 32, 8, page == 5 ? small_d : 128, page,
                                      layout, page % 2 == 0, DType::kBF16, DType::kBF16);
      cfg.seq_lens = {static_cast<std::int32_t>(page) + 1, 0, 1, 77, 1000, 17, 2 * 16 + 3};
      const DecodeProblemHost p = make_decode_problem(cfg, seed++);
      for (int n : {1, 5}) {
        const GpuOut g = run_gpu(p, count_opts(n), DType::kF32, LseBase::kNatural);
        expect_matches_reference(p, g, DType::kF32, LseBase::kNatural,
                                 cfg.name() + " splits " + std::to_string(n));
      }
      const GpuOut g = run_gpu(p, DecodeOptions{}, DType::kBF16, LseBase::kBase2);
      expect_matches_reference(p, g, DType::kBF16, LseBase::kBase2, cfg.name() + " auto");
    }
  }
}

TEST(CudaDecode, AutomaticPlanOfARaggedBatchBalancesAndMatches) {
  // One long request among short ones: the automatic plan splits from all the lengths (the long
  // request into many splits, the short ones into few), matches the reference and repeats
  // bitwise; a plan made for these maximum lengths serves shorter ones.
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.heads_q = 32;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.page_size = 16;
  cfg.block_table = true;
  cfg.seq_lens = {24000, 300, 2000, 1, 0, 700};
  const DecodeProblemHost p = make_decode_problem(cfg, 3100);
  const GpuOut a = run_gpu(p, DecodeOptions{}, DType::kF32, LseBase::kNatural);
  EXPECT_EQ(a.plan.splits().policy, SplitPolicy::kFixedSize);
  EXPECT_GT(a.plan.splits().max_splits, 8) << "the long request should be split finely";
  expect_matches_reference(p, a, DType::kF32, LseBase::kNatural, "ragged auto");
  const GpuOut b = run_plan(p, a.plan, DType::kF32, LseBase::kNatural);
  expect_matches_reference(p, b, DType::kF32, LseBase::kNatural, "ragged auto again");
  ASSERT_EQ(a.o.size(), b.o.size());
  EXPECT_EQ(0, std::memcmp(a.o.data(), b.o.data(), a.o.size()));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), 4 * a.lse.size()));
  // the same plan over shorter lengths (the pages and table stay)
  DecodeConfig shorter = cfg;
  shorter.seq_lens = {9000, 299, 0, 1, 0, 16};
  const DecodeProblemHost q = make_decode_problem(shorter, 3101);
  const GpuOut c = run_plan(q, a.plan, DType::kF32, LseBase::kNatural);
  expect_matches_reference(q, c, DType::kF32, LseBase::kNatural, "ragged plan, shorter lengths");
}

/// Runs the CPU decode of `p` with `layout` and `variant` into an f32 natural state.
HostState cpu_variant(const DecodeProblemHost& p, const SplitLayout& layout, float scale,
                      const AttentionVariant& variant) {
  HostState c(p.tokens(), p.cfg.heads_q, p.cfg.head_dim, DType::kF32, LseBase::kNatural);
  cpu::decode(p.q_view(), p.kv_view(), layout, scale, variant, c.view);
  return c;
}

/// Expects the GPU state `g` within the CPU decode's `c` (f32 natural): `o` within the bf16
/// decode's tolerance (the probabilities are bf16 operands of `P V` on the GPU), LSEs within
/// 1e-3, empty rows on both sides alike (a NaN anywhere fails).
void expect_near_cpu(const GpuOut& g, const HostState& c, const std::string& what) {
  ASSERT_EQ(g.o.size(), c.o.size());
  const double worst =
      max_abs_diff(g.o.data(), c.o.data(), DType::kF32, static_cast<std::int64_t>(g.o.size() / 4));
  EXPECT_LE(worst, o_tol(DType::kBF16, DType::kF32)) << what;
  int bad = 0;
  for (std::size_t i = 0; i < c.lse.size(); ++i) {
    const float a = g.lse[i], b = c.lse[i];
    const bool ok = std::isinf(a) || std::isinf(b) ? a == b : std::fabs(a - b) <= 1e-3f;
    if (!ok && bad++ < 3) ADD_FAILURE() << what << ": lse " << i << " gpu " << a << " cpu " << b;
  }
}

TEST(CudaDecode, SlidingWindowAndSoftCapMatchTheCpuDecode) {
  // Windows (none, 0, 1, 37, 300, longer than any request) x soft caps (none, 5, 30) x split
  // policies, q_len 1 and 3, pages of 16 and 5, ragged lengths with empty and one-key requests:
  // the GPU against the CPU decode of the same layout and variant (the CPU's own tests check it
  // against the double reference), outputs poisoned first.
  ATTNSTATE_REQUIRE_GPU();
  std::uint64_t seed = 3200;
  for (std::int64_t q_len : {1, 3})
    for (std::int64_t page : {16, 5}) {
      DecodeConfig cfg = shape_config(q_len, 32, 8, 128, page, KvLayout::kNHD, page == 16,
                                      DType::kBF16, DType::kBF16);
      cfg.q_gain = 4.f;  // large scores, so that the cap matters
      cfg.seq_lens = {3000, 0, 1, 700, 17, 1500};
      const DecodeProblemHost p = make_decode_problem(cfg, seed++);
      for (std::int64_t window : {kNoWindow, std::int64_t{0}, std::int64_t{1}, std::int64_t{37},
                                  std::int64_t{300}, std::int64_t{100000}})
        for (float cap : {0.f, 5.f, 30.f}) {
          for (int policy = 0; policy < 3; ++policy) {
            DecodeOptions o = policy == 0 ? DecodeOptions{} : count_opts(policy == 1 ? 7 : 1);
            o.variant.window_left = window;
            o.variant.logits_soft_cap = cap;
            const GpuOut g = run_gpu(p, o, DType::kF32, LseBase::kNatural);
            EXPECT_FALSE(g.plan.kernel() == DecodeKernel::kStreamed);
            const HostState c = cpu_variant(p, g.plan.splits(), g.plan.scale(), o.variant);
            expect_near_cpu(g, c,
                            cfg.name() + " window " + std::to_string(window) + " cap " +
                                std::to_string(cap) + " policy " + std::to_string(policy));
          }
        }
    }
}

TEST(CudaDecode, WindowedPlanCostsTheWindow) {
  // A window of 512 over a 100k-key request: the plan splits only the keys the kernel reads, so
  // it has as many splits as a 512-key request would, and the result matches the CPU decode.
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.heads_q = 32;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.seq_lens = {100000, 40000};
  const DecodeProblemHost p = make_decode_problem(cfg, 3300);
  DecodeOptions o;
  o.variant.window_left = 512;
  const GpuOut g = run_gpu(p, o, DType::kF32, LseBase::kNatural);
  DecodeConfig small = cfg;
  small.seq_lens = {512 + 16, 512 + 16};
  const DecodeProblemHost ps = make_decode_problem(small, 3301);
  const GpuOut gs = run_gpu(ps, DecodeOptions{}, DType::kF32, LseBase::kNatural);
  EXPECT_LE(g.plan.splits().max_splits, gs.plan.splits().max_splits + 1);
  const HostState c = cpu_variant(p, g.plan.splits(), g.plan.scale(), o.variant);
  expect_near_cpu(g, c, "window 512 of 100k");
  // a plan with a variant refuses prior states and bad variants are named
  DecodeOptions bad;
  bad.variant.window_left = -2;
  EXPECT_THROW(cuda::plan_decode(p.problem(), p.seq_lens.data(), bad, num_sms()), Error);
  bad.variant.window_left = kNoWindow;
  bad.variant.logits_soft_cap = -1.f;
  try {
    cuda::plan_decode(p.problem(), p.seq_lens.data(), bad, num_sms());
    FAIL() << "a negative cap was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("options.variant.logits_soft_cap"), std::string::npos);
  }
}

TEST(CudaDecode, LargeLogitsQueriesTimes40) {
  ATTNSTATE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    DecodeConfig cfg;
    cfg.heads_q = 32;
    cfg.heads_kv = 4;
    cfg.head_dim = 128;
    cfg.q_gain = 40.f;
    cfg.q_dtype = cfg.kv_dtype = dt;
    cfg.seq_lens = {2000, 37, 1};
    const DecodeProblemHost p = make_decode_problem(cfg, 400);
    for (int n : {1, 4, 33}) {
      const GpuOut g = run_gpu(p, count_opts(n), DType::kF32, LseBase::kNatural);
      expect_matches_reference(p, g, DType::kF32, LseBase::kNatural,
                               std::string(to_string(dt)) + " splits " + std::to_string(n));
    }
  }
}

TEST(CudaDecode, AgreesWithCpuDecodeOfTheSamePlan) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.q_len = 2;
  cfg.heads_q = 32;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.seq_lens = {3000, 700, 5};
  const DecodeProblemHost p = make_decode_problem(cfg, 500);
  const GpuOut g = run_gpu(p, DecodeOptions{}, DType::kF32, LseBase::kNatural);
  expect_matches_reference(p, g, DType::kF32, LseBase::kNatural, "gpu");
  HostState c(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  cpu::decode(p.q_view(), p.kv_view(), g.plan.splits(), g.plan.scale(), c.view);
  GpuOut cpu_out;  // the CPU result, checked against the reference too
  cpu_out.plan = g.plan;
  cpu_out.o = c.o;
  cpu_out.lse = c.lse;
  expect_matches_reference(p, cpu_out, DType::kF32, LseBase::kNatural, "cpu");
  ASSERT_EQ(c.o.size(), g.o.size());
  // NaN-propagating: a NaN on either side makes `worst` infinite.
  const double worst =
      max_abs_diff(g.o.data(), c.o.data(), DType::kF32, static_cast<std::int64_t>(g.o.size() / 4));
  EXPECT_LE(worst, o_tol(DType::kBF16, DType::kF32));
  for (std::size_t i = 0; i < g.lse.size(); ++i) EXPECT_NEAR(g.lse[i], c.lse[i], 1e-3);
}

TEST(CudaDecode, BitwiseRepeatable) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.heads_q = 64;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.seq_lens = {5000, 100};
  const DecodeProblemHost p = make_decode_problem(cfg, 600);
  const GpuOut a = run_gpu(p, count_opts(13), DType::kF32, LseBase::kNatural);
  const GpuOut b = run_gpu(p, count_opts(13), DType::kF32, LseBase::kNatural);
  // Each run against the reference: two runs that leave the same row unwritten (NaN) would
  // otherwise be bitwise equal.
  expect_matches_reference(p, a, DType::kF32, LseBase::kNatural, "run 1");
  expect_matches_reference(p, b, DType::kF32, LseBase::kNatural, "run 2");
  ASSERT_EQ(a.o.size(), b.o.size());
  ASSERT_EQ(a.lse.size(), b.lse.size());
  EXPECT_EQ(0, std::memcmp(a.o.data(), b.o.data(), a.o.size()));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), 4 * a.lse.size()));
}

TEST(CudaDecode, FixedSizeRowsIndependentOfBatch) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.heads_q = 32;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.seq_lens = {1500};
  const DecodeProblemHost alone = make_decode_problem(cfg, 700);
  DecodeConfig cfg2 = cfg;
  cfg2.seq_lens = {9000, 1500, 5};
  DecodeProblemHost others = make_decode_problem(cfg2, 701);
  const std::int64_t D = cfg.head_dim;
  for (std::int64_t t = 0; t < 1504; ++t)
    for (std::int64_t h = 0; h < cfg.heads_kv; ++h) {
      const std::int64_t src = alone.kv_offset(0, t, h);
      const std::int64_t dst = others.kv_offset(1, t, h);
      std::memcpy(&others.k[2 * dst], &alone.k[2 * src], 2 * D);
      std::memcpy(&others.v[2 * dst], &alone.v[2 * src], 2 * D);
    }
  const std::int64_t qrow = cfg.heads_q * D;
  std::memcpy(&others.q[2 * qrow], alone.q.data(), 2 * qrow);
  DecodeOptions o;
  o.policy = SplitPolicy::kFixedSize;
  o.split_size = 256;
  const GpuOut a = run_gpu(alone, o, DType::kF32, LseBase::kNatural);
  const GpuOut b = run_gpu(others, o, DType::kF32, LseBase::kNatural);
  // Both against the reference (of `others` as modified): the bitwise check alone would pass a
  // row both runs leave unwritten (NaN).
  expect_matches_reference(alone, a, DType::kF32, LseBase::kNatural, "alone");
  expect_matches_reference(others, b, DType::kF32, LseBase::kNatural, "in a batch");
  ASSERT_EQ(a.o.size(), static_cast<std::size_t>(4 * qrow));
  ASSERT_EQ(b.o.size(), static_cast<std::size_t>(3 * 4 * qrow));
  EXPECT_EQ(0, std::memcmp(a.o.data(), b.o.data() + 4 * qrow, 4 * qrow));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data() + cfg.heads_q, 4 * cfg.heads_q));
}

// Up to 8 splits are merged inside a thread-block cluster, more through the workspace with
// tickets. A plan made for longer requests (same split size) takes the workspace path for the
// same requests: both merges must give bitwise the same rows, for every head dim, with one and
// several row tiles, with and without vector-aligned outputs.
TEST(CudaDecode, ClusterMergeEqualsWorkspaceMergeBitwise) {
  ATTNSTATE_REQUIRE_GPU();
  const std::vector<std::int64_t> dims = attnstate_test::decode_head_dims();
  std::uint64_t seed = 900;
  for (std::int64_t D : dims) {
    for (std::int64_t q_len : {1, 3}) {
      DecodeConfig cfg;
      cfg.q_len = q_len;
      cfg.heads_q = 16;
      cfg.heads_kv = 2;
      cfg.head_dim = D;
      cfg.page_size = 16;
      cfg.block_table = q_len == 1;
      cfg.seq_lens = std::vector<std::int32_t>{8 * 96, 0, 2, 8 * 96 - 5, 200, 96};
      const DecodeProblemHost p = make_decode_problem(cfg, seed++);
      DecodeOptions o;
      o.policy = SplitPolicy::kFixedSize;
      o.split_size = 96;
      for (DType od : {DType::kF32, DType::kBF16}) {
        const GpuOut a = run_gpu(p, o, od, LseBase::kNatural);
        ASSERT_EQ(a.plan.splits().max_splits, 8);
        // The same problem under a plan for requests of up to 20 splits.
        std::vector<std::int32_t> longer(p.seq_lens.begin(), p.seq_lens.end());
        longer[0] = 20 * 96;
        const cuda::DecodePlan plan_b = cuda::plan_decode(p.problem(), longer.data(), o, num_sms());
        ASSERT_EQ(plan_b.splits().max_splits, 20);
        DeviceProblem d(p);
        DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan_b.workspace_bytes()));
        ws.poison();
        cuda::init_decode_workspace(plan_b, ws.get(), ws.bytes());
        DeviceState out(p.tokens(), cfg.heads_q, D, od, LseBase::kNatural);
        cuda::run_decode(plan_b, d.qv(p), d.kv(p), out.view, ws.get(), ws.bytes());
        ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<unsigned char> bo = out.o.download();
        const std::vector<float> bl = out.lse.download();
        const std::string what =
            "D " + std::to_string(D) + " q_len " + std::to_string(q_len) + " out " + to_string(od);
        EXPECT_EQ(0, std::memcmp(a.o.data(), bo.data(), a.o.size())) << what;
        EXPECT_EQ(0, std::memcmp(a.lse.data(), bl.data(), 4 * a.lse.size())) << what;
        expect_matches_reference(p, a, od, LseBase::kNatural, what);
      }
    }
  }
}

// More splits than a cluster merges whole go through the workspace: in groups of consecutive
// splits sharing a cluster (one ticket per group, the last group's CTAs share the columns) when
// every group is resident at once, else one ticket per CTA. A prefix of the batch (a small grid:
// groups) and the whole batch (hundreds of CTAs per SM slot: tickets) must give bitwise the same
// rows, with partial and empty groups (ragged lengths) and one and two row tiles.
TEST(CudaDecode, WorkspaceGroupMergeEqualsTicketMergeBitwise) {
  ATTNSTATE_REQUIRE_GPU();
  std::uint64_t seed = 950;
  for (std::int64_t D :
       attnstate_test::only_compiled({64, 128}, attnstate_test::decode_head_dims())) {
    for (std::int64_t q_len : {1, 3}) {
      DecodeConfig cfg;
      cfg.q_len = q_len;
      cfg.heads_q = 64;
      cfg.heads_kv = 8;
      cfg.head_dim = D;
      cfg.block_table = q_len == 1;
      cfg.seq_lens = std::vector<std::int32_t>{1000, 300, 0, 64 * 9 + 3};
      for (int b = 0; b < 8; ++b) cfg.seq_lens.push_back(1024 - 7 * b);
      const DecodeProblemHost p = make_decode_problem(cfg, seed++);
      DecodeOptions o;
      o.policy = SplitPolicy::kFixedSize;
      o.split_size = 64;
      const GpuOut all = run_gpu(p, o, DType::kF32, LseBase::kNatural);
      ASSERT_EQ(all.plan.splits().max_splits, 16);
      const std::string what = "D " + std::to_string(D) + " q_len " + std::to_string(q_len);
      expect_matches_reference(p, all, DType::kF32, LseBase::kNatural, what);
      DeviceProblem d(p);
      for (std::int64_t kb : {1, 2, 4}) {
        PagedKvCache kv = d.kv(p);
        kv.batch = kb;
        ConstTensorView qv = d.qv(p);
        qv.shape[0] = kb;
        DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, all.plan.workspace_bytes()));
        ws.poison();
        cuda::init_decode_workspace(all.plan, ws.get(), ws.bytes());
        DeviceState out(kb * q_len, cfg.heads_q, D, DType::kF32, LseBase::kNatural);
        cuda::run_decode(all.plan, qv, kv, out.view, ws.get(), ws.bytes());
        ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<unsigned char> ao = out.o.download();
        const std::vector<float> al = out.lse.download();
        EXPECT_EQ(0, std::memcmp(ao.data(), all.o.data(), ao.size())) << what << " prefix " << kb;
        EXPECT_EQ(0, std::memcmp(al.data(), all.lse.data(), 4 * al.size()))
            << what << " prefix " << kb;
      }
    }
  }
}

// Short splits run in a configuration with one more CTA per SM when the grid exceeds one wave or
// when only it keeps every cluster resident; the same request alone runs in the default one.
// The rows must agree bitwise (fixed split size) and match the reference.
TEST(CudaDecode, ShortSplitConfigurationMatchesDefaultBitwise) {
  ATTNSTATE_REQUIRE_GPU();
  struct Case {
    int batch;
    std::int32_t len, split;
  };
  // 40 one-split requests (320 CTAs); 4 requests of 8 splits (32 clusters of 8).
  const Case cases[] = {{40, 250, 256}, {4, 1024, 128}};
  std::uint64_t seed = 980;
  for (const Case& c : cases) {
    DecodeConfig cfg;
    cfg.heads_q = 32;
    cfg.heads_kv = 8;
    cfg.head_dim = 128;
    cfg.block_table = true;
    for (int b = 0; b < c.batch; ++b) cfg.seq_lens.push_back(c.len - (b % 3));
    const DecodeProblemHost p = make_decode_problem(cfg, seed++);
    DecodeOptions o;
    o.policy = SplitPolicy::kFixedSize;
    o.split_size = c.split;
    const GpuOut all = run_gpu(p, o, DType::kF32, LseBase::kNatural);
    expect_matches_reference(p, all, DType::kF32, LseBase::kNatural,
                             "batch " + std::to_string(c.batch));
    // Request 0 alone, same buffers and plan.
    DeviceProblem d(p);
    PagedKvCache kv = d.kv(p);
    kv.batch = 1;
    ConstTensorView qv = d.qv(p);
    qv.shape[0] = 1;
    DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, all.plan.workspace_bytes()));
    cuda::init_decode_workspace(all.plan, ws.get(), ws.bytes());
    DeviceState out(1, cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
    cuda::run_decode(all.plan, qv, kv, out.view, ws.get(), ws.bytes());
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<unsigned char> ao = out.o.download();
    const std::vector<float> al = out.lse.download();
    EXPECT_EQ(0, std::memcmp(ao.data(), all.o.data(), ao.size())) << "batch " << c.batch;
    EXPECT_EQ(0, std::memcmp(al.data(), all.lse.data(), 4 * al.size())) << "batch " << c.batch;
  }
}

// Queries whose rows do not start on 16-byte boundaries are loaded element by element, and
// outputs whose rows are not 4-element aligned are written element by element.
TEST(CudaDecode, UnalignedQueryAndOutputRows) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.q_len = 2;
  cfg.heads_q = 32;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.seq_lens = {700, 1, 2500};
  const DecodeProblemHost p = make_decode_problem(cfg, 950);
  const std::int64_t D = cfg.head_dim, hq = cfg.heads_q;
  const std::int64_t rows = p.tokens() * hq;
  // Query rows of D + 3 elements.
  std::vector<unsigned char> q_pad(rows * (D + 3) * 2, 0);
  for (std::int64_t r = 0; r < rows; ++r)
    std::memcpy(q_pad.data() + r * (D + 3) * 2, p.q.data() + r * D * 2, D * 2);
  const DeviceBuffer<unsigned char> dq = upload(q_pad);
  ConstTensorView qv = p.q_view();
  qv.data = dq.get();
  qv.space = MemorySpace::kDevice;
  qv.stride[2] = D + 3;
  qv.stride[1] = hq * (D + 3);
  qv.stride[0] = cfg.q_len * hq * (D + 3);
  for (DType od : {DType::kF32, DType::kF16}) {
    for (int n : {1, 4, 20}) {
      DeviceProblem d(p);
      const cuda::DecodePlan plan =
          cuda::plan_decode(p.problem(), p.seq_lens.data(), count_opts(n), num_sms());
      DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
      cuda::init_decode_workspace(plan, ws.get(), ws.bytes());
      // Rows of D + 1 elements: every other row starts off a 4-element boundary.
      DeviceBuffer<unsigned char> o(rows * (D + 1) * size_of(od));
      DeviceBuffer<float> lse(rows);
      o.poison();
      lse.poison();
      StateView view = make_state_view(o.get(), od, lse.get(), p.tokens(), hq, D, LseBase::kNatural,
                                       MemorySpace::kDevice);
      view.o_stride_head = D + 1;
      view.o_stride_token = hq * (D + 1);
      cuda::run_decode(plan, qv, d.kv(p), view, ws.get(), ws.bytes());
      ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<unsigned char> raw = o.download();
      std::vector<unsigned char> packed(rows * D * size_of(od));
      for (std::int64_t r = 0; r < rows; ++r)
        std::memcpy(packed.data() + r * D * size_of(od), raw.data() + r * (D + 1) * size_of(od),
                    D * size_of(od));
      GpuOut g;
      g.plan = plan;
      g.o = packed;
      g.lse = lse.download();
      expect_matches_reference(p, g, od, LseBase::kNatural,
                               std::string(to_string(od)) + " splits " + std::to_string(n));
    }
  }
}

TEST(CudaDecode, GraphReplayOfMaxPlanServesShorterRequests) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.q_len = 2;
  cfg.heads_q = 32;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.seq_lens = {3000, 3000, 3000, 3000};
  DecodeProblemHost p = make_decode_problem(cfg, 800);
  DeviceProblem d(p);
  const cuda::DecodePlan plan =
      cuda::plan_decode(p.problem(), p.seq_lens.data(), DecodeOptions{}, num_sms());
  ASSERT_GT(plan.splits().max_splits, 1);
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  DeviceState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  cudaStream_t stream;
  ATTNSTATE_CUDA_CHECK(cudaStreamCreate(&stream));
  cuda::init_decode_workspace(plan, ws.get(), ws.bytes(), stream);
  ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cuda::run_decode(plan, d.qv(p), d.kv(p), out.view, ws.get(), ws.bytes(), stream);
  ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const std::vector<std::vector<std::int32_t>> lens = {
      {3000, 3000, 3000, 3000}, {100, 0, 2999, 17}, {1, 1500, 0, 0}, {3000, 2, 64, 65}};
  for (const auto& l : lens) {
    const GpuOut g = replay(exec, stream, plan, p, d, out, l);
    expect_matches_reference(p, g, DType::kF32, LseBase::kNatural,
                             "replay lens " + std::to_string(l[0]) + "," + std::to_string(l[1]));
  }
  ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ATTNSTATE_CUDA_CHECK(cudaGraphDestroy(graph));
  ATTNSTATE_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(CudaDecode, ProgrammaticLaunchWaitsForThePreviousKernel) {
  // Two chained programmatic decodes sharing one workspace: the second reads the first's output
  // (poisoned with NaN first) as its queries, so it matches the reference only if every CTA
  // waited for the first kernel; launched directly and replayed from a graph.
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.heads_q = 32;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.q_gain = 4.f;
  cfg.seq_lens = {16000, 700};
  const DecodeProblemHost p = make_decode_problem(cfg, 901);
  DeviceProblem d(p);
  DecodeOptions chained;
  chained.programmatic_launch = true;
  const cuda::DecodePlan plan =
      cuda::plan_decode(p.problem(), p.seq_lens.data(), chained, num_sms());
  ASSERT_GT(plan.splits().max_splits, 1);
  ASSERT_TRUE(plan.programmatic_launch());
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  DeviceState mid(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kBF16, LseBase::kNatural);
  DeviceState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  ConstTensorView q2 = d.qv(p);  // the first decode's output, read as queries
  q2.data = mid.o.get();
  cudaStream_t stream;
  ATTNSTATE_CUDA_CHECK(cudaStreamCreate(&stream));
  cuda::init_decode_workspace(plan, ws.get(), ws.bytes(), stream);
  auto chain = [&] {
    cuda::run_decode(plan, d.qv(p), d.kv(p), mid.view, ws.get(), ws.bytes(), stream);
    cuda::run_decode(plan, q2, d.kv(p), out.view, ws.get(), ws.bytes(), stream);
  };
  auto check = [&](const std::string& what) {
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
    GpuOut first;
    first.plan = plan;
    first.o = mid.o.download();
    first.lse = mid.lse.download();
    expect_matches_reference(p, first, DType::kBF16, LseBase::kNatural, what + ": first");
    DecodeProblemHost p2 = p;  // the second decode's problem: the first's output as queries
    p2.q.assign(first.o.begin(), first.o.end());
    GpuOut second;
    second.plan = plan;
    second.o = out.o.download();
    second.lse = out.lse.download();
    expect_matches_reference(p2, second, DType::kF32, LseBase::kNatural, what + ": second");
  };
  auto poison = [&] {
    for (DeviceState* s : {&mid, &out}) {
      s->o.poison();
      s->lse.poison();
    }
  };
  poison();
  chain();
  check("direct");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  chain();
  ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    poison();
    ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    check("graph replay " + std::to_string(rep));
  }
  ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ATTNSTATE_CUDA_CHECK(cudaGraphDestroy(graph));
  ATTNSTATE_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(CudaDecode, LengthsClampedToOwnedPages) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.heads_q = 8;
  cfg.heads_kv = 2;
  cfg.head_dim = attnstate_test::decode_head_dims().front();  // 64 in the default build
  cfg.seq_lens = {40, 100};
  DecodeProblemHost p = make_decode_problem(cfg, 900);
  DeviceProblem d(p);
  const cuda::DecodePlan plan =
      cuda::plan_decode(p.problem(), p.seq_lens.data(), count_opts(2), num_sms());
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  cuda::init_decode_workspace(plan, ws.get(), ws.bytes());
  DeviceState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  d.lens.upload({100000, 100});  // request 0 owns 3 pages = 48 tokens
  cuda::run_decode(plan, d.qv(p), d.kv(p), out.view, ws.get(), ws.bytes());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  p.seq_lens = {48, 100};
  GpuOut g;
  g.plan = plan;
  g.o = out.o.download();
  g.lse = out.lse.download();
  expect_matches_reference(p, g, DType::kF32, LseBase::kNatural, "clamped");
}

TEST(CudaDecode, LargeCacheAbove2To31Elements) {
  ATTNSTATE_REQUIRE_GPU();
  // One pool of 2^31 + 2^20 elements (K and V share it), request pages at the far end.
  const std::int64_t D = 128, hkv = 8, page = 16;
  const std::int64_t page_elems = page * hkv * D;
  const std::int64_t num_pages = ((std::int64_t{1} << 31) + (1 << 20)) / page_elems + 1;
  const std::size_t bytes = static_cast<std::size_t>(num_pages * page_elems * 2);
  std::size_t free_b = 0, total_b = 0;
  ATTNSTATE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < bytes + (std::size_t{1} << 30)) GTEST_SKIP() << "not enough GPU memory";
  DecodeConfig cfg;
  cfg.heads_q = 32;
  cfg.heads_kv = hkv;
  cfg.head_dim = D;
  cfg.page_size = page;
  cfg.block_table = true;
  cfg.seq_lens = {600, 37};
  DecodeProblemHost p = make_decode_problem(cfg, 1000);
  // Same keys for K and V: the test aliases them.
  p.v = p.k;
  DeviceBuffer<unsigned char> pool(bytes);
  // Move page i of the host problem to pool page num_pages - 1 - i.
  std::vector<std::int32_t> bt = p.block_table;
  for (auto& id : bt) id = static_cast<std::int32_t>(num_pages - 1 - id);
  for (std::int64_t i = 0; i < p.num_pages; ++i)
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(pool.get() + (num_pages - 1 - i) * page_elems * 2,
                                    p.k.data() + i * page_elems * 2, page_elems * 2,
                                    cudaMemcpyHostToDevice));
  DeviceBuffer<std::int32_t> dbt = upload(bt), dlens = upload(p.seq_lens);
  DeviceBuffer<unsigned char> dq = upload(p.q);
  PagedKvCache kv = p.kv_view();
  kv.k = kv.v = pool.get();
  kv.num_pages = num_pages;
  kv.block_table = dbt.get();
  kv.seq_lens = dlens.get();
  kv.space = MemorySpace::kDevice;
  ConstTensorView q = p.q_view();
  q.data = dq.get();
  q.space = MemorySpace::kDevice;
  const cuda::DecodePlan plan =
      cuda::plan_decode(p.problem(), p.seq_lens.data(), count_opts(3), num_sms());
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  cuda::init_decode_workspace(plan, ws.get(), ws.bytes());
  DeviceState out(p.tokens(), cfg.heads_q, D, DType::kF32, LseBase::kNatural);
  cuda::run_decode(plan, q, kv, out.view, ws.get(), ws.bytes());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  GpuOut g;
  g.plan = plan;
  g.o = out.o.download();
  g.lse = out.lse.download();
  expect_matches_reference(p, g, DType::kF32, LseBase::kNatural, "large pool");
}

TEST(CudaDecode, RejectsBadArguments) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg;
  cfg.head_dim = attnstate_test::decode_head_dims().front();  // 64 in the default build
  cfg.seq_lens = {40, 20};
  const DecodeProblemHost p = make_decode_problem(cfg, 1100);
  DeviceProblem d(p);
  const cuda::DecodePlan plan0 =
      cuda::plan_decode(p.problem(), p.seq_lens.data(), count_opts(2), num_sms());
  DeviceBuffer<unsigned char> ws(plan0.workspace_bytes() + 16);
  cuda::init_decode_workspace(plan0, ws.get(), ws.bytes());
  DeviceState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  auto expect_err = [&](auto&& f, Status st, const char* name) {
    try {
      f();
      ADD_FAILURE() << "no error for " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), st) << name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  const PagedKvCache kv = d.kv(p);
  const ConstTensorView q = d.qv(p);
  auto run = [&](const cuda::DecodePlan& pl, const ConstTensorView& qq, const PagedKvCache& kk,
                 StateView o, std::size_t wsb) { cuda::run_decode(pl, qq, kk, o, ws.get(), wsb); };
  {
    DecodeProblem pr = p.problem();
    pr.head_dim = 96;
    expect_err([&] { cuda::plan_decode(pr, p.seq_lens.data(), {}, 132); }, Status::kNotSupported,
               "problem.head_dim");
    pr = p.problem();
    pr.q_dtype = DType::kF32;
    expect_err([&] { cuda::plan_decode(pr, p.seq_lens.data(), {}, 132); }, Status::kNotSupported,
               "problem.q_dtype");
    pr = p.problem();
    pr.q_len = 9;
    expect_err([&] { cuda::plan_decode(pr, p.seq_lens.data(), {}, 132); }, Status::kInvalidArgument,
               "problem.q_len");
    expect_err([&] { cuda::plan_decode(p.problem(), p.seq_lens.data(), {}, 0); },
               Status::kInvalidArgument, "num_sms");
  }
  expect_err([&] { run(plan0, q, kv, out.view, plan0.workspace_bytes() - 1); },
             Status::kWorkspaceTooSmall, "workspace_bytes");
  {
    DecodeOptions o = count_opts(2);  // two splits: the streamed kernel does not apply
    o.kernel = DecodeKernel::kStreamed;
    expect_err([&] { cuda::plan_decode(p.problem(), p.seq_lens.data(), o, num_sms()); },
               Status::kInvalidArgument, "options.kernel");
    // a plan of another shape: its problem against the tensors
    DecodeProblem pr = p.problem();
    pr.q_len = 2;
    const std::vector<std::int32_t> lens = p.seq_lens;
    const cuda::DecodePlan other = cuda::plan_decode(pr, lens.data(), count_opts(2), num_sms());
    expect_err([&] { run(other, q, kv, out.view, ws.bytes()); }, Status::kInvalidArgument,
               "q.shape[1]");
    // a plan of a build with another kernel catalog (forged) and one no planner made
    cuda::DecodePlan forged = plan0;
    cuda::detail::DecodePlanAccess::data(forged).catalog_fingerprint ^= 1;
    expect_err([&] { run(forged, q, kv, out.view, ws.bytes()); }, Status::kInvalidArgument,
               "another kernel catalog");
    expect_err([&] { run(cuda::DecodePlan{}, q, kv, out.view, ws.bytes()); },
               Status::kInvalidArgument, "default-constructed");
  }
  {
    auto k2 = kv;
    k2.space = MemorySpace::kHost;
    expect_err([&] { run(plan0, q, k2, out.view, ws.bytes()); }, Status::kInvalidArgument,
               "kv.space");
  }
  {
    auto k2 = kv;
    k2.k = static_cast<const char*>(kv.k) + 2;
    expect_err([&] { run(plan0, q, k2, out.view, ws.bytes()); }, Status::kInvalidArgument, "kv.k");
  }
  {
    auto k2 = kv;
    k2.dtype = DType::kF16;
    expect_err([&] { run(plan0, q, k2, out.view, ws.bytes()); }, Status::kInvalidArgument,
               "kv.dtype");
  }
  {
    auto q2 = q;
    q2.shape[3] = cfg.head_dim * 2;  // (not the plan's head dim in any build)
    expect_err([&] { run(plan0, q2, kv, out.view, ws.bytes()); }, Status::kInvalidArgument,
               "q.shape[3]");
  }
  {
    auto o2 = out.view;
    o2.o = nullptr;
    expect_err([&] { run(plan0, q, kv, o2, ws.bytes()); }, Status::kInvalidArgument, "out.o");
  }
  {
    auto o2 = out.view;
    o2.space = MemorySpace::kHost;
    expect_err([&] { run(plan0, q, kv, o2, ws.bytes()); }, Status::kInvalidArgument, "out.space");
  }
  {
    auto k2 = kv;
    k2.page_indices = nullptr;
    expect_err([&] { run(plan0, q, k2, out.view, ws.bytes()); }, Status::kInvalidArgument,
               "kv.page_indices");
  }
  {
    auto k2 = kv;  // only V misaligned: the message names V
    k2.v = static_cast<const char*>(kv.v) + 2;
    expect_err([&] { run(plan0, q, k2, out.view, ws.bytes()); }, Status::kInvalidArgument,
               "'kv.v'");
    k2 = kv;
    k2.layout = static_cast<KvLayout>(3);
    expect_err([&] { run(plan0, q, k2, out.view, ws.bytes()); }, Status::kInvalidArgument,
               "'kv.layout'");
  }
  {
    auto o2 = out.view;  // the output's LSEs inside the workspace
    o2.lse = reinterpret_cast<float*>(ws.get());
    expect_err([&] { run(plan0, q, kv, o2, ws.bytes()); }, Status::kInvalidArgument, "'out.lse'");
    o2 = out.view;  // an f32 output one byte off
    o2.o = static_cast<char*>(o2.o) + 1;
    expect_err([&] { run(plan0, q, kv, o2, ws.bytes()); }, Status::kInvalidArgument, "'out.o'");
  }
}

/// A decode problem with random sink logits in `[lo, hi]`, on the host and on the device.
struct SinkProblem {
  DecodeProblemHost p;
  std::vector<float> sinks;
  DeviceBuffer<float> dev;
  AttentionSinks as;
  SinkProblem(const DecodeConfig& cfg, std::uint64_t seed, float lo, float hi)
      : p(make_decode_problem(cfg, seed)),
        sinks(random_sinks(cfg.heads_q, lo, hi, seed + 1)),
        dev(upload(sinks)) {
    as.logits = dev.get();
  }
};

TEST(CudaDecode, SinksAreMergedOnceAfterEveryMergePath) {
  // Attention sinks fused into the final merge: every output row is its keys' state merged once
  // with (0, s_h), whatever path writes it (one split: the direct store; a few: the cluster merge;
  // many: the workspace merge; the streamed kernel; fp8 KV), for ragged batches with empty
  // requests (their rows become (0, s_h)), q_len 1 and 3, every head dim, output dtype and base.
  // Against the double reference with the sinks merged in double: a sink merged into each split,
  // or not at all, fails.
  ATTNSTATE_REQUIRE_GPU();
  struct Case {
    std::int64_t q_len, hq, hkv, D, page;
    KvLayout layout;
    DType dt, kv, od;
    LseBase base;
  };
  const Case cases[] = {
      {1, 32, 8, 128, 16, KvLayout::kNHD, DType::kBF16, DType::kBF16, DType::kF32,
       LseBase::kNatural},
      {3, 16, 2, 64, 1, KvLayout::kHND, DType::kF16, DType::kF16, DType::kBF16, LseBase::kBase2},
      {1, 16, 4, 256, 32, KvLayout::kNHD, DType::kBF16, DType::kBF16, DType::kF32, LseBase::kBase2},
      {1, 32, 8, 128, 16, KvLayout::kNHD, DType::kBF16, DType::kE4M3, DType::kF32,
       LseBase::kNatural},
  };
  const std::vector<std::int64_t> dims = attnstate_test::decode_head_dims();
  std::uint64_t seed = 5100;
  for (const Case& c : cases) {
    if (attnstate_test::only_compiled({c.D}, dims).empty()) continue;  // not in this build
    DecodeConfig cfg = shape_config(c.q_len, c.hq, c.hkv, c.D, c.page, c.layout, false, c.dt, c.kv);
    cfg.seq_lens = {0, 1, 17, 300, 2100};
    const SinkProblem sp(cfg, seed, -3.f, 9.f);
    seed += 2;
    const DecodeProblemHost& p = sp.p;
    for (int policy = 0; policy < 5; ++policy) {
      DecodeOptions o = count_opts(policy == 0 ? 1 : (policy == 1 ? 4 : 24));
      if (policy == 3) {
        o.policy = SplitPolicy::kFixedSize;
        o.split_size = 64;
      }
      if (policy == 4) {  // the streamed kernel, where it takes the shape
        if (c.D > 128 || c.page % 16 != 0) continue;
        o = count_opts(1);
        o.kernel = DecodeKernel::kStreamed;
      }
      const cuda::DecodePlan plan = cuda::plan_decode(p.problem(), p.seq_lens.data(), o, num_sms());
      const GpuOut g = run_plan(p, plan, c.od, c.base, sp.as);
      attnstate::testing::ReferenceState ref = reference_decode(p, g.plan.scale());
      ref = attnstate::testing::apply_sinks(ref, sp.sinks);
      EXPECT_EQ(compare_decode(ref, g.o.data(), c.od, g.lse.data(), c.base,
                               decode_tolerance(o_tol(is_fp8(c.kv) ? DType::kF16 : c.kv, c.od) +
                                                    (is_fp8(c.kv) ? 2e-2 : 0.0),
                                                5e-5)),
                "")
          << cfg.name() << " policy " << policy;
    }
  }
}

TEST(CudaDecode, SinksWithAWindowAndASoftCap) {
  // A sink on top of the variant kernel: the CPU decode of the same layout and variant, the sinks
  // merged in double after it.
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg =
      shape_config(2, 32, 8, 128, 16, KvLayout::kNHD, true, DType::kBF16, DType::kBF16);
  cfg.seq_lens = {0, 40, 700, 3000};
  const SinkProblem sp(cfg, 5200, -2.f, 7.f);
  const DecodeProblemHost& p = sp.p;
  for (int splits : {1, 3, 16}) {
    DecodeOptions o = count_opts(splits);
    o.variant.window_left = 37;
    o.variant.logits_soft_cap = 30.f;
    const GpuOut g = run_plan(p, cuda::plan_decode(p.problem(), p.seq_lens.data(), o, num_sms()),
                              DType::kF32, LseBase::kNatural, sp.as);
    const HostState c = cpu_variant(p, g.plan.splits(), g.plan.scale(), o.variant);
    attnstate::testing::ReferenceState ref = attnstate::testing::to_reference(
        attnstate::testing::HostState::from_view(attnstate::ConstStateView(c.view)));
    ref = attnstate::testing::apply_sinks(ref, sp.sinks);
    EXPECT_EQ(compare_decode(ref, g.o.data(), DType::kF32, g.lse.data(), LseBase::kNatural,
                             decode_tolerance(o_tol(DType::kBF16, DType::kF32), 2e-4)),
              "")
        << "splits " << splits;
  }
}

TEST(CudaDecode, AGraphReadsTheSinksItsBufferHoldsAtReplay) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg =
      shape_config(1, 32, 8, 128, 16, KvLayout::kNHD, false, DType::kBF16, DType::kBF16);
  cfg.seq_lens = {9, 1500, 0, 260};
  const DecodeProblemHost p = make_decode_problem(cfg, 5300);
  DeviceProblem d(p);
  const cuda::DecodePlan plan =
      cuda::plan_decode(p.problem(), p.seq_lens.data(), DecodeOptions{}, num_sms());
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  cuda::init_decode_workspace(plan, ws.get(), ws.bytes());
  DeviceState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  DeviceBuffer<float> dev(static_cast<std::size_t>(cfg.heads_q));
  AttentionSinks as;
  as.logits = dev.get();
  cudaStream_t stream;
  ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda::run_decode(plan, d.qv(p), d.kv(p), as, out.view, ws.get(), ws.bytes(), stream);
  ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (std::uint64_t round = 0; round < 2; ++round) {
    const std::vector<float> sinks = random_sinks(cfg.heads_q, -1.f, 8.f, 5310 + round);
    dev.upload(sinks);
    out.o.poison();
    out.lse.poison();
    ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
    attnstate::testing::ReferenceState ref = reference_decode(p, plan.scale());
    ref = attnstate::testing::apply_sinks(ref, sinks);
    const auto o = out.o.download();
    const auto lse = out.lse.download();
    EXPECT_EQ(compare_decode(ref, o.data(), DType::kF32, lse.data(), LseBase::kNatural,
                             decode_tolerance(o_tol(DType::kBF16, DType::kF32), 5e-5)),
              "")
        << "replay " << round;
  }
  ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ATTNSTATE_CUDA_CHECK(cudaGraphDestroy(graph));
  ATTNSTATE_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(CudaDecode, BadSinksAreNamed) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg =
      shape_config(1, 8, 2, 128, 16, KvLayout::kNHD, false, DType::kBF16, DType::kBF16);
  cfg.seq_lens = {40, 3};
  const DecodeProblemHost p = make_decode_problem(cfg, 5400);
  DeviceProblem d(p);
  const cuda::DecodePlan plan =
      cuda::plan_decode(p.problem(), p.seq_lens.data(), count_opts(2), num_sms());
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  cuda::init_decode_workspace(plan, ws.get(), ws.bytes());
  DeviceState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  auto run = [&](const float* logits, StateView o) {
    AttentionSinks as;
    as.logits = logits;
    cuda::run_decode(plan, d.qv(p), d.kv(p), as, o, ws.get(), ws.bytes());
  };
  const std::vector<float> host(8, 1.f);
  expect_named_error([&] { run(host.data(), out.view); }, Status::kInvalidArgument, "sinks.logits",
                     "attnstate::cuda::run_decode");
  float* pinned = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaMallocHost(&pinned, 8 * sizeof(float)));
  expect_named_error([&] { run(pinned, out.view); }, Status::kInvalidArgument, "sinks.logits");
  ATTNSTATE_CUDA_CHECK(cudaFreeHost(pinned));
  DeviceBuffer<float> dev(9);
  expect_named_error(
      [&] {
        run(reinterpret_cast<const float*>(reinterpret_cast<const char*>(dev.get()) + 2), out.view);
      },
      Status::kInvalidArgument, "sinks.logits");
  // the output may not overlap the sinks it reads
  expect_named_error([&] { run(out.lse.get(), out.view); }, Status::kInvalidArgument, "out.lse");
  if (ws.bytes() >= 8 * sizeof(float))
    expect_named_error([&] { run(reinterpret_cast<const float*>(ws.get()), out.view); },
                       Status::kInvalidArgument, "workspace");
  run(dev.get(), out.view);  // valid
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(CudaDecode, StreamedVariantMatchesTheCpuDecode) {
  // The streamed kernel's variant instance: windows (0, 1, 37, 300, longer than any request),
  // soft caps (30, 50) and both together, with sinks, at every streamed head dim, both 16-bit
  // dtypes, q_len 1 (one row tile of 4 rows) and 3 (row tiles of 16 and 8 rows), ragged lengths
  // (empty, one key, tile and page edges, long requests whose windows start many tiles and
  // several 32-page windows of page ids in), planned for 1 SM (each warp takes many items in a
  // row, its copies running from one item's window into the next) and for the device. Against
  // the CPU decode of the same variant with the sinks merged in double, outputs poisoned first.
  // Every plan must name the streamed variant row and every run must keep it (aligned rows,
  // pages of whole tiles, no prior states): else this would check the split kernel.
  ATTNSTATE_REQUIRE_GPU();
  namespace catalog = attnstate::catalog;
  const std::vector<std::int64_t> dims = attnstate_test::stream_head_dims();
  if (dims.empty()) GTEST_SKIP() << "no streamed kernel compiled";
  struct Variant {
    std::int64_t window;
    float cap;
  };
  const Variant variants[] = {{0, 0.f},      {1, 0.f},    {37, 0.f},     {300, 0.f},
                              {100000, 0.f}, {-1, 30.f},  {-1, 50.f},    {37, 30.f},
                              {0, 50.f},     {300, 50.f}, {100000, 30.f}};
  std::uint64_t seed = 5400;
  for (std::int64_t D : dims)
    for (DType dt : {DType::kF16, DType::kBF16})
      for (std::int64_t q_len : {1, 3}) {
        // q_len 1: NHD pages of 16 behind a block table; q_len 3: HND pages of 64 in CSR
        const bool one = q_len == 1;
        const std::int64_t page = one ? 16 : 64;
        DecodeConfig cfg = shape_config(q_len, one ? 32 : 16, one ? 8 : 2, D, page,
                                        one ? KvLayout::kNHD : KvLayout::kHND, one, dt, dt);
        cfg.q_gain = 4.f;  // large scores, so that the cap matters
        const std::int32_t pg = static_cast<std::int32_t>(page);
        cfg.seq_lens = {0, 1, 15, 16, 17, pg - 1, pg + 1, 300, 700, 2000, 3, 3000, 33, 1029};
        const SinkProblem sp(cfg, seed, -3.f, 9.f);
        seed += 2;
        const DecodeProblemHost& p = sp.p;
        const DType od = one ? DType::kF32 : dt;
        const LseBase base = one ? LseBase::kNatural : LseBase::kBase2;
        for (const Variant& v : variants)
          for (int sms : {1, num_sms()}) {
            DecodeOptions o = count_opts(1);
            o.kernel = DecodeKernel::kStreamed;
            o.variant.window_left = v.window;
            o.variant.logits_soft_cap = v.cap;
            const std::string what = cfg.name() + " window " + std::to_string(v.window) + " cap " +
                                     std::to_string(v.cap) + " planned for " + std::to_string(sms) +
                                     " SMs";
            const cuda::DecodePlan plan = cuda::plan_decode(p.problem(), p.seq_lens.data(), o, sms);
            ASSERT_EQ(plan.kernel(), DecodeKernel::kStreamed) << what;
            const catalog::Variants want = catalog::variants_of(v.window, v.cap);
            ASSERT_GE(plan.kernel_id(), 0) << what;
            const catalog::Row& row = catalog::kRows[static_cast<std::size_t>(plan.kernel_id())];
            ASSERT_EQ(row.family, catalog::Family::kDecodeStream) << what;
            ASSERT_EQ(row.variants & want, want) << what;
            ASSERT_EQ(attnstate::plan::decode_run_family(plan.kernel_id(), want, 0, true, page),
                      catalog::Family::kDecodeStream)
                << what;
            const GpuOut g = run_plan(p, plan, od, base, sp.as);
            const HostState c = cpu_variant(p, g.plan.splits(), g.plan.scale(), o.variant);
            attnstate::testing::ReferenceState ref = attnstate::testing::to_reference(
                attnstate::testing::HostState::from_view(attnstate::ConstStateView(c.view)));
            ref = attnstate::testing::apply_sinks(ref, sp.sinks);
            EXPECT_EQ(compare_decode(ref, g.o.data(), od, g.lse.data(), base,
                                     decode_tolerance(o_tol(dt, od), 2e-4)),
                      "")
                << what;
          }
      }
}

TEST(CudaDecode, StreamedVariantIsChosenAutomatically) {
  // Many short requests with a window and a soft cap: the automatic policy streams them (the
  // variant instance), and the result matches the CPU decode of the same variant.
  ATTNSTATE_REQUIRE_GPU();
  namespace catalog = attnstate::catalog;
  const std::vector<std::int64_t> dims = attnstate_test::stream_head_dims();
  if (std::find(dims.begin(), dims.end(), 128) == dims.end())
    GTEST_SKIP() << "needs the streamed kernel at head dim 128";
  DecodeConfig cfg;
  cfg.heads_q = 32;
  cfg.heads_kv = 8;
  cfg.head_dim = 128;
  cfg.block_table = true;
  cfg.q_gain = 4.f;
  const int sms = num_sms();
  cfg.seq_lens.resize(static_cast<std::size_t>(sms));
  for (std::size_t i = 0; i < cfg.seq_lens.size(); ++i)
    cfg.seq_lens[i] = static_cast<std::int32_t>(100 + (i * 37) % 400);  // 8 items per SM
  const DecodeProblemHost p = make_decode_problem(cfg, 5500);
  DecodeOptions o;
  o.variant.window_left = 64;
  o.variant.logits_soft_cap = 30.f;
  const cuda::DecodePlan plan = cuda::plan_decode(p.problem(), p.seq_lens.data(), o, sms);
  ASSERT_EQ(plan.kernel(), DecodeKernel::kStreamed) << plan.to_string();
  const catalog::Row& row = catalog::kRows[static_cast<std::size_t>(plan.kernel_id())];
  EXPECT_EQ(row.variants & (catalog::kWindow | catalog::kSoftCap),
            catalog::kWindow | catalog::kSoftCap);
  const GpuOut g = run_plan(p, plan, DType::kF32, LseBase::kNatural);
  expect_near_cpu(g, cpu_variant(p, plan.splits(), plan.scale(), o.variant), "automatic");
}

TEST(CudaDecode, EveryCatalogRowMatchesTheCpuDecode) {
  // Every decode row of the catalog (family, head dim, query and K/V dtype, depth, variant
  // instance), planned by hand onto that very row and run into a poisoned output: against the
  // CPU decode of the same layout and variant (a window and a soft cap on the variant rows),
  // ragged lengths with empty and one-key requests, q_len 2, NHD block-table pages of 16.
  ATTNSTATE_REQUIRE_GPU();
  namespace catalog = attnstate::catalog;
  int ran = 0, rows = 0;
  std::uint64_t seed = 9100;
  for (std::size_t i = 0; i < catalog::kRows.size(); ++i) {
    const catalog::Row& r = catalog::kRows[i];
    const bool streamed = r.family == catalog::Family::kDecodeStream;
    if (!streamed && r.family != catalog::Family::kDecodeSplit) continue;
    ++rows;
    const bool variant = (r.variants & (catalog::kWindow | catalog::kSoftCap)) != 0;
    DecodeConfig cfg = shape_config(2, 16, 4, r.head_dim, 16, KvLayout::kNHD, true, r.q, r.kv);
    cfg.q_gain = variant ? 4.f : 1.f;  // large scores, so that the cap matters
    cfg.seq_lens = {700, 0, 1, 1500, 33, 260};
    const DecodeProblemHost p = make_decode_problem(cfg, seed++);
    DecodeOptions o = count_opts(streamed ? 1 : 3);
    o.kernel = streamed ? DecodeKernel::kStreamed : DecodeKernel::kSplit;
    if (!streamed) o.split_stages = r.stages;
    if (variant) {
      o.variant.window_left = 300;
      o.variant.logits_soft_cap = 30.f;
    }
    const std::string what = cfg.name() + " row " + std::to_string(i) + " (" +
                             catalog::to_string(r.family) + ", " + std::to_string(r.stages) +
                             " stages" + (variant ? ", variant)" : ")");
    const cuda::DecodePlan plan = cuda::plan_decode(p.problem(), p.seq_lens.data(), o, num_sms());
    ASSERT_EQ(plan.kernel_id(), static_cast<int>(i)) << what << ": " << plan.to_string();
    const GpuOut g = run_plan(p, plan, DType::kF32, LseBase::kNatural);
    expect_near_cpu(g, cpu_variant(p, plan.splits(), plan.scale(), o.variant), what);
    ++ran;
  }
  EXPECT_EQ(ran, rows);
  EXPECT_GT(rows, 0);
}

}  // namespace
