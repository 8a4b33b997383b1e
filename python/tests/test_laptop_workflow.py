"""The laptop workflow (docs/laptop.md) on the Triton split-KV example, no GPU needed: the kit on
the kernel under Triton's interpreter with CPU tensors (the correct kernel passes, the planted
merge bugs are caught), and an ahead-of-time compile for sm_90. Each runs in a subprocess: the
interpreter must be chosen before Triton builds the kernels, the compiler needs them built
without it. Skipped, with the reason, where torch or Triton is missing."""

import json
import os
import subprocess
import sys

import pytest

import attnstate
import attnstate.testing
from helpers import has_module

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
MISSING = [m for m in ("torch", "triton") if not has_module(m)]

pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"the laptop workflow needs torch and Triton; missing: "
                          f"{', '.join(MISSING)} (pip install torch triton)")


def run_example(code, interpret, tmp_path):
    """Runs `code` in a fresh Python with the examples and this attnstate importable, Triton's
    cache in tmp_path (a compile is a real one) and TRITON_INTERPRET set or not; returns the
    JSON the code prints on its last line after 'RESULT '."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
               PYTHONPATH=os.pathsep.join(
                   [EXAMPLES, os.path.dirname(os.path.dirname(attnstate.__file__))]
                   + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=900)
    last = done.stdout.strip().splitlines()[-1:] or [""]
    assert done.returncode == 0 and last[0].startswith("RESULT "), \
        f"exit {done.returncode}\nstdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    return json.loads(last[0][len("RESULT "):])


@pytest.mark.skipif(attnstate.testing._T is None, reason="built without the testing kit")
def test_kit_on_the_interpreted_kernel_passes_it_and_catches_the_planted_bugs(tmp_path):
    # Few cases per law, one law per bug and one shrunk report keep this to seconds: the
    # interpreter runs every program instance in Python, and shrinking calls the kernel again
    # for every smaller case tried. A fixed seed makes the cases (and the catch) repeatable.
    result = run_example("""
import json, triton_interpret_check as c, triton_split_kv
out = {"device": triton_split_kv.DEVICE, "correct": c.check(None, num_tests=4, seed=7),
       "mixed_base": c.check("mixed_base", num_tests=6, seed=7, laws=["split_merge"]),
       "no_max": c.check("no_max", num_tests=6, seed=7, laws=["large_logits"], shrink=False)}
print("RESULT " + json.dumps(out))
""", True, tmp_path)
    assert result["device"] == "cpu"
    passed, summary = result["correct"]
    assert passed, summary
    assert "FAIL" not in summary and summary.count("PASS") == len(attnstate.testing.LAWS)
    passed, report = result["mixed_base"]
    assert not passed and "law 'split_merge' broke" in report
    passed, report = result["no_max"]
    assert not passed and "law 'large_logits' broke" in report and "inf/NaN" in report


def test_ahead_of_time_compile_for_sm90_without_a_gpu(tmp_path):
    result = run_example("""
import json, triton_compile_check as c
out = {}
for name, k in c.compile_for(arch=90, head_dim=128, dtype="fp16"):
    cubin = c.cubin_report(k)
    out[name] = dict(registers=cubin["registers"], local=cubin["local"], cubin_arch=cubin["arch"],
                     target_arch=k.metadata.target.arch, stages=list(k.asm.keys()),
                     elf=k.asm["cubin"][:4].hex(), shared=k.metadata.shared,
                     ptx_target=[l for l in k.asm["ptx"].splitlines() if l.startswith(".target")],
                     loads=c.global_loads(k))
print("RESULT " + json.dumps(out))
""", False, tmp_path)
    assert sorted(result) == ["_merge_splits", "_partial_states"]
    for name, k in result.items():
        print(name, k)  # the resource use, shown by pytest -s
        assert k["target_arch"] == 90 and k["cubin_arch"].startswith("sm_90"), (name, k)
        assert k["ptx_target"] and k["ptx_target"][0].split()[1].startswith("sm_90"), (name, k)
        assert "ptx" in k["stages"] and "cubin" in k["stages"] and k["elf"] == "7f454c46", (name, k)
        # A thread has at most 255 registers; a spill would show as local memory.
        assert 0 < k["registers"] <= 255 and k["local"] == 0, (name, k)
    # The launch's divisibility hints give 16-byte vector loads of K and V.
    assert result["_partial_states"]["loads"].get("ld.global.v4.b32", 0) > 0, result
