/// @file merge.cpp
/// @brief CPU backend: `merge_state`, `merge_state_inplace`, `merge_states` (dense and ragged)
///        and `rebase`, multi-threaded over (token, head) rows, numerics from merge_math.hpp.
///
/// Inputs are converted on load (`math::convert_lse` into the output's base, `to_float` for o,
/// times the view's `o_scale` for an fp8 o); sums are fp32 and the result is rounded once to the
/// output dtype (an fp8 output: value / `o_scale`, saturating). `merge_states_ragged` and `rebase`
/// take no fp8 o. Every (token, head) row is
/// computed by one thread in a fixed order, so results do not depend on scheduling.
#include "attnstate/cpu/merge.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnstate/core/merge_math.hpp"
#include "common/validate.hpp"
#include "cpu/loader.hpp"
#include "cpu/merge_rows.hpp"
#include "cpu/parallel.hpp"

namespace attnstate {
namespace cpu {
namespace {

namespace v = attnstate::detail;
constexpr MemorySpace kHost = MemorySpace::kHost;
/// Elements of o touched per parallel chunk (amortises scheduling).
constexpr std::int64_t kGrainElems = std::int64_t{1} << 15;
/// Floats of fp32 accumulator per block of heads of one token (stays in L1/L2).
constexpr std::int64_t kBlockFloats = 8192;

template <class T>
const T* typed(const void* p) {
  return static_cast<const T*>(p);
}

using detail::Loader;

/// Bytes ahead of each read that are prefetched. The hardware prefetchers alone leave the merge
/// at about half the read bandwidth of a plain streaming loop; hinting ~8 KiB ahead of the
/// row being read (the next rows of a sequential scan) recovers most of the gap.
constexpr std::uintptr_t kPrefetchAhead = 8192;

/// Hints the cache to load the `bytes` that start `kPrefetchAhead` bytes after `p`. A hint never
/// faults, so the address may lie past the end of the buffer (it is formed as an integer).
void prefetch_ahead(const void* p, std::size_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p) + kPrefetchAhead;
  for (std::size_t b = 0; b < bytes; b += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(a + b), 0, 3);
#else
  (void)p;
  (void)bytes;
#endif
}

std::int64_t grain_rows(std::int64_t head_dim, std::int64_t states) {
  return std::max<std::int64_t>(1, kGrainElems / (head_dim * std::max<std::int64_t>(1, states)));
}

// ---------------------------------------------------------------------------------------------
// Pairwise: out = a ⊕ b (out may be a or b exactly). A token the mask leaves out is not
// written by the in-place form and gets `a ⊕ (0, -inf)`, `a` converted, out of place.

/// The LSE of `b` at row `(t, h)` as the pairwise merge sees it: `-inf` (the empty state) where
/// the mask leaves token `t` out.
inline float masked_lse(const ConstStateView& b, const TokenMask& mask, std::int64_t t,
                        std::int64_t h, LseBase base) {
  return mask.selected(t) ? math::convert_lse(b.lse[b.lse_offset(t, h)], b.base, base)
                          : math::neg_inf();
}

template <class Ta, class Tb, class To>
void pair_rows(const ConstStateView& a, const ConstStateView& b, const StateView& out,
               const TokenMask& mask, bool in_place, std::int64_t r0, std::int64_t r1) {
  const LseBase base = out.base;
  const std::int64_t heads = out.heads, dim = out.head_dim;
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t t = r / heads, h = r % heads;
    if (in_place && !mask.selected(t)) continue;
    const float la = math::convert_lse(a.lse[a.lse_offset(t, h)], a.base, base);
    const float lb = masked_lse(b, mask, t, h, base);
    const math::PairWeights p = math::pair_weights(base, la, lb);
    const Loader<Ta> load_a;
    const Loader<Tb> load_b;
    const Ta* oa = typed<Ta>(a.o) + a.o_offset(t, h);
    const Tb* ob = typed<Tb>(b.o) + b.o_offset(t, h);
    To* oo = static_cast<To*>(out.o) + out.o_offset(t, h);
    // Branch once per row; pair_combine then folds to a straight loop (and never reads the
    // o of an empty side).
    if (p.a_empty && p.b_empty) {
      for (std::int64_t d = 0; d < dim; ++d)
        oo[d] = from_float<To>(math::pair_combine(p, 0.f, 0.f));
    } else if (p.b_empty) {
      for (std::int64_t d = 0; d < dim; ++d)
        oo[d] = from_float<To>(math::pair_combine(p, load_a(oa[d]), 0.f));
    } else if (p.a_empty) {
      for (std::int64_t d = 0; d < dim; ++d)
        oo[d] = from_float<To>(math::pair_combine(p, 0.f, load_b(ob[d])));
    } else {
      for (std::int64_t d = 0; d < dim; ++d)
        oo[d] = from_float<To>(math::pair_combine(p, load_a(oa[d]), load_b(ob[d])));
    }
    if (out.lse != nullptr) out.lse[out.lse_offset(t, h)] = p.lse;
  }
}

/// `dst[d]` = the real value of element `d` of the row at `o + off` (`dt`): `to_float`, times
/// `scale` for an fp8 `o`.
void load_o_row(const void* o, DType dt, float scale, std::int64_t off, std::int64_t n,
                float* dst) {
  dispatch_dtype_with_fp8(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* p = typed<T>(o) + off;
    if constexpr (kIsFp8<T>) {
      const float* table = detail::fp8_table<T>();
      for (std::int64_t d = 0; d < n; ++d) dst[d] = table[p[d].bits] * scale;
    } else {
      const Loader<T> load;
      for (std::int64_t d = 0; d < n; ++d) dst[d] = load(p[d]);
    }
  });
}

/// Writes `src[d]` to the row at `o + off` (`dt`), rounded once; an fp8 `o` stores the
/// saturating rounding of `src[d] / scale`.
void store_o_row(void* o, DType dt, float scale, std::int64_t off, std::int64_t n,
                 const float* src) {
  dispatch_dtype_with_fp8(dt, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(o) + off;
    if constexpr (kIsFp8<T>) {
      for (std::int64_t d = 0; d < n; ++d) p[d] = from_float<T>(src[d] / scale);
    } else {
      for (std::int64_t d = 0; d < n; ++d) p[d] = from_float<T>(src[d]);
    }
  });
}

/// `pair_rows` for calls with an fp8 `o` (any of the three): each row's inputs are loaded as
/// real values into fp32 rows, combined as `pair_rows` does and stored once, so the fp8 forms add
/// two conversions per dtype instead of a kernel per dtype combination.
void pair_rows_fp8(const ConstStateView& a, const ConstStateView& b, const StateView& out,
                   const TokenMask& mask, bool in_place, std::int64_t r0, std::int64_t r1) {
  const LseBase base = out.base;
  const std::int64_t heads = out.heads, dim = out.head_dim;
  thread_local std::vector<float> fa, fb, fo;
  fa.assign(dim, 0.f);
  fb.assign(dim, 0.f);
  fo.resize(dim);
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t t = r / heads, h = r % heads;
    if (in_place && !mask.selected(t)) continue;
    const float la = math::convert_lse(a.lse[a.lse_offset(t, h)], a.base, base);
    const float lb = masked_lse(b, mask, t, h, base);
    const math::PairWeights p = math::pair_weights(base, la, lb);
    // an empty side's o is never read (pair_combine does not use its value)
    if (!p.a_empty) load_o_row(a.o, a.dtype, a.o_scale, a.o_offset(t, h), dim, fa.data());
    if (!p.b_empty) load_o_row(b.o, b.dtype, b.o_scale, b.o_offset(t, h), dim, fb.data());
    for (std::int64_t d = 0; d < dim; ++d) fo[d] = math::pair_combine(p, fa[d], fb[d]);
    store_o_row(out.o, out.dtype, out.o_scale, out.o_offset(t, h), dim, fo.data());
    if (out.lse != nullptr) out.lse[out.lse_offset(t, h)] = p.lse;
  }
}

void pair_merge(const ConstStateView& a, const ConstStateView& b, const StateView& out,
                const TokenMask& mask, bool in_place) {
  const std::int64_t rows = out.tokens * out.heads;
  if (rows == 0) return;
  if (is_fp8(a.dtype) || is_fp8(b.dtype) || is_fp8(out.dtype)) {
    detail::parallel_for(0, rows, grain_rows(out.head_dim, 2),
                         [&](std::int64_t r0, std::int64_t r1) {
                           pair_rows_fp8(a, b, out, mask, in_place, r0, r1);
                         });
    return;
  }
  dispatch_dtype(a.dtype, [&](auto ta) {
    dispatch_dtype(b.dtype, [&](auto tb) {
      dispatch_dtype(out.dtype, [&](auto to) {
        using Ta = decltype(ta);
        using Tb = decltype(tb);
        using To = decltype(to);
        detail::parallel_for(0, rows, grain_rows(out.head_dim, 2),
                             [&](std::int64_t r0, std::int64_t r1) {
                               pair_rows<Ta, Tb, To>(a, b, out, mask, in_place, r0, r1);
                             });
      });
    });
  });
}

// ---------------------------------------------------------------------------------------------
// N-ary: out[t, h] = ⊕ of a run of states per token (a dense stack, or ragged rows).

/// Where the states of token t live: `count(t)` states, state s of head h at
/// `o + o_token(t) + s * o_stride_state + h * o_stride_head` (likewise for lse).
struct StackSource {
  const void* o = nullptr;
  const float* lse = nullptr;
  LseBase base = LseBase::kNatural;
  float o_scale = 1.f;  ///< Scale of an fp8 `o` (1 otherwise).
  std::int64_t o_stride_head = 0, lse_stride_head = 0;
  std::int64_t o_stride_state = 0, lse_stride_state = 0;
  std::int64_t o_stride_token = 0, lse_stride_token = 0, num_states = 0;
  const std::int32_t* indptr = nullptr;  ///< Ragged when non-null.

  std::int64_t count(std::int64_t t) const {
    return indptr ? static_cast<std::int64_t>(indptr[t + 1]) - indptr[t] : num_states;
  }
  std::int64_t first(std::int64_t t) const { return indptr ? indptr[t] : 0; }
  std::int64_t o_token(std::int64_t t) const {
    return indptr ? first(t) * o_stride_state : t * o_stride_token;
  }
  std::int64_t lse_token(std::int64_t t) const {
    return indptr ? first(t) * lse_stride_state : t * lse_stride_token;
  }
};

/// Per-thread scratch of the n-ary merge of a block of rows.
struct Scratch {
  std::vector<float> w;            // (S, nb) converted LSEs, then weights
  std::vector<std::uint8_t> live;  // (S, nb) 1 when the input is non-empty
  std::vector<float> m, sum, inv, lse, acc;
  std::vector<std::int64_t> o_row, lse_row;  // (nb) offsets of state 0 of each row
  std::vector<std::uint8_t> started;
};

/// Merges the rows `[r0, r0 + nb)` (row = token * heads + head) of one token, which all have
/// `states` inputs. Reads the inputs state by state (long sequential runs for both dense layouts),
/// accumulating `Σ w o` in an fp32 block that stays in L1/L2, then normalises once and rounds
/// once to the output dtype.
template <class Ti, class To>
void merge_block(const StackSource& src, const StateView& out, std::int64_t r0, std::int64_t nb,
                 std::int64_t states, Scratch& sc) {
  const LseBase base = out.base;
  const std::int64_t dim = out.head_dim, heads = out.heads;
  const std::size_t n = static_cast<std::size_t>(states * nb);
  if (sc.w.size() < n) {
    sc.w.resize(n);
    sc.live.resize(n);
  }
  sc.m.assign(nb, math::neg_inf());
  sc.sum.assign(nb, 0.f);
  sc.inv.resize(nb);
  sc.lse.resize(nb);
  sc.o_row.resize(nb);
  sc.lse_row.resize(nb);
  sc.started.assign(nb, 0);
  if (sc.acc.size() < static_cast<std::size_t>(nb * dim)) sc.acc.resize(nb * dim);
  for (std::int64_t j = 0; j < nb; ++j) {
    const std::int64_t t = (r0 + j) / heads, h = (r0 + j) % heads;
    sc.o_row[j] = src.o_token(t) + h * src.o_stride_head;
    sc.lse_row[j] = src.lse_token(t) + h * src.lse_stride_head;
  }
  // Pass 1: LSEs in the working base and their max.
  for (std::int64_t s = 0; s < states; ++s) {
    const float* ls = src.lse + s * src.lse_stride_state;
    float* w = sc.w.data() + s * nb;
    for (std::int64_t j = 0; j < nb; ++j) {
      w[j] = math::convert_lse(ls[sc.lse_row[j]], src.base, base);
      sc.m[j] = math::nan_max(sc.m[j], w[j]);
    }
  }
  // Pass 2: weights of the non-empty inputs, their sum, and the merged LSE.
  for (std::int64_t s = 0; s < states; ++s) {
    float* w = sc.w.data() + s * nb;
    std::uint8_t* live = sc.live.data() + s * nb;
    for (std::int64_t j = 0; j < nb; ++j) {
      live[j] = !math::is_empty_lse(w[j]);
      if (live[j]) {
        w[j] = math::merge_weight(base, w[j], sc.m[j]);
        sc.sum[j] += w[j];
      }
    }
  }
  for (std::int64_t j = 0; j < nb; ++j) {
    const math::MergeResult r = math::merge_finalize(base, sc.m[j], sc.sum[j]);
    sc.inv[j] = r.inv_sum;
    sc.lse[j] = r.lse;
  }
  // Pass 3: the weighted sum of o, state by state, then normalise once.
  for (std::int64_t s = 0; s < states; ++s) {
    const Ti* os = typed<Ti>(src.o) + s * src.o_stride_state;
    const float* w = sc.w.data() + s * nb;
    const std::uint8_t* live = sc.live.data() + s * nb;
    for (std::int64_t j = 0; j < nb; ++j) {
      if (!live[j]) continue;  // an empty input's o is never read
      const Ti* o = os + sc.o_row[j];
      prefetch_ahead(o, dim * sizeof(Ti));
      float* acc = sc.acc.data() + j * dim;
      const float wj = w[j];
      // The first term is assigned so a lone input passes through bitwise.
      if constexpr (kIsFp8<Ti>) {
        detail::axpy_row_fp8(wj, o, src.o_scale, acc, dim, !sc.started[j]);
      } else {
        detail::axpy_row(wj, o, acc, dim, !sc.started[j]);
      }
      sc.started[j] = 1;
    }
  }
  for (std::int64_t j = 0; j < nb; ++j) {
    const std::int64_t t = (r0 + j) / heads, h = (r0 + j) % heads;
    To* oo = static_cast<To*>(out.o) + out.o_offset(t, h);
    const float* acc = sc.acc.data() + j * dim;
    const float inv = sc.inv[j];
    if (!sc.started[j]) {
      for (std::int64_t d = 0; d < dim; ++d) oo[d] = from_float<To>(0.f);
    } else if constexpr (kIsFp8<To>) {
      detail::scale_store_row_fp8(acc, inv, out.o_scale, oo, dim);
    } else {
      detail::scale_store_row(acc, inv, oo, dim);
    }
    if (out.lse != nullptr) out.lse[out.lse_offset(t, h)] = sc.lse[j];
  }
}

void nary_merge(const StackSource& src, DType in_dtype, const StateView& out,
                std::int64_t avg_states) {
  const std::int64_t heads = out.heads, dim = out.head_dim;
  const std::int64_t rows = out.tokens * heads;
  if (rows == 0) return;
  const std::int64_t block = std::max<std::int64_t>(1, kBlockFloats / dim);
  dispatch_dtype_with_fp8(in_dtype, [&](auto ti) {
    dispatch_dtype_with_fp8(out.dtype, [&](auto to) {
      using Ti = decltype(ti);
      using To = decltype(to);
      detail::parallel_for(0, rows, grain_rows(dim, avg_states),
                           [&](std::int64_t r0, std::int64_t r1) {
                             thread_local Scratch sc;
                             for (std::int64_t r = r0; r < r1;) {
                               // A block stays within one token: its rows share their state
                               // count, and for [T, S, H, D] stacks it is one sequential scan
                               // (blocks spanning tokens interleave streams and run slower).
                               const std::int64_t nb = std::min({r1 - r, block, heads - r % heads});
                               merge_block<Ti, To>(src, out, r, nb, src.count(r / heads), sc);
                               r += nb;
                             }
                           });
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Rebase: out = in converted to out's base and dtype.

template <class Ti, class To>
void rebase_rows(const ConstStateView& in, const StateView& out, bool copy_o, std::int64_t r0,
                 std::int64_t r1) {
  const std::int64_t heads = out.heads, dim = out.head_dim;
  const Loader<Ti> load;
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t t = r / heads, h = r % heads;
    const float lse = math::convert_lse(in.lse[in.lse_offset(t, h)], in.base, out.base);
    To* oo = static_cast<To*>(out.o) + out.o_offset(t, h);
    if (math::is_empty_lse(lse)) {
      // the empty state is (0, -inf) whatever its o held (NaN included), also in place
      for (std::int64_t d = 0; d < dim; ++d) oo[d] = from_float<To>(0.f);
    } else if (copy_o) {
      const Ti* oi = typed<Ti>(in.o) + in.o_offset(t, h);
      for (std::int64_t d = 0; d < dim; ++d) oo[d] = from_float<To>(load(oi[d]));
    }
    out.lse[out.lse_offset(t, h)] = lse;
  }
}

}  // namespace

void merge_state(ConstStateView a, ConstStateView b, StateView out, TokenMask mask) {
  static const char* const kFunc = "attnstate::cpu::merge_state";
  constexpr bool kFp8 = true;  // every dtype combination, fp8 included
  constexpr bool kLseOptional = true;
  v::check_state(kFunc, "a", a, kHost, kFp8);
  v::check_state(kFunc, "b", b, kHost, kFp8);
  v::check_output_state(kFunc, "out", out, kHost, kFp8, kLseOptional);
  v::check_same_shape(kFunc, "a", a, "b", b);
  v::check_same_shape(kFunc, "a", a, "out", out);
  v::check_alias(kFunc, "out", out, "a", a);
  v::check_alias(kFunc, "out", out, "b", b);
  v::check_mask(kFunc, "mask", mask, "out", out);
  pair_merge(a, b, out, mask, /*in_place=*/false);
}

void merge_state_inplace(StateView acc, ConstStateView other, TokenMask mask) {
  static const char* const kFunc = "attnstate::cpu::merge_state_inplace";
  constexpr bool kFp8 = true;
  v::check_output_state(kFunc, "acc", acc, kHost, kFp8);
  v::check_state(kFunc, "other", other, kHost, kFp8);
  v::check_same_shape(kFunc, "acc", acc, "other", other);
  v::check_alias(kFunc, "acc", acc, "other", other);
  v::check_mask(kFunc, "mask", mask, "acc", acc);
  pair_merge(acc, other, acc, mask, /*in_place=*/true);
}

void merge_states(ConstStateStackView states, StateView out) {
  static const char* const kFunc = "attnstate::cpu::merge_states";
  constexpr bool kFp8 = true;
  constexpr bool kLseOptional = true;
  v::check_stack(kFunc, "states", states, kHost, kFp8, /*min_states=*/0);
  v::check_output_state(kFunc, "out", out, kHost, kFp8, kLseOptional);
  v::check_same_shape(kFunc, "states", states, "out", out);
  v::check_disjoint(kFunc, "out", out, "states", states);
  StackSource src;
  src.o = states.o;
  src.lse = states.lse;
  src.base = states.base;
  src.o_scale = states.o_scale;
  src.o_stride_head = states.o_stride_head;
  src.lse_stride_head = states.lse_stride_head;
  src.o_stride_state = states.o_stride_state;
  src.lse_stride_state = states.lse_stride_state;
  src.o_stride_token = states.o_stride_token;
  src.lse_stride_token = states.lse_stride_token;
  src.num_states = states.num_states;
  nary_merge(src, states.dtype, out, states.num_states);
}

void merge_states_ragged(ConstStateView rows, const std::int32_t* indptr, StateView out) {
  static const char* const kFunc = "attnstate::cpu::merge_states_ragged";
  v::check_state(kFunc, "rows", rows, kHost);
  v::check_output_state(kFunc, "out", out, kHost, /*fp8=*/false, /*lse_optional=*/true);
  if (rows.heads != out.heads) {
    v::throw_argument(kFunc, "rows.heads", std::to_string(out.heads) + " (as out.heads)",
                      std::to_string(rows.heads));
  }
  if (rows.head_dim != out.head_dim) {
    v::throw_argument(kFunc, "rows.head_dim", std::to_string(out.head_dim) + " (as out.head_dim)",
                      std::to_string(rows.head_dim));
  }
  v::check_aligned(kFunc, "indptr", indptr, sizeof(std::int32_t));
  v::check_indptr_host(kFunc, "indptr", indptr, out.tokens, rows.tokens);
  v::check_disjoint(kFunc, "out", out, "rows", rows.o, v::o_bytes(rows), rows.lse,
                    v::lse_bytes(rows));
  v::check_disjoint(kFunc, "out", out, "indptr", indptr, (out.tokens + 1) * 4, nullptr, 0);
  StackSource src;
  src.o = rows.o;
  src.lse = rows.lse;
  src.base = rows.base;
  src.o_stride_head = rows.o_stride_head;
  src.lse_stride_head = rows.lse_stride_head;
  src.o_stride_state = rows.o_stride_token;
  src.lse_stride_state = rows.lse_stride_token;
  src.indptr = indptr;
  const std::int64_t used = static_cast<std::int64_t>(indptr[out.tokens]) - indptr[0];
  nary_merge(src, rows.dtype, out, out.tokens > 0 ? used / out.tokens : 1);
}

void mark_empty_rows(StateView state) {
  static const char* const kFunc = "attnstate::cpu::mark_empty_rows";
  v::check_output_lse(kFunc, "state", state, kHost);
  for (std::int64_t t = 0; t < state.tokens; ++t)
    for (std::int64_t h = 0; h < state.heads; ++h) {
      float& l = state.lse[state.lse_offset(t, h)];
      if (l == INFINITY) l = -INFINITY;
    }
}

void rebase(ConstStateView in, StateView out) {
  static const char* const kFunc = "attnstate::cpu::rebase";
  v::check_state(kFunc, "in", in, kHost);
  v::check_output_state(kFunc, "out", out, kHost);
  v::check_same_shape(kFunc, "in", in, "out", out);
  v::check_alias(kFunc, "out", out, "in", in);
  const std::int64_t rows = out.tokens * out.heads;
  if (rows == 0) return;
  const bool copy_o = out.o != in.o;  // exact alias (checked above): o is already in place
  dispatch_dtype(in.dtype, [&](auto ti) {
    dispatch_dtype(out.dtype, [&](auto to) {
      using Ti = decltype(ti);
      using To = decltype(to);
      detail::parallel_for(
          0, rows, grain_rows(out.head_dim, 1),
          [&](std::int64_t r0, std::int64_t r1) { rebase_rows<Ti, To>(in, out, copy_o, r0, r1); });
    });
  });
}

}  // namespace cpu
}  // namespace attnstate
