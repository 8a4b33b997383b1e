/// @file decode_problem.hpp
/// @brief Random paged decode problems in host memory and a double-precision reference decode,
///        shared by the CPU and GPU decode tests.
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

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate_test {

using attnstate::DType;
using attnstate::KvLayout;

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

  std::string name() const {
    return "q_len=" + std::to_string(q_len) + " hq=" + std::to_string(heads_q) +
           " hkv=" + std::to_string(heads_kv) + " D=" + std::to_string(head_dim) +
           " page=" + std::to_string(page_size) + (layout == KvLayout::kHND ? " HND" : " NHD") +
           (block_table ? " bt" : " csr") + " q=" + attnstate::to_string(q_dtype) +
           " kv=" + attnstate::to_string(kv_dtype) + " gain=" + std::to_string(q_gain);
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

/// Stores a float as `dt` into raw bytes at element `i`.
inline void put(std::vector<unsigned char>& buf, DType dt, std::int64_t i, float x) {
  if (dt == DType::kF32) {
    std::memcpy(buf.data() + 4 * i, &x, 4);
  } else if (dt == DType::kF16) {
    const auto h = attnstate::from_float<attnstate::half_t>(x);
    std::memcpy(buf.data() + 2 * i, &h, 2);
  } else {
    const auto h = attnstate::from_float<attnstate::bfloat16_t>(x);
    std::memcpy(buf.data() + 2 * i, &h, 2);
  }
}
/// Reads element `i` of raw bytes of dtype `dt` as a double.
inline double get(const void* buf, DType dt, std::int64_t i) {
  const unsigned char* p = static_cast<const unsigned char*>(buf);
  if (dt == DType::kF32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  if (dt == DType::kF16) {
    attnstate::half_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return attnstate::to_float(h);
  }
  attnstate::bfloat16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return attnstate::to_float(h);
}

/// A decode problem in host memory: queries, paged K/V pools with shuffled page ids, tables.
struct DecodeProblemHost {
  DecodeConfig cfg;
  std::int64_t batch = 0;
  std::int64_t num_pages = 0;
  std::int64_t bt_stride = 0;
  std::vector<unsigned char> q, k, v;
  std::vector<std::int32_t> seq_lens, indptr, indices, block_table;

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
    return kv;
  }
  /// Host view of the queries `(batch, q_len, heads_q, head_dim)`.
  attnstate::ConstTensorView q_view() const {
    return attnstate::make_tensor_view(q.data(), cfg.q_dtype,
                                       {batch, cfg.q_len, cfg.heads_q, cfg.head_dim});
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

/// Builds a random problem: values uniform in [-1, 1] (queries × q_gain), page ids shuffled,
/// unused pool slots NaN (so reading outside the request's keys shows).
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
          put(p.k, cfg.kv_dtype, off + d, u(rng));
          put(p.v, cfg.kv_dtype, off + d, u(rng));
        }
      }
  const std::int64_t qn = p.batch * cfg.q_len * cfg.heads_q * cfg.head_dim;
  p.q.assign(std::max<std::int64_t>(1, qn) * attnstate::size_of(cfg.q_dtype), 0);
  for (std::int64_t i = 0; i < qn; ++i) put(p.q, cfg.q_dtype, i, u(rng) * cfg.q_gain);
  return p;
}

/// Reference states in double: `o (tokens, heads_q, head_dim)`, natural-log `lse (tokens,
/// heads_q)`; rows without keys give `(0, -inf)`.
struct ReferenceStates {
  std::vector<double> o, lse;
};

/// Double-precision decode of `p` (row i of request b sees keys [0, len - q_len + i]).
inline ReferenceStates reference_decode(const DecodeProblemHost& p, double scale) {
  const auto& c = p.cfg;
  const std::int64_t group = c.heads_q / c.heads_kv;
  const std::int64_t D = c.head_dim;
  ReferenceStates r;
  r.o.assign(p.tokens() * c.heads_q * D, 0.0);
  r.lse.assign(p.tokens() * c.heads_q, -std::numeric_limits<double>::infinity());
  std::vector<double> s;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t qi = 0; qi < c.q_len; ++qi)
      for (std::int64_t hq = 0; hq < c.heads_q; ++hq) {
        const std::int64_t hkv = hq / group;
        const std::int64_t n = std::max<std::int64_t>(0, p.seq_lens[b] - c.q_len + qi + 1);
        const std::int64_t token = b * c.q_len + qi;
        const std::int64_t qoff = (token * c.heads_q + hq) * D;
        if (n == 0) continue;
        s.assign(n, 0.0);
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t t = 0; t < n; ++t) {
          const std::int64_t off = p.kv_offset(b, t, hkv);
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += get(p.q.data(), c.q_dtype, qoff + d) * get(p.k.data(), c.kv_dtype, off + d);
          s[t] = dot * scale;
          m = std::max(m, s[t]);
        }
        double sum = 0;
        std::vector<double> acc(D, 0.0);
        for (std::int64_t t = 0; t < n; ++t) {
          const double w = std::exp(s[t] - m);
          sum += w;
          const std::int64_t off = p.kv_offset(b, t, hkv);
          for (std::int64_t d = 0; d < D; ++d) acc[d] += w * get(p.v.data(), c.kv_dtype, off + d);
        }
        for (std::int64_t d = 0; d < D; ++d) r.o[qoff + d] = acc[d] / sum;
        r.lse[token * c.heads_q + hq] = m + std::log(sum);
      }
  return r;
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

/// Max abs error of a state against the reference (lse compared in natural log; `-inf` must match
/// exactly). Returns +inf on a NaN or a mismatched empty row. `o_err`/`lse_err` receive both.
inline void compare_states(const ReferenceStates& ref, const void* o, DType o_dtype,
                           const float* lse, attnstate::LseBase base, std::int64_t rows,
                           std::int64_t dim, double* o_err, double* lse_err) {
  double eo = 0, el = 0;
  const double inf = std::numeric_limits<double>::infinity();
  for (std::int64_t r = 0; r < rows; ++r) {
    double l = lse[r];
    if (base == attnstate::LseBase::kBase2) l *= std::log(2.0);
    const double rl = ref.lse[r];
    if (std::isinf(rl) || std::isinf(l)) {
      if (!(std::isinf(rl) && std::isinf(l) && rl < 0 && l < 0)) el = inf;
    } else if (std::isnan(l)) {
      el = inf;
    } else {
      el = std::max(el, std::fabs(l - rl) / std::max(1.0, std::fabs(rl)));
    }
    for (std::int64_t d = 0; d < dim; ++d) {
      const double x = get(o, o_dtype, r * dim + d);
      const double e = std::fabs(x - ref.o[r * dim + d]);
      eo = std::isnan(x) ? inf : std::max(eo, e);
    }
  }
  *o_err = eo;
  *lse_err = el;
}

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
