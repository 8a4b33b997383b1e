/// @file cascade.hpp
/// @brief CUDA backend: cascade (shared-prefix) attention over a paged KV pool, plan/run.
///
/// Call shape: `plan_cascade` (host, from the shapes, the host copies of the level arrays, the
/// SM count and the current device's facts: picks a row tile, a KV split and the kernel per
/// level, sizes the fp32 workspace) → allocate `plan.workspace_bytes()` of device memory (no
/// initialisation: the tickets of a last level on the split-KV decode are zeroed by `run_cascade`
/// itself, one `cudaMemsetAsync` per call) → `run_cascade` (any number of times, on the caller's
/// stream; never allocates, never synchronises, capturable in a CUDA graph). One workspace serves
/// one run at a time: give each stream or graph that may run concurrently its own. Calls run on
/// the current device, which must be the device of the stream and of every pointer; a null
/// stream is the legacy default stream.
///
/// How it runs (kernels per level, the fold of the states, numerics): docs/cascade.md.
///
/// Device lengths may differ from the planned ones (e.g. a graph replayed as suffixes grow):
/// the split of a segment is derived on the device from its device length (the last split takes
/// any excess), lengths are clamped to the segment's pages and page ids to the pool. The request
/// grouping (`request_indptr`) and `num_segments` must be the planned ones.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/cuda/cascade_plan.hpp"
#include "attnstate/cuda/decode.hpp"

namespace attnstate {
namespace cuda {

/// A cascade plan: everything `run_cascade` needs besides the tensors (a small host value): the
/// choices (`CascadeChoice`, read through its accessors) and the decode plan of a decode last
/// level. Only `plan_cascade` makes one; `run_cascade` refuses a default-constructed plan and one
/// of another kernel catalog (another build) by name.
class CascadePlan : public CascadeChoice {
 public:
  /// The decode plan of the last level when it runs on the split-KV decode (see
  /// `CascadeTuning::decode_last_level`; a default-constructed plan otherwise); its workspace
  /// follows the partial states.
  const DecodePlan& last_decode() const { return last_decode_; }
  /// Bytes of device workspace `run_cascade` needs: fp32 partial states
  /// `(num_slots, rows, head_dim)` and their LSEs `(num_slots, rows)`, then the workspace of
  /// `last_decode` when the last level runs on the decode; 256-byte aligned sections.
  std::size_t workspace_bytes() const;

 private:
  friend struct detail::CascadePlanAccess;
  DecodePlan last_decode_;
};

/// Plans a cascade for the current device (host; reads the host level arrays). Its only CUDA
/// calls gather that device's facts, once per device (which code the runtime loaded for it,
/// whether the driver encodes tensor maps): the plan records the kernel of every level, so
/// `run_cascade` makes no device query (run the plan on the device it was made for; the choices:
/// docs/internals.md, "Cascade").
///
/// @param shape        the problem shape (see `CascadeShape`).
/// @param host_levels  `num_levels` levels whose arrays are in HOST memory: `request_indptr`,
///                     `page_indptr` and `seg_lens` are read (the lengths the plan serves);
///                     `page_indices` is checked against the pool when non-null.
/// @param num_levels   1..kMaxCascadeLevels.
/// @param options      scale (0 → `1/sqrt(head_dim)`) and causal masking (see `CascadeOptions`).
/// @param num_sms      SMs of the device (`cudaDevAttrMultiProcessorCount`), ≥ 1.
/// @param tuning       optional overrides of the tile and split choices.
/// @throws Error `kInvalidArgument` naming the argument, or `kNotSupported` naming `head_dim`
///         or `dtype`; `kCudaError` when the device facts cannot be queried.
CascadePlan plan_cascade(const CascadeShape& shape, const CascadeLevel* host_levels, int num_levels,
                         const CascadeOptions& options, int num_sms,
                         const CascadeTuning& tuning = {});

/// Runs a planned cascade on `stream`: every level, then the merge, which a last level on the
/// split-KV decode performs itself (see the file comment).
///
/// @param plan           from `plan_cascade`.
/// @param q              device queries `(batch, q_len, heads_q, head_dim)`, dtype
///                       `plan.shape.dtype`, last dim contiguous, 16-byte aligned rows.
/// @param kv             device pool (`kv.space == kDevice`) of the planned shape: `k`, `v`
///                       16-byte aligned, `page_elems()` a multiple of 8, NHD or HND; its
///                       page-table fields are ignored.
/// @param device_levels  `num_levels` levels (a host array of structs) whose arrays are in
///                       DEVICE memory, with the planned `num_segments` and request grouping.
/// @param num_levels     `plan.num_levels`.
/// @param out            device state `(batch · q_len, heads_q, head_dim)`, token `b·q_len + t`;
///                       any dtype, any base (written in `out.base`).
/// @param workspace      device memory of at least `plan.workspace_bytes()`; 16-byte aligned
///                       (checked), 256-byte aligned recommended (as `cudaMalloc` returns; the
///                       sections inside are laid out at 256-byte offsets). Needs no
///                       initialisation: the tickets of a decode last level are zeroed on
///                       `stream` at the start of every call. Not shared with a run that may be
///                       in flight at the same time (another stream or graph).
/// @param workspace_bytes its size.
/// @param stream         the caller's stream.
/// @throws Error (`kInvalidArgument`, `kWorkspaceTooSmall`, `kCudaError`).
void run_cascade(const CascadePlan& plan, const ConstTensorView& q, const PagedKvCache& kv,
                 const CascadeLevel* device_levels, int num_levels, StateView out, void* workspace,
                 std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// `run_cascade` with attention sinks, fused into the final merge (the merge kernel, or the decode
/// last level's output step): each output row `(token, h)` is merged once with
/// `(0, sinks.logits[h])` after every level and split; the levels' partial states stay
/// sink-free. `sinks.logits`: `heads_q` fp32 natural-base logits in device memory (checked),
/// read when the kernels run. `sinks.none()`: exactly `run_cascade` above.
void run_cascade(const CascadePlan& plan, const ConstTensorView& q, const PagedKvCache& kv,
                 const CascadeLevel* device_levels, int num_levels, const AttentionSinks& sinks,
                 StateView out, void* workspace, std::size_t workspace_bytes,
                 cudaStream_t stream = nullptr);

/// One stage of `run_cascade`: the partial states of level `level` (for profiling). Every level
/// followed by `run_cascade_merge` gives the result of `run_cascade` up to rounding (a decode
/// level run alone writes its own state to its workspace slot, and the merge then folds it).
/// Arguments as in `run_cascade`. A shared level of a windowed plan (`window_left() >= 0`) is
/// refused (`kNotSupported`, naming `plan`): its rows are placed by every level's lengths, which
/// `run_cascade` reads.
void run_cascade_level(const CascadePlan& plan, int level, const ConstTensorView& q,
                       const PagedKvCache& kv, const CascadeLevel& device_level, void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// The last stage of `run_cascade`: merges the partial states of every level into `out`.
/// Arguments as in `run_cascade`.
void run_cascade_merge(const CascadePlan& plan, StateView out, const void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// `run_cascade_merge` with the sinks applied in it (the one merge that may carry them).
void run_cascade_merge(const CascadePlan& plan, const AttentionSinks& sinks, StateView out,
                       const void* workspace, std::size_t workspace_bytes,
                       cudaStream_t stream = nullptr);

}  // namespace cuda
}  // namespace attnstate
