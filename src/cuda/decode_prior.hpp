/// @file decode_prior.hpp
/// @brief Internal entry of the split-KV decode that folds prior attention states into its
///        output: the cascade's unique last level merges the shared levels' partial states in
///        the decode's own merge step instead of a separate merge launch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/cuda/decode.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// States computed before the decode, merged into each of its output rows: `count` states per
/// row, fp32 `o` `(count, rows, head_dim)` normalised, LSEs `(count, rows)` in base 2, row
/// `token · heads_q + head` (the decode's output rows); empty states (`lse = -inf`) contribute
/// nothing. Device memory, 16-byte aligned.
struct PriorStates {
  const float* o = nullptr;    ///< `(count, rows, head_dim)`.
  const float* lse = nullptr;  ///< `(count, rows)`, base 2.
  int count = 0;               ///< States per row; 0 = none.
  std::int64_t rows = 0;       ///< Rows per state, at least `batch · q_len · heads_q`.
  /// Launch beside the previous kernel of the stream (a programmatic dependent launch that never
  /// waits for it: the decode must read nothing that kernel writes; `count` must be 0). The grid
  /// still completes only after that kernel, so a later launch sees the results of both.
  bool beside_previous = false;
  /// Attention sinks (`AttentionSinks::logits`): `heads_q` natural-base logits in device memory,
  /// merged into each output row once, after the prior states; null = none (checked by
  /// `check_device_sinks`).
  const float* sinks = nullptr;
};

/// Throws (naming `fn` and `sinks.logits`) unless the sinks are none, or `heads_q` fp32 logits
/// in device or managed memory, 4-byte aligned, disjoint from `out` and from the `workspace`
/// bytes the call writes. Their values are read by the kernels, not here.
void check_device_sinks(const char* fn, const AttentionSinks& sinks, std::int64_t heads_q,
                        const StateView& out, const void* workspace, std::size_t workspace_bytes);

/// Throws (naming `fn` and `kv.k_scale.data` or `kv.v_scale.data`) unless each scale pointer of
/// `kv` is null or device or managed memory: the fp8 kernels read the scales when they run.
void check_kv_scales_readable(const char* fn, const PagedKvCache& kv);

/// Every check of `run_decode_with_prior` with the same arguments, in the same order, and no
/// launch: lets the cascade find a bad decode level before it queues its shared levels.
/// @throws Error as `run_decode_with_prior` would.
void check_decode_with_prior(const DecodePlan& plan, const ConstTensorView& q,
                             const PagedKvCache& kv, StateView out, void* workspace,
                             std::size_t workspace_bytes, const PriorStates& prior);

/// The launch of `run_decode_with_prior` without its checks: only for arguments that passed
/// `check_decode_with_prior` (the cascade checks its decode level once, before its shared
/// levels, then launches it after them). `workspace_bytes` was checked there.
void launch_decode_with_prior(const DecodePlan& plan, const ConstTensorView& q,
                              const PagedKvCache& kv, StateView out, void* workspace,
                              const PriorStates& prior, cudaStream_t stream);

/// `run_decode` with `prior` folded into the output state: the output is the merge of the
/// decode's state over the request's keys with the row's prior states. Same checks as
/// `run_decode`, plus `prior` (non-null aligned pointers and enough rows when `count > 0`):
/// `check_decode_with_prior`, then `launch_decode_with_prior`.
void run_decode_with_prior(const DecodePlan& plan, const ConstTensorView& q, const PagedKvCache& kv,
                           StateView out, void* workspace, std::size_t workspace_bytes,
                           const PriorStates& prior, cudaStream_t stream);

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
