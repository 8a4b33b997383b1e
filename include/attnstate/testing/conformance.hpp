/// @file conformance.hpp
/// @brief `check_state_kernel`: property-tests a user's attention kernel against the algebra of
///        attention states (exactness, split/merge, identity, declared base, large logits,
///        determinism) and reports which law broke, the shrunk minimal case and the seed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/mla.hpp"
#include "attnstate/testing/problem.hpp"

namespace attnstate {
namespace testing {

/// A kernel under test: returns the attention state of `problem`'s queries over the keys
/// `keys` (indices into `problem.k` / `problem.v`, sorted, possibly empty). Use
/// `select_keys(problem, keys)` to get a problem holding only those keys and
/// `make_output_state(problem)` for an output shaped `(tokens, H_q, head_dim)` in the
/// requested dtype and base. The returned state's base tag is its declared base.
///
/// Problems carry a variant when `KernelCheckOptions::problems` asks for one
/// (`soft_cap_percent`, `window_percent`, or `variant_problem_options()`): the kernel then
/// soft-caps every score (`problem.variant.logits_soft_cap`) and computes row `t` over
/// `visible_keys(problem, t, keys)` (the empty state when that is empty); `select_keys` keeps
/// the variant and the keys' positions, so a kernel taking positions reads them from the
/// selected problem. Every law holds unchanged for these problems.
///
/// Problems carry attention sinks when `KernelCheckOptions::problems.sink_percent > 0`
/// (`sink_problem_options()`): `problem.sinks` holds one natural-base logit per query head, and
/// the kernel returns the state of `keys` with the sinks, each row merged once with
/// `(0, problem.sinks[h])` after all its keys (its LSE includes the sink; an empty row is
/// `(0, s_h)`); `select_keys` keeps them and `problem.attention_sinks()` passes them as the
/// library's decode and cascade calls take them. Empty `problem.sinks` means no sinks: the kit
/// asks for partial states that way (the parts of `kSplitMerge`, the identity's `fn(∅)`), and a
/// kernel must then add none (a sink merged into every partial counts once per partial).
using StateKernel = std::function<HostState(const AttentionProblem& problem,
                                            const std::vector<std::int64_t>& keys)>;

/// The laws `check_state_kernel` property-tests.
enum class Law {
  kExactness,  ///< `fn(K)` matches the double-precision reference for a random key subset K.
  kSplitMerge,  ///< `fn(P1 ∪ … ∪ Pn) ≈ fn(P1) ⊕ … ⊕ fn(Pn)` for a random partition (empty
                ///< and one-key parts included, each part requested in a random base, the
                ///< merge in double); n = 2 is `fn(I ∪ J) ≈ fn(I) ⊕ fn(J)`. With sinks, "a
                ///< sink is merged once": the parts are asked for without sinks (partial
                ///< states) and `fn(P1 ∪ … ∪ Pn) ≈ (fn(P1) ⊕ … ⊕ fn(Pn)) ⊕ sink`, so a kernel
                ///< that merges the sink into each of its splits, or into every state it is
                ///< asked for, fails.
  kIdentity,      ///< `fn(∅)` is exactly the empty state: `lse = -inf`, `o = 0` (no NaN), for
                  ///< the problem without sinks; with sinks, `fn(∅)` is the sink state
                  ///< (`o` exactly 0, `lse = s_h`).
  kDeclaredBase,  ///< The state's base tag is the one requested and its LSEs are in that base.
  kLargeLogits,   ///< Scores in the hundreds (q × 40) give finite `o` and `lse` (rows that
                  ///< see no key, in windowed problems, the empty state), matching the
                  ///< reference (a kernel without max subtraction overflows here).
  kDeterminism,   ///< Two calls with the same inputs give bitwise-identical states.
};

/// Name of a law.
/// @param law  the law.
/// @return "exactness", "split_merge", "identity", "declared_base", "large_logits",
///         "determinism" (or "unknown" for a value outside `Law`).
const char* to_string(Law law);

/// Every law, in the order they are checked.
/// @return the six laws (the default of `KernelCheckOptions::laws`).
std::vector<Law> all_laws();

/// Options of `check_state_kernel`. `check_state_kernel` validates them before running any
/// case and throws `attnstate::Error` (`kInvalidArgument`) naming the offending field.
struct KernelCheckOptions {
  ProblemGenOptions problems;          ///< The problems drawn (shapes, dtypes, bases): every
                                       ///< list non-empty, `min_keys <= max_keys`.
  std::vector<Law> laws = all_laws();  ///< The laws to check (at least one, each once).
  int num_tests = 200;                 ///< Successful cases required per law (≥ 1). This, not
                                       ///< `RC_PARAMS`' `max_success`, sets the case count.
  int max_parts = 5;                   ///< Largest partition for `kSplitMerge` (≥ 1).
  std::uint64_t seed = 0;              ///< RapidCheck seed; 0 takes the seed of `RC_PARAMS`
                                       ///< (random per process unless set there).
  double tolerance_factor = 1.0;       ///< Multiplies every tolerance (finite, > 0; relax for
                                       ///< low-precision kernels; the defaults are
                                       ///< `tolerance_for(problem)`).
  bool shrink = true;                  ///< Shrink failures to a minimal case.
  bool p_rounded_to_input = true;      ///< The kernel may round the probabilities `P` to the
                                       ///< 16-bit input dtype for `P·V` (tensor cores), which
                                       ///< the tolerance then allows for; false holds a kernel
                                       ///< that keeps `P` in fp32 to that precision (see
                                       ///< `tolerance_for(const AttentionProblem&, bool)`).
};

/// The outcome of one RapidCheck property.
struct PropertyResult {
  std::string name;     ///< The property's (law's) name.
  bool passed = false;  ///< True when every case passed.
  int num_tests = 0;    ///< Cases that passed (before the failure, if any).
  std::string message;  ///< For a failure: the law's name, the shrunk minimal case (each
                        ///< value labelled), what differed and, in its last line, how to
                        ///< reproduce it (the seed); empty on success. `summary()` prints that
                        ///< line once for all the laws.
};

/// The outcome of one law of `check_state_kernel`.
struct LawResult : PropertyResult {
  Law law = Law::kExactness;  ///< The law.
};

/// The outcome of `check_state_kernel`.
struct KernelCheckReport {
  std::uint64_t seed = 0;  ///< The RapidCheck seed every law ran with.
  /// The options' seed field the reproduce line names (`KernelCheckOptions::seed`, or
  /// `MlaKernelCheckOptions::seed` for `check_mla_kernel`).
  std::string seed_option = "KernelCheckOptions::seed";
  std::vector<LawResult> laws;  ///< One entry per checked law.

  /// @return true when every checked law passed.
  bool passed() const;
  /// @param law  a law.
  /// @return true when `law` was checked and failed.
  bool failed(Law law) const;
  /// @return the names of the failed laws, comma-separated ("" when all passed).
  std::string failed_laws() const;
  /// @return a multi-line summary: one line per law (`PASS`/`FAIL`, cases), then each
  ///         failure's message, then the seed, once: `seed <seed>` when every law passed, else
  ///         how to reproduce (`RC_PARAMS="seed=<seed>"` or `KernelCheckOptions::seed`).
  std::string summary() const;
};

/// Property-tests `fn` against the laws in `options.laws` with RapidCheck and returns a report.
///
/// Each law runs `options.num_tests` random cases drawn from `options.problems` (RapidCheck's
/// `max_success`, from `RC_PARAMS`, does not change that count); a failing case is shrunk to a
/// minimal one (fewest tokens, heads, keys, parts; simplest dtype and base), printed in the report
/// with the law's name and the seed. Exceptions thrown by `fn` count as failures of the law being
/// checked. Comparisons use `tolerance_for(problem)` (with `options.p_rounded_to_input`) scaled by
/// `options.tolerance_factor` (twice that for `kSplitMerge`, where both sides carry error). The
/// dtype of the returned state is not checked against `problem.out_dtype`: only its values are
/// compared, at the tolerance of the requested dtype.
///
/// @param fn       the kernel under test.
/// @param options  the problems drawn, the laws, the case count, the seed and the tolerances.
/// @return one result per law in `options.laws` (pass or failure message) and the seed used.
/// @throws attnstate::Error (`kInvalidArgument`) before running any case when `fn` is empty or
///         `options` is invalid (an empty list in `options.problems` or `options.laws`,
///         `min_keys > max_keys`, `num_tests < 1`, ...); the message names the field, e.g.
///         `options.problems.bases`.
///
/// Example (a kernel author's whole test):
/// @code
///   auto report = attnstate::testing::check_state_kernel(
///       [](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
///         return my_kernel(select_keys(p, keys));   // returns a HostState
///       });
///   EXPECT_TRUE(report.passed()) << report.summary();
/// @endcode
KernelCheckReport check_state_kernel(const StateKernel& fn, const KernelCheckOptions& options = {});

/// An MLA kernel under test: returns the state of `problem`'s queries over the latent tokens
/// `keys` (indices into `problem.ckv` / `problem.kpe`, sorted, possibly empty), e.g. its kernel
/// run on `select_keys(problem, keys)` into `make_output_state(problem)` (shaped
/// `(tokens, heads, kv_lora_rank)` in the requested dtype and base). Every row sees every key it
/// is given; with `problem.sinks` set, each row is merged once with `(0, sinks[h])` after its
/// keys, and empty `sinks` asks for a partial (sink-free) state, as for `StateKernel`.
using MlaKernel =
    std::function<HostState(const MlaProblem& problem, const std::vector<std::int64_t>& keys)>;

/// Options of `check_mla_kernel`: those of `KernelCheckOptions` with MLA problems.
struct MlaKernelCheckOptions {
  MlaGenOptions problems;              ///< The MLA problems drawn (`gen_mla_problem`).
  std::vector<Law> laws = all_laws();  ///< The laws to check (at least one, each once).
  int num_tests = 100;                 ///< Successful cases required per law (≥ 1).
  int max_parts = 5;                   ///< Largest partition for `kSplitMerge` (≥ 1).
  std::uint64_t seed = 0;              ///< RapidCheck seed; 0 takes the seed of `RC_PARAMS`.
  double tolerance_factor = 1.0;       ///< Multiplies every tolerance (finite, > 0).
  bool shrink = true;                  ///< Shrink failures to a minimal case.
  bool p_rounded_to_input = true;      ///< The kernel may round `P` to the 16-bit input dtype
                                       ///< (`tolerance_for(const MlaProblem&, bool)`).
};

/// Property-tests an MLA kernel against the same laws as `check_state_kernel` (exactness against
/// `reference_mla_state`, split/merge with the sink merged once, identity, declared base, large
/// logits, determinism) over problems drawn by `gen_mla_problem(options.problems)`, with
/// `tolerance_for(const MlaProblem&, bool)` scaled by `options.tolerance_factor`.
/// @param fn       the MLA kernel under test.
/// @param options  the problems drawn, the laws, the case count, the seed and the tolerances.
/// @return one result per law in `options.laws` and the seed used.
/// @throws attnstate::Error (`kInvalidArgument`) before running any case when `fn` is empty or
///         `options` is invalid, naming the field (e.g. `options.problems.heads`).
KernelCheckReport check_mla_kernel(const MlaKernel& fn, const MlaKernelCheckOptions& options = {});

/// Runs one RapidCheck property with explicit parameters and no console output: the building
/// block of `check_state_kernel`, usable for custom laws.
/// @param name       the law's name, used in the failure message.
/// @param property   the property body: draws with `*gen` and asserts with `RC_ASSERT` /
///                   `RC_FAIL` (as a body passed to `rc::check`).
/// @param num_tests  cases required to pass.
/// @param seed       RapidCheck seed (0: the seed of `RC_PARAMS`).
/// @param shrink     whether to shrink a failure.
/// @param labels     what the property's draws are, in the order it draws them: the shrunk
///                   counterexample shows value `i` as `<labels[i]> (<type>):` (as
///                   `value <i+1> (<type>):` past the labels given).
/// @return whether every case passed, the cases that passed and, on failure, the shrunk
///         counterexample, the failure's description and the seed (once, in the last line).
/// @throws attnstate::Error (`kInvalidArgument`) when `property` is empty or `num_tests < 1`.
PropertyResult run_property(const std::string& name, const std::function<void()>& property,
                            int num_tests, std::uint64_t seed, bool shrink = true,
                            const std::vector<std::string>& labels = {});

/// The seed RapidCheck uses in this process when none is given.
/// @return the seed of `RC_PARAMS`, else one drawn randomly once per process.
std::uint64_t default_seed();

}  // namespace testing
}  // namespace attnstate
