/// @file attnstate.hpp
/// @brief Umbrella header: the core types and math, and the CPU backend.
#pragma once

#include "attnstate/core/config.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/merge.hpp"
