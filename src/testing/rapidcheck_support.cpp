/// @file rapidcheck_support.cpp
/// @brief The case count of RapidCheck's configuration.
#include "attnstate/testing/rapidcheck_support.hpp"

namespace attnstate {
namespace testing {

int rc_max_success() { return rc::detail::configuration().testParams.maxSuccess; }

}  // namespace testing
}  // namespace attnstate
