"""Autograde a classroom's submissions, each in a sandbox it cannot escape.

    python -m utils.autograde ps01 [--course-dir DIR] [--student alice ...] [--jobs 2]

The course directory has nbgrader's layout (the notebooks of ``solutions/`` are valid nbgrader
source notebooks)::

    DIR/source/ps01/*.ipynb                   the instructor's notebooks: check cells and points
    DIR/submitted/<student>/ps01/*.ipynb      what each student handed in
    DIR/autograded/<student>/ps01/*.ipynb     written here: the executed notebooks, for feedback
    DIR/gradebook.db                          written here: nbgrader's gradebook (its API)

For every student this process (the trusted side)

1. copies the submission's regular files to a fresh folder, and puts the instructor's version
   back into every locked cell (setup and check cells) of each notebook, as nbgrader does;
2. runs the notebooks in a bubblewrap sandbox: no network (own network namespace), the
   course's code read-only (its ``solutions/``, ``.git`` and the course directory hidden), a
   private ``/tmp`` of limited size, only this submission's files visible, its own PID
   namespace (every process dies with the sandbox), and limits on time per cell, time per
   notebook, memory (RLIMIT_AS) and processes (RLIMIT_NPROC, for a user other than root: run
   as root, the sandbox drops to ``nobody``);
3. reads the results from a pipe (bounded in size), scores each check cell with the points
   the *instructor's* notebook gives it (a check cell earns its points when it ran without an
   error, as in nbgrader), and only then writes the gradebook and the executed notebooks.

Nothing in the sandbox can write outside its own tmpfs. Submissions are graded in simulation
(the sandbox has no GPU device), with the same graders as on a GPU.

Requirements: Linux, bubblewrap (``apt-get install bubblewrap``), and either root or
unprivileged user namespaces. ``--check`` says whether the sandbox works on this machine.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# No import of the course's packages at module level: the same file runs inside the sandbox
# as a script (``python utils/autograde.py --inside ...``), where importing ``utils`` (torch,
# the simulators) would only cost time before the notebook imports it.
ROOT = Path(__file__).resolve().parent.parent

CHECK_HEADER = "# Check your answer"
#: Defaults for a classroom: a check cell of the course runs for seconds in simulation.
CELL_TIMEOUT = 300
SETUP_TIMEOUT = 600        # the instructor's own cells (locked, not graded): imports, data
NOTEBOOK_TIMEOUT = 1800
MEMORY_GB = 8.0            # RLIMIT_AS of each process in the sandbox (virtual memory)
MAX_PROCS = 128            # RLIMIT_NPROC: processes and threads of the sandbox's user
TMP_MB = 1024              # the sandbox's private /tmp (and the course's cache folder), in RAM
THREADS = 4                # OMP_NUM_THREADS etc.: torch would start one thread per core
SANDBOX_UID = 65534        # nobody, when run as root
#: What the trusted side reads back from one sandbox, at most.
MAX_RESULT_BYTES = 64 << 20
#: What one cell's outputs may hold in the executed notebook (text is cut, images dropped).
MAX_OUTPUT_CHARS = 20000
MAX_SUBMISSION_BYTES = 50 << 20
_STUDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")
#: Environment variables that reach the sandbox (the rest is cleared).
_PASS_ENV = ("COURSE_NO_SYSTEM_CUDA", "COURSE_SIMULATE", "COURSE_FULL_TRACEBACK", "LANG", "TZ")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing, or cannot create its namespaces on this machine."""


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
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


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
        if gid in src_cells:
            orig = src_cells[gid]
            nb.cells[i] = cell = copy.deepcopy(orig)
        elif _meta(cell).get("grade") or _meta(cell).get("locked"):
            cell.metadata.pop("nbgrader", None)      # not the instructor's: an ordinary cell
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def _copy_submission(src: Path, dest: Path) -> None:
    """Regular files only (a symbolic link could point at another student's files), at most
    ``MAX_SUBMISSION_BYTES`` in all."""
    total = 0
    for root, dirs, files in os.walk(src, followlinks=False):
        rel = Path(root).relative_to(src)
        dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink() and not d.startswith(".")]
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for f in files:
            p = Path(root) / f
            if p.is_symlink() or not p.is_file() or f.startswith("."):
                continue
            total += p.stat().st_size
            if total > MAX_SUBMISSION_BYTES:
                raise ValueError(f"the submission is larger than {MAX_SUBMISSION_BYTES >> 20} MB")
            shutil.copyfile(p, dest / rel / f, follow_symlinks=False)


# --------------------------------------------------------------------------------------
# The sandbox
# --------------------------------------------------------------------------------------
def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def _ancestors(path: Path):
    out = []
    for p in reversed(path.parents):
        if str(p) != "/":
            out.append(p)
    return out


class Limits:
    def __init__(self, cell_timeout=CELL_TIMEOUT, notebook_timeout=NOTEBOOK_TIMEOUT, memory_gb=MEMORY_GB,
                 max_procs=MAX_PROCS, tmp_mb=TMP_MB, threads=THREADS, setup_timeout=None):
        self.cell_timeout = float(cell_timeout)
        self.setup_timeout = float(max(cell_timeout, SETUP_TIMEOUT if setup_timeout is None else setup_timeout))
        self.notebook_timeout = float(notebook_timeout)
        self.memory_gb = float(memory_gb)
        self.max_procs = int(max_procs)
        self.tmp_mb = int(tmp_mb)
        self.threads = int(threads)


def bwrap_command(stage: Path, *, hidden=(), uid=SANDBOX_UID, limits: Limits, result_fd: int,
                  notebooks: list[str]) -> list[str]:
    """The bubblewrap command line that runs ``notebooks`` of the folder ``stage``."""
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
    # (a later mount hides what is under it).
    size = str(limits.tmp_mb << 20)
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    args += ["--perms", "1777", "--size", str(min(limits.tmp_mb, 256) << 20), "--tmpfs", "/dev/shm"]
    # Python and the course's code, read-only
    made = {Path("/tmp"), Path("/dev")}   # mounted above: their modes stay
    binds = []
    for p in (Path(sys.base_prefix), Path(sys.prefix), ROOT):
        p = p.resolve()
        if str(p).startswith("/usr/") or p in binds:
            continue
        binds.append(p)
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
            args += ["--tmpfs", str(h), "--remount-ro", str(h)]
        elif h.exists():
            args += ["--ro-bind", "/dev/null", str(h)]
    # private, size-limited, writable: the course's compile cache
    cache = ROOT / ".cache"            # the course's compile cache: empty and private in here
    cache.mkdir(exist_ok=True)         # (a mount point cannot be made inside a read-only bind)
    args += ["--perms", "1777", "--size", size, "--tmpfs", str(cache)]
    # the submission, read-only (the runner copies it into /tmp)
    args += ["--ro-bind", str(stage), "/submission", "--chdir", "/tmp"]
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": "/tmp/home", "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8", "JUPYTER_PLATFORM_DIRS": "1", "COURSE_AUTOGRADE_SANDBOX": "1",
        "OMP_NUM_THREADS": str(limits.threads), "MKL_NUM_THREADS": str(limits.threads),
        "NUMBA_NUM_THREADS": str(limits.threads), "OPENBLAS_NUM_THREADS": str(limits.threads),
    }
    for k in _PASS_ENV:
        if k in os.environ:
            env[k] = os.environ[k]
    args += ["--clearenv"]
    for k, v in env.items():
        args += ["--setenv", k, v]
    config = dict(uid=uid if root_mode else None, fd=result_fd, notebooks=notebooks,
                  cell_timeout=limits.cell_timeout, setup_timeout=limits.setup_timeout,
                  notebook_timeout=limits.notebook_timeout,
                  memory=int(limits.memory_gb * (1 << 30)), max_procs=limits.max_procs)
    args += [sys.executable, "-I", str(ROOT / "utils" / "autograde.py"), "--inside", json.dumps(config)]
    return args


_SANDBOX_OK: dict = {}


def sandbox_status() -> tuple[bool, str]:
    """``(True, "")`` when a sandbox starts here, else ``(False, why)`` (cached)."""
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
            status = (True, "")
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


def run_sandbox(stage: Path, notebooks: list[str], *, limits: Limits, uid=SANDBOX_UID, hidden=()) -> dict:
    """Run ``notebooks`` (names in ``stage``) in one sandbox; ``{name: result}`` as the runner
    reported them, or ``{"error": why}`` for every notebook if the sandbox failed."""
    r, w = os.pipe()
    cmd = bwrap_command(stage, hidden=hidden, uid=uid, limits=limits, result_fd=w, notebooks=notebooks)
    wall = limits.notebook_timeout * max(1, len(notebooks)) + 60
    proc = subprocess.Popen(cmd, pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
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
    results = {}
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and item.get("notebook") in notebooks and item["notebook"] not in results:
            results[item["notebook"]] = item
    for name in notebooks:
        if name not in results:
            tail = log.data.decode("utf-8", "replace").strip().splitlines()[-5:]
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


def _trim_outputs(cell) -> None:
    keep = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            text = out.get("text", "")
            text = "".join(text) if isinstance(text, list) else text
            if len(text) > MAX_OUTPUT_CHARS:
                text = text[:MAX_OUTPUT_CHARS // 2] + "\n... (cut) ...\n" + text[-MAX_OUTPUT_CHARS // 2:]
            out["text"] = text
        elif out.get("output_type") in ("display_data", "execute_result"):
            data = out.get("data", {})
            out["data"] = {k: v for k, v in data.items() if len(json.dumps(v)) <= 4 * MAX_OUTPUT_CHARS}
        elif out.get("output_type") == "error":
            out["traceback"] = [t[:MAX_OUTPUT_CHARS] for t in out.get("traceback", [])[-40:]]
            out["evalue"] = str(out.get("evalue", ""))[:MAX_OUTPUT_CHARS]
        keep.append(out)
    cell["outputs"] = keep


def _error_output(ename, evalue):
    from nbformat.v4 import new_output
    return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _execute(path: Path, cfg: dict) -> dict:
    """Run one notebook cell by cell; report each code cell's status."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from nbclient.util import run_sync
    from nbformat.v4 import new_code_cell

    nb = nbformat.read(str(path), as_version=4)
    cell_timeout = cfg["cell_timeout"]
    client = NotebookClient(nb, timeout=cell_timeout, allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}, record_timing=False,
                            shutdown_kernel="immediate", startup_timeout=120)
    statuses, seconds = {}, {}
    started = time.monotonic()
    last = [started]

    def executed(cell=None, cell_index=None, execute_reply=None, **_):
        statuses[cell_index] = (execute_reply or {}).get("content", {}).get("status", "error")
        now = time.monotonic()
        seconds[cell_index] = round(now - last[0], 3)
        last[0] = now
    client.on_cell_executed = executed
    stop = None
    try:
        with client.setup_kernel():
            seconds["kernel"] = round(time.monotonic() - started, 3)
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
                last[0] = time.monotonic()
                m = _meta(cell)
                timeout = cfg["setup_timeout"] if m.get("locked") and not m.get("grade") else cell_timeout
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
    except Exception as e:  # a kernel that does not start, and the like
        stop = stop or f"{type(e).__name__}: {e}"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            _trim_outputs(cell)
    return {"notebook": path.name, "statuses": {str(k): v for k, v in statuses.items()},
            "seconds": {str(k): v for k, v in seconds.items()},
            "stopped": stop, "executed": nbformat.writes(nb)}


def inside(config: str) -> int:
    cfg = json.loads(config)
    fd = cfg["fd"]
    if cfg.get("uid") is not None:
        _drop_privileges(int(cfg["uid"]))
    import resource
    _limit(resource.RLIMIT_NPROC, cfg["max_procs"])
    _limit(resource.RLIMIT_AS, cfg["memory"])
    _limit(resource.RLIMIT_CORE, 0)
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
    os.makedirs("/tmp/home", exist_ok=True)
    work = Path("/tmp/submission")
    shutil.copytree("/submission", work)
    for name in cfg["notebooks"]:
        try:
            res = _execute(work / name, cfg)
        except Exception as e:
            res = {"notebook": name, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(res) + "\n")
        out.flush()
    out.close()
    return 0


# --------------------------------------------------------------------------------------
# Grading (the trusted side)
# --------------------------------------------------------------------------------------
def _cell_passed(cell, status) -> bool:
    if status != "ok":
        return False
    return not any(o.get("output_type") == "error" for o in cell.get("outputs", []))


def score_notebook(to_run, source, result: dict) -> dict:
    """``{grade_id: {"score", "max", "status", "message"}}`` for the instructor's check cells.
    Which cell is which comes from ``to_run`` (built here), never from the sandbox's copy."""
    nbformat = _nbformat()
    points = grade_cells(source)
    scores = {gid: {"score": 0.0, "max": p, "status": "missing", "message": "the check cell is not in the submission"}
              for gid, p in points.items()}
    if "error" in result:
        for s in scores.values():
            s.update(status="not run", message=result["error"])
        return scores
    try:
        executed = nbformat.reads(result["executed"], as_version=4)
    except Exception as e:
        for s in scores.values():
            s.update(status="not run", message=f"unreadable result: {e}")
        return scores
    statuses = result.get("statuses", {})
    seen = {}
    for i, cell in enumerate(to_run.cells):
        gid = _meta(cell).get("grade_id")
        if gid not in points or not _meta(cell).get("grade"):
            continue
        status = statuses.get(str(i), "not run")
        out_cell = executed.cells[i] if i < len(executed.cells) else {}
        passed = (_cell_passed(out_cell, status) and len(executed.cells) == len(to_run.cells)
                  and _source(out_cell) == _source(cell))
        message = ""
        if not passed:
            errs = [o for o in out_cell.get("outputs", []) if o.get("output_type") == "error"]
            message = (f"{errs[-1].get('ename')}: {errs[-1].get('evalue')}" if errs
                       else {"not run": result.get("stopped") or "not run"}.get(status, status))
        # a check cell that appears twice must pass both times
        prev = seen.get(gid, True)
        seen[gid] = prev and passed
        scores[gid].update(score=points[gid] if seen[gid] else 0.0, status="passed" if seen[gid] else status,
                           message="" if seen[gid] else (message or scores[gid]["message"]))
    return scores


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
    """Record every score with nbgrader's API (the trusted side only)."""
    db = course / "gradebook.db"
    cid = _course_id(course) if course_id is None else course_id
    with gradebook(db, cid) as gb:
        gb.update_or_create_assignment(assignment)
        for nb_name, source in sources.items():            # nbgrader names a notebook by its stem
            gb.update_or_create_notebook(Path(nb_name).stem, assignment)
            for gid, pts in grade_cells(source).items():
                gb.update_or_create_grade_cell(gid, Path(nb_name).stem, assignment, max_score=pts, cell_type="code")
        for student, notebooks in report.items():
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
    """The folder the sandbox sees, and ``{notebook: merged notebook}``."""
    nbformat = _nbformat()
    sub = course / "submitted" / student / assignment
    stage = into / student
    stage.mkdir(parents=True)
    _copy_submission(sub, stage)
    merged, problems = {}, {}
    for name, source in sources.items():
        path = sub / name
        if path.is_symlink() or not path.is_file():
            problems[name] = "the notebook is not in the submission"
            continue
        try:
            if path.stat().st_size > MAX_SUBMISSION_BYTES:
                raise ValueError("the notebook is too large")
            submitted = nbformat.read(str(path), as_version=4)
            nb = merge(source, submitted)
        except Exception as e:
            problems[name] = f"the notebook cannot be read: {e}"
            continue
        (stage / name).write_text(nbformat.writes(nb), encoding="utf-8")
        merged[name] = nb
    for p in [stage, *stage.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return stage, merged, problems


def grade_submissions(course, assignment, *, students=None, limits: Limits | None = None, jobs=1,
                      uid=SANDBOX_UID, log=print) -> tuple[dict, dict, dict]:
    """Run every submission in its sandbox. Returns ``(report, sources, executed)``:
    ``report[student][notebook][grade_id] = {"score", "max", "status", "message"}``,
    the instructor's notebooks, and ``executed[student][notebook]`` (text, for feedback)."""
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
    sub_root = course / "submitted"
    if students is None:
        students = sorted(p.name for p in sub_root.iterdir() if (p / assignment).is_dir()) if sub_root.is_dir() else []
    for s in students:
        if not _STUDENT_RE.match(s):
            raise ValueError(f"not a student id: {s!r}")
    hidden = [course]
    report, executed = {}, {}
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
            sandbox_uid = free_uids.get()
            try:
                results = run_sandbox(stage, list(merged), limits=limits, uid=sandbox_uid,
                                      hidden=hidden) if merged else {}
            finally:
                free_uids.put(sandbox_uid)
            nbs = {}
            for name, source in sources.items():
                if name in problems:
                    nbs[name] = score_notebook(source, source, {"error": problems[name]})
                    continue
                nbs[name] = score_notebook(merged[name], source, results[name])
                if "executed" in results[name]:
                    executed.setdefault(student, {})[name] = results[name]["executed"]
            got = sum(s["score"] for n in nbs.values() for s in n.values())
            full = sum(s["max"] for n in nbs.values() for s in n.values())
            log(f"{student}: {got:g} of {full:g} ({time.monotonic() - t0:.1f} s)")
            return student, nbs

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for student, nbs in pool.map(one, students):
                report[student] = nbs
    return report, sources, executed


#: What of a cell's rich output reaches the instructor: no HTML or JavaScript from a sandbox.
_SAFE_MIME = ("text/plain", "image/png", "image/jpeg")


def write_feedback(course: Path, assignment: str, executed: dict) -> None:
    """The executed notebooks, under autograded/<student>/<assignment>/. They are the
    sandbox's output: re-validated here, with rich outputs cut down to text and images (a
    submission's HTML or JavaScript would run in the instructor's browser)."""
    nbformat = _nbformat()
    for student, nbs in executed.items():
        dest = Path(course) / "autograded" / student / assignment
        dest.mkdir(parents=True, exist_ok=True)
        for name, text in nbs.items():
            try:
                nb = nbformat.reads(text, as_version=4)
                nbformat.validate(nb)
            except Exception:
                continue
            for cell in nb.cells:
                for out in cell.get("outputs", []):
                    if "data" in out:
                        out["data"] = {k: v for k, v in out["data"].items() if k in _SAFE_MIME}
                        out["metadata"] = {}
            (dest / name).write_text(nbformat.writes(nb), encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m utils.autograde", description=__doc__.split("\n\n")[0])
    ap.add_argument("assignment", nargs="?")
    ap.add_argument("--course-dir", default=".", help="nbgrader's course directory (default: .)")
    ap.add_argument("--student", action="append", help="grade only this student (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="sandboxes at a time")
    ap.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT, help="seconds per cell")
    ap.add_argument("--setup-timeout", type=float, default=SETUP_TIMEOUT,
                    help="seconds for each of the instructor's own cells (locked, not graded)")
    ap.add_argument("--notebook-timeout", type=float, default=NOTEBOOK_TIMEOUT, help="seconds per notebook")
    ap.add_argument("--memory-gb", type=float, default=MEMORY_GB, help="virtual memory per process")
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
        print("the sandbox works here" if ok else why)
        return 0 if ok else 1
    if not args.assignment:
        ap.error("the assignment is required")
    course = Path(args.course_dir).resolve()
    limits = Limits(args.cell_timeout, args.notebook_timeout, args.memory_gb, args.max_procs,
                    setup_timeout=args.setup_timeout)
    try:
        report, sources, executed = grade_submissions(course, args.assignment, students=args.student,
                                                      limits=limits, jobs=args.jobs, uid=args.uid)
    except SandboxUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, sort_keys=True))
    if not args.no_gradebook:
        write_feedback(course, args.assignment, executed)
        db = write_gradebook(course, args.assignment, sources, report, args.course_id)
        print(f"scores written to {db}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--inside":
        # inside the sandbox, run as a script: nothing of the course is imported
        sys.exit(inside(sys.argv[2]))
    sys.exit(main())
