"""What runs inside the sandbox: it starts the kernel, runs a notebook cell by cell, reports.

The sandbox starts this file by path, ``python -I .../tools/autograde/runner.py CONFIG``
(``sandbox.bwrap_command`` writes ``CONFIG``, a JSON object). In isolated mode neither the
course nor this package is on ``sys.path``, so this module imports only the standard library
(and nbformat, nbclient and jupyter_client, inside functions): what the trusted side shares
with it (the statuses it reports, the caps on outputs, how a cell's nbgrader metadata is read)
is defined here, and the other modules of ``tools.autograde`` import it from here.

From the first cell on, everything in the sandbox is untrusted: this process only reports, and
the trusted side validates what it reports (``scoring.clean_result``).
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


def nbgrader_meta(cell) -> dict:
    """A cell's nbgrader metadata; ``{}`` where there is none, or it is not a dict."""
    m = cell.get("metadata", {})
    m = m.get("nbgrader", {}) if isinstance(m, dict) else {}
    return m if isinstance(m, dict) else {}


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
    """Run the notebooks ``config`` names (its JSON) in this sandbox: drop privileges, set the
    limits, then one line of JSON per notebook on the result pipe (only ``{"ready": true}`` when
    it names none: ``sandbox_status`` asks that)."""
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: runner.py CONFIG (started by the sandbox: see tools/autograde/sandbox.py)")
    sys.exit(inside(sys.argv[1]))
