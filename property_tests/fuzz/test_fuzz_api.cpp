/// @file test_fuzz_api.cpp
/// @brief The API fuzzer over the CPU backend, the core view factories and planning, and the
///        testing kit's public constructors (see fuzz_harness.hpp for the arena and the oracle).
///        Each property runs >= 10,000 cases (RC_PARAMS' default max_success here; CI pins the
///        seed); a deliberately broken entry point checks that the harness catches what it must.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <sys/mman.h>

#include <cstdlib>
#include <memory>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/cpu/merge.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/host_tensor.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "fuzz_cp_cases.hpp"
#include "fuzz_mla_cases.hpp"
#include "rc_defaults.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=10000");

namespace {

using namespace attnstate_fuzz;  // NOLINT(google-build-using-namespace): test file
namespace cpu = attnstate::cpu;

constexpr i64 kArenaBytes = 32 * 1024;

// TODO(issue 16): cases disabled until the library fix of the finding lands (findings in
// /tmp/fuzz-findings.md; set each to false when its fix is in main).
/// F1: make_state_view / make_state_stack multiply their extents unchecked (signed overflow,
/// UBSan).
constexpr bool kPendingStackFactoryOverflow = false;
/// F2: testing::HostState::from_view reads a misaligned lse/o pointer (UBSan) instead of
/// rejecting it.
constexpr bool kPendingFromViewAlignment = false;

/// One host arena for the process (each case refills it) and a never-mapped (PROT_NONE) page
/// range for wild pointers: touching it crashes, under ASan or not.
struct HostArena {
  std::uint8_t* mem = nullptr;
  std::uintptr_t wild = 0;
  HostArena() {
    mem = static_cast<std::uint8_t*>(std::aligned_alloc(256, kArenaBytes));
    void* w = mmap(nullptr, 1 << 16, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    wild = reinterpret_cast<std::uintptr_t>(w);
  }
  ~HostArena() { std::free(mem); }
};
HostArena& arena() {
  static HostArena a;
  return a;
}

struct CpuBackend {
  static constexpr const char* kPrefix = "attnstate::cpu::";
  static constexpr bool kHostTables = true;
  static i64 draw_dim(Rng& r) { return r.range(1, 8); }
  static void upload(Ctx&) {}
  static void download(Ctx&) {}
  static void sync() {}
  static void merge_state(ConstStateView a, ConstStateView b, StateView out) {
    cpu::merge_state(a, b, out);
  }
  static void merge_state(ConstStateView a, ConstStateView b, StateView out, TokenMask m) {
    cpu::merge_state(a, b, out, m);
  }
  static void merge_state_inplace(StateView acc, ConstStateView o, TokenMask m) {
    cpu::merge_state_inplace(acc, o, m);
  }
  static void merge_states(ConstStateStackView s, StateView out) { cpu::merge_states(s, out); }
  static void merge_states_ragged(ConstStateView rows, const std::int32_t* ip, StateView out) {
    cpu::merge_states_ragged(rows, ip, out);
  }
  static void rebase(ConstStateView in, StateView out) { cpu::rebase(in, out); }
  static void mark_empty_rows(StateView s) { cpu::mark_empty_rows(s); }
};

/// Counts of the last property run (valid calls and calls that returned), for the coverage check.
struct Counts {
  long cases = 0, valid = 0, returned = 0;
};
Counts g_counts;

template <class Build>
void fuzz_one(Build build, i64 arena_bytes) {
  const Draw d = draw();
  Ctx c(arena().mem, arena_bytes, reinterpret_cast<std::uintptr_t>(arena().mem), arena().wild,
        MemorySpace::kHost, d.seed);
  const Built b = build(c, d.nmut);
  const std::string err = run_case<CpuBackend>(c, b);
  ++g_counts.cases;
  if (!c.expect_reject) ++g_counts.valid;
  if (!err.empty()) RC_FAIL(err);
}

/// Runs a property and checks that it ran enough valid calls (20-60%: the write-only-inside part
/// is exercised). A case costs about its arena's bytes (filled, snapshot, compared): a builder
/// that needs less may take less.
template <class Build>
void run_property(const char* name, Build build, i64 arena_bytes = kArenaBytes) {
  g_counts = {};
  const auto result = rc::check(name, [&] { fuzz_one(build, arena_bytes); });
  EXPECT_TRUE(result) << name;
  if (g_counts.cases >= 1000) {
    const double f = static_cast<double>(g_counts.valid) / static_cast<double>(g_counts.cases);
    EXPECT_GE(f, 0.15) << name << ": too few valid calls";
    EXPECT_LE(f, 0.6) << name << ": too few invalid calls";
  }
}

TEST(FuzzConfig, RunsAtLeast10000CasesPerEntryPoint) {
  const char* env = std::getenv("RC_PARAMS");
  if (env != nullptr && std::string(env).find("max_success=") != std::string::npos &&
      attnstate::testing::rc_max_success() < 10000)
    GTEST_SKIP() << "RC_PARAMS overrides max_success";
  EXPECT_GE(attnstate::testing::rc_max_success(), 10000);
}

// --- the merge family -------------------------------------------------------------------------

TEST(FuzzCpu, MergeState) { run_property("merge_state", build_merge_state<CpuBackend>); }
TEST(FuzzCpu, MergeStateInplace) {
  run_property("merge_state_inplace", build_merge_state_inplace<CpuBackend>);
}
TEST(FuzzCpu, MergeStates) { run_property("merge_states", build_merge_states<CpuBackend>); }
TEST(FuzzCpu, MergeStatesRagged) {
  run_property("merge_states_ragged", build_merge_states_ragged<CpuBackend>);
}
TEST(FuzzCpu, Rebase) { run_property("rebase", build_rebase<CpuBackend>); }
TEST(FuzzCpu, MarkEmptyRows) { run_property("mark_empty_rows", build_mark_empty_rows<CpuBackend>); }

// --- producers ----------------------------------------------------------------------------------

TEST(FuzzCpu, AttentionState) { run_property("attention_state", build_attention_state); }
TEST(FuzzCpu, DecodeWithLayout) {
  run_property("decode(layout)", [](Ctx& c, int n) { return build_decode(c, n, true); });
}
TEST(FuzzCpu, DecodeWithOptions) {
  run_property("decode(options)", [](Ctx& c, int n) { return build_decode(c, n, false); });
}
TEST(FuzzCpu, CascadeAttention) { run_property("cascade_attention", build_cascade); }
TEST(FuzzCpu, MlaDecodeWithLayout) {
  run_property("mla_decode(layout)", [](Ctx& c, int n) { return build_mla(c, n, true); });
}
TEST(FuzzCpu, MlaDecodeWithOptions) {
  run_property("mla_decode(options)", [](Ctx& c, int n) { return build_mla(c, n, false); });
}

// --- the context-parallel merge --------------------------------------------------------------

TEST(FuzzCpu, CpMergeSimulated) {
  // at most 16 small states (8 ranks, draw_cp_shape): < 15 KiB
  run_property("cp_merge_simulated", build_cp_merge_simulated, 16 * 1024);
}

// --- planning -----------------------------------------------------------------------------------

/// plan_cp_merge over random, often huge, shapes: an Error of the documented form naming a
/// `shape.` field the contract rules out, or a plan whose regions are 256-aligned, disjoint and
/// inside workspace_bytes (UBSan reports any overflow in the planner); check_cp_plans_agree
/// names the field that differs.
TEST(FuzzCpu, PlanCpMerge) {
  const bool ok = rc::check("plan_cp_merge", [] {
    const Draw d = draw();
    Ctx c(arena().mem, 64, reinterpret_cast<std::uintptr_t>(arena().mem), 0, MemorySpace::kHost,
          d.seed);
    const std::string err = run_plan_cp_case(c, d.nmut);
    if (!err.empty()) RC_FAIL(err);
  });
  EXPECT_TRUE(ok);
}

/// plan_split_layout over random problems: an Error of the documented form, or a layout that
/// decode accepts (policy kFixedCount/kFixedSize, 1 <= max_splits <= 512, a positive multiple of
/// 16 as split size). UBSan reports any overflow inside the (inline) planner.
TEST(FuzzCpu, PlanSplitLayout) {
  const bool ok = rc::check("plan_split_layout", [] {
    const Draw d = draw();
    Ctx c(arena().mem, kArenaBytes, reinterpret_cast<std::uintptr_t>(arena().mem), arena().wild,
          MemorySpace::kHost, d.seed);
    Rng& r = c.rng;
    attnstate::DecodeProblem p;
    p.batch = r.range(0, 4);
    p.heads_kv = r.range(1, 4);
    p.heads_q = p.heads_kv * r.range(1, 4);
    p.head_dim = 64;
    std::vector<std::int32_t> lens(static_cast<std::size_t>(p.batch));
    for (auto& x : lens)
      x = static_cast<std::int32_t>(r.coin(80) ? r.range(0, 5000) : r.range(0, INT32_MAX));
    attnstate::DecodeOptions o;
    o.policy = r.pick({attnstate::SplitPolicy::kAuto, attnstate::SplitPolicy::kFixedCount,
                       attnstate::SplitPolicy::kFixedSize});
    o.num_splits = static_cast<int>(r.range(1, 512));
    o.split_size = static_cast<int>(16 * r.range(1, 64));
    i64 slots = r.range(1, 1024), ctas = r.range(1, 64);
    const std::int32_t* seq = lens.data();
    // draw the long lengths' split size large enough for at most 512 splits
    if (o.policy == attnstate::SplitPolicy::kFixedSize) {
      std::int32_t m = 0;
      for (auto x : lens) m = std::max(m, x);
      o.split_size = std::max<int>(o.split_size, (m / 512 + 16) / 16 * 16);
    }
    for (int i = 0; i < d.nmut; ++i) {
      switch (r.range(0, 8)) {
        case 0:
          p.batch = r.pick<i64>({-1, kI64Min});
          c.reject("batch < 0", {"problem.batch", "batch", "seq_lens"});
          break;
        case 1:
          if (p.batch < 1) break;
          seq = nullptr;
          c.reject("seq_lens null", {"seq_lens"});
          break;
        case 2:
          if (p.batch < 1 || lens.empty()) break;
          lens[0] = r.pick<std::int32_t>({-1, INT32_MIN});
          c.reject("seq_lens[0] < 0", {"seq_lens"});
          break;
        case 3:
          o.policy = static_cast<attnstate::SplitPolicy>(r.range(3, 255));
          c.reject("options.policy invalid", {"options.policy"});
          break;
        case 4:
          o.policy = attnstate::SplitPolicy::kFixedCount;
          o.num_splits = static_cast<int>(r.pick<i64>({0, -1, 513, INT32_MIN, INT32_MAX}));
          c.reject("options.num_splits", {"options.num_splits"});
          break;
        case 5:
          o.policy = attnstate::SplitPolicy::kFixedSize;
          o.split_size = static_cast<int>(r.pick<i64>({0, -16, 17, INT32_MIN}));
          c.reject("options.split_size", {"options.split_size"});
          break;
        case 6:  // slots or CTAs out of range: documented as counts >= 1
          slots = r.pick<i64>({0, -1, kI64Min, kI64Max});
          c.uncertain = true;
          c.note("slots = " + str(slots));
          break;
        case 7:
          ctas = r.pick<i64>({0, -1, kI64Min, kI64Max, k2p62});
          c.uncertain = true;
          c.note("ctas_per_split = " + str(ctas));
          break;
        case 8:
          p.batch = r.pick<i64>({k2p62, kI64Max});
          c.reject("batch huge (seq_lens has 4 entries)", {"problem.batch", "batch", "seq_lens"});
          seq = nullptr;
          break;
      }
    }
    c.note("batch " + str(p.batch) + ", policy " + std::to_string(static_cast<int>(o.policy)) +
           ", num_splits " + std::to_string(o.num_splits) + ", split_size " +
           std::to_string(o.split_size) + ", slots " + str(slots) + ", ctas " + str(ctas));
    try {
      const attnstate::SplitLayout l = attnstate::plan_split_layout(p, seq, o, slots, ctas);
      RC_ASSERT_FALSE(c.expect_reject);
      const bool policy_ok = l.policy == attnstate::SplitPolicy::kFixedCount ||
                             l.policy == attnstate::SplitPolicy::kFixedSize;
      if (!policy_ok || l.max_splits < 1 || l.max_splits > attnstate::kMaxSplits ||
          (l.policy == attnstate::SplitPolicy::kFixedSize &&
           (l.split_size <= 0 || l.split_size % 16 != 0)))
        RC_FAIL("plan_split_layout returned an invalid layout" + case_log(c));
    } catch (const attnstate::Error& e) {
      const std::string err = check_error(c, e, "attnstate::plan_split_layout");
      if (!err.empty()) RC_FAIL(err + case_log(c));
    }
  });
  EXPECT_TRUE(ok);
}

// --- set_num_threads ----------------------------------------------------------------------------

/// set_num_threads: a bounded count; an accepted one is reported back and the pool works (a tiny
/// merge runs); anything else is an Error naming 'n'. A count of 100000 (issue 16) is refused.
TEST(FuzzCpu, SetNumThreads) {
  const bool ok = rc::check("set_num_threads", [] {
    const Draw d = draw();
    Rng r;
    r.s = d.seed | 1;
    const int n = static_cast<int>(
        d.nmut == 0 ? r.range(0, 4)
                    : r.pick<i64>({-1, -1000, INT32_MIN, 100000, INT32_MAX, 1 << 20, 5, 8}));
    const bool must_reject = n < 0 || n >= 100000;
    try {
      cpu::set_num_threads(n);
      if (must_reject) {
        cpu::set_num_threads(0);
        RC_FAIL("set_num_threads(" + std::to_string(n) + ") accepted");
      }
      if (n > 0) RC_ASSERT(cpu::num_threads() == n);
      std::vector<float> o(8, 1.f), l(2, 0.f), out_o(8), out_l(2);
      const auto a = attnstate::make_const_state_view(o.data(), DType::kF32, l.data(), 2, 1, 4,
                                                      LseBase::kNatural);
      cpu::merge_state(a, a,
                       attnstate::make_state_view(out_o.data(), DType::kF32, out_l.data(), 2, 1, 4,
                                                  LseBase::kNatural));
      RC_ASSERT(out_o[0] == 1.f);
    } catch (const attnstate::Error& e) {
      Ctx c(arena().mem, 64, reinterpret_cast<std::uintptr_t>(arena().mem), 0, MemorySpace::kHost,
            1);
      c.expect_reject = true;
      c.blame = {"n"};
      const std::string err = check_error(c, e, "attnstate::cpu::set_num_threads");
      if (!must_reject) c.uncertain = true;
      if (!err.empty()) RC_FAIL(err);
    }
    cpu::set_num_threads(0);
  });
  EXPECT_TRUE(ok);
}

// --- view factories -----------------------------------------------------------------------------

/// The inline factories over extreme extents: no undefined behaviour (UBSan), fields as given,
/// or an Error of the documented form. A factory's contiguous strides must be exact whenever
/// the product of the extents fits.
TEST(FuzzCpu, ViewFactories) {
  const bool ok = rc::check("view factories", [] {
    const Draw d = draw();
    Rng r;
    r.s = d.seed | 1;
    const auto ext = [&] {
      return d.nmut == 0 ? r.range(0, 5)
                         : r.pick<i64>({0, 1, 3, -1, kI64Min, kI64Max, k2p62, k2p62 + 1,
                                        i64{1} << 31, i64{1} << 32, i64{1} << 40});
    };
    const i64 t = ext(), s = ext(), h = ext(), dim = ext();
    // every partial product of the non-zero extents fits (what a factory may compute)
    const auto fits = [](std::initializer_list<i64> xs) {
      i64 p = 1;
      for (i64 x : xs) {
        if (x == kI64Min) return false;
        if (x != 0 && !attnstate::checked_mul(p, x < 0 ? -x : x, &p)) return false;
      }
      return true;
    };
    static float dummy[4];
    if (kPendingStackFactoryOverflow && !fits({h, dim})) return;
    try {
      const StateView v =
          attnstate::make_state_view(dummy, DType::kF16, dummy, t, h, dim, LseBase::kBase2);
      RC_ASSERT(v.tokens == t && v.heads == h && v.head_dim == dim);
      if (fits({h, dim})) RC_ASSERT(v.o_stride_token == h * dim);
      const StateView hm = attnstate::with_head_major_lse(v, r.coin(50) ? 0 : ext());
      RC_ASSERT(hm.lse_stride_token == 1);
      const ConstStateView cv =
          attnstate::make_const_state_view(dummy, DType::kF32, dummy, t, h, dim, LseBase::kNatural);
      RC_ASSERT(cv.tokens == t);
    } catch (const attnstate::Error& e) {
      Ctx c(arena().mem, 64, reinterpret_cast<std::uintptr_t>(arena().mem), 0, MemorySpace::kHost,
            1);
      c.expect_reject = true;
      c.blame = {"tokens", "heads", "head_dim", "lse_stride_head"};
      const std::string err = check_error(c, e, "attnstate::make_", true);
      if (!err.empty()) RC_FAIL(err);
    }
    if (kPendingStackFactoryOverflow && !fits({t, s, h, dim})) return;
    try {
      const auto order =
          r.coin(50) ? attnstate::StackOrder::kTokensMajor : attnstate::StackOrder::kStatesMajor;
      const auto st = attnstate::make_state_stack(dummy, DType::kF32, dummy, order, t, s, h, dim,
                                                  LseBase::kNatural);
      RC_ASSERT(st.num_states == s);
      if (fits({t, s, h, dim}))
        RC_ASSERT(st.o_stride_token ==
                  (order == attnstate::StackOrder::kTokensMajor ? s * h * dim : h * dim));
    } catch (const attnstate::Error& e) {
      Ctx c(arena().mem, 64, reinterpret_cast<std::uintptr_t>(arena().mem), 0, MemorySpace::kHost,
            1);
      c.expect_reject = true;
      c.blame = {"tokens", "num_states", "heads", "head_dim"};
      const std::string err = check_error(c, e, "attnstate::make_state_stack");
      if (!err.empty()) RC_FAIL(err);
    }
    try {
      const int rank = static_cast<int>(r.range(1, 4));
      const ConstTensorView tv =
          rank == 1   ? attnstate::make_tensor_view(dummy, DType::kBF16, {t})
          : rank == 2 ? attnstate::make_tensor_view(dummy, DType::kBF16, {t, s})
          : rank == 3 ? attnstate::make_tensor_view(dummy, DType::kBF16, {t, s, h})
                      : attnstate::make_tensor_view(dummy, DType::kBF16, {t, s, h, dim});
      RC_ASSERT(tv.rank == rank && tv.stride[rank - 1] == 1);
      if (rank == 4 && fits({t, s, h, dim})) RC_ASSERT(tv.stride[0] == s * h * dim);
    } catch (const attnstate::Error& e) {
      Ctx c(arena().mem, 64, reinterpret_cast<std::uintptr_t>(arena().mem), 0, MemorySpace::kHost,
            1);
      c.expect_reject = true;
      c.blame = {"dims", "shape"};
      const std::string err = check_error(c, e, "attnstate::make_tensor_view");
      if (!err.empty()) RC_FAIL(err);
    }
  });
  EXPECT_TRUE(ok);
}

// --- the testing kit ----------------------------------------------------------------------------

/// HostState / HostTensor constructors and HostState::from_view: shapes either tiny or past
/// 2^62 elements (never large-but-fitting: that is a real allocation), invalid enums; from_view
/// over arena views (the arena must be unchanged, the copy equal to the view).
TEST(FuzzKit, PublicConstructors) {
  const bool ok = rc::check("testing kit constructors", [] {
    const Draw d = draw();
    Ctx c(arena().mem, kArenaBytes, reinterpret_cast<std::uintptr_t>(arena().mem), arena().wild,
          MemorySpace::kHost, d.seed);
    Rng& r = c.rng;
    const auto ext = [&](bool bad) {
      return !bad ? r.range(0, 4) : r.pick<i64>({-1, kI64Min, kI64Max, k2p62 + 1});
    };
    const int which = static_cast<int>(r.range(0, 2));
    std::string func;
    std::function<void()> call;
    if (which == 0) {
      const int badf = d.nmut > 0 ? static_cast<int>(r.range(0, 4)) : -1;
      const i64 t = ext(badf == 0), h = ext(badf == 1), dim = ext(badf == 2);
      const DType dt = badf == 3 ? static_cast<DType>(r.range(5, 255)) : draw_dtype(r);
      const LseBase base = badf == 4 ? static_cast<LseBase>(r.range(2, 255)) : draw_base(r);
      // tiny extents with one huge one can still fit (e.g. 0 * huge): only then is it valid
      const bool small = t >= 0 && h >= 0 && dim >= 0 && t <= 4 && h <= 4 && dim <= 4;
      const bool enums =
          attnstate::is_valid(dt) && (base == LseBase::kNatural || base == LseBase::kBase2);
      // 0 x huge is an empty state of a huge extent: acceptable either way
      if (enums && !small && t >= 0 && h >= 0 && dim >= 0 && (t == 0 || h == 0 || dim == 0))
        c.uncertain = true;
      else if (!small || !enums)
        c.reject("HostState extents/enums", {"tokens", "heads", "head_dim", "dtype", "base"});
      c.note("HostState(" + str(t) + ", " + str(h) + ", " + str(dim) + ", dtype " +
             std::to_string(static_cast<int>(dt)) + ", base " +
             std::to_string(static_cast<int>(base)) + ")");
      func = "attnstate::testing::HostState";
      call = [=] {
        attnstate::testing::HostState s(t, h, dim, dt, base);
        if (s.tokens() != t || s.lse_values().size() != static_cast<std::size_t>(t * h))
          throw std::logic_error("HostState has the wrong shape");
      };
    } else if (which == 1) {
      const int rank =
          static_cast<int>(d.nmut > 0 && r.coin(30) ? r.pick<i64>({0, 5, 6}) : r.range(1, 4));
      std::vector<i64> shape(static_cast<std::size_t>(rank));
      const int badf = d.nmut > 0 ? static_cast<int>(r.range(0, rank)) : -1;
      for (int i = 0; i < rank; ++i) shape[static_cast<std::size_t>(i)] = ext(i == badf);
      const DType dt =
          d.nmut > 0 && r.coin(20) ? static_cast<DType>(r.range(5, 255)) : draw_dtype(r);
      const i64 n = attnstate::checked_product(shape.data(), rank);
      const bool valid = rank >= 1 && rank <= 4 && n >= 0 && n <= 256 && attnstate::is_valid(dt);
      bool negative = false;
      for (auto x : shape) negative = negative || x < 0;
      if (!valid && (negative || rank < 1 || rank > 4 || !attnstate::is_valid(dt) || n < 0))
        c.reject("HostTensor shape/dtype", {"shape", "dtype"});
      else if (!valid)
        c.uncertain = true;
      std::string s;
      for (auto x : shape) s += " " + str(x);
      c.note("HostTensor(dtype " + std::to_string(static_cast<int>(dt)) + ", shape" + s + ")");
      const bool from = r.coin(50);
      const bool wrong_count = from && d.nmut > 0 && r.coin(50);
      if (wrong_count && valid)
        c.reject("from_floats with a wrong value count", {"values", "shape"});
      func =
          from ? "attnstate::testing::HostTensor::from_floats" : "attnstate::testing::HostTensor";
      call = [=] {
        if (from) {
          std::vector<float> vals(static_cast<std::size_t>(valid ? n + (wrong_count ? 1 : 0) : 3),
                                  0.5f);
          attnstate::testing::HostTensor::from_floats(dt, shape, vals);
        } else {
          attnstate::testing::HostTensor tt(dt, shape);
          if (tt.numel() != n) throw std::logic_error("HostTensor has the wrong numel");
        }
      };
    } else {
      const i64 t = r.range(0, 3), h = r.range(1, 3), dim = r.range(1, 4);
      auto s = std::make_shared<StateArg>(
          make_state(c, "view", t, h, dim, false, draw_dtype(r), draw_base(r)));
      apply_mutations(c, d.nmut, {[&] { return mutate_state(c, *s, {}); }});
      // the kit's extents may be 0 (HostState(0, 0, 0) is its default): a 0 head count or
      // head_dim is not an error there
      if (s->v.heads == 0 || s->v.head_dim == 0) c.uncertain = c.accept_ok = true;
      for (const auto& l : c.log)
        if (kPendingFromViewAlignment && l.find("misaligned") != std::string::npos) return;
      c.note(describe(*s, c));
      func = "attnstate::testing::HostState::from_view";
      call = [s] {
        const auto h2 = attnstate::testing::HostState::from_view(s->v);
        for (i64 ti = 0; ti < s->v.tokens; ++ti)
          for (i64 hi = 0; hi < s->v.heads; ++hi) {
            const float want = s->v.lse[ti * s->v.lse_stride_token + hi * s->v.lse_stride_head];
            const float got = h2.lse(ti, hi);
            if (std::memcmp(&want, &got, 4) != 0) throw std::logic_error("from_view: LSE differs");
          }
      };
    }
    const std::string err = run_case<CpuBackend>(c, {func, call});
    if (!err.empty()) RC_FAIL(err);
  });
  EXPECT_TRUE(ok);
}

// --- the harness's own negative tests ---------------------------------------------------------

/// A broken merge_state: writes one float past the end of out's LSEs (a canary), or one into
/// a.o (an input), or accepts a call it must reject. The oracle must flag each.
struct BrokenBackend : CpuBackend {
  static int mode;
  static void merge_state(ConstStateView a, ConstStateView b, StateView out, TokenMask m = {}) {
    if (mode == 2) return;  // accepts everything, writes nothing
    cpu::merge_state(a, b, out, m);
    if (out.tokens == 0) return;
    if (mode == 0)
      out.lse[(out.tokens - 1) * out.lse_stride_token + (out.heads - 1) * out.lse_stride_head + 1 +
              4] = 1.f;
    if (mode == 1) *static_cast<std::uint8_t*>(const_cast<void*>(a.o)) ^= 0x5A;
  }
  /// Mode 3: reads a mask of stride >= 2 as a contiguous one (a wrong stride computation; it
  /// then reads only inside the mask's span).
  static void merge_state_inplace(StateView acc, ConstStateView o, TokenMask m) {
    if (mode == 3 && m.stride > 1) m.stride = 1;
    cpu::merge_state_inplace(acc, o, m);
  }
};
int BrokenBackend::mode = 0;

TEST(FuzzHarness, CatchesWritesOutsideOutputsAndAcceptedInvalidCalls) {
  for (int mode = 0; mode < 3; ++mode) {
    BrokenBackend::mode = mode;
    int flagged = 0, eligible = 0;
    for (std::uint64_t seed = 1; seed <= 400; ++seed) {
      Ctx c(arena().mem, kArenaBytes, reinterpret_cast<std::uintptr_t>(arena().mem), arena().wild,
            MemorySpace::kHost, seed);
      const Built b = build_merge_state<BrokenBackend>(c, mode == 2 ? 1 : 0);
      // mode 2 must be caught on invalid calls, the others on valid ones
      if (mode == 2 ? c.expect_reject : !c.expect_reject) ++eligible;
      const std::string err = run_case<BrokenBackend>(c, b);
      if (!err.empty()) ++flagged;
    }
    // modes 0/1 are caught on every valid call with rows; mode 2 on every invalid call
    EXPECT_GT(flagged, eligible / 2) << "mode " << mode;
    EXPECT_GT(eligible, 50) << "mode " << mode;
  }
}

/// A masked in-place merge that misreads a strided mask writes tokens the mask leaves out: the
/// oracle, which allows only the selected tokens' rows, must flag it.
TEST(FuzzHarness, CatchesAMaskReadWithTheWrongStride) {
  BrokenBackend::mode = 3;
  int flagged = 0, cases = 0;
  for (std::uint64_t seed = 1; seed <= 1000; ++seed) {
    Ctx c(arena().mem, kArenaBytes, reinterpret_cast<std::uintptr_t>(arena().mem), arena().wild,
          MemorySpace::kHost, seed);
    const Built b = build_merge_state_inplace<BrokenBackend>(c, 0);
    ++cases;
    if (!run_case<BrokenBackend>(c, b).empty()) ++flagged;
  }
  BrokenBackend::mode = 0;
  // about 1 case in 12 has a mask of stride >= 2 over 2+ tokens whose misread flags differ
  EXPECT_GT(flagged, cases / 50);
}

/// The error check itself: a wrong status, a message without ", got", an innocent argument.
TEST(FuzzHarness, CatchesBadErrors) {
  Ctx c(arena().mem, 64, reinterpret_cast<std::uintptr_t>(arena().mem), 0, MemorySpace::kHost, 1);
  c.reject("test", {"a.tokens"});
  const std::string f = "attnstate::cpu::merge_state";
  EXPECT_EQ(check_error(c,
                        attnstate::Error(attnstate::Status::kInvalidArgument,
                                         f + ": argument 'a.tokens': expected >= 0, got -1"),
                        f),
            "");
  EXPECT_NE(check_error(c,
                        attnstate::Error(attnstate::Status::kInternal,
                                         f + ": argument 'a.tokens': expected >= 0, got -1"),
                        f),
            "");
  EXPECT_NE(check_error(c,
                        attnstate::Error(attnstate::Status::kInvalidArgument,
                                         f + ": argument 'a.tokens': expected >= 0"),
                        f),
            "");
  EXPECT_NE(check_error(c,
                        attnstate::Error(attnstate::Status::kInvalidArgument,
                                         f + ": argument 'b.o': expected x, got y"),
                        f),
            "");
  EXPECT_NE(check_error(c,
                        attnstate::Error(attnstate::Status::kInvalidArgument,
                                         "merge_state: argument 'a.tokens': expected x, got y"),
                        f),
            "");
}

}  // namespace
