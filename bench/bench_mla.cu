/// @file bench_mla.cu
/// @brief MLA decode benchmark (`cuda::run_mla_decode`, absorbed form: 512 latent + 64 rotary
///        columns, one latent head per token): batch × context × heads × q_len × latent dtype,
///        pages of 64 tokens (`--page`), the planner's automatic splits. Each row: the median
///        time of many calls, each after an L2 flush; the GB/s of the bytes moved (latent cache
///        `576 · dtype bytes` per token, plus q and the output state) against a device-to-device
///        copy measured in the same run; the TFLOP/s of the useful work (`2 · (576 + 512)` FLOP
///        per (query row, visible key)) against a dense bf16 tensor peak measured in the same
///        run; the ratio of the time to the floor `max(bytes / copy, FLOP / peak)`; and a check
///        of request 0's rows against `cpu::mla_decode` (the output NaN-poisoned first).
///
/// The tensor peak: a 8192³ bf16 GEMM with fp32 accumulation through cuBLASLt (its heuristic's
/// best algorithm) when the build links it (`ATTNSTATE_BENCH_CUBLASLT`), else the throughput of
/// an `mma.sync` m16n8k16 bf16 loop kernel (registers only; below the wgmma peak on Hopper). The
/// `mma.sync` loop is printed beside the GEMM in either case (the MLA kernel's own instruction).
///
/// Inputs: counter-hash uniforms; queries in [-3, 3) (scores of standard deviation ~1 at the
/// default scale 1/24), the latent cache in [-1, 1) (fp8: stored ×16 in e4m3, per-tensor scale
/// 1/16, exact in both backends). Request b owns pages [b·P, (b+1)·P) through a block table, all
/// requests `ctx` tokens long; q_len > 1 rows are causal (row i sees `ctx − q_len + 1 + i` keys).
///
/// Run with `--help` for the options. Exit status 1 when a row's check fails.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnstate/cpu/mla.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/mla.hpp"
#include "bench_util.cuh"
#include "mla_inputs.cuh"
#if ATTNSTATE_BENCH_CUBLASLT
#include <cublasLt.h>
#endif

namespace {

using namespace attnstate;

using namespace mla_inputs;

/// The most query rows a request of `MlaDecodeKernel::kWgmmaNarrow` (or `kWgmmaNarrow2`) may have
/// (`heads · q_len`).
constexpr int kNarrowRows = 32;

const char* kUsage =
    "usage: bench_mla [options]\n"
    "  --splits N         force N splits per request (default: the planner's choice)\n"
    "  --kernel K         auto (the planner's choice: wgmma on sm_90a), mma, wgmma, narrow\n"
    "                     (the narrow wgmma kernel: rows of at most 32 query rows, others\n"
    "                     skipped), narrow2 (the narrow kernel's two-CTA configuration, the\n"
    "                     same rows), balanced (the wgmma kernel with both consumer warpgroups\n"
    "                     computing scores), both (each row twice, mma.sync then wgmma: an A/B\n"
    "                     in one run), balanced-ab (each row twice, wgmma then balanced) or all\n"
    "                     (mma.sync, wgmma, balanced, then narrow and narrow2 where the rows\n"
    "                     fit them)\n"
    "  --no-check         skip the CPU check of request 0\n"
    "  --help             this text (no CUDA call)\n"
    "Rows: heads, q_len, dtype, batch, ctx, page, splits, median us (L2 flushed), GB/s and its\n"
    "fraction of the device copy, TFLOP/s and its fraction of the measured bf16 tensor peak,\n"
    "the floor max(bytes/copy, FLOP/peak) in us, time / floor, the check of request 0, and\n"
    "the kernel that ran (mma: cp.async + mma.sync; wgmma: warp-specialised wgmma; balanced: the\n"
    "same, its two consumer warpgroups each computing half of every tile's scores; narrow: the\n"
    "transposed wgmma kernel of at most 32 rows, one CTA per SM; narrow2: the same, two CTAs\n"
    "per SM).\n"
    "Shapes:\n";

void fill(void* p, std::size_t n, DType dt, std::uint32_t seed, float amp, int sms,
          cudaStream_t s) {
  ATTNSTATE_CUDA_CHECK(mla_inputs::fill_async(p, n, dt == DType::kE4M3, seed, amp, sms, s));
}

/// `iters` rounds of 8 independent mma.sync m16n8k16 bf16 → fp32 per warp, registers only; the
/// accumulators reach `sink` only on an impossible value, so no round can be dropped.
__global__ void __launch_bounds__(256) mma_loop(int iters, float* sink) {
  const std::uint32_t t = threadIdx.x;
  std::uint32_t a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = 0x3F803F80u ^ (t * 0x00010001u * (i + 1) & 0x003F003Fu);
  for (int i = 0; i < 2; ++i) b[i] = 0x3C003C00u ^ (t * 0x00020002u * (i + 3) & 0x001F001Fu);
  float c[8][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  float s = 0;
  for (int j = 0; j < 8; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 1234.5f) *sink = s;
}

/// TFLOP/s of the mma.sync loop over every SM (median of 11 timed launches).
double mma_sync_tflops(bench_util::FlushTimer& t) {
  float* sink = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&sink, sizeof(float)));
  const int blocks = t.num_sms * 4, iters = 4096;
  const double us = t.time_us(
      11, [](int) {},
      [&] {
        mma_loop<<<blocks, 256, 0, t.stream>>>(iters, sink);
        ATTNSTATE_CHECK_LAUNCH(t.stream, "mma_loop");
      });
  ATTNSTATE_CUDA_CHECK(cudaFree(sink));
  const double flop = 2.0 * 16 * 8 * 16 * 8.0 * iters * (blocks * 256.0 / 32);
  return flop / (us * 1e-6) / 1e12;
}

#if ATTNSTATE_BENCH_CUBLASLT
#define BENCH_LT(call)                                                                    \
  do {                                                                                    \
    const cublasStatus_t st_ = (call);                                                    \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      std::fprintf(stderr, "bench_mla: %s failed (cublas status %d)\n", #call, (int)st_); \
      return 0.0;                                                                         \
    }                                                                                     \
  } while (0)

/// TFLOP/s of a 8192³ bf16 GEMM (fp32 accumulation, bf16 out; A transposed) through cuBLASLt's
/// best heuristic algorithm, median of 21 timed calls; 0 when cuBLASLt fails.
double cublaslt_tflops(bench_util::FlushTimer& t) {
  const int n = 8192;
  const std::size_t elems = std::size_t{n} * n, ws_bytes = std::size_t{64} << 20;
  void *a = nullptr, *b = nullptr, *c = nullptr, *ws = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&a, elems * 2));
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&b, elems * 2));
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&c, elems * 2));
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  fill(a, elems, DType::kBF16, 11u, 1.f, t.num_sms, t.stream);
  fill(b, elems, DType::kBF16, 12u, 1.f, t.num_sms, t.stream);
  double tflops = 0.0;
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto run = [&]() -> double {
    BENCH_LT(cublasLtCreate(&lt));
    BENCH_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    BENCH_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    BENCH_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    BENCH_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, n, n));
    BENCH_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, n, n));
    BENCH_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n));
    BENCH_LT(cublasLtMatmulPreferenceCreate(&pref));
    BENCH_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    BENCH_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &found));
    if (found < 1) {
      std::fprintf(stderr, "bench_mla: cuBLASLt found no bf16 GEMM algorithm\n");
      return 0.0;
    }
    const float alpha = 1.f, beta = 0.f;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    const double us = t.time_us(
        21, [](int) {},
        [&] {
          const cublasStatus_t s = cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, c, lc, c,
                                                  lc, &heur.algo, ws, ws_bytes, t.stream);
          if (s != CUBLAS_STATUS_SUCCESS) st = s;
        });
    BENCH_LT(st);
    return 2.0 * n * static_cast<double>(n) * n / (us * 1e-6) / 1e12;
  };
  tflops = run();
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (desc) cublasLtMatmulDescDestroy(desc);
  if (lt) cublasLtDestroy(lt);
  ATTNSTATE_CUDA_CHECK(cudaFree(a));
  ATTNSTATE_CUDA_CHECK(cudaFree(b));
  ATTNSTATE_CUDA_CHECK(cudaFree(c));
  ATTNSTATE_CUDA_CHECK(cudaFree(ws));
  return tflops;
}
#endif

DType dtype_of(const Shape& s) { return s.fp8 ? DType::kE4M3 : DType::kBF16; }
const char* dtype_str(const Shape& s) { return s.fp8 ? "e4m3" : "bf16"; }

/// Request 0 of the point on the CPU (`cpu::mla_decode`, f32 state, natural base) against the
/// device output `o` (bf16) and `lse` (natural), both read back for its `q_len · heads` rows.
/// Compared by `compare_rows` (mla_inputs.cuh).
CheckStats check_request0(const Shape& pt, int page, float scale, const void* q_nope,
                          const void* q_pe, const void* ckv, const void* kpe,
                          const std::uint16_t* o, const float* lse) {
  const std::size_t esz = size_of(dtype_of(pt));
  const std::int64_t pages = (pt.ctx + page - 1) / page;
  const std::size_t tokens = static_cast<std::size_t>(pages) * page;
  const std::size_t rows = static_cast<std::size_t>(pt.q_len) * pt.heads;
  std::vector<std::uint8_t> h_ckv(tokens * kRank * esz), h_kpe(tokens * kRope * esz);
  std::vector<std::uint16_t> h_qn(rows * kRank), h_qp(rows * kRope), h_o(rows * kRank);
  std::vector<float> h_lse(rows);
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(h_ckv.data(), ckv, h_ckv.size(), cudaMemcpyDeviceToHost));
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(h_kpe.data(), kpe, h_kpe.size(), cudaMemcpyDeviceToHost));
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(h_qn.data(), q_nope, h_qn.size() * 2, cudaMemcpyDeviceToHost));
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(h_qp.data(), q_pe, h_qp.size() * 2, cudaMemcpyDeviceToHost));
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(h_o.data(), o, h_o.size() * 2, cudaMemcpyDeviceToHost));
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(h_lse.data(), lse, rows * 4, cudaMemcpyDeviceToHost));

  std::vector<std::int32_t> bt(static_cast<std::size_t>(pages)), lens{pt.ctx};
  for (std::int64_t i = 0; i < pages; ++i) bt[static_cast<std::size_t>(i)] = static_cast<int>(i);
  MlaKvCache kv;
  kv.ckv = h_ckv.data();
  kv.kpe = h_kpe.data();
  kv.ckv_dtype = kv.kpe_dtype = dtype_of(pt);
  if (pt.fp8) kv.ckv_scale.value = kv.kpe_scale.value = kFp8Scale;
  kv.num_pages = pages;
  kv.page_size = page;
  kv.block_table = bt.data();
  kv.block_table_stride = pages;
  kv.seq_lens = lens.data();
  kv.batch = 1;
  kv.space = MemorySpace::kHost;
  const ConstTensorView qn =
      make_tensor_view(h_qn.data(), DType::kBF16, {1, pt.q_len, pt.heads, kRank});
  const ConstTensorView qp =
      make_tensor_view(h_qp.data(), DType::kBF16, {1, pt.q_len, pt.heads, kRope});
  std::vector<float> r_o(rows * kRank), r_lse(rows);
  const StateView ref = make_state_view(r_o.data(), DType::kF32, r_lse.data(), pt.q_len, pt.heads,
                                        kRank, LseBase::kNatural, MemorySpace::kHost);
  DecodeOptions opt;
  opt.scale = scale;
  cpu::mla_decode(qn, qp, kv, opt, ref);

  return compare_rows(h_o.data(), h_lse.data(), r_o.data(), r_lse.data(), rows);
}

}  // namespace

int main(int argc, char** argv) {
  bool check = true;
  int force_splits = 0;
  std::vector<cuda::MlaDecodeKernel> kernels = {cuda::MlaDecodeKernel::kAuto};
  ShapeOptions so;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf("%s%s", kUsage, kShapeUsage);
        return 0;
      } else if (so.parse(argc, argv, i)) {
      } else if (a == "--no-check") {
        check = false;
      } else if (a == "--splits" && i + 1 < argc) {
        force_splits = int_list(a, argv[++i], 1, 1024).at(0);
      } else if (a == "--kernel" && i + 1 < argc) {
        const std::string k = argv[++i];
        if (k == "auto")
          kernels = {cuda::MlaDecodeKernel::kAuto};
        else if (k == "mma")
          kernels = {cuda::MlaDecodeKernel::kMma};
        else if (k == "wgmma")
          kernels = {cuda::MlaDecodeKernel::kWgmma};
        else if (k == "narrow")
          kernels = {cuda::MlaDecodeKernel::kWgmmaNarrow};
        else if (k == "narrow2")
          kernels = {cuda::MlaDecodeKernel::kWgmmaNarrow2};
        else if (k == "balanced")
          kernels = {cuda::MlaDecodeKernel::kWgmmaBalanced};
        else if (k == "balanced-ab")
          kernels = {cuda::MlaDecodeKernel::kWgmma, cuda::MlaDecodeKernel::kWgmmaBalanced};
        else if (k == "both")
          kernels = {cuda::MlaDecodeKernel::kMma, cuda::MlaDecodeKernel::kWgmma};
        else if (k == "all")
          kernels = {cuda::MlaDecodeKernel::kMma, cuda::MlaDecodeKernel::kWgmma,
                     cuda::MlaDecodeKernel::kWgmmaBalanced, cuda::MlaDecodeKernel::kWgmmaNarrow,
                     cuda::MlaDecodeKernel::kWgmmaNarrow2};
        else
          throw std::invalid_argument(
              "--kernel takes auto, mma, wgmma, narrow, narrow2, balanced, both, balanced-ab or "
              "all, not '" +
              k + "'");
      } else {
        throw std::invalid_argument("unknown or incomplete option '" + a + "'");
      }
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_mla: %s\n%s%s", e.what(), kUsage, kShapeUsage);
    return 2;
  }
  const int page = so.page;
  const std::vector<Shape> points = so.shapes();

  try {
    const bench_util::Device device = bench_util::current_device();
    bench_util::FlushTimer bench;
    bench.init(device.num_sms);

    // Pools for the largest point: request b owns pages [b·P, (b+1)·P).
    const Extents ext = extents(points, page);
    const std::int64_t max_tokens = ext.tokens, max_rows = ext.rows;
    const int max_batch = ext.batch;
    const std::int64_t pool_pages = max_tokens / page;
    void *ckv = nullptr, *kpe = nullptr, *q_nope = nullptr, *q_pe = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&ckv, static_cast<std::size_t>(max_tokens) * kRank * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&kpe, static_cast<std::size_t>(max_tokens) * kRope * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&q_nope, static_cast<std::size_t>(max_rows) * kRank * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&q_pe, static_cast<std::size_t>(max_rows) * kRope * 2));
    fill(q_nope, static_cast<std::size_t>(max_rows) * kRank, DType::kBF16, kSeedQNope, kQAmp,
         bench.num_sms, bench.stream);
    fill(q_pe, static_cast<std::size_t>(max_rows) * kRope, DType::kBF16, kSeedQPe, kQAmp,
         bench.num_sms, bench.stream);
    std::uint16_t* o = nullptr;
    float* lse = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&o, static_cast<std::size_t>(max_rows) * kRank * 2));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&lse, static_cast<std::size_t>(max_rows) * 4));
    std::vector<std::int32_t> bt(static_cast<std::size_t>(pool_pages));
    for (std::int64_t i = 0; i < pool_pages; ++i)
      bt[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    std::int32_t *d_bt = nullptr, *d_lens = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&d_bt, std::max<std::size_t>(1, bt.size()) * 4));
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(d_bt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&d_lens, static_cast<std::size_t>(max_batch) * 4));
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(bench.stream));

    // The same run's ceilings: the device copy (bytes read + written per second) and the dense
    // bf16 tensor peak.
    const double copy_gbps =
        bench_util::copy_bandwidth(bench.stream, std::size_t{1} << 30,
                                   [&](auto&& copy) { return bench.time_us(10, copy); }) /
        1e9;
    const double mma_tflops = mma_sync_tflops(bench);
    double peak_tflops = mma_tflops;
    const char* peak_src = "mma.sync loop";
#if ATTNSTATE_BENCH_CUBLASLT
    const double lt_tflops = cublaslt_tflops(bench);
    if (lt_tflops > 0) {
      peak_tflops = lt_tflops;
      peak_src = "cuBLASLt bf16 GEMM 8192^3";
    }
#endif
    const float scale = 1.f / std::sqrt(static_cast<float>(kKeyDim));
    std::printf(
        "# %s, %d SMs; device-to-device copy %.0f GB/s (read + written); bf16 tensor peak "
        "%.0f TFLOP/s (%s); mma.sync loop %.0f TFLOP/s\n",
        device.prop.name, device.num_sms, copy_gbps, peak_tflops, peak_src, mma_tflops);
    std::printf(
        "# MLA decode, 512 + 64, bf16 queries, bf16 state out (natural LSE), pages of %d "
        "tokens (block table), scale %.5f; times are medians with L2 flushed\n",
        page, scale);
    std::printf("%5s %2s %5s %6s %6s %6s %9s %7s %6s %8s %6s %9s %7s %5s %9s %9s %6s\n", "heads",
                "q", "kv", "batch", "ctx", "splits", "time_us", "GB/s", "%copy", "TFLOP/s", "%peak",
                "floor_us", "x_floor", "check", "max_do", "max_dlse", "kernel");
    FILE* csv = nullptr;
    if (!so.csv.empty()) {
      csv = bench_util::open_csv(
          so.csv,
          "heads,q_len,kv_dtype,batch,ctx,page,splits,time_us,bytes,gbps,frac_copy,tflops,"
          "frac_peak,floor_us,ratio_to_floor,copy_gbps,peak_tflops,peak_source,check,max_do,"
          "max_dlse,kernel\n");
      if (!csv) return 1;
    }

    int failures = 0;
    DType filled = DType::kF32;  // none yet
    void* ws = nullptr;
    std::size_t ws_cap = 0;
    for (const Shape& pt : points) {
      const DType dt = dtype_of(pt);
      if (dt != filled) {  // the latent cache in this dtype
        const float amp = pt.fp8 ? kFp8Amp : 1.f;
        fill(ckv, static_cast<std::size_t>(max_tokens) * kRank, dt, kSeedCkv, amp, bench.num_sms,
             bench.stream);
        fill(kpe, static_cast<std::size_t>(max_tokens) * kRope, dt, kSeedKpe, amp, bench.num_sms,
             bench.stream);
        filled = dt;
      }
      const std::int64_t P = (pt.ctx + page - 1) / page;
      std::vector<std::int32_t> lens(static_cast<std::size_t>(pt.batch), pt.ctx);
      ATTNSTATE_CUDA_CHECK(
          cudaMemcpy(d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
      cuda::MlaDecodeProblem pr;
      pr.batch = pt.batch;
      pr.q_len = pt.q_len;
      pr.heads = pt.heads;
      pr.ckv_dtype = pr.kpe_dtype = dt;
      DecodeOptions opt;
      opt.scale = scale;
      if (force_splits > 0) {
        opt.policy = SplitPolicy::kFixedCount;
        opt.num_splits = force_splits;
      }
      for (const cuda::MlaDecodeKernel kernel : kernels) {
        // the narrow kernels take at most 32 rows: larger shapes are skipped for them
        if ((kernel == cuda::MlaDecodeKernel::kWgmmaNarrow ||
             kernel == cuda::MlaDecodeKernel::kWgmmaNarrow2) &&
            pt.heads * pt.q_len > kNarrowRows)
          continue;
        const cuda::MlaDecodePlan plan =
            cuda::plan_mla_decode(pr, lens.data(), opt, bench.num_sms, kernel);
        const std::string plan_str = plan.to_string();
        const char* kernel_str = plan_str.find("two CTAs") != std::string::npos   ? "narrow2"
                                 : plan_str.find("narrow") != std::string::npos   ? "narrow"
                                 : plan_str.find("balanced") != std::string::npos ? "balanced"
                                 : plan_str.find("wgmma") != std::string::npos    ? "wgmma"
                                                                                  : "mma";
        if (plan.workspace_bytes() > ws_cap) {
          if (ws) ATTNSTATE_CUDA_CHECK(cudaFree(ws));
          ws_cap = plan.workspace_bytes();
          ATTNSTATE_CUDA_CHECK(cudaMalloc(&ws, ws_cap));
        }
        cuda::init_mla_decode_workspace(plan, ws, ws_cap, bench.stream);
        MlaKvCache kv;
        kv.ckv = ckv;
        kv.kpe = kpe;
        kv.ckv_dtype = kv.kpe_dtype = dt;
        if (pt.fp8) kv.ckv_scale.value = kv.kpe_scale.value = kFp8Scale;
        kv.num_pages = pool_pages;
        kv.page_size = page;
        kv.block_table = d_bt;
        kv.block_table_stride = P;
        kv.seq_lens = d_lens;
        kv.batch = pt.batch;
        kv.space = MemorySpace::kDevice;
        const ConstTensorView qn = make_tensor_view(
            q_nope, DType::kBF16, {pt.batch, pt.q_len, pt.heads, kRank}, MemorySpace::kDevice);
        const ConstTensorView qp = make_tensor_view(
            q_pe, DType::kBF16, {pt.batch, pt.q_len, pt.heads, kRope}, MemorySpace::kDevice);
        const std::int64_t tokens_out = std::int64_t{pt.batch} * pt.q_len;
        const StateView out = make_state_view(o, DType::kBF16, lse, tokens_out, pt.heads, kRank,
                                              LseBase::kNatural, MemorySpace::kDevice);
        auto call = [&] { cuda::run_mla_decode(plan, qn, qp, kv, out, ws, ws_cap, bench.stream); };

        // The checked call, into an output poisoned with NaN (0xFF bytes).
        CheckStats c;
        if (check) {
          ATTNSTATE_CUDA_CHECK(cudaMemsetAsync(
              o, 0xFF, static_cast<std::size_t>(tokens_out) * pt.heads * kRank * 2, bench.stream));
          ATTNSTATE_CUDA_CHECK(cudaMemsetAsync(
              lse, 0xFF, static_cast<std::size_t>(tokens_out) * pt.heads * 4, bench.stream));
          call();
          ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(bench.stream));
          c = check_request0(pt, page, scale, q_nope, q_pe, ckv, kpe, o, lse);
          if (!c.ok) ++failures;
        }

        const std::int64_t bytes =
            bytes_moved(pt.batch, pt.q_len, pt.heads, pt.ctx, static_cast<int>(size_of(dt)));
        const double flop = useful_flop(pt.batch, pt.q_len, pt.heads, pt.ctx);
        const int reps = so.reps_per_row();
        const double t = bench.time_us(reps, call);
        const double gbps = bytes / (t * 1e-6) / 1e9;
        const double tflops = flop / (t * 1e-6) / 1e12;
        const double floor_us =
            std::max(bytes / (copy_gbps * 1e9), flop / (peak_tflops * 1e12)) * 1e6;
        const int splits = plan.splits().policy == SplitPolicy::kFixedSize
                               ? plan.splits().splits_for(pt.ctx)
                               : plan.splits().num_splits;
        const char* verdict = !check ? "-" : c.ok ? "ok" : "FAIL";
        std::printf(
            "%5d %2d %5s %6d %6s %6d %9.1f %7.0f %5.0f%% %8.1f %5.0f%% %9.1f %7.2f %5s "
            "%9.2e %9.2e %6s\n",
            pt.heads, pt.q_len, dtype_str(pt), pt.batch, ctx_str(pt.ctx).c_str(), splits, t, gbps,
            100.0 * gbps / copy_gbps, tflops, 100.0 * tflops / peak_tflops, floor_us, t / floor_us,
            verdict, c.max_do, c.max_dlse, kernel_str);
        std::fflush(stdout);
        if (csv) {
          std::fprintf(
              csv,
              "%d,%d,%s,%d,%d,%d,%d,%.2f,%lld,%.1f,%.4f,%.2f,%.4f,%.2f,%.3f,%.1f,%.1f,%s,%s,"
              "%.3e,%.3e,%s\n",
              pt.heads, pt.q_len, dtype_str(pt), pt.batch, pt.ctx, page, splits, t,
              static_cast<long long>(bytes), gbps, gbps / copy_gbps, tflops, tflops / peak_tflops,
              floor_us, t / floor_us, copy_gbps, peak_tflops, peak_src, verdict, c.max_do,
              c.max_dlse, kernel_str);
          std::fflush(csv);
        }
      }
    }
    if (csv) std::fclose(csv);
    if (ws) cudaFree(ws);
    cudaFree(ckv);
    cudaFree(kpe);
    cudaFree(q_nope);
    cudaFree(q_pe);
    cudaFree(o);
    cudaFree(lse);
    cudaFree(d_bt);
    cudaFree(d_lens);
    cudaFree(bench.flush_buf);
    cudaFree(bench.sink);
    if (failures > 0) std::printf("# %d row(s) FAILED the check\n", failures);
    return failures > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_mla: %s\n", e.what());
    return 1;
  }
}
