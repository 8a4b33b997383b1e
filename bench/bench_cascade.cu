/// @file bench_cascade.cu
/// @brief Cascade benchmark: a shared prefix {4k, 32k} + a unique suffix {64, 256, 1024} per
///        request, batch {16, 64, 256} (plus every shape of the ANCHORS.md cascade table), 32/8
///        heads, head_dim 128, bf16, pages of 16 tokens NHD. For each shape: the median time of
///        the cascade call, of each level and of the merge (L2 flushed before every timed call),
///        and of the staged path (each level, then the merge launch, as separate calls: no level
///        overlap, no merge folded into the last level's decode);
///        the library's plain split-KV decode of the same caches (each request's page list = the
///        shared prefix pages + its own suffix pages) and the cascade kernel run as one level of
///        concatenated segments; the floor Σ_level max(bytes / measured copy bandwidth,
///        FLOP / 790 TFLOP/s); FlashInfer's cascade time where ANCHORS.md has the shape; the
///        largest difference between the cascade and the plain-decode outputs.
///        `--csv <path>` writes a CSV; `--quick` runs the anchor shapes with fewer repeats;
///        `--shapes P:S:B[,P:S:B...]` runs only those (prefix, suffix, batch) shapes; `--lean`
///        times the cascade, its levels and the merge only (no plain decode, one-level or
///        mma-only comparisons); `--decode-sms n` sets `CascadeTuning::decode_sms` (SMs the
///        prefix level leaves to the suffix decode; -1 automatic, printed after the splits);
///        `--decode-fold n` sets `CascadeTuning::decode_fold` (-1 automatic; the choice is
///        printed last: "fold" or "merge", the decode beside the prefix and a merge launch);
///        `--page n` sets the tokens per page (16 by default); `--scatter` places the shared
///        prefix's pages in a random order of the pool (by default they are in id order, so
///        every KV tile of the prefix is one run of consecutive pages); `--stream n` plans a
///        one-split suffix decode again with `CascadeTuning::decode_kernel = kStreamed` (1) or
///        `kSplit` (0) (the streamed kernel takes no soft cap: then kept as planned).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "attnstate/cuda/cascade.hpp"
#include "attnstate/cuda/check.hpp"
#include "bench_util.cuh"
#if !defined(BENCH_CASCADE_NO_DECODE) && __has_include("attnstate/cuda/decode.hpp")
#include "attnstate/cuda/decode.hpp"
#define BENCH_CASCADE_HAS_DECODE 1
#else
#define BENCH_CASCADE_HAS_DECODE 0
#endif

namespace {

using namespace attnstate;

constexpr int kHeadDim = 128, kHeadsKv = 8, kHeadsQ = 32;
/// Tokens per page (`--page`; 16 by default, the ANCHORS.md setting).
int g_page = 16;
/// True: the shared prefix's pages in a random order of the pool (`--scatter`); false: in id
/// order.
bool g_scatter = false;
// --soft-cap: the logits soft cap of every level, and of the plain decode it is compared with
float g_soft_cap = 0.f;
constexpr double kTensorFlops = 790e12;  // bf16 dense tensor throughput of the H200 (wgmma)

/// ANCHORS.md: FlashInfer cascade (µs) and its prefix level (µs) per (prefix, suffix, batch).
struct Anchor {
  int prefix, suffix, batch;
  double cascade_us, plain_us, prefix_us;
};
const Anchor kAnchors[] = {
    {4096, 64, 16, 28.4, 100.4, 18.8},         {4096, 256, 128, 103.3, 772.4, 48.8},
    {32768, 64, 16, 62.4, 729.9, 51.7},        {32768, 256, 64, 158.8, 2941.9, 125.3},
    {32768, 256, 128, 289.1, 5839.7, 233.8},   {32768, 64, 256, 522.2, 11240.7, 455.4},
    {32768, 1024, 256, 741.9, 11559.4, 462.1},
};
const Anchor* find_anchor(int p, int s, int b) {
  for (const Anchor& a : kAnchors)
    if (a.prefix == p && a.suffix == s && a.batch == b) return &a;
  return nullptr;
}

template <class T>
T* dalloc(std::size_t n) {
  T* p = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  return p;
}
template <class T>
T* dupload(const std::vector<T>& h) {
  T* p = dalloc<T>(h.size());
  if (!h.empty())
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

struct Timer {
  cudaStream_t stream;
  void* flush = nullptr;
  std::size_t flush_bytes = 256ull << 20;  // > 4x the 60 MiB L2
  cudaEvent_t e0, e1;
  int reps;
  explicit Timer(cudaStream_t s, int r) : stream(s), reps(r) {
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    ATTNSTATE_CUDA_CHECK(cudaEventCreate(&e0));
    ATTNSTATE_CUDA_CHECK(cudaEventCreate(&e1));
  }
  /// Median µs of `f` with the L2 flushed (overwritten) before every call.
  template <class F>
  double median_us(F&& f) {
    f();  // warm-up
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return bench_util::event_median_us(
        stream, e0, e1, reps,
        [&](int i) { ATTNSTATE_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, stream)); },
        f);
  }
};

/// Device-to-device copy bandwidth (bytes read + written per second).
double copy_bandwidth(cudaStream_t stream) {
  Timer t(stream, 10);
  return bench_util::copy_bandwidth(stream, 2ull << 30,
                                    [&](auto&& copy) { return t.median_us(copy); });
}

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Row {
  int prefix, suffix, batch;
  double cascade_us, prefix_us, suffix_us, merge_us, decode_us, flat_us, floor_us, fi_us;
  double max_diff, mma_us, staged_us;
  int prefix_tile, prefix_splits, suffix_tile, suffix_splits, decode_sms;
  bool decode_fold;
};

/// Optional exploration: prefix-level time for each (tile_rows, chunk) override.
struct Explore {
  bool on = false;
  std::vector<std::string> lines;
};

/// `CascadeTuning::decode_sms` of every plan (`--decode-sms`; -1 automatic).
int g_decode_sms = -1;
/// `CascadeTuning::decode_fold` of every plan (`--decode-fold`; -1 automatic).
int g_decode_fold = -1;
/// `--stream n`: a one-split decode level planned on the streamed (1) or the split (0) kernel
/// (`CascadeTuning::decode_kernel`; -1: the automatic choice).
int g_stream = -1;

Row run_shape(int prefix, int suffix, int batch, int num_sms, double bw, cudaStream_t stream,
              int reps, bool lean, Explore* explore = nullptr) {
  Row row{};
  row.prefix = prefix;
  row.suffix = suffix;
  row.batch = batch;
  const int pp = (prefix + g_page - 1) / g_page, sp = (suffix + g_page - 1) / g_page;
  const std::int64_t num_pages = pp + static_cast<std::int64_t>(batch) * sp;
  const std::int64_t page_elems = static_cast<std::int64_t>(g_page) * kHeadsKv * kHeadDim;
  const std::size_t pool = static_cast<std::size_t>(num_pages * page_elems);
  std::uint16_t* k = dalloc<std::uint16_t>(pool);
  std::uint16_t* v = dalloc<std::uint16_t>(pool);
  const std::size_t qn = static_cast<std::size_t>(batch) * kHeadsQ * kHeadDim;
  std::uint16_t* q = dalloc<std::uint16_t>(qn);
  bench_util::fill_bf16<<<1024, 256, 0, stream>>>(k, pool, 1);
  bench_util::fill_bf16<<<1024, 256, 0, stream>>>(v, pool, 2);
  bench_util::fill_bf16<<<256, 256, 0, stream>>>(q, qn, 3);
  ATTNSTATE_CHECK_LAUNCH(stream, "fill_bf16");

  // page placement: prefix pages first in id order (`--scatter`: in a random order), suffix
  // pages interleaved
  std::vector<std::int32_t> prefix_ids(pp), suffix_ids(static_cast<std::size_t>(batch) * sp);
  for (int i = 0; i < pp; ++i) prefix_ids[i] = i;
  if (g_scatter) std::shuffle(prefix_ids.begin(), prefix_ids.end(), std::mt19937(12345));
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < sp; ++j)
      suffix_ids[static_cast<std::size_t>(b) * sp + j] = pp + j * batch + b;

  // two-level cascade
  std::vector<std::int32_t> l0_req{0, batch}, l0_pind{0, pp}, l0_len{prefix};
  std::vector<std::int32_t> l1_req(batch + 1), l1_pind(batch + 1), l1_len(batch, suffix);
  for (int b = 0; b <= batch; ++b) {
    l1_req[b] = b;
    l1_pind[b] = b * sp;
  }
  // one level: each request's concatenated pages
  std::vector<std::int32_t> f_pind(batch + 1), f_ids, f_len(batch, prefix + suffix);
  for (int b = 0; b < batch; ++b) {
    f_pind[b] = static_cast<std::int32_t>(f_ids.size());
    f_ids.insert(f_ids.end(), prefix_ids.begin(), prefix_ids.end());
    f_ids.insert(f_ids.end(), suffix_ids.begin() + static_cast<std::ptrdiff_t>(b) * sp,
                 suffix_ids.begin() + static_cast<std::ptrdiff_t>(b + 1) * sp);
  }
  f_pind[batch] = static_cast<std::int32_t>(f_ids.size());
  if (prefix % g_page != 0) {
    std::fprintf(stderr, "prefix must be a multiple of the page size\n");
    std::exit(2);
  }

  auto host_level = [](const std::vector<std::int32_t>& req, const std::vector<std::int32_t>& pind,
                       const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& len) {
    CascadeLevel l;
    l.num_segments = static_cast<std::int64_t>(len.size());
    l.request_indptr = req.data();
    l.page_indptr = pind.data();
    l.page_indices = ids.data();
    l.seg_lens = len.data();
    return l;
  };
  auto dev_level = [](const CascadeLevel& h, std::int64_t n_ids, std::vector<void*>& owned) {
    CascadeLevel d = h;
    const std::int64_t ns = h.num_segments;
    auto up = [&](const std::int32_t* p, std::int64_t n) {
      std::int32_t* dp = dupload(std::vector<std::int32_t>(p, p + n));
      owned.push_back(dp);
      return dp;
    };
    d.request_indptr = up(h.request_indptr, ns + 1);
    d.page_indptr = up(h.page_indptr, ns + 1);
    d.page_indices = up(h.page_indices, n_ids);
    d.seg_lens = up(h.seg_lens, ns);
    return d;
  };
  std::vector<void*> owned;
  const CascadeLevel h_levels[2] = {host_level(l0_req, l0_pind, prefix_ids, l0_len),
                                    host_level(l1_req, l1_pind, suffix_ids, l1_len)};
  const CascadeLevel d_levels[2] = {
      dev_level(h_levels[0], pp, owned),
      dev_level(h_levels[1], static_cast<std::int64_t>(batch) * sp, owned)};
  const CascadeLevel h_flat = host_level(l1_req, f_pind, f_ids, f_len);
  const CascadeLevel d_flat = dev_level(h_flat, static_cast<std::int64_t>(f_ids.size()), owned);

  cuda::CascadeShape shape;
  shape.batch = batch;
  shape.q_len = 1;
  shape.heads_q = kHeadsQ;
  shape.heads_kv = kHeadsKv;
  shape.head_dim = kHeadDim;
  shape.page_size = g_page;
  shape.num_pages = num_pages;
  shape.dtype = DType::kBF16;
  cuda::CascadeTuning tuning;
  tuning.decode_sms = g_decode_sms;
  tuning.decode_fold = g_decode_fold;
  CascadeOptions copt;
  copt.variant.logits_soft_cap = g_soft_cap;
  cuda::CascadePlan plan = cuda::plan_cascade(shape, h_levels, 2, copt, num_sms, tuning);
  if (g_stream >= 0 && plan.level(1).decode && plan.last_decode().splits().max_splits == 1 &&
      (g_stream == 0 || g_soft_cap == 0.f)) {
    tuning.decode_kernel = g_stream == 1 ? DecodeKernel::kStreamed : DecodeKernel::kSplit;
    plan = cuda::plan_cascade(shape, h_levels, 2, copt, num_sms, tuning);
  }
  const cuda::CascadePlan flat_plan = cuda::plan_cascade(shape, &h_flat, 1, copt, num_sms);
  cuda::CascadeTuning mma_only;
  mma_only.kernel = cuda::CascadeKernel::kMma;
  const cuda::CascadePlan mma_plan =
      cuda::plan_cascade(shape, h_levels, 2, copt, num_sms, mma_only);
  row.prefix_tile = plan.level(0).tile_rows;
  row.prefix_splits = plan.level(0).max_splits;
  row.suffix_tile = plan.level(1).tile_rows;
  row.suffix_splits = plan.level(1).max_splits;
  row.decode_sms = plan.decode_sms();
  row.decode_fold = plan.decode_fold();
  std::size_t ws_bytes =
      std::max({plan.workspace_bytes(), flat_plan.workspace_bytes(), mma_plan.workspace_bytes()});
  if (explore && explore->on) ws_bytes = std::max<std::size_t>(ws_bytes, 512ull << 20);
  void* ws = dalloc<std::uint8_t>(ws_bytes);

  PagedKvCache kv;
  kv.k = k;
  kv.v = v;
  kv.dtype = DType::kBF16;
  kv.layout = KvLayout::kNHD;
  kv.num_pages = num_pages;
  kv.page_size = g_page;
  kv.heads_kv = kHeadsKv;
  kv.head_dim = kHeadDim;
  kv.space = MemorySpace::kDevice;
  const ConstTensorView qv =
      make_tensor_view(q, DType::kBF16, {batch, 1, kHeadsQ, kHeadDim}, MemorySpace::kDevice);
  std::uint16_t* o_c = dalloc<std::uint16_t>(qn);
  std::uint16_t* o_d = dalloc<std::uint16_t>(qn);
  float* lse = dalloc<float>(static_cast<std::size_t>(batch) * kHeadsQ);
  const StateView out_c = make_state_view(o_c, DType::kBF16, lse, batch, kHeadsQ, kHeadDim,
                                          LseBase::kNatural, MemorySpace::kDevice);
  const StateView out_d = make_state_view(o_d, DType::kBF16, lse, batch, kHeadsQ, kHeadDim,
                                          LseBase::kNatural, MemorySpace::kDevice);

  Timer timer(stream, reps);
  row.cascade_us = timer.median_us(
      [&] { cuda::run_cascade(plan, qv, kv, d_levels, 2, out_c, ws, ws_bytes, stream); });
  row.prefix_us = timer.median_us(
      [&] { cuda::run_cascade_level(plan, 0, qv, kv, d_levels[0], ws, ws_bytes, stream); });
  row.suffix_us = timer.median_us(
      [&] { cuda::run_cascade_level(plan, 1, qv, kv, d_levels[1], ws, ws_bytes, stream); });
  // staged: every level, then the merge launch, as separate calls (no overlap, no fold)
  row.staged_us = timer.median_us([&] {
    for (int l = 0; l < 2; ++l)
      cuda::run_cascade_level(plan, l, qv, kv, d_levels[l], ws, ws_bytes, stream);
    cuda::run_cascade_merge(plan, out_c, ws, ws_bytes, stream);
  });
  row.mma_us = -1;
  if (!lean) {
    row.mma_us = timer.median_us(
        [&] { cuda::run_cascade(mma_plan, qv, kv, d_levels, 2, out_c, ws, ws_bytes, stream); });
  }
  row.merge_us =
      timer.median_us([&] { cuda::run_cascade_merge(plan, out_c, ws, ws_bytes, stream); });
  if (explore && explore->on) {
    for (auto kernel : {cuda::CascadeKernel::kMma, cuda::CascadeKernel::kWgmma})
      for (int tile : {64, 128})
        for (int chunk : {0, 1024, 2048, 4096, 8192}) {
          cuda::CascadeTuning t;
          t.tile_rows = tile;
          t.chunk = chunk;
          t.kernel = kernel;
          const cuda::CascadePlan ep = cuda::plan_cascade(shape, h_levels, 2, copt, num_sms, t);
          if (ep.workspace_bytes() > ws_bytes) continue;
          const double us = timer.median_us(
              [&] { cuda::run_cascade_level(ep, 0, qv, kv, d_levels[0], ws, ws_bytes, stream); });
          char buf[160];
          std::snprintf(buf, sizeof buf,
                        "  prefix %5d batch %3d: %-5s tile %3d chunk %5d (splits %2d): %8.1f us "
                        "(%.0f TFLOP/s)",
                        prefix, batch, kernel == cuda::CascadeKernel::kMma ? "mma" : "wgmma", tile,
                        ep.level(0).chunk, ep.level(0).max_splits, us,
                        4.0 * batch * kHeadsQ * double(prefix) * kHeadDim / (us * 1e6));
          explore->lines.push_back(buf);
        }
  }
  cuda::run_cascade(plan, qv, kv, d_levels, 2, out_c, ws, ws_bytes, stream);
  row.flat_us = -1;
  if (!lean)
    row.flat_us = timer.median_us(
        [&] { cuda::run_cascade(flat_plan, qv, kv, &d_flat, 1, out_d, ws, ws_bytes, stream); });
  row.decode_us = -1;
#if BENCH_CASCADE_HAS_DECODE
  if (!lean) try {
      DecodeProblem prob;
      prob.batch = batch;
      prob.q_len = 1;
      prob.heads_q = kHeadsQ;
      prob.heads_kv = kHeadsKv;
      prob.head_dim = kHeadDim;
      prob.q_dtype = prob.kv_dtype = DType::kBF16;
      DecodeOptions dopt;
      dopt.variant.logits_soft_cap = g_soft_cap;
      const cuda::DecodePlan dplan = cuda::plan_decode(prob, f_len.data(), dopt, num_sms);
      const std::size_t dws_bytes = dplan.workspace_bytes();
      void* dws = dalloc<std::uint8_t>(dws_bytes);
      cuda::init_decode_workspace(dplan, dws, dws_bytes, stream);
      PagedKvCache dkv = kv;
      dkv.page_indptr = static_cast<const std::int32_t*>(d_flat.page_indptr);
      dkv.page_indices = static_cast<const std::int32_t*>(d_flat.page_indices);
      dkv.seq_lens = static_cast<const std::int32_t*>(d_flat.seg_lens);
      dkv.batch = batch;
      row.decode_us =
          timer.median_us([&] { cuda::run_decode(dplan, qv, dkv, out_d, dws, dws_bytes, stream); });
      cuda::run_decode(dplan, qv, dkv, out_d, dws, dws_bytes, stream);
      ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
      ATTNSTATE_CUDA_CHECK(cudaFree(dws));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "plain decode failed (%s): comparing with the one-level cascade\n",
                   e.what());
      row.decode_us = -1;
    }
#endif
  // the reference output of the comparison: plain decode if built, else the one-level cascade
  if (row.decode_us < 0)
    cuda::run_cascade(flat_plan, qv, kv, &d_flat, 1, out_d, ws, ws_bytes, stream);
  ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<std::uint16_t> hc(qn), hd(qn);
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(hc.data(), o_c, qn * 2, cudaMemcpyDeviceToHost));
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(hd.data(), o_d, qn * 2, cudaMemcpyDeviceToHost));
  double md = 0;
  for (std::size_t i = 0; i < qn; ++i) {
    const double d = std::fabs(double(bf16_to_float(hc[i])) - double(bf16_to_float(hd[i])));
    md = std::isnan(d) ? INFINITY : std::max(md, d);
  }
  row.max_diff = md;

  // floor: per level max(bytes / bandwidth, FLOP / tensor throughput)
  const double kv_tok = 2.0 * kHeadsKv * kHeadDim * 2;  // K and V bytes per token
  const double pre_bytes = prefix * kv_tok, suf_bytes = double(batch) * suffix * kv_tok;
  const double flop_tok = 4.0 * kHeadsQ * kHeadDim;  // QKᵀ + PV per (query, key)
  const double pre_flop = double(batch) * prefix * flop_tok;
  const double suf_flop = double(batch) * suffix * flop_tok;
  row.floor_us = 1e6 * (std::max(pre_bytes / bw, pre_flop / kTensorFlops) +
                        std::max(suf_bytes / bw, suf_flop / kTensorFlops));
  const Anchor* a = find_anchor(prefix, suffix, batch);
  row.fi_us = a ? a->cascade_us : -1;

  for (void* p : owned) ATTNSTATE_CUDA_CHECK(cudaFree(p));
  for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q), ws,
                  static_cast<void*>(o_c), static_cast<void*>(o_d), static_cast<void*>(lse)})
    ATTNSTATE_CUDA_CHECK(cudaFree(p));
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv, only;
  bool quick = false, lean = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc)
      csv = argv[++i];
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--decode-sms") && i + 1 < argc)
      g_decode_sms = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--decode-fold") && i + 1 < argc)
      g_decode_fold = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--stream") && i + 1 < argc)
      g_stream = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--lean"))
      lean = true;
    else if (!std::strcmp(argv[i], "--page") && i + 1 < argc)
      g_page = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--scatter"))
      g_scatter = true;
    else if (!std::strcmp(argv[i], "--soft-cap") && i + 1 < argc)
      g_soft_cap = static_cast<float>(std::atof(argv[++i]));
    else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc)
      only = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--csv path] [--quick] [--lean] [--shapes P:S:B,...] "
                   "[--decode-sms n] [--decode-fold n] [--page n] [--scatter] [--soft-cap c]\n",
                   argv[0]);
      return 2;
    }
  }
  if (g_page < 1) {
    std::fprintf(stderr, "--page must be positive\n");
    return 2;
  }
  try {
    const bench_util::Device device = bench_util::current_device();
    const int num_sms = device.num_sms;
    const cudaDeviceProp& prop = device.prop;
    cudaStream_t stream;
    ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const double bw = copy_bandwidth(stream);
    std::printf(
        "device %s, %d SMs; copy bandwidth %.0f GB/s (read + written); floor uses it and "
        "%.0f TFLOP/s; pages of %d tokens, prefix pages %s; soft cap %g (0: none)\n",
        prop.name, num_sms, bw / 1e9, kTensorFlops / 1e12, g_page,
        g_scatter ? "scattered" : "in id order", g_soft_cap);
    std::printf("plain decode: %s\n", BENCH_CASCADE_HAS_DECODE
                                          ? "the library's split-KV decode (run_decode)"
                                          : "not built; 'flat' = the cascade kernel, one level");
    struct Shape {
      int p, s, b;
    };
    std::vector<Shape> shapes;
    for (std::size_t at = 0; at < only.size();) {
      Shape sh{};
      int used = 0;
      if (std::sscanf(only.c_str() + at, "%d:%d:%d%n", &sh.p, &sh.s, &sh.b, &used) != 3 ||
          sh.p < 0 || sh.s < 0 || sh.b < 1) {
        std::fprintf(stderr, "bad --shapes list: %s\n", only.c_str());
        return 2;
      }
      shapes.push_back(sh);
      at += static_cast<std::size_t>(used) + 1;  // past the comma
    }
    if (only.empty())
      for (const Anchor& a : kAnchors) shapes.push_back({a.prefix, a.suffix, a.batch});
    if (!quick && only.empty())
      for (int p : {4096, 32768})
        for (int s : {64, 256, 1024})
          for (int b : {16, 64, 256})
            if (!find_anchor(p, s, b)) shapes.push_back({p, s, b});
    const int reps = quick ? 7 : 25;
    std::vector<Row> rows;
    std::printf(
        "%6s %5s %5s | %9s %9s %9s %9s %6s %9s %8s | %10s %9s %7s | %8s %6s | %8s %6s | %9s | "
        "%s\n",
        "prefix", "suf", "batch", "cascade", "staged", "mma-only", "prefix", "TF/s", "suffix",
        "merge", "decode", "flat", "x-dec", "floor", "x-flr", "FI", "x-FI", "maxdiff",
        "tiles/splits");
    Explore explore;
    for (const Shape& sh : shapes) {
      explore.on = !quick && !lean && only.empty() && sh.s == 256 &&
                   ((sh.p == 32768 && sh.b == 128) || (sh.p == 4096 && sh.b == 16) ||
                    (sh.p == 32768 && sh.b == 16));
      const Row r = run_shape(sh.p, sh.s, sh.b, num_sms, bw, stream, reps, lean, &explore);
      rows.push_back(r);
      // prefix-level tensor throughput: QKᵀ + PV over every (query row, prefix key) pair
      const double prefix_tflops =
          4.0 * r.batch * kHeadsQ * double(r.prefix) * kHeadDim / (r.prefix_us * 1e6);
      std::printf(
          "%6d %5d %5d | %9.1f %9.1f %9.1f %9.1f %6.0f %9.1f %8.1f | %10.1f %9.1f %7.1f | %8.1f "
          "%6.2f | %8.1f %6.2f | %9.2e | %d/%d %d/%d %dsm %s\n",
          r.prefix, r.suffix, r.batch, r.cascade_us, r.staged_us, r.mma_us, r.prefix_us,
          prefix_tflops, r.suffix_us, r.merge_us, r.decode_us, r.flat_us,
          (r.decode_us > 0 ? r.decode_us : r.flat_us) / r.cascade_us, r.floor_us,
          r.cascade_us / r.floor_us, r.fi_us, r.fi_us > 0 ? r.fi_us / r.cascade_us : 0.0,
          r.max_diff, r.prefix_tile, r.prefix_splits, r.suffix_tile, r.suffix_splits, r.decode_sms,
          r.decode_fold ? "fold" : "merge");
      std::fflush(stdout);
    }
    if (!explore.lines.empty()) {
      std::printf("prefix level by row tile and split size (chunk 0 = automatic):\n");
      for (const std::string& l : explore.lines) std::printf("%s\n", l.c_str());
    }
    if (!csv.empty()) {
      FILE* f = bench_util::open_csv(
          csv,
          "prefix,suffix,batch,cascade_us,prefix_level_us,suffix_level_us,merge_us,"
          "plain_decode_us,flat_cascade_us,speedup_vs_plain,floor_us,ratio_to_floor,"
          "flashinfer_us,speedup_vs_flashinfer,max_abs_diff,prefix_tile,"
          "prefix_splits,suffix_tile,suffix_splits,copy_bw_gbps,mma_only_us,staged_us,"
          "decode_sms,decode_fold\n");
      if (!f) return 1;
      for (const Row& r : rows)
        std::fprintf(f,
                     "%d,%d,%d,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.3f,%.2f,%.3f,%.1f,%.3f,%.3e,%d,"
                     "%d,%d,%d,%.0f,%.2f,%.2f,%d,%d\n",
                     r.prefix, r.suffix, r.batch, r.cascade_us, r.prefix_us, r.suffix_us,
                     r.merge_us, r.decode_us, r.flat_us,
                     (r.decode_us > 0 ? r.decode_us : r.flat_us) / r.cascade_us, r.floor_us,
                     r.cascade_us / r.floor_us, r.fi_us, r.fi_us > 0 ? r.fi_us / r.cascade_us : 0.0,
                     r.max_diff, r.prefix_tile, r.prefix_splits, r.suffix_tile, r.suffix_splits,
                     bw / 1e9, r.mma_us, r.staged_us, r.decode_sms, r.decode_fold ? 1 : 0);
      std::fclose(f);
    }
    int bad = 0;
    for (const Row& r : rows)
      if (!(r.max_diff < 2e-2)) ++bad;
    if (bad) std::printf("FAILED: %d shapes where cascade and plain attention disagree\n", bad);
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cascade: %s\n", e.what());
    return 1;
  }
}
