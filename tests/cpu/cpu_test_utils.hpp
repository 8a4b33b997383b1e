/// @file cpu_test_utils.hpp
/// @brief Helpers of the CPU backend tests: owning strided host states, random fills, NaN
///        poisoning, and the testing kit's double references of the merge and of attention
///        over these states, compared by the kit's comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/host_tensor.hpp"
#include "attnstate/testing/problem.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace attnstate {
namespace test {

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kInf = std::numeric_limits<double>::infinity();

/// Reads element `i` of a buffer of dtype `dt` as double.
inline double load(const void* p, DType dt, std::int64_t i) {
  return dispatch_dtype(dt, [&](auto tag) -> double {
    using T = decltype(tag);
    return static_cast<double>(to_float(static_cast<const T*>(p)[i]));
  });
}

/// Writes `x` (rounded to `dt`) as element `i` of a buffer of dtype `dt`.
inline void store(void* p, DType dt, std::int64_t i, float x) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    static_cast<T*>(p)[i] = from_float<T>(x);
  });
}

/// Stored LSE in `base` -> natural log, in double.
inline double to_natural(float lse, LseBase base) {
  return base == LseBase::kBase2 ? static_cast<double>(lse) * kLn2 : static_cast<double>(lse);
}
/// Natural-log LSE -> stored value in `base` (rounded to float).
inline float from_natural(double lse, LseBase base) {
  return static_cast<float>(base == LseBase::kBase2 ? lse / kLn2 : lse);
}

/// Extra padding of a strided layout (elements), and whether heads are the outer dimension.
struct Padding {
  std::int64_t o_head = 0, o_token = 0, lse_head = 0, lse_token = 0;
  bool heads_major = false;
};

/// An owning state with arbitrary (padded) strides; all bytes outside the view are kept
/// poisoned so that stray writes can be detected.
struct OwnedState {
  StateLayout layout;
  std::vector<unsigned char> o;  // raw bytes, dtype layout.dtype
  std::vector<float> lse;

  StateView view() {
    StateView v;
    static_cast<StateLayout&>(v) = layout;
    v.o = o.data();
    v.lse = lse.data();
    return v;
  }
  ConstStateView cview() const {
    ConstStateView v;
    static_cast<StateLayout&>(v) = layout;
    v.o = o.data();
    v.lse = lse.data();
    return v;
  }
  double o_at(std::int64_t t, std::int64_t h, std::int64_t d) const {
    return load(o.data(), layout.dtype, layout.o_offset(t, h) + d);
  }
  float lse_at(std::int64_t t, std::int64_t h) const { return lse[layout.lse_offset(t, h)]; }
  double lse_nat(std::int64_t t, std::int64_t h) const {
    return to_natural(lse_at(t, h), layout.base);
  }
  void set_o(std::int64_t t, std::int64_t h, std::int64_t d, float x) {
    store(o.data(), layout.dtype, layout.o_offset(t, h) + d, x);
  }
  void set_lse(std::int64_t t, std::int64_t h, float x) { lse[layout.lse_offset(t, h)] = x; }
  /// Fills every byte with 0xFF (NaN in every dtype), the view and its padding.
  void poison() {
    std::fill(o.begin(), o.end(), 0xFF);
    std::memset(lse.data(), 0xFF, lse.size() * sizeof(float));
  }
  /// True when every o element and lse outside the view still holds the poison pattern.
  bool padding_untouched() const {
    const std::int64_t es = static_cast<std::int64_t>(size_of(layout.dtype));
    std::vector<char> in_o(o.size() / es, 0), in_lse(lse.size(), 0);
    for (std::int64_t t = 0; t < layout.tokens; ++t)
      for (std::int64_t h = 0; h < layout.heads; ++h) {
        in_lse[layout.lse_offset(t, h)] = 1;
        for (std::int64_t d = 0; d < layout.head_dim; ++d) in_o[layout.o_offset(t, h) + d] = 1;
      }
    for (std::size_t i = 0; i < in_o.size(); ++i)
      if (!in_o[i])
        for (std::int64_t b = 0; b < es; ++b)
          if (o[i * es + b] != 0xFF) return false;
    std::uint32_t bits;
    for (std::size_t i = 0; i < in_lse.size(); ++i) {
      std::memcpy(&bits, &lse[i], 4);
      if (!in_lse[i] && bits != 0xFFFFFFFFu) return false;
    }
    return true;
  }
};

/// A state `(tokens, heads, head_dim)` of `dtype` and `base` with the given padding, poisoned.
inline OwnedState make_state(std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                             DType dtype, LseBase base, const Padding& pad = {}) {
  OwnedState s;
  StateLayout& l = s.layout;
  l.tokens = tokens;
  l.heads = heads;
  l.head_dim = head_dim;
  l.dtype = dtype;
  l.base = base;
  if (!pad.heads_major) {
    l.o_stride_head = head_dim + pad.o_head;
    l.o_stride_token = heads * l.o_stride_head + pad.o_token;
    l.lse_stride_head = 1 + pad.lse_head;
    l.lse_stride_token = heads * l.lse_stride_head + pad.lse_token;
  } else {
    l.o_stride_token = head_dim + pad.o_token;
    l.o_stride_head = tokens * l.o_stride_token + pad.o_head;
    l.lse_stride_token = 1 + pad.lse_token;
    l.lse_stride_head = tokens * l.lse_stride_token + pad.lse_head;
  }
  const std::int64_t o_elems =
      tokens == 0 ? 1 : (tokens - 1) * l.o_stride_token + (heads - 1) * l.o_stride_head + head_dim;
  const std::int64_t lse_elems =
      tokens == 0 ? 1 : (tokens - 1) * l.lse_stride_token + (heads - 1) * l.lse_stride_head + 1;
  s.o.resize(static_cast<std::size_t>(o_elems) * size_of(dtype));
  s.lse.resize(static_cast<std::size_t>(lse_elems));
  s.poison();
  return s;
}

/// Random padding (or none) for a view.
inline Padding random_padding(std::mt19937& rng) {
  std::uniform_int_distribution<int> p(0, 3);
  Padding pad;
  if (p(rng) == 0) return pad;
  pad.o_head = p(rng);
  pad.o_token = p(rng);
  pad.lse_head = p(rng);
  pad.lse_token = p(rng);
  pad.heads_major = p(rng) == 0;
  return pad;
}

inline LseBase random_base(std::mt19937& rng) {
  return std::uniform_int_distribution<int>(0, 1)(rng) ? LseBase::kBase2 : LseBase::kNatural;
}

/// Fills a state with o ~ U(-2, 2) and natural LSEs ~ U(lse_lo, lse_hi) (stored in the state's
/// base); each (token, head) is empty (lse -inf, o NaN) with probability `p_empty`.
inline void fill_random(OwnedState& s, std::mt19937& rng, double lse_lo = -5, double lse_hi = 5,
                        double p_empty = 0.0) {
  std::uniform_real_distribution<float> uo(-2.f, 2.f);
  std::uniform_real_distribution<double> ul(lse_lo, lse_hi);
  std::uniform_real_distribution<double> u01(0, 1);
  const StateLayout& l = s.layout;
  for (std::int64_t t = 0; t < l.tokens; ++t)
    for (std::int64_t h = 0; h < l.heads; ++h) {
      const bool empty = u01(rng) < p_empty;
      for (std::int64_t d = 0; d < l.head_dim; ++d)
        s.set_o(t, h, d, empty ? std::numeric_limits<float>::quiet_NaN() : uo(rng));
      s.set_lse(t, h, empty ? -INFINITY : from_natural(ul(rng), l.base));
    }
}

/// A reference state in double: the testing kit's (`o (tokens, heads, head_dim)`, LSEs in
/// natural log here). Every reference of these tests is computed by the kit
/// (`testing::reference_merge`, `testing::reference_state`).
using RefState = testing::ReferenceState;

/// An identity `(0, -inf)` reference of the given shape, natural log, to be filled by hand.
inline RefState make_ref(std::int64_t tokens, std::int64_t heads, std::int64_t head_dim) {
  RefState r;
  r.tokens = tokens;
  r.heads = heads;
  r.head_dim = head_dim;
  r.base = LseBase::kNatural;
  r.o.assign(static_cast<std::size_t>(tokens * heads * head_dim), 0.0);
  r.lse.assign(static_cast<std::size_t>(tokens * heads), -kInf);
  return r;
}
/// Writable `o[t, h, d]` of a reference built by hand.
inline double& ref_o(RefState& r, std::int64_t t, std::int64_t h, std::int64_t d) {
  return r.o[static_cast<std::size_t>((t * r.heads + h) * r.head_dim + d)];
}
/// Writable `lse[t, h]` of a reference built by hand.
inline double& ref_lse(RefState& r, std::int64_t t, std::int64_t h) {
  return r.lse[static_cast<std::size_t>(t * r.heads + h)];
}

/// The values of a (strided) state as the kit's contiguous host state.
inline testing::HostState to_host(const OwnedState& s) {
  return testing::HostState::from_view(s.cview());
}
/// A stored state widened exactly to double, LSEs in natural log (e.g. one result compared with
/// another through the same comparison).
inline RefState widened(const OwnedState& s) {
  return testing::rebased(testing::to_reference(to_host(s)), LseBase::kNatural);
}

/// The kit's reference merge of several owned states over every (token, head).
inline RefState ref_merge(const std::vector<const OwnedState*>& in) {
  std::vector<testing::HostState> states;
  for (const OwnedState* s : in) states.push_back(to_host(*s));
  return testing::reference_merge(states, LseBase::kNatural);
}

/// The kit's reference of a ragged merge: token `t` is the merge of rows
/// `[indptr[t], indptr[t + 1])` of `rows` (no rows: `(0, -inf)`).
inline RefState ref_merge_ragged(const OwnedState& rows, const std::vector<std::int32_t>& indptr) {
  const StateLayout& l = rows.layout;
  const std::int64_t tokens = static_cast<std::int64_t>(indptr.size()) - 1;
  RefState r = make_ref(tokens, l.heads, l.head_dim);
  const testing::HostState all = to_host(rows);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<testing::HostState> parts;
    for (std::int32_t row = indptr[t]; row < indptr[t + 1]; ++row) {
      testing::HostState part(1, l.heads, l.head_dim, l.dtype, l.base);
      for (std::int64_t h = 0; h < l.heads; ++h) {
        part.set_lse(0, h, all.lse(row, h));
        for (std::int64_t d = 0; d < l.head_dim; ++d) part.set_o(0, h, d, all.o(row, h, d));
      }
      parts.push_back(std::move(part));
    }
    if (parts.empty()) continue;
    const RefState m = testing::reference_merge(parts, LseBase::kNatural);
    for (std::int64_t h = 0; h < l.heads; ++h) {
      ref_lse(r, t, h) = m.lse_at(0, h);
      for (std::int64_t d = 0; d < l.head_dim; ++d) ref_o(r, t, h, d) = m.o_at(0, h, d);
    }
  }
  return r;
}

/// Absolute tolerance on o (|o| <= 2) for an output dtype.
inline double o_tolerance(DType out) {
  switch (out) {
    case DType::kF16:
      return 2.0 * 1e-3;
    case DType::kBF16:
      return 2.0 * 8e-3;
    default:
      return 2e-5;
  }
}

/// The tolerance of these tests in the kit's model: `tol_o` absolute on o, `1e-5 + 2e-6 |e|` on
/// the natural LSE.
inline testing::Tolerance cpu_tolerance(double tol_o) {
  return testing::Tolerance::absolute(tol_o, 1e-5, 2e-6);
}

/// Expects `got` to match `ref` (natural LSEs) by the kit's comparison within
/// `cpu_tolerance(tol_o)`; empty reference rows must be exactly (0, -inf). Also checks padding
/// is untouched.
inline void expect_matches(const OwnedState& got, const RefState& ref, double tol_o,
                           const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.layout.tokens, ref.tokens);
  EXPECT_EQ(testing::compare_states(to_host(got), ref, cpu_tolerance(tol_o)), "");
  EXPECT_TRUE(got.padding_untouched()) << "a write landed outside the output view";
}

/// True when two states have bitwise-identical o and lse inside their views.
inline bool bitwise_equal(const OwnedState& a, const OwnedState& b) {
  const StateLayout& l = a.layout;
  const std::int64_t es = static_cast<std::int64_t>(size_of(l.dtype));
  if (l.dtype != b.layout.dtype) return false;
  for (std::int64_t t = 0; t < l.tokens; ++t)
    for (std::int64_t h = 0; h < l.heads; ++h) {
      if (std::memcmp(&a.lse[l.lse_offset(t, h)], &b.lse[b.layout.lse_offset(t, h)], 4) != 0)
        return false;
      if (std::memcmp(&a.o[l.o_offset(t, h) * es], &b.o[b.layout.o_offset(t, h) * es],
                      l.head_dim * es) != 0)
        return false;
    }
  return true;
}

/// An owning tensor `(n0, n1, n2)` of `dtype` with optional padding of the two outer strides.
struct OwnedTensor {
  std::vector<unsigned char> data;
  ConstTensorView view;
  double at(std::int64_t i, std::int64_t j, std::int64_t k) const {
    return load(view.data, view.dtype, i * view.stride[0] + j * view.stride[1] + k);
  }
};

inline OwnedTensor make_tensor(std::int64_t n0, std::int64_t n1, std::int64_t n2, DType dtype,
                               std::mt19937& rng, float scale = 1.f, std::int64_t pad1 = 0,
                               std::int64_t pad0 = 0) {
  OwnedTensor t;
  const std::int64_t s1 = n2 + pad1, s0 = n1 * s1 + pad0;
  const std::int64_t elems = std::max<std::int64_t>(1, n0 * s0);
  t.data.assign(static_cast<std::size_t>(elems) * size_of(dtype), 0xFF);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (std::int64_t i = 0; i < n0; ++i)
    for (std::int64_t j = 0; j < n1; ++j)
      for (std::int64_t k = 0; k < n2; ++k)
        store(t.data.data(), dtype, i * s0 + j * s1 + k, scale * nd(rng));
  t.view.data = t.data.data();
  t.view.dtype = dtype;
  t.view.rank = 3;
  t.view.shape[0] = n0;
  t.view.shape[1] = n1;
  t.view.shape[2] = n2;
  t.view.stride[0] = s0;
  t.view.stride[1] = s1;
  t.view.stride[2] = 1;
  return t;
}

/// A view of keys `[begin, end)` of a `(T, H, D)` tensor view.
inline ConstTensorView slice_rows(const ConstTensorView& t, std::int64_t begin, std::int64_t end) {
  ConstTensorView s = t;
  s.data = static_cast<const unsigned char*>(t.data) +
           begin * t.stride[0] * static_cast<std::int64_t>(size_of(t.dtype));
  s.shape[0] = end - begin;
  return s;
}

/// A `(n0, n1, n2)` tensor's values as the kit's contiguous host tensor (same dtype, exact).
inline testing::HostTensor to_host(const OwnedTensor& t) {
  const std::int64_t n0 = t.view.shape[0], n1 = t.view.shape[1], n2 = t.view.shape[2];
  std::vector<float> values;
  values.reserve(static_cast<std::size_t>(n0 * n1 * n2));
  for (std::int64_t i = 0; i < n0; ++i)
    for (std::int64_t j = 0; j < n1; ++j)
      for (std::int64_t k = 0; k < n2; ++k) values.push_back(static_cast<float>(t.at(i, j, k)));
  return testing::HostTensor::from_floats(t.view.dtype, {n0, n1, n2}, values);
}

/// The kit's reference of attention over keys `[k0, k1)` (natural LSEs) for every
/// (token, query head), GQA by `H_q / H_kv`.
inline RefState ref_attention(const OwnedTensor& q, const OwnedTensor& k, const OwnedTensor& v,
                              float scale, std::int64_t k0 = 0, std::int64_t k1 = -1) {
  if (k1 < 0) k1 = k.view.shape[0];
  testing::AttentionProblem p;
  p.q = to_host(q);
  p.k = to_host(k);
  p.v = to_host(v);
  p.scale = scale;
  std::vector<std::int64_t> keys;
  for (std::int64_t i = k0; i < k1; ++i) keys.push_back(i);
  return testing::reference_state(p, keys, LseBase::kNatural);
}

/// Runs `f`, expecting `attnstate::Error` with `status` and a message containing `arg`.
inline void expect_arg_error(const std::function<void()>& f, const std::string& arg,
                             Status status = Status::kInvalidArgument) {
  try {
    f();
    ADD_FAILURE() << "no attnstate::Error thrown (expected one naming '" << arg << "')";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    const std::string msg = e.what();
    EXPECT_NE(msg.find(": argument '" + arg + "': expected "), std::string::npos)
        << "message does not name '" << arg << "' as \"<function>: argument '<name>': expected "
        << "<what>, got <value>\": " << msg;
    EXPECT_NE(msg.find(", got "), std::string::npos) << "message lacks ', got <value>': " << msg;
  }
}

}  // namespace test
}  // namespace attnstate
