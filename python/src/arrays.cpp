/// @file arrays.cpp
/// @brief Array import (DLPack, with a direct path for torch tensors), views and streams.
#include "arrays.hpp"

#include <nanobind/stl/string.h>

#if defined(ATTNSTATE_HAS_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace attnstate {
namespace py {

namespace {

constexpr int kDlCpu = 1, kDlCuda = 2, kDlCudaHost = 3, kDlCudaManaged = 13;

// torch's objects, looked up once torch is imported (attnstate never imports it itself here).
// `Tensor.__dlpack__` is Python code with checks that cost microseconds per array; the C
// function behind torch.utils.dlpack.to_dlpack gives the same capsule for a fraction of that.
struct TorchHooks {
  bool ready = false;
  PyTypeObject* tensor = nullptr;
  nb::object to_dlpack;       // torch._C._to_dlpack
  nb::object current_stream;  // torch._C._cuda_getCurrentRawStream(device) -> int
};
TorchHooks& torch_hooks() {
  static TorchHooks* hooks = new TorchHooks();  // never destroyed: holds Python objects
  if (!hooks->ready) {
    PyObject* torch = PyImport_GetModule(nb::str("torch").ptr());
    if (torch == nullptr) {
      PyErr_Clear();
      return *hooks;
    }
    nb::object t = nb::steal(torch);
    nb::object c = nb::getattr(t, "_C", nb::none());
    nb::object tensor = nb::getattr(t, "Tensor", nb::none());
    if (!c.is_none() && !tensor.is_none() && PyType_Check(tensor.ptr())) {
      hooks->tensor = reinterpret_cast<PyTypeObject*>(tensor.release().ptr());
      hooks->to_dlpack = nb::getattr(c, "_to_dlpack", nb::none());
      hooks->current_stream = nb::getattr(c, "_cuda_getCurrentRawStream", nb::none());
      hooks->ready = true;
    }
  }
  return *hooks;
}

bool is_torch_tensor(nb::handle h) {
  TorchHooks& t = torch_hooks();
  return t.ready && PyObject_TypeCheck(h.ptr(), t.tensor);
}

[[maybe_unused]] std::string module_of(nb::handle h) {
  nb::object mod = nb::getattr(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(h.ptr()))),
                               "__module__", nb::none());
  return mod.is_none() ? std::string() : nb::cast<std::string>(nb::str(mod));
}

std::string shape_string(const Array& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

}  // namespace

LseBase parse_base(nb::handle base, const char* fn, const std::string& name) {
  if (base.is_none())
    detail::throw_argument(fn, name.c_str(), "a base: attnstate.Base or \"natural\" / \"base2\"",
                           "None");
  if (nb::isinstance<LseBase>(base)) return nb::cast<LseBase>(base);
  if (nb::isinstance<nb::str>(base)) {
    const std::string s = nb::cast<std::string>(base);
    if (s == "natural") return LseBase::kNatural;
    if (s == "base2") return LseBase::kBase2;
    detail::throw_argument(fn, name.c_str(), "\"natural\" or \"base2\"", "\"" + s + "\"");
  }
  detail::throw_argument(fn, name.c_str(), "attnstate.Base or \"natural\" / \"base2\"",
                         nb::cast<std::string>(nb::str(nb::type_name(base.type()))));
}

bool to_dtype(nb::dlpack::dtype dt, DType* out) {
  if (dt.lanes != 1) return false;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 32) {
    *out = DType::kF32;
  } else if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 16) {
    *out = DType::kF16;
  } else if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16) {
    *out = DType::kBF16;
  } else {
    return false;
  }
  return true;
}

std::string dtype_name(nb::dlpack::dtype dt) {
  const char* kind = "?";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      kind = "other";
  }
  return std::string(kind) + std::to_string(dt.bits);
}

void Call::fail(const std::string& name, const std::string& expected, const std::string& got,
                Status status) const {
  detail::throw_argument(fn_, name.c_str(), expected, got, status);
}

Array Call::array(nb::handle h, const std::string& name, int ndim) {
  if (h.is_none()) fail(name, "an array", "None");
  Array a;
  bool ok = false;
  if (is_torch_tensor(h) && torch_hooks().to_dlpack.is_valid() &&
      !torch_hooks().to_dlpack.is_none()) {
    nb::object capsule = torch_hooks().to_dlpack(h);
    ok = nb::try_cast(capsule, a);
  } else {
    ok = nb::try_cast(h, a);
  }
  if (!ok)
    fail(name, "an array speaking DLPack (torch, CuPy, JAX, NumPy)",
         nb::cast<std::string>(nb::str(nb::type_name(h.type()))));
  if (static_cast<int>(a.ndim()) != ndim)
    fail(name, std::to_string(ndim) + " dimensions", shape_string(a));
  place(a, h, name);
  keep_.push_back(a);
  return a;
}

void Call::place(const Array& a, nb::handle h, const std::string& name) {
  const int type = a.device_type();
  MemorySpace space;
  int device = -1;
  if (type == kDlCpu || type == kDlCudaHost) {
    space = MemorySpace::kHost;
  } else if (type == kDlCuda || type == kDlCudaManaged) {
#if !defined(ATTNSTATE_HAS_CUDA)
    fail(name, "a host array (this build of attnstate has no CUDA backend)", "a CUDA array",
         Status::kNotSupported);
#endif
    space = MemorySpace::kDevice;
    device = a.device_id();
  } else {
    fail(name, "a host or CUDA array", "DLPack device type " + std::to_string(type));
  }
  if (!placed_) {
    placed_ = true;
    space_ = space;
    device_ = device;
    first_ = h;
    return;
  }
  if (space != space_)
    fail(name, std::string("a ") + to_string(space_) + " array (as the arguments before it)",
         std::string("a ") + to_string(space) + " array");
  if (device != device_)
    fail(name,
         "an array on CUDA device " + std::to_string(device_) + " (as the arguments before it)",
         "device " + std::to_string(device));
}

const PyState& Call::state_of(nb::handle h, const std::string& name) const {
  PyState* s = nullptr;
  if (!nb::try_cast<PyState*>(h, s) || s == nullptr)
    fail(name, "an attnstate.State(o, lse, base)",
         nb::cast<std::string>(nb::str(nb::type_name(h.type()))));
  return *s;
}

StateView Call::state(nb::handle h, const std::string& name) {
  const PyState& s = state_of(h, name);
  Array o = array(s.o, name + ".o", 3);
  Array lse = array(s.lse, name + ".lse", 2);
  StateView v;
  if (!to_dtype(o.dtype(), &v.dtype))
    fail(name + ".o", "dtype float32, float16 or bfloat16", dtype_name(o.dtype()));
  if (!(lse.dtype() == nb::dtype<float>()))
    fail(name + ".lse", "dtype float32", dtype_name(lse.dtype()));
  if (o.shape(2) > 1 && o.stride(2) != 1)
    fail(name + ".o", "a contiguous last dimension (stride 1)",
         "stride " + std::to_string(o.stride(2)));
  if (lse.shape(0) != o.shape(0) || lse.shape(1) != o.shape(1))
    fail(name + ".lse",
         "shape (" + std::to_string(o.shape(0)) + ", " + std::to_string(o.shape(1)) +
             ") (o's first two dimensions)",
         shape_string(lse));
  v.o = const_cast<void*>(o.data());
  v.lse = static_cast<float*>(const_cast<void*>(lse.data()));
  v.tokens = static_cast<std::int64_t>(o.shape(0));
  v.heads = static_cast<std::int64_t>(o.shape(1));
  v.head_dim = static_cast<std::int64_t>(o.shape(2));
  v.o_stride_token = o.stride(0);
  v.o_stride_head = o.stride(1);
  v.lse_stride_token = lse.stride(0);
  v.lse_stride_head = lse.stride(1);
  v.base = s.base;
  v.space = space_;
  return v;
}

ConstStateStackView Call::stack(nb::handle h, StackOrder order, const std::string& name) {
  const PyState& s = state_of(h, name);
  Array o = array(s.o, name + ".o", 4);
  Array lse = array(s.lse, name + ".lse", 3);
  ConstStateStackView v;
  if (!to_dtype(o.dtype(), &v.dtype))
    fail(name + ".o", "dtype float32, float16 or bfloat16", dtype_name(o.dtype()));
  if (!(lse.dtype() == nb::dtype<float>()))
    fail(name + ".lse", "dtype float32", dtype_name(lse.dtype()));
  if (o.shape(3) > 1 && o.stride(3) != 1)
    fail(name + ".o", "a contiguous last dimension (stride 1)",
         "stride " + std::to_string(o.stride(3)));
  for (int i = 0; i < 3; ++i)
    if (lse.shape(i) != o.shape(i))
      fail(name + ".lse",
           "shape (" + std::to_string(o.shape(0)) + ", " + std::to_string(o.shape(1)) + ", " +
               std::to_string(o.shape(2)) + ") (o's first three dimensions)",
           shape_string(lse));
  // dims: tokens-major (T, S, H, D), states-major (S, T, H, D)
  const int t = order == StackOrder::kTokensMajor ? 0 : 1;
  const int st = 1 - t;
  v.o = o.data();
  v.lse = static_cast<const float*>(lse.data());
  v.tokens = static_cast<std::int64_t>(o.shape(t));
  v.num_states = static_cast<std::int64_t>(o.shape(st));
  v.heads = static_cast<std::int64_t>(o.shape(2));
  v.head_dim = static_cast<std::int64_t>(o.shape(3));
  v.o_stride_token = o.stride(t);
  v.o_stride_state = o.stride(st);
  v.o_stride_head = o.stride(2);
  v.lse_stride_token = lse.stride(t);
  v.lse_stride_state = lse.stride(st);
  v.lse_stride_head = lse.stride(2);
  v.base = s.base;
  v.space = space_;
  return v;
}

const std::int32_t* Call::int32_vector(nb::handle h, const std::string& name, std::int64_t* size,
                                       bool optional) {
  if (h.is_none() && optional) return nullptr;
  Array a = array(h, name, 1);
  if (!(a.dtype() == nb::dtype<std::int32_t>())) fail(name, "dtype int32", dtype_name(a.dtype()));
  if (a.shape(0) > 1 && a.stride(0) != 1) fail(name, "a contiguous array", "a strided one");
  if (size) *size = static_cast<std::int64_t>(a.shape(0));
  return static_cast<const std::int32_t*>(a.data());
}

const float* Call::float32_vector(nb::handle h, const std::string& name, std::int64_t* size) {
  Array a = array(h, name, 1);
  if (!(a.dtype() == nb::dtype<float>())) fail(name, "dtype float32", dtype_name(a.dtype()));
  if (a.shape(0) > 1 && a.stride(0) != 1) fail(name, "a contiguous array", "a strided one");
  if (size) *size = static_cast<std::int64_t>(a.shape(0));
  return static_cast<const float*>(a.data());
}

const std::int32_t* Call::int32_matrix(nb::handle h, const std::string& name, std::int64_t* rows,
                                       std::int64_t* cols) {
  Array a = array(h, name, 2);
  if (!(a.dtype() == nb::dtype<std::int32_t>())) fail(name, "dtype int32", dtype_name(a.dtype()));
  if (a.shape(1) > 1 && a.stride(1) != 1) fail(name, "a contiguous last dimension", "strided");
  *rows = static_cast<std::int64_t>(a.shape(0));
  *cols = a.stride(0);  // the table's row stride (its columns as the library counts them)
  if (a.shape(0) <= 1) *cols = static_cast<std::int64_t>(a.shape(1));
  return static_cast<const std::int32_t*>(a.data());
}

ConstTensorView Call::tensor(nb::handle h, const std::string& name, int ndim) {
  Array a = array(h, name, ndim);
  ConstTensorView t;
  if (!to_dtype(a.dtype(), &t.dtype))
    fail(name, "dtype float32, float16 or bfloat16", dtype_name(a.dtype()));
  if (a.shape(ndim - 1) > 1 && a.stride(ndim - 1) != 1)
    fail(name, "a contiguous last dimension (stride 1)",
         "stride " + std::to_string(a.stride(ndim - 1)));
  t.data = a.data();
  t.rank = ndim;
  for (int i = 0; i < ndim; ++i) {
    t.shape[i] = static_cast<std::int64_t>(a.shape(i));
    t.stride[i] = a.stride(i);
  }
  t.space = space_;
  return t;
}

void* Call::stream(nb::handle stream) {
  if (space_ == MemorySpace::kHost) {
    if (!stream.is_none())
      fail("stream", "None for host arrays (they run on the CPU backend)",
           nb::cast<std::string>(nb::repr(stream)));
    return nullptr;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  // The CUDA API runs on the current device: make it the arrays' device for this call.
  int current = -1;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device_) {
    ATTNSTATE_CUDA_CHECK(cudaSetDevice(device_));
    restore_device_ = current;
  }
  nb::object handle;
  if (stream.is_none()) {
    if (is_torch_tensor(first_) && !torch_hooks().current_stream.is_none()) {
      handle = torch_hooks().current_stream(device_);
    } else if (module_of(first_).rfind("cupy", 0) == 0) {
      handle = nb::module_::import_("cupy").attr("cuda").attr("get_current_stream")().attr("ptr");
    } else {
      fail("stream",
           "a CUDA stream (an int handle or an object with __cuda_stream__) for CUDA arrays of " +
               module_of(first_),
           "None");
    }
  } else if (nb::isinstance<nb::int_>(stream)) {
    handle = nb::borrow(stream);
  } else if (nb::hasattr(stream, "__cuda_stream__")) {
    nb::object r = stream.attr("__cuda_stream__")();
    handle = nb::isinstance<nb::tuple>(r) ? nb::object(r[1]) : r;
  } else if (nb::hasattr(stream, "cuda_stream")) {
    handle = stream.attr("cuda_stream");
  } else if (nb::hasattr(stream, "ptr")) {
    handle = stream.attr("ptr");
  } else {
    fail("stream", "an int handle or an object with __cuda_stream__",
         nb::cast<std::string>(nb::str(nb::type_name(stream.type()))));
  }
  return reinterpret_cast<void*>(nb::cast<std::uintptr_t>(handle));
#else
  return nullptr;  // unreachable: place() refuses CUDA arrays in a build without CUDA
#endif
}

Call::~Call() {
#if defined(ATTNSTATE_HAS_CUDA)
  if (restore_device_ >= 0) cudaSetDevice(restore_device_);
#endif
}

}  // namespace py
}  // namespace attnstate
