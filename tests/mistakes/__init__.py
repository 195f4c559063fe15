"""Catalogs of the mistakes learners make in each exercise, as mutations of the solutions.

One module per exercise, ``tests/mistakes/NN_topic.py``, named like its notebook in
``solutions/``, loaded by path (``Mistake`` is given to it, no import needed). It defines
``MISTAKES``, a list of :class:`Mistake`: an exact ``old -> new`` text replacement in one
solution cell, the verdict the exercise's check must give the mutated solution, and the
cause its message must name (``cause``, a regex searched case-insensitively) and must not
name (``not_words``: a wrong hint it used to give); no rejection's message may say PASS.
Right kernels written an unusual way are entries too, with ``verdict="accepted"``.

A module may also define ``prepare(source, tag) -> source``, applied to every cell before it
runs, for notebooks that register global names (exercise 07's ``torch.library`` operators).

A module whose exercise runs the same code in both modes (no kernel: exercise 13's collectives
run as gloo processes on CPU tensors, with a GPU or without) says so in ``MODE_INDEPENDENT``, a
sentence; its entries then need no verdict recorded on a GPU (``tests/test_sim_vs_gpu.py``).

A module whose entries may end the CUDA context of the process grading them on a GPU (a trap,
a hang stopped by a time limit) says why in ``ISOLATE``: on a GPU, ``sim_vs_gpu`` then grades each
of its entries in a process of its own.

The entries that recur across exercises (an index without its guard, a store without its
mask, a race) are made by the functions below, which a catalog imports.

``tests/test_mistakes.py`` grades every entry in simulation; ``benchmarks/simulators/sim_vs_gpu.py``
grades them in the current mode and records the GPU side.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import linecache
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


class MutationError(AssertionError):
    """A catalog entry no longer applies to its solution: the solution changed."""


@dataclass
class Mistake:
    name: str
    #: text that occurs in exactly one solution cell: the cell to mutate
    cell: str
    old: str
    new: str
    #: "rejected" or "accepted"
    verdict: str = "rejected"
    #: a regex the grader's message must match (case-insensitive); "" for accepted entries
    cause: str = ""
    #: words the message must not contain (a wrong hint)
    not_words: tuple = ()
    #: why this entry is expected to fail for now (a pytest xfail reason), or None
    xfail: str | None = None
    #: why only simulation catches this mistake (a race, undefined behaviour), or None
    sim_only: str | None = None
    #: more replacements (cell, old, new) for a mistake that spans two cells
    more: tuple = ()


# ---------------------------------------------------------------------------------------
# Entries that recur across exercises, with their cause and note written once. A catalog
# imports the ones it uses: ``from mistakes import no_mask, race``.
# ---------------------------------------------------------------------------------------
def no_bounds_check(lang: str, cell: str, guarded: str, unguarded: str, index: str = "idx") -> Mistake:
    """``<lang>_no_bounds_check``: the ``index < n`` guard of a CUDA C++ or Numba kernel removed."""
    cause = rf"past the end|{index} < n|bounds" + ("|index" if lang == "numba" else "")
    return Mistake(f"{lang}_no_bounds_check", cell, guarded, unguarded, cause=cause)


def no_mask(cell: str, store: str) -> Mistake:
    """``triton_no_mask``: ``store``, a ``tl.store(..., mask=mask)``, without its mask."""
    return Mistake("triton_no_mask", cell, store, store.replace(", mask=mask)", ")"), cause=r"mask|past the end")


def no_tail(cell: str, tail: str) -> Mistake:
    """``vec4_no_tail``: a vectorized kernel without the code for the last n % 4 elements."""
    return Mistake("vec4_no_tail", cell, tail, "", cause=r"tail|never written|last")


#: Why a missing ``other=`` may pass on a GPU.
OTHER_UNDEFINED = ("undefined behaviour: masked-off lanes are undefined; a GPU often loads 0 there, "
                   "simulation loads NaN so the missing other= shows")

#: Why a kernel that moves too many bytes is caught in simulation only.
TRITON_TRAFFIC = ("efficiency: the traffic check counts the bytes a Triton kernel moves in simulation only; "
                  "on a GPU the exercise grades the results and says the traffic is graded in simulation")


def race(name: str, cell: str, old: str, new: str, cause: str, gpu: str) -> Mistake:
    """A missing barrier or atomic. Simulation always catches the race; ``gpu`` says why a
    GPU may not show it."""
    return Mistake(name, cell, old, new, cause=cause, sim_only=f"a race: {gpu}")


@dataclass
class Verdict:
    verdict: str
    message: str

    @property
    def first_line(self) -> str:
        return self.message.strip().splitlines()[0] if self.message.strip() else ""


def exercises() -> list[str]:
    """The exercises with a catalog: ``["01_threads_blocks_grids", ...]``."""
    return sorted(p.stem for p in HERE.glob("[0-9][0-9]_*.py"))


def load(exercise: str):
    """The catalog module of one exercise."""
    name = f"_mistakes_{exercise}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"{exercise}.py")
    mod = importlib.util.module_from_spec(spec)
    mod.Mistake = Mistake   # a catalog is loaded by path, so it gets the class this way
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    assert (ROOT / "solutions" / f"{exercise}.ipynb").exists(), f"no solutions/{exercise}.ipynb"
    return mod


def mode_independent(exercise: str) -> str | None:
    """Why the exercise's verdicts cannot differ between simulation and a GPU, or None."""
    return getattr(load(exercise), "MODE_INDEPENDENT", None)


def catalog(exercise: str) -> list[Mistake]:
    return list(load(exercise).MISTAKES)


def all_mistakes() -> list[tuple[str, Mistake]]:
    return [(ex, m) for ex in exercises() for m in catalog(ex)]


def _cells(exercise: str):
    nb = nbformat.read(str(ROOT / "solutions" / f"{exercise}.ipynb"), as_version=4)
    out = []
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        meta = c.metadata.get("nbgrader", {})
        out.append((i, c.source, bool(meta.get("grade")), bool(meta.get("solution"))))
    return out


def _replace_once(source: str, old: str, new: str, where: str) -> str:
    n = source.count(old)
    if n != 1:
        raise MutationError(f"{where}: the text to replace occurs {n} times, not once: {old!r}")
    return source.replace(old, new)


def mutate(exercise: str, m: Mistake) -> dict[int, str]:
    """The mutated sources, by cell index; raises MutationError where an entry no longer applies."""
    cells = _cells(exercise)
    out: dict[int, str] = {}
    for cell, old, new in ((m.cell, m.old, m.new), *m.more):
        hits = [i for i, src, _, sol in cells if sol and cell in src]
        if len(hits) != 1:
            raise MutationError(f"{exercise}/{m.name}: {len(hits)} solution cells contain {cell!r}, not one")
        i = hits[0]
        src = out.get(i, dict((j, s) for j, s, _, _ in cells)[i])
        out[i] = _replace_once(src, old, new, f"{exercise}/{m.name}")
    return out


def _run_cell(source: str, ns: dict, filename: str) -> None:
    # Triton reads a kernel's source through inspect, which reads linecache
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)


class Grader:
    """Grades mutations of one exercise's solution, running the cells before the mutated one
    once and the check cell that follows it for each mutation."""

    def __init__(self, exercise: str):
        self.exercise = exercise
        self.cells = _cells(exercise)
        self.prepare = getattr(load(exercise), "prepare", None)
        self._prefix: dict[int, dict] = {}
        self._runs = 0

    def _src(self, source: str, tag: str) -> str:
        return self.prepare(source, tag) if self.prepare else source

    def _base(self, first: int) -> dict:
        """The namespace after every non-check cell before cell ``first``."""
        if first not in self._prefix:
            ns: dict = {"__name__": "__main__"}
            for i, src, is_check, _ in self.cells:
                if i >= first:
                    break
                if not is_check:
                    with contextlib.redirect_stdout(io.StringIO()):
                        _run_cell(self._src(src, "base"), ns, f"<{self.exercise} cell {i}>")
            self._prefix[first] = ns
        return dict(self._prefix[first])

    def grade(self, m: Mistake) -> Verdict:
        mutated = mutate(self.exercise, m)
        first = min(mutated)
        last = max(mutated)
        checks = [i for i, _, is_check, _ in self.cells if is_check and i > last]
        assert checks, f"{self.exercise}/{m.name}: no check cell after cell {last}"
        check = checks[0]
        self._runs += 1
        tag = f"m{self._runs}"
        ns = self._base(first)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                for i, src, is_check, _ in self.cells:
                    if i < first or i > check or (is_check and i != check):
                        continue
                    _run_cell(self._src(mutated.get(i, src), tag), ns, f"<{self.exercise} {m.name} cell {i}>")
        except NotImplementedError as e:
            return Verdict("rejected", f"NotImplementedError: {e}")
        except Exception as e:  # what the learner sees: any error rejects
            from utils.grading import GradingError
            if isinstance(e, GradingError):
                return Verdict("rejected", str(e))
            return Verdict("rejected", f"{type(e).__name__}: {e}")
        return Verdict("accepted", "")


def explain(exercise: str, m: Mistake, v: Verdict) -> list[str]:
    """What is wrong with verdict ``v`` for entry ``m`` (empty when it is as the catalog says)."""
    problems = []
    if v.verdict != m.verdict:
        problems.append(f"{exercise}/{m.name}: {v.verdict}, expected {m.verdict}: {v.message[:600]}")
        return problems
    if m.verdict == "rejected":
        if m.cause and not re.search(m.cause, v.message, re.I | re.S):
            problems.append(f"{exercise}/{m.name}: the message does not name the cause /{m.cause}/: {v.message[:800]}")
        low = v.message.lower()
        bad = [w for w in m.not_words if w.lower() in low]
        if bad:
            problems.append(f"{exercise}/{m.name}: the message names a wrong cause {bad}: {v.message[:800]}")
        if re.search(r"\bPASS(ED)?\b", v.message):   # a verdict of its own, inside a rejection, misleads
            problems.append(f"{exercise}/{m.name}: a failure's message says PASS: {v.message[:800]}")
    return problems


_GRADERS: dict[str, Grader] = {}
_VERDICTS: dict[tuple[str, str], Verdict] = {}


def verdict(exercise: str, m: Mistake) -> Verdict:
    """The verdict of one entry, graded once per process (the catalog test and the
    simulation-versus-GPU test share it)."""
    key = (exercise, m.name)
    if key not in _VERDICTS:
        grader = _GRADERS.setdefault(exercise, Grader(exercise))
        _VERDICTS[key] = grader.grade(m)
    return _VERDICTS[key]
