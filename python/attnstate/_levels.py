"""Cascade levels found in a page table, and the choice between the cascade and the plain decode.

`cascade_levels` finds the shared prefixes of the requests of a paged KV cache (a trie over page
ids: a system prompt shared by all, blocks shared by groups, forks of one conversation) and
returns them as levels `Cascade.plan` / `Cascade.run` take, with the order the cascade's queries
come in. `decide_cascade` estimates both ways of running the batch and says which is faster and
why. See docs/cascade.md, "Levels from a page table" and "Cascade or plain decode".
"""

from . import _attnstate as _C
from ._arrays import error
from ._plans import _kv_dtype

CascadeLevels = _C.CascadeLevels
CascadeDecision = _C.CascadeDecision


def cascade_levels(seq_lens, *, page_size, num_pages, page_indptr=None, page_indices=None,
                   block_table=None, min_shared_tokens=16, max_levels=8, q_len=1):
    """The cascade levels of a page table (host int32 arrays of any DLPack library).

    seq_lens: (batch,) tokens per request. The table: either page_indptr (batch + 1) and
    page_indices (CSR), or block_table (batch, max_pages); request b owns its first
    ceil(seq_lens[b] / page_size) pages, ids in [0, num_pages). Two requests share a prefix where
    they hold the same page ids with the same tokens in them.
    min_shared_tokens: a shorter shared run is read by each request itself. max_levels (1..8):
    deeper sharing folds into the requests' own remainders. q_len: new tokens per request of the
    causal cascade the levels are for (each remainder keeps at least q_len - 1 tokens).

    Returns a CascadeLevels: `.levels` (the arrays per level, NumPy int32), `.order` (give the
    cascade q[order]; row i of its output is request order[i]), `.identity_order`,
    `.keys_total`, `.keys_read`, and a one-line repr for logs.
    """
    return _C.find_cascade_levels(seq_lens, page_size, num_pages, page_indptr, page_indices,
                                  block_table, min_shared_tokens, max_levels, q_len)


def decide_cascade(levels, *, heads_q, heads_kv, head_dim, q_len=1, kv_dtype="bfloat16",
                   copy_gbps=4280.0, tensor_tflops=790.0):
    """Cascade or plain decode for `levels` (a CascadeLevels) at this shape.

    A cost model of both (each stage's bytes at the device copy bandwidth `copy_gbps`, read +
    written GB/s, and FLOPs at the tensor-core peak `tensor_tflops`, with the fixed costs
    measured on the H200), pessimistic for the cascade: it is chosen only where it wins by a
    margin. Returns a CascadeDecision: `.use_cascade`, `.shared_levels` (rebuild the levels with
    max_levels = shared_levels + 1 when fewer than found), `.cascade_us`, `.decode_us`, the bytes
    each reads, and `.reason` (one line for logs).
    """
    fn = "attnstate.decide_cascade"
    if not isinstance(levels, CascadeLevels):
        raise error(fn, "levels", "an attnstate.CascadeLevels (attnstate.cascade_levels)",
                    type(levels).__name__)
    return _C.decide_cascade(levels, heads_q, heads_kv, head_dim, q_len,
                             _kv_dtype(kv_dtype, kv_dtype, fn), float(copy_gbps),
                             float(tensor_tflops))
