/// @file conformance.cpp
/// @brief `check_state_kernel`: the laws of attention states as RapidCheck properties over a
///        user kernel, run with explicit parameters and reported per law.
#include "attnstate/testing/conformance.hpp"

#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <sstream>

#include "arg_checks.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/testing/mla.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "option_checks.hpp"

namespace attnstate {
namespace testing {

namespace {

/// RapidCheck's nominal size at which choices are uniform over their whole range.
constexpr int kFullSize = 100;

/// A listener that prints nothing: the report carries the result.
class QuietListener : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

/// Fails the current case with `message` as its whole description. Unlike `RC_FAIL`, which
/// prefixes the kit's own source location and macro text, the report then shows only what the
/// law says; shrinking and the seed are unaffected (RC_FAIL throws the same `CaseResult`).
[[noreturn]] void fail(const std::string& message) {
  throw rc::detail::CaseResult(rc::detail::CaseResult::Type::Failure, message);
}

bool is_law(Law law) {
  const std::vector<Law> laws = all_laws();
  return std::find(laws.begin(), laws.end(), law) != laws.end();
}

/// The checks of the problem options of each kind of kernel.
void check_gen_options(const ProblemGenOptions& o, const char* func, const char* arg) {
  check_problem_gen_options(o, func, arg);
}
void check_gen_options(const MlaGenOptions& o, const char* func, const char* arg) {
  kit::check_mla_gen_options(o, func, arg);
}

/// Rejects options that cannot be checked, before any case runs, so that a bad option is never
/// reported as a failure of the kernel.
template <class Fn, class Options>
void check_options(const Fn& fn, const Options& o, const char* func, const char* kernel_type) {
  if (!fn)
    detail::throw_argument(func, "fn", "a callable kernel", std::string("an empty ") + kernel_type);
  check_gen_options(o.problems, func, "options.problems");
  if (o.laws.empty()) {
    detail::throw_argument(func, "options.laws", "at least one law (the default is all_laws())",
                           "an empty list");
  }
  for (std::size_t i = 0; i < o.laws.size(); ++i) {
    const std::string name = "options.laws[" + std::to_string(i) + "]";
    if (!is_law(o.laws[i])) {
      detail::throw_argument(func, name.c_str(), "a Law (kExactness ... kDeterminism)",
                             "value " + std::to_string(static_cast<int>(o.laws[i])));
    }
    if (std::find(o.laws.begin(), o.laws.begin() + static_cast<std::ptrdiff_t>(i), o.laws[i]) !=
        o.laws.begin() + static_cast<std::ptrdiff_t>(i)) {
      detail::throw_argument(func, name.c_str(), "each law at most once",
                             std::string(to_string(o.laws[i])) + " again");
    }
  }
  if (o.num_tests < 1) {
    detail::throw_argument(func, "options.num_tests", ">= 1", std::to_string(o.num_tests));
  }
  if (o.max_parts < 1) {
    detail::throw_argument(func, "options.max_parts", ">= 1", std::to_string(o.max_parts));
  }
  if (!(std::isfinite(o.tolerance_factor) && o.tolerance_factor > 0)) {
    detail::throw_argument(func, "options.tolerance_factor", "a finite value > 0",
                           show_number(o.tolerance_factor));
  }
}

std::string show_keys(const std::vector<std::int64_t>& keys) {
  std::ostringstream ss;
  ss << "{";
  for (std::size_t i = 0; i < keys.size(); ++i) ss << (i ? ", " : "") << keys[i];
  ss << "}";
  return ss.str();
}

/// A kernel under test of problems of type `P`.
template <class P>
using KernelOf = std::function<HostState(const P&, const std::vector<std::int64_t>&)>;

/// The state of `p`'s queries over `keys` in double, LSEs in `base`: the reference of each kind
/// of problem.
ReferenceState reference_of(const AttentionProblem& p, const std::vector<std::int64_t>& keys,
                            LseBase base) {
  return reference_state(p, keys, base);
}
ReferenceState reference_of(const MlaProblem& p, const std::vector<std::int64_t>& keys,
                            LseBase base) {
  return reference_mla_state(p, keys, base);
}
/// As above, in the problem's requested base.
template <class P>
ReferenceState reference_of(const P& p, const std::vector<std::int64_t>& keys) {
  return reference_of(p, keys, p.base);
}

/// A problem drawn from the options of its kind.
AttentionProblem draw_problem(const ProblemGenOptions& o) { return *gen_attention_problem(o); }
MlaProblem draw_problem(const MlaGenOptions& o) { return *gen_mla_problem(o); }

/// An MLA problem and a partition of its keys, drawn as one value (as `PartitionedProblem`).
struct PartitionedMlaProblem {
  MlaProblem problem;                            ///< The problem.
  std::vector<std::vector<std::int64_t>> parts;  ///< Disjoint parts covering all its keys.
};
void showValue(const PartitionedMlaProblem& value, std::ostream& os) {
  os << value.problem << "\nparts:";
  for (const auto& part : value.parts) os << " " << show_keys(part);
}

/// A problem and a partition of its keys into up to `max_parts` parts.
PartitionedProblem draw_partitioned(const ProblemGenOptions& o, int max_parts) {
  return *gen_partitioned_problem(o, max_parts);
}
PartitionedMlaProblem draw_partitioned(const MlaGenOptions& o, int max_parts) {
  return *rc::gen::exec([o, max_parts] {
    PartitionedMlaProblem pp;
    pp.problem = *gen_mla_problem(o);
    pp.parts = *gen_partition(pp.problem.num_keys(), max_parts);
    return pp;
  });
}

/// Calls the kernel; an exception it throws fails the case with its message.
template <class P>
HostState call(const KernelOf<P>& fn, const P& p, const std::vector<std::int64_t>& keys,
               const char* law) {
  try {
    return fn(p, keys);
  } catch (const std::exception& e) {
    fail(std::string(law) + ": the kernel threw for keys " + show_keys(keys) + ": " + e.what());
  }
}

template <class P, class Options>
Tolerance law_tolerance(const P& p, const Options& opt) {
  return tolerance_for(p, opt.p_rounded_to_input).scaled(opt.tolerance_factor);
}

template <class GenOptions>
GenOptions with_keys_and_logits(GenOptions o, int large_percent) {
  o.min_keys = std::max<std::int64_t>(1, o.min_keys);
  o.max_keys = std::max(o.max_keys, o.min_keys);
  if (large_percent >= 0) o.large_logits_percent = large_percent;
  return o;
}

/// Most times a sink may be merged into one row that the failure hints look for.
constexpr int kMostSinkMerges = 8;

/// For a problem with sinks whose kernel state `out` over `keys` failed: "" when no simple sink
/// mistake explains it (or `out` is right about the sink), else a line saying how many times the
/// sink seems merged into `out`: the `k` (0, or 2 to 8) for which `out` matches the sink-free
/// reference with the sink merged `k` times. `what` names the state (e.g. "fn(all keys)").
template <class P>
std::string sink_hint(const HostState& out, const P& p, const std::vector<std::int64_t>& keys,
                      const Tolerance& tol, const std::string& what) {
  if (!p.has_sinks()) return {};
  const ReferenceState sink_free = reference_of(without_sinks(p), keys);
  ReferenceState ref = apply_sinks(sink_free, p.sinks);
  if (compare_states(out, ref, tol).empty()) return {};
  if (compare_states(out, sink_free, tol).empty()) {
    return "\n" + what + " matches the reference without the sinks: are the sinks ignored?";
  }
  for (int k = 2; k <= kMostSinkMerges; ++k) {
    ref = apply_sinks(ref, p.sinks);
    if (compare_states(out, ref, tol).empty()) {
      return "\n" + what + " matches the reference with the sink merged " + std::to_string(k) +
             " times: a sink is merged once, after every split (merged into each of k splits or "
             "partials it counts k times)";
    }
  }
  return {};
}

/// Whether the partial state `part` (asked for over `keys` of `without_sinks(p)`) is instead the
/// state with `p`'s sinks: it matches that and not the sink-free reference.
template <class P, class Options>
bool carries_the_sink(const HostState& part, P p, const std::vector<std::int64_t>& keys,
                      const Options& opt) {
  p.base = part.base();
  const Tolerance tol = law_tolerance(p, opt).scaled(2.0);
  return compare_states(part, reference_of(p, keys), tol).empty() &&
         !compare_states(part, reference_of(without_sinks(p), keys), tol).empty();
}

template <class P, class Options>
void law_exactness(const KernelOf<P>& fn, const Options& opt) {
  const P p = draw_problem(opt.problems);
  const auto keys = *gen_key_subset(p.num_keys());
  const HostState out = call(fn, p, keys, "exactness");
  const Tolerance tol = law_tolerance(p, opt);
  const std::string msg = compare_states(out, reference_of(p, keys), tol);
  if (!msg.empty()) {
    fail("exactness: fn(K) differs from the double-precision reference, K = " + show_keys(keys) +
         sink_hint(out, p, keys, tol, "fn(K)") + "\n" + msg);
  }
}

template <class P, class Options>
void law_split_merge(const KernelOf<P>& fn, const Options& opt) {
  const auto pp = draw_partitioned(opt.problems, opt.max_parts);
  const P& p = pp.problem;
  // Each part is requested in a random base among the allowed ones (mixed bases), so the
  // merge also checks that every returned state's base tag is honoured.
  // Drawn at full size: at the small sizes of the first cases `inRange` would give base 0 only.
  const std::vector<LseBase>& bases = opt.problems.bases;
  const auto base_of_part = *rc::gen::container<std::vector<std::size_t>>(
      pp.parts.size(), rc::gen::resize(kFullSize, rc::gen::inRange<std::size_t>(0, bases.size())));
  const std::vector<std::int64_t> all = all_keys(p.num_keys());
  const HostState whole = call(fn, p, all, "split_merge");
  // The parts are partial states: asked for without the sinks, which are merged once, after
  // their ⊕ (a kernel that merges the sink into every partial counts it once per part).
  const P partial = without_sinks(p);
  std::vector<HostState> parts;
  std::ostringstream desc;
  for (std::size_t i = 0; i < pp.parts.size(); ++i) {
    P pi = partial;
    pi.base = bases[base_of_part[i]];
    parts.push_back(call(fn, pi, pp.parts[i], "split_merge"));
    desc << (i ? ", " : "") << "P" << i + 1 << " = " << show_keys(pp.parts[i]) << " ("
         << to_string(parts.back().base()) << ")";
  }
  ReferenceState merged = apply_sinks(reference_merge(parts, p.base), p.sinks);
  // The scale of the parts' rounding errors (of P, and of each stored o_j, |o_j| <= M_j): the
  // merge weights average the parts' magnitudes M_j into that of the whole key set (scaled, with
  // sinks, by the sink's weight, as o is).
  merged.o_magnitude = reference_of(p, all).o_magnitude;
  const Tolerance tol = law_tolerance(p, opt).scaled(2.0);
  const std::string msg = compare_states(whole, merged, tol);
  if (!msg.empty()) {
    std::ostringstream ss;
    ss << "split_merge: fn(all keys) differs from the ⊕ of fn over the " << parts.size()
       << " parts " << desc.str() << " (⊕ in double over the kernel's outputs"
       << (p.has_sinks() ? ", the parts asked for without sinks, then the sinks merged once" : "")
       << ")";
    if (p.has_sinks()) {
      for (std::size_t i = 0; i < parts.size(); ++i) {
        if (carries_the_sink(parts[i], p, pp.parts[i], opt)) {
          ss << "\nfn(P" << i + 1 << ") was asked for a partial state (the problem without sinks) "
             << "and returned the state with the sink: a partial stays sink-free, the sink is "
                "merged once at the end";
          break;
        }
      }
      ss << sink_hint(whole, p, all, tol, "fn(all keys)");
    }
    ss << "\n" << msg;
    fail(ss.str());
  }
}

template <class P, class Options>
void law_identity(const KernelOf<P>& fn, const Options& opt) {
  const P p = draw_problem(opt.problems);
  // The identity is the sink-free empty state (a partial over no keys).
  const P partial = without_sinks(p);
  const HostState out = call(fn, partial, {}, "identity");
  const std::string msg = compare_states(out, reference_of(partial, {}), Tolerance{});
  if (!msg.empty()) {
    fail("identity: fn(∅) must be exactly the empty state (o = 0, lse = -inf)" +
         std::string(p.has_sinks() ? " for the problem without sinks" : "") + "\n" + msg);
  }
  if (!p.has_sinks()) return;
  // With sinks, an empty row is the sink's state: o exactly 0 (an empty o is never a factor),
  // the LSE that of the sink.
  const HostState sunk = call(fn, p, {}, "identity");
  Tolerance exact_o = law_tolerance(p, opt);
  exact_o.o_abs = exact_o.o_rel = exact_o.o_magnitude_rel = 0;
  const std::string with = compare_states(sunk, reference_of(p, {}), exact_o);
  if (!with.empty()) {
    fail(
        "identity: with sinks, fn(∅) must be the sink state (o = 0, lse = s_h): an empty row "
        "merged with its sink becomes (0, s_h)" +
        sink_hint(sunk, p, {}, exact_o, "fn(∅)") + "\n" + with);
  }
}

template <class P, class Options>
void law_declared_base(const KernelOf<P>& fn, const Options& opt) {
  const P p = draw_problem(with_keys_and_logits(opt.problems, -1));
  const auto keys = all_keys(p.num_keys());
  const HostState out = call(fn, p, keys, "declared_base");
  if (out.base() != p.base) {
    fail(std::string("declared_base: the state is declared ") + to_string(out.base()) + " but " +
         to_string(p.base) + " was requested");
  }
  Tolerance lse_only = law_tolerance(p, opt);
  lse_only.o_abs = lse_only.o_rel = 1e300;
  const std::string msg = compare_states(out, reference_of(p, keys, out.base()), lse_only);
  if (msg.empty()) return;
  const LseBase other = out.base() == LseBase::kBase2 ? LseBase::kNatural : LseBase::kBase2;
  HostState relabeled = out;
  relabeled.relabel_base(other);
  if (compare_states(relabeled, reference_of(p, keys, other), lse_only).empty()) {
    fail(std::string("declared_base: the LSEs do not match the declared base ") +
         to_string(out.base()) + ": they are " + to_string(other) + " LSEs declared " +
         to_string(out.base()) + " (the classic mixed-base bug)\n" + msg);
  }
  // Relabelling does not fix it: the LSEs are wrong in either base, so this is not a base
  // problem; report the whole state against the reference, as the exactness law does.
  const Tolerance tol = law_tolerance(p, opt);
  const std::string full = compare_states(out, reference_of(p, keys), tol);
  fail(
      "declared_base: an exactness failure, not a base problem (the LSEs match the reference in "
      "neither base): fn(all keys) differs from the double-precision reference" +
      sink_hint(out, p, keys, tol, "fn(all keys)") + "\n" + (full.empty() ? msg : full));
}

template <class P, class Options>
void law_large_logits(const KernelOf<P>& fn, const Options& opt) {
  const P p = draw_problem(with_keys_and_logits(opt.problems, 100));
  const auto keys = all_keys(p.num_keys());
  const HostState out = call(fn, p, keys, "large_logits");
  const ReferenceState ref = reference_of(p, keys);
  for (std::int64_t t = 0; t < out.tokens() && t < ref.tokens; ++t) {
    for (std::int64_t h = 0; h < out.heads() && h < ref.heads; ++h) {
      // a row whose window holds none of the keys is the empty state (compared below)
      if (std::isinf(ref.lse_at(t, h))) continue;
      bool finite = std::isfinite(out.lse(t, h));
      for (std::int64_t d = 0; d < out.head_dim() && finite; ++d) {
        finite = std::isfinite(out.o(t, h, d));
      }
      if (!finite) {
        std::ostringstream ss;
        ss << "large_logits: inf/NaN in row [" << t << "," << h << "] (lse " << out.lse(t, h)
           << ", o[0] " << out.o(t, h, 0) << ") with scores up to " << max_abs_score(p)
           << " in magnitude: is the running max subtracted before exponentiating?";
        fail(ss.str());
      }
    }
  }
  const Tolerance tol = law_tolerance(p, opt);
  const std::string msg = compare_states(out, ref, tol);
  if (!msg.empty()) {
    fail("large_logits: differs from the double-precision reference" +
         sink_hint(out, p, keys, tol, "fn(all keys)") + "\n" + msg);
  }
}

template <class P, class Options>
void law_determinism(const KernelOf<P>& fn, const Options& opt) {
  const P p = draw_problem(opt.problems);
  const auto keys = *gen_key_subset(p.num_keys());
  const HostState a = call(fn, p, keys, "determinism");
  const HostState b = call(fn, p, keys, "determinism");
  const std::string msg = compare_bitwise(a, b);
  if (!msg.empty()) {
    fail("determinism: two calls on the same inputs differ, K = " + show_keys(keys) + "\n" + msg);
  }
}

}  // namespace

const char* to_string(Law law) {
  switch (law) {
    case Law::kExactness:
      return "exactness";
    case Law::kSplitMerge:
      return "split_merge";
    case Law::kIdentity:
      return "identity";
    case Law::kDeclaredBase:
      return "declared_base";
    case Law::kLargeLogits:
      return "large_logits";
    case Law::kDeterminism:
      return "determinism";
  }
  return "unknown";
}

std::vector<Law> all_laws() {
  return {Law::kExactness,    Law::kSplitMerge,  Law::kIdentity,
          Law::kDeclaredBase, Law::kLargeLogits, Law::kDeterminism};
}

std::uint64_t default_seed() { return rc::detail::configuration().testParams.seed; }

namespace {

/// The reproduce line, the one place a report prints its seed.
std::string reproduce_line(std::uint64_t seed, const char* option) {
  return "reproduce with RC_PARAMS=\"seed=" + std::to_string(seed) + "\" (or " + option +
         " set to that seed)";
}

/// A failure as RapidCheck shows it, each drawn value under its label: "<label> (<type>):",
/// or "value <i> (<type>):" past the labels given.
void print_failure(const rc::detail::FailureResult& failure, const std::vector<std::string>& labels,
                   std::ostream& os) {
  const std::size_t shrinks = failure.reproduce.shrinkPath.size();
  os << "Falsifiable after " << failure.numSuccess + 1 << " test"
     << (failure.numSuccess == 0 ? "" : "s") << " and " << shrinks << " shrink"
     << (shrinks == 1 ? "" : "s") << "\n";
  for (std::size_t i = 0; i < failure.counterExample.size(); ++i) {
    const auto& value = failure.counterExample[i];
    os << "\n"
       << (i < labels.size() ? labels[i] : "value " + std::to_string(i + 1)) << " (" << value.first
       << "):\n"
       << value.second << "\n";
  }
  os << "\n" << failure.description;
}

PropertyResult run_property_impl(const std::string& name, const std::function<void()>& property,
                                 int num_tests, std::uint64_t seed, bool shrink,
                                 const std::vector<std::string>& labels, const char* seed_option) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = num_tests;
  params.seed = seed != 0 ? seed : default_seed();
  params.disableShrinking = !shrink;
  rc::detail::TestMetadata metadata;
  metadata.id = name;
  metadata.description = name;
  QuietListener listener;
  const rc::detail::TestResult result =
      rc::detail::checkProperty(rc::detail::toProperty(property), metadata, params, listener);

  PropertyResult out;
  out.name = name;
  if (result.is<rc::detail::SuccessResult>()) {
    out.passed = true;
    out.num_tests = result.get<rc::detail::SuccessResult>().numSuccess;
    return out;
  }
  std::ostringstream ss;
  ss << "law '" << name << "' broke\n";
  if (result.is<rc::detail::FailureResult>()) {
    const auto& failure = result.get<rc::detail::FailureResult>();
    out.num_tests = failure.numSuccess;
    print_failure(failure, labels, ss);
  } else {
    rc::detail::printResultMessage(result, ss);
  }
  ss << "\n" << reproduce_line(params.seed, seed_option);
  out.message = ss.str();
  return out;
}

}  // namespace

PropertyResult run_property(const std::string& name, const std::function<void()>& property,
                            int num_tests, std::uint64_t seed, bool shrink,
                            const std::vector<std::string>& labels) {
  const char* func = "attnstate::testing::run_property";
  if (!property)
    detail::throw_argument(func, "property", "a callable property", "an empty function");
  if (num_tests < 1) detail::throw_argument(func, "num_tests", ">= 1", std::to_string(num_tests));
  return run_property_impl(name, property, num_tests, seed, shrink, labels,
                           "run_property's seed argument");
}

bool KernelCheckReport::passed() const {
  return std::all_of(laws.begin(), laws.end(), [](const LawResult& r) { return r.passed; });
}

bool KernelCheckReport::failed(Law law) const {
  return std::any_of(laws.begin(), laws.end(),
                     [law](const LawResult& r) { return r.law == law && !r.passed; });
}

std::string KernelCheckReport::failed_laws() const {
  std::string out;
  for (const LawResult& r : laws) {
    if (r.passed) continue;
    if (!out.empty()) out += ", ";
    out += r.name;
  }
  return out;
}

std::string KernelCheckReport::summary() const {
  std::ostringstream ss;
  for (const LawResult& r : laws) {
    ss << (r.passed ? "PASS " : "FAIL ") << r.name << " (" << r.num_tests << " cases passed)\n";
  }
  // Each message ends with the same reproduce line (one seed for every law): printed once, last.
  const std::string reproduce = "\n" + reproduce_line(seed, seed_option.c_str());
  for (const LawResult& r : laws) {
    if (r.passed) continue;
    const bool ends =
        r.message.size() >= reproduce.size() &&
        r.message.compare(r.message.size() - reproduce.size(), reproduce.size(), reproduce) == 0;
    ss << "\n"
       << (ends ? r.message.substr(0, r.message.size() - reproduce.size()) : r.message) << "\n";
  }
  // The seed once, for the whole report: every law ran with it.
  if (passed()) {
    ss << "seed " << seed;
  } else {
    ss << reproduce_line(seed, seed_option.c_str());
  }
  return ss.str();
}

namespace {

/// Runs the laws of `options` over `fn` (the options checked); `seed_option` names the options'
/// seed field in the report.
template <class P, class Options>
KernelCheckReport run_laws(const KernelOf<P>& fn, const Options& options, const char* seed_option) {
  KernelCheckReport report;
  report.seed = options.seed != 0 ? options.seed : default_seed();
  report.seed_option = seed_option;
  for (Law law : options.laws) {
    std::function<void()> property;
    // What each law draws, in order (the labels of its counterexample's values).
    std::vector<std::string> labels = {"problem"};
    switch (law) {
      case Law::kExactness:
        property = [&] { law_exactness(fn, options); };
        labels.push_back("keys K, indices into the problem's keys");
        break;
      case Law::kSplitMerge:
        property = [&] { law_split_merge(fn, options); };
        labels = {"problem and its partition P1, ..., Pn of the keys",
                  "base of each part, an index into options.problems.bases"};
        break;
      case Law::kIdentity:
        property = [&] { law_identity(fn, options); };
        break;
      case Law::kDeclaredBase:
        property = [&] { law_declared_base(fn, options); };
        break;
      case Law::kLargeLogits:
        property = [&] { law_large_logits(fn, options); };
        break;
      case Law::kDeterminism:
        property = [&] { law_determinism(fn, options); };
        labels.push_back("keys K, indices into the problem's keys");
        break;
    }
    LawResult r;
    static_cast<PropertyResult&>(r) =
        run_property_impl(to_string(law), property, options.num_tests, report.seed, options.shrink,
                          labels, seed_option);
    r.law = law;
    report.laws.push_back(std::move(r));
  }
  return report;
}

}  // namespace

KernelCheckReport check_state_kernel(const StateKernel& fn, const KernelCheckOptions& options) {
  check_options(fn, options, "attnstate::testing::check_state_kernel", "StateKernel");
  return run_laws(fn, options, "KernelCheckOptions::seed");
}

KernelCheckReport check_mla_kernel(const MlaKernel& fn, const MlaKernelCheckOptions& options) {
  check_options(fn, options, "attnstate::testing::check_mla_kernel", "MlaKernel");
  return run_laws(fn, options, "MlaKernelCheckOptions::seed");
}

}  // namespace testing
}  // namespace attnstate
