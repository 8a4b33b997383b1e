"""The laptop check of the Triton split-KV kernel (triton_split_kv.py): Triton's interpreter runs
the kernel on CPU tensors, and attnstate.testing.check_kernel judges it. The correct kernel
passes; each planted merge bug (a base-2 LSE merged with natural exponentials, a merge without
max subtraction) is caught, with the kit's report. No GPU needed: torch (CPU) and Triton only.

    python python/examples/triton_interpret_check.py [--num-tests N] [--seed S]

The interpreter must be chosen before Triton builds the kernels, so this file sets
TRITON_INTERPRET=1 before it imports them (or run it in a process started with it set). It runs
tile semantics with NumPy: it proves the kernel's arithmetic, not its speed, nor that it compiles
(triton_compile_check.py does that).
"""

import argparse
import os
import sys

if "triton_split_kv" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("triton_interpret_check: triton_split_kv was imported without "
                       "TRITON_INTERPRET=1, so its kernels are compiled ones, which need a GPU; "
                       "import this module first, or set TRITON_INTERPRET=1 before Python starts")
# [interpret-setup]
os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are built: @triton.jit reads it

import attnstate.testing  # noqa: E402
import triton_split_kv  # noqa: E402  (its DEVICE is now "cpu": the kit's inputs, CPU tensors)

# Small problems keep a run to tens of seconds: every program instance is run in Python.
LAPTOP_OPTIONS = dict(triton_split_kv.KIT_OPTIONS, head_dims=(16, 32), max_keys=96)
# [interpret-setup]


def _index_scalars_by_item():
    """Triton's interpreter holds a scalar as a one-element array, and up to Triton 3.6 gives it to
    Python (`range(begin, end, BLOCK_N)` over runtime bounds) as int(array): a TypeError from
    NumPy 2.4 on (int() of an array with ndim > 0). Triton 3.7 takes the element first
    (triton-lang/triton#9171); this does so for the older ones too. The interpreter sets
    tl.tensor's methods at each launch (3.6: in a scope that restores them), so this wraps that."""
    from triton.runtime import interpreter
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None or getattr(patch_tensor, "_index_by_item", False):
        return

    def patched(tensor, *scope):
        patch_tensor(tensor, *scope)
        set_attr = scope[0].set_attr if scope else setattr
        set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patched._index_by_item = True
    interpreter._patch_lang_tensor = patched


_index_scalars_by_item()
BUGS = {
    "mixed_base": dict(base_bug=True),  # exp(lse) of base-2 LSEs: split_merge / exactness
    "no_max": dict(max_bug=True),  # exp2(lse) overflows: large_logits
}


def check(bug=None, num_tests=8, seed=1, **options):
    """check_kernel on the interpreted kernel (with the planted `bug`, a key of BUGS, or none):
    returns (passed, the kit's summary or failure report)."""
    if triton_split_kv.DEVICE != "cpu":
        raise RuntimeError("triton_interpret_check.check: expected the kernels built under "
                           "TRITON_INTERPRET=1 (DEVICE 'cpu'), got DEVICE "
                           f"{triton_split_kv.DEVICE!r}")
    if bug is not None and bug not in BUGS:
        raise ValueError(f"triton_interpret_check.check: argument 'bug': expected None or one of "
                         f"{sorted(BUGS)}, got {bug!r}")
    planted = BUGS.get(bug, {})

    # [interpret-check]
    def kernel(q, k, v, scale):  # CPU tensors in, CPU tensors out
        return triton_split_kv.split_kv_attention(q, k, v, scale, **planted)
    try:
        return True, attnstate.testing.check_kernel(kernel, num_tests=num_tests, seed=seed,
                                                    **dict(LAPTOP_OPTIONS, **options))
    except AssertionError as report:  # a law broke: the law, the shrunk case, the seed
        return False, str(report)
    # [interpret-check]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-tests", type=int, default=8, help="kit cases per law")
    parser.add_argument("--seed", type=int, default=1, help="RapidCheck seed (0: random)")
    args = parser.parse_args(argv)
    ok, text = check(None, args.num_tests, args.seed)
    print(f"correct kernel: {'passed' if ok else 'FAILED'}\n{text}")
    caught = []
    for bug in BUGS:
        bug_ok, report = check(bug, args.num_tests, args.seed)
        caught.append(not bug_ok)
        print(f"\n{bug} bug: {'NOT caught' if bug_ok else 'caught'}\n{report}")
    return 0 if ok and all(caught) else 1


if __name__ == "__main__":
    sys.exit(main())
