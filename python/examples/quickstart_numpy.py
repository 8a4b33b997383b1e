"""The README's CPU quick start: the states of two disjoint key sets, computed in NumPy, merged by
attnstate on the CPU and checked against one-pass attention over all the keys.

    python python/examples/quickstart_numpy.py
"""

# [readme-quickstart]
import numpy as np
import attnstate


def attention(q, k, v):  # q (tokens, heads, d), k and v (keys, heads, d)
    s = np.einsum("thd,khd->thk", q, k) / np.sqrt(q.shape[-1])  # scores
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)  # max-subtracted: no overflow
    o = np.einsum("thk,khd->thd", p, v) / p.sum(axis=-1, keepdims=True)
    lse = m[..., 0] + np.log(p.sum(axis=-1))  # natural-log LSE (tokens, heads)
    return attnstate.State(o.astype(np.float32), lse.astype(np.float32), "natural")


rng = np.random.default_rng(0)
q = rng.standard_normal((4, 8, 64), dtype=np.float32)  # 4 query rows, 8 heads, head_dim 64
k, v = rng.standard_normal((2, 1000, 8, 64), dtype=np.float32)  # 1000 keys
a = attention(q, k[:300], v[:300])  # keys 0..299
b = attention(q, k[300:], v[300:])  # keys 300..999
out = attnstate.merge_state(a, b)  # the state of all 1000 keys
whole = attention(q, k, v)  # one pass over them
assert np.allclose(out.o, whole.o, atol=1e-5) and np.allclose(out.lse, whole.lse, atol=1e-5)
print("merge of the two halves == one pass: max |diff| of o", np.abs(out.o - whole.o).max())
# [readme-quickstart]
