"""attnstate: the attention-state algebra for arrays of any DLPack library (torch, CuPy, JAX,
NumPy).

An attention state `State(o, lse, base)` is the normalised output over a set of keys and the
log-sum-exp of their scores, tagged with the LSE's base ("natural" as FlashAttention and
PyTorch return, "base2" as FlashInfer does). States of disjoint key sets merge exactly (⊕).
Host arrays run on the CPU backend, CUDA arrays on the CUDA backend on the caller's stream.
Errors raise `attnstate.Error` (`.status`, a message naming the argument).
The context-parallel merge across a torch.distributed group is `attnstate.distributed.cp_merge`
(that module imports torch); `cp_merge_simulated` runs every rank of it in one process.
"""

from ._attnstate import Base, DType, Error, State, Status, has_cuda, num_threads, set_num_threads
from ._merge import (mark_empty_rows, merge_state, merge_state_, merge_states, merge_states_ragged,
                     rebase, sink_state)
from ._levels import CascadeDecision, CascadeLevels, cascade_levels, decide_cascade
from ._plans import (Cascade, Decode, MlaCascade, MlaDecode, default_scale,
                     flashmla_fp8_views)
from ._context_parallel import cp_merge_simulated, head_bounds

__version__ = "0.1.0"

__all__ = [
    "Base", "Cascade", "CascadeDecision", "CascadeLevels", "DType", "Decode", "Error", "MlaCascade",
    "MlaDecode",
    "State", "Status", "cascade_levels", "cp_merge_simulated", "decide_cascade", "default_scale",
    "flashmla_fp8_views", "has_cuda", "head_bounds",
    "mark_empty_rows", "merge_state", "merge_state_", "merge_states", "merge_states_ragged",
    "num_threads", "rebase", "set_num_threads", "sink_state",
]

try:  # torch custom ops (torch.ops.attnstate.*) when torch is importable
    from . import torch_ops as _torch_ops  # noqa: F401
except ImportError:
    pass
