/// @file tolerance.cpp
/// @brief Dtype-aware tolerances and the state comparisons that describe mismatches.
#include "attnstate/testing/tolerance.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "arg_checks.hpp"

namespace attnstate {
namespace testing {

namespace {

constexpr double kUnitRoundoff = 5.9604644775390625e-8;  // 2^-24, fp32
/// Half the spacing of f16 subnormals (2^-25): the largest absolute error of rounding a value
/// below 2^-14 to f16.
constexpr double kF16SubnormalHalfUlp = 2.98023223876953125e-8;
constexpr int kMaxReported = 6;

/// Unit roundoff (half an ulp at 1, the largest relative error of rounding a normal value to
/// nearest) of a storage dtype: 2^-8 for bf16 (8 significant bits), 2^-11 for f16, 2^-24 f32.
double unit_roundoff(DType dt) {
  switch (dt) {
    case DType::kBF16:
      return 3.90625e-3;
    case DType::kF16:
      return 4.8828125e-4;
    default:
      return kUnitRoundoff;
  }
}

/// Collects mismatch lines, keeping the first few and counting the rest.
class Mismatches {
 public:
  std::ostringstream& add() {
    ++count_;
    if (count_ <= kMaxReported) {
      if (count_ > 1) lines_ << "\n";
      lines_ << "  ";
      return lines_;
    }
    return discarded_;
  }
  bool empty() const { return count_ == 0; }
  std::string text(const std::string& header) const {
    std::ostringstream out;
    out << header << ": " << count_ << " mismatch" << (count_ == 1 ? "" : "es") << "\n"
        << lines_.str();
    if (count_ > kMaxReported) out << "\n  ... (" << count_ - kMaxReported << " more)";
    return out.str();
  }

 private:
  int count_ = 0;
  std::ostringstream lines_;
  std::ostringstream discarded_;  // the lines past kMaxReported
};

/// Checks one value; returns an empty string or why it does not match.
std::string check_value(double got, double want, double abs_tol, double rel_tol) {
  std::ostringstream ss;
  ss << std::setprecision(9);
  if (std::isnan(want)) {
    if (std::isnan(got)) return {};
    ss << "got " << got << ", expected NaN (NaN in a non-empty input must propagate)";
    return ss.str();
  }
  if (std::isinf(want)) {
    if (got == want) return {};
    ss << "got " << got << ", expected " << want;
    return ss.str();
  }
  if (!std::isfinite(got)) {
    ss << "got " << got << ", expected the finite " << want;
    return ss.str();
  }
  const double diff = std::fabs(got - want);
  const double tol = abs_tol + rel_tol * std::fabs(want);
  if (diff <= tol) return {};
  ss << "got " << got << ", expected " << want << " (|diff| " << std::setprecision(3) << diff
     << " > tol " << tol << ")";
  return ss.str();
}

std::string shape_header(const HostState& a, const ReferenceState& e) {
  std::ostringstream ss;
  ss << "state (" << a.tokens() << ", " << a.heads() << ", " << a.head_dim() << ") o "
     << to_string(a.dtype()) << ", lse declared " << to_string(a.base());
  if (a.base() != e.base) ss << " (compared in " << to_string(e.base) << ")";
  return ss.str();
}

}  // namespace

Tolerance tolerance_for(DType o_dtype) {
  kit::check_dtype(o_dtype, "attnstate::testing::tolerance_for", "o_dtype");
  switch (o_dtype) {
    case DType::kF16:
      return Tolerance{2e-3, 2e-3, 1e-5, 1e-6};
    case DType::kBF16:
      return Tolerance{1.6e-2, 1.6e-2, 1e-5, 1e-6};
    default:
      return Tolerance{1e-5, 1e-5, 1e-5, 1e-6};
  }
}

namespace kit {

Tolerance attention_tolerance(DType in, DType out_dtype, LseBase base, double keys, double dim,
                              double max_score, double v_max, bool p_rounded_to_input) {
  // The fp32 floor of the f32 row of the table; the LSE part is the table's (fp32 whatever the
  // dtypes), widened below.
  Tolerance tol = tolerance_for(DType::kF32);
  const double score_err = (dim + 8) * kUnitRoundoff * max_score;
  const double sum_err = (keys + dim + 8) * kUnitRoundoff;
  const double base_factor = base == LseBase::kBase2 ? 1.4426950408889634 : 1.0;
  // Rounding P to the input dtype (tensor cores) and o to the output dtype, each at most one
  // unit roundoff of the element's magnitude Σ w_i |v_i|; twice that as the margin.
  const bool rounds_p = p_rounded_to_input && in != DType::kF32;
  const double u_in = rounds_p ? unit_roundoff(in) : 0.0;
  tol.o_magnitude_rel = 2 * (u_in + unit_roundoff(out_dtype));
  tol.o_magnitude_default = v_max;
  tol.o_abs = tol.o_abs * v_max + (4 * score_err + 2 * sum_err) * v_max;
  if (rounds_p && in == DType::kF16) tol.o_abs += 2 * keys * kF16SubnormalHalfUlp * v_max;
  if (out_dtype == DType::kF16) tol.o_abs += 2 * kF16SubnormalHalfUlp;
  tol.lse_abs += (2 * score_err + sum_err) * base_factor;
  return tol;
}

}  // namespace kit

Tolerance tolerance_for(const AttentionProblem& problem, bool p_rounded_to_input) {
  kit::check_problem(problem, "attnstate::testing::tolerance_for", "problem");
  // The 16-bit dtype P may be rounded to: the inputs', or the queries' for fp8 keys and values
  // (a tensor-core kernel multiplies P in the queries' dtype with V converted to it exactly:
  // every fp8 value is an f16 and a bf16 value; the scales are applied in fp32).
  const DType in = problem.has_fp8_kv() ? problem.q.dtype() : problem.v.dtype();
  double v_max = 1.0;
  for (const double v :
       kit::dequantized(problem.v, problem.v_scale, "attnstate::testing::tolerance_for")) {
    v_max = std::max(v_max, std::fabs(v));
  }
  return kit::attention_tolerance(
      in, problem.out_dtype, problem.base, static_cast<double>(problem.num_keys()),
      static_cast<double>(problem.head_dim()), max_abs_score(problem), v_max, p_rounded_to_input);
}

Tolerance merge_tolerance(DType out_dtype, const std::vector<HostState>& inputs) {
  kit::check_dtype(out_dtype, "attnstate::testing::merge_tolerance", "out_dtype");
  Tolerance tol = tolerance_for(out_dtype);
  double lse_max = 0, o_max = 1;
  for (const HostState& s : inputs) {
    for (std::int64_t t = 0; t < s.tokens(); ++t) {
      for (std::int64_t h = 0; h < s.heads(); ++h) {
        const double l = s.lse(t, h);
        if (!std::isfinite(l)) continue;
        const double ln = s.base() == LseBase::kBase2 ? l * 0.6931471805599453 : l;
        lse_max = std::max(lse_max, std::fabs(ln));
        for (std::int64_t d = 0; d < s.head_dim(); ++d) {
          const double o = s.o(t, h, d);
          if (std::isfinite(o)) o_max = std::max(o_max, std::fabs(o));
        }
      }
    }
  }
  // Working in base 2 scales the LSEs by log2(e): use that larger magnitude.
  const double lse_err = 4 * kUnitRoundoff * lse_max * 1.4426950408889634;
  tol.o_abs = tol.o_abs * o_max + lse_err * o_max;
  tol.lse_abs += lse_err;
  return tol;
}

std::string compare_states(const HostState& a, const ReferenceState& e, const Tolerance& tol) {
  kit::check_reference(e, "attnstate::testing::compare_states", "expected");
  if (a.tokens() != e.tokens || a.heads() != e.heads || a.head_dim() != e.head_dim) {
    std::ostringstream ss;
    ss << "shape mismatch: got (" << a.tokens() << ", " << a.heads() << ", " << a.head_dim()
       << "), expected (" << e.tokens << ", " << e.heads << ", " << e.head_dim << ")";
    return ss.str();
  }
  const ReferenceState got = rebased(to_reference(a), e.base);
  const bool with_magnitude = e.has_o_magnitude();
  Mismatches mm;
  for (std::int64_t t = 0; t < e.tokens; ++t) {
    for (std::int64_t h = 0; h < e.heads; ++h) {
      const double want_lse = e.lse_at(t, h);
      // Below the floor the relative tolerance applies to the floor: an absolute term.
      const bool floored = std::fabs(want_lse) < tol.lse_rel_floor;
      const double lse_abs = floored ? tol.lse_abs + tol.lse_rel * tol.lse_rel_floor : tol.lse_abs;
      const std::string lse_msg =
          check_value(got.lse_at(t, h), want_lse, lse_abs, floored ? 0.0 : tol.lse_rel);
      if (!lse_msg.empty()) mm.add() << "lse[" << t << "," << h << "]: " << lse_msg;
      const bool empty = want_lse == -INFINITY;
      for (std::int64_t d = 0; d < e.head_dim; ++d) {
        const double g = got.o_at(t, h, d);
        if (empty) {
          if (g != 0.0) {
            mm.add() << "o[" << t << "," << h << "," << d << "]: got " << g
                     << ", expected exactly 0 (empty state)";
          }
          continue;
        }
        const double want = e.o_at(t, h, d);
        const std::size_t i = static_cast<std::size_t>((t * e.heads + h) * e.head_dim + d);
        const double magnitude =
            with_magnitude ? e.o_magnitude[i] : std::max(std::fabs(want), tol.o_magnitude_default);
        const double abs_tol =
            tol.o_magnitude_rel > 0 ? tol.o_abs + tol.o_magnitude_rel * magnitude : tol.o_abs;
        const std::string msg = check_value(g, want, abs_tol, tol.o_rel);
        if (!msg.empty()) mm.add() << "o[" << t << "," << h << "," << d << "]: " << msg;
      }
    }
  }
  if (mm.empty()) return {};
  return mm.text(shape_header(a, e));
}

std::string compare_states(const HostState& actual, const HostState& expected,
                           const Tolerance& tol) {
  return compare_states(actual, to_reference(expected), tol);
}

std::string compare_bitwise(const HostState& a, const HostState& b) {
  std::ostringstream ss;
  if (a.tokens() != b.tokens() || a.heads() != b.heads() || a.head_dim() != b.head_dim()) {
    ss << "shape mismatch: (" << a.tokens() << ", " << a.heads() << ", " << a.head_dim() << ") vs ("
       << b.tokens() << ", " << b.heads() << ", " << b.head_dim() << ")";
    return ss.str();
  }
  if (a.dtype() != b.dtype()) {
    return std::string("dtype mismatch: ") + to_string(a.dtype()) + " vs " + to_string(b.dtype());
  }
  if (a.base() != b.base()) {
    return std::string("base mismatch: ") + to_string(a.base()) + " vs " + to_string(b.base());
  }
  a.view();  // view() checks that each storage matches its shape (read below through data())
  b.view();
  Mismatches mm;
  const std::size_t elem = size_of(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(a.o_tensor().data());
  const auto* pb = static_cast<const unsigned char*>(b.o_tensor().data());
  for (std::int64_t t = 0; t < a.tokens(); ++t) {
    for (std::int64_t h = 0; h < a.heads(); ++h) {
      const float la = a.lse(t, h), lb = b.lse(t, h);
      if (std::memcmp(&la, &lb, sizeof(float)) != 0) {
        mm.add() << std::setprecision(9) << "lse[" << t << "," << h << "]: " << la << " vs " << lb;
      }
      for (std::int64_t d = 0; d < a.head_dim(); ++d) {
        const std::size_t off = static_cast<std::size_t>((t * a.heads() + h) * a.head_dim() + d);
        if (std::memcmp(pa + off * elem, pb + off * elem, elem) != 0) {
          mm.add() << std::setprecision(9) << "o[" << t << "," << h << "," << d
                   << "]: " << a.o(t, h, d) << " vs " << b.o(t, h, d);
        }
      }
    }
  }
  if (mm.empty()) return {};
  std::ostringstream hdr;
  hdr << "bitwise (" << a.tokens() << ", " << a.heads() << ", " << a.head_dim() << ") o "
      << to_string(a.dtype()) << ", lse " << to_string(a.base());
  return mm.text(hdr.str());
}

}  // namespace testing
}  // namespace attnstate
