"""Ahead-of-time compile of the split-KV kernels (triton_split_kv.py) for a GPU one does not own:
`triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))` lowers both kernels to PTX and
an sm_90 (H100) cubin on a machine without a GPU, and the cubin's resource use is read back
(registers per thread, spills, static shared memory). The interpreter (triton_interpret_check.py)
proves the arithmetic; this proves the kernels lower (loop-carried dtypes, constexpr use,
unsupported ops fail only in the real compiler) before any GPU time is spent.

    python python/examples/triton_compile_check.py [--arch 90] [--head-dim 128] [--dtype fp16]

Needs Triton (its NVIDIA backend ships ptxas and cuobjdump), not torch's CUDA nor a driver.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

# The compiler needs the kernels as JIT functions: the interpreter's are Python only.
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import triton_split_kv  # noqa: E402

# What a launch specialises on (arguments divisible by 16: aligned pointers, strides of rows of
# 16 elements) is what unlocks vector loads; spelled out here as the launch would.
_ALIGNED = [["tt.divisibility", 16]]


def kernel_sources(head_dim=128, dtype="fp16", block_n=64, max_splits=32):
    """(name, ASTSource) of both kernels for q, k, v of Triton type `dtype` ("fp16", "bf16",
    "fp32") and a head dim `head_dim` (a power of two >= 16), the signatures of
    split_kv_attention's launches."""
    if dtype not in ("fp16", "bf16", "fp32"):
        raise ValueError(f"kernel_sources: argument 'dtype': expected 'fp16', 'bf16' or 'fp32', "
                         f"got {dtype!r}")
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"kernel_sources: argument 'head_dim': expected a power of two >= 16, "
                         f"got {head_dim!r}")
    partial = triton_split_kv._partial_states
    merge = triton_split_kv._merge_splits
    for fn in (partial, merge):
        if not isinstance(fn, triton.runtime.jit.JITFunction):
            raise RuntimeError(f"kernel_sources: expected {fn.__name__} to be a Triton JIT "
                               f"function, got {type(fn).__name__} (triton_split_kv imported "
                               "under TRITON_INTERPRET=1?)")
    ptr = "*" + dtype
    # [aot-source]
    # Argument types as Triton spells them; constexprs are given values, as at a launch.
    partial_sig = {"Q": ptr, "K": ptr, "V": ptr, "PO": "*fp32", "PL": "*fp32",
                   "scale_log2": "fp32", "num_keys": "i32", "chunk": "i32", "heads_q": "i32",
                   "group": "i32", "stride_qt": "i32", "stride_qh": "i32", "stride_kn": "i32",
                   "stride_kh": "i32", "splits": "i32", "D": "constexpr", "BLOCK_N": "constexpr"}
    aligned = ("Q", "K", "V", "PO", "PL", "stride_qt", "stride_qh", "stride_kn", "stride_kh")
    partial_src = ASTSource(fn=partial, signature=partial_sig,
                            constexprs={"D": head_dim, "BLOCK_N": block_n},
                            attrs={(partial.arg_names.index(a),): _ALIGNED for a in aligned})
    # [aot-source]
    merge_sig = {"PO": "*fp32", "PL": "*fp32", "O": "*fp32", "LSE": "*fp32", "splits": "i32",
                 "D": "constexpr", "BLOCK_S": "constexpr", "BASE_BUG": "constexpr",
                 "MAX_BUG": "constexpr"}
    merge_src = ASTSource(fn=merge, signature=merge_sig,
                          constexprs={"D": head_dim, "BLOCK_S": max_splits, "BASE_BUG": False,
                                      "MAX_BUG": False},
                          attrs={(merge.arg_names.index(a),): _ALIGNED for a in ("PO", "O")})
    return [(partial.__name__, partial_src), (merge.__name__, merge_src)]


def cubin_report(compiled):
    """{"arch", "registers", "stack", "shared", "local"} of a CompiledKernel's cubin, as
    cuobjdump (the one Triton ships) reads it: the SM it is for (e.g. "sm_90a"), registers per
    thread, bytes of stack, of static shared memory and of local memory (spills). No driver
    needed, unlike CompiledKernel.n_regs. The shared memory a launch asks for (dynamic
    included) is compiled.metadata.shared."""
    cuobjdump = triton.knobs.nvidia.cuobjdump.path
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        text = subprocess.run([cuobjdump, "--dump-resource-usage", path], check=True,
                              capture_output=True, text=True).stdout
        elf = subprocess.run([cuobjdump, "--list-elf", path], check=True, capture_output=True,
                             text=True).stdout
    found = {key.lower(): int(value)
             for key, value in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text)}
    arch = re.search(r"\.(sm_\w+)\.cubin", elf)
    if "reg" not in found or arch is None:
        raise RuntimeError("cubin_report: expected REG:<n> and an sm_<arch> ELF in cuobjdump's "
                           f"reports, got {text!r} and {elf!r}")
    return {"arch": arch.group(1), "registers": found["reg"], "stack": found.get("stack", 0),
            "shared": found.get("shared", 0), "local": found.get("local", 0)}


def global_loads(compiled):
    """{PTX global load instruction: count} of a CompiledKernel: ld.global.v4.b32 are 16-byte
    vector loads, what a bandwidth-bound kernel wants for K and V."""
    loads = {}
    for op in re.findall(r"\bld\.global(?:\.[a-z0-9]+)+", compiled.asm["ptx"]):
        loads[op] = loads.get(op, 0) + 1
    return loads


def compile_for(arch=90, head_dim=128, dtype="fp16", num_warps=4):
    """Both kernels compiled for GPUTarget("cuda", arch, 32): [(name, CompiledKernel)]."""
    # [aot-compile]
    target = GPUTarget("cuda", arch, 32)  # backend, compute capability, warp size
    return [(name, triton.compile(src, target=target, options={"num_warps": num_warps}))
            for name, src in kernel_sources(head_dim, dtype)]
    # [aot-compile]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90, 100")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    args = parser.parse_args(argv)
    print(f"Triton {triton.__version__}, target cuda sm_{args.arch}, head dim {args.head_dim}, "
          f"{args.dtype} q/k/v")
    for name, k in compile_for(args.arch, args.head_dim, args.dtype):
        md, use = k.metadata, cubin_report(k)
        loads = ", ".join(f"{op} x{n}" for op, n in sorted(global_loads(k).items()))
        print(f"{name}: stages {','.join(k.asm.keys())}; {use['arch']} cubin, "
              f"{md.num_warps} warps, "
              f"{use['registers']} registers/thread, {use['local']} B spilled, "
              f"{md.shared} B shared memory; {k.asm['ptx'].count(chr(10))} PTX lines "
              f"({loads}); cubin {len(k.asm['cubin'])} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
