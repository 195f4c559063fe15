"""Autograde a classroom's submissions, each in a sandbox it cannot escape.

    python -m tools.autograde ps01 [--course-dir DIR] [--student alice ...] [--jobs 2]

The course directory has nbgrader's layout (the notebooks of ``solutions/`` are valid nbgrader
source notebooks)::

    DIR/source/ps01/*.ipynb                   the instructor's notebooks: check cells and points
    DIR/submitted/<student>/ps01/*.ipynb      what each student handed in
    DIR/autograded/<student>/ps01/*.ipynb     written here: the executed notebooks, for feedback
    DIR/gradebook.db                          written here: nbgrader's gradebook (its API)

For every student this process (the trusted side)

1. refuses, for that student only and with a message naming them, a folder name that is not a
   student id, a student or assignment folder that is a symbolic link or resolves elsewhere, a
   hard link, an unreadable file, and a submission over ``MAX_SUBMISSION_BYTES`` (counting the
   disk blocks a sparse file claims too, checked before anything is read);
2. copies the submission's regular files (through file descriptors that never follow a link)
   to a fresh folder, and puts the instructor's version back into every locked cell (setup and
   check cells) of each notebook, as nbgrader does;
3. runs each notebook in its own bubblewrap sandbox (see ``sandbox.bwrap_command``), started under
   ``env -i``: no network, no socket file of the machine reachable, the course's code
   read-only, nothing writable but size-limited tmpfs, its own PID namespace, limits on time,
   memory (RLIMIT_AS per process, and a memory cgroup for the whole sandbox where the machine
   lets this user make one) and processes. The kernel is started by the sandbox's runner from
   an empty working directory, by absolute path to ipykernel's launcher, with ``python -P -s``:
   nothing in the submission's folder can become a module, a config file or a startup file of
   the kernel. Before every check cell the runner verifies that no cell changed how the kernel
   runs cells (input and AST transformers, pre-run hooks, IPython's own methods);
4. validates everything the sandbox sends back (types, sizes), scores each check cell with the
   points the *instructor's* notebook gives it (a check cell earns its points when it ran,
   unchanged, without an error, as in nbgrader), and only then writes the gradebook and the
   executed notebooks, rebuilt here: markdown with its HTML escaped, outputs cut down to text
   and images, limited per cell and per notebook.

A failure of one submission (refused, crashed kernel, nonsense from the kernel) is that
student's result, with a message; the others are graded as usual. Submissions are graded in
simulation (the sandbox has no GPU device), with the same graders as on a GPU.

Requirements: Linux, bubblewrap (``apt-get install bubblewrap``), and either root or
unprivileged user namespaces. ``--check`` says whether the sandbox works on this machine.

The modules, each importing only those above it in this list:

    runner.py        what runs inside the sandbox (started by path; imports nothing of the course)
    sandbox.py       bubblewrap's command line, the limits, the cgroup, one sandbox run
    feedback.py      what reaches the instructor: messages, executed notebooks rebuilt and cut
    submissions.py   the submissions found, refused or copied, merged with the locked cells
    scoring.py       points, the sandbox's report validated and scored, the gradebook, autograded/
    __init__.py      ``grade_submissions``: all of it for one assignment (and the public names)
    __main__.py      the command line
"""
from __future__ import annotations

import os
import queue
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from tools import ROOT

from .feedback import feedback_notebook, printable, safe_markdown, safe_outputs
from .runner import TAMPERED
from .sandbox import (
    SANDBOX_UID,
    Limits,
    SandboxUnavailable,
    python_socket_files,
    run_sandbox,
    sandbox_status,
)
from .scoring import (
    STATUSES,
    clean_result,
    grade_cells,
    gradebook,
    refused_report,
    score_notebook,
    write_feedback,
    write_gradebook,
)
from .submissions import SubmissionRefused, find_submissions, merge, stage_submission

__all__ = [
    "grade_submissions", "write_gradebook", "write_feedback", "gradebook", "sandbox_status", "find_submissions",
    "merge", "grade_cells", "score_notebook", "clean_result", "feedback_notebook", "safe_outputs", "safe_markdown",
    "Limits", "SandboxUnavailable", "SubmissionRefused", "STATUSES", "TAMPERED", "ROOT",
]


def grade_submissions(course, assignment, *, students=None, limits: Limits | None = None, jobs=1,
                      uid=SANDBOX_UID, log=print) -> tuple[dict, dict, dict]:
    """Run every submission in its sandboxes (one per notebook). Returns ``(report, sources,
    feedback)``: ``report[student][notebook][grade_id] = {"score", "max", "status", "message"}``
    (a refused student's cells say why), the instructor's notebooks, and
    ``feedback[student][notebook]`` (the rebuilt executed notebook). One student's failure,
    whatever it is, is that student's result: the others are graded."""
    course = Path(course).resolve()
    limits = limits or Limits()
    ok, why = sandbox_status()
    if not ok:
        raise SandboxUnavailable(why)
    src_dir = course / "source" / assignment
    sources = {p.name: nbformat.read(str(p), as_version=4) for p in sorted(src_dir.glob("*.ipynb"))}
    if not sources:
        raise FileNotFoundError(f"no notebooks in {src_dir}")
    students, refused = find_submissions(course, assignment, students)
    report, feedback = {}, {}
    for name, message in refused.items():
        report[name] = refused_report(sources, message)
        log(printable(message))
    hidden = [course]
    python_sockets = python_socket_files()
    with tempfile.TemporaryDirectory(prefix="autograde-") as tmp:
        tmp = Path(tmp)
        os.chmod(tmp, 0o755)

        # one user per sandbox running at a time: RLIMIT_NPROC counts a user's processes
        # across the machine, so two sandboxes of one user would share their limit
        free_uids = queue.Queue()
        for k in range(max(1, jobs)):
            free_uids.put(uid - k)

        def one(student):
            t0 = time.monotonic()
            stage, merged, problems = stage_submission(course, assignment, student, sources, tmp)
            nbs = {}
            for name, source in sources.items():
                if name in problems:
                    nbs[name] = refused_report({name: source}, f"{student}: {problems[name]}", "not run")[name]
                    continue
                sandbox_uid = free_uids.get()
                try:
                    result = run_sandbox(stage, [name], limits=limits, uid=sandbox_uid, hidden=hidden,
                                         python_sockets=python_sockets)[name]
                finally:
                    free_uids.put(sandbox_uid)
                nbs[name], fb = score_notebook(merged[name], source, result)
                if fb is not None:
                    feedback.setdefault(student, {})[name] = fb
            got = sum(s["score"] for n in nbs.values() for s in n.values())
            full = sum(s["max"] for n in nbs.values() for s in n.values())
            log(f"{student}: {got:g} of {full:g} ({time.monotonic() - t0:.1f} s)")
            return nbs

        def guarded(student):
            try:
                return student, one(student)
            except SubmissionRefused as e:
                message = f"{student}: not graded: {e}"
            except Exception as e:  # whatever it was, it is this student's result
                message = f"{student}: not graded: {type(e).__name__}: {e}"
            message = printable(message)
            log(message)
            return student, refused_report(sources, message)

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for student, nbs in pool.map(guarded, students):
                report[student] = nbs
    return report, sources, feedback
