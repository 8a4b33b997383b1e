/// @file attnstate.hpp
/// @brief Umbrella header: the core types and math, cascade levels from a page table, the CPU
///        backend (merges, attention, decode, cascade) and, when the CUDA backend is linked
///        (`ATTNSTATE_HAS_CUDA`), its API.
#pragma once

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/cascade_levels.hpp"
#include "attnstate/core/checked.hpp"
#include "attnstate/core/config.hpp"
#include "attnstate/core/context_parallel.hpp"
#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/core/variant.hpp"
#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/context_parallel.hpp"
#include "attnstate/cpu/decode.hpp"
#include "attnstate/cpu/merge.hpp"
#include "attnstate/cpu/mla.hpp"

#if defined(ATTNSTATE_HAS_CUDA)
#include "attnstate/cuda/cascade.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"
#include "attnstate/cuda/merge.hpp"
#include "attnstate/cuda/mla.hpp"
#include "attnstate/cuda/mla_cascade.hpp"
#endif
