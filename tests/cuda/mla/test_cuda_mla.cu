/// @file test_cuda_mla.cu
/// @brief CUDA MLA decode (`cuda::run_mla_decode`) against the testing kit's double reference
///        (the reference `cpu::mla_decode` is checked against): bf16 and fp8 latent caches (fp8
///        rope or bf16), pages of 1, 16, 64 and odd sizes, CSR and block tables, both peers'
///        layouts, q_len 1..4, 16, 64 and 128 heads, one split and several (fixed and planned),
///        sinks, every state dtype and base, outputs poisoned with NaN first; split states merged
///        with `cuda::merge_states` against the one-pass state; the kit's MLA laws on a CUDA
///        adapter; argument errors naming the argument. Every GPU test runs each kernel the
///        device runs (`device_kernels`: mma.sync, and on sm_90a the wgmma one and its balanced
///        variant, the narrow ones for at most 32 rows). GPU tests skip
///        without a GPU; the planner's errors and its kernel rows (host only) run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/cpu/mla.hpp"
#include "attnstate/cuda/merge.hpp"
#include "attnstate/cuda/mla.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/mla.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "catalog/catalog.hpp"
#include "cuda/mla_common.hpp"
#include "cuda_test_utils.hpp"
#include "mla_device.hpp"
#include "mla_problem.hpp"
#include "plan/mla_plan.hpp"
#include "plan/tuning_sm90.hpp"

namespace {

using namespace attnstate;
using attnstate::testing::HostState;
using attnstate_test::bytes_of;
using attnstate_test::DeviceBuffer;
using attnstate_test::DeviceState;
using attnstate_test::expect_named_error;
using attnstate_test::make_mla_host;
using attnstate_test::MlaConfig;
using attnstate_test::MlaHost;
using attnstate_test::moved;
using attnstate_test::upload;

constexpr const char* kPlanFn = "attnstate::cuda::plan_mla_decode";
constexpr const char* kRunFn = "attnstate::cuda::run_mla_decode";

/// An MLA host problem copied to the device, with device views of its queries and cache.
struct DeviceMla {
  DeviceBuffer<unsigned char> q, ckv, kpe, pool;
  DeviceBuffer<std::int32_t> lens, indptr, indices, bt;
  DeviceBuffer<float> scales, sinks;
  explicit DeviceMla(const MlaHost& h)
      : q(upload(h.q)),
        ckv(upload(h.ckv)),
        kpe(upload(h.kpe)),
        pool(upload(h.pool)),
        lens(upload(h.seq_lens)),
        indptr(upload(h.indptr)),
        indices(upload(h.indices)),
        bt(upload(h.block_table)),
        scales(upload(h.scale_mem)),
        sinks(upload(h.problem.sinks)) {}
  /// The cache view over the device copies (`one_pool`: FlashMLA's interleaved pool).
  MlaKvCache kv(const MlaHost& h, bool one_pool = false) const {
    MlaKvCache c = h.kv_view(one_pool);
    c.ckv = one_pool ? moved(c.ckv, h.pool, pool) : moved(c.ckv, h.ckv, ckv);
    c.kpe = one_pool ? moved(c.kpe, h.pool, pool) : moved(c.kpe, h.kpe, kpe);
    if (c.ckv_scale.data != nullptr) c.ckv_scale.data = scales.get();
    if (c.kpe_scale.data != nullptr) c.kpe_scale.data = scales.get() + 1;
    c.seq_lens = lens.get();
    if (h.cfg.block_table) {
      c.block_table = bt.get();
    } else {
      c.page_indptr = indptr.get();
      c.page_indices = indices.get();
    }
    c.space = MemorySpace::kDevice;
    return c;
  }
  ConstTensorView q_nope(const MlaHost& h) const { return device_view(h.q_nope_view(), h); }
  ConstTensorView q_pe(const MlaHost& h) const { return device_view(h.q_pe_view(), h); }
  ConstTensorView device_view(ConstTensorView t, const MlaHost& h) const {
    t.data = moved(t.data, h.q, q);
    t.space = MemorySpace::kDevice;
    return t;
  }
  AttentionSinks attention_sinks(const MlaHost& h) const {
    AttentionSinks s;
    if (h.problem.has_sinks()) s.logits = sinks.get();
    return s;
  }
};

/// The planned problem of `h`.
cuda::MlaDecodeProblem problem_of(const MlaHost& h) {
  cuda::MlaDecodeProblem pr;
  pr.batch = h.batch;
  pr.q_len = h.cfg.q_len;
  pr.heads = h.cfg.heads;
  pr.q_dtype = h.cfg.q_dtype;
  pr.ckv_dtype = h.cfg.ckv_dtype;
  pr.kpe_dtype = h.cfg.kpe_dtype;
  return pr;
}

DecodeOptions fixed_count(int n) {
  DecodeOptions o;
  o.policy = SplitPolicy::kFixedCount;
  o.num_splits = n;
  return o;
}

DecodeOptions fixed_size(int size) {
  DecodeOptions o;
  o.policy = SplitPolicy::kFixedSize;
  o.split_size = size;
  return o;
}

/// The catalog family of a plan's kernel.
catalog::Family family_of(const cuda::MlaDecodePlan& plan) {
  return catalog::kRows[static_cast<std::size_t>(plan.kernel_id())].family;
}

/// The MLA decode kernels the device runs for requests of `rows` query rows (`heads · q_len`):
/// mma.sync, and the wgmma kernels where the planner's automatic choice takes one (an sm_90 device
/// running sm_90a code: the wgmma kernel and its balanced variant), with the narrow wgmma kernels
/// besides for at most 32 rows.
std::vector<cuda::MlaDecodeKernel> device_kernels(std::int64_t rows) {
  cuda::MlaDecodeProblem pr;
  pr.batch = 1;
  pr.heads = 16;
  const std::int32_t len = 1;
  const bool ws =
      family_of(cuda::plan_mla_decode(pr, &len, DecodeOptions{}, 1)) != catalog::Family::kMlaDecode;
  if (ws && rows <= catalog::kMlaNarrowRows)
    return {cuda::MlaDecodeKernel::kMma, cuda::MlaDecodeKernel::kWgmma,
            cuda::MlaDecodeKernel::kWgmmaBalanced, cuda::MlaDecodeKernel::kWgmmaNarrow,
            cuda::MlaDecodeKernel::kWgmmaNarrow2};
  if (ws)
    return {cuda::MlaDecodeKernel::kMma, cuda::MlaDecodeKernel::kWgmma,
            cuda::MlaDecodeKernel::kWgmmaBalanced};
  return {cuda::MlaDecodeKernel::kMma};
}

/// Whether `k` is one of the narrow kernels (requests of at most 32 rows).
bool is_narrow(cuda::MlaDecodeKernel k) {
  return k == cuda::MlaDecodeKernel::kWgmmaNarrow || k == cuda::MlaDecodeKernel::kWgmmaNarrow2;
}

/// A kernel's name in failure messages.
std::string kernel_name(cuda::MlaDecodeKernel k) {
  return k == cuda::MlaDecodeKernel::kWgmma           ? "wgmma"
         : k == cuda::MlaDecodeKernel::kWgmmaBalanced ? "wgmma-balanced"
         : k == cuda::MlaDecodeKernel::kWgmmaNarrow   ? "wgmma-narrow"
         : k == cuda::MlaDecodeKernel::kWgmmaNarrow2  ? "wgmma-narrow2"
         : k == cuda::MlaDecodeKernel::kMma           ? "mma.sync"
                                                      : "auto";
}

/// The catalog family of a kernel choice other than `kAuto`.
catalog::Family family_of(cuda::MlaDecodeKernel k) {
  return k == cuda::MlaDecodeKernel::kWgmma           ? catalog::Family::kMlaDecodeWs
         : k == cuda::MlaDecodeKernel::kWgmmaBalanced ? catalog::Family::kMlaDecodeWsBalanced
         : k == cuda::MlaDecodeKernel::kWgmmaNarrow   ? catalog::Family::kMlaDecodeNarrow
         : k == cuda::MlaDecodeKernel::kWgmmaNarrow2  ? catalog::Family::kMlaDecodeNarrow2
                                                      : catalog::Family::kMlaDecode;
}

/// Plans (on `kernel`, checked to be the plan's row) and runs the CUDA MLA decode of `h` (scale
/// of the problem, sinks of the problem) into a fresh poisoned output; returns it on the host.
HostState run_cuda(const MlaHost& h, const DeviceMla& d, DecodeOptions options, DType out_dtype,
                   LseBase base, bool one_pool = false, cuda::MlaDecodePlan* keep = nullptr,
                   cuda::MlaDecodeKernel kernel = cuda::MlaDecodeKernel::kAuto) {
  options.scale = h.problem.scale;
  const cuda::MlaDecodePlan plan = cuda::plan_mla_decode(problem_of(h), h.seq_lens.data(), options,
                                                         attnstate_test::device_sms(), kernel);
  if (kernel != cuda::MlaDecodeKernel::kAuto)
    EXPECT_EQ(family_of(plan), family_of(kernel)) << plan.to_string();
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  cuda::init_mla_decode_workspace(plan, ws.get(), ws.bytes());
  DeviceState out(h.tokens(), h.cfg.heads, h.cfg.kv_lora_rank, out_dtype, base);
  cuda::run_mla_decode(plan, d.q_nope(h), d.q_pe(h), d.kv(h, one_pool), d.attention_sinks(h),
                       out.view, ws.get(), ws.bytes());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  if (keep) *keep = plan;
  return out.download();
}

/// Compares `out` with the kit's double reference of `h` (its sinks included) at the kit's
/// tolerance for a kernel that rounds P to bf16: "" when it matches.
std::string compare_with_reference(const MlaHost& h, const HostState& out) {
  attnstate::testing::MlaProblem p = h.problem;
  p.out_dtype = out.dtype();
  p.base = out.base();
  return attnstate::testing::compare_states(out, h.reference(out.base()),
                                            attnstate::testing::tolerance_for(p, true));
}

struct Case {
  DType ckv, kpe, out;
  std::int64_t page, q_len, heads;
  bool bt;
  LseBase base;
  bool sinks;
  bool one_pool;
};

MlaConfig config_of(const Case& c, std::uint64_t seed) {
  MlaConfig cfg;
  cfg.ckv_dtype = c.ckv;
  cfg.kpe_dtype = c.kpe;
  cfg.page_size = c.page;
  cfg.q_len = c.q_len;
  cfg.heads = c.heads;
  cfg.block_table = c.bt;
  if (is_fp8(c.ckv)) {
    cfg.kv_amp = c.ckv == DType::kE4M3 ? 224.f : 2.f;
    cfg.ckv_scale = 0x1p-7f;
    cfg.kpe_scale = is_fp8(c.kpe) ? 0.37f : 1.f;
    cfg.scale_pointer = seed % 2 == 0;
  }
  // lengths: empty, shorter than q_len, a page + 1, several tiles, many tiles
  cfg.seq_lens = {0, 2, static_cast<std::int32_t>(c.page + 1), 45, 300};
  if (c.heads > 16) cfg.seq_lens = {static_cast<std::int32_t>(c.page), 19, 130};
  return cfg;
}

void add_sinks(MlaHost& h, std::uint64_t seed) {
  h.problem.sinks.resize(static_cast<std::size_t>(h.cfg.heads));
  for (std::size_t i = 0; i < h.problem.sinks.size(); ++i)
    h.problem.sinks[i] = -2.f + 0.37f * static_cast<float>((i * 7 + seed) % 23);
}

// (tests named *Large* are skipped under compute-sanitizer by scripts/gpu-check.sh;
// `EveryPathOnASmallProblem` is its coverage of every kernel path)
TEST(MlaCuda, LargeMatrixMatchesTheReference) {
  ATTNSTATE_REQUIRE_GPU();
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  const DType e4 = DType::kE4M3, e5 = DType::kE5M2;
  const LseBase ln = LseBase::kNatural, b2 = LseBase::kBase2;
  const Case cases[] = {
      {bf, bf, f32, 16, 1, 16, false, ln, false, false},
      {bf, bf, bf, 64, 2, 16, true, b2, true, false},
      {bf, bf, f16, 1, 3, 16, false, b2, false, true},
      {bf, bf, f32, 7, 4, 16, true, ln, true, false},
      {e4, bf, f32, 64, 1, 16, true, ln, false, true},
      {e4, e4, bf, 16, 2, 16, false, b2, true, false},
      {e5, e5, f32, 33, 3, 16, false, ln, false, false},
      {e4, bf, f16, 1, 4, 16, true, b2, true, false},
      {bf, bf, f32, 16, 1, 64, true, b2, false, false},
      {bf, bf, bf, 33, 2, 64, false, ln, true, true},
      {bf, bf, f32, 16, 1, 128, false, b2, true, false},
      {e4, bf, bf, 64, 2, 128, true, ln, false, false},
      {e4, e4, f32, 1, 1, 128, false, b2, false, false},
  };
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    MlaHost h = make_mla_host(config_of(c, seed), seed);
    if (c.sinks) add_sinks(h, seed);
    ++seed;
    const DeviceMla d(h);
    for (const cuda::MlaDecodeKernel k : device_kernels(c.heads * c.q_len))
      for (const DecodeOptions& o :
           {fixed_count(1), fixed_count(3), fixed_size(32), DecodeOptions{}}) {
        const HostState out = run_cuda(h, d, o, c.out, c.base, c.one_pool, nullptr, k);
        EXPECT_EQ(compare_with_reference(h, out), "")
            << kernel_name(k) << " " << h.cfg.name() << " policy " << static_cast<int>(o.policy)
            << " n " << o.num_splits << " size " << o.split_size << (c.sinks ? " sinks" : "")
            << (c.one_pool ? " one pool" : "");
      }
  }
}

TEST(MlaCuda, EveryPathOnASmallProblem) {
  ATTNSTATE_REQUIRE_GPU();
  // each row of each kernel (bf16, e4m3 and e5m2 latent parts; fp8 and bf16 rope), one split,
  // the ticket merge (3 splits) and the stacked merge (5: the empty request's and the 40-token
  // request's slots past their splits written empty), sinks, two row tiles, partial K/V tiles, a
  // request of four 64-key tiles (the wgmma kernel's two-stage ring refilled): small enough for
  // memcheck and racecheck
  const DType bf = DType::kBF16, e4 = DType::kE4M3, e5 = DType::kE5M2;
  const Case cases[] = {
      {bf, bf, DType::kF32, 16, 2, 16, false, LseBase::kNatural, true, false},
      {e4, e4, DType::kBF16, 16, 1, 16, true, LseBase::kBase2, false, false},
      {e5, bf, DType::kF16, 16, 2, 48, false, LseBase::kBase2, true, false},
  };
  std::uint64_t seed = 51;
  for (const Case& c : cases) {
    MlaConfig cfg = config_of(c, seed);
    cfg.seq_lens = {0, 40, 200};
    MlaHost h = make_mla_host(cfg, seed);
    if (c.sinks) add_sinks(h, seed);
    ++seed;
    const DeviceMla d(h);
    for (const cuda::MlaDecodeKernel k : device_kernels(c.heads * c.q_len))
      for (const DecodeOptions& o : {fixed_count(1), fixed_count(3), fixed_count(5)}) {
        const HostState out = run_cuda(h, d, o, c.out, c.base, false, nullptr, k);
        EXPECT_EQ(compare_with_reference(h, out), "")
            << kernel_name(k) << " " << h.cfg.name() << " n " << o.num_splits;
      }
  }
}

TEST(MlaCuda, LargeLogitsAndLongRequests) {
  ATTNSTATE_REQUIRE_GPU();
  // scores in the hundreds (the running max moves), and requests of many tiles and splits
  // (16 heads: 32 rows, for the narrow kernel alone; the others run the 64 rows of 32 heads)
  for (const std::int64_t heads : {32, 16}) {
    MlaConfig cfg;
    cfg.q_gain = 40.f;
    cfg.q_len = 2;
    cfg.heads = heads;
    cfg.page_size = 64;
    cfg.seq_lens = {1500, 77, 4096};
    const MlaHost h = make_mla_host(cfg, 11);
    const DeviceMla d(h);
    for (const cuda::MlaDecodeKernel k : device_kernels(cfg.heads * cfg.q_len)) {
      if (heads == 16 && !is_narrow(k)) continue;
      for (const DecodeOptions& o : {fixed_count(1), fixed_count(7), DecodeOptions{}}) {
        const HostState out = run_cuda(h, d, o, DType::kF32, LseBase::kNatural, false, nullptr, k);
        EXPECT_EQ(compare_with_reference(h, out), "")
            << kernel_name(k) << " heads " << heads << " " << o.num_splits;
      }
    }
  }
}

TEST(MlaCuda, EmptyRowsAreTheIdentityOrTheSink) {
  ATTNSTATE_REQUIRE_GPU();
  // a request with no keys, one shorter than q_len: its first rows see nothing (q_len 2: the
  // rows of the narrow kernel, run by it alone)
  MlaConfig cfg;
  cfg.seq_lens = {0, 1};
  for (const std::int64_t q_len : {3, 2})
    for (bool sinks : {false, true}) {
      cfg.q_len = q_len;
      MlaHost h = make_mla_host(cfg, 3);
      if (sinks) add_sinks(h, 3);
      const DeviceMla d(h);
      for (const cuda::MlaDecodeKernel k : device_kernels(cfg.heads * cfg.q_len))
        for (const DecodeOptions& o : {fixed_count(1), fixed_count(2)}) {
          if (q_len == 2 && !is_narrow(k)) continue;
          SCOPED_TRACE(kernel_name(k) + " q_len " + std::to_string(q_len));
          const HostState out =
              run_cuda(h, d, o, DType::kF32, LseBase::kNatural, false, nullptr, k);
          // request 0's q_len rows, request 1's first q_len - 1
          for (std::int64_t t = 0; t < 2 * q_len - 1; ++t)
            for (std::int64_t hd = 0; hd < cfg.heads; ++hd) {
              const float lse = out.lse_values()[static_cast<std::size_t>(t * cfg.heads + hd)];
              if (sinks)  // the sink's logit, through base 2 and back
                EXPECT_NEAR(lse, h.problem.sinks[static_cast<std::size_t>(hd)], 1e-5f)
                    << t << " " << hd;
              else
                EXPECT_TRUE(std::isinf(lse) && lse < 0) << t << " " << hd << " " << lse;
              for (std::int64_t x = 0; x < cfg.kv_lora_rank; ++x)
                ASSERT_EQ(out.o_tensor().get((t * cfg.heads + hd) * cfg.kv_lora_rank + x), 0.f);
            }
          EXPECT_EQ(compare_with_reference(h, out), "");
        }
    }
}

TEST(MlaCuda, TheTwoCtaNarrowKernelKeepsTwoCtasPerSm) {
  ATTNSTATE_REQUIRE_GPU();
  // its shared memory and registers (setmaxnreg within 128 a thread) leave room for two CTAs,
  // which its split layout fills: the point of the configuration
  const std::vector<cuda::MlaDecodeKernel> ks = device_kernels(32);
  if (std::find(ks.begin(), ks.end(), cuda::MlaDecodeKernel::kWgmmaNarrow2) == ks.end())
    GTEST_SKIP() << "no wgmma kernels on this device";
  for (const int rows : {16, 32})
    EXPECT_EQ(cuda::detail::mla_narrow2_resident_ctas(rows), catalog::kMlaNarrow2CtasPerSm)
        << rows << " rows";
}

TEST(MlaCuda, ReplaysAPlanForFewerAndShorterRequests) {
  ATTNSTATE_REQUIRE_GPU();
  // plan at the maximum shape, run a smaller batch of shorter requests on the same workspace
  MlaConfig big;
  big.seq_lens = {700, 500, 900};
  const MlaHost hb = make_mla_host(big, 21);
  MlaConfig small = big;
  small.seq_lens = {40, 333};
  const MlaHost hs = make_mla_host(small, 22);
  const DeviceMla d(hs);
  // split whatever the automatic chooser takes: 3 splits (the ticket merge) and splits of 256
  // tokens (4 of the planned 900: the stacked merge, its stack of the replay's 2 requests)
  for (DecodeOptions o : {fixed_count(3), fixed_size(256)})
    for (const cuda::MlaDecodeKernel k : device_kernels(big.heads * big.q_len)) {
      o.scale = hs.problem.scale;
      const cuda::MlaDecodePlan plan = cuda::plan_mla_decode(problem_of(hb), hb.seq_lens.data(), o,
                                                             attnstate_test::device_sms(), k);
      ASSERT_GT(plan.splits().max_splits, 1) << plan.to_string();
      DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
      cuda::init_mla_decode_workspace(plan, ws.get(), ws.bytes());
      for (int rep = 0; rep < 2; ++rep) {  // the tickets are left at zero for the next run
        DeviceState out(hs.tokens(), hs.cfg.heads, 512, DType::kF32, LseBase::kBase2);
        cuda::run_mla_decode(plan, d.q_nope(hs), d.q_pe(hs), d.kv(hs), out.view, ws.get(),
                             ws.bytes());
        ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(compare_with_reference(hs, out.download()), "")
            << kernel_name(k) << " " << plan.to_string() << " " << rep;
      }
    }
}

TEST(MlaCuda, SplitStatesMergedWithMergeStatesEqualTheOnePassState) {
  ATTNSTATE_REQUIRE_GPU();
  // q_len 1: each request's pages cut into three shards, each run as its own request (a CSR
  // table of the shard's pages); the shards' states merged by cuda::merge_states
  MlaConfig cfg;
  cfg.heads = 32;
  cfg.page_size = 16;
  cfg.seq_lens = {200, 97, 16};
  const MlaHost h = make_mla_host(cfg, 31);
  const DeviceMla d(h);
  for (const cuda::MlaDecodeKernel k : device_kernels(cfg.heads * cfg.q_len)) {
    SCOPED_TRACE(kernel_name(k));
    const std::int64_t B = h.batch, H = cfg.heads, L = cfg.kv_lora_rank, S = 3;
    const HostState one =
        run_cuda(h, d, fixed_count(1), DType::kF32, LseBase::kBase2, false, nullptr, k);
    DeviceBuffer<float> stack_o(static_cast<std::size_t>(S * B * H * L));
    DeviceBuffer<float> stack_lse(static_cast<std::size_t>(S * B * H));
    for (std::int64_t s = 0; s < S; ++s) {
      std::vector<std::int32_t> indptr(1, 0), indices, lens;
      for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t pages = (h.seq_lens[b] + cfg.page_size - 1) / cfg.page_size;
        const std::int64_t p0 = pages * s / S, p1 = pages * (s + 1) / S;
        for (std::int64_t p = p0; p < p1; ++p) indices.push_back(h.indices[h.indptr[b] + p]);
        indptr.push_back(static_cast<std::int32_t>(indices.size()));
        lens.push_back(static_cast<std::int32_t>(std::max<std::int64_t>(
            0, std::min<std::int64_t>(h.seq_lens[b], p1 * cfg.page_size) - p0 * cfg.page_size)));
      }
      if (indices.empty()) indices.push_back(0);
      const DeviceBuffer<std::int32_t> dptr = upload(indptr), dind = upload(indices),
                                       dlen = upload(lens);
      MlaKvCache kv = d.kv(h);
      kv.page_indptr = dptr.get();
      kv.page_indices = dind.get();
      kv.seq_lens = dlen.get();
      DecodeOptions o = fixed_count(2);
      o.scale = h.problem.scale;
      const cuda::MlaDecodePlan plan =
          cuda::plan_mla_decode(problem_of(h), lens.data(), o, attnstate_test::device_sms(), k);
      DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
      cuda::init_mla_decode_workspace(plan, ws.get(), ws.bytes());
      const StateView part =
          make_state_view(stack_o.get() + s * B * H * L, DType::kF32, stack_lse.get() + s * B * H,
                          B, H, L, LseBase::kBase2, MemorySpace::kDevice);
      cuda::run_mla_decode(plan, d.q_nope(h), d.q_pe(h), kv, part, ws.get(), ws.bytes());
      ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
    }
    DeviceState merged(B, H, L, DType::kF32, LseBase::kBase2);
    cuda::merge_states(
        make_state_stack(stack_o.get(), DType::kF32, stack_lse.get(), StackOrder::kStatesMajor, B,
                         S, H, L, LseBase::kBase2, MemorySpace::kDevice),
        merged.view);
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
    const HostState m = merged.download();
    EXPECT_EQ(compare_with_reference(h, m), "");
    EXPECT_EQ(compare_with_reference(h, one), "");
    attnstate::testing::MlaProblem p = h.problem;
    p.out_dtype = DType::kF32;
    p.base = LseBase::kBase2;
    attnstate::testing::Tolerance tol = attnstate::testing::tolerance_for(p, true);
    tol = tol.scaled(2.0);  // both sides carry rounding
    EXPECT_EQ(attnstate::testing::compare_states(m, one, tol), "");
  }
}

// ---- the kit's laws on a CUDA adapter ----

/// The kernel the kit's adapter plans (`LargeDrawsPassEveryLawOfTheKit` sets it).
cuda::MlaDecodeKernel g_kit_kernel = cuda::MlaDecodeKernel::kAuto;

/// The CUDA MLA decode as a kit kernel: the selected latent tokens in one page that every query
/// row (a request of one new token) reads through its block table, two splits, on `g_kit_kernel`.
HostState cuda_mla_kernel(const attnstate::testing::MlaProblem& all,
                          const std::vector<std::int64_t>& keys) {
  const attnstate::testing::MlaProblem p = attnstate::testing::select_keys(all, keys);
  const std::int64_t T = p.tokens(), H = p.heads(), L = p.kv_lora_rank(), R = p.rope_dim();
  const std::int64_t N = p.num_keys();
  const std::vector<std::int32_t> table(static_cast<std::size_t>(std::max<std::int64_t>(1, T)), 0);
  const std::vector<std::int32_t> lens(static_cast<std::size_t>(std::max<std::int64_t>(1, T)),
                                       static_cast<std::int32_t>(N));
  auto raw = [](const attnstate::testing::HostTensor& t) {
    const auto* b = static_cast<const unsigned char*>(t.data());
    return std::vector<unsigned char>(b, b + bytes_of(t));
  };
  const DeviceBuffer<unsigned char> qn = upload(raw(p.q_nope)), qp = upload(raw(p.q_pe)),
                                    ckv = upload(raw(p.ckv)), kpe = upload(raw(p.kpe));
  const DeviceBuffer<std::int32_t> dtable = upload(table), dlens = upload(lens);
  const DeviceBuffer<float> dsinks = upload(p.sinks);
  MlaKvCache kv;
  kv.ckv = ckv.get();
  kv.kpe = kpe.get();
  kv.ckv_dtype = p.ckv.dtype();
  kv.kpe_dtype = p.kpe.dtype();
  if (is_fp8(kv.ckv_dtype)) kv.ckv_scale = KvScale::per_tensor(p.ckv_scale);
  if (is_fp8(kv.kpe_dtype)) kv.kpe_scale = KvScale::per_tensor(p.kpe_scale);
  kv.kv_lora_rank = L;
  kv.rope_dim = R;
  kv.num_pages = 1;
  kv.page_size = std::max<std::int64_t>(1, N);
  kv.block_table = dtable.get();
  kv.block_table_stride = 1;
  kv.seq_lens = dlens.get();
  kv.batch = T;
  kv.space = MemorySpace::kDevice;
  const ConstTensorView q_nope =
      make_tensor_view(qn.get(), p.q_nope.dtype(), {T, 1, H, L}, MemorySpace::kDevice);
  const ConstTensorView q_pe =
      make_tensor_view(qp.get(), p.q_pe.dtype(), {T, 1, H, R}, MemorySpace::kDevice);
  cuda::MlaDecodeProblem pr;
  pr.batch = T;
  pr.heads = H;
  pr.q_dtype = p.q_nope.dtype();
  pr.ckv_dtype = kv.ckv_dtype;
  pr.kpe_dtype = kv.kpe_dtype;
  DecodeOptions o = fixed_count(2);
  o.scale = p.scale;
  const cuda::MlaDecodePlan plan =
      cuda::plan_mla_decode(pr, lens.data(), o, attnstate_test::device_sms(), g_kit_kernel);
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  cuda::init_mla_decode_workspace(plan, ws.get(), ws.bytes());
  DeviceState out(T, H, L, p.out_dtype, p.base);
  AttentionSinks s;
  if (p.has_sinks()) s.logits = dsinks.get();
  cuda::run_mla_decode(plan, q_nope, q_pe, kv, s, out.view, ws.get(), ws.bytes());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

TEST(MlaCudaKit, LargeDrawsPassEveryLawOfTheKit) {
  ATTNSTATE_REQUIRE_GPU();
  attnstate::testing::MlaKernelCheckOptions o;
  o.num_tests = 15;
  o.problems.max_keys = 150;
  o.problems.heads = {16, 32};
  o.problems.q_dtypes = {DType::kBF16};
  o.problems.ckv_dtypes = {DType::kBF16, DType::kE4M3, DType::kE5M2};
  o.problems.sink_percent = 50;
  for (const cuda::MlaDecodeKernel k : device_kernels(32)) {  // (q_len 1, at most 32 heads)
    g_kit_kernel = k;
    const attnstate::testing::KernelCheckReport report =
        attnstate::testing::check_mla_kernel(cuda_mla_kernel, o);
    EXPECT_TRUE(report.passed()) << kernel_name(k) << ": " << report.summary();
    EXPECT_EQ(report.laws.size(), attnstate::testing::all_laws().size());
  }
  g_kit_kernel = cuda::MlaDecodeKernel::kAuto;
}

// ---- argument errors: each names the argument ----

cuda::MlaDecodeProblem small_problem() {
  cuda::MlaDecodeProblem pr;
  pr.batch = 2;
  pr.heads = 16;
  return pr;
}

TEST(MlaCudaErrors, ThePlannerNamesEachArgument) {
  // host only: runs without a GPU
  const std::vector<std::int32_t> lens = {10, 20};
  const DecodeOptions o;
  auto plan = [&](const cuda::MlaDecodeProblem& pr, const DecodeOptions& opt, int sms = 4) {
    return [pr, opt, sms, &lens] { (void)cuda::plan_mla_decode(pr, lens.data(), opt, sms); };
  };
  cuda::MlaDecodeProblem pr = small_problem();
  pr.heads = 24;
  expect_named_error(plan(pr, o), Status::kNotSupported, "problem.heads", kPlanFn);
  pr = small_problem();
  pr.heads = 256;
  expect_named_error(plan(pr, o), Status::kNotSupported, "problem.heads", kPlanFn);
  pr = small_problem();
  pr.q_len = 5;
  expect_named_error(plan(pr, o), Status::kNotSupported, "problem.q_len", kPlanFn);
  pr = small_problem();
  pr.q_len = 0;
  expect_named_error(plan(pr, o), Status::kInvalidArgument, "problem.q_len", kPlanFn);
  pr = small_problem();
  pr.kv_lora_rank = 256;
  expect_named_error(plan(pr, o), Status::kNotSupported, "problem.kv_lora_rank", kPlanFn);
  pr = small_problem();
  pr.rope_dim = 32;
  expect_named_error(plan(pr, o), Status::kNotSupported, "problem.rope_dim", kPlanFn);
  pr = small_problem();
  pr.q_dtype = DType::kF16;
  expect_named_error(plan(pr, o), Status::kNotSupported, "problem.q_dtype", kPlanFn);
  pr = small_problem();
  pr.ckv_dtype = DType::kF32;
  expect_named_error(plan(pr, o), Status::kNotSupported, "problem.ckv_dtype", kPlanFn);
  pr = small_problem();
  pr.kpe_dtype = DType::kE4M3;  // fp8 rope under a bf16 latent part
  expect_named_error(plan(pr, o), Status::kNotSupported, "problem.kpe_dtype", kPlanFn);
  pr = small_problem();
  pr.batch = -1;
  expect_named_error(plan(pr, o), Status::kInvalidArgument, "problem.batch", kPlanFn);
  expect_named_error(plan(small_problem(), o, 0), Status::kInvalidArgument, "num_sms", kPlanFn);
  DecodeOptions bad;
  bad.variant.window_left = 8;
  expect_named_error(plan(small_problem(), bad), Status::kNotSupported, "options.variant", kPlanFn);
  bad = DecodeOptions{};
  bad.kernel = DecodeKernel::kStreamed;
  expect_named_error(plan(small_problem(), bad), Status::kNotSupported, "options.kernel", kPlanFn);
  bad = DecodeOptions{};
  bad.split_cluster = 2;
  expect_named_error(plan(small_problem(), bad), Status::kNotSupported, "options.split_cluster",
                     kPlanFn);
  bad = DecodeOptions{};
  bad.plan_ctas_per_sm = 1;
  expect_named_error(plan(small_problem(), bad), Status::kNotSupported, "options.plan_ctas_per_sm",
                     kPlanFn);
  bad = DecodeOptions{};
  bad.scale = NAN;
  expect_named_error(plan(small_problem(), bad), Status::kInvalidArgument, "options.scale",
                     kPlanFn);
  bad = fixed_size(24);
  expect_named_error(plan(small_problem(), bad), Status::kInvalidArgument, "options.split_size",
                     kPlanFn);
  expect_named_error(
      [] { (void)cuda::plan_mla_decode(small_problem(), nullptr, DecodeOptions{}, 4); },
      Status::kInvalidArgument, "seq_lens_host", kPlanFn);
}

TEST(MlaCudaErrors, PlansRecordTheirSplitsAndWorkspace) {
  // host only: the plan's layout, kernel row and workspace size
  const std::vector<std::int32_t> lens = {4000, 10};
  cuda::MlaDecodeProblem pr = small_problem();
  pr.q_len = 2;
  pr.heads = 128;
  const cuda::MlaDecodePlan one = cuda::plan_mla_decode(pr, lens.data(), fixed_count(1), 132);
  EXPECT_EQ(one.splits().max_splits, 1);
  EXPECT_EQ(one.workspace_bytes(), 0u);
  EXPECT_EQ(one.row_tiles(), 4);
  EXPECT_GE(one.kernel_id(), 0);
  const cuda::MlaDecodePlan three = cuda::plan_mla_decode(pr, lens.data(), fixed_count(3), 132);
  const std::size_t parts = 2 * 4 * 3 * 64;
  const auto r256 = [](std::size_t x) { return (x + 255) / 256 * 256; };
  EXPECT_EQ(three.workspace_bytes(), r256(parts * 512 * 4) + r256(parts * 4) + r256(2 * 4 * 4));
  EXPECT_NE(three.to_string().find("MLA decode"), std::string::npos) << three.to_string();
  EXPECT_NE(three.to_string().find("ticket merge"), std::string::npos) << three.to_string();
  // from kMlaStackMergeSplits splits: a stack [split][batch · q_len · heads][512] and its merge's
  // fp32 state and zero row, no tickets
  const int many = attnstate::plan::kMlaStackMergeSplits;
  const cuda::MlaDecodePlan stacked =
      cuda::plan_mla_decode(pr, lens.data(), fixed_count(many), 132);
  ASSERT_EQ(stacked.splits().max_splits, many);
  const std::size_t rows = 2 * 2 * 128;
  EXPECT_EQ(stacked.workspace_bytes(), r256(rows * many * 512 * 4) + r256(rows * many * 4) +
                                           r256(rows * 512 * 4) + r256(rows * 4) + r256(512 * 4));
  EXPECT_NE(stacked.to_string().find("stacked"), std::string::npos) << stacked.to_string();
  const cuda::MlaDecodePlan below =
      cuda::plan_mla_decode(pr, lens.data(), fixed_count(many - 1), 132);
  EXPECT_NE(below.to_string().find("ticket merge"), std::string::npos) << below.to_string();
  // the automatic policy splits a long request over an idle device, and not a full one
  const cuda::MlaDecodePlan autop = cuda::plan_mla_decode(pr, lens.data(), DecodeOptions{}, 132);
  EXPECT_GT(autop.splits().max_splits, 1) << autop.to_string();
  pr.batch = 1;
  const std::vector<std::int32_t> shorts = {64};
  EXPECT_EQ(cuda::plan_mla_decode(pr, shorts.data(), DecodeOptions{}, 132).splits().max_splits, 1);
  const cuda::MlaDecodePlan none;
  expect_named_error([&] { cuda::init_mla_decode_workspace(none, nullptr, 0); },
                     Status::kInvalidArgument, "plan");
}

TEST(MlaCudaErrors, PlansNameTheKernelAsked) {
  // host only: each kernel choice plans its family's row of the latent dtype (the wgmma row
  // whatever the device: a run elsewhere is refused); the automatic choice takes the mma.sync
  // row without a GPU
  const std::vector<std::int32_t> lens = {300, 10};
  const DType dts[][2] = {{DType::kBF16, DType::kBF16},
                          {DType::kE4M3, DType::kBF16},
                          {DType::kE4M3, DType::kE4M3},
                          {DType::kE5M2, DType::kE5M2}};
  for (const auto& dt : dts) {
    cuda::MlaDecodeProblem pr = small_problem();
    pr.ckv_dtype = dt[0];
    pr.kpe_dtype = dt[1];
    const auto plan = [&](cuda::MlaDecodeKernel k) {
      return cuda::plan_mla_decode(pr, lens.data(), fixed_count(2), 132, k);
    };
    const cuda::MlaDecodePlan mma = plan(cuda::MlaDecodeKernel::kMma);
    const cuda::MlaDecodePlan wg = plan(cuda::MlaDecodeKernel::kWgmma);
    const catalog::Row& rm = catalog::kRows[static_cast<std::size_t>(mma.kernel_id())];
    const catalog::Row& rw = catalog::kRows[static_cast<std::size_t>(wg.kernel_id())];
    EXPECT_EQ(rm.family, catalog::Family::kMlaDecode) << mma.to_string();
    EXPECT_EQ(rw.family, catalog::Family::kMlaDecodeWs) << wg.to_string();
    EXPECT_EQ(rm.kv, dt[0]);
    EXPECT_EQ(rw.kv, dt[0]);
    EXPECT_EQ(rw.tile_keys, 64) << wg.to_string();
    EXPECT_NE(wg.to_string().find("wgmma"), std::string::npos) << wg.to_string();
    // the same splits and workspace: the kernels share the split chooser and the epilogues
    EXPECT_EQ(wg.splits().max_splits, mma.splits().max_splits);
    EXPECT_EQ(wg.workspace_bytes(), mma.workspace_bytes());
    // the balanced wgmma kernel: its own row of the latent dtype and the wgmma row's tiles,
    // splits and workspace
    const cuda::MlaDecodePlan bal = plan(cuda::MlaDecodeKernel::kWgmmaBalanced);
    const catalog::Row& rb = catalog::kRows[static_cast<std::size_t>(bal.kernel_id())];
    EXPECT_EQ(rb.family, catalog::Family::kMlaDecodeWsBalanced) << bal.to_string();
    EXPECT_EQ(rb.kv, dt[0]);
    EXPECT_EQ(rb.tile_rows, rw.tile_rows) << bal.to_string();
    EXPECT_EQ(rb.tile_keys, 64) << bal.to_string();
    EXPECT_NE(bal.to_string().find("balanced"), std::string::npos) << bal.to_string();
    EXPECT_EQ(bal.splits().max_splits, mma.splits().max_splits);
    EXPECT_EQ(bal.workspace_bytes(), mma.workspace_bytes());
    if (!attnstate_test::gpu_available())
      EXPECT_EQ(family_of(plan(cuda::MlaDecodeKernel::kAuto)), catalog::Family::kMlaDecode);
    // the narrow kernels: each its own row of the latent dtype, the same splits and workspace;
    // refused by name past 32 rows
    for (const std::int64_t q_len : {1, 2}) {
      pr.q_len = q_len;
      for (const cuda::MlaDecodeKernel k :
           {cuda::MlaDecodeKernel::kWgmmaNarrow, cuda::MlaDecodeKernel::kWgmmaNarrow2}) {
        const cuda::MlaDecodePlan nw = plan(k);
        const catalog::Row& rn = catalog::kRows[static_cast<std::size_t>(nw.kernel_id())];
        EXPECT_EQ(rn.family, family_of(k)) << nw.to_string();
        EXPECT_EQ(rn.kv, dt[0]);
        EXPECT_EQ(rn.tile_rows, 32) << nw.to_string();
        EXPECT_EQ(nw.splits().max_splits, plan(cuda::MlaDecodeKernel::kMma).splits().max_splits);
        EXPECT_EQ(nw.workspace_bytes(), plan(cuda::MlaDecodeKernel::kMma).workspace_bytes());
      }
      // the automatic choice on a wgmma device, for few rows: narrow over a bf16 cache, the
      // two-CTA narrow kernel over fp8 where its splits stay long; from kMlaBalancedAutoRows rows
      // of a bf16 cache the balanced wgmma kernel; else the wgmma kernel
      const cuda::MlaDecodePlan ap = plan(cuda::MlaDecodeKernel::kAuto);
      const catalog::Family fa = family_of(ap);
      if (fa != catalog::Family::kMlaDecode) {
        const bool few = pr.heads * q_len <= cuda::tuning::kMlaNarrowAutoRows;
        const bool two =
            few && dt[0] != DType::kBF16 &&
            attnstate::plan::mla_narrow2_layout_ok(
                plan(cuda::MlaDecodeKernel::kWgmmaNarrow2).splits(), lens.data(), pr.batch);
        EXPECT_EQ(fa == catalog::Family::kMlaDecodeNarrow2, two) << "q_len " << q_len;
        EXPECT_EQ(fa == catalog::Family::kMlaDecodeNarrow, few && dt[0] == DType::kBF16)
            << "q_len " << q_len;
        EXPECT_EQ(fa == catalog::Family::kMlaDecodeWsBalanced,
                  pr.heads * q_len >= cuda::tuning::kMlaBalancedAutoRows && dt[0] == DType::kBF16)
            << "q_len " << q_len;
        if (two) {
          EXPECT_EQ(ap.splits().max_splits,
                    plan(cuda::MlaDecodeKernel::kWgmmaNarrow2).splits().max_splits);
        }
      }
    }
    // from kMlaBalancedAutoRows rows: the balanced wgmma kernel over a bf16 cache, the wgmma
    // one over fp8
    static_assert(cuda::tuning::kMlaBalancedAutoRows <= 32, "the heads below take it");
    for (const std::int64_t heads : {32, 64, 128}) {
      pr.q_len = 1;
      pr.heads = heads;
      const catalog::Family fw = family_of(plan(cuda::MlaDecodeKernel::kAuto));
      if (fw != catalog::Family::kMlaDecode)
        EXPECT_EQ(fw, dt[0] == DType::kBF16 ? catalog::Family::kMlaDecodeWsBalanced
                                            : catalog::Family::kMlaDecodeWs)
            << heads << " heads";
      pr.heads = small_problem().heads;
    }
    for (const cuda::MlaDecodeKernel k :
         {cuda::MlaDecodeKernel::kWgmmaNarrow, cuda::MlaDecodeKernel::kWgmmaNarrow2}) {
      for (const std::int64_t q_len : {3, 4}) {
        pr.q_len = q_len;
        expect_named_error([&] { (void)plan(k); }, Status::kNotSupported, "kernel", kPlanFn);
      }
      pr.q_len = 1;
      pr.heads = 48;
      expect_named_error([&] { (void)plan(k); }, Status::kNotSupported, "kernel", kPlanFn);
      pr.heads = small_problem().heads;
    }
  }
  expect_named_error(
      [&] {
        (void)cuda::plan_mla_decode(small_problem(), lens.data(), DecodeOptions{}, 4,
                                    static_cast<cuda::MlaDecodeKernel>(7));
      },
      Status::kInvalidArgument, "kernel", kPlanFn);
}

TEST(MlaCudaErrors, TheRunNamesEachArgument) {
  ATTNSTATE_REQUIRE_GPU();
  MlaConfig cfg;
  cfg.seq_lens = {40, 70};
  const MlaHost h = make_mla_host(cfg, 41);
  const DeviceMla d(h);
  DecodeOptions o = fixed_count(2);
  const cuda::MlaDecodePlan plan =
      cuda::plan_mla_decode(problem_of(h), h.seq_lens.data(), o, attnstate_test::device_sms());
  DeviceBuffer<unsigned char> ws(plan.workspace_bytes());
  cuda::init_mla_decode_workspace(plan, ws.get(), ws.bytes());
  DeviceState out(h.tokens(), cfg.heads, 512, DType::kF32, LseBase::kNatural);
  const ConstTensorView qn = d.q_nope(h), qp = d.q_pe(h);
  const MlaKvCache kv = d.kv(h);
  auto run = [&](const ConstTensorView& a, const ConstTensorView& b, const MlaKvCache& c,
                 StateView s, void* w, std::size_t wb, AttentionSinks sk = {}) {
    return [=, &plan] { cuda::run_mla_decode(plan, a, b, c, sk, s, w, wb); };
  };
  expect_named_error(run(qn, qp, kv, out.view, ws.get(), ws.bytes() - 1),
                     Status::kWorkspaceTooSmall, "workspace_bytes", kRunFn);
  expect_named_error(run(qn, qp, kv, out.view, nullptr, ws.bytes()), Status::kInvalidArgument,
                     "workspace", kRunFn);
  const cuda::MlaDecodePlan none;
  expect_named_error(
      [&] { cuda::run_mla_decode(none, qn, qp, kv, out.view, ws.get(), ws.bytes()); },
      Status::kInvalidArgument, "plan", kRunFn);
  MlaKvCache bad = kv;
  bad.ckv_dtype = DType::kE4M3;
  bad.ckv_scale = KvScale::per_tensor(1.f);
  expect_named_error(run(qn, qp, bad, out.view, ws.get(), ws.bytes()), Status::kInvalidArgument,
                     "kv.ckv_dtype", kRunFn);
  bad = kv;
  bad.ckv = static_cast<const unsigned char*>(kv.ckv) + 2;  // aligned to its element only
  expect_named_error(run(qn, qp, bad, out.view, ws.get(), ws.bytes()), Status::kInvalidArgument,
                     "kv.ckv", kRunFn);
  bad = kv;
  bad.ckv_token_stride = 516;  // rows of 1032 bytes: not whole 16-byte chunks
  bad.ckv_page_stride = 516 * cfg.page_size;
  bad.num_pages = h.num_pages / 2;
  expect_named_error(run(qn, qp, bad, out.view, ws.get(), ws.bytes()), Status::kNotSupported,
                     "kv.ckv_token_stride", kRunFn);
  bad = kv;
  bad.batch = 3;
  expect_named_error(run(qn, qp, bad, out.view, ws.get(), ws.bytes()), Status::kInvalidArgument,
                     "q_nope.shape[0]", kRunFn);
  ConstTensorView q_short = qn;
  q_short.shape[1] = 2;
  ConstTensorView qp_short = qp;
  qp_short.shape[1] = 2;
  DeviceState out2(h.batch * 2, cfg.heads, 512, DType::kF32, LseBase::kNatural);
  expect_named_error(run(q_short, qp_short, kv, out2.view, ws.get(), ws.bytes()),
                     Status::kInvalidArgument, "q_nope.shape[1]", kRunFn);
  ConstTensorView q_odd = qn;
  q_odd.data = static_cast<const unsigned char*>(qn.data) + 2;
  q_odd.shape[3] = 512;
  expect_named_error(run(q_odd, qp, kv, out.view, ws.get(), ws.bytes()), Status::kInvalidArgument,
                     "q_nope.data", kRunFn);
  StateView overlap = out.view;
  overlap.o = const_cast<void*>(qn.data);
  expect_named_error(run(qn, qp, kv, overlap, ws.get(), ws.bytes()), Status::kInvalidArgument,
                     "out.o", kRunFn);
  std::vector<float> host_sinks(static_cast<std::size_t>(cfg.heads), 0.f);
  AttentionSinks hs;
  hs.logits = host_sinks.data();
  expect_named_error(run(qn, qp, kv, out.view, ws.get(), ws.bytes(), hs), Status::kInvalidArgument,
                     "sinks.logits", kRunFn);
  MlaKvCache host = kv;
  host.space = MemorySpace::kHost;
  expect_named_error(run(qn, qp, host, out.view, ws.get(), ws.bytes()), Status::kInvalidArgument,
                     "kv.space", kRunFn);
  if (device_kernels(cfg.heads * cfg.q_len).size() ==
      1) {  // a device without the wgmma kernels: their plans are refused
    for (const cuda::MlaDecodeKernel k :
         {cuda::MlaDecodeKernel::kWgmma, cuda::MlaDecodeKernel::kWgmmaBalanced}) {
      const cuda::MlaDecodePlan wg = cuda::plan_mla_decode(problem_of(h), h.seq_lens.data(), o,
                                                           attnstate_test::device_sms(), k);
      expect_named_error(
          [&] { cuda::run_mla_decode(wg, qn, qp, kv, out.view, ws.get(), ws.bytes()); },
          Status::kNotSupported, "plan", kRunFn);
    }
  }
}

}  // namespace
