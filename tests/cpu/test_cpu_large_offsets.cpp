/// @file test_cpu_large_offsets.cpp
/// @brief CPU merges address rows beyond 2^31 elements correctly (64-bit offsets): views whose
///        second token starts 2^31 elements into a 4 GiB buffer. Only the touched pages of the
///        buffers are ever committed by the operating system.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>

#include "attnstate/cpu/merge.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace {

using namespace attnstate;

constexpr std::int64_t kFar = std::int64_t{1} << 31;  // elements between the two tokens
constexpr std::int64_t kDim = 128;

/// A lazily committed buffer of `kFar + kDim` bf16 elements (default-initialised: untouched).
std::unique_ptr<bfloat16_t[]> far_buffer() {
  return std::unique_ptr<bfloat16_t[]>(new bfloat16_t[static_cast<std::size_t>(kFar + kDim)]);
}

StateView far_view(bfloat16_t* o, float* lse, LseBase base) {
  StateView v = make_state_view(o, DType::kBF16, lse, 2, 1, kDim, base);
  v.o_stride_token = kFar;  // token 1 lives 2^31 elements after token 0
  return v;
}

TEST(CpuMergeLargeOffsets, PairwiseMergeReachesRowsBeyond2To31Elements) {
  auto oa = far_buffer(), ob = far_buffer(), oo = far_buffer();
  float la[2] = {1.5f, -0.25f}, lb[2] = {0.5f * constants::kLog2e, 2.f * constants::kLog2e};
  float lo[2] = {NAN, NAN};
  std::mt19937 rng(31);
  std::normal_distribution<float> normal;
  for (std::int64_t t = 0; t < 2; ++t)
    for (std::int64_t d = 0; d < kDim; ++d) {
      oa[t * kFar + d] = from_float<bfloat16_t>(normal(rng));
      ob[t * kFar + d] = from_float<bfloat16_t>(normal(rng));
      oo[t * kFar + d] = from_float<bfloat16_t>(NAN);  // poisoned
    }
  const StateView a = far_view(oa.get(), la, LseBase::kNatural);
  const StateView b = far_view(ob.get(), lb, LseBase::kBase2);
  const StateView out = far_view(oo.get(), lo, LseBase::kNatural);
  cpu::merge_state(a, b, out);

  // Against the kit's double reference: the LSE within 1e-5, o within 1e-2 (1 + |o|).
  attnstate::testing::Tolerance tol;
  tol.o_abs = 1e-2;
  tol.o_rel = 1e-2;
  tol.lse_abs = 1e-5;
  const auto host = [](const StateView& v) { return attnstate::testing::HostState::from_view(v); };
  EXPECT_EQ(attnstate::testing::compare_states(
                host(out),
                attnstate::testing::reference_merge({host(a), host(b)}, LseBase::kNatural), tol),
            "");
}

}  // namespace
