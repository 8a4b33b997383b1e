/// @file cascade.cu
/// @brief CUDA cascade attention: `plan_cascade` (the host planner of plan/cascade_plan.hpp fed
///        with the device facts), and the run entry points: their checks, the level kernels'
///        parameters and launches, the bridge to the decode of a unique last level, the merge.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attnstate/core/error.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/cuda/cascade.hpp"
#include "attnstate/cuda/check.hpp"
#include "catalog/catalog.hpp"
#include "common/cascade_validate.hpp"
#include "common/compiled.hpp"
#include "common/cuda_cascade_validate.hpp"
#include "cuda/cascade_tma.hpp"
#include "cuda/cascade_units.hpp"
#include "cuda/decode_prior.hpp"
#include "cuda/device_cache.hpp"
#include "cuda/kernels/cascade/level_ws.cuh"
#include "cuda/kernels/cascade/merge.cuh"
#include "cuda/kernels/cascade/tails.cuh"
#include "cuda/launch.hpp"
#include "plan/cascade_plan.hpp"
#include "plan/cascade_plan_access.hpp"

namespace attnstate {
namespace cuda {
namespace {

using ::attnstate::detail::cascade_str;
using ::attnstate::detail::check_cascade_device_level;
using ::attnstate::detail::check_cascade_inputs;
using ::attnstate::detail::check_cascade_plan_out;
using ::attnstate::detail::check_cascade_workspace;
using ::attnstate::detail::throw_argument;

/// The caller named by the dispatch's errors (values the checks already accepted).
constexpr const char* kCascadeFn = "attnstate::cuda::run_cascade";

/// The partial states' outputs and LSEs in the workspace (fp32, `(num_slots, rows, ...)`).
float* slots_o(void* workspace) { return static_cast<float*>(workspace); }
float* slots_lse(const CascadePlan& plan, void* workspace) {
  return reinterpret_cast<float*>(static_cast<char*>(workspace) + plan::partials_o_bytes(plan));
}

/// Bytes of the last level's decode workspace (0 unless that level runs on the decode).
std::size_t decode_bytes(const CascadePlan& plan) {
  return plan.num_levels() > 0 && plan.level(plan.num_levels() - 1).decode
             ? plan.last_decode().workspace_bytes()
             : 0;
}

/// Bytes of the decode workspace rounded to 256: the offset of a windowed plan's tails after it.
std::size_t decode_bytes_aligned(const CascadePlan& plan) {
  return (decode_bytes(plan) + 255) / 256 * 256;
}

/// A windowed plan's request tails in the workspace (`kernels::cascade_tails_kernel`; null
/// without a window).
std::int32_t* window_tails(const CascadePlan& plan, void* workspace) {
  return plan.window_left() < 0 ? nullptr
                                : reinterpret_cast<std::int32_t*>(static_cast<char*>(workspace) +
                                                                  plan::partials_bytes(plan) +
                                                                  decode_bytes_aligned(plan));
}

/// Launches the kernel writing a windowed plan's request tails from every level's device arrays
/// (before the levels, which read them).
void launch_tails(const CascadePlan& plan, const PagedKvCache& kv,
                  const CascadeLevel* device_levels, void* workspace, cudaStream_t stream) {
  kernels::CascadeTailsParams p{};
  for (int l = 0; l < plan.num_levels(); ++l) {
    p.request_indptr[l] = device_levels[l].request_indptr;
    p.page_indptr[l] = device_levels[l].page_indptr;
    p.seg_lens[l] = device_levels[l].seg_lens;
    p.num_segments[l] = static_cast<int>(device_levels[l].num_segments);
    p.has_pages[l] = device_levels[l].page_indices != nullptr ? 1 : 0;
  }
  p.num_levels = plan.num_levels();
  p.batch = static_cast<int>(plan.shape().batch);
  p.page_size = static_cast<int>(kv.page_size);
  p.tails = window_tails(plan, workspace);
  detail::LaunchConfig cfg;
  cfg.grid = dim3(static_cast<unsigned>((p.batch + kernels::kCascadeTailsThreads - 1) /
                                        kernels::kCascadeTailsThreads));
  cfg.block = dim3(kernels::kCascadeTailsThreads);
  cfg.stream = stream;
  detail::launch_kernel(cfg, kernels::cascade_tails_kernel, "cascade_tails_kernel", p);
}

/// How the decode of a unique last level runs.
enum class DecodeLevelMode {
  kSlot,        ///< Its state to its workspace slot, stream-ordered (the stage-by-stage API).
  kSlotBeside,  ///< The same, launched beside the previous kernel (never waits for it).
  kFold,        ///< Folds the earlier levels' slots into `out` (waits for them before that).
};

/// The arguments of the split-KV decode that runs level `l` (a unique last level): the
/// segments' page lists are the requests' page table, their lengths the sequence lengths.
/// `kSlot` and `kSlotBeside` write the state to the level's workspace slot (fp32, base 2) for
/// the merge; `kSlotBeside` as a programmatic dependent launch that reads nothing of the
/// previous kernel's (it may run on the SMs a shared level leaves while that one still runs;
/// its grid completes after it, so the merge launched next sees both). `kFold` folds the earlier
/// levels' partial states (workspace slots before this level's) into its own merge and writes
/// the final state to `out`, so no merge launch follows.
struct DecodeLevelCall {
  PagedKvCache table;
  StateView out;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  detail::PriorStates prior;

  DecodeLevelCall(const CascadePlan& plan, int l, const PagedKvCache& kv, const CascadeLevel& lv,
                  void* ws, DecodeLevelMode mode, const StateView* final_out,
                  const float* sinks = nullptr) {
    const CascadeShape& s = plan.shape();
    table = kv;
    table.page_indptr = lv.page_indptr;
    table.page_indices = lv.page_indices;
    table.block_table = nullptr;
    table.block_table_stride = 0;
    table.seq_lens = lv.seg_lens;
    table.batch = s.batch;
    table.space = MemorySpace::kDevice;
    const std::int64_t rows = plan.rows();
    const std::int64_t slot = plan.level(l).slot_offset;
    workspace_bytes = decode_bytes(plan);
    workspace = workspace_bytes > 0 ? static_cast<char*>(ws) + plan::partials_bytes(plan) : nullptr;
    if (mode == DecodeLevelMode::kFold) {
      out = *final_out;
      prior.sinks = sinks;  // the fold writes the final state: the sinks go in there, once
      prior.o = slots_o(ws);
      prior.lse = slots_lse(plan, ws);
      prior.count = static_cast<int>(slot);
      prior.rows = rows;
      return;
    }
    out = make_state_view(slots_o(ws) + slot * rows * s.head_dim, DType::kF32,
                          slots_lse(plan, ws) + slot * rows, s.batch * s.q_len, s.heads_q,
                          s.head_dim, LseBase::kBase2, MemorySpace::kDevice);
    prior.beside_previous = mode == DecodeLevelMode::kSlotBeside;
  }

  /// Every check of the decode run, launching nothing (before the shared levels are queued).
  void check(const CascadePlan& plan, const ConstTensorView& q) const {
    detail::check_decode_with_prior(plan.last_decode(), q, table, out, workspace, workspace_bytes,
                                    prior);
  }
  /// Zeroes the decode's tickets (one small memset: the cascade's workspace needs no
  /// initialisation).
  void zero_tickets(const CascadePlan& plan, cudaStream_t stream) const {
    if (workspace_bytes > 0)
      init_decode_workspace(plan.last_decode(), workspace, workspace_bytes, stream);
  }
  /// Launches the decode run (after `check`: its checks are not repeated).
  void launch(const CascadePlan& plan, const ConstTensorView& q, cudaStream_t stream) const {
    detail::launch_decode_with_prior(plan.last_decode(), q, table, out, workspace, prior, stream);
  }
};

/// Launches level `l` on a cascade level kernel, the one the plan recorded; with `overlap` as a
/// programmatic dependent launch that may run beside the previous level's kernel (levels write
/// disjoint workspace slots; the merge waits for all).
void launch_level(const CascadePlan& plan, int l, const ConstTensorView& q, const PagedKvCache& kv,
                  const CascadeLevel& lv, void* workspace, bool overlap, cudaStream_t stream) {
  const CascadeShape& s = plan.shape();
  const CascadeLevelPlan& lp = plan.level(l);
  kernels::CascadeLevelParams p{};
  fill_attention_params(p, q, kv, s.batch, s.q_len, s.heads_q, plan.scale(), plan.logits_soft_cap(),
                        plan.window_left());
  p.page_shift = -1;
  for (int b = 0; b < 31; ++b)
    if ((std::int64_t{1} << b) == kv.page_size) p.page_shift = b;
  p.prefetch_pages = plan.prefetch_pages() ? 1 : 0;
  p.request_indptr = lv.request_indptr;
  p.page_indptr = lv.page_indptr;
  p.page_indices = lv.page_indices;
  p.seg_lens = lv.seg_lens;
  p.num_segments = static_cast<int>(lp.num_segments);
  p.chunk = lp.chunk;
  p.max_splits = lp.max_splits;
  p.max_tiles = lp.max_tiles;
  p.causal_tail = (plan.causal() && s.q_len > 1 && l == plan.num_levels() - 1) ? 1 : 0;
  p.causal_pos = plan.causal() ? 1 : 0;
  p.tails = window_tails(plan, workspace);
  if (p.tails != nullptr) p.tails += static_cast<std::int64_t>(l) * s.batch;
  p.ws_o = slots_o(workspace);
  p.ws_lse = slots_lse(plan, workspace);
  p.rows_total = plan.rows();
  p.slot_offset = lp.slot_offset;
  // the plan's catalog rows (ids of this build's catalog: the plan's fingerprint was checked)
  if (lp.kernel_id < 0 || lp.kernel_id >= catalog::kNumRows || lp.fallback_id < 0 ||
      lp.fallback_id >= catalog::kNumRows)
    throw_argument(kCascadeFn, "plan", "level kernel ids of the catalog",
                   "ids " + cascade_str(lp.kernel_id) + " and " + cascade_str(lp.fallback_id),
                   Status::kInternal);
  const catalog::Row& row = catalog::kRows[static_cast<std::size_t>(lp.kernel_id)];
  detail::CascadeLevelLaunch u;
  u.grid = dim3(static_cast<unsigned>(lp.num_segments * lp.max_tiles * lp.max_splits),
                static_cast<unsigned>(s.heads_kv));
  u.pdl = overlap;
  u.k_scale = kv.k_scale;
  u.v_scale = kv.v_scale;
  catalog::Needs met = catalog::kNeedsNothing;
  kernels::CascadeTmaMaps maps;
  if ((row.needs & catalog::kNeedsPoolMap) != 0) {
    const auto v = static_cast<plan::CascadeWsVariant>(lp.ws_variant);
    p.ws_pingpong =
        v == plan::CascadeWsVariant::kKv128Turns || v == plan::CascadeWsVariant::kKv64Turns ? 1 : 0;
    // The pool's tensor maps: its layout and page stride are known only now, and the maps
    // embed its addresses. A pool they cannot describe (the row's run-time need unmet) runs the
    // row's fallback by the catalog's rule, which the plan recorded (the same kernel for every
    // run of that pool).
    const plan::CascadeTmaLayout layout =
        plan::describe_cascade_kv_maps(kv, lp.tma_box, lp.tma_run);
    if (detail::encode_cascade_kv_maps(kv, layout, &maps.k, &maps.v, &maps.k_run, &maps.v_run,
                                       &p.tma_run)) {
      p.tma_box = layout.box;
      p.tma_coords = layout.coords;
      u.maps = &maps;
      met = catalog::kNeedsPoolMap;
    }
  }
  const int id = catalog::family_that_runs(row, met) == row.family ? lp.kernel_id : lp.fallback_id;
  const catalog::Row& runs = catalog::kRows[static_cast<std::size_t>(id)];
  // the unit of the row's head dim (cascade_units.hpp), then its launch table
  using detail::CascadeUnit;
  compiled::dispatch(
      kCascadeFn, "shape.head_dim", runs.head_dim, compiled::CascadeHeadDims{}, [&](auto d) {
        constexpr int D = decltype(d)::value;
        switch (detail::unit_of(runs)) {
          case CascadeUnit::kWs:
            return detail::cascade_unit_launch<D, CascadeUnit::kWs>(id, p, u, stream);
          case CascadeUnit::kWgmma:
            return detail::cascade_unit_launch<D, CascadeUnit::kWgmma>(id, p, u, stream);
          case CascadeUnit::kMmaFp8:
            return detail::cascade_unit_launch<D, CascadeUnit::kMmaFp8>(id, p, u, stream);
          case CascadeUnit::kWgmmaFp8:
            return detail::cascade_unit_launch<D, CascadeUnit::kWgmmaFp8>(id, p, u, stream);
          case CascadeUnit::kWsFp8:
            return detail::cascade_unit_launch<D, CascadeUnit::kWsFp8>(id, p, u, stream);
          default:
            return detail::cascade_unit_launch<D, CascadeUnit::kMma>(id, p, u, stream);
        }
      });
}

/// Launches the merge of every level's and split's state into `out`, the attention `sinks`
/// (device logits, or null) merged in last; `programmatic`: as a
/// programmatic dependent launch (its CTAs may be placed while the previous kernel finishes;
/// they wait for it before reading).
void launch_merge(const CascadePlan& plan, StateView out, const void* workspace, bool programmatic,
                  const float* sinks, cudaStream_t stream) {
  void* ws = const_cast<void*>(workspace);
  kernels::CascadeMergeParams p{};
  p.ws_o = slots_o(ws);
  p.ws_lse = slots_lse(plan, ws);
  p.rows = plan.rows();
  p.num_slots = plan.num_slots();
  p.heads_q = static_cast<int>(plan.shape().heads_q);
  p.out_o = out.o;
  p.out_lse = out.lse;
  p.o_stride_token = out.o_stride_token;
  p.o_stride_head = out.o_stride_head;
  p.lse_stride_token = out.lse_stride_token;
  p.lse_stride_head = out.lse_stride_head;
  p.base = out.base;
  p.sinks = sinks;
  detail::LaunchConfig cfg;
  cfg.grid = dim3(static_cast<unsigned>((p.rows + kernels::kCascadeMergeWarps - 1) /
                                        kernels::kCascadeMergeWarps));
  cfg.block = dim3(32 * kernels::kCascadeMergeWarps);
  cfg.pdl = programmatic;
  cfg.stream = stream;
  compiled::dispatch(kCascadeFn, "shape.head_dim", plan.shape().head_dim,
                     compiled::CascadeHeadDims{}, [&](auto d) {
                       compiled::dispatch_storage(
                           kCascadeFn, "out.dtype", out.dtype, compiled::MergeDTypes{},
                           [&](auto to) {
                             constexpr auto kernel =
                                 kernels::cascade_merge_kernel<decltype(d)::value, decltype(to)>;
                             detail::launch_kernel(cfg, kernel, "cascade_merge_kernel", p);
                           });
                     });
}

}  // namespace

std::size_t CascadePlan::workspace_bytes() const {
  return plan::partials_bytes(*this) + decode_bytes_aligned(*this) +
         plan::window_tails_bytes(*this);
}

CascadePlan plan_cascade(const CascadeShape& shape, const CascadeLevel* host_levels, int num_levels,
                         const CascadeOptions& options, int num_sms, const CascadeTuning& tuning) {
  // (the variant's checks, a window refused by the catalog, are the host planner's)
  // the device facts, once per device (cached): the plan records the kernels this device runs
  plan::CascadeDeviceFacts facts;
  facts.wgmma = detail::device_facts().wgmma();
  facts.tensor_maps = detail::tensor_maps_available();
  DecodePlan decode;
  const auto plan_decode_level = [&decode](const DecodeProblem& problem, const std::int32_t* lens,
                                           const DecodeOptions& dopt, int sms) {
    decode = plan_decode(problem, lens, dopt, sms);
    return plan::CascadeDecodeLevel{decode.splits(), decode.row_tiles()};
  };
  CascadePlan plan;
  static_cast<CascadeChoice&>(plan) =
      plan::plan_cascade("attnstate::cuda::plan_cascade", shape, host_levels, num_levels, options,
                         num_sms, tuning, facts, plan_decode_level);
  detail::CascadePlanAccess::last_decode(plan) = decode;
  return plan;
}

void run_cascade_level(const CascadePlan& plan, int level, const ConstTensorView& q,
                       const PagedKvCache& kv, const CascadeLevel& device_level, void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream) {
  const char* func = "attnstate::cuda::run_cascade_level";
  plan::check_cascade_plan(func, plan);
  if (level < 0 || level >= plan.num_levels())
    throw_argument(func, "level", "0.." + cascade_str(plan.num_levels() - 1), cascade_str(level));
  const std::int64_t pool_bytes = check_cascade_inputs(func, plan, q, kv);
  detail::check_kv_scales_readable(func, kv);
  check_cascade_device_level(func, plan, level, device_level);
  check_cascade_workspace(func, plan.workspace_bytes(), workspace, workspace_bytes, nullptr, &q);
  // the level writes its partial states into the workspace while it reads the cache and tables
  const auto ws_bytes = static_cast<std::int64_t>(plan.workspace_bytes());
  ::attnstate::detail::check_disjoint_from_pools(func, "workspace", workspace, ws_bytes, kv,
                                                 pool_bytes);
  ::attnstate::detail::check_disjoint_from_level(func, "workspace", workspace, ws_bytes, level,
                                                 device_level, false);
  // a windowed level places its rows by every level's lengths (the tails run_cascade computes)
  if (plan.window_left() >= 0 && !plan.level(level).decode)
    throw_argument(func, "plan",
                   "a plan without a window (a windowed plan's shared levels run through "
                   "run_cascade, which reads every level's lengths)",
                   "window_left " + cascade_str(plan.window_left()), Status::kNotSupported);
  if (plan.level(level).decode) {
    const DecodeLevelCall decode(plan, level, kv, device_level, workspace, DecodeLevelMode::kSlot,
                                 nullptr);
    decode.check(plan, q);
    decode.zero_tickets(plan, stream);
    decode.launch(plan, q, stream);
    return;
  }
  launch_level(plan, level, q, kv, device_level, workspace, false, stream);
}

void run_cascade_merge(const CascadePlan& plan, StateView out, const void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream) {
  run_cascade_merge(plan, AttentionSinks{}, out, workspace, workspace_bytes, stream);
}

void run_cascade_merge(const CascadePlan& plan, const AttentionSinks& sinks, StateView out,
                       const void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  const char* func = "attnstate::cuda::run_cascade_merge";
  plan::check_cascade_plan(func, plan);
  check_cascade_plan_out(func, plan, out);
  check_cascade_workspace(func, plan.workspace_bytes(), workspace, workspace_bytes, &out);
  detail::check_device_sinks(func, sinks, plan.shape().heads_q, out, workspace, workspace_bytes);
  launch_merge(plan, out, workspace, false, sinks.logits, stream);
}

void run_cascade(const CascadePlan& plan, const ConstTensorView& q, const PagedKvCache& kv,
                 const CascadeLevel* device_levels, int num_levels, StateView out, void* workspace,
                 std::size_t workspace_bytes, cudaStream_t stream) {
  run_cascade(plan, q, kv, device_levels, num_levels, AttentionSinks{}, out, workspace,
              workspace_bytes, stream);
}

void run_cascade(const CascadePlan& plan, const ConstTensorView& q, const PagedKvCache& kv,
                 const CascadeLevel* device_levels, int num_levels, const AttentionSinks& sinks,
                 StateView out, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  const char* func = "attnstate::cuda::run_cascade";
  plan::check_cascade_plan(func, plan);
  if (device_levels == nullptr)
    throw_argument(func, "device_levels", "a non-null pointer", "nullptr");
  if (num_levels != plan.num_levels())
    throw_argument(func, "num_levels", "the planned " + cascade_str(plan.num_levels()),
                   cascade_str(num_levels));
  const std::int64_t pool_bytes = check_cascade_inputs(func, plan, q, kv);
  detail::check_kv_scales_readable(func, kv);
  for (int l = 0; l < num_levels; ++l) check_cascade_device_level(func, plan, l, device_levels[l]);
  check_cascade_plan_out(func, plan, out, &q);
  ::attnstate::detail::check_disjoint_from_pool(func, "out", out, kv, pool_bytes);
  ::attnstate::detail::check_out_disjoint_from_levels(func, out, device_levels, num_levels, false);
  check_cascade_workspace(func, plan.workspace_bytes(), workspace, workspace_bytes, &out, &q);
  const auto ws_bytes = static_cast<std::int64_t>(plan.workspace_bytes());
  ::attnstate::detail::check_disjoint_from_pools(func, "workspace", workspace, ws_bytes, kv,
                                                 pool_bytes);
  for (int l = 0; l < num_levels; ++l)
    ::attnstate::detail::check_disjoint_from_level(func, "workspace", workspace, ws_bytes, l,
                                                   device_levels[l], false);
  detail::check_device_sinks(func, sinks, plan.shape().heads_q, out, workspace, workspace_bytes);
  // A last level on the decode starts beside the last shared level: either it merges the other
  // levels' states itself (no merge launch) or it runs ahead into its workspace slot and the
  // merge follows as a programmatic launch. Its tickets are zeroed before the first level so
  // that nothing stands between the last shared level and the decode.
  const int last = num_levels - 1;
  if (plan.window_left() >= 0) launch_tails(plan, kv, device_levels, workspace, stream);
  if (!plan.level(last).decode) {
    for (int l = 0; l < num_levels; ++l)
      launch_level(plan, l, q, kv, device_levels[l], workspace, plan.overlap_levels() && l > 0,
                   stream);
    launch_merge(plan, out, workspace, false, sinks.logits, stream);
    return;
  }
  const DecodeLevelCall decode(
      plan, last, kv, device_levels[last], workspace,
      plan.decode_fold() ? DecodeLevelMode::kFold : DecodeLevelMode::kSlotBeside, &out,
      sinks.logits);
  decode.check(plan, q);  // the decode level's own checks before anything is queued
  decode.zero_tickets(plan, stream);
  for (int l = 0; l < last; ++l)
    launch_level(plan, l, q, kv, device_levels[l], workspace, plan.overlap_levels() && l > 0,
                 stream);
  decode.launch(plan, q, stream);
  if (!plan.decode_fold()) launch_merge(plan, out, workspace, true, sinks.logits, stream);
}

}  // namespace cuda
}  // namespace attnstate
