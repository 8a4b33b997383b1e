/// @file plans.cpp
/// @brief Bindings of split-KV decode and cascade attention (GQA and MLA) as plan/run pairs. A
///        plan is made on the host once (CUDA: `plan_decode`, `plan_cascade`, `plan_mla_decode`,
///        `plan_mla_cascade`; host arrays: the options the CPU backend takes); each run imports
///        its arrays and launches on the caller's stream.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "catalog/catalog.hpp"
#include "common/cascade_validate.hpp"

namespace attnstate {
namespace py {

namespace {

#if defined(ATTNSTATE_HAS_CUDA)
using CudaDecodePlan = cuda::DecodePlan;
using CudaCascadePlan = cuda::CascadePlan;
using CudaMlaPlan = cuda::MlaDecodePlan;
using CudaMlaCascadePlan = cuda::MlaCascadePlan;
#else
struct NoPlan {  // a build without CUDA plans for the CPU only
  std::size_t workspace_bytes() const { return 0; }
};
using CudaDecodePlan = NoPlan;
using CudaCascadePlan = NoPlan;
using CudaMlaPlan = NoPlan;
using CudaMlaCascadePlan = NoPlan;
#endif

// What a Python plan object holds: the CPU options and, for a CUDA device, the CUDA plan.
template <class Plan, class Options>
struct PyPlan {
  bool device = false;
  Options options;
  Plan plan;
  std::size_t workspace_bytes() const { return device ? plan.workspace_bytes() : 0; }
};

struct PyDecodePlan : PyPlan<CudaDecodePlan, DecodeOptions> {
  DecodeProblem problem;
};

struct PyCascadePlan : PyPlan<CudaCascadePlan, CascadeOptions> {
  std::int64_t batch = 0;
  std::int64_t q_len = 1, heads_q = 0, head_dim = 0;  // the queries' shape a run must have
  int num_levels = 0;
  DType kv_dtype = DType::kF32;  // an fp8 dtype: the pools are uint8 arrays of it
};

// The MLA layout a plan fixes: the queries' shape and the dtypes every run must have.
struct MlaLayout {
  std::int64_t q_len = 1, heads = 0;
  std::int64_t kv_lora_rank = kMlaKvLoraRank, rope_dim = kMlaRopeDim;
  DType q_dtype = DType::kBF16, ckv_dtype = DType::kBF16, kpe_dtype = DType::kBF16;
};

// An MLA decode plan (a run's batch may be smaller than the plan's).
struct PyMlaPlan : PyPlan<CudaMlaPlan, DecodeOptions>, MlaLayout {
  std::int64_t batch = 0;
};

// An MLA cascade plan: the layout, the batch the levels serve (every run's), the pool's page
// size and the number of levels.
struct PyMlaCascadePlan : PyPlan<CudaMlaCascadePlan, CascadeOptions>, MlaLayout {
  std::int64_t batch = 0, page_size = 0;
  int num_levels = 0;
};

// A run's queries against the plan's shape (batch is free: a run may have fewer requests),
// named 'q', before any other argument is compared with them (an `out` allocated from the plan
// would otherwise be blamed for q's mistake).
void check_q_against_plan(const Call& c, const ConstTensorView& q, std::int64_t q_len,
                          std::int64_t heads_q, std::int64_t head_dim) {
  if (q.shape[1] == q_len && q.shape[2] == heads_q && q.shape[3] == head_dim) return;
  c.fail("q",
         "shape (batch, " + std::to_string(q_len) + ", " + std::to_string(heads_q) + ", " +
             std::to_string(head_dim) + ") (the plan's q_len, heads_q and head_dim)",
         "(" + std::to_string(q.shape[0]) + ", " + std::to_string(q.shape[1]) + ", " +
             std::to_string(q.shape[2]) + ", " + std::to_string(q.shape[3]) + ")");
}

// The checks a CPU plan makes at plan time, as the CUDA plan does (named by the Python keywords):
// the problem's shape and dtypes, the scale and the split policy against the lengths. The CPU
// backend takes any head_dim and any KV dtype; fp8 queries are not supported. `ctas_per_split`:
// the tasks of one split of a request (plan_split_layout), as the run will plan them.
void check_cpu_decode_plan(const char* fn, const DecodeProblem& pr, const DecodeOptions& options,
                           const std::int32_t* lens, std::int64_t ctas_per_split) {
  const auto str = [](std::int64_t v) { return std::to_string(v); };
  if (pr.q_len < 1 || pr.q_len > 8) detail::throw_argument(fn, "q_len", "1..8", str(pr.q_len));
  if (pr.heads_kv < 1) detail::throw_argument(fn, "heads_kv", ">= 1", str(pr.heads_kv));
  if (pr.heads_q < 1 || pr.heads_q % pr.heads_kv != 0)
    detail::throw_argument(fn, "heads_q", "a positive multiple of heads_kv = " + str(pr.heads_kv),
                           str(pr.heads_q));
  if (pr.head_dim < 1) detail::throw_argument(fn, "head_dim", ">= 1", str(pr.head_dim));
  if (is_fp8(pr.q_dtype))
    detail::throw_argument(fn, "dtype", "float32, float16 or bfloat16 (the queries' dtype)",
                           to_string(pr.q_dtype), Status::kNotSupported);
  if (!std::isfinite(options.scale)) {
    std::ostringstream got;
    got << options.scale;
    detail::throw_argument(fn, "scale", "a finite value (None: 1/sqrt(head_dim))", got.str());
  }
  if (options.policy == SplitPolicy::kFixedCount &&
      (options.num_splits < 1 || options.num_splits > kMaxSplits))
    detail::throw_argument(fn, "num_splits",
                           "1.." + str(kMaxSplits) + " with policy=\"fixed_count\"",
                           str(options.num_splits));
  if (options.policy == SplitPolicy::kFixedSize &&
      (options.split_size <= 0 || options.split_size % kSplitGranularity != 0))
    detail::throw_argument(fn, "split_size", "a positive multiple of 16 with policy=\"fixed_size\"",
                           str(options.split_size));
  std::int64_t max_len = 0;
  for (std::int64_t b = 0; b < pr.batch; ++b) {
    if (lens[b] < 0)
      detail::throw_argument(fn, "seq_lens", "lengths >= 0",
                             str(lens[b]) + " at request " + str(b));
    max_len = std::max<std::int64_t>(max_len, lens[b]);
  }
  if (options.policy == SplitPolicy::kFixedSize &&
      (max_len + options.split_size - 1) / options.split_size > kMaxSplits)
    detail::throw_argument(fn, "split_size",
                           "at most " + str(kMaxSplits) + " splits for the longest request (" +
                               str(max_len) + " tokens)",
                           str(options.split_size));
  // and every rule of the layout the run will plan (the lengths' too)
  plan_split_layout(pr, lens, options, cpu::num_threads(), ctas_per_split, fn, "seq_lens",
                    "options");
}

SplitPolicy parse_policy(const char* fn, const std::string& p) {
  if (p == "auto") return SplitPolicy::kAuto;
  if (p == "fixed_count") return SplitPolicy::kFixedCount;
  if (p == "fixed_size") return SplitPolicy::kFixedSize;
  detail::throw_argument(fn, "policy", "\"auto\", \"fixed_count\" or \"fixed_size\"",
                         "\"" + p + "\"");
}

KvLayout parse_layout(const Call& c, const std::string& l) {
  if (l == "NHD") return KvLayout::kNHD;
  if (l == "HND") return KvLayout::kHND;
  c.fail("layout", "\"NHD\" or \"HND\"", "\"" + l + "\"");
}

int device_sms(int device) {
#if defined(ATTNSTATE_HAS_CUDA)
  int sms = 0;
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
#else
  (void)device;
  detail::throw_argument("attnstate.Decode.plan", "device",
                         "None (this build of attnstate has no CUDA backend)", "a CUDA device",
                         Status::kNotSupported);
#endif
}

// A pool of the fp8 dtype `fp8`: an array of that dtype (torch's float8 tensors, ml_dtypes'
// NumPy arrays) or a uint8 array of the stored bytes (e.g. `k.view(torch.uint8)`, for array
// libraries without fp8 dtypes), of rank `ndim`.
ConstTensorView fp8_pool(Call& c, nb::handle h, const char* name, DType fp8, int ndim = 4) {
  const Array a = c.array(h, name, ndim);
  DType dt = DType::kF32;
  const bool bytes = a.dtype() == nb::dtype<std::uint8_t>();
  if (!bytes && !(to_dtype(a.dtype(), &dt) && dt == fp8))
    c.fail(name,
           std::string("an array of the plan's kv_dtype ") + to_string(fp8) +
               ", or a uint8 array of its stored bytes",
           "dtype " + dtype_name(a.dtype()));
  if (a.shape(ndim - 1) > 1 && a.stride(ndim - 1) != 1)
    c.fail(name, "a contiguous last dimension (stride 1)",
           "stride " + std::to_string(a.stride(ndim - 1)));
  ConstTensorView t;
  t.data = a.data();
  t.dtype = fp8;
  t.rank = ndim;
  for (int i = 0; i < ndim; ++i) {
    t.shape[i] = static_cast<std::int64_t>(a.shape(i));
    t.stride[i] = a.stride(i);
  }
  t.space = c.space();
  return t;
}

// The dequantisation scale `scale` of a pool of `dt`, named `name` (the Python keyword): a
// finite float > 0 for an fp8 pool, 1 (the keyword's None) for any other.
KvScale pool_scale(const Call& c, const char* name, float scale, DType dt) {
  std::ostringstream got;
  got << scale;
  if (!is_fp8(dt) && scale != 1.f)
    c.fail(name,
           std::string("None (a scale applies to an fp8 cache; this one is ") + to_string(dt) + ")",
           got.str());
  if (!(scale > 0.f) || !std::isfinite(scale))
    c.fail(name, "a finite scale > 0 (real value = stored value x scale)", got.str());
  return KvScale::per_tensor(scale);
}

// The paged pools: k and v `[pages, page_size, H_kv, D]` (NHD) or `[pages, H_kv, page_size, D]`
// (HND), each page dense; pages may be strided (page_stride = k's first stride). For an fp8
// `kv_dtype` (the plan's) they are uint8 arrays of the stored bytes, read with the scales
// `k_scale` and `v_scale`.
PagedKvCache kv_pools(Call& c, nb::handle k, nb::handle v, const std::string& layout,
                      DType kv_dtype, float k_scale, float v_scale) {
  PagedKvCache kv;
  kv.layout = parse_layout(c, layout);
  const bool fp8 = is_fp8(kv_dtype);
  const ConstTensorView tk = fp8 ? fp8_pool(c, k, "k", kv_dtype) : c.tensor(k, "k", 4);
  const ConstTensorView tv = fp8 ? fp8_pool(c, v, "v", kv_dtype) : c.tensor(v, "v", 4);
  for (int i = 0; i < 4; ++i) {
    if (tv.shape[i] != tk.shape[i] || tv.stride[i] != tk.stride[i])
      c.fail("v", "the shape and strides of k", "another shape or strides");
  }
  if (tv.dtype != tk.dtype)
    c.fail("v", std::string("dtype ") + to_string(tk.dtype) + " (as k)", to_string(tv.dtype));
  const bool nhd = kv.layout == KvLayout::kNHD;
  kv.num_pages = tk.shape[0];
  kv.page_size = nhd ? tk.shape[1] : tk.shape[2];
  kv.heads_kv = nhd ? tk.shape[2] : tk.shape[1];
  kv.head_dim = tk.shape[3];
  // inside a page: [page_size, H_kv, D] or [H_kv, page_size, D], dense (extents of 1 aside)
  const bool dense = (tk.shape[2] <= 1 || tk.stride[2] == tk.shape[3]) &&
                     (tk.shape[1] <= 1 || tk.stride[1] == tk.shape[2] * tk.shape[3]);
  if (!dense)
    c.fail("k", "pages laid out densely inside (only the page stride may be larger)",
           "strides (" + std::to_string(tk.stride[0]) + ", " + std::to_string(tk.stride[1]) + ", " +
               std::to_string(tk.stride[2]) + ", " + std::to_string(tk.stride[3]) + ")");
  kv.page_stride = tk.stride[0];
  kv.k = tk.data;
  kv.v = tv.data;
  kv.dtype = tk.dtype;
  kv.space = c.space();
  kv.k_scale = pool_scale(c, "k_scale", k_scale, kv.dtype);
  kv.v_scale = pool_scale(c, "v_scale", v_scale, kv.dtype);
  return kv;
}

// The attention sinks of a run (None: none): a 1-D float32 array of `heads_q` natural-base
// logits, imported after q (so an array in other memory than q's is an error naming 'sinks').
AttentionSinks sinks_of(Call& c, nb::handle sinks, std::int64_t heads_q) {
  AttentionSinks s;
  if (sinks.is_none()) return s;
  std::int64_t n = 0;
  s.logits = c.float32_vector(sinks, "sinks", &n);
  if (n != heads_q)
    c.fail("sinks", "heads_q = " + std::to_string(heads_q) + " logits (one per query head)",
           std::to_string(n));
  return s;
}

// The page table and lengths of a run into `kv` (a PagedKvCache or an MlaKvCache): int32
// `seq_lens`, and a CSR table (page_indptr, page_indices) or a block table (None for absent; the
// library checks that exactly one is given).
template <class Kv>
void read_page_table(Call& c, Kv* kv, nb::handle seq_lens, nb::handle page_indptr,
                     nb::handle page_indices, nb::handle block_table) {
  kv->seq_lens = c.int32_vector(seq_lens, "seq_lens", &kv->batch);
  std::int64_t n_indptr = 0;
  kv->page_indptr = c.int32_vector(page_indptr, "page_indptr", &n_indptr, true);
  kv->page_indices = c.int32_vector(page_indices, "page_indices", nullptr, true);
  if (!block_table.is_none()) {
    std::int64_t rows = 0;
    kv->block_table = c.int32_matrix(block_table, "block_table", &rows, &kv->block_table_stride);
  }
}

struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// The run's workspace (None for none), after checking that the arrays imported so far are in
// the memory the plan was made for (`device`: a CUDA plan).
// `first`: the run's first array argument, named in that error.
Workspace workspace_of(Call& c, nb::handle workspace, bool device, const char* first = "q") {
  if (device && c.space() == MemorySpace::kHost)
    c.fail(first, "CUDA arrays (the plan was made for a CUDA device)", "host arrays");
  if (!device && c.space() == MemorySpace::kDevice)
    c.fail(first, "host arrays (the plan was made for the CPU)", "CUDA arrays");
  Workspace w;
  if (!workspace.is_none()) {
    Array a = c.array(workspace, "workspace", 1);
    w.data = const_cast<void*>(a.data());
    w.bytes = a.nbytes();
  }
  return w;
}

// What a run imports after its inputs, in this order (so an error names the first wrong
// argument): `out`, the sinks of `heads` query heads, the workspace (after checking that the
// arrays are in the plan's memory: `first` names the run's first array) and the stream.
struct RunEnd {
  StateView out;
  AttentionSinks sinks;
  Workspace workspace;
  void* stream = nullptr;
};

RunEnd run_end(Call& c, nb::handle out, nb::handle sinks, std::int64_t heads, nb::handle workspace,
               bool device, nb::handle stream, const char* first = "q") {
  RunEnd r;
  r.out = c.state(out, "out");
  r.sinks = sinks_of(c, sinks, heads);
  r.workspace = workspace_of(c, workspace, device, first);
  r.stream = c.stream(stream);
  return r;
}

// The variant of a plan (window_left: -1 for none; logits_soft_cap: 0 for none), checked with
// the Python keywords' names. `device_refuses`: a CUDA cascade plan refuses a window when the
// catalog holds no level kernel taking one: silently ignoring a window would return plain
// attention as if it were the variant.
AttentionVariant plan_variant(const char* fn, std::int64_t window_left, float logits_soft_cap,
                              bool device_refuses) {
  const auto number = [](float x) {
    std::ostringstream ss;
    ss << x;
    return ss.str();
  };
  AttentionVariant v;
  v.window_left = window_left;
  v.logits_soft_cap = logits_soft_cap;
  if (window_left < kNoWindow)
    detail::throw_argument(fn, "window_left", "an int >= 0, or None for no window",
                           std::to_string(window_left));
  if (logits_soft_cap != 0.f && !(std::isfinite(logits_soft_cap) && logits_soft_cap > 0.f))
    detail::throw_argument(fn, "logits_soft_cap", "a finite cap > 0, or None for no cap",
                           number(logits_soft_cap));
  // the CUDA cascade's level kernels take what the catalog says (host arrays run the CPU's)
  catalog::Query levels;
  levels.family = catalog::Family::kCascadeMma;
  levels.variants = catalog::variants_of(window_left, 0.f);
  if (device_refuses && !catalog::compiled(levels))
    detail::throw_argument(fn, "window_left",
                           "None on a CUDA device (this build's CUDA cascade takes no window: " +
                               catalog::not_supported_message(levels) +
                               "; host arrays run it on the CPU)",
                           std::to_string(window_left), Status::kNotSupported);
  return v;
}

PyDecodePlan plan_decode(nb::handle seq_lens, std::int64_t q_len, std::int64_t heads_q,
                         std::int64_t heads_kv, std::int64_t head_dim, DType q_dtype,
                         DType kv_dtype, float scale, const std::string& policy, int num_splits,
                         int split_size, std::int64_t window_left, float logits_soft_cap,
                         int device, int num_sms) {
  const char* fn = "attnstate.Decode.plan";
  Call c(fn);
  std::int64_t batch = 0;
  const std::int32_t* lens = c.int32_vector(seq_lens, "seq_lens", &batch);
  if (c.space() != MemorySpace::kHost)
    c.fail("seq_lens", "a host array (the plan reads the lengths on the host)", "a CUDA array");
  PyDecodePlan p;
  p.problem = DecodeProblem{batch, q_len, heads_q, heads_kv, head_dim, q_dtype, kv_dtype};
  p.options.scale = scale;
  p.options.policy = parse_policy(fn, policy);
  p.options.num_splits = num_splits;
  p.options.split_size = split_size;
  p.device = device >= 0;
  p.options.variant = plan_variant(fn, window_left, logits_soft_cap, false);
  if (!p.device) {
    check_cpu_decode_plan(fn, p.problem, p.options, lens, p.problem.heads_kv);
    return p;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  if (num_sms <= 0) num_sms = device_sms(device);
  p.plan = cuda::plan_decode(p.problem, lens, p.options, num_sms);
#else
  device_sms(device);
#endif
  return p;
}

void init_decode_workspace(const PyDecodePlan& p, nb::handle workspace, nb::handle stream) {
  if (!p.device || p.workspace_bytes() == 0) return;
#if defined(ATTNSTATE_HAS_CUDA)
  Call c("attnstate.Decode.plan");
  Array ws = c.array(workspace, "workspace", 1);
  [[maybe_unused]] void* s = c.stream(stream);
  cuda::init_decode_workspace(p.plan, const_cast<void*>(ws.data()), ws.nbytes(),
                              static_cast<cudaStream_t>(s));
#endif
}

void run_decode(const PyDecodePlan& p, nb::handle q, nb::handle k, nb::handle v,
                nb::handle seq_lens, nb::handle page_indptr, nb::handle page_indices,
                nb::handle block_table, const std::string& layout, nb::handle out,
                nb::handle workspace, nb::handle stream, float k_scale, float v_scale,
                nb::handle sinks) {
  Call c("attnstate.Decode.run");
  const ConstTensorView tq = c.tensor(q, "q", 4);
  check_q_against_plan(c, tq, p.problem.q_len, p.problem.heads_q, p.problem.head_dim);
  PagedKvCache kv = kv_pools(c, k, v, layout, p.problem.kv_dtype, k_scale, v_scale);
  read_page_table(c, &kv, seq_lens, page_indptr, page_indices, block_table);
  const RunEnd e = run_end(c, out, sinks, tq.shape[2], workspace, p.device, stream);
  if (c.space() == MemorySpace::kHost) {
    nb::gil_scoped_release unlocked;
    cpu::decode(tq, kv, p.options, e.sinks, e.out);
    return;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  cuda::run_decode(p.plan, tq, kv, e.sinks, e.out, e.workspace.data, e.workspace.bytes,
                   static_cast<cudaStream_t>(e.stream));
#endif
}

// Level arrays as a tuple (request_indptr, page_indptr, page_indices or None, seg_lens).
std::vector<CascadeLevel> levels_of(Call& c, const std::vector<nb::tuple>& levels) {
  std::vector<CascadeLevel> out;
  for (size_t i = 0; i < levels.size(); ++i) {
    const std::string name = "levels[" + std::to_string(i) + "]";
    if (levels[i].size() != 4)
      c.fail(name, "(request_indptr, page_indptr, page_indices, seg_lens)",
             std::to_string(levels[i].size()) + " items");
    CascadeLevel l;
    std::int64_t n = 0, m = 0;
    l.request_indptr = c.int32_vector(levels[i][0], name + ".request_indptr", &n);
    l.page_indptr = c.int32_vector(levels[i][1], name + ".page_indptr", &m);
    l.page_indices = c.int32_vector(levels[i][2], name + ".page_indices", nullptr, true);
    l.seg_lens = c.int32_vector(levels[i][3], name + ".seg_lens", &l.num_segments);
    if (n != l.num_segments + 1 || m != l.num_segments + 1)
      c.fail(name,
             "request_indptr and page_indptr of len(seg_lens) + 1 = " +
                 std::to_string(l.num_segments + 1) + " entries",
             std::to_string(n) + " and " + std::to_string(m));
    out.push_back(l);
  }
  return out;
}

// The levels a plan reads, which must be host arrays.
std::vector<CascadeLevel> host_levels_of(Call& c, const std::vector<nb::tuple>& levels) {
  std::vector<CascadeLevel> host = levels_of(c, levels);
  if (c.space() != MemorySpace::kHost)
    c.fail("levels", "host arrays (the plan reads them on the host)", "CUDA arrays");
  return host;
}

// The checks a CPU cascade plan (GQA or MLA) makes after its heads and widths, named by the
// Python keywords: the pool's geometry, the queries' dtype, the scale at key width `key_dim` and
// the levels against the batch, q_len, causal masking and the pool, by the library's own level
// checks. The CPU backend takes any KV dtype and an empty batch; fp8 queries are not supported.
void check_cpu_levels_plan(const char* fn, const CascadeLevel* levels, int num_levels,
                           std::int64_t batch, std::int64_t q_len, const CascadeOptions& options,
                           std::int64_t key_dim, std::int64_t page_size, std::int64_t num_pages,
                           DType dtype) {
  const auto str = [](std::int64_t v) { return std::to_string(v); };
  detail::check_min(fn, "page_size", page_size, 1);
  detail::check_min(fn, "num_pages", num_pages, 0);
  if (is_fp8(dtype))
    detail::throw_argument(fn, "dtype", "float32, float16 or bfloat16 (the queries' dtype)",
                           to_string(dtype), Status::kNotSupported);
  detail::resolve_scale(fn, "scale", options.scale, key_dim);
  if (num_levels < 1 || num_levels > kMaxCascadeLevels)
    detail::throw_argument(fn, "levels", "1.." + str(kMaxCascadeLevels) + " levels",
                           str(num_levels));
  if (batch == 0) return;  // a run of no requests reads no level
  PagedKvCache pool;       // the scalars the level checks read
  pool.page_size = page_size;
  pool.num_pages = num_pages;
  detail::check_cascade_levels(fn, levels, num_levels, batch, q_len, options.causal, pool, false);
}

// The batch and q_len of a cascade plan (the CPU's limits, named by the Python keywords).
void check_cascade_batch(const char* fn, std::int64_t batch, std::int64_t q_len) {
  detail::check_min(fn, "batch", batch, 0);
  if (q_len < 1 || q_len > kMaxCascadeQueryLen)
    detail::throw_argument(fn, "q_len", "1.." + std::to_string(kMaxCascadeQueryLen),
                           std::to_string(q_len));
}

// The checks a CPU GQA cascade plan makes at plan time, as the CUDA plan does: what
// `cpu::cascade_attention` would refuse at run of queries, pools and levels of this plan's
// shape. The CPU backend takes any head_dim and a window.
void check_cpu_cascade_plan(const char* fn, const PyCascadePlan& p, const CascadeLevel* levels,
                            std::int64_t heads_kv, std::int64_t page_size, std::int64_t num_pages,
                            DType dtype) {
  check_cascade_batch(fn, p.batch, p.q_len);
  detail::check_min(fn, "heads_kv", heads_kv, 1);
  if (p.heads_q < 1 || p.heads_q % heads_kv != 0)
    detail::throw_argument(fn, "heads_q",
                           "a positive multiple of heads_kv = " + std::to_string(heads_kv),
                           std::to_string(p.heads_q));
  detail::check_min(fn, "head_dim", p.head_dim, 1);
  check_cpu_levels_plan(fn, levels, p.num_levels, p.batch, p.q_len, p.options, p.head_dim,
                        page_size, num_pages, dtype);
}

PyCascadePlan plan_cascade(const std::vector<nb::tuple>& levels, std::int64_t batch,
                           std::int64_t q_len, std::int64_t heads_q, std::int64_t heads_kv,
                           std::int64_t head_dim, std::int64_t page_size, std::int64_t num_pages,
                           DType dtype, DType kv_dtype, float scale, bool causal,
                           std::int64_t window_left, float logits_soft_cap, int device,
                           int num_sms) {
  Call c("attnstate.Cascade.plan");
  const std::vector<CascadeLevel> host = host_levels_of(c, levels);
  PyCascadePlan p;
  p.batch = batch;
  p.q_len = q_len;
  p.heads_q = heads_q;
  p.head_dim = head_dim;
  p.options.scale = scale;
  p.options.causal = causal;
  p.num_levels = static_cast<int>(host.size());
  p.device = device >= 0;
  p.kv_dtype = kv_dtype;
  p.options.variant =
      plan_variant("attnstate.Cascade.plan", window_left, logits_soft_cap, p.device);
  if (!p.device) {
    check_cpu_cascade_plan("attnstate.Cascade.plan", p, host.data(), heads_kv, page_size, num_pages,
                           dtype);
    return p;
  }
  catalog::Query kernels;
  kernels.family = catalog::Family::kCascadeMma;
  kernels.q = catalog::mask(dtype);
  kernels.kv = catalog::mask(kv_dtype);
  if (p.device && kv_dtype != dtype && !catalog::compiled(kernels)) {
    kernels.kv = catalog::kAnyDType;
    c.fail("kv_dtype",
           "K/V " + catalog::dtypes_string(catalog::dtypes(kernels, true)) + " under " +
               to_string(dtype) +
               " queries on a CUDA device (the CUDA cascade's compiled kernels; host arrays run "
               "on the CPU)",
           to_string(kv_dtype), Status::kNotSupported);
  }
#if defined(ATTNSTATE_HAS_CUDA)
  if (p.device) {
    if (num_sms <= 0) num_sms = device_sms(device);
    cuda::CascadeShape shape{batch,    q_len,     heads_q,   heads_kv,
                             head_dim, page_size, num_pages, dtype};
    if (kv_dtype != dtype) shape.kv_dtype = kv_dtype;
    p.plan = cuda::plan_cascade(shape, host.data(), p.num_levels, p.options, num_sms);
  }
#else
  (void)num_sms;
  device_sms(device);
#endif
  return p;
}

void run_cascade(const PyCascadePlan& p, nb::handle q, nb::handle k, nb::handle v,
                 const std::vector<nb::tuple>& levels, const std::string& layout, nb::handle out,
                 nb::handle workspace, nb::handle stream, float k_scale, float v_scale,
                 nb::handle sinks) {
  Call c("attnstate.Cascade.run");
  const ConstTensorView tq = c.tensor(q, "q", 4);
  check_q_against_plan(c, tq, p.q_len, p.heads_q, p.head_dim);
  const PagedKvCache kv = kv_pools(c, k, v, layout, p.kv_dtype, k_scale, v_scale);
  const std::vector<CascadeLevel> lv = levels_of(c, levels);
  const RunEnd e = run_end(c, out, sinks, tq.shape[2], workspace, p.device, stream);
  if (c.space() == MemorySpace::kHost) {
    nb::gil_scoped_release unlocked;
    cpu::cascade_attention(tq, kv, lv.data(), static_cast<int>(lv.size()), p.options, e.sinks,
                           e.out);
    return;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  cuda::run_cascade(p.plan, tq, kv, lv.data(), static_cast<int>(lv.size()), e.sinks, e.out,
                    e.workspace.data, e.workspace.bytes, static_cast<cudaStream_t>(e.stream));
#endif
}

// ---- MLA decode -------------------------------------------------------------------------------

// Rank of an array argument before importing it (its `ndim`, else its `shape`'s length; 0 when
// it has neither, for the import to refuse by name).
int rank_of(nb::handle h) {
  if (nb::hasattr(h, "ndim")) return nb::cast<int>(h.attr("ndim"));
  if (nb::hasattr(h, "shape")) return static_cast<int>(nb::len(nb::object(h.attr("shape"))));
  return 0;
}

// One part of the latent cache, named `name` ("ckv" or "kpe"), of the plan's dtype `dt`:
// FlashInfer's `(pages, page_size, width)` or FlashMLA's `(pages, page_size, 1, width)` (a view
// of its 576-wide pool), the last dim contiguous; an fp8 part as an array of that fp8 dtype or a
// uint8 array of its bytes. Any page and token strides: the library checks them.
ConstTensorView mla_part(Call& c, nb::handle h, const char* name, DType dt) {
  const int ndim = rank_of(h) == 4 ? 4 : 3;
  const ConstTensorView t = is_fp8(dt) ? fp8_pool(c, h, name, dt, ndim) : c.tensor(h, name, ndim);
  if (t.dtype != dt)
    c.fail(name,
           std::string("dtype ") + to_string(dt) + " (the plan's " +
               (name[0] == 'c' ? "kv_dtype" : "kpe_dtype") + ")",
           to_string(t.dtype));
  if (ndim == 4 && t.shape[2] != 1)
    c.fail(name, "(pages, page_size, 1, width): one latent head",
           "shape[2] = " + std::to_string(t.shape[2]));
  return t;
}

// The latent queries of a run against the plan's layout, named 'q_nope', before any other
// argument is compared with them (an `out` allocated from the plan would otherwise be blamed).
// `batch`: the batch a run must have (a cascade's), or -1 for any.
ConstTensorView mla_queries(Call& c, const MlaLayout& p, nb::handle q_nope, std::int64_t batch) {
  const ConstTensorView qn = c.tensor(q_nope, "q_nope", 4);
  const auto str = [](std::int64_t v) { return std::to_string(v); };
  if ((batch >= 0 && qn.shape[0] != batch) || qn.shape[1] != p.q_len || qn.shape[2] != p.heads ||
      qn.shape[3] != p.kv_lora_rank)
    c.fail("q_nope",
           "shape (" + (batch >= 0 ? str(batch) : std::string("batch")) + ", " + str(p.q_len) +
               ", " + str(p.heads) + ", " + str(p.kv_lora_rank) + ") (the plan's " +
               (batch >= 0 ? "batch, " : "") + "q_len, heads and kv_lora_rank)",
           "(" + str(qn.shape[0]) + ", " + str(qn.shape[1]) + ", " + str(qn.shape[2]) + ", " +
               str(qn.shape[3]) + ")");
  if (qn.dtype != p.q_dtype)
    c.fail("q_nope", std::string("dtype ") + to_string(p.q_dtype) + " (the plan's dtype)",
           to_string(qn.dtype));
  return qn;
}

// The per-token block scales of an fp8 latent part `ckv` (the view `a`), the float32 array
// `h` named 'ckv_block_scales': `(pages, page_size, blocks)` or `(pages, page_size, 1, blocks)`
// (FlashMLA's 4 scales of each 656-byte row, a float32 view of its bytes 512..527), blocks of
// `kv_lora_rank / blocks` columns; any page and token strides (the library checks them).
MlaBlockScale mla_block_scales(Call& c, nb::handle h, const ConstTensorView& a, float ckv_scale) {
  const char* name = "ckv_block_scales";
  if (!is_fp8(a.dtype))
    c.fail(name,
           std::string("None (block scales apply to an fp8 latent part; this one is ") +
               to_string(a.dtype) + ")",
           "an array");
  if (ckv_scale != 1.f) {
    std::ostringstream got;
    got << ckv_scale;
    c.fail("ckv_scale", "None with ckv_block_scales (the block scales are the whole scale)",
           got.str());
  }
  const int ndim = rank_of(h) == 4 ? 4 : 3;
  const ConstTensorView s = c.tensor(h, name, ndim);
  const auto str = [](std::int64_t v) { return std::to_string(v); };
  if (s.dtype != DType::kF32) c.fail(name, "dtype float32", to_string(s.dtype));
  if (s.shape[0] != a.shape[0] || s.shape[1] != a.shape[1])
    c.fail(name,
           "the pages and page_size of ckv (" + str(a.shape[0]) + ", " + str(a.shape[1]) + ")",
           "(" + str(s.shape[0]) + ", " + str(s.shape[1]) + ")");
  if (ndim == 4 && s.shape[2] != 1)
    c.fail(name, "(pages, page_size, 1, blocks): one latent head", "shape[2] = " + str(s.shape[2]));
  const std::int64_t rank = a.shape[a.rank - 1];
  const std::int64_t blocks = s.shape[ndim - 1];
  if (blocks < 1 || rank % blocks != 0)
    c.fail(name, "a last extent dividing kv_lora_rank = " + str(rank), str(blocks));
  MlaBlockScale bs;
  bs.data = static_cast<const float*>(s.data);
  bs.block_cols = rank / blocks;
  bs.token_stride = s.shape[1] > 1 ? s.stride[1] : 0;
  bs.page_stride = s.shape[0] > 1 ? s.stride[0] : 0;
  return bs;
}

// The latent cache of a run from its two parts (ckv, kpe) and scales (per tensor, or the latent
// part's block scales when `ckv_block_scales` is not None), of the plan's dtypes and widths;
// extents of 1 take the dense stride (an array library may report any stride for them).
MlaKvCache mla_cache(Call& c, const MlaLayout& p, nb::handle ckv, nb::handle kpe, float ckv_scale,
                     float kpe_scale, nb::handle ckv_block_scales) {
  const ConstTensorView a = mla_part(c, ckv, "ckv", p.ckv_dtype);
  const ConstTensorView b = mla_part(c, kpe, "kpe", p.kpe_dtype);
  const int last = a.rank - 1;
  if (b.shape[0] != a.shape[0] || b.shape[1] != a.shape[1])
    c.fail("kpe",
           "the pages and page_size of ckv (" + std::to_string(a.shape[0]) + ", " +
               std::to_string(a.shape[1]) + ")",
           "(" + std::to_string(b.shape[0]) + ", " + std::to_string(b.shape[1]) + ")");
  MlaKvCache kv;
  kv.ckv = a.data;
  kv.kpe = b.data;
  kv.ckv_dtype = a.dtype;
  kv.kpe_dtype = b.dtype;
  kv.kv_lora_rank = a.shape[last];
  kv.rope_dim = b.shape[b.rank - 1];
  kv.num_pages = a.shape[0];
  kv.page_size = a.shape[1];
  kv.ckv_token_stride = a.shape[1] > 1 ? a.stride[1] : 0;
  kv.ckv_page_stride = a.shape[0] > 1 ? a.stride[0] : 0;
  kv.kpe_token_stride = b.shape[1] > 1 ? b.stride[1] : 0;
  kv.kpe_page_stride = b.shape[0] > 1 ? b.stride[0] : 0;
  kv.ckv_scale = pool_scale(c, "ckv_scale", ckv_scale, kv.ckv_dtype);
  kv.kpe_scale = pool_scale(c, "kpe_scale", kpe_scale, kv.kpe_dtype);
  if (!ckv_block_scales.is_none())
    kv.ckv_block_scale = mla_block_scales(c, ckv_block_scales, a, ckv_scale);
  kv.space = c.space();
  if (kv.rope_dim != p.rope_dim)
    c.fail("kpe", "width rope_dim = " + std::to_string(p.rope_dim) + " (the plan's)",
           std::to_string(kv.rope_dim));
  if (kv.kv_lora_rank != p.kv_lora_rank)
    c.fail("ckv", "width kv_lora_rank = " + std::to_string(p.kv_lora_rank) + " (the plan's)",
           std::to_string(kv.kv_lora_rank));
  return kv;
}

// The CPU's checks of an MLA layout (any heads and widths >= 1), named by the Python keywords.
void check_cpu_mla_layout(const char* fn, const MlaLayout& l) {
  detail::check_min(fn, "heads", l.heads, 1);
  detail::check_min(fn, "kv_lora_rank", l.kv_lora_rank, 1);
  detail::check_min(fn, "rope_dim", l.rope_dim, 1);
}

#if defined(ATTNSTATE_HAS_CUDA)
// The CUDA MLA problem of a plan's layout and batch.
cuda::MlaDecodeProblem cuda_mla_problem(const MlaLayout& l, std::int64_t batch) {
  cuda::MlaDecodeProblem pr;
  pr.batch = batch;
  pr.q_len = l.q_len;
  pr.heads = l.heads;
  pr.kv_lora_rank = l.kv_lora_rank;
  pr.rope_dim = l.rope_dim;
  pr.q_dtype = l.q_dtype;
  pr.ckv_dtype = l.ckv_dtype;
  pr.kpe_dtype = l.kpe_dtype;
  return pr;
}
#endif

PyMlaPlan plan_mla_decode(nb::handle seq_lens, std::int64_t q_len, std::int64_t heads,
                          std::int64_t kv_lora_rank, std::int64_t rope_dim, DType q_dtype,
                          DType ckv_dtype, DType kpe_dtype, float scale, const std::string& policy,
                          int num_splits, int split_size, int device, int num_sms) {
  const char* fn = "attnstate.MlaDecode.plan";
  Call c(fn);
  PyMlaPlan p;
  const std::int32_t* lens = c.int32_vector(seq_lens, "seq_lens", &p.batch);
  if (c.space() != MemorySpace::kHost)
    c.fail("seq_lens", "a host array (the plan reads the lengths on the host)", "a CUDA array");
  static_cast<MlaLayout&>(p) =
      MlaLayout{q_len, heads, kv_lora_rank, rope_dim, q_dtype, ckv_dtype, kpe_dtype};
  p.options.scale = scale;
  p.options.policy = parse_policy(fn, policy);
  p.options.num_splits = num_splits;
  p.options.split_size = split_size;
  p.device = device >= 0;
  if (!p.device) {
    // the CPU MLA decode is the decode of one latent head of width kv_lora_rank + rope_dim,
    // its rows in tasks of 64 (the tasks of a split the layout is planned with)
    check_cpu_mla_layout(fn, p);
    const DecodeProblem pr{p.batch, q_len, heads, 1, kv_lora_rank + rope_dim, q_dtype, ckv_dtype};
    check_cpu_decode_plan(fn, pr, p.options, lens, (q_len * heads + 63) / 64);
    return p;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  if (num_sms <= 0) num_sms = device_sms(device);
  p.plan = cuda::plan_mla_decode(cuda_mla_problem(p, p.batch), lens, p.options, num_sms);
#else
  (void)num_sms;
  device_sms(device);
#endif
  return p;
}

void init_mla_decode_workspace(const PyMlaPlan& p, nb::handle workspace, nb::handle stream) {
  if (!p.device || p.workspace_bytes() == 0) return;
#if defined(ATTNSTATE_HAS_CUDA)
  Call c("attnstate.MlaDecode.plan");
  Array ws = c.array(workspace, "workspace", 1);
  [[maybe_unused]] void* s = c.stream(stream);
  cuda::init_mla_decode_workspace(p.plan, const_cast<void*>(ws.data()), ws.nbytes(),
                                  static_cast<cudaStream_t>(s));
#endif
}

void run_mla_decode(const PyMlaPlan& p, nb::handle q_nope, nb::handle q_pe, nb::handle ckv,
                    nb::handle kpe, nb::handle seq_lens, nb::handle page_indptr,
                    nb::handle page_indices, nb::handle block_table, nb::handle out,
                    nb::handle workspace, nb::handle stream, float ckv_scale, float kpe_scale,
                    nb::handle sinks, nb::handle ckv_block_scales) {
  Call c("attnstate.MlaDecode.run");
  const ConstTensorView qn = mla_queries(c, p, q_nope, -1);
  const ConstTensorView qp = c.tensor(q_pe, "q_pe", 4);
  MlaKvCache kv = mla_cache(c, p, ckv, kpe, ckv_scale, kpe_scale, ckv_block_scales);
  read_page_table(c, &kv, seq_lens, page_indptr, page_indices, block_table);
  const RunEnd e = run_end(c, out, sinks, qn.shape[2], workspace, p.device, stream, "q_nope");
  if (c.space() == MemorySpace::kHost) {
    nb::gil_scoped_release unlocked;
    cpu::mla_decode(qn, qp, kv, p.options, e.sinks, e.out);
    return;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  cuda::run_mla_decode(p.plan, qn, qp, kv, e.sinks, e.out, e.workspace.data, e.workspace.bytes,
                       static_cast<cudaStream_t>(e.stream));
#endif
}

// ---- MLA cascade ------------------------------------------------------------------------------

PyMlaCascadePlan plan_mla_cascade(const std::vector<nb::tuple>& levels, std::int64_t batch,
                                  std::int64_t q_len, std::int64_t heads, std::int64_t kv_lora_rank,
                                  std::int64_t rope_dim, std::int64_t page_size,
                                  std::int64_t num_pages, DType q_dtype, DType ckv_dtype,
                                  DType kpe_dtype, float scale, bool causal, int device,
                                  int num_sms) {
  const char* fn = "attnstate.MlaCascade.plan";
  Call c(fn);
  const std::vector<CascadeLevel> host = host_levels_of(c, levels);
  PyMlaCascadePlan p;
  p.batch = batch;
  static_cast<MlaLayout&>(p) =
      MlaLayout{q_len, heads, kv_lora_rank, rope_dim, q_dtype, ckv_dtype, kpe_dtype};
  p.page_size = page_size;
  p.num_levels = static_cast<int>(host.size());
  p.options.scale = scale;
  p.options.causal = causal;
  p.device = device >= 0;
  if (!p.device) {
    // what `cpu::mla_cascade` would refuse at run: the MLA decode's shape, then the levels
    check_cascade_batch(fn, batch, q_len);
    check_cpu_mla_layout(fn, p);
    check_cpu_levels_plan(fn, host.data(), p.num_levels, batch, q_len, p.options,
                          kv_lora_rank + rope_dim, page_size, num_pages, q_dtype);
    return p;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  if (num_sms <= 0) num_sms = device_sms(device);
  cuda::MlaCascadeProblem pr;
  pr.mla = cuda_mla_problem(p, batch);
  pr.page_size = page_size;
  pr.num_pages = num_pages;
  p.plan = cuda::plan_mla_cascade(pr, host.data(), p.num_levels, p.options, num_sms);
#else
  (void)num_pages;
  (void)num_sms;
  device_sms(device);
#endif
  return p;
}

void run_mla_cascade(const PyMlaCascadePlan& p, nb::handle q_nope, nb::handle q_pe, nb::handle ckv,
                     nb::handle kpe, const std::vector<nb::tuple>& levels, nb::handle out,
                     nb::handle workspace, nb::handle stream, float ckv_scale, float kpe_scale,
                     nb::handle sinks, nb::handle ckv_block_scales) {
  Call c("attnstate.MlaCascade.run");
  // the levels serve the planned requests: a run has the plan's batch
  const ConstTensorView qn = mla_queries(c, p, q_nope, p.batch);
  const ConstTensorView qp = c.tensor(q_pe, "q_pe", 4);
  const MlaKvCache kv = mla_cache(c, p, ckv, kpe, ckv_scale, kpe_scale, ckv_block_scales);
  if (kv.page_size != p.page_size)  // the levels' token counts are in pages of the plan's size
    c.fail("ckv", "pages of the plan's page_size = " + std::to_string(p.page_size) + " tokens",
           std::to_string(kv.page_size));
  const std::vector<CascadeLevel> lv = levels_of(c, levels);
  if (static_cast<int>(lv.size()) != p.num_levels)
    c.fail("levels", std::to_string(p.num_levels) + " levels (the plan's)",
           std::to_string(lv.size()));
  const RunEnd e = run_end(c, out, sinks, qn.shape[2], workspace, p.device, stream, "q_nope");
  if (c.space() == MemorySpace::kHost) {
    nb::gil_scoped_release unlocked;
    cpu::mla_cascade(qn, qp, kv, lv.data(), p.num_levels, p.options, e.sinks, e.out);
    return;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  cuda::run_mla_cascade(p.plan, qn, qp, kv, lv.data(), p.num_levels, e.sinks, e.out,
                        e.workspace.data, e.workspace.bytes, static_cast<cudaStream_t>(e.stream));
#endif
}

// The class of a cascade plan (GQA's or MLA's) with the properties both show; the caller adds
// its description.
template <class P>
nb::class_<P> bind_cascade_plan(nb::module_& m, const char* name) {
  return nb::class_<P>(m, name)
      .def_prop_ro("workspace_bytes", &P::workspace_bytes)
      .def_prop_ro("on_device", [](const P& p) { return p.device; })
      .def_prop_ro("num_levels", [](const P& p) { return p.num_levels; })
      .def_prop_ro("batch", [](const P& p) { return p.batch; });
}

}  // namespace

void bind_plans(nb::module_& m) {
  using nb::arg;
  nb::enum_<DType>(m, "DType", "Storage dtype of o, queries and KV (e4m3, e5m2: KV only).")
      .value("F32", DType::kF32)
      .value("F16", DType::kF16)
      .value("BF16", DType::kBF16)
      .value("E4M3", DType::kE4M3)
      .value("E5M2", DType::kE5M2);

  nb::class_<PyDecodePlan>(m, "_DecodePlan")
      .def_prop_ro("workspace_bytes", &PyDecodePlan::workspace_bytes)
      .def_prop_ro("on_device", [](const PyDecodePlan& p) { return p.device; })
      .def_prop_ro("batch", [](const PyDecodePlan& p) { return p.problem.batch; })
      .def_prop_ro("max_splits",
                   [](const PyDecodePlan& p) {
#if defined(ATTNSTATE_HAS_CUDA)
                     if (p.device) return p.plan.splits().max_splits;
#endif
                     return 0;
                   })
      .def_prop_ro("streamed", [](const PyDecodePlan& p) {
#if defined(ATTNSTATE_HAS_CUDA)
        if (p.device) return p.plan.kernel() == DecodeKernel::kStreamed;
#endif
        return false;
      });
  m.def("plan_decode", &plan_decode, arg("seq_lens"), arg("q_len"), arg("heads_q"), arg("heads_kv"),
        arg("head_dim"), arg("q_dtype"), arg("kv_dtype"), arg("scale"), arg("policy"),
        arg("num_splits"), arg("split_size"), arg("window_left"), arg("logits_soft_cap"),
        arg("device"), arg("num_sms"));
  m.def("init_decode_workspace", &init_decode_workspace, arg("plan"), arg("workspace"),
        arg("stream").none());
  m.def("run_decode", &run_decode, arg("plan"), arg("q"), arg("k"), arg("v"), arg("seq_lens"),
        arg("page_indptr").none(), arg("page_indices").none(), arg("block_table").none(),
        arg("layout"), arg("out"), arg("workspace").none(), arg("stream").none(),
        arg("k_scale") = 1.f, arg("v_scale") = 1.f, arg("sinks").none() = nb::none());

  nb::class_<PyMlaPlan>(m, "_MlaDecodePlan")
      .def_prop_ro("workspace_bytes", &PyMlaPlan::workspace_bytes)
      .def_prop_ro("on_device", [](const PyMlaPlan& p) { return p.device; })
      .def_prop_ro("batch", [](const PyMlaPlan& p) { return p.batch; })
      .def_prop_ro("max_splits",
                   [](const PyMlaPlan& p) {
#if defined(ATTNSTATE_HAS_CUDA)
                     if (p.device) return p.plan.splits().max_splits;
#endif
                     return 0;
                   })
      .def_prop_ro("description", [](const PyMlaPlan& p) -> std::string {
#if defined(ATTNSTATE_HAS_CUDA)
        if (p.device) return p.plan.to_string();
#endif
        return "CPU MLA decode: " + std::to_string(p.heads) + " heads, q_len " +
               std::to_string(p.q_len) + ", splits planned per run from the lengths";
      });
  m.def("plan_mla_decode", &plan_mla_decode, arg("seq_lens"), arg("q_len"), arg("heads"),
        arg("kv_lora_rank"), arg("rope_dim"), arg("q_dtype"), arg("ckv_dtype"), arg("kpe_dtype"),
        arg("scale"), arg("policy"), arg("num_splits"), arg("split_size"), arg("device"),
        arg("num_sms"));
  m.def("init_mla_decode_workspace", &init_mla_decode_workspace, arg("plan"), arg("workspace"),
        arg("stream").none());
  m.def("run_mla_decode", &run_mla_decode, arg("plan"), arg("q_nope"), arg("q_pe"), arg("ckv"),
        arg("kpe"), arg("seq_lens"), arg("page_indptr").none(), arg("page_indices").none(),
        arg("block_table").none(), arg("out"), arg("workspace").none(), arg("stream").none(),
        arg("ckv_scale") = 1.f, arg("kpe_scale") = 1.f, arg("sinks").none() = nb::none(),
        arg("ckv_block_scales").none() = nb::none());

  bind_cascade_plan<PyMlaCascadePlan>(m, "_MlaCascadePlan")
      .def_prop_ro("description", [](const PyMlaCascadePlan& p) -> std::string {
#if defined(ATTNSTATE_HAS_CUDA)
        if (p.device) return p.plan.to_string();
#endif
        return "CPU MLA cascade: " + std::to_string(p.num_levels) + " levels, " +
               std::to_string(p.heads) + " heads, q_len " + std::to_string(p.q_len) +
               ", each level a state merged into the output";
      });
  m.def("plan_mla_cascade", &plan_mla_cascade, arg("levels"), arg("batch"), arg("q_len"),
        arg("heads"), arg("kv_lora_rank"), arg("rope_dim"), arg("page_size"), arg("num_pages"),
        arg("q_dtype"), arg("ckv_dtype"), arg("kpe_dtype"), arg("scale"), arg("causal"),
        arg("device"), arg("num_sms"));
  m.def("run_mla_cascade", &run_mla_cascade, arg("plan"), arg("q_nope"), arg("q_pe"), arg("ckv"),
        arg("kpe"), arg("levels"), arg("out"), arg("workspace").none(), arg("stream").none(),
        arg("ckv_scale") = 1.f, arg("kpe_scale") = 1.f, arg("sinks").none() = nb::none(),
        arg("ckv_block_scales").none() = nb::none());

  bind_cascade_plan<PyCascadePlan>(m, "_CascadePlan")
      .def_prop_ro("description", [](const PyCascadePlan& p) -> std::string {
#if defined(ATTNSTATE_HAS_CUDA)
        if (p.device) return cuda::to_string(p.plan);
#endif
        return "CPU cascade: " + std::to_string(p.num_levels) +
               " levels, each a state merged into the output";
      });
  m.def("plan_cascade", &plan_cascade, arg("levels"), arg("batch"), arg("q_len"), arg("heads_q"),
        arg("heads_kv"), arg("head_dim"), arg("page_size"), arg("num_pages"), arg("dtype"),
        arg("kv_dtype"), arg("scale"), arg("causal"), arg("window_left"), arg("logits_soft_cap"),
        arg("device"), arg("num_sms"));
  m.def("run_cascade", &run_cascade, arg("plan"), arg("q"), arg("k"), arg("v"), arg("levels"),
        arg("layout"), arg("out"), arg("workspace").none(), arg("stream").none(),
        arg("k_scale") = 1.f, arg("v_scale") = 1.f, arg("sinks").none() = nb::none());
}

}  // namespace py
}  // namespace attnstate
