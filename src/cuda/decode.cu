/// @file decode.cu
/// @brief CUDA split-KV decode: planning, argument checks, workspace layout and the one
///        runtime → compile-time dispatch (head dim × dtype) of the decode kernel.
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"
#include "cpu/decode_validate.hpp"
#include "cuda/kernels/decode_split_kv.cuh"

namespace attnstate {
namespace cuda {
namespace {

using attnstate::detail::decode_str;
using attnstate::detail::throw_argument;

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

/// Concurrent CTAs per SM of the kernel for a head dim (shared memory bound).
int ctas_per_sm(std::int64_t head_dim) { return head_dim <= 64 ? 4 : head_dim <= 128 ? 2 : 1; }

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

/// Raises the kernel's dynamic shared-memory limit once per device (function attributes belong to
/// the device context, so a process driving several GPUs sets them on each).
template <int D, bool kBF16>
void ensure_kernel_attributes() {
  int device = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::vector<bool> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (device < static_cast<int>(done.size()) && done[static_cast<std::size_t>(device)]) return;
  ATTNSTATE_CUDA_CHECK(cudaFuncSetAttribute(
      detail::decode_split_kv_kernel<D, kBF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(detail::decode_smem_bytes(D, kMaxSplits))));
  // Prefer the largest shared-memory carveout so that the planned CTAs per SM fit.
  ATTNSTATE_CUDA_CHECK(cudaFuncSetAttribute(detail::decode_split_kv_kernel<D, kBF16>,
                                            cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  if (device >= static_cast<int>(done.size())) done.resize(static_cast<std::size_t>(device) + 1);
  done[static_cast<std::size_t>(device)] = true;
}

template <int D, bool kBF16>
void launch(const detail::DecodeParams& p, std::int64_t grid, cudaStream_t stream) {
  ensure_kernel_attributes<D, kBF16>();
  const std::int64_t smem = detail::decode_smem_bytes(D, p.splits.max_splits);
  detail::decode_split_kv_kernel<D, kBF16><<<static_cast<unsigned>(grid), detail::kDecodeWarps * 32,
                                             static_cast<std::size_t>(smem), stream>>>(p);
  ATTNSTATE_CHECK_LAUNCH(stream, "decode_split_kv_kernel");
}

template <int D>
void dispatch_dtype(const detail::DecodeParams& p, DType dt, std::int64_t grid,
                    cudaStream_t stream) {
  if (dt == DType::kBF16) {
    launch<D, true>(p, grid, stream);
  } else {
    launch<D, false>(p, grid, stream);
  }
}

/// The one place where (head_dim, dtype) become template arguments.
void dispatch(const detail::DecodeParams& p, std::int64_t head_dim, DType dt, std::int64_t grid,
              cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      dispatch_dtype<64>(p, dt, grid, stream);
      break;
    case 128:
      dispatch_dtype<128>(p, dt, grid, stream);
      break;
    default:
      dispatch_dtype<256>(p, dt, grid, stream);
      break;
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
      options.scale != 0.f ? options.scale : 1.f / std::sqrt(static_cast<float>(problem.head_dim));
  attnstate::detail::validate_scale(fn, scale);
  DecodePlan plan;
  plan.problem = problem;
  plan.scale = scale;
  plan.num_sms = num_sms;
  const std::int64_t rows = problem.q_len * problem.group();
  plan.row_tiles = static_cast<int>((rows + detail::kDecodeTileRows - 1) / detail::kDecodeTileRows);
  const std::int64_t slots = static_cast<std::int64_t>(num_sms) * ctas_per_sm(problem.head_dim);
  plan.splits =
      plan_split_layout(problem, seq_lens_host, options, slots, problem.heads_kv * plan.row_tiles);
  const std::int64_t grid =
      problem.batch * problem.heads_kv * plan.row_tiles * plan.splits.max_splits;
  if (grid > 0x7FFFFFFF) throw_argument(fn, "problem", "at most 2^31-1 CTAs", decode_str(grid));
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
  const char* fn = "attnstate::cuda::run_decode";
  const DecodeProblem& pr = plan.problem;
  validate_problem(fn, pr);
  attnstate::detail::validate_split_layout(fn, plan.splits);
  attnstate::detail::validate_scale(fn, plan.scale);
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
  if (kv.batch == 0) return;
  if (kv.num_pages < 1) throw_argument(fn, "kv.num_pages", ">= 1", decode_str(kv.num_pages));
  if (reinterpret_cast<std::uintptr_t>(kv.k) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(kv.v) % 16 != 0)
    throw_argument(fn, "kv.k", "16-byte aligned K and V pools", "a misaligned pointer");
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
    if (reinterpret_cast<std::uintptr_t>(workspace) % 16 != 0)
      throw_argument(fn, "workspace", "16-byte aligned", "a misaligned pointer");
  }

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
  p.s2_scale = math::base2_score_scale(plan.scale);
  p.out_o = out.o;
  p.out_lse = out.lse;
  p.o_stride_token = out.o_stride_token;
  p.o_stride_head = out.o_stride_head;
  p.lse_stride_token = out.lse_stride_token;
  p.lse_stride_head = out.lse_stride_head;
  p.out_dtype = out.dtype;
  p.out_base = out.base;
  char* ws = static_cast<char*>(workspace);
  p.ws_o = w.total ? reinterpret_cast<float*>(ws + w.o_off) : nullptr;
  p.ws_lse = w.total ? reinterpret_cast<float*>(ws + w.lse_off) : nullptr;
  p.tickets = w.total ? reinterpret_cast<std::int32_t*>(ws + w.ticket_off) : nullptr;
  p.skip_combine = plan.profile_skip_combine;
  const std::int64_t grid = kv.batch * pr.heads_kv * plan.row_tiles * plan.splits.max_splits;
  dispatch(p, pr.head_dim, pr.kv_dtype, grid, stream);
}

}  // namespace cuda
}  // namespace attnstate
