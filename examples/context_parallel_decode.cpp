/// @file context_parallel_decode.cpp
/// @brief Example: context-parallel decode. The KV cache of a batch is sharded across ranks, each
///        rank decodes its shard into a state, the ranks' states are merged with ⊕ across the
///        ranks, and the result is checked against the decode of the whole cache.
///
/// Two shardings: contiguous chunks of each request, and tokens dealt round-robin over the ranks
/// (vLLM's decode context parallelism). Either way a rank holds its tokens in a paged pool of its
/// own, with its own page table and lengths, as a rank of an engine does; the short third request
/// leaves some ranks without any of its keys, so their state of it is the empty state.
///
/// The CPU path always runs: `cpu::decode` of each shard and `cpu::cp_merge_simulated` (every
/// rank in this process), against `cpu::decode` of the whole cache. Built with attnstate::dist
/// (NCCL) and run where GPUs are present, the GPU path runs too, on every GPU (one thread each):
/// `cuda::run_decode` of the rank's shard on its GPU and `dist::cp_merge`, against
/// `cuda::run_decode` of the whole cache on GPU 0.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/context_parallel.hpp"
#include "attnstate/cpu/context_parallel.hpp"
#include "attnstate/cpu/decode.hpp"

#if defined(ATTNSTATE_HAS_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <thread>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"
#include "attnstate/dist/cp_merge.hpp"
#endif

namespace {

using namespace attnstate;

constexpr std::int64_t kHq = 8, kHkv = 2, kD = 128, kPage = 16;
constexpr std::int64_t kTokenElems = kHkv * kD;  // elements of one token's K (or V)
constexpr int kCpuRanks = 4;

/// A paged bf16 KV cache in host memory: NHD pools, a block table and the lengths.
struct Cache {
  std::vector<bfloat16_t> k, v;
  std::vector<std::int32_t> table, lens;
  std::int64_t stride = 1;  // columns of the block table

  std::int64_t batch() const { return static_cast<std::int64_t>(lens.size()); }
  /// Element offset of token `t` of request `b` in the pools.
  std::int64_t at(std::int64_t b, std::int64_t t) const {
    return (table[b * stride + t / kPage] * kPage + t % kPage) * kTokenElems;
  }
  PagedKvCache view(const void* kp, const void* vp, const std::int32_t* tp, const std::int32_t* lp,
                    MemorySpace space) const {
    PagedKvCache kv;
    kv.k = kp;
    kv.v = vp;
    kv.dtype = DType::kBF16;
    kv.layout = KvLayout::kNHD;
    kv.num_pages = static_cast<std::int64_t>(k.size()) / (kPage * kTokenElems);
    kv.page_size = kPage;
    kv.heads_kv = kHkv;
    kv.head_dim = kD;
    kv.block_table = tp;
    kv.block_table_stride = stride;
    kv.seq_lens = lp;
    kv.batch = batch();
    kv.space = space;
    return kv;
  }
  PagedKvCache host() const {
    return view(k.data(), v.data(), table.data(), lens.data(), MemorySpace::kHost);
  }
};

/// A zeroed cache for requests of `lens` tokens, its pages dealt to the requests in a shuffled
/// order (a serving pool is never in order). At least one page, so that a shard without any
/// token still has a valid pool.
Cache make_cache(std::vector<std::int32_t> lens, std::mt19937& rng) {
  Cache c;
  c.lens = std::move(lens);
  std::int64_t total = 0;
  for (std::int32_t len : c.lens) {
    const std::int64_t pages = (len + kPage - 1) / kPage;
    c.stride = std::max(c.stride, pages);
    total += pages;
  }
  total = std::max<std::int64_t>(total, 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(total));
  for (std::int64_t i = 0; i < total; ++i) ids[static_cast<std::size_t>(i)] = static_cast<int>(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.table.assign(static_cast<std::size_t>(c.batch() * c.stride), 0);
  std::size_t next = 0;
  for (std::int64_t b = 0; b < c.batch(); ++b)
    for (std::int64_t p = 0; p < (c.lens[b] + kPage - 1) / kPage; ++p)
      c.table[static_cast<std::size_t>(b * c.stride + p)] = ids[next++];
  c.k.assign(static_cast<std::size_t>(total * kPage * kTokenElems), bfloat16_t{});
  c.v = c.k;
  return c;
}

enum class Sharding { kContiguous, kInterleaved };

const char* to_string(Sharding s) {
  return s == Sharding::kContiguous ? "contiguous" : "interleaved";
}

/// Whether rank `r` of `ranks` holds token `t` of a request of `len` tokens.
bool owns(Sharding s, int ranks, int r, std::int64_t len, std::int64_t t) {
  if (s == Sharding::kInterleaved) return t % ranks == r;
  return t >= r * len / ranks && t < (r + 1) * len / ranks;
}

/// Rank `r`'s cache: the tokens of each request it owns, in order, in a pool of its own.
Cache shard_of(const Cache& all, Sharding s, int ranks, int r, std::mt19937& rng) {
  std::vector<std::int32_t> lens;
  for (std::int32_t len : all.lens) {
    std::int32_t n = 0;
    for (std::int64_t t = 0; t < len; ++t) n += owns(s, ranks, r, len, t) ? 1 : 0;
    lens.push_back(n);
  }
  Cache c = make_cache(lens, rng);
  for (std::int64_t b = 0; b < all.batch(); ++b) {
    std::int64_t j = 0;
    for (std::int64_t t = 0; t < all.lens[b]; ++t) {
      if (!owns(s, ranks, r, all.lens[b], t)) continue;
      std::copy_n(all.k.begin() + all.at(b, t), kTokenElems, c.k.begin() + c.at(b, j));
      std::copy_n(all.v.begin() + all.at(b, t), kTokenElems, c.v.begin() + c.at(b, j));
      ++j;
    }
  }
  return c;
}

/// A host state of `heads` heads for every request, `o` of `T`, natural-log LSE.
template <class T>
struct HostState {
  std::int64_t tokens, heads;
  std::vector<T> o;
  std::vector<float> lse;
  HostState(std::int64_t t, std::int64_t h)
      : tokens(t),
        heads(h),
        o(static_cast<std::size_t>(t * h * kD)),
        lse(static_cast<std::size_t>(t * h)) {}
  StateView view() {
    return make_state_view(o.data(), DTypeOf<T>::value, lse.data(), tokens, heads, kD,
                           LseBase::kNatural);
  }
};

/// What a rank decodes into: bf16 `o`, as an engine's attention output (and what the all-to-all
/// puts on the wire). The merged outputs and the references are f32, so that only the ranks'
/// rounding is measured.
using LocalState = HostState<bfloat16_t>;
using OutState = HostState<float>;

/// The two algorithms, each with both outputs.
struct Config {
  CpAlgorithm algorithm;
  CpOutput output;
};
constexpr Config kConfigs[] = {{CpAlgorithm::kAllToAll, CpOutput::kHeadSharded},
                               {CpAlgorithm::kAllToAll, CpOutput::kReplicated},
                               {CpAlgorithm::kAllGatherLse, CpOutput::kHeadSharded},
                               {CpAlgorithm::kAllGatherLse, CpOutput::kReplicated}};

/// The all-gather's reduce-scatter gives every rank the same number of heads.
bool runs_on(const Config& c, int ranks) {
  return !(c.algorithm == CpAlgorithm::kAllGatherLse && c.output == CpOutput::kHeadSharded &&
           kHq % ranks != 0);
}

/// Every rank's plan of the merge of `batch` rows.
std::vector<CpMergePlan> plans_for(const Config& c, int ranks, std::int64_t batch) {
  std::vector<CpMergePlan> plans;
  for (int r = 0; r < ranks; ++r) {
    CpMergeShape s;
    s.world_size = ranks;
    s.rank = r;
    s.tokens = batch;
    s.heads = kHq;
    s.head_dim = kD;
    s.dtype = DType::kBF16;
    s.out_dtype = DType::kF32;
    s.algorithm = c.algorithm;
    s.output = c.output;
    plans.push_back(plan_cp_merge(s));
  }
  return plans;
}

/// The tolerance of an element of `o`: each rank's `o` is rounded once to bf16 (relative error at
/// most 2^-8) and the merge is a convex combination of the ranks' `o`, so the merged element is off
/// by at most 2^-8 of the largest |o| a rank holds there; twice that, plus 1e-5 for the fp32
/// rounding of the decodes and the merge (a few ulp of |v| <= 1 per key summed, in other orders).
double o_tolerance(const std::vector<LocalState>& locals, std::size_t i) {
  double m = 0;
  for (const LocalState& l : locals) m = std::max(m, std::fabs(double{to_float(l.o[i])}));
  return std::ldexp(m, -7) + 1e-5;
}
/// The tolerance of the LSE: it stays fp32 end to end, and the shards sum the same exponentials
/// in other orders; the worst-case fp32 error of a sum of n <= 4096 terms is n * 2^-24 < 2.5e-4
/// (relative in the sum, so absolute in its log), GPU exp2/log2 add a few ulp. 4x that bound.
constexpr double kLseTolerance = 1e-3;

/// Checks every rank's merged output (`outs[r]`: its heads, or all of them) against `ref` with
/// the tolerances above (`locals`: the ranks' states), prints one line and returns whether every
/// element is within them.
bool check(const char* path, Sharding s, const Config& c, const std::vector<CpMergePlan>& plans,
           const std::vector<OutState>& outs, const std::vector<LocalState>& locals,
           const OutState& ref) {
  // NaN-propagating maxima (std::fmax would skip a NaN, and the check would pass).
  const auto worse = [](double worst, double e) {
    return std::isnan(e) ? INFINITY : std::max(worst, e);
  };
  double err_o = 0, err_lse = 0, ratio = 0;  // ratio: the largest error / tolerance
  for (std::size_t r = 0; r < outs.size(); ++r) {
    const OutState& got = outs[r];
    const std::int64_t h0 =
        c.output == CpOutput::kHeadSharded ? plans[r].head_begin(static_cast<int>(r)) : 0;
    for (std::int64_t t = 0; t < got.tokens; ++t)
      for (std::int64_t h = 0; h < got.heads; ++h) {
        const std::size_t g = static_cast<std::size_t>(t * got.heads + h);
        const std::size_t e = static_cast<std::size_t>(t * kHq + h0 + h);
        const double el = std::fabs(got.lse[g] - ref.lse[e]);
        err_lse = worse(err_lse, el);
        ratio = worse(ratio, el / kLseTolerance);
        for (std::size_t d = 0; d < kD; ++d) {
          const double eo = std::fabs(got.o[g * kD + d] - ref.o[e * kD + d]);
          err_o = worse(err_o, eo);
          ratio = worse(ratio, eo / o_tolerance(locals, e * kD + d));
        }
      }
  }
  const bool ok = ratio <= 1;
  std::printf("%-4s %5zu  %-11s  %-14s  %-12s  %10.2e  %12.2e  %7.3f  %s\n", path, outs.size(),
              to_string(s), to_string(c.algorithm), to_string(c.output), err_o, err_lse, ratio,
              ok ? "ok" : "MISMATCH");
  return ok;
}

/// The line of a configuration the rank count does not allow.
void print_skipped(const char* path, int ranks, Sharding s, const Config& c) {
  std::printf("%-4s %5d  %-11s  %-14s  %-12s  skipped: %lld heads are not a multiple of %d\n", path,
              ranks, to_string(s), to_string(c.algorithm), to_string(c.output),
              static_cast<long long>(kHq), ranks);
}

/// The queries of `batch` requests, one new token each.
ConstTensorView queries(const void* q, std::int64_t batch, MemorySpace space) {
  return make_tensor_view(q, DType::kBF16, {batch, 1, kHq, kD}, space);
}

/// The CPU path: `kCpuRanks` ranks simulated in this process.
bool run_cpu(const Cache& all, const std::vector<bfloat16_t>& q, std::mt19937& rng) {
  const std::int64_t batch = all.batch();
  OutState ref(batch, kHq);
  cpu::decode(queries(q.data(), batch, MemorySpace::kHost), all.host(), DecodeOptions{},
              ref.view());
  bool ok = true;
  for (Sharding s : {Sharding::kContiguous, Sharding::kInterleaved}) {
    std::vector<LocalState> locals;
    std::vector<ConstStateView> local_views;
    for (int r = 0; r < kCpuRanks; ++r) {
      const Cache shard = shard_of(all, s, kCpuRanks, r, rng);
      locals.emplace_back(batch, kHq);
      cpu::decode(queries(q.data(), batch, MemorySpace::kHost), shard.host(), DecodeOptions{},
                  locals.back().view());
    }
    for (LocalState& l : locals) local_views.push_back(l.view());
    for (const Config& c : kConfigs) {
      if (!runs_on(c, kCpuRanks)) {
        print_skipped("cpu", kCpuRanks, s, c);
        continue;
      }
      const std::vector<CpMergePlan> plans = plans_for(c, kCpuRanks, batch);
      std::vector<OutState> outs;
      std::vector<StateView> out_views;
      for (const CpMergePlan& p : plans) outs.emplace_back(batch, p.out_heads());
      for (OutState& o : outs) out_views.push_back(o.view());
      cpu::cp_merge_simulated(plans, local_views, out_views);
      ok = check("cpu", s, c, plans, outs, locals, ref) && ok;
    }
  }
  return ok;
}

#if defined(ATTNSTATE_HAS_NCCL)
/// The device allocations of one thread, freed together, and the stream its copies are ordered
/// on (a non-blocking stream does not wait for a plain cudaMemcpy's transfer to finish).
struct DeviceArena {
  cudaStream_t stream;
  std::vector<void*> ptrs;
  explicit DeviceArena(cudaStream_t s) : stream(s) {}
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : ptrs) cudaFree(p);
  }
  void* alloc(std::size_t bytes) {
    void* p = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)));
    ptrs.push_back(p);
    return p;
  }
  template <class T>
  const T* upload(const std::vector<T>& h) {
    void* p = alloc(h.size() * sizeof(T));
    ATTNSTATE_CUDA_CHECK(
        cudaMemcpyAsync(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
    return static_cast<const T*>(p);
  }
  /// Copies the device state `d` into `h` once the stream's work is done.
  template <class T>
  void download(HostState<T>& h, const StateView& d) {
    ATTNSTATE_CUDA_CHECK(
        cudaMemcpyAsync(h.o.data(), d.o, h.o.size() * sizeof(T), cudaMemcpyDeviceToHost, stream));
    ATTNSTATE_CUDA_CHECK(
        cudaMemcpyAsync(h.lse.data(), d.lse, h.lse.size() * 4, cudaMemcpyDeviceToHost, stream));
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  /// A device state shaped as `h`.
  template <class T>
  StateView state(const HostState<T>& h) {
    return make_state_view(alloc(h.o.size() * sizeof(T)), DTypeOf<T>::value,
                           static_cast<float*>(alloc(h.lse.size() * 4)), h.tokens, h.heads, kD,
                           LseBase::kNatural, MemorySpace::kDevice);
  }
};

/// Queues the decode of `c` on the current device into the device state `out` on `mem.stream`
/// (planned for this cache's lengths and the device's SMs, as each rank plans its own shard).
void gpu_decode(DeviceArena& mem, const Cache& c, const std::vector<bfloat16_t>& q, StateView out) {
  int dev = 0, sms = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  DecodeProblem pr;
  pr.batch = c.batch();
  pr.heads_q = kHq;
  pr.heads_kv = kHkv;
  pr.head_dim = kD;
  // attnstate::cuda spelled out: a bare cuda:: is ambiguous with libcu++'s ::cuda.
  const attnstate::cuda::DecodePlan plan =
      attnstate::cuda::plan_decode(pr, c.lens.data(), DecodeOptions{}, sms);
  const std::size_t ws_bytes = plan.workspace_bytes();
  void* ws = mem.alloc(ws_bytes);
  const PagedKvCache kv = c.view(mem.upload(c.k), mem.upload(c.v), mem.upload(c.table),
                                 mem.upload(c.lens), MemorySpace::kDevice);
  attnstate::cuda::init_decode_workspace(plan, ws, ws_bytes, mem.stream);
  attnstate::cuda::run_decode(plan, queries(mem.upload(q), c.batch(), MemorySpace::kDevice), kv,
                              out, ws, ws_bytes, mem.stream);
}

/// The GPU path on every GPU (at most one rank per head): whether every check passed (true when
/// it is skipped for want of a GPU).
bool run_gpu(const Cache& all, const std::vector<bfloat16_t>& q, std::mt19937& rng) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu: skipped (no GPU)\n");
    return true;
  }
  const int n = std::min<int>(devices, static_cast<int>(kHq));
  const std::int64_t batch = all.batch();
  OutState ref(batch, kHq);
  {
    ATTNSTATE_CUDA_CHECK(cudaSetDevice(0));
    DeviceArena mem(nullptr);
    const StateView out = mem.state(ref);
    gpu_decode(mem, all, q, out);
    mem.download(ref, out);
  }
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
  std::vector<int> devs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) devs[static_cast<std::size_t>(r)] = r;
  const ncclResult_t init = ncclCommInitAll(comms.data(), n, devs.data());
  if (init != ncclSuccess) {
    std::printf("gpu: ncclCommInitAll over %d GPUs failed: %s\n", n, ncclGetErrorString(init));
    return false;
  }
  bool ok = true;
  for (Sharding s : {Sharding::kContiguous, Sharding::kInterleaved}) {
    std::vector<Cache> shards;
    for (int r = 0; r < n; ++r) shards.push_back(shard_of(all, s, n, r, rng));
    std::vector<std::vector<CpMergePlan>> plans;
    std::vector<std::vector<OutState>> outs(std::size(kConfigs));
    for (std::size_t ci = 0; ci < std::size(kConfigs); ++ci) {
      plans.push_back(runs_on(kConfigs[ci], n) ? plans_for(kConfigs[ci], n, batch)
                                               : std::vector<CpMergePlan>{});
      for (const CpMergePlan& p : plans.back()) outs[ci].emplace_back(batch, p.out_heads());
    }
    std::vector<LocalState> locals(static_cast<std::size_t>(n), LocalState(batch, kHq));
    std::vector<std::string> errors(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        const std::size_t ri = static_cast<std::size_t>(r);
        cudaStream_t stream = nullptr;
        try {
          ATTNSTATE_CUDA_CHECK(cudaSetDevice(r));
          ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
          DeviceArena mem(stream);
          const StateView local = mem.state(locals[ri]);
          gpu_decode(mem, shards[ri], q, local);
          for (std::size_t ci = 0; ci < plans.size(); ++ci) {
            if (plans[ci].empty()) continue;
            const CpMergePlan& plan = plans[ci][ri];
            attnstate::dist::check_cp_plans(plan, comms[ri], stream);
            const StateView out = mem.state(outs[ci][ri]);
            const auto ws_bytes = static_cast<std::size_t>(plan.workspace_bytes);
            attnstate::dist::cp_merge(plan, local, out, comms[ri], mem.alloc(ws_bytes), ws_bytes,
                                      stream);
            mem.download(outs[ci][ri], out);
          }
          mem.download(locals[ri], local);
        } catch (const std::exception& e) {
          errors[ri] = e.what();
        }
        if (stream) cudaStreamDestroy(stream);
      });
    }
    for (std::thread& t : threads) t.join();
    bool ran = true;
    for (int r = 0; r < n; ++r)
      if (!errors[static_cast<std::size_t>(r)].empty()) {
        std::printf("gpu rank %d: %s\n", r, errors[static_cast<std::size_t>(r)].c_str());
        ran = false;
      }
    if (!ran) {
      ok = false;
      break;  // a rank that failed may have left its peers' collectives unmatched
    }
    for (std::size_t ci = 0; ci < plans.size(); ++ci) {
      if (plans[ci].empty()) {
        print_skipped("gpu", n, s, kConfigs[ci]);
        continue;
      }
      ok = check("gpu", s, kConfigs[ci], plans[ci], outs[ci], locals, ref) && ok;
    }
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  return ok;
}
#endif

}  // namespace

int main() {
  try {
    // Two long requests and one of 3 tokens: with 4 or more ranks some ranks own none of its
    // keys, and their state of it is the empty state.
    const std::vector<std::int32_t> lens = {3000, 1234, 3};
    std::mt19937 rng(23);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    Cache all = make_cache(lens, rng);
    for (bfloat16_t& x : all.k) x = from_float<bfloat16_t>(u(rng));
    for (bfloat16_t& x : all.v) x = from_float<bfloat16_t>(u(rng));
    // Queries in [-2, 2): the scores spread over a few units, so the softmax is not flat.
    std::vector<bfloat16_t> q(static_cast<std::size_t>(all.batch() * kHq * kD));
    for (bfloat16_t& x : q) x = from_float<bfloat16_t>(2 * u(rng));

    std::printf(
        "context-parallel decode: batch %lld (%d, %d, %d tokens), H_q/H_kv %lld/%lld, "
        "head_dim %lld, bf16 KV in pages of %lld\n",
        static_cast<long long>(all.batch()), lens[0], lens[1], lens[2], static_cast<long long>(kHq),
        static_cast<long long>(kHkv), static_cast<long long>(kD), static_cast<long long>(kPage));
    std::printf("%-4s %5s  %-11s  %-14s  %-12s  %10s  %12s  %7s\n", "path", "ranks", "sharding",
                "algorithm", "output", "max|o err|", "max|lse err|", "err/tol");
    bool ok = run_cpu(all, q, rng);
#if defined(ATTNSTATE_HAS_NCCL)
    ok = run_gpu(all, q, rng) && ok;
#elif defined(ATTNSTATE_HAS_CUDA)
    std::printf("gpu: skipped (built without attnstate::dist: NCCL was not found)\n");
#else
    std::printf("gpu: skipped (built without the CUDA backend)\n");
#endif
    std::printf("%s\n", ok ? "OK: the merge of the shards' states equals the decode of the whole "
                             "cache"
                           : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "context_parallel_decode: %s\n", e.what());
    return 1;
  }
}
