/// @file cascade.hpp
/// @brief CUDA backend: cascade (shared-prefix) attention over a paged KV pool, plan/run.
///
/// Call shape: `plan_cascade` (host only, from the shapes, the host copies of the level arrays
/// and the SM count: picks a row tile and a KV split per level, sizes the fp32 workspace) →
/// allocate `plan.workspace_bytes()` of device memory (no initialisation: its only integer
/// tickets, those of a last level on the split-KV decode, are zeroed by `run_cascade` itself at
/// the start of every call, one `cudaMemsetAsync`) → `run_cascade` (any number of times, on the
/// caller's stream; never allocates, never synchronises, capturable in a CUDA graph). One
/// workspace serves one run at a time: give each stream or graph that may run concurrently its
/// own. Calls run on the current device, which must be the device of the stream and of every
/// pointer; a null stream is the legacy default stream.
///
/// How it runs. For every level one kernel launch: a CTA takes one segment, one KV head, one tile
/// of query rows and one KV split of the segment. The rows of a tile are the queries of ALL the
/// requests sharing the segment (requests × new tokens × the GQA group's query heads), so each
/// page of a shared segment is read from memory once per tile, not once per request. `QKᵀ` and
/// `PV` run on tensor cores, bf16/f16 operands, fp32 accumulation, the probabilities rounded to
/// the KV dtype as the `PV` operand:
/// - bf16, head_dim 128, tiles of 64/128 rows on sm_90, page sizes with a bulk-copy box (8, 16,
///   32, 64 or a multiple of 64): a warp-specialised Hopper kernel. A producer warp streams
///   128-key K/V tiles with bulk tensor copies (TMA) into a 3-stage ring guarded by mbarriers;
///   two consumer warpgroups of 64 rows each issue `wgmma` QKᵀ for one tile and PV for the
///   previous one back to back, so the softmax of a tile overlaps the tensor cores; P stays in
///   registers. A split's last, partial tile is copied with `cp.async`, zero-filled past the
///   segment's end, so no key beyond a segment is read.
/// - otherwise `wgmma` or `mma.sync` m16n8k16 kernels fed by a 2- or 3-stage `cp.async` pipeline
///   of 64-key tiles whose page ids are fetched a tile ahead.
/// - a last level whose segments each belong to one request (the unique suffixes) runs on the
///   library's split-KV decode (`run_decode`, see decode.hpp; `CascadeTuning::decode_last_level`).
///
/// Levels after the first are programmatic dependent launches where the level kernel allows it.
/// Each level writes partial states (o, base-2 lse) in fp32 to the workspace. The states of a
/// row are then folded with the library's max-subtracted merge (`math::merge_weight` /
/// `merge_finalize`, the numerics of `cuda::merge_states`) and written in the output's dtype and
/// base: by the decode of the last level, which merges the other levels' states into its own
/// split merge (`CascadePlan::decode_fold`), or else by one merge launch over every level's and
/// split's state (a large decode level then runs beside the shared levels without waiting). No
/// floating-point atomics: results are bitwise repeatable for a given plan.
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
#include "attnstate/core/state_view.hpp"
#include "attnstate/cuda/decode.hpp"

namespace attnstate {
namespace cuda {

/// The shape of a cascade problem (everything but the tensors and the level arrays).
struct CascadeShape {
  std::int64_t batch = 0;      ///< Requests (≥ 1).
  std::int64_t q_len = 1;      ///< New tokens per request, 1..kMaxCascadeQueryLen.
  std::int64_t heads_q = 0;    ///< Query heads, a multiple of `heads_kv`, group ≤ 64.
  std::int64_t heads_kv = 0;   ///< KV heads.
  std::int64_t head_dim = 0;   ///< 64 or 128 (others: `Status::kNotSupported`).
  std::int64_t page_size = 0;  ///< Tokens per page (any ≥ 1).
  std::int64_t num_pages = 0;  ///< Pages in the pool.
  DType dtype = DType::kBF16;  ///< Query and KV dtype: f16 or bf16 (others: `kNotSupported`).
};

/// Which tensor-core instructions a level kernel uses.
enum class CascadeKernel : std::uint8_t {
  kAuto = 0,   ///< `wgmma` for bf16 tiles of 64 or 128 rows at head_dim 128 on sm_90, else
               ///< `mma.sync`.
  kMma = 1,    ///< `mma.sync` m16n8k16 (any tile; every architecture the library builds for).
  kWgmma = 2,  ///< Hopper `wgmma` where it applies (bf16, tiles of 64 or 128 rows, head_dim
               ///< 128); other levels use `mma.sync`.
};

/// Overrides of the plan's choices (0 = automatic); for tests and tuning. `tile_rows`, `chunk`
/// and `kernel` apply to the levels that run on cascade level kernels, not to a last level that
/// runs on the split-KV decode (which plans its own splits).
struct CascadeTuning {
  int tile_rows = 0;                            ///< Query rows per CTA tile: 16, 64 or 128.
  int chunk = 0;                                ///< KV tokens per split, a positive multiple of 64.
  CascadeKernel kernel = CascadeKernel::kAuto;  ///< Tensor-core instruction family.
  /// Run a last level whose segments each belong to one request (segment `b` to request `b`)
  /// with the library's split-KV decode (`run_decode`) instead of a cascade level kernel; it
  /// applies when the new tokens are causal or `q_len == 1` (see `decode_fold` for how its
  /// state meets the other levels').
  bool decode_last_level = true;
  /// Splits of such a decode level: 0 = the decode's automatic policy, else a fixed count
  /// (`1..attnstate::kMaxSplits`, i.e. 1..512, the range `plan_decode` takes).
  int decode_splits = 0;
  /// SMs the shared levels leave to such a decode level, which then runs beside them (it is a
  /// programmatic dependent launch that waits for them only before folding their states, if it
  /// folds them):
  /// -1 = automatic (enough for all the decode's CTAs when the shared segments are short and
  /// the decode needs at most half of the SMs, else 0), else `0..num_sms - 1`.
  int decode_sms = -1;
  /// How such a decode level's state meets the shared levels' states in `run_cascade`:
  /// 1 = the decode folds them into its own split merge (no merge launch; its CTAs wait for the
  /// shared levels before folding, holding their SM slots meanwhile); 0 = the decode never waits:
  /// it writes its state to its workspace slot while the shared levels still run, on whatever
  /// SMs they leave, and one merge launch follows (which waits for both); -1 = automatic (fold
  /// when `decode_sms` leaves SMs for every decode CTA at once or the decode is at most about
  /// two waves of CTAs, else the merge launch). With the unique level alone the decode always
  /// writes the output itself.
  int decode_fold = -1;
  /// The warp-specialised (bulk-copy, `wgmma`) kernel of bf16 levels at head_dim 128 with tiles
  /// of 64 or 128 rows: -1 = automatic (KV tiles of 128 keys), 0 = never (those levels run on
  /// the `cp.async` kernels), 1 = 128-key tiles, 2 = 128-key tiles with the warpgroups issuing
  /// in turns, 3 = 64-key tiles, 4 = 64-key tiles in turns (for comparisons; each is exact to
  /// rounding, and repeatable for a given plan).
  int ws_variant = -1;
};

/// What the plan chose for one level.
struct CascadeLevelPlan {
  std::int64_t num_segments = 0;  ///< Segments (must match the run's level).
  int tile_rows = 0;              ///< Query rows per CTA tile (16, 64 or 128).
  int max_tiles = 0;              ///< Most row tiles of any segment.
  int chunk = 0;                  ///< KV tokens per split (a multiple of 64; a decode level:
                                  ///< the decode's split size, a multiple of 16).
  int max_splits = 0;             ///< Most splits of any segment (planned lengths).
  int slot_offset = 0;            ///< First workspace slot of this level's partial states.
  bool has_pages = false;         ///< The planned level uses pages (`page_indices` required).
  bool wgmma = false;             ///< Use the `wgmma` kernel (on an sm_90 device).
  bool decode = false;            ///< Runs on the split-KV decode (`CascadePlan::last_decode`).
};

/// A cascade plan: everything `run_cascade` needs besides the tensors (a small host value).
struct CascadePlan {
  CascadeShape shape;                               ///< The planned shape.
  int num_levels = 0;                               ///< Levels (1..kMaxCascadeLevels).
  CascadeLevelPlan levels[kMaxCascadeLevels] = {};  ///< Per-level choices.
  int num_slots = 0;                                ///< Partial states per query row.
  float scale = 0.f;                                ///< Softmax scale (resolved, never 0).
  bool causal = true;                               ///< Causal mask on the last level.
  int num_sms = 0;                                  ///< SMs planned for.
  /// Launch every level after the first as a programmatic dependent launch, so a memory-bound
  /// level (unique suffixes) runs beside a compute-bound one (a long shared prefix).
  bool overlap_levels = true;
  /// Fetch each KV tile's page ids one tile ahead of its copies (hides the page-table latency).
  bool prefetch_pages = true;
  /// The warp-specialised kernel variant of the levels that take it (`CascadeTuning::ws_variant`
  /// resolved: 0 none, 1..4).
  int ws_variant = 1;

  /// The decode plan of the last level when it runs on the split-KV decode (see
  /// `CascadeTuning::decode_last_level`); its workspace follows the partial states.
  DecodePlan last_decode;
  /// SMs the shared levels' splits leave free for that decode (`CascadeTuning::decode_sms`).
  int decode_sms = 0;
  /// That decode folds the shared levels' states into its output (`CascadeTuning::decode_fold`);
  /// false: it writes its workspace slot beside the shared levels and a merge launch follows.
  bool decode_fold = true;
  /// Query rows `batch · q_len · heads_q`.
  std::int64_t rows() const { return shape.batch * shape.q_len * shape.heads_q; }
  /// Bytes of device workspace `run_cascade` needs: fp32 partial states
  /// `(num_slots, rows, head_dim)` and their LSEs `(num_slots, rows)`, then the workspace of
  /// `last_decode` when the last level runs on the decode; 256-byte aligned sections.
  std::size_t workspace_bytes() const;
};

/// Plans a cascade (host only; reads the host level arrays, makes no CUDA call).
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
///         or `dtype`.
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

/// One stage of `run_cascade`: the partial states of level `level` (for profiling). Every level
/// followed by `run_cascade_merge` gives the result of `run_cascade` up to rounding (a decode
/// level run alone writes its own state to its workspace slot, and the merge then folds it).
/// Arguments as in `run_cascade`.
void run_cascade_level(const CascadePlan& plan, int level, const ConstTensorView& q,
                       const PagedKvCache& kv, const CascadeLevel& device_level, void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// The last stage of `run_cascade`: merges the partial states of every level into `out`.
/// Arguments as in `run_cascade`.
void run_cascade_merge(const CascadePlan& plan, StateView out, const void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream = nullptr);

}  // namespace cuda
}  // namespace attnstate
