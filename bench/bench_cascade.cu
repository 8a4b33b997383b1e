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
///        `kSplit` (0) (the streamed kernel takes no fp8 pool: then kept as planned);
///        `--ws-variant n`, `--tile-rows n` and `--chunk n` set `CascadeTuning::ws_variant`
///        (-1 automatic), `tile_rows` and `chunk` (0 automatic) of the cascade's plans.
///        `--dtype f16|bf16` (queries, output and KV), `--head-dim 64|128|256`, `--window w`
///        (`variant.window_left` of the cascade and of the plain decode), `--soft-cap c` and
///        `--kv-dtype e4m3|e5m2` (an fp8 KV pool, one scale per tensor, queries in `--dtype`)
///        change what every shape runs; `--sections` runs instead a fixed list of sections
///        (bf16 D128, f16, D64, D256, soft cap 50, window 4096, fp8 e4m3 KV) on 32k/256/128 and
///        4k/64/16 (or `--shapes`), each row with the cascade, its floor, the plain decode of
///        the same batch, their largest difference against a tolerance of the dtypes, and the
///        level kernels of the plan. A cascade the planner refuses (`kNotSupported`) is a
///        `refused: <message>` row beside the plain decode's time, not a failure. The floor
///        counts the keys inside the rows' window and the pool's bytes per element (1 for fp8).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
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

constexpr int kHeadsKv = 8, kHeadsQ = 32;
/// Tokens per page (`--page`; 16 by default, the ANCHORS.md setting).
int g_page = 16;
/// True: the shared prefix's pages in a random order of the pool (`--scatter`); false: in id
/// order.
bool g_scatter = false;
constexpr double kTensorFlops = 790e12;  // bf16 dense tensor throughput of the H200 (wgmma)
/// An fp8 pool stores the values times this (so they span [-64, 64), well inside e4m3's 448),
/// and is read with the per-tensor scale 1 / kFp8Mul.
constexpr float kFp8Mul = 64.f;

/// What every shape of a run computes besides its lengths: the dtypes, the head dim and the
/// variant (the flags; `--sections` sets one per section).
struct Config {
  const char* name = "bf16 D128";
  DType dtype = DType::kBF16;     ///< Queries and output (and the KV pool unless fp8).
  DType kv_dtype = DType::kBF16;  ///< The KV pool: `dtype`, or e4m3 / e5m2.
  int head_dim = 128;
  float soft_cap = 0.f;             ///< Logits soft cap of every level and of the decode.
  std::int64_t window = kNoWindow;  ///< `variant.window_left` (-1: none).
  bool is_default() const {
    return dtype == DType::kBF16 && kv_dtype == DType::kBF16 && head_dim == 128 &&
           soft_cap == 0.f && window == kNoWindow;
  }
  /// Largest difference allowed between the cascade and the plain decode: the output's rounding
  /// (f16 keeps 3 more mantissa bits than bf16), doubled over an fp8 pool (a kernel may round
  /// the probabilities to fp8 for its PV product).
  double tolerance() const {
    const double t = dtype == DType::kF16 ? 1e-2 : 2e-2;
    return is_fp8(kv_dtype) ? 2 * t : t;
  }
};
Config g_cfg;

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

/// Rewrites `n` bf16 values of `src` as `T` times `mul` in `dst`. `dst` may be `src` for a 2-byte
/// `T`: each thread reads its element before writing it.
template <class T>
__global__ void convert_bf16(const std::uint16_t* src, T* dst, std::size_t n, float mul) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = from_float<T>(to_float(bfloat16_t{src[i]}) * mul);
}

/// Fills `n` values of dtype `dt` at `p` with `fill_bf16`'s values of `seed` (so the bf16 runs
/// keep their inputs): f16 converted in place, fp8 times kFp8Mul through a bf16 buffer (random
/// finite fp8 bytes).
void fill(void* p, std::size_t n, DType dt, std::uint32_t seed, int grid, cudaStream_t stream) {
  std::uint16_t* src = dt == DType::kBF16 || dt == DType::kF16 ? static_cast<std::uint16_t*>(p)
                                                               : dalloc<std::uint16_t>(n);
  bench_util::fill_bf16<<<grid, 256, 0, stream>>>(src, n, seed);
  ATTNSTATE_CHECK_LAUNCH(stream, "fill_bf16");
  if (dt == DType::kBF16) return;
  if (dt == DType::kF16)
    convert_bf16<<<grid, 256, 0, stream>>>(src, static_cast<half_t*>(p), n, 1.f);
  else if (dt == DType::kE4M3)
    convert_bf16<<<grid, 256, 0, stream>>>(src, static_cast<float8_e4m3_t*>(p), n, kFp8Mul);
  else
    convert_bf16<<<grid, 256, 0, stream>>>(src, static_cast<float8_e5m2_t*>(p), n, kFp8Mul);
  ATTNSTATE_CHECK_LAUNCH(stream, "convert_bf16");
  if (src != p) {
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
    ATTNSTATE_CUDA_CHECK(cudaFree(src));
  }
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
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  ~Timer() {  // one per shape: a run of many shapes must not keep their flush buffers
    cudaFree(flush);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
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

/// A 16-bit output element (bf16 or f16) as a float.
float out_to_float(std::uint16_t b, DType dt) {
  return dt == DType::kF16 ? to_float(half_t{b}) : to_float(bfloat16_t{b});
}

/// The cascade's shape with the queries in `q` and the pool in `kv`. Where `CascadeShape` has a
/// `kv_dtype` of its own it takes the pool's; else its one dtype is the pool's, so a pool of
/// another dtype than the queries (fp8) meets the planner's dtype check, not a silent bf16 run.
template <class S>
auto set_shape_dtypes(S& s, DType q, DType kv, int) -> decltype(s.kv_dtype = kv, void()) {
  s.dtype = q;
  s.kv_dtype = kv;
}
template <class S>
void set_shape_dtypes(S& s, DType /*q*/, DType kv, long) {
  s.dtype = kv;
}

/// The level kernels of `plan`, short: `L<l>:<kernel>/<row tile>r/<splits>s` per level, a decode
/// level as `L<l>:decode-<split|streamed>/<splits>s/<fold|merge>`.
std::string plan_kernels(const cuda::CascadePlan& plan) {
  std::string out;
  for (int l = 0; l < plan.num_levels(); ++l) {
    const cuda::CascadeLevelPlan& lp = plan.level(l);
    out += (l ? " L" : "L") + std::to_string(l) + ":";
    if (lp.decode) {
      out += plan.last_decode().kernel() == DecodeKernel::kStreamed ? "decode-streamed"
                                                                    : "decode-split";
      out += "/" + std::to_string(lp.max_splits) + "s/" + (plan.decode_fold() ? "fold" : "merge");
      continue;
    }
    out += lp.kernel == cuda::CascadeLevelKernel::kWarpSpecialized ? "ws"
           : lp.kernel == cuda::CascadeLevelKernel::kWgmma         ? "wgmma"
                                                                   : "mma";
    out += "/" + std::to_string(lp.tile_rows) + "r/" + std::to_string(lp.max_splits) + "s";
  }
  return out;
}

struct Row {
  int prefix, suffix, batch;
  double cascade_us, prefix_us, suffix_us, merge_us, decode_us, flat_us, floor_us, fi_us;
  double max_diff, mma_us, staged_us;
  int prefix_tile, prefix_splits, suffix_tile, suffix_splits, decode_sms;
  bool decode_fold;
  Config cfg;
  std::string kernels;    ///< `plan_kernels` of the cascade's plan.
  std::string plan_text;  ///< The plan's `to_string`.
  /// Why the cascade did not run: the planner's (or a run's) `kNotSupported` message.
  std::string refused;
  std::string error;           ///< Another library error of the cascade (a failure).
  std::string decode_refused;  ///< Why the plain decode did not run.
  /// The cascade ran (was neither refused nor failed with a library error).
  bool ran() const { return refused.empty() && error.empty(); }
  /// The cascade ran and matched its reference within `cfg.tolerance()`.
  bool ok() const { return ran() && max_diff < cfg.tolerance(); }
  /// The refusal or the error.
  const std::string& message() const { return refused.empty() ? error : refused; }
  const char* status() const {
    return !refused.empty() ? "refused" : !error.empty() ? "error" : ok() ? "ok" : "FAIL";
  }
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
/// `CascadeTuning::ws_variant` of every plan (`--ws-variant`; -1 automatic).
int g_ws_variant = -1;
/// `CascadeTuning::tile_rows` of every plan (`--tile-rows`; 0 automatic).
int g_tile_rows = 0;
/// `CascadeTuning::chunk` of every plan (`--chunk`; 0 automatic): keys per split of the shared
/// levels.
int g_chunk = 0;

/// Times one shape under `cfg`. `lean`: the cascade, its levels and the merge only (plus the
/// plain decode when `decode`).
Row run_shape(int prefix, int suffix, int batch, int num_sms, double bw, cudaStream_t stream,
              int reps, bool lean, bool decode, const Config& cfg, Explore* explore = nullptr) {
  Row row{};
  row.prefix = prefix;
  row.suffix = suffix;
  row.batch = batch;
  row.cfg = cfg;
  row.max_diff = -1;
  const int head_dim = cfg.head_dim;
  const std::size_t kv_elem = size_of(cfg.kv_dtype);
  const int pp = (prefix + g_page - 1) / g_page, sp = (suffix + g_page - 1) / g_page;
  const std::int64_t num_pages = pp + static_cast<std::int64_t>(batch) * sp;
  const std::int64_t page_elems = static_cast<std::int64_t>(g_page) * kHeadsKv * head_dim;
  const std::size_t pool = static_cast<std::size_t>(num_pages * page_elems);
  std::uint8_t* k = dalloc<std::uint8_t>(pool * kv_elem);
  std::uint8_t* v = dalloc<std::uint8_t>(pool * kv_elem);
  const std::size_t qn = static_cast<std::size_t>(batch) * kHeadsQ * head_dim;
  std::uint16_t* q = dalloc<std::uint16_t>(qn);
  fill(k, pool, cfg.kv_dtype, 1, 1024, stream);
  fill(v, pool, cfg.kv_dtype, 2, 1024, stream);
  fill(q, qn, cfg.dtype, 3, 256, stream);

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
  shape.head_dim = head_dim;
  shape.page_size = g_page;
  shape.num_pages = num_pages;
  set_shape_dtypes(shape, cfg.dtype, cfg.kv_dtype, 0);
  cuda::CascadeTuning tuning;
  tuning.decode_sms = g_decode_sms;
  tuning.decode_fold = g_decode_fold;
  tuning.ws_variant = g_ws_variant;
  tuning.tile_rows = g_tile_rows;
  tuning.chunk = g_chunk;
  CascadeOptions copt;
  copt.variant.logits_soft_cap = cfg.soft_cap;
  copt.variant.window_left = cfg.window;
  // A library error of the cascade (planning or a run's checks): `kNotSupported` makes the row
  // `refused` (what the library does not run yet), any other but a CUDA error a failed row; both
  // leave the plain decode to run.
  const auto cascade_error = [&](const Error& e) {
    if (e.status() == Status::kCudaError) throw;
    (e.status() == Status::kNotSupported ? row.refused : row.error) = e.what();
  };
  cuda::CascadePlan plan, flat_plan, mma_plan;
  try {
    plan = cuda::plan_cascade(shape, h_levels, 2, copt, num_sms, tuning);
    if (g_stream >= 0 && plan.level(1).decode && plan.last_decode().splits().max_splits == 1 &&
        (g_stream == 0 || !is_fp8(cfg.kv_dtype))) {
      tuning.decode_kernel = g_stream == 1 ? DecodeKernel::kStreamed : DecodeKernel::kSplit;
      plan = cuda::plan_cascade(shape, h_levels, 2, copt, num_sms, tuning);
    }
    flat_plan = cuda::plan_cascade(shape, &h_flat, 1, copt, num_sms);
    cuda::CascadeTuning mma_only;
    mma_only.kernel = cuda::CascadeKernel::kMma;
    mma_plan = cuda::plan_cascade(shape, h_levels, 2, copt, num_sms, mma_only);
    row.prefix_tile = plan.level(0).tile_rows;
    row.prefix_splits = plan.level(0).max_splits;
    row.suffix_tile = plan.level(1).tile_rows;
    row.suffix_splits = plan.level(1).max_splits;
    row.decode_sms = plan.decode_sms();
    row.decode_fold = plan.decode_fold();
    row.kernels = plan_kernels(plan);
    row.plan_text = cuda::to_string(plan);
  } catch (const Error& e) {
    cascade_error(e);
  }
  const bool cascade = row.refused.empty() && row.error.empty();
  std::size_t ws_bytes = 0;
  if (cascade)
    ws_bytes =
        std::max({plan.workspace_bytes(), flat_plan.workspace_bytes(), mma_plan.workspace_bytes()});
  if (cascade && explore && explore->on) ws_bytes = std::max<std::size_t>(ws_bytes, 512ull << 20);
  void* ws = dalloc<std::uint8_t>(ws_bytes);

  PagedKvCache kv;
  kv.k = k;
  kv.v = v;
  kv.dtype = cfg.kv_dtype;
  if (is_fp8(cfg.kv_dtype)) kv.k_scale = kv.v_scale = KvScale::per_tensor(1.f / kFp8Mul);
  kv.layout = KvLayout::kNHD;
  kv.num_pages = num_pages;
  kv.page_size = g_page;
  kv.heads_kv = kHeadsKv;
  kv.head_dim = head_dim;
  kv.space = MemorySpace::kDevice;
  const ConstTensorView qv =
      make_tensor_view(q, cfg.dtype, {batch, 1, kHeadsQ, head_dim}, MemorySpace::kDevice);
  std::uint16_t* o_c = dalloc<std::uint16_t>(qn);
  std::uint16_t* o_d = dalloc<std::uint16_t>(qn);
  float* lse = dalloc<float>(static_cast<std::size_t>(batch) * kHeadsQ);
  const StateView out_c = make_state_view(o_c, cfg.dtype, lse, batch, kHeadsQ, head_dim,
                                          LseBase::kNatural, MemorySpace::kDevice);
  const StateView out_d = make_state_view(o_d, cfg.dtype, lse, batch, kHeadsQ, head_dim,
                                          LseBase::kNatural, MemorySpace::kDevice);

  Timer timer(stream, reps);
  row.cascade_us = row.prefix_us = row.suffix_us = row.staged_us = row.merge_us = -1;
  row.mma_us = -1;
  row.flat_us = -1;
  if (cascade) try {
      row.cascade_us = timer.median_us(
          [&] { cuda::run_cascade(plan, qv, kv, d_levels, 2, out_c, ws, ws_bytes, stream); });
      // the stages alone (a windowed plan's shared level runs only inside run_cascade: -1)
      if (plan.window_left() < 0) {
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
      }
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
              const double us = timer.median_us([&] {
                cuda::run_cascade_level(ep, 0, qv, kv, d_levels[0], ws, ws_bytes, stream);
              });
              char buf[160];
              std::snprintf(buf, sizeof buf,
                            "  prefix %5d batch %3d: %-5s tile %3d chunk %5d (splits %2d): %8.1f "
                            "us (%.0f TFLOP/s)",
                            prefix, batch, kernel == cuda::CascadeKernel::kMma ? "mma" : "wgmma",
                            tile, ep.level(0).chunk, ep.level(0).max_splits, us,
                            4.0 * batch * kHeadsQ * double(prefix) * head_dim / (us * 1e6));
              explore->lines.push_back(buf);
            }
      }
      cuda::run_cascade(plan, qv, kv, d_levels, 2, out_c, ws, ws_bytes, stream);
      if (!lean)
        row.flat_us = timer.median_us(
            [&] { cuda::run_cascade(flat_plan, qv, kv, &d_flat, 1, out_d, ws, ws_bytes, stream); });
    } catch (const Error& e) {
      cascade_error(e);
    }
  row.decode_us = -1;
  (void)decode;  // unread without the decode
#if BENCH_CASCADE_HAS_DECODE
  if (decode) try {
      DecodeProblem prob;
      prob.batch = batch;
      prob.q_len = 1;
      prob.heads_q = kHeadsQ;
      prob.heads_kv = kHeadsKv;
      prob.head_dim = head_dim;
      prob.q_dtype = cfg.dtype;
      prob.kv_dtype = cfg.kv_dtype;
      DecodeOptions dopt;
      dopt.variant.logits_soft_cap = cfg.soft_cap;
      dopt.variant.window_left = cfg.window;
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
      row.decode_refused = e.what();
    }
#endif
  if (row.refused.empty() && row.error.empty()) {
    // the reference output of the comparison: plain decode if built, else the one-level cascade
    if (row.decode_us < 0)
      cuda::run_cascade(flat_plan, qv, kv, &d_flat, 1, out_d, ws, ws_bytes, stream);
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<std::uint16_t> hc(qn), hd(qn);
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(hc.data(), o_c, qn * 2, cudaMemcpyDeviceToHost));
    ATTNSTATE_CUDA_CHECK(cudaMemcpy(hd.data(), o_d, qn * 2, cudaMemcpyDeviceToHost));
    double md = 0;
    for (std::size_t i = 0; i < qn; ++i) {
      const double d = std::fabs(double(out_to_float(hc[i], cfg.dtype)) -
                                 double(out_to_float(hd[i], cfg.dtype)));
      md = std::isnan(d) ? INFINITY : std::max(md, d);
    }
    row.max_diff = md;
  }

  // floor: per level max(bytes / bandwidth, FLOP / tensor throughput), over the keys each level
  // holds inside the rows' window (the position of every row is total - 1: q_len 1)
  const std::int64_t first = window_begin(prefix + suffix - 1, cfg.window);
  const double pre_keys = prefix - std::min<std::int64_t>(first, prefix);
  const double suf_keys = suffix - std::max<std::int64_t>(0, first - prefix);
  const double kv_tok = 2.0 * kHeadsKv * head_dim * double(kv_elem);  // K and V bytes per token
  const double pre_bytes = pre_keys * kv_tok, suf_bytes = double(batch) * suf_keys * kv_tok;
  const double flop_tok = 4.0 * kHeadsQ * head_dim;  // QKᵀ + PV per (query, key)
  const double pre_flop = double(batch) * pre_keys * flop_tok;
  const double suf_flop = double(batch) * suf_keys * flop_tok;
  row.floor_us = 1e6 * (std::max(pre_bytes / bw, pre_flop / kTensorFlops) +
                        std::max(suf_bytes / bw, suf_flop / kTensorFlops));
  const Anchor* a = cfg.is_default() ? find_anchor(prefix, suffix, batch) : nullptr;
  row.fi_us = a ? a->cascade_us : -1;

  for (void* p : owned) ATTNSTATE_CUDA_CHECK(cudaFree(p));
  for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q), ws,
                  static_cast<void*>(o_c), static_cast<void*>(o_d), static_cast<void*>(lse)})
    ATTNSTATE_CUDA_CHECK(cudaFree(p));
  return row;
}

/// The sections of `--sections`: the bf16 / D 128 cascade and one change each.
std::vector<Config> sections() {
  std::vector<Config> out(7);
  out[1].name = "f16";
  out[1].dtype = out[1].kv_dtype = DType::kF16;
  out[2].name = "D64";
  out[2].head_dim = 64;
  out[3].name = "D256";
  out[3].head_dim = 256;
  out[4].name = "soft cap 50";
  out[4].soft_cap = 50.f;
  out[5].name = "window 4096";
  out[5].window = 4096;
  out[6].name = "fp8 e4m3 KV";
  out[6].kv_dtype = DType::kE4M3;
  return out;
}

/// One row of `--sections`: the cascade against its floor and the plain decode, the check of
/// their difference and the level kernels, or why the cascade did not run; then the plan.
void print_section_row(const Row& r) {
  char dec[32] = "-", xdec[16] = "-";
  if (r.decode_us > 0) std::snprintf(dec, sizeof dec, "%.1f", r.decode_us);
  if (r.decode_us > 0 && r.ran())
    std::snprintf(xdec, sizeof xdec, "%.2f", r.decode_us / r.cascade_us);
  if (r.ran())
    std::printf("%-12s %6d %5d %5d | %9.1f %9.1f %6.2f | %10s %7s | %9.2e %7s | %s\n", r.cfg.name,
                r.prefix, r.suffix, r.batch, r.cascade_us, r.floor_us, r.cascade_us / r.floor_us,
                dec, xdec, r.max_diff, r.status(), r.kernels.c_str());
  else
    std::printf("%-12s %6d %5d %5d | %9s %9.1f %6s | %10s %7s | %9s %7s | %s: %s\n", r.cfg.name,
                r.prefix, r.suffix, r.batch, "-", r.floor_us, "-", dec, xdec, "-", r.status(),
                r.status(), r.message().c_str());
  if (!r.decode_refused.empty())
    std::printf("    plain decode refused: %s\n", r.decode_refused.c_str());
  if (!r.plan_text.empty()) std::printf("    %s\n", r.plan_text.c_str());
}

/// `cfg` in words, for the run's header.
std::string describe(const Config& cfg) {
  std::string s = std::string("queries ") + to_string(cfg.dtype) + ", KV " +
                  to_string(cfg.kv_dtype) + ", head_dim " + std::to_string(cfg.head_dim);
  if (is_fp8(cfg.kv_dtype)) s += " (one scale per tensor, 1/" + std::to_string(int(kFp8Mul)) + ")";
  if (cfg.soft_cap != 0.f) s += ", soft cap " + std::to_string(cfg.soft_cap);
  if (cfg.window != kNoWindow) s += ", window_left " + std::to_string(cfg.window);
  return s;
}

/// A CSV field: quoted, its quotes doubled.
std::string csv_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv, only;
  bool quick = false, lean = false, run_sections = false;
  const auto dtype_arg = [&](const char* flag, const char* v, std::initializer_list<DType> ok) {
    for (DType d : ok)
      if (!std::strcmp(v, to_string(d))) return d;
    std::fprintf(stderr, "%s: expected", flag);
    for (DType d : ok) std::fprintf(stderr, " %s", to_string(d));
    std::fprintf(stderr, ", got %s\n", v);
    std::exit(2);
  };
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
    else if (!std::strcmp(argv[i], "--ws-variant") && i + 1 < argc)
      g_ws_variant = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--tile-rows") && i + 1 < argc)
      g_tile_rows = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--chunk") && i + 1 < argc)
      g_chunk = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--lean"))
      lean = true;
    else if (!std::strcmp(argv[i], "--page") && i + 1 < argc)
      g_page = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--scatter"))
      g_scatter = true;
    else if (!std::strcmp(argv[i], "--soft-cap") && i + 1 < argc)
      g_cfg.soft_cap = static_cast<float>(std::atof(argv[++i]));
    else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc)
      g_cfg.dtype = dtype_arg("--dtype", argv[++i], {DType::kF16, DType::kBF16});
    else if (!std::strcmp(argv[i], "--kv-dtype") && i + 1 < argc)
      g_cfg.kv_dtype = dtype_arg("--kv-dtype", argv[++i], {DType::kE4M3, DType::kE5M2});
    else if (!std::strcmp(argv[i], "--head-dim") && i + 1 < argc)
      g_cfg.head_dim = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--window") && i + 1 < argc)
      g_cfg.window = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--sections"))
      run_sections = true;
    else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc)
      only = argv[++i];
    else {
      std::fprintf(
          stderr,
          "usage: %s [--csv path] [--quick] [--lean] [--shapes P:S:B,...] "
          "[--decode-sms n] [--decode-fold n] [--ws-variant n] [--tile-rows n] [--chunk n] "
          "[--page n] [--scatter] [--soft-cap c] "
          "[--dtype f16|bf16] [--kv-dtype e4m3|e5m2] [--head-dim 64|128|256] "
          "[--window w] [--sections]\n",
          argv[0]);
      return 2;
    }
  }
  if (g_page < 1) {
    std::fprintf(stderr, "--page must be positive\n");
    return 2;
  }
  if (!is_fp8(g_cfg.kv_dtype)) g_cfg.kv_dtype = g_cfg.dtype;  // no --kv-dtype: the queries'
  if (g_cfg.head_dim != 64 && g_cfg.head_dim != 128 && g_cfg.head_dim != 256) {
    std::fprintf(stderr, "--head-dim: expected 64, 128 or 256, got %d\n", g_cfg.head_dim);
    return 2;
  }
  if (g_cfg.window < kNoWindow) {
    std::fprintf(stderr, "--window: expected -1 (none) or >= 0, got %lld\n",
                 static_cast<long long>(g_cfg.window));
    return 2;
  }
  if (!(g_cfg.soft_cap >= 0.f) || !std::isfinite(g_cfg.soft_cap)) {
    std::fprintf(stderr, "--soft-cap: expected 0 (none) or a finite value > 0, got %g\n",
                 g_cfg.soft_cap);
    return 2;
  }
  if (run_sections && !g_cfg.is_default()) {
    std::fprintf(stderr,
                 "--sections sets the dtypes, head dim and variant of each section: drop "
                 "--dtype, --kv-dtype, --head-dim, --window and --soft-cap\n");
    return 2;
  }
  if (!g_cfg.is_default()) g_cfg.name = "flags";
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
        g_scatter ? "scattered" : "in id order", g_cfg.soft_cap);
    std::printf("plain decode: %s\n", BENCH_CASCADE_HAS_DECODE
                                          ? "the library's split-KV decode (run_decode)"
                                          : "not built; 'flat' = the cascade kernel, one level");
    if (!run_sections && !g_cfg.is_default()) std::printf("%s\n", describe(g_cfg).c_str());
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
    if (only.empty() && run_sections) shapes = {{32768, 256, 128}, {4096, 64, 16}};
    if (only.empty() && !run_sections)
      for (const Anchor& a : kAnchors) shapes.push_back({a.prefix, a.suffix, a.batch});
    if (!quick && only.empty() && !run_sections)
      for (int p : {4096, 32768})
        for (int s : {64, 256, 1024})
          for (int b : {16, 64, 256})
            if (!find_anchor(p, s, b)) shapes.push_back({p, s, b});
    const int reps = quick ? 7 : 25;
    std::vector<Row> rows;
    if (run_sections) {
      // each section: the cascade (lean: its levels and merge go to the CSV) and the plain
      // decode of the same batch
      std::printf("sections: %s; tolerance of maxdiff: 2e-2 bf16, 1e-2 f16, doubled over fp8 KV\n",
                  describe(Config{}).c_str());
      std::printf("%-12s %6s %5s %5s | %9s %9s %6s | %10s %7s | %9s %7s | %s\n", "section",
                  "prefix", "suf", "batch", "cascade", "floor", "x-flr", "decode", "x-dec",
                  "maxdiff", "check", "level kernels");
      for (const Config& cfg : sections())
        for (const Shape& sh : shapes) {
          const Row r =
              run_shape(sh.p, sh.s, sh.b, num_sms, bw, stream, reps, true, true, cfg, nullptr);
          rows.push_back(r);
          print_section_row(r);
          std::fflush(stdout);
        }
    } else {
      std::printf(
          "%6s %5s %5s | %9s %9s %9s %9s %6s %9s %8s | %10s %9s %7s | %8s %6s | %8s %6s | %9s | "
          "%s\n",
          "prefix", "suf", "batch", "cascade", "staged", "mma-only", "prefix", "TF/s", "suffix",
          "merge", "decode", "flat", "x-dec", "floor", "x-flr", "FI", "x-FI", "maxdiff",
          "tiles/splits");
    }
    Explore explore;
    if (run_sections) shapes.clear();  // run above, section by section
    for (const Shape& sh : shapes) {
      explore.on = !quick && !lean && only.empty() && g_cfg.is_default() && sh.s == 256 &&
                   ((sh.p == 32768 && sh.b == 128) || (sh.p == 4096 && sh.b == 16) ||
                    (sh.p == 32768 && sh.b == 16));
      const Row r =
          run_shape(sh.p, sh.s, sh.b, num_sms, bw, stream, reps, lean, !lean, g_cfg, &explore);
      rows.push_back(r);
      if (!r.ran()) {
        std::printf("%6d %5d %5d | %s: %s | decode %.1f | floor %.1f\n", r.prefix, r.suffix,
                    r.batch, r.status(), r.message().c_str(), r.decode_us, r.floor_us);
        std::fflush(stdout);
        continue;
      }
      // prefix-level tensor throughput: QKᵀ + PV over every (query row, prefix key) pair
      const double prefix_tflops =
          4.0 * r.batch * kHeadsQ * double(r.prefix) * g_cfg.head_dim / (r.prefix_us * 1e6);
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
          "decode_sms,decode_fold,section,dtype,kv_dtype,head_dim,soft_cap,window_left,"
          "tolerance,status,level_kernels,message\n");
      if (!f) return 1;
      for (const Row& r : rows) {
        const bool ran = r.ran();
        std::fprintf(f,
                     "%d,%d,%d,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.3f,%.2f,%.3f,%.1f,%.3f,%.3e,%d,"
                     "%d,%d,%d,%.0f,%.2f,%.2f,%d,%d,%s,%s,%s,%d,%g,%lld,%.0e,%s,%s,%s\n",
                     r.prefix, r.suffix, r.batch, r.cascade_us, r.prefix_us, r.suffix_us,
                     r.merge_us, r.decode_us, r.flat_us,
                     ran ? (r.decode_us > 0 ? r.decode_us : r.flat_us) / r.cascade_us : -1.0,
                     r.floor_us, ran ? r.cascade_us / r.floor_us : -1.0, r.fi_us,
                     r.fi_us > 0 && ran ? r.fi_us / r.cascade_us : 0.0, r.max_diff, r.prefix_tile,
                     r.prefix_splits, r.suffix_tile, r.suffix_splits, bw / 1e9, r.mma_us,
                     r.staged_us, r.decode_sms, r.decode_fold ? 1 : 0,
                     csv_quote(r.cfg.name).c_str(), to_string(r.cfg.dtype),
                     to_string(r.cfg.kv_dtype), r.cfg.head_dim, r.cfg.soft_cap,
                     static_cast<long long>(r.cfg.window), r.cfg.tolerance(), r.status(),
                     csv_quote(r.kernels).c_str(),
                     csv_quote(!r.ran()                    ? r.message()
                               : !r.decode_refused.empty() ? "plain decode: " + r.decode_refused
                                                           : std::string())
                         .c_str());
      }
      std::fclose(f);
    }
    int bad = 0, refused = 0;
    for (const Row& r : rows) {
      if (!r.refused.empty())
        ++refused;
      else if (!r.ok())
        ++bad;
    }
    if (refused)
      std::printf("refused: %d rows the library does not run as a cascade (kNotSupported)\n",
                  refused);
    if (bad) std::printf("FAILED: %d shapes where cascade and plain attention disagree\n", bad);
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cascade: %s\n", e.what());
    return 1;
  }
}
