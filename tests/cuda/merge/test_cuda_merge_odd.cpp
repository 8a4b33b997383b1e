/// @file test_cuda_merge_odd.cpp
/// @brief The odd-row kernel of the CUDA `merge_states` (head dims whose rows are not a power of
///        two of 8-element chunks, `compiled::MergeOddHeadDims`): which stacks take it, bitwise
///        agreement with the general kernel (the same stack with `o` one element off alignment)
///        and closeness to the CPU reference at every such head dim, for state counts below,
///        at and above one batch, every dtype pair, both layouts, ragged last blocks, empty,
///        NaN and +inf inputs, into NaN-poisoned outputs; outputs without an LSE (also through
///        the ring kernel); all-empty rows.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

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

/// The head dims of the odd-row kernel (the catalog's rows).
std::vector<std::int64_t> odd_head_dims() { return attnstate_test::merge_odd_head_dims(); }

/// A dense stack and an output of this shape over no memory (16-byte aligned): only shapes,
/// strides and alignment matter to the choice of kernel.
ConstStateStackView stand_in_stack(StackOrder order, std::int64_t tokens, std::int64_t states,
                                   std::int64_t heads, std::int64_t dim, DType din) {
  alignas(16) static float stand_in[4] = {0.f, 0.f, 0.f, 0.f};
  return attnstate::make_state_stack(stand_in, din, stand_in, order, tokens, states, heads, dim,
                                     LseBase::kNatural, MemorySpace::kDevice);
}
StateView stand_in_out(std::int64_t tokens, std::int64_t heads, std::int64_t dim, DType dout) {
  alignas(16) static float stand_in[4] = {0.f, 0.f, 0.f, 0.f};
  return attnstate::make_state_view(stand_in, dout, stand_in, tokens, heads, dim, LseBase::kNatural,
                                    MemorySpace::kDevice);
}

/// True when a dense stack of this shape (aligned `o`) takes a fast `merge_states` kernel.
bool takes_fast(StackOrder order, std::int64_t tokens, std::int64_t states, std::int64_t heads,
                std::int64_t dim, DType din, DType dout) {
  return merge_states_fast_path(stand_in_stack(order, tokens, states, heads, dim, din),
                                stand_in_out(tokens, heads, dim, dout));
}

/// The fewest tokens (doubling, then bisecting, up to 1 << 16) for which such a stack takes a
/// fast kernel, or -1.
std::int64_t fewest_tokens(StackOrder order, std::int64_t states, std::int64_t heads,
                           std::int64_t dim, DType din, DType dout) {
  std::int64_t hi = 1;
  while (hi <= (1 << 16) && !takes_fast(order, hi, states, heads, dim, din, dout)) hi *= 2;
  if (hi > (1 << 16)) return -1;
  std::int64_t lo = hi / 2;  // not fast (or 0)
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    (takes_fast(order, mid, states, heads, dim, din, dout) ? hi : lo) = mid;
  }
  return hi;
}

/// Skips the test without a GPU or, on devices before sm_80, without the fast kernels.
#define REQUIRE_ODD_KERNEL()                                                                  \
  do {                                                                                        \
    ATTNSTATE_REQUIRE_GPU();                                                                  \
    if (fewest_tokens(StackOrder::kTokensMajor, 8, 32, odd_head_dims().front(), DType::kBF16, \
                      DType::kBF16) < 0)                                                      \
      GTEST_SKIP() << "no fast merge_states path on this device";                             \
  } while (0)

/// `merge_states` of `view` on the GPU into a fresh NaN-poisoned state (its LSE left out when
/// `with_lse` is false).
TestState merge_on_gpu(const ConstStateStackView& view, DType dout, LseBase base,
                       bool with_lse = true) {
  TestState got(view.tokens, view.heads, view.head_dim, dout, base);
  got.poison_device();
  StateView out = got.dev_view();
  if (!with_lse) out.lse = nullptr;
  gpu::merge_states(view, out);
  sync();
  got.download();
  return got;
}

TEST(CudaMergeOdd, ListedHeadDimsAreRowsOfNonPowerOfTwoChunkCounts) {
  // The head dims of models whose rows are 12 and 24 chunks (3 chunks a thread).
  const std::vector<std::int64_t> dims = odd_head_dims();
  for (std::int64_t d : {96, 192})
    EXPECT_NE(std::find(dims.begin(), dims.end(), d), dims.end()) << d;
  for (std::int64_t d : dims) {
    const std::int64_t chunks = d / 8;
    EXPECT_EQ(d % 8, 0) << d;
    EXPECT_NE(chunks & (chunks - 1), 0) << d << ": a power of two of chunks (the ring's rows)";
  }
}

TEST(CudaMergeOdd, LargeAlignedStacksTakeItOthersDoNot) {
  ATTNSTATE_REQUIRE_GPU();
  int dev = 0, major = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 9) GTEST_SKIP() << "the fast path is measured and required on sm_90 only";
  for (std::int64_t dim : odd_head_dims()) {
    SCOPED_TRACE("D " + std::to_string(dim));
    for (StackOrder order : {StackOrder::kTokensMajor, StackOrder::kStatesMajor}) {
      // The benchmark's shape: 4096 tokens, 8 states, 32 heads.
      const ConstStateStackView dense = stand_in_stack(order, 4096, 8, 32, dim, DType::kBF16);
      const StateView out = stand_in_out(4096, 32, dim, DType::kBF16);
      EXPECT_TRUE(merge_states_fast_path(dense, out));
      ConstStateStackView shifted = dense;
      shifted.o = static_cast<const attnstate::bfloat16_t*>(dense.o) + 1;  // o unaligned
      EXPECT_FALSE(merge_states_fast_path(shifted, out));
      ConstStateStackView many = dense;
      many.num_states = 65;  // more states than any fast kernel holds LSEs for
      EXPECT_FALSE(merge_states_fast_path(many, out));
      ConstStateStackView one = dense;
      StateView one_out = out;
      one.tokens = one_out.tokens = 1;  // too small: the general kernel spreads it better
      EXPECT_FALSE(merge_states_fast_path(one, one_out));
    }
  }
  // Rows not of whole chunks (84 = 10.5 chunks) take the general kernel.
  EXPECT_FALSE(takes_fast(StackOrder::kTokensMajor, 4096, 8, 32, 84, DType::kBF16, DType::kBF16));
}

/// Sets a few LSEs of the stack to NaN and +inf (the same in `a` and `b`), drawn from `rng`.
void add_invalid_lses(Rng& rng, TestStack& a, TestStack& b, std::int64_t tokens,
                      std::int64_t states, std::int64_t heads) {
  for (int i = 0; i < 3; ++i) {
    const std::int64_t t = rng.integer(0, tokens - 1), s = rng.integer(0, states - 1),
                       h = rng.integer(0, heads - 1);
    const float x = i == 0 ? INFINITY : NAN;
    a.set_lse(t, s, h, x);
    b.set_lse(t, s, h, x);
  }
  a.upload();
  b.upload();
}

TEST(CudaMergeOdd, MatchesTheGeneralKernelBitwiseAndTheCpu) {
  REQUIRE_ODD_KERNEL();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::vector<DType>& dts = all_dtypes();
  int pair = 0;  // every dtype pair in turn
  for (std::int64_t dim : odd_head_dims()) {
    // Below, at and above one batch (8 states of a 16-bit o, 4 of f32), and the most LSEs a
    // row holds (4 per lane of the general kernel's group: 32 at rows of at most 8 chunks).
    std::vector<std::int64_t> counts = {5, 8, 9, 17, 32};
    if (dim / 8 > 8) counts.insert(counts.end(), {33, 64});
    for (std::int64_t S : counts) {
      const DType din = dts[static_cast<std::size_t>(pair / 3 % 3)];
      const DType dout = dts[static_cast<std::size_t>(pair % 3)];
      ++pair;
      const StackOrder order = pair % 2 ? StackOrder::kTokensMajor : StackOrder::kStatesMajor;
      // Few heads in the states-major layout: a block's rows then span many tokens.
      const std::int64_t heads = order == StackOrder::kStatesMajor ? 4 : 32;
      const std::int64_t fewest = fewest_tokens(order, S, heads, dim, din, dout);
      ASSERT_GT(fewest, 0) << "D " << dim << " S " << S;
      const std::int64_t T = fewest + rng.integer(0, 37);  // a ragged last block
      SCOPED_TRACE("D " + std::to_string(dim) + " S " + std::to_string(S) + " T " +
                   std::to_string(T) + " heads " + std::to_string(heads) + " " +
                   describe({din, dout}) +
                   (order == StackOrder::kTokensMajor ? " tokens-major" : " states-major"));
      const LseBase in_base = rng.base(), out_base = rng.base();
      const std::uint64_t seed = static_cast<std::uint64_t>(rng.integer(0, 1ll << 62));
      TestStack dense(order, T, S, heads, dim, din, in_base);
      TestStack shifted(order, T, S, heads, dim, din, in_base, 0, 1);
      Rng fill_a(seed), fill_b(seed);  // the same values in both
      dense.fill_random(fill_a, -12.f, 12.f, 0.2);
      shifted.fill_random(fill_b, -12.f, 12.f, 0.2);
      TestState probe(T, heads, dim, dout, out_base);
      ASSERT_TRUE(merge_states_fast_path(dense.dev_view(), probe.dev_view()));
      ASSERT_FALSE(merge_states_fast_path(shifted.dev_view(), probe.dev_view()));
      const TestState fast = merge_on_gpu(dense.dev_view(), dout, out_base);
      const TestState general = merge_on_gpu(shifted.dev_view(), dout, out_base);
      EXPECT_TRUE(rows_bitwise_equal(fast, general));
      TestState want(T, heads, dim, dout, out_base);
      cpu::merge_states(dense.host_view(), want.host_view());
      EXPECT_TRUE(states_close(fast, want));
      // NaN and +inf LSEs propagate the same way through both kernels.
      add_invalid_lses(rng, dense, shifted, T, S, heads);
      EXPECT_TRUE(rows_bitwise_equal(merge_on_gpu(dense.dev_view(), dout, out_base),
                                     merge_on_gpu(shifted.dev_view(), dout, out_base)));
    }
  }
}

TEST(CudaMergeOdd, OutputsWithoutAnLseWriteTheSameOAndNoLse) {
  // Large enough for the odd-row kernel and, at the ring's head dims, the ring kernel.
  REQUIRE_ODD_KERNEL();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  std::vector<std::int64_t> dims = odd_head_dims();
  for (std::int64_t d : merge_head_dims()) dims.push_back(d);
  for (std::int64_t dim : dims) {
    SCOPED_TRACE("D " + std::to_string(dim));
    const std::int64_t T =
        fewest_tokens(StackOrder::kTokensMajor, 8, 32, dim, DType::kBF16, DType::kBF16);
    ASSERT_GT(T, 0);
    TestStack stack(StackOrder::kTokensMajor, T, 8, 32, dim, DType::kBF16, rng.base());
    stack.fill_random(rng, -6.f, 6.f, 0.2);
    const TestState with = merge_on_gpu(stack.dev_view(), DType::kBF16, LseBase::kNatural);
    const TestState without =
        merge_on_gpu(stack.dev_view(), DType::kBF16, LseBase::kNatural, /*with_lse=*/false);
    bool same_o = true, lse_untouched = true;
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < 32; ++h) {
        lse_untouched = lse_untouched && std::isnan(without.lse(t, h));  // still the poison
        for (std::int64_t d = 0; d < dim; ++d) {
          const float x = with.o(t, h, d), y = without.o(t, h, d);
          same_o = same_o && std::memcmp(&x, &y, 4) == 0;
        }
      }
    EXPECT_TRUE(same_o);
    EXPECT_TRUE(lse_untouched);
  }
}

TEST(CudaMergeOdd, AllEmptyRowsGiveTheIdentity) {
  REQUIRE_ODD_KERNEL();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t dim : odd_head_dims()) {
    SCOPED_TRACE("D " + std::to_string(dim));
    const std::int64_t T =
        fewest_tokens(StackOrder::kTokensMajor, 9, 32, dim, DType::kF16, DType::kF32);
    ASSERT_GT(T, 0);
    TestStack stack(StackOrder::kTokensMajor, T, 9, 32, dim, DType::kF16, LseBase::kBase2);
    stack.fill_random(rng, -5.f, 5.f, 1.0);  // every state empty, o = NaN
    const TestState got = merge_on_gpu(stack.dev_view(), DType::kF32, LseBase::kNatural);
    bool identity = true;
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < 32; ++h) {
        identity = identity && got.lse(t, h) == -INFINITY;
        for (std::int64_t d = 0; d < dim; ++d)
          identity = identity && got.o(t, h, d) == 0.f && !std::signbit(got.o(t, h, d));
      }
    EXPECT_TRUE(identity);
  }
}

}  // namespace
}  // namespace attnstate_test
