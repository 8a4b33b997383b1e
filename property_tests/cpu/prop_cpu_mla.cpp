/// @file prop_cpu_mla.cpp
/// @brief RapidCheck properties of the CPU MLA decode (≥ 500 cases each): on random paged latent
///        caches (any page size, CSR or block table, every cache dtype, fp8 with its scales, both
///        peer layouts) it equals the kit's double reference for any split layout and equals
///        the one-split state to rounding; key shards merged with `merge_states`, the sink merged
///        once, equal the one-pass state with sinks.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnstate/cpu/merge.hpp"
#include "attnstate/cpu/mla.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "mla_problem.hpp"
#include "rc_defaults.hpp"
#include "split_layout_gen.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=500");

namespace {

using namespace attnstate;
using attnstate::testing::HostState;
using attnstate_test::make_mla_host;
using attnstate_test::MlaConfig;
using attnstate_test::MlaHost;

/// A random small paged problem (small widths mostly: the reference's cost grows with them).
MlaHost random_problem(std::int64_t q_len_max = 4) {
  MlaConfig cfg;
  const auto widths = *rc::gen::element(std::pair<std::int64_t, std::int64_t>{16, 8},
                                        std::pair<std::int64_t, std::int64_t>{64, 16},
                                        std::pair<std::int64_t, std::int64_t>{512, 64});
  cfg.kv_lora_rank = widths.first;
  cfg.rope_dim = widths.second;
  cfg.q_len = *rc::gen::inRange<std::int64_t>(1, q_len_max + 1);
  cfg.heads = *rc::gen::element<std::int64_t>(1, 2, 16);
  cfg.page_size = *rc::gen::element<std::int64_t>(1, 3, 16, 64);
  cfg.block_table = *rc::gen::arbitrary<bool>();
  cfg.q_dtype = *rc::gen::element(DType::kF32, DType::kBF16);
  const auto dtypes = *rc::gen::element(std::pair<DType, DType>{DType::kF32, DType::kF32},
                                        std::pair<DType, DType>{DType::kBF16, DType::kBF16},
                                        std::pair<DType, DType>{DType::kF16, DType::kF16},
                                        std::pair<DType, DType>{DType::kE4M3, DType::kBF16},
                                        std::pair<DType, DType>{DType::kE5M2, DType::kE5M2});
  cfg.ckv_dtype = dtypes.first;
  cfg.kpe_dtype = dtypes.second;
  if (is_fp8(cfg.ckv_dtype)) {
    cfg.kv_amp = *rc::gen::element(1.f, cfg.ckv_dtype == DType::kE4M3 ? 224.f : 28672.f);
    cfg.ckv_scale = *rc::gen::element(1.f, 0x1p-10f, 0x1p8f, 0.37f);
    cfg.kpe_scale = *rc::gen::element(1.f, 0x1p-10f, 0.37f);
    cfg.scale_pointer = *rc::gen::arbitrary<bool>();
  }
  cfg.q_gain = *rc::gen::element(1.f, 8.f, 40.f);
  const int batch = *rc::gen::inRange(1, 4);
  for (int b = 0; b < batch; ++b) cfg.seq_lens.push_back(*rc::gen::inRange(0, 150));
  return make_mla_host(cfg, *rc::gen::arbitrary<std::uint32_t>());
}

/// The decode of `h` (f32, natural) with `layout`, in either cache layout, poisoned first.
HostState run(const MlaHost& h, const SplitLayout& layout, bool one_pool) {
  HostState out(h.tokens(), h.cfg.heads, h.cfg.kv_lora_rank, DType::kF32, LseBase::kNatural);
  out.poison();
  cpu::mla_decode(h.q_nope_view(), h.q_pe_view(), h.kv_view(one_pool), layout, h.problem.scale,
                  h.problem.attention_sinks(), out.view());
  return out;
}

/// The kit's tolerance of `h` for an f32 output in natural base, fp32 probabilities.
attnstate::testing::Tolerance tolerance(const MlaHost& h) {
  attnstate::testing::MlaProblem p = h.problem;
  p.out_dtype = DType::kF32;
  p.base = LseBase::kNatural;
  return attnstate::testing::tolerance_for(p, false);
}

// Any split layout, either cache layout: the double-precision reference, and the one-split state
// to rounding (both against the reference first: two runs compared only with each other could
// share an error).
RC_GTEST_PROP(MlaProps, AnySplitLayoutMatchesTheReferenceAndOneSplit, ()) {
  const MlaHost h = random_problem();
  const SplitLayout l = attnstate_test::random_split_layout(150);
  const bool one_pool = *rc::gen::arbitrary<bool>();
  SplitLayout one;
  one.policy = SplitPolicy::kFixedCount;
  const HostState a = run(h, l, one_pool);
  const HostState b = run(h, one, one_pool);
  const attnstate::testing::ReferenceState ref = h.reference(LseBase::kNatural);
  const attnstate::testing::Tolerance tol = tolerance(h);
  RC_ASSERT(attnstate::testing::compare_states(a, ref, tol) == "");
  RC_ASSERT(attnstate::testing::compare_states(b, ref, tol) == "");
  RC_ASSERT(attnstate::testing::compare_states(a, b, tol.scaled(2)) == "");
}

// Random page-aligned shards of every request's keys (one new token per request: every row sees
// a whole shard), each decoded alone (sink-free, each in a random LSE base, rebased for the
// stack), merged with merge_states in shard order, the sink state merged once: the one-pass state
// with sinks, to rounding.
RC_GTEST_PROP(MlaProps, ShardsMergedWithMergeStatesEqualOnePass, ()) {
  MlaHost h = random_problem(1);
  const std::int64_t T = h.tokens(), H = h.cfg.heads, L = h.cfg.kv_lora_rank;
  const std::int64_t P = h.cfg.page_size;
  const int S = *rc::gen::inRange(1, 4);
  // cut points per request: S + 1 non-decreasing page multiples from 0 to len
  std::vector<std::vector<std::int32_t>> cuts(static_cast<std::size_t>(S + 1),
                                              std::vector<std::int32_t>(h.batch));
  for (std::int64_t b = 0; b < h.batch; ++b) {
    const std::int32_t len = h.seq_lens[b];
    const auto pages = static_cast<std::int32_t>((len + P - 1) / P);
    std::vector<std::int32_t> at = {0};
    for (int s = 1; s < S; ++s) at.push_back(*rc::gen::inRange(0, pages + 1));
    std::sort(at.begin(), at.end());
    for (int s = 0; s < S; ++s) cuts[s][b] = std::min<std::int32_t>(len, at[s] * P);
    cuts[S][b] = len;
  }
  std::vector<float> o(static_cast<std::size_t>(std::max<std::int64_t>(1, S * T * H * L)), NAN);
  std::vector<float> lse(static_cast<std::size_t>(std::max<std::int64_t>(1, S * T * H)), NAN);
  for (int s = 0; s < S; ++s) {
    std::int64_t stride = 1;
    for (std::int64_t b = 0; b < h.batch; ++b)
      stride = std::max<std::int64_t>(stride, (cuts[s + 1][b] - cuts[s][b] + P - 1) / P);
    std::vector<std::int32_t> table(static_cast<std::size_t>(h.batch * stride), 0), lens;
    for (std::int64_t b = 0; b < h.batch; ++b) {
      lens.push_back(cuts[s + 1][b] - cuts[s][b]);
      for (std::int64_t p = 0; p * P < lens.back(); ++p)
        table[b * stride + p] = static_cast<std::int32_t>(h.page(b, cuts[s][b] / P + p));
    }
    MlaKvCache kv = h.kv_view(*rc::gen::arbitrary<bool>());
    kv.page_indptr = nullptr;
    kv.page_indices = nullptr;
    kv.block_table = table.data();
    kv.block_table_stride = stride;
    kv.seq_lens = lens.data();
    const LseBase base = *rc::gen::element(LseBase::kNatural, LseBase::kBase2);
    StateView part =
        make_state_view(&o[s * T * H * L], DType::kF32, &lse[s * T * H], T, H, L, base);
    cpu::mla_decode(h.q_nope_view(), h.q_pe_view(), kv, attnstate_test::random_split_layout(150),
                    h.problem.scale, part);
    if (base == LseBase::kBase2)
      for (std::int64_t i = s * T * H; i < (s + 1) * T * H; ++i) lse[i] *= 0.6931471805599453f;
  }
  HostState merged(T, H, L, DType::kF32, LseBase::kNatural);
  merged.poison();
  cpu::merge_states(make_state_stack(o.data(), DType::kF32, lse.data(), StackOrder::kStatesMajor, T,
                                     S, H, L, LseBase::kNatural),
                    merged.view());
  // sinks in about half the cases, merged once after the shards
  if (*rc::gen::arbitrary<bool>()) {
    h.problem.sinks.resize(static_cast<std::size_t>(H));
    for (float& x : h.problem.sinks) x = static_cast<float>(*rc::gen::inRange(-40, 121)) / 10.f;
    std::vector<float> sink_lse(static_cast<std::size_t>(T * H));
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t hd = 0; hd < H; ++hd) sink_lse[t * H + hd] = h.problem.sinks[hd];
    const std::vector<float> zeros(static_cast<std::size_t>(L), 0.f);
    ConstStateView sink = make_const_state_view(zeros.data(), DType::kF32, sink_lse.data(), T, H, L,
                                                LseBase::kNatural);
    sink.o_stride_token = 0;
    sink.o_stride_head = 0;
    cpu::merge_state_inplace(merged.view(), sink);
  }
  SplitLayout one;
  one.policy = SplitPolicy::kFixedCount;
  const HostState whole = run(h, one, false);
  const attnstate::testing::Tolerance tol = tolerance(h);
  RC_ASSERT(attnstate::testing::compare_states(whole, h.reference(LseBase::kNatural), tol) == "");
  RC_ASSERT(attnstate::testing::compare_states(merged, h.reference(LseBase::kNatural), tol) == "");
  RC_ASSERT(attnstate::testing::compare_states(merged, whole, tol.scaled(2)) == "");
}

}  // namespace
