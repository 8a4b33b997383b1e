"""DeepSeek-V3-shaped MLA decode on the CPU backend: 128 query heads, kv_lora_rank 512, rope 64,
a bfloat16 latent cache of 64-token pages in FlashMLA's one 576-wide pool; the states of two
shards of the keys, merged, equal the one-pass state.

    python python/examples/mla_decode_numpy.py
"""

# [mla-python]
import math

import ml_dtypes
import numpy as np
import attnstate

heads, rank, rope, page = 128, 512, 64, 64  # DeepSeek-V3: kv_lora_rank 512, qk_rope_head_dim 64
bf16 = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
seq_lens = np.array([1000, 300], np.int32)  # two requests, one new token each
# FlashMLA's cache: one pool (blocks, block_size, 1, 576), each row [ckv (512), kpe (64)]
kv = rng.standard_normal((32, page, 1, rank + rope)).astype(bf16)
block_table = rng.permutation(32).astype(np.int32).reshape(2, 16)  # 16 blocks a request
q = rng.standard_normal((2, 1, heads, rank + rope)).astype(bf16)  # (batch, q_len, heads, 576)
mscale = 0.1 * math.log(40) + 1.0  # YaRN, factor 40
sm_scale = mscale**2 / math.sqrt(128 + 64)  # DeepSeek-V3's softmax scale

mla = attnstate.MlaDecode().plan(seq_lens, heads=heads, dtype=bf16, scale=sm_scale)
q_nope, q_pe, ckv, kpe = q[..., :rank], q[..., rank:], kv[..., :rank], kv[..., rank:]  # views
whole = mla.run(q_nope, q_pe, ckv, kpe, seq_lens, block_table=block_table, dtype="float32")
# whole.o (2, 128, 512), whole.lse (2, 128): an attention state, to merge with others.
# Two shards of the keys (e.g. two GPUs' halves of the context): tokens 0..511 and the rest.
first = np.minimum(seq_lens, 512)
a = mla.run(q_nope, q_pe, ckv, kpe, first, block_table=block_table[:, :8], dtype="float32")
b = mla.run(q_nope, q_pe, ckv, kpe, seq_lens - first, block_table=block_table[:, 8:],
            dtype="float32")
merged = attnstate.merge_state(a, b)
assert np.allclose(merged.o, whole.o, atol=1e-5) and np.allclose(merged.lse, whole.lse, atol=1e-5)
print("MLA: merge of the two shards == one pass: max |diff| of o",
      np.abs(merged.o - whole.o).max())
# [mla-python]
