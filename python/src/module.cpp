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
  nb::enum_<Status>(m, "Status", "Category of an attnstate.Error.")
      .value("INVALID_ARGUMENT", Status::kInvalidArgument)
      .value("NOT_SUPPORTED", Status::kNotSupported)
      .value("WORKSPACE_TOO_SMALL", Status::kWorkspaceTooSmall)
      .value("CUDA_ERROR", Status::kCudaError)
      .value("INTERNAL", Status::kInternal);

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

  nb::class_<PyState>(m, "State",
                      "An attention state (o, lse) of any array library, tagged with its LSE "
                      "base.\n\n"
                      "o: (tokens, heads, head_dim), float32/float16/bfloat16, last dim "
                      "contiguous.\nlse: (tokens, heads) float32, any strides (FlashAttention's "
                      "head-major LSE is a transposed view).\nbase: attnstate.Base or "
                      "\"natural\" / \"base2\" (required).")
      .def(
          "__init__",
          [](PyState* self, nb::object o, nb::object lse, nb::handle base) {
            new (self)
                PyState{std::move(o), std::move(lse), parse_base(base, "attnstate.State", "base")};
          },
          nb::arg("o"), nb::arg("lse"), nb::arg("base") = nb::none())
      .def_prop_ro("o", [](const PyState& s) { return s.o; })
      .def_prop_ro("lse", [](const PyState& s) { return s.lse; })
      .def_prop_ro("base", [](const PyState& s) { return s.base; })
      .def("__iter__",
           [](const PyState& s) { return nb::iter(nb::make_tuple(s.o, s.lse, nb::cast(s.base))); })
      .def("__repr__", [](const PyState& s) {
        auto shape = [](const nb::object& a) -> std::string {
          nb::object sh = nb::getattr(a, "shape", nb::none());
          return sh.is_none() ? "?" : nb::cast<std::string>(nb::str(nb::tuple(sh)));
        };
        return "attnstate.State(o=" + shape(s.o) + ", lse=" + shape(s.lse) +
               ", base=" + to_string(s.base) + ")";
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
