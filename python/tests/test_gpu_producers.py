"""Against real producers on the GPU: PyTorch's flash and cuDNN SDPA kernels return a
log-sum-exp; attention over two disjoint halves of the keys, merged with attnstate, matches
attention over all keys. The same merge with CuPy and JAX arrays. Skipped without a GPU."""

import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX beside torch on one GPU

import attnstate
from helpers import cuda_torch, has_module, requires_torch_cuda

pytestmark = [pytest.mark.gpu, requires_torch_cuda]
torch = cuda_torch()

B, H, L, S, D = 1, 8, 64, 1024, 128


def qkv(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
            for n in (L, S, S)]


def flash(q, k, v):
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False)
    return out[0], out[1]


def cudnn(q, k, v):
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False,
                                                             False)
    return out[0], out[1]


def as_state(o, lse):
    """(B=1, H, L, D) output and (B, H, L) natural-log LSE as a State (L, H, D): strided views,
    the LSE read head-major, no copy."""
    lse = lse.reshape(B, H, L)  # cuDNN may add a trailing dim of 1
    return attnstate.State(o[0].transpose(0, 1), lse[0].transpose(0, 1), "natural")


@pytest.mark.parametrize("producer", [flash, cudnn], ids=["flash", "cudnn"])
def test_two_halves_merged_equal_full_attention(producer):
    q, k, v = qkv()
    try:
        full = producer(q, k, v)
    except RuntimeError as e:  # this torch build or GPU lacks the kernel
        pytest.skip(f"{producer.__name__} SDPA unavailable: {e}")
    half = S // 2 + 37
    a = as_state(*producer(q, k[:, :, :half], v[:, :, :half]))
    b = as_state(*producer(q, k[:, :, half:], v[:, :, half:]))
    out = attnstate.merge_state(a, b, dtype=torch.float32)
    ref = as_state(*full)
    torch.testing.assert_close(out.o, ref.o.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.lse, ref.lse.float(), atol=1e-3, rtol=1e-4)


def test_flash_states_merge_as_cupy_arrays():
    if not has_module("cupy"):
        pytest.skip("needs CuPy")
    import cupy
    q, k, v = qkv(1)
    a = as_state(*flash(q, k[:, :, :300], v[:, :, :300]))
    b = as_state(*flash(q, k[:, :, 300:], v[:, :, 300:]))
    torch.cuda.synchronize()  # CuPy's stream does not order after torch's
    ca = attnstate.State(cupy.from_dlpack(a.o.float()), cupy.from_dlpack(a.lse), "natural")
    cb = attnstate.State(cupy.from_dlpack(b.o.float()), cupy.from_dlpack(b.lse), "natural")
    out = attnstate.merge_state(ca, cb)  # CuPy's current stream, CuPy outputs
    assert isinstance(out.o, cupy.ndarray)
    ref = as_state(*flash(q, k, v))
    np.testing.assert_allclose(cupy.asnumpy(out.o), ref.o.float().cpu().numpy(), atol=2e-2)
    np.testing.assert_allclose(cupy.asnumpy(out.lse), ref.lse.cpu().numpy(), atol=1e-3)


def test_flash_states_merge_from_jax_arrays_into_torch_outputs():
    if not has_module("jax"):
        pytest.skip("needs JAX")
    import jax
    import jax.numpy as jnp
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees no GPU")
    q, k, v = qkv(2)
    a = as_state(*flash(q, k[:, :, :500], v[:, :, :500]))
    b = as_state(*flash(q, k[:, :, 500:], v[:, :, 500:]))
    # JAX arrays of the first half (a copy made by JAX), ready before attnstate reads them
    gpu = jax.devices("gpu")[0]
    ja = attnstate.State(jnp.asarray(a.o.float().cpu().numpy(), device=gpu),
                         jnp.asarray(a.lse.contiguous().cpu().numpy(), device=gpu), "natural")
    jax.block_until_ready((ja.o, ja.lse))
    out = attnstate.State(torch.empty(L, H, D, device="cuda"), torch.empty(L, H, device="cuda"),
                          "natural")
    attnstate.merge_state(ja, b, out=out, stream=torch.cuda.current_stream())
    ref = as_state(*flash(q, k, v))
    torch.testing.assert_close(out.o, ref.o.float(), atol=2e-2, rtol=2e-2)
