/// @file bench_cp_merge.cu
/// @brief Benchmark of the context-parallel merge over NCCL (`dist::cp_merge`), on N = every power
///        of two up to the visible GPU count (1 included), one process driving every GPU with one
///        thread a rank.
///
/// 1. Per-layer merge: bf16 states of batch {1, 16, 64, 256} × 32 heads × 128, both algorithms
///    and both outputs, beside the bare NCCL collectives moving the same bytes (the plan's
///    grouped ncclSend/ncclRecv chunks, or its ncclAllGather + ncclReduceScatter / ncclAllReduce,
///    on a workspace of the plan's layout) and one local `cuda::merge_states` of the N states of
///    the rank's heads, all in the same run. ratio = merge / (collectives + local merge); the
///    target is at most 1.15. Each point is a CUDA graph of back-to-back calls (plain launches
///    with --no-graph, and where capturing the collectives fails on any rank), the time per call
///    the median over many launches; the inputs stay in L2 (in a decode step the merge reads the
///    states the attention kernel has just written).
/// 2. End-to-end context-parallel decode: batch 1 × a long context (1M tokens, 256k with --quick,
///    halved while the one-GPU cache does not fit), 32/8 heads × 128, bf16 KV in pages of 16,
///    each rank's contiguous shard decoded by `cuda::run_decode` then merged, against
///    `run_decode` of the whole context on one GPU (speedup column); L2 flushed before each step.
///
/// Every time is the slowest rank's median (a step waits for every rank). Each launch starts
/// after a host barrier of the rank threads, so that a collective does not time the ranks' skew.
/// Usage: bench_cp_merge [--csv PATH] [--quick] [--no-graph]
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "attnstate/core/context_parallel.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"
#include "attnstate/cuda/merge.hpp"
#include "attnstate/dist/cp_merge.hpp"
#include "bench_util.cuh"

namespace {

using attnstate::ConstStateStackView;
using attnstate::CpAlgorithm;
using attnstate::CpMergePlan;
using attnstate::CpMergeShape;
using attnstate::CpOutput;
using attnstate::DType;
using attnstate::LseBase;
using attnstate::MemorySpace;
using attnstate::StateView;

constexpr std::int64_t kHeads = 32, kHeadsKv = 8, kHeadDim = 128, kPage = 16;

/// Timed steps of part 2 (each a long decode: fewer than part 1's launches).
int step_reps(bool quick) { return quick ? 5 : 20; }

void nccl_check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(call) + ": " + ncclGetErrorString(r));
}

/// A reusable barrier of the rank threads (C++17 has no std::barrier).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    const std::uint64_t gen = gen_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int count_, waiting_ = 0;
  std::uint64_t gen_ = 0;
};

/// What the rank threads of one world size share.
struct Team {
  int world = 1;
  std::vector<ncclComm_t> comms;
  std::vector<bench_util::FlushTimer>* timers = nullptr;  // one per GPU, GPU r for rank r
  Barrier barrier;
  std::vector<double> slots;  // one value per rank, for `slowest`
  /// Set by a rank whose graph capture failed; read by every rank after a barrier, so that all
  /// ranks launch the same way (a rank left in a collective that its peers never launch hangs).
  std::atomic<bool> capture_failed{false};
  bool graphs = true;
  int reps = 50, calls = 20;  // part 1: launches timed, calls per launch
  int step_reps = 20;         // part 2: steps timed
  explicit Team(int n) : world(n), barrier(n), slots(static_cast<std::size_t>(n)) {}
};

/// The largest of the ranks' values (every rank calls it).
double slowest(Team& team, int rank, double v) {
  team.slots[static_cast<std::size_t>(rank)] = v;
  team.barrier.wait();
  const double m = *std::max_element(team.slots.begin(), team.slots.end());
  team.barrier.wait();  // nobody writes a slot before every rank has read them
  return m;
}

/// Ends a capture left open on `s` by a failed call.
void abandon_capture(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
  }
  cudaGetLastError();
}

/// This rank's median time (µs) of one `body(stream)`: graphs of `team.calls` back-to-back calls
/// (plain launches when graphs are off), launched `team.reps` times, each after a host barrier.
template <class Body>
double time_call_us(Team& team, int rank, Body&& body) {
  bench_util::FlushTimer& t = (*team.timers)[static_cast<std::size_t>(rank)];
  cudaGraphExec_t exec = nullptr;
  if (team.graphs && !team.capture_failed) {
    try {
      cudaGraph_t g = nullptr;
      ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(t.stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < team.calls; ++i) body(t.stream);
      ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(t.stream, &g));
      const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
      cudaGraphDestroy(g);
      ATTNSTATE_CUDA_CHECK(e);
    } catch (const std::exception& e) {
      abandon_capture(t.stream);
      exec = nullptr;
      if (!team.capture_failed.exchange(true))
        std::printf("# rank %d: graph capture failed (%s): plain launches from here on\n", rank,
                    e.what());
    }
  }
  team.barrier.wait();
  if (team.capture_failed && exec) {
    ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
    exec = nullptr;
  }
  const auto launch = [&] {
    if (exec) {
      ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, t.stream));
    } else {
      for (int i = 0; i < team.calls; ++i) body(t.stream);
    }
  };
  launch();  // warm-up (and the graph's upload)
  ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(t.stream));
  const double us = bench_util::event_median_us(
      t.stream, t.e0, t.e1, team.reps, [&](int) { team.barrier.wait(); }, launch);
  if (exec) ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  return us / team.calls;
}

/// Device allocations of one rank thread, freed together.
struct Arena {
  std::vector<void*> ptrs;
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    for (void* p : ptrs) cudaFree(p);
  }
  template <class T = std::uint8_t>
  T* alloc(std::size_t bytes) {
    void* p = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)));
    ptrs.push_back(p);
    return static_cast<T*>(p);
  }
  /// A device state of `tokens` × `heads` × kHeadDim, bf16 `o` filled (seed), LSEs 0 (the merge's
  /// cost does not depend on their values).
  StateView state(std::int64_t tokens, std::int64_t heads, std::uint32_t seed,
                  cudaStream_t stream) {
    const std::size_t n = static_cast<std::size_t>(tokens * heads * kHeadDim);
    auto* o = alloc<std::uint16_t>(n * 2);
    auto* lse = alloc<float>(static_cast<std::size_t>(tokens * heads) * 4);
    bench_util::fill_bf16<<<64, 256, 0, stream>>>(o, n, seed);
    ATTNSTATE_CHECK_LAUNCH(stream, "fill_bf16");
    ATTNSTATE_CUDA_CHECK(
        cudaMemsetAsync(lse, 0, static_cast<std::size_t>(tokens * heads) * 4, stream));
    return attnstate::make_state_view(o, DType::kBF16, lse, tokens, heads, kHeadDim,
                                      LseBase::kNatural, MemorySpace::kDevice);
  }
};

CpMergePlan plan_for(int world, int rank, std::int64_t tokens, CpAlgorithm a, CpOutput o) {
  CpMergeShape s;
  s.world_size = world;
  s.rank = rank;
  s.tokens = tokens;
  s.heads = kHeads;
  s.head_dim = kHeadDim;
  s.dtype = DType::kBF16;
  s.out_dtype = DType::kBF16;
  s.algorithm = a;
  s.output = o;
  return attnstate::plan_cp_merge(s);
}

/// The collectives of `plan` alone, with its chunk sizes on a workspace of its layout: what the
/// merge moves on the wire, without its packing and merge kernels.
void bare_collectives(const CpMergePlan& plan, void* ws, ncclComm_t comm, cudaStream_t stream) {
  const CpMergeShape& s = plan.shape;
  const auto at = [&](std::int64_t offset) { return static_cast<std::uint8_t*>(ws) + offset; };
  // One grouped exchange: `send` bytes to every peer p from send_at(p), `recv(p)` bytes from p.
  const auto exchange = [&](auto send_at, auto send_bytes, auto recv_at, auto recv_bytes) {
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < s.world_size; ++p) {
      nccl_check(
          ncclSend(send_at(p), static_cast<std::size_t>(send_bytes(p)), ncclUint8, p, comm, stream),
          "ncclSend");
      nccl_check(
          ncclRecv(recv_at(p), static_cast<std::size_t>(recv_bytes(p)), ncclUint8, p, comm, stream),
          "ncclRecv");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  };
  if (s.algorithm == CpAlgorithm::kAllToAll) {
    const std::int64_t mine = plan.chunk_bytes(plan.heads_of(s.rank), s.dtype);
    exchange([&](int p) { return at(plan.send_offset + plan.send_chunk_offset(p)); },
             [&](int p) { return plan.chunk_bytes(plan.heads_of(p), s.dtype); },
             [&](int p) { return at(plan.recv_offset + p * mine); }, [&](int) { return mine; });
    if (s.output == CpOutput::kReplicated) {
      const std::int64_t merged = plan.chunk_bytes(plan.heads_of(s.rank), s.out_dtype);
      exchange([&](int) { return at(plan.mine_offset); }, [&](int) { return merged; },
               [&](int p) { return at(plan.gather_offset + plan.gather_chunk_offset(p)); },
               [&](int p) { return plan.chunk_bytes(plan.heads_of(p), s.out_dtype); });
    }
    return;
  }
  nccl_check(ncclAllGather(at(plan.lse_offset), at(plan.gathered_offset),
                           static_cast<std::size_t>(s.tokens * s.heads), ncclFloat32, comm, stream),
             "ncclAllGather");
  if (s.output == CpOutput::kHeadSharded) {
    nccl_check(
        ncclReduceScatter(at(plan.scaled_offset), at(plan.sum_offset),
                          static_cast<std::size_t>(s.tokens * plan.heads_of(s.rank) * s.head_dim),
                          ncclFloat32, ncclSum, comm, stream),
        "ncclReduceScatter");
  } else {
    nccl_check(ncclAllReduce(at(plan.scaled_offset), at(plan.scaled_offset),
                             static_cast<std::size_t>(plan.scaled_bytes / 4), ncclFloat32, ncclSum,
                             comm, stream),
               "ncclAllReduce");
  }
}

struct Row {
  std::string kind;  // "merge" or "decode"
  int gpus = 0;
  std::int64_t batch = 0, context = 0;
  std::string algorithm, output;
  double time_us = 0;
  double collective_us = 0, local_us = 0, ratio = 0;  // merge rows
  double decode_us = 0, one_gpu_us = 0, speedup = 0;  // decode rows
  std::int64_t wire_bytes = 0;                        // per rank and call
};

/// A row of `plan`'s point, its time `us`.
Row row_of(const char* kind, const CpMergePlan& plan, std::int64_t context, double us) {
  Row r;
  r.kind = kind;
  r.gpus = plan.shape.world_size;
  r.batch = plan.shape.tokens;
  r.context = context;
  r.algorithm = attnstate::to_string(plan.shape.algorithm);
  r.output = attnstate::to_string(plan.shape.output);
  r.time_us = us;
  r.wire_bytes = plan.wire_bytes_sent;
  return r;
}

constexpr CpAlgorithm kAlgorithms[] = {CpAlgorithm::kAllToAll, CpAlgorithm::kAllGatherLse};
constexpr CpOutput kOutputs[] = {CpOutput::kHeadSharded, CpOutput::kReplicated};

/// Part 1 on one rank: every batch, algorithm and output.
void merge_points(Team& team, int rank, std::vector<Row>& rows) {
  const cudaStream_t stream = (*team.timers)[static_cast<std::size_t>(rank)].stream;
  const ncclComm_t comm = team.comms[static_cast<std::size_t>(rank)];
  for (std::int64_t batch : {1, 16, 64, 256})
    for (CpAlgorithm a : kAlgorithms)
      for (CpOutput o : kOutputs) {
        Arena mem;
        const CpMergePlan plan = plan_for(team.world, rank, batch, a, o);
        attnstate::dist::check_cp_plans(plan, comm, stream);
        const std::int64_t mine = plan.heads_of(rank);
        const StateView local = mem.state(batch, kHeads, 1u + static_cast<unsigned>(rank), stream);
        const StateView out = mem.state(batch, plan.out_heads(), 7u, stream);
        const auto ws_bytes = static_cast<std::size_t>(plan.workspace_bytes);
        void* ws = mem.alloc(ws_bytes);
        void* bare_ws = mem.alloc(ws_bytes);
        ATTNSTATE_CUDA_CHECK(cudaMemsetAsync(bare_ws, 0, ws_bytes, stream));
        // The local merge: the N states of this rank's heads, stacked as the all-to-all receives
        // them (one state per source rank).
        const StateView stack_buf = mem.state(team.world * batch, mine, 3u, stream);
        const ConstStateStackView stack = attnstate::make_state_stack(
            stack_buf.o, DType::kBF16, stack_buf.lse, attnstate::StackOrder::kStatesMajor, batch,
            team.world, mine, kHeadDim, LseBase::kNatural, MemorySpace::kDevice);
        const StateView merged = mem.state(batch, mine, 5u, stream);
        ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));

        const double merge_us =
            slowest(team, rank, time_call_us(team, rank, [&](cudaStream_t s) {
                      attnstate::dist::cp_merge(plan, local, out, comm, ws, ws_bytes, s);
                    }));
        const double coll_us = slowest(team, rank, time_call_us(team, rank, [&](cudaStream_t s) {
                                         bare_collectives(plan, bare_ws, comm, s);
                                       }));
        const double local_us = slowest(team, rank, time_call_us(team, rank, [&](cudaStream_t s) {
                                          attnstate::cuda::merge_states(stack, merged, s);
                                        }));
        if (rank != 0) continue;
        Row r = row_of("merge", plan, 0, merge_us);
        r.collective_us = coll_us;
        r.local_us = local_us;
        r.ratio = merge_us / (coll_us + local_us);
        std::printf(
            "merge  N=%d batch=%-4lld %-14s %-12s %9.2f us  collectives %9.2f us  "
            "local merge %7.2f us  ratio %5.2f%s  %lld B sent\n",
            r.gpus, static_cast<long long>(batch), r.algorithm.c_str(), r.output.c_str(), r.time_us,
            r.collective_us, r.local_us, r.ratio, r.ratio > 1.15 ? " (>1.15)" : "",
            static_cast<long long>(r.wire_bytes));
        std::fflush(stdout);
        rows.push_back(r);
      }
}

/// The decode of batch 1 over `tokens` keys (a pool of its own, pages in order) into `out` on
/// `stream`, planned for this device; `run` queues it.
struct Decode {
  attnstate::cuda::DecodePlan plan;
  attnstate::PagedKvCache kv;
  attnstate::ConstTensorView q;
  void* ws = nullptr;
  std::size_t ws_bytes = 0;

  Decode(Arena& mem, std::int64_t tokens, int num_sms, cudaStream_t stream) {
    const std::int64_t pages = std::max<std::int64_t>((tokens + kPage - 1) / kPage, 1);
    const std::size_t pool = static_cast<std::size_t>(pages * kPage * kHeadsKv * kHeadDim);
    auto* k = mem.alloc<std::uint16_t>(pool * 2);
    auto* v = mem.alloc<std::uint16_t>(pool * 2);
    auto* qd = mem.alloc<std::uint16_t>(kHeads * kHeadDim * 2);
    bench_util::fill_bf16<<<num_sms * 8, 512, 0, stream>>>(k, pool, 1u);
    ATTNSTATE_CHECK_LAUNCH(stream, "fill_bf16");
    bench_util::fill_bf16<<<num_sms * 8, 512, 0, stream>>>(v, pool, 2u);
    ATTNSTATE_CHECK_LAUNCH(stream, "fill_bf16");
    bench_util::fill_bf16<<<16, 256, 0, stream>>>(qd, kHeads * kHeadDim, 3u);
    ATTNSTATE_CHECK_LAUNCH(stream, "fill_bf16");
    std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
    for (std::int64_t i = 0; i < pages; ++i)
      table[static_cast<std::size_t>(i)] = static_cast<int>(i);
    const std::int32_t len = static_cast<std::int32_t>(tokens);
    auto* d_table = mem.alloc<std::int32_t>(table.size() * 4);
    auto* d_len = mem.alloc<std::int32_t>(4);
    ATTNSTATE_CUDA_CHECK(
        cudaMemcpyAsync(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice, stream));
    ATTNSTATE_CUDA_CHECK(cudaMemcpyAsync(d_len, &len, 4, cudaMemcpyHostToDevice, stream));
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));  // `table` and `len` are ours
    attnstate::DecodeProblem pr;
    pr.batch = 1;
    pr.heads_q = kHeads;
    pr.heads_kv = kHeadsKv;
    pr.head_dim = kHeadDim;
    plan = attnstate::cuda::plan_decode(pr, &len, attnstate::DecodeOptions{}, num_sms);
    ws_bytes = plan.workspace_bytes();
    ws = mem.alloc(ws_bytes);
    attnstate::cuda::init_decode_workspace(plan, ws, ws_bytes, stream);
    kv.k = k;
    kv.v = v;
    kv.dtype = DType::kBF16;
    kv.num_pages = pages;
    kv.page_size = kPage;
    kv.heads_kv = kHeadsKv;
    kv.head_dim = kHeadDim;
    kv.block_table = d_table;
    kv.block_table_stride = pages;
    kv.seq_lens = d_len;
    kv.batch = 1;
    kv.space = MemorySpace::kDevice;
    q = attnstate::make_tensor_view(qd, DType::kBF16, {1, 1, kHeads, kHeadDim},
                                    MemorySpace::kDevice);
  }
  void run(StateView out, cudaStream_t stream) const {
    attnstate::cuda::run_decode(plan, q, kv, out, ws, ws_bytes, stream);
  }
};

/// This rank's median time (µs) of `f()` on its stream, each call after an L2 flush and a host
/// barrier (the steps are long: the events' skew does not matter, L2 hits would).
template <class F>
double time_step_us(Team& team, int rank, F&& f) {
  bench_util::FlushTimer& t = (*team.timers)[static_cast<std::size_t>(rank)];
  return t.time_us(
      team.step_reps,
      [&](int) {
        t.flush();
        ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(t.stream));
        team.barrier.wait();
      },
      f);
}

/// Part 2 on one rank: its contiguous shard of `context` tokens decoded, then merged.
void decode_points(Team& team, int rank, std::int64_t context, double one_gpu_us,
                   std::vector<Row>& rows) {
  bench_util::FlushTimer& t = (*team.timers)[static_cast<std::size_t>(rank)];
  const ncclComm_t comm = team.comms[static_cast<std::size_t>(rank)];
  Arena mem;
  const std::int64_t shard = (rank + 1) * context / team.world - rank * context / team.world;
  const Decode dec(mem, shard, t.num_sms, t.stream);
  const StateView local = mem.state(1, kHeads, 9u, t.stream);
  ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(t.stream));
  const double decode_us =
      slowest(team, rank, time_step_us(team, rank, [&] { dec.run(local, t.stream); }));
  for (CpAlgorithm a : kAlgorithms)
    for (CpOutput o : kOutputs) {
      const CpMergePlan plan = plan_for(team.world, rank, 1, a, o);
      attnstate::dist::check_cp_plans(plan, comm, t.stream);
      const StateView out = mem.state(1, plan.out_heads(), 11u, t.stream);
      const auto ws_bytes = static_cast<std::size_t>(plan.workspace_bytes);
      void* ws = mem.alloc(ws_bytes);
      ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(t.stream));
      const double us =
          slowest(team, rank, time_step_us(team, rank, [&] {
                    dec.run(local, t.stream);
                    attnstate::dist::cp_merge(plan, local, out, comm, ws, ws_bytes, t.stream);
                  }));
      if (rank != 0) continue;
      Row r = row_of("decode", plan, context, us);
      r.decode_us = decode_us;
      r.one_gpu_us = one_gpu_us;
      r.speedup = one_gpu_us / us;
      std::printf(
          "decode N=%d context=%lld %-14s %-12s %9.1f us  (shard decode %9.1f us; one "
          "GPU %9.1f us)  speedup %5.2fx\n",
          r.gpus, static_cast<long long>(context), r.algorithm.c_str(), r.output.c_str(), us,
          decode_us, one_gpu_us, r.speedup);
      std::fflush(stdout);
      rows.push_back(r);
    }
}

/// One world size: its communicators, then both parts on every rank's thread.
void run_world(int n, std::vector<bench_util::FlushTimer>& timers, bool graphs, bool quick,
               std::int64_t context, double one_gpu_us, std::vector<Row>& rows) {
  Team team(n);
  team.timers = &timers;
  team.graphs = graphs;
  team.reps = quick ? 10 : 50;
  team.calls = quick ? 10 : 20;
  team.step_reps = step_reps(quick);
  team.comms.resize(static_cast<std::size_t>(n));
  std::vector<int> devs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) devs[static_cast<std::size_t>(r)] = r;
  nccl_check(ncclCommInitAll(team.comms.data(), n, devs.data()), "ncclCommInitAll");
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        ATTNSTATE_CUDA_CHECK(cudaSetDevice(r));
        merge_points(team, r, rows);
        decode_points(team, r, context, one_gpu_us, rows);
      } catch (const std::exception& e) {
        // Its peers wait in a collective or a barrier that this rank will never reach.
        std::fprintf(stderr, "bench_cp_merge: rank %d of %d: %s\n", r, n, e.what());
        std::fflush(stderr);
        std::_Exit(1);
      }
    });
  for (std::thread& t : threads) t.join();
  for (ncclComm_t c : team.comms) ncclCommDestroy(c);
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv;
  bool quick = false, graphs = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) {
      csv = argv[++i];
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--no-graph")) {
      graphs = false;
    } else {
      std::fprintf(stderr, "usage: %s [--csv PATH] [--quick] [--no-graph]\n", argv[0]);
      return 2;
    }
  }
  try {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
      std::printf("no GPU: nothing to time\n");
      return 0;
    }
    std::vector<bench_util::FlushTimer> timers(static_cast<std::size_t>(gpus));
    for (int d = 0; d < gpus; ++d) {
      ATTNSTATE_CUDA_CHECK(cudaSetDevice(d));
      timers[static_cast<std::size_t>(d)].init(bench_util::current_device().num_sms);
    }
    ATTNSTATE_CUDA_CHECK(cudaSetDevice(0));
    const bench_util::Device dev0 = bench_util::current_device();
    int nccl_version = 0;
    nccl_check(ncclGetVersion(&nccl_version), "ncclGetVersion");
    std::printf("# %d x %s, %d SMs; NCCL %d; %s\n", gpus, dev0.prop.name, dev0.num_sms,
                nccl_version, graphs ? "CUDA graphs" : "plain launches");

    // The context of part 2: halved while one GPU cannot hold its K and V (and room to spare).
    std::int64_t context = quick ? std::int64_t{1} << 18 : std::int64_t{1} << 20;
    std::size_t free_bytes = 0, total_bytes = 0;
    ATTNSTATE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    while (context > 4096 &&
           static_cast<double>(2 * context * kHeadsKv * kHeadDim * 2) > 0.8 * free_bytes)
      context /= 2;
    double one_gpu_us = 0;
    {
      Arena mem;
      bench_util::FlushTimer& t = timers[0];
      const Decode dec(mem, context, t.num_sms, t.stream);
      const StateView out = mem.state(1, kHeads, 9u, t.stream);
      ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(t.stream));
      one_gpu_us = t.time_us(step_reps(quick), [&] { dec.run(out, t.stream); });
      std::printf("# one GPU: decode of batch 1 x %lld tokens, %lld/%lld heads x %lld: %.1f us\n",
                  static_cast<long long>(context), static_cast<long long>(kHeads),
                  static_cast<long long>(kHeadsKv), static_cast<long long>(kHeadDim), one_gpu_us);
    }

    std::vector<Row> rows;
    for (int n = 1; n <= gpus; n *= 2)
      run_world(n, timers, graphs, quick, context, one_gpu_us, rows);

    if (!csv.empty()) {
      FILE* f = bench_util::open_csv(
          csv,
          "kind,gpus,batch,context,heads,head_dim,dtype,algorithm,output,time_us,collective_us,"
          "local_merge_us,ratio,decode_us,one_gpu_us,speedup,wire_bytes_per_rank\n");
      if (!f) return 1;
      for (const Row& r : rows)
        std::fprintf(
            f, "%s,%d,%lld,%lld,%lld,%lld,bf16,%s,%s,%.3f,%.3f,%.3f,%.4f,%.3f,%.3f,%.4f,%lld\n",
            r.kind.c_str(), r.gpus, static_cast<long long>(r.batch),
            static_cast<long long>(r.context), static_cast<long long>(kHeads),
            static_cast<long long>(kHeadDim), r.algorithm.c_str(), r.output.c_str(), r.time_us,
            r.collective_us, r.local_us, r.ratio, r.decode_us, r.one_gpu_us, r.speedup,
            static_cast<long long>(r.wire_bytes));
      std::fclose(f);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cp_merge: %s\n", e.what());
    return 1;
  }
  return 0;
}
