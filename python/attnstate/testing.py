"""The conformance kit for Python kernels: `check_kernel(fn, base=...)` property-tests an
attention kernel against the algebra of attention states with the library's RapidCheck laws
(exactness against a double-precision reference, split/merge, identity, declared base, large
logits, determinism), shrinking a failure to a minimal case.

    def test_my_kernel():
        attnstate.testing.check_kernel(my_kernel, base="natural")

`fn(q, k, v, scale)` gets q (tokens, heads_q, head_dim) and k, v (keys, heads_kv, head_dim)
(query head h reads KV head h // (heads_q // heads_kv); keys may be 0) and returns (o, lse):
o (tokens, heads_q, head_dim), lse (tokens, heads_q) in the declared base, as arrays of any
library (host or CUDA; they are copied to float32 NumPy arrays for the comparison). By default
q, k, v are float32 NumPy arrays holding values of the drawn input dtype (exactly: every f16 and
bf16 value is a float32 value); pass
`to_inputs(array, dtype_name)` to hand the kernel other arrays (e.g. bfloat16 CUDA tensors).

Attention sinks: with `sink_percent > 0`, that share of the problems has one sink logit per query
head (natural base, uniform in `sink_range`, default [-4, 12]) and the kernel is called
`fn(q, k, v, scale, sinks=s)`: `s` a (heads_q,) float32 array (through `to_inputs(s,
"float32")`), and fn returns the state with every row (t, h) merged once with the sink state
(0, s[h]), its LSE including the sink; or `s = None`, and fn adds no sink: the kit asks for the
partial states of its split/merge law that way, and a kernel that merges the sink into every
partial (or every split of its own) fails. `reference_state(q, k, v, scale, sinks=...)` is the
kit's double-precision reference with the same rule.
"""

import numpy as np

from . import _attnstate as _C
from ._arrays import dtype_name, error, library
from ._merge import _parse_base

try:
    from . import _testing as _T
except ImportError:  # a build without RapidCheck has no kit
    _T = None

LAWS = ("exactness", "split_merge", "identity", "declared_base", "large_logits", "determinism")


def to_numpy(x):
    """`x` (torch, CuPy, JAX or NumPy; host or CUDA) as a contiguous float32 NumPy array."""
    lib = library(x)
    if lib == "torch":
        x = x.detach().float().cpu().numpy()
    elif lib == "cupy":
        x = x.astype("float32").get()
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def _default_inputs(a, dtype):
    return a  # float32 arrays already hold values rounded to the drawn dtype


def _check_kit_and_base(fn_name, base):
    """The kit's name of `base` (attnstate.Base or "natural" / "base2"); raises attnstate.Error
    for a build without the kit or for another base."""
    if _T is None:
        raise error(fn_name, "kit", "a build of attnstate with its testing kit (RapidCheck)",
                    "a build without it")
    return "base2" if _parse_base(base, fn_name, "base") == _C.Base.BASE2 else "natural"


def check_kernel(fn, *, base, out_dtype="float32",
                 input_dtypes=("float32", "float16", "bfloat16"), laws=LAWS, num_tests=100,
                 seed=0, tolerance_factor=1.0, shrink=True,
                 p_rounded_to_input=True, max_parts=5, max_tokens=3, min_keys=0, max_keys=300,
                 max_heads_kv=2, group_sizes=(1, 2, 4), head_dims=(1, 2, 4, 8, 16, 32),
                 large_logits_percent=20, sink_percent=0, sink_range=(-4.0, 12.0),
                 to_inputs=None):
    """Runs the kit's laws on `fn`; raises AssertionError with the kit's report (law, shrunk
    minimal case, seed) when one fails, else returns the report's summary text.

    base: the base `fn`'s LSEs are in (attnstate.Base or "natural" / "base2"; required).
    out_dtype: the dtype fn's o is judged at (its tolerance). input_dtypes: the q/k/v dtypes
    drawn (any spelling: "bfloat16", np.float16, torch.bfloat16, ...). seed: RapidCheck
    seed (0: RC_PARAMS' or a random one, printed in the report). The shape options match the C++
    `ProblemGenOptions` (head_dims, group_sizes, max_keys, ...); `num_tests` cases per law.
    sink_percent: share of problems with attention sinks (0, the default: none, and fn is called
    without the `sinks` keyword); sink_range: (least, largest) sink logit drawn.
    Raises attnstate.Error naming the option on an invalid one.
    """
    fn_name = "attnstate.testing.check_kernel"
    base = _check_kit_and_base(fn_name, base)
    if not callable(fn):
        raise error(fn_name, "fn", "a callable fn(q, k, v, scale) -> (o, lse)", type(fn).__name__)
    convert = to_inputs or _default_inputs
    with_sinks = int(sink_percent) > 0
    try:
        sink_min, sink_max = (float(x) for x in sink_range)
    except (TypeError, ValueError):
        raise error(fn_name, "sink_range", "(least, largest) sink logits",
                    repr(sink_range)) from None

    def kernel(q, k, v, scale, dtype, sinks):
        args = (convert(q, dtype), convert(k, dtype), convert(v, dtype), scale)
        if with_sinks:
            o, lse = fn(*args, sinks=None if sinks is None else convert(sinks, "float32"))
        else:
            o, lse = fn(*args)
        return to_numpy(o), to_numpy(lse)

    passed, summary, used_seed, _ = _T.check_state_kernel(
        kernel, base, list(laws), int(num_tests), int(seed), float(tolerance_factor), bool(shrink),
        bool(p_rounded_to_input), int(max_parts), int(max_tokens), int(min_keys), int(max_keys),
        int(max_heads_kv), [int(g) for g in group_sizes], [int(d) for d in head_dims],
        [dtype_name(d, "input_dtypes", fn_name) for d in input_dtypes],
        dtype_name(out_dtype, "out_dtype", fn_name), int(large_logits_percent), int(sink_percent),
        sink_min, sink_max)
    if not passed:
        raise AssertionError(summary)
    return summary


def reference_state(q, k, v, scale, *, sinks=None, base="natural"):
    """The kit's double-precision reference: the attention state (o, lse) of q (tokens, heads_q,
    head_dim) over all of k, v (keys, heads_kv, head_dim), as float64 NumPy arrays, lse in `base`
    (attnstate.Base or "natural" / "base2"). Inputs of any library are read as float32 (`to_numpy`).

    sinks: None, or (heads_q,) sink logits (natural base): every row (t, h) is then merged once
    with the sink state (0, sinks[h]) after its keys: lse = log(e^lse + e^s), o scaled by
    e^lse / (e^lse + e^s); a row without keys becomes (0, s). The state of a partial key set (a
    split) is sink-free: call it with sinks=None and merge the sink once after the partials.
    Raises attnstate.Error naming the argument on a bad shape or base.
    """
    base = _check_kit_and_base("attnstate.testing.reference_state", base)
    s = None if sinks is None else to_numpy(sinks)
    return _T.reference_state(to_numpy(q), to_numpy(k), to_numpy(v), float(scale), s, base)
