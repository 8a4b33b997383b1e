/// @file prop_cuda_decode.cpp
/// @brief RapidCheck properties of the CUDA split-KV decode (100 cases each, skipped without a
///        GPU): on random paged problems it agrees with the CPU decode of the same split layout,
///        splitting anywhere equals not splitting, to the tensor-core rounding, and a plan made
///        for longer requests gives bitwise the same results.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attnstate/cpu/decode.hpp"
#include "attnstate/cuda/decode.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "compiled_dims.hpp"
#include "cuda_test_utils.hpp"
#include "decode_device_problem.hpp"
#include "decode_problem.hpp"
#include "rc_defaults.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=100");

namespace {

using namespace attnstate;
using namespace attnstate_test;

DecodeProblemHost random_gpu_problem() {
  DecodeConfig cfg;
  cfg.q_len = *rc::gen::inRange<std::int64_t>(1, 9);
  cfg.heads_kv = *rc::gen::inRange<std::int64_t>(1, 4);
  cfg.heads_q = cfg.heads_kv * *rc::gen::element<std::int64_t>(1, 2, 4, 8, 16);
  cfg.head_dim = *rc::gen::elementOf(attnstate_test::decode_head_dims());
  cfg.page_size = *rc::gen::element<std::int64_t>(1, 8, 16, 64);
  cfg.layout = *rc::gen::element(KvLayout::kNHD, KvLayout::kHND);
  cfg.block_table = *rc::gen::arbitrary<bool>();
  cfg.q_dtype = cfg.kv_dtype = *rc::gen::element(DType::kBF16, DType::kF16);
  cfg.q_gain = *rc::gen::element(1.f, 40.f);
  const int batch = *rc::gen::inRange(1, 4);
  for (int b = 0; b < batch; ++b) cfg.seq_lens.push_back(*rc::gen::inRange(0, 400));
  return make_decode_problem(cfg, *rc::gen::arbitrary<std::uint32_t>());
}

DecodeOptions random_options() {
  DecodeOptions o;
  const int kind = *rc::gen::inRange(0, 3);
  o.policy = kind == 0   ? SplitPolicy::kAuto
             : kind == 1 ? SplitPolicy::kFixedCount
                         : SplitPolicy::kFixedSize;
  o.num_splits = *rc::gen::inRange(1, 30);
  o.split_size = kSplitGranularity * *rc::gen::inRange(1, 10);
  return o;
}

struct Gpu {
  std::vector<float> o, lse;
  cuda::DecodePlan plan;
};

/// Runs the planned decode. `may_stream`: a plan without split requests may be drawn to run on
/// the streamed kernel, launched for 1, 3 or all SMs (few SMs: each warp takes many items).
Gpu run_gpu(const DecodeProblemHost& p, const DecodeOptions& opt,
            const std::int32_t* plan_lens = nullptr, bool may_stream = false) {
  int sms = 0;
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Gpu g;
  const std::int32_t* lens = plan_lens ? plan_lens : p.seq_lens.data();
  g.plan = cuda::plan_decode(p.problem(), lens, opt, sms);
  const std::vector<std::int64_t> stream_dims = stream_head_dims();
  const bool stream_row = opt.variant.window_left < 0 && opt.variant.logits_soft_cap == 0.f &&
                          !is_fp8(p.cfg.kv_dtype) &&
                          std::count(stream_dims.begin(), stream_dims.end(), p.cfg.head_dim) > 0;
  if (may_stream && stream_row && g.plan.splits().max_splits == 1 && *rc::gen::arbitrary<bool>()) {
    // the same single split on the streamed kernel, planned for fewer SMs
    DecodeOptions o = opt;
    o.kernel = DecodeKernel::kStreamed;
    if (g.plan.splits().policy == SplitPolicy::kFixedSize) {
      o.policy = SplitPolicy::kFixedSize;
      o.split_size = g.plan.splits().split_size;
    }
    g.plan = cuda::plan_decode(p.problem(), lens, o, *rc::gen::element(1, 3, sms));
    RC_ASSERT(g.plan.splits().max_splits == 1);
  }
  const DeviceProblem dp(p);
  const PagedKvCache kv = dp.kv(p);
  const ConstTensorView qv = dp.qv(p);
  const std::int64_t rows = p.tokens() * p.cfg.heads_q;
  DeviceBuffer<float> o(std::max<std::int64_t>(1, rows * p.cfg.head_dim));
  DeviceBuffer<float> lse(std::max<std::int64_t>(1, rows));
  o.poison();
  lse.poison();
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, g.plan.workspace_bytes()));
  cuda::init_decode_workspace(g.plan, ws.get(), ws.bytes());
  cuda::run_decode(g.plan, qv, kv,
                   make_state_view(o.get(), DType::kF32, lse.get(), p.tokens(), p.cfg.heads_q,
                                   p.cfg.head_dim, LseBase::kNatural, MemorySpace::kDevice),
                   ws.get(), ws.bytes());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  g.o = o.download();
  g.lse = lse.download();
  return g;
}

/// Fails the case unless the GPU result matches the double-precision reference decode of `p` (the
/// output starts poisoned: an unwritten element is NaN, an infinite error). Tolerances of
/// tests/cuda/decode/test_cuda_decode.cpp for an f32 output.
void assert_matches_reference(const DecodeProblemHost& p, const Gpu& g) {
  const std::string mismatch = compare_decode(
      reference_decode(p, g.plan.scale()), g.o.data(), DType::kF32, g.lse.data(), LseBase::kNatural,
      decode_tolerance(p.cfg.kv_dtype == DType::kBF16 ? 1.2e-2 : 3e-3, 5e-5));
  RC_ASSERT(mismatch.empty());
}

void assert_close(const std::vector<float>& ao, const std::vector<float>& al,
                  const std::vector<float>& bo, const std::vector<float>& bl, double tol_o) {
  for (std::size_t i = 0; i < al.size(); ++i) {
    if (std::isinf(bl[i])) {
      RC_ASSERT(std::isinf(al[i]) && al[i] < 0);
    } else {
      RC_ASSERT(std::fabs(al[i] - bl[i]) <= 5e-5 * std::max(1.f, std::fabs(bl[i])));
    }
  }
  for (std::size_t i = 0; i < ao.size(); ++i) RC_ASSERT(std::fabs(ao[i] - bo[i]) <= tol_o);
}

// The GPU decode equals the CPU decode of the same split layout (fp32 reference of the same
// splits; the GPU rounds the probabilities to the KV dtype for the PV product), on the split or
// the streamed kernel.
void agrees_with_cpu_decode() {
  const DecodeProblemHost p = random_gpu_problem();
  const Gpu g = run_gpu(p, random_options(), nullptr, true);
  assert_matches_reference(p, g);
  HostState c(p.tokens(), p.cfg.heads_q, p.cfg.head_dim, DType::kF32, LseBase::kNatural);
  cpu::decode(p.q_view(), p.kv_view(), g.plan.splits(), g.plan.scale(), c.view);
  std::vector<float> co(g.o.size());
  if (!co.empty()) std::memcpy(co.data(), c.o.data(), 4 * co.size());
  const std::vector<float> cl(c.lse.begin(), c.lse.begin() + g.lse.size());
  assert_close(g.o, g.lse, co, cl, p.cfg.kv_dtype == DType::kBF16 ? 1.2e-2 : 3e-3);
}

// Splitting anywhere equals not splitting on the GPU (either side possibly streamed).
void splitting_anywhere_equals_not_splitting() {
  const DecodeProblemHost p = random_gpu_problem();
  DecodeOptions one;
  one.policy = SplitPolicy::kFixedCount;
  one.num_splits = 1;
  const Gpu a = run_gpu(p, random_options(), nullptr, true);
  const Gpu b = run_gpu(p, one, nullptr, true);
  // Both against the reference: two GPU results compared only with each other could share an
  // error.
  assert_matches_reference(p, a);
  assert_matches_reference(p, b);
  assert_close(a.o, a.lse, b.o, b.lse, p.cfg.kv_dtype == DType::kBF16 ? 1.5e-2 : 4e-3);
}

// A plan made for longer requests (same split size) serves the real ones bitwise identically,
// whichever way it merges the splits (inside a cluster for up to 8 splits, through the workspace
// beyond).
void plan_for_longer_requests_gives_same_bits() {
  const DecodeProblemHost p = random_gpu_problem();
  DecodeOptions o;
  o.policy = SplitPolicy::kFixedSize;
  o.split_size = kSplitGranularity * *rc::gen::inRange(1, 10);
  std::vector<std::int32_t> longer = p.seq_lens;
  longer[0] = std::max(longer[0], o.split_size * *rc::gen::inRange(1, 20));
  const Gpu a = run_gpu(p, o);
  const Gpu b = run_gpu(p, o, longer.data());
  // Against the reference too: two runs that leave the same row unwritten (NaN) would otherwise
  // be bitwise equal.
  assert_matches_reference(p, a);
  RC_ASSERT(a.o.size() == b.o.size());
  RC_ASSERT(a.lse.size() == b.lse.size());
  RC_ASSERT(0 == std::memcmp(a.o.data(), b.o.data(), 4 * a.o.size()));
  RC_ASSERT(0 == std::memcmp(a.lse.data(), b.lse.data(), 4 * a.lse.size()));
}

// Each property skips cleanly without a GPU, otherwise runs under RapidCheck and fails on a
// counterexample (printed with its seed above the failure).
TEST(DecodeGpuProps, AgreesWithCpuDecode) {
  ATTNSTATE_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("cuda decode == cpu decode of the same splits", agrees_with_cpu_decode));
}

TEST(DecodeGpuProps, SplittingAnywhereEqualsNotSplitting) {
  ATTNSTATE_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("cuda decode: splitting anywhere == not splitting",
                        splitting_anywhere_equals_not_splitting));
}

TEST(DecodeGpuProps, PlanForLongerRequestsGivesSameBits) {
  ATTNSTATE_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("cuda decode: a plan for longer requests gives the same bits",
                        plan_for_longer_requests_gives_same_bits));
}

}  // namespace
