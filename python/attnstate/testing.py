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
"""

import numpy as np

from ._arrays import dtype_name, error, library

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


def check_kernel(fn, *, base, out_dtype="float32",
                 input_dtypes=("float32", "float16", "bfloat16"), laws=LAWS, num_tests=100,
                 seed=0, tolerance_factor=1.0, shrink=True,
                 p_rounded_to_input=True, max_parts=5, max_tokens=3, min_keys=0, max_keys=300,
                 max_heads_kv=2, group_sizes=(1, 2, 4), head_dims=(1, 2, 4, 8, 16, 32),
                 large_logits_percent=20, to_inputs=None):
    """Runs the kit's laws on `fn`; raises AssertionError with the kit's report (law, shrunk
    minimal case, seed) when one fails, else returns the report's summary text.

    base: the base `fn`'s LSEs are in ("natural" or "base2"; required). out_dtype: the dtype
    fn's o is judged at (its tolerance). input_dtypes: the q/k/v dtypes drawn. seed: RapidCheck
    seed (0: RC_PARAMS' or a random one, printed in the report). The shape options match the C++
    `ProblemGenOptions` (head_dims, group_sizes, max_keys, ...); `num_tests` cases per law.
    Raises attnstate.Error naming the option on an invalid one.
    """
    fn_name = "attnstate.testing.check_kernel"
    if _T is None:
        raise error(fn_name, "kit", "a build of attnstate with its testing kit (RapidCheck)",
                    "a build without it")
    if base not in ("natural", "base2"):
        raise error(fn_name, "base", '"natural" or "base2" (the base fn returns)', repr(base))
    if not callable(fn):
        raise error(fn_name, "fn", "a callable fn(q, k, v, scale) -> (o, lse)", type(fn).__name__)
    convert = to_inputs or _default_inputs

    def kernel(q, k, v, scale, dtype):
        o, lse = fn(convert(q, dtype), convert(k, dtype), convert(v, dtype), scale)
        return to_numpy(o), to_numpy(lse)

    passed, summary, used_seed, _ = _T.check_state_kernel(
        kernel, base, list(laws), int(num_tests), int(seed), float(tolerance_factor), bool(shrink),
        bool(p_rounded_to_input), int(max_parts), int(max_tokens), int(min_keys), int(max_keys),
        int(max_heads_kv), [int(g) for g in group_sizes], [int(d) for d in head_dims],
        [dtype_name(d, "input_dtypes", fn_name) for d in input_dtypes],
        dtype_name(out_dtype, "out_dtype", fn_name), int(large_logits_percent))
    if not passed:
        raise AssertionError(summary)
    return summary
