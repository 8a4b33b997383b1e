"""Array-library helpers: which library an array comes from, its dtype's name, where it lives,
and allocation of outputs and workspaces with that same library (attnstate never allocates)."""

from . import _attnstate as _C

_DTYPE_ALIASES = {
    "f32": "float32", "float32": "float32", "float": "float32",
    "f16": "float16", "float16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "int32": "int32", "uint8": "uint8", "bool": "bool",
}
_TO_DTYPE = {"float32": _C.DType.F32, "float16": _C.DType.F16, "bfloat16": _C.DType.BF16}


def library(a):
    """'torch', 'cupy', 'jax', 'numpy' or the array type's top-level module name."""
    mod = type(a).__module__.split(".")[0]
    return "jax" if mod in ("jaxlib", "jax") else mod


def dtype_name(dtype, arg="dtype", fn="attnstate"):
    """Normalised name of a dtype given as a string or as any library's dtype object."""
    if isinstance(dtype, _C.DType):
        return {_C.DType.F32: "float32", _C.DType.F16: "float16", _C.DType.BF16: "bfloat16"}[dtype]
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or str(dtype)
    name = name.rsplit(".", 1)[-1]  # torch.bfloat16 -> bfloat16
    if name not in _DTYPE_ALIASES:
        raise error(fn, arg, "float32, float16 or bfloat16", repr(dtype))
    return _DTYPE_ALIASES[name]


def array_dtype(a):
    return dtype_name(a.dtype)


def to_dtype(dtype, arg="dtype", fn="attnstate"):
    name = dtype_name(dtype, arg, fn)
    if name not in _TO_DTYPE:
        raise error(fn, arg, "float32, float16 or bfloat16", name)
    return _TO_DTYPE[name]


def device_of(a):
    """CUDA device index of `a`, or None for host memory (from the DLPack device)."""
    kind, index = a.__dlpack_device__() if hasattr(a, "__dlpack_device__") else (1, 0)
    return int(index) if int(kind) in (2, 13) else None


def empty(like, shape, dtype):
    """An uninitialised array of `shape` and `dtype` from the library and device of `like`."""
    lib = library(like)
    dtype = dtype_name(dtype) if dtype not in ("int32", "uint8") else dtype
    if lib == "torch":
        import torch
        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    if lib == "cupy":
        import cupy
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=_numpy_dtype(dtype))
    if lib == "jax":
        import jax.numpy as jnp
        return jnp.empty(shape, dtype=dtype, device=list(like.devices())[0])
    import numpy as np
    return np.empty(shape, dtype=_numpy_dtype(dtype))


def _numpy_dtype(dtype):
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise error("attnstate", "dtype",
                        "float32 or float16 for NumPy arrays (bfloat16 needs ml_dtypes)",
                        "bfloat16") from None
        return ml_dtypes.bfloat16
    return dtype


def error(fn, arg, expected, got, status=_C.Status.INVALID_ARGUMENT):
    """An attnstate.Error in the library's message form, naming the Python argument."""
    err = _C.Error(f"{fn}: argument '{arg}': expected {expected}, got {got}")
    err.status = status
    return err
