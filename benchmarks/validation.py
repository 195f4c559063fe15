"""Is a GPU validation call due? The last call's summary against the code here.

``bash .ci/gpu-validate.sh`` runs the unit tests and every notebook on a GPU and writes
``<gpu>-validation.txt`` (``h200-validation.txt`` on an H200), committed in
``benchmarks/results/validation/``. Its ``code:`` line names the commit tested
(``code: commit 1a2b3c4d5e6f``, possibly ``plus uncommitted changes``); an older summary
written by hand names it in its ``== call N: commit 1a2b3c4d5e6f`` headings (the last one
counts). ``python -m benchmarks --stale`` prints ``validation_report()``: the newest summary,
and which files under ``runtime/``, ``kernels/``, ``utils/``, ``notebooks/``, ``exercises/`` and
``solutions/`` changed since the commit it tested, committed or not. When git or that commit is missing here
it says so rather than guess.

This module reads files and asks git only (no torch, no ``utils``).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The code a validation call tests: a change here calls for a new one.
CODE_DIRS = ("runtime", "kernels", "utils", "notebooks", "exercises", "solutions")
#: How many changed paths the report names.
SHOWN = 5

_CODE_LINE = re.compile(r"^code:\s*commit\s+([0-9a-fA-F]{7,40})(\s+plus uncommitted changes)?", re.M)
_UNKNOWN_LINE = re.compile(r"^code:\s*commit unknown", re.M)
_CALL_LINE = re.compile(r"^==\s*call\s+\d+:\s*commit\s+([0-9a-fA-F]{7,40})", re.M)
_DATE_LINE = re.compile(r"^date:\s*(\S+)", re.M)
_GPU_LINE = re.compile(r"^gpu:\s*([^,\n]+)", re.M)
_EXIT_LINE = re.compile(r"pytest exit code (\d+)")
_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)
_CUT_LINE = re.compile(r"^cut short:", re.M)


def validation_files(results_dir: Path) -> list[Path]:
    """The GPU validation summaries, ``<gpu>-validation.txt`` (not ``cpu-validation.txt``)."""
    return sorted(p for p in Path(results_dir).glob("*-validation.txt") if p.name != "cpu-validation.txt")


def read_validation(path: Path) -> dict:
    """``{"path", "date", "gpu", "commit", "dirty", "status", "failed", "cut"}`` of one summary;
    ``commit`` None when it names none (``dirty``: the call tested uncommitted changes on top of
    it); ``status``: pytest's exit code (None when not written), ``failed``: the tests that
    failed or errored, ``cut``: the run stopped at its time budget before every test ran."""
    text = Path(path).read_text(errors="replace")
    date = _DATE_LINE.search(text)
    gpu = _GPU_LINE.search(text)
    codes = _EXIT_LINE.findall(text)
    out = dict(path=Path(path), date=date.group(1) if date else "", gpu=gpu.group(1).strip() if gpu else None,
               commit=None, dirty=False, status=int(codes[-1]) if codes else None,
               failed=_FAILED_LINE.findall(text), cut=bool(_CUT_LINE.search(text)))
    code = _CODE_LINE.search(text)
    if code:
        out.update(commit=code.group(1).lower(), dirty=bool(code.group(2)))
    elif not _UNKNOWN_LINE.search(text):
        calls = _CALL_LINE.findall(text)
        if calls:
            out["commit"] = calls[-1].lower()
    return out


def latest_validation(results_dir: Path) -> dict | None:
    """The most recent summary (by its ``date:`` line, then the file's time), or None."""
    found = [read_validation(p) for p in validation_files(results_dir)]
    if not found:
        return None
    return max(found, key=lambda v: (v["date"], v["path"].stat().st_mtime))


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def changes_since(commit: str, root: Path = ROOT) -> dict | None:
    """``{"changed": [paths], "uncommitted": [paths]}``: the files under ``CODE_DIRS`` that differ
    from ``commit`` here (the working tree, new files included), and which of them differ from
    ``HEAD`` too (not committed yet). None when git or the commit is not available."""
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        return None
    since = _git(root, "diff", "--name-only", commit, "--", *CODE_DIRS)
    head = _git(root, "diff", "--name-only", "HEAD", "--", *CODE_DIRS)
    new = _git(root, "ls-files", "--others", "--exclude-standard", "--", *CODE_DIRS)
    if since is None or head is None or new is None:
        return None
    new_files = set(new.splitlines())
    return dict(changed=sorted(set(since.splitlines()) | new_files),
                uncommitted=sorted(set(head.splitlines()) | new_files))


def _not_passed(v: dict) -> str | None:
    """Why a summary's call does not count as a passing validation, or None when it does."""
    if v["cut"]:
        return "it was cut short by its time budget before every test ran"
    if v["status"] not in (None, 0):
        failed = v["failed"]
        return (f"it did not pass (pytest exit code {v['status']}"
                + (f"; {len(failed)} failed, first {failed[0]}" if failed else "") + ")")
    return None


def validation_report(results_dir: Path, root: Path = ROOT) -> tuple[str, bool | None]:
    """One paragraph on the last GPU validation call, and whether a new one is due (None:
    unknown, git or the commit is missing here)."""
    dirs = ", ".join(f"{d}/" for d in CODE_DIRS)
    how = ("run `bash .ci/gpu-validate.sh` on the GPU at the final commit and commit its summary as "
           "benchmarks/results/validation/<gpu>-validation.txt")
    last = latest_validation(results_dir)
    if last is None:
        return (f"GPU validation: no <gpu>-validation.txt in {results_dir}, so nothing says which code was "
                f"last validated on a GPU: a validation call is due ({how})."), True
    what = f"the last call ({last['path'].name}" + (f", {last['date']}" if last["date"] else "") + ")"
    if not last["commit"]:
        return (f"GPU validation: {what} does not name the commit it tested, so whether code changed since "
                f"is unknown."), None
    tested = f"commit {last['commit'][:12]}" + (" plus uncommitted changes" if last["dirty"] else "")
    changes = changes_since(last["commit"], root)
    if changes is None:
        return (f"GPU validation: {what} tested {tested}, which git cannot show here (no git, or a copy "
                f"without that commit), so whether {dirs} changed since is unknown."), None
    changed, uncommitted = changes["changed"], changes["uncommitted"]
    caveat = (" It tested uncommitted changes as well, which git cannot show: the files it names may"
              " include some that call already covered.") if last["dirty"] else ""
    why = _not_passed(last)
    if not changed:
        if why:
            return (f"GPU validation: {what} tested {tested}, and nothing under {dirs} changed since, but {why}: "
                    f"a validation call is due ({how}).{caveat}"), True
        return f"GPU validation: {what} tested {tested}; nothing under {dirs} changed since.{caveat}", False
    shown = ", ".join(changed[:SHOWN]) + (f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else "")
    pending = f" ({len(uncommitted)} of them not committed yet)" if uncommitted else ""
    return (f"GPU validation: {what} tested {tested}. Since then {len(changed)} file(s) under {dirs} changed"
            f"{pending}: {shown}. A validation call is due: {how}.{caveat}"), True
