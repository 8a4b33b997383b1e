"""Helpers of the merge tests ported from the peers' suites and of the compat adapters' tests:
arrays of one library (NumPy, torch on the CPU, torch on CUDA) behind one small interface,
per-case random streams, NaN-poisoned outputs, float64 merge references and tolerances per
dtype."""

import zlib

import numpy as np
import pytest

from helpers import cuda_torch, has_module

LN2 = float(np.log(2.0))

def seed_of(*params):
    """A deterministic seed per case (fresh inputs for every case, the same on every run)."""
    return zlib.crc32(repr(params).encode())


def cpu_libs():
    """NumPy always; torch on the CPU when installed (skipped otherwise, with the reason)."""
    return ["numpy", pytest.param("torch", marks=pytest.mark.skipif(
        not has_module("torch"), reason="torch is not installed"))]


requires_gpu = pytest.mark.skipif(
    cuda_torch() is None, reason="needs torch, a CUDA device and attnstate's CUDA backend")


class Lib:
    """Arrays of one library: "numpy", "torch" (CPU) or "cuda" (torch on the current device)."""

    def __init__(self, name):
        self.name = name
        if name == "numpy":
            self.xp = np
        else:
            self.xp = pytest.importorskip("torch", reason="torch is not installed")
        self.device = "cuda" if name == "cuda" else "cpu"

    def dtype(self, name):
        if self.name != "numpy":
            return getattr(self.xp, name)
        if name in ("bfloat16", "float8_e4m3fn"):
            ml = pytest.importorskip("ml_dtypes", reason="NumPy's " + name + " needs ml_dtypes")
            return getattr(ml, name)
        return np.dtype(name)

    def rng(self, seed):
        if self.name == "numpy":
            return np.random.default_rng(seed)
        return self.xp.Generator(device=self.device).manual_seed(seed)

    def normal(self, rng, shape, dtype="float32"):
        if self.name == "numpy":
            return rng.standard_normal(shape).astype(np.float32).astype(self.dtype(dtype))
        t = self.xp.randn(shape, generator=rng, device=self.device)
        return t.to(self.dtype(dtype))

    def uniform(self, rng, shape):
        if self.name == "numpy":
            return rng.random(shape)
        return self.xp.rand(shape, generator=rng, device=self.device, dtype=self.xp.float64)

    def full(self, shape, value, dtype="float32"):
        if self.name == "numpy":
            return np.full(shape, value, np.float32).astype(self.dtype(dtype))
        return self.xp.full(shape, value, dtype=self.xp.float32, device=self.device).to(
            self.dtype(dtype))

    def nan(self, shape, dtype="float32"):
        """An output poisoned with NaN (fp8 e4m3fn has a NaN; the merge must overwrite it)."""
        return self.full(shape, float("nan"), dtype)

    def asarray(self, a, dtype=None):
        """A host NumPy array (or Python list) in this library, cast to `dtype`."""
        a = np.asarray(a)
        if self.name == "numpy":
            return a if dtype is None else a.astype(self.dtype(dtype))
        t = self.xp.from_numpy(np.ascontiguousarray(a)).to(self.device)
        return t if dtype is None else t.to(self.dtype(dtype))

    def f64(self, x):
        """A float64 copy (the exact value of every element of a float array)."""
        if self.name == "numpy":
            return np.asarray(x).astype(np.float64)
        return x.to(self.xp.float64)

    def host(self, x):
        if self.name == "numpy":
            return np.asarray(x)
        return x.cpu().numpy()

    def copy(self, x):
        return x.copy() if self.name == "numpy" else x.clone()

    def sync(self):
        if self.name == "cuda":
            self.xp.cuda.synchronize()

    def close(self, got, want, atol, rtol, what):
        """`got` (any float dtype) against the float64 `want`, elementwise within
        atol + rtol * |want|; infinities must match exactly; no NaN anywhere."""
        self.sync()
        got = self.f64(got)
        if self.name == "numpy":
            np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=what)
        else:
            self.xp.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m: what +
                                         ": " + m)

    def equal(self, got, want, what):
        """Bit-for-bit equal values (NaN nowhere)."""
        self.sync()
        if self.name == "numpy":
            np.testing.assert_array_equal(np.asarray(got).astype(np.float64),
                                          np.asarray(want).astype(np.float64), err_msg=what)
        else:
            self.xp.testing.assert_close(got, want, atol=0, rtol=0, msg=lambda m: what + ": " +
                                         m)


def tolerance(dtype):
    """(atol, rtol) of an output stored in `dtype` against the float64 merge of its inputs:
    the store's rounding (half an ulp) and float32 arithmetic, with room for |o| up to ~8."""
    return {"float32": (2e-6, 2e-6), "float16": (2e-3, 1e-3),
            "bfloat16": (1.6e-2, 8e-3)}[dtype]


LSE_TOL = (1e-5, 2e-6)  # float32 LSEs of magnitude up to ~20


def reference_merge(xp, o, lse):
    """The float64 merge over axis 0: o (S, T, H, D), lse (S, T, H) natural log, -inf for an
    empty state; S may be 0. Returns (o (T, H, D), lse (T, H)); a row whose states are all
    empty is (0, -inf). Neither input is modified; NaN in the o of an empty state is ignored."""
    inf = float("inf")
    if lse.shape[0] == 0:  # sums over no state: zeros of the right shape, dtype and device
        return o.sum(0), lse.sum(0) - inf
    m = xp.amax(lse, 0)
    empty = m == -inf
    m0 = xp.where(empty, xp.zeros_like(m), m)
    w = xp.exp(lse - m0)[..., None]
    den = w.sum(0)
    o_w = xp.where(w > 0, o * w, xp.zeros_like(o))
    out_o = o_w.sum(0) / xp.where(empty[..., None], xp.ones_like(den), den)
    log_den = xp.log(xp.where(empty, xp.ones_like(m), den[..., 0]))
    out_lse = xp.where(empty, xp.zeros_like(m) - inf, m0 + log_den)
    return out_o, out_lse


def base2_reference(lib, vs, ss):
    """float64 merge of the states (vs[i] (T, H, D), ss[i] (T, H) base 2): (v, s base 2)."""
    xp = lib.xp
    o, lse = reference_merge(xp, xp.stack([lib.f64(v) for v in vs]),
                             xp.stack([lib.f64(s) * LN2 for s in ss]))
    return o, lse / LN2


def vllm_reference(lib, p_o, p_lse, s_o, s_lse, with_context=None):
    """vLLM's merge in float64, with attnstate's empty rows: (o (T, H, D), lse (H, T)) of the
    partials with head-major LSEs; infinite LSEs are empty partials; tokens from
    `with_context` on take the suffix alone. A row with no partial left is (0, -inf) (vLLM's
    CUDA kernel copies prefix_output, or suffix_output and its LSE for a token without
    context: docs/compat.md)."""
    xp = lib.xp
    tokens = p_o.shape[0]
    n = tokens if with_context is None else min(with_context, tokens)
    lse = xp.stack([lib.f64(p_lse).T, lib.f64(s_lse).T])
    lse[xp.isinf(lse)] = -float("inf")
    o, out_lse = reference_merge(xp, xp.stack([lib.f64(p_o), lib.f64(s_o)]), lse)
    o_s, lse_s = reference_merge(xp, lib.f64(s_o)[None], lse[1:])
    o[n:] = o_s[n:]
    out_lse[n:] = lse_s[n:]
    return o, out_lse.T
