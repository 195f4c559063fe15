"""An instructor's path through nbgrader, done for real with solution 01.

    course/source/ps01/<solution notebook>        the solution, copied as it is
    nbgrader generate_assignment ps01             -> course/release/ps01/ (stubs, as exercises/)
    course/submitted/alice/ps01/<notebook>        a filled-in copy (the solution)
    course/submitted/bob/ps01/<notebook>          an unfilled copy (the release)
    nbgrader autograde ps01                       -> scores in course/gradebook.db

nbgrader runs with the course root on PYTHONPATH (the notebooks' ``import utils`` must work
from nbgrader's folders), and with the course's ClearSolutions, which puts
``NOT_SOLVED_YET;`` rather than a Python stub into CUDA C++ source strings.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from runtime.paths import ROOT

SOLUTION = ROOT / "solutions" / "01_threads_blocks_grids.ipynb"
ASSIGNMENT = "ps01"

CONFIG = """\
import tools.nbtools

c = get_config()
c.CourseDirectory.course_id = "gpu-kernels"
c.CourseDirectory.root = {root!r}
c.GenerateAssignment.preprocessors = tools.nbtools.GENERATE_ASSIGNMENT_PREPROCESSORS
c.ExecutePreprocessor.timeout = 300
"""


def _env_path() -> str:
    # nbgrader runs the `alembic` script of its environment: put that environment's bin/ first,
    # as activating it would
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = _env_path()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.mark.timeout(900)
@pytest.mark.skipif(not SOLUTION.exists(), reason="solutions/01_threads_blocks_grids.ipynb is not there yet")
def test_generate_assignment_and_autograde(tmp_path, monkeypatch):
    pytest.importorskip("nbgrader")
    monkeypatch.setenv("PATH", _env_path())  # the Gradebook below checks its database with alembic too
    from nbgrader.api import Gradebook

    course = tmp_path / "course"
    source = course / "source" / ASSIGNMENT
    source.mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(CONFIG.format(root=str(course)))
    shutil.copy(SOLUTION, source / SOLUTION.name)

    _nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
    released = course / "release" / ASSIGNMENT / SOLUTION.name
    assert released.exists()
    text = released.read_text()
    assert "BEGIN SOLUTION" not in text and "not solved yet" in text
    assert "YOUR CODE HERE" not in text, "nbgrader's own Python stub ended up in the release"
    # nbgrader's release and the course's exercises/ give a learner the same code
    release_code = [c.source for c in nbformat.read(str(released), as_version=4).cells if c.cell_type == "code"]
    exercise = ROOT / "exercises" / SOLUTION.name
    if exercise.exists():
        exercise_code = [c.source for c in nbformat.read(str(exercise), as_version=4).cells
                         if c.cell_type == "code"]
        assert release_code == exercise_code, "nbgrader's release differs from exercises/"

    for student, notebook in (("alice", SOLUTION), ("bob", released)):
        dest = course / "submitted" / student / ASSIGNMENT
        dest.mkdir(parents=True)
        shutil.copy(notebook, dest / SOLUTION.name)

    _nbgrader(course, "autograde", ASSIGNMENT, "--create", "--force")

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="gpu-kernels") as gb:
        alice = gb.find_submission(ASSIGNMENT, "alice")
        bob = gb.find_submission(ASSIGNMENT, "bob")
        assert alice.max_score > 0, "solution 01 has no graded check cells"
        print(f"alice (the solution): {alice.score} of {alice.max_score}; bob (the release): {bob.score}")
        assert alice.score == alice.max_score, f"the solution scored {alice.score} of {alice.max_score}"
        assert bob.max_score == alice.max_score
        assert bob.score == 0, f"the unfilled release scored {bob.score} of {bob.max_score}"
        # every graded cell of the unfilled copy failed because of a stub, not a crash
        nb = gb.find_submission_notebook(SOLUTION.stem, ASSIGNMENT, "bob")
        assert all(g.auto_score == 0 for g in nb.grades)
    autograded = course / "autograded" / "bob" / ASSIGNMENT / SOLUTION.name
    assert "not solved yet" in autograded.read_text()
