/// @file bench_decode.cu
/// @brief Split-KV decode benchmark: the sweep of the project's anchors (H_q/H_kv 32/8 and 64/8,
///        batch {1, 4, 16, 64}, context {1k, 8k, 32k, 128k}, pages of 16 tokens NHD, bf16,
///        head_dim 128). Prints the median time (L2 flushed before every timed call), the GB/s of
///        KV read, its fraction of a device-to-device copy measured in the same run, the splits
///        chosen, the combine's share, the best anchor, and the automatic plan against
///        num_splits = 1.
///
/// Options: `--csv <path>` writes a CSV; `--quick` runs a few points; `--points
/// hq:batch:ctx,...` runs the given points (ctx in tokens, or with a `k` suffix); `--splits n`
/// forces n splits; `--explore` times several split counts per point; `--no-s1` skips the
/// one-split column; `--reps n` sets the timed calls per point; `--hnd` uses HND pages;
/// `--no-flush` keeps the L2 warm between calls (a short spin kernel before each timed call keeps
/// the host's launch time out of the measurement; `--no-flush-raw` times without it, so an idle
/// GPU waits for the host's launch); `--floors` also times an empty kernel after the flush and
/// the read bandwidth of the cache in the decode's access pattern (no arithmetic); `--host`
/// prints the host time of one `run_decode` call; `--timeline` (builds with
/// -DATTNSTATE_BUILD_PROBES=ON only) prints per-CTA timeline statistics of single calls;
/// `--layers n` also times the point as a model's layer loop: n calls captured in one CUDA graph,
/// call l reading its own cache (layer l's pages, inputs rotated: n caches, at least 256 MiB in
/// all, never the same bytes twice in a replay), the graph replayed after an L2 flush; prints
/// the time per call (launch gaps inside the graph included, no host launch latency); points
/// whose caches would take more than 4 GiB skip it; `--programmatic` plans every decode with
/// `DecodeOptions::programmatic_launch` (consecutive calls then overlap their launches, e.g. in
/// the layer loop); `--stream 0|1` plans every decode without split requests again with
/// `DecodeOptions::kernel = kSplit` or `kStreamed` (the same split layout; default: the
/// automatic choice); `--explore` also times the one-split plan on the streamed kernel (`s1st`).
/// `--latency` runs only the batch-1 latency sweep (`run_latency`): batch 1 × {1k, 2k, 4k, 8k}
/// × the compiled head dims of {64, 128, 256} × 32/8 and 64/8 heads, every split count, merge
/// path, depth, the streamed kernel and the automatic layout over fewer CTAs per SM, each checked
/// against the CPU decode and timed (L2 flushed), the best and the automatic plan also as
/// programmatic launches; one line per row (`--latency-all`: every alternative too), every
/// alternative in the `--csv` file; `--reps` sets its timed calls (default 31); exits 2 when a
/// check fails.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attnstate/cpu/decode.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"
#include "bench_util.cuh"
#include "probe_hooks.hpp"

namespace {

using namespace attnstate;

constexpr int kHeadDim = 128;
constexpr int kHeadsKv = 8;
constexpr int kPage = 16;

/// Best anchor of ANCHORS.md per (H_q, batch, context): GB/s and who.
struct Anchor {
  int hq, batch, ctx_k;
  double gbps;
  const char* who;
};
const Anchor kAnchors[] = {
    {32, 1, 1, 341, "cuDNN"},     {32, 1, 8, 1529, "FI-tc"},    {32, 1, 32, 2891, "FI-tc"},
    {32, 1, 128, 3829, "FI-tc"},  {32, 4, 1, 1063, "FI-cc"},    {32, 4, 8, 2959, "FI-tc"},
    {32, 4, 32, 3969, "FI-tc"},   {32, 4, 128, 4313, "FI-tc"},  {32, 16, 1, 2290, "cuDNN"},
    {32, 16, 8, 3948, "FI-tc"},   {32, 16, 32, 4379, "cuDNN"},  {32, 16, 128, 4519, "cuDNN"},
    {32, 64, 1, 3472, "FI-tc"},   {32, 64, 8, 4397, "cuDNN"},   {32, 64, 32, 4517, "cuDNN"},
    {32, 64, 128, 4554, "cuDNN"}, {64, 1, 1, 350, "cuDNN"},     {64, 1, 8, 1440, "cuDNN"},
    {64, 1, 32, 2632, "cuDNN"},   {64, 1, 128, 3800, "cuDNN"},  {64, 4, 1, 975, "cuDNN"},
    {64, 4, 8, 2787, "FI-tc"},    {64, 4, 32, 3851, "FI-tc"},   {64, 4, 128, 4308, "FI-tc"},
    {64, 16, 1, 2346, "cuDNN"},   {64, 16, 8, 3962, "cuDNN"},   {64, 16, 32, 4382, "cuDNN"},
    {64, 16, 128, 4520, "cuDNN"}, {64, 64, 1, 3446, "cuDNN"},   {64, 64, 8, 4396, "cuDNN"},
    {64, 64, 32, 4514, "cuDNN"},  {64, 64, 128, 4550, "cuDNN"},
};

const Anchor* find_anchor(int hq, int batch, int ctx) {
  if (ctx % 1024 != 0) return nullptr;
  for (const Anchor& a : kAnchors)
    if (a.hq == hq && a.batch == batch && a.ctx_k == ctx / 1024) return &a;
  return nullptr;
}

__global__ void empty_kernel() {}

/// Busy-waits `ns` nanoseconds of the global timer (keeps the GPU busy while the host launches).
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

/// Reads the K and V rows of `streams` (request, KV head) pairs the way the decode does, without
/// arithmetic: one CTA of 4 warps per stream, each warp 16-token tiles (w, w + 4, ...), lane l
/// the 16-byte chunk l % 16 of row l / 16 (+2 per load), two tiles in flight. Row `t` of stream
/// `(b, h)` starts at int4 `((b·T + t)·H + h)·16` (NHD pages) or `((b·H + h)·T + t)·16`.
__global__ void __launch_bounds__(128)
    read_rows(const int4* k, const int4* v, int tokens, int heads, bool hnd, int* sink) {
  const int b = blockIdx.x / heads;
  const int h = blockIdx.x % heads;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const std::int64_t row_stride = hnd ? 16 : static_cast<std::int64_t>(heads) * 16;
  const std::int64_t base = hnd ? (static_cast<std::int64_t>(b) * heads + h) * tokens * 16
                                : (static_cast<std::int64_t>(b) * tokens * heads + h) * 16;
  const std::int64_t lane_off = base + (lane >> 4) * row_stride + (lane & 15);
  int acc = 0;
  const int tiles = tokens / 16;
  for (int t = warp; t < tiles; t += 8) {
    int4 x[2][16];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int tt = t + 4 * u;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const std::int64_t off =
            lane_off + (static_cast<std::int64_t>(tt) * 16 + 2 * i) * row_stride;
        x[u][2 * i] = tt < tiles ? __ldcg(k + off) : make_int4(0, 0, 0, 0);
        x[u][2 * i + 1] = tt < tiles ? __ldcg(v + off) : make_int4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int i = 0; i < 16; ++i) acc ^= x[u][i].x ^ x[u][i].y ^ x[u][i].z ^ x[u][i].w;
  }
  if (acc == 0x7F3A5C1D) *sink = acc;
}

/// The shared timer, plus how the L2 is treated between timed calls.
struct Bench : bench_util::FlushTimer {
  bool flush_l2 = true;
  bool spin = true;  // without the flush: a spin kernel before each timed call

  /// Median of `reps` event-timed calls of `f` (µs), each after an L2 flush (`flush_l2`), or
  /// else after a spin kernel (`spin`) or nothing.
  template <class F>
  double time_us(int reps, F&& f) {
    return FlushTimer::time_us(
        reps,
        [&](int) {
          if (flush_l2) {
            flush();
          } else if (spin) {
            spin_kernel<<<1, 32, 0, stream>>>(20000);
            ATTNSTATE_CHECK_LAUNCH(stream, "spin_kernel");
          }
        },
        f);
  }
};

struct Point {
  int hq, batch, ctx;
};

/// Parses "hq:batch:ctx,..." (ctx in tokens, or with a k suffix).
std::vector<Point> parse_points(const char* s) {
  std::vector<Point> pts;
  std::string str(s);
  std::size_t pos = 0;
  while (pos < str.size()) {
    std::size_t end = str.find(',', pos);
    if (end == std::string::npos) end = str.size();
    const std::string item = str.substr(pos, end - pos);
    Point pt{};
    char unit = 0;
    if (std::sscanf(item.c_str(), "%d:%d:%d%c", &pt.hq, &pt.batch, &pt.ctx, &unit) >= 3) {
      if (unit == 'k' || unit == 'K') pt.ctx *= 1024;
      pts.push_back(pt);
    }
    pos = end + 1;
  }
  return pts;
}

/// Caches in the layer loop for `layers` requested and `bytes` of K + V per cache: at least
/// `layers`, and enough to read 256 MiB (well above the L2) per graph replay; 0 (no layer loop
/// at this point) when they would take more than 4 GiB.
int layer_count(int layers, std::int64_t bytes) {
  if (layers <= 0) return 0;
  const std::int64_t min_total = std::int64_t{256} << 20, max_total = std::int64_t{4} << 30;
  const std::int64_t n = std::max<std::int64_t>(layers, (min_total + bytes - 1) / bytes);
  return n * bytes > max_total ? 0 : static_cast<int>(n);
}

std::string ctx_str(int ctx) {
  return ctx % 1024 == 0 ? std::to_string(ctx / 1024) + "k" : std::to_string(ctx);
}

/// The bf16 decode of one bench row: `batch` requests of `heads_q` / `heads_kv` heads of
/// `head_dim`, one query each, over the paged cache `k` / `v` (`num_pages` pages of `page`
/// tokens, `layout`) with the device block table `bt` (`bt_stride` ids per request) and lengths
/// `lens`.
struct DecodeRow {
  DecodeProblem problem;
  PagedKvCache kv;
};

DecodeRow bf16_decode_row(int batch, int heads_q, int heads_kv, int head_dim, const void* k,
                          const void* v, KvLayout layout, std::int64_t num_pages, int page,
                          const std::int32_t* bt, std::int64_t bt_stride,
                          const std::int32_t* lens) {
  DecodeRow r;
  r.problem.batch = batch;
  r.problem.q_len = 1;
  r.problem.heads_q = heads_q;
  r.problem.heads_kv = heads_kv;
  r.problem.head_dim = head_dim;
  r.problem.q_dtype = r.problem.kv_dtype = DType::kBF16;
  r.kv.k = k;
  r.kv.v = v;
  r.kv.dtype = DType::kBF16;
  r.kv.layout = layout;
  r.kv.num_pages = num_pages;
  r.kv.page_size = page;
  r.kv.heads_kv = heads_kv;
  r.kv.head_dim = head_dim;
  r.kv.block_table = bt;
  r.kv.block_table_stride = bt_stride;
  r.kv.seq_lens = lens;
  r.kv.batch = batch;
  r.kv.space = MemorySpace::kDevice;
  return r;
}

// ---- --latency: the alternatives of a batch-1 call (issue 33, "latency path for small batches")

/// The kernel ahead of a chained decode (the latency sweep's "chain" columns): it does nothing
/// but let the next programmatic launch of the stream start (the role of the kernel that writes
/// the queries and the new keys ahead of a decode step).
__global__ void producer_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

/// One alternative of the latency sweep: its name and the options that plan it.
struct LatAlt {
  std::string name;
  DecodeOptions opt;
};

/// What one alternative's plan resolved to, in words: "s<splits> c<cluster> st<stages>" or
/// "s1 streamed".
std::string plan_str(const cuda::DecodePlan& p, int ctx) {
  if (p.kernel() == DecodeKernel::kStreamed) return "s1 streamed";
  char b[64];
  std::snprintf(b, sizeof b, "s%d/%d c%d st%d", p.splits().splits_for(ctx),
                p.splits().chunk_for(ctx), p.split_launch().cluster, p.split_launch().stages);
  return b;
}

/// The alternatives of one row: the automatic plan, the automatic layout over fewer CTA slots per
/// SM (`plan_ctas_per_sm` 1..3; refused past the kernel's occupancy), then every split count
/// from 1 to 128 (fixed split size, exact count) with every merge the kernel takes (the cluster
/// merge up to 8 splits, the workspace merge alone or in groups of each divisor up to 8) at
/// both depths (the short-split depth where the head dim has one), and the one-split plan on
/// the streamed kernel. Plans the planner refuses are dropped by the caller.
std::vector<LatAlt> latency_alternatives(int ctx) {
  std::vector<LatAlt> alts;
  alts.push_back({"auto", DecodeOptions{}});
  for (int per_sm = 1; per_sm <= 3; ++per_sm) {
    DecodeOptions o;
    o.plan_ctas_per_sm = per_sm;
    alts.push_back({"auto/" + std::to_string(per_sm) + "sm", o});
  }
  for (int ns : {1, 2, 4, 8, 16, 32, 64, 128}) {
    int size = (ctx + ns - 1) / ns;
    size = (size + kSplitGranularity - 1) / kSplitGranularity * kSplitGranularity;
    if (ns > 1 && (ctx + size - 1) / size != ns) continue;
    DecodeOptions base;
    base.policy = SplitPolicy::kFixedSize;
    base.split_size = size;
    base.kernel = DecodeKernel::kSplit;
    std::vector<int> clusters;
    if (ns > 1) {
      if (ns <= 8) clusters.push_back(ns);
      clusters.push_back(1);
      for (int c = 2; c <= std::min(8, ns - 1); ++c)
        if (ns % c == 0) clusters.push_back(c);
    } else {
      clusters.push_back(0);
    }
    for (int c : clusters)
      for (int stages : {3, 2}) {
        DecodeOptions o = base;
        o.split_cluster = c;
        o.split_stages = stages;
        alts.push_back(
            {"s" + std::to_string(ns) + " c" + std::to_string(c) + " st" + std::to_string(stages),
             o});
      }
    if (ns == 1) {
      DecodeOptions o = base;
      o.kernel = DecodeKernel::kStreamed;
      alts.push_back({"s1 streamed", o});
    }
  }
  return alts;
}

/// The batch-1 latency sweep: batch 1 × {1k, 2k, 4k, 8k} keys × the compiled head dims of
/// {64, 128, 256} × groups 4 and 8 (32/8 and 64/8 heads), bf16, pages of 16 (block table). Every
/// alternative (`latency_alternatives`) runs once on NaN-poisoned outputs and is checked against
/// the CPU decode (one split), then is timed (medians of `reps` calls, L2 flushed); the best
/// alternative is timed again as a programmatic launch, as is the automatic plan. Prints one
/// line per row (the automatic plan, the best, both with PDL); `all` prints every alternative;
/// `csv` gets every alternative. Returns the number of failed checks.
int run_latency(Bench& bench, int reps, const std::string& csv_path, bool all) {
  constexpr int kLatPage = 16, kLatHkv = 8, kMaxCtx = 8192;
  const int ctxs[] = {1024, 2048, 4096, 8192};
  FILE* csv = nullptr;
  if (!csv_path.empty()) {
    csv = std::fopen(csv_path.c_str(), "w");
    if (csv)
      std::fprintf(csv,
                   "heads_q,heads_kv,head_dim,ctx,alt,plan,pdl,time_us,chain_us,maxdiff_o,"
                   "maxdiff_lse,ok\n");
  }
  std::printf(
      "# latency: batch 1, H_kv %d, bf16, pages of %d (block table), L2 flushed, medians of %d; "
      "softmax scale 0.5 (a sharp softmax, so that the check sees the merge); check: |o - cpu| "
      "<= 1e-2 and |lse - cpu| <= 1e-3 (1 + |lse|), outputs NaN-poisoned first\n",
      kLatHkv, kLatPage, reps);
  std::printf(
      "# columns: the automatic plan (splits/split size, cluster, depth) and the best alternative "
      "(flushed single calls); both as programmatic launches; 'chain': producer_kernel then the "
      "decode timed together, plain and programmatic (a programmatic decode may be placed while "
      "the producer runs)\n");
  std::printf("%-7s %4s %5s | %7s %-18s | %7s %-22s | %7s %7s | %7s %7s %7s %7s | %6s %4s %s\n",
              "Hq/Hkv", "D", "ctx", "auto_us", "auto plan", "best_us", "best", "a+pdl", "b+pdl",
              "ch_a", "ch_a+p", "ch_b", "ch_b+p", "b/auto", "alts", "check");
  int failures = 0;
  const int pages = kMaxCtx / kLatPage;
  for (int D : {64, 128, 256}) {
    // this head dim compiled? (a plan of one request answers; kNotSupported: skip it)
    DecodeProblem probe;
    probe.batch = 1;
    probe.heads_q = 32;
    probe.heads_kv = kLatHkv;
    probe.head_dim = D;
    probe.q_dtype = probe.kv_dtype = DType::kBF16;
    const std::int32_t probe_len = 1024;
    try {
      (void)cuda::plan_decode(probe, &probe_len, DecodeOptions{}, bench.num_sms);
    } catch (const Error& e) {
      if (e.status() != Status::kNotSupported) throw;
      std::printf("# head dim %d: not compiled in this build, skipped\n", D);
      continue;
    }
    const std::size_t pool = static_cast<std::size_t>(pages) * kLatPage * kLatHkv * D;
    const std::size_t q_elems = static_cast<std::size_t>(64) * D;
    std::uint16_t *k = nullptr, *v = nullptr, *q = nullptr, *o = nullptr;
    float* lse = nullptr;
    std::int32_t *d_bt = nullptr, *d_len = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&k, pool * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&v, pool * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&q, q_elems * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&o, q_elems * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&lse, 64 * 4));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&d_bt, pages * 4));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&d_len, 4));
    // fresh inputs for each head dim (seeds differ from the main sweep's)
    bench_util::fill_bf16<<<bench.num_sms * 8, 512, 0, bench.stream>>>(k, pool, 11u + D);
    ATTNSTATE_CHECK_LAUNCH(bench.stream, "fill_bf16");
    bench_util::fill_bf16<<<bench.num_sms * 8, 512, 0, bench.stream>>>(v, pool, 12u + D);
    ATTNSTATE_CHECK_LAUNCH(bench.stream, "fill_bf16");
    bench_util::fill_bf16<<<64, 256, 0, bench.stream>>>(q, q_elems, 13u + D);
    ATTNSTATE_CHECK_LAUNCH(bench.stream, "fill_bf16");
    // the block table of the main sweep (identity), so the automatic plan's time compares
    std::vector<std::int32_t> bt(static_cast<std::size_t>(pages));
    for (int i = 0; i < pages; ++i) bt[i] = i;
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(d_bt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
    std::vector<std::uint16_t> hk(pool), hv(pool), hq(q_elems);
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(bench.stream));
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(hk.data(), k, pool * 2, cudaMemcpyDeviceToHost));
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(hv.data(), v, pool * 2, cudaMemcpyDeviceToHost));
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(hq.data(), q, q_elems * 2, cudaMemcpyDeviceToHost));
    void* ws = nullptr;
    std::size_t ws_bytes = 0;
    for (int hq_n : {32, 64})
      for (int ctx : ctxs) {
        ATTNSTATE_CUDA_CHECK(cudaMemcpy(d_len, &ctx, 4, cudaMemcpyHostToDevice));
        const DecodeRow row = bf16_decode_row(1, hq_n, kLatHkv, D, k, v, KvLayout::kNHD, pages,
                                              kLatPage, d_bt, pages, d_len);
        const DecodeProblem& pr = row.problem;
        const PagedKvCache& kv = row.kv;
        const ConstTensorView qv =
            make_tensor_view(q, DType::kBF16, {1, 1, hq_n, D}, MemorySpace::kDevice);
        const StateView out = make_state_view(o, DType::kBF16, lse, 1, hq_n, D, LseBase::kNatural,
                                              MemorySpace::kDevice);
        // the CPU reference: one split, f32 state
        PagedKvCache hkv = kv;
        hkv.k = hk.data();
        hkv.v = hv.data();
        hkv.block_table = bt.data();
        hkv.seq_lens = &ctx;
        hkv.space = MemorySpace::kHost;
        std::vector<float> ref_o(static_cast<std::size_t>(hq_n) * D), ref_lse(hq_n);
        constexpr float kScale = 0.5f;
        {
          SplitLayout one;
          one.policy = SplitPolicy::kFixedCount;
          one.num_splits = one.max_splits = 1;
          cpu::decode(make_tensor_view(hq.data(), DType::kBF16, {1, 1, hq_n, D}), hkv, one, kScale,
                      make_state_view(ref_o.data(), DType::kF32, ref_lse.data(), 1, hq_n, D,
                                      LseBase::kNatural));
        }
        std::vector<std::uint16_t> got_o(static_cast<std::size_t>(hq_n) * D);
        std::vector<float> got_lse(hq_n);
        struct Result {
          std::string name, plan;
          double t = 0;
          bool ok = false;
          DecodeOptions opt;
          double chain = 0;  // producer_kernel then the decode, timed together
        };
        std::vector<Result> results;
        const auto run_alt = [&](const std::string& name, DecodeOptions opt, bool pdl,
                                 bool chain = false) {
          opt.scale = kScale;
          opt.programmatic_launch = pdl;
          cuda::DecodePlan p;
          try {
            p = cuda::plan_decode(pr, &ctx, opt, bench.num_sms);
          } catch (const Error& e) {  // a launch this head dim does not take (e.g. its depth)
            if (e.status() != Status::kInvalidArgument && e.status() != Status::kNotSupported)
              throw;
            if (all) std::printf("  %-16s refused: %s\n", name.c_str(), e.what());
            return Result{};
          }
          if (p.workspace_bytes() > ws_bytes) {
            if (ws != nullptr) ATTNSTATE_CUDA_CHECK(cudaFree(ws));
            ws_bytes = p.workspace_bytes();
            ATTNSTATE_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
          }
          cuda::init_decode_workspace(p, ws, ws_bytes, bench.stream);
          // the check: poisoned outputs, one run, against the CPU
          ATTNSTATE_CUDA_CHECK(cudaMemsetAsync(o, 0xFF, q_elems * 2, bench.stream));
          ATTNSTATE_CUDA_CHECK(cudaMemsetAsync(lse, 0xFF, 64 * 4, bench.stream));
          cuda::run_decode(p, qv, kv, out, ws, ws_bytes, bench.stream);
          ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(bench.stream));
          ATTNSTATE_CUDA_CHECK(
              cudaMemcpy(got_o.data(), o, got_o.size() * 2, cudaMemcpyDeviceToHost));
          ATTNSTATE_CUDA_CHECK(
              cudaMemcpy(got_lse.data(), lse, got_lse.size() * 4, cudaMemcpyDeviceToHost));
          double d_o = 0, d_lse = 0;
          bool ok = true;
          for (std::size_t i = 0; i < got_o.size(); ++i) {
            const double d = std::fabs(detail::bf16_bits_to_float(got_o[i]) - ref_o[i]);
            if (!(d <= 1e-2)) ok = false;
            d_o = std::isnan(d) || d > d_o ? d : d_o;
          }
          for (int h = 0; h < hq_n; ++h) {
            const double d = std::fabs(got_lse[h] - ref_lse[h]);
            if (!(d <= 1e-3 * (1.0 + std::fabs(ref_lse[h])))) ok = false;
            d_lse = std::isnan(d) || d > d_lse ? d : d_lse;
          }
          Result r{name, plan_str(p, ctx), 0.0, ok, opt};
          r.t = bench.time_us(
              reps, [&] { cuda::run_decode(p, qv, kv, out, ws, ws_bytes, bench.stream); });
          if (chain)  // behind a kernel of the stream: a programmatic launch may start early
            r.chain = bench.time_us(reps, [&] {
              producer_kernel<<<1, 32, 0, bench.stream>>>();
              ATTNSTATE_CHECK_LAUNCH(bench.stream, "producer_kernel");
              cuda::run_decode(p, qv, kv, out, ws, ws_bytes, bench.stream);
            });
          if (!ok) {
            ++failures;
            std::printf("CHECK FAILED %d/%d D%d %s %s (%s)%s: maxdiff o %.3g lse %.3g\n", hq_n,
                        kLatHkv, D, ctx_str(ctx).c_str(), name.c_str(), r.plan.c_str(),
                        pdl ? " pdl" : "", d_o, d_lse);
          }
          if (all)
            std::printf("  %-16s %-22s%s %8.2f us%s\n", name.c_str(), r.plan.c_str(),
                        pdl ? " pdl" : "    ", r.t, ok ? "" : " CHECK FAILED");
          if (csv)
            std::fprintf(csv, "%d,%d,%d,%d,%s,%s,%d,%.3f,%.3f,%.3g,%.3g,%d\n", hq_n, kLatHkv, D,
                         ctx, name.c_str(), r.plan.c_str(), pdl ? 1 : 0, r.t, r.chain, d_o, d_lse,
                         ok ? 1 : 0);
          return r;
        };
        if (all) std::printf("%d/%d D%d %s:\n", hq_n, kLatHkv, D, ctx_str(ctx).c_str());
        const int failures_before = failures;
        for (const LatAlt& a : latency_alternatives(ctx)) {
          Result r = run_alt(a.name, a.opt, false);
          if (!r.name.empty()) results.push_back(r);
        }
        if (results.empty() || results[0].name != "auto") {
          std::printf("%d/%d D%d %s: the automatic plan was refused\n", hq_n, kLatHkv, D,
                      ctx_str(ctx).c_str());
          continue;
        }
        const Result au = results[0];
        std::size_t bi = 0;
        for (std::size_t i = 1; i < results.size(); ++i)
          if (results[i].ok && (!results[bi].ok || results[i].t < results[bi].t)) bi = i;
        const Result best = results[bi];
        // the two again, as programmatic launches and behind a producer kernel
        const Result au_c = run_alt("auto", au.opt, false, true);
        const Result au_pdl = run_alt("auto", au.opt, true, true);
        const Result best_c = run_alt(best.name, best.opt, false, true);
        const Result best_pdl = run_alt(best.name, best.opt, true, true);
        char hd[16];
        std::snprintf(hd, sizeof hd, "%d/%d", hq_n, kLatHkv);
        std::printf(
            "%-7s %4d %5s | %7.2f %-18s | %7.2f %-22s | %7.2f %7.2f | %7.2f %7.2f %7.2f %7.2f | "
            "%5.2fx %4zu %s\n",
            hd, D, ctx_str(ctx).c_str(), au.t, au.plan.c_str(), best.t,
            (best.name.compare(0, 4, "auto") == 0 ? best.name + "=" + best.plan : best.name)
                .substr(0, 22)
                .c_str(),
            au_pdl.t, best_pdl.t, au_c.chain, au_pdl.chain, best_c.chain, best_pdl.chain,
            best.t / au.t, results.size(), failures == failures_before ? "ok" : "FAILED");
        std::fflush(stdout);
      }
    if (ws != nullptr) ATTNSTATE_CUDA_CHECK(cudaFree(ws));
    ATTNSTATE_CUDA_CHECK(cudaFree(k));
    ATTNSTATE_CUDA_CHECK(cudaFree(v));
    ATTNSTATE_CUDA_CHECK(cudaFree(q));
    ATTNSTATE_CUDA_CHECK(cudaFree(o));
    ATTNSTATE_CUDA_CHECK(cudaFree(lse));
    ATTNSTATE_CUDA_CHECK(cudaFree(d_bt));
    ATTNSTATE_CUDA_CHECK(cudaFree(d_len));
  }
  if (csv) std::fclose(csv);
  std::printf("# latency: %d failed checks\n", failures);
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  bool quick = false, explore = false, no_s1 = false, hnd = false, floors = false;
  bool host_time = false, timeline = false, programmatic = false, latency = false;
  bool latency_all = false;
  int force_splits = 0, reps_arg = 0, layers = 0, stream_mode = -1;
  std::vector<Point> points;
  Bench bench;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc)
      csv_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--splits") && i + 1 < argc)
      force_splits = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--explore"))
      explore = true;
    else if (!std::strcmp(argv[i], "--points") && i + 1 < argc)
      points = parse_points(argv[++i]);
    else if (!std::strcmp(argv[i], "--no-s1"))
      no_s1 = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps_arg = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--hnd"))
      hnd = true;
    else if (!std::strcmp(argv[i], "--no-flush"))
      bench.flush_l2 = false;
    else if (!std::strcmp(argv[i], "--no-flush-raw"))
      bench.flush_l2 = bench.spin = false;
    else if (!std::strcmp(argv[i], "--host"))
      host_time = true;
    else if (!std::strcmp(argv[i], "--timeline"))
      timeline = true;
    else if (!std::strcmp(argv[i], "--floors"))
      floors = true;
    else if (!std::strcmp(argv[i], "--programmatic"))
      programmatic = true;
    else if (!std::strcmp(argv[i], "--layers") && i + 1 < argc)
      layers = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--latency"))
      latency = true;
    else if (!std::strcmp(argv[i], "--latency-all"))
      latency = latency_all = true;
    else if (!std::strcmp(argv[i], "--stream") && i + 1 < argc)
      stream_mode = std::atoi(argv[++i]) != 0 ? 1 : 0;
  }
  if (points.empty()) {
    std::vector<int> batches = {1, 4, 16, 64};
    std::vector<int> ctxs_k = {1, 8, 32, 128};
    if (quick) {
      batches = {1, 16, 64};
      ctxs_k = {1, 32, 128};
    }
    for (int hq : {32, 64})
      for (int batch : batches)
        for (int ctx_k : ctxs_k) points.push_back(Point{hq, batch, ctx_k * 1024});
  }
  try {
    const bench_util::Device device = bench_util::current_device();
    const cudaDeviceProp& prop = device.prop;
    bench.init(device.num_sms);
    if (latency) {
      std::printf("# %s, %d SMs\n", prop.name, bench.num_sms);
      const int failed = run_latency(bench, reps_arg > 0 ? reps_arg : 31, csv_path, latency_all);
      return failed == 0 ? 0 : 2;
    }

    int max_batch = 1;
    std::int64_t max_pages = 64;  // pages of all requests of one point
    const std::int64_t page_bytes = std::int64_t{kPage} * kHeadsKv * kHeadDim * 2;  // K or V
    for (const Point& pt : points) {
      max_batch = std::max(max_batch, pt.batch);
      const std::int64_t pages = std::int64_t{pt.batch} * ((pt.ctx + kPage - 1) / kPage);
      max_pages = std::max<std::int64_t>(max_pages, pages);
      // the layer loop's caches: `layers` of them, 256 MiB of K + V at least (see --layers)
      max_pages =
          std::max<std::int64_t>(max_pages, pages * layer_count(layers, pages * 2 * page_bytes));
    }

    // Device-to-device copy bandwidth (bytes read + written), measured here.
    const double copy_gbps =
        bench_util::copy_bandwidth(bench.stream, std::size_t{1} << 30,
                                   [&](auto&& copy) { return bench.time_us(10, copy); }) /
        1e9;

    // One pool pair for the largest point, reused by every point.
    const std::int64_t num_pages = max_pages;
    const std::int64_t page_elems = std::int64_t{kPage} * kHeadsKv * kHeadDim;
    const std::size_t pool_elems = static_cast<std::size_t>(num_pages * page_elems);
    std::uint16_t *k = nullptr, *v = nullptr, *q = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&k, pool_elems * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&v, pool_elems * 2));
    bench_util::fill_bf16<<<bench.num_sms * 8, 512, 0, bench.stream>>>(k, pool_elems, 1u);
    ATTNSTATE_CHECK_LAUNCH(bench.stream, "fill_bf16");
    bench_util::fill_bf16<<<bench.num_sms * 8, 512, 0, bench.stream>>>(v, pool_elems, 2u);
    ATTNSTATE_CHECK_LAUNCH(bench.stream, "fill_bf16");
    const std::size_t q_elems = static_cast<std::size_t>(max_batch) * 64 * kHeadDim;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&q, q_elems * 2));
    bench_util::fill_bf16<<<64, 256, 0, bench.stream>>>(q, q_elems, 3u);
    ATTNSTATE_CHECK_LAUNCH(bench.stream, "fill_bf16");
    // Block table (identity): with stride P, request b owns pages [b·P, (b+1)·P) of the pool.
    std::vector<std::int32_t> bt(static_cast<std::size_t>(num_pages));
    for (std::int64_t i = 0; i < num_pages; ++i) bt[i] = static_cast<std::int32_t>(i);
    std::int32_t *d_bt = nullptr, *d_lens = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&d_bt, bt.size() * 4));
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(d_bt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&d_lens, max_batch * 4));
    float *o = nullptr, *lse = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&o, static_cast<std::size_t>(max_batch) * 64 * kHeadDim * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&lse, static_cast<std::size_t>(max_batch) * 64 * 4));
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(bench.stream));

    std::printf("# %s, %d SMs; device-to-device copy %.0f GB/s (read + written)\n", prop.name,
                bench.num_sms, copy_gbps);
    if (floors) {
      const double t_empty = bench.time_us(51, [&] {
        empty_kernel<<<1, 32, 0, bench.stream>>>();
        ATTNSTATE_CHECK_LAUNCH(bench.stream, "empty_kernel");
      });
      std::printf("# floor: empty kernel %.2f us (%s)\n", t_empty,
                  bench.flush_l2 ? "after an L2 flush" : "no flush");
      // Read bandwidth of the decode's access pattern over the largest point's cache.
      for (bool h : {false, true}) {
        const std::int64_t pool_tokens = num_pages * kPage;
        const int tokens = static_cast<int>(std::min<std::int64_t>(pool_tokens, 32768));
        const int streams =
            static_cast<int>(std::min<std::int64_t>(64, pool_tokens / tokens)) * kHeadsKv;
        const double t = bench.time_us(11, [&] {
          read_rows<<<streams, 128, 0, bench.stream>>>(reinterpret_cast<const int4*>(k),
                                                       reinterpret_cast<const int4*>(v), tokens,
                                                       kHeadsKv, h, bench.sink);
          ATTNSTATE_CHECK_LAUNCH(bench.stream, "read_rows");
        });
        const double bytes = 2.0 * streams * tokens * kHeadDim * 2;
        std::printf("# floor: read %s rows, %d streams x %d tokens: %.1f us, %.0f GB/s\n",
                    h ? "HND" : "NHD", streams, tokens, t, bytes / (t * 1e-6) / 1e9);
      }
    }
    std::printf(
        "# decode bf16, head_dim %d, H_kv %d, pages of %d tokens %s (block table)%s; "
        "times are medians%s\n",
        kHeadDim, kHeadsKv, kPage, hnd ? "HND" : "NHD",
        programmatic ? ", programmatic launches" : "",
        bench.flush_l2 ? " with L2 flushed" : ", L2 warm");
    std::printf("%6s %6s %6s %8s %6s %9s %7s %6s %6s %9s %7s %7s %9s %7s\n", "Hq/Hkv", "batch",
                "ctx", "KV_MiB", "splits", "time_us", "GB/s", "%copy", "comb%", "s1_us", "s1_GB/s",
                "auto/s1", "anchor", "vs_best");
    FILE* csv = nullptr;
    if (!csv_path.empty()) {
      csv = std::fopen(csv_path.c_str(), "w");
      if (csv)
        std::fprintf(csv,
                     "heads_q,heads_kv,batch,ctx,kv_mib,splits,time_us,gbps,frac_copy,"
                     "combine_share,s1_time_us,s1_gbps,copy_gbps,anchor_gbps,anchor\n");
    }
    for (const Point& pt : points) {
      const int hq = pt.hq, batch = pt.batch, ctx = pt.ctx;
      std::vector<std::int32_t> lens(batch, ctx);
      ATTNSTATE_CUDA_CHECK(cudaMemcpy(d_lens, lens.data(), batch * 4, cudaMemcpyHostToDevice));
      const DecodeRow row = bf16_decode_row(batch, hq, kHeadsKv, kHeadDim, k, v,
                                            hnd ? KvLayout::kHND : KvLayout::kNHD, num_pages, kPage,
                                            d_bt, (ctx + kPage - 1) / kPage, d_lens);
      const DecodeProblem& pr = row.problem;
      const PagedKvCache& kv = row.kv;
      const ConstTensorView qv =
          make_tensor_view(q, DType::kBF16, {batch, 1, hq, kHeadDim}, MemorySpace::kDevice);
      const StateView out = make_state_view(o, DType::kBF16, lse, batch, hq, kHeadDim,
                                            LseBase::kNatural, MemorySpace::kDevice);
      DecodeOptions opt;
      opt.programmatic_launch = programmatic;
      if (force_splits > 0) {
        opt.policy = SplitPolicy::kFixedCount;
        opt.num_splits = force_splits;
      }
      const std::int64_t kv_bytes = std::int64_t{batch} * ctx * kHeadsKv * kHeadDim * 2 * 2;
      const int reps = reps_arg > 0 ? reps_arg
                       : quick      ? 15
                                    : (kv_bytes > (std::int64_t{1} << 31) ? 20 : 60);
      cuda::DecodePlan plan = cuda::plan_decode(pr, lens.data(), opt, bench.num_sms);
      if (stream_mode >= 0 && plan.splits().max_splits == 1) {
        DecodeOptions so = opt;  // the same single split, on the kernel asked for
        so.kernel = stream_mode == 1 ? DecodeKernel::kStreamed : DecodeKernel::kSplit;
        if (plan.splits().policy == SplitPolicy::kFixedSize) {
          so.policy = SplitPolicy::kFixedSize;
          so.split_size = plan.splits().split_size;
        }
        plan = cuda::plan_decode(pr, lens.data(), so, bench.num_sms);
      }
      if (explore) {
        // Split counts at this point (time in µs).
        std::printf("explore %d/%d b%d %s (auto %d):", hq, kHeadsKv, batch, ctx_str(ctx).c_str(),
                    plan.splits().splits_for(ctx));
        for (int ns : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 33, 40, 48, 49, 64, 66, 132}) {
          if (ns > 1 && std::int64_t{ctx} / ns < 32) continue;
          // Fixed split size (the policy the automatic plan resolves to): ns splits of equal
          // length, rounded up to the tile.
          DecodeOptions eo;
          eo.policy = SplitPolicy::kFixedSize;
          eo.split_size = (ctx + ns - 1) / ns;
          eo.split_size =
              (eo.split_size + kSplitGranularity - 1) / kSplitGranularity * kSplitGranularity;
          if (ns > 1 && (ctx + eo.split_size - 1) / eo.split_size != ns) continue;
          cuda::DecodePlan ep = cuda::plan_decode(pr, lens.data(), eo, bench.num_sms);
          void* ews = nullptr;
          const std::size_t eb = std::max<std::size_t>(256, ep.workspace_bytes());
          ATTNSTATE_CUDA_CHECK(cudaMalloc(&ews, eb));
          cuda::init_decode_workspace(ep, ews, eb, bench.stream);
          const double et = bench.time_us(
              reps, [&] { cuda::run_decode(ep, qv, kv, out, ews, eb, bench.stream); });
          std::printf(" s%d=%.1f", ns, et);
          if (ns == 1) {
            eo.kernel = DecodeKernel::kStreamed;
            const cuda::DecodePlan sp = cuda::plan_decode(pr, lens.data(), eo, bench.num_sms);
            const double st = bench.time_us(
                reps, [&] { cuda::run_decode(sp, qv, kv, out, ews, eb, bench.stream); });
            std::printf(" s1st=%.1f", st);
          }
          ATTNSTATE_CUDA_CHECK(cudaFree(ews));
        }
        std::printf("\n");
        std::fflush(stdout);
        continue;
      }
      if (timeline) {
#if ATTNSTATE_PROBES
        // Single calls after a flush: per-CTA stamps (start, partial state done, merge
        // decision, merge end) relative to the first CTA's start, in µs.
        void* tws = nullptr;
        const std::size_t tb = std::max<std::size_t>(256, plan.workspace_bytes());
        ATTNSTATE_CUDA_CHECK(cudaMalloc(&tws, tb));
        cuda::init_decode_workspace(plan, tws, tb, bench.stream);
        const int ctas = static_cast<int>(std::min<std::int64_t>(
            16384, std::int64_t{batch} * kHeadsKv * plan.row_tiles() * plan.splits().max_splits));
        const int S = plan.splits().max_splits;
        std::vector<unsigned long long> tl(static_cast<std::size_t>(ctas) * 8);
        attnstate_decode_timeline(tl.data(), ctas);  // clears
        for (int rep = 0; rep < 3; ++rep) {
          if (bench.flush_l2) bench.flush();
          cuda::run_decode(plan, qv, kv, out, tws, tb, bench.stream);
          attnstate_decode_timeline(tl.data(), ctas);
          unsigned long long t0 = ~0ull;
          for (int c = 0; c < ctas; ++c)
            if (tl[8 * c] != 0) t0 = std::min(t0, tl[8 * c]);
          auto rel = [&](unsigned long long t) { return t ? (t - t0) / 1000.0 : -1.0; };
          double start_max = 0, p_min = 1e30, p_max = 0, dec_max = 0, end_max = 0;
          double tile_lat_sum = 0, tile_lat_max = 0, tile_tk_max = 0;
          int tiles = 0, mergers = 0, lives = 0;
          double life_sum = 0, len_sum = 0, first_sum = 0, loop_sum = 0;
          int len_n = 0, first_n = 0, loop_n = 0;
          for (int c0 = 0; c0 < ctas; c0 += S) {
            double pm = 0, dm = 0, em = 0;
            for (int c = c0; c < std::min(ctas, c0 + S); ++c) {
              if (tl[8 * c] == 0) continue;
              start_max = std::max(start_max, rel(tl[8 * c]));
              if (tl[8 * c + 4]) {
                len_sum += (tl[8 * c + 4] - tl[8 * c]) / 1000.0;
                ++len_n;
              }
              if (tl[8 * c + 5]) {
                first_sum += (tl[8 * c + 5] - tl[8 * c]) / 1000.0;
                ++first_n;
              }
              if (tl[8 * c + 6]) {
                loop_sum += (tl[8 * c + 6] - tl[8 * c]) / 1000.0;
                ++loop_n;
              }
              if (tl[8 * c + 1]) {
                life_sum += (tl[8 * c + 1] - tl[8 * c]) / 1000.0;
                ++lives;
                p_min = std::min(p_min, rel(tl[8 * c + 1]));
                pm = std::max(pm, rel(tl[8 * c + 1]));
              }
              if (tl[8 * c + 2]) dm = std::max(dm, rel(tl[8 * c + 2]));
              if (tl[8 * c + 3]) {
                em = std::max(em, rel(tl[8 * c + 3]));
                ++mergers;
              }
            }
            p_max = std::max(p_max, pm);
            dec_max = std::max(dec_max, dm);
            end_max = std::max(end_max, em);
            if (em > 0) {
              ++tiles;
              tile_lat_sum += em - pm;
              tile_lat_max = std::max(tile_lat_max, em - pm);
              tile_tk_max = std::max(tile_tk_max, dm - pm);
            }
          }
          std::printf(
              "timeline %d/%d b%d %s S=%d ctas=%d: start<=%.2f partial %.2f..%.2f "
              "decision<=%.2f end<=%.2f | per tile last partial->merged mean %.2f max %.2f "
              "(->decision max %.2f) mergers %d; CTA start-> len %.2f first tile %.2f "
              "loop %.2f partial %.2f (means)\n",
              hq, kHeadsKv, batch, ctx_str(ctx).c_str(), S, ctas, start_max,
              p_min > 1e29 ? -1.0 : p_min, p_max, dec_max, end_max,
              tiles ? tile_lat_sum / tiles : 0.0, tile_lat_max, tile_tk_max, mergers,
              len_n ? len_sum / len_n : 0.0, first_n ? first_sum / first_n : 0.0,
              loop_n ? loop_sum / loop_n : 0.0, lives ? life_sum / lives : 0.0);
        }
        ATTNSTATE_CUDA_CHECK(cudaFree(tws));
#else
        std::printf("timeline: build with -DATTNSTATE_BUILD_PROBES=ON\n");
#endif
      }
      if (host_time) {
        // Host time of one call (enqueue only), averaged over 200 calls behind a spin kernel.
        void* hws = nullptr;
        const std::size_t hb = std::max<std::size_t>(256, plan.workspace_bytes());
        ATTNSTATE_CUDA_CHECK(cudaMalloc(&hws, hb));
        cuda::init_decode_workspace(plan, hws, hb, bench.stream);
        for (int i = 0; i < 10; ++i) cuda::run_decode(plan, qv, kv, out, hws, hb, bench.stream);
        ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(bench.stream));
        spin_kernel<<<1, 32, 0, bench.stream>>>(2000000);
        ATTNSTATE_CHECK_LAUNCH(bench.stream, "spin_kernel");
        ATTNSTATE_CUDA_CHECK(cudaEventRecord(bench.e0, bench.stream));
        const auto h0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 200; ++i) cuda::run_decode(plan, qv, kv, out, hws, hb, bench.stream);
        const auto h1 = std::chrono::steady_clock::now();
        ATTNSTATE_CUDA_CHECK(cudaEventRecord(bench.e1, bench.stream));
        ATTNSTATE_CUDA_CHECK(cudaEventSynchronize(bench.e1));
        float ms = 0;
        ATTNSTATE_CUDA_CHECK(cudaEventElapsedTime(&ms, bench.e0, bench.e1));
        std::printf(
            "host %d/%d b%d %s: %.2f us per run_decode call (enqueue); GPU back-to-back "
            "%.2f us per call (L2 warm)\n",
            hq, kHeadsKv, batch, ctx_str(ctx).c_str(),
            std::chrono::duration<double, std::micro>(h1 - h0).count() / 200, 1000.0 * ms / 200);
        ATTNSTATE_CUDA_CHECK(cudaFree(hws));
      }
      if (const int n = layer_count(layers, kv_bytes); n > 0) {
        // The layer loop: n calls in one graph, call l on layer l's pages of the pool (its own
        // K and V), replayed after a flush; the median replay time / n.
        const std::int64_t pages = std::int64_t{batch} * kv.block_table_stride;
        void* lws = nullptr;
        const std::size_t lb = std::max<std::size_t>(256, plan.workspace_bytes());
        ATTNSTATE_CUDA_CHECK(cudaMalloc(&lws, lb));
        cuda::init_decode_workspace(plan, lws, lb, bench.stream);
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(bench.stream, cudaStreamCaptureModeGlobal));
        for (int l = 0; l < n; ++l) {
          PagedKvCache kl = kv;
          kl.k = k + l * pages * page_elems;
          kl.v = v + l * pages * page_elems;
          kl.num_pages = pages;
          cuda::run_decode(plan, qv, kl, out, lws, lb, bench.stream);
        }
        ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(bench.stream, &graph));
        ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        const double tg =
            bench.time_us(reps, [&] { ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, bench.stream)); });
        ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
        ATTNSTATE_CUDA_CHECK(cudaGraphDestroy(graph));
        ATTNSTATE_CUDA_CHECK(cudaFree(lws));
        std::printf(
            "layers %d/%d b%d %s: %d calls in one graph, each on its own %.0f MiB cache: "
            "%.2f us per call (%.0f GB/s)\n",
            hq, kHeadsKv, batch, ctx_str(ctx).c_str(), n, kv_bytes / 1048576.0, tg / n,
            kv_bytes / (tg / n * 1e-6) / 1e9);
      }
      DecodeOptions one;
      one.policy = SplitPolicy::kFixedCount;
      one.num_splits = 1;
      one.programmatic_launch = programmatic;
      const cuda::DecodePlan plan1 = cuda::plan_decode(pr, lens.data(), one, bench.num_sms);
      void* ws = nullptr;
      const std::size_t ws_bytes = std::max<std::size_t>(256, plan.workspace_bytes());
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
      cuda::init_decode_workspace(plan, ws, ws_bytes, bench.stream);
      const double t = bench.time_us(
          reps, [&] { cuda::run_decode(plan, qv, kv, out, ws, ws_bytes, bench.stream); });
      double comb = 0;  // the merge's share: only a probe build can leave the merge out
#if ATTNSTATE_PROBES
      if (plan.splits().max_splits > 1) {
        const double ts = bench.time_us(reps, [&] {
          cuda::probe::run_decode_skip_combine(plan, qv, kv, out, ws, ws_bytes, bench.stream);
        });
        comb = std::max(0.0, (t - ts) / t);
      }
#else
      comb = std::nan("");
#endif
      const double t1 = no_s1 ? 0.0 : bench.time_us(reps, [&] {
        cuda::run_decode(plan1, qv, kv, out, ws, ws_bytes, bench.stream);
      });
      ATTNSTATE_CUDA_CHECK(cudaFree(ws));
      const double gbps = kv_bytes / (t * 1e-6) / 1e9;
      const double gbps1 = no_s1 ? 0.0 : kv_bytes / (t1 * 1e-6) / 1e9;
      const Anchor* a = find_anchor(hq, batch, ctx);
      char splits_s[32];
      if (plan.splits().policy == SplitPolicy::kFixedSize)
        std::snprintf(splits_s, sizeof splits_s, "%d", plan.splits().splits_for(ctx));
      else
        std::snprintf(splits_s, sizeof splits_s, "%d", plan.splits().num_splits);
      if (plan.kernel() == DecodeKernel::kStreamed)
        std::snprintf(splits_s, sizeof splits_s, "1st");  // streamed kernel
      std::printf(
          "%3d/%-2d %6d %6s %8.0f %6s %9.1f %7.0f %5.0f%% %5.1f%% %9.1f %7.0f %6.2fx "
          "%5.0f %-5s %6.2fx\n",
          hq, kHeadsKv, batch, ctx_str(ctx).c_str(), kv_bytes / 1048576.0, splits_s, t, gbps,
          100.0 * gbps / copy_gbps, 100.0 * comb, t1, gbps1, no_s1 ? 0.0 : t1 / t,
          a ? a->gbps : 0.0, a ? a->who : "-", a ? gbps / a->gbps : 0.0);
      std::fflush(stdout);
      if (csv)
        std::fprintf(csv, "%d,%d,%d,%d,%.1f,%s,%.2f,%.1f,%.4f,%.4f,%.2f,%.1f,%.1f,%.0f,%s\n", hq,
                     kHeadsKv, batch, ctx, kv_bytes / 1048576.0, splits_s, t, gbps,
                     gbps / copy_gbps, comb, t1, gbps1, copy_gbps, a ? a->gbps : 0.0,
                     a ? a->who : "-");
    }
    if (csv) std::fclose(csv);
    cudaFree(k);
    cudaFree(v);
    cudaFree(q);
    cudaFree(d_bt);
    cudaFree(d_lens);
    cudaFree(o);
    cudaFree(lse);
    cudaFree(bench.flush_buf);
    cudaFree(bench.sink);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode: %s\n", e.what());
    return 1;
  }
}
