/// @file decode.hpp
/// @brief CUDA backend: split-KV (Flash-Decoding) attention over a paged KV cache, plan/run.
///
/// Call shape: `plan_decode` (host, once per shape: picks the splits from the real lengths and
/// the SM count, sizes the workspace) → allocate `plan.workspace_bytes()` of device memory,
/// 16-byte aligned, and zero its tickets once (`init_decode_workspace`) → `run_decode` (any
/// number of times, on the caller's stream, never allocates, never synchronises, capturable in a
/// CUDA graph). A workspace belongs to one plan (initialise it again before using it with
/// another) and to one run at a time: two runs in flight on one workspace (two streams, or two
/// graphs replayed concurrently) race on its integer tickets, so give each stream or graph that
/// may run concurrently its own. For a CUDA graph, plan once at the maximum batch and lengths and
/// reuse that plan and its workspace (the size depends on the batch and the split layout). Calls
/// run on the current device, which must be the device of the stream and of every pointer; a null
/// stream is the legacy default stream (pass `cudaStreamPerThread` or your own stream in engines).
///
/// The kernel reads `seq_lens` and the page table on the device and derives each request's splits
/// from its device length (clamped to the pages the table gives it), so a plan made for maximum
/// lengths and batch replays correctly for shorter requests, fewer requests or empty ones
/// (`seq_len = 0` gives the empty state `(0, -inf)`).
///
/// Numerics, loads and kernels: docs/decode.md ("How it runs"). Requirements: `k`, `v` 16-byte
/// aligned and `page_elems()` a multiple of 8 elements.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/core/variant.hpp"

namespace attnstate {
namespace cuda {

/// How the split-KV kernel launches (`DecodePlan::split_launch`). Every configuration gives the
/// same bits; they differ in speed only.
struct DecodeSplitLaunch {
  /// `cp.async` pipeline depth per warp: 3, or 2 at head dim 128 (the short-split configuration:
  /// less shared memory, so one more CTA per SM overlaps the fixed costs of short splits).
  int stages = 3;
  /// CTAs per thread-block cluster: `splits.max_splits` (at most 8: the splits merge in
  /// distributed shared memory), a smaller divisor of it (the workspace merge, each group of
  /// consecutive splits sharing the last merge) or 1 (the workspace merge, or one split).
  int cluster = 1;
};

class DecodePlan;

namespace detail {

struct DecodePlanAccess;

/// What a decode plan records: the planner (`plan_decode`) writes it, the runner reads it
/// (through `DecodePlanAccess`, src/plan/decode_plan_access.hpp); users read a plan through
/// `DecodePlan`'s accessors.
struct DecodePlanData {
  DecodeProblem problem;
  SplitLayout splits;
  float scale = 0.f;
  AttentionVariant variant;
  bool programmatic_launch = false;
  /// The catalog's fingerprint of the build that made the plan (0: no planner made it).
  std::uint64_t catalog_fingerprint = 0;
  DecodeKernel kernel = DecodeKernel::kSplit;  ///< kSplit or kStreamed.
  /// The catalog row (kernel id) that runs at the planned batch: the streamed row, or the split
  /// row at `split.stages`.
  int kernel_id = -1;
  /// The split rows (the plan's dtypes and variant) at the default depth and at the short-split
  /// depth (-1 where the catalog holds none): the split kernel of a smaller batch, or the
  /// streamed row's fallback.
  int split_ids[2] = {-1, -1};
  DecodeSplitLaunch split;  ///< The split kernel's launch at the planned batch.
  int forced_stages = 0;    ///< `DecodeOptions::split_stages` (0: the planner's rule).
  int forced_cluster = 0;   ///< `DecodeOptions::split_cluster` (0: the planner's rule).
  int num_sms = 0;          ///< SMs planned for.
  int row_tiles = 1;        ///< Tiles of 16 query rows per KV head.
  std::uint8_t reason = 0;  ///< Why the kernel (`plan::DecodeReason`).
  /// Clusters of `c` CTAs (index `c`, 2..8) of the split kernel resident at once on the planned
  /// device, `[0]` at the default depth and `[1]` at the short-split one (0 for sizes the plan
  /// never uses): a smaller batch resolves its launch from them.
  int resident_clusters[2][9] = {};
};

}  // namespace detail

/// A decode plan: everything `run_decode` needs besides the tensors (a small host value). Only
/// `plan_decode` makes one (a default-constructed plan is refused by `run_decode`); it records
/// the split layout, the kernel (by its catalog id, with the catalog's fingerprint: a plan made
/// by a build with another kernel catalog is refused by name), the split kernel's launch and the
/// device facts a run of a smaller batch resolves its launch from. Its members are read-only:
/// the choices a caller may make go through `DecodeOptions` (checked when planning), so a run
/// checks only what can differ from the plan (tensors, strides, dtypes, lengths, the batch
/// against the planned one, the workspace).
class DecodePlan {
 public:
  DecodePlan() = default;

  const DecodeProblem& problem() const { return d_.problem; }  ///< The (maximum) shape planned.
  const SplitLayout& splits() const { return d_.splits; }  ///< How requests are cut into splits.
  float scale() const { return d_.scale; }                 ///< Softmax scale (resolved: never 0).
  /// The attention variant (`DecodeOptions::variant`): a sliding window and a logits soft cap,
  /// applied as the CPU backend does (docs/numerics.md). With a window the splits cut each
  /// request's keys from its first row's window start (rounded down to 16 keys) to its end, so a
  /// request costs its window, not its length. A plan with a variant runs the split kernel (never
  /// the streamed one); it cannot fold prior states (a cascade's last level).
  const AttentionVariant& variant() const { return d_.variant; }
  /// Launches as a programmatic dependent launch (`DecodeOptions::programmatic_launch`; sm_90
  /// and later, ignored before): its CTAs may be placed while the previous kernel of the stream
  /// finishes and each waits for that kernel to complete (its writes visible) before its first
  /// read; they let the next programmatic launch of the stream (e.g. the next layer's kernels)
  /// be placed early in turn. The same bits; only launch latency between chained kernels can be
  /// hidden (chained decode calls in a CUDA graph were measured no faster with it:
  /// bench/RESULTS.md). Graph capture keeps the programmatic edges.
  bool programmatic_launch() const { return d_.programmatic_launch; }
  /// The kernel: `kStreamed` or `kSplit`. The streamed kernel: each warp takes whole (request,
  /// KV head, row tile) items in turn, copying the next item's first tiles while it computes
  /// the current one's last (the per-request start-up of the split kernel is paid once per
  /// warp); chosen by the automatic policy when no request is split, the catalog holds a
  /// streamed instance for the problem (head dim 64 or 128, 16-bit caches; plain, or its variant
  /// instance for a window and a soft cap), no request is longer than 2048 keys (with a window:
  /// counted from its first row's window start) and there are at least 6 items per SM, or asked
  /// for with `DecodeOptions::kernel`. Results differ from the split kernel's only by rounding (one
  /// warp sums a request's tiles in key order); repeatable for a given plan. A run it does not
  /// apply to falls back to the split kernel as `split_launch` says: query rows not 16-byte
  /// aligned, page sizes that are not multiples of 16, or prior states folded in (a cascade's
  /// fold). It runs one CTA per SM (`num_sms`, fewer when there are fewer items).
  DecodeKernel kernel() const { return d_.kernel; }
  /// The catalog row (kernel id) that runs at the planned batch (docs/catalog.md).
  int kernel_id() const { return d_.kernel_id; }
  /// The split kernel's launch at the planned batch (the kernel when `kernel()` is `kSplit`, the
  /// fallback when it is `kStreamed`): the short-split depth when the splits are short (head dim
  /// 128, at most 256 tokens) and the grid exceeds one wave of the default depth, or when only it
  /// keeps every cluster of the cluster merge resident; the cluster merge when every cluster is
  /// resident at once; else the workspace merge in the largest groups that divide the split
  /// count and stay resident (each part replaced by `DecodeOptions::split_stages` /
  /// `split_cluster` when given). A run of fewer requests resolves it again by the same rule for
  /// its smaller grid, from the occupancy the plan recorded (no device query).
  DecodeSplitLaunch split_launch() const { return d_.split; }
  int num_sms() const { return d_.num_sms; }  ///< SMs the plan was made for.
  /// Tiles of 16 query rows per KV head: `ceil(q_len·group / 16)`.
  int row_tiles() const { return d_.row_tiles; }
  /// Which kernel runs and why, with its launch, in words (e.g. for logs and benchmarks).
  std::string to_string() const;

  /// Bytes of device workspace `run_decode` needs (0 when `splits().max_splits == 1`): fp32
  /// partial states `o (batch, heads_kv, row_tiles, max_splits, 16, head_dim)` and their base-2
  /// LSEs, plus one int32 ticket per (request, KV head, row tile), each section rounded up to 256
  /// bytes. With `tiles = batch · heads_kv · row_tiles` and `parts = tiles · max_splits · 16`:
  /// `round256(parts · head_dim · 4) + round256(parts · 4) + round256(tiles · 4)`; e.g. batch 1,
  /// 8 KV heads, 4 query heads per KV head, head_dim 128, 32 splits: 2,113,792 bytes. It depends
  /// on the planned batch and split layout (so on the planned lengths and, for `kAuto`, the SM
  /// count): plan at the maximum shape a graph will replay.
  std::size_t workspace_bytes() const;

 private:
  friend struct detail::DecodePlanAccess;
  detail::DecodePlanData d_;
};

/// Plans a decode on the host and records every choice in the plan (see `DecodePlan`). The first
/// plan with split requests for a head dim and dtype on a device queries that device (the current
/// one) for its occupancy, once: the facts are cached per device, so later plans make no CUDA
/// call (nor does a plan with one split per request or an empty batch), and the queries are not
/// stream operations (planning while a stream is captured is fine). Plan on the device the plan
/// runs on.
///
/// @param problem        shape: `batch ≥ 0`, `1 ≤ q_len ≤ 8`, `heads_q % heads_kv == 0` (any
///                       group; `q_len · group ≤ 16` rows share one pass over the KV, more rows
///                       use several row tiles), `head_dim ∈ {64, 128, 256}`,
///                       `q_dtype == kv_dtype ∈ {f16, bf16}` (others: `Status::kNotSupported`).
/// @param seq_lens_host  host array `(batch)`: the (maximum) lengths the plan must serve.
/// @param options        scale (0 → `1/sqrt(head_dim)`), split policy (see `SplitLayout`),
///                       variant, and the hand choices of the kernel and its launch (checked
///                       here: a choice the kernels do not support is refused naming its field,
///                       e.g. `options.split_cluster`).
/// @param num_sms        SMs of the device (`cudaDevAttrMultiProcessorCount`), ≥ 1.
/// @throws Error naming the argument on a violation (checked before any device query);
///         `kCudaError` when the occupancy query fails.
DecodePlan plan_decode(const DecodeProblem& problem, const std::int32_t* seq_lens_host,
                       const DecodeOptions& options, int num_sms);

/// Zeroes the ticket counters of a workspace on `stream` (one `cudaMemsetAsync`). Call once after
/// allocating the workspace (or after a failed run); every `run_decode` leaves them zero again.
/// A workspace serves one plan: where the counters lie depends on the plan, so a workspace that
/// another plan has used (e.g. after re-planning, or one buffer shared by several plans) must be
/// initialised again for this plan before its next `run_decode` (stream-ordered, outside any
/// graph that replays the other plan), or its split merges may never complete.
/// @param plan             the plan the workspace serves.
/// @param workspace        device memory of at least `plan.workspace_bytes()` (null if 0),
///                         16-byte aligned (checked by `run_decode`).
/// @param workspace_bytes  size of `workspace` in bytes.
/// @param stream           the caller's stream.
/// @throws Error (`kInvalidArgument`, `kWorkspaceTooSmall`, `kCudaError`).
void init_decode_workspace(const DecodePlan& plan, void* workspace, std::size_t workspace_bytes,
                           cudaStream_t stream = nullptr);

/// Runs a planned decode on `stream`: checks the arguments against the plan, then launches the
/// kernel the plan records, once (the streamed kernel, or the split kernel as
/// `plan.split_launch()` says; see `DecodePlan::kernel` for the streamed kernel's run-time
/// fallback). It checks what may differ from the plan: a plan made by `plan_decode` of this
/// build (the catalog's fingerprint), the tensors' pointers, strides, dtypes and shapes against
/// the planned problem, the batch against the planned one, the workspace's size and alignment.
///
/// Row `i` of request `b` (the `i`-th of its `q_len` new tokens, which are the last `q_len` of
/// its `seq_lens[b]` keys) attends to keys `[0, seq_lens[b] − q_len + i]`; when
/// `seq_lens[b] < q_len` the first `q_len − seq_lens[b]` rows see no key and get `(0, -inf)`.
///
/// @param plan       from `plan_decode`; `kv.batch` may be smaller than `plan.problem().batch`.
/// @param q          device queries `(batch, q_len, heads_q, head_dim)`, any strides with the last
///                   dim contiguous, dtype `plan.problem().q_dtype`.
/// @param kv         device paged cache (`kv.space == kDevice`): `k`, `v` 16-byte aligned,
///                   `page_elems()` a multiple of 8, CSR table or block table, device `seq_lens`.
///                   Lengths are clamped to the pages each request owns; page ids to the pool;
///                   a request whose CSR offsets are negative or decreasing has no keys.
/// @param out        device state `(batch·q_len, heads_q, head_dim)`, token `b·q_len + i`; any
///                   dtype, any base (written in `out.base`).
/// @param workspace  device memory of at least `plan.workspace_bytes()`, 16-byte aligned
///                   (`cudaMalloc` gives 256), initialised once with `init_decode_workspace`;
///                   may be null when that size is 0. Not shared with a run that may be in
///                   flight at the same time (another stream or graph): they race on its tickets.
/// @param workspace_bytes  size of `workspace` in bytes.
/// @param stream     the caller's stream.
/// @throws Error (`kInvalidArgument`, `kNotSupported`, `kWorkspaceTooSmall`, `kCudaError`).
void run_decode(const DecodePlan& plan, const ConstTensorView& q, const PagedKvCache& kv,
                StateView out, void* workspace, std::size_t workspace_bytes,
                cudaStream_t stream = nullptr);

/// `run_decode` with attention sinks, fused into the kernels' final merge: each output row
/// `(token, h)` is merged once with `(0, sinks.logits[h])` after every split, so `out` holds the
/// state of the keys plus the sink (see `AttentionSinks`, core/sink.hpp). A row with no keys gets
/// `(0, sinks.logits[h])`. `sinks.logits`: `heads_q` fp32 natural-base logits in device memory
/// (checked: host memory is refused), read when the kernels run (a captured graph reads the values
/// at replay; a NaN logit gives NaN rows of its head, as a NaN key does). `sinks.none()`: exactly
/// `run_decode` above. Other arguments as above.
void run_decode(const DecodePlan& plan, const ConstTensorView& q, const PagedKvCache& kv,
                const AttentionSinks& sinks, StateView out, void* workspace,
                std::size_t workspace_bytes, cudaStream_t stream = nullptr);

}  // namespace cuda
}  // namespace attnstate
