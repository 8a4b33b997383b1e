/// @file decode.cu
/// @brief CUDA split-KV decode: `plan_decode` (the device facts, then the host planner of
///        `src/plan/decode_plan.hpp`), the argument checks of a run, the workspace layout and the
///        launch: the catalog row the plan names, through the launch table keyed by kernel id
///        (`cuda/decode_units.hpp`).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnstate/core/online_softmax.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"
#include "catalog/catalog.hpp"
#include "common/compiled.hpp"
#include "common/decode_validate.hpp"
#include "cuda/decode_prior.hpp"
#include "cuda/decode_units.hpp"
#include "cuda/device_cache.hpp"
#include "cuda/kernels/decode/params.cuh"
#include "cuda/launch.hpp"
#include "cuda/plan_run_checks.hpp"
#include "plan/decode_plan.hpp"
#include "plan/decode_plan_access.hpp"

namespace attnstate {
namespace cuda {
namespace {

using attnstate::detail::decode_str;
using attnstate::detail::throw_argument;
using detail::check_scale_memory;
using detail::DecodePlanAccess;
using detail::DecodePlanData;

/// The caller named by the launch's errors (values the checks already accepted).
constexpr const char* kRunFn = "attnstate::cuda::run_decode";

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

static_assert(plan::kMaxCluster == detail::kDecodeMaxWsGroup &&
                  detail::kDecodeMaxCluster <= plan::kMaxCluster,
              "the plan records the occupancy of every cluster size the kernel uses");

/// Bytes of a K/V element of the problem's cache (2, or 1 for fp8).
int kv_bytes(const DecodeProblem& pr) { return is_fp8(pr.kv_dtype) ? 1 : 2; }

/// A decode row's entry points (null for the rows of other families).
struct DecodeRowEntry {
  void (*launch)(int, const detail::DecodeParams&, const detail::DecodeLaunch&,
                 cudaStream_t) = nullptr;
  const detail::ResidentClusters& (*clusters)(int) = nullptr;
};

template <std::size_t I>
constexpr DecodeRowEntry decode_row_entry() {
  constexpr catalog::Row r = catalog::kRows[I];
  if constexpr (r.family == catalog::Family::kDecodeSplit ||
                r.family == catalog::Family::kDecodeStream) {
    constexpr detail::DecodeUnit u = detail::unit_of(r);
    return {&detail::decode_unit_launch<r.head_dim, u>,
            &detail::decode_unit_clusters<r.head_dim, u>};
  } else {
    return {};
  }
}
template <std::size_t... I>
constexpr std::array<DecodeRowEntry, catalog::kNumRows> decode_table(std::index_sequence<I...>) {
  return {decode_row_entry<I>()...};
}

/// The launch table: every decode row's entry points, keyed by its kernel id.
constexpr std::array<DecodeRowEntry, catalog::kNumRows> kDecodeTable =
    decode_table(std::make_index_sequence<catalog::kNumRows>{});

/// The split row of (`head_dim`, query dtype `q_dt`, K/V dtype `dt`) at depth `stages`, plain:
/// its query.
catalog::Query split_row(std::int64_t head_dim, DType q_dt, DType dt, int stages) {
  catalog::Query q;
  q.family = catalog::Family::kDecodeSplit;
  q.head_dim = head_dim;
  q.q = catalog::mask(q_dt);
  q.kv = catalog::mask(dt);
  q.stages = stages;
  return q;
}

/// Throws `Status::kNotSupported` naming what the catalog holds for `q`.
[[noreturn]] void not_compiled(const catalog::Query& q) {
  throw_argument(kRunFn, "plan", catalog::not_supported_message(q),
                 "a kernel the catalog lacks (" + std::string(catalog::to_string(q.family)) +
                     " at head dim " + std::to_string(q.head_dim) + ")",
                 Status::kNotSupported);
}

/// Fills `f.resident_clusters` for the split kernel of (`head_dim`, KV dtype `dt`, query dtype
/// `q_dt`) on the current device: the plain rows at the default depth (`[0]`) and at the plan's
/// other depth `other` (`[1]`, where the catalog holds one: the short-split depth, or one
/// `DecodeOptions::split_stages` named), through the launch table.
void query_occupancy(std::int64_t head_dim, DType dt, DType q_dt, int other, plan::DecodeFacts& f) {
  const int depths[2] = {detail::kDecodeStages, other};
  for (int row = 0; row < 2; ++row) {
    const catalog::Query q = split_row(head_dim, q_dt, dt, depths[row]);
    const int id = catalog::find_id(q);
    if (id < 0) {
      if (row == 0) not_compiled(q);
      continue;
    }
    const detail::ResidentClusters& n = kDecodeTable[static_cast<std::size_t>(id)].clusters(id);
    for (int c = 0; c <= plan::kMaxCluster; ++c) f.resident_clusters[row][c] = n[c];
  }
}

/// The planner's facts as a plan recorded them.
plan::DecodeFacts recorded_facts(const DecodePlanData& d) {
  plan::DecodeFacts f = plan::decode_kernel_facts(d.problem.head_dim, kv_bytes(d.problem));
  for (int s = 0; s < 2; ++s)
    for (int c = 0; c <= plan::kMaxCluster; ++c)
      f.resident_clusters[s][c] = d.resident_clusters[s][c];
  return f;
}

#if ATTNSTATE_PROBES
thread_local bool t_skip_combine = false;  // set only by probe::run_decode_skip_combine
bool probe_skip_combine() { return t_skip_combine; }
#else
constexpr bool probe_skip_combine() { return false; }
#endif

struct WorkspaceLayout {
  std::size_t o_off = 0, lse_off = 0, ticket_off = 0, total = 0;
};

WorkspaceLayout workspace_layout(const DecodePlanData& d) {
  WorkspaceLayout w;
  if (d.splits.max_splits <= 1) return w;
  const std::size_t tiles = static_cast<std::size_t>(d.problem.batch) *
                            static_cast<std::size_t>(d.problem.heads_kv) *
                            static_cast<std::size_t>(d.row_tiles);
  const std::size_t parts =
      tiles * static_cast<std::size_t>(d.splits.max_splits) * detail::kDecodeTileRows;
  w.o_off = 0;
  w.lse_off = align_up(parts * static_cast<std::size_t>(d.problem.head_dim) * 4);
  w.ticket_off = w.lse_off + align_up(parts * 4);
  w.total = w.ticket_off + align_up(tiles * 4);
  return w;
}

using detail::DecodeLaunch;

/// Launches what `l` says: the catalog row the plan recorded for it (the streamed row, or the
/// split row at the run's depth), through the launch table keyed by its kernel id (the row's
/// unit dispatches nothing more).
void launch(const detail::DecodeParams& p, const DecodePlanData& d, const DecodeLaunch& l,
            cudaStream_t stream) {
  const int id = l.streamed ? d.kernel_id : d.split_ids[l.stages == detail::kDecodeStages ? 0 : 1];
  if (id < 0) {  // the planner resolves only depths it found rows for
    catalog::Query q =
        split_row(d.problem.head_dim, d.problem.q_dtype, d.problem.kv_dtype, l.stages);
    q.variants = l.variants;
    not_compiled(q);
  }
  kDecodeTable[static_cast<std::size_t>(id)].launch(id, p, l, stream);
}

/// The checks of a run (every one, in order) and what it launches; `launch.grid == 0` when the
/// run has no request (nothing to launch).
struct CheckedRun {
  WorkspaceLayout w;
  float scale = 0.f;
  plan::SplitLaunch split;
  std::int64_t grid = 0;
};

/// The checks of a run: what can differ from the plan (the plan itself is as `plan_decode` made
/// it, its fingerprint checked first).
CheckedRun check_run(const char* fn, const DecodePlan& plan, const ConstTensorView& q,
                     const PagedKvCache& kv, const StateView& out, void* workspace,
                     std::size_t workspace_bytes, const detail::PriorStates& prior) {
  CheckedRun r;
  const DecodePlanData& d = DecodePlanAccess::data(plan);
  detail::check_plan_fingerprint(fn, d.catalog_fingerprint, "plan_decode");
  const DecodeProblem& pr = d.problem;
  if (prior.count > 0) {  // a split instance takes the variant and the prior states
    catalog::Query c;
    c.family = catalog::Family::kDecodeSplit;
    c.head_dim = pr.head_dim;
    c.q = catalog::mask(pr.q_dtype);
    c.kv = catalog::mask(pr.kv_dtype);
    c.variants = catalog::variants_of(d.variant.window_left, d.variant.logits_soft_cap) |
                 catalog::kPriorStates;
    if (!catalog::compiled(c))
      throw_argument(fn, "plan.variant()", catalog::not_supported_message(c),
                     catalog::variants_string(c.variants), Status::kNotSupported);
  }
  const std::int64_t pool_bytes =
      attnstate::detail::validate_decode_args(fn, q, kv, out, MemorySpace::kDevice);
  if (kv.batch > pr.batch)
    throw_argument(fn, "kv.batch", "<= plan.problem().batch = " + decode_str(pr.batch),
                   decode_str(kv.batch));
  if (q.shape[1] != pr.q_len)
    throw_argument(fn, "q.shape[1]", "plan.problem().q_len = " + decode_str(pr.q_len),
                   decode_str(q.shape[1]));
  if (q.shape[2] != pr.heads_q)
    throw_argument(fn, "q.shape[2]", "plan.problem().heads_q = " + decode_str(pr.heads_q),
                   decode_str(q.shape[2]));
  if (kv.heads_kv != pr.heads_kv)
    throw_argument(fn, "kv.heads_kv", "plan.problem().heads_kv = " + decode_str(pr.heads_kv),
                   decode_str(kv.heads_kv));
  if (kv.head_dim != pr.head_dim)
    throw_argument(fn, "kv.head_dim", "plan.problem().head_dim = " + decode_str(pr.head_dim),
                   decode_str(kv.head_dim));
  if (q.dtype != pr.q_dtype)
    throw_argument(fn, "q.dtype", std::string("plan.problem().q_dtype = ") + to_string(pr.q_dtype),
                   to_string(q.dtype));
  if (kv.dtype != pr.kv_dtype)
    throw_argument(fn, "kv.dtype",
                   std::string("plan.problem().kv_dtype = ") + to_string(pr.kv_dtype),
                   to_string(kv.dtype));
  if (prior.count < 0) throw_argument(fn, "prior.count", ">= 0", decode_str(prior.count));
  if (prior.beside_previous && prior.count > 0)
    throw_argument(fn, "prior.beside_previous", "false when prior states are folded (count > 0)",
                   "true with prior.count = " + decode_str(prior.count));
  if (prior.count > 0) {
    if (prior.o == nullptr || prior.lse == nullptr ||
        reinterpret_cast<std::uintptr_t>(prior.o) % 16 != 0)
      throw_argument(fn, "prior.o", "non-null prior states with 16-byte aligned o",
                     "a null or misaligned pointer");
    const std::int64_t rows = kv.batch * pr.q_len * pr.heads_q;
    if (prior.rows < rows)
      throw_argument(fn, "prior.rows", ">= batch * q_len * heads_q = " + decode_str(rows),
                     decode_str(prior.rows));
  }
  if (kv.batch == 0) return r;
  if (kv.num_pages < 1) throw_argument(fn, "kv.num_pages", ">= 1", decode_str(kv.num_pages));
  attnstate::detail::check_aligned(fn, "kv.k", kv.k, 16);  // the kernels' 16-byte copies
  attnstate::detail::check_aligned(fn, "kv.v", kv.v, 16);
  const std::int64_t chunk = 16 / static_cast<std::int64_t>(size_of(kv.dtype));  // elements
  if (kv.page_elems() % chunk != 0)
    throw_argument(fn, "kv.page_stride", "a multiple of " + decode_str(chunk) + " elements",
                   decode_str(kv.page_elems()));
  check_scale_memory(fn, "kv.k_scale.data", kv.k_scale.data);
  check_scale_memory(fn, "kv.v_scale.data", kv.v_scale.data);
  if (kv.page_size > 0x7FFFFFFF / 2)
    throw_argument(fn, "kv.page_size", "< 2^30", decode_str(kv.page_size));
  r.w = workspace_layout(d);
  const WorkspaceLayout& w = r.w;
  if (w.total > 0) {
    if (workspace == nullptr) throw_argument(fn, "workspace", "non-null", "null");
    if (workspace_bytes < w.total)
      throw_argument(fn, "workspace_bytes", ">= plan.workspace_bytes() = " + decode_str(w.total),
                     decode_str(static_cast<std::int64_t>(workspace_bytes)),
                     Status::kWorkspaceTooSmall);
    attnstate::detail::check_aligned(fn, "workspace", workspace, 16);
    // written while q is read and out is written
    attnstate::detail::check_disjoint(fn, "out", out, "workspace", workspace, w.total, nullptr, 0);
    if (attnstate::detail::ranges_overlap(q.data, attnstate::detail::tensor_bytes(q), workspace,
                                          w.total))
      throw_argument(fn, "workspace", "memory disjoint from q", "an overlap");
    // and from the cache and the tables it reads
    attnstate::detail::check_disjoint_from_kv(fn, "workspace", workspace,
                                              static_cast<std::int64_t>(w.total), kv, pool_bytes);
  }
  return r;
}

/// What a run launches, from the plan and the run's batch (at most the planned one, whose grid
/// `plan_decode` checked): the recorded split launch, or for a smaller batch the plan's rule
/// again for the smaller grid, from the occupancy and the hand choices the plan recorded.
CheckedRun derive_run(const DecodePlanData& d, std::int64_t batch) {
  CheckedRun r;
  r.scale = d.scale;
  r.w = workspace_layout(d);
  r.grid = batch * d.problem.heads_kv * d.row_tiles * d.splits.max_splits;
  r.split.stages = d.split.stages;
  r.split.cluster = d.split.cluster;
  if (batch != d.problem.batch)
    r.split = plan::resolve_split_launch(recorded_facts(d), d.split_ids, d.splits, d.num_sms,
                                         r.grid, d.forced_stages, d.forced_cluster);
  return r;
}

}  // namespace

std::size_t DecodePlan::workspace_bytes() const { return workspace_layout(d_).total; }

std::string DecodePlan::to_string() const {
  if (d_.catalog_fingerprint != catalog::kFingerprint) return "no plan (not made by plan_decode)";
  const auto row_str = [](int id) {
    if (id < 0 || id >= catalog::kNumRows) return std::string("no compiled kernel");
    const catalog::Row& r = catalog::kRows[static_cast<std::size_t>(id)];
    return std::string(catalog::to_string(r.family)) + ", kernel " + decode_str(id) +
           " (head dim " + decode_str(r.head_dim) + ", " + attnstate::to_string(r.q) +
           " queries, " + attnstate::to_string(r.kv) + " K/V, " + decode_str(r.stages) +
           " stages, " +
           (r.tile_keys == catalog::kDecodePairKeys ? "32 keys a warp's step (paired), "
                                                    : std::string()) +
           catalog::variants_string(r.variants) + ")";
  };
  const int S = d_.splits.max_splits;
  const int c = d_.split.cluster;
  const std::string merge = S == 1   ? "no merge"
                            : c == S ? "the cluster merge"
                            : c > 1  ? "the workspace merge in groups of " + decode_str(c)
                                     : "the workspace merge";
  std::string s = row_str(d_.kernel_id) + ": " +
                  plan::to_string(static_cast<plan::DecodeReason>(d_.reason)) + "; " +
                  (S == 1 ? std::string("one split per request")
                          : "at most " + decode_str(S) + " splits per request") +
                  "; ";
  const int split_id = d_.split_ids[d_.split.stages == detail::kDecodeStages ? 0 : 1];
  if (d_.kernel == DecodeKernel::kStreamed) s += "fallback: " + row_str(split_id) + ", ";
  s += "cluster " + decode_str(c) + " (" + merge + ")";
  if (d_.forced_stages != 0) s += "; options.split_stages = " + decode_str(d_.forced_stages);
  if (d_.forced_cluster != 0) s += "; options.split_cluster = " + decode_str(d_.forced_cluster);
  return s;
}

DecodePlan plan_decode(const DecodeProblem& problem, const std::int32_t* seq_lens_host,
                       const DecodeOptions& options, int num_sms) {
  const char* fn = "attnstate::cuda::plan_decode";
  plan::check_decode_problem(fn, problem);
  if (num_sms < 1) throw_argument(fn, "num_sms", ">= 1", decode_str(num_sms));
  const float scale =
      attnstate::detail::resolve_scale(fn, "options.scale", options.scale, problem.head_dim);
  attnstate::detail::check_variant(fn, "options.variant", options.variant);
  plan::DecodeFacts facts = plan::decode_kernel_facts(problem.head_dim, kv_bytes(problem));
  // A window: the splits are planned over the keys the kernel reads (from the first row's
  // window start, rounded down to a tile), so a long request costs its window only.
  std::vector<std::int32_t> windowed;
  const std::int32_t* lens = seq_lens_host;
  if (options.variant.window_left >= 0 && problem.batch > 0 && seq_lens_host != nullptr) {
    windowed.assign(seq_lens_host, seq_lens_host + problem.batch);
    for (std::int32_t& len : windowed) {
      const std::int64_t first =
          static_cast<std::int64_t>(len) - problem.q_len - options.variant.window_left;
      if (len > 0 && first > 0) len -= static_cast<std::int32_t>(first) & ~(kSplitGranularity - 1);
    }
    lens = windowed.data();
  }
  // every argument checked first (the variant against the catalog too); then, for split
  // requests, the device's occupancy (queried once per device) for the merge's clusters
  plan::DecodeChoice c = plan::resolve_decode(fn, problem, lens, options, num_sms, facts);
  if (c.grid > 0 && c.splits.max_splits > 1) {
    const int other = c.split_ids[1] >= 0
                          ? catalog::kRows[static_cast<std::size_t>(c.split_ids[1])].stages
                          : detail::kDecodeShortStages;
    query_occupancy(problem.head_dim, problem.kv_dtype, problem.q_dtype, other, facts);
    c.split = plan::resolve_split_launch(facts, c.split_ids, c.splits, num_sms, c.grid,
                                         c.forced_stages, c.forced_cluster);
  }
  DecodePlan plan;
  DecodePlanData& d = DecodePlanAccess::data(plan);
  d.problem = problem;
  d.splits = c.splits;
  d.scale = scale;
  d.variant = options.variant;
  d.programmatic_launch = options.programmatic_launch;
  d.catalog_fingerprint = catalog::kFingerprint;
  d.kernel = c.streamed ? DecodeKernel::kStreamed : DecodeKernel::kSplit;
  d.kernel_id = c.kernel_id();
  d.split_ids[0] = c.split_ids[0];
  d.split_ids[1] = c.split_ids[1];
  d.split.stages = c.split.stages;
  d.split.cluster = c.split.cluster;
  d.forced_stages = c.forced_stages;
  d.forced_cluster = c.forced_cluster;
  d.num_sms = num_sms;
  d.row_tiles = c.row_tiles;
  d.reason = static_cast<std::uint8_t>(c.reason);
  for (int s = 0; s < 2; ++s)
    for (int k = 0; k <= plan::kMaxCluster; ++k)
      d.resident_clusters[s][k] = facts.resident_clusters[s][k];
  return plan;
}

void init_decode_workspace(const DecodePlan& plan, void* workspace, std::size_t workspace_bytes,
                           cudaStream_t stream) {
  const char* fn = "attnstate::cuda::init_decode_workspace";
  const DecodePlanData& d = DecodePlanAccess::data(plan);
  detail::check_plan_fingerprint(fn, d.catalog_fingerprint, "plan_decode");
  const WorkspaceLayout w = workspace_layout(d);
  if (w.total == 0) return;
  if (workspace == nullptr) throw_argument(fn, "workspace", "non-null", "null");
  if (workspace_bytes < w.total)
    throw_argument(fn, "workspace_bytes", ">= plan.workspace_bytes() = " + decode_str(w.total),
                   decode_str(static_cast<std::int64_t>(workspace_bytes)),
                   Status::kWorkspaceTooSmall);
  ATTNSTATE_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(workspace) + w.ticket_off, 0,
                                       w.total - w.ticket_off, stream));
}

void run_decode(const DecodePlan& plan, const ConstTensorView& q, const PagedKvCache& kv,
                StateView out, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  detail::run_decode_with_prior(plan, q, kv, out, workspace, workspace_bytes, detail::PriorStates{},
                                stream);
}

void run_decode(const DecodePlan& plan, const ConstTensorView& q, const PagedKvCache& kv,
                const AttentionSinks& sinks, StateView out, void* workspace,
                std::size_t workspace_bytes, cudaStream_t stream) {
  detail::PriorStates prior;
  prior.sinks = sinks.logits;
  detail::run_decode_with_prior(plan, q, kv, out, workspace, workspace_bytes, prior, stream);
}

void detail::check_kv_scales_readable(const char* fn, const PagedKvCache& kv) {
  check_scale_memory(fn, "kv.k_scale.data", kv.k_scale.data);
  check_scale_memory(fn, "kv.v_scale.data", kv.v_scale.data);
}

void detail::check_device_sinks(const char* fn, const AttentionSinks& sinks, std::int64_t heads_q,
                                const StateView& out, const void* workspace,
                                std::size_t workspace_bytes) {
  if (sinks.none()) return;
  if (reinterpret_cast<std::uintptr_t>(sinks.logits) % alignof(float) != 0)
    throw_argument(fn, "sinks.logits", "4-byte aligned fp32 logits", "a misaligned pointer");
  check_scale_memory(fn, "sinks.logits", sinks.logits, "the kernels read the sinks");
  const std::int64_t bytes = heads_q * static_cast<std::int64_t>(sizeof(float));
  attnstate::detail::check_disjoint(fn, "out", out, "sinks.logits", sinks.logits, bytes, nullptr,
                                    0);
  attnstate::detail::check_buffer_disjoint(fn, "workspace", workspace,
                                           static_cast<std::int64_t>(workspace_bytes),
                                           "sinks.logits", sinks.logits, bytes);
}

void detail::check_decode_with_prior(const DecodePlan& plan, const ConstTensorView& q,
                                     const PagedKvCache& kv, StateView out, void* workspace,
                                     std::size_t workspace_bytes, const PriorStates& prior) {
  check_run("attnstate::cuda::run_decode", plan, q, kv, out, workspace, workspace_bytes, prior);
  AttentionSinks sinks;
  sinks.logits = prior.sinks;
  check_device_sinks("attnstate::cuda::run_decode", sinks, plan.problem().heads_q, out, workspace,
                     workspace_bytes);
}

void detail::run_decode_with_prior(const DecodePlan& plan, const ConstTensorView& q,
                                   const PagedKvCache& kv, StateView out, void* workspace,
                                   std::size_t workspace_bytes, const PriorStates& prior,
                                   cudaStream_t stream) {
  check_decode_with_prior(plan, q, kv, out, workspace, workspace_bytes, prior);
  launch_decode_with_prior(plan, q, kv, out, workspace, prior, stream);
}

void detail::launch_decode_with_prior(const DecodePlan& plan, const ConstTensorView& q,
                                      const PagedKvCache& kv, StateView out, void* workspace,
                                      const PriorStates& prior, cudaStream_t stream) {
  const DecodePlanData& d = DecodePlanAccess::data(plan);
  const CheckedRun r = derive_run(d, kv.batch);
  if (r.grid == 0) return;
  const DecodeProblem& pr = d.problem;
  const WorkspaceLayout& w = r.w;

  detail::DecodeParams p{};
  fill_attention_params(p, q, kv, kv.batch, pr.q_len, pr.heads_q, r.scale,
                        d.variant.logits_soft_cap, d.variant.window_left);
  p.block_table = kv.block_table;
  p.block_table_stride = kv.block_table_stride;
  p.seq_lens = kv.seq_lens;
  p.rows = p.q_len * p.group;
  p.row_tiles = d.row_tiles;
  p.splits = d.splits;
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  p.out_o = out.o;
  p.out_lse = out.lse;
  p.o_stride_token = out.o_stride_token;
  p.o_stride_head = out.o_stride_head;
  p.lse_stride_token = out.lse_stride_token;
  p.lse_stride_head = out.lse_stride_head;
  p.out_dtype = out.dtype;
  p.out_base = out.base;
  const std::int64_t out_esize = static_cast<std::int64_t>(size_of(out.dtype));
  p.out_vec4 =
      reinterpret_cast<std::uintptr_t>(out.o) % static_cast<std::uintptr_t>(4 * out_esize) == 0 &&
      out.o_stride_token % 4 == 0 && out.o_stride_head % 4 == 0;
  p.cluster = r.split.cluster;
  p.q_vec = reinterpret_cast<std::uintptr_t>(q.data) % 16 == 0 && q.stride[0] % 8 == 0 &&
            q.stride[1] % 8 == 0 && q.stride[2] % 8 == 0;
  char* ws = static_cast<char*>(workspace);
  p.ws_o = w.total ? reinterpret_cast<float*>(ws + w.o_off) : nullptr;
  p.ws_lse = w.total ? reinterpret_cast<float*>(ws + w.lse_off) : nullptr;
  p.tickets = w.total ? reinterpret_cast<std::int32_t*>(ws + w.ticket_off) : nullptr;
  p.skip_combine = probe_skip_combine();
  p.prior_o = prior.count > 0 ? prior.o : nullptr;
  p.prior_lse = prior.count > 0 ? prior.lse : nullptr;
  p.prior_count = prior.count;
  p.prior_rows = prior.rows;
  p.beside_previous = prior.beside_previous ? 1 : 0;
  p.programmatic = d.programmatic_launch && prior.count == 0 && !prior.beside_previous ? 1 : 0;
  p.sinks = prior.sinks;

  DecodeLaunch l;
  l.variants = catalog::variants_of(d.variant.window_left, d.variant.logits_soft_cap);
  // the catalog's fallback rule on the plan's row: a streamed row whose run-time needs the run
  // cannot meet runs its fallback, the split row at the run's depth
  const catalog::Family runs =
      plan::decode_run_family(d.kernel_id, l.variants, prior.count, p.q_vec, kv.page_size);
  l.streamed = runs == catalog::Family::kDecodeStream;
  l.stages = r.split.stages;
  l.grid = r.grid;
  l.num_sms = d.num_sms;
  l.pdl = p.prior_count > 0 || p.beside_previous != 0 || p.programmatic != 0;
  launch(p, d, l, stream);
}

}  // namespace cuda
}  // namespace attnstate

#if ATTNSTATE_PROBES
namespace {
/// Folds every unit's timeline (every group at each build head dim) into `host`.
template <int... D>
void fold_timelines(unsigned long long* host, int ctas, std::integer_sequence<int, D...>) {
  using attnstate::cuda::detail::decode_unit_timeline;
  using attnstate::cuda::detail::DecodeUnit;
  ((decode_unit_timeline<D, DecodeUnit::kSplit>(host, ctas),
    decode_unit_timeline<D, DecodeUnit::kVariant>(host, ctas),
    decode_unit_timeline<D, DecodeUnit::kFp8>(host, ctas),
    decode_unit_timeline<D, DecodeUnit::kStream>(host, ctas),
    decode_unit_timeline<D, DecodeUnit::kFp8Variant>(host, ctas),
    decode_unit_timeline<D, DecodeUnit::kStreamFp8>(host, ctas)),
   ...);
}
}  // namespace

/// Probe builds only: copies the per-CTA timeline stamps (8 per CTA, `ctas` CTAs) to `host` and
/// clears them (every unit's: each translation unit's kernels stamp their own copy).
extern "C" void attnstate_decode_timeline(unsigned long long* host, int ctas) {
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  std::fill(host, host + static_cast<std::size_t>(ctas) * 8, 0ull);
  fold_timelines(host, ctas, attnstate::compiled::BuildHeadDims{});
}
#endif

#if ATTNSTATE_PROBES
namespace attnstate {
namespace cuda {
namespace probe {

void run_decode_skip_combine(const DecodePlan& plan, const ConstTensorView& q,
                             const PagedKvCache& kv, StateView out, void* workspace,
                             std::size_t workspace_bytes, cudaStream_t stream) {
  t_skip_combine = true;
  try {
    run_decode(plan, q, kv, out, workspace, workspace_bytes, stream);
  } catch (...) {
    t_skip_combine = false;
    throw;
  }
  t_skip_combine = false;
}

}  // namespace probe
}  // namespace cuda
}  // namespace attnstate
#endif
