/// @file fi_decode.cu
/// @brief FlashInfer 0.7.2.post1's paged decode on one GPU (sm_90a), both of its paths, timed
///        and checked, as the same-run peer of bench/bench_decode.cu and
///        bench/bench_decode_serving.cu.
///
/// What `BatchDecodeWithPagedKVCacheWrapper` runs for bf16/f16 on sm_90 (flashinfer/decode.py;
/// the kernels in fi_decode_kernel.cu):
///  - `cuda_core` (use_tensor_cores=False): DecodePlan with the work estimation of the GQA group
///    size, then the CUDA-core decode kernel (plus VariableLengthMergeStates when the plan splits
///    the KV). Group sizes 1, 2, 3, 4, 6, 8 and 16 only, q_len 1 only.
///  - `tensor_core` (use_tensor_cores=True, backend "auto" -> "fa2" for 16-bit dtypes): PrefillPlan
///    with decode.py's arguments, then the fa2 paged batch prefill with the CTA tile the plan chose
///    (16, 64 or 128); causal for q_len > 1.
/// Both with sm_scale 1/sqrt(D), no window, soft cap or ALiBi, the LSE written, PDL on (`--no-pdl`
/// turns it off).
///
/// Shapes, in the order their options are given (several may be combined):
///  - `--uniform` (the default without any shape option): bench_decode's sweep, H_q/H_kv 32/8 and
///    64/8, batch {1, 4, 16, 64} x context {1k, 8k, 32k, 128k} (with `--quick`: bench_decode
///    --quick's {1, 16, 64} x {1k, 32k, 128k}), head dim 128, bf16, NHD pages of 16, ids
///    `u<H_q>-<B>x<ctx>`; `--uniform-points hq:batch:ctx,...` takes bench_decode's `--points`
///    list instead;
///  - `--serving [pages,shapes]`: bench_decode_serving's bf16 sections that FlashInfer's plain
///    decode covers, with its lengths and order: `pages` (pages of 16, 1, 2, 4, 8, 32, 64, 128, 3
///    and 5 tokens at batch 4 and 16 x 32k; ids `pages-<B>x32k-p<page>`), `shapes` (head dims 64
///    and 256 at group 4, groups 1, 2, 5, 7, 8, 16 at head dim 128, batch {1, 16} x {8k, 128k}, 8
///    KV heads; ids `shapes-d<D>-g<G>-<B>x<ctx>`); `--quick` drops what bench_decode_serving
///    --quick drops;
///  - `--points-file PATH`: the `--points` specs bench_decode_serving `--fi-spec PATH` writes for
///    its ragged section (the same lengths);
///  - `--points SPEC[;SPEC...]`, SPEC = hq:hkv:d:page:LENS[:flags] (see kPointsGrammar).
///
/// Per shape: random inputs in a paged cache with a CSR page table (0.5·N(0, 1) from a counter
/// hash, seeds 1/2/3 for K/V/Q; request b owns ceil(len_b / page) pages, in order or, with
/// scatter, a Fisher–Yates permutation with seed 7), FlashInfer's last_page_len = len − (pages −
/// 1)·page. Per path: plan from the host page indptr; one run into an output, LSE and float
/// workspace poisoned with NaN bytes, checked against a host fp64 reference (every request when
/// the shape's KV is at most 1 GiB, else the first, the last and the longest; every output value
/// must be finite; max|do| <= 2e-2, max|dlse| <= 5e-3 in natural log; FlashInfer's LSE is
/// log2-based); `--warmup` untimed and `--reps` timed calls (default 5 and 51), each timed alone
/// with CUDA events after an L2 flush (a 512 MiB read), the median and the minimum; the last
/// timed output compared with the checked one; the tensor-core output compared with the
/// CUDA-core output over every row. The first row (`memcpy`) is a 4 GiB device-to-device
/// cudaMemcpy, bytes read + written over the median of 10, measured in the same run;
/// `frac_of_copy` is a row's GB/s over it.
///
/// stdout (and `--csv PATH`): path,id,hq,hkv,d,page,batch,ctx,kv_bytes,median_us,min_us,gbps,
/// frac_of_copy,check,note (the columns bench/peers/plot_decode.py reads).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <numeric>
#include <thread>

#include "fi_decode.hpp"
#include "fi_harness.cuh"

namespace {

using i64 = std::int64_t;
using fic::dtype_name;
using fid::DType;
using fih::DevBuf;
using fih::DeviceCopy;
using fih::fill_randn;
using fih::fmt;
using fih::lut;
using fih::median;
using fih::num;
using fih::open_device;
using fih::splitmix64;
using fih::worse;
constexpr i64 kGiB = i64{1} << 30;
constexpr i64 kMiB = i64{1} << 20;
constexpr double kTolO = 2e-2;                    // max |o − o_ref|
constexpr double kTolLse = 5e-3;                  // max |lse − lse_ref|, natural log
constexpr double kLn2 = 0.693147180559945309417;  // FlashInfer's LSE is log2-based

// ---------------------------------------------------------------------------------------------
// Shapes

/// One decode shape: per-request lengths, heads, head dim, page size and the flags.
struct Shape {
  std::string id;
  int hq, hkv, d, page;
  std::vector<std::int32_t> lens;  // one per request
  int q_len = 1;
  bool hnd = false;
  fid::DType dtype = fid::DType::kBF16;
  bool scatter = false;  // page ids a random permutation of the pool

  int batch() const { return static_cast<int>(lens.size()); }
  int max_len() const { return *std::max_element(lens.begin(), lens.end()); }
  i64 tokens() const { return std::accumulate(lens.begin(), lens.end(), i64{0}); }
  i64 pages() const {
    i64 n = 0;
    for (std::int32_t len : lens) n += (len + i64{page} - 1) / page;
    return n;
  }
  i64 kv_bytes() const { return tokens() * hkv * d * 2 * 2; }
};

std::string count_text(i64 n) {
  return n % 1024 == 0 ? std::to_string(n / 1024) + "k" : std::to_string(n);
}

const char* const kPointsGrammar =
    "SPEC = hq:hkv:d:page:LENS[:flags]; LENS = BxCTX (B requests of CTX tokens; CTX may end in k "
    "= 1024) or a comma list of per-request lengths; flags, separated by ':', ',' or '+': hnd "
    "(HND pages), f16 (half, else bf16), q4 (q_len 4, causal; tensor-core path only), scatter "
    "(page ids a random permutation, fixed seed); several SPECs separated by ';'";

/// A non-negative decimal integer, with an optional k (x1024) suffix where `k_ok`.
i64 parse_count(const std::string& t, const char* what, bool k_ok) {
  std::size_t n = t.size();
  i64 mul = 1;
  if (k_ok && n > 0 && (t[n - 1] == 'k' || t[n - 1] == 'K')) {
    mul = 1024;
    --n;
  }
  if (n == 0 || n > 12)
    throw std::invalid_argument(std::string(what) + " '" + t + "' is not a number");
  i64 v = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (t[i] < '0' || t[i] > '9')
      throw std::invalid_argument(std::string(what) + " '" + t + "' is not a number" +
                                  (k_ok ? " (digits, optionally ending in k)" : " (digits)"));
    v = v * 10 + (t[i] - '0');
  }
  return v * mul;
}

std::vector<std::string> split_on(const std::string& s, const char* seps) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (std::strchr(seps, c) != nullptr) {
      out.push_back(cur);
      cur.clear();
    } else if (c != ' ' && c != '\t') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

/// A point's id: its spec in canonical form, `hq:hkv:d:page:LENS[:flag+flag]`, LENS `BxCTX` when
/// every request has the same length, else the lengths joined by '/' (up to 8 of them) or
/// `<B>lens-max<M>-sum<T>-<hash>` (CSV-safe: no ',').
std::string point_id(const Shape& s) {
  std::string id = std::to_string(s.hq) + ":" + std::to_string(s.hkv) + ":" + std::to_string(s.d) +
                   ":" + std::to_string(s.page) + ":";
  const bool same =
      std::all_of(s.lens.begin(), s.lens.end(), [&](std::int32_t l) { return l == s.lens[0]; });
  if (same) {
    id += std::to_string(s.batch()) + "x" + count_text(s.lens[0]);
  } else if (s.batch() <= 8) {
    for (int b = 0; b < s.batch(); ++b) id += (b ? "/" : "") + std::to_string(s.lens[b]);
  } else {
    std::uint32_t h = 2166136261u;  // FNV-1a over the lengths
    for (std::int32_t l : s.lens)
      for (int k = 0; k < 4; ++k)
        h = (h ^ ((static_cast<std::uint32_t>(l) >> (8 * k)) & 0xFF)) * 16777619u;
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", h);
    id += std::to_string(s.batch()) + "lens-max" + std::to_string(s.max_len()) + "-sum" +
          std::to_string(s.tokens()) + "-" + hex;
  }
  std::string flags;
  auto flag = [&flags](bool on, const char* name) {
    if (on) flags += (flags.empty() ? "" : "+") + std::string(name);
  };
  flag(s.hnd, "hnd");
  flag(s.dtype == fid::DType::kF16, "f16");
  flag(s.q_len == 4, "q4");
  flag(s.scatter, "scatter");
  if (!flags.empty()) id += ":" + flags;
  return id;
}

/// The head dims compiled for a dtype (from the registered kernel instances).
std::vector<int> compiled_head_dims(fid::DType dt) {
  std::vector<int> v;
  for (const fid::Entry& e : fid::registry())
    if (e.key.dtype == dt && std::find(v.begin(), v.end(), e.key.d) == v.end())
      v.push_back(e.key.d);
  std::sort(v.begin(), v.end());
  return v;
}

/// One `--points` argument: SPEC[;SPEC...]. Throws std::invalid_argument saying what is wrong.
std::vector<Shape> parse_points(const std::string& arg) {
  std::vector<Shape> out;
  for (const std::string& raw : split_on(arg, ";")) {
    if (raw.empty()) continue;
    try {
      const std::vector<std::string> f = split_on(raw, ":");
      if (f.size() < 5)
        throw std::invalid_argument("needs at least 5 ':'-separated fields (hq:hkv:d:page:LENS)");
      auto small = [](const std::string& t, const char* what) {
        const i64 v = parse_count(t, what, false);
        if (v < 1 || v > 65536)
          throw std::invalid_argument(std::string(what) + " " + t + " is outside [1, 65536]");
        return static_cast<int>(v);
      };
      Shape s{"", small(f[0], "hq"), small(f[1], "hkv"), small(f[2], "d"), small(f[3], "page"), {}};
      // LENS
      const std::string& lens = f[4];
      const std::size_t x = lens.find_first_of("xX");
      std::vector<i64> ls;
      if (x != std::string::npos) {
        const i64 b = parse_count(lens.substr(0, x), "batch (B of BxCTX)", false);
        const i64 ctx = parse_count(lens.substr(x + 1), "context (CTX of BxCTX)", true);
        if (b < 1 || b > (i64{1} << 20))
          throw std::invalid_argument("batch " + std::to_string(b) + " is outside [1, 1048576]");
        ls.assign(static_cast<std::size_t>(b), ctx);
      } else {
        for (const std::string& t : split_on(lens, ","))
          ls.push_back(parse_count(t, "request length", true));
        if (ls.size() > (std::size_t{1} << 20))
          throw std::invalid_argument("more than 1048576 request lengths");
      }
      for (i64 l : ls) {
        if (l < 1 || l > (i64{1} << 30))
          throw std::invalid_argument("request length " + std::to_string(l) +
                                      " is outside [1, 1073741824]");
        s.lens.push_back(static_cast<std::int32_t>(l));
      }
      // flags
      for (std::size_t i = 5; i < f.size(); ++i)
        for (const std::string& t : split_on(f[i], ",+")) {
          if (t.empty()) continue;
          if (t == "hnd") {
            s.hnd = true;
          } else if (t == "f16") {
            s.dtype = fid::DType::kF16;
          } else if (t == "q4") {
            s.q_len = 4;
          } else if (t == "scatter") {
            s.scatter = true;
          } else {
            throw std::invalid_argument("unknown flag '" + t + "' (hnd, f16, q4, scatter)");
          }
        }
      // what FlashInfer and this harness can take
      if (s.hq % s.hkv != 0)
        throw std::invalid_argument("hq " + std::to_string(s.hq) + " is not a multiple of hkv " +
                                    std::to_string(s.hkv));
      const std::vector<int> dims = compiled_head_dims(s.dtype);
      if (std::find(dims.begin(), dims.end(), s.d) == dims.end()) {
        std::string list;
        for (int d : dims) list += " " + std::to_string(d);
        throw std::invalid_argument("head dim " + std::to_string(s.d) + " is not compiled for " +
                                    dtype_name(s.dtype) + " (compiled:" + list + ")");
      }
      if (s.q_len > 1 && *std::min_element(s.lens.begin(), s.lens.end()) < s.q_len)
        throw std::invalid_argument(
            "q4 needs every request length >= 4 (FlashInfer's decode plan() raises ValueError "
            "when a kv_len is below q_len_per_req)");
      if (s.pages() > INT32_MAX)
        throw std::invalid_argument("more than 2^31 - 1 pages (FlashInfer's int32 page ids)");
      if (static_cast<i64>(s.batch()) * s.q_len * s.hq * s.d > INT32_MAX)
        throw std::invalid_argument("batch·q_len·hq·d exceeds 2^31 - 1 (int32 query offsets)");
      s.id = point_id(s);
      out.push_back(std::move(s));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("--points spec '" + raw + "': " + e.what());
    }
  }
  if (out.empty()) throw std::invalid_argument("--points '" + arg + "' holds no spec");
  return out;
}

/// A bench_decode point: H_q/8 heads, head dim 128, bf16, NHD pages of 16, `batch` requests of
/// `ctx` tokens; id `u<H_q>-<B>x<ctx>` (what plot_decode.py draws).
Shape uniform_shape(int hq, int batch, int ctx) {
  return Shape{"u" + std::to_string(hq) + "-" + std::to_string(batch) + "x" + count_text(ctx),
               hq,
               8,
               128,
               16,
               std::vector<std::int32_t>(batch, ctx)};
}

/// bench_decode's default sweep, or with `quick` its --quick sweep, in its order.
std::vector<Shape> uniform_shapes(bool quick) {
  const std::vector<int> batches =
      quick ? std::vector<int>{1, 16, 64} : std::vector<int>{1, 4, 16, 64};
  const std::vector<int> ctxs_k =
      quick ? std::vector<int>{1, 32, 128} : std::vector<int>{1, 8, 32, 128};
  std::vector<Shape> v;
  for (int hq : {32, 64})
    for (int batch : batches)
      for (int ctx_k : ctxs_k) v.push_back(uniform_shape(hq, batch, ctx_k * 1024));
  return v;
}

/// bench_decode's `--points hq:batch:ctx[,...]` (ctx in tokens or with a k suffix); throws
/// std::invalid_argument naming the bad item.
std::vector<Shape> parse_uniform_points(const std::string& arg) {
  std::vector<Shape> out;
  for (const std::string& item : split_on(arg, ",")) {
    if (item.empty()) continue;
    int hq = 0, batch = 0, ctx = 0, used = 0;
    char unit = 0;
    const int n = std::sscanf(item.c_str(), "%d:%d:%d%n%c", &hq, &batch, &ctx, &used, &unit);
    const bool k =
        n == 4 && (unit == 'k' || unit == 'K') && used + 1 == static_cast<int>(item.size());
    if (n < 3 || (!k && used != static_cast<int>(item.size())))
      throw std::invalid_argument("--uniform-points: '" + item +
                                  "' is not hq:batch:ctx (ctx in tokens, or with a k suffix)");
    if (k) ctx *= 1024;
    if (hq < 8 || hq % 8 != 0 || hq > 256 || batch < 1 || batch > 65536 || ctx < 1 ||
        ctx > (1 << 24))
      throw std::invalid_argument("--uniform-points: '" + item +
                                  "' needs hq a multiple of 8 in [8, 256] (8 KV heads), 1 <= batch "
                                  "<= 65536 and 1 <= ctx <= 16777216");
    out.push_back(uniform_shape(hq, batch, ctx));
  }
  if (out.empty()) throw std::invalid_argument("--uniform-points '" + arg + "' holds no point");
  return out;
}

/// bench_decode_serving's `pages` and `shapes` sections (32/8 heads, head dim 128, pages of 16
/// unless the section varies them), with its lengths and order; `quick` drops what its --quick
/// drops. Its `ragged` section comes from the spec file its --fi-spec writes (--points-file).
std::vector<Shape> serving_shapes(const std::string& sections, bool quick) {
  std::vector<Shape> v;
  for (const std::string& sec : {std::string("pages"), std::string("shapes")}) {
    if (sections.find(sec) == std::string::npos) continue;
    if (sec == "pages") {
      for (int batch : {4, 16})
        for (int page : {16, 1, 2, 4, 8, 32, 64, 128, 3, 5}) {
          if (quick && page != 16 && page != 1 && page != 8) continue;
          v.push_back(Shape{fmt("pages-%dx32k-p%d", batch, page), 32, 8, 128, page,
                            std::vector<std::int32_t>(batch, 32768)});
        }
    } else {
      const int shs[][2] = {{64, 4},  {256, 4}, {128, 1}, {128, 2},
                            {128, 5}, {128, 7}, {128, 8}, {128, 16}};  // head dim, group
      for (const auto& sh : shs)
        for (int batch : {1, 16})
          for (int ctx : {8192, 131072}) {
            if (quick && ctx == 131072 && batch == 16) continue;
            v.push_back(
                Shape{fmt("shapes-d%d-g%d-%dx%s", sh[0], sh[1], batch, count_text(ctx).c_str()),
                      8 * sh[1], 8, sh[0], 16, std::vector<std::int32_t>(batch, ctx)});
          }
    }
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Timing

/// `--timing chain`: `reps` calls queued back to back with no flush in between and one event pair
/// around them (so consecutive calls may overlap, e.g. through PDL); returns the mean µs per call.
template <class F>
double time_chain(cudaStream_t stream, int reps, int warmup, F&& f) {
  cudaEvent_t a, b;
  FIH_CUDA(cudaEventCreate(&a));
  FIH_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f();
  FIH_CUDA(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; ++i) f();
  FIH_CUDA(cudaEventRecord(b, stream));
  FIH_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  FIH_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0 * ms / reps;
}

// ---------------------------------------------------------------------------------------------
// Host fp64 reference

/// Everything about one shape's cache that the check needs.
struct ShapeData {
  std::vector<std::int32_t> indptr, indices, last_page_len;
  i64 num_pages = 0, page_elems = 0;
  const void* dk = nullptr;
  const void* dv = nullptr;
  std::vector<std::uint16_t> q;  // host copy, (batch·q_len, hq, d)
};

struct Reference {
  std::vector<int> reqs;    // the checked requests
  std::vector<double> o;    // (reqs·q_len, hq, d)
  std::vector<double> lse;  // (reqs·q_len, hq), natural log
  double seconds = 0;
};

/// Row t of request b attends keys [0, len_b − q_len + t] (decode.py: causal when q_len > 1).
Reference reference(const Shape& s, const ShapeData& sd, double scale) {
  const auto t0 = std::chrono::steady_clock::now();
  Reference r;
  const int B = s.batch();
  if (s.kv_bytes() <= kGiB) {
    r.reqs.resize(B);
    std::iota(r.reqs.begin(), r.reqs.end(), 0);
  } else {
    const int longest =
        static_cast<int>(std::max_element(s.lens.begin(), s.lens.end()) - s.lens.begin());
    r.reqs = {0, B - 1, longest};
    std::sort(r.reqs.begin(), r.reqs.end());
    r.reqs.erase(std::unique(r.reqs.begin(), r.reqs.end()), r.reqs.end());
  }
  // the checked requests' pages, copied to a compact host pool (runs of consecutive ids at once)
  std::vector<std::int32_t> src;
  for (int b : r.reqs)
    src.insert(src.end(), sd.indices.begin() + sd.indptr[b], sd.indices.begin() + sd.indptr[b + 1]);
  std::sort(src.begin(), src.end());
  src.erase(std::unique(src.begin(), src.end()), src.end());
  const std::size_t pe = static_cast<std::size_t>(sd.page_elems);
  std::vector<std::uint16_t> hk(src.size() * pe), hv(src.size() * pe);
  for (std::size_t i = 0; i < src.size();) {
    std::size_t j = i + 1;
    while (j < src.size() && src[j] == src[j - 1] + 1) ++j;
    const std::size_t off = static_cast<std::size_t>(src[i]) * pe * 2;
    FIH_CUDA(cudaMemcpy(hk.data() + i * pe, static_cast<const char*>(sd.dk) + off, (j - i) * pe * 2,
                        cudaMemcpyDeviceToHost));
    FIH_CUDA(cudaMemcpy(hv.data() + i * pe, static_cast<const char*>(sd.dv) + off, (j - i) * pe * 2,
                        cudaMemcpyDeviceToHost));
    i = j;
  }
  const float* L = lut(s.dtype).data();
  const int group = s.hq / s.hkv, D = s.d, P = s.page;
  const std::size_t rows = r.reqs.size() * s.q_len;
  r.o.assign(rows * s.hq * D, 0.0);
  r.lse.assign(rows * s.hq, -INFINITY);
  // one task per (checked request, query row, kv head): all `group` query heads at once
  const std::size_t tasks = rows * s.hkv;
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    std::vector<double> qd(static_cast<std::size_t>(group) * D), sc, acc(qd.size());
    std::vector<const std::uint16_t*> krow, vrow;
    for (std::size_t task; (task = next.fetch_add(1)) < tasks;) {
      const std::size_t row = task / s.hkv;  // checked row = ci · q_len + t
      const int kh = static_cast<int>(task % s.hkv);
      const int ci = static_cast<int>(row / s.q_len), t = static_cast<int>(row % s.q_len);
      const int b = r.reqs[ci];
      const int len = s.lens[b];
      const int visible = len - s.q_len + t + 1;
      if (visible <= 0) continue;
      const std::size_t qrow = static_cast<std::size_t>(b) * s.q_len + t;
      for (int g = 0; g < group; ++g)
        for (int e = 0; e < D; ++e) qd[g * D + e] = L[sd.q[(qrow * s.hq + kh * group + g) * D + e]];
      krow.resize(visible);
      vrow.resize(visible);
      for (int j = 0; j < visible; ++j) {
        const std::int32_t pid = sd.indices[sd.indptr[b] + j / P];
        const std::size_t hp =
            std::lower_bound(src.begin(), src.end(), pid) - src.begin();  // host page
        const int slot = j % P;
        const std::size_t off =
            s.hnd ? ((hp * s.hkv + kh) * P + slot) * D : ((hp * P + slot) * s.hkv + kh) * D;
        krow[j] = hk.data() + off;
        vrow[j] = hv.data() + off;
      }
      sc.assign(static_cast<std::size_t>(group) * visible, 0.0);
      for (int j = 0; j < visible; ++j) {
        const std::uint16_t* kp = krow[j];
        for (int g = 0; g < group; ++g) {
          const double* qp = qd.data() + g * D;
          double dot = 0;
          for (int e = 0; e < D; ++e) dot += qp[e] * L[kp[e]];
          sc[static_cast<std::size_t>(g) * visible + j] = dot * scale;
        }
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      std::vector<double> m(group, -INFINITY), sum(group, 0.0);
      for (int g = 0; g < group; ++g) {
        const double* sg = sc.data() + static_cast<std::size_t>(g) * visible;
        for (int j = 0; j < visible; ++j) m[g] = std::max(m[g], sg[j]);
      }
      for (int j = 0; j < visible; ++j) {
        const std::uint16_t* vp = vrow[j];
        for (int g = 0; g < group; ++g) {
          const double w = std::exp(sc[static_cast<std::size_t>(g) * visible + j] - m[g]);
          sum[g] += w;
          double* ag = acc.data() + g * D;
          for (int e = 0; e < D; ++e) ag[e] += w * L[vp[e]];
        }
      }
      for (int g = 0; g < group; ++g) {
        const int h = kh * group + g;
        for (int e = 0; e < D; ++e) r.o[(row * s.hq + h) * D + e] = acc[g * D + e] / sum[g];
        r.lse[row * s.hq + h] = m[g] + std::log(sum[g]);
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
  std::vector<std::uint16_t> o;
  std::vector<float> lse;  // as FlashInfer writes it (log2)
};

Output fetch(const fid::Problem& p, std::size_t o_elems, std::size_t lse_elems) {
  Output out;
  out.o.resize(o_elems);
  out.lse.resize(lse_elems);
  FIH_CUDA(cudaMemcpy(out.o.data(), p.o, o_elems * 2, cudaMemcpyDeviceToHost));
  FIH_CUDA(cudaMemcpy(out.lse.data(), p.lse, lse_elems * 4, cudaMemcpyDeviceToHost));
  return out;
}

struct Errors {
  double max_do = 0, max_dlse = 0;
  i64 nonfinite = 0;
  bool ok() const { return max_do <= kTolO && max_dlse <= kTolLse && nonfinite == 0; }
};

/// GPU output against the reference (checked rows), and every value for finiteness.
Errors against_reference(const Shape& s, const Output& g, const Reference& r) {
  Errors e;
  const float* L = lut(s.dtype).data();
  const int D = s.d;
  for (std::size_t ci = 0; ci < r.reqs.size(); ++ci)
    for (int t = 0; t < s.q_len; ++t) {
      const std::size_t grow = static_cast<std::size_t>(r.reqs[ci]) * s.q_len + t;
      const std::size_t rrow = ci * s.q_len + t;
      for (int h = 0; h < s.hq; ++h) {
        for (int x = 0; x < D; ++x)
          e.max_do = worse(e.max_do, std::fabs(L[g.o[(grow * s.hq + h) * D + x]] -
                                               r.o[(rrow * s.hq + h) * D + x]));
        e.max_dlse = worse(
            e.max_dlse,
            std::fabs(static_cast<double>(g.lse[grow * s.hq + h]) * kLn2 - r.lse[rrow * s.hq + h]));
      }
    }
  for (std::uint16_t x : g.o) e.nonfinite += !std::isfinite(L[x]);
  for (float x : g.lse) e.nonfinite += !std::isfinite(x);
  return e;
}

/// Two GPU outputs over every row.
Errors between(const Shape& s, const Output& a, const Output& b, bool* same_bits) {
  Errors e;
  const float* L = lut(s.dtype).data();
  for (std::size_t i = 0; i < a.o.size(); ++i)
    e.max_do = worse(e.max_do, std::fabs(L[a.o[i]] - L[b.o[i]]));
  for (std::size_t i = 0; i < a.lse.size(); ++i)
    e.max_dlse = worse(
        e.max_dlse,
        a.lse[i] == b.lse[i] ? 0.0 : std::fabs(static_cast<double>(a.lse[i]) - b.lse[i]) * kLn2);
  if (same_bits != nullptr)
    *same_bits = std::memcmp(a.o.data(), b.o.data(), a.o.size() * 2) == 0 &&
                 std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
  return e;
}

// ---------------------------------------------------------------------------------------------
// Rows

struct Row {
  std::string path;
  i64 kv_bytes = 0;
  double median_us = NAN, min_us = NAN, gbps = NAN, frac = NAN;
  std::string check = "ERROR";
  std::string note;
};

std::string csv_line(const Shape& s, const Row& r) {
  std::string note = r.note;
  std::replace(note.begin(), note.end(), ',', ';');
  return fmt("%s,%s,%d,%d,%d,%d,%d,%d,%lld,", r.path.c_str(), s.id.c_str(), s.hq, s.hkv, s.d,
             s.page, s.batch(), s.max_len(), static_cast<long long>(r.kv_bytes)) +
         num(r.median_us, "%.2f") + "," + num(r.min_us, "%.2f") + "," + num(r.gbps, "%.1f") + "," +
         num(r.frac, "%.4f") + "," + r.check + "," + note;
}

struct Context {
  int sms = 1;
  int reps = 51, warmup = 5;
  bool pdl = true;
  bool chain = false;  // --timing chain
  double copy_gbps = 0;
  cudaStream_t stream = nullptr;
  fih::Timer timer;
  std::vector<fid::Path> paths{fid::Path::kCudaCore, fid::Path::kTensorCore};
};

using fid::path_name;

const fid::Entry* find_instance(fid::Path path, const Shape& s) {
  for (const fid::Entry& e : fid::registry())
    if (e.key.path == path && e.key.dtype == s.dtype && e.key.d == s.d &&
        (path == fid::Path::kCudaCore || e.key.causal == (s.q_len > 1)))
      return &e;
  return nullptr;
}
/// The CSR page table: request b owns ceil(len_b / page) pages, ids in order or, with scatter, a
/// Fisher–Yates permutation with seed 7; FlashInfer's last_page_len = len − (pages − 1)·page.
void make_page_table(const Shape& s, ShapeData& sd) {
  const int B = s.batch();
  sd.indptr.assign(B + 1, 0);
  for (int b = 0; b < B; ++b) sd.indptr[b + 1] = sd.indptr[b] + (s.lens[b] + s.page - 1) / s.page;
  sd.indices.resize(sd.indptr[B]);
  std::iota(sd.indices.begin(), sd.indices.end(), 0);
  if (s.scatter) {
    std::uint64_t seed = 7;
    for (std::size_t i = sd.indices.size(); i > 1; --i)
      std::swap(sd.indices[i - 1], sd.indices[splitmix64(seed) % i]);
  }
  sd.last_page_len.resize(B);
  for (int b = 0; b < B; ++b) {
    const int pages = sd.indptr[b + 1] - sd.indptr[b];
    sd.last_page_len[b] = pages == 0 ? 0 : s.lens[b] - (pages - 1) * s.page;
  }
}

/// Runs one shape on every path, emitting one row per path.
void run_shape(const Shape& s, Context& cx, const std::function<void(const Row&)>& emit) {
  using clock = std::chrono::steady_clock;
  auto sec = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const auto t0 = clock::now();
  const cudaStream_t st = cx.stream;
  const int B = s.batch();
  ShapeData sd;
  make_page_table(s, sd);
  std::vector<std::int32_t> qo_indptr(B + 1);
  for (int b = 0; b <= B; ++b) qo_indptr[b] = b * s.q_len;
  sd.num_pages = std::max<i64>(1, sd.indptr[B]);
  sd.page_elems = static_cast<i64>(s.page) * s.hkv * s.d;
  const i64 tokens = static_cast<i64>(B) * s.q_len;  // query rows
  const std::size_t pool_elems = static_cast<std::size_t>(sd.num_pages * sd.page_elems);
  const std::size_t q_elems = static_cast<std::size_t>(tokens * s.hq * s.d);
  const std::size_t lse_elems = static_cast<std::size_t>(tokens * s.hq);

  DevBuf k(pool_elems * 2), v(pool_elems * 2), q(q_elems * 2), o(q_elems * 2);
  DevBuf lse(lse_elems * 4);
  DevBuf d_indptr(sd.indptr.size() * 4), d_indices(std::max<std::size_t>(1, sd.indices.size()) * 4);
  DevBuf d_last(static_cast<std::size_t>(B) * 4), d_qo(qo_indptr.size() * 4);
  fill_randn(k.p, pool_elems, s.dtype, 1, cx.sms, st);
  fill_randn(v.p, pool_elems, s.dtype, 2, cx.sms, st);
  fill_randn(q.p, q_elems, s.dtype, 3, cx.sms, st);
  FIH_CUDA(cudaMemcpyAsync(d_indptr.p, sd.indptr.data(), sd.indptr.size() * 4,
                           cudaMemcpyHostToDevice, st));
  FIH_CUDA(cudaMemcpyAsync(d_indices.p, sd.indices.data(), sd.indices.size() * 4,
                           cudaMemcpyHostToDevice, st));
  FIH_CUDA(cudaMemcpyAsync(d_last.p, sd.last_page_len.data(), sd.last_page_len.size() * 4,
                           cudaMemcpyHostToDevice, st));
  FIH_CUDA(
      cudaMemcpyAsync(d_qo.p, qo_indptr.data(), qo_indptr.size() * 4, cudaMemcpyHostToDevice, st));
  FIH_CUDA(cudaStreamSynchronize(st));
  sd.dk = k.p;
  sd.dv = v.p;
  sd.q.resize(q_elems);
  FIH_CUDA(cudaMemcpy(sd.q.data(), q.p, q_elems * 2, cudaMemcpyDeviceToHost));

  fid::Problem pr;
  pr.hq = s.hq;
  pr.hkv = s.hkv;
  pr.d = s.d;
  pr.page = s.page;
  pr.batch = B;
  pr.q_len = s.q_len;
  pr.hnd = s.hnd;
  pr.dtype = s.dtype;
  pr.num_pages = sd.num_pages;
  pr.h_page_indptr = sd.indptr.data();
  pr.k = k.p;
  pr.v = v.p;
  pr.q = q.p;
  pr.o = o.p;
  pr.lse = lse.as<float>();
  pr.page_indptr = d_indptr.as<std::int32_t>();
  pr.page_indices = d_indices.as<std::int32_t>();
  pr.last_page_len = d_last.as<std::int32_t>();
  pr.qo_indptr = d_qo.as<std::int32_t>();
  pr.sm_scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  pr.pdl = cx.pdl;
  pr.stream = st;

  std::string lens = std::to_string(s.lens[0]);
  if (std::any_of(s.lens.begin(), s.lens.end(), [&](std::int32_t l) { return l != s.lens[0]; })) {
    lens.clear();
    for (int b = 0; b < std::min(B, 8); ++b) lens += (b ? ";" : "") + std::to_string(s.lens[b]);
    if (B > 8)
      lens +=
          ";... (" + std::to_string(B) + " lengths, longest " + std::to_string(s.max_len()) + ")";
  }
  std::fprintf(stderr,
               "# %s: %d/%d heads, d %d, page %d %s, %s, batch %d, q_len %d, lens %s; KV %.1f MiB "
               "in %lld pages%s; setup %.2f s\n",
               s.id.c_str(), s.hq, s.hkv, s.d, s.page, s.hnd ? "HND" : "NHD", dtype_name(s.dtype),
               B, s.q_len, lens.c_str(), static_cast<double>(s.kv_bytes()) / kMiB,
               static_cast<long long>(sd.num_pages), s.scatter ? " (permuted)" : "",
               sec(clock::now() - t0));

  const std::string shape_note =
      fmt("q_len=%d layout=%s dtype=%s", s.q_len, s.hnd ? "HND" : "NHD", dtype_name(s.dtype));
  std::unique_ptr<Reference> ref;
  std::unique_ptr<Output> cuda_core_out;
  for (fid::Path path : cx.paths) {
    Row row;
    row.path = path_name(path);
    row.kv_bytes = s.kv_bytes();
    row.note = shape_note;
    try {
      const fid::Entry* inst = find_instance(path, s);
      if (inst == nullptr) {
        if (path == fid::Path::kCudaCore && s.q_len > 1) {
          row.check = "UNSUPPORTED";
          row.note +=
              " q_len_per_req>1 requires tensor-core decode (FlashInfer decode.py plan() "
              "raises ValueError; the CUDA-core kernel handles one query row per request)";
        } else {
          row.check = "NOT_BUILT";
          row.note +=
              fmt(" no %s instance built for %s head dim %d%s (CMake FI_DTYPES / "
                  "FI_HEAD_DIMS / FI_DECODE_PATHS / FI_DECODE_MASKS)",
                  row.path.c_str(), dtype_name(s.dtype), s.d, s.q_len > 1 ? " causal" : "");
        }
        emit(row);
        continue;
      }
      std::unique_ptr<fid::Runner> runner = inst->make();
      const auto p0 = clock::now();
      fid::PlanSummary ps;
      try {
        ps = runner->plan(pr);
      } catch (const fid::Unsupported& e) {
        row.check = "UNSUPPORTED";
        row.note += std::string(" FlashInfer refuses: ") + e.what();
        std::fprintf(stderr, "#   %s: UNSUPPORTED: %s\n", row.path.c_str(), e.what());
        emit(row);
        continue;
      }
      const double plan_s = sec(clock::now() - p0);
      std::string plan_note = fmt(" split_kv=%d padded_batch=%lld kv_chunk_tokens=%lld",
                                  ps.split_kv ? 1 : 0, ps.padded_batch, ps.kv_chunk_tokens);
      if (path == fid::Path::kTensorCore) plan_note += fmt(" cta_tile_q=%d", ps.cta_tile_q);
      if (ps.max_grid >= 0) plan_note += fmt(" max_grid=%lld", ps.max_grid);
      plan_note += fmt(" pdl=%d lse=1", cx.pdl ? 1 : 0);
      row.note += plan_note;

      // 1. one run into a poisoned output, LSE and float workspace
      FIH_CUDA(cudaMemsetAsync(o.p, 0xFF, q_elems * 2, st));
      FIH_CUDA(cudaMemsetAsync(lse.p, 0xFF, lse_elems * 4, st));
      if (runner->float_workspace_bytes() > 0)
        FIH_CUDA(
            cudaMemsetAsync(runner->float_workspace(), 0xFF, runner->float_workspace_bytes(), st));
      runner->run();
      FIH_CUDA(cudaStreamSynchronize(st));
      FIH_CUDA(cudaGetLastError());
      const Output first = fetch(pr, q_elems, lse_elems);
      if (!ref) ref = std::make_unique<Reference>(reference(s, sd, pr.sm_scale));
      const auto c0 = clock::now();
      const Errors ec = against_reference(s, first, *ref);
      const double check_s = sec(clock::now() - c0);
      bool pass = ec.ok();
      std::string what = ref->reqs.size() == static_cast<std::size_t>(B) ? "all" : "requests";
      if (ref->reqs.size() != static_cast<std::size_t>(B))
        for (std::size_t i = 0; i < ref->reqs.size(); ++i)
          what += (i ? ";" : ":") + std::to_string(ref->reqs[i]);
      row.note += fmt(" cpu_check=%s max_do=%.3e max_dlse=%.3e nonfinite=%lld", what.c_str(),
                      ec.max_do, ec.max_dlse, static_cast<long long>(ec.nonfinite));

      // 2. timing
      std::vector<double> us;
      if (cx.chain) {
        row.median_us = time_chain(st, cx.reps, cx.warmup, [&] { runner->run(); });
        us = {row.median_us};
        row.note += " timing=chain(mean of back-to-back calls; no flush)";
      } else {
        us = cx.timer.time(cx.reps, cx.warmup, true, [&] { runner->run(); });
        row.median_us = median(us);
        row.min_us = us.front();
      }
      row.gbps = static_cast<double>(row.kv_bytes) / (row.median_us * 1e-6) / 1e9;
      row.frac = row.gbps / cx.copy_gbps;
      // the last timed call's output against the checked one
      const Output last = fetch(pr, q_elems, lse_elems);
      bool same = false;
      const Errors er = between(s, last, first, &same);
      pass = pass && er.max_do <= kTolO && er.max_dlse <= kTolLse;
      row.note += same ? std::string(" repeat=same-bits")
                       : fmt(" repeat=DIFFERS(max_do=%.3e max_dlse=%.3e)", er.max_do, er.max_dlse);
      // the other path, every row
      std::string cross;
      if (path == fid::Path::kCudaCore) {
        cuda_core_out = std::make_unique<Output>(first);
      } else if (cuda_core_out) {
        const Errors ex = between(s, first, *cuda_core_out, nullptr);
        pass = pass && ex.max_do <= kTolO && ex.max_dlse <= kTolLse;
        cross = fmt(" vs_cuda_core(all rows) max_do=%.3e max_dlse=%.3e", ex.max_do, ex.max_dlse);
        row.note += cross;
      }
      row.check = pass ? "PASS" : "FAIL";
      std::fprintf(stderr,
                   "#   %s:%s (plan %.3f s, workspace float %zu B int %zu B)\n"
                   "#     check (%s, reference %.2f s, compare %.2f s): max|do| %.3e, max|dlse| "
                   "%.3e, %lld non-finite -> %s%s\n"
                   "#     %d calls: median %.2f us, min %.2f, max %.2f; %.0f GB/s = %.3f of "
                   "copy; last call %s\n",
                   row.path.c_str(), plan_note.c_str(), plan_s, ps.float_ws, ps.int_ws,
                   what.c_str(), ref->seconds, check_s, ec.max_do, ec.max_dlse,
                   static_cast<long long>(ec.nonfinite), row.check.c_str(), cross.c_str(), cx.reps,
                   row.median_us, row.min_us, us.back(), row.gbps, row.frac,
                   same ? "has the checked bits" : "DIFFERS from the checked output");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "#   %s: ERROR: %s\n", row.path.c_str(), e.what());
      row.check = "ERROR";
      row.note += std::string(" error: ") + e.what();
      (void)cudaGetLastError();
    }
    emit(row);
  }
  std::fprintf(stderr, "#   wall %.2f s\n", sec(clock::now() - t0));
}

/// `--selftest`: the host reference (paged, compact host pool, threads) against a dense brute force
/// written from the page table directly, on small random caches covering what `--points` can ask
/// for: NHD/HND, page sizes 1/4/8/16, permuted page ids, group sizes 2/3/4/6, f16 and q_len 4
/// (causal). Needs a device only for the copies.
int selftest() {
  std::vector<Shape> cases;
  auto mk = [&](const char* id, int hq, int hkv, int d, int page,
                std::vector<std::int32_t> lens) -> Shape& {
    cases.push_back(Shape{id, hq, hkv, d, page, std::move(lens)});
    return cases.back();
  };
  mk("nhd", 32, 8, 64, 16, {37, 1, 100});
  mk("layout-hnd", 8, 2, 128, 16, {50, 17}).hnd = true;
  mk("page-1", 16, 8, 64, 1, {5, 9, 1});
  mk("permuted-pages", 32, 8, 64, 4, {33, 8, 21}).scatter = true;
  mk("group3-half", 24, 8, 64, 16, {19, 64}).dtype = fid::DType::kF16;
  mk("q4-causal", 32, 8, 64, 16, {4, 10, 23}).q_len = 4;
  {
    Shape& h = mk("q4-permuted-hnd", 12, 2, 64, 8, {7, 30});
    h.q_len = 4;
    h.hnd = true;
    h.scatter = true;
  }
  int bad = 0;
  std::uint64_t rng = 12345;
  for (const Shape& s : cases) {
    const int B = s.batch();
    ShapeData sd;
    make_page_table(s, sd);
    sd.num_pages = sd.indptr[B] + 3;  // a few pages nobody owns
    sd.page_elems = static_cast<i64>(s.page) * s.hkv * s.d;
    const std::size_t pool = static_cast<std::size_t>(sd.num_pages * sd.page_elems);
    const float* L = lut(s.dtype).data();
    auto rnd16 = [&] {  // a finite value of the dtype in about [-2, 2]
      for (;;) {
        const std::uint16_t u = static_cast<std::uint16_t>(splitmix64(rng));
        const float f = L[u];
        if (std::isfinite(f) && std::fabs(f) < 2.f) return u;
      }
    };
    std::vector<std::uint16_t> hk(pool), hv(pool);
    for (auto& x : hk) x = rnd16();
    for (auto& x : hv) x = rnd16();
    sd.q.resize(static_cast<std::size_t>(B) * s.q_len * s.hq * s.d);
    for (auto& x : sd.q) x = rnd16();
    DevBuf dk(pool * 2), dv(pool * 2);
    FIH_CUDA(cudaMemcpy(dk.p, hk.data(), pool * 2, cudaMemcpyHostToDevice));
    FIH_CUDA(cudaMemcpy(dv.p, hv.data(), pool * 2, cudaMemcpyHostToDevice));
    sd.dk = dk.p;
    sd.dv = dv.p;
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
    const Reference r = reference(s, sd, scale);
    // dense brute force: element (token j, kv head kh, feature e) of request b
    auto at = [&](const std::vector<std::uint16_t>& pool_v, int b, int j, int kh, int e) {
      const i64 page = sd.indices[sd.indptr[b] + j / s.page], slot = j % s.page;
      const i64 idx = s.hnd ? page * sd.page_elems + (kh * s.page + slot) * s.d + e
                            : page * sd.page_elems + (slot * s.hkv + kh) * s.d + e;
      return static_cast<double>(L[pool_v[idx]]);
    };
    double max_do = 0, max_dlse = 0;
    for (std::size_t ci = 0; ci < r.reqs.size(); ++ci) {
      const int b = r.reqs[ci];
      for (int t = 0; t < s.q_len; ++t)
        for (int h = 0; h < s.hq; ++h) {
          const int kh = h / (s.hq / s.hkv);
          const int n = s.lens[b] - s.q_len + t + 1;  // keys 0..len-q_len+t
          std::vector<double> sc(n);
          double m = -INFINITY;
          for (int j = 0; j < n; ++j) {
            double dot = 0;
            for (int e = 0; e < s.d; ++e)
              dot +=
                  static_cast<double>(
                      L[sd.q[((static_cast<std::size_t>(b) * s.q_len + t) * s.hq + h) * s.d + e]]) *
                  at(hk, b, j, kh, e);
            sc[j] = dot * scale;
            m = std::max(m, sc[j]);
          }
          double sum = 0;
          for (int j = 0; j < n; ++j) sum += std::exp(sc[j] - m);
          const std::size_t row = ci * s.q_len + t;
          for (int e = 0; e < s.d; ++e) {
            double o = 0;
            for (int j = 0; j < n; ++j) o += std::exp(sc[j] - m) / sum * at(hv, b, j, kh, e);
            max_do = std::max(max_do, std::fabs(o - r.o[(row * s.hq + h) * s.d + e]));
          }
          max_dlse = std::max(max_dlse, std::fabs(m + std::log(sum) - r.lse[row * s.hq + h]));
        }
    }
    // the comparison helpers on outputs rounded from the reference
    Output g;
    g.o.resize(static_cast<std::size_t>(B) * s.q_len * s.hq * s.d);
    g.lse.resize(static_cast<std::size_t>(B) * s.q_len * s.hq);
    for (std::size_t ci = 0; ci < r.reqs.size(); ++ci)
      for (int t = 0; t < s.q_len; ++t)
        for (int h = 0; h < s.hq; ++h) {
          const std::size_t grow = static_cast<std::size_t>(r.reqs[ci]) * s.q_len + t;
          const std::size_t rrow = ci * s.q_len + t;
          for (int e = 0; e < s.d; ++e)
            g.o[(grow * s.hq + h) * s.d + e] =
                fih::round16(static_cast<float>(r.o[(rrow * s.hq + h) * s.d + e]), s.dtype);
          g.lse[grow * s.hq + h] = static_cast<float>(r.lse[rrow * s.hq + h] / kLn2);
        }
    const Errors e = against_reference(s, g, r);
    bool same = false;
    const Errors e2 = between(s, g, g, &same);
    const bool ok = max_do < 1e-12 && max_dlse < 1e-12 && r.reqs.size() == s.lens.size() &&
                    e.ok() && e.max_do < 1e-2 && e.max_dlse < 1e-6 && same && e2.max_do == 0;
    bad += !ok;
    std::printf(
        "selftest %-18s reference vs dense: max|do| %.2e max|dlse| %.2e; rounded output vs "
        "reference: max|do| %.2e max|dlse| %.2e nonfinite %lld -> %s\n",
        s.id.c_str(), max_do, max_dlse, e.max_do, e.max_dlse, static_cast<long long>(e.nonfinite),
        ok ? "ok" : "BAD");
  }
  return bad == 0 ? 0 : 4;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t end = std::min(s.find(',', pos), s.size());
    if (end > pos) out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

/// The compiled kernel instances, sorted, for the log and `--list`.
std::string instance_list() {
  std::vector<const fid::Entry*> v;
  for (const fid::Entry& e : fid::registry()) v.push_back(&e);
  std::sort(v.begin(), v.end(), [](const fid::Entry* a, const fid::Entry* b) {
    const int c = std::strcmp(a->name, b->name);
    return c != 0 ? c < 0 : a->key.d < b->key.d;
  });
  std::string out;
  for (const fid::Entry* e : v) out += fmt(" [%s, head dim %d]", e->name, e->key.d);
  return out;
}

/// What `--list` expects of one path for a shape (no CUDA call; FlashInfer's plan decides).
std::string expectation(fid::Path path, const Shape& s) {
  if (path == fid::Path::kCudaCore && s.q_len > 1)
    return "UNSUPPORTED (q_len>1 needs the tensor-core path)";
  if (find_instance(path, s) == nullptr) return "NOT_BUILT";
  const int group = s.hq / s.hkv;
  if (path == fid::Path::kCudaCore && group != 1 && group != 2 && group != 3 && group != 4 &&
      group != 6 && group != 8 && group != 16)
    return fmt("UNSUPPORTED expected (group %d; DecodePlan dispatches 1 2 3 4 6 8 16)", group);
  return "ok";
}

const char* const kUsage =
    "usage: %s [--uniform] [--uniform-points hq:batch:ctx[,...]] [--serving [pages,shapes]] "
    "[--points-file PATH] [--points SPEC[;SPEC...]] [--quick] [--csv PATH] [--only id1,id2] "
    "[--paths cuda_core,tensor_core] [--reps N] [--warmup N] [--no-pdl] [--timing flush|chain] "
    "[--list] [--selftest]\n"
    "  without a shape option: the uniform sweep (--uniform); shape options may be combined and "
    "repeated, the shapes run in the order given\n  %s\n"
    "  e.g. --points "
    "'64:8:128:16:8x16k;16:2:256:16:2x64k:f16;32:4:128:32:1000,20000,3000:hnd+scatter'\n";
}  // namespace

/// The shapes of the shape options, in their order (`quick` applies to every --uniform and
/// --serving, wherever it is given); throws std::invalid_argument saying what is wrong.
std::vector<Shape> expand_sources(const std::vector<std::pair<std::string, std::string>>& sources,
                                  bool quick) {
  std::vector<Shape> shapes;
  for (const auto& [opt, arg] : sources) {
    std::vector<Shape> v;
    if (opt == "--uniform") {
      v = uniform_shapes(quick);
    } else if (opt == "--uniform-points") {
      v = parse_uniform_points(arg);
    } else if (opt == "--serving") {
      v = serving_shapes(arg, quick);
    } else if (opt == "--points-file") {
      std::FILE* f = std::fopen(arg.c_str(), "r");
      if (f == nullptr) throw std::invalid_argument("--points-file: cannot read '" + arg + "'");
      std::string text;
      char buf[1 << 16];
      for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
      std::fclose(f);
      for (char& ch : text)  // one spec a line is taken too
        if (ch == '\n' || ch == '\r') ch = ';';
      v = parse_points(text);
    } else {
      v = parse_points(arg);
    }
    shapes.insert(shapes.end(), v.begin(), v.end());
  }
  return shapes;
}

int main(int argc, char** argv) {
  std::string csv_path, only;
  Context cx;
  std::vector<std::pair<std::string, std::string>> sources;  // shape options, in order
  bool quick = false, list = false, self = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const bool has = i + 1 < argc;
      if (a == "--uniform") {
        sources.emplace_back(a, "");
      } else if (a == "--serving") {  // the sections are optional: both by default
        const bool arg = has && argv[i + 1][0] != '-';
        const std::string secs = arg ? argv[++i] : "pages,shapes";
        for (const std::string& x : split_list(secs))
          if (x != "pages" && x != "shapes")
            throw std::invalid_argument(
                "--serving: expected sections pages and/or shapes (the "
                "ragged section comes with --points-file), got '" +
                x + "'");
        sources.emplace_back(a, secs);
      } else if ((a == "--uniform-points" || a == "--points-file" || a == "--points") && has) {
        sources.emplace_back(a, argv[++i]);
      } else if (a == "--quick") {
        quick = true;
      } else if (a == "--csv" && has) {
        csv_path = argv[++i];
      } else if (a == "--only" && has) {
        only = argv[++i];
      } else if (a == "--paths" && has) {
        cx.paths.clear();
        for (const std::string& p : split_list(argv[++i])) {
          if (p == "cuda_core")
            cx.paths.push_back(fid::Path::kCudaCore);
          else if (p == "tensor_core")
            cx.paths.push_back(fid::Path::kTensorCore);
          else
            throw std::invalid_argument("--paths: expected cuda_core and/or tensor_core, got '" +
                                        p + "'");
        }
        if (cx.paths.empty()) throw std::invalid_argument("--paths: no path given");
      } else if (a == "--reps" && has) {
        cx.reps = static_cast<int>(fih::int_arg("--reps", argv[++i], 1, 100000));
      } else if (a == "--warmup" && has) {
        cx.warmup = static_cast<int>(fih::int_arg("--warmup", argv[++i], 0, 100000));
      } else if (a == "--no-pdl") {
        cx.pdl = false;
      } else if (a == "--timing" && has) {
        const std::string t = argv[++i];
        if (t != "flush" && t != "chain")
          throw std::invalid_argument("--timing: expected flush or chain, got '" + t + "'");
        cx.chain = t == "chain";
      } else if (a == "--selftest") {
        self = true;
      } else if (a == "--list") {
        list = true;
      } else {
        std::fprintf(stderr, kUsage, argv[0], kPointsGrammar);
        return 2;
      }
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "fi_decode: %s\n", e.what());
    return 2;
  }
  if (self) {
    try {
      return selftest();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fi_decode --selftest: %s\n", e.what());
      return 1;
    }
  }
  if (sources.empty()) sources.emplace_back("--uniform", "");
  std::vector<Shape> shapes;
  try {
    shapes = expand_sources(sources, quick);
  } catch (const std::invalid_argument& e) {
    const bool spec = std::strstr(e.what(), "--points") != nullptr;
    std::fprintf(stderr, "fi_decode: %s\n%s%s", e.what(), spec ? "  " : "",
                 spec ? (std::string(kPointsGrammar) + "\n").c_str() : "");
    return 2;
  }
  if (!only.empty()) {
    std::vector<Shape> picked;
    for (const std::string& id : split_list(only)) {
      auto it =
          std::find_if(shapes.begin(), shapes.end(), [&](const Shape& s) { return s.id == id; });
      if (it == shapes.end()) {
        std::fprintf(stderr, "unknown shape id '%s' (--list prints them)\n", id.c_str());
        return 2;
      }
      picked.push_back(*it);
    }
    shapes = picked;
  }
  if (list) {  // the parsed shapes, no CUDA call
    std::printf("id,hq,hkv,d,page,batch,ctx,q_len,layout,dtype,pages,page_ids,kv_bytes,lens");
    for (fid::Path p : cx.paths) std::printf(",%s", path_name(p));
    std::printf("\n");
    for (const Shape& s : shapes) {
      std::string lens;
      for (int b = 0; b < std::min(s.batch(), 8); ++b)
        lens += (b ? ";" : "") + std::to_string(s.lens[b]);
      if (s.batch() > 8) lens += fmt(";... (%d lengths)", s.batch());
      std::printf("%s,%d,%d,%d,%d,%d,%d,%d,%s,%s,%lld,%s,%lld,%s", s.id.c_str(), s.hq, s.hkv, s.d,
                  s.page, s.batch(), s.max_len(), s.q_len, s.hnd ? "HND" : "NHD",
                  dtype_name(s.dtype), static_cast<long long>(s.pages()),
                  s.scatter ? "permuted" : "in order", static_cast<long long>(s.kv_bytes()),
                  lens.c_str());
      for (fid::Path p : cx.paths) std::printf(",%s", expectation(p, s).c_str());
      std::printf("\n");
    }
    std::printf("# %zu shapes; kernel instances:%s\n", shapes.size(), instance_list().c_str());
    return 0;
  }
  Row copy_row;
  std::string device_note;
  try {
    {  // device-to-device copy of 4 GiB: bytes read + written over the median of 10
      const DeviceCopy copy =
          open_device(cx.sms, cx.stream, cx.timer, std::size_t{4} << 30, 2, false);
      cx.copy_gbps = copy.bytes_per_s / 1e9;
      copy_row.path = "memcpy";
      copy_row.kv_bytes = static_cast<i64>(std::size_t{4} << 30);
      copy_row.median_us = copy.median_us;
      copy_row.min_us = copy.min_us;
      copy_row.gbps = cx.copy_gbps;
      copy_row.frac = 1.0;
      copy_row.check = "-";
      device_note = copy.device_note;
      copy_row.note =
          "device-to-device cudaMemcpy of 4 GiB; gbps = bytes read + written / median of 10; " +
          device_note + "; FlashInfer 0.7.2.post1 headers";
    }
    std::fprintf(stderr,
                 "# %s; device-to-device copy of 4 GiB: %.0f GB/s (read + written)\n# timing: %d "
                 "warm-up + %d timed calls per shape and path, L2 flushed before each (%zu MiB "
                 "read%s); pdl %d; kernel instances:",
                 device_note.c_str(), cx.copy_gbps, cx.warmup, cx.reps, cx.timer.flush_bytes >> 20,
                 cx.chain ? "; --timing chain: NO flush, calls back to back, mean" : "",
                 cx.pdl ? 1 : 0);
    std::fprintf(stderr, "%s\n", instance_list().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fi_decode: %s\n", e.what());
    return 1;
  }
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (!csv_path.empty() && csv == nullptr) {
    std::fprintf(stderr, "fi_decode: cannot write %s\n", csv_path.c_str());
    return 1;
  }
  const char* header =
      "path,id,hq,hkv,d,page,batch,ctx,kv_bytes,median_us,min_us,gbps,frac_of_copy,check,note";
  auto put = [&](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (csv) {
      std::fprintf(csv, "%s\n", line.c_str());
      std::fflush(csv);
    }
  };
  put(header);
  {  // the copy: no heads, page, batch or context
    std::string note = copy_row.note;
    std::replace(note.begin(), note.end(), ',', ';');
    put(fmt("memcpy,d2d-4GiB,,,,,,,%lld,%.2f,%.2f,%.1f,%.4f,-,%s",
            static_cast<long long>(copy_row.kv_bytes), copy_row.median_us, copy_row.min_us,
            copy_row.gbps, copy_row.frac, note.c_str()));
  }
  int failures = 0, unsupported = 0, rows = 0;
  for (const Shape& s : shapes) {
    try {
      run_shape(s, cx, [&](const Row& r) {
        ++rows;
        failures += r.check != "PASS" && r.check != "UNSUPPORTED";
        unsupported += r.check == "UNSUPPORTED";
        put(csv_line(s, r));
      });
    } catch (const std::exception& e) {  // setup failed: one ERROR row per path
      std::fprintf(stderr, "# %s: ERROR: %s\n", s.id.c_str(), e.what());
      (void)cudaGetLastError();
      for (fid::Path p : cx.paths) {
        Row r;
        r.path = path_name(p);
        r.kv_bytes = s.kv_bytes();
        r.note = std::string("setup error: ") + e.what();
        ++rows;
        ++failures;
        put(csv_line(s, r));
      }
    }
  }
  if (csv) std::fclose(csv);
  std::fprintf(stderr, "# %zu shapes, %d rows: %d not PASS (besides %d UNSUPPORTED)\n",
               shapes.size(), rows, failures, unsupported);
  return failures == 0 ? 0 : 3;
}
