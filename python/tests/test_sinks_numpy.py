"""Attention sinks through Decode.run(sinks=) / Cascade.run(sinks=) on NumPy arrays (CPU
backend) against a NumPy float64 reference over the keys plus the sink mass: every split count
gives the same state, a request without keys gets (0, s), the LSE includes the sink, and the
keyword's errors are named."""

import math

import numpy as np
import pytest

import attnstate
from helpers import paged_keys, shared_prefix_levels

rng = np.random.default_rng(2201)


def sink_softmax_state(q, k, v, scale, sink, cap=None):
    """(o, natural lse) of q (H, D) over k, v (N, Hkv, D) plus the sink logits (H,): the sink
    adds exp(sink[h]) to the denominator and nothing to the numerator (float64)."""
    q, k, v, sink = (np.asarray(x, np.float64) for x in (q, k, v, sink))
    g = q.shape[0] // max(1, k.shape[1])
    s = np.einsum("hd,khd->hk", q, np.repeat(k, g, axis=1)) * scale
    if cap:
        s = cap * np.tanh(s / cap)
    m = np.maximum(s.max(axis=1, initial=-np.inf), sink)
    p = np.exp(s - m[:, None])
    denom = p.sum(axis=1) + np.exp(sink - m)
    o = np.einsum("hk,khd->hd", p, np.repeat(v, g, axis=1)) / denom[:, None]
    return o, m + np.log(denom)


def nan_state(tokens, heads, d, base="natural"):
    o = np.full((tokens, heads, d), np.nan, np.float32)
    return attnstate.State(o, np.full((tokens, heads), np.nan, np.float32), base)


SEQ_LENS = np.array([70, 0, 2, 33, 130], np.int32)  # request 1 has no key
Q_LEN, HEADS_Q, HEADS_KV, D, PAGE = 3, 8, 2, 16, 16


@pytest.fixture(scope="module")
def problem():
    k, v, indptr, indices, keys = paged_keys(rng, SEQ_LENS, PAGE, HEADS_KV, D)
    q = (3 * rng.standard_normal((len(SEQ_LENS), Q_LEN, HEADS_Q, D))).astype(np.float32)
    sinks = rng.uniform(-3, 5, HEADS_Q).astype(np.float32)
    return q, k, v, indptr, indices, keys, sinks


def run_decode(problem, sinks, base="natural", **plan):
    q, k, v, indptr, indices, _, _ = problem
    dec = attnstate.Decode().plan(SEQ_LENS, heads_q=HEADS_Q, heads_kv=HEADS_KV, head_dim=D,
                                  dtype="float32", q_len=Q_LEN, **plan)
    out = nan_state(len(SEQ_LENS) * Q_LEN, HEADS_Q, D, base)
    dec.run(q, k, v, SEQ_LENS, page_indptr=indptr, page_indices=indices, out=out, sinks=sinks)
    return out


@pytest.mark.parametrize("window_left,cap", [(None, None), (5, None), (None, 5.0), (20, 30.0)])
@pytest.mark.parametrize("policy,num_splits,split_size", [("fixed_count", 1, 0),
                                                          ("fixed_count", 3, 0),
                                                          ("fixed_count", 8, 0),
                                                          ("fixed_size", 0, 16), ("auto", 0, 0)])
def test_decode_sinks_match_the_reference_of_keys_plus_sink(problem, policy, num_splits,
                                                            split_size, window_left, cap):
    q, _, _, _, _, keys, sinks = problem
    out = run_decode(problem, sinks, policy=policy, num_splits=num_splits, split_size=split_size,
                     window_left=window_left, logits_soft_cap=cap)
    for b, n in enumerate(SEQ_LENS):
        kb, vb = keys[b]
        for i in range(Q_LEN):
            p = int(n) - Q_LEN + i
            lo = 0 if window_left is None else max(0, p - window_left)
            seen = np.arange(lo, p + 1) if p >= 0 else np.arange(0)
            o, lse = sink_softmax_state(q[b, i], kb[seen], vb[seen], 1.0 / math.sqrt(D), sinks,
                                        cap)
            np.testing.assert_allclose(out.o[b * Q_LEN + i], o, atol=2e-5)
            np.testing.assert_allclose(out.lse[b * Q_LEN + i], lse, atol=2e-5, rtol=1e-6)


@pytest.mark.parametrize("base", ["natural", "base2"])
def test_decode_split_counts_agree_and_an_empty_request_is_the_sink_state(problem, base):
    sinks = problem[-1]
    one = run_decode(problem, sinks, base, policy="fixed_count", num_splits=1)
    for plan in (dict(policy="fixed_count", num_splits=3), dict(policy="fixed_count", num_splits=8),
                 dict(policy="fixed_size", split_size=16)):
        many = run_decode(problem, sinks, base, **plan)
        np.testing.assert_allclose(many.o, one.o, atol=1e-5)
        np.testing.assert_allclose(many.lse, one.lse, atol=1e-5, rtol=1e-6)
    # request 1 has no key: its rows are exactly (0, s_h), the LSE in the output's base
    rows = slice(1 * Q_LEN, 2 * Q_LEN)
    assert np.all(one.o[rows] == 0)
    expect = sinks / np.float32(math.log(2.0)) if base == "base2" else sinks
    np.testing.assert_allclose(one.lse[rows], np.broadcast_to(expect, (Q_LEN, HEADS_Q)),
                               rtol=1e-6)
    if base == "natural":
        assert np.array_equal(one.lse[rows], np.broadcast_to(sinks, (Q_LEN, HEADS_Q)))


def test_decode_sinks_equal_the_sink_free_run_then_one_merge_with_the_sink_state(problem):
    sinks = problem[-1]
    fused = run_decode(problem, sinks, policy="fixed_count", num_splits=3)
    plain = run_decode(problem, None, policy="fixed_count", num_splits=3)
    attnstate.merge_state_(plain, attnstate.sink_state(sinks, plain.o.shape[0], D))
    np.testing.assert_allclose(fused.o, plain.o, atol=1e-6)
    np.testing.assert_allclose(fused.lse, plain.lse, rtol=1e-6)
    # sinks=None is the sink-free run
    again = run_decode(problem, None, policy="fixed_count", num_splits=3)
    ref = run_decode(problem, None, policy="fixed_count", num_splits=3)
    assert np.array_equal(again.o, ref.o) and np.array_equal(again.lse, ref.lse)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("levels_used", [1, 2])
def test_cascade_sinks_match_the_reference_of_keys_plus_sink(causal, levels_used):
    heads_q, heads_kv, d, page_size, q_len = 4, 2, 8, 4, 2
    prefix, suffixes = 10, [3, 9, 20]
    batch = len(suffixes)
    levels, total, starts = shared_prefix_levels(prefix, suffixes, page_size)
    levels = levels[:levels_used]
    k = rng.standard_normal((total, page_size, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal((total, page_size, heads_kv, d)).astype(np.float32)
    q = (3 * rng.standard_normal((batch, q_len, heads_q, d))).astype(np.float32)
    sinks = rng.uniform(-3, 5, heads_q).astype(np.float32)
    cas = attnstate.Cascade().plan(levels, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                                   head_dim=d, page_size=page_size, num_pages=total,
                                   dtype="float32", q_len=q_len, causal=causal)
    out = cas.run(q, k, v, levels, out=nan_state(batch * q_len, heads_q, d), sinks=sinks)
    flat_k, flat_v = k.reshape(-1, heads_kv, d), v.reshape(-1, heads_kv, d)
    for b, n in enumerate(suffixes):
        s0 = starts[1 + b] * page_size
        own = np.arange(s0, s0 + n) if levels_used == 2 else np.arange(0)
        idx = np.concatenate([np.arange(prefix), own]).astype(np.int64)
        for t in range(q_len):
            p = len(idx) - q_len + t if causal else len(idx) - 1
            seen = idx[:p + 1]
            o, lse = sink_softmax_state(q[b, t], flat_k[seen], flat_v[seen], 1.0 / math.sqrt(d),
                                        sinks)
            np.testing.assert_allclose(out.o[b * q_len + t], o, atol=2e-5)
            np.testing.assert_allclose(out.lse[b * q_len + t], lse, atol=2e-5, rtol=1e-6)


def test_cascade_request_without_keys_is_the_sink_state():
    heads_q, heads_kv, d, page_size = 2, 1, 4, 4
    levels, total, _ = shared_prefix_levels(0, [5, 0], page_size)
    k = rng.standard_normal((max(1, total), page_size, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal(k.shape).astype(np.float32)
    q = rng.standard_normal((2, 1, heads_q, d)).astype(np.float32)
    sinks = np.array([0.5, -2.0], np.float32)
    cas = attnstate.Cascade().plan(levels, batch=2, heads_q=heads_q, heads_kv=heads_kv,
                                   head_dim=d, page_size=page_size, num_pages=max(1, total),
                                   dtype="float32", causal=False)
    out = cas.run(q, k, v, levels, out=nan_state(2, heads_q, d), sinks=sinks)
    assert np.all(out.o[1] == 0) and np.array_equal(out.lse[1], sinks)
    assert np.all(np.isfinite(out.o[0])) and np.all(out.lse[0] > sinks)


def test_sinks_errors_are_named(problem):
    q, k, v, indptr, indices, _, sinks = problem
    dec = attnstate.Decode().plan(SEQ_LENS, heads_q=HEADS_Q, heads_kv=HEADS_KV, head_dim=D,
                                  dtype="float32", q_len=Q_LEN)

    def run(s):
        return dec.run(q, k, v, SEQ_LENS, page_indptr=indptr, page_indices=indices, sinks=s)

    with pytest.raises(attnstate.Error, match="Decode.run: argument 'sinks': expected heads_q = 8 "
                                              "logits .*, got 7"):
        run(sinks[:7])
    with pytest.raises(attnstate.Error, match="argument 'sinks': expected dtype float32, got "
                                              "float64"):
        run(sinks.astype(np.float64))
    with pytest.raises(attnstate.Error, match="argument 'sinks': expected 1 dimensions"):
        run(sinks.reshape(2, 4))
    with pytest.raises(attnstate.Error, match="argument 'sinks': expected a contiguous array"):
        run(np.repeat(sinks, 2)[::2])
    with pytest.raises(attnstate.Error, match="argument 'sinks': expected an array"):
        run([1.0] * HEADS_Q)
    for bad, got in ((np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")):
        s = sinks.copy()
        s[3] = bad
        with pytest.raises(attnstate.Error,
                           match=r"argument 'sinks.logits\[3\]': expected a finite logit.*, got "
                                 + got) as e:
            run(s)
        assert e.value.status == attnstate.Status.INVALID_ARGUMENT
    # the cascade names them too
    levels, total, _ = shared_prefix_levels(4, [2, 3], 4)
    kc = rng.standard_normal((total, 4, 1, 4)).astype(np.float32)
    qc = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    cas = attnstate.Cascade().plan(levels, batch=2, heads_q=2, heads_kv=1, head_dim=4,
                                   page_size=4, num_pages=total, dtype="float32")
    with pytest.raises(attnstate.Error, match="Cascade.run: argument 'sinks': expected heads_q = 2"):
        cas.run(qc, kc, kc, levels, sinks=np.zeros(3, np.float32))
    with pytest.raises(attnstate.Error, match=r"argument 'sinks.logits\[1\]': expected a finite"):
        cas.run(qc, kc, kc, levels, sinks=np.array([0.0, np.nan], np.float32))
