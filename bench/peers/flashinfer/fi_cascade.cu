/// @file fi_cascade.cu
/// @brief FlashInfer 0.7.2.post1's two-level cascade decode on one GPU (sm_90a): the kernels
///        `MultiLevelCascadeAttentionWrapper(2, ...)` runs, timed and checked, as a same-run peer
///        of bench/bench_cascade.cu.
///
/// What the wrapper does for a shared prefix of P tokens, B requests with S suffix tokens each
/// and one query token per request (flashinfer/cascade.py, prefill.py):
///  - plan(): one `BatchPrefillWithPagedKVCacheWrapper` per level, each with its own int workspace
///    and plan, sharing one float workspace; level 0 = qo_indptr [0, B] (every request's query as
///    ONE query segment) over the prefix pages, level 1 = qo_indptr [0, 1, ..., B] over each
///    request's suffix pages; causal False on both (cascade.py passes `causal` to the last level
///    only, and a q_len-1 decode plans it False), sm_scale 1/sqrt(D), the same window_left and
///    logits_soft_cap on every level. Backend "auto" picks "fa3" on sm_90 with CUDA >= 12.3 for
///    bf16/f16 queries and KV, no custom mask, no RoPE, no fp16 QK reduction and head dims 64,
///    128 or 256 (utils.py determine_attention_backend), so each level is the FA3 paged batch
///    prefill (hopper/prefill_sm90.cuh via csrc/batch_prefill_sm90.cu; fi_cascade_level.cu).
///  - run(): level 1 (the last) into (out, lse), then level 0 into (out_0, lse_0), then
///    `merge_state_in_place(out, lse, out_0, lse_0)` (MergeStateInPlace; fi_cascade_merge.cu).
/// Each call here is those three launches on one stream; the Python wrapper's allocations of the
/// outputs are not timed.
///
/// Shapes: `P:S:B` (prefix, suffix, batch), 32/8 heads, head dim 128, bf16, pages of 16 tokens
/// NHD (`--heads`, `--head-dim`, `--dtype`, `--page`), page placement as bench_cascade's: the
/// prefix pages first in id order, the suffix pages interleaved (request b's page j is
/// pp + j·B + b). Default: the ANCHORS.md cascade table's shapes, then bench_cascade's grid
/// {4k, 32k} x {64, 256, 1024} x {16, 64, 256} (those not in the table), in bench_cascade's
/// order.
///
/// Per shape: inputs 0.5·N(0, 1) from a counter hash (seeds 1/2/3 for K/V/Q); plan both levels;
/// one cascade call into outputs and LSEs poisoned with NaN bytes, checked against a CPU fp64
/// reference of the concatenated attention (prefix keys then the request's suffix keys; every
/// request when B <= 16, else 16 requests evenly spaced from the first to the last; every output
/// and LSE value must be finite; max|do| <= 2e-2, max|dlse| <= 5e-3 in natural log; FlashInfer's
/// LSE is log2-based); then `--warmup` untimed and `--reps` timed calls (default 5 and 51), each
/// timed alone with CUDA events after an L2 flush (a 512 MiB read); the median and the minimum.
/// The last timed call's output is compared with the checked one. Level 1, level 0 and the merge
/// are then timed alone the same way (the note). The floor is bench_cascade's: Σ over the levels
/// of max(K+V bytes ÷ copy bandwidth, FLOP ÷ 790 TFLOP/s), the copy bandwidth (bytes read +
/// written per second of a 2 GiB device-to-device cudaMemcpy, median of 10) measured in the same
/// run and written as the first row (`memcpy`).
///
/// `--soft-cap c` (FlashInfer's logits soft cap, c·tanh(s/c), the FA3 LogitsSoftCap variant) and
/// `--window w` (window_left w: keys at positions >= query position - w) run the instances built
/// with them; the reference applies them to the concatenated keys. Note that the cascade wrapper
/// passes window_left to each level, whose FA3 kernel measures the window from that level's own
/// KV length and query position, so a windowed cascade differs from windowed attention over the
/// concatenated keys unless the window holds every key (the check then reads FAIL).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "fi_cascade.hpp"
#include "fi_harness.cuh"

namespace {

using i64 = std::int64_t;
using fic::DType;
using fih::DevBuf;
using fih::DeviceCopy;
using fih::fill_randn;
using fih::fmt;
using fih::int_arg;
using fih::lut;
using fih::median;
using fih::num;
using fih::open_device;
using fih::splitmix64;
using fih::upload;
using fih::worse;
constexpr double kTolO = 2e-2;                    // max |o − o_ref|
constexpr double kTolLse = 5e-3;                  // max |lse − lse_ref|, natural log
constexpr double kLn2 = 0.693147180559945309417;  // FlashInfer's LSE is log2-based
constexpr double kTensorFlops = 790e12;           // bench_cascade's dense bf16 wgmma throughput
constexpr int kMaxChecked = 16;                   // requests checked against the CPU

// ---------------------------------------------------------------------------------------------
// Configuration and shapes

struct Config {
  int hq = 32, hkv = 8, d = 128, page = 16;
  DType dtype = DType::kBF16;
  double soft_cap = 0;  // 0: none
  int window = -1;      // window_left; -1: none
  int reps = 51, warmup = 5;
};

struct Shape {
  int prefix = 0, suffix = 0, batch = 0;
};

/// ANCHORS.md's cascade table (bench_cascade's kAnchors), in its order.
const Shape kAnchorShapes[] = {{4096, 64, 16},    {4096, 256, 128},  {32768, 64, 16},
                               {32768, 256, 64},  {32768, 256, 128}, {32768, 64, 256},
                               {32768, 1024, 256}};

/// bench_cascade's default list: the anchors, then its grid without them.
std::vector<Shape> default_shapes() {
  std::vector<Shape> v(std::begin(kAnchorShapes), std::end(kAnchorShapes));
  for (int p : {4096, 32768})
    for (int s : {64, 256, 1024})
      for (int b : {16, 64, 256})
        if (std::none_of(v.begin(), v.begin() + std::size(kAnchorShapes), [&](const Shape& a) {
              return a.prefix == p && a.suffix == s && a.batch == b;
            }))
          v.push_back({p, s, b});
  return v;
}

/// `--shapes P:S:B[,P:S:B...]`; throws std::invalid_argument naming the bad item.
std::vector<Shape> parse_shapes(const std::string& arg) {
  std::vector<Shape> out;
  std::size_t at = 0;
  while (at <= arg.size()) {
    const std::size_t end = std::min(arg.find(',', at), arg.size());
    const std::string item = arg.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    long long p = 0, s = 0, b = 0;
    int used = 0;
    if (std::sscanf(item.c_str(), "%lld:%lld:%lld%n", &p, &s, &b, &used) != 3 ||
        used != static_cast<int>(item.size()))
      throw std::invalid_argument("--shapes: '" + item + "' is not P:S:B (three integers)");
    if (p < 1 || s < 1 || b < 1 || p > (1 << 24) || s > (1 << 24) || b > 65536)
      throw std::invalid_argument("--shapes: '" + item +
                                  "' needs 1 <= P, S <= 16777216 and 1 <= B <= 65536");
    out.push_back({static_cast<int>(p), static_cast<int>(s), static_cast<int>(b)});
  }
  if (out.empty()) throw std::invalid_argument("--shapes '" + arg + "' holds no shape");
  return out;
}

std::string count_text(i64 n) {
  return n % 1024 == 0 ? std::to_string(n / 1024) + "k" : std::to_string(n);
}

/// A row's id: `P:S:B` plus what differs from the defaults (heads, head dim, dtype, page, soft
/// cap, window), e.g. `32k:256:128` or `32k:256:128:d64:f16:cap50`.
std::string shape_id(const Shape& s, const Config& c) {
  std::string id =
      count_text(s.prefix) + ":" + count_text(s.suffix) + ":" + std::to_string(s.batch);
  if (c.hq != 32 || c.hkv != 8) id += fmt(":h%d/%d", c.hq, c.hkv);
  if (c.d != 128) id += fmt(":d%d", c.d);
  if (c.dtype != DType::kBF16) id += ":f16";
  if (c.page != 16) id += fmt(":page%d", c.page);
  if (c.soft_cap > 0) id += fmt(":cap%g", c.soft_cap);
  if (c.window >= 0) id += fmt(":w%d", c.window);
  return id;
}

// ---------------------------------------------------------------------------------------------
// Page tables (bench_cascade's placement)

struct Tables {
  int pp = 0, sp = 0;  // pages of the prefix, of one suffix
  i64 num_pages = 0;
  // level 0: one segment over the prefix pages; level 1: one segment per request
  std::vector<std::int32_t> qo0, kvp0, idx0, last0, len0;
  std::vector<std::int32_t> qo1, kvp1, idx1, last1, len1;
};

Tables make_tables(const Shape& s, int page) {
  Tables t;
  const int B = s.batch;
  t.pp = (s.prefix + page - 1) / page;
  t.sp = (s.suffix + page - 1) / page;
  t.num_pages = t.pp + static_cast<i64>(B) * t.sp;
  t.qo0 = {0, B};
  t.kvp0 = {0, t.pp};
  t.idx0.resize(t.pp);
  std::iota(t.idx0.begin(), t.idx0.end(), 0);
  t.last0 = {s.prefix - (t.pp - 1) * page};
  t.len0 = {s.prefix};
  t.qo1.resize(B + 1);
  t.kvp1.resize(B + 1);
  for (int b = 0; b <= B; ++b) {
    t.qo1[b] = b;
    t.kvp1[b] = b * t.sp;
  }
  t.idx1.resize(static_cast<std::size_t>(B) * t.sp);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < t.sp; ++j)
      t.idx1[static_cast<std::size_t>(b) * t.sp + j] = t.pp + j * B + b;
  t.last1.assign(B, s.suffix - (t.sp - 1) * page);
  t.len1.assign(B, s.suffix);
  return t;
}

/// The requests checked against the CPU: all when B <= kMaxChecked, else kMaxChecked evenly
/// spaced from the first to the last.
std::vector<int> checked_requests(int B) {
  std::vector<int> r;
  if (B <= kMaxChecked) {
    r.resize(B);
    std::iota(r.begin(), r.end(), 0);
    return r;
  }
  for (int i = 0; i < kMaxChecked; ++i)
    r.push_back(static_cast<int>((static_cast<i64>(i) * (B - 1) + (kMaxChecked - 1) / 2) /
                                 (kMaxChecked - 1)));
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

// ---------------------------------------------------------------------------------------------
// Host fp64 reference of the concatenated attention

/// The host copy of what the reference reads: the prefix pages, the checked requests' suffix
/// pages (each request's in its page order) and every query.
struct HostKV {
  std::vector<int> reqs;                           // checked requests
  std::vector<std::uint16_t> pk, pv;               // pp pages
  std::vector<std::vector<std::uint16_t>> sk, sv;  // per checked request, sp pages
  std::vector<std::uint16_t> q;                    // (B, hq, d)
};

struct Reference {
  std::vector<double> o;    // (reqs, hq, d)
  std::vector<double> lse;  // (reqs, hq), natural log
  double seconds = 0;
};

/// Request reqs[ci]'s query attends the prefix keys 0..P-1 then its suffix keys P..P+S-1 (query
/// position P+S-1); logits scale·q·k, soft-capped to c·tanh(logit/c) when c > 0; with a window
/// w >= 0 only keys at positions >= P+S-1-w.
Reference reference(const Shape& s, const Config& c, const HostKV& h, double scale) {
  const auto t0 = std::chrono::steady_clock::now();
  Reference r;
  const int group = c.hq / c.hkv, D = c.d, page = c.page;
  const int L = s.prefix + s.suffix;
  const int first = c.window >= 0 ? std::max(0, L - 1 - c.window) : 0;
  const float* T = lut(c.dtype).data();
  const std::size_t nreq = h.reqs.size();
  r.o.assign(nreq * c.hq * D, 0.0);
  r.lse.assign(nreq * c.hq, -INFINITY);
  const std::size_t tasks = nreq * c.hkv;
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    std::vector<double> qd(static_cast<std::size_t>(group) * D), acc(qd.size()), sc;
    for (std::size_t task; (task = next.fetch_add(1)) < tasks;) {
      const int ci = static_cast<int>(task / c.hkv), kh = static_cast<int>(task % c.hkv);
      const int b = h.reqs[ci];
      for (int g = 0; g < group; ++g)
        for (int e = 0; e < D; ++e)
          qd[g * D + e] = T[h.q[(static_cast<std::size_t>(b) * c.hq + kh * group + g) * D + e]];
      auto key = [&](const std::vector<std::uint16_t>& pre, const std::vector<std::uint16_t>& suf,
                     int j) {
        const bool in_prefix = j < s.prefix;
        const int t = in_prefix ? j : j - s.prefix;
        const std::size_t off =
            ((static_cast<std::size_t>(t / page) * page + t % page) * c.hkv + kh) * D;
        return (in_prefix ? pre.data() : suf.data()) + off;
      };
      const int n = L - first;
      sc.assign(static_cast<std::size_t>(group) * n, 0.0);
      for (int j = first; j < L; ++j) {
        const std::uint16_t* kp = key(h.pk, h.sk[ci], j);
        for (int g = 0; g < group; ++g) {
          const double* qp = qd.data() + g * D;
          double dot = 0;
          for (int e = 0; e < D; ++e) dot += qp[e] * T[kp[e]];
          double logit = dot * scale;
          if (c.soft_cap > 0) logit = c.soft_cap * std::tanh(logit / c.soft_cap);
          sc[static_cast<std::size_t>(g) * n + (j - first)] = logit;
        }
      }
      std::vector<double> m(group, -INFINITY), sum(group, 0.0);
      for (int g = 0; g < group; ++g)
        for (int j = 0; j < n; ++j) m[g] = std::max(m[g], sc[static_cast<std::size_t>(g) * n + j]);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = first; j < L; ++j) {
        const std::uint16_t* vp = key(h.pv, h.sv[ci], j);
        for (int g = 0; g < group; ++g) {
          const double w = std::exp(sc[static_cast<std::size_t>(g) * n + (j - first)] - m[g]);
          sum[g] += w;
          double* ag = acc.data() + g * D;
          for (int e = 0; e < D; ++e) ag[e] += w * T[vp[e]];
        }
      }
      for (int g = 0; g < group; ++g) {
        const int hh = kh * group + g;
        for (int e = 0; e < D; ++e)
          r.o[(static_cast<std::size_t>(ci) * c.hq + hh) * D + e] = acc[g * D + e] / sum[g];
        r.lse[static_cast<std::size_t>(ci) * c.hq + hh] = m[g] + std::log(sum[g]);
      }
    }
  };
  const unsigned nthreads = std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < nthreads; ++i) pool.emplace_back(worker);
  for (std::thread& th : pool) th.join();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

struct Output {
  std::vector<std::uint16_t> o;  // (B, hq, d)
  std::vector<float> lse;        // (B, hq), log2
};

struct Errors {
  double max_do = 0, max_dlse = 0;
  i64 nonfinite = 0;
  bool ok() const { return max_do <= kTolO && max_dlse <= kTolLse && nonfinite == 0; }
};

/// The checked requests' rows against the reference, and every value for finiteness.
Errors against_reference(const Config& c, const HostKV& h, const Output& g, const Reference& r) {
  Errors e;
  const float* T = lut(c.dtype).data();
  for (std::size_t ci = 0; ci < h.reqs.size(); ++ci) {
    const std::size_t b = static_cast<std::size_t>(h.reqs[ci]);
    for (int hh = 0; hh < c.hq; ++hh) {
      for (int x = 0; x < c.d; ++x)
        e.max_do = worse(e.max_do, std::fabs(T[g.o[(b * c.hq + hh) * c.d + x]] -
                                             r.o[(ci * c.hq + hh) * c.d + x]));
      e.max_dlse = worse(e.max_dlse, std::fabs(static_cast<double>(g.lse[b * c.hq + hh]) * kLn2 -
                                               r.lse[ci * c.hq + hh]));
    }
  }
  for (std::uint16_t x : g.o) e.nonfinite += !std::isfinite(T[x]);
  for (float x : g.lse) e.nonfinite += !std::isfinite(x);
  return e;
}

// ---------------------------------------------------------------------------------------------
// Rows

struct Row {
  std::string path = "fi_cascade";
  double median_us = NAN, min_us = NAN, floor_us = NAN;
  std::string check = "ERROR";
  std::string note;
};

std::string csv_line(const Shape& s, const Config& c, const Row& r) {
  std::string note = r.note;
  std::replace(note.begin(), note.end(), ',', ';');
  const double ratio = r.median_us / r.floor_us;
  return fmt("%s,%s,%d,%d,%d,%d,%d,%d,%s,", r.path.c_str(), shape_id(s, c).c_str(), s.prefix,
             s.suffix, s.batch, c.hq, c.hkv, c.d, fic::dtype_name(c.dtype)) +
         num(r.median_us, "%.2f") + "," + num(r.min_us, "%.2f") + "," + num(r.floor_us, "%.2f") +
         "," + num(ratio, "%.3f") + "," + r.check + "," + note;
}

struct Context {
  Config cfg;
  int sms = 1;
  double copy_bw = 0;  // bytes read + written per second
  cudaStream_t stream = nullptr;
  fih::Timer timer;
};

const fic::LevelEntry* find_level(const Config& c) {
  for (const fic::LevelEntry& e : fic::level_registry())
    if (e.key.dtype == c.dtype && e.key.d == c.d && e.key.soft_cap == (c.soft_cap > 0) &&
        e.key.window == (c.window >= 0))
      return &e;
  return nullptr;
}

fic::MergeFn find_merge(DType t) {
  for (const fic::MergeEntry& e : fic::merge_registry())
    if (e.dtype == t) return e.fn;
  return nullptr;
}

/// Σ over the levels of max(K+V bytes ÷ copy bandwidth, FLOP ÷ 790 TFLOP/s), in µs, every key of
/// both levels counted (bench_cascade's floor).
double floor_us(const Shape& s, const Config& c, double bw) {
  const double kv_tok = 2.0 * c.hkv * c.d * 2;  // K and V bytes per token
  const double flop_tok = 4.0 * c.hq * c.d;     // QKᵀ + PV per (query, key)
  const double pre_bytes = s.prefix * kv_tok, suf_bytes = double(s.batch) * s.suffix * kv_tok;
  const double pre_flop = double(s.batch) * s.prefix * flop_tok;
  const double suf_flop = double(s.batch) * s.suffix * flop_tok;
  return 1e6 * (std::max(pre_bytes / bw, pre_flop / kTensorFlops) +
                std::max(suf_bytes / bw, suf_flop / kTensorFlops));
}

std::string plan_text(const fic::PlanSummary& p) {
  return fmt("works=%lld/%d_ctas same_schedule=%d cta_q=%d", p.works, p.ctas,
             p.same_schedule_for_all_heads ? 1 : 0, p.cta_tile_q);
}

/// Runs one shape: plan, check, time; returns its row.
Row run_shape(const Shape& s, Context& cx) {
  using clock = std::chrono::steady_clock;
  auto sec = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const auto t0 = clock::now();
  const Config& c = cx.cfg;
  const cudaStream_t st = cx.stream;
  const int B = s.batch;
  Row row;
  row.floor_us = floor_us(s, c, cx.copy_bw);
  row.note = fmt("page=%d NHD sm_scale=1/sqrt(%d) soft_cap=%g window_left=%d", c.page, c.d,
                 c.soft_cap, c.window);
  const fic::LevelEntry* inst = find_level(c);
  const fic::MergeFn merge = find_merge(c.dtype);
  if (inst == nullptr || merge == nullptr) {
    row.check = "NOT_BUILT";
    row.note +=
        fmt(" no FA3 level instance built for %s head dim %d%s%s (CMake FI_DTYPES / FI_HEAD_DIMS / "
            "FI_VARIANTS)",
            fic::dtype_name(c.dtype), c.d, c.soft_cap > 0 ? " soft_cap" : "",
            c.window >= 0 ? " window" : "");
    return row;
  }
  if (c.hq % c.hkv != 0) {
    row.check = "UNSUPPORTED";
    row.note += fmt(" FlashInfer refuses: num_qo_heads %d should be divisible by num_kv_heads %d",
                    c.hq, c.hkv);
    return row;
  }

  const Tables t = make_tables(s, c.page);
  const std::size_t page_elems = static_cast<std::size_t>(c.page) * c.hkv * c.d;
  const std::size_t pool = static_cast<std::size_t>(t.num_pages) * page_elems;
  const std::size_t q_elems = static_cast<std::size_t>(B) * c.hq * c.d;
  const std::size_t lse_elems = static_cast<std::size_t>(B) * c.hq;
  DevBuf k(pool * 2), v(pool * 2), q(q_elems * 2), o1(q_elems * 2), o0(q_elems * 2);
  DevBuf lse1(lse_elems * 4), lse0(lse_elems * 4);
  // the cascade wrapper's float workspace, shared by its levels (128 MiB, FlashInfer's examples)
  DevBuf float_ws(std::size_t{128} << 20);
  fill_randn(k.p, pool, c.dtype, 1, cx.sms, st);
  fill_randn(v.p, pool, c.dtype, 2, cx.sms, st);
  fill_randn(q.p, q_elems, c.dtype, 3, cx.sms, st);
  auto d_qo0 = upload(t.qo0), d_kvp0 = upload(t.kvp0), d_idx0 = upload(t.idx0),
       d_last0 = upload(t.last0);
  auto d_qo1 = upload(t.qo1), d_kvp1 = upload(t.kvp1), d_idx1 = upload(t.idx1),
       d_last1 = upload(t.last1);
  FIH_CUDA(cudaStreamSynchronize(st));

  auto level = [&](int l) {
    fic::LevelProblem p;
    p.hq = c.hq;
    p.hkv = c.hkv;
    p.d = c.d;
    p.page = c.page;
    p.dtype = c.dtype;
    p.segments = l == 0 ? 1 : B;
    p.rows = B;
    p.h_qo_indptr = (l == 0 ? t.qo0 : t.qo1).data();
    p.h_kv_page_indptr = (l == 0 ? t.kvp0 : t.kvp1).data();
    p.h_kv_len = (l == 0 ? t.len0 : t.len1).data();
    p.qo_indptr = (l == 0 ? d_qo0 : d_qo1)->as<std::int32_t>();
    p.kv_page_indptr = (l == 0 ? d_kvp0 : d_kvp1)->as<std::int32_t>();
    p.kv_indices = (l == 0 ? d_idx0 : d_idx1)->as<std::int32_t>();
    p.last_page_len = (l == 0 ? d_last0 : d_last1)->as<std::int32_t>();
    p.k = k.p;
    p.v = v.p;
    p.q = q.p;
    p.o = l == 0 ? o0.p : o1.p;
    p.lse = (l == 0 ? lse0 : lse1).as<float>();
    p.sm_scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    p.soft_cap = c.soft_cap;
    p.window_left = c.window;
    p.float_workspace = float_ws.p;
    p.float_workspace_bytes = float_ws.bytes;
    p.stream = st;
    return p;
  };
  const fic::LevelProblem p0 = level(0), p1 = level(1);
  std::unique_ptr<fic::LevelRunner> r0 = inst->make(), r1 = inst->make();
  fic::PlanSummary s0, s1;
  const auto tp = clock::now();
  try {
    s0 = r0->plan(p0);
    s1 = r1->plan(p1);
  } catch (const fic::Unsupported& e) {
    row.check = "UNSUPPORTED";
    row.note += std::string(" FlashInfer refuses: ") + e.what();
    return row;
  }
  const double plan_s = sec(clock::now() - tp);
  row.note += " l0{" + plan_text(s0) + "} l1{" + plan_text(s1) + "}";
  auto do_merge = [&] {
    merge(o1.p, lse1.as<float>(), o0.p, lse0.as<float>(), static_cast<std::uint32_t>(B),
          static_cast<std::uint32_t>(c.hq), static_cast<std::uint32_t>(c.d), st);
  };
  // MultiLevelCascadeAttentionWrapper.run: the last level, then level 0 merged into it
  auto cascade = [&] {
    r1->run();
    r0->run();
    do_merge();
  };
  auto fetch = [&] {
    Output out;
    out.o.resize(q_elems);
    out.lse.resize(lse_elems);
    FIH_CUDA(cudaMemcpy(out.o.data(), o1.p, q_elems * 2, cudaMemcpyDeviceToHost));
    FIH_CUDA(cudaMemcpy(out.lse.data(), lse1.p, lse_elems * 4, cudaMemcpyDeviceToHost));
    return out;
  };

  // 1. one call into poisoned outputs, checked
  for (DevBuf* b : {&o1, &o0, &lse1, &lse0}) FIH_CUDA(cudaMemsetAsync(b->p, 0xFF, b->bytes, st));
  cascade();
  FIH_CUDA(cudaStreamSynchronize(st));
  FIH_CUDA(cudaGetLastError());
  const Output first = fetch();
  HostKV h;
  h.reqs = checked_requests(B);
  h.q.resize(q_elems);
  FIH_CUDA(cudaMemcpy(h.q.data(), q.p, q_elems * 2, cudaMemcpyDeviceToHost));
  h.pk.resize(t.pp * page_elems);
  h.pv.resize(t.pp * page_elems);
  FIH_CUDA(cudaMemcpy(h.pk.data(), k.p, h.pk.size() * 2, cudaMemcpyDeviceToHost));  // ids 0..pp-1
  FIH_CUDA(cudaMemcpy(h.pv.data(), v.p, h.pv.size() * 2, cudaMemcpyDeviceToHost));
  for (int b : h.reqs) {
    h.sk.emplace_back(t.sp * page_elems);
    h.sv.emplace_back(t.sp * page_elems);
    for (int j = 0; j < t.sp; ++j) {
      const std::size_t src =
          static_cast<std::size_t>(t.idx1[static_cast<std::size_t>(b) * t.sp + j]) * page_elems * 2;
      FIH_CUDA(cudaMemcpy(h.sk.back().data() + j * page_elems, static_cast<char*>(k.p) + src,
                          page_elems * 2, cudaMemcpyDeviceToHost));
      FIH_CUDA(cudaMemcpy(h.sv.back().data() + j * page_elems, static_cast<char*>(v.p) + src,
                          page_elems * 2, cudaMemcpyDeviceToHost));
    }
  }
  const Reference ref = reference(s, c, h, p0.sm_scale);
  const Errors ec = against_reference(c, h, first, ref);
  bool pass = ec.ok();
  row.note += fmt(" cpu_check=%zu/%d_requests max_do=%.3e max_dlse=%.3e nonfinite=%lld",
                  h.reqs.size(), B, ec.max_do, ec.max_dlse, static_cast<long long>(ec.nonfinite));
  if (c.window >= 0 && c.window < s.prefix + s.suffix - 1)
    row.note += " (window: FlashInfer measures it per level; see the README)";

  // 2. the cascade call, timed
  const std::vector<double> us = cx.timer.time(c.reps, c.warmup, true, cascade);
  row.median_us = median(us);
  row.min_us = us.front();
  const Output last = fetch();
  const bool same = std::memcmp(last.o.data(), first.o.data(), q_elems * 2) == 0 &&
                    std::memcmp(last.lse.data(), first.lse.data(), lse_elems * 4) == 0;
  if (!same) {
    const Errors er = against_reference(c, h, last, ref);
    pass = pass && er.ok();
    row.note += fmt(" repeat=DIFFERS(max_do=%.3e max_dlse=%.3e)", er.max_do, er.max_dlse);
  } else {
    row.note += " repeat=same-bits";
  }
  // 3. each level and the merge alone (the merge then works on the outputs in place: its time
  // only)
  const std::vector<double> u1 = cx.timer.time(c.reps, c.warmup, true, [&] { r1->run(); });
  const std::vector<double> u0 = cx.timer.time(c.reps, c.warmup, true, [&] { r0->run(); });
  const std::vector<double> um = cx.timer.time(c.reps, c.warmup, true, do_merge);
  row.note += fmt(" level1_us=%.2f level0_us=%.2f merge_us=%.2f (medians alone)", median(u1),
                  median(u0), median(um));
  row.check = pass ? "PASS" : "FAIL";
  std::fprintf(stderr,
               "# %s: plan %.3f s; l0 %s; l1 %s\n#   check (%zu of %d requests, reference %.2f s): "
               "max|do| %.3e, max|dlse| %.3e, %lld non-finite -> %s\n#   %d calls: median %.2f "
               "us (min %.2f, max %.2f), floor %.2f us (x%.2f); level 1 %.2f, level 0 %.2f, merge "
               "%.2f us; last call %s; wall %.1f s\n",
               shape_id(s, c).c_str(), plan_s, plan_text(s0).c_str(), plan_text(s1).c_str(),
               h.reqs.size(), B, ref.seconds, ec.max_do, ec.max_dlse,
               static_cast<long long>(ec.nonfinite), row.check.c_str(), c.reps, row.median_us,
               row.min_us, us.back(), row.floor_us, row.median_us / row.floor_us, median(u1),
               median(u0), median(um), same ? "has the checked bits" : "DIFFERS",
               sec(clock::now() - t0));
  return row;
}

// ---------------------------------------------------------------------------------------------
// --selftest: the reference against a brute force over dense keys, and the level-merge identity

/// Small cascades with dense random keys: (a) `reference` (paged, per level tables) against a
/// brute force over the dense concatenated keys, with and without soft cap and window, pages of
/// 1, 5 and 16 tokens (partial last pages), group sizes 1/4/6, f16; (b) with no window, the two
/// levels' fp64 states merged as MergeStateInPlace merges them (log2 LSEs) against the
/// concatenation. No device needed.
int selftest() {
  struct Case {
    const char* name;
    Shape s;
    Config c;
  };
  std::vector<Case> cases;
  auto add = [&](const char* name, Shape s, int hq, int hkv, int d, int page, DType dt, double cap,
                 int window) {
    Config c;
    c.hq = hq;
    c.hkv = hkv;
    c.d = d;
    c.page = page;
    c.dtype = dt;
    c.soft_cap = cap;
    c.window = window;
    cases.push_back({name, s, c});
  };
  add("plain", {48, 16, 3}, 32, 8, 64, 16, DType::kBF16, 0, -1);
  add("partial-pages", {37, 11, 4}, 8, 2, 32, 5, DType::kBF16, 0, -1);
  add("page-1-mha", {9, 3, 2}, 4, 4, 16, 1, DType::kF16, 0, -1);
  add("soft-cap", {40, 24, 3}, 12, 2, 64, 16, DType::kBF16, 1.5, -1);
  add("window-in-suffix", {40, 24, 3}, 8, 2, 32, 8, DType::kBF16, 0, 10);
  add("window-into-prefix", {40, 24, 3}, 8, 2, 32, 8, DType::kF16, 2.0, 30);
  int bad = 0;
  std::uint64_t rng = 12345;
  for (const Case& tc : cases) {
    const Shape& s = tc.s;
    const Config& c = tc.c;
    const int B = s.batch, L = s.prefix + s.suffix, D = c.d;
    const float* T = lut(c.dtype).data();
    auto rnd16 = [&] {  // a finite value of the dtype in about [-2, 2]
      for (;;) {
        const std::uint16_t u = static_cast<std::uint16_t>(splitmix64(rng));
        if (std::isfinite(T[u]) && std::fabs(T[u]) < 2.f) return u;
      }
    };
    // dense keys: prefix (P, hkv, D) shared, suffix (B, S, hkv, D)
    std::vector<std::uint16_t> kp(static_cast<std::size_t>(s.prefix) * c.hkv * D), vp(kp.size()),
        ks(static_cast<std::size_t>(B) * s.suffix * c.hkv * D), vs(ks.size()),
        qd(static_cast<std::size_t>(B) * c.hq * D);
    for (auto* a : {&kp, &vp, &ks, &vs, &qd})
      for (auto& x : *a) x = rnd16();
    // the paged host copy the reference reads, through the level tables
    const Tables t = make_tables(s, c.page);
    const std::size_t pe = static_cast<std::size_t>(c.page) * c.hkv * D;
    std::vector<std::uint16_t> poolk(static_cast<std::size_t>(t.num_pages) * pe, 0xFFFF),
        poolv(poolk.size(), 0xFFFF);  // NaN where no token lives
    for (int j = 0; j < s.prefix; ++j)
      for (std::size_t x = 0; x < static_cast<std::size_t>(c.hkv) * D; ++x) {
        const std::size_t at = static_cast<std::size_t>(t.idx0[j / c.page]) * pe +
                               static_cast<std::size_t>(j % c.page) * c.hkv * D + x;
        poolk[at] = kp[static_cast<std::size_t>(j) * c.hkv * D + x];
        poolv[at] = vp[static_cast<std::size_t>(j) * c.hkv * D + x];
      }
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < s.suffix; ++j)
        for (std::size_t x = 0; x < static_cast<std::size_t>(c.hkv) * D; ++x) {
          const std::size_t at =
              static_cast<std::size_t>(t.idx1[static_cast<std::size_t>(b) * t.sp + j / c.page]) *
                  pe +
              static_cast<std::size_t>(j % c.page) * c.hkv * D + x;
          const std::size_t src = (static_cast<std::size_t>(b) * s.suffix + j) * c.hkv * D + x;
          poolk[at] = ks[src];
          poolv[at] = vs[src];
        }
    HostKV h;
    h.reqs = checked_requests(B);
    h.q = qd;
    h.pk.assign(poolk.begin(), poolk.begin() + static_cast<std::ptrdiff_t>(t.pp * pe));
    h.pv.assign(poolv.begin(), poolv.begin() + static_cast<std::ptrdiff_t>(t.pp * pe));
    for (int b : h.reqs) {
      h.sk.emplace_back();
      h.sv.emplace_back();
      for (int j = 0; j < t.sp; ++j) {
        const std::size_t src =
            static_cast<std::size_t>(t.idx1[static_cast<std::size_t>(b) * t.sp + j]) * pe;
        h.sk.back().insert(h.sk.back().end(), poolk.begin() + src, poolk.begin() + src + pe);
        h.sv.back().insert(h.sv.back().end(), poolv.begin() + src, poolv.begin() + src + pe);
      }
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    const Reference r = reference(s, c, h, scale);
    // brute force over the dense keys; also the two levels' states for the merge identity
    double max_do = 0, max_dlse = 0, merge_do = 0, merge_dlse = 0;
    for (std::size_t ci = 0; ci < h.reqs.size(); ++ci) {
      const int b = h.reqs[ci];
      for (int hh = 0; hh < c.hq; ++hh) {
        const int kh = hh / (c.hq / c.hkv);
        auto kv = [&](bool val, int j, int e) {
          if (j < s.prefix)
            return static_cast<double>(
                T[(val ? vp : kp)[(static_cast<std::size_t>(j) * c.hkv + kh) * D + e]]);
          const std::size_t at =
              ((static_cast<std::size_t>(b) * s.suffix + (j - s.prefix)) * c.hkv + kh) * D + e;
          return static_cast<double>(T[(val ? vs : ks)[at]]);
        };
        // state over keys [lo, hi) with the window's visibility: (output, natural LSE)
        auto state = [&](int lo, int hi, std::vector<double>& o) {
          std::vector<double> sc;
          double m = -INFINITY;
          for (int j = lo; j < hi; ++j) {
            const bool visible = c.window < 0 || j >= L - 1 - c.window;
            double dot = 0;
            for (int e = 0; e < D; ++e)
              dot += T[qd[(static_cast<std::size_t>(b) * c.hq + hh) * D + e]] * kv(false, j, e);
            double logit = dot * scale;
            if (c.soft_cap > 0) logit = c.soft_cap * std::tanh(logit / c.soft_cap);
            sc.push_back(visible ? logit : -INFINITY);
            m = std::max(m, sc.back());
          }
          o.assign(D, 0.0);
          double sum = 0;
          for (int j = lo; j < hi; ++j) {
            const double w = std::isinf(sc[j - lo]) ? 0.0 : std::exp(sc[j - lo] - m);
            sum += w;
            for (int e = 0; e < D; ++e) o[e] += w * kv(true, j, e);
          }
          for (int e = 0; e < D; ++e) o[e] = sum > 0 ? o[e] / sum : 0.0;
          return sum > 0 ? m + std::log(sum) : -INFINITY;
        };
        std::vector<double> o, o0, o1;
        const double lse = state(0, L, o);
        for (int e = 0; e < D; ++e)
          max_do = std::max(max_do, std::fabs(o[e] - r.o[(ci * c.hq + hh) * D + e]));
        max_dlse = std::max(max_dlse, std::fabs(lse - r.lse[ci * c.hq + hh]));
        if (c.window < 0) {  // MergeStateInPlace's arithmetic, in log2 units, on fp64 states
          const double s1 = state(s.prefix, L, o1) / kLn2, s0 = state(0, s.prefix, o0) / kLn2;
          const double smax = std::max(s1, s0);
          const double w1 = std::exp2(s1 - smax), w0 = std::exp2(s0 - smax), dsum = w1 + w0;
          for (int e = 0; e < D; ++e)
            merge_do = std::max(merge_do, std::fabs((w1 * o1[e] + w0 * o0[e]) / dsum - o[e]));
          merge_dlse = std::max(merge_dlse, std::fabs((std::log2(dsum) + smax) * kLn2 - lse));
        }
      }
    }
    const bool ok = max_do < 1e-12 && max_dlse < 1e-12 && merge_do < 1e-12 && merge_dlse < 1e-12;
    bad += !ok;
    const std::string merged = c.window < 0
                                   ? fmt("max|do| %.2e max|dlse| %.2e", merge_do, merge_dlse)
                                   : std::string("not applicable (window)");
    std::printf(
        "selftest %-20s reference vs brute force: max|do| %.2e max|dlse| %.2e; merged "
        "levels vs concatenation: %s -> %s\n",
        tc.name, max_do, max_dlse, merged.c_str(), ok ? "ok" : "BAD");
  }
  return bad == 0 ? 0 : 4;
}

// ---------------------------------------------------------------------------------------------

std::string instance_list() {
  std::vector<std::string> v;
  for (const fic::LevelEntry& e : fic::level_registry())
    v.push_back(fmt("[%s, head dim %d]", e.name, e.key.d));
  std::sort(v.begin(), v.end());
  std::string out;
  for (const std::string& x : v) out += " " + x;
  out += " merge:";
  for (const fic::MergeEntry& e : fic::merge_registry())
    out += std::string(" ") + fic::dtype_name(e.dtype);
  return out;
}

const char* const kUsage =
    "usage: %s [--shapes P:S:B[,P:S:B...]] [--dtype bf16|f16] [--head-dim 64|128|256] "
    "[--heads HQ:HKV] [--page N] [--soft-cap C] [--window W] [--reps N] [--warmup N] "
    "[--csv PATH] [--list] [--selftest]\n"
    "  default shapes: the ANCHORS.md cascade table, then bench_cascade's grid {4k,32k} x "
    "{64,256,1024} x {16,64,256}\n";

}  // namespace

int main(int argc, char** argv) {
  Context cx;
  Config& c = cx.cfg;
  std::vector<Shape> shapes;
  std::string csv_path;
  bool list = false, self = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const bool has = i + 1 < argc;
      if (a == "--shapes" && has) {
        const std::vector<Shape> v = parse_shapes(argv[++i]);
        shapes.insert(shapes.end(), v.begin(), v.end());
      } else if (a == "--dtype" && has) {
        const std::string t = argv[++i];
        if (t != "bf16" && t != "f16")
          throw std::invalid_argument("--dtype: expected bf16 or f16, got '" + t + "'");
        c.dtype = t == "bf16" ? DType::kBF16 : DType::kF16;
      } else if (a == "--head-dim" && has) {
        c.d = static_cast<int>(int_arg("--head-dim", argv[++i], 64, 256));
        if (c.d != 64 && c.d != 128 && c.d != 256)
          throw std::invalid_argument(
              fmt("--head-dim: expected 64, 128 or 256 (the head dims FlashInfer's FA3 prefill "
                  "takes; others make the wrapper pick fa2), got %d",
                  c.d));
      } else if (a == "--heads" && has) {
        int hq = 0, hkv = 0, used = 0;
        const std::string t = argv[++i];
        if (std::sscanf(t.c_str(), "%d:%d%n", &hq, &hkv, &used) != 2 ||
            used != static_cast<int>(t.size()) || hq < 1 || hkv < 1 || hq > 256 || hkv > hq)
          throw std::invalid_argument("--heads: expected HQ:HKV with 1 <= HKV <= HQ <= 256, got '" +
                                      t + "'");
        c.hq = hq;
        c.hkv = hkv;
      } else if (a == "--page" && has) {
        c.page = static_cast<int>(int_arg("--page", argv[++i], 1, 65536));
      } else if (a == "--soft-cap" && has) {
        char* end = nullptr;
        c.soft_cap = std::strtod(argv[++i], &end);
        if (end == argv[i] || *end != '\0' || !(c.soft_cap > 0) || !std::isfinite(c.soft_cap))
          throw std::invalid_argument(std::string("--soft-cap: expected a number > 0, got '") +
                                      argv[i] + "'");
      } else if (a == "--window" && has) {
        c.window = static_cast<int>(int_arg("--window", argv[++i], 0, 1 << 30));
      } else if (a == "--reps" && has) {
        c.reps = static_cast<int>(int_arg("--reps", argv[++i], 1, 100000));
      } else if (a == "--warmup" && has) {
        c.warmup = static_cast<int>(int_arg("--warmup", argv[++i], 0, 100000));
      } else if (a == "--csv" && has) {
        csv_path = argv[++i];
      } else if (a == "--list") {
        list = true;
      } else if (a == "--selftest") {
        self = true;
      } else {
        std::fprintf(stderr, kUsage, argv[0]);
        return 2;
      }
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "fi_cascade: %s\n", e.what());
    return 2;
  }
  if (self) return selftest();
  if (shapes.empty()) shapes = default_shapes();
  if (list) {  // no CUDA call
    std::printf(
        "id,P,S,B,hq,hkv,d,dtype,page,soft_cap,window_left,prefix_pages,pages,kv_bytes,"
        "instance\n");
    const fic::LevelEntry* inst = find_level(c);
    for (const Shape& s : shapes) {
      const Tables t = make_tables(s, c.page);
      const double kv_bytes = (s.prefix + double(s.batch) * s.suffix) * 2.0 * c.hkv * c.d * 2;
      std::printf("%s,%d,%d,%d,%d,%d,%d,%s,%d,%g,%d,%d,%lld,%.0f,%s\n", shape_id(s, c).c_str(),
                  s.prefix, s.suffix, s.batch, c.hq, c.hkv, c.d, fic::dtype_name(c.dtype), c.page,
                  c.soft_cap, c.window, t.pp, static_cast<long long>(t.num_pages), kv_bytes,
                  inst != nullptr ? inst->name : "NOT_BUILT");
    }
    std::printf("# %zu shapes; instances:%s\n", shapes.size(), instance_list().c_str());
    return 0;
  }

  FILE* csv = nullptr;
  if (!csv_path.empty() && (csv = std::fopen(csv_path.c_str(), "w")) == nullptr) {
    std::fprintf(stderr, "fi_cascade: cannot write %s\n", csv_path.c_str());
    return 1;
  }
  auto put = [&](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (csv) {
      std::fprintf(csv, "%s\n", line.c_str());
      std::fflush(csv);
    }
  };
  put("path,id,P,S,B,hq,hkv,d,dtype,median_us,min_us,floor_us,ratio_to_floor,check,note");
  try {
    // device-to-device copy of 2 GiB, bytes read + written over the median of 10 (bench_cascade)
    const DeviceCopy copy = open_device(cx.sms, cx.stream, cx.timer, std::size_t{2} << 30, 1, true);
    cx.copy_bw = copy.bytes_per_s;
    const std::string& dev_note = copy.device_note;
    std::string note =
        fmt("device-to-device cudaMemcpy of 2 GiB; %.1f GB/s = bytes read + written / median of 10 "
            "(the floor's bandwidth); %s; FlashInfer 0.7.2.post1 headers",
            cx.copy_bw / 1e9, dev_note.c_str());
    std::replace(note.begin(), note.end(), ',', ';');
    put(fmt("memcpy,d2d-2GiB,,,,,,,,%.2f,%.2f,,,-,%s", copy.median_us, copy.min_us, note.c_str()));
    std::fprintf(stderr,
                 "# %s; copy %.0f GB/s (read + written); floor: %.0f TFLOP/s\n# timing: %d "
                 "warm-up + %d timed calls per shape, L2 flushed before each (%zu MiB read); "
                 "instances:%s\n",
                 dev_note.c_str(), cx.copy_bw / 1e9, kTensorFlops / 1e12, c.warmup, c.reps,
                 cx.timer.flush_bytes >> 20, instance_list().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_cascade: %s\n", e.what());
    if (csv) std::fclose(csv);
    return 1;
  }
  int not_pass = 0;
  for (const Shape& s : shapes) {
    Row r;
    try {
      r = run_shape(s, cx);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "# %s: ERROR: %s\n", shape_id(s, c).c_str(), e.what());
      r.check = "ERROR";
      r.floor_us = floor_us(s, c, cx.copy_bw);
      r.note = std::string("error: ") + e.what();
      (void)cudaGetLastError();
    }
    not_pass += r.check != "PASS" && r.check != "UNSUPPORTED";
    put(csv_line(s, c, r));
  }
  if (csv) std::fclose(csv);
  std::fprintf(stderr, "# %zu shapes: %d not PASS (UNSUPPORTED rows excepted)\n", shapes.size(),
               not_pass);
  return not_pass == 0 ? 0 : 3;
}
