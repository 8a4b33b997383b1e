/// @file prop_cpu_cascade.cpp
/// @brief Property: for random problems, cascade attention over a random level structure equals
///        plain attention over each request's concatenated KV (CPU; the GPU variant lives in
///        prop_cuda_cascade.cu).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/cpu/cascade.hpp"
#include "cascade_case.hpp"
#include "cascade_gen.hpp"

namespace {

// 500 cases unless the caller's RC_PARAMS sets max_success (other keys, e.g. a seed, are kept;
// RapidCheck reads RC_PARAMS at its first check).
const bool kDefaultCases = [] {
  const char* env = std::getenv("RC_PARAMS");
  const std::string current = env != nullptr ? env : "";
  if (current.find("max_success=") != std::string::npos) return false;
  const std::string merged = current.empty() ? "max_success=500" : current + " max_success=500";
  return setenv("RC_PARAMS", merged.c_str(), 1) == 0;
}();

using attnstate::DType;
using attnstate::LseBase;
using attnstate::MemorySpace;

RC_GTEST_PROP(CascadeProperty, CpuCascadeEqualsAttentionOverTheConcatenation, ()) {
  const attnstate_test::CaseSpec spec = *attnstate_test::gen_case_spec(/*max_batch=*/6,
                                                                       /*max_len=*/70);
  const attnstate_test::CascadeCase c(spec);
  const DType out_dt = *rc::gen::element(DType::kF32, DType::kF16, DType::kBF16);
  const LseBase base = *rc::gen::element(LseBase::kNatural, LseBase::kBase2);
  std::vector<std::uint8_t> o_raw(c.out_elems() * attnstate::size_of(out_dt), 0xFF);
  std::vector<float> lse(c.lse_elems(), std::numeric_limits<float>::quiet_NaN());
  auto out = attnstate::make_state_view(o_raw.data(), out_dt, lse.data(), c.tokens(), spec.heads_q,
                                        spec.head_dim, base);
  const auto levels = c.host_levels();
  attnstate::cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                                    c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost),
                                    levels.data(), static_cast<int>(levels.size()), c.options(),
                                    out);
  double tol = 5e-5;
  if (out_dt == DType::kBF16) tol += 4e-3;
  if (out_dt == DType::kF16) tol += 5e-4;
  const auto res = attnstate_test::matches_reference(
      c, attnstate_test::decode(o_raw.data(), out_dt, c.out_elems()), lse, base, tol, 2e-4);
  RC_ASSERT(static_cast<bool>(res));
}

}  // namespace
