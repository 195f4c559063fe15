"""Every grader runs its calls of the learner's function through one grading loop
(``utils.grading.grade``), and ``success``, which prints "correct", refuses a grader whose
calls did not: a new topic's grader cannot leave out the guards, the second run for races,
the check for elements never written, the inputs-unchanged check, the comparison or the
check that a kernel computed the result by forgetting to copy them."""
import pytest
import torch
from grader_kernels import relu_ok
from test_graders import REFERENCE_LAUNCHERS, grade_reference

import utils
from utils import grading


# --------------------------------------------------------------------------------------
# Every grader of the course, on its right launcher
# --------------------------------------------------------------------------------------
def test_the_table_covers_every_grader():
    assert set(utils.topics.CHECKS) <= set(REFERENCE_LAUNCHERS)


@pytest.mark.parametrize("name", sorted(REFERENCE_LAUNCHERS))
def test_every_grader_goes_through_the_loop(name, capsys):
    with grading.graders_made() as made:
        grade_reference(name)
    out = capsys.readouterr().out
    assert out.startswith(f"{name}: ") or out.startswith("check_matmul: "), out  # check_matmul_fp16 is check_matmul
    assert made, f"{name} made no Grader"
    for g in made:
        assert g.looped, f"{name}: the grading loop never ran on its Grader {g.name}"
        assert g.runs, f"{name}: its Grader {g.name} made no call of the launcher"
        outside = [run.case.label for run in g.runs if not run.in_loop]
        assert not outside, f"{name}: calls made outside the grading loop, on {outside}"
        assert g.went_through_loop()


# --------------------------------------------------------------------------------------
# A grader written without the loop is refused
# --------------------------------------------------------------------------------------
def _case():
    x = torch.arange(7.0) - 3.0
    return grading.Case("a 7-element input", (x,), x.clamp(min=0).double())


def handmade(fn, *, seed=None):
    """A grader that calls the function and compares the result itself: no guards, no second
    run, no check of what computed the result."""
    g = grading.Grader("check_handmade", fn, seed)
    case = _case()
    run = g.call(case)
    got = g.output_tensor(run, (7,)).detach().to("cpu", torch.float64)
    if not torch.equal(got, case.expected):
        g.fail("wrong")
    grading.success("check_handmade", [case], 0.0, "one size")


def calls_directly(fn, *, seed=None):
    """A grader that calls the function itself, without the harness's call at all."""
    grading.Grader("check_handmade", fn, seed)
    case = _case()
    fn(case.values[0].to(utils.DEVICE))
    grading.success("check_handmade", [case], 0.0, "one size")


def one_call_outside(fn, *, seed=None):
    """A grader that runs the loop, and one more call of its own outside it."""
    g = grading.Grader("check_handmade", fn, seed)
    case = _case()
    worst = grading.run_cases(g, [case], names=("x",), shape_of=lambda c: c.expected.shape)
    g.call(case)
    grading.success("check_handmade", [case], worst, "one size")


def with_the_loop(fn, *, seed=None):
    """The same grader on the loop: accepted."""
    g = grading.Grader("check_handmade", fn, seed)
    case = _case()
    worst = grading.run_cases(g, [case], names=("x",), shape_of=lambda c: c.expected.shape)
    grading.success("check_handmade", [case], worst, "one size")


@pytest.mark.parametrize("grader", [handmade, calls_directly, one_call_outside])
@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "graded"])
def test_a_grader_without_the_loop_is_refused(grader, wrapped, capsys):
    check = grading.graded(grader) if wrapped else grader
    with pytest.raises(RuntimeError, match=r"^check_handmade: success\(\) refused: .*grading loop"):
        check(relu_ok, seed=1)
    assert "correct" not in capsys.readouterr().out


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "graded"])
def test_the_same_grader_on_the_loop_is_accepted(wrapped, capsys):
    check = grading.graded(with_the_loop) if wrapped else with_the_loop
    check(relu_ok, seed=1)
    assert capsys.readouterr().out == "check_handmade: correct on 1 inputs (one size), max error 0\n"


def test_every_grader_of_a_graded_call_is_asked():
    """A check that makes two Graders of one name (as check_gpt_op does) is refused when either
    of them went around the loop, not only the last one made."""
    def two_graders(fn, *, seed=None):
        handmade_grader = grading.Grader("check_handmade", fn, seed)
        handmade_grader.call(_case())
        g = grading.Grader("check_handmade", fn, seed)
        grading.run_cases(g, [_case()], names=("x",), shape_of=lambda c: c.expected.shape)
        grading.success("check_handmade", [_case()], 0.0, "one size")
    with pytest.raises(RuntimeError, match=r"^check_handmade: success\(\) refused"):
        grading.graded(two_graders)(relu_ok, seed=1)
