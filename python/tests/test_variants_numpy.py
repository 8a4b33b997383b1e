"""Sliding window and logits soft cap through Decode.plan / Cascade.plan on NumPy arrays (CPU
backend) against a NumPy softmax reference, and the keywords' named errors."""

import math

import numpy as np
import pytest

import attnstate
from helpers import paged_keys, shared_prefix_levels

rng = np.random.default_rng(22)


def softmax_state(q, k, v, scale, cap=None):
    """(o, natural lse) of q (H, D) over k, v (N, Hkv, D) in float64, the cap on the scaled
    score; the empty state for N = 0."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    if k.shape[0] == 0:
        return np.zeros(q.shape), np.full(q.shape[0], -np.inf)
    g = q.shape[0] // k.shape[1]
    s = np.einsum("hd,khd->hk", q, np.repeat(k, g, axis=1)) * scale
    if cap:
        s = cap * np.tanh(s / cap)
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    o = np.einsum("hk,khd->hd", p, np.repeat(v, g, axis=1)) / p.sum(axis=1, keepdims=True)
    return o, m[:, 0] + np.log(p.sum(axis=1))


def window_of(p, window_left):
    """The key positions a row at position p sees (an empty range for p < 0)."""
    lo = 0 if window_left is None else max(0, p - window_left)
    return np.arange(lo, p + 1) if p >= 0 else np.arange(0)


@pytest.mark.parametrize("window_left", [None, 0, 1, 6, 40, 1000])
@pytest.mark.parametrize("cap", [None, 5.0, 30.0])
@pytest.mark.parametrize("policy,num_splits,split_size", [("auto", 0, 0), ("fixed_count", 3, 0),
                                                          ("fixed_size", 0, 16)])
def test_decode_variants_match_softmax(window_left, cap, policy, num_splits, split_size):
    seq_lens = np.array([70, 0, 2, 33, 5], np.int32)
    q_len, heads_q, heads_kv, d, page_size = 3, 4, 2, 8, 3
    k, v, indptr, indices, keys = paged_keys(rng, seq_lens, page_size, heads_kv, d)
    q = (4 * rng.standard_normal((len(seq_lens), q_len, heads_q, d))).astype(np.float32)
    dec = attnstate.Decode().plan(seq_lens, heads_q=heads_q, heads_kv=heads_kv, head_dim=d,
                                  dtype="float32", q_len=q_len, policy=policy,
                                  num_splits=num_splits, split_size=split_size,
                                  window_left=window_left, logits_soft_cap=cap)
    o_nan = np.full((len(seq_lens) * q_len, heads_q, d), np.nan, np.float32)
    out = attnstate.State(o_nan, np.full(o_nan.shape[:2], np.nan, np.float32), "natural")
    dec.run(q, k, v, seq_lens, page_indptr=indptr, page_indices=indices, out=out)
    scale = 1.0 / math.sqrt(d)
    for b, n in enumerate(seq_lens):
        kb, vb = keys[b]
        for i in range(q_len):
            seen = window_of(int(n) - q_len + i, window_left)
            o, lse = softmax_state(q[b, i], kb[seen], vb[seen], scale, cap)
            np.testing.assert_allclose(out.o[b * q_len + i], o, atol=2e-5)
            np.testing.assert_allclose(out.lse[b * q_len + i], lse, atol=2e-5, rtol=1e-6)


def test_decode_soft_cap_is_on_the_scaled_score():
    # head_dim 1, q = 1: raw scores 8, 16, 24, -4 with scale 0.25 and cap 2; capping the raw
    # score (then scaling) would give another state
    k = np.array([8, 16, 24, -4], np.float32).reshape(1, 4, 1, 1)
    v = np.array([1, -0.5, 0.25, 2], np.float32).reshape(1, 4, 1, 1)
    seq_lens = np.array([4], np.int32)
    q = np.ones((1, 1, 1, 1), np.float32)
    dec = attnstate.Decode().plan(seq_lens, heads_q=1, heads_kv=1, head_dim=1, dtype="float32",
                                  scale=0.25, logits_soft_cap=2.0)
    out = dec.run(q, k, v, seq_lens, page_indptr=np.array([0, 1], np.int32),
                  page_indices=np.array([0], np.int32))
    raw = k.reshape(4).astype(np.float64)
    capped_scaled, capped_raw = 2 * np.tanh(0.25 * raw / 2), 0.25 * 2 * np.tanh(raw / 2)
    for scores, close in ((capped_scaled, True), (capped_raw, False)):
        p = np.exp(scores - scores.max())
        lse = scores.max() + np.log(p.sum())
        assert np.isclose(out.lse[0, 0], lse, atol=1e-5) == close
        if close:
            np.testing.assert_allclose(out.o[0, 0, 0], (p * v.reshape(4)).sum() / p.sum(),
                                       atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window_left", [None, 0, 3, 12, 500])
@pytest.mark.parametrize("cap", [None, 50.0])
def test_cascade_window_spans_the_levels(causal, window_left, cap):
    heads_q, heads_kv, d, page_size, q_len = 4, 2, 8, 4, 2
    prefix, suffixes = 10, [3, 9, 20]  # with window 3 the shared prefix is outside some rows
    batch = len(suffixes)
    levels, total, starts = shared_prefix_levels(prefix, suffixes, page_size)
    k = rng.standard_normal((total, page_size, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal((total, page_size, heads_kv, d)).astype(np.float32)
    q = (3 * rng.standard_normal((batch, q_len, heads_q, d))).astype(np.float32)
    cas = attnstate.Cascade().plan(levels, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                                   head_dim=d, page_size=page_size, num_pages=total,
                                   dtype="float32", q_len=q_len, causal=causal,
                                   window_left=window_left, logits_soft_cap=cap)
    out = cas.run(q, k, v, levels)
    flat_k, flat_v = k.reshape(-1, heads_kv, d), v.reshape(-1, heads_kv, d)
    for b, n in enumerate(suffixes):
        s0 = starts[1 + b] * page_size
        idx = np.concatenate([np.arange(prefix), np.arange(s0, s0 + n)])  # concatenated keys
        for t in range(q_len):
            p = len(idx) - q_len + t if causal else len(idx) - 1
            seen = idx[window_of(p, window_left)]
            o, lse = softmax_state(q[b, t], flat_k[seen], flat_v[seen], 1.0 / math.sqrt(d), cap)
            np.testing.assert_allclose(out.o[b * q_len + t], o, atol=2e-5)
            np.testing.assert_allclose(out.lse[b * q_len + t], lse, atol=2e-5, rtol=1e-6)


def test_variant_keywords_are_checked():
    lens = np.array([3], np.int32)
    plan = dict(heads_q=2, heads_kv=1, head_dim=4, dtype="float32")
    for bad, match in ((-2, "expected an int >= 0, or None for no window, got -2"),
                       (1.5, "got float"), (True, "got bool"), ("4", "got str")):
        with pytest.raises(attnstate.Error, match="argument 'window_left': .*" + match):
            attnstate.Decode().plan(lens, window_left=bad, **plan)
    for bad in (-1.0, math.inf, math.nan, "5"):
        with pytest.raises(attnstate.Error, match="Decode.plan: argument 'logits_soft_cap'"):
            attnstate.Decode().plan(lens, logits_soft_cap=bad, **plan)
    levels, total, _ = shared_prefix_levels(4, [2], 4)
    cplan = dict(batch=1, heads_q=2, heads_kv=1, head_dim=4, page_size=4, num_pages=total,
                 dtype="float32")
    with pytest.raises(attnstate.Error, match="Cascade.plan: argument 'window_left'"):
        attnstate.Cascade().plan(levels, window_left=-5, **cplan)
    with pytest.raises(attnstate.Error, match="Cascade.plan: argument 'logits_soft_cap'"):
        attnstate.Cascade().plan(levels, logits_soft_cap=-3.0, **cplan)
    # -1 and 0 are the library's "none"
    attnstate.Decode().plan(lens, window_left=-1, logits_soft_cap=0.0, **plan)
    err = None
    try:
        attnstate.Decode().plan(lens, window_left=-7, **plan)
    except attnstate.Error as e:
        err = e
    assert err is not None and err.status == attnstate.Status.INVALID_ARGUMENT
