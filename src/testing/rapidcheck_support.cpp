/// @file rapidcheck_support.cpp
/// @brief Default RapidCheck parameters for a test executable.
#include "attnstate/testing/rapidcheck_support.hpp"

#include <cstdlib>
#include <sstream>

namespace attnstate {
namespace testing {

bool add_default_rc_params(const std::string& params) {
  const char* env = std::getenv("RC_PARAMS");
  std::string current = env ? env : "";
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

int rc_max_success() { return rc::detail::configuration().testParams.maxSuccess; }

}  // namespace testing
}  // namespace attnstate
