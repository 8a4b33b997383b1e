/// @file test_cuda_merge_ops.cpp
/// @brief Every CUDA merge operation against the CPU reference on fresh random inputs, with the
///        output poisoned (NaN) first: all dtype combinations, head dims, both stack layouts,
///        ragged rows, masks, strided views and mixed LSE bases.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <vector>

#include "attnstate/core/sink.hpp"
#include "attnstate/cpu/merge.hpp"
#include "attnstate/cuda/merge.hpp"
#include "merge_test_support.hpp"

namespace attnstate_test {
namespace {

namespace cpu = attnstate::cpu;
namespace gpu = attnstate::cuda;

// The merges' own choice of head dims, literal on purpose: the merges take any head dim >= 1 in
// every build (ATTNSTATE_CUDA_HEAD_DIMS only picks where merge_states may take its ring kernel,
// which it skips at the others), so a build of fewer head dims runs these too.
const std::int64_t kHeadDims[] = {64, 128, 256, 512};
/// One of `kHeadDims`, drawn.
std::int64_t any_head_dim(Rng& rng) {
  return kHeadDims[rng.integer(0, static_cast<std::int64_t>(std::size(kHeadDims)) - 1)];
}

void sync() { ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize()); }

/// Runs `merge_state` on the GPU and the CPU for one configuration and compares.
void check_pair(Rng& rng, std::int64_t tokens, std::int64_t heads, std::int64_t dim, DType da,
                DType db, DType dout, Padding pad = {}) {
  SCOPED_TRACE(describe({da, db, dout}) + " head_dim " + std::to_string(dim));
  TestState a(tokens, heads, dim, da, rng.base(), pad);
  TestState b(tokens, heads, dim, db, rng.base());
  a.fill_random(rng, -6.f, 6.f, 0.15);
  b.fill_random(rng, -6.f, 6.f, 0.15);
  TestState got(tokens, heads, dim, dout, rng.base(), pad);
  TestState want(tokens, heads, dim, dout, got.base(), pad);
  got.poison_device();
  gpu::merge_state(a.dev_view(), b.dev_view(), got.dev_view());
  sync();
  got.download();
  cpu::merge_state(a.host_view(), b.host_view(), want.host_view());
  EXPECT_TRUE(states_close(got, want));
}

TEST(CudaMerge, MergeStateMatchesCpuForEveryDtypeCombination) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType da : all_dtypes())
    for (DType db : all_dtypes())
      for (DType dout : all_dtypes()) check_pair(rng, 5, 3, any_head_dim(rng), da, db, dout);
}

TEST(CudaMerge, MergeStateMatchesCpuForEveryHeadDim) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t dim : kHeadDims) {
    check_pair(rng, 9, 4, dim, DType::kBF16, DType::kBF16, DType::kBF16);
    check_pair(rng, 9, 4, dim, DType::kF32, DType::kF16, DType::kF32);
  }
}

TEST(CudaMerge, MergeStateMatchesCpuOnStridedViews) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  // Aligned padding (vector path) and odd padding (element path), for a and out.
  check_pair(rng, 6, 3, 128, DType::kBF16, DType::kBF16, DType::kBF16, Padding{8, 16, 1, 3});
  check_pair(rng, 6, 3, 128, DType::kF16, DType::kF32, DType::kBF16, Padding{3, 5, 2, 1});
  check_pair(rng, 6, 3, 64, DType::kF32, DType::kF32, DType::kF32, Padding{1, 0, 0, 7});
}

TEST(CudaMerge, MergeStateWritesIntoAnExactlyAliasedInput) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t dim : kHeadDims) {
    for (int which = 0; which < 2; ++which) {
      TestState a(7, 5, dim, DType::kBF16, LseBase::kNatural);
      TestState b(7, 5, dim, DType::kBF16, LseBase::kNatural);
      a.fill_random(rng, -4.f, 4.f, 0.1);
      b.fill_random(rng, -4.f, 4.f, 0.1);
      TestState want(7, 5, dim, DType::kBF16, LseBase::kNatural);
      cpu::merge_state(a.host_view(), b.host_view(), want.host_view());
      TestState& out = which == 0 ? a : b;
      gpu::merge_state(a.dev_view(), b.dev_view(), out.dev_view());
      sync();
      out.download();
      EXPECT_TRUE(states_close(out, want)) << "out aliases " << (which == 0 ? "a" : "b");
    }
  }
}

TEST(CudaMerge, MergeStateInplaceMatchesCpuWithAndWithoutMask) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::int64_t tokens = 37, heads = 6;
  for (DType dacc : all_dtypes())
    for (DType doth : all_dtypes())
      for (int masked = 0; masked < 2; ++masked) {
        const std::int64_t dim = any_head_dim(rng);
        SCOPED_TRACE(describe({dacc, doth}) + " head_dim " + std::to_string(dim) +
                     (masked ? " masked" : ""));
        TestState acc(tokens, heads, dim, dacc, rng.base());
        TestState other(tokens, heads, dim, doth, rng.base());
        acc.fill_random(rng, -5.f, 5.f, 0.2);
        other.fill_random(rng, -5.f, 5.f, 0.2);
        std::vector<std::uint8_t> mask(tokens);
        for (auto& m : mask)
          m = rng.chance(0.6) ? static_cast<std::uint8_t>(rng.integer(1, 255)) : 0;
        DeviceBuffer<std::uint8_t> dmask(mask);
        TestState want = acc.clone();
        cpu::merge_state_inplace(want.host_view(), other.host_view(),
                                 masked ? mask.data() : nullptr);
        gpu::merge_state_inplace(acc.dev_view(), other.dev_view(), masked ? dmask.get() : nullptr);
        sync();
        acc.download();
        EXPECT_TRUE(states_close(acc, want));
      }
}

TEST(CudaMerge, SinkStateMergedInPlaceMatchesCpu) {
  // core/sink.hpp: the sink state (o = 0 read through strides 0, lse per head broadcast over
  // tokens) merged into a state on the GPU, against the same merge on the CPU; empty rows too.
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::int64_t tokens = 19, heads = 5;
  for (DType dacc : all_dtypes())
    for (DType dzero : all_dtypes()) {
      const std::int64_t dim = any_head_dim(rng);
      const attnstate::LseBase sink_base = rng.base();
      SCOPED_TRACE(describe({dacc, dzero}) + " head_dim " + std::to_string(dim));
      TestState acc(tokens, heads, dim, dacc, rng.base());
      acc.fill_random(rng, -5.f, 5.f, 0.2);
      std::vector<float> sinks(static_cast<std::size_t>(heads));
      for (float& s : sinks) s = static_cast<float>(rng.integer(-40, 40)) / 8.f;
      const std::vector<std::uint32_t> zeros(static_cast<std::size_t>(dim), 0u);
      DeviceBuffer<float> dsinks(sinks);
      DeviceBuffer<std::uint32_t> dzeros(zeros);
      TestState want = acc.clone();
      cpu::merge_state_inplace(want.host_view(),
                               attnstate::make_sink_state(sinks.data(), zeros.data(), dzero, tokens,
                                                          heads, dim, sink_base));
      gpu::merge_state_inplace(
          acc.dev_view(),
          attnstate::make_sink_state(dsinks.get(), dzeros.get(), dzero, tokens, heads, dim,
                                     sink_base, attnstate::MemorySpace::kDevice));
      sync();
      acc.download();
      EXPECT_TRUE(states_close(acc, want));
    }
}

/// Runs `merge_states` on a stack in `order` and compares with the CPU.
void check_stack(Rng& rng, StackOrder order, std::int64_t tokens, std::int64_t states,
                 std::int64_t heads, std::int64_t dim, DType din, DType dout, double p_empty) {
  SCOPED_TRACE(describe({din, dout}) + " S " + std::to_string(states) + " head_dim " +
               std::to_string(dim) +
               (order == StackOrder::kTokensMajor ? " tokens-major" : " states-major"));
  TestStack stack(order, tokens, states, heads, dim, din, rng.base());
  stack.fill_random(rng, -10.f, 10.f, p_empty);
  TestState got(tokens, heads, dim, dout, rng.base());
  TestState want(tokens, heads, dim, dout, got.base());
  got.poison_device();
  gpu::merge_states(stack.dev_view(), got.dev_view());
  sync();
  got.download();
  cpu::merge_states(stack.host_view(), want.host_view());
  EXPECT_TRUE(states_close(got, want));
}

TEST(CudaMerge, MergeStatesMatchesCpuInBothLayouts) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (StackOrder order : {StackOrder::kTokensMajor, StackOrder::kStatesMajor})
    for (std::int64_t states : {1, 2, 5, 8, 17, 33, 70})
      check_stack(rng, order, 11, states, 3, any_head_dim(rng), DType::kBF16, DType::kBF16, 0.2);
}

TEST(CudaMerge, MergeStatesMatchesCpuForEveryDtypeAndHeadDim) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType din : all_dtypes())
    for (DType dout : all_dtypes())
      for (std::int64_t dim : kHeadDims)
        check_stack(rng, rng.chance(0.5) ? StackOrder::kTokensMajor : StackOrder::kStatesMajor, 6,
                    rng.integer(1, 40), 2, dim, din, dout, 0.25);
}

TEST(CudaMerge, MergeStatesMatchesCpuOnAStridedStack) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  // A stack viewed inside a larger buffer: states 3 apart from a token-major buffer of 7 slots,
  // heads padded, o pointer offset by one element (so only element access is valid).
  for (int misaligned = 0; misaligned < 2; ++misaligned) {
    const std::int64_t tokens = 5, slots = 7, states = 2, heads = 3, dim = 128;
    TestStack big(StackOrder::kTokensMajor, tokens, slots, heads + 1, dim + 8, DType::kF16,
                  LseBase::kBase2);
    big.fill_random(rng, -5.f, 5.f, 0.1);
    ConstStateStackView dv = big.dev_view(), hv = big.host_view();
    for (ConstStateStackView* v : {&dv, &hv}) {
      v->num_states = states;
      v->o_stride_state *= 3;
      v->lse_stride_state *= 3;
      v->heads = heads;
      v->head_dim = dim;
      v->o = static_cast<const attnstate::half_t*>(v->o) + misaligned;
    }
    TestState got(tokens, heads, dim, DType::kF32, LseBase::kNatural);
    TestState want(tokens, heads, dim, DType::kF32, LseBase::kNatural);
    got.poison_device();
    gpu::merge_states(dv, got.dev_view());
    sync();
    got.download();
    cpu::merge_states(hv, want.host_view());
    EXPECT_TRUE(states_close(got, want)) << "misaligned " << misaligned;
  }
}

/// Random non-decreasing offsets over `rows` rows for `tokens` tokens, some tokens empty.
std::vector<std::int32_t> random_indptr(Rng& rng, std::int64_t tokens, std::int64_t max_per_token) {
  std::vector<std::int32_t> indptr(tokens + 1, 0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t n = rng.chance(0.2) ? 0 : rng.integer(1, max_per_token);
    indptr[t + 1] = static_cast<std::int32_t>(indptr[t] + n);
  }
  return indptr;
}

TEST(CudaMerge, MergeStatesRaggedMatchesCpuWithEmptyTokens) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType din : all_dtypes())
    for (DType dout : all_dtypes()) {
      const std::int64_t dim = any_head_dim(rng), tokens = 23, heads = 4;
      SCOPED_TRACE(describe({din, dout}) + " head_dim " + std::to_string(dim));
      const std::vector<std::int32_t> indptr = random_indptr(rng, tokens, 40);
      DeviceBuffer<std::int32_t> dindptr(indptr);
      TestState rows(indptr.back(), heads, dim, din, rng.base());
      rows.fill_random(rng, -6.f, 6.f, 0.2);
      TestState got(tokens, heads, dim, dout, rng.base());
      TestState want(tokens, heads, dim, dout, got.base());
      got.poison_device();
      gpu::merge_states_ragged(rows.dev_view(), dindptr.get(), got.dev_view());
      sync();
      got.download();
      cpu::merge_states_ragged(rows.host_view(), indptr.data(), want.host_view());
      EXPECT_TRUE(states_close(got, want));
    }
}

TEST(CudaMerge, MergeStatesRaggedClampsOutOfRangeOffsets) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  // indptr negative, decreasing and past the rows: token t merges the rows
  // [clamp(indptr[t], 0, R), clamp(indptr[t+1], begin, R)), nothing out of bounds.
  const std::int64_t tokens = 4, heads = 2, dim = 64, nrows = 6;
  const std::vector<std::int32_t> bad = {-5, 2, 1, 4, 1000};
  DeviceBuffer<std::int32_t> dbad(bad);
  TestState rows(nrows, heads, dim, DType::kF32, LseBase::kNatural);
  rows.fill_random(rng);
  // The reference: the clamped ranges gathered into consecutive rows, merged by the CPU.
  std::vector<std::int64_t> gathered;
  std::vector<std::int32_t> indptr = {0};
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t begin = std::min<std::int64_t>(std::max<std::int64_t>(bad[t], 0), nrows);
    const std::int64_t end =
        std::min<std::int64_t>(std::max<std::int64_t>(bad[t + 1], begin), nrows);
    for (std::int64_t r = begin; r < end; ++r) gathered.push_back(r);
    indptr.push_back(static_cast<std::int32_t>(gathered.size()));
  }
  TestState copy(static_cast<std::int64_t>(gathered.size()), heads, dim, DType::kF32,
                 LseBase::kNatural);
  for (std::size_t i = 0; i < gathered.size(); ++i)
    for (std::int64_t h = 0; h < heads; ++h) {
      copy.set_lse(static_cast<std::int64_t>(i), h, rows.lse(gathered[i], h));
      for (std::int64_t d = 0; d < dim; ++d)
        copy.set_o(static_cast<std::int64_t>(i), h, d, rows.o(gathered[i], h, d));
    }
  TestState got(tokens, heads, dim, DType::kF32, LseBase::kNatural);
  TestState want(tokens, heads, dim, DType::kF32, LseBase::kNatural);
  got.poison_device();
  gpu::merge_states_ragged(rows.dev_view(), dbad.get(), got.dev_view());
  sync();
  got.download();
  cpu::merge_states_ragged(copy.host_view(), indptr.data(), want.host_view());
  EXPECT_TRUE(states_close(got, want));
}

TEST(CudaMerge, RebaseMatchesCpuForEveryDtypeCombination) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType din : all_dtypes())
    for (DType dout : all_dtypes()) {
      const std::int64_t dim = any_head_dim(rng);
      SCOPED_TRACE(describe({din, dout}) + " head_dim " + std::to_string(dim));
      TestState in(13, 3, dim, din, rng.base());
      in.fill_random(rng, -20.f, 20.f, 0.1);
      TestState got(13, 3, dim, dout, rng.base(), Padding{8, 0, 1, 0});
      TestState want(13, 3, dim, dout, got.base(), Padding{8, 0, 1, 0});
      got.poison_device();
      gpu::rebase(in.dev_view(), got.dev_view());
      sync();
      got.download();
      cpu::rebase(in.host_view(), want.host_view());
      EXPECT_TRUE(states_close(got, want));
    }
}

TEST(CudaMerge, RebaseInPlaceRewritesTheLseAndTheEmptyRows) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  TestState s(9, 4, 256, DType::kBF16, LseBase::kBase2);
  s.fill_random(rng, -9.f, 9.f, 0.2);
  TestState want = s.clone();
  StateView out = s.dev_view();
  out.base = LseBase::kNatural;
  gpu::rebase(s.dev_view(), out);
  sync();
  s.download();
  StateView hout = want.host_view();
  hout.base = LseBase::kNatural;
  cpu::rebase(want.host_view(), hout);
  // o untouched but the empty rows' (NaN there, 0 after), LSEs converted alike
  EXPECT_TRUE(rows_bitwise_equal(s, want));
}

TEST(CudaMerge, MarkEmptyRowsTurnsPositiveInfinityIntoTheEmptyState) {
  // FlashAttention's rows without keys (lse = +inf) become empty; every other row, finite, -inf
  // or NaN, and every o element keep their bits (as the CPU does).
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  TestState s(37, 6, 128, DType::kBF16, LseBase::kNatural);
  s.fill_random(rng, -9.f, 9.f, 0.2);
  for (int t = 0; t < 37; t += 3) s.set_lse(t, t % 6, INFINITY);
  s.set_lse(1, 2, NAN);
  s.upload();
  TestState want = s.clone();
  gpu::mark_empty_rows(s.dev_view());
  sync();
  s.download();
  cpu::mark_empty_rows(want.host_view());
  EXPECT_TRUE(rows_bitwise_equal(s, want));
  int emptied = 0;
  for (int t = 0; t < 37; t += 3) emptied += s.lse(t, t % 6) == -INFINITY;
  EXPECT_EQ(emptied, 13);
  EXPECT_TRUE(std::isnan(s.lse(1, 2)));
}

TEST(CudaMerge, ManyHeadsAndFewTokensMatchCpu) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t dim : kHeadDims) {
    check_pair(rng, 1, 128, dim, DType::kBF16, DType::kBF16, DType::kBF16);
    check_stack(rng, StackOrder::kTokensMajor, 1, 8, 128, dim, DType::kBF16, DType::kBF16, 0.1);
  }
}

TEST(CudaMerge, HundredThousandTokensOneHeadMatchCpu) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const std::int64_t tokens = 100000;
  check_pair(rng, tokens, 1, 64, DType::kBF16, DType::kF16, DType::kBF16);
  check_stack(rng, StackOrder::kStatesMajor, tokens, 3, 1, 128, DType::kBF16, DType::kF32, 0.1);
  const std::vector<std::int32_t> indptr = random_indptr(rng, tokens, 3);
  DeviceBuffer<std::int32_t> dindptr(indptr);
  TestState rows(indptr.back(), 1, 64, DType::kF16, LseBase::kBase2);
  rows.fill_random(rng, -6.f, 6.f, 0.1);
  TestState got(tokens, 1, 64, DType::kF16, LseBase::kNatural);
  TestState want(tokens, 1, 64, DType::kF16, LseBase::kNatural);
  got.poison_device();
  gpu::merge_states_ragged(rows.dev_view(), dindptr.get(), got.dev_view());
  sync();
  got.download();
  cpu::merge_states_ragged(rows.host_view(), indptr.data(), want.host_view());
  EXPECT_TRUE(states_close(got, want));
}

TEST(CudaMerge, ZeroTokensIsANoOp) {
  ATTNSTATE_REQUIRE_GPU();
  TestState a(0, 2, 64, DType::kF32, LseBase::kNatural);
  TestState out(0, 2, 64, DType::kF32, LseBase::kNatural);
  EXPECT_NO_THROW(gpu::merge_state(a.dev_view(), a.dev_view(), out.dev_view()));
  EXPECT_NO_THROW(gpu::rebase(a.dev_view(), out.dev_view()));
  TestStack stack(StackOrder::kTokensMajor, 0, 3, 2, 64, DType::kF32, LseBase::kNatural);
  EXPECT_NO_THROW(gpu::merge_states(stack.dev_view(), out.dev_view()));
  sync();
}

}  // namespace
}  // namespace attnstate_test
