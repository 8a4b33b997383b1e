"""Attention kernels in NumPy, checked with attnstate.testing.check_kernel: one correct, one
with the classic bug of exponentiating the scores without subtracting their maximum (it
overflows once scores reach the hundreds).

    python python/examples/numpy_attention.py
"""

import numpy as np


def _empty_state(tokens, heads, d):
    return np.zeros((tokens, heads, d), np.float32), np.full((tokens, heads), -np.inf, np.float32)


def _scores(q, k, scale):
    group = q.shape[1] // max(k.shape[1], 1)
    kh = np.repeat(k.astype(np.float64), group, axis=1)  # (keys, heads_q, d)
    return np.einsum("thd,khd->thk", q.astype(np.float64), kh) * scale, group


def attention(q, k, v, scale):
    """The attention state (o, lse), natural-log LSE, of q over all of k, v."""
    tokens, heads, d = q.shape
    if k.shape[0] == 0:  # no keys: the empty state
        return _empty_state(tokens, heads, d)
    s, group = _scores(q, k, scale)
    m = s.max(axis=2, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=2, keepdims=True)
    vh = np.repeat(v.astype(np.float64), group, axis=1)
    o = np.einsum("thk,khd->thd", p, vh) / l
    return o.astype(np.float32), (m + np.log(l))[..., 0].astype(np.float32)


def attention_without_max(q, k, v, scale):
    """The same in float32 without the max subtraction: exp(s) overflows for large scores."""
    tokens, heads, d = q.shape
    if k.shape[0] == 0:
        return _empty_state(tokens, heads, d)
    s, group = _scores(q, k, scale)
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.exp(s.astype(np.float32))
        l = p.sum(axis=2, keepdims=True)
        vh = np.repeat(v.astype(np.float32), group, axis=1)
        o = np.einsum("thk,khd->thd", p, vh) / l
        return o.astype(np.float32), np.log(l)[..., 0].astype(np.float32)


if __name__ == "__main__":
    import attnstate.testing

    print(attnstate.testing.check_kernel(attention, base="natural", num_tests=50))
    try:
        attnstate.testing.check_kernel(attention_without_max, base="natural", num_tests=50)
    except AssertionError as report:
        print("the kit caught the missing max subtraction:\n" + str(report))
