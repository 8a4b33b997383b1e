/// @file test_cuda_merge_fast_path.cpp
/// @brief The fast path of the CUDA `merge_states` (large stacks with 16-byte aligned `o`):
///        which stacks take it, bitwise agreement with the general kernel (the same stack with
///        `o` one element off alignment) for state counts that do and do not fill a stage
///        (1, 2, 3, 9, 17, 33, 64) and token counts that do not fill the pipeline, agreement
///        with the CPU reference (empty states with NaN `o`, mixed bases, every dtype pair), the
///        fallback of unaligned and odd stacks, and graph capture.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "attnstate/cpu/merge.hpp"
#include "attnstate/cuda/merge.hpp"
#include "compiled_dims.hpp"
#include "merge_test_support.hpp"

namespace attnstate_test {
namespace {

namespace cpu = attnstate::cpu;
namespace gpu = attnstate::cuda;
using attnstate::cuda::detail::merge_states_fast_path;

void sync() { ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize()); }

/// The shape and dtypes of a stack to merge.
struct StackShape {
  StackOrder order;
  std::int64_t tokens, states, heads, dim;
  DType din, dout;
};

std::string describe_shape(const StackShape& s) {
  return std::string(s.order == StackOrder::kTokensMajor ? "tokens-major" : "states-major") +
         " T " + std::to_string(s.tokens) + " S " + std::to_string(s.states) + " H " +
         std::to_string(s.heads) + " D " + std::to_string(s.dim) + " " + describe({s.din, s.dout});
}

/// `merge_states` of `view` on the GPU into a fresh state, poisoned (NaN) first.
TestState merge_on_gpu(const ConstStateStackView& view, DType dout, LseBase base) {
  TestState got(view.tokens, view.heads, view.head_dim, dout, base);
  got.poison_device();
  gpu::merge_states(view, got.dev_view());
  sync();
  got.download();
  return got;
}

/// The CPU reference of `view` (a host view).
TestState merge_on_cpu(const ConstStateStackView& view, DType dout, LseBase base) {
  TestState want(view.tokens, view.heads, view.head_dim, dout, base);
  cpu::merge_states(view, want.host_view());
  return want;
}

/// The fewest tokens (up to `limit`) for which a dense stack of `s` takes the fast path, or -1.
/// Blocks then have at most one row or tile each, so no pipeline of stages is ever full.
std::int64_t fewest_fast_tokens(const StackShape& s, std::int64_t limit) {
  // Only shapes, strides and alignment matter to the choice: views of no memory suffice.
  alignas(16) static float stand_in[4] = {0.f, 0.f, 0.f, 0.f};
  for (std::int64_t t = 1; t <= limit; ++t) {
    const ConstStateStackView v =
        attnstate::make_state_stack(stand_in, s.din, stand_in, s.order, t, s.states, s.heads, s.dim,
                                    LseBase::kNatural, MemorySpace::kDevice);
    const StateView out = attnstate::make_state_view(stand_in, s.dout, stand_in, t, s.heads, s.dim,
                                                     LseBase::kNatural, MemorySpace::kDevice);
    if (merge_states_fast_path(v, out)) return t;
  }
  return -1;
}

/// Skips the test when the device has no fast path (it needs sm_80 or newer).
#define REQUIRE_FAST_PATH()                                                                  \
  do {                                                                                       \
    ATTNSTATE_REQUIRE_GPU();                                                                 \
    if (fewest_fast_tokens(                                                                  \
            StackShape{StackOrder::kTokensMajor, 0, 8, 32, 128, DType::kBF16, DType::kBF16}, \
            4096) < 0)                                                                       \
      GTEST_SKIP() << "no fast merge_states path on this device";                            \
  } while (0)

TEST(CudaMergeFastPath, LargeAlignedStacksTakeIt) {
  ATTNSTATE_REQUIRE_GPU();
  int dev = 0, major = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 9) GTEST_SKIP() << "the fast path is measured and required on sm_90 only";
  for (StackOrder order : {StackOrder::kTokensMajor, StackOrder::kStatesMajor}) {
    TestStack dense(order, 512, 8, 32, 128, DType::kBF16, LseBase::kNatural);
    TestStack shifted(order, 512, 8, 32, 128, DType::kBF16, LseBase::kNatural, 0, 1);
    TestState out(512, 32, 128, DType::kBF16, LseBase::kNatural);
    EXPECT_TRUE(merge_states_fast_path(dense.dev_view(), out.dev_view()));
    EXPECT_FALSE(merge_states_fast_path(shifted.dev_view(), out.dev_view()));  // o unaligned
    ConstStateStackView many = dense.dev_view();
    many.num_states = 65;  // more states than the fast kernels hold LSEs for
    EXPECT_FALSE(merge_states_fast_path(many, out.dev_view()));
    ConstStateStackView one = dense.dev_view();
    StateView one_out = out.dev_view();
    one.tokens = one_out.tokens = 1;  // too small: the general kernel spreads it better
    EXPECT_FALSE(merge_states_fast_path(one, one_out));
  }
}

/// Merges the same random stack once aligned (fast path) and once with `o` one element off
/// alignment (general kernel), expecting bitwise-equal outputs; compares with the CPU too.
void check_fast_against_general(Rng& rng, const StackShape& s, double p_empty) {
  SCOPED_TRACE(describe_shape(s));
  const LseBase in_base = rng.base(), out_base = rng.base();
  const std::uint64_t seed = static_cast<std::uint64_t>(rng.integer(0, 1ll << 62));
  TestStack dense(s.order, s.tokens, s.states, s.heads, s.dim, s.din, in_base);
  TestStack shifted(s.order, s.tokens, s.states, s.heads, s.dim, s.din, in_base, 0, 1);
  Rng fill_a(seed), fill_b(seed);  // the same values in both
  dense.fill_random(fill_a, -12.f, 12.f, p_empty);
  shifted.fill_random(fill_b, -12.f, 12.f, p_empty);
  TestState out(s.tokens, s.heads, s.dim, s.dout, out_base);
  ASSERT_TRUE(merge_states_fast_path(dense.dev_view(), out.dev_view()));
  ASSERT_FALSE(merge_states_fast_path(shifted.dev_view(), out.dev_view()));
  TestState fast = merge_on_gpu(dense.dev_view(), s.dout, out_base);
  TestState general = merge_on_gpu(shifted.dev_view(), s.dout, out_base);
  EXPECT_TRUE(rows_bitwise_equal(fast, general));
  EXPECT_TRUE(states_close(fast, merge_on_cpu(dense.host_view(), s.dout, out_base)));
}

TEST(CudaMergeFastPath, MatchesTheGeneralKernelBitwiseForAnyStateCount) {
  REQUIRE_FAST_PATH();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (StackOrder order : {StackOrder::kTokensMajor, StackOrder::kStatesMajor}) {
    for (std::int64_t S : {1, 2, 3, 9, 17, 33, 64}) {
      StackShape s{order, 0, S, 32, 128, DType::kBF16, DType::kBF16};
      const std::int64_t fewest = fewest_fast_tokens(s, 4096);
      ASSERT_GT(fewest, 0);
      // The fewest tokens (no pipeline full); for some S also a count with a ragged last round.
      s.tokens = fewest;
      check_fast_against_general(rng, s, 0.15);
      if (S == 3 || S == 33) {
        s.tokens = fewest + 37;
        check_fast_against_general(rng, s, 0.15);
      }
    }
  }
}

TEST(CudaMergeFastPath, MatchesTheGeneralKernelBitwiseForEveryHeadDimAndDtype) {
  REQUIRE_FAST_PATH();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::vector<std::int64_t> dims = attnstate_test::merge_head_dims();
  for (DType din : all_dtypes())
    for (DType dout : all_dtypes()) {
      const std::int64_t dim = dims[static_cast<std::size_t>(
          rng.integer(0, static_cast<std::int64_t>(dims.size()) - 1))];
      const StackOrder order =
          rng.chance(0.5) ? StackOrder::kTokensMajor : StackOrder::kStatesMajor;
      // Few heads in the states-major layout: a block's rows then span many tokens.
      const std::int64_t heads = order == StackOrder::kStatesMajor ? 4 : 32;
      const std::int64_t S = rng.integer(1, dim == 64 ? 32 : 40);
      StackShape s{order, 0, S, heads, dim, din, dout};
      const std::int64_t fewest = fewest_fast_tokens(s, 8192);
      ASSERT_GT(fewest, 0) << describe_shape(s);
      s.tokens = fewest + rng.integer(0, fewest);
      check_fast_against_general(rng, s, 0.2);
    }
}

/// The few-states kernel (S ≤ 4): every head dim and state count, both layouts, several dtype
/// pairs, a token count that fills many blocks (and one that leaves a partial block), with empty
/// inputs; bitwise against the general kernel and close to the CPU.
TEST(CudaMergeFastPath, FewStatesMatchTheGeneralKernelBitwise) {
  REQUIRE_FAST_PATH();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::pair<DType, DType> dtypes[] = {
      {DType::kBF16, DType::kBF16}, {DType::kF16, DType::kF32}, {DType::kF32, DType::kBF16}};
  for (std::int64_t dim : attnstate_test::merge_head_dims())
    for (std::int64_t S : {1, 2, 3, 4}) {
      const auto& dt = dtypes[rng.integer(0, 2)];
      const StackOrder order =
          rng.chance(0.5) ? StackOrder::kTokensMajor : StackOrder::kStatesMajor;
      StackShape s{order, 0, S, 8, dim, dt.first, dt.second};
      ASSERT_EQ(fewest_fast_tokens(s, 1), 1) << describe_shape(s);  // any size takes it
      s.tokens = 1;
      check_fast_against_general(rng, s, 0.25);
      s.tokens = 333;
      check_fast_against_general(rng, s, 0.25);
    }
}

TEST(CudaMergeFastPath, AllEmptyRowsGiveTheIdentity) {
  REQUIRE_FAST_PATH();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t S : {2, 5}) {  // the few-states and the ring kernel
    StackShape s{StackOrder::kTokensMajor, 0, S, 32, 128, DType::kBF16, DType::kF32};
    SCOPED_TRACE(describe_shape(s));
    s.tokens = fewest_fast_tokens(s, 4096);
    ASSERT_GT(s.tokens, 0);
    TestStack stack(s.order, s.tokens, s.states, s.heads, s.dim, s.din, LseBase::kBase2);
    stack.fill_random(rng, -5.f, 5.f, 1.0);  // every state empty, o = NaN
    TestState got = merge_on_gpu(stack.dev_view(), s.dout, LseBase::kNatural);
    ASSERT_TRUE(merge_states_fast_path(stack.dev_view(), got.dev_view()));
    for (std::int64_t t = 0; t < s.tokens; ++t)
      for (std::int64_t h = 0; h < s.heads; ++h) {
        ASSERT_EQ(got.lse(t, h), -INFINITY);
        for (std::int64_t d = 0; d < s.dim; ++d) {
          ASSERT_EQ(got.o(t, h, d), 0.f);
          ASSERT_FALSE(std::signbit(got.o(t, h, d)));
        }
      }
  }
}

TEST(CudaMergeFastPath, UnalignedAndOddStacksMatchCpu) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::int64_t T = 300, S = 6, H = 32, D = 128;
  // One extra token so that views shifted by one element stay inside the buffer.
  TestStack stack(StackOrder::kTokensMajor, T + 1, S, H, D, DType::kF16, LseBase::kNatural);
  stack.fill_random(rng, -6.f, 6.f, 0.1);
  for (int which = 0; which < 4; ++which) {
    ConstStateStackView dv = stack.dev_view(), hv = stack.host_view();
    for (ConstStateStackView* v : {&dv, &hv}) {
      v->tokens = T;
      if (which == 0) v->o = static_cast<const attnstate::half_t*>(v->o) + 1;  // o unaligned
      if (which == 1) v->lse += 1;                                             // LSE rows odd
      if (which == 2) v->heads = H - 1;       // runs of 31 rows: not a multiple of 4
      if (which == 3) v->o_stride_head += 8;  // heads not dense (the view spans fewer heads)
      if (which == 3) v->heads = H / 2;
    }
    SCOPED_TRACE("case " + std::to_string(which));
    TestState out(T, dv.heads, D, DType::kBF16, LseBase::kBase2);
    if (which == 0) {
      EXPECT_FALSE(merge_states_fast_path(dv, out.dev_view()));
    }
    TestState got = merge_on_gpu(dv, DType::kBF16, LseBase::kBase2);
    EXPECT_TRUE(states_close(got, merge_on_cpu(hv, DType::kBF16, LseBase::kBase2)));
  }
}

TEST(CudaMergeFastPath, CapturesInAGraphAndReplaysWithNewInputs) {
  REQUIRE_FAST_PATH();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  StackShape s{StackOrder::kStatesMajor, 0, 12, 32, 128, DType::kBF16, DType::kBF16};
  s.tokens = fewest_fast_tokens(s, 4096) + 5;
  TestStack stack(s.order, s.tokens, s.states, s.heads, s.dim, s.din, LseBase::kNatural);
  TestState out(s.tokens, s.heads, s.dim, s.dout, LseBase::kNatural);
  ASSERT_TRUE(merge_states_fast_path(stack.dev_view(), out.dev_view()));
  cudaStream_t stream;
  ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  gpu::merge_states(stack.dev_view(), out.dev_view(), stream);
  ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    stack.fill_random(rng, -8.f, 8.f, 0.1);
    out.poison_device();
    ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
    out.download();
    EXPECT_TRUE(states_close(out, merge_on_cpu(stack.host_view(), s.dout, LseBase::kNatural)))
        << "replay " << replay;
  }
  ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ATTNSTATE_CUDA_CHECK(cudaGraphDestroy(graph));
  ATTNSTATE_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace attnstate_test
