/// @file bench_cascade_auto.cu
/// @brief The automatic cascade path against the plain decode (issue 20 item 5): for batches
///        from much sharing to none, the page table goes through `build_cascade_levels` and
///        `decide_cascade`, and the run it picks is timed beside the plain decode of the same
///        table and beside the cascade over every level found (and the shallower one the decision
///        keeps, when it keeps fewer). 32/8 heads, head dim 128, bf16, pages of 16, one new token
///        per request; medians of `--reps` calls (21), L2 flushed, the copy bandwidth measured in
///        the same run and fed to the decision's model.
///
/// Columns: the decision (`cascade/s` with `s` shared levels kept, or `decode`), its estimates,
/// the measured plain decode, cascade (all levels) and kept cascade, `auto/dec` (the picked
/// run's time over the plain decode's: the target is at most 1.03) and `auto/best` (over the
/// faster of the plain decode and the cascades: the cost of the decision's mistakes).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/cascade_decision.hpp"
#include "attnstate/core/cascade_levels.hpp"
#include "attnstate/cuda/cascade.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"
#include "bench_util.cuh"
#include "bench_util.hpp"

using namespace attnstate;

namespace {

constexpr int kHeadsQ = 32, kHeadsKv = 8, kHeadDim = 128, kPage = 16;

/// A batch's page table on the host: requests in groups sharing prefixes, contiguous (identity
/// order), each page id used by one prefix or one request.
struct Table {
  std::vector<std::int32_t> indptr{0}, indices, lens;
  std::int32_t pages = 0;
  std::vector<std::int32_t> run(std::int64_t tokens) {
    std::vector<std::int32_t> r;
    for (std::int64_t i = 0; i < (tokens + kPage - 1) / kPage; ++i) r.push_back(pages++);
    return r;
  }
  void add(const std::vector<std::int32_t>& shared, std::int64_t shared_tokens, std::int64_t own) {
    indices.insert(indices.end(), shared.begin(), shared.end());
    const std::vector<std::int32_t> mine = run(own);
    indices.insert(indices.end(), mine.begin(), mine.end());
    indptr.push_back(static_cast<std::int32_t>(indices.size()));
    lens.push_back(static_cast<std::int32_t>(shared_tokens + own));
  }
  PagedKvCache host() const {
    PagedKvCache t;
    t.page_size = kPage;
    t.num_pages = pages;
    t.batch = static_cast<std::int64_t>(lens.size());
    t.seq_lens = lens.data();
    t.page_indptr = indptr.data();
    t.page_indices = indices.data();
    t.space = MemorySpace::kHost;
    return t;
  }
};

struct Scenario {
  std::string name;
  Table table;
};

/// `groups` groups of `per` requests, each group under its own `prompt`-token prefix (shared by
/// all groups when `common`), each request with `own(i)` tokens of its own.
template <class Own>
Table grouped(int groups, int per, std::int64_t prompt, bool common, Own&& own) {
  Table t;
  std::vector<std::int32_t> shared = t.run(prompt);
  int i = 0;
  for (int g = 0; g < groups; ++g) {
    if (!common && g > 0) shared = t.run(prompt);
    for (int r = 0; r < per; ++r) t.add(shared, prompt, own(i++));
  }
  return t;
}

std::vector<Scenario> scenarios(bool quick) {
  std::vector<Scenario> s;
  auto fixed = [](std::int64_t n) { return [n](int) { return n; }; };
  s.push_back({"prompt 32k x 128, own 256", grouped(1, 128, 32768, true, fixed(256))});
  s.push_back({"prompt 4k x 16, own 64", grouped(1, 16, 4096, true, fixed(64))});
  s.push_back({"prompt 8k x 32, own 1..2000", grouped(1, 32, 8192, true, [](int i) {
                 return std::int64_t{1} + (i * 977) % 2000;
               })});
  s.push_back({"prompt 256 x 8, own 2000", grouped(1, 8, 256, true, fixed(2000))});
  s.push_back({"prompt 32k x 2, own 100", grouped(1, 2, 32768, true, fixed(100))});
  s.push_back({"prompt 16 x 64, own 4096", grouped(1, 64, 16, true, fixed(4096))});
  s.push_back({"4 prompts 16k x 8, own 512", grouped(4, 8, 16384, false, fixed(512))});
  if (!quick) {
    // three levels: a 4k system prompt for all, 8k blocks for groups of 16, own 128
    Table t;
    const std::vector<std::int32_t> sys = t.run(4096);
    for (int g = 0; g < 4; ++g) {
      std::vector<std::int32_t> p = sys;
      const std::vector<std::int32_t> block = t.run(8192);
      p.insert(p.end(), block.begin(), block.end());
      for (int r = 0; r < 16; ++r) t.add(p, 4096 + 8192, 128);
    }
    s.push_back({"sys 4k x 64 / blocks 8k x 16, own 128", t});
    s.push_back({"no sharing: 64 x 8k", grouped(64, 1, 0, false, fixed(8192))});
    Table half;  // 32 requests under one 16k prompt, 32 alone
    const std::vector<std::int32_t> p = half.run(16384);
    for (int r = 0; r < 32; ++r) half.add(p, 16384, 256);
    for (int r = 0; r < 32; ++r) half.add({}, 0, 16384 + 256);
    s.push_back({"half shared: 32 under 16k, 32 alone", half});
  }
  return s;
}

/// Device copies of the levels' arrays, and the level views over them.
struct DeviceLevels {
  std::vector<void*> owned;
  std::vector<CascadeLevel> levels;
  explicit DeviceLevels(const CascadeLevels& lv) {
    auto up = [&](const std::vector<std::int32_t>& v) -> const std::int32_t* {
      void* p = nullptr;
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(4, 4 * v.size())));
      if (!v.empty())
        ATTNSTATE_CUDA_CHECK(cudaMemcpy(p, v.data(), 4 * v.size(), cudaMemcpyHostToDevice));
      owned.push_back(p);
      return static_cast<const std::int32_t*>(p);
    };
    for (int l = 0; l < lv.num_levels(); ++l) {
      const CascadeLevels::Arrays& a = lv.arrays(l);
      CascadeLevel d;
      d.num_segments = static_cast<std::int64_t>(a.seg_lens.size());
      d.request_indptr = up(a.request_indptr);
      d.page_indptr = up(a.page_indptr);
      d.page_indices = up(a.page_indices);
      d.seg_lens = up(a.seg_lens);
      levels.push_back(d);
    }
  }
  ~DeviceLevels() {
    for (void* p : owned) cudaFree(p);
  }
  DeviceLevels(const DeviceLevels&) = delete;
  DeviceLevels& operator=(const DeviceLevels&) = delete;
};

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  bool quick = false;
  int reps = 21;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--csv PATH] [--quick] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  if (reps < 1) {
    std::fprintf(stderr, "--reps must be positive\n");
    return 2;
  }
  try {
    const bench_util::Device dev = bench_util::current_device();
    bench_util::FlushTimer timer;
    timer.init(dev.num_sms);
    const cudaStream_t stream = timer.stream;
    const double copy_gbps =
        bench_util::copy_bandwidth(stream, std::size_t{1} << 30,
                                   [&](auto&& f) { return timer.time_us(reps, f); }) /
        1e9;
    std::printf(
        "# %s, %d SMs; device copy %.0f GB/s (read + written), fed to the decision; "
        "32/8 heads, head dim 128, bf16, pages of 16; medians of %d calls, L2 flushed\n",
        dev.prop.name, dev.num_sms, copy_gbps, reps);
    std::printf("%-38s %3s %6s %10s %9s %9s | %9s %9s %9s | %8s %9s  %s\n", "batch", "lv", "read%",
                "decision", "est_cas", "est_dec", "decode", "cascade", "kept", "auto/dec",
                "auto/best", "reason");
    FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
    if (csv)
      std::fprintf(csv,
                   "batch,levels,keys_read,keys_total,use_cascade,shared_levels,est_cascade_us,"
                   "est_decode_us,decode_us,cascade_us,kept_us,auto_over_decode,auto_over_best,"
                   "host_us,copy_gbps\n");
    CascadeCostShape cs;
    cs.heads_q = kHeadsQ;
    cs.heads_kv = kHeadsKv;
    cs.head_dim = kHeadDim;
    cs.kv_dtype = DType::kBF16;
    CascadeCostModel model;
    model.copy_gbps = copy_gbps;
    for (const Scenario& sc : scenarios(quick)) {
      const Table& t = sc.table;
      const int batch = static_cast<int>(t.lens.size());
      // the automatic path's host side: levels and decision (timed on the host)
      const auto h0 = std::chrono::steady_clock::now();
      const CascadeLevels found = build_cascade_levels(t.host());
      const CascadeDecision d = decide_cascade(found, cs, model);
      const double host_us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count();
      // device data: pools, queries, table, output
      const std::size_t page_elems = std::size_t{kPage} * kHeadsKv * kHeadDim;
      const std::size_t pool = page_elems * static_cast<std::size_t>(std::max(1, t.pages));
      std::uint16_t *k = nullptr, *v = nullptr, *q = nullptr, *o = nullptr;
      float* lse = nullptr;
      std::int32_t *d_indptr = nullptr, *d_indices = nullptr, *d_lens = nullptr;
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&k, 2 * pool));
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&v, 2 * pool));
      const std::size_t q_elems = static_cast<std::size_t>(batch) * kHeadsQ * kHeadDim;
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&q, 2 * q_elems));
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&o, 2 * q_elems));
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&lse, 4 * static_cast<std::size_t>(batch) * kHeadsQ));
      bench_util::fill_bf16<<<256, 256, 0, stream>>>(k, pool, 1u);
      ATTNSTATE_CHECK_LAUNCH(stream, "fill_bf16");
      bench_util::fill_bf16<<<256, 256, 0, stream>>>(v, pool, 2u);
      ATTNSTATE_CHECK_LAUNCH(stream, "fill_bf16");
      bench_util::fill_bf16<<<64, 256, 0, stream>>>(q, q_elems, 3u);
      ATTNSTATE_CHECK_LAUNCH(stream, "fill_bf16");
      auto up = [&](std::int32_t** dst, const std::vector<std::int32_t>& src) {
        ATTNSTATE_CUDA_CHECK(cudaMalloc(dst, std::max<std::size_t>(4, 4 * src.size())));
        if (!src.empty())
          ATTNSTATE_CUDA_CHECK(
              cudaMemcpy(*dst, src.data(), 4 * src.size(), cudaMemcpyHostToDevice));
      };
      up(&d_indptr, t.indptr);
      up(&d_indices, t.indices);
      up(&d_lens, t.lens);
      PagedKvCache kv;
      kv.k = k;
      kv.v = v;
      kv.dtype = DType::kBF16;
      kv.num_pages = std::max(1, t.pages);
      kv.page_size = kPage;
      kv.heads_kv = kHeadsKv;
      kv.head_dim = kHeadDim;
      kv.page_indptr = d_indptr;
      kv.page_indices = d_indices;
      kv.seq_lens = d_lens;
      kv.batch = batch;
      kv.space = MemorySpace::kDevice;
      const ConstTensorView qv =
          make_tensor_view(q, DType::kBF16, {batch, 1, kHeadsQ, kHeadDim}, MemorySpace::kDevice);
      const StateView out = make_state_view(o, DType::kBF16, lse, batch, kHeadsQ, kHeadDim,
                                            LseBase::kNatural, MemorySpace::kDevice);
      // the plain decode
      DecodeProblem pr;
      pr.batch = batch;
      pr.heads_q = kHeadsQ;
      pr.heads_kv = kHeadsKv;
      pr.head_dim = kHeadDim;
      pr.q_dtype = pr.kv_dtype = DType::kBF16;
      const cuda::DecodePlan dplan = cuda::plan_decode(pr, t.lens.data(), {}, dev.num_sms);
      void* dws = nullptr;
      ATTNSTATE_CUDA_CHECK(cudaMalloc(&dws, std::max<std::size_t>(256, dplan.workspace_bytes())));
      cuda::init_decode_workspace(dplan, dws, dplan.workspace_bytes(), stream);
      const double decode_us = timer.time_us(reps, [&] {
        cuda::run_decode(dplan, qv, kv, out, dws, dplan.workspace_bytes(), stream);
      });
      // a cascade over `lv` (-1 when nothing is shared)
      auto time_cascade = [&](const CascadeLevels& lv) -> double {
        if (lv.num_levels() < 2) return -1;
        cuda::CascadeShape shape;
        shape.batch = batch;
        shape.heads_q = kHeadsQ;
        shape.heads_kv = kHeadsKv;
        shape.head_dim = kHeadDim;
        shape.page_size = kPage;
        shape.num_pages = kv.num_pages;
        shape.dtype = DType::kBF16;
        const cuda::CascadePlan plan =
            cuda::plan_cascade(shape, lv.levels(), lv.num_levels(), {}, dev.num_sms);
        const DeviceLevels dl(lv);
        void* ws = nullptr;
        ATTNSTATE_CUDA_CHECK(cudaMalloc(&ws, std::max<std::size_t>(256, plan.workspace_bytes())));
        const double us = timer.time_us(reps, [&] {
          cuda::run_cascade(plan, qv, kv, dl.levels.data(), lv.num_levels(), out, ws,
                            plan.workspace_bytes(), stream);
        });
        ATTNSTATE_CUDA_CHECK(cudaFree(ws));
        return us;
      };
      const double cascade_us = time_cascade(found);
      double kept_us = cascade_us;
      if (d.use_cascade && d.shared_levels + 1 < found.num_levels()) {
        CascadeLevelsOptions lo;
        lo.max_levels = d.shared_levels + 1;
        kept_us = time_cascade(build_cascade_levels(t.host(), lo));
      }
      const double auto_us = d.use_cascade ? kept_us : decode_us;
      double best = decode_us;
      if (cascade_us > 0) best = std::min(best, cascade_us);
      if (kept_us > 0) best = std::min(best, kept_us);
      const std::string decision =
          d.use_cascade ? "cascade/" + std::to_string(d.shared_levels) : "decode";
      std::printf("%-38s %3d %5.1f%% %10s %9.1f %9.1f | %9.1f %9.1f %9.1f | %8.3f %9.3f  %s\n",
                  sc.name.c_str(), found.num_levels(),
                  100.0 * static_cast<double>(found.keys_read()) /
                      static_cast<double>(std::max<std::int64_t>(1, found.keys_total())),
                  decision.c_str(), d.cascade_us, d.decode_us, decode_us, cascade_us, kept_us,
                  auto_us / decode_us, auto_us / best, d.reason.c_str());
      if (csv)
        std::fprintf(csv,
                     "\"%s\",%d,%lld,%lld,%d,%d,%.2f,%.2f,%.2f,%.2f,%.2f,%.4f,%.4f,%.1f,%.1f\n",
                     sc.name.c_str(), found.num_levels(), static_cast<long long>(found.keys_read()),
                     static_cast<long long>(found.keys_total()), d.use_cascade ? 1 : 0,
                     d.shared_levels, d.cascade_us, d.decode_us, decode_us, cascade_us, kept_us,
                     auto_us / decode_us, auto_us / best, host_us, copy_gbps);
      for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q),
                      static_cast<void*>(o), static_cast<void*>(lse), static_cast<void*>(d_indptr),
                      static_cast<void*>(d_indices), static_cast<void*>(d_lens), dws})
        ATTNSTATE_CUDA_CHECK(cudaFree(p));
    }
    if (csv) std::fclose(csv);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
