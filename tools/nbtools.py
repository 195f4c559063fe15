"""Notebook housekeeping: strip outputs, generate the exercises, check that all is in sync.

    python -m tools.nbtools strip [FILES...]   # outputs, execution counts, machine metadata
    python -m tools.nbtools exercises          # solutions/NN_*.ipynb -> exercises/NN_*.ipynb
    python -m tools.nbtools check              # non-zero exit if anything is stale or dirty

``solutions/NN_*.ipynb`` are the single source of the exercises. In a solution notebook

* a **solution cell** holds the answer between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION`` (or ``// BEGIN SOLUTION`` / ``// END SOLUTION`` inside a CUDA C++
  source string), with a ``# TODO (about N lines): what to write`` line (``// TODO ...``
  in C++) just above the region;
* a **check cell** starts with the line ``# Check your answer`` and calls a grader.

``exercises`` replaces each Python answer with
``raise NotImplementedError("not solved yet: <TODO text>")`` and each C++ answer with
``NOT_SOLVED_YET;`` (the CUDA loader raises ``NotImplementedError`` when a kernel holding it
is launched), strips outputs, and writes nbgrader metadata: solution cells are
``solution``, check cells are ``grade`` + ``locked`` with 1 point, every other cell is a
locked read-only cell. The same metadata is written into the solution notebook itself, so
``solutions/`` are valid nbgrader *source* notebooks.

Instructors: nbgrader's own ``ClearSolutions`` would put a Python stub inside CUDA C++
strings. Use this module's :class:`ClearSolutions` instead, so that nbgrader's release is
the same as ``exercises/``. In the course directory's ``nbgrader_config.py``::

    c = get_config()
    c.GenerateAssignment.preprocessors = tools.nbtools.GENERATE_ASSIGNMENT_PREPROCESSORS
    # (with ``import tools.nbtools`` above, and the course root on PYTHONPATH)

and run ``nbgrader`` with the course root on ``PYTHONPATH`` so that the notebooks'
``import utils`` works from nbgrader's folders (``PYTHONPATH=/path/to/course nbgrader ...``).

The output is deterministic: the same solutions give byte-identical exercises.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import sys
from pathlib import Path

import nbformat

from tools import ROOT

__all__ = [
    "strip_notebook", "clear_solutions", "make_exercise", "add_grading_metadata",
    "generate_exercises", "check", "notebook_problems",
]

NOTEBOOK_DIRS = ("notebooks", "exercises", "solutions")

BEGIN_PY, END_PY = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_CPP, END_CPP = "// BEGIN SOLUTION", "// END SOLUTION"
CHECK_HEADER = "# Check your answer"
CPP_STUB = "NOT_SOLVED_YET;"
TEXT_STUB = "YOUR ANSWER HERE"

#: The kernel every notebook of the course runs on (nbval and JupyterLab pick it by name).
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
#: Cell metadata a notebook editor writes that says nothing about the course.
_VOLATILE_CELL_KEYS = ("execution", "collapsed", "scrolled", "ExecuteTime", "vscode", "pycharm")

# A TODO line: "# TODO (about 4 lines): launch the kernel" or "// TODO (about 3 lines): ..."
_TODO_RE = re.compile(r"^\s*(?:#|//)\s*TODO\b\s*(?:\((?P<size>[^)]*)\))?\s*:?\s*(?P<what>.*?)\s*$")


class NotebookError(ValueError):
    """A solution notebook breaks the exercise conventions (the message says where)."""


# --------------------------------------------------------------------------------------
# reading and writing
# --------------------------------------------------------------------------------------
def read(path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def dumps(nb: nbformat.NotebookNode) -> str:
    """The file contents nbformat writes (sorted keys, one-space indent), ending in a newline."""
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def _write_if_changed(path: Path, text: str) -> bool:
    path = Path(path)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return True


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


# --------------------------------------------------------------------------------------
# strip
# --------------------------------------------------------------------------------------
def strip_notebook(nb: nbformat.NotebookNode, name: str = "") -> nbformat.NotebookNode:
    """Remove outputs, execution counts and editor/machine metadata (in place; returns nb).

    Cells without an id get a deterministic one (derived from ``name`` and the position),
    so stripping twice gives the same bytes.
    """
    nb.nbformat, nb.nbformat_minor = 4, max(5, nb.get("nbformat_minor", 5))
    # Keep a python3 kernelspec as it is (editors differ in its display name); any other
    # kernel name is a local one (a learner's own environment), which nbval cannot start.
    spec = nb.metadata.get("kernelspec") or {}
    if spec.get("name") != KERNELSPEC["name"]:
        spec = KERNELSPEC
    # language_info as Jupyter writes it, less the interpreter version of this machine
    lang = {k: v for k, v in (nb.metadata.get("language_info") or {}).items() if k != "version"}
    nb.metadata = nbformat.NotebookNode(
        kernelspec=nbformat.NotebookNode(spec),
        language_info=nbformat.NotebookNode(lang or {"name": "python"}),
    )
    seen = set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        else:
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
        for key in _VOLATILE_CELL_KEYS:
            cell.metadata.pop(key, None)
        cid = cell.get("id")
        if not cid or cid in seen:
            cid = hashlib.sha1(f"{name}:{i}".encode()).hexdigest()[:8]
            while cid in seen:
                cid = hashlib.sha1(cid.encode()).hexdigest()[:8]
            cell.id = cid
        seen.add(cid)
    return nb


def all_notebooks(root: Path = ROOT) -> list[Path]:
    out = []
    for d in NOTEBOOK_DIRS:
        out += sorted(p for p in (Path(root) / d).glob("*.ipynb"))
    return out


def strip_files(files) -> list[Path]:
    """Strip every file in place; returns those that changed."""
    changed = []
    for f in files:
        f = Path(f)
        nb = strip_notebook(read(f), f.name)
        if _write_if_changed(f, dumps(nb)):
            changed.append(f)
    return changed


# --------------------------------------------------------------------------------------
# exercises
# --------------------------------------------------------------------------------------
def _todo_message(todo_line: str | None) -> str:
    m = _TODO_RE.match(todo_line or "")
    if not m:
        return "not solved yet"
    what, size = m.group("what").strip(), (m.group("size") or "").strip()
    msg = "not solved yet"
    if what:
        msg += f": {what}"
    if size:
        msg += f" ({size})"
    return msg


def _todo_above(out: list[str], comment: str, marker: str, where: str) -> str:
    """The line above a solution marker, which must be its TODO line (a ``comment`` line)."""
    previous = out[-1] if out else ""
    if not _TODO_RE.match(previous) or not previous.strip().startswith(comment):
        raise NotebookError(f"{where}: put a '{comment} TODO (about N lines): ...' line just above {marker}")
    return previous


def clear_solutions(source: str, cell_type: str = "code", where: str = "") -> tuple[str, bool]:
    """Replace every solution region of one cell's source by its stub.

    Returns ``(new_source, replaced_any)``. Python regions (``### BEGIN SOLUTION``) become
    ``raise NotImplementedError("not solved yet: <TODO text>")`` at the marker's
    indentation; C++ regions (``// BEGIN SOLUTION``) become ``NOT_SOLVED_YET;``; in
    markdown, a region becomes ``YOUR ANSWER HERE``. The TODO line above a region stays.
    """
    lines = source.split("\n")
    out: list[str] = []
    region = None  # (kind, line number) while inside a region
    replaced = False
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        begins = "BEGIN SOLUTION" in stripped
        ends = "END SOLUTION" in stripped and not begins
        if begins:
            if region:
                raise NotebookError(f"{where}: line {lineno}: BEGIN SOLUTION inside another solution region")
            indent = line[: len(line) - len(line.lstrip())]
            if cell_type != "code":
                kind = "text"
                out.append(indent + TEXT_STUB)
            elif stripped.startswith(BEGIN_PY):
                kind = "py"
                message = json.dumps(_todo_message(_todo_above(out, "#", BEGIN_PY, f"{where}: line {lineno}")),
                                     ensure_ascii=False)
                out.append(f"{indent}raise NotImplementedError({message})")
            elif stripped.startswith(BEGIN_CPP):
                kind = "cpp"
                _todo_above(out, "//", BEGIN_CPP, f"{where}: line {lineno}")
                out.append(indent + CPP_STUB)
            else:
                raise NotebookError(
                    f"{where}: line {lineno}: write the marker as '{BEGIN_PY}' (Python) or "
                    f"'{BEGIN_CPP}' (inside C++ source), not {stripped!r}")
            region = (kind, lineno)
            replaced = True
        elif ends:
            if not region:
                raise NotebookError(f"{where}: line {lineno}: END SOLUTION without BEGIN SOLUTION")
            region = None
        elif not region:
            out.append(line)
    if region:
        raise NotebookError(f"{where}: line {region[1]}: BEGIN SOLUTION is never ended")
    return "\n".join(out), replaced


def _is_check_cell(cell) -> bool:
    if cell.cell_type != "code":
        return False
    first = next((ln.strip() for ln in _source(cell).split("\n") if ln.strip()), "")
    return first.startswith(CHECK_HEADER)


def _has_solution(cell) -> bool:
    return "BEGIN SOLUTION" in _source(cell)


def _nbgrader_meta(**kw) -> nbformat.NotebookNode:
    meta = dict(grade=False, locked=False, schema_version=3, solution=False, task=False)
    meta.update(kw)
    return nbformat.NotebookNode(meta)


def add_grading_metadata(nb: nbformat.NotebookNode, stem: str) -> nbformat.NotebookNode:
    """Write nbgrader metadata into every cell (in place): solution, graded check, or read-only.

    ``grade_id``s are positional per kind (``<stem>-solution-1``, ``<stem>-check-1``,
    ``<stem>-cell-3``), so they are unique and stable for the same notebook.
    """
    prefix = re.sub(r"[^A-Za-z0-9_-]", "-", stem)[:40]
    counts = {"solution": 0, "check": 0}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "raw":
            cell.metadata.pop("nbgrader", None)
            continue
        if _is_check_cell(cell) and _has_solution(cell):
            raise NotebookError(f"{stem} cell {i}: a check cell cannot hold a solution region")
        if _has_solution(cell):
            counts["solution"] += 1
            cell.metadata["nbgrader"] = _nbgrader_meta(
                grade_id=f"{prefix}-solution-{counts['solution']}", solution=True)
        elif _is_check_cell(cell):
            counts["check"] += 1
            cell.metadata["nbgrader"] = _nbgrader_meta(
                grade_id=f"{prefix}-check-{counts['check']}", grade=True, locked=True, points=1)
        else:
            cell.metadata["nbgrader"] = _nbgrader_meta(grade_id=f"{prefix}-cell-{i}", locked=True)
    return nb


def make_exercise(solution: nbformat.NotebookNode, stem: str) -> nbformat.NotebookNode:
    """The exercise notebook for a solution notebook (a new notebook; the input is untouched)."""
    nb = copy.deepcopy(solution)
    strip_notebook(nb, stem + ".ipynb")
    add_grading_metadata(nb, stem)
    for i, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source, _ = clear_solutions(_source(cell), cell.cell_type, f"{stem} cell {i}")
            # the learner writes here: keep the cell, let them edit it (as nbgrader's LockCells)
            cell.metadata["deletable"] = False
            cell.metadata.pop("editable", None)
        elif meta.get("grade") or meta.get("locked"):
            cell.metadata["deletable"] = False
            cell.metadata["editable"] = False
    return nb


def _pairs(root: Path):
    for sol in sorted((Path(root) / "solutions").glob("[0-9][0-9]_*.ipynb")):
        yield sol, Path(root) / "exercises" / sol.name


def expected_files(root: Path = ROOT) -> dict[Path, str]:
    """``{path: contents}`` the generator wants: every exercise, and every solution with metadata."""
    want = {}
    for sol, ex in _pairs(root):
        nb = read(sol)
        solution = add_grading_metadata(strip_notebook(copy.deepcopy(nb), sol.name), sol.stem)
        want[sol] = dumps(solution)
        want[ex] = dumps(make_exercise(nb, sol.stem))
    return want


def generate_exercises(root: Path = ROOT, out_dir: Path | None = None) -> list[Path]:
    """Write ``exercises/`` (or ``out_dir``) from ``solutions/``; returns the files written.

    The solution notebooks get their nbgrader metadata (and are stripped) in place, unless
    ``out_dir`` is given: then nothing under ``root`` changes, and ``out_dir`` receives the
    exercises only (the tests use this to compare without touching the tree).
    """
    written = []
    for path, text in expected_files(root).items():
        is_solution = path.parent.name == "solutions"
        if out_dir is not None:
            if is_solution:
                continue
            path = Path(out_dir) / path.name
        if _write_if_changed(path, text):
            written.append(path)
    return written


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------
def _machine_path_patterns() -> list[re.Pattern]:
    pats = [r"/home/[A-Za-z0-9_.-]+/", r"/Users/[A-Za-z0-9_.-]+/", r"[A-Za-z]:\\\\Users\\\\"]
    for p in {str(ROOT), os.path.expanduser("~")}:
        if p and p not in ("/", "/root") and len(p) > 4:
            pats.append(re.escape(p))
    return [re.compile(p) for p in pats]


def notebook_problems(path: Path) -> list[str]:
    """What is wrong with a committed notebook: outputs, execution counts, machine paths."""
    problems = []
    try:
        nb = read(path)
    except Exception as e:  # unreadable JSON is a problem too
        return [f"cannot be read: {e}"]
    for i, cell in enumerate(nb.cells):
        if cell.get("outputs"):
            problems.append(f"cell {i} has outputs")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {i} has an execution count")
    text = Path(path).read_text(encoding="utf-8")
    for pat in _machine_path_patterns():
        m = pat.search(text)
        if m:
            problems.append(f"contains a machine path {m.group(0)!r}")
    if nb.metadata.get("kernelspec", {}).get("name") not in (None, KERNELSPEC["name"]):
        problems.append(f"kernelspec is {nb.metadata['kernelspec'].get('name')!r}, not {KERNELSPEC['name']!r}")
    return problems


def check(root: Path = ROOT) -> list[str]:
    """Every problem found, one line each (empty: all in sync and clean)."""
    root = Path(root)
    problems = []
    try:
        want = expected_files(root)
    except NotebookError as e:
        want = {}
        problems.append(f"solutions: {e}")
    for path, text in want.items():
        rel = path.relative_to(root)
        if not path.exists():
            problems.append(f"{rel}: missing (run python -m tools.nbtools exercises)")
        elif path.read_text(encoding="utf-8") != text:
            what = ("nbgrader metadata or stripping" if path.parent.name == "solutions"
                    else "out of sync with its solution")
            problems.append(f"{rel}: {what} (run python -m tools.nbtools exercises)")
    for ex in sorted((root / "exercises").glob("*.ipynb")):
        if not (root / "solutions" / ex.name).exists():
            problems.append(f"{ex.relative_to(root)}: no solutions/{ex.name} to generate it from")
    for nb in all_notebooks(root):
        for p in notebook_problems(nb):
            problems.append(f"{nb.relative_to(root)}: {p} (run python -m tools.nbtools strip)")
    return problems


# --------------------------------------------------------------------------------------
# nbgrader: the same stubs as exercises/ in nbgrader's release
# --------------------------------------------------------------------------------------
_NBGRADER = {}


def _nbgrader_parts():
    """Built on first use: importing nbgrader takes a while, and strip, exercises and check do not
    need it."""
    if not _NBGRADER:
        from nbgrader.converters.generate_assignment import GenerateAssignment
        from nbgrader.preprocessors import ClearSolutions as NbgraderClearSolutions

        class ClearSolutions(NbgraderClearSolutions):
            """nbgrader's ClearSolutions with the course's stubs (C++ regions get ``NOT_SOLVED_YET;``)."""

            def _replace_solution_region(self, cell, language):
                cell.source, replaced = clear_solutions(_source(cell), cell.cell_type, "nbgrader")
                return replaced

        ClearSolutions.__module__ = __name__
        ClearSolutions.__qualname__ = "ClearSolutions"
        default = GenerateAssignment.class_traits()["preprocessors"].default()
        _NBGRADER["ClearSolutions"] = ClearSolutions
        _NBGRADER["GENERATE_ASSIGNMENT_PREPROCESSORS"] = [
            ClearSolutions if p is NbgraderClearSolutions else p for p in default]
    return _NBGRADER


def __getattr__(name):
    # ``ClearSolutions`` (an nbgrader preprocessor) and ``GENERATE_ASSIGNMENT_PREPROCESSORS``
    if name in ("ClearSolutions", "GENERATE_ASSIGNMENT_PREPROCESSORS"):
        return _nbgrader_parts()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.nbtools", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("strip", help="remove outputs, execution counts and machine metadata")
    p.add_argument("files", nargs="*", help="notebooks (default: notebooks/, exercises/, solutions/)")
    sub.add_parser("exercises", help="generate exercises/ from solutions/")
    sub.add_parser("check", help="fail if exercises are stale or notebooks carry outputs")
    args = ap.parse_args(argv)

    if args.cmd == "strip":
        files = [Path(f) for f in args.files] or all_notebooks()
        changed = strip_files(files)
        print(f"stripped {len(changed)} of {len(files)} notebooks" +
              "".join(f"\n  {f}" for f in changed))
        return 0
    if args.cmd == "exercises":
        try:
            written = generate_exercises()
        except NotebookError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        n = len(list(_pairs(ROOT)))
        print(f"{n} solution notebooks -> exercises/; {len(written)} files updated" +
              "".join(f"\n  {f.relative_to(ROOT)}" for f in written))
        return 0
    problems = check()
    if problems:
        print("notebooks need attention:\n" + "\n".join(f"  {p}" for p in problems), file=sys.stderr)
        return 1
    print("exercises in sync with solutions; all notebooks clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
