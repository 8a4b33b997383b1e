"""A split-KV attention kernel in Triton, checked with attnstate.testing.check_kernel: one kernel
computes each split's partial state (o, base-2 LSE) with an online softmax, a second merges the
splits with the max-subtracted merge into (o, natural-log LSE). Two classic merge bugs can be
planted, and the kit catches both: `base_bug=True` merges base-2 LSEs with natural exponentials,
`max_bug=True` weights the splits by exp2(lse) without subtracting the largest LSE first (it
overflows once logits reach the hundreds).

The tensors live on DEVICE: a CUDA GPU, or the CPU under Triton's interpreter (TRITON_INTERPRET=1
set before Triton is imported; see triton_interpret_check.py and docs/laptop.md).

    python python/examples/triton_split_kv.py          # torch, Triton and a CUDA GPU
    python python/examples/triton_interpret_check.py   # the kit on a CPU, under the interpreter
"""

import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# Interpreted kernels run on CPU tensors; compiled ones need CUDA tensors.
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@triton.jit
def _partial_states(Q, K, V, PO, PL, scale_log2, num_keys, chunk, heads_q, group, stride_qt,
                    stride_qh, stride_kn, stride_kh, splits, D: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    row = tl.program_id(0)  # token * heads_q + head
    split = tl.program_id(1)
    t = row // heads_q
    h = row % heads_q
    hk = h // group
    d = tl.arange(0, D)
    q = tl.load(Q + t * stride_qt + h * stride_qh + d).to(tl.float32)
    # a finite start for the running max: no -inf - -inf when a block has no valid key
    m_i = tl.max(tl.full((BLOCK_N,), -1e30, tl.float32), axis=0)
    l_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0)
    acc = tl.zeros((D,), tl.float32)
    begin = split * chunk
    end = tl.minimum(begin + chunk, num_keys)
    for start in range(begin, end, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        valid = n < end
        offs = n[:, None] * stride_kn + hk * stride_kh + d[None, :]
        k = tl.load(K + offs, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale_log2
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        v = tl.load(V + offs, mask=valid[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    has = l_i > 0
    safe_l = tl.where(has, l_i, 1.0)
    tl.store(PO + (row * splits + split) * D + d, tl.where(has, acc / safe_l, 0.0))
    tl.store(PL + row * splits + split, tl.where(has, m_i + tl.log2(safe_l), float("-inf")))


@triton.jit
def _merge_splits(PO, PL, O, LSE, splits, D: tl.constexpr, BLOCK_S: tl.constexpr,
                  BASE_BUG: tl.constexpr, MAX_BUG: tl.constexpr):
    row = tl.program_id(0)
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    ok = sp < splits
    lse = tl.load(PL + row * splits + sp, mask=ok, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)  # all splits empty: every weight 0
    if BASE_BUG:
        w = tl.exp(lse - m)  # base-2 LSEs weighted as natural ones
    elif MAX_BUG:
        w = tl.exp2(lse)  # no max subtracted: inf once an LSE passes 128
        m = tl.zeros_like(m)
    else:
        w = tl.exp2(lse - m)
    po = tl.load(PO + (row * splits + sp[:, None]) * D + d[None, :], mask=ok[:, None], other=0.0)
    total = tl.sum(w, axis=0)
    has = total > 0
    tl.store(O + row * D + d, tl.sum(w[:, None] * po, axis=0) / tl.where(has, total, 1.0))
    tl.store(LSE + row, tl.where(has, (m + tl.log2(tl.where(has, total, 1.0))) * 0.6931471805599453,
                                 float("-inf")))


def split_kv_attention(q, k, v, scale, num_splits=4, block_n=32, base_bug=False, max_bug=False):
    """State (o float32 (T, Hq, D), natural-log lse (T, Hq)) of q (T, Hq, D) over k, v
    (N, Hkv, D) (torch tensors on DEVICE, D a power of two >= 16), in up to `num_splits`
    splits. base_bug, max_bug: plant the merge bug of that name (module docstring)."""
    tokens, heads_q, dim = q.shape
    num_keys, heads_kv, _ = k.shape
    chunk = max(block_n, -(-num_keys // num_splits))
    chunk = -(-chunk // block_n) * block_n
    splits = max(1, -(-num_keys // chunk))
    if num_keys == 0:  # a real pointer for the kernel, which reads no key
        k = v = torch.zeros(1, heads_kv, dim, device=q.device, dtype=q.dtype)
    rows = tokens * heads_q
    po = torch.empty(rows, splits, dim, device=q.device, dtype=torch.float32)
    pl = torch.empty(rows, splits, device=q.device, dtype=torch.float32)
    _partial_states[(rows, splits)](q, k, v, po, pl, scale * LOG2E, num_keys, chunk, heads_q,
                                    heads_q // heads_kv, q.stride(0), q.stride(1), k.stride(0),
                                    k.stride(1), splits, D=dim, BLOCK_N=block_n)
    o = torch.empty(tokens, heads_q, dim, device=q.device, dtype=torch.float32)
    lse = torch.empty(tokens, heads_q, device=q.device, dtype=torch.float32)
    _merge_splits[(rows,)](po, pl, o, lse, splits, D=dim,
                           BLOCK_S=triton.next_power_of_2(splits), BASE_BUG=base_bug,
                           MAX_BUG=max_bug)
    return o, lse


def to_device(array, dtype):
    """The kit's float32 NumPy inputs as tensors of the drawn dtype on DEVICE (exact)."""
    return torch.from_numpy(array).to(DEVICE, getattr(torch, dtype))


KIT_OPTIONS = dict(base="natural", input_dtypes=("float16", "bfloat16"), head_dims=(16, 32, 64),
                   to_inputs=to_device)

if __name__ == "__main__":
    import attnstate.testing

    print(attnstate.testing.check_kernel(split_kv_attention, num_tests=50, **KIT_OPTIONS))
    for bug, what in (("base_bug", "the mixed-base merge"),
                      ("max_bug", "the merge without max subtraction")):
        try:
            attnstate.testing.check_kernel(
                lambda q, k, v, s, bug=bug: split_kv_attention(q, k, v, s, **{bug: True}),
                num_tests=50, **KIT_OPTIONS)
            print(f"the kit missed {what}")
        except AssertionError as report:
            print(f"the kit caught {what}:\n{report}")
