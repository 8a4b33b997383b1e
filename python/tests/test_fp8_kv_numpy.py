"""fp8 KV caches through the Python plans on the CPU backend: uint8 pools of e4m3/e5m2 bytes with
k_scale/v_scale, against a float64 NumPy reference over the dequantised cache; named errors."""

import numpy as np
import pytest

import attnstate
from helpers import reference_state, shared_prefix_levels

rng = np.random.default_rng(21)


def fp8_table(fmt):
    """The real value of each of the 256 encodings of `fmt` ("e4m3": OCP e4m3fn, "e5m2"), from
    the formats' definitions (NaN codes NaN, e5m2's infinities infinite)."""
    mant, bias = (3, 7) if fmt == "e4m3" else (2, 15)
    out = np.empty(256)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b & 0x7F) >> mant, b & ((1 << mant) - 1)
        if fmt == "e4m3" and (b & 0x7F) == 0x7F or fmt == "e5m2" and e == 31 and m:
            out[b] = np.nan
        elif fmt == "e5m2" and e == 31:
            out[b] = sign * np.inf
        elif e == 0:
            out[b] = sign * m * 2.0 ** (1 - bias - mant)
        else:
            out[b] = sign * (1 + m / 2 ** mant) * 2.0 ** (e - bias)
    return out


def finite_codes(fmt, shape):
    """Random finite encodings of `fmt` (every exponent, the largest and the subnormals)."""
    table = fp8_table(fmt)
    ok = np.flatnonzero(np.isfinite(table)).astype(np.uint8)
    return rng.choice(ok, size=shape)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("k_scale,v_scale", [(1.0, 1.0), (2.0 ** -10, 2.0 ** 8), (2.0 ** 8, 0.37)])
def test_fp8_decode_matches_the_dequantised_reference(fmt, k_scale, v_scale):
    seq_lens = np.array([37, 0, 5, 64], np.int32)
    heads_q, heads_kv, d, page_size = 4, 2, 8, 8
    pages_of = [-(-n // page_size) for n in seq_lens]
    total = sum(pages_of)
    indices = rng.permutation(total).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(pages_of)]).astype(np.int32)
    k = finite_codes(fmt, (total, page_size, heads_kv, d))
    v = finite_codes(fmt, k.shape)
    table = fp8_table(fmt)
    k_real, v_real = table[k] * k_scale, table[v] * v_scale
    q = (rng.standard_normal((len(seq_lens), 1, heads_q, d)) / np.abs(k_real).max()).astype(
        np.float32)
    dec = attnstate.Decode().plan(seq_lens, heads_q=heads_q, heads_kv=heads_kv, head_dim=d,
                                  dtype="float32", kv_dtype=fmt, policy="fixed_size",
                                  split_size=16)
    out = dec.run(q, k, v, seq_lens, page_indptr=indptr, page_indices=indices,
                  k_scale=k_scale, v_scale=v_scale)
    for b, n in enumerate(seq_lens):
        pages = indices[indptr[b]:indptr[b + 1]]
        kb = k_real[pages].reshape(-1, heads_kv, d)[:n]
        vb = v_real[pages].reshape(-1, heads_kv, d)[:n]
        o, lse = reference_state(q[b], kb, vb, 1.0 / np.sqrt(d))
        v_max = max(1.0, np.abs(vb).max()) if n else 1.0
        np.testing.assert_allclose(out.o[b], o[0], atol=1e-5 * v_max)
        np.testing.assert_allclose(out.lse[b], lse[0], atol=1e-5)
    # the scales are read: without them the result differs
    if (k_scale, v_scale) != (1.0, 1.0):
        plain = dec.run(q, k, v, seq_lens, page_indptr=indptr, page_indices=indices)
        assert not np.allclose(plain.o, out.o)


def test_fp8_cascade_matches_the_dequantised_reference():
    heads_q, heads_kv, d, page_size = 4, 2, 8, 4
    prefix, suffixes = 10, [3, 7, 1]
    batch = len(suffixes)
    levels, total, starts = shared_prefix_levels(prefix, suffixes, page_size)
    k = finite_codes("e4m3", (total, page_size, heads_kv, d))
    v = finite_codes("e4m3", k.shape)
    table = fp8_table("e4m3")
    k_scale, v_scale = 2.0 ** -6, 3.0
    k_real, v_real = table[k] * k_scale, table[v] * v_scale
    q = rng.standard_normal((batch, 1, heads_q, d)).astype(np.float32)
    cas = attnstate.Cascade().plan(levels, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                                   head_dim=d, page_size=page_size, num_pages=total,
                                   dtype="float32", kv_dtype="e4m3")
    out = cas.run(q, k, v, levels, k_scale=k_scale, v_scale=v_scale)
    flat_k, flat_v = k_real.reshape(-1, heads_kv, d), v_real.reshape(-1, heads_kv, d)
    for b, n in enumerate(suffixes):
        s0 = starts[1 + b] * page_size
        idx = np.concatenate([np.arange(prefix), np.arange(s0, s0 + n)])
        o, lse = reference_state(q[b], flat_k[idx], flat_v[idx], 1.0 / np.sqrt(d))
        np.testing.assert_allclose(out.o[b], o[0], atol=1e-5 * np.abs(flat_v[idx]).max())
        np.testing.assert_allclose(out.lse[b], lse[0], atol=1e-5 * max(1.0, np.abs(lse).max()))


def test_fp8_errors_name_the_argument():
    seq_lens = np.array([3], np.int32)
    indptr, indices = np.array([0, 1], np.int32), np.array([0], np.int32)
    q = np.zeros((1, 1, 2, 4), np.float32)
    k8 = np.zeros((1, 4, 1, 4), np.uint8)
    dec = attnstate.Decode().plan(seq_lens, heads_q=2, heads_kv=1, head_dim=4, dtype="float32",
                                  kv_dtype="e5m2")
    run = dict(page_indptr=indptr, page_indices=indices)
    with pytest.raises(attnstate.Error, match="argument 'k': expected an array of the plan's kv_dtype "
                       "e5m2, or a uint8 array of its stored bytes, got dtype float32"):
        dec.run(q, k8.astype(np.float32), k8, seq_lens, **run)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(attnstate.Error, match="argument 'v_scale': expected a finite scale"):
            dec.run(q, k8, k8, seq_lens, v_scale=bad, **run)
    with pytest.raises(attnstate.Error, match="argument 'k_scale': expected a float scale"):
        dec.run(q, k8, k8, seq_lens, k_scale="2", **run)
    dec.run(q, k8, k8, seq_lens, k_scale=0.5, v_scale=2.0, **run)  # valid
    plain = attnstate.Decode().plan(seq_lens, heads_q=2, heads_kv=1, head_dim=4, dtype="float32")
    k32 = np.zeros((1, 4, 1, 4), np.float32)
    with pytest.raises(attnstate.Error, match="argument 'k_scale': expected None"):
        plain.run(q, k32, k32, seq_lens, k_scale=2.0, **run)
    with pytest.raises(attnstate.Error, match="argument 'kv_dtype'"):
        attnstate.Decode().plan(seq_lens, heads_q=2, heads_kv=1, head_dim=4, dtype="float32",
                                kv_dtype="e3m4")
    # fp8 queries are not taken (fp8 is for the cache)
    with pytest.raises(attnstate.Error, match="argument 'dtype'"):
        attnstate.Decode().plan(seq_lens, heads_q=2, heads_kv=1, head_dim=4, dtype="e4m3")
