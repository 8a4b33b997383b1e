"""Bad input from Python raises attnstate.Error naming the argument, never a crash."""

import numpy as np
import pytest

import attnstate


def st(tokens=4, heads=2, d=8, dtype=np.float32, base="natural"):
    return attnstate.State(np.zeros((tokens, heads, d), dtype),
                           np.zeros((tokens, heads), np.float32), base)


def raises(match, status=attnstate.Status.INVALID_ARGUMENT):
    class Ctx:
        def __enter__(self):
            self.ctx = pytest.raises(attnstate.Error, match=match)
            self.info = self.ctx.__enter__()

        def __exit__(self, *exc):
            r = self.ctx.__exit__(*exc)
            assert self.info.value.status == status
            return r
    return Ctx()


def test_missing_or_bad_base():
    with raises("argument 'base'"):
        attnstate.State(np.zeros((1, 1, 4), np.float32), np.zeros((1, 1), np.float32))
    with raises("argument 'base'.*\"e\""):
        st(base="e")
    with raises("attnstate.rebase: argument 'base'"):
        attnstate.rebase(st())


def test_wrong_dtype():
    with raises("argument 'a.o': expected dtype float32, float16, bfloat16, float8_e4m3fn or "
                "float8_e5m2, got int32"):
        attnstate.merge_state(st(dtype=np.int32), st())
    bad = attnstate.State(np.zeros((4, 2, 8), np.float32), np.zeros((4, 2), np.float64), "natural")
    with raises("argument 'b.lse': expected dtype float32, got float64"):
        attnstate.merge_state(st(), bad)
    with raises("argument 'dtype'"):
        attnstate.merge_state(st(), st(), dtype="int8")


def test_non_contiguous_last_dimension():
    o = np.zeros((4, 2, 16), np.float32)[:, :, ::2]
    s = attnstate.State(o, np.zeros((4, 2), np.float32), "natural")
    with raises("argument 'b.o': expected a contiguous last dimension"):
        attnstate.merge_state(st(), s)


def test_mismatched_shapes():
    with raises("argument 'b.heads'"):
        attnstate.merge_state(st(), st(heads=3))
    s = attnstate.State(np.zeros((4, 2, 8), np.float32), np.zeros((4, 3), np.float32), "natural")
    with raises("argument 'a.lse': expected shape \\(4, 2\\)"):
        attnstate.merge_state(s, st())
    with raises("argument 'a.o': expected 3 dimensions"):
        flat = attnstate.State(np.zeros((4, 8), np.float32), np.zeros((4, 2), np.float32),
                               "natural")
        attnstate.merge_state(flat, st())
    with raises("argument 'mask'"):
        attnstate.merge_state_(st(), st(), mask=np.ones(3, np.uint8))
    with raises("argument 'indptr'"):
        attnstate.merge_states_ragged(st(), np.array([0, 1], np.int64), out=st(tokens=1))


def test_host_arrays_with_a_stream():
    with raises("argument 'stream': expected None for host arrays"):
        attnstate.merge_state(st(), st(), stream=0)


def test_not_an_array_or_not_a_state():
    with raises("argument 'a': expected an attnstate.State"):
        attnstate.merge_state((np.zeros(1), np.zeros(1)), st())
    with raises("argument 'b.o': expected an array speaking DLPack"):
        attnstate.merge_state(st(), attnstate.State("not an array", np.zeros((4, 2), np.float32),
                                                    "natural"))
    with raises("argument 'order'"):
        attnstate.merge_states(attnstate.State(np.zeros((1, 2, 1, 4), np.float32),
                                               np.zeros((1, 2, 1), np.float32), "natural"),
                               order="rows")


def test_error_is_a_runtime_error_with_a_status():
    assert issubclass(attnstate.Error, RuntimeError)
    try:
        attnstate.merge_state(st(), st(heads=1))
    except attnstate.Error as e:
        assert e.status == attnstate.Status.INVALID_ARGUMENT
        assert str(e).startswith("attnstate::cpu::merge_state: argument")
