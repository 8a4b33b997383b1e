"""Every spelling a caller may use is taken (CPU backend): attnstate.Base wherever a base is,
any library's dtype objects wherever a dtype is, a CascadeLevels wherever levels are; errors
name the function and the argument the caller passed; attnstate.Status is the C++ enum; a CPU
decode plan checks its arguments when planning, as the CUDA plan does."""

import ml_dtypes
import numpy as np
import pytest

import attnstate
import attnstate.testing
from helpers import reference_state, shared_prefix_levels
from numpy_attention import attention

rng = np.random.default_rng(31)
kit = pytest.mark.skipif(attnstate.testing._T is None, reason="built without the testing kit")


def state(t=4, h=2, d=8, dtype=np.float32):
    return attnstate.State(rng.standard_normal((t, h, d)).astype(dtype),
                           rng.standard_normal((t, h)).astype(np.float32), "natural")


# ---- Status ----

def test_status_is_the_cpp_enum():
    cpp = {name.upper(): code for name, code in attnstate._attnstate._cpp_status_names().items()}
    assert "RESOURCE_EXHAUSTED" in cpp  # the C++ side is read, not an empty list
    assert {s.name: s.value for s in attnstate.Status} == cpp


# ---- Base ----

@kit
def test_the_kit_takes_the_base_enum():
    summary = attnstate.testing.check_kernel(attention, base=attnstate.Base.NATURAL,
                                             num_tests=10, seed=2)
    assert "PASS" in summary
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 2, 4), (5, 1, 4),
                                                                    (5, 1, 4)))
    o, lse = attnstate.testing.reference_state(q, k, v, 0.5, base=attnstate.Base.BASE2)
    o_ref, lse_ref = reference_state(q, k, v, 0.5, "base2")
    np.testing.assert_allclose(o, o_ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-6, atol=1e-7)
    with pytest.raises(attnstate.Error, match="check_kernel: argument 'base'.*'e'"):
        attnstate.testing.check_kernel(attention, base="e")


def test_every_base_argument_takes_the_enum():
    b2 = attnstate.Base.BASE2
    a = state()
    assert attnstate.merge_state(a, state(), base=b2).base == b2
    assert attnstate.rebase(a, b2).base == b2
    assert attnstate.sink_state(np.zeros(2, np.float32), 4, 8, base=b2).base == b2
    outs = attnstate.cp_merge_simulated([a, state()], wire_base=b2, out_base=b2)
    assert all(o.base == b2 for o in outs)
    lens = np.array([5], np.int32)
    k = rng.standard_normal((1, 8, 1, 8)).astype(np.float32)
    dec = attnstate.Decode().plan(lens, heads_q=2, heads_kv=1, head_dim=8, dtype="float32")
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    out = dec.run(q, k, k, lens, page_indptr=np.array([0, 1], np.int32),
                  page_indices=np.array([0], np.int32), base=b2)
    assert out.base == b2


# ---- dtypes ----

@pytest.mark.parametrize("spelling", ["float32", np.float32, np.dtype("float32"), "f32"])
def test_dtype_spellings(spelling):
    out = attnstate.merge_state(state(dtype=np.float16), state(), dtype=spelling)
    assert out.o.dtype == np.float32
    lens = np.array([3], np.int32)
    dec = attnstate.Decode().plan(lens, heads_q=2, heads_kv=1, head_dim=8, dtype=spelling,
                                  kv_dtype=spelling)
    assert dec.workspace is None


@pytest.mark.skipif(not __import__("helpers").has_module("torch"), reason="needs torch")
def test_torch_dtype_objects():
    import torch
    out = attnstate.merge_state(state(), state(), dtype=torch.float16)
    assert out.o.dtype == np.float16


def test_bfloat16_and_fp8_types_as_dtypes():
    assert attnstate.merge_state(state(), state(), dtype=ml_dtypes.bfloat16).o.dtype == \
        ml_dtypes.bfloat16
    lv = attnstate.cascade_levels(np.array([32, 32], np.int32), page_size=16, num_pages=3,
                                  page_indptr=np.array([0, 2, 4], np.int32),
                                  page_indices=np.array([0, 1, 0, 2], np.int32),
                                  min_shared_tokens=16)
    by_type = attnstate.decide_cascade(lv, heads_q=2, heads_kv=1, head_dim=8,
                                       kv_dtype=ml_dtypes.float8_e4m3fn)
    by_name = attnstate.decide_cascade(lv, heads_q=2, heads_kv=1, head_dim=8, kv_dtype="e4m3")
    assert by_type.decode_bytes == by_name.decode_bytes


def test_float64_is_refused_naming_the_function_and_argument():
    with pytest.raises(attnstate.Error,
                       match="attnstate.merge_state: argument 'dtype': expected .*got float64"):
        attnstate.merge_state(state(), state(), dtype=np.float64)
    with pytest.raises(attnstate.Error, match="attnstate.merge_state: argument 'a.o': .*float64"):
        attnstate.merge_state(state(dtype=np.float64), state())  # NumPy's default dtype
    for fn, call in [("merge_states", lambda s: attnstate.merge_states(
                         attnstate.State(s.o[:, None], s.lse[:, None], "natural"))),
                     ("merge_states_ragged", lambda s: attnstate.merge_states_ragged(
                         s, np.array([0, 4], np.int32))),
                     ("rebase", lambda s: attnstate.rebase(s, "base2"))]:
        arg = {"merge_states": "states.o", "merge_states_ragged": "rows.o"}.get(fn, "state.o")
        with pytest.raises(attnstate.Error, match=f"attnstate.{fn}: argument '{arg}'"):
            call(state(dtype=np.float64))
    with pytest.raises(attnstate.Error, match="attnstate.Decode.plan: argument 'dtype'"):
        attnstate.Decode().plan(np.array([3], np.int32), heads_q=2, heads_kv=1, head_dim=8,
                                dtype=np.float64)
    with pytest.raises(attnstate.Error, match="attnstate.sink_state: argument 'dtype'"):
        attnstate.sink_state(np.zeros(2, np.float32), 1, 8, dtype="float64")


# ---- cascade levels and decode plans ----

def test_cascade_plan_and_run_take_cascade_levels():
    page_size, heads_q, heads_kv, d = 4, 2, 1, 8
    lens = np.array([11, 13], np.int32)
    indptr, indices = np.array([0, 3, 7], np.int32), np.array([0, 1, 2, 0, 1, 3, 4], np.int32)
    lv = attnstate.cascade_levels(lens, page_size=page_size, num_pages=5, page_indptr=indptr,
                                  page_indices=indices, min_shared_tokens=4)
    assert lv.num_levels == 2
    k = rng.standard_normal((5, page_size, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal(k.shape).astype(np.float32)
    q = rng.standard_normal((2, 1, heads_q, d)).astype(np.float32)[lv.order]
    kw = dict(heads_q=heads_q, heads_kv=heads_kv, head_dim=d, num_pages=5, dtype=np.float32)
    by_object = attnstate.Cascade().plan(lv, **kw)  # batch and page_size from the levels
    by_tuples = attnstate.Cascade().plan(lv.levels, batch=2, page_size=page_size, **kw)
    np.testing.assert_array_equal(by_object.run(q, k, v, lv).o, by_tuples.run(q, k, v,
                                                                              lv.levels).o)
    with pytest.raises(attnstate.Error, match="Cascade.plan: argument 'levels'"):
        attnstate.Cascade().plan(7, batch=2, page_size=4, **kw)
    with pytest.raises(attnstate.Error, match="Cascade.plan: argument 'batch': expected 2"):
        attnstate.Cascade().plan(lv, batch=3, **kw)
    with pytest.raises(attnstate.Error, match="Cascade.plan: argument 'page_size'"):
        attnstate.Cascade().plan(lv.levels, batch=2, **kw)


def test_runs_blame_q_when_it_disagrees_with_the_plan():
    lens = np.array([5, 7], np.int32)
    k = rng.standard_normal((4, 4, 1, 8)).astype(np.float32)
    tables = dict(page_indptr=np.array([0, 2, 4], np.int32),
                  page_indices=np.arange(4, dtype=np.int32))
    dec = attnstate.Decode().plan(lens, heads_q=4, heads_kv=1, head_dim=8, dtype="float32")
    for shape in [(2, 1, 2, 8), (2, 2, 4, 8)]:  # other heads_q, other q_len
        with pytest.raises(attnstate.Error, match="attnstate.Decode.run: argument 'q': expected "
                           r"shape \(batch, 1, 4, 8\)"):
            dec.run(np.zeros(shape, np.float32), k, k, lens, **tables)
    levels, num_pages, _ = shared_prefix_levels(4, [3, 2], 4)
    cas = attnstate.Cascade().plan(levels, batch=2, heads_q=4, heads_kv=1, head_dim=8,
                                   page_size=4, num_pages=num_pages, dtype="float32")
    pool = np.zeros((num_pages, 4, 1, 8), np.float32)
    with pytest.raises(attnstate.Error, match="attnstate.Cascade.run: argument 'q'"):
        cas.run(np.zeros((2, 1, 2, 8), np.float32), pool, pool, levels)


@pytest.mark.parametrize("kw,arg", [
    (dict(q_len=0), "q_len"), (dict(q_len=9), "q_len"), (dict(heads_q=3), "heads_q"),
    (dict(heads_kv=0), "heads_kv"), (dict(head_dim=0), "head_dim"),
    (dict(scale=float("inf")), "scale"), (dict(policy="fixed_count", num_splits=0), "num_splits"),
    (dict(policy="fixed_size", split_size=24), "split_size"),
    (dict(policy="fixed_size", split_size=16, lens=[9000]), "split_size"),
    (dict(lens=[4, -1]), "seq_lens"), (dict(policy="sometimes"), "policy"),
    (dict(window_left=-2), "window_left"),
])
def test_cpu_decode_plan_checks_at_plan_time(kw, arg):
    lens = np.array(kw.pop("lens", [4, 9]), np.int32)
    args = dict(heads_q=4, heads_kv=2, head_dim=8, dtype="float32")
    args.update(kw)
    with pytest.raises(attnstate.Error, match=f"attnstate.Decode.plan: argument '{arg}'"):
        attnstate.Decode().plan(lens, **args)
