"""What both adapters share: argument checks that name the adapter's own arguments, and the
library-neutral array operations they need (a float32 view or copy, a copy, a token mask)."""

import contextlib
import re

from .. import _attnstate as _C
from .._arrays import empty, error


def shape_of(x, fn, arg):
    shape = getattr(x, "shape", None)
    if shape is None:
        raise error(fn, arg, "an array (torch, CuPy, JAX, NumPy)", type(x).__name__)
    return tuple(int(n) for n in shape)


def check_ndim(x, ndim, what, fn, arg):
    shape = shape_of(x, fn, arg)
    if len(shape) != ndim:
        raise error(fn, arg, f"{ndim} dimensions {what}", shape)
    return shape


def check_shape(x, want, what, fn, arg):
    shape = shape_of(x, fn, arg)
    if shape != tuple(want):
        raise error(fn, arg, f"shape {tuple(want)} {what}", shape)
    return shape


def raw_dtype_name(x):
    """The dtype's name as its library spells it, without the module (torch.float8_e4m3fn ->
    float8_e4m3fn), also for dtypes attnstate's own parser does not list."""
    return str(getattr(x, "dtype", type(x).__name__)).rsplit(".", 1)[-1]


def is_float32(x):
    return raw_dtype_name(x) == "float32"


def check_float32(x, fn, arg):
    if not is_float32(x):
        raise error(fn, arg, "dtype float32 (written in place)", raw_dtype_name(x))


def as_float32(x, fn, arg):
    """x itself when float32, else a float32 copy (the peers convert their LSE inputs too)."""
    if is_float32(x):
        return x
    name = raw_dtype_name(x)
    if not (name.startswith("float") or name == "bfloat16") or name.startswith("float8"):
        raise error(fn, arg, "a floating-point dtype (float32 expected)", name)
    if hasattr(x, "float") and hasattr(x, "clone"):  # torch
        return x.float()
    return x.astype("float32")


def copy(x):
    return x.clone() if hasattr(x, "clone") else x.copy()


def token_mask(like, tokens, first):
    """A (tokens,) uint8 array from the library and device of `like`: 1 for the first `first`
    tokens, 0 after (filled by the library: no host round trip, capturable in a CUDA graph)."""
    m = empty(like, (tokens,), "uint8")
    m[:first] = 1
    m[first:] = 0
    return m


_FN = re.compile(r"^attnstate(?:\.|::)[\w.:]+: ")


@contextlib.contextmanager
def renamed(fn, states, args=None):
    """Re-raises an attnstate.Error of the library in the caller's names, keeping its status:
    the adapter's function `fn` in front, and each State argument of the library (`states`
    maps its name onto the caller's (o, lse) names, e.g. "a": ("v_a", "s_a")) written as the
    caller's array: 'a.o' -> 'v_a', 'a.lse' -> 's_a', 'a.head_dim' -> 'v_a.head_dim'.
    `args` renames plain arguments ('mask' -> ...)."""
    try:
        yield
    except _C.Error as e:
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, states)) + r")\.(\w+)")

        def state_part(m):
            o, lse = states[m.group(1)]
            part = m.group(2)
            return {"o": o, "lse": lse}.get(part, f"{lse if part == 'lse_layout' else o}.{part}")

        msg = _FN.sub("", str(e))
        msg = pattern.sub(state_part, msg)
        for old, new in (args or {}).items():
            msg = msg.replace(f"argument '{old}'", f"argument '{new}'")
        err = _C.Error(f"{fn}: {msg}")
        err.status = getattr(e, "status", _C.Status.INVALID_ARGUMENT)
        raise err from e
