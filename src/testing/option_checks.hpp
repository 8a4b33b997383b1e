/// @file option_checks.hpp
/// @brief Up-front validation of the testing kit's generator options (internal to the kit): a
///        bad option is reported as `attnstate::Error` naming the field, before any case runs,
///        rather than as a failure of the kernel or property under test.
#pragma once

#include <sstream>
#include <string>

#include "attnstate/testing/generators.hpp"

namespace attnstate {
namespace testing {

/// A number as an error message shows it (`0`, `-1.5`, `inf`, `nan`; not `0.000000`).
inline std::string show_number(double x) {
  std::ostringstream ss;
  ss << x;
  return ss.str();
}

/// Throws `attnstate::Error` (`kInvalidArgument`) from `func`, naming the field as
/// `<prefix>.<field>` (e.g. `options.problems.bases`), unless `options` can generate problems:
/// `max_tokens`, `max_heads_kv` ≥ 1, `0 ≤ min_keys ≤ max_keys`, non-empty `group_sizes` and
/// `head_dims` of values ≥ 1, non-empty dtype and base lists of valid values,
/// `large_logits_percent`, `offset_values_percent`, `soft_cap_percent` and `window_percent` in
/// [0, 100], a finite `large_logit_factor` > 0, `soft_caps` of finite values > 0 (non-empty when
/// `soft_cap_percent > 0`), `sink_percent` in [0, 100] and a finite sink range with
/// `sink_min <= sink_max`.
void check_problem_gen_options(const ProblemGenOptions& options, const char* func,
                               const std::string& prefix);

/// As above for `StateGenOptions`: `max_tokens`, `max_heads`, `max_head_dim` ≥ 1, non-empty
/// dtype and base lists of valid values, a finite `lse_magnitude`.
void check_state_gen_options(const StateGenOptions& options, const char* func,
                             const std::string& prefix);

}  // namespace testing
}  // namespace attnstate
