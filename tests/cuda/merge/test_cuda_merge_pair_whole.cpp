/// @file test_cuda_merge_pair_whole.cpp
/// @brief The whole-row kernel of the pairwise merges (rows of whole chunks split evenly over a
///        power of two of threads, vector access): which calls take it, and bits equal to the
///        general kernel's (the same merge with one input one element off alignment) and close
///        to the CPU, out of place and in place, masked and not, into NaN-poisoned outputs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/cpu/merge.hpp"
#include "attnstate/cuda/merge.hpp"
#include "merge_test_support.hpp"

namespace attnstate_test {
namespace {

namespace cpu = attnstate::cpu;
namespace gpu = attnstate::cuda;
using attnstate::TokenMask;
using attnstate::cuda::detail::merge_state_whole_path;

/// Head dims whose rows split evenly: 2 or 3 chunks of 8 per thread over 1..32 threads.
const std::int64_t kWholeDims[] = {16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512};

void sync() { ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize()); }

TEST(CudaMergePairWhole, TakenWhereRowsSplitEvenlyAndViewsAreAligned) {
  ATTNSTATE_REQUIRE_GPU();
  for (std::int64_t dim : kWholeDims) {
    SCOPED_TRACE("head_dim " + std::to_string(dim));
    TestState a(3, 2, dim, DType::kBF16, LseBase::kNatural);
    TestState b(3, 2, dim, DType::kF16, LseBase::kBase2);
    TestState out(3, 2, dim, DType::kF32, LseBase::kNatural);
    EXPECT_TRUE(merge_state_whole_path(a.dev_view(), b.dev_view(), out.dev_view()));
    TestState shifted(3, 2, dim, DType::kBF16, LseBase::kNatural, Padding{1, 0, 0, 0});
    EXPECT_FALSE(merge_state_whole_path(shifted.dev_view(), b.dev_view(), out.dev_view()));
  }
  for (std::int64_t dim : {8, 40, 80, 100, 112, 160, 1024}) {  // no even split, or partial chunks
    SCOPED_TRACE("head_dim " + std::to_string(dim));
    TestState a(3, 2, dim, DType::kBF16, LseBase::kNatural);
    TestState out(3, 2, dim, DType::kBF16, LseBase::kNatural);
    EXPECT_FALSE(merge_state_whole_path(a.dev_view(), a.dev_view(), out.dev_view()));
  }
}

/// The four pairwise calls (out of place, in place, each masked or not) once through the
/// whole-row kernel and once through the general kernel (`a` one element off alignment): the same
/// bits, and close to the CPU.
void check_whole_against_general(Rng& rng, std::int64_t tokens, std::int64_t heads,
                                 std::int64_t dim, DType da, DType db, DType dout) {
  SCOPED_TRACE(describe({da, db, dout}) + " head_dim " + std::to_string(dim) + " tokens " +
               std::to_string(tokens));
  const LseBase base_a = rng.base(), base_b = rng.base(), base_out = rng.base();
  const std::uint64_t seed = static_cast<std::uint64_t>(rng.integer(0, 1ll << 62));
  Rng fill_a(seed), fill_b(seed);  // the same values in both
  TestState a(tokens, heads, dim, da, base_a);
  TestState shifted(tokens, heads, dim, da, base_a, Padding{1, 0, 0, 0});
  a.fill_random(fill_a, -8.f, 8.f, 0.15);
  shifted.fill_random(fill_b, -8.f, 8.f, 0.15);
  TestState b(tokens, heads, dim, db, base_b);
  b.fill_random(rng, -8.f, 8.f, 0.15);
  const std::int64_t stride = rng.integer(0, 3);
  std::vector<std::uint8_t> mask_host(static_cast<std::size_t>(stride == 0 ? 1 : tokens * stride));
  for (std::int64_t t = 0; t < (stride == 0 ? 1 : tokens); ++t)
    mask_host[static_cast<std::size_t>(t * stride)] = rng.chance(0.5) ? 0 : 1;
  DeviceBuffer<std::uint8_t> mask_dev(mask_host);
  // an fp8 output is one rounding of a few bits from the CPU's, subnormals included
  const float o_atol = attnstate::is_fp8(dout) ? 1.f / 256.f : 1e-5f;

  for (bool masked : {false, true}) {
    SCOPED_TRACE(masked ? "masked, stride " + std::to_string(stride) : "no mask");
    const TokenMask md = masked ? TokenMask(mask_dev.get(), stride) : TokenMask{};
    const TokenMask mh = masked ? TokenMask(mask_host.data(), stride) : TokenMask{};
    // out of place
    TestState whole(tokens, heads, dim, dout, base_out);
    TestState general(tokens, heads, dim, dout, base_out);
    TestState want(tokens, heads, dim, dout, base_out);
    ASSERT_TRUE(merge_state_whole_path(a.dev_view(), b.dev_view(), whole.dev_view()));
    ASSERT_FALSE(merge_state_whole_path(shifted.dev_view(), b.dev_view(), general.dev_view()));
    whole.poison_device();
    general.poison_device();
    gpu::merge_state(a.dev_view(), b.dev_view(), whole.dev_view(), md);
    gpu::merge_state(shifted.dev_view(), b.dev_view(), general.dev_view(), md);
    sync();
    whole.download();
    general.download();
    cpu::merge_state(a.host_view(), b.host_view(), want.host_view(), mh);
    EXPECT_TRUE(rows_bitwise_equal(whole, general));
    EXPECT_TRUE(states_close(whole, want, o_atol));
    // in place (the accumulator of a's dtype)
    TestState acc = a.clone();
    TestState acc_general = shifted.clone();
    TestState acc_want = a.clone();
    ASSERT_TRUE(merge_state_whole_path(acc.dev_view(), b.dev_view(), acc.dev_view()));
    gpu::merge_state_inplace(acc.dev_view(), b.dev_view(), md);
    gpu::merge_state_inplace(acc_general.dev_view(), b.dev_view(), md);
    sync();
    acc.download();
    acc_general.download();
    cpu::merge_state_inplace(acc_want.host_view(), b.host_view(), mh);
    EXPECT_TRUE(rows_bitwise_equal(acc, acc_general));
    EXPECT_TRUE(states_close(acc, acc_want, o_atol));
  }
}

TEST(CudaMergePairWhole, MatchesTheGeneralKernelBitwiseForEveryEvenHeadDim) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::vector<DType> dts = all_dtypes();
  for (std::int64_t dim : kWholeDims) {
    const auto pick = [&] { return dts[static_cast<std::size_t>(rng.integer(0, 2))]; };
    // 37 tokens x 5 heads: rows that end mid-warp and mid-block
    check_whole_against_general(rng, 37, 5, dim, pick(), pick(), pick());
  }
}

TEST(CudaMergePairWhole, Fp8OutputsMatchTheGeneralKernelBitwise) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType f8 : {DType::kE4M3, DType::kE5M2})
    for (std::int64_t dim : {64, 96, 128, 256}) {
      // bf16 inputs into an fp8 output (the streamed loads), and fp8 in and out (in place)
      check_whole_against_general(rng, 19, 4, dim, DType::kBF16, DType::kBF16, f8);
      check_whole_against_general(rng, 19, 4, dim, f8, f8, f8);
    }
}

}  // namespace
}  // namespace attnstate_test
