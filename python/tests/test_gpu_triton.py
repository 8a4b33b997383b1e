"""The kit on the project's Triton split-KV kernel (GPU machine): the kernel conforms, and the
mixed-base merge bug is caught. Skipped without torch, Triton and a GPU."""

import pytest

import attnstate.testing
from helpers import cuda_torch, has_module

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda_torch() is None or not has_module("triton")
                                 or attnstate.testing._T is None,
                                 reason="needs torch, Triton, a CUDA device and the testing kit")]


def test_triton_split_kv_kernel_conforms():
    from triton_split_kv import KIT_OPTIONS, split_kv_attention
    summary = attnstate.testing.check_kernel(split_kv_attention, num_tests=40, seed=5,
                                             **KIT_OPTIONS)
    assert "FAIL" not in summary


def test_triton_mixed_base_merge_is_caught():
    from triton_split_kv import KIT_OPTIONS, split_kv_attention

    def buggy(q, k, v, scale):
        return split_kv_attention(q, k, v, scale, base_bug=True)
    with pytest.raises(AssertionError, match="split_merge|exactness"):
        attnstate.testing.check_kernel(buggy, num_tests=40, seed=5, **KIT_OPTIONS)
