"""utils.check: the tolerance table, assert_close and the plain-words mismatch report."""
import math

import pytest
import torch

import utils
from utils import check


def test_tolerance_table_covers_the_course_dtypes():
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        tol = utils.TOLERANCES[dt]
        assert set(tol) == {"atol", "rtol"} and tol["atol"] > 0 and tol["rtol"] > 0
    # coarser types get looser tolerances
    assert utils.TOLERANCES[torch.float64]["rtol"] < utils.TOLERANCES[torch.float32]["rtol"] \
        < utils.TOLERANCES[torch.float16]["rtol"] <= utils.TOLERANCES[torch.bfloat16]["rtol"]


def test_float32_tolerance_tells_tanh_gelu_from_erf_gelu():
    x = torch.linspace(-6, 6, 4001, dtype=torch.float32)
    ref = utils.gelu_tanh_ref(x)
    tanh32 = 0.5 * x * (1 + torch.tanh(0.79788456 * (x + 0.044715 * x ** 3)))
    utils.assert_close(tanh32, ref)                             # float32 rounding: accepted
    with pytest.raises(AssertionError):
        utils.assert_close(torch.nn.functional.gelu(x), ref)    # erf GELU: rejected


def test_assert_close_passes_and_fails_with_a_diagnosis():
    ref = torch.arange(2000, dtype=torch.float64)
    utils.assert_close(ref.float(), ref)
    bad = ref.float().clone()
    bad[1024:1823] = 0
    with pytest.raises(AssertionError) as info:
        utils.assert_close(bad, ref, what="y")
    msg = str(info.value)
    assert "799 of 2000 elements of the y are wrong: elements 1024..1822." in msg
    assert "y[1024] = 0, expected 1024" in msg


def test_assert_close_shape_and_type():
    with pytest.raises(AssertionError, match="shape"):
        utils.assert_close(torch.zeros(3), torch.zeros(4, dtype=torch.float64))
    with pytest.raises(AssertionError, match="torch.Tensor"):
        utils.assert_close([1.0], torch.zeros(1))


def test_nan_and_inf_handling():
    e = torch.tensor([1.0, math.inf, math.nan], dtype=torch.float64)
    utils.assert_close(torch.tensor([1.0, math.inf, math.nan]), e)
    with pytest.raises(AssertionError):
        utils.assert_close(torch.tensor([math.nan, math.inf, math.nan]), e)
    with pytest.raises(AssertionError):
        utils.assert_close(torch.tensor([1.0, -math.inf, math.nan]), e)


def test_max_abs_err():
    assert utils.max_abs_err(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])) == 0.5
    assert utils.max_abs_err(torch.tensor([math.nan]), torch.tensor([1.0])) == math.inf
    assert utils.max_abs_err(torch.tensor([math.nan]), torch.tensor([math.nan])) == 0.0
    assert utils.max_abs_err(torch.zeros(0), torch.zeros(0)) == 0.0


def test_index_ranges_and_words():
    m = torch.zeros(20, dtype=torch.bool)
    m[0] = m[5:8] = m[19] = True
    assert check.index_ranges(m) == [(0, 0), (5, 7), (19, 19)]
    assert check.format_ranges(check.index_ranges(m)) == "elements 0, 5..7 and 19"
    assert check.format_ranges([(3, 3)]) == "element 3"
    assert "and 2 more ranges" in check.format_ranges([(i, i) for i in range(0, 12, 2)])


def test_describe_positions_2d():
    m = torch.zeros(5, 8, dtype=torch.bool)
    m[2:] = True
    assert check.describe_positions(m) == "rows 2..4 (all 8 columns)"
    m = torch.zeros(5, 8, dtype=torch.bool)
    m[:, 6:] = True
    assert check.describe_positions(m) == "columns 6..7 of every row"
    m = torch.zeros(5, 8, dtype=torch.bool)
    m[1:3, 4:] = True
    assert check.describe_positions(m) == "columns 4..7 of rows 1..2"


def test_describe_mismatch_is_empty_when_close():
    a = torch.ones(10)
    assert utils.describe_mismatch(a, a.double()) == ""


def test_describe_mismatch_of_a_scalar():
    msg = utils.describe_mismatch(torch.tensor(3.0), torch.tensor(4.0, dtype=torch.float64))
    assert msg.startswith("the result is wrong: got 3, expected 4")


def test_tolerance_lookup():
    assert check.tolerance(torch.float32) == utils.TOLERANCES[torch.float32]
    assert check.tolerance(torch.int32) == dict(atol=0.0, rtol=0.0)
    check.tolerance(torch.float32)["atol"] = 1.0          # a copy: the table stays as it is
    assert utils.TOLERANCES[torch.float32]["atol"] != 1.0
