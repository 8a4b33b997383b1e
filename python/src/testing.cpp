/// @file testing.cpp
/// @brief `attnstate._testing`: the conformance kit (attnstate::testing::check_state_kernel) run
///        on a Python kernel, and the kit's double reference. Each case's problem goes to Python
///        as float32 NumPy arrays (its sinks too, or None); the kernel's (o, lse) comes back as
///        float32 NumPy arrays in the declared base.
#include "attnstate/testing/testing.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "numpy_owned.hpp"

namespace nb = nanobind;
using namespace attnstate;
using namespace attnstate::testing;

namespace {

using F32Array = nb::ndarray<nb::numpy, float, nb::c_contig>;
using F32In = nb::ndarray<float, nb::c_contig, nb::device::cpu>;

using attnstate::py::owned;

F32Array to_numpy(const HostTensor& t) {
  return owned(t.to_floats(), std::vector<size_t>(t.shape().begin(), t.shape().end()));
}

/// The problem's sinks as a float32 (H_q,) array, or None.
nb::object sinks_of(const AttentionProblem& p) {
  if (!p.has_sinks()) return nb::none();
  return nb::cast(owned(p.sinks, {p.sinks.size()}));
}

/// A float32 array's values and its extents (rank 3 required, named `arg`).
std::vector<float> values_of(const F32In& a, const char* arg, std::int64_t extents[3]) {
  if (a.ndim() != 3) {
    detail::throw_argument("attnstate.testing.reference_state", arg, "a rank-3 array",
                           "rank " + std::to_string(a.ndim()));
  }
  for (int i = 0; i < 3; ++i) extents[i] = static_cast<std::int64_t>(a.shape(i));
  return std::vector<float>(a.data(), a.data() + a.size());
}

DType parse_dtype(const std::string& s, const char* field) {
  if (s == "float32") return DType::kF32;
  if (s == "float16") return DType::kF16;
  if (s == "bfloat16") return DType::kBF16;
  detail::throw_argument("attnstate.testing.check_kernel", field,
                         "\"float32\", \"float16\" or \"bfloat16\"", "\"" + s + "\"");
}

const char* dtype_name(DType d) {
  return d == DType::kF16 ? "float16" : d == DType::kBF16 ? "bfloat16" : "float32";
}

LseBase parse_base(const std::string& name, const char* fn) {
  if (name != "natural" && name != "base2")
    detail::throw_argument(fn, "base", "\"natural\" or \"base2\"", "\"" + name + "\"");
  return name == "base2" ? LseBase::kBase2 : LseBase::kNatural;
}

Law parse_law(const std::string& s) {
  for (Law law : all_laws())
    if (s == to_string(law)) return law;
  detail::throw_argument("attnstate.testing.check_kernel", "laws",
                         "names among exactness, split_merge, identity, declared_base, "
                         "large_logits, determinism",
                         "\"" + s + "\"");
}

// The kernel's output as a state of `problem`'s shape in `base`; a wrong shape or dtype throws,
// which the kit reports as a failure of the law being checked.
HostState state_of(const AttentionProblem& p, nb::handle result, LseBase base) {
  auto [o, lse] = nb::cast<std::tuple<F32In, F32In>>(result);
  const size_t t = static_cast<size_t>(p.tokens()), h = static_cast<size_t>(p.heads_q()),
               d = static_cast<size_t>(p.head_dim());
  if (o.ndim() != 3 || o.shape(0) != t || o.shape(1) != h || o.shape(2) != d)
    throw Error(Status::kInvalidArgument, "the kernel's o: expected shape (" + std::to_string(t) +
                                              ", " + std::to_string(h) + ", " + std::to_string(d) +
                                              ")");
  if (lse.ndim() != 2 || lse.shape(0) != t || lse.shape(1) != h)
    throw Error(Status::kInvalidArgument, "the kernel's lse: expected shape (" + std::to_string(t) +
                                              ", " + std::to_string(h) + ")");
  return HostState::from_view(make_const_state_view(o.data(), DType::kF32, lse.data(), p.tokens(),
                                                    p.heads_q(), p.head_dim(), base));
}

}  // namespace

NB_MODULE(_testing, m) {
  m.doc() = "attnstate's conformance kit for Python kernels (use attnstate.testing).";
  // attnstate::Error becomes the package's attnstate.Error (with its Status), as in _attnstate.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      nb::module_ core = nb::module_::import_("attnstate._attnstate");
      nb::object err = core.attr("Error")(nb::str(e.what()));
      err.attr("status") = core.attr("Status")(static_cast<int>(e.status()));
      PyErr_SetObject(core.attr("Error").ptr(), err.ptr());
    }
  });
  m.def(
      "check_state_kernel",
      [](nb::callable kernel, const std::string& base_name, const std::vector<std::string>& laws,
         int num_tests, std::uint64_t seed, double tolerance_factor, bool shrink,
         bool p_rounded_to_input, int max_parts, std::int64_t max_tokens, std::int64_t min_keys,
         std::int64_t max_keys, std::int64_t max_heads_kv,
         const std::vector<std::int64_t>& group_sizes, const std::vector<std::int64_t>& head_dims,
         const std::vector<std::string>& input_dtypes, const std::string& out_dtype,
         int large_logits_percent, int sink_percent, float sink_min, float sink_max) {
        const LseBase base = parse_base(base_name, "attnstate.testing.check_kernel");
        KernelCheckOptions options;
        options.laws.clear();
        for (const std::string& l : laws) options.laws.push_back(parse_law(l));
        options.num_tests = num_tests;
        options.seed = seed;
        options.tolerance_factor = tolerance_factor;
        options.shrink = shrink;
        options.p_rounded_to_input = p_rounded_to_input;
        options.max_parts = max_parts;
        ProblemGenOptions& g = options.problems;
        g.max_tokens = max_tokens;
        g.min_keys = min_keys;
        g.max_keys = max_keys;
        g.max_heads_kv = max_heads_kv;
        g.group_sizes = group_sizes;
        g.head_dims = head_dims;
        g.input_dtypes.clear();
        for (const std::string& d : input_dtypes)
          g.input_dtypes.push_back(parse_dtype(d, "input_dtypes"));
        g.output_dtypes = {parse_dtype(out_dtype, "out_dtype")};
        // The kernel declares one base: every case asks for it (the base law checks the claim).
        g.bases = {base};
        g.large_logits_percent = large_logits_percent;
        g.sink_percent = sink_percent;
        g.sink_min = sink_min;
        g.sink_max = sink_max;
        // The problem's sinks go with it (None: no sinks, as for the partials the kit asks for).
        StateKernel fn = [&kernel, base](const AttentionProblem& problem,
                                         const std::vector<std::int64_t>& keys) {
          const AttentionProblem p = select_keys(problem, keys);
          nb::object r = kernel(to_numpy(p.q), to_numpy(p.k), to_numpy(p.v), p.scale,
                                dtype_name(p.q.dtype()), sinks_of(p));
          return state_of(p, r, base);
        };
        const KernelCheckReport report = check_state_kernel(fn, options);
        std::vector<std::tuple<std::string, bool, int, std::string>> per_law;
        for (const LawResult& r : report.laws)
          per_law.emplace_back(to_string(r.law), r.passed, r.num_tests, r.message);
        return std::make_tuple(report.passed(), report.summary(), report.seed, per_law);
      },
      nb::arg("kernel"), nb::arg("base"), nb::arg("laws"), nb::arg("num_tests"), nb::arg("seed"),
      nb::arg("tolerance_factor"), nb::arg("shrink"), nb::arg("p_rounded_to_input"),
      nb::arg("max_parts"), nb::arg("max_tokens"), nb::arg("min_keys"), nb::arg("max_keys"),
      nb::arg("max_heads_kv"), nb::arg("group_sizes"), nb::arg("head_dims"),
      nb::arg("input_dtypes"), nb::arg("out_dtype"), nb::arg("large_logits_percent"),
      nb::arg("sink_percent"), nb::arg("sink_min"), nb::arg("sink_max"));
  // The kit's double reference (attnstate::testing::reference_state) over float32 q, k, v, all
  // keys, with the sinks merged once per row when given: (o, lse) as float64 arrays.
  m.def(
      "reference_state",
      [](const F32In& q, const F32In& k, const F32In& v, float scale,
         const std::optional<F32In>& sinks, const std::string& base_name) {
        const char* fn = "attnstate.testing.reference_state";
        const LseBase base = parse_base(base_name, fn);
        std::int64_t qe[3], ke[3], ve[3];
        const std::vector<float> qv = values_of(q, "q", qe), kv = values_of(k, "k", ke),
                                 vv = values_of(v, "v", ve);
        if (ve[0] != ke[0] || ve[1] != ke[1] || ve[2] != ke[2])
          detail::throw_argument(fn, "v", "the shape of k", "another shape");
        AttentionProblem p = make_problem(qe[0], qe[1], ke[1], qe[2], ke[0], DType::kF32, qv, kv,
                                          vv, scale, DType::kF32, base);
        if (sinks) {
          if (sinks->ndim() != 1)
            detail::throw_argument(fn, "sinks", "a (heads_q,) array",
                                   "rank " + std::to_string(sinks->ndim()));
          p.sinks.assign(sinks->data(), sinks->data() + sinks->size());
        }
        const ReferenceState r = reference_state(p, all_keys(p.num_keys()));
        const size_t t = static_cast<size_t>(r.tokens), h = static_cast<size_t>(r.heads),
                     d = static_cast<size_t>(r.head_dim);
        return std::make_tuple(owned(r.o, {t, h, d}), owned(r.lse, {t, h}));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("scale"), nb::arg("sinks").none(),
      nb::arg("base"));
}
