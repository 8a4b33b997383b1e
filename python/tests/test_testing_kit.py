"""attnstate.testing.check_kernel on NumPy kernels: the correct one passes, the classic bug
(no max subtraction) is caught with the kit's report."""

import pytest

import attnstate
import attnstate.testing
from numpy_attention import attention, attention_without_max

kit = pytest.mark.skipif(attnstate.testing._T is None, reason="built without the testing kit")


@kit
def test_correct_numpy_kernel_passes():
    summary = attnstate.testing.check_kernel(attention, base="natural", num_tests=40, seed=1)
    assert "PASS" in summary and "FAIL" not in summary


@kit
def test_missing_max_subtraction_is_caught_with_the_report():
    with pytest.raises(AssertionError) as report:
        attnstate.testing.check_kernel(attention_without_max, base="natural", num_tests=40,
                                       seed=1, laws=["large_logits"])
    text = str(report.value)
    assert "large_logits" in text and "seed" in text


@kit
def test_wrong_declared_base_is_caught():
    with pytest.raises(AssertionError, match="declared_base|exactness"):
        attnstate.testing.check_kernel(attention, base="base2", num_tests=20, seed=3,
                                       laws=["declared_base", "exactness"])


@kit
def test_kernel_exceptions_fail_the_law():
    def broken(q, k, v, scale):
        raise ValueError("kernel exploded")
    with pytest.raises(AssertionError, match="kernel exploded"):
        attnstate.testing.check_kernel(broken, base="natural", num_tests=5, laws=["identity"])


@kit
def test_bad_options_name_the_option():
    with pytest.raises(attnstate.Error, match="argument 'base'"):
        attnstate.testing.check_kernel(attention, base=None)
    with pytest.raises(attnstate.Error, match="laws"):
        attnstate.testing.check_kernel(attention, base="natural", laws=["speed"])
    with pytest.raises(attnstate.Error, match="input_dtypes"):
        attnstate.testing.check_kernel(attention, base="natural", input_dtypes=["int8"])
