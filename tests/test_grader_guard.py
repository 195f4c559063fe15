"""A solution cell cannot switch a grader off: every cheap trick earns no points, with a
message that names what was replaced (utils/guard.py).

Each trick is tried against a wrong kernel (one that would pass if the trick worked) and the
check must fail with "... was replaced in this notebook: this check earns no points"; then
the trick is undone and an honest kernel passes again, so no test leaks into the next.
"""
from __future__ import annotations

import builtins
import contextlib
import sys
import types

import pytest
import torch

import utils
from utils import guard

triton = pytest.importorskip("triton")
from copy_kernels import copy_tl_kernel  # noqa: E402
from grader_kernels import relu_ok as relu  # noqa: E402  (the honest launcher)

REPLACED = "in this notebook: this check earns no points"


def wrong(x):
    """A launcher whose kernel forgets the max(x, 0): the check must fail."""
    out = torch.empty_like(x)
    copy_tl_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK_SIZE=1024)
    return out


def _noop(*args, **kwargs):
    return None


@pytest.fixture
def restore():
    """Undo list for tricks that monkeypatch cannot undo (writes into __dict__, __code__ swaps);
    afterwards nothing may be left replaced, or every later check in this worker would fail."""
    undo = []
    recorded = dict(guard._State.recorded)
    yield undo
    for fn in reversed(undo):
        fn()
    guard._State.recorded.clear()
    guard._State.recorded.update(recorded)
    assert guard.tampering() == [], "a trick was left in place"
    utils.check_relu(relu)


def _fails_with(what, launcher=wrong, check=None):
    check = check or (lambda f: utils.check_relu(f))
    with pytest.raises(utils.GradingError) as e:
        check(launcher)
    msg = str(e.value)
    assert REPLACED in msg, msg
    assert what in msg, msg
    return msg


def test_honest_and_wrong_kernels_without_tricks():
    assert guard.is_installed() and isinstance(utils, guard.GuardedModule)
    assert guard.tampering() == []
    utils.check_relu(relu)
    with pytest.raises(utils.GradingError) as e:
        utils.check_relu(wrong)
    assert REPLACED not in str(e.value) and "negative" in str(e.value)


def test_what_torch_and_python_cache_on_their_own_is_no_tampering():
    # copying or pickling a tensor makes copyreg cache __slotnames__ on torch.Tensor, and the
    # launch recording's dispatch mode may import torch._dynamo, which wraps torch.manual_seed
    import copy
    import pickle
    if "__slotnames__" in vars(torch.Tensor):
        type.__delattr__(torch.Tensor, "__slotnames__")
    copy.deepcopy(torch.ones(3))
    pickle.dumps(torch.ones(3))
    __import__("torch._dynamo")
    assert guard.tampering() == []
    utils.check_relu(relu)


# --- the grader itself, rebound ---------------------------------------------------------
def test_rebinding_a_grader_in_utils(monkeypatch, capsys):
    monkeypatch.setattr(utils, "check_relu", lambda *a, **k: None)   # `utils.check_relu = ...`
    assert "utils.check_relu was replaced" in capsys.readouterr().err
    msg = _fails_with("utils.check_relu was replaced", launcher=relu)  # even an honest kernel
    assert "restart the kernel" in msg
    from utils import check_relu  # a fresh import sees it too
    with pytest.raises(utils.GradingError, match="utils.check_relu was replaced"):
        check_relu(relu)
    # the other graders are not affected
    assert utils.check_relu_backward is utils.topics.relu.check_relu_backward
    assert guard.tampering() == []


def test_writing_into_the_module_dict(restore):
    orig = utils.check_relu
    vars(utils)["check_relu"] = _noop
    restore.append(lambda: vars(utils).__setitem__("check_relu", orig))
    _fails_with("utils.check_relu was replaced")
    types.ModuleType.__setattr__(utils, "check_relu", _noop)         # the base class's setattr
    _fails_with("utils.check_relu was replaced")


def test_deleting_a_grader(restore):
    orig = utils.check_relu
    del utils.check_relu
    restore.append(lambda: setattr(utils, "check_relu", orig))
    _fails_with("utils.check_relu was replaced")


def test_the_same_grader_through_its_topic_module(restore):
    import utils.topics.relu as topic
    orig = topic.check_relu
    topic.check_relu = _noop
    restore.append(lambda: setattr(topic, "check_relu", orig))
    _fails_with("utils.topics.relu.check_relu was replaced", check=lambda f: topic.check_relu(f))
    vars(topic)["check_relu"] = _noop                                  # past the module's setattr
    _fails_with("utils.topics.relu.check_relu was replaced", check=lambda f: topic.check_relu(f))
    # the package's grader is the original, but a topic module was tampered with: no points
    _fails_with("utils.topics.relu.check_relu was replaced", launcher=relu)


def test_the_module_type_cannot_be_taken_off(restore):
    utils.__class__ = types.ModuleType                                 # refused, and remembered
    assert type(utils) is guard.GuardedModule
    _fails_with("the type of module utils was changed", launcher=relu)


def test_a_module_swapped_in_sys_modules(restore, monkeypatch):
    monkeypatch.setitem(sys.modules, "utils.grading", types.ModuleType("utils.grading"))
    _fails_with("sys.modules['utils.grading'] was replaced")


# --- the harness --------------------------------------------------------------------------
def _code_swap(fn, restore):
    code = fn.__code__
    fn.__code__ = (lambda *a, **k: None).__code__
    restore.append(lambda: setattr(fn, "__code__", code))


HARNESS_TRICKS = {
    "utils.grading.Grader.fail": lambda mp, r: mp.setattr(utils.grading.Grader, "fail", _noop),
    "utils.grading.run_cases": lambda mp, r: mp.setattr(utils.grading, "run_cases", lambda *a, **k: 0.0),
    "utils.grading.grade": lambda mp, r: mp.setattr(utils.grading, "grade", lambda *a, **k: 0.0),
    "utils.topics.relu.run_cases": lambda mp, r: mp.setattr(utils.topics.relu, "run_cases", lambda *a, **k: 0.0),
    "utils.topics.relu.same": lambda mp, r: mp.setattr(utils.topics.relu, "same", lambda *a, **k: True),
    "utils.check.mismatch_mask": lambda mp, r: mp.setattr(
        utils.check, "mismatch_mask", lambda a, e, **k: torch.zeros(torch.as_tensor(e).shape, dtype=torch.bool)),
    "utils.grading.Grader.check_unwritten": lambda mp, r: _code_swap(utils.grading.Grader.check_unwritten, r),
    "utils.check.describe_mismatch": lambda mp, r: _code_swap(utils.check.describe_mismatch, r),
    "utils.check.TOLERANCES": lambda mp, r: mp.setitem(utils.check.TOLERANCES[torch.float32], "atol", 1e9),
    "utils.SIZES": lambda mp, r: mp.setattr(utils.SIZES, "grader_sizes", [1]),
    "utils.topics.relu.relu_ref64": lambda mp, r: mp.setattr(utils.topics.relu, "relu_ref64", lambda x: x.double()),
}


@pytest.mark.parametrize("what", list(HARNESS_TRICKS))
def test_the_harness_replaced(what, monkeypatch, restore):
    HARNESS_TRICKS[what](monkeypatch, restore)
    _fails_with(what)
    monkeypatch.undo()


def test_a_builtin_hidden_in_a_topic_module(restore):
    vars(utils.topics.relu)["bool"] = lambda x: False
    restore.append(lambda: vars(utils.topics.relu).pop("bool"))
    _fails_with("utils.topics.relu.bool was added")


# --- torch and builtins -----------------------------------------------------------------
TORCH_TRICKS = {
    "torch.allclose": (torch, "allclose", lambda *a, **k: True),
    "torch.equal": (torch, "equal", lambda *a, **k: True),
    "torch.isclose": (torch, "isclose", lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)),
    "torch.testing.assert_close": (torch.testing, "assert_close", _noop),
    "torch.isnan": (torch, "isnan", lambda t: torch.zeros_like(t, dtype=torch.bool)),
    "torch.relu": (torch, "relu", lambda t: t),
    "torch.Tensor.__eq__": (torch.Tensor, "__eq__", lambda a, b: torch.ones(a.shape, dtype=torch.bool)),
    "torch.Tensor.__le__": (torch.Tensor, "__le__", lambda a, b: torch.ones(a.shape, dtype=torch.bool)),
    "torch.Tensor.any": (torch.Tensor, "any", lambda t, *a, **k: torch.tensor(False)),
    "torch.Tensor.abs": (torch.Tensor, "abs", lambda t: t * 0),
    "torch.nn.functional.relu": (torch.nn.functional, "relu", lambda t, *a, **k: t),
    "builtins.bool": (builtins, "bool", lambda *a: False),
    "builtins.max": (builtins, "max", lambda *a, **k: 0.0),
}


@pytest.mark.parametrize("what", list(TORCH_TRICKS))
def test_torch_and_builtins_replaced(what, monkeypatch):
    owner, name, fake = TORCH_TRICKS[what]
    orig = getattr(owner, name)
    try:
        setattr(owner, name, fake)
        # the grader's own machinery may trip over the fake first: any failure is fine, a pass is not
        with pytest.raises(BaseException) as e:
            utils.check_relu(wrong)
    finally:
        setattr(owner, name, orig)
    assert isinstance(e.value, utils.GradingError) and what in str(e.value), str(e.value)
    assert guard.tampering() == []


def test_the_le_trick_would_work_without_the_guard(monkeypatch):
    """The trick is real: with `Tensor.__le__` replaced, the comparison finds no wrong element."""
    mismatch_mask = vars(utils.check)["mismatch_mask"]   # the function itself, past the guard
    fake = TORCH_TRICKS["torch.Tensor.__le__"][2]
    monkeypatch.setattr(torch.Tensor, "__le__", fake)
    assert not bool(mismatch_mask(torch.zeros(3), torch.ones(3), atol=0, rtol=0).any())
    with pytest.raises(utils.GradingError, match="torch.Tensor.__le__ was replaced"):
        utils.check.mismatch_mask(torch.zeros(3), torch.ones(3), atol=0, rtol=0)
    monkeypatch.undo()
    assert bool(mismatch_mask(torch.zeros(3), torch.ones(3), atol=0, rtol=0).all())


@contextlib.contextmanager
def tracing():
    """A trace function, as a debugger sets one (or a tracer that could rewrite a grader's variables)."""
    sys.settrace(lambda *a: None)
    try:
        yield
    finally:
        sys.settrace(None)


def test_a_tracer_that_could_rewrite_the_graders_variables():
    with tracing(), pytest.raises(utils.GradingError, match="sys.settrace"):
        utils.check_relu(wrong)
    assert guard.tampering() == []


# --- during the graded call -------------------------------------------------------------
def test_a_launcher_that_replaces_the_grader_while_it_runs(restore):
    orig = utils.grading.Grader.fail
    restore.append(lambda: setattr(utils.grading.Grader, "fail", orig))

    def sneaky(x):
        utils.grading.Grader.fail = _noop
        return wrong(x)
    _fails_with("utils.grading.Grader.fail was replaced", launcher=sneaky)


def test_assert_close_in_a_check_cell_is_guarded(monkeypatch):
    monkeypatch.setattr(utils, "assert_close", _noop)
    with pytest.raises(utils.GradingError, match="utils.assert_close was replaced"):
        utils.assert_close(torch.zeros(3), torch.ones(3))
    monkeypatch.undo()
    monkeypatch.setattr(torch, "isinf", lambda t: torch.zeros_like(t, dtype=torch.bool))
    with pytest.raises(utils.GradingError, match="torch.isinf was replaced"):
        utils.assert_close(torch.zeros(3), torch.ones(3))


# --- a notebook's namespace ---------------------------------------------------------------
def test_a_check_cell_gets_the_real_utils_back(restore):
    fake = types.SimpleNamespace(check_relu=_noop)
    ns = {"utils": fake, "check_relu": _noop, "relu": relu}
    info = types.SimpleNamespace(raw_cell="# Check your answer\nutils.check_relu(relu)\n")
    guard._pre_run_cell(info)                      # no IPython here: nothing to look up, nothing done
    guard.check_cell_names(ns)                     # what the hook does before a check cell
    assert ns["utils"] is utils and ns["relu"] is relu
    with pytest.raises(utils.GradingError, match="check_relu was replaced"):
        ns["check_relu"](relu)
    _fails_with("the name `utils` was rebound", launcher=relu)


def test_a_deleted_utils_comes_back_and_a_stand_in_in_builtins_is_removed(restore):
    import builtins
    restore.append(lambda: vars(builtins).pop("utils", None))
    builtins.utils = types.SimpleNamespace(check_relu=_noop)  # what `del utils` would let a check cell find
    ns = {"relu": relu}
    guard.check_cell_names(ns)
    assert ns["utils"] is utils and "utils" not in vars(builtins)
    _fails_with("builtins.utils was set", launcher=relu)


def test_the_ipython_hook_runs_before_check_cells_only(restore):
    ip_mod = pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    try:
        assert guard._install_ipython_hook(shell)
        shell.user_ns["utils"] = utils
        shell.run_cell("utils = None  # a solution cell")
        assert shell.user_ns["utils"] is None          # not a check cell: left alone
        shell.run_cell("# Check your answer\nseen = utils")
        assert shell.user_ns["seen"] is utils
        _fails_with("the name `utils` was rebound", launcher=relu)
    finally:
        shell.events.unregister("pre_run_cell", guard._pre_run_cell)
        InteractiveShell.clear_instance()
    assert ip_mod


def test_a_tensor_subclass_that_lies_to_torch():
    class Liar(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types_, args=(), kwargs=None):
            return super().__torch_function__(func, types_, args, kwargs or {})

    def liar(x):
        return wrong(x).as_subclass(Liar)
    with pytest.raises(utils.GradingError, match="a subclass of torch.Tensor") as e:
        utils.check_relu(liar)
    assert "this check earns no points" in str(e.value)


def test_the_guard_switched_off_is_put_back_before_a_check_cell(restore):
    orig = utils.check_relu
    restore.append(lambda: vars(utils).__setitem__("check_relu", orig))
    restore.append(lambda: type.__setattr__(guard.GuardedModule, "__getattribute__",
                                            guard._State.globals_["utils.guard"]["GuardedModule"][2]
                                            ["__getattribute__"][1]))
    type.__setattr__(guard.GuardedModule, "__getattribute__", types.ModuleType.__getattribute__)
    vars(utils)["check_relu"] = _noop
    assert utils.check_relu is _noop                 # the trick works, until the next check cell
    guard.check_cell_names({"utils": utils})         # what runs before every check cell in IPython
    _fails_with("utils.check_relu was replaced", launcher=relu)
    _fails_with("utils.guard.GuardedModule.__getattribute__ was replaced", launcher=relu,
                check=lambda f: utils.topics.relu.check_relu(f))


def test_a_debugger_is_named(restore):
    with tracing(), pytest.raises(utils.GradingError, match="Turn the debugger off"):
        utils.check_relu(relu)


def test_every_module_a_grader_relies_on_is_guarded():
    """A grader moved to a new module, or a new module of the harness, must be guarded too."""
    import inspect

    from utils.guard import PROTECTED_MODULES
    graders = {n: f for n, f in vars(utils).items() if n.startswith("check_") and inspect.isfunction(f)
               and n != "check_input"}
    assert "check_relu" in graders and "check_softmax" in graders
    needed = {f.__module__ for f in graders.values()} | {utils.GradingError.__module__}
    unguarded = sorted(m for m in needed
                       if not any(m == p or m.startswith(p + ".") for p in PROTECTED_MODULES))
    assert not unguarded, (f"add {unguarded} to utils.guard.PROTECTED_MODULES (and to UNGUARDED the "
                           "globals such a module changes while a grader runs)")
    for m in needed:
        assert type(sys.modules[m]) is guard.GuardedModule, m
