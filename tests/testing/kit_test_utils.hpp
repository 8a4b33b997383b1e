/// @file kit_test_utils.hpp
/// @brief Helpers shared by the testing kit's own tests.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>

#include "attnstate/core/error.hpp"

namespace attnstate_test {

/// Runs `call`, which must throw `attnstate::Error(kInvalidArgument)`; returns its message.
inline std::string invalid_argument_message(const std::function<void()>& call) {
  try {
    call();
  } catch (const attnstate::Error& e) {
    EXPECT_EQ(e.status(), attnstate::Status::kInvalidArgument) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

}  // namespace attnstate_test
