"""What the MLA tests share (test_mla.py, test_mla_cascade.py): DeepSeek's widths and a
DeepSeek-like scale, storage dtypes, random queries, a float64 attention state of one row over
given tokens, the comparison of a state with a reference, and CUDA copies of NumPy arrays that
keep a view of a pool a view of the pool's copy."""

import math

import ml_dtypes
import numpy as np
import pytest

import attnstate

RANK, ROPE = 512, 64
SCALE = 0.1352  # a DeepSeek-like scale (mscale^2 / sqrt(192)), not the default 1/sqrt(576)

NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
             "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def stored(x, dtype, scale=1.0):
    """x in the storage dtype (fp8: x / scale) and the real values it holds, in float64."""
    s = (x / scale).astype(NP_DTYPES[dtype])
    return s, s.astype(np.float64) * scale


def queries(rng, batch, q_len, heads, dtype="float32", rank=RANK, rope=ROPE, flashmla=False):
    """q_nope, q_pe in `dtype`; FlashMLA's one (batch, q_len, heads, 576) query as two views."""
    if flashmla:
        q = rng.standard_normal((batch, q_len, heads, rank + rope)).astype(NP_DTYPES[dtype])
        return q[..., :rank], q[..., rank:]
    return (rng.standard_normal((batch, q_len, heads, rank)).astype(NP_DTYPES[dtype]),
            rng.standard_normal((batch, q_len, heads, rope)).astype(NP_DTYPES[dtype]))


def row_state(q_nope, q_pe, ckv, kpe, scale, sinks=None):
    """The float64 MLA state (o (heads, rank), lse (heads,), natural base) of one query row
    q_nope (heads, rank), q_pe (heads, rope) over the tokens ckv (n, rank), kpe (n, rope): keys
    [ckv, kpe], values ckv; the sink (0, sinks[h]) merged in. No token and no sink: (0, -inf)."""
    qn, qp = np.asarray(q_nope, np.float64), np.asarray(q_pe, np.float64)
    s = scale * (qn @ ckv.T + qp @ kpe.T)  # (heads, n)
    n = s.shape[1]
    if sinks is not None:
        s = np.concatenate([s, np.asarray(sinks, np.float64)[:, None]], axis=1)
    if s.shape[1] == 0:
        return np.zeros((qn.shape[0], ckv.shape[1])), np.full(qn.shape[0], -np.inf)
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - m)
    den = e.sum(axis=1)
    return (e[:, :n] @ ckv) / den[:, None], m[:, 0] + np.log(den)


def check(state, want, atol, lse_atol=2e-5):
    """state (an attnstate.State of host arrays) equals want = (o, lse) to the tolerances."""
    o, lse = want
    np.testing.assert_allclose(np.asarray(state.o, np.float64), o, atol=atol, rtol=atol)
    np.testing.assert_allclose(state.lse, lse, atol=lse_atol, rtol=1e-6)


# NumPy dtypes torch.from_numpy cannot take: the same-size integer view, then torch's dtype
_TORCH_VIEW = {np.dtype(ml_dtypes.bfloat16): (np.int16, "bfloat16"),
               np.dtype(ml_dtypes.float8_e4m3fn): (np.uint8, "float8_e4m3fn"),
               np.dtype(ml_dtypes.float8_e5m2): (np.uint8, "float8_e5m2")}


def to_cuda(torch, a):
    """A CUDA copy of the NumPy array `a`; a view of a pool (FlashMLA's) stays a view of the
    pool's copy."""
    base = a if a.base is None else a.base
    view, name = _TORCH_VIEW.get(base.dtype, (base.dtype, None))
    t = torch.from_numpy(np.ascontiguousarray(base).view(view))
    t = (t.view(getattr(torch, name)) if name else t).cuda()
    if a is base:
        return t
    item = a.dtype.itemsize
    offset = (a.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
    return t.as_strided(a.shape, [s // item for s in a.strides], offset)


def ln_to(base):
    """The factor turning a natural-base LSE into one of `base`."""
    return 1.0 if base == "natural" else 1.0 / math.log(2.0)


def poisoned_out(torch, tokens, heads, dtype, base, rank=RANK):
    """A CUDA State (tokens, heads, rank) of `dtype` (a torch dtype), every value NaN: a row the
    kernels leave unwritten stays NaN."""
    return attnstate.State(torch.full((tokens, heads, rank), float("nan"), dtype=dtype,
                                      device="cuda"),
                           torch.full((tokens, heads), float("nan"), device="cuda"), base)


def compare_cuda(gpu, cpu, atol):
    """A CUDA state against the CPU backend's: every row written (no NaN), o to `atol`, the LSEs
    to 2e-3."""
    o = gpu.o.float().cpu().numpy()
    lse = gpu.lse.cpu().numpy()
    assert not np.isnan(o).any() and not np.isnan(lse).any()  # every row written
    np.testing.assert_allclose(o, cpu.o, atol=atol, rtol=atol)
    np.testing.assert_allclose(lse, cpu.lse, atol=2e-3, rtol=1e-4)


def shared_run_errors(q_nope, q_pe, ckv, kpe):
    """The run errors MlaDecode.run and MlaCascade.run share, as (keyword changes, message) of a
    `run(qn=, qp=, ckv=, kpe=, **keywords)` whose defaults are these float32 queries and pools
    (a plan of their dtype and widths, 2 output tokens): the queries' and the pool's dtypes and
    widths, the scales of a pool that is not fp8, the sinks, the output, the stream, the output's
    dtype and base."""
    heads, rank, rope = q_nope.shape[2], q_nope.shape[3], q_pe.shape[3]
    bad_out = attnstate.State(np.empty((2, heads, rank - 2), np.float32),
                              np.empty((2, heads), np.float32), "natural")
    inf_sink = np.zeros(heads, np.float32)
    inf_sink[-1] = np.inf
    return [
        (dict(qn=q_nope.astype(np.float16)), "argument 'q_nope': expected dtype f32"),
        (dict(qp=q_pe[..., :rope // 2]),
         f"argument 'q_pe.shape\\[3\\]': expected kv.rope_dim = {rope}"),
        (dict(qp=q_pe.astype(np.float16)), "argument 'q_pe.dtype'"),
        (dict(kpe=kpe[:2]), "argument 'kpe': expected the pages and page_size of ckv"),
        (dict(ckv=ckv.astype(np.float16)), "argument 'ckv': expected dtype f32"),
        (dict(ckv=ckv[..., :rank - 2]), f"argument 'ckv': expected width kv_lora_rank = {rank}"),
        (dict(kpe=kpe[..., :rope - 2]), f"argument 'kpe': expected width rope_dim = {rope}"),
        (dict(ckv=ckv[:, :, None].repeat(2, 2)), "argument 'ckv': expected \\(pages"),
        (dict(ckv_scale=0.5), "argument 'ckv_scale': expected None"),
        (dict(kpe_scale=0.5), "argument 'kpe_scale': expected None"),
        (dict(sinks=np.zeros(heads + 1, np.float32)),
         f"argument 'sinks': expected heads_q = {heads}"),
        (dict(sinks=inf_sink), f"argument 'sinks.logits\\[{heads - 1}\\]'"),
        (dict(out=bad_out), "argument 'out.head_dim'"),
        (dict(out="state"), "argument 'out'"),
        (dict(stream=1), "argument 'stream'"),
        (dict(dtype="int8"), "argument 'dtype'"),
        (dict(base="base10"), "argument 'base'"),
    ]


def expect_errors(run, cases):
    """Each call `run(**change)` raises an attnstate.Error matching its message; the unchanged
    call runs."""
    for change, message in cases:
        with pytest.raises(attnstate.Error, match=message):
            run(**change)
    run()


def replayed_in_cuda_graphs(torch, step, args):
    """`step(*args)` (returning (o, lse) tensors) compiled whole and replayed in CUDA graphs
    gives the eager call's bits; returns the replay's (o, lse)."""
    eager = step(*args)
    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # warm-up, record, replay
        got = compiled(*args)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    return got
