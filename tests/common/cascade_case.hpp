/// @file cascade_case.hpp
/// @brief Test support for cascade attention: random cascade problems in a shuffled paged pool,
///        their host level arrays, and plain attention over each request's concatenated KV in
///        double precision (the testing kit's reference, which every cascade result is compared
///        with by the kit's comparison).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/host_tensor.hpp"
#include "attnstate/testing/problem.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace attnstate_test {

/// One segment of a level: how many consecutive requests share it and how many tokens it holds.
struct SegmentSpec {
  int requests = 1;  ///< Consecutive requests served (≥ 0).
  int len = 0;       ///< Tokens (≥ 0).
};

/// The shape of a random cascade problem.
struct CaseSpec {
  int q_len = 1;
  int heads_q = 8;
  int heads_kv = 2;
  int head_dim = 128;
  int page_size = 16;
  attnstate::DType dtype = attnstate::DType::kBF16;
  attnstate::KvLayout layout = attnstate::KvLayout::kNHD;
  bool causal = true;
  float scale = 0.f;
  float soft_cap = 0.f;  ///< Logits soft cap of the options and the reference (0: none).
  /// Sliding window of the options and the reference (-1: none): a query token at position `p`
  /// of its request's concatenated keys sees those at `[max(0, p - window_left), p]`.
  std::int64_t window_left = -1;
  float q_amp = 1.f;    ///< Queries uniform in [-q_amp, q_amp].
  int page_pad = 0;     ///< Extra elements between pages (a multiple of 8).
  int extra_pages = 3;  ///< Unused pages in the pool (random garbage).
  /// NaN in every pool element no key of the problem owns: the slots past each segment's end
  /// in its last page, the padding between pages, the unused pages (none may ever be read).
  bool nan_outside = false;
  /// Page ids of the pool: 0 shuffled; 1 consecutive in allocation order (each segment's pages
  /// one run); 2 consecutive with random breaks (about one page in eight swapped elsewhere).
  int placement = 0;
  /// A query row (token · heads_q + head) whose element 3 is NaN, -1 for none: that row's
  /// reference state is NaN (its scores are), every other row is unaffected.
  int nan_query_row = -1;
  /// A key of the first segment of level 0 whose element 3 is NaN in KV head 0, -1 for none:
  /// every row of that head's group that sees the key has a NaN reference state.
  int nan_key = -1;
  std::uint64_t seed = 1;
  std::vector<std::vector<SegmentSpec>> levels;  ///< Level-major segment lists.
  /// fp8 pools (e4m3, e5m2; unset: `dtype`): each K/V element stored as the fp8 rounding of a
  /// uniform value over its scale, read as `stored · scale` (`k_scale` / `v_scale`: one value
  /// or one per KV head).
  std::optional<attnstate::DType> kv_dtype;
  std::vector<float> k_scale{1.f}, v_scale{1.f};

  /// The pools' dtype.
  attnstate::DType pool_dtype() const { return kv_dtype.value_or(dtype); }
};

/// Host arrays of one level.
struct HostLevel {
  std::vector<std::int32_t> request_indptr, page_indptr, page_indices, seg_lens;
  /// A view of these host arrays.
  attnstate::CascadeLevel view() const {
    attnstate::CascadeLevel l;
    l.num_segments = static_cast<std::int64_t>(seg_lens.size());
    l.request_indptr = request_indptr.data();
    l.page_indptr = page_indptr.data();
    l.page_indices = page_indices.empty() ? nullptr : page_indices.data();
    l.seg_lens = seg_lens.data();
    return l;
  }
};

/// Pages a spec's segments occupy (without the extra ones).
inline std::int64_t needed_pages(const CaseSpec& s) {
  std::int64_t n = 0;
  for (const auto& lv : s.levels)
    for (const SegmentSpec& seg : lv) n += (seg.len + s.page_size - 1) / s.page_size;
  return n;
}

/// Raw storage of `n` values of `dt` rounded from `vals` (which are rounded in place).
inline std::vector<std::uint8_t> encode(std::vector<float>& vals, attnstate::DType dt) {
  std::vector<std::uint8_t> raw(vals.size() * attnstate::size_of(dt));
  for (std::size_t i = 0; i < vals.size(); ++i) {
    if (dt == attnstate::DType::kE4M3) {
      const auto x = attnstate::from_float<attnstate::float8_e4m3_t>(vals[i]);
      vals[i] = attnstate::to_float(x);
      raw[i] = x.bits;
    } else if (dt == attnstate::DType::kE5M2) {
      const auto x = attnstate::from_float<attnstate::float8_e5m2_t>(vals[i]);
      vals[i] = attnstate::to_float(x);
      raw[i] = x.bits;
    } else if (dt == attnstate::DType::kBF16) {
      const auto x = attnstate::from_float<attnstate::bfloat16_t>(vals[i]);
      vals[i] = attnstate::to_float(x);
      std::memcpy(&raw[2 * i], &x, 2);
    } else if (dt == attnstate::DType::kF16) {
      const auto x = attnstate::from_float<attnstate::half_t>(vals[i]);
      vals[i] = attnstate::to_float(x);
      std::memcpy(&raw[2 * i], &x, 2);
    } else {
      std::memcpy(&raw[4 * i], &vals[i], 4);
    }
  }
  return raw;
}

/// Decodes `n` stored values of `dt` to float.
inline std::vector<float> decode(const void* p, attnstate::DType dt, std::size_t n) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (dt == attnstate::DType::kBF16)
      out[i] = attnstate::to_float(static_cast<const attnstate::bfloat16_t*>(p)[i]);
    else if (dt == attnstate::DType::kF16)
      out[i] = attnstate::to_float(static_cast<const attnstate::half_t*>(p)[i]);
    else
      out[i] = static_cast<const float*>(p)[i];
  }
  return out;
}

/// A random cascade problem with its double-precision reference.
struct CascadeCase {
  CaseSpec spec;
  std::int64_t batch = 0;
  std::int64_t num_pages = 0;
  std::int64_t page_elems = 0;
  /// Values (already rounded to the dtype); of fp8 pools the stored values (times the scales:
  /// the real ones).
  std::vector<float> q, k, v;
  std::vector<std::uint8_t> q_raw, k_raw, v_raw;  ///< Stored bytes.
  std::vector<HostLevel> levels;
  /// The reference (the testing kit's): `(batch·q_len, heads_q, head_dim)`, natural log.
  attnstate::testing::ReferenceState reference;

  explicit CascadeCase(const CaseSpec& s) : spec(s) {
    std::mt19937_64 rng(s.seed);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    batch = 0;
    for (const SegmentSpec& seg : s.levels.at(0)) batch += seg.requests;
    // pages: every segment gets ceil(len / page_size) pages of a shuffled pool
    num_pages = needed_pages(s) + s.extra_pages;
    std::vector<std::int32_t> perm(static_cast<std::size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    if (s.placement == 0) {
      std::shuffle(perm.begin(), perm.end(), rng);
    } else if (s.placement == 2) {
      std::uniform_int_distribution<std::size_t> pick(0, perm.size() - 1);
      for (std::size_t i = 0; i < perm.size(); ++i)
        if (pick(rng) % 8 == 0) std::swap(perm[i], perm[pick(rng)]);
    }
    std::size_t next = 0;
    for (const auto& lv : s.levels) {
      HostLevel h;
      h.request_indptr.push_back(0);
      h.page_indptr.push_back(0);
      for (const SegmentSpec& seg : lv) {
        h.request_indptr.push_back(h.request_indptr.back() + seg.requests);
        const int np = (seg.len + s.page_size - 1) / s.page_size;
        for (int p = 0; p < np; ++p) h.page_indices.push_back(perm[next++]);
        h.page_indptr.push_back(h.page_indptr.back() + np);
        h.seg_lens.push_back(seg.len);
      }
      levels.push_back(h);
    }
    page_elems = static_cast<std::int64_t>(s.page_size) * s.heads_kv * s.head_dim + s.page_pad;
    q.resize(static_cast<std::size_t>(batch) * s.q_len * s.heads_q * s.head_dim);
    for (float& x : q) x = uni(rng) * s.q_amp;
    if (s.nan_query_row >= 0)
      q.at(static_cast<std::size_t>(s.nan_query_row) * s.head_dim + 3) =
          std::numeric_limits<float>::quiet_NaN();
    k.resize(static_cast<std::size_t>(num_pages * page_elems));
    v.resize(k.size());
    for (float& x : k) x = uni(rng);
    for (float& x : v) x = uni(rng);
    if (attnstate::is_fp8(s.pool_dtype())) {  // stored = the real value over its head's scale
      for (std::size_t i = 0; i < k.size(); ++i) {
        const std::int64_t h = head_of(static_cast<std::int64_t>(i));
        k[i] /= scale_at(s.k_scale, h);
        v[i] /= scale_at(s.v_scale, h);
      }
    }
    if (s.nan_outside) poison_outside();
    if (s.nan_key >= 0) {
      const HostLevel& h = levels.at(0);
      const std::int64_t page =
          h.page_indices.at(static_cast<std::size_t>(h.page_indptr[0] + s.nan_key / s.page_size));
      k.at(static_cast<std::size_t>(page * page_elems + in_page(s.nan_key % s.page_size, 0) + 3)) =
          std::numeric_limits<float>::quiet_NaN();
    }
    q_raw = encode(q, s.dtype);
    k_raw = encode(k, s.pool_dtype());
    v_raw = encode(v, s.pool_dtype());
    compute_reference();
  }

  /// Sets to NaN every K/V element that belongs to no key of the problem (see
  /// `CaseSpec::nan_outside`).
  void poison_outside() {
    std::vector<char> owned(static_cast<std::size_t>(k.size()), 0);
    for (const HostLevel& h : levels)
      for (std::size_t sg = 0; sg < h.seg_lens.size(); ++sg)
        for (std::int64_t j = 0; j < h.seg_lens[sg]; ++j) {
          const std::int64_t page = h.page_indices[h.page_indptr[sg] + j / spec.page_size];
          for (int hk = 0; hk < spec.heads_kv; ++hk) {
            const std::int64_t o = page * page_elems + in_page(j % spec.page_size, hk);
            std::fill(owned.begin() + o, owned.begin() + o + spec.head_dim, 1);
          }
        }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t i = 0; i < owned.size(); ++i)
      if (!owned[i]) k[i] = v[i] = nan;
  }

  /// The scale of KV head `h` in a list of one value or one per head.
  static float scale_at(const std::vector<float>& scales, std::int64_t h) {
    return scales.size() == 1 ? scales[0] : scales.at(static_cast<std::size_t>(h));
  }
  /// The KV head of pool element `i` (any head for the padding between pages).
  std::int64_t head_of(std::int64_t i) const {
    const std::int64_t in = i % page_elems, row = in / spec.head_dim;
    if (in >= static_cast<std::int64_t>(spec.page_size) * spec.heads_kv * spec.head_dim) return 0;
    return spec.layout == attnstate::KvLayout::kNHD ? row % spec.heads_kv : row / spec.page_size;
  }

  std::int64_t tokens() const { return batch * spec.q_len; }
  std::int64_t out_elems() const { return tokens() * spec.heads_q * spec.head_dim; }
  std::int64_t lse_elems() const { return tokens() * spec.heads_q; }
  float scale() const {
    return spec.scale != 0.f ? spec.scale : 1.f / std::sqrt(static_cast<float>(spec.head_dim));
  }
  std::int64_t in_page(std::int64_t slot, std::int64_t h) const {
    return spec.layout == attnstate::KvLayout::kNHD ? (slot * spec.heads_kv + h) * spec.head_dim
                                                    : (h * spec.page_size + slot) * spec.head_dim;
  }

  /// The pool description over `k`/`v` pointers in `space`; of an fp8 pool with one scale per KV
  /// head, those scales at `k_scales` / `v_scales` in `space` (the spec's own on the host).
  attnstate::PagedKvCache pool(const void* kp, const void* vp, attnstate::MemorySpace space,
                               const float* k_scales = nullptr,
                               const float* v_scales = nullptr) const {
    attnstate::PagedKvCache kv;
    if (attnstate::is_fp8(spec.pool_dtype())) {
      const auto scale = [&](const std::vector<float>& s, const float* at) {
        if (s.size() == 1) return attnstate::KvScale::per_tensor(s[0]);
        return attnstate::KvScale::per_head(at != nullptr ? at : s.data());
      };
      kv.k_scale = scale(spec.k_scale, k_scales);
      kv.v_scale = scale(spec.v_scale, v_scales);
    }
    kv.k = kp;
    kv.v = vp;
    kv.dtype = spec.pool_dtype();
    kv.layout = spec.layout;
    kv.num_pages = num_pages;
    kv.page_size = spec.page_size;
    kv.heads_kv = spec.heads_kv;
    kv.head_dim = spec.head_dim;
    kv.page_stride = spec.page_pad ? page_elems : 0;
    kv.space = space;
    return kv;
  }
  /// The query view over `data` in `space`.
  attnstate::ConstTensorView query(const void* data, attnstate::MemorySpace space) const {
    return attnstate::make_tensor_view(data, spec.dtype,
                                       {batch, spec.q_len, spec.heads_q, spec.head_dim}, space);
  }
  /// Host level views.
  std::vector<attnstate::CascadeLevel> host_levels() const {
    std::vector<attnstate::CascadeLevel> v;
    for (const HostLevel& h : levels) v.push_back(h.view());
    return v;
  }
  attnstate::CascadeOptions options() const {
    attnstate::CascadeOptions o;
    o.scale = spec.scale;
    o.causal = spec.causal;
    o.variant.logits_soft_cap = spec.soft_cap;
    o.variant.window_left = spec.window_left;
    return o;
  }

  /// The pool as a problem for the testing kit: `k`/`v` hold every pool slot (`page ·
  /// page_size + slot`, padding dropped), `q` the queries.
  attnstate::testing::AttentionProblem pool_problem() const {
    const std::int64_t slots = num_pages * spec.page_size, D = spec.head_dim;
    std::vector<float> ks(static_cast<std::size_t>(slots * spec.heads_kv * D));
    std::vector<float> vs(ks.size());
    for (std::int64_t page = 0; page < num_pages; ++page)
      for (std::int64_t slot = 0; slot < spec.page_size; ++slot)
        for (int hk = 0; hk < spec.heads_kv; ++hk) {
          const std::int64_t src = page * page_elems + in_page(slot, hk);
          const std::int64_t dst = ((page * spec.page_size + slot) * spec.heads_kv + hk) * D;
          std::copy(k.begin() + src, k.begin() + src + D, ks.begin() + dst);
          std::copy(v.begin() + src, v.begin() + src + D, vs.begin() + dst);
        }
    attnstate::testing::AttentionProblem p;
    p.q = attnstate::testing::HostTensor::from_floats(spec.dtype, {tokens(), spec.heads_q, D}, q);
    p.k = attnstate::testing::HostTensor::from_floats(spec.pool_dtype(), {slots, spec.heads_kv, D},
                                                      ks);
    p.v = attnstate::testing::HostTensor::from_floats(spec.pool_dtype(), {slots, spec.heads_kv, D},
                                                      vs);
    if (attnstate::is_fp8(spec.pool_dtype())) {
      p.k_scale = spec.k_scale;
      p.v_scale = spec.v_scale;
    }
    p.scale = scale();
    p.variant.logits_soft_cap = spec.soft_cap;
    return p;
  }

  /// The pool slots each query token sees: its request's segments level after level, the last
  /// level causally masked when `spec.causal` (token `t` of `q_len` sees all but the last
  /// `q_len - 1 - t` keys of it), the keys before its window dropped.
  std::vector<std::vector<std::int64_t>> keys_per_token() const {
    const int L = static_cast<int>(levels.size());
    std::vector<std::vector<std::int64_t>> keys;
    for (std::int64_t b = 0; b < batch; ++b) {
      std::vector<std::int64_t> slots;  // the request's keys in concatenation order
      std::int64_t shared = 0, last_len = 0;
      for (int l = 0; l < L; ++l) {
        const HostLevel& h = levels[l];
        std::int64_t s = 0;
        while (!(h.request_indptr[s] <= b && b < h.request_indptr[s + 1])) ++s;
        for (std::int64_t j = 0; j < h.seg_lens[s]; ++j) {
          const std::int64_t page = h.page_indices[h.page_indptr[s] + j / spec.page_size];
          slots.push_back(page * spec.page_size + j % spec.page_size);
        }
        if (l == L - 1) {
          last_len = h.seg_lens[s];
        } else {
          shared += h.seg_lens[s];
        }
      }
      const std::int64_t total = static_cast<std::int64_t>(slots.size());
      for (int t = 0; t < spec.q_len; ++t) {
        std::int64_t n = total;
        if (spec.causal) n = shared + std::max<std::int64_t>(0, last_len - (spec.q_len - 1 - t));
        // the window: positions from p - window_left, p the token's (CascadeOptions::variant)
        const std::int64_t p = spec.causal ? total - spec.q_len + t : total - 1;
        const std::int64_t begin =
            spec.window_left < 0 ? 0 : std::min(n, std::max<std::int64_t>(0, p - spec.window_left));
        keys.emplace_back(slots.begin() + begin, slots.begin() + n);
      }
    }
    return keys;
  }

 private:
  /// Plain attention over each request's concatenated keys: the testing kit's double reference.
  void compute_reference() {
    reference = attnstate::testing::reference_state_per_token(pool_problem(), keys_per_token(),
                                                              attnstate::LseBase::kNatural);
  }
};

/// Compares a computed state (o decoded to float, lse in `base`) with the case's reference by
/// the kit's `compare_states` within `|o - ref| ≤ tol_o` and `|lse - ref| ≤ tol_lse` (natural
/// log): every element finite where the reference is, empty rows exactly `(0, -inf)`, a row
/// whose reference is NaN (a NaN input) NaN in its LSE and in every element of o.
inline ::testing::AssertionResult matches_reference(const CascadeCase& c,
                                                    const std::vector<float>& o,
                                                    const std::vector<float>& lse,
                                                    attnstate::LseBase base, double tol_o,
                                                    double tol_lse) {
  const attnstate::ConstStateView view =
      attnstate::make_const_state_view(o.data(), attnstate::DType::kF32, lse.data(), c.tokens(),
                                       c.spec.heads_q, c.spec.head_dim, base);
  const std::string mismatch = attnstate::testing::compare_states(
      attnstate::testing::HostState::from_view(view), c.reference,
      attnstate::testing::Tolerance::absolute(tol_o, tol_lse));
  if (mismatch.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatch;
}

/// Tolerance on `o` for KV/query dtype `kv` and output dtype `out` (values in [-1, 1]).
inline double o_tolerance(attnstate::DType kv, attnstate::DType out) {
  double t = 2e-5;
  if (kv == attnstate::DType::kBF16) t += 6e-3;  // probabilities rounded to bf16 on the GPU
  if (kv == attnstate::DType::kF16) t += 1e-3;
  if (out == attnstate::DType::kBF16) t += 4e-3;
  if (out == attnstate::DType::kF16) t += 5e-4;
  return t;
}

/// Spec of a typical two-level problem: one shared prefix, unique suffixes.
inline CaseSpec two_level_spec(int batch, int prefix, int suffix, std::uint64_t seed) {
  CaseSpec s;
  s.seed = seed;
  s.levels.push_back({SegmentSpec{batch, prefix}});
  std::vector<SegmentSpec> suf;
  for (int b = 0; b < batch; ++b) suf.push_back(SegmentSpec{1, suffix + (b % 3) * 5});
  s.levels.push_back(suf);
  return s;
}

/// The cascades of both backends' sinks tests: two levels (4 requests, 16 query heads over 2 KV
/// heads); three levels at causal q_len 2 with 1-key last-level segments, the shortest a causal
/// last level may hold (q_len - 1 keys), which give row 0 no key of that level.
inline std::vector<CaseSpec> sink_cascade_specs() {
  CaseSpec two = two_level_spec(4, 300, 700, 61);
  two.heads_q = 16;
  two.heads_kv = 2;
  CaseSpec three;
  three.seed = 62;
  three.q_len = 2;
  three.levels = {
      {{6, 130}}, {{2, 64}, {4, 17}}, {{1, 400}, {1, 1}, {1, 333}, {1, 2}, {1, 90}, {1, 1}}};
  return {two, three};
}

}  // namespace attnstate_test
