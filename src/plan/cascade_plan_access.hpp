/// @file cascade_plan_access.hpp
/// @brief The one way into a `cuda::CascadeChoice`'s (and a `cuda::CascadePlan`'s) recorded
///        data: the planner (`plan::plan_cascade`, `cuda::plan_cascade`) writes it and the runner
///        reads it. Plain C++ for the choices; the plan's decode plan only where
///        attnstate/cuda/cascade.hpp is included first. Tests may forge a plan's fingerprint to
///        see it refused; users read a plan through its accessors.
#pragma once

#include "attnstate/cuda/cascade_plan.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

struct CascadePlanAccess {
  static CascadeChoiceData& data(CascadeChoice& plan) { return plan.d_; }
  static const CascadeChoiceData& data(const CascadeChoice& plan) { return plan.d_; }
  /// The decode plan of a `CascadePlan` (`P` = `CascadePlan`: a template, so this header needs
  /// no CUDA header).
  template <typename P>
  static auto& last_decode(P& plan) {
    return plan.last_decode_;
  }
};

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
