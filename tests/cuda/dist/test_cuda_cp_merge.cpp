// dist::cp_merge over NCCL, one process driving every visible GPU (one thread a rank): world
// size 1 on one GPU, and 2..8 where the machine has them. The all-to-all output is compared
// bitwise with cuda::merge_states of the ranks' states on one GPU, the all-gather one with the
// CPU simulation (cpu::cp_merge_simulated) to rounding; outputs poisoned first, inputs random
// with empty rows holding NaN garbage. Skips cleanly without a GPU.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attnstate/cpu/context_parallel.hpp"
#include "attnstate/cuda/merge.hpp"
#include "attnstate/dist/cp_merge.hpp"
#include "cp_shape.hpp"
#include "cuda_test_utils.hpp"

namespace {

using attnstate::ConstStateStackView;
using attnstate::ConstStateView;
using attnstate::CpAlgorithm;
using attnstate::CpMergePlan;
using attnstate::CpMergeShape;
using attnstate::CpOutput;
using attnstate::DType;
using attnstate::LseBase;
using attnstate::MemorySpace;
using attnstate::StateView;
using attnstate_test::DeviceBuffer;

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// Every rank's communicator, one GPU each (ncclCommInitAll over devices 0..n-1).
struct Comms {
  std::vector<ncclComm_t> comms;
  explicit Comms(int n) : comms(static_cast<std::size_t>(n)) {
    std::vector<int> devs(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) devs[static_cast<std::size_t>(i)] = i;
    EXPECT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess);
  }
  ~Comms() {
    for (ncclComm_t c : comms)
      if (c) ncclCommDestroy(c);
  }
};

// Host states of every rank: o bf16/f16/f32 [tokens, heads, dim] as floats rounded to the dtype,
// LSEs natural; a third of the rows empty with NaN in o.
struct HostRank {
  std::vector<std::uint8_t> o;
  std::vector<float> lse;
};

void store(std::uint8_t* p, DType dt, std::size_t i, float x) {
  if (dt == DType::kF32) {
    std::memcpy(p + 4 * i, &x, 4);
    return;
  }
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  std::uint16_t h;
  if (dt == DType::kBF16) {
    h = static_cast<std::uint16_t>(u >> 16);  // truncation: any bf16 value will do
  } else {
    const __half v = __float2half(x);
    std::memcpy(&h, &v, 2);
  }
  std::memcpy(p + 2 * i, &h, 2);
}

HostRank random_rank(std::mt19937& rng, std::int64_t tokens, std::int64_t heads, std::int64_t dim,
                     DType dt) {
  HostRank r;
  r.o.resize(static_cast<std::size_t>(tokens * heads * dim) * attnstate::size_of(dt));
  r.lse.resize(static_cast<std::size_t>(tokens * heads));
  std::uniform_real_distribution<float> uo(-2.f, 2.f), ul(-6.f, 6.f);
  std::uniform_int_distribution<int> third(0, 2);
  for (std::int64_t row = 0; row < tokens * heads; ++row) {
    const bool empty = third(rng) == 0;
    r.lse[static_cast<std::size_t>(row)] = empty ? -INFINITY : ul(rng);
    for (std::int64_t d = 0; d < dim; ++d)
      store(r.o.data(), dt, static_cast<std::size_t>(row * dim + d), empty ? NAN : uo(rng));
  }
  return r;
}

struct Outcome {
  std::vector<std::vector<std::uint8_t>> o;
  std::vector<std::vector<float>> lse;
};

// Runs cp_merge on every rank (one thread per GPU) and returns each rank's output.
Outcome run_ranks(const CpMergeShape& shape, const std::vector<HostRank>& in, LseBase out_base,
                  const std::vector<float>* sinks) {
  const int n = shape.world_size;
  Comms comms(n);
  Outcome res;
  res.o.resize(static_cast<std::size_t>(n));
  res.lse.resize(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ATTNSTATE_CUDA_CHECK(cudaSetDevice(r));
        CpMergeShape s = shape;
        s.rank = r;
        const CpMergePlan plan = attnstate::plan_cp_merge(s);
        cudaStream_t stream;
        ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        attnstate::dist::check_cp_plans(plan, comms.comms[static_cast<std::size_t>(r)], stream);
        const HostRank& h = in[static_cast<std::size_t>(r)];
        DeviceBuffer<std::uint8_t> o(h.o);
        DeviceBuffer<float> lse(h.lse);
        const std::int64_t oh = plan.out_heads();
        DeviceBuffer<std::uint8_t> out_o(static_cast<std::size_t>(s.tokens * oh * s.head_dim) *
                                         attnstate::size_of(s.out_dtype));
        DeviceBuffer<float> out_lse(static_cast<std::size_t>(s.tokens * oh));
        out_o.poison();
        out_lse.poison();
        DeviceBuffer<std::uint8_t> ws(static_cast<std::size_t>(plan.workspace_bytes));
        ws.poison();
        DeviceBuffer<float> sink_buf;
        attnstate::AttentionSinks sk;
        if (sinks) {
          sink_buf = DeviceBuffer<float>(*sinks);
          sk.logits = sink_buf.get();
        }
        const ConstStateView local =
            attnstate::make_const_state_view(o.get(), s.dtype, lse.get(), s.tokens, s.heads,
                                             s.head_dim, LseBase::kNatural, MemorySpace::kDevice);
        const StateView out =
            attnstate::make_state_view(out_o.get(), s.out_dtype, out_lse.get(), s.tokens, oh,
                                       s.head_dim, out_base, MemorySpace::kDevice);
        attnstate::dist::cp_merge(plan, local, out, comms.comms[static_cast<std::size_t>(r)],
                                  ws.get(), ws.bytes(), stream, sk);
        ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
        ATTNSTATE_CUDA_CHECK(cudaStreamDestroy(stream));
        res.o[static_cast<std::size_t>(r)] = out_o.download();
        res.lse[static_cast<std::size_t>(r)] = out_lse.download();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  return res;
}

// cuda::merge_states of the ranks' states (stacked [n, tokens, heads, dim]) on GPU 0, heads
// [h0, h0 + h), into out_dtype / out_base.
Outcome one_gpu_merge(const CpMergeShape& s, const std::vector<HostRank>& in, LseBase out_base,
                      const CpMergePlan& plan) {
  ATTNSTATE_CUDA_CHECK(cudaSetDevice(0));
  const int n = s.world_size;
  std::vector<std::uint8_t> o;
  std::vector<float> lse;
  for (const HostRank& h : in) {
    o.insert(o.end(), h.o.begin(), h.o.end());
    lse.insert(lse.end(), h.lse.begin(), h.lse.end());
  }
  DeviceBuffer<std::uint8_t> d_o(o);
  DeviceBuffer<float> d_lse(lse);
  // Each owner's head slice is merged by its own merge_states call, as the owning rank does (a
  // merge over a different head count may take another kernel).
  const std::size_t es = attnstate::size_of(s.dtype), oes = attnstate::size_of(s.out_dtype);
  DeviceBuffer<std::uint8_t> all_o(static_cast<std::size_t>(s.tokens * s.heads * s.head_dim) * oes);
  DeviceBuffer<float> all_lse(static_cast<std::size_t>(s.tokens * s.heads));
  all_o.poison();
  all_lse.poison();
  for (int q = 0; q < n; ++q) {
    const std::int64_t h0 = plan.head_begin(q), h = plan.heads_of(q);
    ConstStateStackView stack = attnstate::make_state_stack(
        d_o.get(), s.dtype, d_lse.get(), attnstate::StackOrder::kStatesMajor, s.tokens, n, s.heads,
        s.head_dim, LseBase::kNatural, MemorySpace::kDevice);
    stack.o =
        static_cast<const std::uint8_t*>(stack.o) + h0 * s.head_dim * static_cast<std::int64_t>(es);
    stack.lse += h0;
    stack.heads = h;
    StateView out = attnstate::make_state_view(all_o.get(), s.out_dtype, all_lse.get(), s.tokens,
                                               s.heads, s.head_dim, out_base, MemorySpace::kDevice);
    out.o = static_cast<std::uint8_t*>(out.o) + h0 * s.head_dim * static_cast<std::int64_t>(oes);
    out.lse += h0;
    out.heads = h;
    attnstate::cuda::merge_states(stack, out);
  }
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<std::uint8_t> ho = all_o.download();
  const std::vector<float> hl = all_lse.download();
  Outcome res;
  for (int r = 0; r < n; ++r) {
    if (s.output == CpOutput::kReplicated) {
      res.o.push_back(ho);
      res.lse.push_back(hl);
      continue;
    }
    // rank r's heads of every token, contiguous [tokens, heads_of(r), head_dim]
    const std::int64_t h0 = plan.head_begin(r), h = plan.heads_of(r);
    std::vector<std::uint8_t> o_r;
    std::vector<float> l_r;
    for (std::int64_t t = 0; t < s.tokens; ++t) {
      const std::size_t row = static_cast<std::size_t>(t * s.heads + h0);
      o_r.insert(o_r.end(), ho.begin() + static_cast<std::ptrdiff_t>(row * s.head_dim * oes),
                 ho.begin() + static_cast<std::ptrdiff_t>((row + h) * s.head_dim * oes));
      l_r.insert(l_r.end(), hl.begin() + static_cast<std::ptrdiff_t>(row),
                 hl.begin() + static_cast<std::ptrdiff_t>(row + h));
    }
    res.o.push_back(o_r);
    res.lse.push_back(l_r);
  }
  return res;
}

CpMergeShape shape_of(int n, std::int64_t tokens, std::int64_t heads, std::int64_t dim, DType dt,
                      DType odt, CpAlgorithm a, CpOutput o) {
  return attnstate_test::cp_shape(n, 0, tokens, heads, dim, dt, odt, LseBase::kNatural, a, o);
}

std::vector<int> world_sizes() {
  std::vector<int> ns;
  for (int n : {1, 2, 4, 8})
    if (n <= device_count()) ns.push_back(n);
  return ns;
}

TEST(DistCpMerge, AllToAllIsBitwiseMergeStatesOnOneGpu) {
  ATTNSTATE_REQUIRE_GPU();
  std::mt19937 rng(1);
  for (int n : world_sizes())
    for (CpOutput output : {CpOutput::kHeadSharded, CpOutput::kReplicated})
      for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
        // uneven heads where n > 1: 32 + 3 heads over n ranks
        const CpMergeShape s = shape_of(n, 5, 32 + (n > 1 ? 3 : 0), 128, dt, DType::kBF16,
                                        CpAlgorithm::kAllToAll, output);
        SCOPED_TRACE(attnstate::to_string(attnstate::plan_cp_merge(s)));
        std::vector<HostRank> in;
        for (int r = 0; r < n; ++r)
          in.push_back(random_rank(rng, s.tokens, s.heads, s.head_dim, dt));
        // wire and output in the natural base: no conversion, so bitwise
        const Outcome got = run_ranks(s, in, LseBase::kNatural, nullptr);
        const Outcome want = one_gpu_merge(s, in, LseBase::kNatural, attnstate::plan_cp_merge(s));
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(got.o[static_cast<std::size_t>(r)], want.o[static_cast<std::size_t>(r)])
              << "rank " << r;
          EXPECT_EQ(0, std::memcmp(got.lse[static_cast<std::size_t>(r)].data(),
                                   want.lse[static_cast<std::size_t>(r)].data(),
                                   want.lse[static_cast<std::size_t>(r)].size() * 4))
              << "rank " << r;
        }
      }
}

TEST(DistCpMerge, AllGatherLseMatchesTheCpuSimulationWithSinks) {
  ATTNSTATE_REQUIRE_GPU();
  std::mt19937 rng(2);
  for (int n : world_sizes())
    for (CpOutput output : {CpOutput::kHeadSharded, CpOutput::kReplicated}) {
      const CpMergeShape s =
          shape_of(n, 3, 8 * n, 64, DType::kF32, DType::kF32, CpAlgorithm::kAllGatherLse, output);
      std::vector<HostRank> in;
      for (int r = 0; r < n; ++r)
        in.push_back(random_rank(rng, s.tokens, s.heads, s.head_dim, DType::kF32));
      std::vector<float> sinks(static_cast<std::size_t>(s.heads));
      for (float& x : sinks) x = std::uniform_real_distribution<float>(-2.f, 3.f)(rng);
      const Outcome got = run_ranks(s, in, LseBase::kBase2, &sinks);
      // the CPU simulation of the same plans
      std::vector<attnstate::CpMergePlan> plans;
      std::vector<ConstStateView> locals;
      std::vector<StateView> outs;
      std::vector<std::vector<float>> want_o(static_cast<std::size_t>(n)),
          want_lse(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        CpMergeShape rs = s;
        rs.rank = r;
        plans.push_back(attnstate::plan_cp_merge(rs));
        const std::int64_t oh = plans.back().out_heads();
        want_o[static_cast<std::size_t>(r)].assign(static_cast<std::size_t>(s.tokens * oh * 64),
                                                   0.f);
        want_lse[static_cast<std::size_t>(r)].assign(static_cast<std::size_t>(s.tokens * oh), 0.f);
        const HostRank& h = in[static_cast<std::size_t>(r)];
        locals.push_back(attnstate::make_const_state_view(
            h.o.data(), DType::kF32, h.lse.data(), s.tokens, s.heads, 64, LseBase::kNatural));
        outs.push_back(attnstate::make_state_view(
            want_o[static_cast<std::size_t>(r)].data(), DType::kF32,
            want_lse[static_cast<std::size_t>(r)].data(), s.tokens, oh, 64, LseBase::kBase2));
      }
      attnstate::AttentionSinks sk;
      sk.logits = sinks.data();
      attnstate::cpu::cp_merge_simulated(plans, locals, outs, sk);
      for (int r = 0; r < n; ++r) {
        std::vector<float> go(got.o[static_cast<std::size_t>(r)].size() / 4);
        std::memcpy(go.data(), got.o[static_cast<std::size_t>(r)].data(), go.size() * 4);
        ASSERT_EQ(go.size(), want_o[static_cast<std::size_t>(r)].size());
        for (std::size_t i = 0; i < go.size(); ++i)
          ASSERT_NEAR(go[i], want_o[static_cast<std::size_t>(r)][i], 1e-5)
              << "rank " << r << " o[" << i << "]";
        for (std::size_t i = 0; i < want_lse[static_cast<std::size_t>(r)].size(); ++i)
          ASSERT_NEAR(got.lse[static_cast<std::size_t>(r)][i],
                      want_lse[static_cast<std::size_t>(r)][i], 1e-5)
              << "rank " << r << " lse[" << i << "]";
      }
    }
}

TEST(DistCpMerge, BadArgumentsAreNamed) {
  ATTNSTATE_REQUIRE_GPU();
  Comms comms(1);
  const CpMergeShape s = shape_of(1, 2, 4, 64, DType::kBF16, DType::kBF16, CpAlgorithm::kAllToAll,
                                  CpOutput::kHeadSharded);
  const CpMergePlan plan = attnstate::plan_cp_merge(s);
  DeviceBuffer<std::uint16_t> o(2 * 4 * 64), out_o(2 * 4 * 64);
  DeviceBuffer<float> lse(8), out_lse(8);
  DeviceBuffer<std::uint8_t> ws(static_cast<std::size_t>(plan.workspace_bytes));
  const ConstStateView local = attnstate::make_const_state_view(
      o.get(), DType::kBF16, lse.get(), 2, 4, 64, LseBase::kNatural, MemorySpace::kDevice);
  const StateView out = attnstate::make_state_view(out_o.get(), DType::kBF16, out_lse.get(), 2, 4,
                                                   64, LseBase::kNatural, MemorySpace::kDevice);
  const auto call = [&](ncclComm_t c, std::size_t bytes, ConstStateView l) {
    attnstate::dist::cp_merge(plan, l, out, c, ws.get(), bytes, nullptr);
  };
  using attnstate::Status;
  attnstate_test::expect_named_error([&] { call(nullptr, ws.bytes(), local); },
                                     Status::kInvalidArgument, "comm", "attnstate::dist::cp_merge");
  attnstate_test::expect_named_error([&] { call(comms.comms[0], ws.bytes() - 1, local); },
                                     Status::kWorkspaceTooSmall, "workspace_bytes");
  ConstStateView host = local;
  host.space = MemorySpace::kHost;
  attnstate_test::expect_named_error([&] { call(comms.comms[0], ws.bytes(), host); },
                                     Status::kInvalidArgument, "local.space");
  CpMergeShape two = s;
  two.world_size = 2;
  attnstate_test::expect_named_error(
      [&] {
        attnstate::dist::cp_merge(
            attnstate::plan_cp_merge(two), local,
            attnstate::make_state_view(out_o.get(), DType::kBF16, out_lse.get(), 2, 2, 64,
                                       LseBase::kNatural, MemorySpace::kDevice),
            comms.comms[0], ws.get(), ws.bytes(), nullptr);
      },
      Status::kInvalidArgument, "comm");
  std::vector<float> host_sinks(4, 0.f);  // sinks in host memory: the kernels read them
  attnstate_test::expect_named_error(
      [&] {
        attnstate::dist::cp_merge(plan, local, out, comms.comms[0], ws.get(), ws.bytes(), nullptr,
                                  attnstate::AttentionSinks{host_sinks.data()});
      },
      Status::kInvalidArgument, "sinks.logits");
}

// A captured cp_merge replays with the states its buffers hold at replay.
TEST(DistCpMerge, AGraphReplaysTheMerge) {
  ATTNSTATE_REQUIRE_GPU();
  std::mt19937 rng(4);
  Comms comms(1);
  const CpMergeShape s = shape_of(1, 4, 8, 128, DType::kBF16, DType::kBF16, CpAlgorithm::kAllToAll,
                                  CpOutput::kHeadSharded);
  const CpMergePlan plan = attnstate::plan_cp_merge(s);
  const HostRank a = random_rank(rng, 4, 8, 128, DType::kBF16);
  const HostRank b = random_rank(rng, 4, 8, 128, DType::kBF16);
  DeviceBuffer<std::uint8_t> o(a.o), out_o(a.o.size());
  DeviceBuffer<float> lse(a.lse), out_lse(a.lse.size());
  DeviceBuffer<std::uint8_t> ws(static_cast<std::size_t>(plan.workspace_bytes));
  const ConstStateView local = attnstate::make_const_state_view(
      o.get(), DType::kBF16, lse.get(), 4, 8, 128, LseBase::kNatural, MemorySpace::kDevice);
  const StateView out = attnstate::make_state_view(out_o.get(), DType::kBF16, out_lse.get(), 4, 8,
                                                   128, LseBase::kNatural, MemorySpace::kDevice);
  cudaStream_t stream;
  ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  attnstate::dist::cp_merge(plan, local, out, comms.comms[0], ws.get(), ws.bytes(), stream);
  ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  o.upload(b.o);
  lse.upload(b.lse);
  out_o.poison();
  out_lse.poison();
  ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
  // one rank: the merge of one state is that state (its o where non-empty, 0 where empty)
  const Outcome want = one_gpu_merge(s, {b}, LseBase::kNatural, plan);
  EXPECT_EQ(out_o.download(), want.o[0]);
  EXPECT_EQ(0, std::memcmp(out_lse.download().data(), want.lse[0].data(), want.lse[0].size() * 4));
  ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ATTNSTATE_CUDA_CHECK(cudaGraphDestroy(graph));
  ATTNSTATE_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
