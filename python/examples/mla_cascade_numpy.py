"""DeepSeek-V3-shaped MLA cascade on the CPU backend: 128 query heads, kv_lora_rank 512, rope 64,
a bfloat16 latent cache of 64-token pages in FlashMLA's one 576-wide pool; a system prompt shared
by four requests, found in their block table by `cascade_levels` and read once for all of them;
the cascade's states equal MlaDecode's over each request's whole pages.

    python python/examples/mla_cascade_numpy.py
"""

# [mla-cascade-python]
import math

import ml_dtypes
import numpy as np
import attnstate

heads, rank, rope, page = 128, 512, 64, 64  # DeepSeek-V3: kv_lora_rank 512, qk_rope_head_dim 64
bf16 = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
# FlashMLA's cache: one pool (blocks, block_size, 1, 576), each row [ckv (512), kpe (64)]
kv = rng.standard_normal((20, page, 1, rank + rope)).astype(bf16)
# four requests: blocks 0..7 (a 512-token system prompt) shared by all, then blocks of their own
own = [[8, 9, 10], [11, 12], [13, 14, 15, 16, 17], [18]]
seq_lens = np.array([700, 600, 800, 520], np.int32)
block_table = np.full((4, 13), 19, np.int32)  # block 19: padding, never read
for b, blocks in enumerate(own):
    block_table[b, :8 + len(blocks)] = list(range(8)) + blocks
q = rng.standard_normal((4, 1, heads, rank + rope)).astype(bf16)  # (batch, q_len, heads, 576)
mscale = 0.1 * math.log(40) + 1.0  # YaRN, factor 40
sm_scale = mscale**2 / math.sqrt(128 + 64)  # DeepSeek-V3's softmax scale
q_nope, q_pe, ckv, kpe = q[..., :rank], q[..., rank:], kv[..., :rank], kv[..., rank:]  # views

# The levels: the prompt (one segment for the four requests), then each request's own blocks.
levels = attnstate.cascade_levels(seq_lens, page_size=page, num_pages=20,
                                  block_table=block_table)
print(levels)  # cascade levels: batch 4, ..., keys read 1084 of 2620; ...
cas = attnstate.MlaCascade().plan(levels, heads=heads, num_pages=20, dtype=bf16, scale=sm_scale)
order = levels.order  # the cascade's row i is request order[i]
state = cas.run(q_nope[order], q_pe[order], ckv, kpe, levels, dtype="float32")
# state.o (4, 128, 512), state.lse (4, 128): attention states, to merge with others.
mla = attnstate.MlaDecode().plan(seq_lens, heads=heads, dtype=bf16, scale=sm_scale)
whole = mla.run(q_nope, q_pe, ckv, kpe, seq_lens, block_table=block_table, dtype="float32")
assert np.allclose(state.o, whole.o[order], atol=1e-5)
assert np.allclose(state.lse, whole.lse[order], atol=1e-5)
print("MLA cascade == MlaDecode over the whole pages: max |diff| of o",
      np.abs(state.o - whole.o[order]).max())
# [mla-cascade-python]
