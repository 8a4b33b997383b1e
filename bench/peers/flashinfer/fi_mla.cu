/// @file fi_mla.cu
/// @brief FlashInfer 0.7.2's Hopper MLA decode (what `BatchMLAPagedAttentionWrapper(backend=
///        "fa3")` runs: `MLAPlan` + `BatchMLAPageAttentionHopper`, fi_mla_kernel.cu) on the shapes
///        and inputs of `bench/bench_mla.cu`, timed the same way, each shape checked against a
///        CPU fp64 reference of request 0. The same-run peer of bench_mla (run-mla.sh runs both
///        in one device call and prints attnstate's speed ÷ FlashInfer's per row).
///
/// Per shape: the inputs of bench_mla (bench/mla_inputs.cuh: the same hash, amplitudes and fp8
/// scales; request b owning pages [b·P, (b+1)·P), here as the wrapper's CSR `kv_indptr` /
/// `kv_indices`), sm_scale 1/sqrt(576), `causal = q_len > 1` (q_len 1 plans non-causal, as a
/// decode does), bf16 output and a natural-base LSE (`return_lse_base_on_e`). Plan, one call into
/// an output and a float workspace filled with NaN bytes, the check of request 0 (every value
/// finite and within the bounds of mla_inputs.cuh, bench_mla's), then 3 untimed and
/// `--reps` timed calls, each after an L2 flush (a 512 MiB read), each timed alone with CUDA
/// events; the upper median (bench_util's) and the minimum are reported. The first row is a 1 GiB
/// device-to-device copy, timed the same way (bytes read + written per second).
///
/// `fi_mla --list [options]` prints the shapes and the built instances and makes no CUDA call;
/// `--help` prints the options.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../mla_inputs.cuh"
#include "fi_harness.cuh"
#include "fi_mla.hpp"

namespace {

using namespace mla_inputs;

const char* kUsage =
    "usage: fi_mla [options]\n"
    "  --list             print the shapes and the built instances (no CUDA call)\n"
    "  --help             this text\n"
    "  --splits N, --no-check: bench_mla's, accepted and ignored (FlashInfer's plan splits;\n"
    "                     every row is checked)\n"
    "Shapes (bench_mla's):\n";

fim::KvType kv_of(const Shape& s) { return s.fp8 ? fim::KvType::kE4M3 : fim::KvType::kBF16; }

void fill(void* p, std::size_t n, bool fp8, std::uint32_t seed, float amp, int sms,
          cudaStream_t s) {
  FIH_CUDA(mla_inputs::fill_async(p, n, fp8, seed, amp, sms, s));
}

float bf16_value(std::uint16_t u) { return fih::lut(fic::DType::kBF16)[u]; }

/// The value of an e4m3 byte (finite: bench inputs are saturated to ±448).
float e4m3_value(std::uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                           : std::ldexp(1.f + static_cast<float>(m) / 8.f, e - 7);
  return s ? -mag : mag;
}

/// Request 0 in fp64 (threads over its rows) against the device output of its rows.
CheckStats check_request0(const Shape& pt, double sm_scale, const void* q_nope, const void* q_pe,
                          const void* ckv, const void* kpe, const void* o, const float* lse) {
  const bool fp8 = pt.fp8;
  const std::size_t esz = fp8 ? 1 : 2;
  const std::size_t tokens = static_cast<std::size_t>(pt.ctx);
  const std::size_t rows = static_cast<std::size_t>(pt.q_len) * pt.heads;
  std::vector<std::uint8_t> h_ckv(tokens * kRank * esz), h_kpe(tokens * kRope * esz);
  std::vector<std::uint16_t> h_qn(rows * kRank), h_qp(rows * kRope), h_o(rows * kRank);
  std::vector<float> h_lse(rows);
  // request 0 owns pages 0..P-1, its tokens contiguous from the pools' start
  FIH_CUDA(cudaMemcpy(h_ckv.data(), ckv, h_ckv.size(), cudaMemcpyDeviceToHost));
  FIH_CUDA(cudaMemcpy(h_kpe.data(), kpe, h_kpe.size(), cudaMemcpyDeviceToHost));
  FIH_CUDA(cudaMemcpy(h_qn.data(), q_nope, h_qn.size() * 2, cudaMemcpyDeviceToHost));
  FIH_CUDA(cudaMemcpy(h_qp.data(), q_pe, h_qp.size() * 2, cudaMemcpyDeviceToHost));
  FIH_CUDA(cudaMemcpy(h_o.data(), o, h_o.size() * 2, cudaMemcpyDeviceToHost));
  FIH_CUDA(cudaMemcpy(h_lse.data(), lse, rows * 4, cudaMemcpyDeviceToHost));

  (void)fih::lut(fic::DType::kBF16);  // the bf16 table built here, before threads read it
  // keys as floats, dequantised
  std::vector<float> k(tokens * kKeyDim);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (int d = 0; d < kRank; ++d) {
      const std::size_t i = t * kRank + d;
      k[t * kKeyDim + d] =
          fp8 ? e4m3_value(h_ckv[i]) * kFp8Scale
              : bf16_value(static_cast<std::uint16_t>(h_ckv[2 * i] | (h_ckv[2 * i + 1] << 8)));
    }
    for (int d = 0; d < kRope; ++d) {
      const std::size_t i = t * kRope + d;
      k[t * kKeyDim + kRank + d] =
          fp8 ? e4m3_value(h_kpe[i]) * kFp8Scale
              : bf16_value(static_cast<std::uint16_t>(h_kpe[2 * i] | (h_kpe[2 * i + 1] << 8)));
    }
  }
  std::vector<double> r_o(rows * kRank), r_lse(rows);
  auto row_ref = [&](std::size_t r) {
    const int i = static_cast<int>(r / pt.heads);  // token-major rows: (i, h)
    const long long visible = std::max(0, pt.ctx - pt.q_len + 1 + i);
    std::vector<double> q(kKeyDim), s(static_cast<std::size_t>(visible)), acc(kRank, 0.0);
    for (int d = 0; d < kRank; ++d) q[d] = bf16_value(h_qn[r * kRank + d]);
    for (int d = 0; d < kRope; ++d) q[kRank + d] = bf16_value(h_qp[r * kRope + d]);
    double m = -INFINITY;
    for (long long t = 0; t < visible; ++t) {
      const float* kt = &k[static_cast<std::size_t>(t) * kKeyDim];
      double dot = 0;
      for (int d = 0; d < kKeyDim; ++d) dot += q[d] * kt[d];
      s[t] = dot * sm_scale;
      m = std::max(m, s[t]);
    }
    double l = 0;
    for (long long t = 0; t < visible; ++t) {
      const double p = std::exp(s[t] - m);
      l += p;
      const float* vt = &k[static_cast<std::size_t>(t) * kKeyDim];
      for (int d = 0; d < kRank; ++d) acc[d] += p * vt[d];
    }
    for (int d = 0; d < kRank; ++d) r_o[r * kRank + d] = visible > 0 ? acc[d] / l : 0.0;
    r_lse[r] = visible > 0 ? m + std::log(l) : -INFINITY;
  };
  const unsigned nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < nt; ++w)
    pool.emplace_back([&, w] {
      for (std::size_t r = w; r < rows; r += nt) row_ref(r);
    });
  for (std::thread& th : pool) th.join();

  return compare_rows(h_o.data(), h_lse.data(), r_o.data(), r_lse.data(), rows);
}

/// bench_util's timing: 3 untimed calls, then `reps` calls each after an L2 flush, each timed
/// alone (synchronised); returns the sorted µs.
template <class F>
std::vector<double> time_calls(fih::Timer& timer, int reps, F&& f) {
  cudaEvent_t e0, e1;
  FIH_CUDA(cudaEventCreate(&e0));
  FIH_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    timer.flush();
    FIH_CUDA(cudaEventRecord(e0, timer.stream));
    f();
    FIH_CUDA(cudaEventRecord(e1, timer.stream));
    FIH_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    FIH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(1000.0 * ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(us.begin(), us.end());
  return us;
}

const fim::Entry* find_instance(fim::KvType kv, bool causal) {
  for (const fim::Entry& e : fim::registry())
    if (e.key.kv == kv && e.key.causal == causal) return &e;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  bool list = false;
  ShapeOptions so;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf("%s%s", kUsage, kShapeUsage);
        return 0;
      } else if (so.parse(argc, argv, i)) {
      } else if (a == "--list") {
        list = true;
      } else if (a == "--splits" && i + 1 < argc) {
        ++i;
      } else if (a != "--no-check") {
        throw std::invalid_argument("unknown or incomplete option '" + a + "'");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_mla: %s\n%s%s", e.what(), kUsage, kShapeUsage);
    return 2;
  }
  const int page = so.page;
  const std::vector<Shape> points = so.shapes();

  if (list) {
    std::printf("# built instances:");
    for (const fim::Entry& e : fim::registry()) std::printf(" [%s]", e.name);
    std::printf("\n# %zu shapes, pages of %d tokens:\n", points.size(), page);
    for (const Shape& p : points)
      std::printf("heads %d q_len %d kv %s batch %d ctx %s%s\n", p.heads, p.q_len,
                  fim::kv_name(kv_of(p)), p.batch, ctx_str(p.ctx).c_str(),
                  find_instance(kv_of(p), p.q_len > 1) ? "" : " (instance not built)");
    return 0;
  }

  try {
    int sms = 0;
    cudaStream_t stream = nullptr;
    fih::Timer timer;
    const fih::DeviceCopy copy =
        fih::open_device(sms, stream, timer, std::size_t{1} << 30, 3, /*flush_each=*/true);
    const double copy_gbps = copy.bytes_per_s / 1e9;

    const Extents ext = extents(points, page);
    const std::int64_t max_tokens = ext.tokens, max_rows = ext.rows;
    fih::DevBuf ckv(static_cast<std::size_t>(max_tokens) * kRank * 2);
    fih::DevBuf kpe(static_cast<std::size_t>(max_tokens) * kRope * 2);
    fih::DevBuf q_nope(static_cast<std::size_t>(max_rows) * kRank * 2);
    fih::DevBuf q_pe(static_cast<std::size_t>(max_rows) * kRope * 2);
    fih::DevBuf o(static_cast<std::size_t>(max_rows) * kRank * 2);
    fih::DevBuf lse(static_cast<std::size_t>(max_rows) * 4);
    fih::DevBuf indices(static_cast<std::size_t>(std::max<std::int64_t>(1, max_tokens / page)) * 4);
    fill(q_nope.p, static_cast<std::size_t>(max_rows) * kRank, false, kSeedQNope, kQAmp, sms,
         stream);
    fill(q_pe.p, static_cast<std::size_t>(max_rows) * kRope, false, kSeedQPe, kQAmp, sms, stream);
    {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(max_tokens / page));
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
      FIH_CUDA(cudaMemcpy(indices.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    }
    FIH_CUDA(cudaStreamSynchronize(stream));
    const double sm_scale = 1.0 / std::sqrt(static_cast<double>(kKeyDim));

    std::printf(
        "# FlashInfer 0.7.2 Hopper MLA (fa3) on %s; device-to-device copy %.0f GB/s "
        "(read + written)\n",
        copy.device_note.c_str(), copy_gbps);
    std::printf("# pages of %d tokens (CSR), sm_scale %.5f, bf16 out; medians with L2 flushed\n",
                page, sm_scale);
    std::printf("%5s %2s %5s %6s %6s %9s %9s %7s %6s %8s %5s %9s %9s  %s\n", "heads", "q", "kv",
                "batch", "ctx", "time_us", "min_us", "GB/s", "%copy", "TFLOP/s", "check", "max_do",
                "max_dlse", "plan");
    FILE* csv = nullptr;
    if (!so.csv.empty()) {
      csv = std::fopen(so.csv.c_str(), "w");
      if (!csv) {
        std::fprintf(stderr, "fi_mla: cannot write %s\n", so.csv.c_str());
        return 1;
      }
      std::fprintf(csv,
                   "path,heads,q_len,kv_dtype,batch,ctx,page,time_us,min_us,bytes,gbps,frac_copy,"
                   "tflops,check,max_do,max_dlse,note\n");
      std::fprintf(csv, "memcpy,,,,,,,%.2f,%.2f,%lld,%.1f,1.0000,,-,,,d2d 1 GiB\n", copy.median_us,
                   copy.min_us, 1ll << 31, copy_gbps);
    }

    int failures = 0;
    int filled = -1;
    for (const Shape& pt : points) {
      const bool fp8 = pt.fp8;
      const fim::KvType kv = kv_of(pt);
      if (filled != static_cast<int>(kv)) {
        fill(ckv.p, static_cast<std::size_t>(max_tokens) * kRank, fp8, kSeedCkv,
             fp8 ? kFp8Amp : 1.f, sms, stream);
        fill(kpe.p, static_cast<std::size_t>(max_tokens) * kRope, fp8, kSeedKpe,
             fp8 ? kFp8Amp : 1.f, sms, stream);
        filled = static_cast<int>(kv);
      }
      const int P = (pt.ctx + page - 1) / page;
      std::vector<std::int32_t> qo(pt.batch + 1), kvp(pt.batch + 1), lens(pt.batch, pt.ctx);
      for (int b = 0; b <= pt.batch; ++b) {
        qo[b] = b * pt.q_len;
        kvp[b] = b * P;
      }
      const std::int64_t tokens_out = std::int64_t{pt.batch} * pt.q_len;
      fim::Problem p;
      p.heads = pt.heads;
      p.q_len = pt.q_len;
      p.page = page;
      p.batch = pt.batch;
      p.kv = kv;
      p.causal = pt.q_len > 1;
      p.h_qo_indptr = qo.data();
      p.h_kv_indptr = kvp.data();
      p.h_kv_len = lens.data();
      p.kv_indices = indices.as<std::int32_t>();
      p.q_nope = q_nope.p;
      p.q_pe = q_pe.p;
      p.ckv = ckv.p;
      p.kpe = kpe.p;
      p.o = o.p;
      p.lse = lse.as<float>();
      p.sm_scale = sm_scale;
      p.ckv_scale = p.kpe_scale = fp8 ? kFp8Scale : 1.f;
      p.stream = stream;

      const std::int64_t bytes = bytes_moved(pt.batch, pt.q_len, pt.heads, pt.ctx, fp8 ? 1 : 2);
      const double flop = useful_flop(pt.batch, pt.q_len, pt.heads, pt.ctx);
      const std::string id = fih::fmt("%5d %2d %5s %6d %6s", pt.heads, pt.q_len, fim::kv_name(kv),
                                      pt.batch, ctx_str(pt.ctx).c_str());
      auto csv_row = [&](double t, double tmin, const char* check, double mdo, double mdl,
                         const std::string& note) {
        if (!csv) return;
        std::string n = note;
        std::replace(n.begin(), n.end(), ',', ';');
        std::fprintf(csv, "fi_mla,%d,%d,%s,%d,%d,%d,%s,%s,%lld,%s,%s,%s,%s,%s,%s,%s\n", pt.heads,
                     pt.q_len, fim::kv_name(kv), pt.batch, pt.ctx, page,
                     fih::num(t, "%.2f").c_str(), fih::num(tmin, "%.2f").c_str(),
                     static_cast<long long>(bytes),
                     fih::num(bytes / (t * 1e-6) / 1e9, "%.1f").c_str(),
                     fih::num(bytes / (t * 1e-6) / 1e9 / copy_gbps, "%.4f").c_str(),
                     fih::num(flop / (t * 1e-6) / 1e12, "%.2f").c_str(), check,
                     fih::num(mdo, "%.3e").c_str(), fih::num(mdl, "%.3e").c_str(), n.c_str());
        std::fflush(csv);
      };

      const fim::Entry* inst = find_instance(kv, p.causal);
      if (inst == nullptr) {
        std::printf("%s NOT_BUILT\n", id.c_str());
        csv_row(NAN, NAN, "NOT_BUILT", NAN, NAN, "instance not built");
        continue;
      }
      std::unique_ptr<fim::Runner> runner = inst->make();
      fim::PlanSummary plan;
      try {
        plan = runner->plan(p);
      } catch (const fim::Unsupported& e) {
        std::printf("%s UNSUPPORTED %s\n", id.c_str(), e.what());
        csv_row(NAN, NAN, "UNSUPPORTED", NAN, NAN, e.what());
        continue;
      }
      const std::string note =
          fih::fmt("cluster %d x %d; works %lld; split tiles %lld", plan.cluster_size,
                   plan.clusters, plan.works, plan.split_tiles);
      // the checked call, into NaN bytes (output, LSE and the float workspace)
      FIH_CUDA(cudaMemsetAsync(
          o.p, 0xFF, static_cast<std::size_t>(tokens_out) * pt.heads * kRank * 2, stream));
      FIH_CUDA(cudaMemsetAsync(lse.p, 0xFF, static_cast<std::size_t>(tokens_out) * pt.heads * 4,
                               stream));
      FIH_CUDA(cudaMemsetAsync(runner->float_workspace(), 0xFF, runner->float_workspace_bytes(),
                               stream));
      runner->run();
      FIH_CUDA(cudaStreamSynchronize(stream));
      const CheckStats c =
          check_request0(pt, sm_scale, q_nope.p, q_pe.p, ckv.p, kpe.p, o.p, lse.as<float>());
      if (!c.ok) ++failures;
      const int reps = so.reps_per_row();
      const std::vector<double> us = time_calls(timer, reps, [&] { runner->run(); });
      const double t = us[us.size() / 2], tmin = us.front();
      const double gbps = bytes / (t * 1e-6) / 1e9;
      std::printf("%s %9.1f %9.1f %7.0f %5.0f%% %8.1f %5s %9.2e %9.2e  %s\n", id.c_str(), t, tmin,
                  gbps, 100.0 * gbps / copy_gbps, flop / (t * 1e-6) / 1e12, c.ok ? "ok" : "FAIL",
                  c.max_do, c.max_dlse, note.c_str());
      std::fflush(stdout);
      csv_row(t, tmin, c.ok ? "ok" : "FAIL", c.max_do, c.max_dlse, note);
    }
    if (csv) std::fclose(csv);
    if (failures > 0) std::printf("# %d row(s) FAILED the check\n", failures);
    return failures > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_mla: %s\n", e.what());
    return 1;
  }
}
