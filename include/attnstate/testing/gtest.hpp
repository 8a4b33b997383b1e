/// @file gtest.hpp
/// @brief GoogleTest adapters of the testing kit (header-only; include it from test code that
///        links GoogleTest).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace attnstate {
namespace testing {

/// `check_state_kernel(fn, options)` as a GoogleTest assertion result whose failure text is
/// the report's summary (failed laws, shrunk cases, seed).
/// @param fn       the kernel under test.
/// @param options  as for `check_state_kernel`.
/// @return success when every law in `options.laws` held, else a failure carrying the summary.
/// @throws attnstate::Error (`kInvalidArgument`) when `fn` is empty or `options` is invalid
///         (as `check_state_kernel`): GoogleTest then reports the test as failed with that
///         message, which names the field.
inline ::testing::AssertionResult kernel_conforms(const StateKernel& fn,
                                                  const KernelCheckOptions& options = {}) {
  const KernelCheckReport report = check_state_kernel(fn, options);
  if (report.passed()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << report.summary();
}

/// `compare_states` as a GoogleTest assertion result.
/// @tparam Expected  `HostState` or `ReferenceState`.
/// @param actual    the state under test.
/// @param expected  the expected state.
/// @param tol       the allowed error.
/// @return success when they match, else a failure listing the first mismatches.
template <class Expected>
::testing::AssertionResult states_close_assertion(const HostState& actual, const Expected& expected,
                                                  const Tolerance& tol) {
  const std::string msg = compare_states(actual, expected, tol);
  if (msg.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << msg;
}

}  // namespace testing
}  // namespace attnstate

/// `EXPECT`s that the kernel `fn` (a `StateKernel`) passes `check_state_kernel`; the optional
/// second argument is a `KernelCheckOptions`. On failure prints the report's summary.
#define ATTNSTATE_EXPECT_KERNEL_CONFORMS(...) \
  EXPECT_TRUE(::attnstate::testing::kernel_conforms(__VA_ARGS__))

/// `EXPECT`s that the `HostState` `actual` matches `expected` (`HostState` or `ReferenceState`)
/// within the `Tolerance` `tol`, printing the mismatches otherwise.
#define ATTNSTATE_EXPECT_STATES_CLOSE(actual, expected, tol) \
  EXPECT_TRUE(::attnstate::testing::states_close_assertion((actual), (expected), (tol)))
