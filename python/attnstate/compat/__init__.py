"""Drop-in adapters for the merge APIs serving engines already call, over attnstate's merges:

- `attnstate.compat.flashinfer`: `merge_state`, `merge_state_in_place`, `merge_states` with
  FlashInfer's argument order, (tokens, heads) layouts and base-2 LSEs;
- `attnstate.compat.vllm`: `merge_attn_states` with vLLM's (heads, tokens) natural-log LSEs,
  its +inf mark of empty rows, `output_lse=None`, `prefill_tokens_with_context` and an fp8
  output with `output_scale`.

Neither imports torch or the peer libraries. docs/compat.md maps each call and lists what differs.
"""

from . import flashinfer, vllm

__all__ = ["flashinfer", "vllm"]
