"""Attention sinks in attnstate.testing (CPU, NumPy): the kit's reference merges each row once
with its head's sink; check_kernel hands the sinks to the kernel (None for the partials it asks
for), passes a NumPy kernel that merges the sink once and catches one that merges it into every
split, one that adds it to every partial and one that ignores it."""

import numpy as np
import pytest

import attnstate
import attnstate.testing
from numpy_attention import attention

kit = pytest.mark.skipif(attnstate.testing._T is None, reason="built without the testing kit")
rng = np.random.default_rng(2204)


def with_sinks(o, lse, sinks):
    """(o, natural lse) merged once per row (t, h) with the sink state (0, sinks[h]), float64."""
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    s = np.broadcast_to(np.asarray(sinks, np.float64), lse.shape)
    m = np.maximum(lse, s)
    total = m + np.log(np.exp(lse - m) + np.exp(s - m))
    return o * np.exp(lse - total)[..., None], total


def sink_kernel(q, k, v, scale, sinks=None):
    """A correct kernel: the state of the keys, then the sink once."""
    o, lse = attention(q, k, v, scale)
    if sinks is None:
        return o, lse
    o, lse = with_sinks(o, lse, sinks)
    return o.astype(np.float32), lse.astype(np.float32)


def per_split_kernel(q, k, v, scale, sinks=None):
    """DEFECT: a split-KV kernel that merges the sink into each of its two splits."""
    half = k.shape[0] // 2
    states = [sink_kernel(q, k[a:b], v[a:b], scale, sinks)
              for a, b in ((0, half), (half, k.shape[0]))]
    (o1, l1), (o2, l2) = [(np.asarray(o, np.float64), np.asarray(l, np.float64))
                          for o, l in states]
    m = np.maximum(l1, l2)
    if np.isneginf(m).all():
        return states[0]
    w1, w2 = np.exp(l1 - m), np.exp(l2 - m)
    o = (w1[..., None] * o1 + w2[..., None] * o2) / (w1 + w2)[..., None]
    return o.astype(np.float32), (m + np.log(w1 + w2)).astype(np.float32)


@kit
def test_reference_merges_the_sink_once_per_row():
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    k = rng.standard_normal((5, 2, 8)).astype(np.float32)
    v = rng.standard_normal((5, 2, 8)).astype(np.float32)
    sinks = np.array([-4.0, 0.5, 3.0, 12.0], np.float32)
    o0, l0 = attnstate.testing.reference_state(q, k, v, 0.35)
    want_o, want_l = with_sinks(o0, l0, sinks)
    o, lse = attnstate.testing.reference_state(q, k, v, 0.35, sinks=sinks)
    assert o.dtype == np.float64 and o.shape == (2, 4, 8) and lse.shape == (2, 4)
    np.testing.assert_allclose(o, want_o, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, want_l, rtol=1e-12)
    _, l2 = attnstate.testing.reference_state(q, k, v, 0.35, sinks=sinks, base="base2")
    np.testing.assert_allclose(l2, want_l / np.log(2), rtol=1e-12)
    # the sink-free reference is plain attention
    o1, l1 = attention(q, k, v, 0.35)
    np.testing.assert_allclose(o0, o1, atol=1e-5)
    np.testing.assert_allclose(l0, l1, atol=1e-5)


@kit
def test_reference_of_no_keys_is_the_sink_state():
    q = np.ones((1, 2, 4), np.float32)
    k = np.zeros((0, 1, 4), np.float32)
    o, lse = attnstate.testing.reference_state(q, k, k, 1.0, sinks=np.array([2.0, -1.0],
                                                                            np.float32))
    assert (o == 0).all()
    np.testing.assert_array_equal(lse, [[2.0, -1.0]])
    _, empty = attnstate.testing.reference_state(q, k, k, 1.0)
    assert np.isneginf(empty).all()


@kit
def test_reference_names_bad_arguments():
    q = np.ones((1, 2, 4), np.float32)
    k = np.ones((3, 1, 4), np.float32)
    with pytest.raises(attnstate.Error, match="problem.sinks"):
        attnstate.testing.reference_state(q, k, k, 1.0, sinks=np.zeros(3, np.float32))
    with pytest.raises(attnstate.Error, match=r"problem.sinks\[0\]"):
        attnstate.testing.reference_state(q, k, k, 1.0, sinks=np.array([np.nan, 0], np.float32))
    with pytest.raises(attnstate.Error, match="argument 'base'"):
        attnstate.testing.reference_state(q, k, k, 1.0, base="e")
    with pytest.raises(attnstate.Error, match="argument 'q'"):
        attnstate.testing.reference_state(q[0], k, k, 1.0)


@kit
def test_sinks_reach_the_kernel_and_partials_come_without():
    seen = {"with": 0, "without": 0}

    def counting(q, k, v, scale, sinks=None):
        if sinks is None:
            seen["without"] += 1
        else:
            assert sinks.dtype == np.float32 and sinks.shape == (q.shape[1],)
            assert ((sinks >= -4) & (sinks <= 12)).all()
            seen["with"] += 1
        return sink_kernel(q, k, v, scale, sinks)

    summary = attnstate.testing.check_kernel(counting, base="natural", num_tests=30, seed=5,
                                             sink_percent=100, max_keys=60)
    assert "FAIL" not in summary
    assert seen["with"] > 0 and seen["without"] > 0  # split_merge's parts, identity's fn(∅)


@kit
def test_a_kernel_merging_the_sink_once_passes():
    summary = attnstate.testing.check_kernel(sink_kernel, base="natural", num_tests=40, seed=1,
                                             sink_percent=50, max_keys=80)
    assert "PASS" in summary and "FAIL" not in summary


def failure_report(kernel, seed):
    """The kit's report on `kernel`, which must fail exactness or split/merge on sink problems."""
    with pytest.raises(AssertionError) as report:
        attnstate.testing.check_kernel(kernel, base="natural", num_tests=40, seed=seed,
                                       sink_percent=100, max_keys=60,
                                       laws=["exactness", "split_merge"])
    return str(report.value)


@kit
def test_a_sink_merged_into_every_split_is_caught():
    text = failure_report(per_split_kernel, 2)
    assert "FAIL exactness" in text and "FAIL split_merge" in text
    assert "the sink merged 2 times" in text


@kit
def test_a_sink_added_to_every_partial_fails_split_merge():
    layer = {}

    def sticky(q, k, v, scale, sinks=None):  # the layer's sinks, whatever the kit asks for
        if sinks is not None:
            layer["sinks"] = sinks
        s = layer.get("sinks")
        return sink_kernel(q, k, v, scale, s if s is not None and len(s) == q.shape[1] else None)

    text = failure_report(sticky, 3)
    assert "PASS exactness" in text and "FAIL split_merge" in text
    assert "asked for a partial state" in text


@kit
def test_a_kernel_ignoring_the_sinks_fails():
    def ignoring(q, k, v, scale, sinks=None):
        return attention(q, k, v, scale)

    with pytest.raises(AssertionError, match="without the sinks"):
        attnstate.testing.check_kernel(ignoring, base="natural", num_tests=20, seed=4,
                                       sink_percent=100, laws=["exactness"])


@kit
def test_without_sinks_the_kernel_gets_no_sinks_keyword():
    def old_signature(q, k, v, scale):  # a kernel written before sinks
        return attention(q, k, v, scale)

    attnstate.testing.check_kernel(old_signature, base="natural", num_tests=10, seed=6)


@kit
def test_bad_sink_options_name_the_option():
    with pytest.raises(attnstate.Error, match="sink_percent"):
        attnstate.testing.check_kernel(sink_kernel, base="natural", sink_percent=101)
    with pytest.raises(attnstate.Error, match="sink_max"):
        attnstate.testing.check_kernel(sink_kernel, base="natural", sink_percent=10,
                                       sink_range=(3.0, 1.0))
    with pytest.raises(attnstate.Error, match="sink_range"):
        attnstate.testing.check_kernel(sink_kernel, base="natural", sink_percent=10,
                                       sink_range=None)
