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
2. copies every submission's regular files once, before any is graded (through file
   descriptors that never follow a link, each folder opened from the one above it), to a
   private folder, and puts the instructor's version of every locked cell (setup and check
   cells, locked markdown) into each notebook, the missing ones too; nothing is read from
   ``submitted/`` after that;
3. runs each notebook in its own bubblewrap sandbox (see ``sandbox.bwrap_command``), started under
   ``env -i``: no network, no socket file of the machine reachable, the course's code
   read-only, nothing writable but tmpfs limited in size and in files, its own user, PID and
   IPC namespaces and keyrings, limits on time, memory (RLIMIT_AS per process, and a memory
   cgroup for the whole sandbox where the machine lets this user make one) and processes. The
   kernel is started by the sandbox's runner from an empty working directory, by absolute path
   to ipykernel's launcher, with ``python -P -s``: nothing in the submission's folder can
   become a module, a config file or a startup file of the kernel. Before every check cell the
   runner verifies that no cell changed how the kernel runs cells (input and AST transformers,
   pre-run hooks, IPython's own methods); after a check cell that passed, it has the kernel
   call the learner's function again on inputs drawn from a seed it picks then;
4. validates everything the sandbox sends back (types, sizes), scores each check cell with the
   points the *instructor's* notebook gives it: a check cell earns them when it ran, unchanged,
   without an error (as in nbgrader) *and*, for a grader of ``verify.VERIFIERS``, when the
   results of that new call are right here, in this process, where no code of the learner's
   ran (``verify.compare``); only then it writes the gradebook and the executed notebooks,
   rebuilt here: markdown that makes no HTML and no link, outputs cut down to text and images,
   limited per cell and per notebook, no lone surrogate.

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
    verify.py        the learner's functions called again on fresh inputs: the plan, the comparison
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

from .feedback import feedback_notebook, printable, safe_markdown, safe_outputs, terminal
from .runner import TAMPERED
from .sandbox import (
    SANDBOX_UID,
    Cgroup,
    Limits,
    SandboxUnavailable,
    python_socket_files,
    run_sandbox,
    sandbox_status,
    stop_all,
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
from .verify import VERIFIERS, plans

__all__ = [
    "grade_submissions", "write_gradebook", "write_feedback", "gradebook", "sandbox_status", "find_submissions",
    "merge", "grade_cells", "score_notebook", "clean_result", "feedback_notebook", "safe_outputs", "safe_markdown",
    "Limits", "SandboxUnavailable", "SubmissionRefused", "STATUSES", "TAMPERED", "ROOT", "VERIFIERS", "plans",
    "import_course",
]


def import_course() -> None:
    """Import the course (``utils``) in this, the trusted, process: ``verify.compare`` computes
    the references with it. A folder of ``PATH`` that this user may not search is left out of
    ``PATH`` first (the course looks for a CUDA toolkit in each folder of ``PATH``: an ordinary
    user grading with root's ``PATH`` would stop there)."""
    path = os.environ.get("PATH")
    if path is not None:
        os.environ["PATH"] = os.pathsep.join(d for d in path.split(os.pathsep) if d and os.access(d, os.X_OK))
    import utils  # noqa: F401


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
    import_course()
    verify_plans = {}
    for name, source in sources.items():
        verify_plans[name], unverified = plans(source)
        for gid, calls in unverified.items():
            log(terminal(f"{name}, {gid}: scored from the kernel's report only, not verified outside the sandbox "
                         f"({'; '.join(calls)})"))
    students, refused = find_submissions(course, assignment, students)
    report, feedback = {}, {}
    for name, message in refused.items():
        report[name] = refused_report(sources, message)
        log(terminal(message))
    hidden = [course]
    python_sockets = python_socket_files()
    with tempfile.TemporaryDirectory(prefix="autograde-") as tmp:
        tmp = Path(tmp)
        os.chmod(tmp, 0o755)

        # every submission copied once, before any is graded: nothing is read from submitted/
        # after this (a folder swapped for a link meanwhile changes nothing)
        staged = {}
        for student in students:
            try:
                staged[student] = stage_submission(course, assignment, student, sources, tmp)
            except Exception as e:  # SubmissionRefused, or whatever it was: this student's result
                message = f"{student}: not graded: " + (str(e) if isinstance(e, SubmissionRefused)
                                                         else f"{type(e).__name__}: {e}")
                report[student] = refused_report(sources, printable(message))
                log(terminal(message))

        # one user per sandbox running at a time: RLIMIT_NPROC counts a user's processes
        # across the machine, so two sandboxes of one user would share their limit
        free_uids = queue.Queue()
        for k in range(max(1, jobs)):
            free_uids.put(uid - k)

        def one(student):
            t0 = time.monotonic()
            stage, merged, problems = staged[student]
            nbs = {}
            for name, source in sources.items():
                if name in problems:
                    nbs[name] = refused_report({name: source}, f"{student}: {problems[name]}", "not run")[name]
                    continue
                sandbox_uid = free_uids.get()
                try:
                    result = run_sandbox(stage, [name], limits=limits, uid=sandbox_uid, hidden=hidden,
                                         python_sockets=python_sockets, verify=verify_plans[name])[name]
                finally:
                    free_uids.put(sandbox_uid)
                nbs[name], fb = score_notebook(merged[name], source, result, verify_plans[name])
                if fb is not None:
                    feedback.setdefault(student, {})[name] = fb
            got = sum(s["score"] for n in nbs.values() for s in n.values())
            full = sum(s["max"] for n in nbs.values() for s in n.values())
            log(terminal(f"{student}: {got:g} of {full:g} ({time.monotonic() - t0:.1f} s)"))
            return nbs

        def guarded(student):
            try:
                return student, one(student)
            except Exception as e:  # whatever it was, it is this student's result
                message = f"{student}: not graded: {type(e).__name__}: {e}"
            log(terminal(message))
            return student, refused_report(sources, printable(message))

        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        done = False
        try:
            for student, nbs in pool.map(guarded, list(staged)):
                report[student] = nbs
            done = True
        finally:
            if not done:          # interrupted (Ctrl-C, SIGTERM): no new sandbox, the running ones end
                pool.shutdown(wait=False, cancel_futures=True)
                stop_all()
            pool.shutdown(wait=True)
            left = Cgroup.remove_all()
            if left:
                log(terminal(f"warning: these memory cgroups could not be removed: {', '.join(left)}"))
    return report, sources, feedback
