/// @file test_testing_cuda_producers.cpp
/// @brief The CUDA split-KV decode run through the testing kit's conformance check
///        (`check_state_kernel`): exactness against the double reference, split/merge, the empty
///        key set, the declared base, large logits and determinism.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "attnstate/cuda/decode.hpp"
#include "attnstate/testing/gtest.hpp"
#include "attnstate/testing/testing.hpp"
#include "cuda_test_utils.hpp"

namespace {

using namespace attnstate;
using attnstate::testing::AttentionProblem;
using attnstate::testing::HostState;
using attnstate_test::DeviceBuffer;

/// The kit's adapter for `cuda::run_decode`: every query row of the problem is one request over
/// the same keys (the selected subset), stored as NHD pages of 16 tokens shared by all requests.
HostState cuda_decode_kernel(const AttentionProblem& full, const std::vector<std::int64_t>& keys) {
  const AttentionProblem p = attnstate::testing::select_keys(full, keys);
  const std::int64_t batch = p.tokens(), hq = p.heads_q(), hkv = p.heads_kv(), d = p.head_dim();
  const std::int64_t t = p.num_keys();
  constexpr std::int64_t kPage = 16;
  const std::int64_t pages = t > 0 ? (t + kPage - 1) / kPage : 1;

  // K/V `(T, H_kv, D)` row-major is exactly a run of NHD pages; pad the last page with zeros.
  const std::size_t page_bytes = std::size_t(kPage * hkv * d) * size_of(p.k.dtype());
  std::vector<unsigned char> kh(pages * page_bytes, 0), vh(pages * page_bytes, 0);
  if (t > 0) {
    std::memcpy(kh.data(), p.k.data(), std::size_t(p.k.numel()) * size_of(p.k.dtype()));
    std::memcpy(vh.data(), p.v.data(), std::size_t(p.v.numel()) * size_of(p.v.dtype()));
  }
  std::vector<std::int32_t> table(batch * pages), lens(batch, static_cast<std::int32_t>(t));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < pages; ++i) table[b * pages + i] = static_cast<std::int32_t>(i);
  std::vector<unsigned char> qh(std::size_t(p.q.numel()) * size_of(p.q.dtype()));
  std::memcpy(qh.data(), p.q.data(), qh.size());

  DeviceBuffer<unsigned char> dk(kh), dv(vh), dq(qh);
  DeviceBuffer<std::int32_t> dtable(table), dlens(lens);
  DeviceBuffer<unsigned char> dout(std::size_t(batch * hq * d) * size_of(p.out_dtype));
  DeviceBuffer<float> dlse(std::size_t(batch * hq));
  dout.poison();
  dlse.poison();

  PagedKvCache kv;
  kv.k = dk.get();
  kv.v = dv.get();
  kv.dtype = p.k.dtype();
  kv.layout = KvLayout::kNHD;
  kv.num_pages = pages;
  kv.page_size = kPage;
  kv.heads_kv = hkv;
  kv.head_dim = d;
  kv.block_table = dtable.get();
  kv.block_table_stride = pages;
  kv.seq_lens = dlens.get();
  kv.batch = batch;
  kv.space = MemorySpace::kDevice;

  DecodeProblem problem;
  problem.batch = batch;
  problem.q_len = 1;
  problem.heads_q = hq;
  problem.heads_kv = hkv;
  problem.head_dim = d;
  problem.q_dtype = p.q.dtype();
  problem.kv_dtype = p.k.dtype();
  DecodeOptions options;
  options.scale = p.scale;
  int device = 0, sms = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&device));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const cuda::DecodePlan plan = cuda::plan_decode(problem, lens.data(), options, sms);
  DeviceBuffer<unsigned char> ws(plan.workspace_bytes());
  cuda::init_decode_workspace(plan, ws.get(), ws.size());
  const ConstTensorView q =
      make_tensor_view(dq.get(), p.q.dtype(), {batch, 1, hq, d}, MemorySpace::kDevice);
  const StateView out = make_state_view(dout.get(), p.out_dtype, dlse.get(), batch, hq, d, p.base,
                                        MemorySpace::kDevice);
  cuda::run_decode(plan, q, kv, out, ws.get(), ws.size());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<unsigned char> o_raw = dout.download();
  const std::vector<float> lse = dlse.download();
  HostState s(batch, hq, d, p.out_dtype, p.base);
  const auto* f32 = reinterpret_cast<const float*>(o_raw.data());
  const auto* f16 = reinterpret_cast<const half_t*>(o_raw.data());
  const auto* b16 = reinterpret_cast<const bfloat16_t*>(o_raw.data());
  for (std::int64_t tok = 0; tok < batch; ++tok)
    for (std::int64_t h = 0; h < hq; ++h) {
      s.set_lse(tok, h, lse[tok * hq + h]);
      for (std::int64_t e = 0; e < d; ++e) {
        const std::int64_t i = (tok * hq + h) * d + e;
        const float x = p.out_dtype == DType::kF32   ? f32[i]
                        : p.out_dtype == DType::kF16 ? to_float(f16[i])
                                                     : to_float(b16[i]);
        s.set_o(tok, h, e, x);
      }
    }
  return s;
}

/// Decode-shaped problems of one 16-bit input dtype, every output dtype, the kit's own
/// tolerance (factor 1): it counts the rounding of the probabilities to the input dtype for the
/// tensor-core P·V product (`p_rounded_to_input`, the default), and nothing more.
attnstate::testing::KernelCheckOptions options_for(DType dt) {
  attnstate::testing::KernelCheckOptions o;
  o.problems = attnstate::testing::decode_problem_options();
  o.problems.input_dtypes = {dt};
  o.problems.output_dtypes = {DType::kF32, DType::kF16, DType::kBF16};
  o.num_tests = 100;
  return o;
}

TEST(CudaDecodeKitConformance, Bf16DecodePassesTheKit) {
  ATTNSTATE_REQUIRE_GPU();
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(cuda_decode_kernel, options_for(DType::kBF16));
}

TEST(CudaDecodeKitConformance, F16DecodePassesTheKit) {
  ATTNSTATE_REQUIRE_GPU();
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(cuda_decode_kernel, options_for(DType::kF16));
}

}  // namespace
