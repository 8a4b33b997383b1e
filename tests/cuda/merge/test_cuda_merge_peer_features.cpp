/// @file test_cuda_merge_peer_features.cpp
/// @brief The CUDA merges on what the serving engines' own merge tests ask for, against the CPU
///        merges on fresh random inputs with the output poisoned (NaN) first: every head dim
///        (1 to 1024, rows of partial chunks and of chunk counts that are not powers of two,
///        aligned and unaligned views), masks of any stride (broadcast included) on the
///        out-of-place and in-place merges, outputs without an LSE, stacks of no states, `rebase`
///        writing empty rows as `(0, -inf)`, and an fp8 output with a scale at odd head dims.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "attnstate/cpu/merge.hpp"
#include "attnstate/cuda/merge.hpp"
#include "merge_test_support.hpp"

namespace attnstate_test {
namespace {

namespace cpu = attnstate::cpu;
namespace gpu = attnstate::cuda;
using attnstate::ConstStateStackView;
using attnstate::Status;
using attnstate::TokenMask;

/// Head dims of vLLM's, SGLang's and FlashInfer's merge tests, of models (80 ... 192, MLA's 512,
/// 576), and the edges of the kernels' row split (partial chunks, 1 chunk, 2^k ± 1 chunks, rows
/// of more than 64 chunks).
const std::int64_t kDims[] = {1,  2,  3,   5,   7,   8,   12,  16,  24,  32,  40,  48,   72,
                              80, 96, 100, 112, 136, 160, 192, 200, 264, 320, 576, 1000, 1024};

void sync() { ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize()); }

DType pick(Rng& rng) { return all_dtypes()[static_cast<std::size_t>(rng.integer(0, 2))]; }

/// A device mask of `tokens` flags `stride` bytes apart (stride 0: the one flag `flags[0]`),
/// with the host copy the CPU merge reads.
struct Mask {
  std::vector<std::uint8_t> host;
  DeviceBuffer<std::uint8_t> dev;
  std::int64_t stride;
  Mask(Rng& rng, std::int64_t tokens, std::int64_t stride_)
      : host(static_cast<std::size_t>(stride_ == 0 ? 1 : tokens * stride_), 0xAB), stride(stride_) {
    for (std::int64_t t = 0; t < (stride == 0 ? 1 : tokens); ++t)
      host[static_cast<std::size_t>(t * stride)] = rng.chance(0.5) ? 0 : 1 + rng.integer(0, 9);
    dev = DeviceBuffer<std::uint8_t>(host);
  }
  TokenMask h() const { return TokenMask(host.data(), stride); }
  TokenMask d() const { return TokenMask(dev.get(), stride); }
};

TEST(CudaMergePeerFeatures, MergeStateTakesEveryHeadDim) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t dim : kDims) {
    const DType da = pick(rng), db = pick(rng), dout = pick(rng);
    SCOPED_TRACE(describe({da, db, dout}) + " head_dim " + std::to_string(dim));
    // odd head paddings make some rows unaligned (element access)
    const Padding pad{rng.integer(0, 1) * 3, 0, 0, 0};
    TestState a(7, 3, dim, da, rng.base(), pad);
    TestState b(7, 3, dim, db, rng.base());
    a.fill_random(rng, -6.f, 6.f, 0.2);
    b.fill_random(rng, -6.f, 6.f, 0.2);
    TestState got(7, 3, dim, dout, rng.base(), pad);
    TestState want(7, 3, dim, dout, got.base(), pad);
    EXPECT_TRUE(gpu_matches_cpu(
        got, want, [&](StateView o) { gpu::merge_state(a.dev_view(), b.dev_view(), o); },
        [&](StateView o) { cpu::merge_state(a.host_view(), b.host_view(), o); }));

    // in place, masked with a random stride
    TestState acc = a.clone();
    TestState acc_want = a.clone();
    const Mask m(rng, 7, rng.integer(0, 3));
    gpu::merge_state_inplace(acc.dev_view(), b.dev_view(), m.d());
    sync();
    acc.download();
    cpu::merge_state_inplace(acc_want.host_view(), b.host_view(), m.h());
    EXPECT_TRUE(states_close(acc, acc_want));
  }
}

TEST(CudaMergePeerFeatures, MergeStatesTakesEveryHeadDimAndNoStates) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t dim : kDims) {
    for (std::int64_t states : {0, 1, 2, 3, 5, 8, 33}) {
      const StackOrder order =
          rng.chance(0.5) ? StackOrder::kTokensMajor : StackOrder::kStatesMajor;
      const DType din = pick(rng), dout = pick(rng);
      const std::int64_t shift = rng.chance(0.25) ? 1 : 0;  // unaligned o
      SCOPED_TRACE(describe({din, dout}) + " head_dim " + std::to_string(dim) + " S " +
                   std::to_string(states) + " shift " + std::to_string(shift));
      TestStack stack(order, 5, states, 2, dim, din, rng.base(), 0, shift);
      stack.fill_random(rng, -10.f, 10.f, 0.2);
      TestState got(5, 2, dim, dout, rng.base());
      TestState want(5, 2, dim, dout, got.base());
      EXPECT_TRUE(gpu_matches_cpu(
          got, want, [&](StateView o) { gpu::merge_states(stack.dev_view(), o); },
          [&](StateView o) { cpu::merge_states(stack.host_view(), o); }));
      if (states == 0) {  // FlashInfer's merge of no states: the empty state
        for (std::int64_t t = 0; t < 5; ++t)
          for (std::int64_t h = 0; h < 2; ++h) {
            EXPECT_EQ(got.lse(t, h), -INFINITY);
            for (std::int64_t d = 0; d < dim; ++d) EXPECT_EQ(got.o(t, h, d), 0.f);
          }
      }
    }
  }
}

TEST(CudaMergePeerFeatures, RaggedMergeAndRebaseTakeEveryHeadDim) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t dim : kDims) {
    const DType din = pick(rng), dout = pick(rng);
    SCOPED_TRACE(describe({din, dout}) + " head_dim " + std::to_string(dim));
    TestState rows(12, 3, dim, din, rng.base());
    rows.fill_random(rng, -8.f, 8.f, 0.2);
    const std::vector<std::int32_t> indptr = {0, 3, 3, 4, 9, 12};
    DeviceBuffer<std::int32_t> dindptr(indptr);
    TestState got(5, 3, dim, dout, rng.base());
    TestState want(5, 3, dim, dout, got.base());
    EXPECT_TRUE(gpu_matches_cpu(
        got, want,
        [&](StateView o) { gpu::merge_states_ragged(rows.dev_view(), dindptr.get(), o); },
        [&](StateView o) { cpu::merge_states_ragged(rows.host_view(), indptr.data(), o); }));
    TestState rb(12, 3, dim, dout, rng.base());
    TestState rb_want(12, 3, dim, dout, rb.base());
    EXPECT_TRUE(gpu_matches_cpu(
        rb, rb_want, [&](StateView o) { gpu::rebase(rows.dev_view(), o); },
        [&](StateView o) { cpu::rebase(rows.host_view(), o); }));
  }
}

TEST(CudaMergePeerFeatures, MaskedMergeStatePassesTheFirstStateThroughWhereTheMaskIsZero) {
  // vLLM's prefill with context: tokens past the context take the suffix alone. Out of place,
  // a token the mask leaves out gets `a` (converted to out's dtype and base, an empty row as
  // (0, -inf)); strides 1, 3 and 0 (one flag broadcast).
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t stride : {1, 3, 0, 0}) {
    for (std::int64_t dim : {64, 96, 100}) {
      const DType da = pick(rng), dout = pick(rng);
      SCOPED_TRACE("stride " + std::to_string(stride) + " head_dim " + std::to_string(dim));
      TestState a(9, 4, dim, da, rng.base());
      TestState b(9, 4, dim, DType::kBF16, rng.base());
      a.fill_random(rng, -5.f, 5.f, 0.2);
      b.fill_random(rng, -5.f, 5.f, 0.2);
      const Mask m(rng, 9, stride);
      TestState got(9, 4, dim, dout, rng.base());
      TestState want(9, 4, dim, dout, got.base());
      EXPECT_TRUE(gpu_matches_cpu(
          got, want, [&](StateView o) { gpu::merge_state(a.dev_view(), b.dev_view(), o, m.d()); },
          [&](StateView o) { cpu::merge_state(a.host_view(), b.host_view(), o, m.h()); }));
      // the rows left out are a's rows converted: rebase of a
      TestState a_only(9, 4, dim, dout, got.base());
      cpu::rebase(a.host_view(), a_only.host_view());
      for (std::int64_t t = 0; t < 9; ++t) {
        if (m.host[static_cast<std::size_t>(t * m.stride)] != 0) continue;
        for (std::int64_t h = 0; h < 4; ++h) {
          EXPECT_EQ(got.lse(t, h), a_only.lse(t, h));
          for (std::int64_t d = 0; d < dim; ++d) EXPECT_EQ(got.o(t, h, d), a_only.o(t, h, d));
        }
      }
    }
  }
}

TEST(CudaMergePeerFeatures, OutputsWithoutAnLseWriteTheSameOAndNoLse) {
  // vLLM's and SGLang's output_lse=None: merge_state and merge_states.
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t dim : {48, 128}) {
    TestState a(6, 3, dim, DType::kBF16, rng.base());
    TestState b(6, 3, dim, DType::kF16, rng.base());
    a.fill_random(rng, -5.f, 5.f, 0.2);
    b.fill_random(rng, -5.f, 5.f, 0.2);
    TestStack stack(StackOrder::kTokensMajor, 6, 4, 3, dim, DType::kBF16, rng.base());
    stack.fill_random(rng, -5.f, 5.f, 0.2);
    const std::function<void(StateView)> ops[] = {
        [&](StateView o) { gpu::merge_state(a.dev_view(), b.dev_view(), o); },
        [&](StateView o) { gpu::merge_states(stack.dev_view(), o); }};
    for (const auto& op : ops) {
      TestState with(6, 3, dim, DType::kBF16, LseBase::kNatural);
      TestState without(6, 3, dim, DType::kBF16, LseBase::kNatural);
      with.poison_device();
      without.poison_device();
      StateView no_lse = without.dev_view();
      no_lse.lse = nullptr;
      op(with.dev_view());
      op(no_lse);
      sync();
      with.download();
      without.download();
      for (std::int64_t t = 0; t < 6; ++t)
        for (std::int64_t h = 0; h < 3; ++h) {
          EXPECT_TRUE(std::isnan(without.lse(t, h)));  // still the poison
          for (std::int64_t d = 0; d < dim; ++d) {
            const float x = with.o(t, h, d), y = without.o(t, h, d);
            EXPECT_EQ(std::memcmp(&x, &y, 4), 0);
          }
        }
    }
  }
}

TEST(CudaMergePeerFeatures, RebaseWritesEmptyRowsAsZero) {
  // docs/numerics.md: all-empty input gives exactly (0, -inf), whatever the empty o held (the
  // test's empty rows hold NaN); out of place and in place.
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (std::int64_t dim : {7, 128}) {
    TestState in(10, 3, dim, DType::kBF16, LseBase::kBase2);
    in.fill_random(rng, -5.f, 5.f, 0.4);
    TestState out(10, 3, dim, DType::kF32, LseBase::kNatural);
    out.poison_device();
    gpu::rebase(in.dev_view(), out.dev_view());
    StateView same = in.dev_view();
    same.base = LseBase::kNatural;
    gpu::rebase(in.dev_view(), same);  // in place
    sync();
    out.download();
    in.download();
    for (std::int64_t t = 0; t < 10; ++t)
      for (std::int64_t h = 0; h < 3; ++h) {
        if (out.lse(t, h) != -INFINITY) continue;
        EXPECT_EQ(in.lse(t, h), -INFINITY);
        for (std::int64_t d = 0; d < dim; ++d) {
          EXPECT_EQ(out.o(t, h, d), 0.f);
          EXPECT_EQ(in.o(t, h, d), 0.f);
        }
      }
  }
}

TEST(CudaMergePeerFeatures, Fp8OutputWithAScaleAtOddHeadDims) {
  // vLLM's output_scale: the merge quantises in its store.
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType f8 : {DType::kE4M3, DType::kE5M2})
    for (std::int64_t dim : {48, 96, 100}) {
      SCOPED_TRACE(std::string(attnstate::to_string(f8)) + " head_dim " + std::to_string(dim));
      TestState a(5, 2, dim, DType::kBF16, rng.base());
      TestState b(5, 2, dim, DType::kBF16, rng.base());
      a.fill_random(rng, -5.f, 5.f, 0.2);
      b.fill_random(rng, -5.f, 5.f, 0.2);
      const std::int64_t bytes = 5 * 2 * dim;
      DeviceBuffer<std::uint8_t> o8(static_cast<std::size_t>(bytes));
      DeviceBuffer<float> lse(10);
      o8.poison();
      std::vector<std::uint8_t> h8(static_cast<std::size_t>(bytes));
      std::vector<float> hlse(10);
      StateView got = attnstate::make_state_view(o8.get(), f8, lse.get(), 5, 2, dim,
                                                 LseBase::kNatural, MemorySpace::kDevice);
      got.o_scale = 0.125f;
      StateView want = attnstate::make_state_view(h8.data(), f8, hlse.data(), 5, 2, dim,
                                                  LseBase::kNatural, MemorySpace::kHost);
      want.o_scale = 0.125f;
      gpu::merge_state(a.dev_view(), b.dev_view(), got);
      sync();
      cpu::merge_state(a.host_view(), b.host_view(), want);
      const std::vector<std::uint8_t> g8 = o8.download();
      // one rounding apart at most (fp32 sums in another order round alike almost always)
      int off = 0;
      for (std::size_t i = 0; i < h8.size(); ++i) off += g8[i] != h8[i];
      EXPECT_LE(off, static_cast<int>(h8.size() / 50)) << off << " bytes differ";
    }
}

TEST(CudaMergePeerFeatures, BadMasksAreNamed) {
  ATTNSTATE_REQUIRE_GPU();
  TestState a(4, 2, 96, DType::kBF16, LseBase::kNatural);
  TestState out(4, 2, 96, DType::kBF16, LseBase::kNatural);
  DeviceBuffer<std::uint8_t> m(4);
  expect_named_error(
      [&] { gpu::merge_state(a.dev_view(), a.dev_view(), out.dev_view(), TokenMask(m.get(), -1)); },
      Status::kInvalidArgument, "mask.stride", "attnstate::cuda::merge_state");
  const StateView o = out.dev_view();
  expect_named_error(
      [&] {
        gpu::merge_state_inplace(o, a.dev_view(),
                                 TokenMask(static_cast<const std::uint8_t*>(o.o), 1));
      },
      Status::kInvalidArgument, "mask", "attnstate::cuda::merge_state_inplace");
  StateView acc = out.dev_view();
  acc.lse = nullptr;  // an in-place accumulator is an input too: its LSE is required
  expect_named_error([&] { gpu::merge_state_inplace(acc, a.dev_view()); }, Status::kInvalidArgument,
                     "acc.lse");
}

}  // namespace
}  // namespace attnstate_test
