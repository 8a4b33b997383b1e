/// @file testing.hpp
/// @brief Umbrella header of the testing kit `attnstate::testing` (GoogleTest adapters are in
///        `attnstate/testing/gtest.hpp`).
#pragma once

#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/host_tensor.hpp"
#include "attnstate/testing/mla.hpp"
#include "attnstate/testing/problem.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"
