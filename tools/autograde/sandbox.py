"""The sandbox: bubblewrap's command line, the limits it sets, and one sandbox run.

``bwrap_command`` builds the sandbox (namespaces, read-only binds of the system, Python and
the course, hidden folders, socket files covered, tmpfs limited in size and in files) around
``runner.py``; ``run_sandbox`` runs it and reads back what the runner reports, within
``MAX_RESULT_BYTES`` and a wall-clock limit. Every sandbox has its own user namespace, and so
its own user and persistent keyrings: without root, bubblewrap makes it; as root, the runner
makes one in which only the sandbox's user exists (``SANDBOX_UID``, for whom RLIMIT_NPROC
applies) and becomes that user. The memory of a whole sandbox is bounded by a cgroup (v2
where the memory controller is delegated, else a writable v1 memory controller), else per
process only (RLIMIT_AS); ``sandbox_status`` says which. Every cgroup made is removed, on
every way out (``Cgroup.remove_all``).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tools import ROOT

from . import runner

#: The file the sandbox runs (by path: see runner.py).
RUNNER = Path(runner.__file__).resolve()
#: Defaults for a classroom: a check cell of the course runs for seconds in simulation.
CELL_TIMEOUT = 300
SETUP_TIMEOUT = 600        # the instructor's own cells (locked, not graded): imports, data
NOTEBOOK_TIMEOUT = 1800
MEMORY_GB = 8.0            # RLIMIT_AS of each process in the sandbox (virtual memory)
SANDBOX_MEMORY_GB = 8.0    # the memory cgroup of a whole sandbox: processes, tmpfs, memfd, shm
MAX_PROCS = 128            # RLIMIT_NPROC: processes and threads of the sandbox's user
TMP_MB = 1024              # the sandbox's private /tmp (and the course's cache folder), in RAM
SHM_MB = 256               # its /dev/shm
TMP_FILES = 32768          # files and folders in each of /tmp and the cache (tmpfs nr_inodes)
SHM_FILES = 4096           # in /dev/shm
THREADS = 4                # OMP_NUM_THREADS etc.: torch would start one thread per core
SANDBOX_UID = 65534        # nobody, when run as root
#: What the trusted side reads back from one sandbox, at most.
MAX_RESULT_BYTES = 64 << 20
#: Environment variables that reach the sandbox's runner (the rest is cleared).
_PASS_ENV = ("COURSE_NO_SYSTEM_CUDA", "COURSE_SIMULATE", "COURSE_FULL_TRACEBACK", "TZ")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing, or cannot create its namespaces on this machine."""


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
                 sandbox_memory_gb=SANDBOX_MEMORY_GB, shm_mb=SHM_MB, tmp_files=TMP_FILES, shm_files=SHM_FILES):
        self.cell_timeout = float(cell_timeout)
        self.setup_timeout = float(max(cell_timeout, SETUP_TIMEOUT if setup_timeout is None else setup_timeout))
        self.notebook_timeout = float(notebook_timeout)
        self.memory_gb = float(memory_gb)
        self.sandbox_memory_gb = float(sandbox_memory_gb)
        self.max_procs = int(max_procs)
        self.tmp_mb = int(tmp_mb)
        self.shm_mb = int(min(shm_mb, tmp_mb))
        self.threads = int(threads)
        self.tmp_files = int(tmp_files)
        self.shm_files = int(min(shm_files, tmp_files))


class Cgroup:
    """A memory cgroup for one sandbox, or ``None`` from ``Cgroup.make`` where this user may
    not make one. cgroup v2 (the hierarchy's root, or this process's own cgroup or its parent,
    where the memory controller is delegated and writable) first, else v1's memory controller.
    The limit covers everything the sandbox's processes hold in RAM: their memory, the pages
    of its tmpfs (``/tmp``, ``/dev/shm``, the cache), memfd and shared memory."""

    _counter = [0]
    _lock = threading.Lock()
    #: Every cgroup made by this process and not yet removed: ``remove_all`` takes them away
    #: (at the end of a grading run, and at exit).
    _made: dict = {}

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
        with cls._lock:
            cls._made[str(path)] = cg
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

    def remove(self, wait: float = 30.0) -> bool:
        """Kill what is left in it and remove it (and its pids cgroup); ``False`` if it is still
        there after ``wait`` seconds (its processes still exiting): ``remove_all`` tries again."""
        deadline = time.monotonic() + wait
        pause = 0.02
        for p in (self.path, *self.extra):
            while p.exists():
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
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(pause)
                    pause = min(1.0, pause * 2)
        with self._lock:
            self._made.pop(str(self.path), None)
        return True

    @classmethod
    def remove_all(cls, wait: float = 60.0) -> list[str]:
        """Remove every cgroup this process made that is still there; the paths left."""
        with cls._lock:
            left = list(cls._made.values())
        return [str(cg.path) for cg in left if not cg.remove(wait)]


atexit.register(Cgroup.remove_all, 10.0)


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
                  notebooks: list[str], cgroup: Cgroup | None = None, python_sockets=None,
                  verify=None) -> list[str]:
    """The command line that runs ``notebooks`` of the folder ``stage`` in a sandbox: bubblewrap,
    started under ``env -i`` (its own first process keeps no variable of the grader's) and,
    with ``cgroup``, from a shell that first moves itself into it. ``verify`` is what the
    runner has the kernel call after each check cell (``verify.plans``)."""
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    root_mode = os.geteuid() == 0
    args = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    # The runner limits the files of each tmpfs (CAP_SYS_ADMIN), then starts itself again without
    # any capability. As root bwrap needs no user namespace: the runner makes one in which only
    # `uid` exists and becomes `uid` in it (CAP_SETUID, CAP_SETGID), so that the sandbox has
    # keyrings of its own and RLIMIT_NPROC applies; otherwise bwrap makes the user namespace.
    args += ["--cap-drop", "ALL", "--cap-add", "CAP_SYS_ADMIN"]
    if root_mode:
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
    # /dev: its usual devices bound one by one (bubblewrap's --dev would nest a second user
    # namespace without root, in which the runner could not limit the files of a tmpfs)
    args += ["--proc", "/proc", "--perms", "0755", "--size", "65536", "--tmpfs", "/dev"]
    for d in ("null", "zero", "full", "random", "urandom", "tty"):
        if os.path.exists(f"/dev/{d}"):
            args += ["--dev-bind", f"/dev/{d}", f"/dev/{d}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        args += ["--symlink", target, f"/dev/{name}"]
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
    tmpfs = [dict(path="/tmp", size=limits.tmp_mb << 20, inodes=limits.tmp_files),
             dict(path="/dev/shm", size=limits.shm_mb << 20, inodes=limits.shm_files),
             dict(path=str(cache), size=limits.tmp_mb << 20, inodes=limits.tmp_files)]
    config = dict(root=root_mode, uid=uid if root_mode else os.getuid(), fd=result_fd, notebooks=notebooks, tmpfs=tmpfs,
                  verify=verify or {},
                  cell_timeout=limits.cell_timeout, setup_timeout=limits.setup_timeout,
                  notebook_timeout=limits.notebook_timeout, launcher=_kernel_launcher(),
                  trusted=sorted({str(p) for p in (*binds, Path(sys.prefix), Path(sys.base_prefix), ROOT,
                                                   Path("/usr"))}),
                  memory=int(limits.memory_gb * (1 << 30)), max_procs=limits.max_procs,
                  fsize=int(limits.tmp_mb) << 20)
    args += [sys.executable, "-I", str(RUNNER), json.dumps(config)]
    # bubblewrap's own process gets a clean environment too: env -i, a minimal explicit one
    cmd = ["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "LANG=C.UTF-8", *args]
    if cgroup is not None:
        cmd = ["/bin/sh", "-c", 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"',
               "sh", *cgroup.procs, "--", *cmd]
    return cmd


def _no_groups() -> dict:
    """As root, bubblewrap starts without supplementary groups (root's own among them)."""
    return {"extra_groups": []} if os.geteuid() == 0 else {}


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
                proc = subprocess.run(cmd, pass_fds=(w,), capture_output=True, text=True, timeout=60,
                                      **_no_groups())
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
                python_sockets=None, verify=None) -> dict:
    """Run ``notebooks`` (names in ``stage``) in one sandbox; ``{name: result}`` as the runner
    reported them (not validated: see ``clean_result``), or ``{"error": why}`` for every
    notebook if the sandbox failed."""
    cgroup = Cgroup.make(int(limits.sandbox_memory_gb * (1 << 30)), limits.max_procs)
    try:                  # the cgroup goes, whatever happens: an error, a timeout, an interrupt
        chunks, why, oom, returncode, tail = _run(stage, notebooks, limits=limits, uid=uid, hidden=hidden,
                                                  python_sockets=python_sockets, cgroup=cgroup, verify=verify)
    finally:
        if cgroup is not None:
            cgroup.remove()
    if returncode == 97 and cgroup is not None and not chunks:
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
            if why is None and oom:
                why = "the sandbox ran out of memory and ended without a result"
            results[name] = {"notebook": name, "error": why or "the sandbox ended without a result"
                             + (":\n" + "\n".join(tail) if tail else "")}
    return results


_RUNNING: set = set()       # the sandboxes' bubblewrap processes now running (``stop_all``)


def stop_all() -> None:
    """Kill every sandbox this process runs now (an interrupted grading run)."""
    for proc in list(_RUNNING):
        _kill(proc)


def _run(stage, notebooks, *, limits, uid, hidden, python_sockets, cgroup, verify):
    """One sandbox, to its end: ``(result chunks, why it was stopped or None, OOM kills, exit
    status, the last lines of its log)``."""
    r, w = os.pipe()
    try:
        cmd = bwrap_command(stage, hidden=hidden, uid=uid, limits=limits, result_fd=w, notebooks=notebooks,
                            cgroup=cgroup, python_sockets=python_sockets, verify=verify)
        wall = limits.notebook_timeout * max(1, len(notebooks)) + 60
        proc = subprocess.Popen(cmd, pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, env={}, cwd="/", **_no_groups())
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    _RUNNING.add(proc)
    try:
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
    except BaseException:
        _kill(proc)
        proc.wait()
        raise
    finally:
        _RUNNING.discard(proc)
    log.thread.join(timeout=5)
    oom = cgroup.oom_kills() if cgroup is not None else 0
    tail = log.data.decode("utf-8", "replace").strip().splitlines()[-5:]
    return chunks, why, oom, proc.returncode, tail


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)      # bwrap; --die-with-parent takes the rest with it
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
