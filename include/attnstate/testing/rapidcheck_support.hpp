/// @file rapidcheck_support.hpp
/// @brief Helpers for writing RapidCheck properties over states: assertion macros with
///        descriptive failures, and a default case count for a test executable.
#pragma once

#include <rapidcheck.h>

#include <string>

#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace attnstate {
namespace testing {

/// Adds `params` (RapidCheck configuration keys, e.g. `"max_success=500"`) to the `RC_PARAMS`
/// environment variable, keeping every key the user already set there (the user's value wins).
/// Must run before RapidCheck reads its configuration, i.e. before the first property runs;
/// `ATTNSTATE_RC_DEFAULT_PARAMS` does that from a static initializer.
/// @param params  space-separated `key=value` items.
/// @return true when `RC_PARAMS` was changed.
bool add_default_rc_params(const std::string& params);

/// The number of cases RapidCheck runs per property in this process (`max_success`).
/// @return `max_success` of RapidCheck's configuration. `check_state_kernel` does not use it
///         (its case count is `KernelCheckOptions::num_tests`).
int rc_max_success();

}  // namespace testing
}  // namespace attnstate

/// @cond INTERNAL
#define ATTNSTATE_RC_CAT2(a, b) a##b
#define ATTNSTATE_RC_CAT(a, b) ATTNSTATE_RC_CAT2(a, b)
/// @endcond

/// Sets default RapidCheck parameters for the whole test executable (unless `RC_PARAMS`
/// already sets those keys), e.g. `ATTNSTATE_RC_DEFAULT_PARAMS("max_success=500");` at
/// namespace scope in one source file of the executable. `max_success` sets the case count of
/// `RC_GTEST_PROP` / `rc::check` properties, not of `check_state_kernel` (which runs
/// `KernelCheckOptions::num_tests` cases per law); a `seed` set this way is used by
/// `check_state_kernel` when `KernelCheckOptions::seed` is 0.
#define ATTNSTATE_RC_DEFAULT_PARAMS(params)                                    \
  static const bool ATTNSTATE_RC_CAT(attnstate_rc_default_params_, __LINE__) = \
      ::attnstate::testing::add_default_rc_params(params)

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
