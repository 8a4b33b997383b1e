/// @file test_plan_compiled.cpp
/// @brief The one list of compiled head dims and dtypes (src/common/compiled.hpp, fed by
///        ATTNSTATE_CUDA_HEAD_DIMS) against the checks that read it and the one dispatch
///        (src/common/dispatch.hpp). No CUDA, no GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>

#include "attnstate/core/error.hpp"
#include "common/compiled.hpp"
#include "common/dispatch.hpp"
#include "plan/cascade_plan.hpp"
#include "plan/decode_plan.hpp"

namespace {

using attnstate::DecodeProblem;
using attnstate::DType;
using attnstate::Error;
using attnstate::Status;
namespace compiled = attnstate::compiled;
namespace plan = attnstate::plan;

DecodeProblem problem(std::int64_t head_dim) {
  DecodeProblem p;
  p.batch = 1;
  p.q_len = 1;
  p.heads_kv = 1;
  p.heads_q = 4;
  p.head_dim = head_dim;
  p.q_dtype = p.kv_dtype = DType::kBF16;
  return p;
}

/// The error of the decode's check for `head_dim` ("" when it passes).
std::string decode_error(std::int64_t head_dim, Status* status) {
  try {
    plan::check_decode_problem("test", problem(head_dim));
  } catch (const Error& e) {
    *status = e.status();
    return e.what();
  }
  *status = Status::kSuccess;
  return "";
}

TEST(Compiled, EachOperationCompilesWhatItSupportsOfTheBuildList) {
  for (int d : {64, 128, 256, 512}) {
    const bool built = compiled::contains(compiled::BuildHeadDims{}, d);
    EXPECT_EQ(compiled::contains(compiled::MergeHeadDims{}, d), built) << d;
    EXPECT_EQ(compiled::contains(compiled::DecodeHeadDims{}, d), built && d <= 256) << d;
    EXPECT_EQ(compiled::contains(compiled::CascadeHeadDims{}, d), built && d <= 256) << d;
    EXPECT_EQ(plan::cascade_head_dim_supported(d), built && d <= 256) << d;
    EXPECT_EQ(plan::decode_head_dim_supported(d), built && d <= 256) << d;
  }
  EXPECT_EQ(std::size(plan::kDecodeHeadDims), compiled::DecodeHeadDims::size());
}

TEST(Compiled, DecodeChecksNameTheList) {
  const std::string list = compiled::list_string(compiled::DecodeHeadDims{});
  for (int d : {64, 128, 256, 96, 512}) {
    Status st = Status::kSuccess;
    const std::string what = decode_error(d, &st);
    if (compiled::contains(compiled::DecodeHeadDims{}, d)) {
      EXPECT_EQ(st, Status::kSuccess) << d << ": " << what;
    } else {
      EXPECT_EQ(st, Status::kNotSupported) << d;
      EXPECT_NE(what.find("expected " + list + ", got " + std::to_string(d)), std::string::npos)
          << what;
    }
  }
}

TEST(Compiled, DecodeHeadDim256WhenNotCompiled) {
  if (compiled::contains(compiled::DecodeHeadDims{}, 256))
    GTEST_SKIP() << "head dim 256 is compiled (ATTNSTATE_CUDA_HEAD_DIMS lists it)";
  Status st = Status::kSuccess;
  const std::string what = decode_error(256, &st);
  EXPECT_EQ(st, Status::kNotSupported);
  EXPECT_NE(what.find("'problem.head_dim'"), std::string::npos) << what;
  EXPECT_NE(what.find(compiled::list_string(compiled::DecodeHeadDims{})), std::string::npos)
      << what;
}

TEST(Compiled, DispatchCallsTheInstanceOrNamesTheList) {
  using L = compiled::IntList<64, 128, 256>;
  int got = 0;
  compiled::dispatch("fn", "head_dim", 128, L{}, [&](auto d) { got = decltype(d)::value; });
  EXPECT_EQ(got, 128);
  try {
    compiled::dispatch("fn", "head_dim", 96, L{}, [&](auto) { got = -1; });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported);
    EXPECT_NE(std::string(e.what()).find("'head_dim': expected 64, 128 or 256, got 96"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(got, 128);
  bool bf16 = false;
  compiled::dispatch_storage("fn", "dtype", DType::kBF16, compiled::DecodeDTypes{}, [&](auto t) {
    bf16 = std::is_same_v<decltype(t), attnstate::bfloat16_t>;
  });
  EXPECT_TRUE(bf16);
  try {
    compiled::dispatch("fn", "dtype", DType::kF32, compiled::DecodeDTypes{}, [](auto) {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported);
    EXPECT_NE(std::string(e.what()).find("expected f16 or bf16, got f32"), std::string::npos)
        << e.what();
  }
}

}  // namespace
