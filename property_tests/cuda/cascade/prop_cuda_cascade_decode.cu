/// @file prop_cuda_cascade_decode.cu
/// @brief RapidCheck property of the CUDA cascade over random level trees (1 to 3 levels,
///        random sharing, lengths 0 and page edges included, pages of 1, 5, 16 or 32 keys), query
///        dtypes, the catalog's cascade head dims, GQA groups, variants (soft cap, sliding window,
///        sinks), KV dtypes (16-bit, fp8 e4m3 or e5m2 with scales), output dtypes and LSE bases:
///        the cascade equals the CUDA split-KV decode over each request's concatenated keys and
///        the CPU cascade (the reference), outputs NaN-poisoned before every run. A combination
///        the catalog holds no kernel for is refused by name (`Status::kNotSupported`), and one
///        it holds is planned: by the property for random problems, and by one test per
///        combination of variant, dtype and head dim. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cuda/cascade.hpp"
#include "attnstate/cuda/decode.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "cascade_case.hpp"
#include "cascade_gen.hpp"
#include "catalog/catalog.hpp"
#include "compiled_dims.hpp"
#include "cuda_test_utils.hpp"
#include "random_sinks.hpp"
#include "rc_defaults.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=100");

namespace {

namespace catalog = attnstate::catalog;
using attnstate::AttentionSinks;
using attnstate::CascadeOptions;
using attnstate::DType;
using attnstate::KvScale;
using attnstate::LseBase;
using attnstate::MemorySpace;
using attnstate::PagedKvCache;
using attnstate::Status;
using attnstate::testing::HostState;
using attnstate::testing::Tolerance;
using attnstate_test::CascadeCase;
using attnstate_test::CaseSpec;
using attnstate_test::DeviceBuffer;

/// Whether `CascadeShape` gives the pool a dtype of its own (`kv_dtype`, as `DecodeProblem`
/// does); without one, `dtype` is the queries' and the pool's, so an fp8 pool asks for fp8
/// queries too.
template <class S, class = void>
struct HasPoolDType : std::false_type {};
template <class S>
struct HasPoolDType<S, std::void_t<decltype(std::declval<S&>().kv_dtype)>> : std::true_type {};

/// Sets the queries' dtype `q` and the pool's `kv` of a cascade shape.
template <class S>
void set_dtypes(S& shape, DType q, DType kv) {
  if constexpr (HasPoolDType<S>::value) {
    shape.dtype = q;
    shape.kv_dtype = kv;
  } else {
    shape.dtype = kv;
  }
}

/// The CUDA cascade's shape of case `c` (its queries in `c.spec.dtype`) over a pool of `kv`.
attnstate::cuda::CascadeShape cascade_shape(const CascadeCase& c, DType kv) {
  attnstate::cuda::CascadeShape shape;
  shape.batch = c.batch;
  shape.q_len = c.spec.q_len;
  shape.heads_q = c.spec.heads_q;
  shape.heads_kv = c.spec.heads_kv;
  shape.head_dim = c.spec.head_dim;
  shape.page_size = c.spec.page_size;
  shape.num_pages = c.num_pages;
  set_dtypes(shape, c.spec.dtype, kv);
  return shape;
}

/// The shape argument a refused pool dtype is named by.
constexpr const char* kPoolDTypeArg =
    HasPoolDType<attnstate::cuda::CascadeShape>::value ? "shape.kv_dtype" : "shape.dtype";

/// One drawn case: the level tree and shape (`spec`, its dtype the queries'), and what the cascade
/// case does not draw: the window, the pool's dtype and scales, sinks, the output.
struct Draw {
  CaseSpec spec;
  std::int64_t window_left = attnstate::kNoWindow;
  DType kv_dtype = DType::kBF16;
  float k_scale = 1.f, v_scale = 1.f;  ///< fp8 pools only.
  bool sinks = false;
  DType out_dtype = DType::kF32;
  LseBase base = LseBase::kNatural;
  bool decode_last_level = true;  ///< `CascadeTuning::decode_last_level`.
  attnstate::cuda::CascadeKernel level_kernel = attnstate::cuda::CascadeKernel::kAuto;
  int decode_split_size = 0;  ///< The plain decode's fixed split size (0: automatic).
};

Draw draw_case() {
  Draw d;
  d.spec = *attnstate_test::gen_case_spec(12, 160);
  d.spec.soft_cap = *rc::gen::element(0.f, 0.f, 5.f, 30.f);
  if (*rc::gen::arbitrary<bool>())
    d.window_left = *rc::gen::oneOf(rc::gen::element<std::int64_t>(0, 1, 15, 16, 17, 64),
                                    rc::gen::inRange<std::int64_t>(0, 400));
  d.kv_dtype = *rc::gen::element(d.spec.dtype, d.spec.dtype, DType::kE4M3, DType::kE5M2);
  if (attnstate::is_fp8(d.kv_dtype)) {
    d.k_scale = *rc::gen::element(1.f, 0.25f, 0x1p-6f, 1.5f);
    d.v_scale = *rc::gen::element(1.f, 0.5f, 0x1p-4f, 0.75f);
  }
  d.sinks = *rc::gen::arbitrary<bool>();
  d.out_dtype = *rc::gen::element(DType::kF32, DType::kF16, DType::kBF16);
  d.base = *rc::gen::element(LseBase::kNatural, LseBase::kBase2);
  d.decode_last_level = *rc::gen::element(true, true, false);
  d.level_kernel = *rc::gen::element(attnstate::cuda::CascadeKernel::kAuto,
                                     attnstate::cuda::CascadeKernel::kAuto,
                                     attnstate::cuda::CascadeKernel::kMma);
  d.decode_split_size = *rc::gen::element(0, 0, 16, 48, 128);
  return d;
}

/// `vals` stored in `dt`: 16-bit dtypes rounded, fp8 ones as `vals / scale` (read back as
/// `stored · scale`).
std::vector<std::uint8_t> store(std::vector<float> vals, DType dt, float scale) {
  if (!attnstate::is_fp8(dt)) return attnstate_test::encode(vals, dt);
  std::vector<std::uint8_t> raw(vals.size());
  for (std::size_t i = 0; i < vals.size(); ++i)
    raw[i] = dt == DType::kE4M3
                 ? attnstate::from_float<attnstate::float8_e4m3_t>(vals[i] / scale).bits
                 : attnstate::from_float<attnstate::float8_e5m2_t>(vals[i] / scale).bits;
  return raw;
}

/// The case's inputs in the drawn pool dtype, and its sinks.
struct Inputs {
  CascadeCase c;
  Draw d;
  std::vector<std::uint8_t> k_raw, v_raw;
  std::vector<float> sinks;  ///< `heads_q` natural-base logits, or empty.

  explicit Inputs(const Draw& draw)
      : c(draw.spec),
        d(draw),
        k_raw(store(c.k, d.kv_dtype, d.k_scale)),
        v_raw(store(c.v, d.kv_dtype, d.v_scale)) {
    if (d.sinks) sinks = attnstate_test::random_sinks(c.spec.heads_q, -3.f, 5.f, c.spec.seed + 1);
  }
  CascadeOptions options() const {
    CascadeOptions o = c.options();  // scale, causal, soft cap
    o.variant.window_left = d.window_left;
    return o;
  }
  PagedKvCache pool(const void* k, const void* v, MemorySpace space) const {
    PagedKvCache kv = c.pool(k, v, space);
    kv.dtype = d.kv_dtype;
    if (attnstate::is_fp8(d.kv_dtype)) {
      kv.k_scale = KvScale::per_tensor(d.k_scale);
      kv.v_scale = KvScale::per_tensor(d.v_scale);
    }
    return kv;
  }
  /// The variants the drawn options ask of a kernel.
  catalog::Variants variants() const {
    return catalog::variants_of(d.window_left, c.spec.soft_cap);
  }
};

/// A state downloaded from `o` (raw, `dt`) and `lse`, in `base`.
HostState to_host(const DeviceBuffer<std::uint8_t>& o, DType dt, const DeviceBuffer<float>& lse,
                  const CascadeCase& c, LseBase base) {
  const std::vector<std::uint8_t> raw = o.download();
  const std::vector<float> l = lse.download();
  return HostState::from_view(attnstate::make_const_state_view(
      raw.data(), dt, l.data(), c.tokens(), c.spec.heads_q, c.spec.head_dim, base));
}

/// The CPU cascade (the reference), f32 output in the natural base over a NaN-filled output.
HostState cpu_cascade(const Inputs& in) {
  const CascadeCase& c = in.c;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> o(static_cast<std::size_t>(c.out_elems()), nan);
  std::vector<float> lse(static_cast<std::size_t>(c.lse_elems()), nan);
  const auto levels = c.host_levels();
  AttentionSinks sinks;
  if (!in.sinks.empty()) sinks.logits = in.sinks.data();
  attnstate::cpu::cascade_attention(
      c.query(c.q_raw.data(), MemorySpace::kHost),
      in.pool(in.k_raw.data(), in.v_raw.data(), MemorySpace::kHost), levels.data(),
      static_cast<int>(levels.size()), in.options(), sinks,
      attnstate::make_state_view(o.data(), DType::kF32, lse.data(), c.tokens(), c.spec.heads_q,
                                 c.spec.head_dim, LseBase::kNatural));
  return HostState::from_view(attnstate::make_const_state_view(o.data(), DType::kF32, lse.data(),
                                                               c.tokens(), c.spec.heads_q,
                                                               c.spec.head_dim, LseBase::kNatural));
}

/// A GPU result, or the error that refused the problem (`Status::kNotSupported` and its words).
struct GpuRun {
  bool refused = false;
  std::string error;
  HostState state;
  std::string pages;  ///< The decode: whose pages its requests read (`Concatenated`).
};

/// Device copies of a problem's queries, sinks and output (poisoned with NaN).
struct DeviceCommon {
  DeviceBuffer<std::uint8_t> q, o;
  DeviceBuffer<float> lse, sinks;
  explicit DeviceCommon(const Inputs& in)
      : q(in.c.q_raw),
        o(static_cast<std::size_t>(in.c.out_elems()) * attnstate::size_of(in.d.out_dtype)),
        lse(static_cast<std::size_t>(in.c.lse_elems())) {
    if (!in.sinks.empty()) sinks = DeviceBuffer<float>(in.sinks);
    o.poison();
    lse.poison();
  }
  AttentionSinks device_sinks() const {
    AttentionSinks s;
    s.logits = sinks.get();  // null: none
    return s;
  }
  attnstate::StateView out(const Inputs& in) {
    return attnstate::make_state_view(o.get(), in.d.out_dtype, lse.get(), in.c.tokens(),
                                      in.c.spec.heads_q, in.c.spec.head_dim, in.d.base,
                                      MemorySpace::kDevice);
  }
};

/// The CUDA cascade of the case; a `Status::kNotSupported` error of its plan is returned as a
/// refusal (any other error, and any error of the run, fails the case).
GpuRun gpu_cascade(const Inputs& in) {
  const CascadeCase& c = in.c;
  const attnstate::cuda::CascadeShape shape = cascade_shape(c, in.d.kv_dtype);
  attnstate::cuda::CascadeTuning tuning;
  tuning.decode_last_level = in.d.decode_last_level;
  tuning.kernel = in.d.level_kernel;
  const auto host = c.host_levels();
  GpuRun r;
  attnstate::cuda::CascadePlan plan;
  try {
    plan = attnstate::cuda::plan_cascade(shape, host.data(), static_cast<int>(host.size()),
                                         in.options(), attnstate_test::device_sms(), tuning);
  } catch (const attnstate::Error& e) {
    if (e.status() != Status::kNotSupported) throw;
    r.refused = true;
    r.error = e.what();
    return r;
  }
  DeviceCommon dev(in);
  const DeviceBuffer<std::uint8_t> k(in.k_raw), v(in.v_raw);
  std::vector<DeviceBuffer<std::int32_t>> arrays;
  std::vector<attnstate::CascadeLevel> levels;
  for (const attnstate_test::HostLevel& h : c.levels) {
    const std::vector<std::int32_t>* parts[] = {&h.request_indptr, &h.page_indptr, &h.page_indices,
                                                &h.seg_lens};
    for (const auto* p : parts)
      arrays.push_back(p->empty() ? DeviceBuffer<std::int32_t>() : DeviceBuffer<std::int32_t>(*p));
    const std::size_t n = arrays.size();
    attnstate::CascadeLevel l;
    l.num_segments = static_cast<std::int64_t>(h.seg_lens.size());
    l.request_indptr = arrays[n - 4].get();
    l.page_indptr = arrays[n - 3].get();
    l.page_indices = arrays[n - 2].get();
    l.seg_lens = arrays[n - 1].get();
    levels.push_back(l);
  }
  DeviceBuffer<std::uint8_t> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
  ws.poison();
  attnstate::cuda::run_cascade(plan, c.query(dev.q.get(), MemorySpace::kDevice),
                               in.pool(k.get(), v.get(), MemorySpace::kDevice), levels.data(),
                               static_cast<int>(levels.size()), dev.device_sinks(), dev.out(in),
                               ws.get(), ws.bytes());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  r.state = to_host(dev.o, in.d.out_dtype, dev.lse, c, in.d.base);
  return r;
}

/// The decode's view of the case: each request's keys concatenated level after level, its
/// page list its levels' pages in order where they hold exactly that (every segment but its last
/// non-empty one fills whole pages: always at page size 1), else pages of its own appended to
/// the case's pool (the keys copied, the slots past its end random); with the CSR table and
/// the lengths of the decode.
struct Concatenated {
  std::vector<std::uint8_t> k, v;  ///< The case's pool, then the appended pages.
  std::vector<std::int32_t> page_indptr{0}, page_indices, seq_lens;
  std::int64_t num_pages = 0;
  int own_pages = 0, copied = 0;  ///< Requests on their levels' pages, on appended ones.

  explicit Concatenated(const Inputs& in) : k(in.k_raw), v(in.v_raw), num_pages(in.c.num_pages) {
    const CascadeCase& c = in.c;
    const CaseSpec& s = c.spec;
    const std::size_t elem = attnstate::size_of(in.d.kv_dtype);
    const std::size_t page_bytes = static_cast<std::size_t>(c.page_elems) * elem;
    const std::size_t row = static_cast<std::size_t>(s.head_dim) * elem;
    std::mt19937_64 rng(s.seed ^ 0x9E3779B97F4A7C15ull);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    const std::vector<std::vector<std::int64_t>> keys = c.keys_per_token();
    for (std::int64_t b = 0; b < c.batch; ++b) {
      // the last token of a request sees all its keys (causal or not)
      const std::vector<std::int64_t>& slots =
          keys[static_cast<std::size_t>(b * s.q_len + s.q_len - 1)];
      std::vector<std::int32_t> pages;  // the request's levels' pages in order
      for (const attnstate_test::HostLevel& h : c.levels) {
        std::size_t g = 0;
        while (!(h.request_indptr[g] <= b && b < h.request_indptr[g + 1])) ++g;
        pages.insert(pages.end(), h.page_indices.begin() + h.page_indptr[g],
                     h.page_indices.begin() + h.page_indptr[g + 1]);
      }
      bool own = true;
      for (std::size_t j = 0; j < slots.size() && own; ++j)
        own = slots[j] == static_cast<std::int64_t>(pages[j / s.page_size]) * s.page_size +
                              static_cast<std::int64_t>(j % s.page_size);
      if (own) {
        ++own_pages;
      } else {
        ++copied;
        const std::int64_t n = static_cast<std::int64_t>(slots.size());
        const std::int64_t first = num_pages, count = (n + s.page_size - 1) / s.page_size;
        std::vector<float> fill(static_cast<std::size_t>(count * c.page_elems));
        for (float& x : fill) x = uni(rng);
        const std::vector<std::uint8_t> kf = store(fill, in.d.kv_dtype, in.d.k_scale);
        for (float& x : fill) x = uni(rng);
        const std::vector<std::uint8_t> vf = store(fill, in.d.kv_dtype, in.d.v_scale);
        k.insert(k.end(), kf.begin(), kf.end());
        v.insert(v.end(), vf.begin(), vf.end());
        num_pages += count;
        pages.clear();
        for (std::int64_t p = 0; p < count; ++p)
          pages.push_back(static_cast<std::int32_t>(first + p));
        for (std::int64_t j = 0; j < n; ++j) {
          const std::int64_t from = slots[static_cast<std::size_t>(j)];
          for (int h = 0; h < s.heads_kv; ++h) {
            const std::size_t src =
                static_cast<std::size_t>(from / s.page_size) * page_bytes +
                static_cast<std::size_t>(c.in_page(from % s.page_size, h)) * elem;
            const std::size_t dst = static_cast<std::size_t>(first + j / s.page_size) * page_bytes +
                                    static_cast<std::size_t>(c.in_page(j % s.page_size, h)) * elem;
            std::memcpy(&k[dst], &in.k_raw[src], row);
            std::memcpy(&v[dst], &in.v_raw[src], row);
          }
        }
      }
      page_indices.insert(page_indices.end(), pages.begin(), pages.end());
      page_indptr.push_back(static_cast<std::int32_t>(page_indices.size()));
      seq_lens.push_back(static_cast<std::int32_t>(slots.size()));
    }
  }
};

/// The CUDA split-KV decode over each request's concatenated keys; a `Status::kNotSupported`
/// error of its plan or run is returned as a refusal.
GpuRun gpu_decode(const Inputs& in) {
  const CascadeCase& c = in.c;
  const Concatenated cat(in);
  attnstate::DecodeProblem problem;
  problem.batch = c.batch;
  problem.q_len = c.spec.q_len;
  problem.heads_q = c.spec.heads_q;
  problem.heads_kv = c.spec.heads_kv;
  problem.head_dim = c.spec.head_dim;
  problem.q_dtype = c.spec.dtype;
  problem.kv_dtype = in.d.kv_dtype;
  attnstate::DecodeOptions opt;
  opt.scale = c.spec.scale;
  opt.variant = in.options().variant;
  if (in.d.decode_split_size > 0) {
    opt.policy = attnstate::SplitPolicy::kFixedSize;
    opt.split_size = in.d.decode_split_size;
  }
  GpuRun r;
  r.pages = cat.copied == 0      ? "levels' pages"
            : cat.own_pages == 0 ? "copied pages"
                                 : "levels' and copied pages";
  try {
    const attnstate::cuda::DecodePlan plan = attnstate::cuda::plan_decode(
        problem, cat.seq_lens.data(), opt, attnstate_test::device_sms());
    DeviceCommon dev(in);
    const DeviceBuffer<std::uint8_t> k(cat.k), v(cat.v);
    const DeviceBuffer<std::int32_t> indptr(cat.page_indptr), lens(cat.seq_lens);
    const DeviceBuffer<std::int32_t> indices(cat.page_indices.empty() ? std::vector<std::int32_t>{0}
                                                                      : cat.page_indices);
    PagedKvCache kv = in.pool(k.get(), v.get(), MemorySpace::kDevice);
    kv.num_pages = cat.num_pages;
    kv.page_indptr = indptr.get();
    kv.page_indices = indices.get();
    kv.seq_lens = lens.get();
    kv.batch = c.batch;
    DeviceBuffer<std::uint8_t> ws(std::max<std::size_t>(1, plan.workspace_bytes()));
    attnstate::cuda::init_decode_workspace(plan, ws.get(), ws.bytes());
    attnstate::cuda::run_decode(plan, c.query(dev.q.get(), MemorySpace::kDevice), kv,
                                dev.device_sinks(), dev.out(in), ws.get(), ws.bytes());
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
    r.state = to_host(dev.o, in.d.out_dtype, dev.lse, c, in.d.base);
  } catch (const attnstate::Error& e) {
    if (e.status() != Status::kNotSupported) throw;
    r.refused = true;
    r.error = e.what();
  }
  return r;
}

/// Whether the catalog holds a kernel of `family` for a head dim, query and pool dtypes and
/// `variants`.
bool catalog_holds(catalog::Family family, std::int64_t head_dim, DType q_dtype, DType kv_dtype,
                   catalog::Variants variants) {
  catalog::Query q;
  q.family = family;
  q.head_dim = head_dim;
  q.q = catalog::mask(q_dtype);
  q.kv = catalog::mask(kv_dtype);
  q.variants = variants;
  return catalog::compiled(q);
}

/// The arguments a refusal of the cascade may name: those of the drawn features some catalog
/// lacks (the window, an fp8 pool).
std::vector<std::string> refusable_args(std::int64_t window_left, DType kv_dtype) {
  std::vector<std::string> a;
  if (window_left >= 0) a.push_back("options.variant.window_left");
  if (attnstate::is_fp8(kv_dtype)) a.push_back(kPoolDTypeArg);
  return a;
}

/// Whether `message` names one of `args` (quoted, as the library's errors name arguments).
bool names_one_of(const std::string& message, const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(), [&](const std::string& a) {
    return message.find("'" + a + "'") != std::string::npos;
  });
}

/// The tolerance on `o` of a GPU result against the CPU cascade: the GPU rounds the
/// probabilities to the query dtype for `P V`. The cascade's is `o_tolerance` (its tests'); the
/// decode's is its own tests' (tests/cuda/decode/test_cuda_decode.cpp), fp8 pools included.
double o_tol(const Draw& d, bool decode) {
  double t =
      decode ? (d.spec.dtype == DType::kBF16 ? 1.2e-2 : 3e-3) + (d.out_dtype == DType::kBF16  ? 8e-3
                                                                 : d.out_dtype == DType::kF16 ? 1e-3
                                                                                              : 0.0)
             : attnstate_test::o_tolerance(d.spec.dtype, d.out_dtype);
  if (attnstate::is_fp8(d.kv_dtype)) t += 2e-2;
  return t;
}

/// `o_tol` and LSEs within 1e-3 (natural log) or 5e-5 relative, against the CPU cascade.
Tolerance tolerance(const Draw& d, bool decode) {
  return Tolerance::absolute(o_tol(d, decode), 1e-3, 5e-5, 1);
}

/// The property: see the file comment.
void cascade_equals_decode_over_the_concatenation() {
  const Inputs in(draw_case());
  const CaseSpec& s = in.c.spec;
  const HostState ref = cpu_cascade(in);

  const GpuRun cas = gpu_cascade(in);
  const bool cascade_held = catalog_holds(catalog::Family::kCascadeMma, s.head_dim, s.dtype,
                                          in.d.kv_dtype, in.variants());
  if (cas.refused) {
    // refused only where the catalog holds no level kernel, naming what it lacks
    if (cascade_held) RC_FAIL("a combination the catalog holds was refused: " + cas.error);
    if (!names_one_of(cas.error, refusable_args(in.d.window_left, in.d.kv_dtype)))
      RC_FAIL("the refusal names none of the case's arguments: " + cas.error);
  } else {
    if (!cascade_held) RC_FAIL("a combination the catalog does not hold was planned");
    const std::string m =
        attnstate::testing::compare_states(cas.state, ref, tolerance(in.d, false));
    if (!m.empty()) RC_FAIL("cuda cascade != cpu cascade: " + m);
  }

  // the decode's new tokens are causal: it applies when the cascade's are, or at q_len 1
  const bool decode_applies = s.causal || s.q_len == 1;
  std::string decode_tag = "no decode (not causal)";
  if (decode_applies) {
    const GpuRun dec = gpu_decode(in);
    const catalog::Variants dv = in.variants() | (in.d.sinks ? catalog::kSinks : 0);
    const bool decode_held =
        catalog_holds(catalog::Family::kDecodeSplit, s.head_dim, s.dtype, in.d.kv_dtype, dv);
    if (dec.refused) {
      if (decode_held) RC_FAIL("the catalog holds the decode, yet it was refused: " + dec.error);
      decode_tag = "decode refused";
    } else {
      if (!decode_held) RC_FAIL("a decode the catalog does not hold ran");
      const std::string m =
          attnstate::testing::compare_states(dec.state, ref, tolerance(in.d, true));
      if (!m.empty()) RC_FAIL("cuda decode over the concatenation != cpu cascade: " + m);
      decode_tag = "decode compared, " + dec.pages;
      if (!cas.refused) {
        // both carry error against the reference
        const Tolerance both =
            Tolerance::absolute(o_tol(in.d, false) + o_tol(in.d, true), 2e-3, 1e-4, 1);
        const std::string mc = attnstate::testing::compare_states(cas.state, dec.state, both);
        if (!mc.empty()) RC_FAIL("cuda cascade != cuda decode over the concatenation: " + mc);
        decode_tag = "cascade == decode, " + dec.pages;
      }
    }
  }
  std::string cascade_tag = "cascade ran";
  if (cas.refused)
    cascade_tag = in.d.window_left >= 0 && cas.error.find("window_left") != std::string::npos
                      ? "cascade refused: window"
                      : "cascade refused: fp8 pool";
  RC_TAG(cascade_tag, decode_tag);
}

TEST(CudaCascadeProps, CascadeEqualsDecodeOverTheConcatenationAndTheCpuCascade) {
  ATTNSTATE_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("cuda cascade == cuda decode over the concatenated keys == cpu cascade",
                        cascade_equals_decode_over_the_concatenation));
}

// One test per combination of query dtype, cascade head dim, variant and pool dtype: planned
// where the catalog holds a cascade level kernel for it, else refused by name.

struct Combination {
  DType q = DType::kBF16;
  std::int64_t head_dim = 0;
  bool window = false;
  bool soft_cap = false;
  DType kv = DType::kBF16;
};

std::vector<Combination> combinations() {
  std::vector<Combination> all;
  for (const DType q : {DType::kF16, DType::kBF16})
    for (const std::int64_t dim : attnstate_test::cascade_head_dims())
      for (int v = 0; v < 4; ++v)
        for (const DType kv : {q, DType::kE4M3, DType::kE5M2})
          all.push_back(Combination{q, dim, (v & 1) != 0, (v & 2) != 0, kv});
  return all;
}

std::string combination_name(const ::testing::TestParamInfo<Combination>& info) {
  const Combination& c = info.param;
  std::string n = std::string(attnstate::to_string(c.q)) + "_d" + std::to_string(c.head_dim);
  n += c.window ? "_window" : "";
  n += c.soft_cap ? "_softcap" : "";
  n += c.window || c.soft_cap ? "" : "_plain";
  return n + "_kv_" + attnstate::to_string(c.kv);
}

/// Prints a combination by its test name (GoogleTest would print its bytes).
void PrintTo(const Combination& c, std::ostream* os) {
  *os << combination_name(::testing::TestParamInfo<Combination>(c, 0));
}

class CudaCascadeCatalogCombination : public ::testing::TestWithParam<Combination> {};

TEST_P(CudaCascadeCatalogCombination, PlannedWhereTheCatalogHoldsItElseRefusedByName) {
  ATTNSTATE_REQUIRE_GPU();  // plan_cascade queries the device
  const Combination& k = GetParam();
  CaseSpec spec = attnstate_test::two_level_spec(3, 40, 9, 81);
  spec.dtype = k.q;
  spec.head_dim = static_cast<int>(k.head_dim);
  spec.soft_cap = k.soft_cap ? 30.f : 0.f;
  const CascadeCase c(spec);
  const attnstate::cuda::CascadeShape shape = cascade_shape(c, k.kv);
  CascadeOptions o = c.options();
  o.variant.window_left = k.window ? 24 : attnstate::kNoWindow;
  const auto host = c.host_levels();
  const auto plan = [&] {
    return attnstate::cuda::plan_cascade(shape, host.data(), static_cast<int>(host.size()), o,
                                         attnstate_test::device_sms());
  };
  if (catalog_holds(catalog::Family::kCascadeMma, k.head_dim, k.q, k.kv,
                    catalog::variants_of(o.variant.window_left, o.variant.logits_soft_cap))) {
    EXPECT_NO_THROW(plan());
    return;
  }
  try {
    plan();
    ADD_FAILURE() << "planned, yet the catalog holds no cascade level kernel for it";
  } catch (const attnstate::Error& e) {
    EXPECT_EQ(e.status(), Status::kNotSupported) << e.what();
    EXPECT_TRUE(names_one_of(e.what(), refusable_args(o.variant.window_left, k.kv))) << e.what();
    EXPECT_NE(std::string(e.what()).find("attnstate::cuda::plan_cascade"), std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Catalog, CudaCascadeCatalogCombination,
                         ::testing::ValuesIn(combinations()), combination_name);

}  // namespace
