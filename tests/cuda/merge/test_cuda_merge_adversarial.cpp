/// @file test_cuda_merge_adversarial.cpp
/// @brief The adversarial matrix of the CUDA merges: empty and all-empty states, NaN in an
///        empty state's `o`, NaN in a non-empty input, LSEs of ±1e4, mixed bases.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "attnstate/cpu/merge.hpp"
#include "attnstate/cuda/merge.hpp"
#include "compiled_dims.hpp"
#include "merge_test_support.hpp"

namespace attnstate_test {
namespace {

namespace cpu = attnstate::cpu;
namespace gpu = attnstate::cuda;

void sync() { ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize()); }

/// Makes every row of `s` empty: lse = -inf and o = NaN (which must never be read).
void make_empty(TestState& s) {
  for (std::int64_t t = 0; t < s.tokens(); ++t)
    for (std::int64_t h = 0; h < s.heads(); ++h) {
      s.set_lse(t, h, -INFINITY);
      for (std::int64_t d = 0; d < s.head_dim(); ++d) s.set_o(t, h, d, NAN);
    }
  s.upload();
}

/// Expects every row of `s` to be exactly (+0, -inf).
void expect_identity(const TestState& s) {
  for (std::int64_t t = 0; t < s.tokens(); ++t)
    for (std::int64_t h = 0; h < s.heads(); ++h) {
      EXPECT_EQ(s.lse(t, h), -INFINITY) << t << "," << h;
      for (std::int64_t d = 0; d < s.head_dim(); ++d) {
        const float o = s.o(t, h, d);
        ASSERT_TRUE(o == 0.f && !std::signbit(o))
            << "o[" << t << "," << h << "," << d << "] = " << o;
      }
    }
}

TEST(CudaMergeAdversarial, EmptyStateWithNanOPassesTheOtherThroughBitwise) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType dt : all_dtypes())
    for (std::int64_t dim : attnstate_test::merge_head_dims()) {
      TestState a(6, 5, dim, dt, LseBase::kNatural);
      a.fill_random(rng);
      TestState e(6, 5, dim, dt, LseBase::kNatural);
      make_empty(e);
      TestState out(6, 5, dim, dt, LseBase::kNatural);
      for (int order = 0; order < 2; ++order) {
        out.poison_device();
        if (order == 0)
          gpu::merge_state(a.dev_view(), e.dev_view(), out.dev_view());
        else
          gpu::merge_state(e.dev_view(), a.dev_view(), out.dev_view());
        sync();
        out.download();
        EXPECT_TRUE(rows_bitwise_equal(out, a)) << "pair, order " << order;
      }
      // The n-ary merge of [a, empty, empty] is a too.
      TestStack stack(attnstate::StackOrder::kStatesMajor, 6, 3, 5, dim, dt, LseBase::kNatural);
      stack.fill_random(rng, -1.f, 1.f, 1.0);  // all empty, o = NaN
      for (std::int64_t t = 0; t < 6; ++t)
        for (std::int64_t h = 0; h < 5; ++h) {
          stack.set_lse(t, 1, h, a.lse(t, h));
          for (std::int64_t d = 0; d < dim; ++d) stack.set_o(t, 1, h, d, a.o(t, h, d));
        }
      stack.upload();
      out.poison_device();
      gpu::merge_states(stack.dev_view(), out.dev_view());
      sync();
      out.download();
      EXPECT_TRUE(rows_bitwise_equal(out, a)) << "stack " << attnstate::to_string(dt);
    }
}

TEST(CudaMergeAdversarial, AllEmptyGivesTheIdentity) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  for (DType dt : all_dtypes()) {
    TestState a(4, 3, 128, dt, LseBase::kBase2);
    TestState b(4, 3, 128, dt, LseBase::kNatural);
    make_empty(a);
    make_empty(b);
    TestState out(4, 3, 128, dt, LseBase::kNatural);
    out.poison_device();
    gpu::merge_state(a.dev_view(), b.dev_view(), out.dev_view());
    sync();
    out.download();
    expect_identity(out);

    TestStack stack(attnstate::StackOrder::kTokensMajor, 4, 9, 3, 128, dt, LseBase::kBase2);
    stack.fill_random(rng, 0.f, 1.f, 1.0);
    out.poison_device();
    gpu::merge_states(stack.dev_view(), out.dev_view());
    sync();
    out.download();
    expect_identity(out);

    // Ragged: tokens without rows, and tokens whose rows are all empty.
    const std::vector<std::int32_t> indptr = {0, 0, 3, 3, 5};
    DeviceBuffer<std::int32_t> dindptr(indptr);
    TestState rows(5, 3, 128, dt, LseBase::kNatural);
    make_empty(rows);
    out.poison_device();
    gpu::merge_states_ragged(rows.dev_view(), dindptr.get(), out.dev_view());
    sync();
    out.download();
    expect_identity(out);
  }
}

TEST(CudaMergeAdversarial, NanInANonEmptyInputPropagates) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  TestState a(3, 2, 64, DType::kF32, LseBase::kNatural);
  TestState b(3, 2, 64, DType::kF32, LseBase::kNatural);
  a.fill_random(rng);
  b.fill_random(rng, -3.f, 3.f);
  a.set_o(0, 1, 17, NAN);                // NaN in o of a non-empty input
  b.set_lse(2, 0, NAN);                  // NaN LSE
  b.set_lse(1, 1, a.lse(1, 1) - 200.f);  // weight underflows to 0, but its o is NaN
  b.set_o(1, 1, 5, NAN);
  a.upload();
  b.upload();
  TestState out(3, 2, 64, DType::kF32, LseBase::kNatural);
  out.poison_device();
  gpu::merge_state(a.dev_view(), b.dev_view(), out.dev_view());
  sync();
  out.download();
  EXPECT_TRUE(std::isnan(out.o(0, 1, 17)));
  EXPECT_FALSE(std::isnan(out.o(0, 1, 16)));
  EXPECT_TRUE(std::isnan(out.lse(2, 0)));
  EXPECT_TRUE(std::isnan(out.o(2, 0, 0)));
  EXPECT_TRUE(std::isnan(out.o(1, 1, 5)));
  EXPECT_FALSE(std::isnan(out.o(1, 1, 4)));
  // Every element against the CPU (NaN exactly where it has one): the spot checks above leave
  // whole rows unchecked, and an unwritten (poisoned) row would pass the NaN ones.
  TestState want(3, 2, 64, DType::kF32, LseBase::kNatural);
  cpu::merge_state(a.host_view(), b.host_view(), want.host_view());
  EXPECT_TRUE(states_close(out, want));

  TestStack stack(attnstate::StackOrder::kTokensMajor, 2, 5, 2, 128, DType::kBF16,
                  LseBase::kNatural);
  stack.fill_random(rng);
  stack.set_o(0, 3, 1, 100, NAN);
  stack.set_lse(1, 4, 0, NAN);
  stack.upload();
  TestState sout(2, 2, 128, DType::kBF16, LseBase::kNatural);
  sout.poison_device();
  gpu::merge_states(stack.dev_view(), sout.dev_view());
  sync();
  sout.download();
  EXPECT_TRUE(std::isnan(sout.o(0, 1, 100)));
  EXPECT_FALSE(std::isnan(sout.o(0, 1, 99)));
  EXPECT_FALSE(std::isnan(sout.lse(0, 1)));
  EXPECT_TRUE(std::isnan(sout.lse(1, 0)));
  EXPECT_FALSE(std::isnan(sout.lse(1, 1)));
  TestState swant(2, 2, 128, DType::kBF16, LseBase::kNatural);
  cpu::merge_states(stack.host_view(), swant.host_view());
  EXPECT_TRUE(states_close(sout, swant));
}

TEST(CudaMergeAdversarial, InvalidLseBesideAnEmptyStateGivesNaN) {
  // +inf or NaN LSE merged with an empty state: NaN in o and lse, as the n-ary merge and the CPU
  // give (a pass-through would hide FlashAttention's +inf rows without keys).
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType dt : {DType::kF32, DType::kBF16}) {
    TestState a(4, 2, 128, dt, LseBase::kNatural);
    TestState b(4, 2, 128, dt, LseBase::kNatural);
    a.fill_random(rng);
    b.fill_random(rng);
    make_empty(b);
    a.set_lse(0, 0, INFINITY);
    a.set_lse(1, 1, NAN);
    b.set_lse(2, 1, a.lse(2, 1));  // one ordinary row, for contrast
    for (int d = 0; d < 128; ++d) b.set_o(2, 1, d, 0.25f);
    a.set_lse(3, 0, -INFINITY);
    b.set_lse(3, 0, INFINITY);  // the invalid side second
    a.upload();
    b.upload();
    TestState out(4, 2, 128, dt, LseBase::kNatural);
    out.poison_device();
    gpu::merge_state(a.dev_view(), b.dev_view(), out.dev_view());
    sync();
    out.download();
    for (auto [t, h] : {std::pair<int, int>{0, 0}, {1, 1}, {3, 0}}) {
      EXPECT_TRUE(std::isnan(out.lse(t, h))) << t << "," << h;
      EXPECT_TRUE(std::isnan(out.o(t, h, 7))) << t << "," << h;
    }
    TestState want(4, 2, 128, dt, LseBase::kNatural);
    cpu::merge_state(a.host_view(), b.host_view(), want.host_view());
    EXPECT_TRUE(states_close(out, want));
    TestStack stack(attnstate::StackOrder::kTokensMajor, 4, 2, 2, 128, dt, LseBase::kNatural);
    for (int t = 0; t < 4; ++t)
      for (int h = 0; h < 2; ++h) {
        stack.set_lse(t, 0, h, a.lse(t, h));
        stack.set_lse(t, 1, h, b.lse(t, h));
        for (int d = 0; d < 128; ++d) {
          stack.set_o(t, 0, h, d, a.o(t, h, d));
          stack.set_o(t, 1, h, d, b.o(t, h, d));
        }
      }
    stack.upload();
    out.poison_device();
    gpu::merge_states(stack.dev_view(), out.dev_view());
    sync();
    out.download();
    EXPECT_TRUE(states_close(out, want));
  }
}

TEST(CudaMergeAdversarial, HugeLsesMatchCpuAndStayFinite) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (float centre : {1e4f, -1e4f}) {
    TestStack stack(attnstate::StackOrder::kStatesMajor, 8, 6, 4, 128, DType::kF32,
                    LseBase::kNatural);
    stack.fill_random(rng, centre - 30.f, centre + 30.f, 0.2);
    TestState got(8, 4, 128, DType::kF32, LseBase::kBase2);
    TestState want(8, 4, 128, DType::kF32, LseBase::kBase2);
    got.poison_device();
    gpu::merge_states(stack.dev_view(), got.dev_view());
    sync();
    got.download();
    cpu::merge_states(stack.host_view(), want.host_view());
    EXPECT_TRUE(states_close(got, want)) << "centre " << centre;
    for (std::int64_t t = 0; t < 8; ++t)
      for (std::int64_t h = 0; h < 4; ++h)
        if (!std::isinf(want.lse(t, h))) {
          EXPECT_TRUE(std::isfinite(got.o(t, h, 0)));
        }

    TestState a(8, 4, 128, DType::kBF16, LseBase::kBase2);
    TestState b(8, 4, 128, DType::kF16, LseBase::kNatural);
    a.fill_random(rng, centre - 5.f, centre + 5.f);
    b.fill_random(rng, -centre - 5.f, -centre + 5.f);  // one side at +1e4, the other at -1e4
    TestState pg(8, 4, 128, DType::kF32, LseBase::kNatural);
    TestState pw(8, 4, 128, DType::kF32, LseBase::kNatural);
    pg.poison_device();
    gpu::merge_state(a.dev_view(), b.dev_view(), pg.dev_view());
    sync();
    pg.download();
    cpu::merge_state(a.host_view(), b.host_view(), pw.host_view());
    EXPECT_TRUE(states_close(pg, pw)) << "pair, centre " << centre;
  }
}

TEST(CudaMergeAdversarial, MixedBasesGiveTheSameStateAsOneBase) {
  ATTNSTATE_REQUIRE_GPU();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  // a in base 2 and b in natural log, merged into base 2, equals both in natural log merged
  // into natural log, up to the base conversion of the LSE.
  TestState a(10, 3, 256, DType::kF32, LseBase::kBase2);
  TestState b(10, 3, 256, DType::kF32, LseBase::kNatural);
  a.fill_random(rng, -10.f, 10.f, 0.1);
  b.fill_random(rng, -10.f, 10.f, 0.1);
  TestState a_nat(10, 3, 256, DType::kF32, LseBase::kNatural);
  a_nat.poison_device();
  gpu::rebase(a.dev_view(), a_nat.dev_view());
  TestState mixed(10, 3, 256, DType::kF32, LseBase::kBase2);
  TestState nat(10, 3, 256, DType::kF32, LseBase::kNatural);
  mixed.poison_device();
  nat.poison_device();
  gpu::merge_state(a.dev_view(), b.dev_view(), mixed.dev_view());
  gpu::merge_state(a_nat.dev_view(), b.dev_view(), nat.dev_view());
  TestState mixed_nat(10, 3, 256, DType::kF32, LseBase::kNatural);
  mixed_nat.poison_device();
  gpu::rebase(mixed.dev_view(), mixed_nat.dev_view());
  sync();
  mixed_nat.download();
  nat.download();
  EXPECT_TRUE(states_close(mixed_nat, nat));
  // Both against the CPU merge of the mixed-base inputs: the two GPU results alone would agree
  // on a row both leave unwritten (NaN).
  TestState want(10, 3, 256, DType::kF32, LseBase::kNatural);
  cpu::merge_state(a.host_view(), b.host_view(), want.host_view());
  EXPECT_TRUE(states_close(nat, want));
  EXPECT_TRUE(states_close(mixed_nat, want));
  // And a mislabelled base changes the result (the tag is honoured).
  StateView wrong = a.dev_view();
  wrong.base = LseBase::kNatural;
  TestState w(10, 3, 256, DType::kF32, LseBase::kNatural);
  w.poison_device();
  gpu::merge_state(wrong, b.dev_view(), w.dev_view());
  sync();
  w.download();
  EXPECT_FALSE(states_close(w, nat));
  // ...to what the CPU gives for the same mislabelled input (not merely to an unwritten NaN).
  StateView wrong_host = a.host_view();
  wrong_host.base = LseBase::kNatural;
  TestState want_w(10, 3, 256, DType::kF32, LseBase::kNatural);
  cpu::merge_state(wrong_host, b.host_view(), want_w.host_view());
  EXPECT_TRUE(states_close(w, want_w));
}

}  // namespace
}  // namespace attnstate_test
