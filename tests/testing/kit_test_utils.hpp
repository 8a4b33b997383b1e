/// @file kit_test_utils.hpp
/// @brief Helpers shared by the testing kit's own tests.
#pragma once

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

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

/// Draws `n` values of `gen` at growing sizes (`i % 101`), from a fixed seed: a reproducible
/// sample of what a generator produces.
template <class T>
std::vector<T> sample_values(const rc::Gen<T>& gen, int n, std::uint64_t seed) {
  std::vector<T> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(
        gen(rc::Random(seed * 1000003u + static_cast<std::uint64_t>(i)), i % 101).value());
  }
  return out;
}

}  // namespace attnstate_test
