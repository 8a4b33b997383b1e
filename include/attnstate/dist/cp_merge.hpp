/// @file cp_merge.hpp
/// @brief Context-parallel merge across GPUs over NCCL: each rank holds the attention state of
///        its shard of the keys, and `cp_merge` gives each rank the merged state
///        `⊕_rank state(q, KV shard of rank)` of its heads (or of every head), by the algorithm
///        of its plan (`CpAlgorithm`, core/context_parallel.hpp). The `dist` component
///        (`attnstate::dist`), built when NCCL and the CUDA backend are found.
///
/// One call per rank, on the caller's communicator and stream: the packing kernels, the NCCL
/// collectives and the merge kernels are queued on `stream`; nothing allocates or synchronises,
/// so the call can be captured in a CUDA graph (NCCL 2.9+ supports capture). See
/// docs/context_parallel.md.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>

#include "attnstate/core/context_parallel.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace dist {

/// Checks, once before the first `cp_merge`, that every rank of `comm` made its plan for the same
/// merge and that `comm` is the communicator the plans describe: the ranks' shapes are
/// all-gathered over `comm` and compared. A collective (every rank must call it) that
/// synchronises `stream`; not for the run path or graph capture.
/// @param plan    this rank's plan.
/// @param comm    the communicator the merges will use.
/// @param stream  the stream the all-gather is queued on (then synchronised).
/// @throws Error(kInvalidArgument) naming `comm` (null, or its size differs from
///         `plan.shape.world_size`), `plan.shape.rank` (not this rank's rank in `comm`) or
///         `plans[r].shape.<field>` (rank r planned another merge); Error(kCudaError) when an
///         NCCL or CUDA call fails.
void check_cp_plans(const CpMergePlan& plan, ncclComm_t comm, cudaStream_t stream);

/// This rank's context-parallel merge of `local` with the states of the other ranks of `comm`.
/// Every rank calls it with its plan, in the same order relative to its other NCCL calls.
/// @param plan             this rank's plan (`plan_cp_merge`).
/// @param local            this rank's state of every head (`plan.shape.tokens` rows,
///                         `plan.shape.heads` heads, dtype `plan.shape.dtype`, any base and
///                         strides), device memory. A row without keys in this rank's shard is
///                         the empty state (`lse = -inf`; its `o` is never read).
/// @param out              the merged state: the heads this rank owns
///                         (`[plan.head_begin(rank), plan.head_end(rank))`) with
///                         `CpOutput::kHeadSharded`, every head with kReplicated; dtype
///                         `plan.shape.out_dtype`, any base; device memory disjoint from every
///                         input and from the workspace.
/// @param comm             the communicator (`world_size` ranks, this rank `plan.shape.rank`).
/// @param workspace        `plan.workspace_bytes` of device memory, 256-byte aligned; its
///                         contents between calls do not matter.
/// @param workspace_bytes  its size.
/// @param stream           the caller's stream.
/// @param sinks            optional per-head sink logits (`plan.shape.heads` fp32, natural base,
///                         device memory), merged once into `out` after the merge across ranks.
/// @throws Error(kInvalidArgument) naming the argument (`plan`, `local.*`, `out.*`, `comm`,
///         `workspace`, `sinks.logits`), Error(kWorkspaceTooSmall) naming `workspace_bytes`,
///         Error(kCudaError) when an NCCL or CUDA call fails.
void cp_merge(const CpMergePlan& plan, ConstStateView local, StateView out, ncclComm_t comm,
              void* workspace, std::size_t workspace_bytes, cudaStream_t stream,
              AttentionSinks sinks = {});

}  // namespace dist
}  // namespace attnstate
