// A consumer of the installed testing kit (attnstate::testing, which brings RapidCheck): runs one
// small property with the kit's generators.
#include <cstdio>

#include "attnstate/testing/testing.hpp"

int main() {
  namespace testing = attnstate::testing;
  const testing::PropertyResult result = testing::run_property(
      "generated shapes are non-empty",
      [] {
        const testing::StateShape shape = *testing::gen_state_shape();
        RC_ASSERT(shape.tokens >= 1 && shape.heads >= 1 && shape.head_dim >= 1);
      },
      /*num_tests=*/20, /*seed=*/1);
  std::printf("consumer_testing: %d cases: %s\n", result.num_tests,
              result.passed ? "ok" : result.message.c_str());
  return result.passed ? 0 : 1;
}
