/// @file test_cuda_merge_graph.cpp
/// @brief The CUDA merges inside CUDA graphs (captured on a stream, replayed with new inputs,
///        ragged replayed for fewer tokens), the caller's stream being honoured, and bitwise
///        repeatability.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "attnstate/cpu/merge.hpp"
#include "attnstate/cuda/merge.hpp"
#include "merge_test_support.hpp"

namespace attnstate_test {
namespace {

namespace cpu = attnstate::cpu;
namespace gpu = attnstate::cuda;

/// A stream, and a graph captured on it.
class Captured {
 public:
  explicit Captured(const std::function<void(cudaStream_t)>& body) {
    ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      body(stream_);
    } catch (...) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(stream_, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
    ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~Captured() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  /// Number of kernel nodes in the graph.
  std::size_t nodes() const {
    std::size_t n = 0;
    ATTNSTATE_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &n));
    return n;
  }
  /// Replays the graph after all earlier work (uploads and poisoning run on the legacy default
  /// stream, which does not order against a non-blocking stream) and waits for it.
  void replay() {
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
    ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

TEST(CudaMergeGraph, EveryOpCapturesAndReplaysWithNewInputs) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::int64_t T = 33, H = 5, D = 128, S = 6;
  TestState a(T, H, D, DType::kBF16, LseBase::kBase2);
  TestState b(T, H, D, DType::kF16, LseBase::kNatural);
  TestState acc(T, H, D, DType::kF32, LseBase::kNatural);
  TestStack stack(StackOrder::kTokensMajor, T, S, H, D, DType::kBF16, LseBase::kBase2);
  std::vector<std::uint8_t> mask(T);
  for (auto& m : mask) m = rng.chance(0.5);
  DeviceBuffer<std::uint8_t> dmask(mask);
  TestState pair_out(T, H, D, DType::kBF16, LseBase::kNatural);
  TestState stack_out(T, H, D, DType::kF32, LseBase::kNatural);
  TestState rebased(T, H, D, DType::kF16, LseBase::kNatural);
  Captured graph([&](cudaStream_t s) {
    gpu::merge_state(a.dev_view(), b.dev_view(), pair_out.dev_view(), s);
    gpu::merge_state_inplace(acc.dev_view(), b.dev_view(), dmask.get(), s);
    gpu::merge_states(stack.dev_view(), stack_out.dev_view(), s);
    gpu::rebase(a.dev_view(), rebased.dev_view(), s);
  });
  EXPECT_EQ(graph.nodes(), 4u);
  for (int replay = 0; replay < 2; ++replay) {
    a.fill_random(rng, -5.f, 5.f, 0.1);
    b.fill_random(rng, -5.f, 5.f, 0.1);
    acc.fill_random(rng, -5.f, 5.f, 0.1);
    stack.fill_random(rng, -5.f, 5.f, 0.1);
    TestState acc_want = acc.clone();
    pair_out.poison_device();
    stack_out.poison_device();
    rebased.poison_device();
    graph.replay();
    TestState pw(T, H, D, DType::kBF16, LseBase::kNatural),
        sw(T, H, D, DType::kF32, LseBase::kNatural), rw(T, H, D, DType::kF16, LseBase::kNatural);
    cpu::merge_state(a.host_view(), b.host_view(), pw.host_view());
    cpu::merge_state_inplace(acc_want.host_view(), b.host_view(), mask.data());
    cpu::merge_states(stack.host_view(), sw.host_view());
    cpu::rebase(a.host_view(), rw.host_view());
    pair_out.download();
    acc.download();
    stack_out.download();
    rebased.download();
    EXPECT_TRUE(states_close(pair_out, pw)) << "replay " << replay;
    EXPECT_TRUE(states_close(acc, acc_want)) << "replay " << replay;
    EXPECT_TRUE(states_close(stack_out, sw)) << "replay " << replay;
    EXPECT_TRUE(states_close(rebased, rw)) << "replay " << replay;
  }
}

TEST(CudaMergeGraph, RaggedGraphForMaxTokensReplaysForFewer) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::int64_t max_tokens = 40, H = 8, D = 256, max_rows = 400;
  TestState rows(max_rows, H, D, DType::kBF16, LseBase::kNatural);
  DeviceBuffer<std::int32_t> dindptr(max_tokens + 1);
  TestState out(max_tokens, H, D, DType::kBF16, LseBase::kBase2);
  Captured graph([&](cudaStream_t s) {
    gpu::merge_states_ragged(rows.dev_view(), dindptr.get(), out.dev_view(), s);
  });
  for (std::int64_t live : {max_tokens, std::int64_t{17}, std::int64_t{1}, std::int64_t{0}}) {
    SCOPED_TRACE("live tokens " + std::to_string(live));
    // The first `live` tokens own 0..19 rows each; the rest repeat the end offset (no rows).
    std::vector<std::int32_t> indptr(max_tokens + 1, 0);
    for (std::int64_t t = 0; t < max_tokens; ++t)
      indptr[t + 1] = indptr[t] + (t < live ? static_cast<std::int32_t>(rng.integer(0, 9)) : 0);
    dindptr.upload(indptr);
    rows.fill_random(rng, -7.f, 7.f, 0.1);
    out.poison_device();
    graph.replay();
    out.download();
    TestState want(max_tokens, H, D, DType::kBF16, LseBase::kBase2);
    cpu::merge_states_ragged(rows.host_view(), indptr.data(), want.host_view());
    EXPECT_TRUE(states_close(out, want));
  }
}

TEST(CudaMergeGraph, ResultsAreBitwiseRepeatable) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::int64_t T = 300, H = 32, D = 128, S = 29;
  TestStack stack(StackOrder::kStatesMajor, T, S, H, D, DType::kBF16, LseBase::kNatural);
  stack.fill_random(rng, -20.f, 20.f, 0.1);
  TestState first(T, H, D, DType::kF32, LseBase::kBase2);
  TestState second(T, H, D, DType::kF32, LseBase::kBase2);
  first.poison_device();
  second.poison_device();
  gpu::merge_states(stack.dev_view(), first.dev_view());
  gpu::merge_states(stack.dev_view(), second.dev_view());
  TestState a(T, H, D, DType::kF16, LseBase::kNatural), b(T, H, D, DType::kBF16, LseBase::kBase2);
  a.fill_random(rng, -3.f, 3.f, 0.1);
  b.fill_random(rng, -3.f, 3.f, 0.1);
  TestState p1(T, H, D, DType::kF16, LseBase::kNatural),
      p2(T, H, D, DType::kF16, LseBase::kNatural);
  p1.poison_device();
  p2.poison_device();
  gpu::merge_state(a.dev_view(), b.dev_view(), p1.dev_view());
  gpu::merge_state(a.dev_view(), b.dev_view(), p2.dev_view());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  first.download();
  second.download();
  p1.download();
  p2.download();
  EXPECT_TRUE(rows_bitwise_equal(first, second));
  EXPECT_TRUE(rows_bitwise_equal(p1, p2));
  // The first run of each against the CPU: two runs that leave the same row unwritten (NaN)
  // would otherwise be bitwise equal.
  TestState want_stack(T, H, D, DType::kF32, LseBase::kBase2);
  cpu::merge_states(stack.host_view(), want_stack.host_view());
  EXPECT_TRUE(states_close(first, want_stack));
  TestState want_pair(T, H, D, DType::kF16, LseBase::kNatural);
  cpu::merge_state(a.host_view(), b.host_view(), want_pair.host_view());
  EXPECT_TRUE(states_close(p1, want_pair));
}

TEST(CudaMergeGraph, LaunchesOnTheCallersStream) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  // A merge on a stream ordered after a copy into its input sees the copied data.
  cudaStream_t s = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::int64_t T = 64, H = 4, D = 64;
  TestState a(T, H, D, DType::kF32, LseBase::kNatural), b(T, H, D, DType::kF32, LseBase::kNatural);
  a.fill_random(rng);
  b.fill_random(rng);
  TestState fresh(T, H, D, DType::kF32, LseBase::kNatural);
  fresh.fill_random(rng);  // host data of `fresh` becomes `a` through a copy on the stream
  TestState out(T, H, D, DType::kF32, LseBase::kNatural);
  out.poison_device();
  const StateView av = a.dev_view(), fv = fresh.dev_view();
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());  // uploads and poisoning done before `s` starts
  ATTNSTATE_CUDA_CHECK(cudaMemcpyAsync(av.o, fv.o, T * H * D * 4, cudaMemcpyDeviceToDevice, s));
  ATTNSTATE_CUDA_CHECK(cudaMemcpyAsync(av.lse, fv.lse, T * H * 4, cudaMemcpyDeviceToDevice, s));
  gpu::merge_state(a.dev_view(), b.dev_view(), out.dev_view(), s);
  ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(s));
  ATTNSTATE_CUDA_CHECK(cudaStreamDestroy(s));
  out.download();
  TestState want(T, H, D, DType::kF32, LseBase::kNatural);
  cpu::merge_state(fresh.host_view(), b.host_view(), want.host_view());
  EXPECT_TRUE(states_close(out, want));
}

}  // namespace
}  // namespace attnstate_test
