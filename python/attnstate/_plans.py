"""Split-KV decode and cascade attention as plan/run objects (FlashInfer's wrapper shape).

`plan(...)` runs on the host, once per shape, from the real (maximum) lengths; it allocates the
workspace with the library of the `like=` array on its device (attnstate never allocates) and,
on the GPU, zeroes its tickets on the stream. `run(...)` launches on the caller's stream, never
allocates when `out=` is given, never synchronises, and can be captured in a CUDA graph
(`torch.cuda.graph`): plan at the maximum batch and lengths, then capture `run`.
"""

import math
import numbers

from . import _attnstate as _C
from ._arrays import (_numpy_dtype, array_dtype, device_of, dtype_name, empty, error, library,
                      to_dtype)
from ._merge import State, _parse_base


def _out_state(like, out, tokens, heads, head_dim, dtype, base, fn):
    if out is not None:
        if not isinstance(out, State):
            raise error(fn, "out", "an attnstate.State(o, lse, base)", type(out).__name__)
        return out
    o_dtype = array_dtype(like) if dtype is None else dtype_name(dtype, "dtype", fn)
    o = empty(like, (tokens, heads, head_dim), o_dtype)
    return State(o, empty(like, (tokens, heads), "float32"), _parse_base(base, fn, "base"))


def _workspace(plan, like, init, stream):
    """The device workspace of `plan`, allocated with the library of `like` on its device and its
    tickets zeroed on `stream` by `init`; None when the plan needs none."""
    nbytes = plan.workspace_bytes
    if not nbytes:
        return None
    workspace = empty(like, (nbytes,), "uint8")
    init(plan, workspace, stream)
    return workspace


def _kv_dtype(kv_dtype, dtype, fn):
    """The KV dtype of a plan: `dtype` for None, else any spelling `to_dtype` takes, fp8 ones
    included ("e4m3", "float8_e5m2", torch.float8_e4m3fn, ml_dtypes.float8_e5m2, ...)."""
    if kv_dtype is None:
        return to_dtype(dtype, "dtype", fn)
    return to_dtype(kv_dtype, "kv_dtype", fn)


def _levels(levels, fn):
    """The levels of a cascade as the binding takes them: a CascadeLevels (what
    `cascade_levels` returns) or a sequence of (request_indptr, page_indptr, page_indices,
    seg_lens) tuples."""
    if isinstance(levels, _C.CascadeLevels):
        return levels.levels
    try:
        return [tuple(level) for level in levels]
    except TypeError:
        raise error(fn, "levels",
                    "an attnstate.CascadeLevels (attnstate.cascade_levels) or a sequence of "
                    "(request_indptr, page_indptr, page_indices, seg_lens) tuples",
                    type(levels).__name__) from None


def _from_levels(levels, value, attr, fn):
    """`value` (a plan keyword), defaulting to the CascadeLevels' own `attr`; required for
    levels given as tuples, and equal to the CascadeLevels' when both are given."""
    if not isinstance(levels, _C.CascadeLevels):
        if value is None:
            raise error(fn, attr, "an int (required unless levels is an attnstate.CascadeLevels)",
                        "None")
        return value
    own = getattr(levels, attr)
    if value is not None and value != own:
        raise error(fn, attr, f"{own} (the CascadeLevels' {attr}), or None", value)
    return own


def _int_arg(value, arg, fn):
    """A plan's integer keyword as an int (its range is the library's check), else an error
    naming the keyword rather than the binding's signature."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(fn, arg, "an int", type(value).__name__)
    return int(value)


def _softmax_scale(scale, fn):
    """The plan's `scale` as the library takes it (None: 0.0, meaning 1/sqrt(head_dim))."""
    if scale is None:
        return 0.0
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise error(fn, "scale", "a finite float, or None for 1/sqrt(head_dim)",
                    type(scale).__name__)
    return float(scale)


def _kv_scale(scale, arg, fn):
    """A pool's dequantisation scale as the library takes it (None: 1.0), checked."""
    if scale is None:
        return 1.0
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise error(fn, arg, "a float scale (real value = stored value x scale), or None",
                    type(scale).__name__)
    return float(scale)


def _variant(window_left, logits_soft_cap, fn):
    """(window_left, cap) as the library takes them (-1 / 0.0 for none), checked."""
    if window_left is None:
        window = -1
    elif isinstance(window_left, bool) or not isinstance(window_left, numbers.Integral):
        raise error(fn, "window_left", "an int >= 0, or None for no window",
                    type(window_left).__name__)
    elif window_left < -1:
        raise error(fn, "window_left", "an int >= 0, or None for no window", str(window_left))
    else:
        window = int(window_left)
    if logits_soft_cap is None:
        return window, 0.0
    if isinstance(logits_soft_cap, bool) or not isinstance(logits_soft_cap, numbers.Real):
        raise error(fn, "logits_soft_cap", "a finite cap > 0, or None for no cap",
                    type(logits_soft_cap).__name__)
    cap = float(logits_soft_cap)
    if cap != 0.0 and not (math.isfinite(cap) and cap > 0.0):
        raise error(fn, "logits_soft_cap", "a finite cap > 0, or None for no cap", str(cap))
    return window, cap


class Decode:
    """Split-KV (Flash-Decoding) attention over a paged KV cache.

    >>> dec = attnstate.Decode()
    >>> dec.plan(seq_lens_host, heads_q=32, heads_kv=8, head_dim=128, dtype=torch.bfloat16,
    ...          like=k_pages)                      # host: splits, workspace
    >>> state = dec.run(q, k_pages, v_pages, seq_lens, page_indptr=indptr,
    ...                 page_indices=indices)       # per step, on the current stream

    Queries q (batch, q_len, heads_q, head_dim); pools k, v (pages, page_size, heads_kv,
    head_dim) for layout "NHD" or (pages, heads_kv, page_size, head_dim) for "HND"; a CSR page
    table (page_indptr (batch + 1,), page_indices) or a block table (batch, max_pages); int32
    seq_lens (batch,) in the memory of q. Row i of request b is at position
    p = seq_lens[b] - q_len + i and attends to keys [0, p], or with `window_left=w` (a sliding
    window) to [max(0, p - w), p]; `logits_soft_cap=c` turns each scaled score s into
    c * tanh(s / c) before the softmax. The output is a State
    (batch * q_len, heads_q, head_dim), token b * q_len + i, in the base asked for, to merge
    further. CUDA: head_dim 64/128/256, q and KV both float16 or both bfloat16, q_len 1..8; CPU:
    any head_dim, float32/16/bfloat16.

    fp8 KV caches (CPU; CUDA at head_dim 128/256 with float16/bfloat16 q, windows and soft
    caps too): plan with kv_dtype="e4m3" or "e5m2" and pass k, v as uint8
    arrays of the stored bytes (torch: `k.view(torch.uint8)`) with `k_scale=`, `v_scale=` floats
    to run: a stored element's real value is its fp8 value times the scale.

    Attention sinks: `run(..., sinks=s)` with s a (heads_q,) float32 array of natural-base logits
    in the memory of q merges the sink state (0, s[h]) once into every output row, after all the
    splits; the returned State (its lse too) is that of the keys plus the sink. A run-time
    argument: one plan serves every layer, each with its own sinks.
    """

    def __init__(self):
        self._plan = None
        self.workspace = None

    def plan(self, seq_lens, *, heads_q, heads_kv, head_dim, dtype, kv_dtype=None, q_len=1,
             scale=None, policy="auto", num_splits=0, split_size=0, window_left=None,
             logits_soft_cap=None, like=None, num_sms=0, stream=None):
        """Plans for the host int32 array `seq_lens` (batch,) of (maximum) lengths.

        dtype / kv_dtype: of the queries / the KV pools (kv_dtype defaults to dtype; "e4m3" or
        "e5m2" for an fp8 cache, whose pools `run` takes as uint8 arrays with their scales).
        scale: softmax scale (default 1/sqrt(head_dim)). policy: "auto", "fixed_count"
        (num_splits per request) or "fixed_size" (split_size tokens, a multiple of 16).
        window_left: sliding window, keys before the row's position it also sees (0: only its
        own; None or -1: none). logits_soft_cap: cap of the scaled scores (None: none). Both
        run on the CPU and the CUDA backend (not over an fp8 cache on CUDA).
        like: an array whose library and device the run will use (e.g. the K pool): a CUDA array
        plans for its device (SM count from the device unless num_sms > 0) and allocates the
        workspace there; a host array or None plans for the CPU backend.
        stream: where the workspace's tickets are zeroed (default: as for every call).
        Returns self.
        """
        fn = "attnstate.Decode.plan"
        window, cap = _variant(window_left, logits_soft_cap, fn)
        device = device_of(like) if like is not None else None
        self._plan = _C.plan_decode(
            seq_lens, q_len, heads_q, heads_kv, head_dim, to_dtype(dtype, "dtype", fn),
            _kv_dtype(kv_dtype, dtype, fn),
            0.0 if scale is None else float(scale), policy, num_splits, split_size, window, cap,
            -1 if device is None else device, num_sms)
        self._heads_q, self._head_dim, self._q_len = heads_q, head_dim, q_len
        self.workspace = _workspace(self._plan, like, _C.init_decode_workspace, stream)
        return self

    @property
    def workspace_bytes(self):
        """Bytes of the workspace the plan needs (0 on the CPU or without split merges)."""
        return self._require().workspace_bytes

    @property
    def max_splits(self):
        """Most splits of any request in the plan (CUDA plans; 0 on the CPU)."""
        return self._require().max_splits

    def _require(self):
        if self._plan is None:
            raise error("attnstate.Decode.run", "self", "a planned Decode (call plan() first)",
                        "no plan")
        return self._plan

    def run(self, q, k, v, seq_lens, *, page_indptr=None, page_indices=None, block_table=None,
            layout="NHD", out=None, dtype=None, base="natural", k_scale=None, v_scale=None,
            sinks=None, stream=None):
        """Runs the planned decode; returns `out` (or a State allocated like q, in `dtype`
        (default q's) and `base` (default natural)). Exactly one of (page_indptr, page_indices)
        and block_table gives the page table; the plan's batch is the maximum, `seq_lens` may be
        shorter or have shorter lengths (a graph captured once replays for them). k_scale,
        v_scale: the scales of an fp8 cache (None: 1; a finite float > 0), None otherwise.
        sinks: None, or a (heads_q,) float32 array of natural-base sink logits in the memory of
        q (host for a CPU plan, CUDA for a CUDA plan), merged once into each output row after
        every split (CPU: each logit must be finite; CUDA: read when the kernels run).
        stream: as for the merges (torch's current stream by default, an int handle or an object
        with `__cuda_stream__`; None for host arrays); the run enqueues and returns."""
        fn = "attnstate.Decode.run"
        plan = self._require()
        batch = q.shape[0] if len(q.shape) == 4 else 0
        out = _out_state(q, out, batch * self._q_len, self._heads_q, self._head_dim, dtype, base,
                         fn)
        _C.run_decode(plan, q, k, v, seq_lens, page_indptr, page_indices, block_table, layout,
                      out, self.workspace, stream, _kv_scale(k_scale, "k_scale", fn),
                      _kv_scale(v_scale, "v_scale", fn), sinks)
        return out


class MlaDecode:
    """Multi-head latent attention (MLA, DeepSeek-V3/R1 and Kimi K2, absorbed form) decode over a
    paged latent cache: split-KV, with Decode's plan/run shape.

    A plan object of its own beside `Decode` rather than more keywords of it: MLA's queries and
    cache come in two parts each (latent "nope" and rotary "pe"), against one latent head shared
    by every query head, so neither `heads_kv`/`head_dim` nor the k/v pools of `Decode` apply.

    >>> mla = attnstate.MlaDecode()
    >>> mla.plan(seq_lens_host, heads=128, dtype=torch.bfloat16, scale=sm_scale,
    ...          like=ckv_cache)                    # host: splits, workspace
    >>> state = mla.run(q_nope, q_pe, ckv_cache, kpe_cache, seq_lens, page_indptr=indptr,
    ...                 page_indices=indices)       # per step, on the current stream

    Row (token i, head h) of request b scores a cached token as
    `scale * (q_nope[b, i, h] . ckv + q_pe[b, i, h] . kpe)`: the key is the 576-wide
    `[ckv, kpe]`, the value the 512-wide `ckv`. Queries q_nope (batch, q_len, heads,
    kv_lora_rank) and q_pe (batch, q_len, heads, rope_dim), last dims contiguous (FlashMLA's
    (batch, q_len, heads, 576) query is the two views `q[..., :512]`, `q[..., 512:]`).

    The cache, in either peer's layout (views, no copy):
    FlashInfer's two pools `ckv (pages, page_size, kv_lora_rank)`, `kpe (pages, page_size,
    rope_dim)`; or FlashMLA's one pool `kv (blocks, block_size, 1, 576)` passed as the views
    `kv[..., :512]` and `kv[..., 512:]`. A CSR page table (page_indptr (batch + 1,),
    page_indices) or a block table (batch, max_pages), and int32 seq_lens (batch,), in the memory
    of the queries. Causal over q_len: row i of request b attends to the keys
    [0, seq_lens[b] - q_len + i]; a row that sees no key gets (0, -inf).

    fp8 caches: plan with kv_dtype="e4m3" (or "e5m2"; kpe_dtype defaults to kv_dtype, FlashMLA
    keeps it bfloat16) and pass the part as an array of that fp8 dtype (torch float8, NumPy
    through ml_dtypes) or a uint8 array of its bytes, with `ckv_scale=` / `kpe_scale=` per-tensor
    floats: a stored element's real value is its fp8 value times the scale. An fp8 latent part
    quantised per token in blocks of columns takes `ckv_block_scales=` instead: a float32 array
    (pages, page_size, [1,] blocks), any strides, the scale of latent column d of a token being
    its entry d // (kv_lora_rank // blocks). FlashMLA's fp8 pool (blocks, block_size, 1, 656)
    uint8 (512 e4m3 values, 4 fp32 scales of 128 columns, 64 bfloat16 rope values a token) is
    three views of itself, `attnstate.flashmla_fp8_views(pool)` (no copy).

    The output is a State (batch * q_len, heads, kv_lora_rank), token b * q_len + i, in the dtype
    and base asked for: it merges with `merge_state(s)`, cascade levels and the
    context-parallel merge like every state. Sinks as for Decode (merged once, after every
    split). CPU: any widths and heads, q_len 1..8, float32/16/bfloat16 queries, any cache
    dtypes. CUDA: bfloat16 queries, widths 512 and 64, heads a multiple of 16 up to 128, q_len
    1..4, a bfloat16 latent part with a bfloat16 rotary part or an fp8 latent part with a
    bfloat16 rotary part or one of its format; each limit is refused by name.
    """

    def __init__(self):
        self._plan = None
        self.workspace = None

    def plan(self, seq_lens, *, heads, dtype, kv_dtype=None, kpe_dtype=None, q_len=1,
             kv_lora_rank=512, rope_dim=64, scale=None, policy="auto", num_splits=0,
             split_size=0, like=None, num_sms=0, stream=None):
        """Plans for the host int32 array `seq_lens` (batch,) of (maximum) lengths.

        dtype: the queries' (both parts). kv_dtype: the latent part's (default dtype; "e4m3" or
        "e5m2" for an fp8 cache). kpe_dtype: the rotary part's (default kv_dtype). scale: the
        softmax scale (DeepSeek-V3 passes its own; default 1/sqrt(kv_lora_rank + rope_dim)).
        policy, num_splits, split_size, like, num_sms, stream: as for Decode.plan (a CUDA `like`
        plans for its device and allocates the workspace there, its tickets zeroed on `stream`).
        Returns self.
        """
        fn = "attnstate.MlaDecode.plan"
        device = device_of(like) if like is not None else None
        ckv_dtype = _kv_dtype(kv_dtype, dtype, fn)
        kpe = ckv_dtype if kpe_dtype is None else to_dtype(kpe_dtype, "kpe_dtype", fn)
        q_len, heads, kv_lora_rank, rope_dim = (
            _int_arg(v, k, fn) for v, k in ((q_len, "q_len"), (heads, "heads"),
                                             (kv_lora_rank, "kv_lora_rank"),
                                             (rope_dim, "rope_dim")))
        self._plan = _C.plan_mla_decode(
            seq_lens, q_len, heads, kv_lora_rank, rope_dim, to_dtype(dtype, "dtype", fn),
            ckv_dtype, kpe, _softmax_scale(scale, fn), policy,
            _int_arg(num_splits, "num_splits", fn), _int_arg(split_size, "split_size", fn),
            -1 if device is None else device, _int_arg(num_sms, "num_sms", fn))
        self._shape = (q_len, heads, kv_lora_rank)
        self.workspace = _workspace(self._plan, like, _C.init_mla_decode_workspace, stream)
        return self

    def _require(self, fn="attnstate.MlaDecode.run"):
        if self._plan is None:
            raise error(fn, "self", "a planned MlaDecode (call plan() first)", "no plan")
        return self._plan

    @property
    def workspace_bytes(self):
        """Bytes of the workspace the plan needs (0 on the CPU or with one split a request)."""
        return self._require("attnstate.MlaDecode").workspace_bytes

    @property
    def max_splits(self):
        """Most splits of any request in the plan (CUDA plans; 0 on the CPU)."""
        return self._require("attnstate.MlaDecode").max_splits

    @property
    def description(self):
        """One line for logs: the kernel, its dtypes and the splits (CUDA), or the CPU's."""
        return self._require("attnstate.MlaDecode").description

    def run(self, q_nope, q_pe, ckv, kpe, seq_lens, *, page_indptr=None, page_indices=None,
            block_table=None, out=None, dtype=None, base="natural", ckv_scale=None,
            kpe_scale=None, sinks=None, stream=None, ckv_block_scales=None):
        """Runs the planned MLA decode; returns `out` (or a State allocated like q_nope, in
        `dtype` (default q_nope's) and `base` (default natural)). Exactly one of (page_indptr,
        page_indices) and block_table gives the page table; the plan's batch is the maximum
        (`seq_lens` may be shorter, with shorter lengths). ckv_scale, kpe_scale: the per-tensor
        scales of fp8 parts (None: 1). ckv_block_scales: None, or the per-token block scales of an
        fp8 latent part (float32 (pages, page_size, [1,] blocks), in the memory of the queries;
        ckv_scale then None). sinks: None, or a (heads,) float32 array of natural-base logits in
        the memory of the queries, merged once into each output row. stream: as for
        Decode.run."""
        fn = "attnstate.MlaDecode.run"
        plan = self._require(fn)
        batch = q_nope.shape[0] if len(q_nope.shape) == 4 else 0
        q_len, heads, rank = self._shape
        out = _out_state(q_nope, out, batch * q_len, heads, rank, dtype, base, fn)
        _C.run_mla_decode(plan, q_nope, q_pe, ckv, kpe, seq_lens, page_indptr, page_indices,
                          block_table, out, self.workspace, stream,
                          _kv_scale(ckv_scale, "ckv_scale", fn),
                          _kv_scale(kpe_scale, "kpe_scale", fn), sinks, ckv_block_scales)
        return out


def flashmla_fp8_views(kv_cache, *, kv_lora_rank=512, rope_dim=64, block_cols=128):
    """The views (ckv, kpe, ckv_block_scales) of FlashMLA's fp8 cache, no copy.

    `kv_cache`: a uint8 array (blocks, block_size, 1, width), NumPy or torch, each token's row
    holding `kv_lora_rank` e4m3 latent values, `kv_lora_rank // block_cols` fp32 scales (one per
    block of `block_cols` latent columns) and `rope_dim` bfloat16 rotary values: 656 bytes at
    512 / 128 / 64. Returns ckv (its e4m3 bytes, uint8), kpe (bfloat16) and ckv_block_scales
    (float32), for `MlaDecode.run` / `MlaCascade.run` planned with kv_dtype="e4m3",
    kpe_dtype="bfloat16":

    >>> ckv, kpe, scales = attnstate.flashmla_fp8_views(kv_cache)
    >>> mla.run(q_nope, q_pe, ckv, kpe, seq_lens, block_table=bt, ckv_block_scales=scales)
    """
    fn = "attnstate.flashmla_fp8_views"
    if kv_lora_rank < 1 or block_cols < 1 or kv_lora_rank % block_cols:
        raise error(fn, "block_cols", f"a divisor of kv_lora_rank = {kv_lora_rank}",
                    str(block_cols))
    if rope_dim < 1:
        raise error(fn, "rope_dim", ">= 1", str(rope_dim))
    end = kv_lora_rank + 4 * (kv_lora_rank // block_cols)
    width = end + 2 * rope_dim
    shape = tuple(getattr(kv_cache, "shape", ()))
    if len(shape) != 4 or shape[2] != 1 or shape[3] != width:
        raise error(fn, "kv_cache", f"shape (blocks, block_size, 1, {width})", str(shape))
    if array_dtype(kv_cache) != "uint8":
        raise error(fn, "kv_cache", "dtype uint8 (the rows' bytes)", array_dtype(kv_cache))
    if library(kv_cache) == "torch":
        import torch

        def as_(a, name):
            return a.view(getattr(torch, name))
    else:
        def as_(a, name):
            return a.view(_numpy_dtype(name))
    return (kv_cache[..., :kv_lora_rank], as_(kv_cache[..., end:], "bfloat16"),
            as_(kv_cache[..., kv_lora_rank:end], "float32"))


class Cascade:
    """Cascade (shared-prefix) attention: levels of KV segments in one paged pool, a segment
    shared by many requests read once for all of them; equals attention over each request's
    concatenated segments.

    A level is a tuple (request_indptr, page_indptr, page_indices, seg_lens) of int32 arrays:
    segment s serves requests [request_indptr[s], request_indptr[s+1]) and holds seg_lens[s]
    tokens in pages page_indices[page_indptr[s]:page_indptr[s+1]]. `plan` takes the levels as
    host arrays, `run` the same levels in the memory of q. Queries (batch, q_len, heads_q,
    head_dim); pools as for Decode. CUDA: head_dim 64, 128 or 256, float16/bfloat16, 1..8 levels.

    Positions count each request's keys over its segments in level order (total of them): with
    causal, row t is at p = total - q_len + t, else every row at total - 1. `window_left=w` lets
    a row see the keys [max(0, p - w), p] across all the levels (a shared segment before the
    window contributes nothing; CPU and CUDA: a CUDA plan runs the shared levels' splits over
    the keys some row's window reaches);
    `logits_soft_cap` as for Decode (CPU and CUDA). fp8 pools (CPU; CUDA under float16/bfloat16
    queries at the head dims of the catalog's fp8 level rows, docs/catalog.md, with windows and
    soft caps too): `kv_dtype=` in plan, uint8 pools and `k_scale=`, `v_scale=` in run, as for
    Decode.
    `run(..., sinks=s)`: attention sinks merged once into every output row after all the levels,
    as for Decode.
    """

    def __init__(self):
        self._plan = None
        self.workspace = None

    @property
    def description(self):
        """One line for logs: where each level runs and why (the CUDA plan's choices)."""
        if self._plan is None:
            raise error("attnstate.Cascade.description", "self", "a planned Cascade", "no plan")
        return self._plan.description

    def plan(self, levels, *, heads_q, heads_kv, head_dim, num_pages, dtype, batch=None,
             page_size=None, kv_dtype=None, q_len=1, scale=None, causal=True, window_left=None,
             logits_soft_cap=None, like=None, num_sms=0):
        """Plans from host levels: a CascadeLevels (what `cascade_levels` returns and
        `decide_cascade` takes; its queries come in its `.order`) or a sequence of level tuples.
        batch and page_size default to the CascadeLevels' own (required with tuples). `like`,
        `kv_dtype`, `window_left` and `logits_soft_cap` as for Decode.plan. A CPU plan checks
        what its run would refuse (the shape, the dtype, the scale, the levels against batch,
        q_len, page_size and num_pages), as a CUDA plan does, naming the keyword. Returns self."""
        fn = "attnstate.Cascade.plan"
        window, cap = _variant(window_left, logits_soft_cap, fn)
        device = device_of(like) if like is not None else None
        batch = _int_arg(_from_levels(levels, batch, "batch", fn), "batch", fn)
        page_size = _int_arg(_from_levels(levels, page_size, "page_size", fn), "page_size", fn)
        q_len, heads_q, heads_kv, head_dim, num_pages = (
            _int_arg(v, k, fn) for v, k in ((q_len, "q_len"), (heads_q, "heads_q"),
                                             (heads_kv, "heads_kv"), (head_dim, "head_dim"),
                                             (num_pages, "num_pages")))
        self._plan = _C.plan_cascade(
            _levels(levels, fn), batch, q_len, heads_q, heads_kv, head_dim,
            page_size, num_pages, to_dtype(dtype, "dtype", fn), _kv_dtype(kv_dtype, dtype, fn),
            _softmax_scale(scale, fn), causal, window, cap, -1 if device is None else device,
            num_sms)
        self._shape = (batch * q_len, heads_q, head_dim)
        nbytes = self._plan.workspace_bytes
        self.workspace = empty(like, (nbytes,), "uint8") if nbytes else None
        return self

    @property
    def workspace_bytes(self):
        """Bytes of the workspace the plan needs (0 on the CPU)."""
        if self._plan is None:
            raise error("attnstate.Cascade", "self", "a planned Cascade", "no plan")
        return self._plan.workspace_bytes

    def run(self, q, k, v, levels, *, layout="NHD", out=None, dtype=None, base="natural",
            k_scale=None, v_scale=None, sinks=None, stream=None):
        """Runs the planned cascade over `levels` (in q's memory: a CascadeLevels' NumPy
        arrays for host arrays, or the tuples copied to the device); returns `out` or a State
        (batch * q_len, heads_q, head_dim), token b * q_len + t, allocated like q in `dtype`
        (default q's) and `base`. k_scale, v_scale, sinks, stream: as for Decode.run (the sinks
        merged once, after every level)."""
        fn = "attnstate.Cascade.run"
        if self._plan is None:
            raise error(fn, "self", "a planned Cascade (call plan() first)", "no plan")
        out = _out_state(q, out, *self._shape, dtype, base, fn)
        _C.run_cascade(self._plan, q, k, v, _levels(levels, fn), layout, out,
                       self.workspace, stream, _kv_scale(k_scale, "k_scale", fn),
                       _kv_scale(v_scale, "v_scale", fn), sinks)
        return out


class MlaCascade:
    """Cascade (shared-prefix) attention of multi-head latent attention (MLA, absorbed form): the
    levels of `Cascade` over one paged latent pool, a shared latent prefix read once for all the
    requests that share it; equals `MlaDecode` over each request's concatenated segments.

    >>> cas = attnstate.MlaCascade()
    >>> cas.plan(levels_host, heads=128, num_pages=ckv_cache.shape[0], dtype=torch.bfloat16,
    ...          scale=sm_scale, like=ckv_cache)   # host: each level's splits, workspace
    >>> state = cas.run(q_nope, q_pe, ckv_cache, kpe_cache, levels_device)

    Levels as for `Cascade`: a CascadeLevels (`cascade_levels`; its queries come in its
    `.order`) or a sequence of (request_indptr, page_indptr, page_indices, seg_lens) int32
    tuples, host arrays to `plan`, the same levels in the memory of the queries to `run`. Typically
    level 0 is a system prompt shared by the batch, the last level each request's own tokens, whose
    last q_len are the new ones.

    Queries q_nope (batch, q_len, heads, kv_lora_rank) and q_pe (batch, q_len, heads, rope_dim)
    and the latent pool (FlashInfer's two pools `ckv (pages, page_size, kv_lora_rank)`,
    `kpe (pages, page_size, rope_dim)`, or FlashMLA's `(blocks, block_size, 1, 576)` pool as the
    views `kv[..., :512]`, `kv[..., 512:]`) as for `MlaDecode`; the pool's page table is the
    levels'. Row i of a request (with `causal`, the default) sees every token of its earlier
    levels and the last-level tokens [0, len - q_len + i]; without it every row sees every token.

    The output is a State (batch * q_len, heads, kv_lora_rank), token b * q_len + i, in the dtype
    and base asked for; a request with no tokens gets (0, -inf). fp8 parts (`kv_dtype=`,
    `kpe_dtype=` and the scales `ckv_scale=`, `kpe_scale=` to `run`) and `sinks=` (merged once
    into every row after all the levels) as for MlaDecode. CPU: any widths and heads, q_len 1..8,
    float32/16/bfloat16 queries, any cache dtypes, 1..8 levels. CUDA: the limits of MlaDecode's
    CUDA kernel (bfloat16 queries, widths 512 and 64, heads a multiple of 16 up to 128, q_len
    1..4); each limit is refused by name.
    """

    def __init__(self):
        self._plan = None
        self.workspace = None

    def plan(self, levels, *, heads, num_pages, dtype, batch=None, page_size=None,
             kv_dtype=None, kpe_dtype=None, q_len=1, kv_lora_rank=512, rope_dim=64, scale=None,
             causal=True, like=None, num_sms=0):
        """Plans from host levels: a CascadeLevels or a sequence of level tuples. batch and
        page_size default to the CascadeLevels' own (required with tuples); num_pages: pages of
        the pool (the levels' page ids are checked against it). dtype, kv_dtype, kpe_dtype,
        kv_lora_rank, rope_dim and scale (default 1/sqrt(kv_lora_rank + rope_dim)) as for
        MlaDecode.plan; `like` and num_sms as for Cascade.plan (a CUDA `like` plans for its
        device and allocates the workspace there, uninitialised). A CPU plan checks what its run
        would refuse, as a CUDA plan does, naming the keyword. Returns self."""
        fn = "attnstate.MlaCascade.plan"
        device = device_of(like) if like is not None else None
        batch = _int_arg(_from_levels(levels, batch, "batch", fn), "batch", fn)
        page_size = _int_arg(_from_levels(levels, page_size, "page_size", fn), "page_size", fn)
        q_len, heads, kv_lora_rank, rope_dim, num_pages = (
            _int_arg(v, k, fn) for v, k in ((q_len, "q_len"), (heads, "heads"),
                                             (kv_lora_rank, "kv_lora_rank"),
                                             (rope_dim, "rope_dim"), (num_pages, "num_pages")))
        ckv_dtype = _kv_dtype(kv_dtype, dtype, fn)
        kpe = ckv_dtype if kpe_dtype is None else to_dtype(kpe_dtype, "kpe_dtype", fn)
        if not isinstance(causal, bool):
            raise error(fn, "causal", "a bool", type(causal).__name__)
        self._plan = _C.plan_mla_cascade(
            _levels(levels, fn), batch, q_len, heads, kv_lora_rank, rope_dim, page_size,
            num_pages, to_dtype(dtype, "dtype", fn), ckv_dtype, kpe, _softmax_scale(scale, fn),
            causal, -1 if device is None else device, _int_arg(num_sms, "num_sms", fn))
        self._shape = (batch * q_len, heads, kv_lora_rank)
        nbytes = self._plan.workspace_bytes
        self.workspace = empty(like, (nbytes,), "uint8") if nbytes else None
        return self

    def _require(self, fn="attnstate.MlaCascade.run"):
        if self._plan is None:
            raise error(fn, "self", "a planned MlaCascade (call plan() first)", "no plan")
        return self._plan

    @property
    def workspace_bytes(self):
        """Bytes of the workspace the plan needs (0 on the CPU)."""
        return self._require("attnstate.MlaCascade").workspace_bytes

    @property
    def num_levels(self):
        """Levels planned."""
        return self._require("attnstate.MlaCascade").num_levels

    @property
    def description(self):
        """One line for logs: each level's kernel and splits (CUDA), or the CPU's."""
        return self._require("attnstate.MlaCascade").description

    def run(self, q_nope, q_pe, ckv, kpe, levels, *, out=None, dtype=None, base="natural",
            ckv_scale=None, kpe_scale=None, sinks=None, stream=None, ckv_block_scales=None):
        """Runs the planned MLA cascade over `levels` (in the queries' memory: a CascadeLevels'
        NumPy arrays for host arrays, or the tuples copied to the device; the planned batch,
        segments and request grouping, any lengths within the segments' pages); returns `out` or
        a State (batch * q_len, heads, kv_lora_rank) allocated like q_nope in `dtype` (default
        q_nope's) and `base`. The queries have the plan's batch (the levels' requests).
        ckv_scale, kpe_scale, ckv_block_scales, sinks, stream: as for MlaDecode.run (the sinks
        merged once, after every level)."""
        fn = "attnstate.MlaCascade.run"
        plan = self._require(fn)
        out = _out_state(q_nope, out, *self._shape, dtype, base, fn)
        _C.run_mla_cascade(plan, q_nope, q_pe, ckv, kpe, _levels(levels, fn), out,
                           self.workspace, stream, _kv_scale(ckv_scale, "ckv_scale", fn),
                           _kv_scale(kpe_scale, "kpe_scale", fn), sinks, ckv_block_scales)
        return out


def default_scale(head_dim):
    """The softmax scale the library uses by default, 1/sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim)
