/// @file decode.cu
/// @brief CUDA split-KV decode: planning, argument checks, workspace layout and the one
///        runtime → compile-time dispatch (head dim × dtype × pipeline depth) of the decode
///        kernel, with the choice of the split merge (cluster or workspace).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"
#include "common/decode_validate.hpp"
#include "cuda/decode_prior.hpp"
#include "cuda/kernels/decode/split_kv.cuh"
#include "cuda/kernels/decode/stream.cuh"
#include "cuda/tuning_sm90.hpp"

namespace attnstate {
namespace cuda {
namespace {

using attnstate::detail::decode_str;
using attnstate::detail::throw_argument;

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

/// Whether a plan may run in the short-split configuration (head dim 128, splits of at most
/// `kDecodeShortTokens` tokens). Both configurations give bitwise the same results; `launch_d128`
/// picks one per launch.
bool short_candidate(std::int64_t head_dim, const SplitLayout& splits) {
  return head_dim == 128 && detail::kDecodeShortTokens > 0 &&
         detail::kDecodeShortStages != detail::kDecodeStages &&
         splits.policy == SplitPolicy::kFixedSize &&
         splits.split_size <= detail::kDecodeShortTokens;
}

/// Concurrent CTAs per SM of the kernel (default configuration) for a head dim.
int ctas_per_sm(std::int64_t head_dim) {
  return head_dim <= 64    ? detail::decode_ctas_per_sm(64, detail::kDecodeStages)
         : head_dim <= 128 ? detail::decode_ctas_per_sm(128, detail::kDecodeStages)
                           : detail::decode_ctas_per_sm(256, detail::kDecodeStages);
}

/// The automatic split layout for `slots` concurrent CTAs: the wave-efficiency heuristic, then,
/// for short requests, at most as many splits as a cluster merges in distributed shared memory
/// (rather than many tiny splits merged through the workspace); for long ones, a split count
/// rounded up to `tuning::kDecodeSplitMultiple` when the grid stays within the slots.
/// Errors name `fn` and `seq_lens_host` (the argument of `plan_decode`).
SplitLayout auto_layout(const char* fn, const DecodeProblem& problem, const std::int32_t* seq_lens,
                        const DecodeOptions& options, std::int64_t slots, int row_tiles) {
  SplitLayout l = plan_split_layout(problem, seq_lens, options, slots, problem.heads_kv * row_tiles,
                                    fn, "seq_lens_host", "options");
  std::int64_t max_len = 0;
  for (std::int64_t i = 0; i < problem.batch; ++i)
    max_len = std::max<std::int64_t>(max_len, seq_lens[i]);
  if (detail::kDecodeMaxCluster > 1 && l.max_splits > detail::kDecodeMaxCluster) {
    std::int64_t chunk = (max_len + detail::kDecodeMaxCluster - 1) / detail::kDecodeMaxCluster;
    chunk = (chunk + kSplitGranularity - 1) / kSplitGranularity * kSplitGranularity;
    if (chunk > 0 && chunk <= tuning::kDecodeClusterTokens) {
      l.split_size = static_cast<std::int32_t>(chunk);
      l.max_splits = static_cast<std::int32_t>((max_len + chunk - 1) / chunk);
    }
  }
  const int mult = tuning::kDecodeSplitMultiple;
  if (mult > 1 && l.policy == SplitPolicy::kFixedSize && l.max_splits > detail::kDecodeMaxCluster &&
      l.max_splits % mult != 0) {
    const std::int64_t target = (l.max_splits + mult - 1) / mult * mult;
    const std::int64_t grid = problem.batch * problem.heads_kv * row_tiles * target;
    std::int64_t chunk = (max_len + target - 1) / target;
    chunk = (chunk + kSplitGranularity - 1) / kSplitGranularity * kSplitGranularity;
    if (target <= kMaxSplits && grid <= slots && chunk > 0 &&
        (max_len + chunk - 1) / chunk == target) {
      l.split_size = static_cast<std::int32_t>(chunk);
      l.max_splits = static_cast<std::int32_t>(target);
    }
  }
  return l;
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

WorkspaceLayout workspace_layout(const DecodePlan& plan) {
  WorkspaceLayout w;
  if (plan.splits.max_splits <= 1) return w;
  const std::size_t tiles = static_cast<std::size_t>(plan.problem.batch) *
                            static_cast<std::size_t>(plan.problem.heads_kv) *
                            static_cast<std::size_t>(plan.row_tiles);
  const std::size_t parts =
      tiles * static_cast<std::size_t>(plan.splits.max_splits) * detail::kDecodeTileRows;
  w.o_off = 0;
  w.lse_off = align_up(parts * static_cast<std::size_t>(plan.problem.head_dim) * 4);
  w.ticket_off = w.lse_off + align_up(parts * 4);
  w.total = w.ticket_off + align_up(tiles * 4);
  return w;
}

/// Lets this thread make non-stream CUDA calls while a stream is being captured (restores the
/// previous capture mode on scope exit).
struct RelaxedCaptureMode {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  RelaxedCaptureMode() { ATTNSTATE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode)); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;
};

/// Raises `kKernel`'s dynamic shared-memory limit to `smem` bytes and prefers the largest
/// shared-memory carveout, once per device (function attributes belong to the device context,
/// so a process driving several GPUs sets them on each). The first call may come while the
/// caller captures a graph: these are not stream operations.
template <auto kKernel>
void raise_smem_limit(int smem) {
  int device = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::vector<bool> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (device < static_cast<int>(done.size()) && done[static_cast<std::size_t>(device)]) return;
  RelaxedCaptureMode relaxed;
  ATTNSTATE_CUDA_CHECK(
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  ATTNSTATE_CUDA_CHECK(
      cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  if (device >= static_cast<int>(done.size())) done.resize(static_cast<std::size_t>(device) + 1);
  done[static_cast<std::size_t>(device)] = true;
}

/// True when a decode launch is a programmatic dependent launch: prior states to fold (from the
/// previous kernel of the stream), a launch beside the previous kernel, or the plan's choice.
bool programmatic_launch(const detail::DecodeParams& p) {
  return p.prior_count > 0 || p.beside_previous != 0 || p.programmatic != 0;
}

/// Per-device state of one kernel instantiation: how many clusters of each size the device
/// keeps resident at once.
struct KernelDeviceState {
  int max_clusters[detail::kDecodeMaxWsGroup + 1] = {};  // -1 unknown
  KernelDeviceState() {
    for (int& c : max_clusters) c = -1;
  }
};

/// Raises the kernel's dynamic shared-memory limit once per device and returns how many
/// clusters of `cluster` CTAs can be resident at once (queried once per device and size; 0 for
/// sizes the merge does not use).
template <int D, bool kBF16, int kStages>
int prepare_kernel(int cluster) {
  constexpr auto kernel = detail::decode_split_kv_kernel<D, kBF16, kStages>;
  const int smem = static_cast<int>(detail::decode_smem_bytes(D, kStages));
  raise_smem_limit<kernel>(smem);  // the largest carveout, so that the planned CTAs per SM fit
  if (cluster < 2 || cluster > detail::kDecodeMaxWsGroup) return 0;
  int device = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::vector<KernelDeviceState> states;
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= static_cast<int>(states.size()))
    states.resize(static_cast<std::size_t>(device) + 1);
  KernelDeviceState& st = states[static_cast<std::size_t>(device)];
  if (st.max_clusters[cluster] >= 0) return st.max_clusters[cluster];
  RelaxedCaptureMode relaxed;  // an occupancy query, not a stream operation
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(cluster));
  cfg.blockDim = dim3(detail::kDecodeWarps * 32);
  cfg.dynamicSmemBytes = static_cast<std::size_t>(smem);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  ATTNSTATE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
  st.max_clusters[cluster] = n;
  return n;
}

/// The group size of the workspace merge of `S` splits on a grid of `grid` CTAs: the largest
/// size that divides the split count and keeps every cluster resident at once, 1 for none.
template <int D, bool kBF16, int kStages>
int ws_group(int S, std::int64_t grid) {
  for (int c = std::min(detail::kDecodeWsGroup, S - 1); c >= 2; --c)
    if (S % c == 0 && grid / c <= prepare_kernel<D, kBF16, kStages>(c)) return c;
  return 1;
}

template <int D, bool kBF16, int kStages>
void launch(detail::DecodeParams p, std::int64_t grid, cudaStream_t stream) {
  const int resident = prepare_kernel<D, kBF16, kStages>(p.cluster);
  // The cluster merge pays off only when every cluster is resident at once (one wave); otherwise
  // the splits merge through the workspace (the same arithmetic, the same bits).
  if (p.cluster > 1 && grid / p.cluster > resident) p.cluster = 1;
  // Workspace merge of a one-wave grid: groups of consecutive splits in clusters (the largest
  // size that divides the split count and keeps every cluster resident), so that the last
  // group's CTAs share the merge.
  const int S = p.splits.max_splits;
  if (p.cluster == 1 && S > 1) p.cluster = ws_group<D, kBF16, kStages>(S, grid);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(detail::kDecodeWarps * 32);
  cfg.dynamicSmemBytes = static_cast<std::size_t>(detail::decode_smem_bytes(D, kStages));
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n_attr = 0;
  if (p.cluster > 1) {
    attr[n_attr].id = cudaLaunchAttributeClusterDimension;
    attr[n_attr].val.clusterDim.x = static_cast<unsigned>(p.cluster);
    attr[n_attr].val.clusterDim.y = 1;
    attr[n_attr].val.clusterDim.z = 1;
    ++n_attr;
  }
  if (programmatic_launch(p)) {
    // The prior states come from the previous kernel of the stream: this one may start while
    // that one finishes (programmatic dependent launch); it waits before reading them. Beside
    // the previous kernel: it reads nothing that kernel writes; its last CTA holds the grid.
    // Programmatic (the plan's choice): every CTA waits for that kernel before its first read.
    attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n_attr].val.programmaticStreamSerializationAllowed = 1;
    ++n_attr;
  }
  cfg.attrs = n_attr > 0 ? attr : nullptr;
  cfg.numAttrs = n_attr;
  ATTNSTATE_CUDA_CHECK(
      cudaLaunchKernelEx(&cfg, detail::decode_split_kv_kernel<D, kBF16, kStages>, p));
  ATTNSTATE_CHECK_LAUNCH(stream, "decode_split_kv_kernel");
}

/// Head dim 128: the short-split configuration (one more CTA per SM) when the plan allows it and
/// the launch needs it: more CTAs than one wave of the default configuration, or clusters that
/// are all resident at once only with it. Otherwise the default (deeper pipeline per warp).
template <bool kBF16>
void launch_d128(const detail::DecodeParams& p, std::int64_t grid, bool short_ok, int num_sms,
                 cudaStream_t stream) {
  constexpr int kLong = detail::kDecodeStages;
  constexpr int kShort = detail::kDecodeShortStages;
  bool use_short = false;
  if (short_ok) {
    use_short = grid > static_cast<std::int64_t>(num_sms) * detail::decode_ctas_per_sm(128, kLong);
    if (!use_short && p.cluster > 1) {
      const std::int64_t clusters = grid / p.cluster;
      use_short = clusters > prepare_kernel<128, kBF16, kLong>(p.cluster) &&
                  clusters <= prepare_kernel<128, kBF16, kShort>(p.cluster);
    }
  }
  if (use_short)
    launch<128, kBF16, kShort>(p, grid, stream);
  else
    launch<128, kBF16, kLong>(p, grid, stream);
}

/// The one place where (head_dim, dtype, pipeline depth) become template arguments; only head
/// dim 128 has the short-split configuration.
void dispatch(const detail::DecodeParams& p, std::int64_t head_dim, DType dt, bool short_ok,
              int num_sms, std::int64_t grid, cudaStream_t stream) {
  const bool bf16 = dt == DType::kBF16;
  switch (head_dim) {
    case 64:
      if (bf16)
        launch<64, true, detail::kDecodeStages>(p, grid, stream);
      else
        launch<64, false, detail::kDecodeStages>(p, grid, stream);
      break;
    case 128:
      if (bf16)
        launch_d128<true>(p, grid, short_ok, num_sms, stream);
      else
        launch_d128<false>(p, grid, short_ok, num_sms, stream);
      break;
    default:
      if (bf16)
        launch<256, true, detail::kDecodeStages>(p, grid, stream);
      else
        launch<256, false, detail::kDecodeStages>(p, grid, stream);
      break;
  }
}

/// Launches the streamed kernel: one CTA per SM (fewer when there are fewer items).
template <int D, bool kBF16>
void launch_stream(const detail::DecodeParams& p, std::int64_t items, int num_sms,
                   cudaStream_t stream) {
  raise_smem_limit<detail::decode_stream_kernel<D, kBF16>>(
      static_cast<int>(detail::stream_smem_bytes(D)));
  constexpr int kWarps = detail::stream_warps(D);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(std::min<std::int64_t>(items, num_sms)));
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = static_cast<std::size_t>(detail::stream_smem_bytes(D));
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  if (programmatic_launch(p)) {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;  // as in `launch`
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  ATTNSTATE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, detail::decode_stream_kernel<D, kBF16>, p));
  ATTNSTATE_CHECK_LAUNCH(stream, "decode_stream_kernel");
}

/// (head_dim, dtype) → template arguments of the streamed kernel (head dims 64 and 128).
void dispatch_stream(const detail::DecodeParams& p, std::int64_t head_dim, DType dt,
                     std::int64_t items, int num_sms, cudaStream_t stream) {
  const bool bf16 = dt == DType::kBF16;
  if (head_dim == 64) {
    if (bf16)
      launch_stream<64, true>(p, items, num_sms, stream);
    else
      launch_stream<64, false>(p, items, num_sms, stream);
  } else {
    if (bf16)
      launch_stream<128, true>(p, items, num_sms, stream);
    else
      launch_stream<128, false>(p, items, num_sms, stream);
  }
}

void validate_problem(const char* fn, const DecodeProblem& pr) {
  if (pr.batch < 0) throw_argument(fn, "problem.batch", ">= 0", decode_str(pr.batch));
  if (pr.q_len < 1 || pr.q_len > 8)
    throw_argument(fn, "problem.q_len", "1..8", decode_str(pr.q_len));
  if (pr.heads_kv < 1) throw_argument(fn, "problem.heads_kv", ">= 1", decode_str(pr.heads_kv));
  if (pr.heads_q < 1 || pr.heads_q % pr.heads_kv != 0)
    throw_argument(fn, "problem.heads_q", "a positive multiple of heads_kv",
                   decode_str(pr.heads_q));
  if (pr.head_dim != 64 && pr.head_dim != 128 && pr.head_dim != 256)
    throw_argument(fn, "problem.head_dim", "64, 128 or 256", decode_str(pr.head_dim),
                   Status::kNotSupported);
  if (pr.kv_dtype != DType::kF16 && pr.kv_dtype != DType::kBF16)
    throw_argument(fn, "problem.kv_dtype", "f16 or bf16", to_string(pr.kv_dtype),
                   Status::kNotSupported);
  if (pr.q_dtype != pr.kv_dtype)
    throw_argument(fn, "problem.q_dtype", std::string("the KV dtype ") + to_string(pr.kv_dtype),
                   to_string(pr.q_dtype), Status::kNotSupported);
}

}  // namespace

std::size_t DecodePlan::workspace_bytes() const { return workspace_layout(*this).total; }

DecodePlan plan_decode(const DecodeProblem& problem, const std::int32_t* seq_lens_host,
                       const DecodeOptions& options, int num_sms) {
  const char* fn = "attnstate::cuda::plan_decode";
  validate_problem(fn, problem);
  if (num_sms < 1) throw_argument(fn, "num_sms", ">= 1", decode_str(num_sms));
  const float scale =
      attnstate::detail::resolve_scale(fn, "options.scale", options.scale, problem.head_dim);
  DecodePlan plan;
  plan.problem = problem;
  plan.scale = scale;
  plan.num_sms = num_sms;
  const std::int64_t rows = problem.q_len * problem.group();
  plan.row_tiles = static_cast<int>((rows + detail::kDecodeTileRows - 1) / detail::kDecodeTileRows);
  const std::int64_t slots = static_cast<std::int64_t>(num_sms) * ctas_per_sm(problem.head_dim);
  plan.splits =
      options.policy == SplitPolicy::kAuto
          ? auto_layout(fn, problem, seq_lens_host, options, slots, plan.row_tiles)
          : plan_split_layout(problem, seq_lens_host, options, slots,
                              problem.heads_kv * plan.row_tiles, fn, "seq_lens_host", "options");
  const std::int64_t grid =
      problem.batch * problem.heads_kv * plan.row_tiles * plan.splits.max_splits;
  if (grid > 0x7FFFFFFF) throw_argument(fn, "problem", "at most 2^31-1 CTAs", decode_str(grid));
  // Automatic policy, one split each, requests up to the cap and enough items to keep at least
  // 3/4 of the streamed kernel's warps busy on every SM: the streamed kernel (its warps' copies
  // run on from one item into the next). With fewer items its SMs hold too few warps to hide
  // the latency of their arithmetic (bench/RESULTS.md, the streamed kernel's section).
  std::int64_t max_len = 0;
  for (std::int64_t i = 0; i < problem.batch; ++i)
    max_len = std::max<std::int64_t>(max_len, seq_lens_host[i]);
  plan.streamed = options.policy == SplitPolicy::kAuto && plan.splits.max_splits == 1 &&
                  problem.head_dim <= 128 &&
                  4 * grid >= 3 * static_cast<std::int64_t>(num_sms) *
                                  detail::stream_warps(static_cast<int>(problem.head_dim)) &&
                  max_len <= tuning::kDecodeStreamMaxTokens;
  return plan;
}

void init_decode_workspace(const DecodePlan& plan, void* workspace, std::size_t workspace_bytes,
                           cudaStream_t stream) {
  const char* fn = "attnstate::cuda::init_decode_workspace";
  const WorkspaceLayout w = workspace_layout(plan);
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

void detail::run_decode_with_prior(const DecodePlan& plan, const ConstTensorView& q,
                                   const PagedKvCache& kv, StateView out, void* workspace,
                                   std::size_t workspace_bytes, const PriorStates& prior,
                                   cudaStream_t stream) {
  const char* fn = "attnstate::cuda::run_decode";
  const DecodeProblem& pr = plan.problem;
  validate_problem(fn, pr);
  attnstate::detail::validate_split_layout(fn, plan.splits);
  const float scale = attnstate::detail::resolve_scale(fn, "plan.scale", plan.scale, pr.head_dim);
  const std::int64_t pool_bytes =
      attnstate::detail::validate_decode_args(fn, q, kv, out, MemorySpace::kDevice);
  if (kv.batch > pr.batch)
    throw_argument(fn, "kv.batch", "<= plan.problem.batch = " + decode_str(pr.batch),
                   decode_str(kv.batch));
  if (q.shape[1] != pr.q_len)
    throw_argument(fn, "q.shape[1]", "plan.problem.q_len = " + decode_str(pr.q_len),
                   decode_str(q.shape[1]));
  if (q.shape[2] != pr.heads_q)
    throw_argument(fn, "q.shape[2]", "plan.problem.heads_q = " + decode_str(pr.heads_q),
                   decode_str(q.shape[2]));
  if (kv.heads_kv != pr.heads_kv)
    throw_argument(fn, "kv.heads_kv", "plan.problem.heads_kv = " + decode_str(pr.heads_kv),
                   decode_str(kv.heads_kv));
  if (kv.head_dim != pr.head_dim)
    throw_argument(fn, "kv.head_dim", "plan.problem.head_dim = " + decode_str(pr.head_dim),
                   decode_str(kv.head_dim));
  if (q.dtype != pr.q_dtype)
    throw_argument(fn, "q.dtype", std::string("plan.problem.q_dtype = ") + to_string(pr.q_dtype),
                   to_string(q.dtype));
  if (kv.dtype != pr.kv_dtype)
    throw_argument(fn, "kv.dtype", std::string("plan.problem.kv_dtype = ") + to_string(pr.kv_dtype),
                   to_string(kv.dtype));
  if (plan.streamed && plan.splits.max_splits > 1)
    throw_argument(fn, "plan.streamed", "false when requests may be split (max_splits > 1)",
                   "true with max_splits = " + decode_str(plan.splits.max_splits));
  // The plan is a public struct: its derived fields must still agree with its problem.
  const std::int64_t tiles =
      (pr.q_len * pr.group() + detail::kDecodeTileRows - 1) / detail::kDecodeTileRows;
  if (plan.row_tiles != tiles)
    throw_argument(fn, "plan.row_tiles", "ceil(q_len * group / 16) = " + decode_str(tiles),
                   decode_str(plan.row_tiles));
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
  if (kv.batch == 0) return;
  if (kv.num_pages < 1) throw_argument(fn, "kv.num_pages", ">= 1", decode_str(kv.num_pages));
  attnstate::detail::check_aligned(fn, "kv.k", kv.k, 16);  // the kernels' 16-byte copies
  attnstate::detail::check_aligned(fn, "kv.v", kv.v, 16);
  if (kv.page_elems() % 8 != 0)
    throw_argument(fn, "kv.page_stride", "a multiple of 8 elements", decode_str(kv.page_elems()));
  if (kv.page_size > 0x7FFFFFFF / 2)
    throw_argument(fn, "kv.page_size", "< 2^30", decode_str(kv.page_size));
  const WorkspaceLayout w = workspace_layout(plan);
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
  // the launch grid of this batch (plan_decode checked it for the plan's batch)
  const std::int64_t grid = kv.batch * pr.heads_kv * plan.row_tiles * plan.splits.max_splits;
  if (grid > 0x7FFFFFFF)
    throw_argument(fn, "plan.splits.max_splits", "a grid of at most 2^31-1 CTAs",
                   decode_str(grid) + " CTAs");
  if (prior.check_only) return;

  detail::DecodeParams p{};
  p.q = q.data;
  p.q_stride_b = q.stride[0];
  p.q_stride_t = q.stride[1];
  p.q_stride_h = q.stride[2];
  p.k = kv.k;
  p.v = kv.v;
  p.page_elems = kv.page_elems();
  p.num_pages = kv.num_pages;
  p.page_size = static_cast<std::int32_t>(kv.page_size);
  p.heads_kv = static_cast<std::int32_t>(kv.heads_kv);
  p.layout_hnd = kv.layout == KvLayout::kHND ? 1 : 0;
  p.page_indptr = kv.page_indptr;
  p.page_indices = kv.page_indices;
  p.block_table = kv.block_table;
  p.block_table_stride = kv.block_table_stride;
  p.seq_lens = kv.seq_lens;
  p.batch = static_cast<std::int32_t>(kv.batch);
  p.q_len = static_cast<std::int32_t>(pr.q_len);
  p.heads_q = static_cast<std::int32_t>(pr.heads_q);
  p.group = static_cast<std::int32_t>(pr.group());
  p.rows = p.q_len * p.group;
  p.row_tiles = plan.row_tiles;
  p.splits = plan.splits;
  p.s2_scale = math::base2_score_scale(scale);
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
  const int S = plan.splits.max_splits;
  p.cluster = S > 1 && S <= detail::kDecodeMaxCluster ? S : 1;
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
  p.programmatic = plan.programmatic_launch && prior.count == 0 && !prior.beside_previous ? 1 : 0;
  if (plan.streamed && pr.head_dim <= 128 && prior.count == 0 && p.q_vec &&
      kv.page_size % detail::kDecodeTileRows == 0) {
    dispatch_stream(p, pr.head_dim, pr.kv_dtype, grid, plan.num_sms > 0 ? plan.num_sms : 1, stream);
    return;
  }
  dispatch(p, pr.head_dim, pr.kv_dtype, short_candidate(pr.head_dim, plan.splits),
           plan.num_sms > 0 ? plan.num_sms : 1, grid, stream);
}

}  // namespace cuda
}  // namespace attnstate

#if ATTNSTATE_PROBES
/// Probe builds only: copies the per-CTA timeline stamps (8 per CTA, `ctas` CTAs) to `host` and
/// clears them.
extern "C" void attnstate_decode_timeline(unsigned long long* host, int ctas) {
  using attnstate::cuda::detail::g_decode_timeline;
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  ATTNSTATE_CUDA_CHECK(
      cudaMemcpyFromSymbol(host, g_decode_timeline, static_cast<std::size_t>(ctas) * 8 * 8));
  void* addr = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaGetSymbolAddress(&addr, g_decode_timeline));
  ATTNSTATE_CUDA_CHECK(cudaMemset(addr, 0, sizeof(g_decode_timeline)));
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
