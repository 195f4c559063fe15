"""Graders that a notebook cannot quietly switch off.

A grader runs in the same Python process as the code it grades, so a solution cell could
replace it: ``utils.check_softmax = lambda *a, **k: None`` would make the check cell below it
pass. ``import utils`` installs this guard, and then

* a grader replaced from a notebook (``utils.check_x = ...``, ``setattr``, a write into
  ``utils.__dict__``, ``del``, the same graders reached through their topic module
  ``utils.topics.<topic>``) is not called: calling it raises ``GradingError("utils.check_x was
  replaced in this notebook: this check earns no points")``;
* every graded call checks, before the learner's function runs and after each of its runs,
  that the grading harness (``utils.grading``, ``utils.check``, the topic modules: their
  functions, their code, their classes' methods, tables such as ``TOLERANCES`` and
  ``utils.SIZES``), torch's functions (``torch.allclose``, ``torch.equal``, ``torch.isclose``,
  ``torch.testing.assert_close``, ``torch.isnan``, the ``torch.Tensor`` methods and operators
  such as ``__eq__`` and ``__le__``, ``torch.nn.functional``, ...), the builtins the harness
  uses (``bool``, ``isinstance``, ...) and ``sys.modules``' entries for the course's modules
  are the ones ``import utils`` found. Anything replaced fails the check, and names what was
  replaced;
* in a notebook (IPython), before each check cell (a cell that starts with
  ``# Check your answer``) the name ``utils`` and grader names in the notebook's namespace
  are checked, and put back if a cell rebound them (the check then fails, and says why).

This stops the cheap tricks, not a determined attacker: code in the same process can always
reach the grader's memory (see README, "Grading and its limits"). For a classroom, grade with
``python -m utils.autograde``, which runs each submission in a sandbox.
"""
from __future__ import annotations

import builtins
import sys
import types

__all__ = ["GuardedModule", "install", "verify", "tampering", "is_installed"]

#: Modules whose every global is part of a verdict (prefix match for the topic modules): their
#: functions (with their code), classes (with their methods) and tables named in capitals
#: (``TOLERANCES``) must stay as ``import utils`` found them. A module that graders start to
#: rely on belongs here (tests/test_grader_guard.py checks the modules that define graders).
PROTECTED_MODULES = ("utils.guard", "utils.check", "utils.grading", "utils.ship", "utils.topics",
                     "runtime.backends.launches")
#: Globals of protected modules that tests replace on purpose and that cannot turn a wrong
#: result into a pass: ``SIMULATE`` decides how a missing profiler on a GPU is reported and how
#: many cases run twice.
UNGUARDED = {"utils.grading": {"SIMULATE"},
             "runtime.backends.launches": {"_ACTIVE"},  # the recordings running now (one per graded call)
             "utils.guard": {"_State"}}  # the guard's own state: checked apart, see _STATE_KEYS
#: torch functions the harness replaces itself while the learner's function runs (poisoned
#: allocations): checked by the harness, not here.
_TORCH_PATCHED_BY_HARNESS = {"empty", "empty_like", "empty_strided"}
#: torch functions torch rebinds itself on first use: ``import torch._dynamo`` (which the launch
#: recording's dispatch mode may trigger) wraps ``torch.manual_seed``. No grader draws from
#: torch's global generator (each uses its own ``torch.Generator``).
_TORCH_PATCHED_BY_TORCH = {"manual_seed"}
_TENSOR_PATCHED_BY_HARNESS = {"new_empty"}
#: torch's submodules whose public functions are checked along with torch's own.
_TORCH_SUBMODULES = ("testing", "nn.functional", "linalg", "special", "autograd", "fft")
#: The builtins the harness and the references rely on.
_BUILTINS = ("bool", "int", "float", "complex", "str", "repr", "len", "abs", "min", "max", "sum",
             "any", "all", "range", "enumerate", "zip", "map", "filter", "sorted", "reversed",
             "isinstance", "issubclass", "callable", "getattr", "hasattr", "setattr", "type",
             "id", "iter", "next", "tuple", "list", "dict", "set", "frozenset", "round", "divmod",
             "pow", "hash", "object", "super", "property", "staticmethod", "classmethod",
             "__import__", "Exception", "BaseException", "AssertionError", "NotImplementedError",
             "AttributeError", "TypeError", "ValueError", "RuntimeError", "IndexError", "KeyError")
CHECK_CELL_HEADER = "# Check your answer"


class _State:
    installed = False
    utils = None                    # the real ``utils`` package
    entries: dict = {}              # module name -> {grader name: original function}
    entry_names: frozenset = frozenset()
    globals_: dict = {}             # module name -> {name: (value, frozen details)}
    modules: dict = {}              # module name -> module object
    torch: list = []                # (label, owner, name, original)
    tensor = (None, {})             # torch.Tensor and its own __dict__
    objects: list = []              # (label, object, frozen vars)
    trace = (None, None)            # sys.gettrace(), sys.getprofile() at install
    recorded: dict = {}             # what a cell did that no value comparison shows, in order
    error = None                    # utils.grading.GradingError
    frozen = None                   # the attributes above (less ``recorded``) as installed


_STATE_KEYS = ("installed", "utils", "error", "entries", "entry_names", "globals_", "modules", "torch", "tensor",
               "objects", "trace")


_MISSING = object()


# --------------------------------------------------------------------------------------
# What "unchanged" means
# --------------------------------------------------------------------------------------
def _freeze(value, depth=0):
    """A copy of a table's contents to compare with later: containers are copied (to a few
    levels), everything else is kept by identity."""
    if depth < 4:
        if isinstance(value, dict):
            return ("dict", {k: _freeze(v, depth + 1) for k, v in value.items()})
        if isinstance(value, (list, tuple, set, frozenset)):
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
            return (type(value).__name__, [_freeze(v, depth + 1) for v in items])
        if isinstance(value, types.SimpleNamespace):
            return ("ns", {k: _freeze(v, depth + 1) for k, v in vars(value).items()})
    return ("id", value)


def _same(value, frozen) -> bool:
    kind, data = frozen
    if kind == "id":
        return value is data
    if kind == "dict":
        return (type(value) is dict and value.keys() == data.keys()
                and all(_same(value[k], f) for k, f in data.items()))
    if kind == "ns":
        return (isinstance(value, types.SimpleNamespace) and vars(value).keys() == data.keys()
                and all(_same(vars(value)[k], f) for k, f in data.items()))
    if type(value).__name__ != kind:
        return False
    items = sorted(value, key=repr) if kind in ("set", "frozenset") else value
    return len(items) == len(data) and all(_same(v, f) for v, f in zip(items, data))


def _function_parts(fn):
    """What a cell could swap inside a function object without rebinding it."""
    return (fn.__code__, fn.__defaults__, fn.__kwdefaults__,
            tuple(id(c.cell_contents) if _cell_full(c) else None for c in (fn.__closure__ or ())))


def _cell_full(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def _is_constant_name(name: str) -> bool:
    """``TOLERANCES``, ``_ORIG``: a table named in capitals is a constant, and its contents are
    checked; a lower-case one (a cache, a record filled while a grader runs) only by identity."""
    core = name.strip("_")
    return bool(core) and core.upper() == core and any(c.isalpha() for c in core)


def _describe_value(value, constant=True):
    """(identity, parts to compare) for one global or class attribute."""
    if isinstance(value, types.FunctionType):
        return ("fn", value, _function_parts(value))
    if isinstance(value, (staticmethod, classmethod)) and isinstance(value.__func__, types.FunctionType):
        return ("fn", value, _function_parts(value.__func__))
    if isinstance(value, property):
        return ("prop", value, tuple(_function_parts(f) if isinstance(f, types.FunctionType) else f
                                     for f in (value.fget, value.fset, value.fdel)))
    if isinstance(value, type) and getattr(value, "__module__", "").startswith(("utils", "runtime")):
        return ("class", value, {k: _describe_value(v, _is_constant_name(k)) for k, v in vars(value).items()
                                 if k not in ("__dict__", "__weakref__", "__doc__")}, value.__bases__)
    if isinstance(value, (dict, list, tuple, set, frozenset, types.SimpleNamespace)) and constant:
        return ("table", value, _freeze(value))
    return ("id", value)


def _changed(value, described) -> bool:
    kind, orig = described[0], described[1]
    if value is not orig:
        return True
    if kind == "fn":
        fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        return _function_parts(fn) != described[2]
    if kind == "prop":
        return tuple(_function_parts(f) if isinstance(f, types.FunctionType) else f
                     for f in (value.fget, value.fset, value.fdel)) != described[2]
    if kind == "class":
        attrs = {k: v for k, v in vars(value).items() if k not in ("__dict__", "__weakref__", "__doc__")}
        if attrs.keys() != described[2].keys() or value.__bases__ != described[3]:
            return True
        return any(_changed(attrs[k], d) for k, d in described[2].items())
    if kind == "table":
        return not _same(value, described[2])
    return False


def _changed_class_attr(value, described) -> str | None:
    """The first attribute of a class that changed (for the message)."""
    attrs = {k: v for k, v in vars(value).items() if k not in ("__dict__", "__weakref__", "__doc__")}
    for k in sorted(set(attrs) | set(described[2])):
        if k not in attrs or k not in described[2] or _changed(attrs[k], described[2][k]):
            return k
    return None


# --------------------------------------------------------------------------------------
# Replaced graders
# --------------------------------------------------------------------------------------
class _Replaced:
    """What stands in for a grader that a notebook replaced: calling it fails the check."""

    def __init__(self, qualname: str):
        self.qualname = qualname
        self.__name__ = qualname.rsplit(".", 1)[-1]

    def __call__(self, *args, **kwargs):
        raise _grading_error()(f"{self.qualname} was replaced in this notebook: this check earns no points. "
                           "Leave the course's graders as they are (restart the kernel to get them back).")

    def __repr__(self):
        return f"<{self.qualname}, replaced in this notebook>"


class GuardedModule(types.ModuleType):
    """A module whose graders cannot be rebound: ``import utils`` gives the course's modules
    this type. Rebinding a grader leaves a stand-in that fails the check; every other name
    behaves as in any module (``monkeypatch`` in tests works as usual)."""

    def __getattribute__(self, name):
        value = super().__getattribute__(name)
        if name not in _State.entry_names:
            return value
        modname = types.ModuleType.__getattribute__(self, "__name__")
        orig = _State.entries.get(modname, {}).get(name)
        if orig is None or isinstance(value, _Replaced) or modname == __name__:
            return value if orig is None or value is orig else _Replaced(f"{modname}.{name}")
        if value is not orig:                      # written into the module's __dict__ directly
            return _Replaced(f"{modname}.{name}")
        problems = tampering()
        if problems:
            return _Tampered(f"{modname}.{name}", problems)
        return value

    def __setattr__(self, name, value):
        modname = types.ModuleType.__getattribute__(self, "__name__")
        if name == "__class__":
            _record(f"the type of module {modname}", "was changed")
            return                                 # refused: the module keeps its guard
        orig = _State.entries.get(modname, {}).get(name)
        if orig is not None and value is not orig and not isinstance(value, _Replaced):
            print(f"{modname}.{name} was replaced: a check that calls it earns no points "
                  "(restart the kernel to get the grader back).", file=sys.stderr)
            value = _Replaced(f"{modname}.{name}")
        super().__setattr__(name, value)

    def __delattr__(self, name):
        modname = types.ModuleType.__getattribute__(self, "__name__")
        if name in _State.entries.get(modname, {}):
            super().__setattr__(name, _Replaced(f"{modname}.{name}"))
            return
        super().__delattr__(name)


class _Tampered(_Replaced):
    """A grader that is itself intact, reached while something it relies on was replaced."""

    def __init__(self, qualname, problems):
        super().__init__(qualname)
        self.problems = problems

    def __call__(self, *args, **kwargs):
        raise _grading_error()(_message(self.problems))


def _message(problems) -> str:
    first, verb = problems[0]
    more = [p for p, _ in problems[1:]]
    text = f"{first} {verb} in this notebook: this check earns no points."
    if more:
        text += f" (Also: {', '.join(more[:5])}{' and more' if len(more) > 5 else ''}.)"
    if any(p == _TRACE for p, _ in problems):
        return text + " Turn the debugger off (or stop the tracer) to run the checks."
    return text + " Leave the course's graders and torch as they are (restart the kernel to get them back)."


def _grading_error():
    return _State.error or AssertionError


def _record(what: str, verb: str = "was replaced") -> None:
    _State.recorded.setdefault(what, verb)


# --------------------------------------------------------------------------------------
# Installing and checking
# --------------------------------------------------------------------------------------
def _protected(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in PROTECTED_MODULES)


def _static(owner, name):
    """What ``owner.name`` finds, without calling descriptors: for a class, the first class
    of its MRO that has the name (so putting back an inherited method counts as unchanged)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            found = vars(klass).get(name, _MISSING)
            if found is not _MISSING:
                return found
        return _MISSING
    return vars(owner).get(name, _MISSING)


def _torch_items():
    import torch
    items = []
    for name, value in vars(torch).items():
        if (not name.startswith("_") and name not in _TORCH_PATCHED_BY_HARNESS | _TORCH_PATCHED_BY_TORCH
                and (callable(value) or isinstance(value, types.ModuleType))):
            items.append((f"torch.{name}", torch, name, value))
    for sub in _TORCH_SUBMODULES:
        mod = torch
        for part in sub.split("."):
            mod = getattr(mod, part, None)
        if not isinstance(mod, types.ModuleType):
            continue
        for name, value in vars(mod).items():
            if not name.startswith("_") and callable(value):
                items.append((f"torch.{sub}.{name}", mod, name, value))
    return items


def install(utils_pkg) -> None:
    """Guard the course's graders (called once, at the end of ``import utils``)."""
    if _State.installed:
        return
    _State.utils = utils_pkg
    # read from the module's dict: attribute access on a guarded module would check again
    _State.error = vars(sys.modules["utils.grading"])["GradingError"]
    # the graders a check cell calls by name, in the package and in the modules that define them
    topics = sys.modules.get("utils.topics")
    entry_names = set(getattr(topics, "CHECKS", {}))  # every topic's graders (utils/topics/*.py)
    for modname in ("utils.check", "utils.ship", "utils.topics.collectives", "utils.topics.graphs"):
        mod = sys.modules.get(modname)
        entry_names |= {n for n in getattr(mod, "__all__", ())
                        if isinstance(getattr(mod, n, None), types.FunctionType)}
    entries = {"utils": {n: getattr(utils_pkg, n) for n in entry_names if hasattr(utils_pkg, n)}}
    modules = {name: mod for name, mod in list(sys.modules.items())
               if _protected(name) and isinstance(mod, types.ModuleType)}
    for name, mod in modules.items():
        own = {n: v for n, v in vars(mod).items()
               if isinstance(v, types.FunctionType) and (n.startswith("check_") or n in entry_names)
               and getattr(v, "__module__", None) == name}
        if name == __name__:              # the guard's own functions: rebinding one fails every check
            own = {n: v for n, v in vars(mod).items() if isinstance(v, types.FunctionType)}
        if own:
            entries[name] = own
    _State.entries = entries
    _State.entry_names = frozenset(n for e in entries.values() for n in e)
    _State.modules = dict(modules, utils=utils_pkg)
    _State.globals_ = {}
    for name, mod in modules.items():
        skip = UNGUARDED.get(name, set())
        _State.globals_[name] = {n: _describe_value(v, _is_constant_name(n)) for n, v in vars(mod).items()
                                 if not (n.startswith("__") and n.endswith("__")) and n not in skip}
    _State.torch = _torch_items()
    import torch
    _State.tensor = (torch.Tensor, dict(vars(torch.Tensor)))
    _State.torch += [(f"builtins.{n}", builtins, n, getattr(builtins, n)) for n in _BUILTINS
                     if hasattr(builtins, n)]
    config = sys.modules.get("runtime.config")
    if config is not None and hasattr(config, "SIZES"):
        _State.objects = [("utils.SIZES", config.SIZES, _freeze(config.SIZES))]
    _State.trace = (sys.gettrace(), sys.getprofile())
    for mod in _State.modules.values():
        if type(mod) is types.ModuleType:
            mod.__class__ = GuardedModule
    _State.installed = True
    _State.frozen = tuple((k, getattr(_State, k)) for k in _STATE_KEYS)
    _install_ipython_hook()


def is_installed() -> bool:
    return _State.installed


def tampering() -> list[tuple[str, str]]:
    """``[(what, "was replaced" / "was changed"), ...]``: what differs from ``import utils``."""
    if not _State.installed:
        return [("the course's grader guard", "was not installed (import utils first)")]
    found = dict(_State.recorded)
    if _State.frozen != tuple((k, getattr(_State, k)) for k in _STATE_KEYS) or any(
            getattr(_State, k) is not v for k, v in _State.frozen):
        found.setdefault("the grader guard's record", "was changed")
    for name, mod in _State.modules.items():
        if sys.modules.get(name) is not mod:
            found.setdefault(f"sys.modules[{name!r}]", "was replaced")
        if type(mod) is not GuardedModule:
            found.setdefault(f"the type of module {name}", "was changed")
    seen_classes = set()
    for modname, described in _State.globals_.items():
        mod = _State.modules[modname]
        current = vars(mod)
        entries = _State.entries.get(modname, {})
        for n, d in described.items():
            if n not in current:
                found.setdefault(f"{modname}.{n}", "was deleted")
                continue
            value = current[n]
            if isinstance(value, _Replaced) and n in entries:
                continue                      # fails the check that calls it, not every check
            if d[0] == "class" and value is d[1]:
                if id(value) in seen_classes:     # one class, imported into several modules
                    continue
                seen_classes.add(id(value))
            if _changed(value, d):
                if d[0] == "class" and value is d[1]:
                    attr = _changed_class_attr(value, d)
                    found.setdefault(f"{value.__module__}.{value.__qualname__}.{attr}", "was replaced")
                else:
                    found.setdefault(f"{modname}.{n}", "was changed" if d[0] == "table" else "was replaced")
        for n in current.keys() - described.keys():
            if hasattr(builtins, n) and n in _BUILTINS:
                found.setdefault(f"{modname}.{n}", "was added (it hides the builtin)")
    # the launch hooks the course put on the libraries' classes (Numba, Triton), which a
    # recording needs to see the learner's launches (runtime/backends/launches.py)
    hooks = _State.globals_.get("runtime.backends.launches", {}).get("hook_problems")
    if hooks is not None and hooks[0] == "fn":
        for what in hooks[1]():
            found.setdefault(what, "was changed")
    for label, owner, n, orig in _State.torch:
        if vars(owner).get(n, _MISSING) is not orig:
            found.setdefault(label, "was replaced")
    # every name a Tensor has: most come from the C type below torch.Tensor, which cannot be
    # changed, so a replacement shows in torch.Tensor's own __dict__ (one put back as the
    # inherited method it was counts as unchanged)
    tensor, own = _State.tensor
    now = vars(tensor)
    for n in now.keys() | own.keys():
        # __slotnames__: copyreg caches it on the class the first time a tensor is copied or pickled
        if n in _TENSOR_PATCHED_BY_HARNESS or n in ("__doc__", "__dict__", "__weakref__", "__slotnames__"):
            continue
        value = now.get(n, _MISSING)
        if value is not own.get(n, _MISSING) and value is not _static(tensor.__mro__[1], n):
            found.setdefault(f"torch.Tensor.{n}", "was replaced")
    for label, obj, frozen in _State.objects:
        if not _same(obj, frozen):
            found.setdefault(label, "was changed")
    if (sys.gettrace(), sys.getprofile()) != _State.trace:
        found.setdefault(_TRACE, "was set")
    return list(found.items())


_TRACE = "sys.settrace / sys.setprofile (a debugger or tracer, which can rewrite the grader's variables)"


def verify(where: str = "the check", result=None) -> None:
    """Raise ``GradingError`` if a grader, the harness or torch was replaced (graded calls
    call this before and after running the learner's function; ``result``: what the
    learner's function returned, which must not be a tensor that overrides torch's functions)."""
    problems = tampering()
    if problems:
        raise _grading_error()(_message(problems))
    for t in (result if isinstance(result, (tuple, list)) else (result,)):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(t, torch.Tensor) and type(t) is not torch.Tensor:
            raise _grading_error()(
                f"{where}: your function returned a {type(t).__module__}.{type(t).__qualname__}, a subclass of "
                "torch.Tensor, which can change what torch's comparisons say: this check earns no points. "
                "Return a plain torch.Tensor (torch.empty_like(x) makes one).")


# --------------------------------------------------------------------------------------
# Notebooks: the names a check cell uses
# --------------------------------------------------------------------------------------
def check_cell_names(ns: dict) -> list[str]:
    """Before a check cell: put back ``utils`` and the graders in the notebook namespace
    ``ns`` if a cell rebound them, and the guard on the ``utils`` module if a cell took it
    off; record what was found (the check then fails and says why). Returns what was found."""
    found = []
    real = _State.utils
    if real is None:
        return found
    if type(real) is not GuardedModule:
        _record("the type of module utils", "was changed")
        real.__class__ = GuardedModule
        found.append("the type of module utils")
    # anything replaced by now stays a failure for every later check, even if put back
    for what, verb in tampering():
        if what != _TRACE:
            _record(what, verb)
            found.append(what)
    # and what the check cell itself would call is put back: the guard's own methods, and a
    # stand-in for every grader rebound past the module's setattr
    guard_class = _State.globals_.get(__name__, {}).get("GuardedModule")
    if guard_class is not None:
        for attr, described in guard_class[2].items():
            if vars(GuardedModule).get(attr, _MISSING) is not described[1]:
                type.__setattr__(GuardedModule, attr, described[1])
    for modname, entries in _State.entries.items():
        mod = _State.modules.get(modname)
        for name, orig in entries.items():
            v = vars(mod).get(name, _MISSING)
            if v is not orig and not isinstance(v, _Replaced):
                vars(mod)[name] = _Replaced(f"{modname}.{name}")
    u = ns.get("utils", _MISSING)
    if u is not _MISSING and u is not real:
        _record("the name `utils`", "was rebound")
        ns["utils"] = real
        found.append("utils")
    elif u is _MISSING:
        ns["utils"] = real  # deleted (or never imported by that name): the check cell finds the real one
    if vars(builtins).get("utils", real) is not real:
        _record("builtins.utils", "was set")  # a stand-in a check cell would find once `utils` is deleted
        del builtins.utils
        found.append("builtins.utils")
    for name, orig in _State.entries.get("utils", {}).items():
        v = ns.get(name, _MISSING)
        if v is not _MISSING and v is not orig and not isinstance(v, _Replaced):
            ns[name] = _Replaced(name)
            found.append(name)
    return found


def _pre_run_cell(info) -> None:
    src = getattr(info, "raw_cell", "") or ""
    first = next((ln.strip() for ln in src.splitlines() if ln.strip()), "")
    if not first.startswith(CHECK_CELL_HEADER):
        return
    ip = _ipython()
    if ip is not None:
        check_cell_names(ip.user_ns)


def _ipython():
    mod = sys.modules.get("IPython")
    if mod is None:
        return None
    try:
        return mod.get_ipython()
    except Exception:
        return None


def _install_ipython_hook(ip=None) -> bool:
    ip = ip or _ipython()
    if ip is None or not hasattr(ip, "events"):
        return False
    callbacks = ip.events.callbacks.get("pre_run_cell", [])
    if _pre_run_cell not in callbacks:
        ip.events.register("pre_run_cell", _pre_run_cell)
    return True
