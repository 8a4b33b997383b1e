/// @file context_parallel.hpp
/// @brief The context-parallel merge of every rank of a plan, run in one process on the host:
///        the same packing, head slicing and merges as `dist::cp_merge` over NCCL, with the
///        collectives' byte movement done in memory. For tests of an engine's context-parallel
///        wiring without several GPUs, and as the reference of the distributed run.
#pragma once

#include <vector>

#include "attnstate/core/context_parallel.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace cpu {

/// Merges the ranks' states as `plans.size()` ranks would over the collectives of
/// `plans[0].shape.algorithm`, every rank's phases run here in rank order between the
/// exchanges. Rank `r` reads `locals[r]` (its state of every head, any base and strides, dtype
/// `shape.dtype`) and writes `outs[r]` (its heads, or every head with `CpOutput::kReplicated`;
/// dtype `shape.out_dtype`, any base). With kAllToAll, `outs[r]` is bitwise the `merge_states`
/// of the ranks' states (converted to `shape.wire_base`) over rank `r`'s heads.
/// @param plans   one plan per rank, `plans[r].shape.rank == r`, every other field equal.
/// @param locals  `plans.size()` host states.
/// @param outs    `plans.size()` host states, disjoint from every input.
/// @param sinks   optional per-head natural-base sink logits (`shape.heads` of them, host),
///                merged once into every output row after the merge across ranks.
/// @throws Error(kInvalidArgument) naming the argument: `plans` empty or of a size other than
///         `plans[0].shape.world_size`, a plan of another rank or shape, `locals[r]` or `outs[r]`
///         not fitting the plan, overlapping buffers, a non-finite sink logit.
void cp_merge_simulated(const std::vector<CpMergePlan>& plans,
                        const std::vector<ConstStateView>& locals,
                        const std::vector<StateView>& outs, AttentionSinks sinks = {});

}  // namespace cpu
}  // namespace attnstate
