"""What a learner reads is printed whole: a stub's "not solved yet" message with its apostrophes
and quotes (a kernel's stub reaches the grader wrapped, and quoted, by Triton), every hint of
lesson 11's catalog to its last word, a wrong dtype named before any value, and no verdict of
PASS inside a failure."""
import ast
import contextlib
import io
import re

import mistakes as M
import pytest
import torch

import utils
from utils import grading

import triton
import triton.language as tl

STUB = "not solved yet: load the token's id and its \"row\" of dout, then add it (about 3 lines)"


def _rejection(check, *args, **kwargs) -> grading.GradingError:
    with pytest.raises(grading.GradingError) as info:
        check(*args, **kwargs)
    return info.value


def _printed(err: grading.GradingError) -> str:
    """What a notebook shows for the error (its short traceback), as one text."""
    return "\n".join(err._short_traceback())


# --------------------------------------------------------------------------------------
# A stub's message, whole
# --------------------------------------------------------------------------------------
def _stub_relu(x):
    raise NotImplementedError(STUB)


@triton.jit
def _stub_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    raise NotImplementedError("not solved yet: load the token's id and its \"row\" of dout, then add it "
                              "(about 3 lines)")


def _stub_triton(x):
    y = torch.empty_like(x)
    _stub_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


def _quoted(x):
    """A stub's error as a wrapper quotes it, with no cause to follow (a GPU compile's error)."""
    raise RuntimeError(f"at 5:4:\n    raise NotImplementedError({STUB!r})\n    ^\nunsupported AST node type: Raise")


@pytest.mark.parametrize("fn", [_stub_relu, _stub_triton, _quoted], ids=["python", "triton-kernel", "quoted"])
def test_a_stub_message_with_an_apostrophe_is_reported_whole(fn):
    err = _rejection(utils.check_relu, fn)
    assert str(err) == STUB
    assert _printed(err).endswith(f"GradingError: {STUB}")


def test_a_stub_in_the_model_is_reported_whole():
    fwd = lambda x: _stub_triton(x)  # noqa: E731  a stub raised inside a kernel, inside autograd
    err = _rejection(utils.check_gpt_op, "gelu", fwd, fwd)
    assert str(err) == STUB


def test_a_stub_a_gpu_compile_refused_is_reported_whole():
    """On a GPU, Triton refuses the ``raise`` in a kernel: its error quotes the statement's first
    line only, and keeps the statement itself (``node``), message continued lines and all."""
    class CompilationError(Exception):
        pass
    source = f"raise NotImplementedError({STUB[:30]!r}\n                          {STUB[30:]!r})"
    err = CompilationError(f"at 3:4:\n    {source.splitlines()[0]}\n    ^\nunsupported AST node type: Raise")
    err.node = ast.parse(source).body[0]
    assert grading.stub_message(err) == STUB
    assert grading.stub_message(RuntimeError("wrapped")) is None


def test_a_wrapped_stub_message_is_whole():
    """``grading.stub_message``, which every grader (lesson 07's and 11's too) reads a stub with."""
    inner = NotImplementedError(STUB)
    outer = RuntimeError(f"the op failed: {inner!r}")
    outer.__cause__ = inner
    assert grading.stub_message(outer) == STUB
    assert grading.stub_message(RuntimeError(f"the op failed: {inner!r}")) == STUB
    assert grading.stub_message(RuntimeError(f"wrapped: {inner!r}")) == STUB


def _stub_texts(source: str) -> list[str]:
    """The messages of the ``raise NotImplementedError("...")`` stubs in a cell."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            arg = node.exc.args[0]
            if isinstance(arg, ast.Constant) and str(arg.value).startswith("not solved yet"):
                out.append(arg.value)
    return out


@pytest.mark.skipif(not utils.SIMULATE, reason="runs lesson 11's exercise notebook in simulation")
def test_lesson_11s_untouched_exercises_print_their_whole_stub_message():
    """The exercise notebook as a learner gets it: each check names the first stub of its
    exercise with its whole message (the TODO's own words, apostrophes included)."""
    import nbformat
    nb = nbformat.read(str(M.ROOT / "exercises" / "11_gpt.ipynb"), as_version=4)
    ns, stubs, seen = {"__name__": "__main__"}, [], []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if not cell.metadata.get("nbgrader", {}).get("grade"):
            stubs += _stub_texts(cell.source)
            with contextlib.redirect_stdout(io.StringIO()):
                M._run_cell(cell.source, ns, f"<exercise 11 cell {i}>")
            continue
        with pytest.raises(grading.GradingError) as info, contextlib.redirect_stdout(io.StringIO()):
            M._run_cell(cell.source, ns, f"<exercise 11 cell {i}>")
        assert stubs, f"cell {i}: a check with no stub before it"
        assert str(info.value) == stubs[0], f"cell {i}: {str(info.value)!r}, the stub says {stubs[0]!r}"
        seen.append(str(info.value))
        stubs = []
    assert len(seen) == 3 and any("'" in s for s in seen)


# --------------------------------------------------------------------------------------
# Lesson 11's catalog: every hint whole, no PASS
# --------------------------------------------------------------------------------------
ENTRIES = [m for m in M.catalog("11_gpt") if m.verdict == "rejected"]


@pytest.mark.skipif(not utils.SIMULATE, reason="grades in simulation")
@pytest.mark.parametrize("m", ENTRIES, ids=[m.name for m in ENTRIES])
def test_every_catalog_message_prints_its_hint_whole(m):
    msg = M.verdict("11_gpt", m).message
    assert msg and "PASS" not in msg, msg
    if msg.startswith("not solved yet"):
        return
    head, _, seed = msg.rpartition("\n(Inputs came from seed ")
    assert re.fullmatch(r"\d+: check_\w+\(fn, seed=\d+\) repeats them\.\)", seed), msg
    hints = [ln for ln in head.splitlines() if ln.startswith("Hint: ")]
    assert len(hints) <= 1, msg
    for hint in hints:
        # a sentence to its end: its quotes and parentheses closed, its last word followed by a stop
        assert re.search(r"[.?!)]$", hint), f"the hint stops mid-sentence: {hint!r}"
        assert hint.count("(") == hint.count(")"), hint
        assert hint.count('"') % 2 == 0 and hint.count("`") % 2 == 0, hint


# --------------------------------------------------------------------------------------
# The dtype, before any value
# --------------------------------------------------------------------------------------
def _relu_bf16(x):
    y = torch.empty_like(x, dtype=torch.bfloat16)
    y.copy_(x.clamp(min=0))
    return y


def test_a_wrong_dtype_is_named_before_the_values():
    err = _rejection(utils.check_relu, _relu_bf16)
    text = str(err)
    assert "the result has dtype torch.bfloat16, expected torch.float32." in text
    assert "8 significant bits (float32 keeps 24)" in text
    assert "wrong" not in text.split("\nHint:")[0]


def test_a_named_output_of_the_wrong_dtype_is_named():
    from utils.topics import cross_entropy as ce

    def half_grad(logits, targets):
        loss = ce.cross_entropy_loss_ref64(logits.cpu(), targets.cpu()).float().to(logits.device)
        return loss, ce.cross_entropy_ref64(logits.cpu(), targets.cpu()).to(logits.device, torch.bfloat16)

    text = str(_rejection(utils.check_cross_entropy, half_grad))
    assert "the gradient has dtype torch.bfloat16, expected torch.float32." in text


def test_a_converted_output_is_still_checked_for_its_dtype():
    """An output with its own conversion (``Output.convert``) gets the dtype check too."""
    g = grading.Grader("check_dtype_probe", lambda x: x.double(), 0)
    case = grading.Case("a 7-element input", (torch.arange(7.0),), torch.arange(7.0).double())
    outputs = lambda c: [grading.Output(grading.RESULT, c.expected, convert=lambda g, v, o: v)]  # noqa: E731
    with pytest.raises(grading.GradingError, match=r"the result has dtype torch\.float64, expected torch\.float32"):
        grading.grade(g, [case], outputs, inputs=("x",))
