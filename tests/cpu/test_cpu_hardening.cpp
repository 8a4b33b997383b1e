/// @file test_cpu_hardening.cpp
/// @brief Regression tests of the hardening round: every input that once corrupted data, read
///        out of bounds, overflowed a size or was treated inconsistently is now rejected with a
///        named error (or, where the API says so, accepted with one meaning everywhere).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"
#include "attnstate/cpu/merge.hpp"
#include "cpu/scratch.hpp"
#include "cpu_test_utils.hpp"

namespace attnstate {
namespace {

using test::expect_arg_error;

constexpr std::int64_t kBig = std::int64_t{1} << 62;

/// A two-request problem over one pool of 4 pages of 4 tokens (f32, 2 KV heads, 4 query heads,
/// head_dim 8): a shared first page (level 0) and one own page per request (level 1), plus the
/// same as a plain decode (CSR page table).
struct Problem {
  static constexpr std::int64_t kPages = 4, kPage = 4, kHkv = 2, kHq = 4, kD = 8, kBatch = 2;
  std::vector<float> pool = std::vector<float>(2 * kPages * kPage * kHkv * kD);
  std::vector<float> q = std::vector<float>(kBatch * kHq * kD);
  std::vector<float> o = std::vector<float>(kBatch * kHq * kD, NAN);
  std::vector<float> lse = std::vector<float>(kBatch * kHq, NAN);
  // cascade levels
  std::vector<std::int32_t> l0_req = {0, 2}, l0_pages = {0, 1}, l0_ids = {0}, l0_lens = {4};
  std::vector<std::int32_t> l1_req = {0, 1, 2}, l1_pages = {0, 1, 2}, l1_ids = {1, 2},
                            l1_lens = {3, 4};
  // decode tables
  std::vector<std::int32_t> indptr = {0, 2, 4}, ids = {0, 1, 0, 2}, lens = {7, 8};

  Problem() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (float& x : pool) x = u(rng);
    for (float& x : q) x = u(rng);
  }
  ConstTensorView qv() const {
    return make_tensor_view(q.data(), DType::kF32, {kBatch, 1, kHq, kD});
  }
  PagedKvCache kv() const {
    PagedKvCache c;
    c.k = pool.data();
    c.v = pool.data() + pool.size() / 2;
    c.dtype = DType::kF32;
    c.num_pages = kPages;
    c.page_size = kPage;
    c.heads_kv = kHkv;
    c.head_dim = kD;
    c.page_indptr = indptr.data();
    c.page_indices = ids.data();
    c.seq_lens = lens.data();
    c.batch = kBatch;
    return c;
  }
  std::vector<CascadeLevel> levels() const {
    CascadeLevel a, b;
    a.num_segments = 1;
    a.request_indptr = l0_req.data();
    a.page_indptr = l0_pages.data();
    a.page_indices = l0_ids.data();
    a.seg_lens = l0_lens.data();
    b.num_segments = 2;
    b.request_indptr = l1_req.data();
    b.page_indptr = l1_pages.data();
    b.page_indices = l1_ids.data();
    b.seg_lens = l1_lens.data();
    return {a, b};
  }
  StateView out() {
    return make_state_view(o.data(), DType::kF32, lse.data(), kBatch, kHq, kD, LseBase::kNatural);
  }
  void cascade(const PagedKvCache& c, StateView out_view, float scale = 0.f) {
    const std::vector<CascadeLevel> lv = levels();
    CascadeOptions opt;
    opt.scale = scale;
    cpu::cascade_attention(qv(), c, lv.data(), 2, opt, out_view);
  }
};

// ---- data loss: a cascade output inside the KV cache ------------------------------------------

TEST(HardeningCascade, OutputInsideTheKvPoolIsRejectedAndTheCacheKept) {
  Problem p;
  const std::vector<float> before = p.pool;
  StateView out = p.out();
  out.o = p.pool.data() + 40;  // inside the K pool
  expect_arg_error([&] { p.cascade(p.kv(), out); }, "out.o");
  out = p.out();
  out.lse = p.pool.data() + p.pool.size() / 2 + 3;  // inside the V pool
  expect_arg_error([&] { p.cascade(p.kv(), out); }, "out.lse");
  EXPECT_EQ(0, std::memcmp(before.data(), p.pool.data(), before.size() * 4));
}

TEST(HardeningCascade, OutputOverALevelArrayIsRejected) {
  Problem p;
  std::vector<float> scratch(64);
  StateView out = p.out();
  out.lse = reinterpret_cast<float*>(p.l1_lens.data());
  expect_arg_error([&] { p.cascade(p.kv(), out); }, "out.lse");
  try {
    p.cascade(p.kv(), out);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("levels[1].seg_lens"), std::string::npos) << e.what();
  }
}

// ---- pool sizes that overflow 64 bits --------------------------------------------------------

TEST(HardeningPool, PoolSizesPast2To62AreRejectedByDecodeAndCascade) {
  Problem p;
  struct Case {
    const char* arg;
    void (*edit)(PagedKvCache&);
  };
  const Case cases[] = {
      {"kv.page_size", [](PagedKvCache& c) { c.page_size = kBig; }},
      {"kv.page_size", [](PagedKvCache& c) { c.page_size = std::int64_t{1} << 58; }},
      {"kv.head_dim", [](PagedKvCache& c) { c.head_dim = std::int64_t{1} << 61; }},
      {"kv.page_stride", [](PagedKvCache& c) { c.page_stride = std::int64_t{1} << 61; }},
      {"kv.num_pages", [](PagedKvCache& c) { c.num_pages = std::int64_t{1} << 60; }},
      {"kv.num_pages", [](PagedKvCache& c) { c.num_pages = INT64_MAX; }},
  };
  for (const Case& c : cases) {
    PagedKvCache kv = p.kv();
    c.edit(kv);
    SCOPED_TRACE(c.arg);
    expect_arg_error([&] { cpu::decode(p.qv(), kv, DecodeOptions{}, p.out()); }, c.arg);
    expect_arg_error([&] { p.cascade(kv, p.out()); }, c.arg);
  }
}

// ---- an overflowing span names the argument that is wrong ------------------------------------

TEST(HardeningSpans, AnOverflowNamesTheExtentOrTheStrideThatIsOutOfProportion) {
  std::vector<float> o(16), lse(4), o2(16), lse2(4);
  StateView a = make_state_view(o.data(), DType::kF32, lse.data(), 2, 2, 4, LseBase::kNatural);
  StateView b = make_state_view(o2.data(), DType::kF32, lse2.data(), 2, 2, 4, LseBase::kNatural);
  StateView huge = a;
  huge.tokens = kBig;  // the contiguous stride 8 is fine: the token count is what is wrong
  expect_arg_error([&] { cpu::merge_state(huge, b, b); }, "a.tokens");
  huge = a;
  huge.o_stride_token = kBig;
  expect_arg_error([&] { cpu::merge_state(huge, b, b); }, "a.o_stride_token");
  huge = a;
  huge.heads = kBig / 2;
  expect_arg_error([&] { cpu::merge_state(huge, b, b); }, "a.heads");
  huge = a;
  huge.head_dim = kBig;  // bytes of one row pass 2^62
  expect_arg_error([&] { cpu::merge_state(huge, b, b); }, "a.head_dim");
  ConstStateStackView st = make_state_stack(
      o.data(), DType::kF32, lse.data(), StackOrder::kStatesMajor, 1, 2, 2, 4, LseBase::kNatural);
  st.num_states = kBig;
  StateView out1 = make_state_view(o2.data(), DType::kF32, lse2.data(), 1, 2, 4, LseBase::kNatural);
  expect_arg_error([&] { cpu::merge_states(st, out1); }, "states.num_states");
  // a tensor: the outer extent of a contiguous tensor, or its stride
  std::vector<float> qd(64), kd(64);
  ConstTensorView qt = make_tensor_view(qd.data(), DType::kF32, {2, 4, 8});
  const ConstTensorView kt = make_tensor_view(kd.data(), DType::kF32, {2, 4, 8});
  const StateView ot =
      make_state_view(o.data(), DType::kF32, lse.data(), 2, 4, 2, LseBase::kNatural);
  qt.shape[0] = kBig;
  expect_arg_error([&] { cpu::attention_state(qt, kt, kt, 0.f, ot); }, "q.shape[0]");
  qt = make_tensor_view(qd.data(), DType::kF32, {2, 4, 8});
  qt.stride[1] = kBig;
  expect_arg_error([&] { cpu::attention_state(qt, kt, kt, 0.f, ot); }, "q.stride[1]");
}

// ---- empty batches ---------------------------------------------------------------------------

TEST(HardeningEmptyBatch, CascadeAndDecodeOfNoRequestsAreNoOps) {
  Problem p;
  const ConstTensorView q0 = make_tensor_view(p.q.data(), DType::kF32, {0, 1, 4, 8});
  StateView out0 = p.out();
  out0.tokens = 0;
  CascadeOptions opt;
  EXPECT_NO_THROW(cpu::cascade_attention(q0, p.kv(), nullptr, 0, opt, out0));
  const std::vector<CascadeLevel> lv = p.levels();
  EXPECT_NO_THROW(cpu::cascade_attention(q0, p.kv(), lv.data(), 2, opt, out0));
  PagedKvCache kv0 = p.kv();
  kv0.batch = 0;
  EXPECT_NO_THROW(cpu::decode(q0, kv0, DecodeOptions{}, out0));
  for (float x : p.o) EXPECT_TRUE(std::isnan(x));  // nothing written
  // the shapes are still checked
  StateView bad = out0;
  bad.heads = 3;
  expect_arg_error([&] { cpu::cascade_attention(q0, p.kv(), nullptr, 0, opt, bad); }, "out.heads");
}

// ---- CSR offsets start at 0 -------------------------------------------------------------------

TEST(HardeningIndptr, PageOffsetsMustStartAtZero) {
  Problem p;
  std::vector<std::int32_t> indptr = {1, 2, 4};
  PagedKvCache kv = p.kv();
  kv.page_indptr = indptr.data();
  expect_arg_error([&] { cpu::decode(p.qv(), kv, DecodeOptions{}, p.out()); }, "kv.page_indptr[0]");
  p.l1_pages = {1, 1, 2};
  expect_arg_error([&] { p.cascade(p.kv(), p.out()); }, "levels[1].page_indptr[0]");
}

// ---- split planning ---------------------------------------------------------------------------

TEST(HardeningPlan, NegativeBatchAndUnknownPolicyAreRejected) {
  DecodeProblem pr;
  pr.batch = -1;
  pr.heads_q = pr.heads_kv = 1;
  pr.head_dim = 8;
  std::int32_t len = 100;
  expect_arg_error([&] { plan_split_layout(pr, &len, DecodeOptions{}, 132, 1); }, "problem.batch");
  pr.batch = 1;
  DecodeOptions o;
  o.policy = static_cast<SplitPolicy>(9);
  expect_arg_error([&] { plan_split_layout(pr, &len, o, 132, 1); }, "options.policy");
  // counts whose products overflow are planned, not wrapped
  pr.batch = kBig;
  std::vector<std::int32_t> lens(4, 100);
  pr.batch = 4;
  EXPECT_EQ(plan_split_layout(pr, lens.data(), DecodeOptions{}, kBig, kBig).policy,
            SplitPolicy::kFixedSize);
}

// ---- mark_empty_rows writes only LSEs: it needs no o -------------------------------------------

TEST(HardeningMarkEmpty, ANullOIsAccepted) {
  std::vector<float> lse = {INFINITY, 1.f, -INFINITY, INFINITY};
  StateView s = make_state_view(nullptr, DType::kF32, lse.data(), 2, 2, 8, LseBase::kNatural);
  ASSERT_NO_THROW(cpu::mark_empty_rows(s));
  EXPECT_EQ(lse[0], -INFINITY);
  EXPECT_EQ(lse[1], 1.f);
  EXPECT_EQ(lse[3], -INFINITY);
  s.lse = nullptr;
  expect_arg_error([&] { cpu::mark_empty_rows(s); }, "state.lse");
}

// ---- scale = 0 means 1/sqrt(head_dim) everywhere ------------------------------------------------

TEST(HardeningScale, ZeroMeansInverseSqrtHeadDimInEveryEntryPoint) {
  Problem p;
  const float s = 1.f / std::sqrt(8.f);
  // attention_state
  {
    std::vector<float> oa(p.o.size()), la(p.lse.size()), ob(p.o.size()), lb(p.lse.size());
    const ConstTensorView q = make_tensor_view(p.q.data(), DType::kF32, {2, 4, 8});
    const ConstTensorView k = make_tensor_view(p.pool.data(), DType::kF32, {8, 2, 8});
    const ConstTensorView v =
        make_tensor_view(p.pool.data() + p.pool.size() / 2, DType::kF32, {8, 2, 8});
    cpu::attention_state(
        q, k, v, 0.f,
        make_state_view(oa.data(), DType::kF32, la.data(), 2, 4, 8, LseBase::kNatural));
    cpu::attention_state(
        q, k, v, s, make_state_view(ob.data(), DType::kF32, lb.data(), 2, 4, 8, LseBase::kNatural));
    EXPECT_EQ(oa, ob);
    EXPECT_EQ(la, lb);
  }
  // both decode overloads
  {
    SplitLayout l;
    l.policy = SplitPolicy::kFixedCount;
    l.num_splits = l.max_splits = 2;
    cpu::decode(p.qv(), p.kv(), l, 0.f, p.out());
    const std::vector<float> o0 = p.o, l0 = p.lse;
    cpu::decode(p.qv(), p.kv(), l, s, p.out());
    EXPECT_EQ(o0, p.o);
    EXPECT_EQ(l0, p.lse);
    DecodeOptions opt;
    opt.policy = SplitPolicy::kFixedCount;
    opt.num_splits = 2;
    cpu::decode(p.qv(), p.kv(), opt, p.out());
    EXPECT_EQ(o0, p.o);
  }
  // cascade
  {
    p.cascade(p.kv(), p.out(), 0.f);
    const std::vector<float> o0 = p.o;
    p.cascade(p.kv(), p.out(), s);
    EXPECT_EQ(o0, p.o);
  }
  expect_arg_error([&] { cpu::decode(p.qv(), p.kv(), SplitLayout{}, NAN, p.out()); }, "scale");
}

// ---- every message has ", got" ---------------------------------------------------------------

TEST(HardeningMessages, FormerlyBareMessagesSayWhatTheyGot) {
  Problem p;
  PagedKvCache kv = p.kv();
  kv.k = nullptr;
  expect_arg_error([&] { p.cascade(kv, p.out()); }, "kv.k");
  kv = p.kv();
  kv.dtype = static_cast<DType>(77);
  expect_arg_error([&] { p.cascade(kv, p.out()); }, "kv.dtype");
  std::vector<CascadeLevel> lv = p.levels();
  lv[1].seg_lens = nullptr;
  expect_arg_error(
      [&] { cpu::cascade_attention(p.qv(), p.kv(), lv.data(), 2, CascadeOptions{}, p.out()); },
      "levels[1].seg_lens");
  CascadeOptions bad;
  bad.scale = INFINITY;
  expect_arg_error([&] { cpu::cascade_attention(p.qv(), p.kv(), lv.data(), 2, bad, p.out()); },
                   "options.scale");
}

// ---- scratch sizes computed from arguments ------------------------------------------------------

TEST(HardeningScratch, AScratchSizePast2To62BytesIsAnErrorNotAWrappedSize) {
  for (std::initializer_list<std::int64_t> x :
       {std::initializer_list<std::int64_t>{std::int64_t{1} << 40, std::int64_t{1} << 30},
        std::initializer_list<std::int64_t>{std::int64_t{1} << 61}}) {
    try {
      (void)cpu::detail::scratch_floats("attnstate::cpu::decode", x);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kResourceExhausted);
    }
  }
  EXPECT_EQ(cpu::detail::scratch_floats("f", {3, 5}).size(), 15u);
}

}  // namespace
}  // namespace attnstate
