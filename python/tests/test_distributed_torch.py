"""attnstate.distributed.cp_merge over torch.distributed: N = 1..4 gloo processes on CPU tensors
(spawned, a free TCP port), checked against attnstate.merge_states (bitwise, all-to-all) and the
CPU simulation attnstate.cp_merge_simulated (both algorithms and outputs, mixed bases, empty
shards with NaN garbage, sinks once), the errors every rank raises together, and an NCCL variant
on CUDA tensors (one process per GPU) that skips without a GPU. Skips without torch."""

import datetime
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)
import torch.multiprocessing as mp  # noqa: E402

import attnstate  # noqa: E402
from test_context_parallel_numpy import rank_states  # noqa: E402

ALGORITHMS = ("all_to_all", "all_gather_lse")
OUTPUTS = ("head_sharded", "replicated")
TOKENS = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cases(n, head_dim):
    """(algorithm, output, heads, dtype, out_dtype, out_base, sinks, seed) for n ranks: uneven
    and even head counts, dtypes, output bases, with and without sinks."""
    out, seed = [], 0
    for heads in sorted({n + 1 if n > 1 else 3, 2 * n}):
        for algorithm in ALGORITHMS:
            for output in OUTPUTS:
                if algorithm == "all_gather_lse" and output == "head_sharded" and heads % n:
                    continue
                for dtype, out_dtype, out_base, sinks in (
                        ("float32", None, None, False), ("bfloat16", "float32", "base2", True),
                        ("float16", "float16", "natural", seed % 2 == 0)):
                    seed += 1
                    out.append((algorithm, output, heads, dtype, out_dtype, out_base, sinks,
                                1000 * n + seed))
    return out


def host_states(n, heads, head_dim, dtype, seed):
    """Every rank's State (CPU torch tensors) and the sinks, the same in every process."""
    rng = np.random.default_rng(seed)
    states = rank_states(rng, n, TOKENS, heads, head_dim, bases=("natural", "base2"), empty=0.25,
                         empty_ranks=(1,) if n > 2 else ())
    sinks = torch.from_numpy(rng.standard_normal(heads).astype(np.float32))
    return [attnstate.State(torch.from_numpy(s.o).to(getattr(torch, dtype)),
                            torch.from_numpy(s.lse), s.base) for s in states], sinks


def on(state, device):
    return attnstate.State(state.o.to(device), state.lse.to(device), state.base)


def merge_states_reference(states, rank, output, out_dtype, out_base, sinks):
    """What the all-to-all algorithm computes, from attnstate.merge_states on one device: the
    ranks' states in the natural base, each owner's head slice merged in rank order."""
    n, heads = len(states), states[0].o.shape[1]
    bounds = attnstate.head_bounds(heads, n)
    wire = [attnstate.rebase(s, "natural") for s in states]
    out_dtype = out_dtype or str(states[0].o.dtype).rsplit(".", 1)[-1]
    out_base = out_base or states[rank].base

    def merged(r, base):
        b0, b1 = bounds[r], bounds[r + 1]
        stack = attnstate.State(torch.stack([w.o[:, b0:b1] for w in wire]),
                                torch.stack([w.lse[:, b0:b1] for w in wire]), "natural")
        return attnstate.merge_states(stack, order="states_major", dtype=out_dtype, base=base)

    if output == "head_sharded":
        out, b0, b1 = merged(rank, out_base), bounds[rank], bounds[rank + 1]
    else:
        parts = [attnstate.rebase(merged(r, "natural"), out_base) for r in range(n)]
        out = attnstate.State(torch.cat([p.o for p in parts], 1),
                              torch.cat([p.lse for p in parts], 1), out_base)
        b0, b1 = 0, heads
    if sinks is not None:
        attnstate.merge_state_(out, attnstate.sink_state(sinks[b0:b1], out.o.shape[0],
                                                         out.o.shape[2]))
    return out


def compare(got, want, exact, what, failures):
    got_o, got_lse = got.o.cpu().float(), got.lse.cpu()
    want_o, want_lse = want.o.cpu().float(), want.lse.cpu()
    if got.base != want.base or got.o.dtype != want.o.dtype or got.o.shape != want.o.shape:
        failures.append(f"{what}: {got!r} {got.o.dtype} vs {want!r} {want.o.dtype}")
        return
    if exact:
        if not (torch.equal(got_o, want_o) and torch.equal(got_lse, want_lse)):
            failures.append(f"{what}: not bitwise equal "
                            f"(max |do| {(got_o - want_o).abs().max().item()})")
        return
    tol = 2e-5 if got.o.dtype == torch.float32 else 1e-2
    if not torch.equal(torch.isneginf(got_lse), torch.isneginf(want_lse)):
        failures.append(f"{what}: empty rows differ")
        return
    fin = torch.isfinite(want_lse)
    if not (torch.allclose(got_o, want_o, rtol=tol, atol=tol) and
            torch.allclose(got_lse[fin], want_lse[fin], rtol=tol, atol=tol)):
        failures.append(f"{what}: max |do| {(got_o - want_o).abs().max().item()}, "
                        f"max |dlse| {(got_lse[fin] - want_lse[fin]).abs().max().item()}")


def expect_error(fn, arg, failures, what, text=None):
    from attnstate.distributed import ArgumentError
    try:
        fn()
    except ArgumentError as e:
        if f"'{arg}'" not in str(e) or (text and text not in str(e)):
            failures.append(f"{what}: error {e} does not name '{arg}' / {text!r}")
        if not isinstance(e, (ValueError, attnstate.Error)):
            failures.append(f"{what}: {type(e)} is not a ValueError and attnstate.Error")
        return
    except Exception as e:  # noqa: BLE001
        failures.append(f"{what}: {type(e).__name__}: {e}")
        return
    failures.append(f"{what}: no error")


def run_errors(rank, n, device, failures):
    """Errors of one rank or of all, raised on every rank together (no rank left waiting)."""
    from attnstate.distributed import cp_merge
    states, _ = host_states(n, 2 * n, 8, "float32", 7)
    mine = on(states[rank], device)
    if rank == 1:  # this rank's heads differ
        mine = attnstate.State(mine.o[:, 1:], mine.lse[:, 1:], mine.base)
    expect_error(lambda: cp_merge(mine), "state.heads", failures, "mismatched heads",
                 "on rank 1")
    bad = (states[0].o, states[0].lse) if rank == 0 else on(states[rank], device)
    expect_error(lambda: cp_merge(bad), "state", failures, "one rank refused",
                 None if rank == 0 else "rank(s) [0]")
    alg = "all_gather_lse" if rank == n - 1 else "all_to_all"
    expect_error(lambda: cp_merge(on(states[rank], device), algorithm=alg), "algorithm", failures,
                 "mismatched algorithm")
    sinks = torch.zeros(2 * n, device=device) if rank == 0 else None
    expect_error(lambda: cp_merge(on(states[rank], device), sinks=sinks), "sinks", failures,
                 "sinks on one rank")
    odd, _ = host_states(n, 2 * n + 1, 8, "float32", 8)
    expect_error(lambda: cp_merge(on(odd[rank], device), algorithm="all_gather_lse"), "heads",
                 failures, "heads not a multiple", "multiple of the world size")
    few, _ = host_states(n, n - 1, 8, "float32", 9)
    expect_error(lambda: cp_merge(on(few[rank], device)), "heads", failures, "too few heads")
    expect_error(lambda: cp_merge(on(states[rank], device), output="tp"), "output", failures,
                 "unknown output")
    # the group still works after the errors
    got = cp_merge(on(states[rank], device))
    compare(got, attnstate.cp_merge_simulated(states)[rank], device.type == "cpu", "after errors",
            failures)


def worker(rank, n, port, backend, head_dim, result_dir):
    device = torch.device("cpu") if backend == "gloo" else torch.device("cuda", rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n, timeout=datetime.timedelta(seconds=120))
    from attnstate.distributed import cp_merge
    failures = []
    exact_device = device.type == "cpu"  # the simulation runs the CPU backend's merges
    for case in cases(n, head_dim):
        algorithm, output, heads, dtype, out_dtype, out_base, with_sinks, seed = case
        what = f"rank {rank}/{n} {case}"
        states, sinks = host_states(n, heads, head_dim, dtype, seed)
        sinks = sinks if with_sinks else None
        try:
            got = cp_merge(on(states[rank], device), algorithm=algorithm, output=output,
                           sinks=None if sinks is None else sinks.to(device),
                           out_dtype=out_dtype, out_base=out_base, check=seed % 3 != 0)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{what}: {type(e).__name__}: {e}")
            break  # the ranks may no longer agree on the collectives
        want = attnstate.cp_merge_simulated(states, algorithm=algorithm, output=output,
                                            out_dtype=out_dtype, out_base=out_base, sinks=sinks)
        compare(got, want[rank], algorithm == "all_to_all" and exact_device,
                what + " vs cp_merge_simulated", failures)
        if algorithm == "all_to_all":  # bitwise the merge_states on this rank's device
            ref = merge_states_reference([on(s, device) for s in states], rank, output,
                                         out_dtype, out_base,
                                         None if sinks is None else sinks.to(device))
            compare(got, ref, True, what + " vs merge_states", failures)
        if got.o.device != device:
            failures.append(f"{what}: output on {got.o.device}")
    states, _ = host_states(n, 2 * n, head_dim, "float32", 1)
    empty = attnstate.State(states[rank].o[:0].to(device), states[rank].lse[:0].to(device),
                            "natural")
    for output in OUTPUTS:  # no rows: shapes only
        got = cp_merge(empty, output=output)
        h = 2 if output == "head_sharded" else 2 * n
        if tuple(got.o.shape) != (0, h, head_dim):
            failures.append(f"rank {rank}: zero tokens gave {tuple(got.o.shape)}")
    if n > 1:
        run_errors(rank, n, device, failures)
    dist.destroy_process_group()
    with open(f"{result_dir}/rank{rank}.txt", "w") as f:
        f.write("\n".join(failures))


def spawn(n, backend, head_dim, tmp_path):
    mp.spawn(worker, args=(n, free_port(), backend, head_dim, str(tmp_path)), nprocs=n,
             join=True)
    failures = []
    for r in range(n):
        text = (tmp_path / f"rank{r}.txt").read_text()
        failures += [line for line in text.splitlines() if line]
    assert not failures, "\n".join(failures[:30])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_gloo_cpu(n, tmp_path):
    spawn(n, "gloo", 8, tmp_path)


def test_no_process_group():
    from attnstate.distributed import ArgumentError, cp_merge
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    s = attnstate.State(torch.zeros(1, 2, 8), torch.zeros(1, 2), "natural")
    with pytest.raises(ArgumentError, match="'group'"):
        cp_merge(s)


def gpus():
    import attnstate as a
    return torch.cuda.device_count() if a.has_cuda and torch.cuda.is_available() else 0


@pytest.mark.skipif(gpus() < 1 or not dist.is_nccl_available(),
                    reason="needs a CUDA device, NCCL in torch and attnstate's CUDA backend")
@pytest.mark.parametrize("n", [1, 2, 4])
def test_nccl_cuda(n, tmp_path):
    if gpus() < n:
        pytest.skip(f"needs {n} GPUs")
    spawn(n, "nccl", 64, tmp_path)
