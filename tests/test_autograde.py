"""The sandboxed autograde (utils/autograde.py) against hostile submissions.

One tiny assignment (two Triton check cells, one point each) is handed in by two honest
students and by six hostile ones (nine attacks: two per submission where both can run, each
in front of its own check cell), and graded in one run of ``python -m utils.autograde``
(in-process ``main``). Each hostile submission earns nothing for what it tried, the honest ones
get full marks, and the instructor's files (the course's code, the course directory, the other
submissions, the rest of the gradebook) are unchanged.

Without bubblewrap these tests are skipped, with the reason; under CI (CI=true) they fail.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from utils import autograde
from utils.nbtools import KERNELSPEC, add_grading_metadata
from utils.paths import ROOT

ASSIGNMENT = "ps00"
NOTEBOOK = "tiny.ipynb"
CELL_TIMEOUT = 10          # the endless loop costs this much; a check cell here takes under 1 s
SETUP_TIMEOUT = 120        # the setup cell imports torch and the course
MAX_PROCS = 96

SETUP = """\
import utils
import torch
import triton
import triton.language as tl
"""
ADD = """\
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # TODO (about 4 lines): offsets of this program, mask, load x and y, store x + y
    ### BEGIN SOLUTION
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)
    ### END SOLUTION


def add(x, y):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    return out
"""
RELU = """\
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # TODO (about 4 lines): offsets of this program, mask, load x, store max(x, 0)
    ### BEGIN SOLUTION
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)
    ### END SOLUTION


def relu(x):
    out = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out
"""
# bob: right too, written differently
BOB_ADD = ADD.replace("BLOCK=1024", "BLOCK=256").replace("cdiv(x.numel(), 1024)", "cdiv(x.numel(), 256)")
BOB_RELU = RELU.replace("tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0)",
                        "tl.where(tl.load(x_ptr + offs, mask=mask) > 0, tl.load(x_ptr + offs, mask=mask), 0.0)")


def source_notebook():
    nb = new_notebook(cells=[
        new_markdown_cell("# A tiny assignment: add and ReLU in Triton"),
        new_code_cell(SETUP),
        new_code_cell(ADD),
        new_code_cell("# Check your answer\nutils.check_add(add)"),
        new_code_cell(RELU),
        new_code_cell("# Check your answer\nutils.check_relu(relu)"),
    ])
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    return add_grading_metadata(nb, "tiny")


def submission(add_src, relu_src, extra_after_setup=None):
    nb = source_notebook()
    nb.cells[2].source, nb.cells[4].source = add_src, relu_src
    if extra_after_setup:
        nb.cells.insert(2, new_code_cell(extra_after_setup))
    return nb


# Each attack sets `ok` when it worked; the launcher after it only returns a right answer then.
LAUNCHERS = {
    "add": """

def add(x, y):
    if not ok:
        raise RuntimeError("the attack failed")
    return x + y
""",
    "relu": """

def relu(x):
    if not ok:
        raise RuntimeError("the attack failed")
    return torch.relu(x)
""",
}


def attacks(course: Path, port: int) -> dict:
    """What a hostile student would try, each in a solution cell before its check cell."""
    alice_nb = course / "submitted" / "alice" / ASSIGNMENT / NOTEBOOK
    db = course / "gradebook.db"
    return {
        "reader": f"""\
import glob, os
ALICE = {str(alice_nb)!r}
found = [p for p in [ALICE, "../alice/{ASSIGNMENT}/{NOTEBOOK}", "/submission/../alice/{ASSIGNMENT}/{NOTEBOOK}"]
         if os.path.exists(p)]
found += glob.glob({str(course)!r} + "/submitted/*/*/*.ipynb") + glob.glob("/tmp/**/alice/**/*.ipynb", recursive=True)
try:
    open(ALICE).read()
except OSError as e:
    print("reading alice's notebook:", type(e).__name__)
print("found:", found)
ok = bool(found)""",
        "gradebook": f"""\
import sqlite3
DB = {str(db)!r}
try:
    print(open(DB, "rb").read(16))
    con = sqlite3.connect(DB)
    con.execute("UPDATE grade SET auto_score = 99")
    con.commit()
    ok = True
except Exception as e:
    print("the gradebook:", type(e).__name__, e)
    ok = False""",
        "writer": f"""\
TARGETS = [{str(ROOT / "utils" / "grading.py")!r}, {str(ROOT / "utils" / "_written_by_a_submission.py")!r},
           {str(course / "source" / ASSIGNMENT / NOTEBOOK)!r}, {str(course / "release_notes.txt")!r}]
ok = False
for t in TARGETS:
    try:
        with open(t, "a") as f:
            f.write("# written by a submission\\n")
        ok = True
    except OSError as e:
        print("writing", t, type(e).__name__, e.strerror)""",
        "net": f"""\
import socket
ok = False
for where in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
    try:
        socket.create_connection(where, timeout=3).close()
        ok = True
    except OSError as e:
        print("connecting to", where, type(e).__name__, e)""",
        # bounded: at most 2000 forks, children sleep 30 s; the sandbox's limit stops it far earlier
        "forks": """\
import os, time
forked, error = 0, None
for _ in range(2000):
    try:
        pid = os.fork()
    except OSError as e:
        error = f"{type(e).__name__}: {e}"
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    forked += 1
print(f"forked {forked} times, then {error}")
ok = False""",
        "memory": """\
import time
t0 = time.time()
try:
    hog = torch.ones(30 * 2**30 // 4)     # 30 GB, touched
    ok = True
except (RuntimeError, MemoryError) as e:
    print(f"30 GB: {type(e).__name__} after {time.time() - t0:.2f} s")
    ok = False""",
    }


def hostile_sources(course: Path, port: int) -> dict:
    """``{student: (add cell, relu cell)}``: two attacks per submission where both can run."""
    a = attacks(course, port)
    return {
        "mallory_snoop": (a["reader"] + LAUNCHERS["add"], a["gradebook"] + LAUNCHERS["relu"]),
        "mallory_escape": (a["writer"] + LAUNCHERS["add"], a["net"] + LAUNCHERS["relu"]),
        "mallory_resources": (a["memory"] + LAUNCHERS["add"], a["forks"] + LAUNCHERS["relu"]),
        "mallory_loop": ("""\
def add(x, y):
    while True:
        pass
""", RELU),
        "mallory_grader": ("""\
utils.check_add = lambda *a, **k: None        # switch the grader off


def add(x, y):
    return y
""", """\
import types
utils = types.SimpleNamespace(check_relu=lambda *a, **k: None)   # a fake utils for the check cell


def relu(x):
    return x
"""),
        "mallory_torch": ("""\
def add(x, y):
    return x + y                  # torch computes it: no kernel of the learner's runs
""", """\
def relu(x):
    return torch.relu(x)
"""),
    }


def _hash_tree(root: Path, skip=()) -> dict:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part in skip for part in rel.parts) or "__pycache__" in rel.parts:
            continue
        out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def _course_code_hash() -> dict:
    # (artifacts/: the browser test's screenshots, written while this one runs beside it)
    return _hash_tree(ROOT, skip={".git", ".venv", ".cache", "benchmarks", "notebooks", "exercises",
                                  "docs", ".pytest_cache", "node_modules", "artifacts"})


def _sandbox_processes() -> list[int]:
    """Processes on this machine started in a sandbox (they carry its environment marker)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"COURSE_AUTOGRADE_SANDBOX=1" in (d / "environ").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def _require_sandbox():
    ok, why = autograde.sandbox_status()
    if not ok:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the sandboxed autograde: {why} (.ci/install-sandbox.sh installs it)")
        pytest.skip(why)


class _Listener:
    """A TCP server on this machine's loopback: a sandbox with a network could reach it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Every submission graded in one run; what the tests below look at."""
    _require_sandbox()
    pytest.importorskip("nbgrader")

    course = tmp_path_factory.mktemp("course")
    (course / "source" / ASSIGNMENT).mkdir(parents=True)
    nbformat.write(source_notebook(), str(course / "source" / ASSIGNMENT / NOTEBOOK))
    (course / "release_notes.txt").write_text("instructor's notes\n")
    # a gradebook with an earlier assignment in it: no submission may touch it
    with autograde.gradebook(course / "gradebook.db") as gb:
        gb.update_or_create_assignment("ps-earlier")
        gb.update_or_create_notebook("old", "ps-earlier")
        gb.update_or_create_grade_cell("old-check-1", "old", "ps-earlier", max_score=5, cell_type="code")
        gb.update_or_create_student("zoe")
        gb.add_submission("ps-earlier", "zoe")
        gb.find_grade("old-check-1", "old", "ps-earlier", "zoe").auto_score = 3
        gb.db.commit()

    listener = _Listener()
    subs = {"alice": submission(ADD, RELU), "bob": submission(BOB_ADD, BOB_RELU)}
    for student, (add_src, relu_src) in hostile_sources(course, listener.port).items():
        subs[student] = submission(add_src, relu_src)
    for student, nb in subs.items():
        dest = course / "submitted" / student / ASSIGNMENT
        dest.mkdir(parents=True)
        nbformat.write(nb, str(dest / NOTEBOOK))

    course_before = _hash_tree(course, skip={"gradebook.db", "autograded"})
    code_before = _course_code_hash()
    t0 = time.monotonic()
    report_file = course.parent / f"{course.name}-report.json"
    try:
        rc = autograde.main([ASSIGNMENT, "--course-dir", str(course), "--jobs", "2",
                             "--cell-timeout", str(CELL_TIMEOUT), "--setup-timeout", str(SETUP_TIMEOUT),
                             "--notebook-timeout", "300",
                             "--max-procs", str(MAX_PROCS), "--memory-gb", "6", "--json", str(report_file)])
    finally:
        listener.close()
        stray = ROOT / "utils" / "_written_by_a_submission.py"
        created = stray.exists()
        stray.unlink(missing_ok=True)
    wall = time.monotonic() - t0
    assert rc == 0
    print(f"autograde of {len(subs)} submissions: {wall:.1f} s")
    outputs = {}
    for student in subs:
        nb = nbformat.read(str(course / "autograded" / student / ASSIGNMENT / NOTEBOOK), as_version=4)
        outputs[student] = "\n".join(
            o.get("text", "") if o.get("output_type") == "stream" else f"{o.get('ename')}: {o.get('evalue')}"
            for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.get("output_type") in ("stream", "error"))
    with autograde.gradebook(course / "gradebook.db") as gb:
        scores = {s: {g.name: g.score for g in gb.find_submission_notebook("tiny", ASSIGNMENT, s).grades}
                  for s in subs}
        zoe = gb.find_grade("old-check-1", "old", "ps-earlier", "zoe").score
    return dict(course=course, scores=scores, outputs=outputs, report=json.loads(report_file.read_text()),
                course_before=course_before, course_after=_hash_tree(course, skip={"gradebook.db", "autograded"}),
                code_before=code_before, code_after=_course_code_hash(), created=created, zoe=zoe,
                connections=listener.connections, leftovers=_sandbox_processes(), wall=wall)


CHECK_ADD, CHECK_RELU = "tiny-check-1", "tiny-check-2"


def _scores(graded, student):
    return graded["scores"][student][CHECK_ADD], graded["scores"][student][CHECK_RELU]


def test_honest_submissions_get_full_marks(graded):
    assert _scores(graded, "alice") == (1.0, 1.0), graded["outputs"]["alice"]
    assert _scores(graded, "bob") == (1.0, 1.0), graded["outputs"]["bob"]


def test_the_instructors_files_are_unchanged(graded):
    assert graded["course_after"] == graded["course_before"]       # sources, notes, every submission
    assert graded["code_after"] == graded["code_before"]           # the course's code
    assert not graded["created"]
    assert graded["zoe"] == 3                                       # the rest of the gradebook
    assert graded["leftovers"] == [], "processes of a sandbox outlived it"


def test_reading_another_submission(graded):
    assert _scores(graded, "mallory_snoop")[0] == 0.0
    out = graded["outputs"]["mallory_snoop"]
    assert "reading alice's notebook: FileNotFoundError" in out and "found: []" in out, out


def test_reading_or_changing_the_gradebook(graded):
    assert _scores(graded, "mallory_snoop")[1] == 0.0
    assert "the gradebook: FileNotFoundError" in graded["outputs"]["mallory_snoop"]


def test_writing_into_the_course(graded):
    assert _scores(graded, "mallory_escape")[0] == 0.0
    out = graded["outputs"]["mallory_escape"]
    # the course's files are read-only, and the course directory is not there at all
    assert "_written_by_a_submission.py OSError Read-only file system" in out, out
    assert "grading.py PermissionError" in out or "grading.py OSError Read-only file system" in out, out
    assert "release_notes.txt FileNotFoundError" in out and "tiny.ipynb FileNotFoundError" in out, out


def test_opening_a_socket(graded):
    assert _scores(graded, "mallory_escape")[1] == 0.0
    assert graded["connections"] == 0
    out = graded["outputs"]["mallory_escape"]
    assert "ConnectionRefusedError" in out and "Network is unreachable" in out, out


def test_a_30_gb_allocation(graded):
    assert _scores(graded, "mallory_resources")[0] == 0.0
    out = graded["outputs"]["mallory_resources"]
    assert "30 GB: RuntimeError after" in out, out
    assert float(out.split("30 GB: RuntimeError after ")[1].split(" s")[0]) < 2.0


def test_a_fork_bomb(graded):
    assert _scores(graded, "mallory_resources")[1] == 0.0
    out = graded["outputs"]["mallory_resources"]
    forked = int(out.split("forked ")[1].split(" times")[0])
    assert forked < MAX_PROCS and "Resource temporarily unavailable" in out, out


def test_an_endless_loop(graded):
    assert _scores(graded, "mallory_loop") == (0.0, 1.0)   # the next check still ran
    assert graded["report"]["mallory_loop"][NOTEBOOK][CHECK_ADD]["status"] == "timeout"


def test_replacing_a_grader(graded):
    assert _scores(graded, "mallory_grader") == (0.0, 0.0)
    msgs = {k: v["message"] for k, v in graded["report"]["mallory_grader"][NOTEBOOK].items()}
    assert "utils.check_add was replaced in this notebook: this check earns no points" in msgs[CHECK_ADD]
    assert "the name `utils` was rebound in this notebook: this check earns no points" in msgs[CHECK_RELU]


def test_launchers_that_call_torch(graded):
    assert _scores(graded, "mallory_torch") == (0.0, 0.0), graded["outputs"]["mallory_torch"]
    msgs = " ".join(v["message"] for v in graded["report"]["mallory_torch"][NOTEBOOK].values())
    assert "launch your kernel" in msgs, msgs


def test_the_sandbox_check_command(capsys):
    _require_sandbox()
    assert autograde.main(["--check"]) == 0
    assert "the sandbox works here" in capsys.readouterr().out
