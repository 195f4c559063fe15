"""``python -m tools.autograde``: the command line (see ``tools/autograde/__init__.py``)."""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from pathlib import Path

import tools.autograde as autograde
from tools.autograde import (
    Limits,
    SandboxUnavailable,
    grade_submissions,
    sandbox_status,
    write_feedback,
    write_gradebook,
)
from tools.autograde.feedback import terminal
from tools.autograde.sandbox import (
    CELL_TIMEOUT,
    MAX_PROCS,
    MEMORY_GB,
    NOTEBOOK_TIMEOUT,
    SANDBOX_MEMORY_GB,
    SANDBOX_UID,
    SETUP_TIMEOUT,
    TMP_FILES,
    TMP_MB,
)
from tools.autograde.submissions import STUDENT_RE


def _stop(signum, frame):
    raise SystemExit(128 + signum)          # the way out through every `finally`: no cgroup left


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.autograde", description=autograde.__doc__.split("\n\n")[0])
    ap.add_argument("assignment", nargs="?")
    ap.add_argument("--course-dir", default=".", help="nbgrader's course directory (default: .)")
    ap.add_argument("--student", action="append", help="grade only this student (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="sandboxes at a time")
    ap.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT, help="seconds per cell")
    ap.add_argument("--setup-timeout", type=float, default=SETUP_TIMEOUT,
                    help="seconds for each of the instructor's own cells (locked, not graded)")
    ap.add_argument("--notebook-timeout", type=float, default=NOTEBOOK_TIMEOUT, help="seconds per notebook")
    ap.add_argument("--memory-gb", type=float, default=MEMORY_GB, help="virtual memory per process (RLIMIT_AS)")
    ap.add_argument("--sandbox-memory-gb", type=float, default=SANDBOX_MEMORY_GB,
                    help="memory of a whole sandbox, its tmpfs and shared memory included (a cgroup, where available)")
    ap.add_argument("--tmp-mb", type=int, default=TMP_MB, help="size of the sandbox's /tmp and of its cache folder")
    ap.add_argument("--tmp-files", type=int, default=TMP_FILES,
                    help="files and folders in the sandbox's /tmp and in its cache folder, each (tmpfs nr_inodes)")
    ap.add_argument("--max-procs", type=int, default=MAX_PROCS, help="processes and threads in a sandbox")
    ap.add_argument("--uid", type=int, default=SANDBOX_UID,
                    help="user a sandbox runs as, when run as root (with --jobs N: this one and the N-1 below it)")
    ap.add_argument("--course-id", default=None, help="nbgrader course id (default: from nbgrader_config.py)")
    ap.add_argument("--no-gradebook", action="store_true", help="print the scores, write nothing")
    ap.add_argument("--json", help="also write the scores to this file")
    ap.add_argument("--check", action="store_true", help="only say whether the sandbox works here")
    args = ap.parse_args(argv)
    for stream in (sys.stdout, sys.stderr):      # whatever the terminal's encoding (names are escaped too)
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")
    if args.check:
        ok, why = sandbox_status()
        print(terminal(f"the sandbox works here; {why}" if ok else why))
        return 0 if ok else 1
    if not args.assignment:
        ap.error("the assignment is required")
    if not STUDENT_RE.match(args.assignment):
        ap.error(f"not an assignment name: {ascii(args.assignment)}")
    course = Path(args.course_dir).resolve()
    limits = Limits(args.cell_timeout, args.notebook_timeout, args.memory_gb, args.max_procs, tmp_mb=args.tmp_mb,
                    setup_timeout=args.setup_timeout, sandbox_memory_gb=args.sandbox_memory_gb,
                    tmp_files=args.tmp_files)
    old = None
    with contextlib.suppress(ValueError):        # (only the main thread may set it)
        old = signal.signal(signal.SIGTERM, _stop)
    try:
        report, sources, feedback = grade_submissions(course, args.assignment, students=args.student,
                                                      limits=limits, jobs=args.jobs, uid=args.uid)
    except SandboxUnavailable as e:
        print(terminal(f"error: {e}"), file=sys.stderr)
        return 2
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, sort_keys=True))
    if not args.no_gradebook:
        write_feedback(course, args.assignment, feedback)
        db = write_gradebook(course, args.assignment, sources, report, args.course_id)
        print(terminal(f"scores written to {db}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
