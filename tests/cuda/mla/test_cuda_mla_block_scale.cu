/// @file test_cuda_mla_block_scale.cu
/// @brief CUDA MLA decode (each kernel the device runs: mma.sync, and wgmma on sm_90a) and MLA
///        cascade over FlashMLA's fp8 rows (e4m3 latent values with 4 fp32 scales a token, one
///        per 128 columns, then bf16 rope: 656 bytes, as views of one pool) against the CPU
///        reference (`cpu::mla_decode` / `cpu::mla_cascade`) and an independent double
///        computation, outputs poisoned with NaN; a host check that the GPU tolerance sees the
///        scales of a wrong block; argument errors naming the block-scale fields. GPU tests skip
///        without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/cpu/mla.hpp"
#include "attnstate/cuda/mla.hpp"
#include "attnstate/cuda/mla_cascade.hpp"
#include "attnstate/testing/host_state.hpp"
#include "catalog/catalog.hpp"
#include "cuda_test_utils.hpp"
#include "mla_block_scale.hpp"
#include "mla_device.hpp"

namespace {

using namespace attnstate;
using attnstate::testing::HostState;
using attnstate_test::BlockScaleConfig;
using attnstate_test::BlockScaleHost;
using attnstate_test::DeviceBuffer;
using attnstate_test::DeviceState;
using attnstate_test::make_block_scale_host;
using attnstate_test::upload;

constexpr const char* kRunFn = "attnstate::cuda::run_mla_decode";

// The kernels convert each scaled value to bf16 (K and V) and round P to bf16, accumulating in
// fp32: against the double computation over the bf16-rounded values (what the kernels read) the
// P rounding remains; against the CPU reference (exact fp32 values) the K/V rounding too.
// (On the host, the CPU reference is 0.03-0.04 from the double computation over the
// bf16-rounded values at most, in absolute terms, and the scales of a wrong block 100 times the
// CPU tolerance away.)
constexpr double kAtolBf16Values = 4e-2, kRtolBf16Values = 2e-2;
constexpr double kAtolCpu = 8e-2, kRtolCpu = 3e-2;

/// A `BlockScaleHost` copied to the device.
struct DeviceBlockScale {
  DeviceBuffer<unsigned char> pool;
  DeviceBuffer<std::uint16_t> q_nope, q_pe;
  DeviceBuffer<std::int32_t> lens, table;
  explicit DeviceBlockScale(const BlockScaleHost& h)
      : pool(upload(h.pool)),
        q_nope(upload(h.q_nope)),
        q_pe(upload(h.q_pe)),
        lens(upload(h.cfg.seq_lens)),
        table(upload(h.block_table)) {}
  MlaKvCache kv(const BlockScaleHost& h) const {
    return h.view(pool.get(), lens.get(), table.get(), MemorySpace::kDevice);
  }
  ConstTensorView qn(const BlockScaleHost& h) const {
    return h.query(q_nope.get(), h.cfg.kv_lora_rank, MemorySpace::kDevice);
  }
  ConstTensorView qp(const BlockScaleHost& h) const {
    return h.query(q_pe.get(), h.cfg.rope_dim, MemorySpace::kDevice);
  }
};

cuda::MlaDecodeProblem problem_of(const BlockScaleHost& h) {
  cuda::MlaDecodeProblem pr;
  pr.batch = h.batch;
  pr.q_len = h.cfg.q_len;
  pr.heads = h.cfg.heads;
  pr.ckv_dtype = DType::kE4M3;
  pr.kpe_dtype = DType::kBF16;
  return pr;
}

/// The MLA decode kernels the device runs for requests of `rows` query rows (as
/// test_cuda_mla.cu: the wgmma one and its balanced variant where the planner's automatic choice
/// takes a wgmma kernel, the narrow ones besides for at most 32 rows).
std::vector<cuda::MlaDecodeKernel> device_kernels(std::int64_t rows) {
  cuda::MlaDecodeProblem pr;
  pr.batch = 1;
  pr.heads = 16;
  const std::int32_t len = 1;
  const cuda::MlaDecodePlan p = cuda::plan_mla_decode(pr, &len, DecodeOptions{}, 1);
  const bool ws =
      catalog::kRows[static_cast<std::size_t>(p.kernel_id())].family != catalog::Family::kMlaDecode;
  if (ws && rows <= catalog::kMlaNarrowRows)
    return {cuda::MlaDecodeKernel::kMma, cuda::MlaDecodeKernel::kWgmma,
            cuda::MlaDecodeKernel::kWgmmaBalanced, cuda::MlaDecodeKernel::kWgmmaNarrow,
            cuda::MlaDecodeKernel::kWgmmaNarrow2};
  if (ws)
    return {cuda::MlaDecodeKernel::kMma, cuda::MlaDecodeKernel::kWgmma,
            cuda::MlaDecodeKernel::kWgmmaBalanced};
  return {cuda::MlaDecodeKernel::kMma};
}

/// A kernel's name in failure messages.
std::string kernel_name(cuda::MlaDecodeKernel k) {
  return k == cuda::MlaDecodeKernel::kWgmma           ? " wgmma"
         : k == cuda::MlaDecodeKernel::kWgmmaBalanced ? " wgmma-balanced"
         : k == cuda::MlaDecodeKernel::kWgmmaNarrow   ? " wgmma-narrow"
         : k == cuda::MlaDecodeKernel::kWgmmaNarrow2  ? " wgmma-narrow2"
                                                      : " mma.sync";
}

HostState run_cuda(const BlockScaleHost& h, const DeviceBlockScale& d, DecodeOptions options,
                   cuda::MlaDecodeKernel kernel, DType out_dtype = DType::kF32,
                   LseBase base = LseBase::kNatural) {
  options.scale = h.scale;
  const cuda::MlaDecodePlan plan = cuda::plan_mla_decode(
      problem_of(h), h.cfg.seq_lens.data(), options, attnstate_test::device_sms(), kernel);
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  cuda::init_mla_decode_workspace(plan, ws.get(), ws.bytes());
  DeviceState out(h.tokens(), h.cfg.heads, h.cfg.kv_lora_rank, out_dtype, base);
  cuda::run_mla_decode(plan, d.qn(h), d.qp(h), d.kv(h), out.view, ws.get(), ws.bytes());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

HostState run_cpu(const BlockScaleHost& h) {
  HostState out(h.tokens(), h.cfg.heads, h.cfg.kv_lora_rank, DType::kF32, LseBase::kNatural);
  out.poison();
  DecodeOptions o;
  o.scale = h.scale;
  cpu::mla_decode(h.query(h.q_nope.data(), h.cfg.kv_lora_rank, MemorySpace::kHost),
                  h.query(h.q_pe.data(), h.cfg.rope_dim, MemorySpace::kHost), h.view(), o,
                  out.view());
  return out;
}

/// The largest difference of `a` and `b` (the CPU reference, f32, natural) in tolerances.
double error_vs_cpu(const HostState& a, const HostState& b) {
  double worst = 0.0;
  for (std::int64_t t = 0; t < b.tokens(); ++t)
    for (std::int64_t hd = 0; hd < b.heads(); ++hd) {
      const double la =
          a.base() == LseBase::kBase2 ? a.lse(t, hd) * 0.6931471805599453 : a.lse(t, hd);
      const double e = std::abs(la - b.lse(t, hd)) / kAtolCpu;
      worst = std::isnan(e) ? INFINITY : std::max(worst, e);
      for (std::int64_t d = 0; d < b.head_dim(); ++d) {
        const double r = b.o(t, hd, d);
        const double x = std::abs(a.o(t, hd, d) - r) / (kAtolCpu + kRtolCpu * std::abs(r));
        worst = std::isnan(x) ? INFINITY : std::max(worst, x);
      }
    }
  return worst;
}

BlockScaleHost host_of(std::int64_t page, std::int64_t q_len, std::int64_t heads,
                       std::vector<std::int32_t> lens, std::uint64_t seed) {
  BlockScaleConfig cfg;
  cfg.page_size = page;
  cfg.q_len = q_len;
  cfg.heads = heads;
  cfg.seq_lens = std::move(lens);
  return make_block_scale_host(cfg, seed);
}

TEST(MlaCudaBlockScale, TheToleranceSeesAWrongBlock) {
  // host only: the bf16 rounding of the values alone (the CPU reference against the double
  // computation over the rounded values) is within the tolerance, and the scales of another
  // block put the double computation far outside the CPU tolerance (a kernel with a wrong block
  // index fails the GPU tests below)
  const BlockScaleHost h = host_of(64, 2, 16, {300, 70}, 3);
  const HostState cpu = run_cpu(h);
  EXPECT_LE(
      attnstate_test::block_scale_state_error(h, cpu, kAtolBf16Values, kRtolBf16Values, 0, true),
      1.0);
  EXPECT_GT(attnstate_test::block_scale_state_error(h, cpu, kAtolCpu, kRtolCpu, 1), 10.0);
  EXPECT_GT(attnstate_test::block_scale_state_error(h, cpu, kAtolCpu, kRtolCpu, 3), 10.0);
}

TEST(MlaCudaBlockScale, BothKernelsMatchTheReferences) {
  ATTNSTATE_REQUIRE_GPU();
  struct Shape {
    std::int64_t page, q_len, heads;
    std::vector<std::int32_t> lens;
  };
  const std::vector<Shape> shapes = {
      {64, 1, 16, {1000, 1, 64, 130}}, {64, 2, 128, {300, 77}},
      {16, 4, 64, {200, 4, 33}},       {1, 1, 16, {45, 3}},
      {33, 3, 32, {100, 70}},          {16, 2, 16, {150, 2, 64}},
  };
  std::uint64_t seed = 100;
  for (const Shape& s : shapes) {
    const BlockScaleHost h = host_of(s.page, s.q_len, s.heads, s.lens, seed++);
    const DeviceBlockScale d(h);
    const HostState cpu = run_cpu(h);
    for (const cuda::MlaDecodeKernel k : device_kernels(s.heads * s.q_len))
      for (const DecodeOptions& o : {DecodeOptions{}, [] {
                                       DecodeOptions f;
                                       f.policy = SplitPolicy::kFixedCount;
                                       f.num_splits = 3;
                                       return f;
                                     }()}) {
        SCOPED_TRACE("page " + std::to_string(s.page) + " q_len " + std::to_string(s.q_len) +
                     " heads " + std::to_string(s.heads) + kernel_name(k) +
                     (o.policy == SplitPolicy::kFixedCount ? " 3 splits" : " planned"));
        const HostState gpu = run_cuda(h, d, o, k);
        EXPECT_LE(attnstate_test::block_scale_state_error(h, gpu, kAtolBf16Values, kRtolBf16Values,
                                                          0, true),
                  1.0);
        EXPECT_LE(error_vs_cpu(gpu, cpu), 1.0);
      }
  }
}

TEST(MlaCudaBlockScale, OtherOutputsAndBase2) {
  ATTNSTATE_REQUIRE_GPU();
  const BlockScaleHost h = host_of(64, 1, 16, {500, 90}, 7);
  const DeviceBlockScale d(h);
  const HostState cpu = run_cpu(h);
  for (const cuda::MlaDecodeKernel k : device_kernels(16)) {  // (16 heads, q_len 1)
    // bf16 outputs round o once more: within the CPU tolerance still
    const HostState gpu = run_cuda(h, d, DecodeOptions{}, k, DType::kBF16, LseBase::kBase2);
    EXPECT_LE(error_vs_cpu(gpu, cpu), 1.0);
  }
}

TEST(MlaCudaBlockScale, CascadeMatchesTheReferences) {
  ATTNSTATE_REQUIRE_GPU();
  for (const std::int64_t q_len : {1, 2}) {
    BlockScaleHost h = host_of(16, q_len, 16, {100, 60, 81, 40}, 20 + q_len);
    const attnstate_test::BlockScaleLevels lv = attnstate_test::share_prefix(h, 2);
    const DeviceBlockScale d(h);
    // device levels
    std::vector<DeviceBuffer<std::int32_t>> arrays;
    for (const auto* v : {&lv.ri0, &lv.pi0, &lv.ix0, &lv.len0, &lv.ri1, &lv.pi1, &lv.ix1, &lv.len1})
      arrays.push_back(upload(*v));
    const std::vector<CascadeLevel> host_levels = lv.levels();
    std::vector<CascadeLevel> dev_levels = host_levels;
    for (int l = 0; l < 2; ++l) {
      dev_levels[l].request_indptr = arrays[4 * l].get();
      dev_levels[l].page_indptr = arrays[4 * l + 1].get();
      dev_levels[l].page_indices = arrays[4 * l + 2].get();
      dev_levels[l].seg_lens = arrays[4 * l + 3].get();
    }
    cuda::MlaCascadeProblem pr;
    pr.mla = problem_of(h);
    pr.page_size = h.cfg.page_size;
    pr.num_pages = h.num_pages;
    CascadeOptions options;
    options.scale = h.scale;
    const cuda::MlaCascadePlan plan =
        cuda::plan_mla_cascade(pr, host_levels.data(), 2, options, attnstate_test::device_sms());
    DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
    DeviceState out(h.tokens(), h.cfg.heads, 512, DType::kF32, LseBase::kNatural);
    MlaKvCache pool = d.kv(h);
    pool.block_table = nullptr;
    pool.block_table_stride = 0;
    pool.seq_lens = nullptr;
    pool.batch = 0;
    cuda::run_mla_cascade(plan, d.qn(h), d.qp(h), pool, dev_levels.data(), 2, out.view, ws.get(),
                          ws.bytes());
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
    const HostState gpu = out.download();
    SCOPED_TRACE("q_len " + std::to_string(q_len));
    EXPECT_LE(
        attnstate_test::block_scale_state_error(h, gpu, kAtolBf16Values, kRtolBf16Values, 0, true),
        1.0);
    EXPECT_LE(error_vs_cpu(gpu, run_cpu(h)), 1.0);
  }
}

TEST(MlaCudaBlockScaleErrors, TheKernelsLimitsAreNamed) {
  ATTNSTATE_REQUIRE_GPU();
  const BlockScaleHost h = host_of(16, 1, 16, {40, 9}, 9);
  const DeviceBlockScale d(h);
  DecodeOptions o;
  o.scale = h.scale;
  const cuda::MlaDecodePlan plan =
      cuda::plan_mla_decode(problem_of(h), h.cfg.seq_lens.data(), o, attnstate_test::device_sms(),
                            cuda::MlaDecodeKernel::kMma);
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  cuda::init_mla_decode_workspace(plan, ws.get(), ws.bytes());
  DeviceState out(h.tokens(), 16, 512, DType::kF32, LseBase::kNatural);
  auto expect_kv = [&](auto edit, const std::string& arg, Status status) {
    MlaKvCache kv = d.kv(h);
    edit(kv);
    attnstate_test::expect_named_error(
        [&] { cuda::run_mla_decode(plan, d.qn(h), d.qp(h), kv, out.view, ws.get(), ws.bytes()); },
        status, arg, kRunFn);
  };
  // blocks of 64 columns: valid for the CPU, not the kernels
  expect_kv([](MlaKvCache& kv) { kv.ckv_block_scale.block_cols = 64; },
            "kv.ckv_block_scale.block_cols", Status::kNotSupported);
  // the 4 scales of a token are one 16-byte load
  expect_kv(
      [](MlaKvCache& kv) {
        kv.ckv_block_scale.data = kv.ckv_block_scale.data + 1;
        kv.ckv_block_scale.token_stride = 164;
      },
      "kv.ckv_block_scale.data", Status::kInvalidArgument);
  expect_kv(
      [](MlaKvCache& kv) {
        // 5 floats a token: not a multiple of 16 bytes
        kv.ckv_block_scale.token_stride = 5;
        kv.ckv_block_scale.page_stride = 0;
      },
      "kv.ckv_block_scale.token_stride", Status::kNotSupported);
  expect_kv([](MlaKvCache& kv) { kv.ckv_scale = KvScale::per_tensor(0.5f); }, "kv.ckv_scale",
            Status::kInvalidArgument);
  // host memory the kernels cannot read
  std::vector<float> host_scales(static_cast<std::size_t>(h.num_pages * 16 * 4), 1.f);
  expect_kv(
      [&](MlaKvCache& kv) {
        kv.ckv_block_scale.data = host_scales.data();
        kv.ckv_block_scale.token_stride = kv.ckv_block_scale.page_stride = 0;
      },
      "kv.ckv_block_scale.data", Status::kInvalidArgument);
}

}  // namespace
