"""Array-library helpers: which library an array comes from, its dtype's name, where it lives,
and allocation of outputs and workspaces with that same library (attnstate never allocates)."""

from . import _attnstate as _C

# Every spelling of a dtype the package takes, to its one name (NumPy's, torch's attribute).
_DTYPE_ALIASES = {
    "f32": "float32", "float32": "float32", "float": "float32",
    "f16": "float16", "float16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "e4m3": "float8_e4m3fn", "e4m3fn": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "float8_e5m2": "float8_e5m2",
    "int32": "int32", "uint8": "uint8", "bool": "bool",
}
_TO_DTYPE = {"float32": _C.DType.F32, "float16": _C.DType.F16, "bfloat16": _C.DType.BF16,
             "float8_e4m3fn": _C.DType.E4M3, "float8_e5m2": _C.DType.E5M2}
_NAME_OF = {v: k for k, v in _TO_DTYPE.items()}
# What a state's o may hold (the binding's message says the same).
STATE_DTYPES = "float32, float16, bfloat16, float8_e4m3fn or float8_e5m2"
# NumPy has these only through ml_dtypes (a dependency of the package).
_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def library(a):
    """'torch', 'cupy', 'jax', 'numpy' or the array type's top-level module name."""
    mod = type(a).__module__.split(".")[0]
    return "jax" if mod in ("jaxlib", "jax") else mod


def _raw_name(dtype):
    """The name of a dtype given as a string, a dtype object of any library (NumPy's, torch's,
    CuPy's) or a scalar type (np.float32, ml_dtypes.bfloat16, jnp.float32)."""
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, _C.DType):
        return _NAME_OF[dtype]
    name = getattr(dtype, "name", None)
    if isinstance(name, str):  # NumPy and CuPy dtype objects
        return name
    if isinstance(dtype, type):  # a scalar type: its NumPy dtype's name
        try:
            import numpy as np
            return np.dtype(dtype).name
        except TypeError:
            return dtype.__name__
    return str(dtype).rsplit(".", 1)[-1]  # torch.bfloat16 -> bfloat16


def dtype_name(dtype, arg="dtype", fn="attnstate"):
    """Normalised name of a dtype given as a string, any library's dtype object or a scalar
    type; an error naming `fn` and `arg` for one the package does not take."""
    name = _raw_name(dtype)
    if name not in _DTYPE_ALIASES:
        raise error(fn, arg, STATE_DTYPES, repr(dtype) if isinstance(dtype, str) else name)
    return _DTYPE_ALIASES[name]


def array_dtype(a):
    """Normalised name of an array's dtype. A dtype the package does not take keeps its own name
    (e.g. "float64"): an output allocated like the array then reaches the binding, whose error
    names the argument the caller passed (e.g. `a.o`)."""
    name = _raw_name(a.dtype)
    return _DTYPE_ALIASES.get(name, name)


def to_dtype(dtype, arg="dtype", fn="attnstate"):
    """The library's DType of a dtype of any spelling; an error naming `fn` and `arg` else."""
    name = dtype_name(dtype, arg, fn)
    if name not in _TO_DTYPE:
        raise error(fn, arg, STATE_DTYPES, name)
    return _TO_DTYPE[name]


def device_of(a):
    """CUDA device index of `a`, or None for host memory (from the DLPack device)."""
    kind, index = a.__dlpack_device__() if hasattr(a, "__dlpack_device__") else (1, 0)
    return int(index) if int(kind) in (2, 13) else None


def empty(like, shape, dtype):
    """An uninitialised array of `shape` and `dtype` (any spelling; a dtype the package does not
    take is allocated as it is, for the binding to refuse) from the library and device of
    `like`."""
    name = _raw_name(dtype)
    name = _DTYPE_ALIASES.get(name, name)
    lib = library(like)
    if lib == "torch":
        import torch
        return torch.empty(shape, dtype=getattr(torch, name), device=like.device)
    if lib == "cupy":
        import cupy
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=_numpy_dtype(name))
    if lib == "jax":
        import jax.numpy as jnp
        return jnp.empty(shape, dtype=name, device=list(like.devices())[0])
    import numpy as np
    return np.empty(shape, dtype=_numpy_dtype(name))


def _numpy_dtype(name):
    if name in _ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            raise error("attnstate", "dtype",
                        f"float32 or float16 for NumPy arrays ({name} needs ml_dtypes)",
                        name) from None
        return getattr(ml_dtypes, name)
    return name


def error(fn, arg, expected, got, status=_C.Status.INVALID_ARGUMENT):
    """An attnstate.Error in the library's message form, naming the Python argument."""
    err = _C.Error(f"{fn}: argument '{arg}': expected {expected}, got {got}")
    err.status = status
    return err
