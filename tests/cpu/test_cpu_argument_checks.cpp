/// @file test_cpu_argument_checks.cpp
/// @brief One test per argument check of the CPU backend: each bad input raises
///        attnstate::Error (kInvalidArgument) naming the argument, and writes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/merge.hpp"
#include "common/cascade_validate.hpp"
#include "common/decode_validate.hpp"
#include "cpu_test_utils.hpp"

namespace attnstate {
namespace {

using test::expect_arg_error;
using test::OwnedState;
using test::OwnedTensor;

constexpr std::int64_t kT = 4, kH = 3, kD = 8;

/// Valid inputs for every operation; each test breaks one argument.
struct Fixture {
  std::mt19937 rng{401};
  OwnedState a = test::make_state(kT, kH, kD, DType::kF32, LseBase::kNatural);
  OwnedState b = test::make_state(kT, kH, kD, DType::kBF16, LseBase::kBase2);
  OwnedState out = test::make_state(kT, kH, kD, DType::kF16, LseBase::kNatural);
  std::vector<float> stack_o = std::vector<float>(kT * 2 * kH * kD, 0.5f);
  std::vector<float> stack_lse = std::vector<float>(kT * 2 * kH, 0.f);
  ConstStateStackView stack =
      make_state_stack(stack_o.data(), DType::kF32, stack_lse.data(), StackOrder::kTokensMajor, kT,
                       2, kH, kD, LseBase::kNatural);
  std::vector<std::int32_t> indptr = {0, 1, 1, 3, 4};
  OwnedTensor q = test::make_tensor(kT, 4, kD, DType::kF32, rng);
  OwnedTensor k = test::make_tensor(5, 2, kD, DType::kF32, rng);
  OwnedTensor v = test::make_tensor(5, 2, kD, DType::kF32, rng);
  OwnedState att = test::make_state(kT, 4, kD, DType::kF32, LseBase::kNatural);

  Fixture() {
    test::fill_random(a, rng);
    test::fill_random(b, rng);
  }
  /// After a rejected call nothing was written: the outputs still hold the poison.
  void expect_outputs_untouched() {
    OwnedState fresh_out = test::make_state(kT, kH, kD, DType::kF16, LseBase::kNatural);
    OwnedState fresh_att = test::make_state(kT, 4, kD, DType::kF32, LseBase::kNatural);
    EXPECT_EQ(out.o, fresh_out.o);
    EXPECT_EQ(0, std::memcmp(out.lse.data(), fresh_out.lse.data(), out.lse.size() * 4));
    EXPECT_EQ(att.o, fresh_att.o);
  }
};

// ---- merge_state ------------------------------------------------------------------------------

TEST(MergeStateArgs, NullOutputOfAIsRejected) {
  Fixture f;
  ConstStateView a = f.a.cview();
  a.o = nullptr;
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), f.out.view()); }, "a.o");
  f.expect_outputs_untouched();
}

TEST(MergeStateArgs, NullLseOfBIsRejected) {
  Fixture f;
  ConstStateView b = f.b.cview();
  b.lse = nullptr;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), b, f.out.view()); }, "b.lse");
  f.expect_outputs_untouched();
}

TEST(MergeStateArgs, NullOutputPointerIsRejected) {
  Fixture f;
  StateView out = f.out.view();
  out.o = nullptr;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), f.b.cview(), out); }, "out.o");
}

TEST(MergeStateArgs, TokenCountMismatchIsRejected) {
  Fixture f;
  ConstStateView b = f.b.cview();
  b.tokens = kT - 1;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), b, f.out.view()); }, "b.tokens");
  f.expect_outputs_untouched();
}

TEST(MergeStateArgs, HeadCountMismatchIsRejected) {
  Fixture f;
  ConstStateView b = f.b.cview();
  b.heads = kH - 1;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), b, f.out.view()); }, "b.heads");
}

TEST(MergeStateArgs, HeadDimMismatchWithOutputIsRejected) {
  Fixture f;
  StateView out = f.out.view();
  out.head_dim = kD / 2;
  out.o_stride_head = kD / 2;
  out.o_stride_token = kH * kD / 2;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), f.b.cview(), out); }, "out.head_dim");
  f.expect_outputs_untouched();
}

TEST(MergeStateArgs, NegativeTokensAreRejected) {
  Fixture f;
  ConstStateView a = f.a.cview();
  a.tokens = -1;
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), f.out.view()); }, "a.tokens");
}

TEST(MergeStateArgs, ZeroHeadsAreRejected) {
  Fixture f;
  ConstStateView a = f.a.cview();
  a.heads = 0;
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), f.out.view()); }, "a.heads");
}

TEST(MergeStateArgs, ZeroHeadDimIsRejected) {
  Fixture f;
  ConstStateView a = f.a.cview();
  a.head_dim = 0;
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), f.out.view()); }, "a.head_dim");
}

TEST(MergeStateArgs, NegativeStrideIsRejected) {
  Fixture f;
  ConstStateView b = f.b.cview();
  b.o_stride_head = -kD;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), b, f.out.view()); }, "b.o_stride_head");
}

TEST(MergeStateArgs, NegativeLseStrideIsRejected) {
  Fixture f;
  ConstStateView b = f.b.cview();
  b.lse_stride_token = -1;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), b, f.out.view()); }, "b.lse_stride_token");
}

TEST(MergeStateArgs, OverlappingOutputTokenStrideIsRejected) {
  Fixture f;
  StateView out = f.out.view();
  out.o_stride_token = kD;  // tokens would overwrite each other's heads
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), f.b.cview(), out); }, "out.o_stride_token");
  f.expect_outputs_untouched();
}

TEST(MergeStateArgs, OverlappingOutputHeadStrideIsRejected) {
  Fixture f;
  StateView out = f.out.view();
  out.o_stride_head = kD - 1;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), f.b.cview(), out); }, "out.o_stride_head");
}

TEST(MergeStateArgs, OverlappingOutputLseStrideIsRejected) {
  Fixture f;
  StateView out = f.out.view();
  out.lse_stride_head = 0;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), f.b.cview(), out); }, "out.lse_stride_head");
}

TEST(MergeStateArgs, StrideWhoseSpanOverflowsIsRejected) {
  Fixture f;
  ConstStateView a = f.a.cview();
  a.o_stride_token = std::numeric_limits<std::int64_t>::max() / 2;
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), f.out.view()); }, "a.o_stride_token");
}

TEST(MergeStateArgs, InvalidDtypeValueIsRejected) {
  Fixture f;
  ConstStateView a = f.a.cview();
  a.dtype = static_cast<DType>(7);
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), f.out.view()); }, "a.dtype");
}

TEST(MergeStateArgs, InvalidOutputDtypeValueIsRejected) {
  Fixture f;
  StateView out = f.out.view();
  out.dtype = static_cast<DType>(7);
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), f.b.cview(), out); }, "out.dtype");
}

TEST(MergeStateArgs, InvalidBaseValueIsRejected) {
  Fixture f;
  ConstStateView b = f.b.cview();
  b.base = static_cast<LseBase>(9);
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), b, f.out.view()); }, "b.base");
}

TEST(MergeStateArgs, DeviceInputIsRejected) {
  Fixture f;
  ConstStateView a = f.a.cview();
  a.space = MemorySpace::kDevice;
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), f.out.view()); }, "a.space");
}

TEST(MergeStateArgs, DeviceOutputIsRejected) {
  Fixture f;
  StateView out = f.out.view();
  out.space = MemorySpace::kDevice;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), f.b.cview(), out); }, "out.space");
}

TEST(MergeStateArgs, PartialAliasOfOutputAndInputIsRejected) {
  Fixture f;
  OwnedState big = test::make_state(kT + 1, kH, kD, DType::kF32, LseBase::kNatural);
  test::fill_random(big, f.rng);
  ConstStateView a = big.cview();
  a.tokens = kT;
  StateView out = big.view();  // out = a shifted by one token: a partial overlap
  out.tokens = kT;
  out.o = static_cast<float*>(out.o) + out.o_stride_token;
  out.lse += out.lse_stride_token;
  expect_arg_error([&] { cpu::merge_state(a, f.a.cview(), out); }, "out.o");
}

TEST(MergeStateArgs, PartialAliasOfLseIsRejected) {
  Fixture f;
  StateView out = f.a.view();  // o aliases a exactly, lse shifted by one head
  out.lse += 1;
  std::vector<float> lse(64);
  out.lse = lse.data();
  ConstStateView a = f.a.cview();
  a.lse = lse.data() + 1;
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), out); }, "out.lse");
}

TEST(MergeStateArgs, AliasWithDifferentDtypeIsRejected) {
  Fixture f;
  StateView out = f.a.view();
  out.dtype = DType::kF16;  // same bytes reinterpreted: not an exact alias
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), f.b.cview(), out); }, "out.o");
}

TEST(MergeStateArgs, OutputLseOverAnInputsOIsRejected) {
  // out.lse inside a.o (and out.o inside b.lse): never an exact alias, a silent corruption
  Fixture f;
  StateView out = f.out.view();
  out.lse = static_cast<float*>(const_cast<void*>(f.a.cview().o)) + 1;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), f.b.cview(), out); }, "out.lse");
  std::vector<float> shared(kT * kH * kD + kT * kH);
  ConstStateView a = f.a.cview();
  a.lse = shared.data() + kD;  // a.lse inside out.o
  StateView out2 = make_state_view(shared.data(), DType::kF32, shared.data() + kT * kH * kD, kT, kH,
                                   kD, LseBase::kNatural);
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), out2); }, "out.o");
  f.expect_outputs_untouched();
}

TEST(MergeStateArgs, MisalignedPointersAreRejected) {
  Fixture f;
  ConstStateView b = f.b.cview();  // bf16: 2-byte elements
  b.o = static_cast<const char*>(b.o) + 1;
  expect_arg_error([&] { cpu::merge_state(f.a.cview(), b, f.out.view()); }, "b.o");
  ConstStateView a = f.a.cview();
  a.lse = reinterpret_cast<const float*>(reinterpret_cast<const char*>(a.lse) + 2);
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), f.out.view()); }, "a.lse");
  f.expect_outputs_untouched();
}

TEST(MergeStateArgs, HeadStrideWhoseSpanOverflowsIsNamed) {
  Fixture f;
  ConstStateView a = f.a.cview();
  a.o_stride_head = std::int64_t{1} << 61;
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), f.out.view()); }, "a.o_stride_head");
  a = f.a.cview();
  a.lse_stride_head = std::int64_t{1} << 62;
  expect_arg_error([&] { cpu::merge_state(a, f.b.cview(), f.out.view()); }, "a.lse_stride_head");
}

TEST(MergeStateArgs, ZeroTokenHeadMajorViewsAreAccepted) {
  // FlashAttention varlen with no tokens: a head-major LSE of 0 tokens has head stride 0
  std::vector<float> o(1), lse(1);
  const StateView none = with_head_major_lse(
      make_state_view(o.data(), DType::kF32, lse.data(), 0, 4, 8, LseBase::kNatural), 0);
  EXPECT_NO_THROW(cpu::merge_state(none, none, none));
}

// ---- merge_state_inplace ----------------------------------------------------------------------

TEST(MergeStateInplaceArgs, NullAccLseIsRejected) {
  Fixture f;
  StateView acc = f.a.view();
  acc.lse = nullptr;
  expect_arg_error([&] { cpu::merge_state_inplace(acc, f.b.cview()); }, "acc.lse");
}

TEST(MergeStateInplaceArgs, OtherShapeMismatchIsRejected) {
  Fixture f;
  ConstStateView other = f.b.cview();
  other.head_dim = kD + 1;
  expect_arg_error([&] { cpu::merge_state_inplace(f.a.view(), other); }, "other.head_dim");
}

TEST(MergeStateInplaceArgs, NullOtherOIsRejected) {
  Fixture f;
  ConstStateView other = f.b.cview();
  other.o = nullptr;
  expect_arg_error([&] { cpu::merge_state_inplace(f.a.view(), other); }, "other.o");
}

TEST(MergeStateInplaceArgs, MaskInsideAccIsRejected) {
  Fixture f;
  const auto* mask = reinterpret_cast<const std::uint8_t*>(f.a.lse.data());
  expect_arg_error([&] { cpu::merge_state_inplace(f.a.view(), f.b.cview(), mask); }, "mask");
}

TEST(MergeStateInplaceArgs, DeviceAccIsRejected) {
  Fixture f;
  StateView acc = f.a.view();
  acc.space = MemorySpace::kDevice;
  expect_arg_error([&] { cpu::merge_state_inplace(acc, f.b.cview()); }, "acc.space");
}

// ---- merge_states -----------------------------------------------------------------------------

TEST(MergeStatesArgs, NegativeStateCountIsRejected) {
  // (S = 0 is the empty state: MergeStates.NoStatesGiveTheEmptyState)
  Fixture f;
  f.stack.num_states = -1;
  expect_arg_error([&] { cpu::merge_states(f.stack, f.out.view()); }, "states.num_states");
  f.expect_outputs_untouched();
}

TEST(MergeStatesArgs, NegativeStateStrideIsRejected) {
  Fixture f;
  f.stack.o_stride_state = -1;
  expect_arg_error([&] { cpu::merge_states(f.stack, f.out.view()); }, "states.o_stride_state");
}

TEST(MergeStatesArgs, NegativeLseStateStrideIsRejected) {
  Fixture f;
  f.stack.lse_stride_state = -3;
  expect_arg_error([&] { cpu::merge_states(f.stack, f.out.view()); }, "states.lse_stride_state");
}

TEST(MergeStatesArgs, NullStackLseIsRejected) {
  Fixture f;
  f.stack.lse = nullptr;
  expect_arg_error([&] { cpu::merge_states(f.stack, f.out.view()); }, "states.lse");
}

TEST(MergeStatesArgs, NullStackOIsRejected) {
  Fixture f;
  f.stack.o = nullptr;
  expect_arg_error([&] { cpu::merge_states(f.stack, f.out.view()); }, "states.o");
}

TEST(MergeStatesArgs, OutputTokenMismatchIsRejected) {
  Fixture f;
  StateView out = f.out.view();
  out.tokens = kT - 1;
  expect_arg_error([&] { cpu::merge_states(f.stack, out); }, "out.tokens");
}

TEST(MergeStatesArgs, DeviceStackIsRejected) {
  Fixture f;
  f.stack.space = MemorySpace::kDevice;
  expect_arg_error([&] { cpu::merge_states(f.stack, f.out.view()); }, "states.space");
}

TEST(MergeStatesArgs, InvalidStackDtypeIsRejected) {
  Fixture f;
  f.stack.dtype = static_cast<DType>(200);
  expect_arg_error([&] { cpu::merge_states(f.stack, f.out.view()); }, "states.dtype");
}

TEST(MergeStatesArgs, OutputInsideTheStackIsRejected) {
  Fixture f;
  StateView out = make_state_view(f.stack_o.data(), DType::kF32, f.stack_lse.data() + 100, kT, kH,
                                  kD, LseBase::kNatural);
  std::vector<float> lse(kT * kH);
  out.lse = lse.data();
  expect_arg_error([&] { cpu::merge_states(f.stack, out); }, "out.o");
}

TEST(MergeStatesArgs, StateStrideOverflowIsRejected) {
  Fixture f;
  f.stack.o_stride_state = std::numeric_limits<std::int64_t>::max() / 2;
  expect_arg_error([&] { cpu::merge_states(f.stack, f.out.view()); }, "states.o_stride_state");
}

// ---- merge_states_ragged ----------------------------------------------------------------------

TEST(MergeStatesRaggedArgs, NullIndptrIsRejected) {
  Fixture f;
  expect_arg_error([&] { cpu::merge_states_ragged(f.a.cview(), nullptr, f.out.view()); }, "indptr");
  f.expect_outputs_untouched();
}

TEST(MergeStatesRaggedArgs, NonMonotoneIndptrIsRejected) {
  Fixture f;
  f.indptr = {0, 2, 1, 3, 4};
  expect_arg_error([&] { cpu::merge_states_ragged(f.a.cview(), f.indptr.data(), f.out.view()); },
                   "indptr[2]");
  f.expect_outputs_untouched();
}

TEST(MergeStatesRaggedArgs, NegativeFirstOffsetIsRejected) {
  Fixture f;
  f.indptr = {-1, 0, 1, 2, 3};
  expect_arg_error([&] { cpu::merge_states_ragged(f.a.cview(), f.indptr.data(), f.out.view()); },
                   "indptr[0]");
}

TEST(MergeStatesRaggedArgs, LastOffsetPastTheRowsIsRejected) {
  Fixture f;
  f.indptr = {0, 1, 2, 3, kT + 1};
  expect_arg_error([&] { cpu::merge_states_ragged(f.a.cview(), f.indptr.data(), f.out.view()); },
                   "indptr[4]");
  f.expect_outputs_untouched();
}

TEST(MergeStatesRaggedArgs, RowsHeadMismatchIsRejected) {
  Fixture f;
  ConstStateView rows = f.a.cview();
  rows.heads = 1;
  expect_arg_error([&] { cpu::merge_states_ragged(rows, f.indptr.data(), f.out.view()); },
                   "rows.heads");
}

TEST(MergeStatesRaggedArgs, RowsHeadDimMismatchIsRejected) {
  Fixture f;
  ConstStateView rows = f.a.cview();
  rows.head_dim = 2;
  expect_arg_error([&] { cpu::merge_states_ragged(rows, f.indptr.data(), f.out.view()); },
                   "rows.head_dim");
}

TEST(MergeStatesRaggedArgs, NullRowsLseIsRejected) {
  Fixture f;
  ConstStateView rows = f.a.cview();
  rows.lse = nullptr;
  expect_arg_error([&] { cpu::merge_states_ragged(rows, f.indptr.data(), f.out.view()); },
                   "rows.lse");
}

TEST(MergeStatesRaggedArgs, OutputOverlappingRowsIsRejected) {
  Fixture f;
  StateView out = f.a.view();
  expect_arg_error([&] { cpu::merge_states_ragged(f.a.cview(), f.indptr.data(), out); }, "out.o");
}

TEST(MergeStatesRaggedArgs, OutputOverTheIndptrIsRejected) {
  Fixture f;
  std::vector<float> buf(kT * kH * kD + kT * kH + 8);
  std::int32_t* indptr = reinterpret_cast<std::int32_t*>(buf.data() + kT * kH * kD + 2);
  for (int i = 0; i <= kT; ++i) indptr[i] = i;  // inside out.lse
  const StateView out = make_state_view(buf.data(), DType::kF32, buf.data() + kT * kH * kD, kT, kH,
                                        kD, LseBase::kNatural);
  expect_arg_error([&] { cpu::merge_states_ragged(f.a.cview(), indptr, out); }, "out.lse");
}

// ---- rebase -----------------------------------------------------------------------------------

TEST(RebaseArgs, ShapeMismatchIsRejected) {
  Fixture f;
  StateView out = f.out.view();
  out.tokens = 1;
  expect_arg_error([&] { cpu::rebase(f.a.cview(), out); }, "out.tokens");
}

TEST(RebaseArgs, NullInputLseIsRejected) {
  Fixture f;
  ConstStateView in = f.a.cview();
  in.lse = nullptr;
  expect_arg_error([&] { cpu::rebase(in, f.out.view()); }, "in.lse");
  f.expect_outputs_untouched();
}

TEST(RebaseArgs, PartialAliasIsRejected) {
  Fixture f;
  StateView out = f.a.view();
  out.lse_stride_token = kH + 1;  // same pointer, other strides
  std::vector<float> big(64);
  out.lse = big.data();
  ConstStateView in = f.a.cview();
  in.lse = big.data();
  expect_arg_error([&] { cpu::rebase(in, out); }, "out.lse");
}

TEST(RebaseArgs, DeviceOutputIsRejected) {
  Fixture f;
  StateView out = f.out.view();
  out.space = MemorySpace::kDevice;
  expect_arg_error([&] { cpu::rebase(f.a.cview(), out); }, "out.space");
}

// ---- attention_state --------------------------------------------------------------------------

void run_attention(Fixture& f, const ConstTensorView& q, const ConstTensorView& k,
                   const ConstTensorView& v, float scale, StateView out) {
  cpu::attention_state(q, k, v, scale, out);
}

TEST(AttentionStateArgs, WrongQueryRankIsRejected) {
  Fixture f;
  ConstTensorView q = f.q.view;
  q.rank = 2;
  expect_arg_error([&] { run_attention(f, q, f.k.view, f.v.view, 0.5f, f.att.view()); }, "q.rank");
  f.expect_outputs_untouched();
}

TEST(AttentionStateArgs, NullQueryDataIsRejected) {
  Fixture f;
  ConstTensorView q = f.q.view;
  q.data = nullptr;
  expect_arg_error([&] { run_attention(f, q, f.k.view, f.v.view, 0.5f, f.att.view()); }, "q.data");
}

TEST(AttentionStateArgs, NullValueDataIsRejected) {
  Fixture f;
  ConstTensorView v = f.v.view;
  v.data = nullptr;
  expect_arg_error([&] { run_attention(f, f.q.view, f.k.view, v, 0.5f, f.att.view()); }, "v.data");
}

TEST(AttentionStateArgs, KeyHeadDimMismatchIsRejected) {
  Fixture f;
  OwnedTensor k = test::make_tensor(5, 2, kD + 1, DType::kF32, f.rng);
  OwnedTensor v = test::make_tensor(5, 2, kD + 1, DType::kF32, f.rng);
  expect_arg_error([&] { run_attention(f, f.q.view, k.view, v.view, 0.5f, f.att.view()); },
                   "k.shape[2]");
}

TEST(AttentionStateArgs, ValueLengthMismatchIsRejected) {
  Fixture f;
  ConstTensorView v = f.v.view;
  v.shape[0] = 4;
  expect_arg_error([&] { run_attention(f, f.q.view, f.k.view, v, 0.5f, f.att.view()); },
                   "v.shape[0]");
}

TEST(AttentionStateArgs, ValueDtypeMismatchIsRejected) {
  Fixture f;
  OwnedTensor v = test::make_tensor(5, 2, kD, DType::kBF16, f.rng);
  expect_arg_error([&] { run_attention(f, f.q.view, f.k.view, v.view, 0.5f, f.att.view()); },
                   "v.dtype");
}

TEST(AttentionStateArgs, QueryHeadsNotMultipleOfKvHeadsIsRejected) {
  Fixture f;
  OwnedTensor k = test::make_tensor(5, 3, kD, DType::kF32, f.rng);
  OwnedTensor v = test::make_tensor(5, 3, kD, DType::kF32, f.rng);
  expect_arg_error([&] { run_attention(f, f.q.view, k.view, v.view, 0.5f, f.att.view()); },
                   "k.shape[1]");
  f.expect_outputs_untouched();
}

TEST(AttentionStateArgs, ZeroKvHeadsAreRejected) {
  Fixture f;
  ConstTensorView k = f.k.view, v = f.v.view;
  k.shape[1] = 0;
  v.shape[1] = 0;
  expect_arg_error([&] { run_attention(f, f.q.view, k, v, 0.5f, f.att.view()); }, "k.shape[1]");
}

TEST(AttentionStateArgs, NonFiniteScaleIsRejected) {
  Fixture f;
  for (float scale :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    expect_arg_error([&] { run_attention(f, f.q.view, f.k.view, f.v.view, scale, f.att.view()); },
                     "scale");
  }
  f.expect_outputs_untouched();
}

TEST(AttentionStateArgs, NonContiguousHeadDimIsRejected) {
  Fixture f;
  ConstTensorView q = f.q.view;
  q.stride[2] = 2;
  expect_arg_error([&] { run_attention(f, q, f.k.view, f.v.view, 0.5f, f.att.view()); },
                   "q.stride[2]");
}

TEST(AttentionStateArgs, NegativeKeyStrideIsRejected) {
  Fixture f;
  ConstTensorView k = f.k.view;
  k.stride[0] = -1;
  expect_arg_error([&] { run_attention(f, f.q.view, k, f.v.view, 0.5f, f.att.view()); },
                   "k.stride[0]");
}

TEST(AttentionStateArgs, InvalidQueryDtypeIsRejected) {
  Fixture f;
  ConstTensorView q = f.q.view;
  q.dtype = static_cast<DType>(5);
  expect_arg_error([&] { run_attention(f, q, f.k.view, f.v.view, 0.5f, f.att.view()); }, "q.dtype");
}

TEST(AttentionStateArgs, DeviceKeysAreRejected) {
  Fixture f;
  ConstTensorView k = f.k.view;
  k.space = MemorySpace::kDevice;
  expect_arg_error([&] { run_attention(f, f.q.view, k, f.v.view, 0.5f, f.att.view()); }, "k.space");
}

TEST(AttentionStateArgs, OutputHeadMismatchIsRejected) {
  Fixture f;
  StateView out = f.att.view();
  out.heads = 2;
  expect_arg_error([&] { run_attention(f, f.q.view, f.k.view, f.v.view, 0.5f, out); }, "out.heads");
}

TEST(AttentionStateArgs, OutputTokenMismatchIsRejected) {
  Fixture f;
  StateView out = f.att.view();
  out.tokens = 1;
  expect_arg_error([&] { run_attention(f, f.q.view, f.k.view, f.v.view, 0.5f, out); },
                   "out.tokens");
}

TEST(AttentionStateArgs, OutputOverlappingQueriesIsRejected) {
  Fixture f;
  StateView out = f.att.view();
  out.o = const_cast<void*>(f.q.view.data);
  expect_arg_error([&] { run_attention(f, f.q.view, f.k.view, f.v.view, 0.5f, out); }, "out.o");
}

TEST(AttentionStateArgs, NullOutputLseIsRejected) {
  Fixture f;
  StateView out = f.att.view();
  out.lse = nullptr;
  expect_arg_error([&] { run_attention(f, f.q.view, f.k.view, f.v.view, 0.5f, out); }, "out.lse");
}

// ---- make_tensor_view ---------------------------------------------------------------------------

TEST(MakeTensorViewArgs, MoreThanFourDimensionsAreRejected) {
  float x[32] = {};
  expect_arg_error([&] { make_tensor_view(x, DType::kF32, {1, 2, 2, 2, 4}); }, "dims");
}

TEST(MakeTensorViewArgs, NoDimensionsAreRejected) {
  float x[1] = {};
  expect_arg_error([&] { make_tensor_view(x, DType::kF32, {}); }, "dims");
  try {
    make_tensor_view(x, DType::kF32, {});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 1 to 4 dimensions, got 0"), std::string::npos)
        << e.what();
  }
}

TEST(MakeTensorViewArgs, NegativeExtentIsRejected) {
  float x[4] = {};
  expect_arg_error([&] { make_tensor_view(x, DType::kF32, {2, -1, 2}); }, "dims[1]");
}

TEST(MakeTensorViewArgs, ElementCountPast2To62IsRejected) {
  float x[4] = {};
  constexpr std::int64_t k31 = std::int64_t{1} << 31;
  // 2^31 · 2^31 · 2 = 2^63 wrapped to a negative count before the check existed
  expect_arg_error([&] { make_tensor_view(x, DType::kF32, {2, k31, k31}); }, "dims");
  expect_arg_error([&] { make_tensor_view(x, DType::kF32, {k31, k31, 4, 1}); }, "dims");
  // an empty outer dimension does not make overflowing strides valid
  expect_arg_error([&] { make_tensor_view(x, DType::kF32, {0, k31 * 4, k31 * 4}); }, "dims");
  const ConstTensorView ok = make_tensor_view(x, DType::kF32, {std::int64_t{1} << 62});
  EXPECT_EQ(ok.numel(), std::int64_t{1} << 62);
}

TEST(MakeTensorViewArgs, NumelOfAHandBuiltViewNeverOverflows) {
  ConstTensorView t;
  t.rank = 3;
  t.shape[0] = t.shape[1] = t.shape[2] = std::int64_t{1} << 30;
  EXPECT_EQ(t.numel(), -1);
  t.shape[2] = -2;
  EXPECT_EQ(t.numel(), -1);
  t.rank = 7;
  EXPECT_EQ(t.numel(), -1);
}

TEST(MakeTensorViewArgs, OneToFourDimensionsAreContiguous) {
  float x[24] = {};
  const ConstTensorView t1 = make_tensor_view(x, DType::kF32, {24});
  EXPECT_EQ(t1.rank, 1);
  EXPECT_EQ(t1.stride[0], 1);
  const ConstTensorView t4 = make_tensor_view(x, DType::kF32, {1, 2, 3, 4});
  EXPECT_EQ(t4.rank, 4);
  EXPECT_EQ(t4.stride[0], 24);
  EXPECT_EQ(t4.stride[1], 12);
  EXPECT_EQ(t4.stride[2], 4);
  EXPECT_EQ(t4.stride[3], 1);
}

// ---- plan_split_layout --------------------------------------------------------------------------

/// Expects `f` to throw an Error whose message starts with `prefix`.
void expect_message_prefix(const std::function<void()>& f, const std::string& prefix) {
  try {
    f();
    ADD_FAILURE() << "no attnstate::Error thrown (expected '" << prefix << "...')";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
  }
}

TEST(PlanSplitLayoutArgs, ErrorsNameTheCallerAndItsArguments) {
  DecodeProblem pr;
  pr.batch = 2;
  pr.heads_q = 4;
  pr.heads_kv = 2;
  pr.head_dim = 64;
  const std::int32_t lens[2] = {100, -3};
  DecodeOptions o;
  expect_message_prefix([&] { plan_split_layout(pr, lens, o, 100, 1); },
                        "attnstate::plan_split_layout: argument 'seq_lens'");
  expect_message_prefix(
      [&] { plan_split_layout(pr, lens, o, 100, 1, "my::plan", "lens_host", "opts"); },
      "my::plan: argument 'lens_host'");
  expect_message_prefix(
      [&] { plan_split_layout(pr, nullptr, o, 100, 1, "my::plan", "lens_host", "opts"); },
      "my::plan: argument 'lens_host'");
  const std::int32_t ok[2] = {100, 3};
  o.policy = SplitPolicy::kFixedSize;
  o.split_size = 8;
  expect_message_prefix([&] { plan_split_layout(pr, ok, o, 100, 1, "my::plan", "l", "opts"); },
                        "my::plan: argument 'opts.split_size'");
  o.split_size = 16;
  const std::int32_t long_lens[2] = {16 * kMaxSplits + 1, 3};
  expect_message_prefix(
      [&] { plan_split_layout(pr, long_lens, o, 100, 1, "my::plan", "l", "opts"); },
      "my::plan: argument 'opts.split_size'");
  o.policy = SplitPolicy::kFixedCount;
  o.num_splits = 0;
  expect_message_prefix([&] { plan_split_layout(pr, ok, o, 100, 1, "my::plan", "l", "opts"); },
                        "my::plan: argument 'opts.num_splits'");
  o.num_splits = kMaxSplits;
  EXPECT_EQ(plan_split_layout(pr, ok, o, 100, 1, "my::plan", "l", "opts").max_splits, kMaxSplits);
}

// ---- decode and cascade output checks (shared by the CPU and the CUDA backends) ----------------

/// A valid decode call's views (2 requests × 1 new token, 4 query heads on 2 KV heads,
/// head_dim 8) in `space`; nothing is dereferenced by the checks.
struct DecodeViews {
  std::vector<float> q = std::vector<float>(2 * 4 * 8);
  std::vector<float> o = std::vector<float>(2 * 4 * 8);
  std::vector<float> lse = std::vector<float>(2 * 4);
  std::vector<float> pool = std::vector<float>(16 * 2 * 8);
  std::vector<std::int32_t> indptr = {0, 1, 1}, indices = {0}, lens = {5, 0};
  MemorySpace space;

  explicit DecodeViews(MemorySpace s) : space(s) {}
  ConstTensorView qv() const {
    return make_tensor_view(q.data(), DType::kF32, {2, 1, 4, 8}, space);
  }
  PagedKvCache kv() const {
    PagedKvCache kv;
    kv.k = kv.v = pool.data();
    kv.dtype = DType::kF32;
    kv.num_pages = 1;
    kv.page_size = 16;
    kv.heads_kv = 2;
    kv.head_dim = 8;
    kv.page_indptr = indptr.data();
    kv.page_indices = indices.data();
    kv.seq_lens = lens.data();
    kv.batch = 2;
    kv.space = space;
    return kv;
  }
  StateView out() {
    return make_state_view(o.data(), DType::kF32, lse.data(), 2, 4, 8, LseBase::kNatural, space);
  }
  void validate(const ConstTensorView& q_view, const StateView& out_view) const {
    detail::validate_decode_args("fn", q_view, kv(), out_view, space);
  }
};

constexpr MemorySpace kBothSpaces[] = {MemorySpace::kHost, MemorySpace::kDevice};

TEST(DecodeOutputArgs, ValidViewsAndStridedSubViewsPass) {
  for (MemorySpace sp : kBothSpaces) {
    DecodeViews d(sp);
    EXPECT_NO_THROW(d.validate(d.qv(), d.out()));
    // A strided view of a larger buffer (e.g. a cascade level's partial states).
    std::vector<float> big(2 * 4 * 24 + 7), big_lse(2 * 4 * 3);
    StateView sub = d.out();
    sub.o = big.data() + 7;
    sub.o_stride_head = 24;
    sub.o_stride_token = 4 * 24;
    sub.lse = big_lse.data();
    sub.lse_stride_head = 3;
    sub.lse_stride_token = 12;
    EXPECT_NO_THROW(d.validate(d.qv(), sub));
    // One token: its stride is never used, any value is fine.
    ConstTensorView q1 = d.qv();
    q1.shape[0] = 1;
    PagedKvCache kv1 = d.kv();
    kv1.batch = 1;
    StateView o1 = d.out();
    o1.tokens = 1;
    o1.o_stride_token = 0;
    o1.lse_stride_token = 0;
    EXPECT_NO_THROW(detail::validate_decode_args("fn", q1, kv1, o1, sp));
  }
}

TEST(DecodeOutputArgs, OverlappingRowsAreRejectedInBothSpaces) {
  for (MemorySpace sp : kBothSpaces) {
    DecodeViews d(sp);
    StateView out = d.out();
    out.o_stride_token = 0;
    expect_arg_error([&] { d.validate(d.qv(), out); }, "out.o_stride_token");
    out = d.out();
    out.o_stride_head = 7;
    expect_arg_error([&] { d.validate(d.qv(), out); }, "out.o_stride_head");
    out = d.out();
    out.lse_stride_token = 2;
    expect_arg_error([&] { d.validate(d.qv(), out); }, "out.lse_stride_token");
    out = d.out();
    out.lse_stride_head = 0;
    expect_arg_error([&] { d.validate(d.qv(), out); }, "out.lse_stride_head");
  }
}

TEST(DecodeOutputArgs, NegativeStridesAreNamedExactly) {
  for (MemorySpace sp : kBothSpaces) {
    DecodeViews d(sp);
    StateView out = d.out();
    out.o_stride_head = -8;
    expect_arg_error([&] { d.validate(d.qv(), out); }, "out.o_stride_head");
    out = d.out();
    out.lse_stride_head = -1;
    expect_arg_error([&] { d.validate(d.qv(), out); }, "out.lse_stride_head");
    for (int dim = 0; dim < 3; ++dim) {
      ConstTensorView q = d.qv();
      q.stride[dim] = -1;
      expect_arg_error([&] { d.validate(q, d.out()); }, "q.stride[" + std::to_string(dim) + "]");
    }
  }
}

TEST(DecodeOutputArgs, OverflowingSpansAreRejected) {
  DecodeViews d(MemorySpace::kHost);
  StateView out = d.out();
  out.o_stride_token = std::int64_t{1} << 62;
  expect_arg_error([&] { d.validate(d.qv(), out); }, "out.o_stride_token");
  ConstTensorView q = d.qv();
  q.stride[1] = std::int64_t{1} << 62;
  q.shape[1] = 2;
  StateView out2 = d.out();
  std::vector<float> o4(4 * 4 * 8), l4(4 * 4);
  out2 = make_state_view(o4.data(), DType::kF32, l4.data(), 4, 4, 8, LseBase::kNatural);
  expect_arg_error([&] { d.validate(q, out2); }, "q.stride[1]");
}

TEST(DecodeOutputArgs, OutputOverlappingTheQueriesIsRejected) {
  for (MemorySpace sp : kBothSpaces) {
    DecodeViews d(sp);
    StateView out = d.out();
    out.o = d.q.data() + 8;
    expect_arg_error([&] { d.validate(d.qv(), out); }, "out.o");
    out = d.out();
    out.lse = d.q.data() + d.q.size() - 2;
    expect_arg_error([&] { d.validate(d.qv(), out); }, "out.lse");
  }
}

TEST(DecodeArgs, InvalidLayoutAndMisalignedPointersAreNamed) {
  for (MemorySpace sp : kBothSpaces) {
    DecodeViews d(sp);
    PagedKvCache kv = d.kv();
    kv.layout = static_cast<KvLayout>(5);
    expect_arg_error([&] { detail::validate_decode_args("fn", d.qv(), kv, d.out(), sp); },
                     "kv.layout");
    kv = d.kv();
    kv.v = reinterpret_cast<const char*>(kv.v) + 2;
    expect_arg_error([&] { detail::validate_decode_args("fn", d.qv(), kv, d.out(), sp); }, "kv.v");
    kv = d.kv();
    kv.seq_lens =
        reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(d.lens.data()) + 1);
    expect_arg_error([&] { detail::validate_decode_args("fn", d.qv(), kv, d.out(), sp); },
                     "kv.seq_lens");
    ConstTensorView q = d.qv();
    q.data = reinterpret_cast<const char*>(q.data) + 2;
    expect_arg_error([&] { d.validate(q, d.out()); }, "q.data");
  }
}

TEST(DecodeArgs, OutputOverTheCacheOrItsTablesIsRejected) {
  for (MemorySpace sp : kBothSpaces) {
    DecodeViews d(sp);
    StateView out = d.out();
    out.o = d.pool.data() + 8;  // out over the K/V pool
    expect_arg_error([&] { d.validate(d.qv(), out); }, "out.o");
    out = d.out();
    out.lse = reinterpret_cast<float*>(d.lens.data());  // over seq_lens
    expect_arg_error([&] { d.validate(d.qv(), out); }, "out.lse");
  }
}

TEST(DecodeArgs, Fp8KvScalesAreCheckedAndNamed) {
  for (MemorySpace sp : kBothSpaces) {
    DecodeViews d(sp);
    const auto check = [&](const PagedKvCache& kv) {
      detail::validate_decode_args("fn", d.qv(), kv, d.out(), sp);
    };
    std::vector<float> scales = {0.5f, 2.f, 4.f};
    // a scale on a cache that is not fp8 would be ignored: refused
    PagedKvCache kv = d.kv();
    kv.k_scale = KvScale::per_tensor(2.f);
    expect_arg_error([&] { check(kv); }, "kv.k_scale");
    kv = d.kv();
    kv.v_scale = KvScale::per_head(scales.data());
    expect_arg_error([&] { check(kv); }, "kv.v_scale");
    // every kind of scale of an fp8 cache passes
    const PagedKvCache fp8 = [&] {
      PagedKvCache c = d.kv();
      c.dtype = DType::kE4M3;
      return c;
    }();
    for (const KvScale& s :
         {KvScale{}, KvScale::per_tensor(0x1p-10f), KvScale::per_tensor_at(scales.data()),
          KvScale::per_head(scales.data()), KvScale::per_head(scales.data(), 2),
          KvScale{1.f, scales.data(), 0}}) {
      kv = fp8;
      kv.k_scale = kv.v_scale = s;
      EXPECT_NO_THROW(check(kv));
    }
    for (float bad : {0.f, -1.f, NAN, INFINITY, -0.f}) {
      kv = fp8;
      kv.k_scale = KvScale::per_tensor(bad);
      expect_arg_error([&] { check(kv); }, "kv.k_scale.value");
    }
    kv = fp8;
    kv.v_scale.head_stride = 1;  // a stride without data
    expect_arg_error([&] { check(kv); }, "kv.v_scale.head_stride");
    kv = fp8;
    kv.v_scale = KvScale::per_tensor_at(scales.data());
    kv.v_scale.value = 2.f;  // a value beside a pointer: which one is the scale?
    expect_arg_error([&] { check(kv); }, "kv.v_scale.value");
    kv = fp8;
    kv.k_scale = KvScale::per_head(scales.data(), -1);
    expect_arg_error([&] { check(kv); }, "kv.k_scale.head_stride");
    kv.k_scale = KvScale::per_head(scales.data(), std::int64_t{1} << 61);  // span past 2^62 bytes
    expect_arg_error([&] { check(kv); }, "kv.k_scale.head_stride");
    kv.k_scale = KvScale::per_head(
        reinterpret_cast<const float*>(reinterpret_cast<const char*>(scales.data()) + 2));
    expect_arg_error([&] { check(kv); }, "kv.k_scale.data");
    // the scales are inputs: out must not overlap them
    kv = fp8;
    kv.v_scale = KvScale::per_head(d.lse.data() + 2);
    if (sp == MemorySpace::kHost) d.lse[2] = d.lse[3] = 1.f;
    expect_arg_error([&] { check(kv); }, "out.lse");
    // pointed-to scales are read on the host (the CPU backend's memory) only
    std::vector<float> bad = {1.f, 0.f, NAN, 1.f};
    kv = fp8;
    kv.v_scale = KvScale::per_head(bad.data());
    kv.k_scale = KvScale::per_tensor_at(bad.data() + 2);
    if (sp == MemorySpace::kHost) {
      expect_arg_error([&] { check(kv); }, "kv.k_scale.data[0]");
      kv.k_scale = KvScale::per_head(bad.data(), 3);  // heads at [0] and [3]: both fine
      expect_arg_error([&] { check(kv); }, "kv.v_scale.data[1]");
    } else {
      EXPECT_NO_THROW(check(kv));  // device scales are read by the kernels, never here
    }
    // fp8 queries: not supported (fp8 is for the cache)
    ConstTensorView q = d.qv();
    q.dtype = DType::kE5M2;
    expect_arg_error([&] { detail::validate_decode_args("fn", q, fp8, d.out(), sp); }, "q.dtype",
                     Status::kNotSupported);
    expect_arg_error([&] { detail::check_cascade_query("fn", q, fp8, sp); }, "q.dtype",
                     Status::kNotSupported);
    kv = fp8;
    kv.k_scale = KvScale::per_tensor(NAN);
    expect_arg_error([&] { detail::check_cascade_pool("fn", kv, sp); }, "kv.k_scale.value");
  }
}

TEST(DecodeOutputArgs, OutputInTheWrongSpaceIsRejected) {
  DecodeViews d(MemorySpace::kDevice);
  StateView out = d.out();
  out.space = MemorySpace::kHost;
  expect_arg_error([&] { d.validate(d.qv(), out); }, "out.space");
}

TEST(CascadeOutputArgs, OverlappingRowsAndNegativeStridesAreNamedInBothSpaces) {
  for (MemorySpace sp : kBothSpaces) {
    std::vector<float> o(3 * 2 * 8), lse(3 * 2);
    const StateView good =
        make_state_view(o.data(), DType::kBF16, lse.data(), 3, 2, 8, LseBase::kBase2, sp);
    const auto check = [&](const StateView& v) { detail::check_cascade_out("fn", v, 3, 2, 8, sp); };
    EXPECT_NO_THROW(check(good));
    StateView out = good;
    out.o_stride_token = 0;
    expect_arg_error([&] { check(out); }, "out.o_stride_token");
    out = good;
    out.lse_stride_head = 0;
    expect_arg_error([&] { check(out); }, "out.lse_stride_head");
    out = good;
    out.o_stride_head = -1;
    expect_arg_error([&] { check(out); }, "out.o_stride_head");
    out = good;
    out.lse_stride_token = -1;
    expect_arg_error([&] { check(out); }, "out.lse_stride_token");
  }
}

TEST(CascadeOutputArgs, OutputOverlappingTheQueriesIsRejectedWhenGiven) {
  std::vector<std::uint16_t> q(3 * 2 * 8);
  const ConstTensorView qv = make_tensor_view(q.data(), DType::kBF16, {3, 1, 2, 8});
  std::vector<float> lse(3 * 2);
  const StateView out =
      make_state_view(q.data() + 8, DType::kBF16, lse.data(), 3, 2, 8, LseBase::kNatural);
  EXPECT_NO_THROW(detail::check_cascade_out("fn", out, 3, 2, 8, MemorySpace::kHost));
  expect_arg_error([&] { detail::check_cascade_out("fn", out, 3, 2, 8, MemorySpace::kHost, &qv); },
                   "out.o");
}

// ---- threads ----------------------------------------------------------------------------------

TEST(ThreadCountArgs, NegativeThreadCountIsRejected) {
  expect_arg_error([] { cpu::set_num_threads(-2); }, "n");
}

}  // namespace
}  // namespace attnstate
