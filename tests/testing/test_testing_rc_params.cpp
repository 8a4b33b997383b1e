/// @file test_testing_rc_params.cpp
/// @brief `add_default_rc_params` adds missing RapidCheck keys to `RC_PARAMS` and never
///        overrides a key the user set.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "attnstate/testing/rapidcheck_support.hpp"
#include "rc_defaults.hpp"

namespace {

using attnstate_test::add_default_rc_params;

/// Sets `RC_PARAMS` for one test and restores it afterwards.
class RcParamsEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("RC_PARAMS");
    had_ = env != nullptr;
    if (had_) saved_ = env;
  }
  void TearDown() override {
    if (had_) {
      setenv("RC_PARAMS", saved_.c_str(), 1);
    } else {
      unsetenv("RC_PARAMS");
    }
  }
  static std::string current() {
    const char* env = std::getenv("RC_PARAMS");
    return env ? env : "";
  }

 private:
  bool had_ = false;
  std::string saved_;
};

TEST_F(RcParamsEnv, AddsDefaultsWhenUnset) {
  unsetenv("RC_PARAMS");
  EXPECT_TRUE(add_default_rc_params("max_success=500"));
  EXPECT_EQ(current(), "max_success=500");
}

TEST_F(RcParamsEnv, KeepsUserKeysAndAppendsMissingOnes) {
  setenv("RC_PARAMS", "seed=42", 1);
  EXPECT_TRUE(add_default_rc_params("max_success=500"));
  EXPECT_EQ(current(), "seed=42 max_success=500");
}

TEST_F(RcParamsEnv, NeverOverridesAUserValue) {
  setenv("RC_PARAMS", "max_success=20 seed=1", 1);
  EXPECT_FALSE(add_default_rc_params("max_success=500"));
  EXPECT_EQ(current(), "max_success=20 seed=1");
}

TEST_F(RcParamsEnv, MatchesWholeKeysOnly) {
  setenv("RC_PARAMS", "xmax_success=3", 1);  // not the key max_success
  EXPECT_TRUE(add_default_rc_params("max_success=500"));
  EXPECT_EQ(current(), "xmax_success=3 max_success=500");
}

}  // namespace
