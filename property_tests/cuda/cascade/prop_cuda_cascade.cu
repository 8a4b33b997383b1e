/// @file prop_cuda_cascade.cu
/// @brief Property on the GPU: for random problems, CUDA cascade attention over a random level
///        structure (and random tile, split and decode-fold choices) equals plain attention over
///        each request's concatenated KV. Skips without a GPU.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include "attnstate/cuda/cascade.hpp"
#include "cascade_case.hpp"
#include "cascade_gen.hpp"
#include "cuda_cascade_runner.hpp"
#include "cuda_test_utils.hpp"

namespace {

TEST(CudaCascadeProperty, CascadeEqualsAttentionOverTheConcatenation) {
  ATTNSTATE_REQUIRE_GPU();
  const bool ok = rc::check("cuda cascade == attention over the concatenation", [] {
    const attnstate_test::CaseSpec spec = *attnstate_test::gen_case_spec(40, 300);
    const attnstate_test::CascadeCase c(spec);
    attnstate::cuda::CascadeTuning t;
    t.tile_rows = *rc::gen::element(0, 16, 64, 128);
    t.chunk = *rc::gen::element(0, 64, 192);
    t.kernel = *rc::gen::element(attnstate::cuda::CascadeKernel::kAuto,
                                 attnstate::cuda::CascadeKernel::kMma,
                                 attnstate::cuda::CascadeKernel::kWgmma);
    t.decode_fold = *rc::gen::element(-1, 0, 1);  // how a decode last level meets the others
    const auto out_dt = *rc::gen::element(attnstate::DType::kF32, attnstate::DType::kBF16);
    const auto base = *rc::gen::element(attnstate::LseBase::kNatural, attnstate::LseBase::kBase2);
    const int sms = *rc::gen::element(0, 3, 132);
    attnstate_test::GpuCascade g(c, out_dt, base, t, sms);
    g.run();
    RC_ASSERT(static_cast<bool>(g.check(c)));
  });
  EXPECT_TRUE(ok);
}

}  // namespace
