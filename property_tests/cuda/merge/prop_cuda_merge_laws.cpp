/// @file prop_cuda_merge_laws.cpp
/// @brief The laws of ⊕ checked with RapidCheck on the GPU: associativity, commutativity, the
///        identity (bitwise), base invariance, empty states with NaN `o`, all-empty input and
///        NaN propagation; and the fast `merge_states` path giving the general kernel's bits.
///        Each law is a plain test that skips without a GPU and otherwise runs `rc::check`,
///        failing on a counterexample.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/cuda/merge.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/reference.hpp"
#include "compiled_dims.hpp"
#include "merge_test_support.hpp"

namespace attnstate_test {
namespace {

namespace gpu = attnstate::cuda;

/// The shape and tags of a random problem; the values come from `seed`.
struct Problem {
  std::int64_t tokens, heads, head_dim;
  DType dtype;
  std::uint64_t seed;
  double p_empty;
  bool huge;  ///< LSEs around ±1e4 instead of [-30, 30).
};

rc::Gen<Problem> gen_problem() {
  return rc::gen::apply(
      [](int tokens, int heads, int dim_index, int dtype, std::uint64_t seed, int empty_pct,
         bool huge) {
        const std::vector<std::int64_t> dims = attnstate_test::merge_head_dims();
        return Problem{
            tokens, heads, dims[dim_index], static_cast<DType>(dtype), seed, empty_pct / 100.0,
            huge};
      },
      rc::gen::inRange(1, 5), rc::gen::inRange(1, 4),
      rc::gen::inRange(0, static_cast<int>(attnstate_test::merge_head_dims().size())),
      rc::gen::inRange(0, 3), rc::gen::arbitrary<std::uint64_t>(), rc::gen::element(0, 0, 20, 50),
      rc::gen::element(false, false, false, true));
}

/// A random state of the problem's shape in `base` (values drawn from `rng`).
TestState random_state(const Problem& p, Rng& rng, LseBase base, DType dtype) {
  TestState s(p.tokens, p.heads, p.head_dim, dtype, base);
  const float c = p.huge ? (rng.chance(0.5) ? 1e4f : -1e4f) : 0.f;
  s.fill_random(rng, c - 30.f, c + 30.f, p.p_empty);
  return s;
}

void sync() { ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize()); }

/// `a ⊕ b` on the GPU into a fresh, poisoned state of `dtype` and `base`.
TestState merged(TestState& a, TestState& b, DType dtype, LseBase base) {
  TestState out(a.tokens(), a.heads(), a.head_dim(), dtype, base);
  out.poison_device();
  gpu::merge_state(a.dev_view(), b.dev_view(), out.dev_view());
  sync();
  out.download();
  out.upload();  // host and device agree, so the result can be merged further
  return out;
}

/// The values of a test state as the testing kit's host state (exact: same dtype and base).
attnstate::testing::HostState host_of(const TestState& s) {
  attnstate::testing::HostState h(s.tokens(), s.heads(), s.head_dim(), s.dtype(), s.base());
  for (std::int64_t t = 0; t < s.tokens(); ++t)
    for (std::int64_t hd = 0; hd < s.heads(); ++hd) {
      h.set_lse(t, hd, s.lse(t, hd));
      for (std::int64_t d = 0; d < s.head_dim(); ++d) h.set_o(t, hd, d, s.o(t, hd, d));
    }
  return h;
}

/// Absolute tolerance on `o` of a chain of merges of `inputs` (fp32 throughout): 2e-5, widened as
/// `attnstate::testing::merge_tolerance` does for large LSEs. An fp32 LSE of magnitude `L` is
/// only known to about `L · 2^-24`, and so is every weight derived from it, so the bound grows
/// by `4 · 2^-24 · L · log2(e) · O` (`L` the largest finite |LSE| in natural-log units, `O` the
/// largest finite |o| of the rows with a finite LSE, at least 1): about 3.4e-3 · O at L = 1e4.
float chain_o_atol(const std::vector<attnstate::testing::HostState>& inputs) {
  double lse_max = 0, o_max = 1;
  for (const attnstate::testing::HostState& s : inputs)
    for (std::int64_t t = 0; t < s.tokens(); ++t)
      for (std::int64_t h = 0; h < s.heads(); ++h) {
        const double l = s.lse(t, h);
        if (!std::isfinite(l)) continue;
        lse_max = std::max(lse_max, std::fabs(s.base() == LseBase::kBase2 ? l * std::log(2.0) : l));
        for (std::int64_t d = 0; d < s.head_dim(); ++d)
          if (std::isfinite(s.o(t, h, d))) o_max = std::max(o_max, std::fabs(double(s.o(t, h, d))));
      }
  const double lse_err = 4 * std::ldexp(1.0, -24) * lse_max * 1.4426950408889634;
  return static_cast<float>(2e-5 * o_max + lse_err * o_max);
}
/// `chain_o_atol` of test states.
float chain_o_atol(const std::vector<const TestState*>& inputs) {
  std::vector<attnstate::testing::HostState> hosts;
  for (const TestState* s : inputs) hosts.push_back(host_of(*s));
  return chain_o_atol(hosts);
}

/// The double-precision reference of `⊕` of some states (the testing kit's `reference_merge`:
/// empty rows skipped whatever their `o`, a NaN LSE makes its output row NaN, a NaN `o` element
/// its own element), stored in fp32 and `base` so that comparisons see only the GPU's error,
/// and the `o` tolerance of comparing an fp32 GPU merge (or a chain of them) of the same states
/// with it: `chain_o_atol` of the inputs (2e-5 widened for large LSEs).
struct Expected {
  TestState state;
  float o_atol;
};

/// The reference `⊕` of `states` (each read in its own base), written in `base`.
Expected expected_merge_hosts(const std::vector<attnstate::testing::HostState>& states,
                              LseBase base) {
  const attnstate::testing::ReferenceState r = attnstate::testing::reference_merge(states, base);
  Expected e{TestState(r.tokens, r.heads, r.head_dim, DType::kF32, base), chain_o_atol(states)};
  for (std::int64_t t = 0; t < r.tokens; ++t)
    for (std::int64_t h = 0; h < r.heads; ++h) {
      e.state.set_lse(t, h, static_cast<float>(r.lse_at(t, h)));
      for (std::int64_t d = 0; d < r.head_dim; ++d)
        e.state.set_o(t, h, d, static_cast<float>(r.o_at(t, h, d)));
    }
  return e;
}

/// The reference `⊕` of test states.
Expected expected_merge(const std::vector<const TestState*>& in, LseBase base) {
  std::vector<attnstate::testing::HostState> hosts;
  for (const TestState* s : in) hosts.push_back(host_of(*s));
  return expected_merge_hosts(hosts, base);
}

/// The reference `⊕` of the states of a stack, read through its host view.
Expected expected_merge(const ConstStateStackView& v, LseBase base) {
  std::vector<attnstate::testing::HostState> hosts;
  for (std::int64_t s = 0; s < v.num_states; ++s) {
    attnstate::testing::HostState h(v.tokens, v.heads, v.head_dim, v.dtype, v.base);
    for (std::int64_t t = 0; t < v.tokens; ++t)
      for (std::int64_t hd = 0; hd < v.heads; ++hd) {
        h.set_lse(t, hd, v.lse[s * v.lse_stride_state + v.lse_offset(t, hd)]);
        for (std::int64_t d = 0; d < v.head_dim; ++d)
          h.set_o(t, hd, d,
                  static_cast<float>(
                      load_elem(v.o, v.dtype, s * v.o_stride_state + v.o_offset(t, hd) + d)));
      }
    hosts.push_back(std::move(h));
  }
  return expected_merge_hosts(hosts, base);
}

/// Fails the RapidCheck case unless `got` matches the reference (every element written: the
/// output starts poisoned, and a NaN only matches a NaN the reference expects).
void rc_expect_reference(const TestState& got, const Expected& want, const std::string& what) {
  const ::testing::AssertionResult r = states_close(got, want.state, want.o_atol);
  if (!r) RC_FAIL(what + " vs the double reference: " + r.message());
}

/// Fails the RapidCheck case with the comparison's message.
void rc_expect(const ::testing::AssertionResult& r, const std::string& what) {
  if (!r) RC_FAIL(what + ": " + r.message());
}

/// Runs the property; the test fails on a counterexample.
template <class Prop>
void check_law(const std::string& name, Prop prop) {
  ATTNSTATE_REQUIRE_GPU();
  EXPECT_TRUE(rc::check(name, prop)) << "counterexample above";
}

TEST(CudaMergeLaws, IsAssociative) {
  check_law("(a ⊕ b) ⊕ c == a ⊕ (b ⊕ c) on the GPU", [] {
    const Problem p = *gen_problem();
    Rng rng(p.seed);
    TestState a = random_state(p, rng, rng.base(), DType::kF32);
    TestState b = random_state(p, rng, rng.base(), DType::kF32);
    TestState c = random_state(p, rng, rng.base(), DType::kF32);
    TestState ab = merged(a, b, DType::kF32, LseBase::kNatural);
    TestState bc = merged(b, c, DType::kF32, LseBase::kNatural);
    TestState left = merged(ab, c, DType::kF32, LseBase::kNatural);
    TestState right = merged(a, bc, DType::kF32, LseBase::kNatural);
    rc_expect(states_close(left, right, chain_o_atol({&a, &b, &c})), "associativity");
    // Against the reference too: two merges that leave the same row unwritten (NaN) would
    // otherwise agree.
    rc_expect_reference(left, expected_merge({&a, &b, &c}, LseBase::kNatural), "(a ⊕ b) ⊕ c");
  });
}

TEST(CudaMergeLaws, IsCommutative) {
  check_law("a ⊕ b == b ⊕ a on the GPU", [] {
    const Problem p = *gen_problem();
    Rng rng(p.seed);
    TestState a = random_state(p, rng, rng.base(), p.dtype);
    TestState b = random_state(p, rng, rng.base(), p.dtype);
    const LseBase base = rng.base();
    TestState ab = merged(a, b, DType::kF32, base);
    TestState ba = merged(b, a, DType::kF32, base);
    rc_expect(states_close(ab, ba), "commutativity");
    rc_expect_reference(ab, expected_merge({&a, &b}, base), "a ⊕ b");
  });
}

TEST(CudaMergeLaws, EmptyStateIsTheIdentityBitwise) {
  check_law("a ⊕ empty == empty ⊕ a == a bitwise on the GPU, NaN in the empty o", [] {
    const Problem p = *gen_problem();
    Rng rng(p.seed);
    TestState a = random_state(p, rng, LseBase::kNatural, p.dtype);
    for (std::int64_t t = 0; t < p.tokens; ++t)  // a's own empty rows hold the canonical (0, -inf)
      for (std::int64_t h = 0; h < p.heads; ++h)
        if (a.lse(t, h) == -INFINITY)
          for (std::int64_t d = 0; d < p.head_dim; ++d) a.set_o(t, h, d, 0.f);
    a.upload();
    Problem pe = p;
    pe.p_empty = 1.0;
    TestState e = random_state(pe, rng, rng.base(), *rc::gen::element(DType::kF32, DType::kBF16));
    TestState ae = merged(a, e, p.dtype, LseBase::kNatural);
    TestState ea = merged(e, a, p.dtype, LseBase::kNatural);
    RC_ASSERT(rows_bitwise_equal(ae, a));
    RC_ASSERT(rows_bitwise_equal(ea, a));
  });
}

TEST(CudaMergeLaws, IsBaseInvariant) {
  check_law("merging in any bases == rebasing first, then merging", [] {
    const Problem p = *gen_problem();
    Rng rng(p.seed);
    TestState a = random_state(p, rng, rng.base(), p.dtype);
    TestState b = random_state(p, rng, rng.base(), p.dtype);
    const LseBase out_base = rng.base();
    TestState direct = merged(a, b, DType::kF32, out_base);
    TestState an(p.tokens, p.heads, p.head_dim, p.dtype, out_base);
    TestState bn(p.tokens, p.heads, p.head_dim, p.dtype, out_base);
    an.poison_device();
    bn.poison_device();
    gpu::rebase(a.dev_view(), an.dev_view());
    gpu::rebase(b.dev_view(), bn.dev_view());
    TestState rebased = merged(an, bn, DType::kF32, out_base);
    rc_expect(states_close(direct, rebased), "base invariance");
    rc_expect_reference(direct, expected_merge({&a, &b}, out_base), "a ⊕ b");
  });
}

/// The n-ary merge of the problem's states, stored in a states-major stack.
TestState merge_stack(const Problem& p, std::vector<TestState*> inputs, LseBase base) {
  const std::int64_t S = static_cast<std::int64_t>(inputs.size());
  TestStack stack(StackOrder::kStatesMajor, p.tokens, S, p.heads, p.head_dim, DType::kF32,
                  inputs[0]->base());
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t t = 0; t < p.tokens; ++t)
      for (std::int64_t h = 0; h < p.heads; ++h) {
        stack.set_lse(t, s, h, inputs[s]->lse(t, h));
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          stack.set_o(t, s, h, d, inputs[s]->o(t, h, d));
      }
  stack.upload();
  TestState out(p.tokens, p.heads, p.head_dim, DType::kF32, base);
  out.poison_device();
  gpu::merge_states(stack.dev_view(), out.dev_view());
  sync();
  out.download();
  return out;
}

TEST(CudaMergeLaws, EmptyStatesWithNanOContributeNothing) {
  check_law("merge_states([x1, empty, x2, empty]) == merge_states([x1, x2])", [] {
    const Problem p = *gen_problem();
    Rng rng(p.seed);
    const LseBase base = rng.base();
    TestState x1 = random_state(p, rng, base, DType::kF32);
    TestState x2 = random_state(p, rng, base, DType::kF32);
    Problem pe = p;
    pe.p_empty = 1.0;
    TestState e = random_state(pe, rng, base, DType::kF32);  // o = NaN everywhere
    TestState with = merge_stack(p, {&x1, &e, &x2, &e}, base);
    TestState without = merge_stack(p, {&x1, &x2}, base);
    rc_expect(states_close(with, without), "empty inputs");
    rc_expect_reference(without, expected_merge({&x1, &x2}, base), "x1 ⊕ x2");
  });
}

TEST(CudaMergeLaws, AllEmptyGivesTheEmptyState) {
  check_law("⊕ of empty states is (0, -inf), whatever their o", [] {
    Problem p = *gen_problem();
    p.p_empty = 1.0;
    Rng rng(p.seed);
    const int n = *rc::gen::inRange(1, 40);
    std::vector<TestState> states;
    std::vector<TestState*> ptrs;
    states.reserve(n);
    for (int i = 0; i < n; ++i)
      states.push_back(random_state(p, rng, LseBase::kBase2, DType::kF32));
    for (auto& s : states) ptrs.push_back(&s);
    TestState out = merge_stack(p, ptrs, LseBase::kNatural);
    TestState pair = merged(states[0], states[n - 1], p.dtype, LseBase::kNatural);
    for (const TestState* r : {&out, &pair})
      for (std::int64_t t = 0; t < p.tokens; ++t)
        for (std::int64_t h = 0; h < p.heads; ++h) {
          RC_ASSERT(r->lse(t, h) == -INFINITY);
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            RC_ASSERT(r->o(t, h, d) == 0.f);
            RC_ASSERT(!std::signbit(r->o(t, h, d)));
          }
        }
  });
}

TEST(CudaMergeLaws, NanInANonEmptyInputPropagates) {
  check_law("a NaN in a non-empty input's o or lse reaches the output", [] {
    Problem p = *gen_problem();
    p.p_empty = 0.0;
    Rng rng(p.seed);
    const LseBase base = rng.base();
    TestState a = random_state(p, rng, base, p.dtype);
    TestState b = random_state(p, rng, base, p.dtype);
    const std::int64_t t = *rc::gen::inRange<std::int64_t>(0, p.tokens);
    const std::int64_t h = *rc::gen::inRange<std::int64_t>(0, p.heads);
    const std::int64_t d = *rc::gen::inRange<std::int64_t>(0, p.head_dim);
    const bool in_lse = *rc::gen::arbitrary<bool>();
    if (in_lse)
      b.set_lse(t, h, NAN);
    else
      b.set_o(t, h, d, NAN);
    b.upload();
    TestState out = merged(a, b, DType::kF32, LseBase::kNatural);
    if (in_lse) {
      RC_ASSERT(std::isnan(out.lse(t, h)));
    } else {
      RC_ASSERT(std::isnan(out.o(t, h, d)));
    }
    TestState stacked = merge_stack(p, {&a, &b, &a}, LseBase::kNatural);
    if (in_lse) {
      RC_ASSERT(std::isnan(stacked.lse(t, h)));
    } else {
      RC_ASSERT(std::isnan(stacked.o(t, h, d)));
    }
    // An output left unwritten is NaN too: every element against the reference (NaN exactly
    // where the reference has it, the other rows and elements finite and close).
    rc_expect_reference(out, expected_merge({&a, &b}, LseBase::kNatural), "a ⊕ b");
    rc_expect_reference(stacked, expected_merge({&a, &b, &a}, LseBase::kNatural), "stack");
  });
}

/// The fewest tokens (up to 8192) for which a dense stack takes the fast `merge_states` path, or
/// 0 when none does (no such path on this device).
std::int64_t fewest_fast_tokens(StackOrder order, std::int64_t S, std::int64_t heads,
                                std::int64_t dim, DType din, DType dout) {
  alignas(16) static float stand_in[4] = {0.f, 0.f, 0.f, 0.f};
  for (std::int64_t t = 1; t <= 8192; ++t) {
    if (gpu::detail::merge_states_fast_path(
            attnstate::make_state_stack(stand_in, din, stand_in, order, t, S, heads, dim,
                                        LseBase::kNatural, MemorySpace::kDevice),
            attnstate::make_state_view(stand_in, dout, stand_in, t, heads, dim, LseBase::kNatural,
                                       MemorySpace::kDevice)))
      return t;
  }
  return 0;
}

TEST(CudaMergeLaws, FastMergeStatesGivesTheGeneralKernelsBits) {
  ATTNSTATE_REQUIRE_GPU();
  if (fewest_fast_tokens(StackOrder::kTokensMajor, 8, 32, 128, DType::kBF16, DType::kBF16) == 0)
    GTEST_SKIP() << "no fast merge_states path on this device";
  check_law("merge_states of an aligned stack (fast path) == of the same stack unaligned", [] {
    const Problem p = *gen_problem();
    Rng rng(p.seed);
    const StackOrder order = *rc::gen::element(StackOrder::kTokensMajor, StackOrder::kStatesMajor);
    const std::int64_t S = *rc::gen::inRange<std::int64_t>(1, 34);
    const DType dout = static_cast<DType>(*rc::gen::inRange(0, 3));
    // Few heads in the states-major layout, 32 otherwise; head_dim 64 holds at most 32 states.
    const std::int64_t heads = order == StackOrder::kStatesMajor ? 4 : 32;
    const std::int64_t D = p.head_dim == 64 ? 128 : p.head_dim;
    // The fewest tokens that take the fast path (no block's pipeline full).
    const std::int64_t T = fewest_fast_tokens(order, S, heads, D, p.dtype, dout);
    if (T == 0) RC_FAIL("no token count takes the fast path");
    const LseBase in_base = rng.base(), out_base = rng.base();
    TestStack aligned(order, T, S, heads, D, p.dtype, in_base);
    TestStack shifted(order, T, S, heads, D, p.dtype, in_base, 0, 1);  // general kernel
    const float c = p.huge ? (rng.chance(0.5) ? 1e4f : -1e4f) : 0.f;
    const std::uint64_t seed = static_cast<std::uint64_t>(rng.integer(0, 1ll << 62));
    Rng fill_a(seed), fill_b(seed);
    aligned.fill_random(fill_a, c - 30.f, c + 30.f, p.p_empty);
    shifted.fill_random(fill_b, c - 30.f, c + 30.f, p.p_empty);
    TestState a(T, heads, D, dout, out_base), b(T, heads, D, dout, out_base);
    a.poison_device();
    b.poison_device();
    gpu::merge_states(aligned.dev_view(), a.dev_view());
    gpu::merge_states(shifted.dev_view(), b.dev_view());
    sync();
    a.download();
    b.download();
    RC_ASSERT(rows_bitwise_equal(a, b));
    // Against the reference too: two kernels that leave the same row unwritten (NaN) would
    // otherwise be bitwise equal.
    rc_expect_reference(a, expected_merge(aligned.host_view(), out_base), "fast path");
  });
}

}  // namespace
}  // namespace attnstate_test
