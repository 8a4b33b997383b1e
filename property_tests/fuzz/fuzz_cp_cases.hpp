/// @file fuzz_cp_cases.hpp
/// @brief Fuzz cases of the context-parallel merge (core/context_parallel.hpp,
///        cpu/context_parallel.hpp): `cpu::cp_merge_simulated` over every rank of a drawn shape
///        (1..8 ranks, uneven heads, both algorithms and outputs, mixed bases, sinks sometimes)
///        with hard mutations of the plans, the ranks' states and the sinks; and the planning
///        property of `plan_cp_merge` / `check_cp_plans_agree` over random, often huge, fields.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attnstate/core/context_parallel.hpp"
#include "attnstate/cpu/context_parallel.hpp"
#include "fuzz_producer_cases.hpp"

namespace attnstate_fuzz {

using attnstate::CpAlgorithm;
using attnstate::CpMergePlan;
using attnstate::CpMergeShape;
using attnstate::CpOutput;

/// `what[r]`, e.g. "locals[2]".
inline std::string at_rank(const char* what, i64 r) {
  return std::string(what) + "[" + str(r) + "]";
}
/// `what[q]field` for every rank q < n (the names a per-rank check may report).
inline std::vector<std::string> every_rank(const char* what, int n, const std::string& field) {
  std::vector<std::string> out;
  for (int q = 0; q < n; ++q) out.push_back(at_rank(what, q) + field);
  return out;
}

/// The layout fields of a plan (what plan_cp_merge computes besides the shape): the int64 slots
/// from `send_offset` to the end, addressed by index so that a field added later is tampered too.
constexpr std::size_t kCpLayoutBegin = offsetof(CpMergePlan, send_offset);
constexpr int kCpLayoutCount = static_cast<int>((sizeof(CpMergePlan) - kCpLayoutBegin) / 8);
constexpr int kCpWorkspaceField =
    static_cast<int>((offsetof(CpMergePlan, workspace_bytes) - kCpLayoutBegin) / 8);
static_assert((sizeof(CpMergePlan) - kCpLayoutBegin) % 8 == 0, "int64 layout fields");

inline std::string describe(const CpMergeShape& s) {
  return "shape{world_size " + std::to_string(s.world_size) + ", tokens " + str(s.tokens) +
         ", heads " + str(s.heads) + ", head_dim " + str(s.head_dim) + ", dtype " +
         std::to_string(static_cast<int>(s.dtype)) + " -> " +
         std::to_string(static_cast<int>(s.out_dtype)) + ", wire_base " +
         std::to_string(static_cast<int>(s.wire_base)) + ", algorithm " +
         std::to_string(static_cast<int>(s.algorithm)) + ", output " +
         std::to_string(static_cast<int>(s.output)) + "}";
}

/// A valid shape of a few ranks over small states (rank 0): heads >= world_size, uneven unless
/// kAllGatherLse shards the heads; smaller states with more ranks (the arena holds 2 states a
/// rank: at most ~15 KiB with 8 ranks, padded strides and gaps included).
inline CpMergeShape draw_cp_shape(Rng& r) {
  CpMergeShape s;
  s.world_size = static_cast<int>(r.coin(75) ? r.range(1, 4) : r.range(5, 8));
  const bool small = s.world_size <= 4;
  s.algorithm = r.coin(50) ? CpAlgorithm::kAllToAll : CpAlgorithm::kAllGatherLse;
  s.output = r.coin(50) ? CpOutput::kHeadSharded : CpOutput::kReplicated;
  if (s.algorithm == CpAlgorithm::kAllGatherLse && s.output == CpOutput::kHeadSharded)
    s.heads = s.world_size * (small ? r.range(1, 2) : 1);
  else
    s.heads = s.world_size + r.range(0, small ? 3 : 2);
  s.tokens = r.pick<i64>({0, 1, 1, 2, 2, 3, 4});
  if (!small) s.tokens = std::min<i64>(s.tokens, 2);
  s.head_dim = r.range(1, small ? 4 : 3);
  s.dtype = draw_dtype(r);
  s.out_dtype = draw_dtype(r);
  s.wire_base = draw_base(r);
  return s;
}

/// One plan per rank of `s`.
inline std::vector<CpMergePlan> plan_ranks(CpMergeShape s) {
  std::vector<CpMergePlan> plans;
  for (int q = 0; q < s.world_size; ++q) {
    s.rank = q;
    plans.push_back(attnstate::plan_cp_merge(s));
  }
  return plans;
}

/// A cp_merge_simulated call's arguments: the first `plans_n` / `locals_n` / `outs_n` entries
/// are passed (past the drawn ones, copies of entry 0: a count mutation).
struct CpArgs {
  std::vector<CpMergePlan> plans;
  std::vector<std::shared_ptr<StateArg>> locals, outs;
  std::size_t plans_n = 0, locals_n = 0, outs_n = 0;
  std::shared_ptr<SinksArg> sinks;
};

template <class T>
std::vector<T> first_n(const std::vector<T>& xs, std::size_t n) {
  std::vector<T> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(xs[std::min(i, xs.size() - 1)]);
  return out;
}

/// Runs the call. The ranks' agreement is checked by the public `check_cp_plans_agree`, whose
/// errors carry its own name: those are taken as the call's.
inline void call_cp_merge_simulated(const CpArgs& a) {
  std::vector<attnstate::ConstStateView> locals;
  std::vector<StateView> outs;
  for (const auto& l : first_n(a.locals, a.locals_n)) locals.push_back(l->v);
  for (const auto& o : first_n(a.outs, a.outs_n)) outs.push_back(o->v);
  try {
    attnstate::cpu::cp_merge_simulated(first_n(a.plans, a.plans_n), locals, outs, a.sinks->s);
  } catch (const attnstate::Error& e) {
    const std::string agree = "attnstate::check_cp_plans_agree: ", msg = e.what();
    if (msg.rfind(agree, 0) != 0) throw;
    throw attnstate::Error(e.status(),
                           "attnstate::cpu::cp_merge_simulated: " + msg.substr(agree.size()));
  }
}

/// Mutations of the plans: counts, shape fields every plan shares (invalid values), one plan of
/// another rank or shape, a tampered layout field, every plan re-planned for a smaller shape (its
/// states then do not fit). `base` is the drawn shape.
inline std::vector<std::function<bool()>> cp_plan_mutations(Ctx& c, std::shared_ptr<CpArgs> a,
                                                            const CpMergeShape& base) {
  Rng& r = c.rng;
  const int n = base.world_size;
  const auto orig = std::make_shared<std::vector<CpMergePlan>>(a->plans);
  const bool multiple =
      base.algorithm == CpAlgorithm::kAllGatherLse && base.output == CpOutput::kHeadSharded;
  return {
      [&c, &r, a, n] {  // a vector of the wrong length
        const int which = static_cast<int>(r.range(0, 2));
        static const char* const kNames[3] = {"plans", "locals", "outs"};
        if (!c.touch(std::string("count#") + kNames[which])) return false;
        std::size_t* cnt = which == 0 ? &a->plans_n : which == 1 ? &a->locals_n : &a->outs_n;
        *cnt = static_cast<std::size_t>(r.pick<i64>({0, n - 1, n + 1}));
        if (*cnt == static_cast<std::size_t>(n)) *cnt = static_cast<std::size_t>(n + 1);
        c.reject(std::string(kNames[which]) + " of " + std::to_string(*cnt) + " entries",
                 {kNames[which], "plans"});
        return true;
      },
      [&c, &r, a, n] {  // a field every plan shares, set to an invalid value
        const int f = static_cast<int>(r.range(0, 8));
        static const char* const kKeys[9] = {"world_size", "tokens", "heads",
                                             "head_dim",   "dtype",  "wire_base",
                                             "algorithm",  "output", "heads"};
        if (!c.touch(std::string("shape#") + kKeys[f])) return false;
        std::string what;
        std::vector<std::string> blame{"plan"};
        for (CpMergePlan& p : a->plans) {
          CpMergeShape& s = p.shape;
          Rng pr = r;  // the same value on every plan
          switch (f) {
            case 0:
              s.world_size = static_cast<int>(pr.pick<i64>(
                  {0, -1, INT_MIN, attnstate::kMaxCpWorldSize + 1, INT_MAX, n + pr.range(2, 4)}));
              blame.push_back("plans");
              what = "world_size = " + std::to_string(s.world_size);
              break;
            case 1:
              s.tokens = pr.pick<i64>({-1, kI64Min, i64{1} << 56, k2p62, kI64Max});
              what = "tokens = " + str(s.tokens);
              break;
            case 2:
              s.heads = pr.pick<i64>({0, -1, kI64Min, (i64{1} << 52) + 1, kI64Max});
              if (n >= 2 && pr.coin(50)) s.heads = pr.range(1, n - 1);
              what = "heads = " + str(s.heads) + " (< world_size or huge)";
              break;
            case 3:
              s.head_dim = pr.pick<i64>({0, -1, kI64Min, i64{1} << 61, kI64Max});
              what = "head_dim = " + str(s.head_dim);
              break;
            case 4: {
              const DType bad = pr.coin(50) ? pr.pick({DType::kE4M3, DType::kE5M2})
                                            : static_cast<DType>(pr.range(5, 255));
              (pr.coin(50) ? s.dtype : s.out_dtype) = bad;
              what = "a dtype = " + std::to_string(static_cast<int>(bad));
              break;
            }
            case 5:
              s.wire_base = static_cast<attnstate::LseBase>(pr.range(2, 255));
              what = "wire_base = " + std::to_string(static_cast<int>(s.wire_base));
              break;
            case 6:
              s.algorithm = static_cast<CpAlgorithm>(pr.range(2, 255));
              what = "algorithm = " + std::to_string(static_cast<int>(s.algorithm));
              break;
            case 7:
              s.output = static_cast<CpOutput>(pr.range(2, 255));
              what = "output = " + std::to_string(static_cast<int>(s.output));
              break;
            case 8:  // kAllGatherLse head-sharded over heads not a multiple of world_size
              if (n < 2) return false;
              s.algorithm = CpAlgorithm::kAllGatherLse;
              s.output = CpOutput::kHeadSharded;
              s.heads = n * pr.range(1, 2) + pr.range(1, n - 1);
              what = "all_gather_lse head_sharded, heads = " + str(s.heads);
              break;
          }
        }
        r.next();
        c.reject("every plan's shape." + what, blame);
        return true;
      },
      [&c, &r, a, n, orig, multiple] {  // one plan of another rank or shape, or tampered
        const int q = static_cast<int>(r.range(0, n - 1));
        const std::string pq = at_rank("plans", q);
        const int k = static_cast<int>(r.range(0, 4));
        if ((k == 1 || k == 2) && n < 2) return false;
        if (!c.touch(pq)) return false;
        CpMergePlan& p = a->plans[static_cast<std::size_t>(q)];
        switch (k) {
          case 0:
            p.shape.rank = static_cast<int>(r.pick<i64>({-1, n, n + 3, INT_MIN, INT_MAX}));
            c.reject(pq + ".shape.rank = " + std::to_string(p.shape.rank), {pq + ".shape.rank"});
            return true;
          case 1: {  // the plan of another rank
            const int o = static_cast<int>((q + r.range(1, n - 1)) % n);
            p = (*orig)[static_cast<std::size_t>(o)];
            // (of the drawn shape: where the plans were re-planned, a field may differ first)
            c.reject(pq + " is the plan of rank " + std::to_string(o), {pq + ".shape"});
            return true;
          }
          case 2: {  // a plan of another (valid) shape than it has
            CpMergeShape s = p.shape;
            const int f = static_cast<int>(r.range(0, 7));
            static const char* const kF[8] = {"tokens",    "heads",     "head_dim",  "dtype",
                                              "out_dtype", "wire_base", "algorithm", "output"};
            switch (f) {
              case 0:
                s.tokens += s.tokens > 0 && r.coin(50) ? -1 : 1;
                break;
              case 1:
                s.heads += multiple ? n : 1;
                break;
              case 2:
                s.head_dim += 1;
                break;
              case 3:
                s.dtype = s.dtype == DType::kF32 ? DType::kBF16 : DType::kF32;
                break;
              case 4:
                s.out_dtype = s.out_dtype == DType::kF16 ? DType::kBF16 : DType::kF16;
                break;
              case 5:
                s.wire_base = s.wire_base == attnstate::LseBase::kNatural
                                  ? attnstate::LseBase::kBase2
                                  : attnstate::LseBase::kNatural;
                break;
              case 6:
                s.algorithm = s.algorithm == CpAlgorithm::kAllToAll ? CpAlgorithm::kAllGatherLse
                                                                    : CpAlgorithm::kAllToAll;
                break;
              case 7:
                s.output = s.output == CpOutput::kHeadSharded ? CpOutput::kReplicated
                                                              : CpOutput::kHeadSharded;
                break;
            }
            try {
              p = attnstate::plan_cp_merge(s);
            } catch (const attnstate::Error&) {
              return false;  // e.g. kAllGatherLse head-sharded over uneven heads
            }
            // the others are compared with rank 0's shape, after rank 0's states were checked
            // against it: those may then not fit
            const std::string field = std::string(".shape.") + kF[f];
            auto blame =
                q > 0 ? std::vector<std::string>{pq + field} : every_rank("plans", n, field);
            if (q == 0) blame.insert(blame.end(), {"locals[0]", "outs[0]"});
            c.reject(pq + " planned for another " + kF[f], blame);
            return true;
          }
          case 3:
          case 4: {  // a layout field changed (workspace_bytes in half the cases)
            const int f =
                k == 3 ? kCpWorkspaceField : static_cast<int>(r.range(0, kCpLayoutCount - 1));
            auto* slot = reinterpret_cast<unsigned char*>(&p) + kCpLayoutBegin + 8 * f;
            i64 old = 0;
            std::memcpy(&old, slot, 8);
            const i64 x = r.coin(60)
                              ? old + 256 * r.range(1, 4) * (old >= 1024 && r.coin(50) ? -1 : 1)
                              : r.pick<i64>({-1, -256, kI64Min, k2p62, kI64Max});
            std::memcpy(slot, &x, 8);
            c.reject(pq + " layout field #" + std::to_string(f) + " " + str(old) + " -> " + str(x),
                     {"plan"});
            return true;
          }
        }
        return false;
      },
      [&c, &r, a, n, base, multiple] {  // every plan made for a smaller shape
        CpMergeShape s = base;
        const int f = static_cast<int>(r.range(0, 4));
        std::string field;
        std::vector<std::string> blame;
        switch (f) {
          case 0:
            if (s.tokens < 1) return false;
            s.tokens -= 1;
            field = ".tokens";
            break;
          case 1:
            if (s.head_dim < 2) return false;
            s.head_dim -= 1;
            field = ".head_dim";
            break;
          case 2:
            if (multiple ? s.heads < 2 * n : s.heads <= n) return false;
            s.heads -= multiple ? n : 1;
            field = ".heads";
            break;
          case 3:  // exclusive with a state dtype mutation (they could cancel)
            if (!c.touch("dtype")) return false;
            s.dtype = s.dtype == DType::kF32 ? DType::kF16 : DType::kF32;
            field = ".dtype";
            break;
          case 4:
            if (!c.touch("out_dtype")) return false;
            s.out_dtype = s.out_dtype == DType::kBF16 ? DType::kF16 : DType::kBF16;
            field = ".dtype";
            break;
        }
        if (!c.touch("replan")) return false;
        a->plans = plan_ranks(s);
        if (f != 4) blame = every_rank("locals", n, field);
        if (f != 3)
          for (auto& b : every_rank("outs", n, field)) blame.push_back(b);
        c.reject("every plan made for " + describe(s), blame);
        return true;
      },
  };
}

/// Mutations of the ranks' states: layouts, pointers, shapes and dtypes that do not fit the plan
/// (always away from it, so that a re-planned shape never makes them fit), outputs over an input
/// or another rank's output.
inline std::vector<std::function<bool()>> cp_state_mutations(Ctx& c, std::shared_ptr<CpArgs> a,
                                                             const CpMergeShape& base) {
  Rng& r = c.rng;
  const int n = base.world_size;
  const auto pick = [&r, n](const std::vector<std::shared_ptr<StateArg>>& xs) {
    return xs[static_cast<std::size_t>(r.range(0, n - 1))];
  };
  return {
      [&c, a, pick] { return mutate_state(c, *pick(a->locals), {}); },
      [&c, a, pick] { return mutate_state(c, *pick(a->outs), {}); },
      [&c, a, pick] { return mutate_mismatch(c, *pick(a->locals), {}); },
      [&c, a, pick] { return mutate_mismatch(c, *pick(a->outs), {}); },
      [&c, &r, a, pick, base] {  // a valid dtype other than the plan's (or fp8)
        const bool out = r.coin(50);
        StateArg& s = *pick(out ? a->outs : a->locals);
        if (!c.touch(out ? "out_dtype" : "dtype")) return false;
        const DType plan = out ? base.out_dtype : base.dtype;
        DType d = plan;
        while (d == plan)
          d = r.pick({DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2});
        s.v.dtype = d;
        c.reject(s.name + ".dtype = " + attnstate::to_string(d) + " (the plan's is " +
                     attnstate::to_string(plan) + ")",
                 {s.name + ".dtype"});
        return true;
      },
      [&c, a, pick] { return overlap_state(c, *pick(a->outs), *pick(a->locals), false); },
      [&c, &r, a, pick] {  // an output over another rank's output
        StateArg& out = *pick(a->outs);
        const StateArg& other = *pick(a->outs);
        if (&out == &other) return false;
        const Range t = r.coin(50) ? o_range(other.v, other.v.o) : lse_range(other.v, other.v.lse);
        return mutate_overlap(c, out, other.name, t.p, t.bytes);
      },
  };
}

/// A cp_merge_simulated call over every rank of a drawn shape.
inline Built build_cp_merge_simulated(Ctx& c, int nmut) {
  Rng& r = c.rng;
  const CpMergeShape base = draw_cp_shape(r);
  const int n = base.world_size;
  auto a = std::make_shared<CpArgs>();
  a->plans = plan_ranks(base);
  a->plans_n = a->locals_n = a->outs_n = static_cast<std::size_t>(n);
  for (int q = 0; q < n; ++q) {
    a->locals.push_back(
        std::make_shared<StateArg>(make_state(c, at_rank("locals", q), base.tokens, base.heads,
                                              base.head_dim, false, base.dtype, draw_base(r))));
    a->outs.push_back(std::make_shared<StateArg>(make_state(
        c, at_rank("outs", q), base.tokens, a->plans[static_cast<std::size_t>(q)].out_heads(),
        base.head_dim, true, base.out_dtype, draw_base(r))));
  }
  a->sinks = draw_sinks(c, base.heads);
  auto muts = cp_plan_mutations(c, a, base);
  for (auto& m : cp_state_mutations(c, a, base)) muts.push_back(m);
  for (auto& m : sink_mutations(c, a->sinks, a->outs[static_cast<std::size_t>(r.range(0, n - 1))]))
    muts.push_back(m);
  apply_mutations(c, nmut, muts);
  {
    std::vector<std::function<void(void*)>> setters;
    for (std::size_t q = 0; q < a->locals.size(); ++q)
      for (auto& s : state_setters({a->locals[q].get(), a->outs[q].get()})) setters.push_back(s);
    maybe_wild(c, setters);
  }
  if (!c.expect_reject)
    for (const auto& o : a->outs) allow_state(c, o->v, o->v.o, o->v.lse);
  c.note(describe(base));
  for (const auto& l : a->locals) c.note(describe(*l, c));
  for (const auto& o : a->outs) c.note(describe(*o, c));
  c.note(a->sinks->off < 0 ? "no sinks" : "sinks @" + str(c.off_of(a->sinks->s.logits)));
  return {"attnstate::cpu::cp_merge_simulated", [a] { call_cp_merge_simulated(*a); }};
}

// ---------------------------------------------------------------------------------------------
// Planning.

/// An extent from the edges: 0, +-1, powers of two up to 2^63 - 1 (and their neighbours).
inline i64 draw_edge(Rng& r) {
  if (r.coin(30)) return r.pick<i64>({0, 1, -1, kI64Min, kI64Max, k2p62, k2p62 + 1, -k2p62});
  const i64 p = i64{1} << r.range(0, 62);
  return p + r.range(-1, 1);
}

/// Checks one plan against the contract: its shape as asked, head slices covering every head
/// (each rank at least one, sizes differing by at most one), and regions of the documented sizes,
/// 256-aligned, disjoint and inside workspace_bytes. Returns "" or the violation.
inline std::string check_cp_plan(const CpMergeShape& s, const CpMergePlan& p) {
  const CpMergeShape& g = p.shape;
  if (g.world_size != s.world_size || g.rank != s.rank || g.tokens != s.tokens ||
      g.heads != s.heads || g.head_dim != s.head_dim || g.dtype != s.dtype ||
      g.out_dtype != s.out_dtype || g.wire_base != s.wire_base || g.algorithm != s.algorithm ||
      g.output != s.output)
    return "plan.shape differs from the shape asked";
  const int n = s.world_size;
  const i128 T = s.tokens, D = s.head_dim;
  if (p.head_begin(0) != 0 || p.head_end(n - 1) != s.heads) return "head slices do not cover heads";
  const i64 lo = s.heads / n;
  for (int q = 0; q < n; ++q)
    if (p.heads_of(q) < std::max<i64>(lo, 1) || p.heads_of(q) > lo + 1)
      return "rank " + std::to_string(q) + " owns " + str(p.heads_of(q)) + " heads";
  const auto r16 = [](i128 x) { return (x + 15) / 16 * 16; };
  const auto chunk = [&](i64 h, DType dt) { return r16(T * h * D * es(dt)) + r16(T * h * 4); };
  const i64 mine = p.heads_of(s.rank);
  struct Reg {
    const char* name;
    i64 off;
    i128 bytes;
  };
  std::vector<Reg> regs;
  const i128 rows = T * s.heads;
  std::string bad;
  const auto size_is = [&](const char* name, i64 got, i128 want) {
    if (bad.empty() && got != want)
      bad = std::string(name) + " = " + str(got) + ", expected " + str(static_cast<i64>(want));
  };
  if (s.algorithm == CpAlgorithm::kAllToAll) {
    i128 send = 0, gather = 0;
    const int probe = static_cast<int>((s.tokens + s.heads) % (n + 1));
    for (int q = 0; q < n; ++q) {
      if (q == probe) size_is("send_chunk_offset(probe)", p.send_chunk_offset(q), send);
      send += chunk(p.heads_of(q), s.dtype);
      gather += chunk(p.heads_of(q), s.out_dtype);
    }
    size_is("send_bytes", p.send_bytes, send);
    size_is("recv_bytes", p.recv_bytes, n * chunk(mine, s.dtype));
    size_is("chunk_bytes(mine)", p.chunk_bytes(mine, s.dtype), chunk(mine, s.dtype));
    regs = {{"send", p.send_offset, send}, {"recv", p.recv_offset, n * chunk(mine, s.dtype)}};
    if (s.output == CpOutput::kReplicated) {
      size_is("gather_bytes", p.gather_bytes, gather);
      regs.push_back({"mine", p.mine_offset, chunk(mine, s.out_dtype)});
      regs.push_back({"gather", p.gather_offset, gather});
    }
  } else {
    size_is("scaled_bytes", p.scaled_bytes, rows * D * 4);
    regs = {{"o32", p.o32_offset, rows * D * 4},
            {"lse", p.lse_offset, rows * 4},
            {"gathered", p.gathered_offset, n * rows * 4},
            {"lse_merged", p.lse_merged_offset, rows * 4},
            {"scaled", p.scaled_offset, rows * D * 4}};
    if (s.output == CpOutput::kHeadSharded) regs.push_back({"sum", p.sum_offset, T * mine * D * 4});
  }
  regs.push_back({"zeros", p.zeros_offset, D * 4});
  if (!bad.empty()) return bad;
  if (p.workspace_bytes < 0 || p.workspace_bytes > k2p62 || p.workspace_bytes % 256 != 0)
    return "workspace_bytes = " + str(p.workspace_bytes);
  for (std::size_t i = 0; i < regs.size(); ++i) {
    const Reg& x = regs[i];
    if (x.off < 0 || x.off % 256 != 0 || x.off + x.bytes > p.workspace_bytes)
      return std::string("region ") + x.name + " at " + str(x.off) + " (" +
             str(static_cast<i64>(x.bytes)) + " bytes) not 256-aligned inside workspace_bytes " +
             str(p.workspace_bytes);
    for (std::size_t j = 0; j < i; ++j) {
      const Reg& y = regs[j];
      if (x.bytes > 0 && y.bytes > 0 && x.off < y.off + y.bytes && y.off < x.off + x.bytes)
        return std::string("regions ") + x.name + " and " + y.name + " overlap";
    }
  }
  return "";
}

/// One planning case: a shape with `nmut` fields drawn from the edges (often huge), planned;
/// either an Error of the documented form naming a `shape.` field the contract rules out, or a
/// plan that `check_cp_plan` accepts. Then `check_cp_plans_agree` against a copy with one field
/// changed (or only the rank: no error). Returns "" or the failure.
inline std::string run_plan_cp_case(Ctx& c, int nmut) {
  Rng& r = c.rng;
  CpMergeShape s;
  s.world_size = static_cast<int>(r.range(1, 8));
  s.rank = static_cast<int>(r.range(0, s.world_size - 1));
  s.tokens = r.range(0, 64);
  s.heads = s.world_size * r.range(1, 4) + (r.coin(50) ? r.range(0, s.world_size - 1) : 0);
  s.head_dim = r.range(1, 256);
  s.dtype = draw_dtype(r);
  s.out_dtype = draw_dtype(r);
  s.wire_base = draw_base(r);
  s.algorithm = static_cast<CpAlgorithm>(r.range(0, 1));
  s.output = static_cast<CpOutput>(r.range(0, 1));
  const auto any_dtype = [&] {
    return r.coin(50) ? r.pick({DType::kE4M3, DType::kE5M2, DType::kF32})
                      : static_cast<DType>(r.range(0, 255));
  };
  for (int i = 0; i < nmut + (nmut > 0 ? 1 : 0); ++i) {
    switch (r.range(0, 9)) {
      case 0:
        s.world_size =
            static_cast<int>(r.pick<i64>({0, -1, INT_MIN, INT_MAX, 1024, 1025, r.range(1, 1024)}));
        break;
      case 1:
        s.rank =
            static_cast<int>(r.pick<i64>({-1, s.world_size, INT_MIN, INT_MAX, r.range(0, 1023)}));
        break;
      case 2:
        s.tokens = draw_edge(r);
        break;
      case 3:
        s.heads = draw_edge(r);
        break;
      case 4:
        s.head_dim = draw_edge(r);
        break;
      case 5:
        s.dtype = any_dtype();
        break;
      case 6:
        s.out_dtype = any_dtype();
        break;
      case 7:
        s.wire_base = static_cast<attnstate::LseBase>(r.range(0, 255));
        break;
      case 8:
        s.algorithm = static_cast<CpAlgorithm>(r.range(0, 255));
        break;
      case 9:
        s.output = static_cast<CpOutput>(r.range(0, 255));
        break;
    }
  }
  if (nmut > 0 && r.coin(25)) {  // extents whose product is near 2^62 (the planner's bound)
    const i64 e = r.range(56, 64), b = r.range(0, std::min<i64>(e, 52)), d = r.range(0, e - b);
    const auto near = [&r](i64 x) { return x >= 63 ? kI64Max : (i64{1} << x) - r.range(0, 1); };
    s.tokens = near(e - b - d);
    s.heads = std::max<i64>(near(b), 1);
    s.head_dim = std::max<i64>(near(d), 1);
    if (r.coin(50)) s.world_size = static_cast<int>(std::min<i64>(s.heads, s.world_size));
  }
  c.note(describe(s) + ", rank " + std::to_string(s.rank));
  // what the contract rules out, each naming its field
  const auto dt_ok = [](DType d) {
    return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
  };
  const bool ws_ok = s.world_size >= 1 && s.world_size <= attnstate::kMaxCpWorldSize;
  const bool algo_ok =
      s.algorithm == CpAlgorithm::kAllToAll || s.algorithm == CpAlgorithm::kAllGatherLse;
  const bool out_ok = s.output == CpOutput::kHeadSharded || s.output == CpOutput::kReplicated;
  if (!ws_ok) c.reject("world_size", {"shape.world_size", "shape.rank", "shape.heads"});
  if (ws_ok && (s.rank < 0 || s.rank >= s.world_size)) c.reject("rank", {"shape.rank"});
  if (s.tokens < 0) c.reject("tokens < 0", {"shape.tokens"});
  if ((ws_ok && s.heads < s.world_size) || s.heads < 1 || s.heads > (i64{1} << 52))
    c.reject("heads", {"shape.heads"});
  if (s.head_dim < 1) c.reject("head_dim < 1", {"shape.head_dim"});
  if (!dt_ok(s.dtype)) c.reject("dtype", {"shape.dtype"});
  if (!dt_ok(s.out_dtype)) c.reject("out_dtype", {"shape.out_dtype"});
  if (s.wire_base != attnstate::LseBase::kNatural && s.wire_base != attnstate::LseBase::kBase2)
    c.reject("wire_base", {"shape.wire_base"});
  if (!algo_ok) c.reject("algorithm", {"shape.algorithm"});
  if (!out_ok) c.reject("output", {"shape.output"});
  if (ws_ok && s.heads >= 1 && s.algorithm == CpAlgorithm::kAllGatherLse &&
      s.output == CpOutput::kHeadSharded && s.heads % s.world_size != 0)
    c.reject("all_gather_lse head_sharded over uneven heads", {"shape.heads"});
  // sizes: past 2^62 bytes a buffer of the run must be refused; well within, planned; between,
  // either (the planner bounds the whole workspace)
  bool may_plan = false;
  if (!c.expect_reject) {
    const auto mul = [](i128 a, i128 b) {  // saturating at 2^100 (operands >= 0)
      const i128 lim = i128{1} << 100;
      return a != 0 && b > lim / a ? lim : a * b;
    };
    const i128 elems = mul(mul(s.tokens, s.heads), s.head_dim);
    const i128 one = mul(elems, s.algorithm == CpAlgorithm::kAllToAll ? es(s.dtype) : 4);
    const i128 all = mul(elems + mul(s.tokens, s.heads) + 64, 4 * (i128{s.world_size} + 1));
    if (one > k2p62 || mul(s.head_dim, 4) > k2p62) {
      c.reject("a buffer past 2^62 bytes", {"shape.tokens", "shape.heads", "shape.head_dim"});
    } else if (all > k2p62 / 4) {
      c.reject("a workspace near 2^62 bytes", {"shape.tokens", "shape.heads", "shape.head_dim"});
      may_plan = true;
    }
  }
  try {
    const CpMergePlan p = attnstate::plan_cp_merge(s);
    if (c.expect_reject && !may_plan)
      return "plan_cp_merge accepted an invalid shape" + case_log(c);
    const std::string err = check_cp_plan(s, p);
    if (!err.empty()) return "plan_cp_merge: " + err + case_log(c);
  } catch (const attnstate::Error& e) {
    const std::string err = check_error(c, e, "attnstate::plan_cp_merge");
    if (!err.empty()) return err + case_log(c);
  }
  // the agreement check: names the first field that differs, never the rank
  CpMergeShape b = s;
  const int f = static_cast<int>(r.range(0, 9));
  static const char* const kFields[10] = {"rank",      "world_size", "tokens",    "heads",
                                          "head_dim",  "dtype",      "out_dtype", "wire_base",
                                          "algorithm", "output"};
  switch (f) {
    case 0:
      b.rank = static_cast<int>(r.range(INT_MIN, INT_MAX));
      break;
    case 1:
      b.world_size ^= static_cast<int>(r.range(1, INT_MAX));
      break;
    case 2:
      b.tokens ^= r.range(1, kI64Max);
      break;
    case 3:
      b.heads ^= r.range(1, kI64Max);
      break;
    case 4:
      b.head_dim ^= r.range(1, kI64Max);
      break;
    case 5:
      b.dtype = static_cast<DType>(static_cast<int>(b.dtype) ^ static_cast<int>(r.range(1, 255)));
      break;
    case 6:
      b.out_dtype =
          static_cast<DType>(static_cast<int>(b.out_dtype) ^ static_cast<int>(r.range(1, 255)));
      break;
    case 7:
      b.wire_base = static_cast<attnstate::LseBase>(static_cast<int>(b.wire_base) ^
                                                    static_cast<int>(r.range(1, 255)));
      break;
    case 8:
      b.algorithm = static_cast<CpAlgorithm>(static_cast<int>(b.algorithm) ^
                                             static_cast<int>(r.range(1, 255)));
      break;
    case 9:
      b.output =
          static_cast<CpOutput>(static_cast<int>(b.output) ^ static_cast<int>(r.range(1, 255)));
      break;
  }
  const int b_rank = static_cast<int>(r.range(0, 1023));
  const std::string want = "attnstate::check_cp_plans_agree: argument 'plans[" +
                           std::to_string(b_rank) + "].shape." + kFields[f] + "': expected ";
  try {
    attnstate::check_cp_plans_agree(s, b, b_rank);
    if (f != 0) return std::string("check_cp_plans_agree: a different ") + kFields[f] + " agreed";
  } catch (const attnstate::Error& e) {
    const std::string msg = e.what();
    if (f == 0 || msg.rfind(want, 0) != 0 || msg.find(", got ") == std::string::npos ||
        e.status() != attnstate::Status::kInvalidArgument)
      return std::string("check_cp_plans_agree (") + kFields[f] + " changed): " + msg;
  }
  return "";
}

}  // namespace attnstate_fuzz
