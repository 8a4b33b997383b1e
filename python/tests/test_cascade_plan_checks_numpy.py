"""A CPU Cascade.plan refuses at plan time what its run would refuse (as a CUDA plan does),
naming the plan's keyword; plans the CPU backend can run (any head_dim, fp8 pools, a window)
are still accepted and match a float64 reference."""

import math

import numpy as np
import pytest

import attnstate
from helpers import reference_state, shared_prefix_levels

rng = np.random.default_rng(30)

HEADS_Q, HEADS_KV, PAGE_SIZE = 4, 2, 4
PREFIX, SUFFIXES = 10, [3, 7, 1]


def good_args(head_dim=8):
    levels, total, _ = shared_prefix_levels(PREFIX, SUFFIXES, PAGE_SIZE)
    return levels, dict(batch=len(SUFFIXES), heads_q=HEADS_Q, heads_kv=HEADS_KV,
                        head_dim=head_dim, page_size=PAGE_SIZE, num_pages=total,
                        dtype="float32")


def with_level(levels, l, field, value):
    """A copy of `levels` whose level `l` has `value` as its array `field` (0..3)."""
    out = [list(level) for level in levels]
    out[l][field] = np.asarray(value, np.int32)
    return [tuple(level) for level in out]


def refused(levels, keyword, expected, **changes):
    """Plans with the good arguments changed by `changes`; returns the error, which must name
    the function and `keyword` with `expected`."""
    _, kwargs = good_args()
    kwargs.update(changes)
    with pytest.raises(attnstate.Error) as info:
        attnstate.Cascade().plan(levels, **kwargs)
    msg = str(info.value)
    assert f"attnstate.Cascade.plan: argument '{keyword}': expected {expected}" in msg, msg
    assert ", got " in msg, msg
    return info.value


@pytest.mark.parametrize("keyword,value,expected", [
    ("q_len", 0, "1..8"),
    ("q_len", 9, "1..8"),
    ("heads_kv", 0, ">= 1"),
    ("heads_q", 3, "a positive multiple of heads_kv = 2"),
    ("heads_q", 0, "a positive multiple of heads_kv = 2"),
    ("head_dim", 0, ">= 1"),
    ("page_size", 0, ">= 1"),
    ("num_pages", -1, ">= 0"),
    ("batch", -1, ">= 0"),
    ("scale", math.nan, "a finite value"),
    ("scale", math.inf, "a finite value"),
])
def test_bad_scalar_refused_at_plan(keyword, value, expected):
    levels, _ = good_args()
    refused(levels, keyword, expected, **{keyword: value})


@pytest.mark.parametrize("keyword,value", [
    ("q_len", 1.0), ("heads_q", "4"), ("heads_kv", None), ("head_dim", 8.0), ("batch", True),
    ("page_size", 4.5), ("num_pages", "7"),
])
def test_non_int_keyword_refused_naming_it(keyword, value):
    levels, _ = good_args()
    refused(levels, keyword, "an int", **{keyword: value})


def test_non_real_scale_refused_naming_it():
    levels, _ = good_args()
    refused(levels, "scale", "a finite float", scale="0.5")


def test_fp8_queries_refused_at_plan():
    levels, _ = good_args()
    err = refused(levels, "dtype", "float32, float16 or bfloat16", dtype="e4m3")
    assert "e4m3" in str(err)


@pytest.mark.parametrize("count", [0, 9])
def test_level_count_refused_at_plan(count):
    levels, _ = good_args()
    refused((levels * 9)[:count], "levels", "1..8 levels", batch=len(SUFFIXES))


def test_levels_against_the_plan_refused_at_plan():
    levels, kwargs = good_args()
    # the levels serve 3 requests, not the plan's batch
    refused(levels, "levels[0].request_indptr", "[num_segments] == batch = 4", batch=4)
    # a page id outside the pool the plan describes
    refused(levels, "levels[1].page_indices", "page ids in [0, kv.num_pages = 4)", num_pages=4)
    # more tokens than the segment's pages hold
    refused(with_level(levels, 1, 3, [3, 9, 1]), "levels[1].seg_lens", "0 <= seg_lens[s]")
    refused(with_level(levels, 1, 3, [3, -1, 1]), "levels[1].seg_lens", "0 <= seg_lens[s]")
    # offsets that decrease
    refused(with_level(levels, 1, 0, [0, 2, 1, 3]), "levels[1].request_indptr",
            "non-decreasing offsets")
    refused(with_level(levels, 1, 1, [0, 1, 0, 3]), "levels[1].page_indptr",
            "non-decreasing offsets")


def test_cascade_levels_checked_at_plan():
    # a CascadeLevels brings its own batch and page_size; the pool's size is the plan's
    lv = attnstate.cascade_levels(np.array([5, 6], np.int32), page_size=2, num_pages=4,
                                  block_table=np.array([[0, 1, 2], [0, 1, 3]], np.int32),
                                  min_shared_tokens=2)
    kwargs = dict(heads_q=HEADS_Q, heads_kv=HEADS_KV, head_dim=8, dtype="float32")
    with pytest.raises(attnstate.Error,
                       match=r"attnstate\.Cascade\.plan: argument 'levels\[\d\]\.page_indices': "
                             r"expected page ids in \[0, kv\.num_pages = 3\)"):
        attnstate.Cascade().plan(lv, num_pages=3, **kwargs)
    attnstate.Cascade().plan(lv, num_pages=4, **kwargs)


def run_and_compare(head_dim, q_len=1, causal=True, **plan_kwargs):
    levels, kwargs = good_args(head_dim)
    kwargs.update(plan_kwargs)
    total, batch = kwargs["num_pages"], kwargs["batch"]
    k = rng.standard_normal((total, PAGE_SIZE, HEADS_KV, head_dim)).astype(np.float32)
    v = rng.standard_normal((total, PAGE_SIZE, HEADS_KV, head_dim)).astype(np.float32)
    q = rng.standard_normal((batch, q_len, HEADS_Q, head_dim)).astype(np.float32)
    cas = attnstate.Cascade().plan(levels, q_len=q_len, causal=causal, **kwargs)
    out = cas.run(q, k, v, levels)
    flat_k, flat_v = k.reshape(-1, HEADS_KV, head_dim), v.reshape(-1, HEADS_KV, head_dim)
    _, _, starts = shared_prefix_levels(PREFIX, SUFFIXES, PAGE_SIZE)
    o_all = out.o.reshape(batch, q_len, HEADS_Q, head_dim)
    lse_all = out.lse.reshape(batch, q_len, HEADS_Q)
    for b, n in enumerate(SUFFIXES):
        s0 = starts[1 + b] * PAGE_SIZE
        idx = np.concatenate([np.arange(PREFIX), np.arange(s0, s0 + n)])
        for t in range(q_len):
            # causal: row t sees the keys up to position total - q_len + t
            seen = idx[:len(idx) - (q_len - 1 - t)] if causal else idx
            o, lse = reference_state(q[b, t:t + 1], flat_k[seen], flat_v[seen],
                                     1.0 / np.sqrt(head_dim))
            np.testing.assert_allclose(o_all[b, t], o[0], atol=1e-5)
            np.testing.assert_allclose(lse_all[b, t], lse[0], atol=1e-5)


@pytest.mark.parametrize("head_dim", [8, 5])  # 5: no CUDA kernel, but the CPU takes any
def test_good_plan_still_runs_and_matches(head_dim):
    run_and_compare(head_dim)


def test_good_plan_with_q_len_and_causal_still_runs():
    run_and_compare(8, q_len=2, causal=True)
    run_and_compare(8, q_len=2, causal=False)


def test_cpu_only_arguments_still_accepted_at_plan():
    levels, kwargs = good_args()
    # an fp8 KV dtype, a window and a soft cap: the CPU cascade runs them all
    attnstate.Cascade().plan(levels, kv_dtype="e4m3", window_left=3, logits_soft_cap=20.0,
                             **kwargs)
    # an empty batch: a run has nothing to read
    empty = [(np.array([0, 0], np.int32), np.array([0, 0], np.int32), np.zeros(0, np.int32),
              np.array([0], np.int32))]
    kwargs["batch"] = 0
    attnstate.Cascade().plan(empty, **kwargs)
