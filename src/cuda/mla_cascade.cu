/// @file mla_cascade.cu
/// @brief CUDA MLA cascade: `plan_mla_cascade` (each level's split layout with the MLA decode's
///        chooser over its segments, the stack of partial states), the argument checks of a run,
///        and the launches: the catalog's MLA cascade level row once per level
///        (`kernels/mla/mla_cascade.cuh`), then `merge_states` over the stack (and, with sinks,
///        `merge_state` with the sink state).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/merge.hpp"
#include "attnstate/cuda/mla_cascade.hpp"
#include "catalog/catalog.hpp"
#include "common/cascade_validate.hpp"
#include "common/mla_cascade_validate.hpp"
#include "common/validate.hpp"
#include "cuda/decode_prior.hpp"
#include "cuda/kernels/mla/mla_cascade.cuh"
#include "cuda/kernels/mla/segment.cuh"
#include "cuda/launch.hpp"
#include "cuda/mla_common.hpp"
#include "cuda/mla_launch.cuh"
#include "cuda/plan_run_checks.hpp"
#include "plan/decode_plan.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// The runner's access to a plan's recorded data.
struct MlaCascadePlanAccess {
  static MlaCascadePlanData& data(MlaCascadePlan& p) { return p.d_; }
  static const MlaCascadePlanData& data(const MlaCascadePlan& p) { return p.d_; }
};

}  // namespace detail

namespace {

using attnstate::detail::decode_str;
using attnstate::detail::throw_argument;
using detail::MlaCascadePlanAccess;
using detail::MlaCascadePlanData;

constexpr const char* kPlanFn = "attnstate::cuda::plan_mla_cascade";
constexpr const char* kRunFn = "attnstate::cuda::run_mla_cascade";

/// The workspace: the stack of the levels' splits and its merge's (`detail::mla_stack_layout`).
using WorkspaceLayout = detail::MlaStackLayout;

/// Query rows of the plan's batch: `batch · q_len · heads`.
std::int64_t stack_rows(const MlaCascadePlanData& d) {
  return d.problem.mla.batch * d.problem.mla.q_len * d.problem.mla.heads;
}

/// The workspace of `d` (its rows < 2^31: checked when planning); false when it does not fit.
bool workspace_layout(const MlaCascadePlanData& d, WorkspaceLayout* w) {
  return detail::mla_stack_layout(stack_rows(d), d.num_slots, 0, w);
}

/// The MLA cascade's level rows (`kMlaLaunchTable`).
struct LevelRows {
  using Params = detail::MlaSegmentParams;
  static constexpr catalog::Family kFamily = catalog::Family::kMlaCascade;
  static constexpr const char* kName = "mla_cascade_level_kernel";
  template <int kKv, bool kBlock>
  static constexpr auto kernel() {
    return &detail::mla_cascade_level_kernel<kKv, kBlock>;
  }
  /// The cache fields of the kernel's argument.
  static const detail::MlaParams& mla(const Params& p) { return p.mla; }
};

/// The split layout of level `lv` (host arrays, checked): the MLA decode's chooser over its
/// segments as requests of `row_tiles` tiles each.
SplitLayout level_layout(const MlaCascadeProblem& pr, const CascadeLevel& lv, int row_tiles,
                         int num_sms) {
  DecodeProblem dp;
  dp.batch = lv.num_segments;
  dp.q_len = pr.mla.q_len;
  dp.heads_q = pr.mla.heads;
  dp.heads_kv = 1;
  dp.head_dim = pr.mla.kv_lora_rank + pr.mla.rope_dim;
  dp.q_dtype = pr.mla.q_dtype;
  dp.kv_dtype = pr.mla.ckv_dtype;
  return plan::auto_layout(kPlanFn, dp, lv.seg_lens, DecodeOptions{}, num_sms, row_tiles,
                           detail::mla_facts());
}

}  // namespace

std::size_t MlaCascadePlan::workspace_bytes() const {
  WorkspaceLayout w;
  if (d_.catalog_fingerprint == 0) return 0;
  workspace_layout(d_, &w);
  return w.total;
}

const SplitLayout& MlaCascadePlan::splits(int l) const {
  if (l < 0 || l >= d_.num_levels)
    throw_argument("attnstate::cuda::MlaCascadePlan::splits", "l",
                   "0..num_levels() - 1 = " + decode_str(d_.num_levels - 1), decode_str(l));
  return d_.splits[static_cast<std::size_t>(l)];
}

std::string MlaCascadePlan::to_string() const {
  if (d_.catalog_fingerprint != catalog::kFingerprint)
    return "no plan (not made by plan_mla_cascade)";
  std::string s = "MLA cascade, kernel " + decode_str(d_.kernel_id) + " (" +
                  attnstate::to_string(d_.problem.mla.ckv_dtype) + " latent / " +
                  attnstate::to_string(d_.problem.mla.kpe_dtype) + " rotary cache); " +
                  decode_str(d_.problem.mla.heads) + " heads × q_len " +
                  decode_str(d_.problem.mla.q_len) + "; levels:";
  for (int l = 0; l < d_.num_levels; ++l)
    s += " [" + decode_str(d_.segments[l]) + " segments × " + decode_str(d_.row_tiles[l]) +
         " row tiles × " + decode_str(d_.splits[l].max_splits) + " splits]";
  return s + "; " + decode_str(d_.num_slots) + " states merged per row";
}

MlaCascadePlan plan_mla_cascade(const MlaCascadeProblem& problem, const CascadeLevel* host_levels,
                                int num_levels, const CascadeOptions& options, int num_sms) {
  namespace v = ::attnstate::detail;
  const char* fn = kPlanFn;
  const MlaDecodeProblem& pr = problem.mla;
  detail::check_mla_problem(fn, pr, "problem.mla.");
  v::check_min(fn, "problem.page_size", problem.page_size, 1);
  if (problem.page_size > (std::int64_t{1} << 30))
    throw_argument(fn, "problem.page_size", "<= 2^30", decode_str(problem.page_size));
  v::check_min(fn, "problem.num_pages", problem.num_pages, 0);
  if (num_sms < 1) throw_argument(fn, "num_sms", ">= 1", decode_str(num_sms));
  if (!options.variant.is_plain())
    throw_argument(fn, "options.variant",
                   "plain attention (the MLA cascade takes no window or soft cap)",
                   "a window or a soft cap", Status::kNotSupported);
  const float scale =
      v::resolve_scale(fn, "options.scale", options.scale, pr.kv_lora_rank + pr.rope_dim);
  MlaKvCache geometry;
  geometry.page_size = problem.page_size;
  geometry.num_pages = problem.num_pages;
  v::check_cascade_levels(fn, host_levels, num_levels, pr.batch, pr.q_len, options.causal,
                          v::mla_level_geometry(geometry), true);
  const std::int64_t req_rows = pr.q_len * pr.heads;
  std::int64_t all_rows = 0;
  if (!checked_mul(pr.batch, req_rows, &all_rows) ||
      all_rows > 0x7FFFFFFF)  // the kernel's row indices are 32-bit
    throw_argument(fn, "problem.mla.batch", "batch · q_len · heads rows within 2^31 - 1",
                   decode_str(pr.batch) + " × " + decode_str(req_rows));
  MlaCascadePlan plan;
  MlaCascadePlanData& d = MlaCascadePlanAccess::data(plan);
  d.problem = problem;
  d.scale = scale;
  d.causal = options.causal;
  d.num_levels = num_levels;
  for (int l = 0; l < num_levels; ++l) {
    const CascadeLevel& lv = host_levels[l];
    std::int64_t most = 1;  // requests of the largest segment
    for (std::int64_t s = 0; s < lv.num_segments; ++s)
      most = std::max<std::int64_t>(most, lv.request_indptr[s + 1] - lv.request_indptr[s]);
    const int tiles =
        static_cast<int>((most * req_rows + catalog::kMlaTileRows - 1) / catalog::kMlaTileRows);
    d.segments[l] = lv.num_segments;
    d.row_tiles[l] = tiles;
    d.splits[l] = level_layout(problem, lv, tiles, num_sms);
    d.first_slot[l] = d.num_slots;
    d.num_slots += d.splits[l].max_splits;
    std::int64_t grid = 0;
    if (!checked_mul(lv.num_segments, std::int64_t{tiles} * d.splits[l].max_splits, &grid) ||
        grid > 0x7FFFFFFF)
      throw_argument(fn, v::cascade_level_arg(l, "num_segments").c_str(),
                     "a grid of at most 2^31 - 1 CTAs",
                     decode_str(lv.num_segments) + " segments × " + decode_str(tiles) +
                         " row tiles × " + decode_str(d.splits[l].max_splits) + " splits");
  }
  d.catalog_fingerprint = catalog::kFingerprint;
  d.kernel_id = catalog::find_id(detail::mla_query(pr, catalog::Family::kMlaCascade));
  d.num_sms = num_sms;
  WorkspaceLayout w;
  if (!workspace_layout(d, &w))
    throw_argument(fn, "problem.mla.batch", "a workspace within 2^60 bytes",
                   decode_str(stack_rows(d)) + " rows × " + decode_str(d.num_slots) + " states");
  return plan;
}

namespace {

/// Every check of a run, in order; returns the workspace layout.
WorkspaceLayout check_run(const MlaCascadePlan& plan, const ConstTensorView& q_nope,
                          const ConstTensorView& q_pe, const MlaKvCache& kv,
                          const CascadeLevel* levels, int num_levels, const AttentionSinks& sinks,
                          const StateView& out, void* workspace, std::size_t workspace_bytes) {
  namespace v = ::attnstate::detail;
  const char* fn = kRunFn;
  const MlaCascadePlanData& d = MlaCascadePlanAccess::data(plan);
  detail::check_plan_fingerprint(fn, d.catalog_fingerprint, "plan_mla_cascade");
  const MlaDecodeProblem& pr = d.problem.mla;
  CascadeOptions o;
  o.causal = d.causal;
  v::validate_mla_cascade_args(fn, q_nope, q_pe, kv, o, out, MemorySpace::kDevice);
  const auto planned = [&](const char* name, std::int64_t want, std::int64_t got,
                           const char* field) {
    if (want != got)
      throw_argument(fn, name, std::string("plan.problem().") + field + " = " + decode_str(want),
                     decode_str(got));
  };
  planned("q_nope.shape[0]", pr.batch, q_nope.shape[0], "mla.batch");
  planned("q_nope.shape[1]", pr.q_len, q_nope.shape[1], "mla.q_len");
  planned("q_nope.shape[2]", pr.heads, q_nope.shape[2], "mla.heads");
  planned("kv.kv_lora_rank", pr.kv_lora_rank, kv.kv_lora_rank, "mla.kv_lora_rank");
  planned("kv.rope_dim", pr.rope_dim, kv.rope_dim, "mla.rope_dim");
  planned("kv.page_size", d.problem.page_size, kv.page_size, "page_size");
  const auto dtype = [&](const char* name, DType want, DType got, const char* field) {
    if (want != got)
      throw_argument(fn, name,
                     std::string("plan.problem().") + field + " = " + attnstate::to_string(want),
                     attnstate::to_string(got));
  };
  dtype("q_nope.dtype", pr.q_dtype, q_nope.dtype, "mla.q_dtype");
  dtype("kv.ckv_dtype", pr.ckv_dtype, kv.ckv_dtype, "mla.ckv_dtype");
  dtype("kv.kpe_dtype", pr.kpe_dtype, kv.kpe_dtype, "mla.kpe_dtype");
  if (num_levels != d.num_levels)
    throw_argument(fn, "num_levels", "plan.num_levels() = " + decode_str(d.num_levels),
                   decode_str(num_levels));
  if (levels == nullptr) throw_argument(fn, "device_levels", "a non-null pointer", "nullptr");
  for (int l = 0; l < num_levels; ++l) {
    if (levels[l].num_segments != d.segments[l])
      throw_argument(fn, v::cascade_level_arg(l, "num_segments").c_str(),
                     "the planned " + decode_str(d.segments[l]),
                     decode_str(levels[l].num_segments));
    v::check_level_arrays(fn, l, levels[l], true);
  }
  WorkspaceLayout w;
  workspace_layout(d, &w);  // fits: checked when planning
  if (pr.batch == 0) return w;
  if (kv.num_pages < 1) throw_argument(fn, "kv.num_pages", ">= 1", decode_str(kv.num_pages));
  detail::check_mla_copies(fn, q_nope, q_pe, kv);
  v::check_out_disjoint_from_levels(fn, out, levels, num_levels, false);
  detail::check_mla_workspace(fn, q_nope, q_pe, kv, out, workspace, workspace_bytes, w.total);
  const auto wb = static_cast<std::int64_t>(w.total);
  for (int l = 0; l < num_levels; ++l)
    v::check_disjoint_from_level(fn, "workspace", workspace, wb, l, levels[l], false);
  detail::check_device_sinks(fn, sinks, pr.heads, out, workspace, workspace_bytes);
  return w;
}

/// Launches every level's kernel on the checked arguments, then the merge of the stack.
void launch(const MlaCascadePlan& plan, const ConstTensorView& q_nope, const ConstTensorView& q_pe,
            const MlaKvCache& kv, const CascadeLevel* levels, const AttentionSinks& sinks,
            const StateView& out, void* workspace, const WorkspaceLayout& w, cudaStream_t stream) {
  const MlaCascadePlanData& d = MlaCascadePlanAccess::data(plan);
  const MlaDecodeProblem& pr = d.problem.mla;
  if (pr.batch == 0) return;
  const auto level = detail::kMlaLaunchTable<LevelRows>[static_cast<std::size_t>(d.kernel_id)];
  if (level == nullptr)  // a plan of this build names an MLA cascade row (its fingerprint)
    throw_argument(kRunFn, "plan", "a plan naming an MLA cascade level row",
                   "kernel id " + decode_str(d.kernel_id), Status::kInternal);
  char* ws = static_cast<char*>(workspace);
  detail::MlaSegmentParams sp{};
  detail::fill_mla_inputs(q_nope, q_pe, ::attnstate::detail::mla_cascade_pool(kv, pr.batch),
                          pr.q_len, pr.heads, d.scale, &sp.mla);
  sp.stack_rows = stack_rows(d);
  sp.stack_o = reinterpret_cast<float*>(ws + w.o_off);
  sp.stack_lse = reinterpret_cast<float*>(ws + w.lse_off);
  for (int l = 0; l < d.num_levels; ++l) {
    const CascadeLevel& lv = levels[l];
    sp.mla.page_indptr = lv.page_indptr;  // the segments' pages and lengths as the requests'
    sp.mla.page_indices = lv.page_indices;
    sp.mla.seq_lens = lv.seg_lens;
    sp.mla.row_tiles = d.row_tiles[l];
    sp.mla.splits = d.splits[l];
    sp.request_indptr = lv.request_indptr;
    sp.causal = d.causal && l == d.num_levels - 1;
    sp.slot0 = d.first_slot[l];
    level(sp, lv.num_segments * d.row_tiles[l] * d.splits[l].max_splits, stream);
  }
  detail::merge_mla_stack(workspace, w, pr.batch * pr.q_len, d.num_slots, pr.heads, sinks, out,
                          stream);
}

}  // namespace

void run_mla_cascade(const MlaCascadePlan& plan, const ConstTensorView& q_nope,
                     const ConstTensorView& q_pe, const MlaKvCache& kv,
                     const CascadeLevel* device_levels, int num_levels, StateView out,
                     void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  run_mla_cascade(plan, q_nope, q_pe, kv, device_levels, num_levels, AttentionSinks{}, out,
                  workspace, workspace_bytes, stream);
}

void run_mla_cascade(const MlaCascadePlan& plan, const ConstTensorView& q_nope,
                     const ConstTensorView& q_pe, const MlaKvCache& kv,
                     const CascadeLevel* device_levels, int num_levels, const AttentionSinks& sinks,
                     StateView out, void* workspace, std::size_t workspace_bytes,
                     cudaStream_t stream) {
  const WorkspaceLayout w = check_run(plan, q_nope, q_pe, kv, device_levels, num_levels, sinks, out,
                                      workspace, workspace_bytes);
  launch(plan, q_nope, q_pe, kv, device_levels, sinks, out, workspace, w, stream);
}

}  // namespace cuda
}  // namespace attnstate
