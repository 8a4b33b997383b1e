/// @file bench_merge.cu
/// @brief Benchmark of the CUDA merges on bf16 states (32 heads, head_dim 128): `merge_states`
///        for S ∈ {2, 8, 32} and tokens ∈ {1, 64, 4096, 65536} in both stack layouts, the
///        pairwise `merge_state` / `merge_state_inplace` at 4096 tokens; then the head-dim
///        section (`merge_states` S = 8 and `merge_state` at 4096 tokens for every head dim of
///        `--head-dims`, each beside head dim 128's GB/s) and the fp8 output (`merge_state` and
///        `merge_states` S = 8 writing e4m3 with a scale, beside the bf16 output).
///
/// Each point is a CUDA graph of many back-to-back calls whose inputs rotate over enough buffer
/// sets that L2 (60 MiB on the H200) does not serve them; the time per call is the median over
/// repeated graph launches. Bandwidth counts bytes read + written (o and LSEs) and is also given
/// as a fraction of a device-to-device cudaMemcpy measured in the same run (read + written).
///
/// Usage: bench_merge [--csv <path>] [--quick] [--states S,...] [--tokens T,...]
///                    [--head-dims D,...] [--only-head-dims]
///        (--states / --tokens restrict the merge_states sweep to the listed values;
///        --head-dims sets the head-dim section's list, default 64,80,96,128,192,256;
///        --only-head-dims runs the head-dim and fp8 sections alone).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/merge.hpp"
#include "bench_util.hpp"

namespace {

using attnstate::bfloat16_t;
using attnstate::ConstStateStackView;
using attnstate::DType;
using attnstate::LseBase;
using attnstate::MemorySpace;
using attnstate::StackOrder;
using attnstate::StateView;
using bench_util::median;

constexpr std::int64_t kHeads = 32;
constexpr std::int64_t kHeadDim = 128;  ///< Head dim of the main sweep.
constexpr std::int64_t kL2Bytes = 60ll << 20;

/// Deterministic pseudo-random fill: o in [-1, 1) as bf16, LSEs in [-5, 5).
__global__ void fill_kernel(bfloat16_t* o, std::int64_t n_o, float* lse, std::int64_t n_lse,
                            std::uint32_t salt) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n_o || i < n_lse; i += stride) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ salt;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = static_cast<float>(h & 0xFFFFFF) / 16777216.f;
    if (i < n_o) o[i] = attnstate::from_float<bfloat16_t>(2.f * u - 1.f);
    if (i < n_lse) lse[i] = 10.f * u - 5.f;
  }
}

/// A device allocation of bf16 o and fp32 LSEs for `rows` rows of (heads, head_dim).
/// The simplest kernel moving a pairwise merge's bytes: `out = a + b` over `n` bf16 elements
/// and `m` fp32 values, 16 bytes per thread (n a multiple of 8), one thread per 16 bytes. Its
/// time is what any kernel reading two arrays and writing a third can reach at that size.
__global__ void sum_reference_kernel(const uint4* a, const uint4* b, uint4* out, std::int64_t n16,
                                     const float* la, const float* lb, float* lo, std::int64_t m) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n16) {
    const uint4 x = a[i];
    const uint4 y = b[i];
    const auto* xa = reinterpret_cast<const __nv_bfloat162*>(&x);
    const auto* ya = reinterpret_cast<const __nv_bfloat162*>(&y);
    uint4 r;
    auto* ra = reinterpret_cast<__nv_bfloat162*>(&r);
    for (int k = 0; k < 4; ++k) ra[k] = __hadd2(xa[k], ya[k]);
    out[i] = r;
  }
  if (i < m) lo[i] = la[i] + lb[i];
}

struct States {
  bfloat16_t* o = nullptr;
  float* lse = nullptr;
  std::int64_t rows = 0;
  std::int64_t dim = kHeadDim;
  explicit States(std::int64_t r, std::uint32_t salt, std::int64_t d = kHeadDim) : rows(r), dim(d) {
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&o, rows * kHeads * dim * sizeof(bfloat16_t)));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&lse, rows * kHeads * sizeof(float)));
    fill_kernel<<<1024, 256>>>(o, rows * kHeads * dim, lse, rows * kHeads, salt);
    ATTNSTATE_CHECK_LAUNCH(nullptr, "fill_kernel");
  }
  ~States() {
    cudaFree(o);
    cudaFree(lse);
  }
  States(const States&) = delete;
  States& operator=(const States&) = delete;
  StateView view(std::int64_t tokens) const {
    return attnstate::make_state_view(o, DType::kBF16, lse, tokens, kHeads, dim, LseBase::kNatural,
                                      MemorySpace::kDevice);
  }
  /// The same memory as an e4m3 `o` with a scale (half its rows of bf16), for fp8 outputs.
  StateView fp8_view(std::int64_t tokens) const {
    StateView v = attnstate::make_state_view(o, DType::kE4M3, lse, tokens, kHeads, dim,
                                             LseBase::kNatural, MemorySpace::kDevice);
    v.o_scale = 0.0625f;
    return v;
  }
};

/// Median time in microseconds of one call of `body(i)` (i = call index), measured as graphs of
/// `calls` back-to-back calls launched `reps` times.
double time_per_call_us(const std::function<void(int, cudaStream_t)>& body, int calls, int reps) {
  cudaStream_t s;
  ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) body(i, s);
  ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  ATTNSTATE_CUDA_CHECK(cudaEventCreate(&e0));
  ATTNSTATE_CUDA_CHECK(cudaEventCreate(&e1));
  ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, s));  // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    ATTNSTATE_CUDA_CHECK(cudaEventRecord(e0, s));
    ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, s));
    ATTNSTATE_CUDA_CHECK(cudaEventRecord(e1, s));
    ATTNSTATE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.f;
    ATTNSTATE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(1e3 * ms / calls);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  return median(t);
}

/// Device-to-device cudaMemcpy bandwidth in GB/s (bytes read + written) over 1 GiB: the median
/// over `reps` of back-to-back copies on a stream.
double copy_bandwidth_gbs(int reps) {
  const std::size_t bytes = std::size_t{1} << 30;
  constexpr int kCopies = 8;
  void *a, *b;
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&a, bytes));
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&b, bytes));
  ATTNSTATE_CUDA_CHECK(cudaMemset(a, 1, bytes));
  ATTNSTATE_CUDA_CHECK(cudaMemset(b, 2, bytes));
  cudaEvent_t e0, e1;
  ATTNSTATE_CUDA_CHECK(cudaEventCreate(&e0));
  ATTNSTATE_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int r = 0; r <= reps; ++r) {
    ATTNSTATE_CUDA_CHECK(cudaEventRecord(e0));
    for (int i = 0; i < kCopies; ++i) {
      ATTNSTATE_CUDA_CHECK(
          cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice));
    }
    ATTNSTATE_CUDA_CHECK(cudaEventRecord(e1));
    ATTNSTATE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.f;
    ATTNSTATE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r > 0) t.push_back(1e3 * ms / kCopies);  // the first round is a warm-up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / (median(t) * 1e3);
}

struct Row {
  std::string op, layout;
  std::int64_t states, tokens;
  double us, gbs, frac;
  std::int64_t head_dim = kHeadDim;
  std::string dtype = "bf16";  ///< Output dtype.
  double vs_ref = 0.0;         ///< GB/s ÷ the reference point's (head dim 128, bf16 output).
};

/// Parses a comma-separated list of positive integers ("8,32"); empty on a malformed list.
std::vector<std::int64_t> parse_list(const char* text) {
  std::vector<std::int64_t> v;
  const char* p = text;
  while (*p) {
    char* end = nullptr;
    const long long x = std::strtoll(p, &end, 10);
    if (end == p || x <= 0) return {};
    v.push_back(x);
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') return {};
  }
  return v;
}

/// Number of buffer sets to rotate so that consecutive calls do not find their inputs in L2.
int rotation(std::int64_t set_bytes) {
  const std::int64_t n = (3 * kL2Bytes + set_bytes - 1) / set_bytes;
  return static_cast<int>(std::min<std::int64_t>(std::max<std::int64_t>(n, 1), 64));
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv;
  bool quick = false;
  std::vector<std::int64_t> only_states, only_tokens;
  std::vector<std::int64_t> head_dims = {64, 80, 96, 128, 192, 256};
  bool only_head_dims = false;
  for (int i = 1; i < argc; ++i) {
    bool ok = true;
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) {
      csv = argv[++i];
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--states") && i + 1 < argc) {
      only_states = parse_list(argv[++i]);
      ok = !only_states.empty();
    } else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) {
      only_tokens = parse_list(argv[++i]);
      ok = !only_tokens.empty();
    } else if (!std::strcmp(argv[i], "--head-dims") && i + 1 < argc) {
      head_dims = parse_list(argv[++i]);
      ok = !head_dims.empty();
    } else if (!std::strcmp(argv[i], "--only-head-dims")) {
      only_head_dims = true;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: %s [--csv <path>] [--quick] [--states S,...] [--tokens T,...] "
                   "[--head-dims D,...] [--only-head-dims]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    cudaDeviceProp prop;
    ATTNSTATE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const int reps = quick ? 7 : 25;
    const double copy_gbs = copy_bandwidth_gbs(reps);
    std::printf("device: %s, %d SMs; device-to-device copy: %.0f GB/s (read + written)\n",
                prop.name, prop.multiProcessorCount, copy_gbs);
    std::vector<Row> rows;
    const auto report = [&](Row r) {
      r.frac = r.gbs / copy_gbs;
      std::printf(
          "%-20s %-13s S=%-3lld tokens=%-6lld D=%-5lld %-5s %10.2f us %9.0f GB/s %6.3f of copy",
          r.op.c_str(), r.layout.c_str(), static_cast<long long>(r.states),
          static_cast<long long>(r.tokens), static_cast<long long>(r.head_dim), r.dtype.c_str(),
          r.us, r.gbs, r.frac);
      if (r.vs_ref > 0) std::printf("  %.3f of D=128 bf16", r.vs_ref);
      std::printf("\n");
      std::fflush(stdout);
      rows.push_back(r);
    };

    const auto stack_point = [&](std::int64_t S, std::int64_t T, StackOrder order) {
      const std::int64_t in_bytes = S * T * kHeads * (kHeadDim * 2 + 4);
      const std::int64_t out_bytes = T * kHeads * (kHeadDim * 2 + 4);
      const int sets = rotation(in_bytes + out_bytes);
      std::vector<std::unique_ptr<States>> ins, outs;
      for (int k = 0; k < sets; ++k) {
        ins.push_back(std::make_unique<States>(S * T, 17u * k + 1u));
        outs.push_back(std::make_unique<States>(T, 31u * k + 7u));
      }
      const int calls = T == 1 ? 200 : std::max(4, std::min(64, 2 * sets));
      const double us = time_per_call_us(
          [&](int i, cudaStream_t s) {
            const States& in = *ins[i % sets];
            const ConstStateStackView stack =
                attnstate::make_state_stack(in.o, DType::kBF16, in.lse, order, T, S, kHeads,
                                            kHeadDim, LseBase::kNatural, MemorySpace::kDevice);
            attnstate::cuda::merge_states(stack, outs[i % sets]->view(T), s);
          },
          calls, reps);
      report(Row{"merge_states",
                 order == StackOrder::kTokensMajor ? "tokens-major" : "states-major", S, T, us,
                 static_cast<double>(in_bytes + out_bytes) / (us * 1e3), 0.0});
    };
    const auto pair_points = [&](std::int64_t T) {
      const std::int64_t state_bytes = T * kHeads * (kHeadDim * 2 + 4);
      const int sets = rotation(3 * state_bytes);
      std::vector<std::unique_ptr<States>> as, bs, outs;
      for (int k = 0; k < sets; ++k) {
        as.push_back(std::make_unique<States>(T, 3u * k + 11u));
        bs.push_back(std::make_unique<States>(T, 5u * k + 13u));
        outs.push_back(std::make_unique<States>(T, 7u * k + 17u));
      }
      const int calls = T == 1 ? 200 : std::max(4, std::min(64, 2 * sets));
      double us = time_per_call_us(
          [&](int i, cudaStream_t s) {
            attnstate::cuda::merge_state(as[i % sets]->view(T), bs[i % sets]->view(T),
                                         outs[i % sets]->view(T), s);
          },
          calls, reps);
      report(Row{"merge_state", "-", 2, T, us, 3.0 * state_bytes / (us * 1e3), 0.0});
      us = time_per_call_us(
          [&](int i, cudaStream_t s) {
            attnstate::cuda::merge_state_inplace(outs[i % sets]->view(T), bs[i % sets]->view(T),
                                                 nullptr, s);
          },
          calls, reps);
      report(Row{"merge_state_inplace", "-", 2, T, us, 3.0 * state_bytes / (us * 1e3), 0.0});
      {
        const std::int64_t n16 = T * kHeads * kHeadDim / 8;
        const std::int64_t m = T * kHeads;
        const unsigned blocks = static_cast<unsigned>((std::max(n16, m) + 255) / 256);
        us = time_per_call_us(
            [&](int i, cudaStream_t s) {
              const States& x = *as[i % sets];
              const States& y = *bs[i % sets];
              States& z = *outs[i % sets];
              sum_reference_kernel<<<blocks, 256, 0, s>>>(
                  reinterpret_cast<const uint4*>(x.o), reinterpret_cast<const uint4*>(y.o),
                  reinterpret_cast<uint4*>(z.o), n16, x.lse, y.lse, z.lse, m);
              ATTNSTATE_CHECK_LAUNCH(s, "sum_reference_kernel");
            },
            calls, reps);
        report(Row{"a+b (reference)", "-", 2, T, us, 3.0 * state_bytes / (us * 1e3), 0.0});
      }
    };

    if (!only_head_dims) {
      // merge_states: S × tokens × layouts.
      std::vector<std::int64_t> token_list = quick ? std::vector<std::int64_t>{1, 4096}
                                                   : std::vector<std::int64_t>{1, 64, 4096, 65536};
      if (!only_tokens.empty()) token_list = only_tokens;
      const std::vector<std::int64_t> states_list =
          only_states.empty() ? std::vector<std::int64_t>{2, 8, 32} : only_states;
      for (std::int64_t S : states_list)
        for (std::int64_t T : token_list)
          for (StackOrder order : {StackOrder::kTokensMajor, StackOrder::kStatesMajor}) {
            if (quick && order == StackOrder::kStatesMajor) continue;
            stack_point(S, T, order);
          }
      // Pairwise and in-place merges at 4096 tokens (and one token, for latency).
      for (std::int64_t T : {std::int64_t{1}, std::int64_t{4096}}) pair_points(T);
    }

    // Head dims (S = 8 merge_states, S = 2 merge_state at 4096 tokens) and the fp8 output, each
    // beside head dim 128 with a bf16 output measured in the same run.
    constexpr std::int64_t kT = 4096;
    constexpr std::int64_t kS = 8;
    const auto dim_points = [&](std::int64_t D, bool fp8_out) -> std::pair<double, double> {
      const std::int64_t row_in = kHeads * (D * 2 + 4);
      const std::int64_t row_out = kHeads * (D * (fp8_out ? 1 : 2) + 4);
      const std::int64_t stack_bytes = kS * kT * row_in + kT * row_out;
      const std::int64_t pair_bytes = 2 * kT * row_in + kT * row_out;
      const int sets = rotation(stack_bytes);
      std::vector<std::unique_ptr<States>> ins, as, bs, outs;
      for (int k = 0; k < sets; ++k) {
        ins.push_back(std::make_unique<States>(kS * kT, 17u * k + 1u, D));
        as.push_back(std::make_unique<States>(kT, 3u * k + 11u, D));
        bs.push_back(std::make_unique<States>(kT, 5u * k + 13u, D));
        outs.push_back(std::make_unique<States>(kT, 31u * k + 7u, D));
      }
      const int calls = std::max(4, std::min(64, 2 * sets));
      const auto out_view = [&](int i) {
        return fp8_out ? outs[i % sets]->fp8_view(kT) : outs[i % sets]->view(kT);
      };
      const double us_stack = time_per_call_us(
          [&](int i, cudaStream_t s) {
            const States& in = *ins[i % sets];
            const ConstStateStackView stack = attnstate::make_state_stack(
                in.o, DType::kBF16, in.lse, StackOrder::kTokensMajor, kT, kS, kHeads, D,
                LseBase::kNatural, MemorySpace::kDevice);
            attnstate::cuda::merge_states(stack, out_view(i), s);
          },
          calls, reps);
      const double us_pair = time_per_call_us(
          [&](int i, cudaStream_t s) {
            attnstate::cuda::merge_state(as[i % sets]->view(kT), bs[i % sets]->view(kT),
                                         out_view(i), s);
          },
          calls, reps);
      return {static_cast<double>(stack_bytes) / (us_stack * 1e3),
              static_cast<double>(pair_bytes) / (us_pair * 1e3)};
    };
    const auto report_dim = [&](std::int64_t D, bool fp8_out, std::pair<double, double> gbs,
                                std::pair<double, double> ref) {
      const std::int64_t row_in = kHeads * (D * 2 + 4);
      const std::int64_t row_out = kHeads * (D * (fp8_out ? 1 : 2) + 4);
      const char* dt = fp8_out ? "e4m3" : "bf16";
      Row a{"merge_states",
            "tokens-major",
            kS,
            kT,
            static_cast<double>(kS * kT * row_in + kT * row_out) / (gbs.first * 1e3),
            gbs.first,
            0.0,
            D,
            dt,
            gbs.first / ref.first};
      Row b{"merge_state",
            "-",
            2,
            kT,
            static_cast<double>(2 * kT * row_in + kT * row_out) / (gbs.second * 1e3),
            gbs.second,
            0.0,
            D,
            dt,
            gbs.second / ref.second};
      report(a);
      report(b);
    };
    const std::pair<double, double> ref = dim_points(kHeadDim, false);
    report_dim(kHeadDim, false, ref, ref);
    for (std::int64_t D : head_dims)
      if (D != kHeadDim) report_dim(D, false, dim_points(D, false), ref);
    report_dim(kHeadDim, true, dim_points(kHeadDim, true), ref);

    if (!csv.empty()) {
      FILE* f = bench_util::open_csv(
          csv,
          "op,layout,states,tokens,heads,head_dim,dtype,time_us,gb_per_s,fraction_of_copy,"
          "copy_gb_per_s,of_d128_bf16\n");
      if (!f) return 1;
      for (const Row& r : rows)
        std::fprintf(f, "%s,%s,%lld,%lld,%lld,%lld,%s,%.3f,%.1f,%.4f,%.1f,%.4f\n", r.op.c_str(),
                     r.layout.c_str(), static_cast<long long>(r.states),
                     static_cast<long long>(r.tokens), static_cast<long long>(kHeads),
                     static_cast<long long>(r.head_dim), r.dtype.c_str(), r.us, r.gbs, r.frac,
                     copy_gbs, r.vs_ref);
      std::fclose(f);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_merge: %s\n", e.what());
    return 1;
  }
  return 0;
}
