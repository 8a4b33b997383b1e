// The context-parallel merge plan (core/context_parallel.hpp) and the CPU simulation of every rank
// (cpu/context_parallel.hpp): the packing, head slicing and merges the NCCL run shares, for 1 to 8
// ranks, uneven head counts, empty shards, mixed bases and NaN garbage in empty states; the
// all-to-all algorithm bitwise against merge_states of the ranks' states, the all-gather one
// against the kit's double reference; sinks merged once; named errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/context_parallel.hpp"
#include "attnstate/cpu/context_parallel.hpp"
#include "attnstate/cpu/merge.hpp"
#include "cp_shape.hpp"
#include "cpu_test_utils.hpp"

namespace attnstate {
namespace test {
namespace {

// The shape with every field given (tests/common/cp_shape.hpp).
CpMergeShape shape_of(int n, int rank, std::int64_t tokens, std::int64_t heads,
                      std::int64_t head_dim, DType dtype, DType out_dtype, LseBase wire,
                      CpAlgorithm algo, CpOutput output) {
  return attnstate_test::cp_shape(n, rank, tokens, heads, head_dim, dtype, out_dtype, wire, algo,
                                  output);
}

std::vector<CpMergePlan> plans_for(const CpMergeShape& s) {
  std::vector<CpMergePlan> plans;
  for (int r = 0; r < s.world_size; ++r) {
    CpMergeShape rs = s;
    rs.rank = r;
    plans.push_back(plan_cp_merge(rs));
  }
  return plans;
}

// The kit's double reference of the merge of `locals` (optionally with the sink states) over
// heads [h0, h0 + h).
RefState reference(const std::vector<OwnedState>& locals, std::int64_t h0, std::int64_t h,
                   const std::vector<float>* sinks) {
  const StateLayout& l = locals[0].layout;
  RefState ref = make_ref(l.tokens, h, l.head_dim);
  for (std::int64_t t = 0; t < l.tokens; ++t)
    for (std::int64_t j = 0; j < h; ++j) {
      std::vector<double> lses;
      for (const OwnedState& s : locals) lses.push_back(s.lse_nat(t, h0 + j));
      if (sinks) lses.push_back((*sinks)[static_cast<std::size_t>(h0 + j)]);
      double m = -INFINITY;
      for (double x : lses) m = std::max(m, x);
      if (m == -INFINITY) {
        ref_lse(ref, t, j) = -INFINITY;
        for (std::int64_t d = 0; d < l.head_dim; ++d) ref_o(ref, t, j, d) = 0;
        continue;
      }
      double sum = 0;
      for (double x : lses) sum += std::exp(x - m);
      ref_lse(ref, t, j) = m + std::log(sum);
      for (std::int64_t d = 0; d < l.head_dim; ++d) {
        double acc = 0;
        for (std::size_t i = 0; i < locals.size(); ++i)
          if (lses[i] != -INFINITY) acc += std::exp(lses[i] - m) * locals[i].o_at(t, h0 + j, d);
        ref_o(ref, t, j, d) = acc / sum;
      }
    }
  return ref;
}

struct Case {
  CpMergeShape shape;
  std::vector<OwnedState> locals, outs;
  std::vector<LseBase> out_bases;
};

// Random locals (padded strides, a third of the rows empty with NaN garbage, or whole empty
// shards) and poisoned outputs for every rank.
Case make_case(std::mt19937& rng, const CpMergeShape& s, bool mixed_bases) {
  Case c;
  c.shape = s;
  std::uniform_int_distribution<int> coin(0, 3);
  const std::vector<CpMergePlan> plans = plans_for(s);
  for (int r = 0; r < s.world_size; ++r) {
    const LseBase base = mixed_bases ? random_base(rng) : s.wire_base;
    c.locals.push_back(
        make_state(s.tokens, s.heads, s.head_dim, s.dtype, base, random_padding(rng)));
    fill_random(c.locals.back(), rng, -6, 6, coin(rng) == 0 ? 1.0 : 0.3);  // some shards empty
    const LseBase ob = random_base(rng);
    c.out_bases.push_back(ob);
    c.outs.push_back(make_state(s.tokens, plans[static_cast<std::size_t>(r)].out_heads(),
                                s.head_dim, s.out_dtype, ob, random_padding(rng)));
  }
  return c;
}

void run(Case& c, const std::vector<float>* sinks = nullptr) {
  std::vector<ConstStateView> locals;
  std::vector<StateView> outs;
  for (auto& l : c.locals) locals.push_back(l.cview());
  for (auto& o : c.outs) outs.push_back(o.view());
  AttentionSinks sk;
  if (sinks) sk.logits = sinks->data();
  cpu::cp_merge_simulated(plans_for(c.shape), locals, outs, sk);
}

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(CpMergePlan, HeadSlicesCoverEveryHeadOnceAndDifferByAtMostOne) {
  for (int n = 1; n <= 8; ++n)
    for (std::int64_t heads = n; heads <= n + 9; ++heads) {
      const CpMergePlan p =
          plan_cp_merge(shape_of(n, 0, 3, heads, 8, DType::kBF16, DType::kBF16, LseBase::kNatural,
                                 CpAlgorithm::kAllToAll, CpOutput::kHeadSharded));
      std::int64_t next = 0, lo = heads, hi = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(p.head_begin(r), next);
        next = p.head_end(r);
        lo = std::min(lo, p.heads_of(r));
        hi = std::max(hi, p.heads_of(r));
      }
      EXPECT_EQ(next, heads);
      EXPECT_GE(lo, 1);
      EXPECT_LE(hi - lo, 1) << n << " ranks, " << heads << " heads";
    }
}

TEST(CpMergePlan, RegionsAreAlignedDisjointAndInsideTheWorkspace) {
  for (CpAlgorithm a : {CpAlgorithm::kAllToAll, CpAlgorithm::kAllGatherLse})
    for (CpOutput o : {CpOutput::kHeadSharded, CpOutput::kReplicated})
      for (int n : {1, 2, 3, 8})
        for (int rank = 0; rank < n; ++rank) {
          const std::int64_t heads = a == CpAlgorithm::kAllGatherLse ? 2 * n : n + 3;
          const CpMergePlan p = plan_cp_merge(
              shape_of(n, rank, 5, heads, 24, DType::kF16, DType::kBF16, LseBase::kBase2, a, o));
          struct R {
            std::int64_t at, bytes;
          };
          std::vector<R> rs{{p.zeros_offset, 24 * 4}};
          if (a == CpAlgorithm::kAllToAll) {
            rs.push_back({p.send_offset, p.send_bytes});
            rs.push_back({p.recv_offset, p.recv_bytes});
            EXPECT_EQ(p.recv_bytes, n * p.chunk_bytes(p.heads_of(rank), DType::kF16));
            EXPECT_EQ(p.send_bytes, p.send_chunk_offset(n));
            if (o == CpOutput::kReplicated) {
              rs.push_back({p.mine_offset, p.chunk_bytes(p.heads_of(rank), DType::kBF16)});
              rs.push_back({p.gather_offset, p.gather_bytes});
            }
          } else {
            rs.push_back({p.o32_offset, 5 * heads * 24 * 4});
            rs.push_back({p.lse_offset, 5 * heads * 4});
            rs.push_back({p.gathered_offset, n * 5 * heads * 4});
            rs.push_back({p.lse_merged_offset, 5 * heads * 4});
            rs.push_back({p.scaled_offset, p.scaled_bytes});
            if (o == CpOutput::kHeadSharded)
              rs.push_back({p.sum_offset, 5 * p.heads_of(rank) * 24 * 4});
          }
          for (std::size_t i = 0; i < rs.size(); ++i) {
            EXPECT_EQ(rs[i].at % 256, 0);
            EXPECT_LE(rs[i].at + rs[i].bytes, p.workspace_bytes);
            for (std::size_t j = 0; j < i; ++j)
              EXPECT_TRUE(rs[i].at >= rs[j].at + rs[j].bytes || rs[j].at >= rs[i].at + rs[i].bytes)
                  << "regions " << i << " and " << j << " overlap: " << to_string(p);
          }
        }
}

TEST(CpMergePlan, WireBytesAndDescription) {
  const CpMergePlan p =
      plan_cp_merge(shape_of(4, 1, 16, 32, 128, DType::kBF16, DType::kBF16, LseBase::kNatural,
                             CpAlgorithm::kAllToAll, CpOutput::kHeadSharded));
  // three peers, each 16 tokens x 8 heads x (128 x 2 + 4) bytes
  EXPECT_EQ(p.wire_bytes_sent, 3 * 16 * 8 * (128 * 2 + 4));
  const std::string d = to_string(p);
  EXPECT_NE(d.find("all_to_all head_sharded: rank 1 of 4"), std::string::npos) << d;
  EXPECT_NE(d.find("heads 8..16"), std::string::npos) << d;
  EXPECT_NE(d.find(std::to_string(p.workspace_bytes)), std::string::npos) << d;
}

TEST(CpMergePlan, BadShapesAreNamed) {
  const CpMergeShape ok = shape_of(4, 0, 2, 8, 16, DType::kBF16, DType::kF32, LseBase::kNatural,
                                   CpAlgorithm::kAllToAll, CpOutput::kHeadSharded);
  const auto bad = [&](auto edit, const char* arg) {
    CpMergeShape s = ok;
    edit(s);
    expect_arg_error([&] { plan_cp_merge(s); }, arg);
  };
  bad([](CpMergeShape& s) { s.world_size = 0; }, "shape.world_size");
  bad([](CpMergeShape& s) { s.world_size = kMaxCpWorldSize + 1; }, "shape.world_size");
  bad([](CpMergeShape& s) { s.rank = 4; }, "shape.rank");
  bad([](CpMergeShape& s) { s.rank = -1; }, "shape.rank");
  bad([](CpMergeShape& s) { s.tokens = -1; }, "shape.tokens");
  bad([](CpMergeShape& s) { s.heads = 3; }, "shape.heads");
  bad([](CpMergeShape& s) { s.head_dim = 0; }, "shape.head_dim");
  bad([](CpMergeShape& s) { s.dtype = static_cast<DType>(9); }, "shape.dtype");
  bad([](CpMergeShape& s) { s.wire_base = static_cast<LseBase>(7); }, "shape.wire_base");
  bad([](CpMergeShape& s) { s.algorithm = static_cast<CpAlgorithm>(5); }, "shape.algorithm");
  bad([](CpMergeShape& s) { s.output = static_cast<CpOutput>(5); }, "shape.output");
  bad(
      [](CpMergeShape& s) {
        s.algorithm = CpAlgorithm::kAllGatherLse;
        s.heads = 10;
      },
      "shape.heads");
  bad([](CpMergeShape& s) { s.tokens = std::int64_t{1} << 56; }, "shape.tokens");
  bad(
      [](CpMergeShape& s) {
        s.tokens = 0;  // no bytes, but the head slices' bounds would overflow
        s.heads = std::int64_t{1} << 61;
      },
      "shape.heads");
  bad([](CpMergeShape& s) { s.head_dim = std::int64_t{1} << 61; }, "shape.tokens");
  expect_arg_error(
      [&] {
        CpMergeShape s = ok;
        s.dtype = DType::kE4M3;
        plan_cp_merge(s);
      },
      "shape.dtype", Status::kNotSupported);
  CpMergeShape other = ok;
  other.head_dim = 32;
  expect_arg_error([&] { check_cp_plans_agree(ok, other, 2); }, "plans[2].shape.head_dim");
  other = ok;
  other.algorithm = CpAlgorithm::kAllGatherLse;
  expect_arg_error([&] { check_cp_plans_agree(ok, other, 3); }, "plans[3].shape.algorithm");
}

// kAllToAll: every rank's output is bitwise merge_states over the stack of the ranks' states
// (in the wire base), on that rank's heads; with kReplicated, then rebased to the output's base.
TEST(CpMergeSimulated, AllToAllIsBitwiseMergeStatesOfTheRanks) {
  std::mt19937 rng(20261202);
  for (int n = 1; n <= 8; ++n)
    for (int trial = 0; trial < 6; ++trial) {
      const std::int64_t heads = n + std::uniform_int_distribution<int>(0, 5)(rng);
      const std::int64_t tokens = std::uniform_int_distribution<int>(0, 3)(rng);
      const std::int64_t dim = trial % 3 == 0 ? 1 : (trial % 3 == 1 ? 8 : 64);
      const DType dt = kDtypes[trial % 3], odt = kDtypes[(trial + n) % 3];
      const CpOutput output = trial % 2 ? CpOutput::kReplicated : CpOutput::kHeadSharded;
      const CpMergeShape s = shape_of(n, 0, tokens, heads, dim, dt, odt, random_base(rng),
                                      CpAlgorithm::kAllToAll, output);
      SCOPED_TRACE(to_string(plan_cp_merge(s)));
      Case c = make_case(rng, s, false);
      run(c);
      // the stack [n, tokens, heads, dim] of the locals, as the receiving ranks see it
      std::vector<unsigned char> o(
          static_cast<std::size_t>(n * tokens * heads * dim) * size_of(dt) + 1);
      std::vector<float> lse(static_cast<std::size_t>(n * tokens * heads) + 1);
      for (int r = 0; r < n; ++r) {
        StateView slot =
            make_state_view(o.data() + r * tokens * heads * dim * size_of(dt), dt,
                            lse.data() + r * tokens * heads, tokens, heads, dim, s.wire_base);
        cpu::rebase(c.locals[static_cast<std::size_t>(r)].cview(), slot);
      }
      const std::vector<CpMergePlan> plans = plans_for(s);
      for (int r = 0; r < n; ++r) {
        const CpMergePlan& p = plans[static_cast<std::size_t>(r)];
        const std::int64_t h0 = output == CpOutput::kHeadSharded ? p.head_begin(r) : 0;
        const std::int64_t h = p.out_heads();
        ConstStateStackView stack = make_state_stack(
            o.data(), dt, lse.data(), StackOrder::kStatesMajor, tokens, n, heads, dim, s.wire_base);
        OwnedState want = make_state(tokens, h, dim, odt, c.out_bases[static_cast<std::size_t>(r)]);
        if (output == CpOutput::kHeadSharded) {
          stack.o = static_cast<const unsigned char*>(stack.o) + h0 * dim * size_of(dt);
          stack.lse += h0;
          stack.heads = h;
          cpu::merge_states(stack, want.view());
        } else {  // each rank's slice merged in the wire base, then rebased
          OwnedState mid = make_state(tokens, h, dim, odt, s.wire_base);
          for (int q = 0; q < n; ++q) {
            ConstStateStackView part = stack;
            part.o =
                static_cast<const unsigned char*>(stack.o) + p.head_begin(q) * dim * size_of(dt);
            part.lse += p.head_begin(q);
            part.heads = p.heads_of(q);
            StateView mv = mid.view();
            mv.o = static_cast<unsigned char*>(mv.o) + p.head_begin(q) * dim * size_of(odt);
            mv.lse += p.head_begin(q);
            mv.heads = p.heads_of(q);
            cpu::merge_states(part, mv);
          }
          cpu::rebase(mid.cview(), want.view());
        }
        const OwnedState& got = c.outs[static_cast<std::size_t>(r)];
        EXPECT_TRUE(bitwise_equal(got, want)) << "rank " << r;
        expect_matches(got, reference(c.locals, h0, h, nullptr), o_tolerance(odt),
                       "rank " + std::to_string(r));
      }
    }
}

TEST(CpMergeSimulated, BothAlgorithmsMatchTheReferenceWithMixedBasesAndEmptyShards) {
  std::mt19937 rng(7);
  for (CpAlgorithm a : {CpAlgorithm::kAllToAll, CpAlgorithm::kAllGatherLse})
    for (CpOutput output : {CpOutput::kHeadSharded, CpOutput::kReplicated})
      for (int n : {1, 2, 3, 5, 8})
        for (int trial = 0; trial < 3; ++trial) {
          const std::int64_t per = std::uniform_int_distribution<int>(1, 3)(rng);
          const std::int64_t heads =
              a == CpAlgorithm::kAllGatherLse && output == CpOutput::kHeadSharded ? n * per
                                                                                  : n + per;
          const DType dt = kDtypes[trial], odt = kDtypes[(trial + 1) % 3];
          const CpMergeShape s =
              shape_of(n, 0, 1 + trial, heads, 16, dt, odt, random_base(rng), a, output);
          SCOPED_TRACE(to_string(plan_cp_merge(s)));
          Case c = make_case(rng, s, true);
          run(c);
          const std::vector<CpMergePlan> plans = plans_for(s);
          for (int r = 0; r < n; ++r) {
            const CpMergePlan& p = plans[static_cast<std::size_t>(r)];
            const std::int64_t h0 = output == CpOutput::kHeadSharded ? p.head_begin(r) : 0;
            // a bf16/f16 wire adds one rounding of o before the merge
            const double tol =
                o_tolerance(odt) + (a == CpAlgorithm::kAllToAll ? o_tolerance(dt) : 0);
            expect_matches(c.outs[static_cast<std::size_t>(r)],
                           reference(c.locals, h0, p.out_heads(), nullptr), tol,
                           "rank " + std::to_string(r));
          }
        }
}

TEST(CpMergeSimulated, SinksAreMergedOnceAfterTheRanks) {
  std::mt19937 rng(11);
  for (CpAlgorithm a : {CpAlgorithm::kAllToAll, CpAlgorithm::kAllGatherLse})
    for (CpOutput output : {CpOutput::kHeadSharded, CpOutput::kReplicated}) {
      const int n = 4;
      const CpMergeShape s =
          shape_of(n, 0, 3, 8, 16, DType::kF32, DType::kF32, LseBase::kNatural, a, output);
      Case c = make_case(rng, s, true);
      std::vector<float> sinks(8);
      for (float& x : sinks) x = std::uniform_real_distribution<float>(-2.f, 4.f)(rng);
      run(c, &sinks);
      const std::vector<CpMergePlan> plans = plans_for(s);
      for (int r = 0; r < n; ++r) {
        const CpMergePlan& p = plans[static_cast<std::size_t>(r)];
        const std::int64_t h0 = output == CpOutput::kHeadSharded ? p.head_begin(r) : 0;
        expect_matches(c.outs[static_cast<std::size_t>(r)],
                       reference(c.locals, h0, p.out_heads(), &sinks), o_tolerance(DType::kF32),
                       std::string(to_string(a)) + " rank " + std::to_string(r));
      }
    }
}

TEST(CpMergeSimulated, ANanInANonEmptyStatePropagates) {
  std::mt19937 rng(3);
  for (CpAlgorithm a : {CpAlgorithm::kAllToAll, CpAlgorithm::kAllGatherLse}) {
    const CpMergeShape s = shape_of(2, 0, 2, 4, 8, DType::kF32, DType::kF32, LseBase::kNatural, a,
                                    CpOutput::kReplicated);
    Case c = make_case(rng, s, false);
    fill_random(c.locals[0], rng, -3, 3, 0.0);
    fill_random(c.locals[1], rng, -3, 3, 0.0);
    c.locals[1].set_o(1, 2, 5, NAN);
    run(c);
    for (const OwnedState& out : c.outs) {
      EXPECT_TRUE(std::isnan(out.o_at(1, 2, 5))) << to_string(a);
      EXPECT_FALSE(std::isnan(out.o_at(0, 2, 5))) << to_string(a);
    }
  }
}

TEST(CpMergeSimulated, BadArgumentsAreNamed) {
  std::mt19937 rng(5);
  const CpMergeShape s = shape_of(3, 0, 2, 6, 8, DType::kBF16, DType::kBF16, LseBase::kNatural,
                                  CpAlgorithm::kAllToAll, CpOutput::kHeadSharded);
  Case c = make_case(rng, s, false);
  std::vector<ConstStateView> locals;
  std::vector<StateView> outs;
  for (auto& l : c.locals) locals.push_back(l.cview());
  for (auto& o : c.outs) outs.push_back(o.view());
  const std::vector<CpMergePlan> plans = plans_for(s);
  expect_arg_error([&] { cpu::cp_merge_simulated({}, locals, outs); }, "plans");
  expect_arg_error([&] { cpu::cp_merge_simulated({plans[0], plans[1]}, locals, outs); }, "plans");
  expect_arg_error([&] { cpu::cp_merge_simulated(plans, {locals[0]}, outs); }, "locals");
  expect_arg_error([&] { cpu::cp_merge_simulated(plans, locals, {outs[0]}); }, "outs");
  expect_arg_error(
      [&] {
        cpu::cp_merge_simulated({plans[0], plans[0], plans[2]}, locals, outs);
      },
      "plans[1].shape.rank");
  {
    std::vector<CpMergePlan> p = plans;
    CpMergeShape other = s;
    other.rank = 2;
    other.head_dim = 16;
    p[2] = plan_cp_merge(other);
    expect_arg_error([&] { cpu::cp_merge_simulated(p, locals, outs); }, "plans[2].shape.head_dim");
    p = plans;
    p[1].workspace_bytes -= 256;
    expect_arg_error([&] { cpu::cp_merge_simulated(p, locals, outs); }, "plan");
  }
  {
    std::vector<ConstStateView> l = locals;
    l[1].heads = 5;
    expect_arg_error([&] { cpu::cp_merge_simulated(plans, l, outs); }, "locals[1].heads");
    l = locals;
    l[2].dtype = DType::kF16;
    expect_arg_error([&] { cpu::cp_merge_simulated(plans, l, outs); }, "locals[2].dtype");
  }
  {
    std::vector<StateView> o = outs;
    OwnedState all_heads = make_state(2, 6, 8, DType::kBF16, LseBase::kNatural);
    o[0] = all_heads.view();  // all heads, for a head-sharded plan
    expect_arg_error([&] { cpu::cp_merge_simulated(plans, locals, o); }, "outs[0].heads");
    o = outs;
    o[1].dtype = DType::kF32;
    expect_arg_error([&] { cpu::cp_merge_simulated(plans, locals, o); }, "outs[1].dtype");
    o = outs;
    o[2] = outs[0];  // two ranks writing one output
    expect_arg_error([&] { cpu::cp_merge_simulated(plans, locals, o); }, "outs[2].o");
  }
  {
    std::vector<StateView> o = outs;  // an output over another rank's input
    OwnedState& victim = c.locals[1];
    o[2].o = victim.o.data();
    o[2].lse = victim.lse.data();
    expect_arg_error([&] { cpu::cp_merge_simulated(plans, locals, o); }, "outs[2].o");
  }
  std::vector<float> sinks(6, 1.f);
  sinks[4] = NAN;
  AttentionSinks sk;
  sk.logits = sinks.data();
  expect_arg_error([&] { cpu::cp_merge_simulated(plans, locals, outs, sk); }, "sinks.logits[4]");
}

}  // namespace
}  // namespace test
}  // namespace attnstate
