/// @file mla.cu
/// @brief CUDA MLA decode: `plan_mla_decode` (the decode's length-aware split chooser with the
///        MLA kernel's facts; the kernel's row), the argument checks of a run, the workspace
///        layout and the launch of the catalog row the plan names (`kernels/mla/mla_decode.cuh`,
///        mma.sync; `kernels/mla/mla_decode_ws.cuh`, wgmma, and its balanced variant;
///        `kernels/mla/mla_decode_narrow.cuh`,
///        wgmma for at most 32 rows), then, from
///        `plan::kMlaStackMergeSplits` splits, `merge_states` over the stacked splits.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/mla.hpp"
#include "catalog/catalog.hpp"
#include "common/mla_validate.hpp"
#include "common/validate.hpp"
#include "cuda/decode_prior.hpp"
#include "cuda/device_cache.hpp"
#include "cuda/kernels/mla/mla_decode.cuh"
#include "cuda/kernels/mla/mla_decode_narrow.cuh"
#include "cuda/kernels/mla/mla_decode_narrow2.cuh"
#include "cuda/kernels/mla/mla_decode_ws.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/launch.hpp"
#include "cuda/mla_common.hpp"
#include "cuda/mla_launch.cuh"
#include "cuda/plan_run_checks.hpp"
#include "plan/decode_plan.hpp"
#include "plan/mla_plan.hpp"
#include "plan/tuning_sm90.hpp"

namespace attnstate {
namespace cuda {

namespace detail {

int mla_narrow2_resident_ctas(int rows) {
  if (rows != 16 && rows != 32)
    throw_argument("attnstate::cuda::detail::mla_narrow2_resident_ctas", "rows", "16 or 32",
                   decode_str(rows));
  const int smem = static_cast<int>(catalog::mla_narrow2_smem_bytes());
  int blocks = 0;
  if (rows == 16) {
    constexpr auto k = &mla_decode_narrow2_kernel<tile::kKvSame, false, 16>;
    raise_smem_limit<k>(smem);
    ATTNSTATE_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, kMlaNarrowThreads, smem));
  } else {
    constexpr auto k = &mla_decode_narrow2_kernel<tile::kKvSame, false, 32>;
    raise_smem_limit<k>(smem);
    ATTNSTATE_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, kMlaNarrowThreads, smem));
  }
  return blocks;
}

/// The runner's access to a plan's recorded data.
struct MlaDecodePlanAccess {
  static MlaDecodePlanData& data(MlaDecodePlan& p) { return p.d_; }
  static const MlaDecodePlanData& data(const MlaDecodePlan& p) { return p.d_; }
};

}  // namespace detail

namespace {

using attnstate::detail::decode_str;
using attnstate::detail::throw_argument;
using detail::mla_query;
using detail::MlaDecodePlanAccess;
using detail::MlaDecodePlanData;

constexpr const char* kPlanFn = "attnstate::cuda::plan_mla_decode";
constexpr const char* kRunFn = "attnstate::cuda::run_mla_decode";

/// Throws naming `options.<field>` for what the MLA decode does not take.
void check_options(const char* fn, const DecodeOptions& o) {
  if (o.variant.window_left >= 0 || o.variant.logits_soft_cap != 0.f)
    throw_argument(fn, "options.variant",
                   "plain attention (the MLA decode takes no window or "
                   "soft cap)",
                   "a window or a soft cap", Status::kNotSupported);
  if (o.kernel != DecodeKernel::kAuto)
    throw_argument(fn, "options.kernel", "kAuto (the MLA decode has one kernel)",
                   "value " + decode_str(static_cast<int>(o.kernel)), Status::kNotSupported);
  if (o.split_stages != 0)
    throw_argument(fn, "options.split_stages", "0 (the MLA decode has one depth)",
                   decode_str(o.split_stages), Status::kNotSupported);
  if (o.split_cluster != 0)
    throw_argument(fn, "options.split_cluster", "0 (the MLA decode merges through the workspace)",
                   decode_str(o.split_cluster), Status::kNotSupported);
  if (o.programmatic_launch)
    throw_argument(fn, "options.programmatic_launch", "false", "true", Status::kNotSupported);
  if (o.plan_ctas_per_sm != 0)
    throw_argument(fn, "options.plan_ctas_per_sm", "0 (the MLA planner's own slots)",
                   decode_str(o.plan_ctas_per_sm), Status::kNotSupported);
}

/// The workspace of a split plan: the partial states and the tickets of the ticket merge, or the
/// stack of the stacked merge (`plan::mla_stack_merge`; no tickets: `ticket_off == total`).
struct WorkspaceLayout {
  std::size_t o_off = 0, lse_off = 0, ticket_off = 0, total = 0;
  bool stacked = false;
  detail::MlaStackLayout stack;  ///< The stacked merge's sections (`stacked`).
};

constexpr std::int64_t kAlign = 256;
std::int64_t align_up(std::int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

/// The workspace of `d` (sizes overflow-checked when planning: `plan_mla_decode` refuses a plan
/// whose workspace does not fit 2^62 bytes).
bool workspace_layout(const MlaDecodePlanData& d, WorkspaceLayout* w) {
  *w = WorkspaceLayout{};
  if (d.splits.max_splits <= 1) return true;
  if (plan::mla_stack_merge(d.splits.max_splits)) {
    // [split][batch · q_len · heads][512]: the rows of the output, one slot per split
    std::int64_t rows = 0;
    w->stacked = true;
    if (!checked_mul(d.problem.batch, d.problem.q_len * d.problem.heads, &rows) ||
        !detail::mla_stack_layout(rows, d.splits.max_splits, 0, &w->stack))
      return false;
    w->o_off = w->stack.o_off;
    w->lse_off = w->stack.lse_off;
    w->ticket_off = w->total = w->stack.total;
    return true;
  }
  std::int64_t tiles = 0, parts = 0, o_bytes = 0;
  if (!checked_mul(d.problem.batch, d.row_tiles, &tiles) ||
      !checked_mul(tiles, std::int64_t{d.splits.max_splits} * catalog::kMlaTileRows, &parts) ||
      !checked_mul(parts, std::int64_t{catalog::kMlaLoraRank} * 4, &o_bytes) ||
      o_bytes > (std::int64_t{1} << 62))
    return false;
  w->lse_off = static_cast<std::size_t>(align_up(o_bytes));
  w->ticket_off = w->lse_off + static_cast<std::size_t>(align_up(parts * 4));
  w->total = w->ticket_off + static_cast<std::size_t>(align_up(tiles * 4));
  return true;
}

/// The rows of an MLA decode family `F` (`kMlaLaunchTable`): the mma.sync kernel's, the wgmma
/// kernel's (`kMlaDecodeWs`), its balanced variant's (`kMlaDecodeWsBalanced`) or a narrow wgmma
/// kernel's (`kMlaDecodeNarrow`, `kMlaDecodeNarrow2`: its instances by `narrow_kernel`).
template <catalog::Family F>
struct DecodeRows {
  using Params = detail::MlaParams;
  static constexpr catalog::Family kFamily = F;
  static constexpr bool kWs = F == catalog::Family::kMlaDecodeWs;
  static constexpr bool kBalanced = F == catalog::Family::kMlaDecodeWsBalanced;
  static constexpr const char* kName =
      F == catalog::Family::kMlaDecodeNarrow    ? "mla_decode_narrow_kernel"
      : F == catalog::Family::kMlaDecodeNarrow2 ? "mla_decode_narrow2_kernel"
      : kWs                                     ? "mla_decode_ws_kernel"
      : kBalanced                               ? "mla_decode_ws_balanced_kernel"
                                                : "mla_decode_kernel";
  template <int kKv, bool kBlock>
  static constexpr auto kernel() {
    if constexpr (kBalanced)
      return &detail::mla_decode_ws_balanced_kernel<kKv, kBlock>;
    else if constexpr (kWs)
      return &detail::mla_decode_ws_kernel<kKv, kBlock>;
    else
      return &detail::mla_decode_kernel<kKv, kBlock>;
  }
  template <int kKv, bool kBlock, int kN>
  static constexpr auto narrow_kernel() {
    if constexpr (F == catalog::Family::kMlaDecodeNarrow2)
      return &detail::mla_decode_narrow2_kernel<kKv, kBlock, kN>;
    else
      return &detail::mla_decode_narrow_kernel<kKv, kBlock, kN>;
  }
  /// The cache fields of the kernel's argument.
  static const detail::MlaParams& mla(const Params& p) { return p; }
};

/// Whether the current device runs the wgmma kernels (false without a device, or a driver).
bool current_device_wgmma() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    (void)cudaGetLastError();  // (clears the error of a machine without a device)
    return false;
  }
  return detail::device_facts().wgmma();
}

/// The catalog row of `kernel` for `problem` (checked: a compiled mma.sync row exists): the
/// wgmma row where `kernel` asks for it (`kAuto`, the two-CTA narrow kernel not taken by the
/// plan: where `wgmma` holds and one is compiled, the narrow row for at most
/// `tuning::kMlaNarrowAutoRows` rows of a bf16 latent cache, the balanced row for at least
/// `tuning::kMlaBalancedAutoRows` rows of one;
/// `kWgmma`: refused by name without one); the balanced wgmma row for `kWgmmaBalanced` (refused by
/// name without one); the narrow row for `kWgmmaNarrow`, the two-CTA narrow
/// row for `kWgmmaNarrow2` (refused by name without one, or for more than `kMlaNarrowRows` rows).
int kernel_row(const char* fn, const MlaDecodeProblem& problem, MlaDecodeKernel kernel,
               bool wgmma) {
  const int mma = catalog::find_id(mla_query(problem));
  if (kernel == MlaDecodeKernel::kMma || (kernel == MlaDecodeKernel::kAuto && !wgmma)) return mma;
  if (kernel == MlaDecodeKernel::kWgmmaNarrow || kernel == MlaDecodeKernel::kWgmmaNarrow2) {
    const bool two = kernel == MlaDecodeKernel::kWgmmaNarrow2;
    const char* name = two ? "kWgmmaNarrow2" : "kWgmmaNarrow";
    const std::int64_t rows = problem.q_len * problem.heads;  // (bounded: checked problem)
    if (rows > catalog::kMlaNarrowRows)
      throw_argument(fn, "kernel",
                     std::string(name) + " for at most " + decode_str(catalog::kMlaNarrowRows) +
                         " rows (heads × q_len)",
                     decode_str(rows) + " rows (" + decode_str(problem.heads) + " heads × q_len " +
                         decode_str(problem.q_len) + ")",
                     Status::kNotSupported);
    const catalog::Query q = mla_query(
        problem, two ? catalog::Family::kMlaDecodeNarrow2 : catalog::Family::kMlaDecodeNarrow);
    const int narrow = catalog::find_id(q);
    if (narrow < 0)
      throw_argument(fn, "kernel", catalog::not_supported_message(q), name, Status::kNotSupported);
    return narrow;
  }
  // kAuto on a wgmma device: the narrow kernel for few rows of a bf16 latent cache (where it
  // measured faster than the 64-row tile and than the two-CTA kernel), else the wgmma kernel
  if (kernel == MlaDecodeKernel::kAuto && problem.ckv_dtype == DType::kBF16 &&
      problem.q_len * problem.heads <= tuning::kMlaNarrowAutoRows) {
    const int narrow = catalog::find_id(mla_query(problem, catalog::Family::kMlaDecodeNarrow));
    if (narrow >= 0) return narrow;
  }
  // kAuto on a wgmma device: the balanced kernel for whole 64-row tiles of a bf16 latent cache
  if (kernel == MlaDecodeKernel::kAuto && problem.ckv_dtype == DType::kBF16 &&
      problem.q_len * problem.heads >= tuning::kMlaBalancedAutoRows) {
    const int bal = catalog::find_id(mla_query(problem, catalog::Family::kMlaDecodeWsBalanced));
    if (bal >= 0) return bal;
  }
  const bool balanced = kernel == MlaDecodeKernel::kWgmmaBalanced;
  const catalog::Query q = mla_query(
      problem, balanced ? catalog::Family::kMlaDecodeWsBalanced : catalog::Family::kMlaDecodeWs);
  const int ws = catalog::find_id(q);
  if (ws < 0 && (kernel == MlaDecodeKernel::kWgmma || balanced))
    throw_argument(fn, "kernel", catalog::not_supported_message(q),
                   balanced ? "kWgmmaBalanced" : "kWgmma", Status::kNotSupported);
  return ws >= 0 ? ws : mma;
}

/// Every check of a run, in order; returns the workspace layout.
WorkspaceLayout check_run(const MlaDecodePlan& plan, const ConstTensorView& q_nope,
                          const ConstTensorView& q_pe, const MlaKvCache& kv,
                          const AttentionSinks& sinks, const StateView& out, void* workspace,
                          std::size_t workspace_bytes) {
  const char* fn = kRunFn;
  const MlaDecodePlanData& d = MlaDecodePlanAccess::data(plan);
  detail::check_plan_fingerprint(fn, d.catalog_fingerprint, "plan_mla_decode");
  const MlaDecodeProblem& pr = d.problem;
  attnstate::detail::validate_mla_args(fn, q_nope, q_pe, kv, out, MemorySpace::kDevice);
  if (kv.batch > pr.batch)
    throw_argument(fn, "kv.batch", "<= plan.problem().batch = " + decode_str(pr.batch),
                   decode_str(kv.batch));
  if (q_nope.shape[1] != pr.q_len)
    throw_argument(fn, "q_nope.shape[1]", "plan.problem().q_len = " + decode_str(pr.q_len),
                   decode_str(q_nope.shape[1]));
  if (q_nope.shape[2] != pr.heads)
    throw_argument(fn, "q_nope.shape[2]", "plan.problem().heads = " + decode_str(pr.heads),
                   decode_str(q_nope.shape[2]));
  if (q_nope.dtype != pr.q_dtype)
    throw_argument(fn, "q_nope.dtype",
                   std::string("plan.problem().q_dtype = ") + to_string(pr.q_dtype),
                   to_string(q_nope.dtype));
  if (kv.kv_lora_rank != pr.kv_lora_rank)
    throw_argument(fn, "kv.kv_lora_rank",
                   "plan.problem().kv_lora_rank = " + decode_str(pr.kv_lora_rank),
                   decode_str(kv.kv_lora_rank));
  if (kv.rope_dim != pr.rope_dim)
    throw_argument(fn, "kv.rope_dim", "plan.problem().rope_dim = " + decode_str(pr.rope_dim),
                   decode_str(kv.rope_dim));
  if (kv.ckv_dtype != pr.ckv_dtype)
    throw_argument(fn, "kv.ckv_dtype",
                   std::string("plan.problem().ckv_dtype = ") + to_string(pr.ckv_dtype),
                   to_string(kv.ckv_dtype));
  if (kv.kpe_dtype != pr.kpe_dtype)
    throw_argument(fn, "kv.kpe_dtype",
                   std::string("plan.problem().kpe_dtype = ") + to_string(pr.kpe_dtype),
                   to_string(kv.kpe_dtype));
  WorkspaceLayout w;
  workspace_layout(d, &w);  // fits: checked when planning
  if (kv.batch == 0) return w;
  if (kv.num_pages < 1) throw_argument(fn, "kv.num_pages", ">= 1", decode_str(kv.num_pages));
  if (kv.page_size > (std::int64_t{1} << 30))
    throw_argument(fn, "kv.page_size", "<= 2^30", decode_str(kv.page_size));
  detail::check_mla_copies(fn, q_nope, q_pe, kv);
  std::int64_t grid = 0;
  if (!checked_mul(kv.batch, std::int64_t{d.row_tiles} * d.splits.max_splits, &grid) ||
      grid > 0x7FFFFFFF)
    throw_argument(fn, "kv.batch", "a grid of at most 2^31 - 1 CTAs",
                   decode_str(kv.batch) + " requests × " + decode_str(d.row_tiles) +
                       " row tiles × " + decode_str(d.splits.max_splits) + " splits");
  if (w.total > 0) {
    detail::check_mla_workspace(fn, q_nope, q_pe, kv, out, workspace, workspace_bytes, w.total);
    const auto disjoint = [&](const char* name, const void* p, std::int64_t bytes) {
      attnstate::detail::check_buffer_disjoint(fn, "workspace", workspace,
                                               static_cast<std::int64_t>(w.total), name, p, bytes);
    };
    disjoint("kv.seq_lens", kv.seq_lens, kv.batch * 4);
    disjoint("kv.page_indptr", kv.page_indptr, (kv.batch + 1) * 4);
    disjoint("kv.block_table", kv.block_table,
             kv.block_table != nullptr ? kv.batch * kv.block_table_stride * 4 : 0);
  }
  detail::check_device_sinks(fn, sinks, pr.heads, out, workspace, workspace_bytes);
  const catalog::Row& row = catalog::kRows[static_cast<std::size_t>(d.kernel_id)];
  if ((row.needs & catalog::kNeedsWgmma) != 0 && !detail::device_facts().wgmma())
    throw_argument(fn, "plan",
                   "a plan whose kernel the device runs (its wgmma row needs an sm_90 device "
                   "running sm_90a code)",
                   std::string("a plan of ") + catalog::to_string(row.family),
                   Status::kNotSupported);
  return w;
}

/// Launches the plan's row on the checked arguments.
void launch(const MlaDecodePlan& plan, const ConstTensorView& q_nope, const ConstTensorView& q_pe,
            const MlaKvCache& kv, const AttentionSinks& sinks, const StateView& out,
            void* workspace, const WorkspaceLayout& w, cudaStream_t stream) {
  const MlaDecodePlanData& d = MlaDecodePlanAccess::data(plan);
  const std::int64_t grid = kv.batch * d.row_tiles * d.splits.max_splits;
  if (grid == 0) return;
  detail::MlaParams p{};
  detail::fill_mla_inputs(q_nope, q_pe, kv, d.problem.q_len, d.problem.heads, d.scale, &p);
  p.row_tiles = d.row_tiles;
  p.splits = d.splits;
  p.out_o = out.o;
  p.out_lse = out.lse;
  p.o_stride_token = out.o_stride_token;
  p.o_stride_head = out.o_stride_head;
  p.lse_stride_token = out.lse_stride_token;
  p.lse_stride_head = out.lse_stride_head;
  p.out_dtype = out.dtype;
  p.out_base = out.base;
  const auto out_esize = static_cast<std::uintptr_t>(size_of(out.dtype));
  p.out_vec4 = reinterpret_cast<std::uintptr_t>(out.o) % (4 * out_esize) == 0 &&
               out.o_stride_token % 4 == 0 && out.o_stride_head % 4 == 0;
  char* ws = static_cast<char*>(workspace);
  p.ws_o = w.total ? reinterpret_cast<float*>(ws + w.o_off) : nullptr;
  p.ws_lse = w.total ? reinterpret_cast<float*>(ws + w.lse_off) : nullptr;
  p.tickets = w.total && !w.stacked ? reinterpret_cast<std::int32_t*>(ws + w.ticket_off) : nullptr;
  p.stack_rows = w.stacked ? kv.batch * d.problem.q_len * d.problem.heads : 0;
  p.sinks = w.stacked ? nullptr : sinks.logits;  // the stacked merge merges the sinks
  const auto id = static_cast<std::size_t>(d.kernel_id);
  const catalog::Family family = catalog::kRows[id].family;
  const auto l =
      family == catalog::Family::kMlaDecodeWs
          ? detail::kMlaLaunchTable<DecodeRows<catalog::Family::kMlaDecodeWs>>[id]
      : family == catalog::Family::kMlaDecodeNarrow
          ? detail::kMlaLaunchTable<DecodeRows<catalog::Family::kMlaDecodeNarrow>>[id]
      : family == catalog::Family::kMlaDecodeNarrow2
          ? detail::kMlaLaunchTable<DecodeRows<catalog::Family::kMlaDecodeNarrow2>>[id]
      : family == catalog::Family::kMlaDecodeWsBalanced
          ? detail::kMlaLaunchTable<DecodeRows<catalog::Family::kMlaDecodeWsBalanced>>[id]
          : detail::kMlaLaunchTable<DecodeRows<catalog::Family::kMlaDecode>>[id];
  if (l == nullptr)  // a plan of this build names an MLA row (checked by its fingerprint)
    throw_argument(kRunFn, "plan", "a plan naming an MLA decode row",
                   "kernel id " + decode_str(d.kernel_id), Status::kInternal);
  l(p, grid, stream);
  if (w.stacked)
    detail::merge_mla_stack(workspace, w.stack, kv.batch * d.problem.q_len, d.splits.max_splits,
                            d.problem.heads, sinks, out, stream);
}

}  // namespace

std::size_t MlaDecodePlan::workspace_bytes() const {
  WorkspaceLayout w;
  workspace_layout(d_, &w);
  return w.total;
}

std::string MlaDecodePlan::to_string() const {
  if (d_.catalog_fingerprint != catalog::kFingerprint)
    return "no plan (not made by plan_mla_decode)";
  const catalog::Row& r = catalog::kRows[static_cast<std::size_t>(d_.kernel_id)];
  const int S = d_.splits.max_splits;
  return std::string(catalog::to_string(r.family)) + ", kernel " + decode_str(d_.kernel_id) + " (" +
         attnstate::to_string(r.q) + " queries, " + attnstate::to_string(d_.problem.ckv_dtype) +
         " latent / " + attnstate::to_string(d_.problem.kpe_dtype) + " rotary cache, " +
         decode_str(r.tile_rows) + " × " + decode_str(r.tile_keys) + " tiles); " +
         decode_str(d_.problem.heads) + " heads × q_len " + decode_str(d_.problem.q_len) + " in " +
         decode_str(d_.row_tiles) + " row tile" + (d_.row_tiles == 1 ? "" : "s") + "; " +
         (S == 1 ? std::string("one split per request")
                 : "at most " + decode_str(S) + " splits per request (" +
                       (plan::mla_stack_merge(S) ? "merge_states over the stacked splits"
                                                 : "the ticket merge in the workspace") +
                       ")");
}

MlaDecodePlan plan_mla_decode(const MlaDecodeProblem& problem, const std::int32_t* seq_lens_host,
                              const DecodeOptions& options, int num_sms, MlaDecodeKernel kernel) {
  const char* fn = kPlanFn;
  detail::check_mla_problem(fn, problem);
  if (num_sms < 1) throw_argument(fn, "num_sms", ">= 1", decode_str(num_sms));
  check_options(fn, options);
  if (kernel != MlaDecodeKernel::kAuto && kernel != MlaDecodeKernel::kMma &&
      kernel != MlaDecodeKernel::kWgmma && kernel != MlaDecodeKernel::kWgmmaNarrow &&
      kernel != MlaDecodeKernel::kWgmmaNarrow2 && kernel != MlaDecodeKernel::kWgmmaBalanced)
    throw_argument(fn, "kernel",
                   "kAuto, kMma, kWgmma, kWgmmaNarrow, kWgmmaNarrow2 or kWgmmaBalanced",
                   "value " + decode_str(static_cast<int>(kernel)));
  const float scale = attnstate::detail::resolve_scale(fn, "options.scale", options.scale,
                                                       problem.kv_lora_rank + problem.rope_dim);
  const int row_tiles = static_cast<int>(
      (problem.q_len * problem.heads + catalog::kMlaTileRows - 1) / catalog::kMlaTileRows);
  // the split chooser sees one KV head of the key width, `row_tiles` CTAs per split
  DecodeProblem dp;
  dp.batch = problem.batch;
  dp.q_len = problem.q_len;
  dp.heads_q = problem.heads;
  dp.heads_kv = 1;
  dp.head_dim = problem.kv_lora_rank + problem.rope_dim;
  dp.q_dtype = problem.q_dtype;
  dp.kv_dtype = problem.ckv_dtype;
  const bool wgmma = kernel == MlaDecodeKernel::kAuto && current_device_wgmma();
  // the slots of the automatic layout: the two-CTA narrow kernel's SMs hold two CTAs each;
  // `kAuto` takes that kernel for few rows of an fp8 latent cache where its layout keeps the
  // splits long enough (`plan::mla_narrow2_layout_ok`)
  MlaDecodeKernel chosen = kernel;
  SplitLayout splits;
  bool planned = false;
  if (wgmma && problem.q_len * problem.heads <= tuning::kMlaNarrowAutoRows &&
      problem.ckv_dtype != DType::kBF16 &&
      catalog::find_id(mla_query(problem, catalog::Family::kMlaDecodeNarrow2)) >= 0) {
    const SplitLayout two = plan::mla_decode_layout(fn, dp, seq_lens_host, options, num_sms,
                                                    row_tiles, catalog::kMlaNarrow2CtasPerSm);
    if (plan::mla_narrow2_layout_ok(two, seq_lens_host, problem.batch)) {
      chosen = MlaDecodeKernel::kWgmmaNarrow2;
      splits = two;
      planned = true;
    }
  }
  if (!planned)
    splits = plan::mla_decode_layout(
        fn, dp, seq_lens_host, options, num_sms, row_tiles,
        chosen == MlaDecodeKernel::kWgmmaNarrow2 ? catalog::kMlaNarrow2CtasPerSm : 1);
  MlaDecodePlan plan;
  MlaDecodePlanData& d = MlaDecodePlanAccess::data(plan);
  d.problem = problem;
  d.splits = splits;
  d.scale = scale;
  d.catalog_fingerprint = catalog::kFingerprint;
  d.kernel_id = kernel_row(fn, problem, chosen, wgmma);
  d.row_tiles = row_tiles;
  d.num_sms = num_sms;
  WorkspaceLayout w;
  std::int64_t grid = 0;
  if (!workspace_layout(d, &w))
    throw_argument(
        fn, "problem.batch", "a workspace within 2^62 bytes",
        decode_str(problem.batch) + " requests × " + decode_str(splits.max_splits) + " splits");
  if (!checked_mul(problem.batch, std::int64_t{row_tiles} * splits.max_splits, &grid) ||
      grid > 0x7FFFFFFF)
    throw_argument(fn, "problem.batch", "a grid of at most 2^31 - 1 CTAs",
                   decode_str(problem.batch) + " requests × " + decode_str(row_tiles) +
                       " row tiles × " + decode_str(splits.max_splits) + " splits");
  return plan;
}

void init_mla_decode_workspace(const MlaDecodePlan& plan, void* workspace,
                               std::size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "attnstate::cuda::init_mla_decode_workspace";
  const MlaDecodePlanData& d = MlaDecodePlanAccess::data(plan);
  detail::check_plan_fingerprint(fn, d.catalog_fingerprint, "plan_mla_decode");
  WorkspaceLayout w;
  workspace_layout(d, &w);
  if (w.total == w.ticket_off) return;  // nothing to zero: no split, or the stacked merge
  if (workspace == nullptr) throw_argument(fn, "workspace", "non-null", "null");
  if (workspace_bytes < w.total)
    throw_argument(fn, "workspace_bytes", ">= plan.workspace_bytes() = " + decode_str(w.total),
                   decode_str(static_cast<std::int64_t>(workspace_bytes)),
                   Status::kWorkspaceTooSmall);
  ATTNSTATE_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(workspace) + w.ticket_off, 0,
                                       w.total - w.ticket_off, stream));
}

void run_mla_decode(const MlaDecodePlan& plan, const ConstTensorView& q_nope,
                    const ConstTensorView& q_pe, const MlaKvCache& kv, StateView out,
                    void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  run_mla_decode(plan, q_nope, q_pe, kv, AttentionSinks{}, out, workspace, workspace_bytes, stream);
}

void run_mla_decode(const MlaDecodePlan& plan, const ConstTensorView& q_nope,
                    const ConstTensorView& q_pe, const MlaKvCache& kv, const AttentionSinks& sinks,
                    StateView out, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream) {
  const WorkspaceLayout w =
      check_run(plan, q_nope, q_pe, kv, sinks, out, workspace, workspace_bytes);
  launch(plan, q_nope, q_pe, kv, sinks, out, workspace, w, stream);
}

}  // namespace cuda
}  // namespace attnstate
