/// @file rc_defaults.hpp
/// @brief The test suite's default RapidCheck parameters per executable: missing keys added to
///        the `RC_PARAMS` environment variable (RapidCheck's own configuration) before the
///        first property runs, the user's keys kept. Test support only: the shipped kit reads
///        no environment variable (a kit user sets `RC_PARAMS` as RapidCheck documents).
#pragma once

#include <cstdlib>
#include <sstream>
#include <string>

namespace attnstate_test {

/// Adds `params` (space-separated RapidCheck `key=value` items, e.g. `"max_success=500"`) to
/// `RC_PARAMS`, keeping every key the user already set there (the user's value wins). Returns
/// true when `RC_PARAMS` was changed.
inline bool add_default_rc_params(const std::string& params) {
  const char* env = std::getenv("RC_PARAMS");
  const std::string current = env ? env : "";
  std::string added;
  std::istringstream in(params);
  std::string item;
  while (in >> item) {
    const std::string key = item.substr(0, item.find('='));
    // Keep the user's value for a key already present ("key=" at a word start).
    const std::string probe = key + "=";
    bool present = false;
    for (std::size_t pos = current.find(probe); pos != std::string::npos;
         pos = current.find(probe, pos + 1)) {
      if (pos == 0 || current[pos - 1] == ' ') present = true;
    }
    if (!present) added += (added.empty() ? "" : " ") + item;
  }
  if (added.empty()) return false;
  const std::string merged = current.empty() ? added : current + " " + added;
  return setenv("RC_PARAMS", merged.c_str(), 1) == 0;
}

}  // namespace attnstate_test

/// @cond INTERNAL
#define ATTNSTATE_RC_CAT2(a, b) a##b
#define ATTNSTATE_RC_CAT(a, b) ATTNSTATE_RC_CAT2(a, b)
/// @endcond

/// Default RapidCheck parameters for the whole test executable (unless `RC_PARAMS` already sets
/// those keys), from a static initializer: `ATTNSTATE_RC_DEFAULT_PARAMS("max_success=500");` at
/// namespace scope in one source file of the executable.
#define ATTNSTATE_RC_DEFAULT_PARAMS(params)                                    \
  static const bool ATTNSTATE_RC_CAT(attnstate_rc_default_params_, __LINE__) = \
      ::attnstate_test::add_default_rc_params(params)
