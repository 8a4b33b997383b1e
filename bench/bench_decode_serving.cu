/// @file bench_decode_serving.cu
/// @brief The split-KV decode on serving-like batches (issue 19), beside the device copy
///        bandwidth measured in the same run:
///        - `ragged`: one long request among short ones (10x), uniform and log-uniform length
///          distributions, batch {4, 16, 64, 256}, total KV 64 MiB .. 8 GiB; each point with the
///          automatic plan and with the plan of the longest request alone (every request planned
///          at the maximum length: what the automatic policy did before it balanced all lengths);
///        - `pages`: pages of {1, 2, 4, 8, 16, 32, 64, 128} tokens at batch 4 and 16 x 32k, the
///          time as a fraction of the page-16 time;
///        - `shapes`: head dims 64 and 256 (group 4) and groups 1, 2, 5, 7, 8, 16 (head dim 128)
///          at batch {1, 16} x {8k, 128k}, 8 KV heads;
///        - `variants`: soft cap, attention sinks, a 4k window over 128k, gpt-oss-like (64/8
///          heads, head dim 64, sinks, window 128) and Gemma-2-like (head dim 256, cap 50,
///          window 4096) shapes, each beside the plain decode of the keys its rows see;
///        - `fp8`: e4m3 and e5m2 caches (per-tensor scales, bf16 queries) beside the bf16 cache
///          of the same batch: uniform batches and two ragged ones, GB/s of the bytes each reads;
///          each with the automatic plan and with the split kernel's paired configuration
///          (`split_stages` 4 and 6: 32 keys a warp's step, which the automatic plan never
///          takes), each with its speedup over bf16.
///
/// bf16, NHD pages (`--hnd`: HND), page ids in order (`--scatter`: a random permutation). Each
/// time is the median of `--reps` (default 21) event-timed calls, each after an L2 flush.
/// `--csv PATH` writes every row; `--fi-spec PATH` writes the ragged points as `--points` specs of
/// the FlashInfer harness (same lengths); `--sections ragged,pages,shapes,variants,fp8` picks
/// sections;
/// `--quick` runs fewer points. GB/s counts the K and V bytes of the real lengths.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"
#include "bench_util.cuh"

namespace {

using namespace attnstate;

/// Device buffers that grow on demand (one allocation reused by every point).
struct Buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  void* get(std::size_t n) {
    if (n > bytes) {
      if (p) ATTNSTATE_CUDA_CHECK(cudaFree(p));
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&p, n));
      bytes = n;
    }
    return p;
  }
};

struct Env : bench_util::FlushTimer {
  int reps = 21;
  bool hnd = false, scatter = false;
  double copy_gbps = 0;
  // the pools hold `pool_tokens` tokens of the largest shape, filled once
  std::uint16_t *k = nullptr, *v = nullptr;
  std::size_t pool_elems = 0;
  Buffer q, o, lse, ws, table, lens, sinks;
  FILE* csv = nullptr;
  FILE* fi_spec = nullptr;  // the ragged points as the FlashInfer harness's --points specs

  /// Median of `reps` event-timed calls of `f`, each after an L2 flush (µs).
  template <class F>
  double time_us(F&& f) {
    return FlushTimer::time_us(reps, f);
  }
};

/// One decode shape: lengths, heads, head dim, page size.
struct Shape {
  std::vector<std::int32_t> lens;
  int hq = 32, hkv = 8, d = 128, page = 16;
  AttentionVariant variant;  // plain unless the variants section sets one
  DType kv = DType::kBF16;   // bf16, or an fp8 cache (the fp8 section; bf16 queries)
  bool sinks = false;        // attention sinks fused into the final merge (the variants section)
  int split_stages = 0;      // the split kernel at this depth (0: the automatic plan's kernel)
  std::int64_t tokens() const { return std::accumulate(lens.begin(), lens.end(), std::int64_t{0}); }
  double kv_bytes() const {
    return 2.0 * static_cast<double>(size_of(kv)) * static_cast<double>(tokens()) * hkv * d;
  }
};

/// A timed decode of `s`: with the automatic plan (`max_lens` empty) or a plan made for
/// `max_lens` and run on `s.lens`.
struct Timed {
  double us = 0;
  cuda::DecodePlan plan;
};

Timed time_decode(Env& env, const Shape& s, const std::vector<std::int32_t>& max_lens = {}) {
  const int batch = static_cast<int>(s.lens.size());
  std::vector<std::int32_t> pages_of(batch);
  std::int64_t total_pages = 0;
  for (int b = 0; b < batch; ++b) {
    pages_of[b] = (s.lens[b] + s.page - 1) / s.page;
    total_pages += pages_of[b];
  }
  const std::int64_t page_elems = std::int64_t{s.page} * s.hkv * s.d;
  if (static_cast<std::size_t>((total_pages + 1) * page_elems) * size_of(s.kv) >
      env.pool_elems * 2) {
    std::fprintf(stderr, "pool too small for this shape\n");
    std::exit(2);
  }
  // CSR page table: each request's pages, consecutive (or a random permutation of the pool's)
  std::vector<std::int32_t> indptr(batch + 1, 0), ids(static_cast<std::size_t>(total_pages));
  for (int b = 0; b < batch; ++b) indptr[b + 1] = indptr[b] + pages_of[b];
  std::iota(ids.begin(), ids.end(), 0);
  if (env.scatter) std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  auto* d_table = static_cast<std::int32_t*>(env.table.get(4 * (ids.size() + indptr.size())));
  ATTNSTATE_CUDA_CHECK(
      cudaMemcpy(d_table, indptr.data(), 4 * indptr.size(), cudaMemcpyHostToDevice));
  ATTNSTATE_CUDA_CHECK(
      cudaMemcpy(d_table + indptr.size(), ids.data(), 4 * ids.size(), cudaMemcpyHostToDevice));
  auto* d_lens = static_cast<std::int32_t*>(env.lens.get(4 * batch));
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(d_lens, s.lens.data(), 4 * batch, cudaMemcpyHostToDevice));

  DecodeProblem pr;
  pr.batch = batch;
  pr.heads_q = s.hq;
  pr.heads_kv = s.hkv;
  pr.head_dim = s.d;
  pr.q_dtype = DType::kBF16;
  pr.kv_dtype = s.kv;
  Timed t;
  t.plan = cuda::plan_decode(
      pr, max_lens.empty() ? s.lens.data() : max_lens.data(),
      [&] {
        DecodeOptions o;
        o.variant = s.variant;
        if (s.split_stages != 0) {
          o.kernel = DecodeKernel::kSplit;
          o.split_stages = s.split_stages;
        }
        return o;
      }(),
      env.num_sms);
  void* ws = env.ws.get(std::max<std::size_t>(256, t.plan.workspace_bytes()));
  cuda::init_decode_workspace(t.plan, ws, t.plan.workspace_bytes(), env.stream);

  PagedKvCache kv;
  kv.k = env.k;
  kv.v = env.v;
  kv.dtype = s.kv;
  if (is_fp8(s.kv)) {  // the engines' per-tensor scales
    kv.k_scale = KvScale::per_tensor(0.75f);
    kv.v_scale = KvScale::per_tensor(1.25f);
  }
  kv.layout = env.hnd ? KvLayout::kHND : KvLayout::kNHD;
  kv.num_pages = total_pages + 1;
  kv.page_size = s.page;
  kv.heads_kv = s.hkv;
  kv.head_dim = s.d;
  kv.page_indptr = d_table;
  kv.page_indices = d_table + indptr.size();
  kv.seq_lens = d_lens;
  kv.batch = batch;
  kv.space = MemorySpace::kDevice;
  const std::size_t q_elems = static_cast<std::size_t>(batch) * s.hq * s.d;
  auto* q = static_cast<std::uint16_t*>(env.q.get(2 * q_elems));
  bench_util::fill_bf16<<<64, 256, 0, env.stream>>>(q, q_elems, 3u);
  ATTNSTATE_CHECK_LAUNCH(env.stream, "fill_bf16");
  const ConstTensorView qv =
      make_tensor_view(q, DType::kBF16, {batch, 1, s.hq, s.d}, MemorySpace::kDevice);
  const StateView out = make_state_view(env.o.get(2 * q_elems), DType::kBF16,
                                        static_cast<float*>(env.lse.get(4 * batch * s.hq)), batch,
                                        s.hq, s.d, LseBase::kNatural, MemorySpace::kDevice);
  AttentionSinks sinks;
  if (s.sinks) {  // one logit per query head, of the order of the rows' LSEs
    std::vector<float> logits(static_cast<std::size_t>(s.hq));
    for (int h = 0; h < s.hq; ++h) logits[h] = 1.f + 0.25f * static_cast<float>(h % 16);
    sinks.logits = static_cast<const float*>(env.sinks.get(4 * logits.size()));
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(const_cast<float*>(sinks.logits), logits.data(),
                                    4 * logits.size(), cudaMemcpyHostToDevice));
  }
  t.us = env.time_us([&] {
    cuda::run_decode(t.plan, qv, kv, sinks, out, ws, t.plan.workspace_bytes(), env.stream);
  });
  return t;
}

std::string plan_str(const cuda::DecodePlan& p) {
  if (p.kernel() == DecodeKernel::kStreamed) return "streamed";
  return std::to_string(p.splits().max_splits) + "x" + std::to_string(p.splits().split_size) +
         "/c" + std::to_string(p.split_launch().cluster);
}

double gbps(const Shape& s, double us) { return s.kv_bytes() / (us * 1e-6) / 1e9; }

/// Lengths of `batch` requests totalling about `tokens` keys, by distribution.
std::vector<std::int32_t> lengths(const std::string& dist, int batch, std::int64_t tokens,
                                  std::mt19937& g) {
  std::vector<double> w(batch);
  if (dist == "one_long") {
    for (int b = 0; b < batch; ++b) w[b] = b == batch / 2 ? 10.0 : 1.0;
  } else if (dist == "uniform") {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (double& x : w) x = u(g);
  } else {  // log-uniform over 1:1024
    std::uniform_real_distribution<double> u(0.0, std::log(1024.0));
    for (double& x : w) x = std::exp(u(g));
  }
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<std::int32_t> lens(batch);
  for (int b = 0; b < batch; ++b)
    lens[b] = static_cast<std::int32_t>(
        std::clamp<double>(std::llround(w[b] / sum * static_cast<double>(tokens)), 1, 0x7FFF0000));
  return lens;
}

void ragged(Env& env, bool quick) {
  std::printf("\n## ragged batches (32/8 heads, head dim 128, pages of 16)\n");
  std::printf("%-9s %5s %7s %8s %8s %15s %9s %7s %6s %15s %9s %7s %7s\n", "dist", "batch", "KV_MiB",
              "max_len", "min_len", "auto_plan", "auto_us", "GB/s", "%copy", "longest_plan",
              "long_us", "%copy", "speedup");
  std::mt19937 g(2026);
  const std::vector<int> batches =
      quick ? std::vector<int>{4, 64} : std::vector<int>{4, 16, 64, 256};
  const std::vector<int> mibs =
      quick ? std::vector<int>{256, 2048} : std::vector<int>{64, 256, 1024, 8192};
  for (const char* dist : {"one_long", "uniform", "loguni"})
    for (int batch : batches)
      for (int mib : mibs) {
        Shape s;
        const std::int64_t tokens = (std::int64_t{mib} << 20) / (2 * 2 * s.hkv * s.d);
        s.lens = lengths(dist, batch, tokens, g);
        const std::int32_t max_len = *std::max_element(s.lens.begin(), s.lens.end());
        const std::int32_t min_len = *std::min_element(s.lens.begin(), s.lens.end());
        const Timed a = time_decode(env, s);
        const Timed l = time_decode(env, s, std::vector<std::int32_t>(s.lens.size(), max_len));
        if (env.fi_spec) {
          std::fprintf(env.fi_spec, "%s%d:%d:%d:%d:", std::ftell(env.fi_spec) > 0 ? ";" : "", s.hq,
                       s.hkv, s.d, s.page);
          for (std::size_t b = 0; b < s.lens.size(); ++b)
            std::fprintf(env.fi_spec, "%s%d", b ? "," : "", s.lens[b]);
        }
        std::printf("%-9s %5d %7d %8d %8d %15s %9.1f %7.0f %6.1f %15s %9.1f %7.1f %7.2f\n", dist,
                    batch, mib, max_len, min_len, plan_str(a.plan).c_str(), a.us, gbps(s, a.us),
                    100 * gbps(s, a.us) / env.copy_gbps, plan_str(l.plan).c_str(), l.us,
                    100 * gbps(s, l.us) / env.copy_gbps, l.us / a.us);
        if (env.csv)
          std::fprintf(env.csv, "ragged,%s,%d,%d,%d,%d,%d,%d,%d,%s,%.2f,%.1f,%.4f,%s,%.2f,%.1f\n",
                       dist, batch, mib, s.hq, s.hkv, s.d, s.page, max_len,
                       plan_str(a.plan).c_str(), a.us, gbps(s, a.us), gbps(s, a.us) / env.copy_gbps,
                       plan_str(l.plan).c_str(), l.us, env.copy_gbps);
      }
}

void pages(Env& env, bool quick) {
  std::printf("\n## page sizes (32/8 heads, head dim 128, %s)\n", env.hnd ? "HND" : "NHD");
  std::printf("%5s %7s %5s %15s %9s %7s %6s %8s\n", "batch", "ctx", "page", "plan", "time_us",
              "GB/s", "%copy", "vs_p16");
  for (int batch : {4, 16}) {
    double t16 = 0;
    for (int page : {16, 1, 2, 4, 8, 32, 64, 128, 3, 5}) {
      if (quick && page != 16 && page != 1 && page != 8) continue;
      Shape s;
      s.page = page;
      s.lens.assign(batch, 32768);
      const Timed t = time_decode(env, s);
      if (page == 16) t16 = t.us;
      std::printf("%5d %7d %5d %15s %9.1f %7.0f %6.1f %8.3f\n", batch, 32768, page,
                  plan_str(t.plan).c_str(), t.us, gbps(s, t.us),
                  100 * gbps(s, t.us) / env.copy_gbps, t.us / t16);
      if (env.csv)
        std::fprintf(env.csv, "pages,uniform,%d,0,%d,%d,%d,%d,32768,%s,%.2f,%.1f,%.4f,,%.4f,%.1f\n",
                     batch, s.hq, s.hkv, s.d, page, plan_str(t.plan).c_str(), t.us, gbps(s, t.us),
                     gbps(s, t.us) / env.copy_gbps, t.us / t16, env.copy_gbps);
    }
  }
}

void shapes(Env& env, bool quick) {
  std::printf("\n## head dims and groups (8 KV heads, pages of 16)\n");
  std::printf("%5s %5s %5s %7s %15s %9s %7s %6s\n", "d", "group", "batch", "ctx", "plan", "time_us",
              "GB/s", "%copy");
  struct Sh {
    int d, group;
  };
  std::vector<Sh> shs = {{64, 4},  {256, 4}, {128, 1}, {128, 2},
                         {128, 5}, {128, 7}, {128, 8}, {128, 16}};
  for (const Sh& sh : shs)
    for (int batch : {1, 16})
      for (int ctx : {8192, 131072}) {
        if (quick && ctx == 131072 && batch == 16) continue;
        Shape s;
        s.d = sh.d;
        s.hq = s.hkv * sh.group;
        s.lens.assign(batch, ctx);
        const Timed t = time_decode(env, s);
        std::printf("%5d %5d %5d %7d %15s %9.1f %7.0f %6.1f\n", s.d, sh.group, batch, ctx,
                    plan_str(t.plan).c_str(), t.us, gbps(s, t.us),
                    100 * gbps(s, t.us) / env.copy_gbps);
        if (env.csv)
          std::fprintf(env.csv, "shapes,uniform,%d,0,%d,%d,%d,%d,%d,%s,%.2f,%.1f,%.4f,,,%.1f\n",
                       batch, s.hq, s.hkv, s.d, s.page, ctx, plan_str(t.plan).c_str(), t.us,
                       gbps(s, t.us), gbps(s, t.us) / env.copy_gbps, env.copy_gbps);
      }
}

/// Random finite fp8 bytes of magnitude below 1 in both formats (sign, and exponent and mantissa
/// bits of 0x37), `n` bytes.
__global__ void fill_fp8(unsigned char* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    p[i] = static_cast<unsigned char>((x & 0x37u) | ((x >> 8) & 0x80u));
  }
}

/// fp8 caches beside bf16 in the same run: uniform batches and a ragged one, e4m3 and e5m2, GB/s
/// of the bytes each reads; the automatic plan, then the split kernel's paired configuration at
/// ring depths 4 and 6 (`pair4`, `pair6`: their plans, times and speedups over bf16). Runs last:
/// it overwrites the pools with fp8 bytes.
void fp8(Env& env, bool quick) {
  std::printf("\n## fp8 KV (32/8 heads, head dim 128, pages of 16; bf16 queries)\n");
  std::printf("%-8s %5s %7s %6s %15s %9s %7s %6s %9s %8s %15s %9s %8s %15s %9s %8s\n", "lens",
              "batch", "ctx", "kv", "plan", "time_us", "GB/s", "%copy", "bf16_us", "speedup",
              "pair4_plan", "pair4_us", "speedup", "pair6_plan", "pair6_us", "speedup");
  const std::size_t bytes = env.pool_elems * 2;
  struct Pt {
    const char* dist;
    int batch, ctx;
  };
  std::vector<Pt> pts = {{"uniform", 1, 131072}, {"uniform", 4, 32768},  {"uniform", 16, 32768},
                         {"uniform", 64, 8192},  {"uniform", 64, 32768}, {"uniform", 1, 8192},
                         {"loguni", 64, 16384},  {"one_long", 16, 16384}};
  if (quick) pts.resize(3);
  std::mt19937 g(2027);
  for (const Pt& pt : pts) {
    Shape s;
    s.lens = std::string(pt.dist) == "uniform"
                 ? std::vector<std::int32_t>(pt.batch, pt.ctx)
                 : lengths(pt.dist, pt.batch, std::int64_t{pt.batch} * pt.ctx, g);
    bench_util::fill_bf16<<<env.num_sms * 8, 512, 0, env.stream>>>(env.k, env.pool_elems, 1u);
    bench_util::fill_bf16<<<env.num_sms * 8, 512, 0, env.stream>>>(env.v, env.pool_elems, 2u);
    ATTNSTATE_CHECK_LAUNCH(env.stream, "fill_bf16");
    const Timed b = time_decode(env, s);
    fill_fp8<<<env.num_sms * 8, 512, 0, env.stream>>>(reinterpret_cast<unsigned char*>(env.k),
                                                      bytes, 1u);
    fill_fp8<<<env.num_sms * 8, 512, 0, env.stream>>>(reinterpret_cast<unsigned char*>(env.v),
                                                      bytes, 2u);
    ATTNSTATE_CHECK_LAUNCH(env.stream, "fill_fp8");
    for (DType f : {DType::kE4M3, DType::kE5M2}) {
      s.kv = f;
      const Timed t = time_decode(env, s);
      Timed pair[2];
      for (int i = 0; i < 2; ++i) {
        Shape ps = s;
        ps.split_stages = i == 0 ? 4 : 6;
        pair[i] = time_decode(env, ps);
      }
      std::printf(
          "%-8s %5d %7d %6s %15s %9.1f %7.0f %6.1f %9.1f %8.3f %15s %9.1f %8.3f %15s %9.1f "
          "%8.3f\n",
          pt.dist, pt.batch, pt.ctx, to_string(f), plan_str(t.plan).c_str(), t.us, gbps(s, t.us),
          100 * gbps(s, t.us) / env.copy_gbps, b.us, b.us / t.us, plan_str(pair[0].plan).c_str(),
          pair[0].us, b.us / pair[0].us, plan_str(pair[1].plan).c_str(), pair[1].us,
          b.us / pair[1].us);
      if (env.csv)
        std::fprintf(env.csv, "fp8,%s,%d,%.0f,%d,%d,%d,%d,%d,%s,%.2f,%.1f,%.4f,%s,%.2f,%.1f\n",
                     pt.dist, pt.batch, s.kv_bytes() / (1 << 20), s.hq, s.hkv, s.d, s.page,
                     *std::max_element(s.lens.begin(), s.lens.end()), plan_str(t.plan).c_str(),
                     t.us, gbps(s, t.us), gbps(s, t.us) / env.copy_gbps, to_string(f), b.us,
                     env.copy_gbps);
      for (int i = 0; env.csv && i < 2; ++i)
        std::fprintf(env.csv,
                     "fp8_pair%d,%s,%d,%.0f,%d,%d,%d,%d,%d,%s,%.2f,%.1f,%.4f,%s,%.2f,%.1f\n",
                     i == 0 ? 4 : 6, pt.dist, pt.batch, s.kv_bytes() / (1 << 20), s.hq, s.hkv, s.d,
                     s.page, *std::max_element(s.lens.begin(), s.lens.end()),
                     plan_str(pair[i].plan).c_str(), pair[i].us, gbps(s, pair[i].us),
                     gbps(s, pair[i].us) / env.copy_gbps, to_string(f), b.us, env.copy_gbps);
    }
    s.kv = DType::kBF16;
  }
}

void variants(Env& env) {
  std::printf("\n## variants (pages of 16; GB/s of the keys each row sees)\n");
  std::printf("%-22s %5s %5s %4s %7s %6s %5s %15s %9s %7s %9s %7s\n", "case", "hq/hkv", "d",
              "batch", "ctx", "window", "cap", "plan", "time_us", "%copy", "plain_us", "ratio");
  struct Case {
    const char* name;
    int hq, hkv, d, batch, ctx;
    std::int64_t window;
    float cap;
    bool sinks;
  };
  // each beside the plain decode of the keys it sees: the same context (cap, sinks) or the
  // window's keys (window), without sinks
  const Case cases[] = {
      {"soft_cap", 32, 8, 128, 1, 131072, kNoWindow, 50.f, false},
      {"soft_cap", 32, 8, 128, 16, 32768, kNoWindow, 50.f, false},
      {"soft_cap", 32, 8, 128, 64, 8192, kNoWindow, 30.f, false},
      {"sinks", 32, 8, 128, 1, 131072, kNoWindow, 0.f, true},
      {"sinks", 32, 8, 128, 16, 32768, kNoWindow, 0.f, true},
      {"sinks", 32, 8, 128, 64, 8192, kNoWindow, 0.f, true},
      {"sinks", 32, 8, 128, 128, 1024, kNoWindow, 0.f, true},
      {"window_4k_of_128k", 32, 8, 128, 1, 131072, 4095, 0.f, false},
      {"window_4k_of_128k", 32, 8, 128, 16, 131072, 4095, 0.f, false},
      {"gpt-oss_window_128", 64, 8, 64, 16, 32768, 127, 0.f, true},
      {"gpt-oss_full", 64, 8, 64, 16, 32768, kNoWindow, 0.f, true},
      {"gemma2_cap50_w4096", 32, 16, 256, 4, 32768, 4095, 50.f, false},
      {"gemma2_cap50_full", 32, 16, 256, 4, 32768, kNoWindow, 50.f, false},
  };
  for (const Case& c : cases) {
    Shape s;
    s.hq = c.hq;
    s.hkv = c.hkv;
    s.d = c.d;
    s.lens.assign(c.batch, c.ctx);
    s.variant.window_left = c.window;
    s.variant.logits_soft_cap = c.cap;
    s.sinks = c.sinks;
    const Timed t = time_decode(env, s);
    Shape plain = s;
    plain.variant = AttentionVariant{};
    plain.sinks = false;
    if (c.window >= 0) plain.lens.assign(c.batch, static_cast<std::int32_t>(c.window + 1));
    const Timed pt = time_decode(env, plain);
    const double seen = plain.kv_bytes();  // the keys the rows see
    const double pct = 100 * seen / (t.us * 1e-6) / 1e9 / env.copy_gbps;
    std::printf("%-22s %2d/%-2d %5d %4d %7d %6lld %5.0f %15s %9.1f %7.1f %9.1f %7.3f\n", c.name,
                c.hq, c.hkv, c.d, c.batch, c.ctx, static_cast<long long>(c.window), c.cap,
                plan_str(t.plan).c_str(), t.us, pct, pt.us, t.us / pt.us);
    if (env.csv)
      std::fprintf(env.csv, "variants,%s,%d,0,%d,%d,%d,%d,%d,%s,%.2f,%.1f,%.4f,,%.4f,%.1f\n",
                   c.name, c.batch, c.hq, c.hkv, c.d, s.page, c.ctx, plan_str(t.plan).c_str(), t.us,
                   seen / (t.us * 1e-6) / 1e9, pct / 100, t.us / pt.us, env.copy_gbps);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Env env;
  std::string csv_path, fi_path, sections = "ragged,pages,shapes,variants,fp8";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc)
      csv_path = argv[++i];
    else if (!std::strcmp(argv[i], "--fi-spec") && i + 1 < argc)
      fi_path = argv[++i];
    else if (!std::strcmp(argv[i], "--sections") && i + 1 < argc)
      sections = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      env.reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--hnd"))
      env.hnd = true;
    else if (!std::strcmp(argv[i], "--scatter"))
      env.scatter = true;
    else {
      std::fprintf(
          stderr,
          "usage: %s [--csv PATH] [--fi-spec PATH] [--sections ragged,pages,shapes,variants,fp8] "
          "[--reps N] [--quick] [--hnd] [--scatter]\n",
          argv[0]);
      return 2;
    }
  }
  try {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      std::printf("no CUDA device: nothing to time\n");
      return 0;
    }
    const bench_util::Device device = bench_util::current_device();
    const cudaDeviceProp& prop = device.prop;
    env.init(device.num_sms);
    // device-to-device copy bandwidth (bytes read + written), measured here
    env.copy_gbps = bench_util::copy_bandwidth(env.stream, std::size_t{1} << 30,
                                               [&](auto&& copy) { return env.time_us(copy); }) /
                    1e9;
    // pools for the largest point: 8 GiB of K + V (ragged), 16 x 128k x 8 x 256 (shapes)
    env.pool_elems = (std::size_t{4} << 30) / 2 + (std::size_t{1} << 24);  // + page rounding
    if (sections.find("shapes") != std::string::npos)
      env.pool_elems = std::max(env.pool_elems, std::size_t{16} * 131072 * 8 * 256 + (1u << 20));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&env.k, env.pool_elems * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&env.v, env.pool_elems * 2));
    bench_util::fill_bf16<<<env.num_sms * 8, 512, 0, env.stream>>>(env.k, env.pool_elems, 1u);
    ATTNSTATE_CHECK_LAUNCH(env.stream, "fill_bf16");
    bench_util::fill_bf16<<<env.num_sms * 8, 512, 0, env.stream>>>(env.v, env.pool_elems, 2u);
    ATTNSTATE_CHECK_LAUNCH(env.stream, "fill_bf16");
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(env.stream));
    if (!csv_path.empty()) {
      env.csv = std::fopen(csv_path.c_str(), "w");
      if (env.csv)
        std::fprintf(env.csv,
                     "section,dist,batch,kv_mib,heads_q,heads_kv,head_dim,page,max_len,plan,"
                     "time_us,gbps,frac_copy,longest_plan,longest_us_or_vs_p16,copy_gbps\n");
    }
    std::printf(
        "# %s, %d SMs; device-to-device copy %.0f GB/s (read + written); bf16, %s pages%s;"
        " medians of %d calls, L2 flushed\n",
        prop.name, env.num_sms, env.copy_gbps, env.hnd ? "HND" : "NHD",
        env.scatter ? " scattered" : " in order", env.reps);
    if (!fi_path.empty()) env.fi_spec = std::fopen(fi_path.c_str(), "w");
    if (sections.find("ragged") != std::string::npos) ragged(env, quick);
    if (env.fi_spec) std::fclose(env.fi_spec);
    if (sections.find("pages") != std::string::npos) pages(env, quick);
    if (sections.find("shapes") != std::string::npos) shapes(env, quick);
    if (sections.find("variants") != std::string::npos) variants(env);
    if (sections.find("fp8") != std::string::npos) fp8(env, quick);
    if (env.csv) std::fclose(env.csv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode_serving: %s\n", e.what());
    return 1;
  }
  return 0;
}
