"""attnstate.compat.flashinfer: FlashInfer's merge_state / merge_state_in_place / merge_states
calls (argument order, base-2 LSEs, shapes, return conventions, errors in the caller's names)
on NumPy and torch CPU arrays, against a float64 reference. The peers' own cases are in
test_peer_flashinfer_merge.py."""

import numpy as np
import pytest

import attnstate
from attnstate.compat import flashinfer as fi
from peer_merge import (LN2, LSE_TOL, Lib, base2_reference, cpu_libs, reference_merge,
                        tolerance)


@pytest.mark.parametrize("lib", cpu_libs())
@pytest.mark.parametrize("head_dim", [1, 3, 80, 192])
def test_merge_state_returns_new_v_in_v_a_dtype_and_base2_s(lib, head_dim):
    lib = Lib(lib)
    rng = lib.rng(head_dim)
    va = lib.normal(rng, (9, 4, head_dim), "float16")
    vb = lib.normal(rng, (9, 4, head_dim), "float32")
    sa, sb = lib.normal(rng, (9, 4)) * 4, lib.normal(rng, (9, 4)) * 4
    va_in, sa_in = lib.copy(va), lib.copy(sa)
    v, s = fi.merge_state(va, sa, vb, sb)
    assert type(v) is type(va) and v.dtype == va.dtype and tuple(v.shape) == (9, 4, head_dim)
    assert tuple(s.shape) == (9, 4) and str(s.dtype).endswith("float32")
    ref_v, ref_s = base2_reference(lib, [va, vb], [sa, sb])
    lib.close(v, ref_v, *tolerance("float16"), "v")
    lib.close(s, ref_s, *LSE_TOL, "s")
    lib.equal(va, va_in, "v_a untouched")
    lib.equal(sa, sa_in, "s_a untouched")


@pytest.mark.parametrize("lib", cpu_libs())
def test_merge_state_converts_a_non_float32_s_as_flashinfer_does(lib):
    lib = Lib(lib)
    rng = lib.rng(1)
    va, vb = lib.normal(rng, (5, 2, 16)), lib.normal(rng, (5, 2, 16))
    sa, sb = lib.normal(rng, (5, 2), "float16"), lib.normal(rng, (5, 2))
    v, s = fi.merge_state(va, sa, vb, sb)
    ref_v, ref_s = base2_reference(lib, [va, vb], [sa, sb])
    lib.close(v, ref_v, *tolerance("float32"), "v")
    lib.close(s, ref_s, *LSE_TOL, "s")


@pytest.mark.parametrize("lib", cpu_libs())
def test_merge_state_in_place_updates_v_and_s_where_the_mask_says(lib):
    lib = Lib(lib)
    rng = lib.rng(2)
    v0, v_other = lib.normal(rng, (6, 3, 24), "float16"), lib.normal(rng, (6, 3, 24), "float16")
    s0, s_other = lib.normal(rng, (6, 3)), lib.normal(rng, (6, 3))
    ref_v, ref_s = base2_reference(lib, [v0, v_other], [s0, s_other])
    keep = np.array([0, 1, 1, 0, 0, 1], bool)
    for mask in (lib.asarray(~keep), lib.asarray(~keep, "uint8")):
        v, s = lib.copy(v0), lib.copy(s0)
        assert fi.merge_state_in_place(v, s, v_other, s_other, mask) is None
        merged = lib.asarray(np.flatnonzero(~keep))
        kept = lib.asarray(np.flatnonzero(keep))
        lib.close(v[merged], ref_v[merged], *tolerance("float16"), "merged v")
        lib.close(s[merged], ref_s[merged], *LSE_TOL, "merged s")
        lib.equal(v[kept], v0[kept], "kept v")
        lib.equal(s[kept], s0[kept], "kept s")
    v, s = lib.copy(v0), lib.copy(s0)
    fi.merge_state_in_place(v, s, v_other, s_other)  # no mask: every position
    lib.close(v, ref_v, *tolerance("float16"), "v")
    lib.close(s, ref_s, *LSE_TOL, "s")


@pytest.mark.parametrize("lib", cpu_libs())
@pytest.mark.parametrize("stride", [0, 2], ids=["broadcast", "every_other"])
def test_merge_state_in_place_takes_masks_of_any_stride(lib, stride):
    lib = Lib(lib)
    rng = lib.rng(3)
    v0, v_other = lib.normal(rng, (5, 2, 8)), lib.normal(rng, (5, 2, 8))
    s0, s_other = lib.normal(rng, (5, 2)), lib.normal(rng, (5, 2))
    ref_v, ref_s = base2_reference(lib, [v0, v_other], [s0, s_other])
    flags = np.array([1, 0, 0, 1, 1, 0, 1, 0, 0, 1], bool)
    if stride == 0:
        one = lib.asarray(flags[:1])
        mask = np.broadcast_to(one, (5,)) if lib.name == "numpy" else one.expand(5)
        want = np.ones(5, bool)
    else:
        mask = lib.asarray(flags)[::2]
        want = flags[::2]
    v, s = lib.copy(v0), lib.copy(s0)
    fi.merge_state_in_place(v, s, v_other, s_other, mask)
    for i in range(5):
        if want[i]:
            lib.close(v[i], ref_v[i], *tolerance("float32"), f"v[{i}]")
            lib.close(s[i], ref_s[i], *LSE_TOL, f"s[{i}]")
        else:
            lib.equal(v[i], v0[i], f"v[{i}] kept")
            lib.equal(s[i], s0[i], f"s[{i}] kept")


@pytest.mark.parametrize("lib", cpu_libs())
def test_merge_states_merges_the_states_axis(lib):
    lib = Lib(lib)
    rng = lib.rng(4)
    v = lib.normal(rng, (7, 5, 3, 40), "float16")
    s = lib.normal(rng, (7, 5, 3)) * 5
    s[2, 1:] = -float("inf")  # position 2: one state not empty
    out_v, out_s = fi.merge_states(v, s)
    assert out_v.dtype == v.dtype and tuple(out_v.shape) == (7, 3, 40)
    xp = lib.xp
    ref_v, ref_s = reference_merge(xp, xp.moveaxis(lib.f64(v), 1, 0),
                                   xp.moveaxis(lib.f64(s), 1, 0) * LN2)
    lib.close(out_v, ref_v, *tolerance("float16"), "v")
    lib.close(out_s, ref_s / LN2, *LSE_TOL, "s")


def test_errors_name_the_adapter_and_the_callers_argument():
    v = np.zeros((4, 2, 8), np.float32)
    s = np.zeros((4, 2), np.float32)
    with pytest.raises(attnstate.Error, match=r"^attnstate\.compat\.flashinfer\.merge_state: "
                                              r"argument 's_b'") as e:
        fi.merge_state(v, s, v, np.zeros((4, 3), np.float32))
    assert e.value.status == attnstate.Status.INVALID_ARGUMENT
    with pytest.raises(attnstate.Error, match=r"merge_state_in_place: argument 's': expected "
                                              r"dtype float32 \(written in place\), got float16"):
        fi.merge_state_in_place(v, s.astype(np.float16), v, s)
    with pytest.raises(attnstate.Error, match=r"merge_state_in_place: argument 'mask': .*bool"):
        fi.merge_state_in_place(v, s, v, s, np.zeros(4, np.float32))
    with pytest.raises(attnstate.Error, match=r"merge_state_in_place: argument 'v_other[.']"):
        fi.merge_state_in_place(v, s, v[:, :, :4], s)
    with pytest.raises(attnstate.Error, match=r"merge_states: argument 'v': expected 4 dim"):
        fi.merge_states(v, s)
    with pytest.raises(attnstate.Error, match=r"merge_state: argument 's_a': expected a "
                                              r"floating-point dtype"):
        fi.merge_state(v, s.astype(np.int32), v, s)
