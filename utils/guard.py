"""Graders that a notebook cannot switch off.

A check cell such as ``utils.check_softmax(softmax_triton)`` is locked in a classroom
(nbgrader), but the cells above it run in the same Python process. This module makes the
cheap ways of passing a check without a right kernel fail in plain words:

* rebinding or deleting a grader, ``utils.check_softmax = lambda *a, **k: None`` (or
  ``del utils.check_softmax``), is refused on the spot, and every later grader call of
  that notebook fails: "utils.check_softmax was replaced in this notebook: no check earns
  points after that";
* at every graded call, the harness (``utils/grading.py``, ``utils/check.py``), every topic's
  references and diagnoses (``utils/topics/*``), lesson 07's grader (``utils/ship.py``),
  the launch recording and torch's comparison functions must be the ones the course
  imported: replacing any of them (``torch.allclose = lambda *a, **k: True``,
  ``utils.topics.softmax.softmax_ref64 = my_kernel``) makes the call fail the same way.

What no check inside the learner's own process can stop: code that rewrites the
interpreter's state below Python (``ctypes``), edits ``utils.__dict__`` and the graders'
closures together, or replaces the whole ``utils`` module in ``sys.modules`` before the check
cell imports it. A classroom that must exclude those runs each submission in a sandbox
and grades from a trusted process (README, "Grading and its limits").
"""
from __future__ import annotations

import importlib
import sys
import types

import torch

#: torch functions the harness compares and reduces with.
_TORCH_FUNCTIONS = ("allclose", "isclose", "equal", "isnan", "isfinite", "isinf", "abs", "where",
                    "any", "all", "maximum", "minimum", "as_tensor", "tensor", "from_numpy")
_TENSOR_METHODS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__abs__",
                   "__sub__", "__getitem__", "allclose", "isclose", "equal", "abs", "any", "all", "isnan",
                   "isfinite", "item", "tolist", "sum", "max", "min", "double", "float", "to", "cpu",
                   "numpy", "view", "eq", "ne", "gt", "lt", "ge", "le", "clone", "copy_")
#: The course's modules whose functions and classes decide a grade.
_COURSE_MODULES = ("utils.grading", "utils.check", "utils.ship", "utils.backends.launches",
                   "utils.topics._spec")

_originals: dict[tuple[str, str], object] = {}
_replaced: list[str] = []  # what was replaced, in the order seen
_installed = False


class GraderReplacedError(AttributeError):
    """Raised where a notebook tries to rebind or delete one of the course's graders."""


def _snapshot_targets():
    """(owner, owner's label, attribute name) of everything whose identity is checked."""
    utils = sys.modules["utils"]
    for name in _TORCH_FUNCTIONS:
        yield torch, "torch", name
    yield torch.testing, "torch.testing", "assert_close"
    for name in _TENSOR_METHODS:
        yield torch.Tensor, "torch.Tensor", name
    modules = [sys.modules[m] for m in _COURSE_MODULES if m in sys.modules]
    modules += [m for n, m in list(sys.modules.items()) if n.startswith("utils.topics.") and m is not None]
    for mod in modules:
        for name, value in list(vars(mod).items()):
            if name.startswith("__"):
                continue
            if isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == mod.__name__:
                yield mod, mod.__name__, name
    for name in _guarded_names(utils):
        yield utils, "utils", name


def _guarded_names(utils_module) -> list[str]:
    return [n for n in vars(utils_module) if n.startswith("check_") or n in ("GradingError", "show_rejection")]


class _GuardedUtils(types.ModuleType):
    """The ``utils`` package, whose graders cannot be rebound or deleted."""

    def __setattr__(self, name, value):
        if _installed and (name, "utils") in _GUARDED_UTILS and value is not _originals.get(("utils", name)):
            _replaced.append(f"utils.{name}")
            raise GraderReplacedError(
                f"utils.{name} is one of the course's graders and cannot be replaced: the check stays "
                f"as the course wrote it, and no check of this notebook earns points after this attempt.")
        super().__setattr__(name, value)

    def __delattr__(self, name):
        if _installed and (name, "utils") in _GUARDED_UTILS:
            _replaced.append(f"utils.{name}")
            raise GraderReplacedError(
                f"utils.{name} is one of the course's graders and cannot be deleted: no check of this "
                f"notebook earns points after this attempt.")
        super().__delattr__(name)


_GUARDED_UTILS: set[tuple[str, str]] = set()


def install() -> None:
    """Record the originals and guard ``utils`` (called once, at the end of ``import utils``)."""
    global _installed
    utils = sys.modules["utils"]
    for owner, label, name in _snapshot_targets():
        _originals[(label, name)] = getattr(owner, name)
        if owner is utils:
            _GUARDED_UTILS.add((name, "utils"))
    utils.__class__ = _GuardedUtils
    _installed = True


def _owner(label: str):
    if label == "torch":
        return torch
    if label == "torch.testing":
        return torch.testing
    if label == "torch.Tensor":
        return torch.Tensor
    return sys.modules.get(label) or importlib.import_module(label)


def replaced() -> list[str]:
    """Everything the course grades with that is no longer what the course imported."""
    found = list(dict.fromkeys(_replaced))
    for (label, name), value in _originals.items():
        owner = _owner(label)
        now = vars(owner).get(name, getattr(owner, name, None)) if label != "torch.Tensor" else getattr(owner, name, None)
        if now is not value:
            what = f"{label}.{name}"
            if what not in found:
                found.append(what)
    return found


def problem(grader: str) -> str | None:
    """What stops ``grader`` from grading (None: nothing): a grader, the harness or torch's
    comparisons replaced in this notebook. Every grader asks before it grades."""
    if not _installed:
        return None
    bad = replaced()
    if not bad:
        return None
    names = ", ".join(bad[:4]) + (", ..." if len(bad) > 4 else "")
    return (f"{grader} cannot grade: {names} {'was' if len(bad) == 1 else 'were'} replaced (or replacing "
            f"{'it' if len(bad) == 1 else 'them'} was tried) in this notebook, so this check earns no points. "
            f"Restart the kernel and run the notebook without replacing the course's graders or torch's "
            f"comparison functions.")
