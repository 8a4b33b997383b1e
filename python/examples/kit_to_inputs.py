"""The testing kit from Python with `to_inputs`: the kit draws q, k, v in float32, float16 and
bfloat16 and hands them to the kernel as float32 NumPy arrays holding the drawn values; a kernel
that wants its inputs in their own dtype converts them through `to_inputs(array, dtype_name)`.
Shown in docs/testing_kit.md ("From Python").

    python python/examples/kit_to_inputs.py
"""

# [to-inputs]
import numpy as np
import attnstate.testing
from numpy_attention import attention  # a NumPy kernel: attention(q, k, v, scale) -> (o, lse)


def in_drawn_dtype(array, dtype_name):  # dtype_name: "float32", "float16" or "bfloat16"
    # float16 draws as float16 arrays; NumPy has no bfloat16 (ml_dtypes has): keep float32
    return array.astype(np.float16) if dtype_name == "float16" else array


received = set()


def my_kernel(q, k, v, scale):
    received.add(q.dtype.name)
    return attention(q, k, v, scale)


summary = attnstate.testing.check_kernel(my_kernel, base="natural", num_tests=50,
                                         to_inputs=in_drawn_dtype)
assert "float16" in received  # float16 draws reached the kernel as float16 arrays
print(summary)
# [to-inputs]
