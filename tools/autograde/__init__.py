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
3. runs each notebook in its own bubblewrap sandbox (see ``bwrap_command``), started under
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
"""
from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import copy
import json
import os
import queue
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# No import of the course's packages at module level: the same file runs inside the sandbox
# as a script (``python -I tools/autograde/__init__.py --inside ...``), where importing ``utils``
# (torch, the simulators) would only cost time before the notebook imports it.
ROOT = Path(__file__).resolve().parents[2]

CHECK_HEADER = "# Check your answer"
#: Defaults for a classroom: a check cell of the course runs for seconds in simulation.
CELL_TIMEOUT = 300
SETUP_TIMEOUT = 600        # the instructor's own cells (locked, not graded): imports, data
NOTEBOOK_TIMEOUT = 1800
MEMORY_GB = 8.0            # RLIMIT_AS of each process in the sandbox (virtual memory)
SANDBOX_MEMORY_GB = 8.0    # the memory cgroup of a whole sandbox: processes, tmpfs, memfd, shm
MAX_PROCS = 128            # RLIMIT_NPROC: processes and threads of the sandbox's user
TMP_MB = 1024              # the sandbox's private /tmp (and the course's cache folder), in RAM
SHM_MB = 256               # its /dev/shm
THREADS = 4                # OMP_NUM_THREADS etc.: torch would start one thread per core
SANDBOX_UID = 65534        # nobody, when run as root
#: What the trusted side reads back from one sandbox, at most.
MAX_RESULT_BYTES = 64 << 20
#: What reaches the executed notebook: each text output, each cell, each notebook, each image.
MAX_OUTPUT_CHARS = 20000
MAX_CELL_OUTPUT_CHARS = 50000
MAX_NOTEBOOK_OUTPUT_CHARS = 1 << 20
MAX_OUTPUTS_PER_CELL = 50
MAX_IMAGE_BYTES = 2 << 20
#: A submission: bytes (the larger of a file's size and the disk blocks it holds), entries, depth.
MAX_SUBMISSION_BYTES = 50 << 20
MAX_SUBMISSION_FILES = 2000
MAX_SUBMISSION_DEPTH = 16
MAX_MESSAGE_CHARS = 1000
_STUDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")
#: Environment variables that reach the sandbox's runner (the rest is cleared).
_PASS_ENV = ("COURSE_NO_SYSTEM_CUDA", "COURSE_SIMULATE", "COURSE_FULL_TRACEBACK", "TZ")
#: The statuses a check cell can have in a report.
STATUSES = ("passed", "ok", "error", "aborted", "timeout", "died", "not run", "missing", "refused", "protocol")
_RUNNER_STATUSES = ("ok", "error", "aborted", "timeout", "died", "not run", "refused", "protocol")

TAMPERED = ("a cell of this notebook changed how the kernel runs cells (an input or AST transformer, "
            "a pre-run hook, or IPython's own code): this check earns no points")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing, or cannot create its namespaces on this machine."""


class SubmissionRefused(ValueError):
    """One student's submission cannot be graded; the message says why and names the student."""


def _printable(text, limit=MAX_MESSAGE_CHARS) -> str:
    """A string from the sandbox or a file name, safe to print in the instructor's terminal."""
    text = text if isinstance(text, str) else repr(text)
    text = "".join(c if c.isprintable() or c == "\n" else f"\\x{ord(c) & 0xff:02x}" for c in text)
    return text if len(text) <= limit else text[:limit] + " ..."


# --------------------------------------------------------------------------------------
# The instructor's notebooks and a submission's
# --------------------------------------------------------------------------------------
def _nbformat():
    import nbformat
    return nbformat


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _meta(cell) -> dict:
    m = cell.get("metadata", {})
    m = m.get("nbgrader", {}) if isinstance(m, dict) else {}
    return m if isinstance(m, dict) else {}


def grade_cells(nb) -> dict[str, float]:
    """``{grade_id: points}`` of a source notebook's graded cells, in order."""
    out = {}
    for cell in nb.cells:
        m = _meta(cell)
        if m.get("grade") and m.get("grade_id"):
            out[m["grade_id"]] = float(m.get("points", 0) or 0)
    return out


def merge(source, submitted):
    """The notebook to run: the student's cells, with every locked cell of the instructor's
    notebook (setup and check cells, found by ``grade_id``) put back as the instructor wrote
    it. A cell of the submission that claims to be graded but is not one of the instructor's
    loses that claim; outputs are cleared."""
    src_cells = {}
    for cell in source.cells:
        m = _meta(cell)
        if m.get("grade_id") and (m.get("locked") or m.get("grade")):
            src_cells[m["grade_id"]] = cell
    nb = copy.deepcopy(submitted)
    nb.metadata = copy.deepcopy(source.metadata)
    for i, cell in enumerate(nb.cells):
        gid = _meta(cell).get("grade_id")
        if isinstance(gid, str) and gid in src_cells:
            orig = src_cells[gid]
            nb.cells[i] = cell = copy.deepcopy(orig)
        elif _meta(cell).get("grade") or _meta(cell).get("locked"):
            cell.metadata.pop("nbgrader", None)      # not the instructor's: an ordinary cell
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def _open_dir(path, dir_fd=None, *, what: str) -> int:
    """A directory's descriptor, never through a symbolic link."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        raise SubmissionRefused(f"{what} cannot be opened ({e.strerror})") from None


def _copy_submission(src: Path, dest: Path, *, who: str = "the submission") -> list[str]:
    """Copy the regular files of ``src`` (not its links, devices or dot files) to ``dest``,
    through descriptors that never follow a link. Everything is measured before a byte is
    read: a hard link with a name outside this submission (the instructor's files, another
    student's) or an unreadable file refuses the submission, and so do more than
    ``MAX_SUBMISSION_BYTES`` (size or disk blocks, whichever is larger: a sparse file counts by
    its size), ``MAX_SUBMISSION_FILES`` entries or ``MAX_SUBMISSION_DEPTH`` levels. Returns the
    files copied (relative paths)."""
    todo, found, opened = [], [], []          # found: (dir fd, name, relative path, stat)
    total, entries_seen, names = 0, 0, {}
    top = _open_dir(src, what=who)
    opened.append(top)
    todo.append((top, Path("."), 0))
    try:
        while todo:                            # 1. look, without reading a file
            dfd, rel, depth = todo.pop()
            try:
                entries = sorted(os.scandir(dfd), key=lambda e: e.name)
            except OSError as e:
                raise SubmissionRefused(f"{who}/{rel} cannot be read ({e.strerror})") from None
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    continue
                entries_seen += 1
                if entries_seen > MAX_SUBMISSION_FILES:
                    raise SubmissionRefused(f"{who} holds more than {MAX_SUBMISSION_FILES} files and folders")
                path = rel / name
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError as e:
                    raise SubmissionRefused(f"{who}/{path} cannot be read ({e.strerror})") from None
                if stat.S_ISDIR(st.st_mode):
                    if depth + 1 > MAX_SUBMISSION_DEPTH:
                        raise SubmissionRefused(f"{who} nests folders more than {MAX_SUBMISSION_DEPTH} deep")
                    sub = _open_dir(name, dfd, what=f"{who}/{path}")
                    opened.append(sub)
                    if not os.path.samestat(st, os.fstat(sub)):
                        raise SubmissionRefused(f"{who}/{path} changed while it was read")
                    todo.append((sub, path, depth + 1))
                    found.append((dfd, name, path, st))
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue                     # links, devices, sockets, pipes: not part of it
                total += max(st.st_size, st.st_blocks * 512)
                if total > MAX_SUBMISSION_BYTES:
                    raise SubmissionRefused(
                        f"{who} is larger than {MAX_SUBMISSION_BYTES >> 20} MB (at {path}: "
                        f"{max(st.st_size, st.st_blocks * 512) / 2**20:.0f} MB)")
                names[(st.st_dev, st.st_ino)] = names.get((st.st_dev, st.st_ino), 0) + 1
                found.append((dfd, name, path, st))
        for dfd, name, path, st in found:      # 2. a hard link: every name inside this submission?
            if stat.S_ISREG(st.st_mode) and st.st_nlink > names[(st.st_dev, st.st_ino)]:
                raise SubmissionRefused(
                    f"{who}/{path} is a hard link to a file outside the submission (the same file has "
                    f"{st.st_nlink} names): hand in a copy of the file instead")
        files = []
        for dfd, name, path, st in found:      # 3. copy
            if stat.S_ISDIR(st.st_mode):
                (dest / path).mkdir(parents=True, exist_ok=True)
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except OSError as e:
                raise SubmissionRefused(f"{who}/{path} cannot be read ({e.strerror})") from None
            with os.fdopen(fd, "rb") as f:
                if not os.path.samestat(st, os.fstat(fd)):
                    raise SubmissionRefused(f"{who}/{path} changed while it was read")
                try:
                    data = f.read(st.st_size + 1)
                except OSError as e:
                    raise SubmissionRefused(f"{who}/{path} cannot be read ({e.strerror})") from None
            if len(data) != st.st_size:
                raise SubmissionRefused(f"{who}/{path} changed while it was read")
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            (dest / path).write_bytes(data)
            files.append(str(path))
    finally:
        for fd in opened:
            os.close(fd)
    return files


def _why_not_a_folder(path: Path, where: str, *, say_absent: bool, say_not_folder: bool) -> str | None:
    """None when ``path`` is a folder of its own (not a symbolic link); otherwise why not, or ""
    where it is skipped without a word (absent, or not a folder, and not to be said)."""
    try:
        st = os.lstat(path)
    except OSError:
        return f"there is no {where}" if say_absent else ""
    if stat.S_ISLNK(st.st_mode):
        return f"{where} is a symbolic link, not the student's own folder"
    if not stat.S_ISDIR(st.st_mode):
        return f"{where} is not a folder" if say_not_folder else ""
    return None


def find_submissions(course: Path, assignment: str, students=None) -> tuple[list[str], dict[str, str]]:
    """``(students to grade, {student: why not})``. Each entry of ``submitted/`` is looked at
    without following a link: a name that is not a student id, a student or assignment folder
    that is a symbolic link (or not a folder, or resolves anywhere but where it lies) is
    refused, with a message naming that entry; the rest are graded."""
    sub_root = Path(course) / "submitted"
    explicit = students is not None
    if students is None:
        try:
            students = sorted(os.listdir(sub_root)) if sub_root.is_dir() else []
        except OSError as e:
            raise FileNotFoundError(f"{sub_root} cannot be read: {e.strerror}") from None
    real_root = os.path.realpath(sub_root)
    ok, refused = [], {}
    for name in students:
        if not isinstance(name, str) or not _STUDENT_RE.match(name):
            refused[name] = (f"{ascii(name)}: not graded: the folder name is not a student id "
                             "(letters, digits and _ . @ + - only, at most 100, starting with a letter or digit)")
            continue
        where = f"submitted/{name}"
        why = _why_not_a_folder(sub_root / name, where, say_absent=explicit, say_not_folder=explicit)
        if why is None:
            where = f"{where}/{assignment}"
            why = _why_not_a_folder(sub_root / name / assignment, where, say_absent=explicit, say_not_folder=True)
        if why is None and os.path.realpath(sub_root / name / assignment) != os.path.join(real_root, name, assignment):
            why = f"{where} resolves outside submitted/{name}/"
        if why is None:
            ok.append(name)
        elif why:
            refused[name] = f"{name}: not graded: {why}"
    return ok, refused


# --------------------------------------------------------------------------------------
# What reaches the instructor: rebuilt on the trusted side, never taken as it came
# --------------------------------------------------------------------------------------
_SCHEME_RE = re.compile(
    "(?i)(" + "|".join("[\\s\\x00-\\x1f]*".join(w) for w in ("javascript", "vbscript", "livescript", "data"))
    + r")[\s\x00-\x1f]*:")
_B64_RE = re.compile(r"^[A-Za-z0-9+/=\s]*$")
_SAFE_MIME = ("text/plain", "image/png", "image/jpeg")


def safe_markdown(text: str) -> str:
    """A student's markdown with no HTML in it (every ``<`` and ``&`` escaped, so no tag,
    entity or autolink survives) and no ``javascript:``/``vbscript:``/``data:`` link (its colon
    becomes a full-width one)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    return _SCHEME_RE.sub(lambda m: m.group(1) + "\uff1a", text)


def _text(value) -> str:
    if isinstance(value, list):
        value = "".join(v for v in value if isinstance(v, str))
    return value if isinstance(value, str) else ""


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = max(0, limit // 2 - 40)
    return text[:half] + f"\n... ({len(text) - 2 * half} characters cut) ...\n" + text[-half:] if half else ""


def _image(value) -> str | None:
    value = _text(value)
    if not value or len(value) > MAX_IMAGE_BYTES * 4 // 3 + 16 or not _B64_RE.match(value):
        return None
    try:
        base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        return None
    return value


def safe_outputs(outputs, budget: list[int]) -> tuple[list, bool]:
    """The outputs of one cell, rebuilt from plain values: streams, errors, text and PNG/JPEG
    images only (no HTML, JavaScript, SVG or markdown from a sandbox); consecutive streams of
    one name merged; each text cut to ``MAX_OUTPUT_CHARS``, the cell to
    ``MAX_CELL_OUTPUT_CHARS`` and ``MAX_OUTPUTS_PER_CELL`` outputs, the notebook to
    ``budget[0]`` characters (decreased here). Errors are always kept (cut): they explain the
    score. Returns ``(outputs, had_error)``: whether any output, kept or not, was an error."""
    from nbformat.v4 import new_output
    items, had_error = [], False           # (kind, fields), streams merged, before any limit
    for o in outputs if isinstance(outputs, list) else []:
        if not isinstance(o, dict):
            continue
        kind = o.get("output_type")
        if kind == "error":
            had_error = True
            tb = o.get("traceback")
            tb = tb[-20:] if isinstance(tb, list) else []
            tb = [_cut(t, MAX_OUTPUT_CHARS // 4) for t in tb if isinstance(t, str)]
            items.append(("error", dict(ename=_cut(_text(o.get("ename")), 200),
                                        evalue=_cut(_text(o.get("evalue")), 2000), traceback=tb)))
        elif kind == "stream":
            name = o.get("name") if o.get("name") in ("stdout", "stderr") else "stdout"
            text = _text(o.get("text"))
            if items and items[-1][0] == "stream" and items[-1][1]["name"] == name:
                prev = items[-1][1]
                prev["size"] += len(text)
                if len(prev["text"]) < 2 * MAX_OUTPUT_CHARS:
                    prev["text"] += text[:2 * MAX_OUTPUT_CHARS]
                prev["tail"] = (prev["tail"] + text)[-MAX_OUTPUT_CHARS:]
            else:
                items.append(("stream", dict(name=name, text=text[:2 * MAX_OUTPUT_CHARS],
                                             tail=text[-MAX_OUTPUT_CHARS:], size=len(text))))
        elif kind in ("execute_result", "display_data"):
            data = o.get("data") if isinstance(o.get("data"), dict) else {}
            keep = {}
            if isinstance(data.get("text/plain"), (str, list)):
                keep["text/plain"] = _cut(_text(data["text/plain"]), MAX_OUTPUT_CHARS)
            for mime in ("image/png", "image/jpeg"):
                img = _image(data.get(mime))
                if img is not None:
                    keep[mime] = img
            if keep:
                count = o.get("execution_count")
                count = count if isinstance(count, int) and not isinstance(count, bool) else None
                items.append((kind, dict(data=keep, execution_count=count)))
    outs, cut = [], False
    left = min(MAX_CELL_OUTPUT_CHARS, max(0, budget[0]))
    for kind, f in items:
        if kind == "error":
            size = len(f["ename"]) + len(f["evalue"]) + sum(map(len, f["traceback"]))
            outs.append(new_output("error", **f))
        elif len(outs) >= MAX_OUTPUTS_PER_CELL or left <= 200:
            cut = True
            continue
        elif kind == "stream":
            limit = min(MAX_OUTPUT_CHARS, left)
            if f["size"] <= limit and len(f["text"]) == f["size"]:
                text = f["text"]
            else:
                half = limit // 2
                text = f["text"][:half] + f"\n... ({f['size'] - 2 * half} characters cut) ...\n" + f["tail"][-half:]
                cut = cut or f["size"] > MAX_OUTPUT_CHARS
            size = len(text)
            outs.append(new_output("stream", name=f["name"], text=text))
        else:
            data = dict(f["data"])
            if "text/plain" in data:
                data["text/plain"] = _cut(data["text/plain"], left)
            size = len(data.get("text/plain", "")) + sum(len(v) for k, v in data.items() if k != "text/plain") // 20
            if size > left:
                data = {k: v for k, v in data.items() if k == "text/plain"}
                size = len(data.get("text/plain", ""))
                cut = True
                if not data:
                    continue
            outs.append(new_output(kind, data=data, **({"execution_count": f["execution_count"]}
                                                        if kind == "execute_result" else {})))
        left -= size
        budget[0] -= size
    if cut:
        outs.append(new_output("stream", name="stderr", text=(
            f"\n[autograde] output was cut: at most {MAX_OUTPUT_CHARS} characters an output, "
            f"{MAX_CELL_OUTPUT_CHARS} and {MAX_OUTPUTS_PER_CELL} outputs a cell, "
            f"{MAX_NOTEBOOK_OUTPUT_CHARS} characters a notebook\n")))
    return outs, had_error


def feedback_notebook(to_run, executed, notes: dict[int, str]):
    """The executed notebook the instructor and the student see, built from ``to_run`` (the
    trusted merge: cells, sources, metadata) with the sandbox's outputs re-validated, markdown
    without HTML, raw cells that no exporter renders, and ``notes[i]`` (why check cell ``i``
    earned nothing) added to the cells."""
    from nbformat.v4 import new_output
    nb = copy.deepcopy(to_run)
    out_cells = executed.cells if executed is not None and len(executed.cells) == len(nb.cells) else None
    budget = [MAX_NOTEBOOK_OUTPUT_CHARS]
    for i, cell in enumerate(nb.cells):
        grader = _meta(cell)
        cell.metadata = {"nbgrader": copy.deepcopy(grader)} if grader else {}
        if cell.cell_type == "markdown" and not grader.get("locked"):   # (locked: the instructor's, put back)
            cell.source = safe_markdown(_source(cell))
            atts = cell.get("attachments")
            if isinstance(atts, dict):
                cell.attachments = {k: {m: v for m, v in a.items() if m in ("image/png", "image/jpeg") and _image(v)}
                                    for k, a in atts.items() if isinstance(k, str) and isinstance(a, dict)}
        elif cell.cell_type == "raw":
            cell.source = _source(cell)
        elif cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            if out_cells is not None and out_cells[i].get("cell_type") == "code":
                cell.outputs, _ = safe_outputs(out_cells[i].get("outputs"), budget)
                count = out_cells[i].get("execution_count")
                cell.execution_count = count if isinstance(count, int) and not isinstance(count, bool) else None
            if i in notes:
                cell.outputs.append(new_output("stream", name="stderr", text=f"[autograde] {notes[i]}\n"))
    return nb


# --------------------------------------------------------------------------------------
# The sandbox
# --------------------------------------------------------------------------------------
def find_bwrap() -> str | None:
    found = shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin:/usr/sbin:/sbin")
    return os.path.realpath(found) if found else None


def _ancestors(path: Path):
    out = []
    for p in reversed(path.parents):
        if str(p) != "/":
            out.append(p)
    return out


class Limits:
    def __init__(self, cell_timeout=CELL_TIMEOUT, notebook_timeout=NOTEBOOK_TIMEOUT, memory_gb=MEMORY_GB,
                 max_procs=MAX_PROCS, tmp_mb=TMP_MB, threads=THREADS, setup_timeout=None,
                 sandbox_memory_gb=SANDBOX_MEMORY_GB, shm_mb=SHM_MB):
        self.cell_timeout = float(cell_timeout)
        self.setup_timeout = float(max(cell_timeout, SETUP_TIMEOUT if setup_timeout is None else setup_timeout))
        self.notebook_timeout = float(notebook_timeout)
        self.memory_gb = float(memory_gb)
        self.sandbox_memory_gb = float(sandbox_memory_gb)
        self.max_procs = int(max_procs)
        self.tmp_mb = int(tmp_mb)
        self.shm_mb = int(min(shm_mb, tmp_mb))
        self.threads = int(threads)


class Cgroup:
    """A memory cgroup for one sandbox, or ``None`` from ``Cgroup.make`` where this user may
    not make one. cgroup v2 (the hierarchy's root, or this process's own cgroup or its parent,
    where the memory controller is delegated and writable) first, else v1's memory controller.
    The limit covers everything the sandbox's processes hold in RAM: their memory, the pages
    of its tmpfs (``/tmp``, ``/dev/shm``, the cache), memfd and shared memory."""

    _counter = [0]
    _lock = threading.Lock()

    def __init__(self, path: Path, version: int, extra=()):
        self.path, self.version, self.extra = path, version, list(extra)

    @staticmethod
    def where() -> tuple[Path, int] | tuple[None, str]:
        """``(parent folder, version)`` where sandboxes' cgroups can be made, or ``(None, why)``."""
        base = Path("/sys/fs/cgroup")
        try:
            own = Path(open("/proc/self/cgroup").read().split("0::", 1)[1].split("\n", 1)[0].strip("/"))
        except (OSError, IndexError):
            own = None
        v2 = [base] if (base / "cgroup.controllers").exists() else []
        if v2 and own is not None and str(own) not in ("", "."):
            v2 += [base / own.parent, base / own]
        for cand in v2:
            try:
                ctl = (cand / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if "memory" in ctl and os.access(cand, os.W_OK | os.X_OK):
                return cand, 2
        v1 = base / "memory"
        if (v1 / "memory.limit_in_bytes").exists() and os.access(v1, os.W_OK | os.X_OK):
            return v1, 1
        return None, ("no memory cgroup this user may create (cgroup v2 with the memory controller "
                      "delegated, or a writable cgroup v1 memory controller)")

    @classmethod
    def make(cls, limit_bytes: int, max_procs: int):
        parent, version = cls.where()
        if parent is None:
            return None
        with cls._lock:
            cls._counter[0] += 1
            name = f"course-autograde-{os.getpid()}-{cls._counter[0]}"
        path = parent / name
        try:
            path.mkdir()
        except OSError:
            return None
        cg = cls(path, version)
        try:
            if version == 2:
                (path / "memory.max").write_text(str(limit_bytes))
                for f, v in (("memory.swap.max", "0"), ("pids.max", str(max_procs + 16))):
                    if (path / f).exists():
                        with contextlib.suppress(OSError):
                            (path / f).write_text(v)
            else:
                (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
                pids = Path("/sys/fs/cgroup/pids")
                if (pids / "pids.max").exists() and os.access(pids, os.W_OK | os.X_OK):
                    with contextlib.suppress(OSError):
                        (pids / name).mkdir()
                        (pids / name / "pids.max").write_text(str(max_procs + 16))
                        cg.extra.append(pids / name)
        except OSError:
            cg.remove()
            return None
        return cg

    @property
    def procs(self) -> list[str]:
        return [str(p / "cgroup.procs") for p in (self.path, *self.extra)]

    def oom_kills(self) -> int:
        try:
            if self.version == 2:
                text = (self.path / "memory.events").read_text()
                return int(re.search(r"oom_kill (\d+)", text).group(1))
            return int((self.path / "memory.failcnt").read_text())
        except (OSError, AttributeError, ValueError):
            return 0

    def remove(self) -> None:
        for p in (self.path, *self.extra):
            for _ in range(50):
                if not p.exists():
                    break
                with contextlib.suppress(OSError):
                    if (p / "cgroup.kill").exists():
                        (p / "cgroup.kill").write_text("1")
                    else:
                        for pid in (p / "cgroup.procs").read_text().split():
                            with contextlib.suppress(OSError):
                                os.kill(int(pid), signal.SIGKILL)
                try:
                    p.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


#: Trees of the machine that a sandbox sees read-only, and where a socket file may lie.
def _bound_trees() -> list[Path]:
    trees = []
    for p in (Path(sys.base_prefix), Path(sys.prefix), ROOT):
        p = p.resolve()
        if str(p).startswith("/usr/") or p in trees:
            continue
        trees.append(p)
    return trees


def socket_files(trees, skip=()) -> list[str]:
    """Socket files under ``trees`` (not under ``skip``). A read-only bind does not stop a
    ``connect`` to one, so each that lies in what a sandbox sees is covered with ``/dev/null``
    there: the small trees (``/etc``, the course) are looked at as each sandbox starts, the
    Python installations (tens of thousands of files, installed by a package manager) once a
    grading run; ``/usr`` and ``/lib`` belong to the system's packages, which install none."""
    found, skip = [], {str(p) for p in skip}
    for tree in trees:
        stack = [str(tree)]
        while stack:
            d = stack.pop()
            try:
                with os.scandir(d) as it:
                    for e in it:
                        try:
                            mode = e.stat(follow_symlinks=False).st_mode
                        except OSError:
                            continue
                        if stat.S_ISSOCK(mode):
                            found.append(e.path)
                        elif stat.S_ISDIR(mode) and e.name != ".git" and e.path not in skip:
                            stack.append(e.path)
            except OSError:
                continue
    return found


def python_socket_files() -> list[str]:
    """Socket files in the Python installations a sandbox sees (not the course's)."""
    return socket_files([t for t in _bound_trees() if t != ROOT.resolve()])


def _kernel_launcher() -> str:
    """The absolute path of ipykernel's launcher in this Python's site-packages."""
    import importlib.util
    spec = importlib.util.find_spec("ipykernel_launcher")
    if spec is None or not spec.origin:
        raise SandboxUnavailable("ipykernel is not installed in this Python")
    return os.path.realpath(spec.origin)


def bwrap_command(stage: Path, *, hidden=(), uid=SANDBOX_UID, limits: Limits, result_fd: int,
                  notebooks: list[str], cgroup: Cgroup | None = None, python_sockets=None) -> list[str]:
    """The command line that runs ``notebooks`` of the folder ``stage`` in a sandbox: bubblewrap,
    started under ``env -i`` (its own first process keeps no variable of the grader's) and,
    with ``cgroup``, from a shell that first moves itself into it."""
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    root_mode = os.geteuid() == 0
    args = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if root_mode:
        # bwrap as root needs no user namespace; the sandbox keeps only the right to become
        # `uid` (the runner drops to it first thing), so that RLIMIT_NPROC applies
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user"]
    # the system, read-only
    args += ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += ["--ro-bind", "/etc", "/etc"]
    # private, size-limited, writable: /tmp and /dev/shm. Mounted before Python and the course
    # are bound, so that a course or a virtual environment that lives under /tmp stays visible
    # (a later mount hides what is under it). No /run, /var or /home: the root is read-only.
    size = str(limits.tmp_mb << 20)
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    args += ["--perms", "1777", "--size", str(limits.shm_mb << 20), "--tmpfs", "/dev/shm"]
    # Python and the course's code, read-only
    made = {Path("/tmp"), Path("/dev")}   # mounted above: their modes stay
    binds = _bound_trees()
    for p in binds:
        for a in _ancestors(p):
            if a not in made and not str(a).startswith("/usr"):
                args += ["--perms", "0755", "--dir", str(a)]
                made.add(a)
        args += ["--ro-bind", str(p), str(p)]
    # what the sandbox must not see inside the course: solutions, history, the course folder
    for h in (ROOT / "solutions", ROOT / ".git", *hidden):
        h = Path(h).resolve()
        if not any(h == b or b in h.parents for b in binds):
            continue                                 # not bound into the sandbox: not there
        if h.is_dir():
            args += ["--size", "4096", "--tmpfs", str(h), "--remount-ro", str(h)]
        elif h.exists():
            args += ["--ro-bind", "/dev/null", str(h)]
    # socket files of the machine in what is bound: a read-only mount does not stop connect()
    hidden_dirs = [Path(h).resolve() for h in (ROOT / "solutions", ROOT / ".git", ROOT / ".cache", *hidden)]
    found = socket_files([Path("/etc"), ROOT.resolve()], skip=hidden_dirs)
    for s in python_socket_files() if python_sockets is None else python_sockets:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(s).st_mode):        # (still there: bwrap needs the target)
                found.append(s)
    for s in sorted(set(found)):
        if not any(Path(s).is_relative_to(h) for h in hidden_dirs):
            args += ["--ro-bind", "/dev/null", s]
    # private, size-limited, writable: the course's compile cache
    cache = ROOT / ".cache"            # the course's compile cache: empty and private in here
    cache.mkdir(exist_ok=True)         # (a mount point cannot be made inside a read-only bind)
    args += ["--perms", "1777", "--size", size, "--tmpfs", str(cache)]
    # the submission, read-only (the runner copies it into /tmp)
    args += ["--ro-bind", str(stage), "/submission", "--chdir", "/tmp"]
    # the root tmpfs (and the folders made on it) and /dev: read-only, so that nothing but the
    # size-limited tmpfs above can be written, whatever uid the sandbox runs as
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": "/tmp/home", "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1",
        "LANG": "C.UTF-8", "JUPYTER_PLATFORM_DIRS": "1", "COURSE_AUTOGRADE_SANDBOX": "1",
        "OMP_NUM_THREADS": str(limits.threads), "MKL_NUM_THREADS": str(limits.threads),
        "NUMBA_NUM_THREADS": str(limits.threads), "OPENBLAS_NUM_THREADS": str(limits.threads),
    }
    for k in _PASS_ENV:
        if k in os.environ:
            env[k] = os.environ[k][:200]
    args += ["--clearenv"]
    for k, v in env.items():
        args += ["--setenv", k, v]
    config = dict(uid=uid if root_mode else None, fd=result_fd, notebooks=notebooks,
                  cell_timeout=limits.cell_timeout, setup_timeout=limits.setup_timeout,
                  notebook_timeout=limits.notebook_timeout, launcher=_kernel_launcher(),
                  trusted=sorted({str(p) for p in (*binds, Path(sys.prefix), Path(sys.base_prefix), ROOT,
                                                   Path("/usr"))}),
                  memory=int(limits.memory_gb * (1 << 30)), max_procs=limits.max_procs,
                  fsize=int(limits.tmp_mb) << 20)
    args += [sys.executable, "-I", str(Path(__file__).resolve()), "--inside", json.dumps(config)]
    # bubblewrap's own process gets a clean environment too: env -i, a minimal explicit one
    cmd = ["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "LANG=C.UTF-8", *args]
    if cgroup is not None:
        cmd = ["/bin/sh", "-c", 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"',
               "sh", *cgroup.procs, "--", *cmd]
    return cmd


_SANDBOX_OK: dict = {}


def sandbox_status() -> tuple[bool, str]:
    """``(True, what bounds its memory)`` when a sandbox starts here, else ``(False, why)``
    (cached)."""
    if "status" in _SANDBOX_OK:
        return _SANDBOX_OK["status"]
    bwrap = find_bwrap()
    if bwrap is None:
        status = (False, "bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    elif not sys.platform.startswith("linux"):
        status = (False, "the sandbox needs Linux namespaces")
    else:
        with tempfile.TemporaryDirectory() as d:
            os.chmod(d, 0o755)
            r, w = os.pipe()
            try:
                cmd = bwrap_command(Path(d), limits=Limits(), result_fd=w, notebooks=[])
                proc = subprocess.run(cmd, pass_fds=(w,), capture_output=True, text=True, timeout=60)
            finally:
                os.close(w)
            data = os.read(r, 1 << 16)
            os.close(r)
        try:
            reply = json.loads(data.decode().splitlines()[-1])
        except (ValueError, IndexError):
            reply = {}
        if proc.returncode == 0 and reply.get("ready"):
            parent, version = Cgroup.where()
            status = (True, f"each sandbox's memory is bounded by a cgroup (v{version}, under {parent})"
                      if parent is not None else f"memory is bounded per process only (RLIMIT_AS): {version}")
        else:
            err = (proc.stderr or proc.stdout or "").strip().splitlines()
            status = (False, f"bubblewrap cannot start a sandbox here: {err[-1] if err else proc.returncode}"
                             " (root, or unprivileged user namespaces, are needed)")
    _SANDBOX_OK["status"] = status
    return status


class _Tail:
    """Reads a pipe to its end, keeping only the last ``keep`` bytes."""

    def __init__(self, f, keep=1 << 16):
        self.f, self.keep, self.data = f, keep, b""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            chunk = self.f.read(1 << 16)
            if not chunk:
                return
            self.data = (self.data + chunk)[-self.keep:]


def run_sandbox(stage: Path, notebooks: list[str], *, limits: Limits, uid=SANDBOX_UID, hidden=(),
                python_sockets=None) -> dict:
    """Run ``notebooks`` (names in ``stage``) in one sandbox; ``{name: result}`` as the runner
    reported them (not validated: see ``clean_result``), or ``{"error": why}`` for every
    notebook if the sandbox failed."""
    r, w = os.pipe()
    cgroup = Cgroup.make(int(limits.sandbox_memory_gb * (1 << 30)), limits.max_procs)
    try:
        cmd = bwrap_command(stage, hidden=hidden, uid=uid, limits=limits, result_fd=w, notebooks=notebooks,
                            cgroup=cgroup, python_sockets=python_sockets)
        wall = limits.notebook_timeout * max(1, len(notebooks)) + 60
        proc = subprocess.Popen(cmd, pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, env={}, cwd="/")
    except BaseException:
        os.close(r)
        os.close(w)
        if cgroup is not None:
            cgroup.remove()
        raise
    os.close(w)
    log = _Tail(proc.stdout)
    chunks, size, why = [], 0, None
    deadline = time.monotonic() + wall
    with os.fdopen(r, "rb", buffering=0) as pipe:
        os.set_blocking(pipe.fileno(), False)
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(pipe, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"the sandbox ran longer than {wall:.0f} s and was stopped"
                break
            if not sel.select(timeout=min(left, 1.0)):
                continue
            chunk = pipe.read(1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_RESULT_BYTES:
                why = f"the sandbox sent more than {MAX_RESULT_BYTES >> 20} MB of results"
                break
            chunks.append(chunk)
        sel.close()
    if why is not None:
        _kill(proc)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.wait()
    log.thread.join(timeout=5)
    oom = 0
    if cgroup is not None:
        oom = cgroup.oom_kills()
        cgroup.remove()
    if proc.returncode == 97 and cgroup is not None and not chunks:
        why = "the sandbox could not join its memory cgroup"
    results = {}
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(item, dict) and item.get("notebook") in notebooks and item["notebook"] not in results:
            results[item["notebook"]] = item
    for name in notebooks:
        if name not in results:
            tail = log.data.decode("utf-8", "replace").strip().splitlines()[-5:]
            if why is None and oom:
                why = "the sandbox ran out of memory and ended without a result"
            results[name] = {"notebook": name, "error": why or "the sandbox ended without a result"
                             + (":\n" + "\n".join(tail) if tail else "")}
    return results


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)      # bwrap; --die-with-parent takes the rest with it
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------------------
# Inside the sandbox (untrusted from the first cell on: it only reports)
# --------------------------------------------------------------------------------------
def _drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    with open("/proc/self/status") as f:
        caps = dict(line.split(":", 1) for line in f if line.startswith("Cap"))
    if int(caps["CapEff"].strip(), 16) or os.getuid() == 0:
        raise SystemExit("could not drop privileges")


def _limit(what, value):
    import resource
    resource.setrlimit(what, (value, value))


def _error_output(ename, evalue):
    from nbformat.v4 import new_output
    return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


#: Evaluated in the kernel as a user expression (not through IPython's input transformers,
#: which a cell could have changed): what decides how a cell's text becomes code that runs.
_PROBE = (
    "(lambda ip, ids: repr(["
    " ids(ip.input_transformers_cleanup), ids(ip.input_transformers_post), ids(ip.ast_transformers),"
    " ids(ip.input_transformer_manager.cleanup_transforms), ids(ip.input_transformer_manager.line_transforms),"
    " ids(ip.input_transformer_manager.token_transformers),"
    " id(ip.input_transformer_manager), id(ip.events), id(ip.events.callbacks), id(ip.compile),"
    " [(k, ids(v)) for k, v in sorted(ip.events.callbacks.items()) if k in ('pre_execute', 'pre_run_cell')],"
    " [(n, id(getattr(type(o), n, None)), id(getattr(getattr(type(o), n, None), '__code__', None)),"
    "   n in getattr(o, '__dict__', {})) for o, names in ("
    "   (ip, ('run_cell', 'run_cell_async', '_run_cell', 'transform_cell', 'transform_ast', 'run_ast_nodes',"
    "         'run_code', 'should_run_async', 'user_expressions')),"
    "   (ip.input_transformer_manager, ('transform_cell', 'do_token_transforms', 'do_one_token_transform')),"
    "   (ip.events, ('trigger',)), (ip.compile, ('__call__', 'ast_parse'))) for n in names]]))"
    "(__import__('IPython').get_ipython(), lambda seq: [id(f) for f in seq])"
)
#: The first thing run in a fresh kernel: what it imported and from where, then into the
#: copy of the submission (a data folder: with ``-P`` no folder of the kernel is on sys.path).
_STARTUP = ("(lambda os, sys: repr((list(sys.path), sorted({str(getattr(m, '__file__', None) or '')"
            " for m in list(sys.modules.values())}), os.chdir(WORK))))(__import__('os'), __import__('sys'))")


def _user_expression(client, expr: str, timeout: float):
    """The text of ``expr`` evaluated in the kernel, or ``None``."""
    from nbclient.util import run_sync
    try:
        msg_id = client.kc.execute("", silent=True, store_history=False, user_expressions={"x": expr},
                                   allow_stdin=False)
        old, client.timeout = client.timeout, timeout
        try:
            reply = run_sync(client.async_wait_for_reply)(msg_id)
        finally:
            client.timeout = old
        value = reply["content"]["user_expressions"]["x"]
        if value.get("status") == "ok":
            text = value["data"]["text/plain"]
            return text if isinstance(text, str) else None
    except Exception:  # no reply, a dead kernel, nonsense: None
        pass
    return None


def _make_client(nb, cfg: dict, *, work: str):
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient
    from nbformat.v4 import new_output

    class Client(NotebookClient):
        """Starts the kernel by absolute path, with ``python -P -s``; keeps the output of a
        cell and of the notebook within bounds while it arrives."""
        cell_chars: dict = {}    # (a class made for one notebook)
        notebook_chars = [0]   
        cut: set = set()       

        def create_kernel_manager(self):
            self.km = AsyncKernelManager(kernel_name="python3")
            self.km._kernel_spec = KernelSpec(
                argv=[sys.executable, "-P", "-s", cfg["launcher"], "-f", "{connection_file}"],
                display_name="Python 3 (autograde)", language="python", env={}, metadata={})
            return self.km

        def output(self, outs, msg, display_id, cell_index):
            out = super().output(outs, msg, display_id, cell_index)
            if out is None or out.get("output_type") == "error":
                return out
            size = len(json.dumps(out))
            used = self.cell_chars.get(cell_index, 0)
            if (used + size > MAX_CELL_OUTPUT_CHARS or self.notebook_chars[0] + size > MAX_NOTEBOOK_OUTPUT_CHARS
                    or len(outs) > MAX_OUTPUTS_PER_CELL):
                if outs and outs[-1] is out:
                    outs.pop()
                if cell_index not in self.cut:
                    self.cut.add(cell_index)
                    outs.append(new_output("stream", name="stderr", text=(
                        "\n[autograde] output was cut: at most "
                        f"{MAX_CELL_OUTPUT_CHARS} characters and {MAX_OUTPUTS_PER_CELL} outputs a cell, "
                        f"{MAX_NOTEBOOK_OUTPUT_CHARS} characters a notebook\n")))
                return None
            self.cell_chars[cell_index] = used + size
            self.notebook_chars[0] += size
            return out

    return Client(nb, timeout=cfg["cell_timeout"], allow_errors=True, kernel_name="python3",
                  record_timing=False, shutdown_kernel="immediate", startup_timeout=120)


def _execute(nb, name: str, cfg: dict, work: str) -> dict:
    """Run one notebook cell by cell; report each code cell's status."""
    import nbformat
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from nbclient.util import run_sync
    from nbformat.v4 import new_code_cell

    cell_timeout = cfg["cell_timeout"]
    client = _make_client(nb, cfg, work=work)
    statuses, messages, seconds = {}, {}, {}
    started = time.monotonic()
    last = [started]

    def executed(cell=None, cell_index=None, execute_reply=None, **_):
        content = execute_reply.get("content") if isinstance(execute_reply, dict) else None
        status = content.get("status") if isinstance(content, dict) else None
        if status in ("ok", "error", "aborted"):
            statuses[cell_index] = status
        else:
            statuses[cell_index] = "protocol"
            messages[cell_index] = (
                f"the kernel's reply to this cell was not valid (its status is a {type(status).__name__}, "
                "not one of ok, error, aborted): this check earns no points")
        now = time.monotonic()
        seconds[cell_index] = round(now - last[0], 3)
        last[0] = now
    client.on_cell_executed = executed
    stop = None
    kernel_dir = tempfile.mkdtemp(prefix="kernel-", dir="/tmp")     # empty: the kernel starts here
    env = {k: v for k, v in os.environ.items()}
    home = tempfile.mkdtemp(prefix="home-", dir="/tmp")
    env.update(HOME=home, IPYTHONDIR=os.path.join(home, ".ipython"), JUPYTER_CONFIG_DIR=os.path.join(home, ".jupyter"),
               JUPYTER_DATA_DIR=os.path.join(home, ".jupyter-data"),
               JUPYTER_RUNTIME_DIR=os.path.join(home, ".jupyter-run"), MPLCONFIGDIR=os.path.join(home, ".matplotlib"))
    probe_timeout = min(30.0, cell_timeout)
    try:
        with client.setup_kernel(cwd=kernel_dir, env=env):
            seconds["kernel"] = round(time.monotonic() - started, 3)
            startup = _user_expression(client, _STARTUP.replace('WORK', repr(work)), 60.0)
            bad = _untrusted_startup(startup, cfg)
            if bad:
                raise RuntimeError(f"the kernel did not start as it should: {bad}")
            baseline = _user_expression(client, _PROBE, probe_timeout)
            if baseline is None:
                raise RuntimeError("the kernel did not answer the runner's first question")
            dirty = False
            last[0] = time.monotonic()
            for i, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                if stop is not None:
                    statuses[i] = "not run"
                    continue
                if time.monotonic() - started > cfg["notebook_timeout"]:
                    stop = f"the notebook ran longer than {cfg['notebook_timeout']:.0f} s"
                    statuses[i] = "not run"
                    continue
                m = _meta(cell)
                locked, graded = bool(m.get("locked") or m.get("grade")), bool(m.get("grade"))
                if locked and _user_expression(client, _PROBE, probe_timeout) != baseline:
                    dirty = True
                if graded and dirty:
                    statuses[i], messages[i] = "refused", TAMPERED
                    dirty = False
                    continue
                last[0] = time.monotonic()
                timeout = cfg["setup_timeout"] if locked and not graded else cell_timeout
                client.timeout = timeout
                try:
                    client.execute_cell(cell, i)
                except CellTimeoutError:
                    statuses[i] = "timeout"
                    cell.outputs.append(_error_output(
                        "TimeoutError", f"this cell ran longer than {timeout:.0f} s and was interrupted"))
                    run_sync(client.km.interrupt_kernel)()
                    client.timeout = min(30.0, cell_timeout)
                    try:                    # back to a responsive kernel, or stop here
                        nb.cells.append(new_code_cell("pass"))
                        client.execute_cell(nb.cells[-1], len(nb.cells) - 1, store_history=False)
                    except Exception as e:
                        stop = f"the kernel did not respond after an interrupt ({type(e).__name__})"
                    finally:
                        nb.cells.pop()
                except DeadKernelError:
                    statuses[i] = "died"
                    cell.outputs.append(_error_output(
                        "DeadKernelError", "the kernel died (out of memory, or a crash) while running this cell"))
                    stop = "the kernel died"
                except Exception as e:  # nonsense from the kernel: this cell's result
                    statuses[i] = "protocol"
                    messages[i] = f"the kernel's messages for this cell were not valid ({type(e).__name__})"
                if locked and not graded:
                    new = _user_expression(client, _PROBE, probe_timeout)   # what the setup cell did
                    baseline = new if new is not None else baseline
    except Exception as e:  # a kernel that does not start, and the like
        stop = stop or f"{type(e).__name__}: {e}"
    return {"notebook": name, "statuses": {str(k): v for k, v in statuses.items()},
            "messages": {str(k): v for k, v in messages.items()},
            "seconds": {str(k): v for k, v in seconds.items()},
            "stopped": stop, "executed": nbformat.writes(nb)}


def _untrusted_startup(text, cfg) -> str:
    """Why the fresh kernel's sys.path or modules are not the trusted ones ('' when they are)."""
    import ast
    try:
        path, files, _ = ast.literal_eval(ast.literal_eval(text))   # the repr of a repr
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return "it did not say what it imported"
    trusted = tuple(p.rstrip("/") + "/" for p in cfg["trusted"])
    for p in path:
        if not isinstance(p, str) or not p.startswith("/"):
            return f"sys.path holds {p!r}"
        if (p.rstrip("/") + "/").startswith(trusted):
            continue   # the course or Python, bound read-only (also where they live under /tmp)
        if p in ("/tmp", "/submission") or p.startswith(("/tmp/", "/submission/")):
            return f"sys.path holds {p!r}"
    for f in files:
        if f and not f.startswith(trusted) and not f.startswith("<"):
            return f"it imported {f}"
    return ""


def inside(config: str) -> int:
    cfg = json.loads(config)
    fd = cfg["fd"]
    if cfg.get("uid") is not None:
        _drop_privileges(int(cfg["uid"]))
    import resource
    _limit(resource.RLIMIT_NPROC, cfg["max_procs"])
    _limit(resource.RLIMIT_AS, cfg["memory"])
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_FSIZE, cfg["fsize"])          # no file (a memfd too) above the tmpfs size
    _limit(resource.RLIMIT_NOFILE, min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)         # (inherited) a write past it fails with EFBIG
    os.set_inheritable(fd, False)                 # the kernel does not get the result pipe,
    try:                                          # nor, through /proc, this process's (not dumpable)
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass
    out = os.fdopen(fd, "w", encoding="utf-8")
    if not cfg["notebooks"]:
        out.write(json.dumps({"ready": True, "uid": os.getuid()}) + "\n")
        out.close()
        return 0
    import nbformat
    # read before any kernel runs: nothing in the sandbox can change what is graded
    notebooks = {}
    for name in cfg["notebooks"]:
        try:
            notebooks[name] = nbformat.reads(Path("/submission", name).read_text(encoding="utf-8"), as_version=4)
        except Exception as e:
            notebooks[name] = f"{type(e).__name__}: {e}"
    work = "/tmp/submission"              # the submission's files, as data the notebook may read
    shutil.copytree("/submission", work)
    for name, nb in notebooks.items():
        try:
            res = _execute(nb, name, cfg, work) if not isinstance(nb, str) else {"notebook": name, "error": nb}
        except Exception as e:
            res = {"notebook": name, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(res) + "\n")
        out.flush()
    out.close()
    return 0


# --------------------------------------------------------------------------------------
# Grading (the trusted side)
# --------------------------------------------------------------------------------------
def clean_result(result, n_cells: int) -> dict:
    """What the sandbox reported for one notebook, with every value checked: ``{"error": str}``
    or ``{"statuses": {int: str}, "messages": {int: str}, "stopped": str|None, "executed":
    notebook|None}``. Anything of the wrong type or size becomes a ``"protocol"`` status or an
    error, never an exception."""
    if not isinstance(result, dict):
        return {"error": "the sandbox's result was not valid"}
    if "error" in result:
        return {"error": _printable(result["error"]) if isinstance(result["error"], str)
                else "the sandbox's result was not valid"}
    statuses, messages = {}, {}
    raw = result.get("statuses")
    raw_msgs = result.get("messages") if isinstance(result.get("messages"), dict) else {}
    if not isinstance(raw, dict):
        return {"error": "the sandbox's result was not valid (no statuses)"}
    for k, v in list(raw.items())[:100000]:
        if not (isinstance(k, str) and k.isdigit() and int(k) < n_cells):
            continue
        statuses[int(k)] = v if isinstance(v, str) and v in _RUNNER_STATUSES else "protocol"
        msg = raw_msgs.get(k)
        if isinstance(msg, str) and msg:
            messages[int(k)] = _printable(msg)
        elif statuses[int(k)] == "protocol":
            messages[int(k)] = "the kernel's reply to this cell was not valid: this check earns no points"
    stopped = result.get("stopped")
    stopped = _printable(stopped) if isinstance(stopped, str) else None
    executed = None
    text = result.get("executed")
    if isinstance(text, str) and len(text) <= MAX_RESULT_BYTES:
        try:
            nb = _nbformat().reads(text, as_version=4)
            if isinstance(nb.get("cells"), list) and all(isinstance(c, dict) for c in nb.cells):
                executed = nb
        except Exception:  # not JSON, too deep, not a notebook
            executed = None
    return {"statuses": statuses, "messages": messages, "stopped": stopped, "executed": executed}


def score_notebook(to_run, source, result) -> tuple[dict, object]:
    """``({grade_id: {"score", "max", "status", "message"}}, feedback notebook or None)`` for
    the instructor's check cells. Which cell is which comes from ``to_run`` (built here), never
    from the sandbox's copy; the result is validated by ``clean_result`` first."""
    points = grade_cells(source)
    scores = {gid: {"score": 0.0, "max": p, "status": "missing", "message": "the check cell is not in the submission"}
              for gid, p in points.items()}
    result = clean_result(result, len(to_run.cells))
    if "error" in result:
        for s in scores.values():
            s.update(status="not run", message=result["error"])
        return scores, None
    executed = result["executed"]
    if executed is None:
        for s in scores.values():
            s.update(status="not run", message="the sandbox sent no readable notebook")
        return scores, None
    statuses, messages = result["statuses"], result["messages"]
    same_shape = len(executed.cells) == len(to_run.cells)
    seen, notes = {}, {}
    budget = [MAX_NOTEBOOK_OUTPUT_CHARS]
    for i, cell in enumerate(to_run.cells):
        gid = _meta(cell).get("grade_id")
        if gid not in points or not _meta(cell).get("grade"):
            continue
        status = statuses.get(i, "not run")
        out_cell = executed.cells[i] if i < len(executed.cells) else {}
        outs, had_error = safe_outputs(out_cell.get("outputs") if isinstance(out_cell, dict) else None, [budget[0]])
        passed = (status == "ok" and not had_error and same_shape and isinstance(out_cell, dict)
                  and _source(out_cell) == _source(cell))
        message = ""
        if not passed:
            errs = [o for o in outs if o.get("output_type") == "error"]
            if i in messages:
                message = messages[i]
            elif errs:
                message = _printable(f"{errs[-1].get('ename')}: {errs[-1].get('evalue')}")
            elif status == "not run":
                message = result["stopped"] or "not run"
            elif status == "ok":
                message = "the check cell that ran is not the instructor's"
            else:
                message = status
            if not errs:
                notes[i] = message       # an error output says it already
        # a check cell that appears twice must pass both times
        prev = seen.get(gid, True)
        seen[gid] = prev and passed
        scores[gid].update(score=points[gid] if seen[gid] else 0.0,
                           status="passed" if seen[gid] else ("error" if status == "ok" else status),
                           message="" if seen[gid] else (message or scores[gid]["message"]))
    return scores, feedback_notebook(to_run, executed, notes)


def _course_id(course: Path) -> str:
    cfg = course / "nbgrader_config.py"
    if cfg.exists():
        m = re.search(r"course_id\s*=\s*['\"]([^'\"]*)['\"]", cfg.read_text(errors="replace"))
        if m:
            return m.group(1)
    return ""


@contextlib.contextmanager
def gradebook(db: Path, course_id: str = ""):
    """nbgrader's Gradebook on ``db``. Opening an existing one runs nbgrader's ``alembic``
    script, which lies next to this Python: that folder goes first on PATH meanwhile."""
    from nbgrader.api import Gradebook
    old = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), old or ""])
    try:
        with warnings.catch_warnings():
            # nbgrader's add_submission trips SQLAlchemy's "not in session" warnings; harmless
            warnings.filterwarnings("ignore", message=".*not in session.*")
            with Gradebook(f"sqlite:///{db}", course_id=course_id) as gb:
                yield gb
    finally:
        if old is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = old


def write_gradebook(course: Path, assignment: str, sources: dict, report: dict, course_id: str | None = None) -> Path:
    """Record every score with nbgrader's API (the trusted side only). A folder name that is
    not a student id is not written."""
    db = course / "gradebook.db"
    cid = _course_id(course) if course_id is None else course_id
    with gradebook(db, cid) as gb:
        gb.update_or_create_assignment(assignment)
        for nb_name, source in sources.items():            # nbgrader names a notebook by its stem
            gb.update_or_create_notebook(Path(nb_name).stem, assignment)
            for gid, pts in grade_cells(source).items():
                gb.update_or_create_grade_cell(gid, Path(nb_name).stem, assignment, max_score=pts, cell_type="code")
        for student, notebooks in report.items():
            if not (isinstance(student, str) and _STUDENT_RE.match(student)):
                continue
            gb.update_or_create_student(student)
            try:
                gb.find_submission(assignment, student)
            except Exception:  # nbgrader's MissingEntry
                gb.add_submission(assignment, student)
            for nb_name, scores in notebooks.items():
                for gid, s in scores.items():
                    grade = gb.find_grade(gid, Path(nb_name).stem, assignment, student)
                    grade.auto_score = s["score"]
                    grade.needs_manual_grade = False
        gb.db.commit()
    return db


def _stage(course: Path, assignment: str, student: str, sources: dict, into: Path):
    """The folder the sandbox sees, and ``{notebook: merged notebook}`` (read from the copy,
    never again from the student's folder)."""
    nbformat = _nbformat()
    sub = course / "submitted" / student / assignment
    stage = into / student
    stage.mkdir(parents=True)
    _copy_submission(sub, stage, who=f"submitted/{student}/{assignment}")
    merged, problems = {}, {}
    for name, source in sources.items():
        path = stage / name
        if not path.is_file():
            problems[name] = "the notebook is not in the submission"
            continue
        try:
            submitted = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
            nb = merge(source, submitted)
        except Exception as e:  # not JSON, not UTF-8, too deep, not a notebook
            problems[name] = _printable(f"the notebook cannot be read: {type(e).__name__}: {e}", 300)
            continue
        path.write_text(nbformat.writes(nb), encoding="utf-8")
        merged[name] = nb
    for p in [stage, *stage.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return stage, merged, problems


def _refused(sources: dict, message: str, status="refused") -> dict:
    return {name: {gid: {"score": 0.0, "max": p, "status": status, "message": message}
                   for gid, p in grade_cells(src).items()} for name, src in sources.items()}


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
    nbformat = _nbformat()
    src_dir = course / "source" / assignment
    sources = {p.name: nbformat.read(str(p), as_version=4) for p in sorted(src_dir.glob("*.ipynb"))}
    if not sources:
        raise FileNotFoundError(f"no notebooks in {src_dir}")
    students, refused = find_submissions(course, assignment, students)
    report, feedback = {}, {}
    for name, message in refused.items():
        report[name] = _refused(sources, message)
        log(_printable(message))
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
            stage, merged, problems = _stage(course, assignment, student, sources, tmp)
            nbs = {}
            for name, source in sources.items():
                if name in problems:
                    nbs[name] = _refused({name: source}, f"{student}: {problems[name]}", "not run")[name]
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
            message = _printable(message)
            log(message)
            return student, _refused(sources, message)

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for student, nbs in pool.map(guarded, students):
                report[student] = nbs
    return report, sources, feedback


def write_feedback(course: Path, assignment: str, feedback: dict) -> None:
    """The executed notebooks, under autograded/<student>/<assignment>/: rebuilt by
    ``score_notebook`` (markdown without HTML, outputs cut down to text and images, limited),
    validated again here; a notebook that does not validate is not written."""
    nbformat = _nbformat()
    for student, nbs in feedback.items():
        if not _STUDENT_RE.match(student):
            continue
        dest = Path(course) / "autograded" / student / assignment
        dest.mkdir(parents=True, exist_ok=True)
        for name, nb in nbs.items():
            if isinstance(nb, str):
                try:
                    nb = nbformat.reads(nb, as_version=4)
                except Exception:
                    continue
            try:
                nbformat.validate(nb)
            except Exception:
                continue
            (dest / name).write_text(nbformat.writes(nb), encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.autograde", description=__doc__.split("\n\n")[0])
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
    ap.add_argument("--max-procs", type=int, default=MAX_PROCS, help="processes and threads in a sandbox")
    ap.add_argument("--uid", type=int, default=SANDBOX_UID,
                    help="user a sandbox runs as, when run as root (with --jobs N: this one and the N-1 below it)")
    ap.add_argument("--course-id", default=None, help="nbgrader course id (default: from nbgrader_config.py)")
    ap.add_argument("--no-gradebook", action="store_true", help="print the scores, write nothing")
    ap.add_argument("--json", help="also write the scores to this file")
    ap.add_argument("--check", action="store_true", help="only say whether the sandbox works here")
    ap.add_argument("--inside", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inside is not None:
        return inside(args.inside)
    if args.check:
        ok, why = sandbox_status()
        print(f"the sandbox works here; {why}" if ok else why)
        return 0 if ok else 1
    if not args.assignment:
        ap.error("the assignment is required")
    if not _STUDENT_RE.match(args.assignment):
        ap.error(f"not an assignment name: {ascii(args.assignment)}")
    course = Path(args.course_dir).resolve()
    limits = Limits(args.cell_timeout, args.notebook_timeout, args.memory_gb, args.max_procs, tmp_mb=args.tmp_mb,
                    setup_timeout=args.setup_timeout, sandbox_memory_gb=args.sandbox_memory_gb)
    try:
        report, sources, feedback = grade_submissions(course, args.assignment, students=args.student,
                                                      limits=limits, jobs=args.jobs, uid=args.uid)
    except SandboxUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, sort_keys=True))
    if not args.no_gradebook:
        write_feedback(course, args.assignment, feedback)
        db = write_gradebook(course, args.assignment, sources, report, args.course_id)
        print(f"scores written to {db}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--inside":
        # inside the sandbox, run as a script: nothing of the course is imported
        sys.exit(inside(sys.argv[2]))
    sys.exit(main())
