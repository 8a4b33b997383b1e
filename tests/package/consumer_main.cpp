// A consumer of the attnstate package: merges two states and checks the result.
#include <cmath>
#include <cstdio>

#include "attnstate/attnstate.hpp"

int main() {
  // Two single-key states (o = v_i, lse = s_i) in different bases; their merge is softmax-weighted.
  float oa[2] = {1.f, 0.f}, ob[2] = {0.f, 1.f}, out_o[2] = {0.f, 0.f};
  float lse_a = 1.f;                                 // natural log
  float lse_b = 2.f * attnstate::constants::kLog2e;  // base 2: the same mass as e^2
  float out_lse = 0.f;
  using attnstate::DType;
  using attnstate::LseBase;
  auto a = attnstate::make_const_state_view(oa, DType::kF32, &lse_a, 1, 1, 2, LseBase::kNatural);
  auto b = attnstate::make_const_state_view(ob, DType::kF32, &lse_b, 1, 1, 2, LseBase::kBase2);
  auto out = attnstate::make_state_view(out_o, DType::kF32, &out_lse, 1, 1, 2, LseBase::kNatural);
  attnstate::cpu::merge_state(a, b, out);
  const double wa = std::exp(1.0) / (std::exp(1.0) + std::exp(2.0));
  const bool ok = std::fabs(out_o[0] - wa) < 1e-6 && std::fabs(out_o[1] - (1 - wa)) < 1e-6 &&
                  std::fabs(out_lse - std::log(std::exp(1.0) + std::exp(2.0))) < 1e-5;
  std::printf("consumer: o = (%.6f, %.6f), lse = %.6f: %s\n", out_o[0], out_o[1], out_lse,
              ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
