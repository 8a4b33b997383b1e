/// @file module.cpp
/// @brief `attnstate._attnstate`: the enums, `State`, `Error` and the bindings' registration.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "arrays.hpp"

namespace attnstate {
namespace py {
void bind_merge(nb::module_& m);
void bind_plans(nb::module_& m);
void bind_levels(nb::module_& m);
void bind_context_parallel(nb::module_& m);
}  // namespace py
}  // namespace attnstate

using namespace attnstate;
using namespace attnstate::py;

namespace {
PyObject* g_error_type = nullptr;  // attnstate.Error, created below and owned by the module
}

NB_MODULE(_attnstate, m) {
  m.doc() = "attnstate's extension module (use the package `attnstate`).";

  nb::enum_<LseBase>(m, "Base", "The base of a stored log-sum-exp.")
      .value("NATURAL", LseBase::kNatural, "lse = ln sum exp(s) (FlashAttention, PyTorch)")
      .value("BASE2", LseBase::kBase2, "lse = log2 sum exp(s) (FlashInfer's default)");
  nb::enum_<Status>(m, "Status", "Category of an attnstate.Error (the C++ attnstate::Status).")
      .value("SUCCESS", Status::kSuccess, "no error (never the status of an Error)")
      .value("INVALID_ARGUMENT", Status::kInvalidArgument,
             "an argument violates the documented contract")
      .value("NOT_SUPPORTED", Status::kNotSupported,
             "a valid request outside the compiled set (head_dim, dtype, layout)")
      .value("WORKSPACE_TOO_SMALL", Status::kWorkspaceTooSmall,
             "a caller-provided workspace is smaller than required")
      .value("CUDA_ERROR", Status::kCudaError, "a CUDA runtime call or kernel launch failed")
      .value("INTERNAL", Status::kInternal, "a broken internal invariant (a library bug)")
      .value("RESOURCE_EXHAUSTED", Status::kResourceExhausted,
             "the system refused a resource (e.g. a worker thread could not start)");
  // The C++ enum's values by its own names (to_string), for the test that keeps the Python enum
  // complete: every code up to the first one the C++ library does not name.
  m.def("_cpp_status_names", [] {
    nb::dict names;
    for (int code = 0; code < 256; ++code) {
      const std::string name = to_string(static_cast<Status>(code));
      if (name == "unknown") break;
      names[nb::str(name.c_str())] = code;
    }
    return names;
  });

  g_error_type = PyErr_NewExceptionWithDoc(
      "attnstate.Error",
      "An argument violates the contract or a CUDA call failed. `status` is an "
      "attnstate.Status; the message names the function, the argument and what was expected.",
      PyExc_RuntimeError, nullptr);
  m.attr("Error") = nb::handle(g_error_type);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const attnstate::Error& e) {
      nb::object err = nb::handle(g_error_type)(nb::str(e.what()));
      err.attr("status") = nb::cast(e.status());
      PyErr_SetObject(g_error_type, err.ptr());
    }
  });

  nb::class_<PyState>(
      m, "State",
      "An attention state (o, lse) of any array library, tagged with its LSE base.\n\n"
      "o: (tokens, heads, head_dim), float32/float16/bfloat16 (NumPy: ml_dtypes.bfloat16) or "
      "fp8 float8_e4m3fn/float8_e5m2 (with `scale`), last dim contiguous.\n"
      "lse: float32 LSEs, any strides: (tokens, heads) for lse_layout=\"tokens_heads\" (a "
      "transposed view of a head-major LSE is one), (heads, tokens) for \"heads_tokens\" "
      "(FlashAttention's and vLLM's head-major LSE as it is); None for an output whose LSE is "
      "not wanted.\nbase: attnstate.Base or \"natural\" / \"base2\" (required).\n"
      "scale: the per-tensor scale of an fp8 o (stored value x scale = real value); 1 for any "
      "other dtype.")
      .def(
          "__init__",
          [](PyState* self, nb::object o, nb::object lse, nb::handle base, nb::handle scale,
             nb::handle lse_layout) {
            const char* fn = "attnstate.State";
            const LseBase b = parse_base(base, fn, "base");
            const LseLayout layout = parse_lse_layout(lse_layout, fn, "lse_layout");
            double x = 0;
            if (nb::isinstance<nb::bool_>(scale) || !nb::try_cast<double>(scale, x))
              detail::throw_argument(fn, "scale",
                                     "a float (the scale of an fp8 o; 1 for any other dtype)",
                                     nb::cast<std::string>(nb::str(nb::type_name(scale.type()))));
            new (self) PyState{std::move(o), std::move(lse), b, static_cast<float>(x), layout};
          },
          nb::arg("o"), nb::arg("lse").none(), nb::arg("base").none() = nb::none(), nb::kw_only(),
          nb::arg("scale") = 1.0, nb::arg("lse_layout") = "tokens_heads")
      .def_prop_ro("o", [](const PyState& s) { return s.o; })
      .def_prop_ro("lse", [](const PyState& s) { return s.lse; })
      .def_prop_ro("base", [](const PyState& s) { return s.base; })
      .def_prop_ro("scale", [](const PyState& s) { return s.scale; })
      .def_prop_ro("lse_layout", [](const PyState& s) { return to_string(s.lse_layout); })
      .def("__iter__",
           [](const PyState& s) { return nb::iter(nb::make_tuple(s.o, s.lse, nb::cast(s.base))); })
      .def("__repr__", [](const PyState& s) {
        auto shape = [](const nb::object& a) -> std::string {
          if (a.is_none()) return "None";
          nb::object sh = nb::getattr(a, "shape", nb::none());
          return sh.is_none() ? "?" : nb::cast<std::string>(nb::str(nb::tuple(sh)));
        };
        std::string r = "attnstate.State(o=" + shape(s.o) + ", lse=" + shape(s.lse) +
                        ", base=" + to_string(s.base);
        if (s.scale != 1.f) r += ", scale=" + nb::cast<std::string>(nb::repr(nb::float_(s.scale)));
        if (s.lse_layout != LseLayout::kTokensHeads)
          r += std::string(", lse_layout=\"") + to_string(s.lse_layout) + "\"";
        return r + ")";
      });

  m.attr("has_cuda") =
#if defined(ATTNSTATE_HAS_CUDA)
      true;
#else
      false;
#endif

  bind_merge(m);
  bind_plans(m);
  bind_levels(m);
  bind_context_parallel(m);
}
