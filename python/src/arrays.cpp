/// @file arrays.cpp
/// @brief Array import (DLPack, with a direct path for torch tensors), views and streams.
#include "arrays.hpp"

#include <nanobind/stl/string.h>

#include <cmath>
#include <sstream>

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

std::string module_of(nb::handle h) {
  nb::object mod = nb::getattr(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(h.ptr()))),
                               "__module__", nb::none());
  return mod.is_none() ? std::string() : nb::cast<std::string>(nb::str(mod));
}

std::string shape_string(const Array& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string number(float x) {
  std::ostringstream ss;
  ss << x;
  return ss.str();
}

std::string type_of(nb::handle h) {
  return nb::cast<std::string>(nb::str(nb::type_name(h.type())));
}

// The name of an array's dtype object: NumPy's "bfloat16", torch's "torch.float8_e4m3fn" as
// "float8_e4m3fn"; empty without a dtype.
std::string dtype_attr_name(nb::handle h) {
  nb::object dt = nb::getattr(h, "dtype", nb::none());
  if (dt.is_none()) return std::string();
  const std::string s = nb::cast<std::string>(nb::str(dt));
  return s.substr(s.rfind('.') + 1);
}

constexpr nb::dlpack::dtype dl(nb::dlpack::dtype_code code, int bits) {
  return nb::dlpack::dtype{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1};
}

// dtypes that NumPy (ml_dtypes' extension types) or older torch (fp8) cannot export through
// DLPack: read through a view of an integer dtype of the same size, then tagged as what they are.
struct ViewedDType {
  const char* name;      // the dtype's name in NumPy and torch
  const char* view;      // the integer dtype of the view
  nb::dlpack::dtype dt;  // what the data is
};
constexpr ViewedDType kViewed[] = {
    {"bfloat16", "uint16", dl(nb::dlpack::dtype_code::Bfloat, 16)},
    {"float8_e4m3fn", "uint8", dl(nb::dlpack::dtype_code::Float8_E4M3FN, 8)},
    {"float8_e5m2", "uint8", dl(nb::dlpack::dtype_code::Float8_E5M2, 8)},
};

const ViewedDType* viewed_dtype(const std::string& name) {
  for (const ViewedDType& v : kViewed)
    if (name == v.name) return &v;
  return nullptr;
}

// `a` with dtype `dt` and, for an array without elements, C-contiguous strides (NumPy 2 reports
// stride 0 for them, which no layout check should see). `owner` keeps the memory alive.
Array retag(const Array& a, nb::dlpack::dtype dt, nb::handle owner) {
  const size_t n = a.ndim();
  std::vector<size_t> shape(n);
  std::vector<std::int64_t> strides(n);
  std::int64_t step = 1;
  for (size_t i = n; i-- > 0;) {
    shape[i] = a.shape(i);
    strides[i] = a.size() == 0 ? step : a.stride(i);
    step *= a.shape(i) > 1 ? static_cast<std::int64_t>(a.shape(i)) : 1;
  }
  return Array(a.data(), n, shape.data(), owner, strides.data(), dt, a.device_type(),
               a.device_id());
}

}  // namespace

const char* const kStateDTypes = "float32, float16, bfloat16, float8_e4m3fn or float8_e5m2";

const char* to_string(LseLayout l) {
  return l == LseLayout::kHeadsTokens ? "heads_tokens" : "tokens_heads";
}

LseLayout parse_lse_layout(nb::handle layout, const char* fn, const std::string& name) {
  const char* expected =
      "\"tokens_heads\" (lse (tokens, heads)) or \"heads_tokens\" (lse (heads, "
      "tokens), FlashAttention's and vLLM's)";
  if (!nb::isinstance<nb::str>(layout))
    detail::throw_argument(fn, name.c_str(), expected, type_of(layout));
  const std::string s = nb::cast<std::string>(layout);
  if (s == "tokens_heads") return LseLayout::kTokensHeads;
  if (s == "heads_tokens") return LseLayout::kHeadsTokens;
  detail::throw_argument(fn, name.c_str(), expected, "\"" + s + "\"");
}

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
                         type_of(base));
}

bool to_dtype(nb::dlpack::dtype dt, DType* out) {
  using code = nb::dlpack::dtype_code;
  if (dt == dl(code::Float, 32)) {
    *out = DType::kF32;
  } else if (dt == dl(code::Float, 16)) {
    *out = DType::kF16;
  } else if (dt == dl(code::Bfloat, 16)) {
    *out = DType::kBF16;
  } else if (dt == dl(code::Float8_E4M3FN, 8)) {
    *out = DType::kE4M3;
  } else if (dt == dl(code::Float8_E5M2, 8)) {
    *out = DType::kE5M2;
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
    case nb::dlpack::dtype_code::Complex:
      kind = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    case nb::dlpack::dtype_code::Float8_E3M4:
      return "float8_e3m4";
    case nb::dlpack::dtype_code::Float8_E4M3:
      return "float8_e4m3";
    case nb::dlpack::dtype_code::Float8_E4M3B11FNUZ:
      return "float8_e4m3b11fnuz";
    case nb::dlpack::dtype_code::Float8_E4M3FN:
      return "float8_e4m3fn";
    case nb::dlpack::dtype_code::Float8_E4M3FNUZ:
      return "float8_e4m3fnuz";
    case nb::dlpack::dtype_code::Float8_E5M2:
      return "float8_e5m2";
    case nb::dlpack::dtype_code::Float8_E5M2FNUZ:
      return "float8_e5m2fnuz";
    case nb::dlpack::dtype_code::Float8_E8M0FNU:
      return "float8_e8m0fnu";
    case nb::dlpack::dtype_code::Float6_E2M3FN:
      return "float6_e2m3fn";
    case nb::dlpack::dtype_code::Float6_E3M2FN:
      return "float6_e3m2fn";
    case nb::dlpack::dtype_code::Float4_E2M1FN:
      return "float4_e2m1fn";
    default:
      return "DLPack dtype code " + std::to_string(dt.code) + " of " + std::to_string(dt.bits) +
             " bits";
  }
  return std::string(kind) + std::to_string(dt.bits);
}

void Call::fail(const std::string& name, const std::string& expected, const std::string& got,
                Status status) const {
  detail::throw_argument(fn_, name.c_str(), expected, got, status);
}

bool Call::import(nb::handle h, Array* a) {
  if (is_torch_tensor(h) && torch_hooks().to_dlpack.is_valid() &&
      !torch_hooks().to_dlpack.is_none()) {
    try {
      nb::object capsule = torch_hooks().to_dlpack(h);
      return nb::try_cast(capsule, *a);
    } catch (const nb::python_error&) {
      return false;  // a dtype torch does not export (fp8 before DLPack 1.1): see array()
    }
  }
  return nb::try_cast(h, *a);
}

Array Call::array(nb::handle h, const std::string& name, int ndim) {
  if (h.is_none()) fail(name, "an array", "None");
  Array a;
  nb::object owner = nb::borrow(h);
  bool ok = import(h, &a);
  nb::dlpack::dtype dt = a.dtype();
  if (!ok) {
    const std::string dtype = dtype_attr_name(h);
    const ViewedDType* viewed = viewed_dtype(dtype);
    // only where `view` shares the memory (an output is written through it): NumPy and torch
    const bool torch = is_torch_tensor(h);
    if (viewed != nullptr && (torch || module_of(h) == "numpy")) {
      nb::object view_dtype = nb::str(viewed->view);
      if (torch) view_dtype = nb::module_::import_("torch").attr(viewed->view);
      owner = h.attr("view")(view_dtype);
      ok = import(owner, &a);
      dt = viewed->dt;
    }
    if (!ok && !dtype.empty())
      fail(name,
           std::string("an array of a dtype attnstate reads (") + kStateDTypes +
               " for states, through ml_dtypes for NumPy; int32, uint8 or bool for tables and "
               "masks)",
           "a " + type_of(h) + " of dtype " + dtype);
    if (!ok) fail(name, "an array speaking DLPack (torch, CuPy, JAX, NumPy)", type_of(h));
  }
  if (!(dt == a.dtype()) || a.size() == 0) a = retag(a, dt, owner);
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
    fail(name, "an attnstate.State(o, lse, base)", type_of(h));
  return *s;
}

DType Call::o_dtype(const Array& o, const PyState& s, const std::string& name) const {
  DType dt = DType::kF32;
  if (!to_dtype(o.dtype(), &dt))
    fail(name + ".o", std::string("dtype ") + kStateDTypes, dtype_name(o.dtype()));
  const int last = static_cast<int>(o.ndim()) - 1;
  if (o.shape(last) > 1 && o.stride(last) != 1)
    fail(name + ".o", "a contiguous last dimension (stride 1)",
         "stride " + std::to_string(o.stride(last)));
  if (!is_fp8(dt) && s.scale != 1.f)
    fail(name + ".scale",
         "1 (a scale is that of an fp8 o; this o is " + dtype_name(o.dtype()) + ")",
         number(s.scale));
  if (is_fp8(dt) && !(std::isfinite(s.scale) && s.scale > 0.f))
    fail(name + ".scale", "a finite scale > 0 (real value = stored value x scale)",
         number(s.scale));
  return dt;
}

StateView Call::state(nb::handle h, const std::string& name) {
  const PyState& s = state_of(h, name);
  Array o = array(s.o, name + ".o", 3);
  StateView v;
  v.dtype = o_dtype(o, s, name);
  v.o_scale = s.scale;
  v.o = const_cast<void*>(o.data());
  v.tokens = static_cast<std::int64_t>(o.shape(0));
  v.heads = static_cast<std::int64_t>(o.shape(1));
  v.head_dim = static_cast<std::int64_t>(o.shape(2));
  v.o_stride_token = o.stride(0);
  v.o_stride_head = o.stride(1);
  v.base = s.base;
  v.space = space_;
  if (s.lse.is_none()) {  // no LSE (an output whose LSE the caller does not want)
    v.lse = nullptr;
    v.lse_stride_token = v.heads;
    v.lse_stride_head = 1;
    return v;
  }
  Array lse = array(s.lse, name + ".lse", 2);
  if (!(lse.dtype() == nb::dtype<float>()))
    fail(name + ".lse", "dtype float32", dtype_name(lse.dtype()));
  // the layout names the axes; the strides are whatever the array has
  const bool head_major = s.lse_layout == LseLayout::kHeadsTokens;
  const int t = head_major ? 1 : 0, hd = 1 - t;
  if (static_cast<std::int64_t>(lse.shape(t)) != v.tokens ||
      static_cast<std::int64_t>(lse.shape(hd)) != v.heads) {
    const std::string T = std::to_string(v.tokens), H = std::to_string(v.heads);
    fail(name + ".lse",
         head_major
             ? "shape (" + H + ", " + T + ") (o's heads and tokens: lse_layout=\"heads_tokens\")"
             : "shape (" + T + ", " + H +
                   ") (o's tokens and heads: lse_layout=\"tokens_heads\"; pass "
                   "lse_layout=\"heads_tokens\" for a (heads, tokens) LSE)",
         shape_string(lse));
  }
  v.lse = static_cast<float*>(const_cast<void*>(lse.data()));
  v.lse_stride_token = lse.stride(t);
  v.lse_stride_head = lse.stride(hd);
  return v;
}

ConstStateStackView Call::stack(nb::handle h, StackOrder order, const std::string& name) {
  const PyState& s = state_of(h, name);
  Array o = array(s.o, name + ".o", 4);
  ConstStateStackView v;
  v.dtype = o_dtype(o, s, name);
  v.o_scale = s.scale;
  if (s.lse.is_none())
    fail(name + ".lse", "an fp32 array (a stack is an input: only an output may omit its LSE)",
         "None");
  const bool head_major = s.lse_layout == LseLayout::kHeadsTokens;
  if (head_major && order == StackOrder::kTokensMajor)
    fail(name + ".lse_layout",
         "\"tokens_heads\" for order=\"tokens_major\" (a stack of head-major LSEs is "
         "order=\"states_major\" with lse (S, heads, tokens))",
         "\"heads_tokens\"");
  Array lse = array(s.lse, name + ".lse", 3);
  if (!(lse.dtype() == nb::dtype<float>()))
    fail(name + ".lse", "dtype float32", dtype_name(lse.dtype()));
  // o: tokens-major (T, S, H, D), states-major (S, T, H, D); lse: o's first three dimensions,
  // or (S, H, T) for head-major LSEs
  const int t = order == StackOrder::kTokensMajor ? 0 : 1;
  const int st = 1 - t;
  const int lt = head_major ? 2 : t, lh = head_major ? 1 : 2;
  if (lse.shape(st) != o.shape(st) || lse.shape(lt) != o.shape(t) || lse.shape(lh) != o.shape(2)) {
    const std::string S = std::to_string(o.shape(st)), T = std::to_string(o.shape(t)),
                      H = std::to_string(o.shape(2));
    fail(name + ".lse",
         head_major ? "shape (" + S + ", " + H + ", " + T +
                          ") (o's states, heads and tokens: lse_layout=\"heads_tokens\")"
         : t == 0 ? "shape (" + T + ", " + S + ", " + H + ") (o's first three dimensions)"
                  : "shape (" + S + ", " + T + ", " + H + ") (o's first three dimensions)",
         shape_string(lse));
  }
  v.o = o.data();
  v.lse = static_cast<const float*>(lse.data());
  v.tokens = static_cast<std::int64_t>(o.shape(t));
  v.num_states = static_cast<std::int64_t>(o.shape(st));
  v.heads = static_cast<std::int64_t>(o.shape(2));
  v.head_dim = static_cast<std::int64_t>(o.shape(3));
  v.o_stride_token = o.stride(t);
  v.o_stride_state = o.stride(st);
  v.o_stride_head = o.stride(2);
  v.lse_stride_token = lse.stride(lt);
  v.lse_stride_state = lse.stride(st);
  v.lse_stride_head = lse.stride(lh);
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
    fail(name, std::string("dtype ") + kStateDTypes, dtype_name(a.dtype()));
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
