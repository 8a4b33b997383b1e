/// @file decode_problem.hpp
/// @brief Random paged decode problems in host memory, their double-precision reference (the
///        testing kit's, each query row over the keys it sees) and comparison, shared by the
///        CPU and GPU decode tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/host_tensor.hpp"
#include "attnstate/testing/problem.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace attnstate_test {

using attnstate::DType;
using attnstate::KvLayout;

/// How a test passes the scales of an fp8 cache (`attnstate::KvScale`).
enum class KvScaleKind {
  kValue,    ///< one host value per tensor
  kPointer,  ///< one scale per tensor, read through a pointer
  kPerHead,  ///< one scale per KV head, `[H_kv]`
};

/// Shape and options of a random decode problem.
struct DecodeConfig {
  std::int64_t q_len = 1;
  std::int64_t heads_q = 8;
  std::int64_t heads_kv = 2;
  std::int64_t head_dim = 64;
  std::int64_t page_size = 16;
  KvLayout layout = KvLayout::kNHD;
  bool block_table = false;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  float q_gain = 1.f;                  ///< Queries are uniform in [-q_gain, q_gain].
  std::int64_t spare_pages = 3;        ///< Unused pages in the pool (filled with NaN).
  std::vector<std::int32_t> seq_lens;  ///< One per request.
  /// fp8 caches only: K and V are stored uniform in [-kv_amp, kv_amp] (rounded once to fp8,
  /// saturating) and read as stored × scale, the scales given as `scale_kind` says: `k_scales`
  /// and `v_scales` hold one value (kValue, kPointer) or one per KV head (kPerHead).
  float kv_amp = 1.f;
  KvScaleKind scale_kind = KvScaleKind::kValue;
  std::vector<float> k_scales = {1.f};
  std::vector<float> v_scales = {1.f};

  std::string name() const {
    return "q_len=" + std::to_string(q_len) + " hq=" + std::to_string(heads_q) +
           " hkv=" + std::to_string(heads_kv) + " D=" + std::to_string(head_dim) +
           " page=" + std::to_string(page_size) + (layout == KvLayout::kHND ? " HND" : " NHD") +
           (block_table ? " bt" : " csr") + " q=" + attnstate::to_string(q_dtype) +
           " kv=" + attnstate::to_string(kv_dtype) + " gain=" + std::to_string(q_gain) +
           (attnstate::is_fp8(kv_dtype) ? fp8_name() : std::string());
  }
  std::string fp8_name() const {
    const char* kinds[] = {"value", "pointer", "per_head"};
    std::string s = std::string(" amp=") + std::to_string(kv_amp) + " scales " +
                    kinds[static_cast<int>(scale_kind)] + " k{";
    for (float x : k_scales) s += std::to_string(x) + " ";
    s += "} v{";
    for (float x : v_scales) s += std::to_string(x) + " ";
    return s + "}";
  }
};

/// A configuration of the given shape (no lengths yet).
inline DecodeConfig shape_config(std::int64_t q_len, std::int64_t heads_q, std::int64_t heads_kv,
                                 std::int64_t head_dim, std::int64_t page_size, KvLayout layout,
                                 bool block_table, DType q_dtype, DType kv_dtype) {
  DecodeConfig c;
  c.q_len = q_len;
  c.heads_q = heads_q;
  c.heads_kv = heads_kv;
  c.head_dim = head_dim;
  c.page_size = page_size;
  c.layout = layout;
  c.block_table = block_table;
  c.q_dtype = q_dtype;
  c.kv_dtype = kv_dtype;
  return c;
}

/// Stores a float as `dt` (any dtype, fp8 included: the stored value, saturating) into raw bytes
/// at element `i`.
inline void put(std::vector<unsigned char>& buf, DType dt, std::int64_t i, float x) {
  attnstate::dispatch_dtype_with_fp8(dt, [&](auto tag) {
    using T = decltype(tag);
    const T v = attnstate::from_float<T>(x);
    std::memcpy(buf.data() + sizeof(T) * i, &v, sizeof(T));
  });
}
/// Reads element `i` of raw bytes of dtype `dt` as a double (an fp8 element: its stored value).
inline double get(const void* buf, DType dt, std::int64_t i) {
  return attnstate::dispatch_dtype_with_fp8(dt, [&](auto tag) -> double {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, static_cast<const unsigned char*>(buf) + sizeof(T) * i, sizeof(T));
    return attnstate::to_float(v);
  });
}

/// A decode problem in host memory: queries, paged K/V pools with shuffled page ids, tables.
struct DecodeProblemHost {
  DecodeConfig cfg;
  std::int64_t batch = 0;
  std::int64_t num_pages = 0;
  std::int64_t bt_stride = 0;
  std::vector<unsigned char> q, k, v;
  std::vector<std::int32_t> seq_lens, indptr, indices, block_table;
  std::vector<float> k_scale_mem, v_scale_mem;  ///< The scales a kPointer/kPerHead cache reads.

  std::int64_t page_elems() const { return cfg.page_size * cfg.heads_kv * cfg.head_dim; }
  std::int64_t tokens() const { return batch * cfg.q_len; }

  /// Host view of the cache (pointers into this object).
  attnstate::PagedKvCache kv_view() const {
    attnstate::PagedKvCache kv;
    kv.k = k.data();
    kv.v = v.data();
    kv.dtype = cfg.kv_dtype;
    kv.layout = cfg.layout;
    kv.num_pages = num_pages;
    kv.page_size = cfg.page_size;
    kv.heads_kv = cfg.heads_kv;
    kv.head_dim = cfg.head_dim;
    if (cfg.block_table) {
      kv.block_table = block_table.data();
      kv.block_table_stride = bt_stride;
    } else {
      kv.page_indptr = indptr.data();
      kv.page_indices = indices.data();
    }
    kv.seq_lens = seq_lens.data();
    kv.batch = batch;
    kv.space = attnstate::MemorySpace::kHost;
    if (attnstate::is_fp8(cfg.kv_dtype)) {
      kv.k_scale = scale_view(k_scale_mem);
      kv.v_scale = scale_view(v_scale_mem);
    }
    return kv;
  }
  /// The `KvScale` of `cfg.scale_kind` over `mem` (the scales of one pool).
  attnstate::KvScale scale_view(const std::vector<float>& mem) const {
    switch (cfg.scale_kind) {
      case KvScaleKind::kPointer:
        return attnstate::KvScale::per_tensor_at(mem.data());
      case KvScaleKind::kPerHead:
        return attnstate::KvScale::per_head(mem.data());
      default:
        return attnstate::KvScale::per_tensor(mem[0]);
    }
  }
  /// Host view of the queries `(batch, q_len, heads_q, head_dim)`.
  attnstate::ConstTensorView q_view() const {
    return attnstate::make_tensor_view(q.data(), cfg.q_dtype,
                                       {batch, cfg.q_len, cfg.heads_q, cfg.head_dim});
  }
  /// The shape `plan_decode` takes for this problem.
  attnstate::DecodeProblem problem() const {
    attnstate::DecodeProblem pr;
    pr.batch = batch;
    pr.q_len = cfg.q_len;
    pr.heads_q = cfg.heads_q;
    pr.heads_kv = cfg.heads_kv;
    pr.head_dim = cfg.head_dim;
    pr.q_dtype = cfg.q_dtype;
    pr.kv_dtype = cfg.kv_dtype;
    return pr;
  }
  /// Element offset of (request b, token t, KV head h, dim 0) in a pool.
  std::int64_t kv_offset(std::int64_t b, std::int64_t t, std::int64_t h) const {
    const std::int64_t pidx = t / cfg.page_size;
    const std::int64_t id =
        cfg.block_table ? block_table[b * bt_stride + pidx] : indices[indptr[b] + pidx];
    const std::int64_t slot = t % cfg.page_size;
    const std::int64_t in = cfg.layout == KvLayout::kNHD
                                ? (slot * cfg.heads_kv + h) * cfg.head_dim
                                : (h * cfg.page_size + slot) * cfg.head_dim;
    return id * page_elems() + in;
  }
};

/// Builds a random problem: values uniform in [-1, 1] (queries × q_gain; fp8 K and V stored ×
/// kv_amp, with the scales of `cfg`), page ids shuffled, unused pool slots NaN (so reading
/// outside the request's keys shows).
inline DecodeProblemHost make_decode_problem(const DecodeConfig& cfg, std::uint64_t seed) {
  DecodeProblemHost p;
  p.cfg = cfg;
  p.batch = static_cast<std::int64_t>(cfg.seq_lens.size());
  p.seq_lens = cfg.seq_lens;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<std::int64_t> pages_of(p.batch);
  std::int64_t used = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    pages_of[b] = (cfg.seq_lens[b] + cfg.page_size - 1) / cfg.page_size;
    used += pages_of[b];
    p.bt_stride = std::max(p.bt_stride, pages_of[b]);
  }
  p.bt_stride += 1;  // a spare column
  p.num_pages = used + cfg.spare_pages;
  std::vector<std::int32_t> perm(p.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  p.indptr.assign(p.batch + 1, 0);
  p.block_table.assign(std::max<std::int64_t>(1, p.batch * p.bt_stride), 0);
  std::int64_t next = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    p.indptr[b + 1] = p.indptr[b] + static_cast<std::int32_t>(pages_of[b]);
    for (std::int64_t i = 0; i < pages_of[b]; ++i) {
      p.indices.push_back(perm[next]);
      p.block_table[b * p.bt_stride + i] = perm[next];
      ++next;
    }
  }
  if (p.indices.empty()) p.indices.push_back(0);
  const float kv_amp = attnstate::is_fp8(cfg.kv_dtype) ? cfg.kv_amp : 1.f;
  p.k_scale_mem = cfg.k_scales;
  p.v_scale_mem = cfg.v_scales;
  const std::int64_t pool = std::max<std::int64_t>(1, p.num_pages) * p.page_elems();
  const std::size_t esz = attnstate::size_of(cfg.kv_dtype);
  p.k.assign(pool * esz, 0);
  p.v.assign(pool * esz, 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t i = 0; i < pool; ++i) {
    put(p.k, cfg.kv_dtype, i, nan);
    put(p.v, cfg.kv_dtype, i, nan);
  }
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t t = 0; t < pages_of[b] * cfg.page_size; ++t)
      for (std::int64_t h = 0; h < cfg.heads_kv; ++h) {
        const std::int64_t off = p.kv_offset(b, t, h);
        for (std::int64_t d = 0; d < cfg.head_dim; ++d) {
          put(p.k, cfg.kv_dtype, off + d, u(rng) * kv_amp);
          put(p.v, cfg.kv_dtype, off + d, u(rng) * kv_amp);
        }
      }
  const std::int64_t qn = p.batch * cfg.q_len * cfg.heads_q * cfg.head_dim;
  p.q.assign(std::max<std::int64_t>(1, qn) * attnstate::size_of(cfg.q_dtype), 0);
  for (std::int64_t i = 0; i < qn; ++i) put(p.q, cfg.q_dtype, i, u(rng) * cfg.q_gain);
  return p;
}

/// `p` as one problem for the testing kit: the queries `(tokens, heads_q, head_dim)` and every
/// request's keys gathered from the pool into `k`/`v` (request after request, in key order).
inline attnstate::testing::AttentionProblem decode_as_problem(const DecodeProblemHost& p,
                                                              float scale) {
  const auto& c = p.cfg;
  std::int64_t keys = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) keys += p.seq_lens[b];
  std::vector<float> q(static_cast<std::size_t>(p.tokens() * c.heads_q * c.head_dim));
  for (std::size_t i = 0; i < q.size(); ++i)
    q[i] = static_cast<float>(get(p.q.data(), c.q_dtype, i));
  std::vector<float> k, v;
  k.reserve(static_cast<std::size_t>(keys * c.heads_kv * c.head_dim));
  v.reserve(k.capacity());
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t t = 0; t < p.seq_lens[b]; ++t)
      for (std::int64_t h = 0; h < c.heads_kv; ++h)
        for (std::int64_t d = 0; d < c.head_dim; ++d) {
          const std::int64_t off = p.kv_offset(b, t, h) + d;
          k.push_back(static_cast<float>(get(p.k.data(), c.kv_dtype, off)));
          v.push_back(static_cast<float>(get(p.v.data(), c.kv_dtype, off)));
        }
  attnstate::testing::AttentionProblem problem;
  problem.q = attnstate::testing::HostTensor::from_floats(c.q_dtype,
                                                          {p.tokens(), c.heads_q, c.head_dim}, q);
  problem.k =
      attnstate::testing::HostTensor::from_floats(c.kv_dtype, {keys, c.heads_kv, c.head_dim}, k);
  problem.v =
      attnstate::testing::HostTensor::from_floats(c.kv_dtype, {keys, c.heads_kv, c.head_dim}, v);
  problem.scale = scale;
  if (attnstate::is_fp8(c.kv_dtype)) {  // stored values: the kit reads them × the scales
    problem.k_scale = c.k_scales;
    problem.v_scale = c.v_scales;
  }
  return problem;
}

/// The keys of `decode_as_problem(p)` each query row sees: row `i` of request `b` sees the
/// request's keys `[0, len - q_len + i]` (none when that is empty).
inline std::vector<std::vector<std::int64_t>> decode_keys(const DecodeProblemHost& p) {
  std::vector<std::vector<std::int64_t>> keys;
  std::int64_t first = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t qi = 0; qi < p.cfg.q_len; ++qi) {
      const std::int64_t n = std::max<std::int64_t>(0, p.seq_lens[b] - p.cfg.q_len + qi + 1);
      keys.emplace_back();
      for (std::int64_t i = 0; i < n; ++i) keys.back().push_back(first + i);
    }
    first += p.seq_lens[b];
  }
  return keys;
}

/// The testing kit's double reference of `p`'s decode (natural-log LSEs; rows without keys are
/// `(0, -inf)`).
inline attnstate::testing::ReferenceState reference_decode(const DecodeProblemHost& p,
                                                           float scale) {
  return attnstate::testing::reference_state_per_token(decode_as_problem(p, scale), decode_keys(p),
                                                       attnstate::LseBase::kNatural);
}

/// The decode tests' bounds in the kit's tolerance model: `o_abs` absolute on `o`, the LSE
/// within `lse_rel · max(1, |lse|)` (natural log).
inline attnstate::testing::Tolerance decode_tolerance(double o_abs, double lse_rel) {
  return attnstate::testing::Tolerance::absolute(o_abs, 0, lse_rel, 1);
}

/// Compares a decode's raw output (`o` in `o_dtype`, LSEs in `base`, `(tokens, heads, dim)`
/// contiguous, as `ref`) with the reference by the kit's `compare_states`: "" when they match,
/// else the first mismatches. Empty rows must be exactly `(0, -inf)`; a NaN fails.
inline std::string compare_decode(const attnstate::testing::ReferenceState& ref, const void* o,
                                  DType o_dtype, const float* lse, attnstate::LseBase base,
                                  const attnstate::testing::Tolerance& tol) {
  const attnstate::ConstStateView view =
      attnstate::make_const_state_view(o, o_dtype, lse, ref.tokens, ref.heads, ref.head_dim, base);
  return attnstate::testing::compare_states(attnstate::testing::HostState::from_view(view), ref,
                                            tol);
}

/// Host output buffers of a state `(tokens, heads, head_dim)` in `dtype` and `base`.
struct HostState {
  std::vector<unsigned char> o;
  std::vector<float> lse;
  attnstate::StateView view;
  HostState(std::int64_t tokens, std::int64_t heads, std::int64_t dim, DType dtype,
            attnstate::LseBase base) {
    o.assign(std::max<std::int64_t>(1, tokens * heads * dim) * attnstate::size_of(dtype), 0xFF);
    lse.assign(std::max<std::int64_t>(1, tokens * heads), std::numeric_limits<float>::quiet_NaN());
    view = attnstate::make_state_view(o.data(), dtype, lse.data(), tokens, heads, dim, base);
  }
};

/// Max abs difference of elements `[0, n)` of two raw buffers of dtype `dt`; +inf as soon as
/// either side holds a NaN (std::max would skip it, so a NaN could never fail a bound).
inline double max_abs_diff(const void* a, const void* b, DType dt, std::int64_t n) {
  double worst = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double e = std::fabs(get(a, dt, i) - get(b, dt, i));
    if (std::isnan(e)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, e);
  }
  return worst;
}

}  // namespace attnstate_test
