/// @file property_test_custom_kernel.cpp
/// @brief Property-testing a user-written attention kernel with `attnstate::testing`: the
///        correct kernel passes every law; three deliberately broken variants (no max
///        subtraction, an empty split that writes 0/0, a base-2 LSE declared natural) are each
///        caught, and the failure the kit reports is printed.
///
/// Exits 0 only if the correct kernel passes and every broken variant is caught by the law
/// that targets its defect.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/testing/testing.hpp"

namespace {

using attnstate::LseBase;
using attnstate::testing::AttentionProblem;
using attnstate::testing::HostState;
using attnstate::testing::Law;

/// The defects a kernel author can plant in the kernel below.
enum class Bug { kNone, kNoMaxSubtraction, kEmptySplitZeroOverZero, kBase2DeclaredNatural };

//! [user-kernel]
// A user's attention kernel on plain fp32 arrays: q (H_q, D) for one query row, k and v (T, H_kv,
// D). Writes o (H_q, D) and the natural-log LSE (H_q). `bug` plants one classic defect.
void my_attention(const float* q, const float* k, const float* v, int num_keys, int heads_q,
                  int heads_kv, int dim, float scale, float* o, float* lse, Bug bug) {
  for (int h = 0; h < heads_q; ++h) {
    const int g = h / (heads_q / heads_kv);
    std::vector<float> s(num_keys);
    float m = -INFINITY;
    for (int i = 0; i < num_keys; ++i) {
      float dot = 0.f;
      for (int d = 0; d < dim; ++d) dot += q[h * dim + d] * k[(i * heads_kv + g) * dim + d];
      s[i] = dot * scale;
      m = std::fmax(m, s[i]);
    }
    if (bug == Bug::kNoMaxSubtraction) m = 0.f;  // exp(s) overflows once s > 88
    float sum = 0.f;
    std::vector<float> acc(dim, 0.f);
    for (int i = 0; i < num_keys; ++i) {
      const float w = std::exp(s[i] - m);
      sum += w;
      for (int d = 0; d < dim; ++d) acc[d] += w * v[(i * heads_kv + g) * dim + d];
    }
    const bool empty = num_keys == 0 && bug != Bug::kEmptySplitZeroOverZero;
    for (int d = 0; d < dim; ++d) o[h * dim + d] = empty ? 0.f : acc[d] / sum;  // 0/0 if buggy
    lse[h] = num_keys == 0 ? -INFINITY : m + std::log(sum);
    if (bug == Bug::kBase2DeclaredNatural) lse[h] *= attnstate::constants::kLog2e;
  }
}
//! [user-kernel]

//! [kit-adapter]
// The adapter the kit calls: run the kernel on the selected keys and return a tagged state.
HostState run_my_kernel(const AttentionProblem& p, const std::vector<std::int64_t>& keys, Bug bug) {
  const AttentionProblem sub = attnstate::testing::select_keys(p, keys);
  const std::vector<float> q = sub.q.to_floats(), k = sub.k.to_floats(), v = sub.v.to_floats();
  const int hq = int(p.heads_q()), dim = int(p.head_dim());
  HostState out = attnstate::testing::make_output_state(p);  // requested dtype and base
  std::vector<float> o(hq * dim), lse(hq);
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    my_attention(&q[t * hq * dim], k.data(), v.data(), int(keys.size()), hq, int(p.heads_kv()), dim,
                 p.scale, o.data(), lse.data(), bug);
    for (int h = 0; h < hq; ++h) {
      for (int d = 0; d < dim; ++d) out.set_o(t, h, d, o[h * dim + d]);
      // The kernel writes natural log; convert to the base the problem asks for.
      out.set_lse(t, h, attnstate::math::convert_lse(lse[h], LseBase::kNatural, p.base));
    }
  }
  return out;
}
//! [kit-adapter]

/// Checks one variant and prints what the kit says. Returns true when the outcome is the
/// expected one (pass for the correct kernel, a failure of `law` for a broken one).
bool check(const char* name, Bug bug, bool expect_pass, Law law) {
  //! [check-kernel]
  attnstate::testing::KernelCheckOptions options;
  options.num_tests = 200;  // per law
  const attnstate::testing::KernelCheckReport report = attnstate::testing::check_state_kernel(
      [bug](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        return run_my_kernel(p, keys, bug);
      },
      options);
  //! [check-kernel]
  std::printf("==== %s ====\n", name);
  if (expect_pass) {
    std::printf("%s\n\n", report.summary().c_str());
    return report.passed();
  }
  const bool caught = report.failed(law);
  std::printf("%s by law '%s' (failed laws: %s)\n", caught ? "CAUGHT" : "NOT CAUGHT",
              attnstate::testing::to_string(law), report.failed_laws().c_str());
  for (const auto& r : report.laws) {
    if (r.law == law && !r.passed) std::printf("%s\n", r.message.c_str());
  }
  std::printf("\n");
  return caught;
}

}  // namespace

int main() {
  bool ok = check("correct kernel", Bug::kNone, true, Law::kExactness);
  ok &= check("no max subtraction", Bug::kNoMaxSubtraction, false, Law::kLargeLogits);
  ok &= check("empty split writes 0/0", Bug::kEmptySplitZeroOverZero, false, Law::kIdentity);
  ok &= check("base-2 LSE declared natural", Bug::kBase2DeclaredNatural, false, Law::kDeclaredBase);
  std::printf("%s\n",
              ok ? "OK: the correct kernel passes and every broken variant is caught" : "FAILED");
  return ok ? 0 : 1;
}
