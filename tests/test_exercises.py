"""The exercise pipeline: exercises/ is generated from solutions/, every stub is rejected
with "not solved yet", and committed notebooks carry no outputs.

That every *solution* passes its graders is proven by nbval on solutions/ (the course's
test command runs it), so it is not repeated here.
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from runtime.paths import ROOT
from tools import nbtools

EXERCISES = sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


# --------------------------------------------------------------------------------------
# (a) in sync
# --------------------------------------------------------------------------------------
def test_every_solution_has_an_exercise_and_back():
    assert {p.name for p in EXERCISES} == {p.name for p in SOLUTIONS}, (
        "exercises/ and solutions/ hold different notebooks: run python -m tools.nbtools exercises")


def test_exercises_in_sync_with_solutions(tmp_path):
    written = nbtools.generate_exercises(ROOT, out_dir=tmp_path)
    assert {p.name for p in written} == {p.name for p in SOLUTIONS}
    stale = [p.name for p in SOLUTIONS
             if (tmp_path / p.name).read_bytes() != (ROOT / "exercises" / p.name).read_bytes()]
    assert not stale, f"out of sync with their solutions (run python -m tools.nbtools exercises): {stale}"


def test_solutions_carry_nbgrader_metadata():
    want = nbtools.expected_files(ROOT)
    stale = [p.name for p in SOLUTIONS if p.read_text(encoding="utf-8") != want[p]]
    assert not stale, f"solutions without up-to-date nbgrader metadata (run python -m tools.nbtools exercises): {stale}"


def test_generator_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    nbtools.generate_exercises(ROOT, out_dir=a)
    nbtools.generate_exercises(ROOT, out_dir=b)
    for p in SOLUTIONS:
        assert (a / p.name).read_bytes() == (b / p.name).read_bytes()


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_exercise_structure(path):
    """Each task has a TODO'd stub, a check cell, and hints; no answer leaks into the exercise."""
    nb = nbformat.read(str(ROOT / "exercises" / path.name), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    checks = [c for c in code if c.metadata.get("nbgrader", {}).get("grade")]
    stubs = [c for c in code if c.metadata.get("nbgrader", {}).get("solution")]
    assert checks and stubs, f"{path.name}: an exercise notebook needs solution cells and check cells"
    assert all(c.source.lstrip().startswith(nbtools.CHECK_HEADER) for c in checks)
    for c in stubs:
        assert "SOLUTION" not in c.source, f"{path.name}: a solution marker is left in an exercise"
        assert "not solved yet" in c.source or nbtools.CPP_STUB in c.source
        assert "TODO" in c.source, f"{path.name}: a stub without its TODO line"
    ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
    assert len(ids) == len(set(ids)), f"{path.name}: duplicate nbgrader grade_ids"
    assert any("<summary>Hint</summary>" in c.source for c in nb.cells if c.cell_type == "markdown"), \
        f"{path.name}: no unfoldable hint (<details><summary>Hint</summary>...)"


# --------------------------------------------------------------------------------------
# the generator itself, on small made-up cells
# --------------------------------------------------------------------------------------
def test_clear_solutions_python_and_cpp():
    py = ("def f(x):\n    # TODO (about 2 lines): return x plus one\n    ### BEGIN SOLUTION\n"
          "    y = x + 1\n    return y\n    ### END SOLUTION\n")
    out, replaced = nbtools.clear_solutions(py)
    assert replaced
    assert out == ("def f(x):\n    # TODO (about 2 lines): return x plus one\n"
                   '    raise NotImplementedError("not solved yet: return x plus one (about 2 lines)")\n')
    ns = {}
    exec(out, ns)
    with pytest.raises(NotImplementedError, match="not solved yet"):
        ns["f"](1)

    cpp = ('SRC = r"""\n__global__ void k(float* y) {\n    // TODO (about 1 line): write 1\n'
           '    // BEGIN SOLUTION\n    y[0] = 1;\n    // END SOLUTION\n}\n"""')
    out, replaced = nbtools.clear_solutions(cpp)
    assert replaced and "    // TODO (about 1 line): write 1\n    NOT_SOLVED_YET;\n}" in out
    assert "y[0] = 1" not in out


@pytest.mark.parametrize("bad,why", [
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", "TODO"),
    ("# TODO (1 line): x\n### BEGIN SOLUTION\nx = 1\n", "never ended"),
    ("x = 1\n### END SOLUTION", "without BEGIN"),
])
def test_clear_solutions_rejects_broken_markers(bad, why):
    with pytest.raises(nbtools.NotebookError, match=why):
        nbtools.clear_solutions(bad)


# --------------------------------------------------------------------------------------
# (b) every stub is rejected with "not solved yet", never a crash
# --------------------------------------------------------------------------------------
def _execute(path: Path) -> nbformat.NotebookNode:
    """Run every cell of a notebook in a fresh kernel, going on past errors."""
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def _error(cell):
    for out in cell.get("outputs", []):
        if out.output_type == "error":
            return out.ename, out.evalue
    return None


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", EXERCISES, ids=[p.stem for p in EXERCISES])
def test_every_stub_is_rejected(path):
    nb = _execute(path)
    problems, checks = [], 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        err = _error(cell)
        is_check = cell.metadata.get("nbgrader", {}).get("grade", False)
        first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
        if is_check:
            checks += 1
            if err is None:
                problems.append(f"cell {i} ({first}) passed with the stubs in place")
            elif err[0] != "GradingError" or "not solved yet" not in err[1]:
                problems.append(f"cell {i} ({first}) failed with {err[0]}: {err[1][:300]}")
        elif err is not None and "not solved yet" not in err[1]:
            # another cell may only fail because it uses an unsolved stub
            problems.append(f"cell {i} ({first}) raised {err[0]}: {err[1][:300]}")
    assert checks, f"{path.name} has no check cells"
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


# --------------------------------------------------------------------------------------
# (c) committed notebooks are clean
# --------------------------------------------------------------------------------------
ALL_NOTEBOOKS = nbtools.all_notebooks(ROOT)


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=[f"{p.parent.name}/{p.stem}" for p in ALL_NOTEBOOKS])
def test_committed_notebook_is_clean(path):
    problems = nbtools.notebook_problems(path)
    assert not problems, f"{path.relative_to(ROOT)}: {problems} (run python -m tools.nbtools strip)"


def test_strip_is_idempotent(tmp_path):
    copies = []
    for p in ALL_NOTEBOOKS:
        dest = tmp_path / p.parent.name / p.name
        dest.parent.mkdir(exist_ok=True)
        dest.write_bytes(p.read_bytes())
        copies.append(dest)
    nbtools.strip_files(copies)
    once = {p: p.read_bytes() for p in copies}
    assert nbtools.strip_files(copies) == [], "stripping a stripped notebook changed it"
    assert all(p.read_bytes() == once[p] for p in copies)
    assert all(not nbtools.notebook_problems(p) for p in copies)


def test_check_command_flags_outputs(tmp_path):
    """`nbtools check` finds outputs, counts and machine paths, and stale exercises."""
    (tmp_path / "solutions").mkdir()
    (tmp_path / "notebooks").mkdir()
    sol = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f():\n    # TODO (1 line): return 1\n    ### BEGIN SOLUTION\n"
                                  "    return 1\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("# Check your answer\nassert f() == 1"),
    ])
    nbformat.write(sol, str(tmp_path / "solutions" / "01_x.ipynb"))
    lesson = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    lesson.cells[0].execution_count = 1
    lesson.cells[0].outputs = [nbformat.v4.new_output("stream", text="/home/someone/x\n")]
    nbformat.write(lesson, str(tmp_path / "notebooks" / "00_x.ipynb"))
    problems = "\n".join(nbtools.check(tmp_path))
    assert "exercises/01_x.ipynb: missing" in problems
    assert "has outputs" in problems and "execution count" in problems and "machine path" in problems
    nbtools.generate_exercises(tmp_path)
    nbtools.strip_files(nbtools.all_notebooks(tmp_path))
    assert nbtools.check(tmp_path) == []
    ex = json.loads((tmp_path / "exercises" / "01_x.ipynb").read_text())
    meta = [c["metadata"]["nbgrader"] for c in ex["cells"]]
    assert meta[0]["solution"] and not meta[0]["grade"]
    assert meta[1]["grade"] and meta[1]["locked"] and meta[1]["points"] == 1
