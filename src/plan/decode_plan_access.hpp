/// @file decode_plan_access.hpp
/// @brief The one way into a `cuda::DecodePlan`'s recorded data: the planner (`plan_decode`)
///        writes it and the runners (`run_decode`, the cascade's decode level) read it. Included
///        by the CUDA units and by tests (which may forge a plan's fingerprint to see it
///        refused); users read a plan through its accessors.
#pragma once

#include "attnstate/cuda/decode.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

struct DecodePlanAccess {
  static DecodePlanData& data(DecodePlan& plan) { return plan.d_; }
  static const DecodePlanData& data(const DecodePlan& plan) { return plan.d_; }
};

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
