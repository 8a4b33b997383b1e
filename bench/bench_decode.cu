/// @file bench_decode.cu
/// @brief Split-KV decode benchmark: the sweep of the project's anchors (H_q/H_kv 32/8 and 64/8,
///        batch {1, 4, 16, 64}, context {1k, 8k, 32k, 128k}, pages of 16 tokens NHD, bf16,
///        head_dim 128). Prints the median time (L2 flushed before every timed call), the GB/s of
///        KV read, its fraction of a device-to-device copy measured in the same run, the splits
///        chosen, the combine's share, the best anchor, and the automatic plan against
///        num_splits = 1. `--csv <path>` writes a CSV; `--quick` runs a few points.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"

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

const Anchor* find_anchor(int hq, int batch, int ctx_k) {
  for (const Anchor& a : kAnchors)
    if (a.hq == hq && a.batch == batch && a.ctx_k == ctx_k) return &a;
  return nullptr;
}

__global__ void fill_bf16(std::uint16_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed ^
                      static_cast<std::uint32_t>(i >> 32) * 40503u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    const float f = (static_cast<float>(x & 0xFFFFu) / 32768.f) - 1.f;
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
}

__global__ void flush_read(const int4* p, std::size_t n, int* sink) {
  int acc = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7F3A5C1D) *sink = acc;
}

struct Bench {
  int num_sms = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  int4* flush_buf = nullptr;
  std::size_t flush_n = 0;
  int* sink = nullptr;

  void flush() {
    flush_read<<<num_sms * 4, 512, 0, stream>>>(flush_buf, flush_n, sink);
    ATTNSTATE_CHECK_LAUNCH(stream, "flush_read");
  }
  /// Median of `reps` event-timed calls of `f`, each after an L2 flush (µs).
  template <class F>
  double time_us(int reps, F&& f) {
    for (int i = 0; i < 3; ++i) f();
    std::vector<float> ts;
    for (int i = 0; i < reps; ++i) {
      flush();
      ATTNSTATE_CUDA_CHECK(cudaEventRecord(e0, stream));
      f();
      ATTNSTATE_CUDA_CHECK(cudaEventRecord(e1, stream));
      ATTNSTATE_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      ATTNSTATE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    return 1000.0 * ts[ts.size() / 2];
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  bool quick = false;
  int force_splits = 0;
  bool explore = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc)
      csv_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--splits") && i + 1 < argc)
      force_splits = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--explore"))
      explore = true;
  }
  try {
    Bench bench;
    int dev = 0;
    ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
    ATTNSTATE_CUDA_CHECK(
        cudaDeviceGetAttribute(&bench.num_sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    ATTNSTATE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    ATTNSTATE_CUDA_CHECK(cudaStreamCreate(&bench.stream));
    ATTNSTATE_CUDA_CHECK(cudaEventCreate(&bench.e0));
    ATTNSTATE_CUDA_CHECK(cudaEventCreate(&bench.e1));
    bench.flush_n = (std::size_t{256} << 20) / sizeof(int4);
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&bench.flush_buf, bench.flush_n * sizeof(int4)));
    ATTNSTATE_CUDA_CHECK(cudaMemset(bench.flush_buf, 1, bench.flush_n * sizeof(int4)));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&bench.sink, sizeof(int)));

    std::vector<int> batches = {1, 4, 16, 64};
    std::vector<int> ctxs_k = {1, 8, 32, 128};
    std::vector<int> hqs = {32, 64};
    if (quick) {
      batches = {1, 16, 64};
      ctxs_k = {1, 32, 128};
    }
    const int max_batch = *std::max_element(batches.begin(), batches.end());
    const int max_ctx = 1024 * *std::max_element(ctxs_k.begin(), ctxs_k.end());

    // Device-to-device copy bandwidth (bytes read + written), measured here.
    double copy_gbps = 0;
    {
      const std::size_t bytes = std::size_t{1} << 30;
      void *a = nullptr, *b = nullptr;
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&a, bytes));
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&b, bytes));
      ATTNSTATE_CUDA_CHECK(cudaMemset(a, 1, bytes));
      const double us = bench.time_us(10, [&] {
        ATTNSTATE_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, bench.stream));
      });
      copy_gbps = 2.0 * bytes / (us * 1e-6) / 1e9;
      ATTNSTATE_CUDA_CHECK(cudaFree(a));
      ATTNSTATE_CUDA_CHECK(cudaFree(b));
    }

    // One pool pair for the largest point, reused by every point.
    const std::int64_t pages_per_req = max_ctx / kPage;
    const std::int64_t num_pages = max_batch * pages_per_req;
    const std::int64_t page_elems = std::int64_t{kPage} * kHeadsKv * kHeadDim;
    const std::size_t pool_elems = static_cast<std::size_t>(num_pages * page_elems);
    std::uint16_t *k = nullptr, *v = nullptr, *q = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&k, pool_elems * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&v, pool_elems * 2));
    fill_bf16<<<bench.num_sms * 8, 512, 0, bench.stream>>>(k, pool_elems, 1u);
    ATTNSTATE_CHECK_LAUNCH(bench.stream, "fill_bf16");
    fill_bf16<<<bench.num_sms * 8, 512, 0, bench.stream>>>(v, pool_elems, 2u);
    ATTNSTATE_CHECK_LAUNCH(bench.stream, "fill_bf16");
    const std::size_t q_elems = static_cast<std::size_t>(max_batch) * 64 * kHeadDim;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&q, q_elems * 2));
    fill_bf16<<<64, 256, 0, bench.stream>>>(q, q_elems, 3u);
    ATTNSTATE_CHECK_LAUNCH(bench.stream, "fill_bf16");
    // Block table: request b owns pages [b·P, (b+1)·P) of the pool.
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
    std::printf(
        "# decode bf16, head_dim %d, H_kv %d, pages of %d tokens NHD (block table); "
        "times are medians with L2 flushed\n",
        kHeadDim, kHeadsKv, kPage);
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
    for (int hq : hqs) {
      for (int batch : batches) {
        for (int ctx_k : ctxs_k) {
          const int ctx = ctx_k * 1024;
          std::vector<std::int32_t> lens(batch, ctx);
          ATTNSTATE_CUDA_CHECK(cudaMemcpy(d_lens, lens.data(), batch * 4, cudaMemcpyHostToDevice));
          DecodeProblem pr;
          pr.batch = batch;
          pr.q_len = 1;
          pr.heads_q = hq;
          pr.heads_kv = kHeadsKv;
          pr.head_dim = kHeadDim;
          pr.q_dtype = pr.kv_dtype = DType::kBF16;
          PagedKvCache kv;
          kv.k = k;
          kv.v = v;
          kv.dtype = DType::kBF16;
          kv.layout = KvLayout::kNHD;
          kv.num_pages = num_pages;
          kv.page_size = kPage;
          kv.heads_kv = kHeadsKv;
          kv.head_dim = kHeadDim;
          kv.block_table = d_bt;
          kv.block_table_stride = pages_per_req;
          kv.seq_lens = d_lens;
          kv.batch = batch;
          kv.space = MemorySpace::kDevice;
          const ConstTensorView qv =
              make_tensor_view(q, DType::kBF16, {batch, 1, hq, kHeadDim}, MemorySpace::kDevice);
          const StateView out = make_state_view(o, DType::kBF16, lse, batch, hq, kHeadDim,
                                                LseBase::kNatural, MemorySpace::kDevice);
          DecodeOptions opt;
          if (force_splits > 0) {
            opt.policy = SplitPolicy::kFixedCount;
            opt.num_splits = force_splits;
          }
          cuda::DecodePlan plan = cuda::plan_decode(pr, lens.data(), opt, bench.num_sms);
          if (explore) {
            // Split counts at this point (time in µs).
            std::printf("explore %d/%d b%d %dk:", hq, kHeadsKv, batch, ctx_k);
            for (int ns : {1, 2, 4, 8, 16, 24, 32, 33, 64, 66, 132}) {
              if (ns > 1 && std::int64_t{ctx} / ns < 64) continue;
              DecodeOptions eo;
              eo.policy = SplitPolicy::kFixedCount;
              eo.num_splits = ns;
              cuda::DecodePlan ep = cuda::plan_decode(pr, lens.data(), eo, bench.num_sms);
              void* ews = nullptr;
              const std::size_t eb = std::max<std::size_t>(256, ep.workspace_bytes());
              ATTNSTATE_CUDA_CHECK(cudaMalloc(&ews, eb));
              cuda::init_decode_workspace(ep, ews, eb, bench.stream);
              const double et = bench.time_us(quick ? 7 : 15, [&] {
                cuda::run_decode(ep, qv, kv, out, ews, eb, bench.stream);
              });
              ATTNSTATE_CUDA_CHECK(cudaFree(ews));
              std::printf(" s%d=%.1f", ns, et);
            }
            std::printf("\n");
            std::fflush(stdout);
            continue;
          }
          DecodeOptions one;
          one.policy = SplitPolicy::kFixedCount;
          one.num_splits = 1;
          const cuda::DecodePlan plan1 = cuda::plan_decode(pr, lens.data(), one, bench.num_sms);
          void* ws = nullptr;
          const std::size_t ws_bytes = std::max<std::size_t>(256, plan.workspace_bytes());
          ATTNSTATE_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
          cuda::init_decode_workspace(plan, ws, ws_bytes, bench.stream);
          const std::int64_t kv_bytes = std::int64_t{batch} * ctx * kHeadsKv * kHeadDim * 2 * 2;
          const int reps = quick ? 15 : (kv_bytes > (std::int64_t{1} << 31) ? 20 : 60);
          const double t = bench.time_us(
              reps, [&] { cuda::run_decode(plan, qv, kv, out, ws, ws_bytes, bench.stream); });
          double comb = 0;
          if (plan.splits.max_splits > 1) {
            cuda::DecodePlan skip = plan;
            skip.profile_skip_combine = true;
            const double ts = bench.time_us(
                reps, [&] { cuda::run_decode(skip, qv, kv, out, ws, ws_bytes, bench.stream); });
            comb = std::max(0.0, (t - ts) / t);
          }
          const double t1 = bench.time_us(
              reps, [&] { cuda::run_decode(plan1, qv, kv, out, ws, ws_bytes, bench.stream); });
          ATTNSTATE_CUDA_CHECK(cudaFree(ws));
          const double gbps = kv_bytes / (t * 1e-6) / 1e9;
          const double gbps1 = kv_bytes / (t1 * 1e-6) / 1e9;
          const Anchor* a = find_anchor(hq, batch, ctx_k);
          char splits_s[32];
          if (plan.splits.policy == SplitPolicy::kFixedSize)
            std::snprintf(splits_s, sizeof splits_s, "%d", plan.splits.splits_for(ctx));
          else
            std::snprintf(splits_s, sizeof splits_s, "%d", plan.splits.num_splits);
          std::printf(
              "%3d/%-2d %6d %5dk %8.0f %6s %9.1f %7.0f %5.0f%% %5.1f%% %9.1f %7.0f %6.2fx "
              "%5.0f %-5s %6.2fx\n",
              hq, kHeadsKv, batch, ctx_k, kv_bytes / 1048576.0, splits_s, t, gbps,
              100.0 * gbps / copy_gbps, 100.0 * comb, t1, gbps1, t1 / t, a ? a->gbps : 0.0,
              a ? a->who : "-", a ? gbps / a->gbps : 0.0);
          std::fflush(stdout);
          if (csv)
            std::fprintf(csv, "%d,%d,%d,%d,%.1f,%s,%.2f,%.1f,%.4f,%.4f,%.2f,%.1f,%.1f,%.0f,%s\n",
                         hq, kHeadsKv, batch, ctx, kv_bytes / 1048576.0, splits_s, t, gbps,
                         gbps / copy_gbps, comb, t1, gbps1, copy_gbps, a ? a->gbps : 0.0,
                         a ? a->who : "-");
        }
      }
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
