"""Helpers of the package's tests: a float64 NumPy reference of attention states and the GPU
skip markers (tests needing torch/CuPy/JAX and a CUDA device skip cleanly without them)."""

import importlib.util

import numpy as np
import pytest


def reference_state(q, k, v, scale, base="natural"):
    """(o, lse) of q (T, H, D) over k, v (N, Hkv, D) in float64; lse in `base`."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    if k.shape[0] == 0:
        return np.zeros(q.shape), np.full(q.shape[:2], -np.inf)
    g = q.shape[1] // k.shape[1]
    s = np.einsum("thd,khd->thk", q, np.repeat(k, g, axis=1)) * scale
    m = s.max(axis=2, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=2, keepdims=True)
    o = np.einsum("thk,khd->thd", p, np.repeat(v, g, axis=1)) / l
    lse = (m + np.log(l))[..., 0]
    return o, (lse / np.log(2.0) if base == "base2" else lse)


def has_module(name):
    return importlib.util.find_spec(name) is not None


def cuda_torch():
    """torch when it is installed and sees a CUDA device and attnstate has its CUDA backend."""
    import attnstate
    if not attnstate.has_cuda or not has_module("torch"):
        return None
    import torch
    return torch if torch.cuda.is_available() else None


requires_torch_cuda = pytest.mark.skipif(
    cuda_torch() is None, reason="needs torch, a CUDA device and attnstate's CUDA backend")


def shared_prefix_levels(prefix, suffixes, page_size):
    """Two cascade levels over one pool: a prefix of `prefix` tokens shared by every request in
    pages 0.., then request b's own `suffixes[b]` tokens in the pages after. Returns the levels
    (host int32 tuples), the pool's page count and the first page of each segment."""
    batch = len(suffixes)
    pages = [-(-prefix // page_size)] + [-(-n // page_size) for n in suffixes]
    total = sum(pages)
    starts = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    shared = (np.array([0, batch], np.int32), np.array([0, pages[0]], np.int32),
              np.arange(pages[0], dtype=np.int32), np.array([prefix], np.int32))
    own = (np.arange(batch + 1, dtype=np.int32), (starts[1:] - starts[1]).astype(np.int32),
           np.arange(starts[1], total, dtype=np.int32), np.array(suffixes, np.int32))
    return [shared, own], total, starts


def paged_keys(rng, seq_lens, page_size, heads_kv, d):
    """Random float32 keys in shuffled NHD pages (drawn from `rng`), a CSR page table, and each
    request's keys in order: (k, v, page_indptr, page_indices, [(k_b, v_b) per request])."""
    pages_of = [-(-n // page_size) for n in seq_lens]
    total = max(1, sum(pages_of))
    perm = rng.permutation(total).astype(np.int32)
    k = rng.standard_normal((total, page_size, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal((total, page_size, heads_kv, d)).astype(np.float32)
    indptr = np.concatenate([[0], np.cumsum(pages_of)]).astype(np.int32)
    keys = []
    for b, n in enumerate(seq_lens):
        pages = perm[indptr[b]:indptr[b + 1]]
        keys.append((k[pages].reshape(-1, heads_kv, d)[:n], v[pages].reshape(-1, heads_kv, d)[:n]))
    return k, v, indptr, perm, keys
