"""docs/compat.md's examples: FlashInfer's and vLLM's merge calls made through attnstate's
drop-in adapters, on NumPy arrays (the CPU backend; torch and CUDA tensors take the same calls),
each checked against one-pass attention over all the keys.

    python python/examples/compat_drop_in.py
"""

import numpy as np


def attention(q, k, v, base):
    """(o, lse) of q (tokens, heads, d) over k, v (keys, heads, d); lse (tokens, heads)."""
    s = np.einsum("thd,khd->thk", q, k) / np.sqrt(q.shape[-1])
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    o = np.einsum("thk,khd->thd", p, v) / p.sum(axis=-1, keepdims=True)
    lse = m[..., 0] + np.log(p.sum(axis=-1))
    return o.astype(np.float32), (lse / np.log(2.0) if base == "base2" else lse).astype(np.float32)


rng = np.random.default_rng(0)
q = rng.standard_normal((6, 4, 64), dtype=np.float32)  # 6 query rows, 4 heads, head_dim 64
k, v = rng.standard_normal((2, 900, 4, 64), dtype=np.float32)  # 900 keys
o_all, lse_all = attention(q, k, v, "natural")

# [compat-flashinfer]
from attnstate.compat.flashinfer import merge_state, merge_state_in_place, merge_states

# FlashInfer's layouts: v [seq_len, num_heads, head_dim], s [seq_len, num_heads] in base 2
v_a, s_a = attention(q, k[:200], v[:200], "base2")
v_b, s_b = attention(q, k[200:500], v[200:500], "base2")
v_c, s_c = attention(q, k[500:], v[500:], "base2")

v_ab, s_ab = merge_state(v_a, s_a, v_b, s_b)  # new arrays, v in v_a's dtype
merge_state_in_place(v_ab, s_ab, v_c, s_c)  # (v_ab, s_ab) now cover all 900 keys
v_abc, s_abc = merge_states(np.stack([v_a, v_b, v_c], axis=1),  # [seq_len, 3, heads, dim]
                            np.stack([s_a, s_b, s_c], axis=1))
# [compat-flashinfer]

for v_m, s_m in ((v_ab, s_ab), (v_abc, s_abc)):
    assert np.allclose(v_m, o_all, atol=1e-5) and np.allclose(s_m * np.log(2.0), lse_all, atol=1e-5)

# [compat-vllm]
from attnstate.compat.vllm import merge_attn_states

# vLLM's layouts: outputs [num_tokens, num_heads, head_size], LSEs [num_heads, num_tokens] in
# natural log; FlashAttention 2 writes +inf for a row without keys
prefix_output, prefix_lse = attention(q, k[:400], v[:400], "natural")
suffix_output, suffix_lse = attention(q, k[400:], v[400:], "natural")
prefix_lse, suffix_lse = prefix_lse.T.copy(), suffix_lse.T.copy()  # head-major, as vLLM's

output = np.empty_like(prefix_output)
output_lse = np.empty_like(prefix_lse)
merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)
# [compat-vllm]

assert np.allclose(output, o_all, atol=1e-5) and np.allclose(output_lse.T, lse_all, atol=1e-5)
print("flashinfer and vllm adapters == one pass: max |diff| of o",
      max(np.abs(x - o_all).max() for x in (v_ab, v_abc, output)))
