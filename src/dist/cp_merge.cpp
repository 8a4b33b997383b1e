#include "attnstate/dist/cp_merge.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/merge.hpp"
#include "common/cp_merge_impl.hpp"
#include "common/validate.hpp"
#include "cuda/decode_prior.hpp"
#include "dist/rescale.hpp"

namespace attnstate {
namespace dist {
namespace {

using attnstate::detail::throw_argument;

[[noreturn]] void throw_nccl(ncclResult_t r, const char* call, const char* file, int line) {
  throw Error(Status::kCudaError, std::string("attnstate::dist: ") + call + " failed at " + file +
                                      ":" + std::to_string(line) + ": " + ncclGetErrorString(r));
}

#define ATTNSTATE_NCCL_CHECK(call)                                                              \
  do {                                                                                          \
    const ncclResult_t attnstate_nccl_ = (call);                                                \
    if (attnstate_nccl_ != ncclSuccess) throw_nccl(attnstate_nccl_, #call, __FILE__, __LINE__); \
  } while (0)

// The CUDA backend's operations for the shared phases (src/common/cp_merge_impl.hpp), queued on
// the caller's stream.
struct DeviceOps {
  MemorySpace space = MemorySpace::kDevice;
  cudaStream_t stream = nullptr;
  void rebase(ConstStateView in, StateView out) { cuda::rebase(in, out, stream); }
  void merge_states(ConstStateStackView states, StateView out) {
    cuda::merge_states(states, out, stream);
  }
  void merge_state_inplace(StateView acc, ConstStateView other) {
    cuda::merge_state_inplace(acc, other, nullptr, stream);
  }
  void rescale(ConstStateView local, ConstStateStackView gathered, StateView out) {
    detail::launch_cp_rescale(local, gathered, out, stream);
  }
  void zero(void* p, std::int64_t bytes) {
    ATTNSTATE_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<std::size_t>(bytes), stream));
  }
};

// Throws naming `comm` / `plan.shape.rank` unless `comm` is the plan's communicator.
void check_comm(const char* fn, const CpMergePlan& plan, ncclComm_t comm) {
  if (comm == nullptr) throw_argument(fn, "comm", "an NCCL communicator", "null");
  int count = 0, rank = 0;
  ATTNSTATE_NCCL_CHECK(ncclCommCount(comm, &count));
  ATTNSTATE_NCCL_CHECK(ncclCommUserRank(comm, &rank));
  if (count != plan.shape.world_size)
    throw_argument(fn, "comm",
                   "a communicator of plan.shape.world_size = " +
                       std::to_string(plan.shape.world_size) + " ranks",
                   std::to_string(count) + " ranks");
  if (rank != plan.shape.rank)
    throw_argument(fn, "plan.shape.rank", std::to_string(rank) + " (this rank in comm)",
                   std::to_string(plan.shape.rank));
}

std::uint8_t* ws_at(void* ws, std::int64_t offset) {
  return static_cast<std::uint8_t*>(ws) + offset;
}

}  // namespace

void check_cp_plans(const CpMergePlan& plan, ncclComm_t comm, cudaStream_t stream) {
  constexpr const char* fn = "attnstate::dist::check_cp_plans";
  check_comm(fn, plan, comm);
  const CpMergeShape& s = plan.shape;
  constexpr int kFields = 10;
  const std::int64_t mine[kFields] = {s.world_size,
                                      s.rank,
                                      s.tokens,
                                      s.heads,
                                      s.head_dim,
                                      static_cast<std::int64_t>(s.dtype),
                                      static_cast<std::int64_t>(s.out_dtype),
                                      static_cast<std::int64_t>(s.wire_base),
                                      static_cast<std::int64_t>(s.algorithm),
                                      static_cast<std::int64_t>(s.output)};
  const std::size_t n = static_cast<std::size_t>(s.world_size);
  void* dev = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&dev, sizeof(mine) * (n + 1)));
  std::vector<std::int64_t> all(kFields * n);
  try {
    auto* d = static_cast<std::int64_t*>(dev);
    ATTNSTATE_CUDA_CHECK(cudaMemcpyAsync(d, mine, sizeof(mine), cudaMemcpyHostToDevice, stream));
    ATTNSTATE_NCCL_CHECK(ncclAllGather(d, d + kFields, kFields, ncclInt64, comm, stream));
    ATTNSTATE_CUDA_CHECK(
        cudaMemcpyAsync(all.data(), d + kFields, sizeof(mine) * n, cudaMemcpyDeviceToHost, stream));
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaFree(dev);
    throw;
  }
  ATTNSTATE_CUDA_CHECK(cudaFree(dev));
  for (std::size_t r = 0; r < n; ++r) {
    const std::int64_t* f = &all[r * kFields];
    CpMergeShape other;
    other.world_size = static_cast<int>(f[0]);
    other.rank = static_cast<int>(f[1]);
    other.tokens = f[2];
    other.heads = f[3];
    other.head_dim = f[4];
    other.dtype = static_cast<DType>(f[5]);
    other.out_dtype = static_cast<DType>(f[6]);
    other.wire_base = static_cast<LseBase>(f[7]);
    other.algorithm = static_cast<CpAlgorithm>(f[8]);
    other.output = static_cast<CpOutput>(f[9]);
    check_cp_plans_agree(s, other, static_cast<int>(r));
  }
}

void cp_merge(const CpMergePlan& plan, ConstStateView local, StateView out, ncclComm_t comm,
              void* workspace, std::size_t workspace_bytes, cudaStream_t stream,
              AttentionSinks sinks) {
  constexpr const char* fn = "attnstate::dist::cp_merge";
  attnstate::detail::check_cp_call(fn, plan, local, "local", out, "out", workspace, workspace_bytes,
                                   MemorySpace::kDevice);
  check_comm(fn, plan, comm);
  cuda::detail::check_device_sinks(fn, sinks, plan.shape.heads, out, workspace,
                                   static_cast<std::size_t>(plan.workspace_bytes));
  const CpMergeShape& s = plan.shape;
  if (s.tokens == 0) return;  // every rank has the same plan: none of them calls a collective
  DeviceOps ops;
  ops.stream = stream;
  const int n = s.world_size;
  attnstate::detail::cp_pack(plan, local, workspace, ops);
  if (s.algorithm == CpAlgorithm::kAllToAll) {
    const std::int64_t mine = plan.chunk_bytes(plan.heads_of(s.rank), s.dtype);
    ATTNSTATE_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < n; ++p) {
      ATTNSTATE_NCCL_CHECK(
          ncclSend(ws_at(workspace, plan.send_offset + plan.send_chunk_offset(p)),
                   static_cast<std::size_t>(plan.chunk_bytes(plan.heads_of(p), s.dtype)), ncclUint8,
                   p, comm, stream));
      ATTNSTATE_NCCL_CHECK(ncclRecv(ws_at(workspace, plan.recv_offset + p * mine),
                                    static_cast<std::size_t>(mine), ncclUint8, p, comm, stream));
    }
    ATTNSTATE_NCCL_CHECK(ncclGroupEnd());
  } else {
    ATTNSTATE_NCCL_CHECK(
        ncclAllGather(ws_at(workspace, plan.lse_offset), ws_at(workspace, plan.gathered_offset),
                      static_cast<std::size_t>(s.tokens * s.heads), ncclFloat32, comm, stream));
  }
  attnstate::detail::cp_combine(plan, out, workspace, ops);
  if (s.algorithm == CpAlgorithm::kAllToAll && s.output == CpOutput::kReplicated) {
    const std::int64_t mine = plan.chunk_bytes(plan.heads_of(s.rank), s.out_dtype);
    ATTNSTATE_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < n; ++p) {
      ATTNSTATE_NCCL_CHECK(ncclSend(ws_at(workspace, plan.mine_offset),
                                    static_cast<std::size_t>(mine), ncclUint8, p, comm, stream));
      ATTNSTATE_NCCL_CHECK(
          ncclRecv(ws_at(workspace, plan.gather_offset + plan.gather_chunk_offset(p)),
                   static_cast<std::size_t>(plan.chunk_bytes(plan.heads_of(p), s.out_dtype)),
                   ncclUint8, p, comm, stream));
    }
    ATTNSTATE_NCCL_CHECK(ncclGroupEnd());
  } else if (s.algorithm == CpAlgorithm::kAllGatherLse) {
    void* scaled = ws_at(workspace, plan.scaled_offset);
    if (s.output == CpOutput::kHeadSharded) {
      ATTNSTATE_NCCL_CHECK(
          ncclReduceScatter(scaled, ws_at(workspace, plan.sum_offset),
                            static_cast<std::size_t>(s.tokens * plan.heads_of(s.rank) * s.head_dim),
                            ncclFloat32, ncclSum, comm, stream));
    } else {
      ATTNSTATE_NCCL_CHECK(ncclAllReduce(scaled, scaled,
                                         static_cast<std::size_t>(plan.scaled_bytes / 4),
                                         ncclFloat32, ncclSum, comm, stream));
    }
  }
  attnstate::detail::cp_finish(plan, out, sinks, workspace, ops);
}

}  // namespace dist
}  // namespace attnstate
