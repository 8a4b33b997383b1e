/// @file mla_cascade.hpp
/// @brief CUDA backend: the MLA cascade (shared latent prefixes), plan/run: the levels of a
///        cascade (`CascadeLevel`, core/cascade.hpp) over one paged latent pool (`MlaKvCache`,
///        core/mla.hpp), each level's latent tokens read once for all the requests that share a
///        segment.
///
/// Call shape: `plan_mla_cascade` (host, once per shape: every level's split layout from the
/// host lengths, the workspace size; no CUDA call) → allocate `plan.workspace_bytes()` of device
/// memory, 16-byte aligned (no initialisation) → `run_mla_cascade` (any number of times, on the
/// caller's stream: never allocates, never synchronises, capturable in a CUDA graph). One
/// workspace serves one run at a time.
///
/// What runs: per level, one launch of the MLA cascade level kernel, one CTA per (segment, tile
/// of 64 rows of the segment's requests, split): the rows of a segment are its requests'
/// `q_len × heads` rows one request after the other, so the requests sharing a segment share its
/// K/V tiles (16 heads at q_len 1: four requests per tile, the prefix read once for them). The
/// CTA runs the MLA decode's mainloop (576-column query tile, 32-key cp.async tiles, mma.sync,
/// online softmax in base 2) and writes its fp32 partial state to its slot of a stack in the
/// workspace; a split past its segment's writes the empty state. Then `merge_states` folds the
/// stack (every level's splits, in level then split order) into `out`; with sinks, into an fp32
/// state of the workspace, merged once with the sinks into `out` (`merge_state`). The last level
/// is causal over a request's `q_len` new tokens (with `CascadeOptions::causal`), the earlier
/// ones seen whole, as `cpu::mla_cascade`, the reference.
///
/// Device lengths may differ from the planned ones (the split of a segment is derived on the
/// device from its device length, clamped to its pages; page ids are clamped to the pool); the
/// batch, `num_segments` and the request grouping (`request_indptr`) must be the planned ones.
///
/// Limits (refused by name): those of the MLA decode (bf16 queries; widths 512 and 64; heads a
/// multiple of 16 up to 128; q_len 1..4; a bf16 latent part with a bf16 rotary part, or an fp8
/// latent part with a bf16 rotary part or one of its format; 16-byte aligned pools, strides and
/// query rows); plain attention (no window or soft cap).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/cuda/mla.hpp"

namespace attnstate {
namespace cuda {

/// The shape of an MLA cascade: the MLA decode's shape (the batch every level serves) and the
/// pool's geometry.
struct MlaCascadeProblem {
  MlaDecodeProblem mla;        ///< Batch, q_len (1..4), heads, widths and dtypes (as the decode).
  std::int64_t page_size = 0;  ///< Tokens per page of the pool (≥ 1).
  std::int64_t num_pages = 0;  ///< Pages in the pool (≥ 0).
};

class MlaCascadePlan;

namespace detail {

struct MlaCascadePlanAccess;

/// What an MLA cascade plan records (the planner writes it, the runner reads it).
struct MlaCascadePlanData {
  MlaCascadeProblem problem;
  float scale = 0.f;
  bool causal = true;
  int num_levels = 0;
  std::array<SplitLayout, kMaxCascadeLevels> splits{};       ///< Each level's split layout.
  std::array<std::int64_t, kMaxCascadeLevels> segments{};    ///< Each level's `num_segments`.
  std::array<int, kMaxCascadeLevels> row_tiles{};            ///< Row tiles of its largest segment.
  std::array<std::int64_t, kMaxCascadeLevels> first_slot{};  ///< Its first slot in the stack.
  std::int64_t num_slots = 0;  ///< Slots of the stack: the levels' `max_splits` summed.
  /// The catalog's fingerprint of the build that made the plan (0: no planner made it).
  std::uint64_t catalog_fingerprint = 0;
  int kernel_id = -1;  ///< The catalog row of the level kernel.
  int num_sms = 0;     ///< SMs planned for.
};

}  // namespace detail

/// An MLA cascade plan: everything `run_mla_cascade` needs besides the tensors (a small host
/// value). Only `plan_mla_cascade` makes one (a default-constructed plan is refused by name).
class MlaCascadePlan {
 public:
  MlaCascadePlan() = default;

  const MlaCascadeProblem& problem() const { return d_.problem; }  ///< The shape planned.
  int num_levels() const { return d_.num_levels; }                 ///< Levels planned.
  /// The split layout of level `l`.
  /// @throws Error (`kInvalidArgument`) naming `l` unless `0 ≤ l < num_levels()`.
  const SplitLayout& splits(int l) const;
  float scale() const { return d_.scale; }                 ///< Softmax scale (resolved: never 0).
  bool causal() const { return d_.causal; }                ///< Causal masking in the last level.
  int kernel_id() const { return d_.kernel_id; }           ///< The level kernel's catalog row.
  std::int64_t num_slots() const { return d_.num_slots; }  ///< States per row in the stack.
  /// The levels, kernel and splits, in words (for logs and benchmarks).
  std::string to_string() const;
  /// Bytes of device workspace `run_mla_cascade` needs: with `rows = batch · q_len · heads`, the
  /// fp32 stack `o (num_slots, rows, 512)` and its LSEs `(num_slots, rows)`, then the fp32 state
  /// `(rows, 512)` and LSEs the sinks' merge reads, and 512 zeros (the sinks' `o`): each section
  /// rounded up to 256 bytes.
  std::size_t workspace_bytes() const;

 private:
  friend struct detail::MlaCascadePlanAccess;
  detail::MlaCascadePlanData d_;
};

/// Plans an MLA cascade on the host (no CUDA call): each level's split layout (the MLA decode's
/// length-aware chooser over the level's segments, their host lengths, `num_sms` slots and the
/// row tiles of the largest segment), the scale, the catalog row and the workspace.
///
/// @param problem      the shape (`problem.mla` as `plan_mla_decode` takes it, `batch ≥ 1`;
///                     `page_size ≥ 1`, `num_pages ≥ 0`).
/// @param host_levels  `num_levels` levels whose arrays are in HOST memory, checked as
///                     `cpu::mla_cascade` checks them (`page_indices` against the pool when
///                     non-null).
/// @param num_levels   1..`kMaxCascadeLevels`.
/// @param options      scale (0 → `1/sqrt(kv_lora_rank + rope_dim)`), `causal`; the variant must
///                     be plain (`kNotSupported` naming `options.variant`).
/// @param num_sms      SMs of the device, ≥ 1.
/// @throws Error naming the argument on a violation (`kInvalidArgument`, `kNotSupported`).
MlaCascadePlan plan_mla_cascade(const MlaCascadeProblem& problem, const CascadeLevel* host_levels,
                                int num_levels, const CascadeOptions& options, int num_sms);

/// Runs a planned MLA cascade on `stream`: checks every argument (against the plan too), then
/// launches each level's kernel and the merge.
///
/// @param plan           from `plan_mla_cascade`.
/// @param q_nope         device latent queries `(batch, q_len, heads, 512)`, bf16, last dim
///                       contiguous, data 16-byte aligned, other strides multiples of 8.
/// @param q_pe           device rotary queries `(batch, q_len, heads, 64)`, likewise.
/// @param kv             device latent pool (`kv.space == kDevice`) of the planned dtypes,
///                       `page_size` and `num_pages`; its page-table fields are ignored.
/// @param device_levels  `num_levels` levels (a host array of structs) whose arrays are in
///                       DEVICE memory, with the planned `num_segments` and request grouping.
/// @param num_levels     `plan.num_levels()`.
/// @param out            device state `(batch·q_len, heads, 512)`, f32, f16 or bf16, either
///                       base, disjoint from every input and from the workspace.
/// @param workspace      device memory of at least `plan.workspace_bytes()`, 16-byte aligned.
/// @param workspace_bytes its size in bytes.
/// @param stream         the caller's stream.
/// @throws Error naming the argument on a violation (`kInvalidArgument`, `kNotSupported`,
///         `kWorkspaceTooSmall`), `kCudaError` when a launch fails.
void run_mla_cascade(const MlaCascadePlan& plan, const ConstTensorView& q_nope,
                     const ConstTensorView& q_pe, const MlaKvCache& kv,
                     const CascadeLevel* device_levels, int num_levels, StateView out,
                     void* workspace, std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// `run_mla_cascade` with attention sinks: each output row `(token, h)` is merged once with
/// `(0, sinks.logits[h])` after every level and split (a row with no keys gets
/// `(0, sinks.logits[h])`). `sinks.logits`: `heads` fp32 natural-base logits in device memory,
/// read when the merge runs; `sinks.none()`: exactly the overload above.
void run_mla_cascade(const MlaCascadePlan& plan, const ConstTensorView& q_nope,
                     const ConstTensorView& q_pe, const MlaKvCache& kv,
                     const CascadeLevel* device_levels, int num_levels, const AttentionSinks& sinks,
                     StateView out, void* workspace, std::size_t workspace_bytes,
                     cudaStream_t stream = nullptr);

}  // namespace cuda
}  // namespace attnstate
