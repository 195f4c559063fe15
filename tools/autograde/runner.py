"""What runs inside the sandbox: it starts the kernel, runs a notebook cell by cell, reports.

The sandbox starts this file by path, ``python -I .../tools/autograde/runner.py CONFIG``
(``sandbox.bwrap_command`` writes ``CONFIG``, a JSON object). In isolated mode neither the
course nor this package is on ``sys.path``, so this module imports only the standard library
(and nbformat, nbclient and jupyter_client, inside functions): what the trusted side shares
with it (the statuses it reports, the caps on outputs, how a cell's nbgrader metadata is read,
the code that calls a learner's function on fresh inputs) is defined here, and the other
modules of ``tools.autograde`` import it from here.

It starts with ``CAP_SYS_ADMIN`` (as root, also ``CAP_SETUID`` and ``CAP_SETGID``): it limits
the files of each writable tmpfs (``nr_inodes``); as root, it makes a user namespace in which
only the sandbox's user exists and becomes that user in it (``_enter_user_namespace``); then
it starts itself again without any capability (``execv``), joins a new session keyring, and
only then reads a notebook.

From the first cell on, everything in the sandbox is untrusted: this process only reports, and
the trusted side validates what it reports (``scoring.clean_result``). After a check cell that
passed, it has the kernel call the learner's function on inputs drawn from a seed it picks then
(``VERIFY_SOURCE``) and sends the results back; the trusted side recomputes the inputs and the
float64 reference outside the sandbox and compares (``verify.py``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

#: What reaches the executed notebook: each cell, each notebook. The runner cuts outputs to
#: these while they arrive; ``feedback.safe_outputs`` again when it rebuilds the notebook.
MAX_CELL_OUTPUT_CHARS = 50000
MAX_NOTEBOOK_OUTPUT_CHARS = 1 << 20
MAX_OUTPUTS_PER_CELL = 50
#: The statuses the runner reports for a code cell.
RUNNER_STATUSES = ("ok", "error", "aborted", "timeout", "died", "not run", "refused", "protocol")

#: Why a check cell was not run: a cell before it changed how the kernel runs cells.
TAMPERED = ("a cell of this notebook changed how the kernel runs cells (an input or AST transformer, "
            "a pre-run hook, or IPython's own code): this check earns no points")


#: What the kernel sends back from calling a learner's function on fresh inputs, at most.
MAX_VERIFY_BYTES = 16 << 20

#: Run in the kernel after a check cell passed: ``_autograde_call(ns, calls, path)`` calls each
#: learner's function ``ns[call["fn"]]`` on the inputs ``make(shape, seed=seed + j)`` of each
#: shape (``make`` is ``"module:function"``, the topic's input maker) and writes every result,
#: a header and its bytes, to ``path``. A call of ``"kind": "ranks"`` (lesson 13) runs the
#: function as each world of ranks instead (``runtime.dist.run_ranks``), rank r's x
#: ``make(seed, r, n)`` for each size n (for the all-gather: only the chunk the rank owns,
#: ``owners(world, seed)[r]``, kept, the marker written elsewhere), and writes every rank's x
#: after the call, by world, size and rank (for the reduce-scatter with the chunk index it
#: returned in the header). Nothing here is trusted: the trusted side draws the same inputs
#: from the same seed itself, and compares the results with its float64 reference.
VERIFY_SOURCE = """
def _autograde_call(ns, calls, path):
    import importlib, json, struct
    import torch

    def resolve(spec):
        module, _, name = spec.partition(":")
        return getattr(importlib.import_module(module), name)

    def write(f, out, **extra):
        out = (out if isinstance(out, torch.Tensor) else torch.as_tensor(out)).detach().to("cpu")
        out = out.contiguous().reshape(-1)
        data = out.view(torch.uint8).numpy().tobytes() if out.numel() else b""
        head = json.dumps({"dtype": str(out.dtype).replace("torch.", ""),
                           "shape": list(out.shape), **extra}).encode()
        f.write(struct.pack("<II", len(head), len(data)) + head + data)

    def as_index(ret):
        if isinstance(ret, torch.Tensor) and ret.numel() == 1:
            try:
                ret = int(ret)
            except (ValueError, RuntimeError):
                pass
        if isinstance(ret, int) and not isinstance(ret, bool) and abs(ret) < 1 << 31:
            return ret
        try:
            return repr(ret)[:80]
        except Exception:
            return type(ret).__name__[:80]

    def rank_side(rank, world, fn, call):
        make, bounds, owners = resolve(call["make"]), resolve(call["bounds"]), resolve(call["owners"])
        out = []
        for n in call["sizes"]:
            x = make(call["seed"], rank, n)
            if call["collective"] == "all_gather":
                owned = owners(world, call["seed"])[rank]
                lo, hi = bounds(n, world)[owned]
                keep = x[lo:hi].clone()
                x.fill_(resolve(call["marker"]))
                x[lo:hi] = keep
                ret = fn(x, rank, world, owned)
            else:
                ret = fn(x, rank, world)
            out.append((x, as_index(ret) if call["collective"] == "reduce_scatter" else None))
        return out

    with open(path, "wb") as f:
        for call in calls:
            fn = ns[call["fn"]]
            if call.get("kind") == "ranks":
                from runtime.dist import run_ranks
                for world in call["worlds"]:
                    ranks = run_ranks(rank_side, world, fn, call, timeout_s=call["timeout_s"],
                                      stall_s=call["stall_s"])
                    for i in range(len(call["sizes"])):
                        for rank in range(world):
                            x, ret = ranks[rank][i]
                            write(f, x, **({} if ret is None else {"returned": ret}))
                continue
            make = resolve(call["make"])
            for j, shape in enumerate(call["shapes"]):
                inputs = make(tuple(shape), seed=call["seed"] + j, device="cpu")
                inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
                write(f, fn(*inputs))
    return "ok"
"""


def nbgrader_meta(cell) -> dict:
    """A cell's nbgrader metadata; ``{}`` where there is none, or it is not a dict."""
    m = cell.get("metadata", {})
    m = m.get("nbgrader", {}) if isinstance(m, dict) else {}
    return m if isinstance(m, dict) else {}


_MS_REMOUNT = 32
_MS_RELATIME = 1 << 21
_ST_RELATIME = 4096
_PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
#: keyctl(2) by machine (the C library has no wrapper): KEYCTL_JOIN_SESSION_KEYRING is 1.
_KEYCTL = {"x86_64": 250, "aarch64": 219, "ppc64le": 288, "s390x": 280, "riscv64": 219}


def _libc():
    import ctypes
    return ctypes.CDLL(None, use_errno=True)


def _limit_tmpfs(mounts) -> None:
    """Remount each writable tmpfs with a size and a number of files (``nr_inodes``): bubblewrap
    sets only the size, and empty files cost kernel memory that no size counts."""
    import ctypes
    libc = _libc()
    for m in mounts:
        path = m["path"].encode()
        flags = os.statvfs(m["path"]).f_flag
        keep = flags & (1 | 2 | 4 | 8 | 16 | 64 | 1024 | 2048)      # ro, nosuid, nodev, noexec, ...
        if flags & _ST_RELATIME:
            keep |= _MS_RELATIME
        data = f"size={int(m['size'])},nr_inodes={int(m['inodes'])}".encode()
        if libc.mount(None, path, None, ctypes.c_ulong(_MS_REMOUNT | keep), data) != 0:
            e = ctypes.get_errno()
            raise SystemExit(f"could not limit the files of {m['path']}: {os.strerror(e)}")


def _enter_user_namespace(uid: int) -> None:
    """(As root.) Go on in a new user namespace in which ``uid`` (and the group of that number)
    is itself and no other user exists, as ``uid``: keyrings of its own, no capability outside
    it. A child makes the namespace; this process, still root outside it, writes its maps,
    drops to ``uid`` too, waits for the child and exits with its status."""
    import ctypes
    libc = _libc()
    os.setgroups([])
    up_r, up_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(up_r)
        os.close(go_w)
        ok = libc.unshare(0x10000000) == 0                  # CLONE_NEWUSER
        if not ok:
            sys.stderr.write(f"could not create a user namespace: {os.strerror(ctypes.get_errno())}\n")
            sys.stderr.flush()
        os.write(up_w, b"u" if ok else b"e")
        if not ok or os.read(go_r, 1) != b"m":
            os._exit(1)
        os.close(up_w)
        os.close(go_r)
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        return
    os.close(up_w)
    os.close(go_r)
    if os.read(up_r, 1) == b"u":
        for name, text in (("uid_map", f"{uid} {uid} 1\n"), ("setgroups", "deny"), ("gid_map", f"{uid} {uid} 1\n")):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(text)
        os.write(go_w, b"m")
    os.closerange(3, 1 << 16)                                # the result pipe is the child's
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _capabilities() -> dict:
    with open("/proc/self/status") as f:
        return {k: int(v.strip(), 16) for k, v in (line.split(":", 1) for line in f if line.startswith("Cap"))}


def _drop_capabilities(argv) -> None:
    """Start this file again with no capability: ambient ones cleared, then ``execv`` (a
    process that is not uid 0 keeps none across it); no setuid program can give one back."""
    libc = _libc()
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.execv(sys.executable, [sys.executable, "-I", os.path.abspath(__file__), *argv])


def _new_session_keyring() -> str:
    """Join a new, empty session keyring, so that the kernel holds none of the grader's keys.
    (The user and persistent keyrings belong to the sandbox's user namespace: its own.)"""
    import ctypes
    import platform
    nr = _KEYCTL.get(platform.machine())
    if nr is None:
        return "unknown machine: no keyctl"
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(nr), ctypes.c_long(1), None) < 0:
        return os.strerror(ctypes.get_errno())
    return ""


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


def _evaluate(client, expr: str, timeout: float) -> tuple[str, str]:
    """``("ok", text)`` of ``expr`` evaluated in the kernel, ``("error", "Name: message")``, or
    ``("none", why)`` when no valid reply came."""
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
            return ("ok", text) if isinstance(text, str) else ("none", "not text")
        return "error", f"{value.get('ename')}: {value.get('evalue')}"[:2000]
    except Exception as e:  # no reply, a dead kernel, nonsense
        return "none", type(e).__name__


def _user_expression(client, expr: str, timeout: float):
    """The text of ``expr`` evaluated in the kernel, or ``None``."""
    status, text = _evaluate(client, expr, timeout)
    return text if status == "ok" else None


def _call_fresh(client, calls: list, timeout: float) -> dict:
    """Have the kernel call the learner's functions of one check cell on inputs drawn from a
    seed picked now (``VERIFY_SOURCE``); what it wrote, for the trusted side to compare."""
    import base64

    from nbclient.util import run_sync
    seed = int.from_bytes(os.urandom(4), "little") & 0x3FFFFFFF
    fd, path = tempfile.mkstemp(prefix="verify-", dir="/tmp")
    os.close(fd)
    calls = [dict(c, seed=seed + 1000 * k) for k, c in enumerate(calls)]
    expr = (f"(lambda g: (exec({VERIFY_SOURCE!r}, g), g['_autograde_call'](get_ipython().user_ns, "
            f"{calls!r}, {path!r}))[1])({{}})")
    status, text = _evaluate(client, expr, timeout)
    if status == "none":
        try:   # (a call that hangs: back to a kernel that answers)
            run_sync(client.km.interrupt_kernel)()
        except Exception:
            pass
    data = b""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_VERIFY_BYTES + 1)
        os.unlink(path)
    except OSError:
        pass
    if len(data) > MAX_VERIFY_BYTES:
        status, text, data = "error", f"the results are larger than {MAX_VERIFY_BYTES >> 20} MB", b""
    return {"seed": seed, "status": status, "message": text[:2000],
            "data": base64.b64encode(data).decode() if status == "ok" else ""}


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
    statuses, messages, seconds, verified = {}, {}, {}, {}
    to_verify = cfg.get("verify") or {}
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
                m = nbgrader_meta(cell)
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
                gid = m.get("grade_id")
                if graded and statuses.get(i) == "ok" and isinstance(gid, str) and to_verify.get(gid):
                    verified[i] = _call_fresh(client, to_verify[gid], cell_timeout)
    except Exception as e:  # a kernel that does not start, and the like
        stop = stop or f"{type(e).__name__}: {e}"
    return {"notebook": name, "statuses": {str(k): v for k, v in statuses.items()},
            "messages": {str(k): v for k, v in messages.items()},
            "seconds": {str(k): v for k, v in seconds.items()},
            "verified": {str(k): v for k, v in verified.items()},
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


def inside(config: str, again: bool = False) -> int:
    """Run the notebooks ``config`` names (its JSON) in this sandbox: limit the tmpfs and start
    again without capabilities, join a new session keyring, set the limits, then one line of
    JSON per notebook on the result pipe (only ``{"ready": true, ...}`` when it names none:
    ``sandbox_status`` asks that)."""
    cfg = json.loads(config)
    fd = cfg["fd"]
    in_sandbox = "tmpfs" in cfg                  # (bwrap_command's config; without it, a plain start)
    if in_sandbox and not again:
        # nothing but the result pipe and the standard streams goes on (anything inherited)
        os.closerange(3, fd)
        os.closerange(fd + 1, 1 << 16)
        _limit_tmpfs(cfg["tmpfs"])
        if cfg.get("root"):
            _enter_user_namespace(int(cfg["uid"]))
        _drop_capabilities([config, "again"])        # (does not return)
    if in_sandbox:
        caps = _capabilities()
        if any(caps.get(k, 0) for k in ("CapEff", "CapPrm", "CapAmb")):
            raise SystemExit(f"could not drop capabilities: {caps}")
        uid = int(cfg["uid"])
        if os.getresuid() != (uid,) * 3 or (cfg.get("root") and (os.getgroups() or os.getgid() != uid)):
            raise SystemExit(f"the sandbox runs as uid {os.getresuid()}, groups {os.getgroups()}, not {uid}")
    keyring = _new_session_keyring()
    import resource
    _limit(resource.RLIMIT_NPROC, cfg["max_procs"])
    _limit(resource.RLIMIT_AS, cfg["memory"])
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_FSIZE, cfg["fsize"])          # no file (a memfd too) above the tmpfs size
    _limit(resource.RLIMIT_NOFILE, min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)         # (inherited) a write past it fails with EFBIG
    os.set_inheritable(fd, False)                 # the kernel does not get the result pipe,
    try:                                          # nor, through /proc, this process's (not dumpable)
        _libc().prctl(4, 0, 0, 0, 0)              # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass
    out = os.fdopen(fd, "w", encoding="utf-8")
    if not cfg["notebooks"]:
        out.write(json.dumps({"ready": True, "uid": os.getuid(), "keyring": keyring or "new"}) + "\n")
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


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["again"]):
        sys.exit("usage: runner.py CONFIG (started by the sandbox: see tools/autograde/sandbox.py)")
    sys.exit(inside(sys.argv[1], again=sys.argv[2:] == ["again"]))
