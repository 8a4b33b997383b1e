/// @file test_cpu_fp8.cpp
/// @brief The CPU merges with fp8 `o` (e4m3, e5m2) on inputs and outputs, with scales: against
///        the double-precision merge of the dequantised inputs within one fp8 rounding (half an
///        ulp: 2^-4 relative for e4m3, 2^-3 for e5m2, fp8_state.hpp), for every dtype
///        combination and scales 1, 2^-10, 2^8 and 0.37; the conversions through the merges bit
///        for bit; saturation at the extremes; NaN propagation and empty inputs; bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cpu/merge.hpp"
#include "fp8_state.hpp"

namespace attnstate {
namespace {

using fp8_test::every_dtype;
using fp8_test::HostState;

const float kScales[] = {1.f, 0x1p-10f, 0x1p8f, 0.37f};

std::mt19937_64 make_gen(std::uint64_t* seed) {
  *seed = std::random_device{}();
  return std::mt19937_64(*seed);
}

std::string name(std::initializer_list<DType> dts, float scale) {
  std::string s;
  for (DType d : dts) s += std::string(s.empty() ? "" : "->") + to_string(d);
  return s + " scale " + std::to_string(scale);
}

/// Compares `got` with the exact rows `ref_o (rows, dim)`, `ref_lse` (natural): NaN where NaN,
/// empty rows exactly `(0, -inf)`, values past the output's range saturated, others within one
/// rounding of the output dtype (`mag`: the inputs' largest |value|).
::testing::AssertionResult matches(const HostState& got, const std::vector<double>& ref_o,
                                   const std::vector<double>& ref_lse, double mag) {
  const DType dt = got.layout.dtype;
  const float scale = got.layout.o_scale;
  const fp8_test::RoundingTolerance tol = fp8_test::rounding_tolerance(dt, scale, mag);
  const double max = fp8_test::max_finite(dt, scale);
  int bad = 0;
  std::ostringstream msg;
  const auto fail = [&](std::int64_t r, std::int64_t d, double g, double e) {
    if (bad++ < 5) msg << "row " << r << " d " << d << ": got " << g << " want " << e << "\n";
  };
  for (std::int64_t r = 0; r < got.rows(); ++r) {
    const double el = ref_lse[r];
    const double gl = fp8_test::natural(got.lse[r], got.layout.base);
    if (std::isnan(el) ? !std::isnan(gl)
                       : (std::isinf(el) ? gl != el : !(std::fabs(gl - el) <= 1e-5 + 1e-6 * el)))
      fail(r, -1, gl, el);
    for (std::int64_t d = 0; d < got.dim(); ++d) {
      const double e = ref_o[r * got.dim() + d], g = got.value(r, d);
      bool ok;
      if (std::isnan(e)) {
        ok = std::isnan(g);
      } else if (el == -INFINITY) {
        ok = g == 0.0;
      } else if (std::fabs(e) > max) {
        ok = g == std::copysign(max, e);  // saturated
      } else {
        ok = std::fabs(g - e) <= tol.rel * std::fabs(e) + tol.abs;
      }
      if (!ok) fail(r, d, g, e);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " mismatches\n" << msg.str();
}

/// The exact pairwise merge of `a` and `b` (rows of real values, LSEs made natural).
void reference_pair(const HostState& a, const HostState& b, std::vector<double>* o,
                    std::vector<double>* lse) {
  const std::int64_t dim = a.dim();
  o->assign(a.rows() * dim, 0.0);
  lse->assign(a.rows(), 0.0);
  std::vector<double> ra(dim), rb(dim);
  for (std::int64_t r = 0; r < a.rows(); ++r) {
    for (std::int64_t d = 0; d < dim; ++d) {
      ra[d] = a.value(r, d);
      rb[d] = b.value(r, d);
    }
    fp8_test::reference_row(
        {fp8_test::natural(a.lse[r], a.layout.base), fp8_test::natural(b.lse[r], b.layout.base)},
        {ra.data(), rb.data()}, dim, o->data() + r * dim, lse->data() + r);
  }
}

double magnitude(std::initializer_list<const HostState*> states) {
  double m = 0;
  for (const HostState* s : states)
    for (std::int64_t r = 0; r < s->rows(); ++r)
      for (std::int64_t d = 0; d < s->dim(); ++d)
        if (std::isfinite(s->value(r, d)) && s->lse[r] != -INFINITY)
          m = std::max(m, std::fabs(s->value(r, d)));
  return std::max(m, 1e-30);
}

TEST(CpuFp8, MergeStateEveryDtypeCombinationAndScale) {
  std::uint64_t seed;
  std::mt19937_64 gen = make_gen(&seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (float scale : kScales)
    for (DType da : every_dtype())
      for (DType db : every_dtype())
        for (DType dout : every_dtype()) {
          SCOPED_TRACE(name({da, db, dout}, scale));
          const float amp = 100.f * scale;  // real values well inside every fp8 range
          HostState a(3, 2, 24, da, LseBase::kNatural, scale);
          HostState b(3, 2, 24, db, LseBase::kBase2, scale * 0.5f);
          HostState out(3, 2, 24, dout, LseBase::kBase2, scale);
          a.fill(gen, amp);
          b.fill(gen, amp);
          cpu::merge_state(a.view(), b.view(), out.view());
          std::vector<double> ro, rl;
          reference_pair(a, b, &ro, &rl);
          EXPECT_TRUE(matches(out, ro, rl, magnitude({&a, &b})));
        }
}

TEST(CpuFp8, MergeStateInplaceWithAndWithoutMask) {
  std::uint64_t seed;
  std::mt19937_64 gen = make_gen(&seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (float scale : kScales)
    for (DType dacc : every_dtype())
      for (DType doth : every_dtype())
        for (int masked = 0; masked < 2; ++masked) {
          SCOPED_TRACE(name({dacc, doth}, scale) + (masked ? " masked" : ""));
          HostState acc(5, 3, 16, dacc, LseBase::kNatural, scale);
          HostState other(5, 3, 16, doth, LseBase::kNatural, scale * 4.f);
          acc.fill(gen, 100.f * scale);
          other.fill(gen, 100.f * scale);
          const HostState before = acc;
          const std::vector<std::uint8_t> mask = {1, 0, 7, 0, 1};
          cpu::merge_state_inplace(acc.view(), other.view(), masked ? mask.data() : nullptr);
          std::vector<double> ro, rl;
          reference_pair(before, other, &ro, &rl);
          // Masked-off tokens keep their bytes; the others are the merge.
          HostState want_rows = acc;
          for (std::int64_t t = 0; t < 5; ++t) {
            if (!masked || mask[t] != 0) continue;
            const std::int64_t row_bytes = 3 * 16 * static_cast<std::int64_t>(size_of(dacc));
            EXPECT_EQ(0, std::memcmp(acc.o.data() + t * row_bytes, before.o.data() + t * row_bytes,
                                     row_bytes));
            for (std::int64_t h = 0; h < 3; ++h) {
              const std::int64_t r = t * 3 + h;
              EXPECT_EQ(0, std::memcmp(&acc.lse[r], &before.lse[r], 4));
              rl[r] = fp8_test::natural(before.lse[r], before.layout.base);
              for (std::int64_t d = 0; d < 16; ++d) ro[r * 16 + d] = before.value(r, d);
            }
          }
          EXPECT_TRUE(matches(acc, ro, rl, magnitude({&before, &other})));
        }
}

/// Runs `merge_states` over `S` random states in `order` and compares with the exact merge.
void check_stack(std::mt19937_64& gen, StackOrder order, std::int64_t states, DType din, DType dout,
                 float scale) {
  SCOPED_TRACE(name({din, dout}, scale) + " S " + std::to_string(states) +
               (order == StackOrder::kTokensMajor ? " tokens-major" : " states-major"));
  const std::int64_t tokens = 4, heads = 3, dim = 32;
  HostState stack(tokens * states, heads, dim, din, LseBase::kBase2, scale);
  stack.fill(gen, 100.f * scale, 0.25);
  ConstStateStackView sv = make_state_stack(stack.o.data(), din, stack.lse.data(), order, tokens,
                                            states, heads, dim, LseBase::kBase2);
  sv.o_scale = stack.layout.o_scale;
  HostState out(tokens, heads, dim, dout, LseBase::kNatural, scale * 2.f);
  cpu::merge_states(sv, out.view());
  std::vector<double> ro(tokens * heads * dim), rl(tokens * heads);
  std::vector<std::vector<double>> rows(states, std::vector<double>(dim));
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t h = 0; h < heads; ++h) {
      std::vector<double> lse;
      std::vector<const double*> o;
      for (std::int64_t s = 0; s < states; ++s) {
        const std::int64_t r = order == StackOrder::kTokensMajor ? (t * states + s) * heads + h
                                                                 : (s * tokens + t) * heads + h;
        lse.push_back(fp8_test::natural(stack.lse[r], LseBase::kBase2));
        for (std::int64_t d = 0; d < dim; ++d) rows[s][d] = stack.value(r, d);
        o.push_back(rows[s].data());
      }
      fp8_test::reference_row(lse, o, dim, ro.data() + (t * heads + h) * dim,
                              rl.data() + t * heads + h);
    }
  EXPECT_TRUE(matches(out, ro, rl, magnitude({&stack})));
}

TEST(CpuFp8, MergeStatesEveryDtypePairBothLayouts) {
  std::uint64_t seed;
  std::mt19937_64 gen = make_gen(&seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (float scale : kScales)
    for (DType din : every_dtype())
      for (DType dout : every_dtype())
        for (std::int64_t states : {1, 3, 9}) {
          check_stack(gen, StackOrder::kTokensMajor, states, din, dout, scale);
          check_stack(gen, StackOrder::kStatesMajor, states, din, dout, scale);
        }
}

/// `a ⊕ empty` into `out`: the merges' pass-through, so `out` holds `a`'s values converted once.
template <class Fn>
void pass_through(HostState& a, HostState& out, Fn&& fn) {
  HostState empty(a.layout.tokens, a.layout.heads, a.dim(), DType::kF32, LseBase::kNatural);
  std::fill(empty.lse.begin(), empty.lse.end(), -INFINITY);
  fn(a.view(), empty.view(), out.view());
}

TEST(CpuFp8, MergesConvertEveryEncodingExactly) {
  // Every fp8 encoding, as a row of 256 elements, through the pair and the n-ary merge into f32.
  for (DType dt : {DType::kE4M3, DType::kE5M2}) {
    SCOPED_TRACE(to_string(dt));
    HostState a(1, 1, 256, dt, LseBase::kNatural, 1.f);
    for (int b = 0; b < 256; ++b) a.o[b] = static_cast<std::uint8_t>(b);
    a.lse[0] = 0.5f;
    HostState out(1, 1, 256, DType::kF32, LseBase::kNatural);
    pass_through(
        a, out, [](ConstStateView x, ConstStateView y, StateView o) { cpu::merge_state(x, y, o); });
    HostState out2(1, 1, 256, DType::kF32, LseBase::kNatural);
    cpu::merge_states(make_state_stack(a.o.data(), dt, a.lse.data(), StackOrder::kTokensMajor, 1, 1,
                                       1, 256, LseBase::kNatural),
                      out2.view());
    for (int b = 0; b < 256; ++b) {
      const float want = dispatch_dtype_with_fp8(dt, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (kIsFp8<T>) return to_float(T{static_cast<std::uint8_t>(b)});
        return 0.f;  // not reached: dt is an fp8 dtype
      });
      for (const HostState* o : {&out, &out2}) {
        const float got = reinterpret_cast<const float*>(o->o.data())[b];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << b;
        } else {
          EXPECT_EQ(0, std::memcmp(&got, &want, 4)) << "encoding " << b << ": " << got;
        }
      }
    }
    // And back: each value, as an f32 state, merged into fp8 gives its encoding (inf saturates).
    HostState f(1, 1, 256, DType::kF32, LseBase::kNatural);
    std::memcpy(f.o.data(), out.o.data(), 256 * 4);
    f.lse[0] = 0.f;
    HostState back(1, 1, 256, dt, LseBase::kNatural, 1.f);
    pass_through(f, back, [](ConstStateView x, ConstStateView y, StateView o) {
      cpu::merge_state(x, y, o);
    });
    for (int b = 0; b < 256; ++b) {
      const float v = reinterpret_cast<const float*>(f.o.data())[b];
      const int want = std::isnan(v) ? 0x7F : std::isinf(v) ? ((b & 0x80) | 0x7B) : b;
      EXPECT_EQ(back.byte(b), want) << "encoding " << b;
    }
  }
}

TEST(CpuFp8, EmptyIsTheIdentityBitwiseAtEqualScales) {
  std::uint64_t seed;
  std::mt19937_64 gen = make_gen(&seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType dt : {DType::kE4M3, DType::kE5M2})
    for (float scale : kScales) {
      SCOPED_TRACE(name({dt}, scale));
      HostState a(6, 2, 16, dt, LseBase::kNatural, scale);
      a.fill(gen, 100.f * scale, 0.0);
      HostState out(6, 2, 16, dt, LseBase::kNatural, scale);
      pass_through(a, out, [](ConstStateView x, ConstStateView y, StateView o) {
        cpu::merge_state(y, x, o);
      });
      EXPECT_EQ(a.o, out.o);
      EXPECT_EQ(0, std::memcmp(a.lse.data(), out.lse.data(), a.lse.size() * 4));
    }
}

TEST(CpuFp8, OutputsSaturateAtTheFormatsExtremes) {
  for (DType dt : {DType::kE4M3, DType::kE5M2})
    for (float scale : {1.f, 0x1p-10f}) {
      SCOPED_TRACE(name({dt}, scale));
      const double max = fp8_test::max_finite(dt, scale);
      HostState a(1, 1, 8, DType::kF32, LseBase::kNatural);
      const float vals[8] = {static_cast<float>(max),
                             static_cast<float>(-max),
                             static_cast<float>(max * 1.03),  // inside the last half ulp
                             static_cast<float>(max * 4),
                             static_cast<float>(-max * 1e6),
                             INFINITY,
                             -INFINITY,
                             3e38f};
      for (int d = 0; d < 8; ++d) a.set(0, d, vals[d]);
      a.lse[0] = 1.f;
      HostState out(1, 1, 8, dt, LseBase::kNatural, scale);
      pass_through(a, out, [](ConstStateView x, ConstStateView y, StateView o) {
        cpu::merge_state(x, y, o);
      });
      HostState out2(1, 1, 8, dt, LseBase::kNatural, scale);
      cpu::merge_states(make_state_stack(a.o.data(), DType::kF32, a.lse.data(),
                                         StackOrder::kTokensMajor, 1, 1, 1, 8, LseBase::kNatural),
                        [&] {
                          StateView v = out2.view();
                          return v;
                        }());
      const std::uint8_t max_bits = dt == DType::kE4M3 ? 0x7E : 0x7B;
      for (const HostState* o : {&out, &out2})
        for (int d = 0; d < 8; ++d) {
          const std::uint8_t want = static_cast<std::uint8_t>(max_bits | (vals[d] < 0 ? 0x80 : 0));
          EXPECT_EQ(o->byte(d), want) << "value " << vals[d];
        }
    }
}

TEST(CpuFp8, NanPropagatesFromNonEmptyInputsOnly) {
  for (DType dt : {DType::kE4M3, DType::kE5M2}) {
    SCOPED_TRACE(to_string(dt));
    // a: non-empty, NaN in element 3 (an fp8 NaN encoding); b: empty with a NaN o.
    HostState a(1, 1, 8, dt, LseBase::kNatural, 0.5f), b(1, 1, 8, dt, LseBase::kNatural, 0.5f);
    for (int d = 0; d < 8; ++d) a.set(0, d, 0.25f * d);
    a.o[3] = 0xFF;  // -NaN in e4m3, a NaN in e5m2
    a.lse[0] = 0.f;
    b.lse[0] = -INFINITY;                                   // its o: 0xFF bytes, NaN
    HostState c(1, 1, 8, DType::kBF16, LseBase::kNatural);  // non-empty, finite
    for (int d = 0; d < 8; ++d) c.set(0, d, 1.f);
    c.lse[0] = 0.f;
    for (DType dout : every_dtype()) {
      HostState out(1, 1, 8, dout, LseBase::kNatural, 2.f);
      cpu::merge_state(a.view(), c.view(), out.view());
      for (int d = 0; d < 8; ++d) EXPECT_EQ(std::isnan(out.value(0, d)), d == 3) << d;
      HostState out2(1, 1, 8, dout, LseBase::kNatural, 2.f);
      cpu::merge_state(b.view(), c.view(), out2.view());  // the empty NaN o is never read
      for (int d = 0; d < 8; ++d) EXPECT_EQ(out2.value(0, d), 1.0) << d;
    }
    // A NaN LSE gives a NaN row: every element of an fp8 output is the NaN encoding 0x7F.
    HostState bad = a;
    bad.o.assign(8, 0x10);
    bad.lse[0] = NAN;
    HostState out(1, 1, 8, dt, LseBase::kNatural, 1.f);
    cpu::merge_state(bad.view(), c.view(), out.view());
    for (int d = 0; d < 8; ++d) EXPECT_EQ(out.byte(d), 0x7F) << d;
    EXPECT_TRUE(std::isnan(out.lse[0]));
    // All-empty input: exactly (0, -inf), the encoding 0x00.
    HostState e2 = b;
    cpu::merge_state(b.view(), e2.view(), out.view());
    for (int d = 0; d < 8; ++d) EXPECT_EQ(out.byte(d), 0x00) << d;
    EXPECT_EQ(out.lse[0], -INFINITY);
  }
}

/// Expects `fn` to throw `Error(status)` whose message names `func` and `arg`.
template <class Fn>
void expect_error(Fn&& fn, Status status, const std::string& func, const std::string& arg) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming " << arg;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find(func), std::string::npos) << what;
    EXPECT_NE(what.find("'" + arg + "'"), std::string::npos) << what;
  }
}

TEST(CpuFp8, BadScalesAndUnsupportedOperationsAreNamed) {
  HostState a(2, 2, 8, DType::kE4M3, LseBase::kNatural, 1.f);
  HostState b(2, 2, 8, DType::kF16, LseBase::kNatural);
  HostState out(2, 2, 8, DType::kE5M2, LseBase::kNatural, 1.f);
  std::fill(a.lse.begin(), a.lse.end(), 0.f);
  std::fill(b.lse.begin(), b.lse.end(), 0.f);
  const std::string kPair = "attnstate::cpu::merge_state";
  for (float bad : {0.f, -1.f, INFINITY, -INFINITY, NAN}) {
    SCOPED_TRACE(bad);
    StateView av = a.view();
    av.o_scale = bad;
    expect_error([&] { cpu::merge_state(av, b.view(), out.view()); }, Status::kInvalidArgument,
                 kPair, "a.o_scale");
    StateView ov = out.view();
    ov.o_scale = bad;
    expect_error([&] { cpu::merge_state(a.view(), b.view(), ov); }, Status::kInvalidArgument, kPair,
                 "out.o_scale");
    expect_error([&] { cpu::merge_state_inplace(ov, a.view()); }, Status::kInvalidArgument,
                 "attnstate::cpu::merge_state_inplace", "acc.o_scale");
    ConstStateStackView sv =
        make_state_stack(a.o.data(), DType::kE4M3, a.lse.data(), StackOrder::kTokensMajor, 2, 1, 2,
                         8, LseBase::kNatural);
    sv.o_scale = bad;
    expect_error([&] { cpu::merge_states(sv, out.view()); }, Status::kInvalidArgument,
                 "attnstate::cpu::merge_states", "states.o_scale");
  }
  // A scale on a non-fp8 o would be ignored: rejected.
  StateView bv = b.view();
  bv.o_scale = 2.f;
  expect_error([&] { cpu::merge_state(a.view(), bv, out.view()); }, Status::kInvalidArgument, kPair,
               "b.o_scale");
  // The operations without fp8: kNotSupported naming the dtype.
  HostState f32(2, 2, 8, DType::kF32, LseBase::kNatural);
  std::fill(f32.lse.begin(), f32.lse.end(), 0.f);
  expect_error([&] { cpu::rebase(a.view(), f32.view()); }, Status::kNotSupported,
               "attnstate::cpu::rebase", "in.dtype");
  expect_error([&] { cpu::rebase(f32.view(), out.view()); }, Status::kNotSupported,
               "attnstate::cpu::rebase", "out.dtype");
  const std::int32_t indptr[3] = {0, 1, 2};
  expect_error([&] { cpu::merge_states_ragged(a.view(), indptr, f32.view()); },
               Status::kNotSupported, "attnstate::cpu::merge_states_ragged", "rows.dtype");
  // mark_empty_rows reads LSEs only: any o dtype.
  a.lse[1] = INFINITY;
  cpu::mark_empty_rows(a.view());
  EXPECT_EQ(a.lse[1], -INFINITY);
}

}  // namespace
}  // namespace attnstate
