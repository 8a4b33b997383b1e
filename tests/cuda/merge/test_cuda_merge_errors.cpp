/// @file test_cuda_merge_errors.cpp
/// @brief Argument errors of the CUDA merges: each names the offending argument, carries the
///        right status, and leaves the output untouched.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cuda/merge.hpp"
#include "merge_test_support.hpp"

namespace attnstate_test {
namespace {

namespace gpu = attnstate::cuda;
using attnstate::Status;

/// Expects `f()` to throw attnstate::Error with `status` and a message naming `arg`.
template <class F>
void expect_error(F&& f, Status status, const std::string& arg) {
  expect_named_error(f, status, arg);
}

class CudaMergeErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_available()) GTEST_SKIP() << "no CUDA device";
    a_ = std::make_unique<TestState>(4, 2, 128, DType::kBF16, LseBase::kNatural);
    b_ = std::make_unique<TestState>(4, 2, 128, DType::kF32, LseBase::kBase2);
    out_ = std::make_unique<TestState>(4, 2, 128, DType::kBF16, LseBase::kNatural);
    Rng rng;
    a_->fill_random(rng);
    b_->fill_random(rng);
    out_->poison_device();
  }
  /// The output is still all NaN (nothing was written).
  void expect_untouched() {
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
    out_->download();
    for (std::int64_t t = 0; t < out_->tokens(); ++t)
      for (std::int64_t h = 0; h < out_->heads(); ++h) {
        ASSERT_TRUE(std::isnan(out_->lse(t, h)));
        ASSERT_TRUE(std::isnan(out_->o(t, h, 0)));
      }
  }
  std::unique_ptr<TestState> a_, b_, out_;
};

TEST_F(CudaMergeErrors, HostViewIsRejected) {
  expect_error([&] { gpu::merge_state(a_->host_view(), b_->dev_view(), out_->dev_view()); },
               Status::kInvalidArgument, "a.space");
  expect_error([&] { gpu::merge_state(a_->dev_view(), b_->dev_view(), out_->host_view()); },
               Status::kInvalidArgument, "out.space");
  expect_error([&] { gpu::rebase(a_->host_view(), out_->dev_view()); }, Status::kInvalidArgument,
               "in.space");
  TestStack stack(StackOrder::kTokensMajor, 4, 3, 2, 128, DType::kBF16, LseBase::kNatural);
  expect_error([&] { gpu::merge_states(stack.host_view(), out_->dev_view()); },
               Status::kInvalidArgument, "states.space");
  expect_untouched();
}

TEST_F(CudaMergeErrors, NullPointersAreRejected) {
  StateView a = a_->dev_view();
  a.o = nullptr;
  expect_error([&] { gpu::merge_state(a, b_->dev_view(), out_->dev_view()); },
               Status::kInvalidArgument, "a.o");
  StateView b = b_->dev_view();
  b.lse = nullptr;
  expect_error([&] { gpu::merge_state(a_->dev_view(), b, out_->dev_view()); },
               Status::kInvalidArgument, "b.lse");
  StateView o = out_->dev_view();
  o.o = nullptr;
  expect_error([&] { gpu::merge_state_inplace(o, b_->dev_view()); }, Status::kInvalidArgument,
               "acc.o");
  expect_error([&] { gpu::merge_states_ragged(a_->dev_view(), nullptr, out_->dev_view()); },
               Status::kInvalidArgument, "indptr");
  expect_untouched();
}

TEST_F(CudaMergeErrors, ShapeMismatchesAreRejected) {
  TestState wide(4, 3, 128, DType::kBF16, LseBase::kNatural);
  expect_error([&] { gpu::merge_state(a_->dev_view(), wide.dev_view(), out_->dev_view()); },
               Status::kInvalidArgument, "b.heads");
  TestState longer(5, 2, 128, DType::kBF16, LseBase::kNatural);
  expect_error([&] { gpu::merge_state(a_->dev_view(), b_->dev_view(), longer.dev_view()); },
               Status::kInvalidArgument, "out.tokens");
  TestState narrow(4, 2, 64, DType::kBF16, LseBase::kNatural);
  DeviceBuffer<std::int32_t> indptr(std::vector<std::int32_t>{0, 1, 2, 3, 4});
  expect_error([&] { gpu::merge_states_ragged(narrow.dev_view(), indptr.get(), out_->dev_view()); },
               Status::kInvalidArgument, "rows.head_dim");
  StateView neg = out_->dev_view();
  neg.o_stride_head = -1;
  expect_error([&] { gpu::merge_state(a_->dev_view(), b_->dev_view(), neg); },
               Status::kInvalidArgument, "out.o_stride_head");
  expect_untouched();
}

TEST_F(CudaMergeErrors, PartialAliasingIsRejected) {
  StateView shifted = a_->dev_view();
  shifted.o = static_cast<attnstate::bfloat16_t*>(shifted.o) + 8;
  shifted.tokens = 3;
  StateView a3 = a_->dev_view();
  a3.tokens = 3;
  StateView b3 = b_->dev_view();
  b3.tokens = 3;
  expect_error([&] { gpu::merge_state(a3, b3, shifted); }, Status::kInvalidArgument, "out.o");
  TestStack stack(StackOrder::kTokensMajor, 4, 2, 2, 128, DType::kBF16, LseBase::kNatural);
  StateView into_stack = out_->dev_view();
  into_stack.o = const_cast<void*>(stack.dev_view().o);
  expect_error([&] { gpu::merge_states(stack.dev_view(), into_stack); }, Status::kInvalidArgument,
               "out.o");
}

TEST_F(CudaMergeErrors, InvalidDtypeAndBaseAreRejected) {
  StateView bad = a_->dev_view();
  bad.dtype = static_cast<DType>(7);
  expect_error([&] { gpu::merge_state(bad, b_->dev_view(), out_->dev_view()); },
               Status::kInvalidArgument, "a.dtype");
  StateView badb = out_->dev_view();
  badb.base = static_cast<LseBase>(9);
  expect_error([&] { gpu::rebase(a_->dev_view(), badb); }, Status::kInvalidArgument, "out.base");
  expect_untouched();
}

}  // namespace
}  // namespace attnstate_test
