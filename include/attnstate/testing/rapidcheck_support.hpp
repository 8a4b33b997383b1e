/// @file rapidcheck_support.hpp
/// @brief Helpers for writing RapidCheck properties over states: assertion macros with
///        descriptive failures, and the case count RapidCheck runs (its configuration comes from
///        the `RC_PARAMS` environment variable, which RapidCheck reads; the kit reads none).
#pragma once

#include <rapidcheck.h>

#include <string>

#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace attnstate {
namespace testing {

/// The number of cases RapidCheck runs per property in this process (`max_success`).
/// @return `max_success` of RapidCheck's configuration. `check_state_kernel` does not use it
///         (its case count is `KernelCheckOptions::num_tests`).
int rc_max_success();

}  // namespace testing
}  // namespace attnstate

/// Inside a RapidCheck property: fails the case, with a description of the mismatches, unless
/// `actual` (a `HostState`) matches `expected` (a `HostState` or `ReferenceState`) within `tol`.
#define ATTNSTATE_RC_ASSERT_STATES_CLOSE(actual, expected, tol)                \
  do {                                                                         \
    const std::string attnstate_rc_msg_ =                                      \
        ::attnstate::testing::compare_states((actual), (expected), (tol));     \
    if (!attnstate_rc_msg_.empty())                                            \
      RC_FAIL(std::string(#actual " vs " #expected ": ") + attnstate_rc_msg_); \
  } while (0)

/// Inside a RapidCheck property: fails the case unless the two `HostState`s are bitwise equal.
#define ATTNSTATE_RC_ASSERT_BITWISE_EQUAL(a, b)                                                  \
  do {                                                                                           \
    const std::string attnstate_rc_msg_ = ::attnstate::testing::compare_bitwise((a), (b));       \
    if (!attnstate_rc_msg_.empty()) RC_FAIL(std::string(#a " vs " #b ": ") + attnstate_rc_msg_); \
  } while (0)
