"""The sandboxed autograde (tools/autograde/) against hostile submissions.

One tiny assignment (two Triton check cells, one point each) is handed in by two honest
students and by hostile ones, and graded in one run of ``python -m tools.autograde`` as root
(in-process ``main``): six hostile notebooks (two attacks each, each in front of its own check
cell; files beside the notebook; markdown and outputs aimed at the instructor), five that
forge the verdict of a check in the kernel with wrong answers (a fake ``utils`` in
``sys.modules``, in ``/tmp``, in place of the setup cell or in ``builtins``; IPython's hooks;
the kernel's replies), a folder swapped for a link while the run goes on, and eight folders
refused before anything runs (links, a hard link, oversized and sparse files, folder names that
are not student ids). At the same time a second run, as an ordinary user (where the machine
allows), with an unreadable folder on ``PATH``, grades a notebook with right answers and a cell
of attacks, beside an unreadable submission. Each attack earns nothing, the honest students
get full marks, the runs finish, nbgrader's ``generate_feedback`` works on the gradebook, and
the instructor's files (the course's code, the course directory, the other submissions, the
rest of the gradebook) are unchanged. Smaller tests run a sandbox or two directly (keyrings,
files in each tmpfs, the memory cgroup on an error), or no sandbox at all (names in an ASCII
terminal, lone surrogates and links in the feedback, the comparison outside the sandbox, lesson
13's collectives run again as ranks included).

Without bubblewrap these tests are skipped, with the reason; under CI (CI=true) they fail.
"""
from __future__ import annotations

import base64
import copy
import ctypes
import glob
import hashlib
import html.parser
import io
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from runtime.paths import ROOT
from tools import autograde
from tools.autograde import runner, sandbox, verify
from tools.autograde.__main__ import main as autograde_main
from tools.nbtools import KERNELSPEC, add_grading_metadata

ASSIGNMENT = "ps00"
NOTEBOOK = "tiny.ipynb"
CELL_TIMEOUT = 30          # the endless loop costs this much; a check cell here takes about 1 s (unloaded)
SETUP_TIMEOUT = 120        # the setup cell imports torch and the course
MAX_PROCS = 96

SETUP = """\
import sys; sys.path.insert(0, "..")  # the course root, as the course's notebooks have it
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


SECRET = "grader-secret-5b7e1d"      # in the grader's environment: no sandbox may see it
TMP_MB = 96                          # the sandboxes' /tmp (and cache) in these tests
SANDBOX_MEMORY_GB = 2.0              # their memory cgroup, where the machine has one
UNPRIVILEGED_UID = 47113             # an ordinary user without a passwd entry (setuid by numbers)

FILL = """\
import os
def fill(path, mb):
    n = 0
    try:
        with open(path, "wb") as f:
            for _ in range(mb):
                f.write(b"\\0" * (1 << 20))
                n += 1
    except OSError as e:
        return n, f"{type(e).__name__}: {e.strerror}"
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return n, "no error"
filled = {}
for d in ["/", "/root", "/dev", "/etc", "/run", os.environ.get("HOME", "/"), "/tmp", "/dev/shm", %(cache)r]:
    filled[d] = fill(os.path.join(d, "fill.bin"), %(mb)d)
    print(f"fill {d}: {filled[d][0]} MB, {filled[d][1]}", flush=True)
ok = (any(n > %(cap)d for n, _ in filled.values())
      or any(filled[d][0] for d in ["/", "/root", "/dev", "/etc", "/run"]))"""

SECRETS = """\
import glob, os
SECRET = "-".join(%(secret)r)          # (not written out: the notebook's source is in the feedback)
seen = [k for k, v in os.environ.items() if SECRET in v]
for p in glob.glob("/proc/*/environ"):
    try:
        if SECRET.encode() in open(p, "rb").read():
            seen.append(p)
    except OSError:
        pass
print("secret seen in:", seen)
ok = bool(seen)"""

UNIX = """\
import socket
ok = False
for path in %(paths)r:
    try:
        c = socket.socket(socket.AF_UNIX)
        c.settimeout(3)
        c.connect(path)
        c.close()
        ok = True
        print("unix socket", path, "connected")
    except OSError as e:
        print("unix socket", path, type(e).__name__)"""


def attacks(course: Path, port: int, sockets=()) -> dict:
    """What a hostile student would try, each in a solution cell before its check cell."""
    alice_nb = course / "submitted" / "alice" / ASSIGNMENT / NOTEBOOK
    db = course / "gradebook.db"
    memfd_mb = int(SANDBOX_MEMORY_GB * 1024 * 1.5) if sandbox.Cgroup.where()[0] is not None else 256
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
ok = bool(found)
""" + SECRETS % {"secret": SECRET.split("-")} + "\nok = ok or bool(seen)",
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
           {str(ROOT / "tools" / "autograde" / "runner.py")!r},
           {str(course / "source" / ASSIGNMENT / NOTEBOOK)!r}, {str(course / "release_notes.txt")!r}]
ok = False
for t in TARGETS:
    try:
        with open(t, "a") as f:
            f.write("# written by a submission\\n")
        ok = True
    except OSError as e:
        print("writing", t, type(e).__name__, e.strerror)
wrote = ok
""" + FILL % {"cache": str(ROOT / ".cache"), "mb": TMP_MB + 64, "cap": TMP_MB} + "\nok = ok or wrote",
        "net": f"""\
import socket
ok = False
for where in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
    try:
        socket.create_connection(where, timeout=3).close()
        ok = True
    except OSError as e:
        print("connecting to", where, type(e).__name__, e)
tcp = ok
""" + UNIX % {"paths": list(sockets)} + "\nok = ok or tcp",
        # bounded: at most 2000 forks, children sleep 30 s; the sandbox's limit stops it far earlier
        "forks": """\
import os, time
forked, error, pids = 0, None, []
for _ in range(2000):
    try:
        pid = os.fork()
    except OSError as e:
        error = f"{type(e).__name__}: {e}"
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    pids.append(pid)
    forked += 1
print(f"forked {forked} times, then {error}")
for pid in pids:                       # (gone before the check cell, which needs its threads)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
ok = False""",
        "memory": f"""\
import os, time
t0 = time.time()
try:
    hog = torch.ones(30 * 2**30 // 4)     # 30 GB, touched
    ok = True
except (RuntimeError, MemoryError) as e:
    print(f"30 GB: {{type(e).__name__}} after {{time.time() - t0:.2f}} s", flush=True)
    ok = False
# memory that RLIMIT_AS does not see: memfd pages, written, never mapped (each below RLIMIT_FSIZE)
fds, total = [], 0
chunk = b"x" * (16 << 20)
try:
    while total < {memfd_mb} << 20:
        fd = os.memfd_create("hog")
        fds.append(fd)
        for _ in range({TMP_MB // 32}):        # each memfd below RLIMIT_FSIZE (the size of /tmp)
            os.write(fd, chunk)
            total += len(chunk)
        print(f"memfd: {{total >> 20}} MB", flush=True)
        time.sleep(0.05)
except OSError as e:
    print(f"memfd: {{type(e).__name__}} at {{total >> 20}} MB", flush=True)
ok = ok or total >= {memfd_mb} << 20""",
        # a transformer, an AST transformer and a pre-run hook, each of which turns the next
        # check cell into `pass`, then removes itself
        "transformers": """\
import ast
ip = get_ipython()
def _to_pass(lines):
    if any("utils.check_" in l for l in lines):
        ip.input_transformers_post.remove(_to_pass)
        return ["pass\\n"]
    return lines
class _Pass(ast.NodeTransformer):
    def visit_Module(self, node):
        if "utils.check_" not in ast.unparse(node):
            return node
        ip.ast_transformers.remove(self)
        return ast.Module(body=[ast.Pass()], type_ignores=[])
def _hook(info):
    ip.events.unregister("pre_run_cell", _hook)
ip.input_transformers_post.append(_to_pass)
ip.ast_transformers.append(_Pass())
ip.events.register("pre_run_cell", _hook)
ok = False""",
        # the kernel answers the next cells with a status that is a list
        "protocol": """\
ip = get_ipython()
ip.input_transformers_post.clear()        # (the attack above, undone: this one stands alone)
ip.ast_transformers.clear()
k = ip.kernel
_orig = k.do_execute
async def _bad(*a, **kw):
    r = await _orig(*a, **kw)
    r["status"] = ["ok"]
    return r
k.do_execute = _bad
ok = True""",
        # one print of 20 MB, and HTML/JavaScript for the instructor's browser
        "outputs": """\
from IPython.display import HTML, Javascript, display
display(HTML("<script>alert('pwned-html')</script><img src=x onerror=alert('pwned-img')>"))
display(Javascript("alert('pwned-js')"))
display({"text/html": "<iframe src='javascript:alert(1)'></iframe>", "text/plain": "plain"}, raw=True)
print("A" * (20 << 20))
""",
        # files beside the notebook: if any were imported or run, it leaves a mark in /tmp/marks
        "stray": """\
import os, sys
marks = os.listdir("/tmp/marks") if os.path.isdir("/tmp/marks") else []
print("marks:", marks)
root = os.path.dirname(os.path.dirname(utils.__file__))    # the course (it may live under /tmp)
trusted = tuple(d.rstrip("/") + "/" for d in (root, sys.prefix, sys.base_prefix))
print("path:", [p for p in sys.path if p in ("", ".")
                or (p.startswith(("/tmp", "/submission")) and not (p.rstrip("/") + "/").startswith(trusted))])
print("torch from:", torch.__file__, "utils from:", utils.__file__)
ok = bool(marks)""",
    }


MARK = "import os\nos.makedirs('/tmp/marks', exist_ok=True)\nopen('/tmp/marks/%s', 'w').close()\n"
STRAY_FILES = {
    "ipykernel_launcher.py": MARK % "ipykernel_launcher" + "import runpy, sys\nsys.exit(0)\n",
    "ipython_kernel_config.py": MARK % "ipython_kernel_config",
    "ipython_config.py": MARK % "ipython_config",
    "sitecustomize.py": MARK % "sitecustomize",
    "usercustomize.py": MARK % "usercustomize",
    "evil.pth": "import os; os.makedirs('/tmp/marks', exist_ok=True); open('/tmp/marks/pth', 'w').close()\n",
    "torch/__init__.py": MARK % "torch",
    "triton/__init__.py": MARK % "triton",
    "utils/__init__.py": MARK % "utils" + "check_add = check_relu = lambda *a, **k: None\n",
    "IPython/__init__.py": MARK % "IPython",
}
MARKDOWN = """\
# My answers <script>alert('pwned-md')</script>
<img src=x onerror="alert('pwned-onerror')"> <iframe src="https://example.com"></iframe>
[click](javascript:alert('pwned-link')) [entity](jav&#x61;script:alert(1)) [tab](java\tscript:alert(1))
<a href="javascript:alert(1)" onclick="alert(2)">x</a>
[escaped](javascript\\:alert(1)) [named](javascript&colon;alert(1)) [hex](JaVaScRiPt&#x3A;alert(1))
[vb](vbscript&#58;msgbox(1)) ![img](data&colon;text/html,pwned) [html](DATA:text/html;base64,PHNjcmlwdD4=)
[angle](<javascript\\:alert(1)>) [space]( java&Tab;script:alert(1)) [ref][r] [ref2][]

[r]: javascript&#58;alert(1)
[ref2]: data&#x3a;text/html,pwned "title"
"""


def hostile_sources(course: Path, port: int, sockets=()) -> dict:
    """``{student: (add cell, relu cell)}``: two attacks per submission where both can run."""
    a = attacks(course, port, sockets)
    return {
        # reading and writing what is not its own; the network and the gradebook
        "mallory_escape": (a["reader"] + "\nread = ok\n" + a["writer"] + "\nok = ok or read" + LAUNCHERS["add"],
                           a["gradebook"] + "\nbook = ok\n" + a["net"] + "\nok = ok or book" + LAUNCHERS["relu"]),
        "mallory_resources": (a["forks"] + LAUNCHERS["add"], a["memory"] + LAUNCHERS["relu"]),
        # (first in line, as the name sorts: the longest to grade, it should not run last)
        "a_mallory_loop": ("""\
def add(x, y):
    while True:
        pass
""", RELU),
        "mallory_grader": (a["outputs"] + """\
utils.check_add = lambda *a, **k: None        # switch the grader off


def add(x, y):
    return y
""", """\
import types
utils = types.SimpleNamespace(check_relu=lambda *a, **k: None)   # a fake utils for the check cell


def relu(x):
    return x
"""),
        "mallory_torch": (a["stray"] + """
def add(x, y):
    return x + y                  # torch computes it: no kernel of the learner's runs
""", """\
def relu(x):
    return torch.relu(x)
"""),
        "mallory_kernel": (a["transformers"] + LAUNCHERS["add"], a["protocol"] + LAUNCHERS["relu"]),
    }


# Wrong answers: with any of the forgeries below they passed their checks in the kernel.
WRONG_ADD = "def add(x, y):\n    return y\n"
WRONG_RELU = "def relu(x):\n    return x\n"
FAKE_UTILS = "check_add = check_relu = lambda *a, **k: None\n"
# the callback registers, right after the instructor's setup cell, a transformer that turns
# the add check into `pass`
AFTER_SETUP = """\
ip = get_ipython()
def _to_pass(lines):
    return ["pass\\n"] if any("utils.check_add(" in line for line in lines) else lines
def _after(result):
    if (result.info.raw_cell or "").startswith("import sys") and _to_pass not in ip.input_transformers_post:
        ip.input_transformers_post.append(_to_pass)
ip.events.register("post_run_cell", _after)
"""
# the kernel's replies: an error becomes ok, its traceback is never sent
OK_REPLIES = """\
kernel = get_ipython().kernel
_send = kernel.session.send
def _always_ok(stream, msg_or_type, content=None, *args, **kwargs):
    if msg_or_type == "error":
        return None
    if msg_or_type == "execute_reply" and isinstance(content, dict) and content.get("status") == "error":
        content = {"status": "ok", "execution_count": content.get("execution_count"), "payload": [],
                   "user_expressions": {}}
    return _send(stream, msg_or_type, content, *args, **kwargs)
kernel.session.send = _always_ok
"""


def forging_submissions() -> dict:
    """``{student: notebook}``: wrong answers whose checks are made to pass inside the kernel."""
    out = {}
    # 1. before the setup cell, a fake utils in sys.modules: `import utils` finds it
    nb = submission(WRONG_ADD, WRONG_RELU)
    nb.cells.insert(1, new_code_cell("import sys, types\nfake = types.ModuleType('utils')\nexec(%r, vars(fake))\n"
                                     "sys.modules['utils'] = fake" % FAKE_UTILS))
    out["mallory_sysmodules"] = nb
    # 2. a fake utils package in /tmp, which the setup's sys.path.insert(0, "..") reaches from
    # the kernel's working folder (/tmp/submission)
    nb = submission(WRONG_ADD, WRONG_RELU)
    nb.cells.insert(1, new_code_cell("import os\nos.makedirs('/tmp/utils', exist_ok=True)\n"
                                     "open('/tmp/utils/__init__.py', 'w').write(%r)" % FAKE_UTILS))
    out["mallory_tmp_utils"] = nb
    # 3. the locked setup cell stripped of its metadata and replaced by one that fakes utils
    nb = submission(WRONG_ADD, WRONG_RELU)
    nb.cells[1] = new_code_cell("import torch, triton, types\nimport triton.language as tl\n"
                                "utils = types.SimpleNamespace(check_add=lambda *a, **k: None, "
                                "check_relu=lambda *a, **k: None)")
    out["mallory_no_setup"] = nb
    # 4. a post_run_cell callback registers an input transformer right after the setup cell
    # (add); 7. the kernel's replies patched so that the failing check reports ok (relu)
    nb = submission(WRONG_ADD, OK_REPLIES + WRONG_RELU)
    nb.cells.insert(1, new_code_cell(AFTER_SETUP))
    out["mallory_hooks"] = nb
    # 5. the same callback from a student cell after the setup, then a copy of the setup cell
    # (add); 6. utils deleted from the namespace and a fake one put into builtins (relu)
    nb = submission(WRONG_ADD, "import builtins, types\nbuiltins.utils = types.SimpleNamespace(check_add=lambda *a, "
                               "**k: None, check_relu=lambda *a, **k: None)\ndel utils\n" + WRONG_RELU)
    nb.cells[2:2] = [new_code_cell(AFTER_SETUP), copy.deepcopy(nb.cells[1])]
    nb.cells[3].id = "copy-of-setup"
    out["mallory_copy_setup"] = nb
    return out


FORGERS = ("mallory_sysmodules", "mallory_tmp_utils", "mallory_no_setup", "mallory_hooks", "mallory_copy_setup")


def refused_submissions(course: Path) -> dict:
    """Submissions refused before anything runs: ``{folder name: what it is}``. Made after
    alice's, from hers."""
    sub = course / "submitted"
    alice = sub / "alice" / ASSIGNMENT
    made = {}
    os.symlink(sub / "alice", sub / "mallory_linkdir")                      # the student folder
    made["mallory_linkdir"] = "is a symbolic link"
    (sub / "mallory_linkassign").mkdir()
    os.symlink("../alice/" + ASSIGNMENT, sub / "mallory_linkassign" / ASSIGNMENT)   # the assignment
    made["mallory_linkassign"] = "is a symbolic link"
    for name, what in [("mallory_hardlink", "hard"), ("mallory_big", "big"), ("mallory_sparse", "sparse"),
                       ("mallory_bignb", "bignb"), ("josé", "name"), ("bad name", "name")]:
        d = sub / name / ASSIGNMENT
        d.mkdir(parents=True)
        if what == "hard":      # the instructor's notebook (solutions and all), linked
            os.link(course / "source" / ASSIGNMENT / NOTEBOOK, d / NOTEBOOK)
            made[name] = "is a hard link to a file outside the submission"
            continue
        shutil.copyfile(alice / NOTEBOOK, d / NOTEBOOK)
        if what == "big":       # 60 MB on disk, of size 0 (blocks kept past the end), or written
            (d / "data.bin").touch()
            if shutil.which("fallocate") is None or subprocess.run(
                    ["fallocate", "--keep-size", "-l", "60MiB", str(d / "data.bin")], check=False).returncode:
                (d / "data.bin").write_bytes(os.urandom(1 << 20) * 60)
            made[name] = "is larger than 50 MB"
        elif what == "sparse":
            with open(d / "sparse.bin", "wb") as f:
                f.truncate(1 << 40)                                            # 1 TB, no block on disk
            made[name] = "is larger than 50 MB"
        elif what == "bignb":
            with open(d / NOTEBOOK, "r+b") as f:
                f.truncate(100 << 20)                                          # a 100 MB notebook
            made[name] = "is larger than 50 MB"
        else:
            made[name] = "the folder name is not a student id"
    return made


def _hash_tree(root: Path, skip=()) -> dict:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part in skip for part in rel.parts) or "__pycache__" in rel.parts:
            continue
        if p.is_symlink():
            out[str(rel)] = "-> " + os.readlink(p)
        elif p.is_file():
            st = p.stat()
            out[str(rel)] = (hashlib.sha256(p.read_bytes()).hexdigest() if st.st_size <= (128 << 20)
                             else f"{st.st_size} bytes, {st.st_blocks} blocks, modified {st.st_mtime_ns}")
        else:
            out[str(rel)] = "dir"
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


def _own_cgroups() -> list[str]:
    """The memory and pids cgroups this process made that are still there."""
    return sorted(glob.glob(f"/sys/fs/cgroup/**/course-autograde-{os.getpid()}-*", recursive=True))


def _require_sandbox():
    ok, why = autograde.sandbox_status()
    if not ok:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the sandboxed autograde: {why} (.ci/install-sandbox.sh installs it)")
        pytest.skip(why)


class _Listener:
    """A TCP server on this machine's loopback, and UNIX sockets in a folder every sandbox sees
    read-only: a sandbox that reached any of them would be counted."""

    def __init__(self, unix_dir: Path | None = None, owners=()):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.socks = [self.sock]
        self.unix = []
        if unix_dir is not None:
            for uid in owners:
                path = unix_dir / f"listen-{uid}.sock"
                s = socket.socket(socket.AF_UNIX)
                s.bind(str(path))
                s.listen(8)
                os.chmod(path, 0o777)
                os.chown(path, uid, uid)
                self.socks.append(s)
                self.unix.append(str(path))
        for s in self.socks:
            s.settimeout(0.1)
        self.connections = 0
        self.peers = []
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            for s in self.socks:
                try:
                    conn, addr = s.accept()
                    self.connections += 1
                    if s.family == socket.AF_UNIX:
                        import struct
                        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                        try:
                            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:300]
                        except OSError:
                            cmd = b"?"
                        addr = (s.getsockname(), pid, uid, cmd)
                    self.peers.append(addr)
                    conn.close()
                except OSError:
                    pass

    def close(self):
        self.stop = True
        self.thread.join()
        for s in self.socks:
            s.close()


def _outputs_text(nb) -> str:
    return "\n".join(
        o.get("text", "") if o.get("output_type") == "stream" else f"{o.get('ename')}: {o.get('evalue')}"
        for c in nb.cells if c.cell_type == "code" for o in c.outputs
        if o.get("output_type") in ("stream", "error"))


def _make_course(course: Path):
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


def _write_submissions(course: Path, subs: dict):
    for student, nb in subs.items():
        dest = course / "submitted" / student / ASSIGNMENT
        dest.mkdir(parents=True)
        nbformat.write(nb, str(dest / NOTEBOOK))


def _read_results(course: Path, students, report_file: Path) -> dict:
    outputs, feedback = {}, {}
    for student in students:
        path = course / "autograded" / student / ASSIGNMENT / NOTEBOOK
        if path.exists():
            feedback[student] = path.read_text()
            outputs[student] = _outputs_text(nbformat.reads(feedback[student], as_version=4))
    with autograde.gradebook(course / "gradebook.db") as gb:
        scores = {}
        for s in students:
            try:
                scores[s] = {g.name: g.score for g in gb.find_submission_notebook("tiny", ASSIGNMENT, s).grades}
            except Exception:  # nbgrader's MissingEntry: not in the gradebook
                scores[s] = None
        zoe = gb.find_grade("old-check-1", "old", "ps-earlier", "zoe").score
    return dict(outputs=outputs, feedback=feedback, scores=scores, zoe=zoe,
                report=json.loads(report_file.read_text()))


_BECOME = """\
set -e
uid=$1
shift
while [ "$1" != "--" ]; do   # a folder that others may not enter (/root), and its children to open
  dir=$1
  children=$2
  shift 2
  stash=$(mktemp -d)
  mount --bind "$dir" "$stash"
  mount -t tmpfs -o mode=0755,size=1m tmpfs "$dir"
  for child in $(echo "$children" | tr ':' ' '); do
    mkdir "$dir/$child"
    mount --bind "$stash/$child" "$dir/$child"
  done
  umount "$stash"
  rmdir "$stash"
done
shift
exec setpriv --reuid="$uid" --regid="$uid" --clear-groups -- "$@"
"""


def _as_user(uid: int) -> list[str] | str:
    """The command prefix that runs a command as ``uid``, or why there is none. Where this
    Python, its environment or the course lie under a folder that others may not enter (pyenv
    in /root, a clone in a private temporary folder), the command runs in a private mount
    namespace in which only the way to them is opened up (nothing changes outside it)."""
    if os.geteuid() != 0:
        return "the tests run as an ordinary user: the unprivileged run needs root to become another"
    for tool in ("setpriv", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is missing"
    opened: dict[Path, set[str]] = {}
    for need in (Path(sys.executable).resolve(), Path(sys.prefix).resolve(), autograde.ROOT.resolve()):
        blocked = [a for a in [*reversed(need.parents)][1:] if not os.stat(a).st_mode & 0o001]
        if len(blocked) > 1:
            return f"{need} lies under several folders that others may not enter: {blocked}"
        if blocked:
            opened.setdefault(blocked[0], set()).add(need.relative_to(blocked[0]).parts[0])
    pairs = [x for d, kids in sorted(opened.items()) for x in (str(d), ":".join(sorted(kids)))]
    if any(":" in k or " " in k for kids in opened.values() for k in kids):
        return f"a folder to open has a name this test cannot pass to the shell: {opened}"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _BECOME, "sh", str(uid), *pairs, "--"]


def _unprivileged_ok() -> list[str] | str:
    """The command prefix of an ordinary user who can run bubblewrap here, or why there is none."""
    prefix = _as_user(UNPRIVILEGED_UID)
    if isinstance(prefix, str):
        return prefix
    try:
        r = subprocess.run([*prefix, sys.executable, "-c", "pass"], capture_output=True, text=True,
                           timeout=60, check=False)
        if r.returncode != 0:
            return f"uid {UNPRIVILEGED_UID} cannot run {sys.executable}: {r.stderr.strip()[-300:]}"
        r = subprocess.run([*prefix, sandbox.find_bwrap() or "bwrap", "--unshare-user", "--unshare-pid",
                            "--unshare-net", "--ro-bind", "/", "/", "true"], capture_output=True, text=True,
                           timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot run bubblewrap as uid {UNPRIVILEGED_UID}: {e}"
    if r.returncode != 0:
        return f"bubblewrap cannot create a user namespace for an ordinary user here: {r.stderr.strip()[-300:]}"
    return prefix


def _start_unprivileged(port: int, sockets) -> dict | None:
    """Start grading an honest and two hostile submissions as an ordinary user, in its own
    process (``python -m tools.autograde``); ``None`` (with the reason) where it cannot run."""
    prefix = _unprivileged_ok()
    if isinstance(prefix, str):
        return {"skip": prefix}
    uid = UNPRIVILEGED_UID
    top = Path(tempfile.mkdtemp(prefix="autograde-unprivileged-"))
    os.chmod(top, 0o755)
    course, home = top / "course", top / "home"
    home.mkdir()
    _make_course(course)
    a = attacks(course, port, sockets)
    # right answers, and before them a cell that tries what an ordinary user's sandbox might
    # allow: full marks prove the sandbox grades; the cell's output, that nothing got through
    subs = {"mallory_uid": submission(ADD, RELU, extra_after_setup="\n".join(
        [a["reader"], a["writer"], UNIX % {"paths": list(sockets)}]))}
    _write_submissions(course, subs)
    unreadable = course / "submitted" / "mallory_unreadable" / ASSIGNMENT
    unreadable.mkdir(parents=True)
    shutil.copyfile(course / "submitted" / "mallory_uid" / ASSIGNMENT / NOTEBOOK, unreadable / NOTEBOOK)
    (unreadable / "secret.txt").write_text("not for the grader\n")
    for p in [top, *top.rglob("*")]:
        os.lchown(p, uid, uid)
    os.chown(unreadable / "secret.txt", 0, 0)
    os.chmod(unreadable / "secret.txt", 0o600)                 # the grader cannot read it
    (top / "noaccess" / "bin").mkdir(parents=True)             # on PATH, and the grader may not look in
    os.chmod(top / "noaccess", 0o700)
    course_before = _hash_tree(course, skip={"gradebook.db", "autograded"})
    env = {"PATH": f"{top / 'noaccess' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(home),
           "LANG": "C.UTF-8",
           "PYTHONPATH": str(ROOT), "COURSE_NO_SYSTEM_CUDA": "1", "GRADER_TOKEN": SECRET,
           "TORCH_EXTENSIONS_DIR": str(home / "torch_extensions"), "NUMBA_CACHE_DIR": str(home / "numba"),
           "TRITON_CACHE_DIR": str(home / "triton"), "XDG_CACHE_HOME": str(home / ".cache")}
    report_file = top / "report.json"
    log = open(top / "log.txt", "w")   # closed by _finish_unprivileged
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "tools.autograde", ASSIGNMENT, "--course-dir", str(course), "--jobs", "2",
         # (no endless loop here: a cell timeout that a loaded machine cannot miss)
         "--cell-timeout", "120", "--setup-timeout", str(SETUP_TIMEOUT), "--notebook-timeout", "300",
         "--max-procs", str(MAX_PROCS), "--memory-gb", "6", "--sandbox-memory-gb", str(SANDBOX_MEMORY_GB),
         "--tmp-mb", str(TMP_MB), "--json", str(report_file)],
        cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    return dict(proc=proc, t0=time.monotonic(), top=top, course=course, log=log, report_file=report_file,
                students=[*subs, "mallory_unreadable"], course_before=course_before)


def _finish_unprivileged(run: dict) -> dict:
    if "skip" in run:
        return run
    try:
        rc = run["proc"].wait(timeout=500)
    finally:
        run["log"].close()
    run["wall"] = time.monotonic() - run["t0"]
    log = (run["top"] / "log.txt").read_text()
    out = dict(rc=rc, log=f"{log}({run['wall']:.1f} s)")
    if rc == 0:
        out.update(_read_results(run["course"], run["students"], run["report_file"]))
        out["course_before"] = run["course_before"]
        out["course_after"] = _hash_tree(run["course"], skip={"gradebook.db", "autograded"})
    shutil.rmtree(run["top"], ignore_errors=True)
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Every submission graded in one run as root, and a few as an ordinary user at the same
    time; what the tests below look at."""
    _require_sandbox()
    pytest.importorskip("nbgrader")

    course = tmp_path_factory.mktemp("course")
    _make_course(course)
    # UNIX sockets in a folder of the course's code (bound read-only into every sandbox): one
    # anybody may connect to, one of the ordinary user's own
    sock_dir = ROOT / "artifacts" / f"autograde-sockets-{os.getpid()}"
    sock_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(sock_dir, 0o755)
    listener = _Listener(sock_dir, owners=(os.geteuid(), UNPRIVILEGED_UID) if os.geteuid() == 0 else (os.geteuid(),))
    unprivileged = _start_unprivileged(listener.port, listener.unix)     # first: it runs beside all of this
    subs = {"alice": submission(ADD, RELU), "bob": submission(BOB_ADD, BOB_RELU)}
    for student, (add_src, relu_src) in hostile_sources(course, listener.port, listener.unix).items():
        subs[student] = submission(add_src, relu_src)
    subs["mallory_grader"].cells.insert(1, new_markdown_cell(MARKDOWN))
    subs["mallory_grader"].cells.insert(2, nbformat.v4.new_raw_cell("<script>alert('pwned-raw')</script>",
                                                                    metadata={"format": "text/html"}))
    subs.update(forging_submissions())
    _write_submissions(course, subs)
    for rel, text in STRAY_FILES.items():
        path = course / "submitted" / "mallory_torch" / ASSIGNMENT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    # a folder that becomes a link to alice's once the first sandbox runs (its own holds no notebook)
    swap = course / "submitted" / "mallory_swap"
    (swap / ASSIGNMENT).mkdir(parents=True)
    (swap / ASSIGNMENT / "notes.txt").write_text("I will hand in later\n")
    refused = refused_submissions(course)

    course_before = _hash_tree(course, skip={"gradebook.db", "autograded"})
    code_before = _course_code_hash()
    t0 = time.monotonic()
    report_file = course.parent / f"{course.name}-report.json"
    os.environ["GRADER_TOKEN"] = SECRET
    real_run, swapped = autograde.run_sandbox, []

    def swapping_run(*args, **kwargs):
        if not swapped:
            swapped.append(course.parent / "mallory_swap-own")
            os.rename(swap, swapped[0])
            os.symlink("alice", swap)
        return real_run(*args, **kwargs)
    try:
        with mock.patch.object(autograde, "run_sandbox", swapping_run):
            rc = autograde_main([ASSIGNMENT, "--course-dir", str(course), "--jobs", "2",
                                 "--cell-timeout", str(CELL_TIMEOUT), "--setup-timeout", str(SETUP_TIMEOUT),
                                 "--notebook-timeout", "300", "--tmp-mb", str(TMP_MB),
                                 "--sandbox-memory-gb", str(SANDBOX_MEMORY_GB),
                                 "--max-procs", str(MAX_PROCS), "--memory-gb", "6", "--json", str(report_file)])
        wall = time.monotonic() - t0
        unprivileged = _finish_unprivileged(unprivileged)
    finally:
        if swapped:
            swap.unlink()
            os.rename(swapped[0], swap)
        os.environ.pop("GRADER_TOKEN", None)
        if "proc" in unprivileged and unprivileged["proc"].poll() is None:
            unprivileged["proc"].kill()
        listener.close()
        shutil.rmtree(sock_dir, ignore_errors=True)
        stray = ROOT / "utils" / "_written_by_a_submission.py"
        created = stray.exists()
        stray.unlink(missing_ok=True)
    assert rc == 0
    print(f"autograde of {len(subs) + len(refused)} submissions: {wall:.1f} s")
    print("as an ordinary user:", unprivileged.get("skip") or unprivileged.get("log", ""))
    results = _read_results(course, [*subs, "mallory_swap", *refused], report_file)
    return dict(course=course, **results, refused=refused, unprivileged=unprivileged, sockets=listener.unix,
                course_before=course_before, course_after=_hash_tree(course, skip={"gradebook.db", "autograded"}),
                code_before=code_before, code_after=_course_code_hash(), created=created, swapped=bool(swapped),
                connections=listener.connections, peers=listener.peers, leftovers=_sandbox_processes(), wall=wall,
                cgroups=_own_cgroups())


CHECK_ADD, CHECK_RELU = "tiny-check-1", "tiny-check-2"


def _scores(graded, student):
    return graded["scores"][student][CHECK_ADD], graded["scores"][student][CHECK_RELU]


def _messages(graded, student):
    return {k: v["message"] for k, v in graded["report"][student][NOTEBOOK].items()}


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
    assert _scores(graded, "mallory_escape")[0] == 0.0
    out = graded["outputs"]["mallory_escape"]
    assert "reading alice's notebook: FileNotFoundError" in out and "found: []" in out, out


def test_the_graders_environment_stays_outside(graded):
    assert "secret seen in: []" in graded["outputs"]["mallory_escape"], graded["outputs"]["mallory_escape"]
    assert SECRET not in "".join(graded["feedback"].values())


def test_reading_or_changing_the_gradebook(graded):
    assert _scores(graded, "mallory_escape")[1] == 0.0
    assert "the gradebook: FileNotFoundError" in graded["outputs"]["mallory_escape"]


def test_writing_into_the_course(graded):
    assert _scores(graded, "mallory_escape")[0] == 0.0
    out = graded["outputs"]["mallory_escape"]
    # the course's files are read-only, and the course directory is not there at all
    assert "_written_by_a_submission.py OSError Read-only file system" in out, out
    assert "grading.py PermissionError" in out or "grading.py OSError Read-only file system" in out, out
    assert "runner.py PermissionError" in out or "runner.py OSError Read-only file system" in out, out
    assert "release_notes.txt FileNotFoundError" in out and "tiny.ipynb FileNotFoundError" in out, out


def _filled(out: str) -> dict:
    found = {}
    for line in out.splitlines():
        if line.startswith("fill "):
            where, rest = line[5:].split(": ", 1)
            found[where] = (int(rest.split(" MB")[0]), rest)
    return found


def _assert_writes_bounded(out: str):
    filled = _filled(out)
    assert {"/", "/root", "/dev", "/etc", "/run", "/tmp", "/dev/shm"} <= set(filled), out
    for d in ("/", "/root", "/dev", "/etc", "/run"):
        assert filled[d][0] == 0, filled             # the root and /dev are read-only; no /root, /run
    for d, (mb, _) in filled.items():
        assert mb <= TMP_MB, filled                  # every writable place is a tmpfs with a size


def test_filling_the_disk_or_memory_through_files(graded):
    _assert_writes_bounded(graded["outputs"]["mallory_escape"])


def test_opening_a_socket(graded):
    assert _scores(graded, "mallory_escape")[1] == 0.0
    assert graded["connections"] == 0, graded["peers"]
    out = graded["outputs"]["mallory_escape"]
    assert "ConnectionRefusedError" in out and "Network is unreachable" in out, out
    for path in graded["sockets"]:          # socket files in a tree bound read-only: unreachable
        assert f"unix socket {path} ConnectionRefusedError" in out, out


def test_a_30_gb_allocation(graded):
    assert _scores(graded, "mallory_resources")[1] == 0.0
    out = graded["outputs"]["mallory_resources"]
    assert "30 GB: RuntimeError after" in out, out
    assert float(out.split("30 GB: RuntimeError after ")[1].split(" s")[0]) < 2.0


def test_memory_outside_rlimit_as_is_bounded(graded):
    """memfd pages count against no process's RLIMIT_AS: the sandbox's memory cgroup stops them."""
    if sandbox.Cgroup.where()[0] is None:
        pytest.skip(f"no memory cgroup here ({sandbox.Cgroup.where()[1]}): the README says what is left")
    out = graded["outputs"]["mallory_resources"]
    reached = [int(line.split("memfd: ")[1].split(" MB")[0]) for line in out.splitlines() if "memfd: " in line
               and " MB" in line and line.split("memfd: ")[1].split(" MB")[0].isdigit()]
    assert reached and max(reached) < SANDBOX_MEMORY_GB * 1024, out
    # the cgroup ended the kernel in the solution cell (or its write failed): no point either way
    entry = graded["report"]["mallory_resources"][NOTEBOOK][CHECK_RELU]
    assert entry["score"] == 0.0 and (entry["status"] == "error" or "the kernel died" in entry["message"]), entry


def test_a_fork_bomb(graded):
    assert _scores(graded, "mallory_resources")[0] == 0.0
    out = graded["outputs"]["mallory_resources"]
    forked = int(out.split("forked ")[1].split(" times")[0])
    assert forked < MAX_PROCS and "Resource temporarily unavailable" in out, out


def test_an_endless_loop(graded):
    assert _scores(graded, "a_mallory_loop") == (0.0, 1.0)   # the next check still ran
    assert graded["report"]["a_mallory_loop"][NOTEBOOK][CHECK_ADD]["status"] == "timeout"


def test_replacing_a_grader(graded):
    assert _scores(graded, "mallory_grader") == (0.0, 0.0)
    msgs = _messages(graded, "mallory_grader")
    assert "utils.check_add was replaced in this notebook: this check earns no points" in msgs[CHECK_ADD]
    assert "the name `utils` was rebound in this notebook: this check earns no points" in msgs[CHECK_RELU]


def test_launchers_that_call_torch(graded):
    assert _scores(graded, "mallory_torch") == (0.0, 0.0), graded["outputs"]["mallory_torch"]
    msgs = " ".join(_messages(graded, "mallory_torch").values())
    assert "launch your kernel" in msgs, msgs


def test_files_beside_the_notebook_do_not_shape_the_kernel(graded):
    """ipykernel_launcher.py, ipython_kernel_config.py, sitecustomize.py, a .pth file, packages
    named torch, triton, utils and IPython in the submission's folder: none is imported or
    run, and no folder of the submission is on sys.path."""
    out = graded["outputs"]["mallory_torch"]
    assert "marks: []" in out and "path: []" in out, out
    venv = str(Path(sys.prefix).resolve())
    line = next(ln for ln in out.splitlines() if ln.startswith("torch from:"))
    assert f"torch from: {venv}" in line or "torch from: /usr" in line, line
    assert f"utils from: {ROOT / 'utils' / '__init__.py'}" in line, line


def test_an_input_transformer_that_turns_checks_into_pass(graded):
    assert _scores(graded, "mallory_kernel")[0] == 0.0, graded["outputs"]["mallory_kernel"]
    entry = graded["report"]["mallory_kernel"][NOTEBOOK][CHECK_ADD]
    assert entry["status"] == "refused" and entry["message"] == autograde.TAMPERED, entry


def test_a_kernel_that_answers_nonsense(graded):
    """The kernel replies to the check cell with a status that is a list: that student's check
    earns nothing, and everyone else is graded."""
    assert _scores(graded, "mallory_kernel")[1] == 0.0
    entry = graded["report"]["mallory_kernel"][NOTEBOOK][CHECK_RELU]
    assert entry["status"] == "protocol" and "its status is a list" in entry["message"], entry


def test_refused_submissions_cost_no_one_else_their_grades(graded):
    """Links, a hard link, oversized and sparse files, a 100 MB notebook, folder names that are
    not student ids: each refused for that student with a message naming them, nothing run."""
    for name, what in graded["refused"].items():
        entry = graded["report"][name][NOTEBOOK]
        for cell in entry.values():
            assert cell["score"] == 0.0 and cell["status"] == "refused", (name, entry)
            assert what in cell["message"] and ascii(name).strip("'") in cell["message"], (name, cell["message"])
        assert name not in graded["feedback"]
    assert graded["scores"]["mallory_linkdir"] == {CHECK_ADD: 0.0, CHECK_RELU: 0.0}
    assert graded["scores"]["josé"] is None and graded["scores"]["bad name"] is None   # not in the gradebook
    assert not (graded["course"] / "autograded" / "josé").exists()


def test_feedback_cannot_attack_the_instructor(graded):
    text = graded["feedback"]["mallory_grader"]
    nb = nbformat.reads(text, as_version=4)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for bad in ("<script", "<img", "<iframe", "<a ", "javascript:", "java\tscript:", "&#x61;"):
        assert bad not in markdown, (bad, markdown)
    assert "pwned-md" in markdown                                   # shown as text
    raw = [c for c in nb.cells if c.cell_type == "raw"]
    assert raw and all(not c.metadata for c in raw)                  # rendered by no exporter
    mimes = {k for c in nb.cells if c.cell_type == "code" for o in c.outputs for k in o.get("data", {})}
    assert mimes <= {"text/plain", "image/png", "image/jpeg"}, mimes
    flood = max((c for c in nb.cells if c.cell_type == "code"), key=lambda c: len(json.dumps(c.outputs)))
    chars = sum(len(o.get("text", "")) + len(json.dumps(o.get("data", {}))) for o in flood.outputs)
    assert len(flood.outputs) <= runner.MAX_OUTPUTS_PER_CELL + 1, len(flood.outputs)
    assert chars <= runner.MAX_CELL_OUTPUT_CHARS + 1000, chars
    total = sum(len(json.dumps(c.outputs)) for c in nb.cells if c.cell_type == "code")
    assert total <= 2 * runner.MAX_NOTEBOOK_OUTPUT_CHARS
    assert "output was cut" in graded["outputs"]["mallory_grader"]


def test_as_an_ordinary_user(graded):
    """The same sandbox when the grader is not root: a notebook with right answers gets full
    marks, while its extra cell finds the grader's environment, its own socket, the other
    submissions and the root filesystem out of reach and every writable place with a size; an
    unreadable file refuses only its own submission."""
    run = graded["unprivileged"]
    if "skip" in run:
        if os.environ.get("CI", "").lower() == "true" and os.geteuid() == 0:
            pytest.fail(f"CI must run the unprivileged sandbox: {run['skip']}")
        pytest.skip(run["skip"])
    assert run["rc"] == 0, run["log"][-3000:]
    assert run["scores"]["mallory_uid"] == {CHECK_ADD: 1.0, CHECK_RELU: 1.0}, run["outputs"].get("mallory_uid")
    out = run["outputs"]["mallory_uid"]
    assert "found: []" in out and "tiny.ipynb FileNotFoundError" in out, out      # no submission, no course
    assert "secret seen in: []" in out and SECRET not in "".join(run["feedback"].values()), out
    for path in graded["sockets"]:
        assert f"unix socket {path} ConnectionRefusedError" in out, out
    _assert_writes_bounded(out)
    msg = run["report"]["mallory_unreadable"][NOTEBOOK][CHECK_ADD]["message"]
    assert msg.startswith("mallory_unreadable: not graded:"), msg
    assert "secret.txt cannot be read (Permission denied)" in msg, msg
    assert run["course_after"] == run["course_before"] and run["zoe"] == 3


def test_the_sandbox_check_command(capsys):
    _require_sandbox()
    assert autograde_main(["--check"]) == 0
    assert "the sandbox works here" in capsys.readouterr().out


# --------------------------------------------------------------------------------------
# A verdict that no code in the kernel can forge
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("student", FORGERS)
def test_a_check_forged_in_the_kernel_earns_nothing(graded, student):
    """Wrong answers whose checks pass inside the kernel (a fake utils before the setup cell, in
    /tmp, in place of the setup cell, in builtins; an input transformer registered after the
    setup cell; the kernel's replies turned to ok): no points."""
    assert _scores(graded, student) == (0.0, 0.0), (_messages(graded, student), graded["outputs"].get(student))


def test_the_results_are_checked_outside_the_sandbox(graded):
    """The honest students' functions are called again on fresh inputs and compared outside;
    where a forgery made the check pass inside the kernel, that comparison is what fails."""
    for student in ("alice", "bob"):
        assert all(e["verified"] for e in graded["report"][student][NOTEBOOK].values()), graded["report"][student]
    for student, check in [("mallory_sysmodules", CHECK_ADD), ("mallory_tmp_utils", CHECK_RELU),
                           ("mallory_hooks", CHECK_ADD), ("mallory_hooks", CHECK_RELU)]:
        entry = graded["report"][student][NOTEBOOK][check]
        assert entry["status"] == "wrong" and "new inputs" in entry["message"], (student, entry)
    msg = graded["report"]["mallory_hooks"][NOTEBOOK][CHECK_RELU]["message"]
    assert "relu() on new inputs" in msg and "is not right" in msg, msg


def test_missing_locked_cells_are_put_back(graded):
    """The setup cell, stripped of its metadata and replaced, runs as the instructor wrote it."""
    nb = nbformat.reads(graded["feedback"]["mallory_no_setup"], as_version=4)
    setup = [c for c in nb.cells if c.cell_type == "code" and c.source == SETUP]
    assert len(setup) == 1 and setup[0].metadata["nbgrader"]["locked"], [c.source[:40] for c in nb.cells]
    copied = nbformat.reads(graded["feedback"]["mallory_copy_setup"], as_version=4)
    assert [bool(c.metadata.get("nbgrader", {}).get("locked")) for c in copied.cells if c.source == SETUP] == [
        True, False]                                         # a second copy is an ordinary cell


def test_a_folder_swapped_for_a_link_during_the_run(graded):
    """Every submission is copied before any is graded: mallory_swap's folder, a link to
    alice's by the time the first sandbox ran, is graded as it was (no notebook)."""
    assert graded["swapped"]
    assert _scores(graded, "mallory_swap") == (0.0, 0.0)
    assert "not in the submission" in _messages(graded, "mallory_swap")[CHECK_ADD]


def test_no_cgroup_is_left_behind(graded):
    assert graded["cgroups"] == [], graded["cgroups"]


_DANGEROUS = re.compile(r"(?i)^(javascript|vbscript|livescript|data):")


def _dangerous_urls(text: str) -> list[str]:
    """URLs of links, images and the like in an HTML page that a browser would run or render
    as a page: javascript:, vbscript:, data: (an output's PNG or JPEG image excepted), however
    they are spelled (entities are decoded as a browser does, whitespace and controls dropped)."""
    found = []

    class Links(html.parser.HTMLParser):
        def handle_starttag(self, tag, attrs):
            for name, value in attrs:
                if name in ("href", "src", "action", "formaction", "xlink:href", "poster", "background",
                            "srcset", "data") and value:
                    url = "".join(c for c in value if c > " ")
                    if _DANGEROUS.match(url) and not (tag == "img" and re.match(r"data:image/(png|jpeg);base64,",
                                                                                 url)):
                        found.append(f"<{tag} {name}={value!r}>")
    Links().feed(text)
    return found


def test_nbgrader_generate_feedback_works_on_the_gradebook(graded, tmp_path):
    """nbgrader's generate_feedback reads the gradebook the autograde wrote (solution cells,
    comments), and the HTML it makes carries no javascript:, vbscript: or data: link."""
    course = graded["course"]
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               PYTHONPATH=str(ROOT))
    students = ["alice", "mallory_grader", "mallory_no_setup"]
    for student in students:
        proc = subprocess.run([sys.executable, "-m", "nbgrader", "generate_feedback", ASSIGNMENT, "--force",
                               f"--CourseDirectory.root={course}", f"--student={student}"],
                              cwd=course, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (student, proc.stdout[-2000:], proc.stderr[-4000:])
    for student in students:
        page = (course / "feedback" / student / ASSIGNMENT / "tiny.html").read_text()
        assert not _dangerous_urls(page), (student, _dangerous_urls(page))
    assert "pwned-md" in (course / "feedback" / "mallory_grader" / ASSIGNMENT / "tiny.html").read_text()


def test_the_feedback_html_carries_no_dangerous_link():
    """Links and images of a student's markdown, in every spelling (escaped colons, entities,
    reference links, mixed case, whitespace), rendered by nbconvert: none reaches an href or src."""
    HTMLExporter = pytest.importorskip("nbconvert").HTMLExporter  # Jupyter's, absent on a GPU machine
    payloads = MARKDOWN + "\n".join([
        "[a](javascript\\:alert(1)) [b](&#106;avascript:alert(1)) [c](&#x6A;avascript&#x3A;alert(1))",
        "[d](java%0ascript:alert(1)) [e](java&#10;script:alert(1)) [f](javascript&NewLine;:alert(1))",
        "<javascript:alert(1)> <data:text/html,pwned> [g](\\javascript:alert(1)) [h]( <javascript:x> )",
        "![i](vbscript:x) ![j][k]\n\n[k]: <javascript:alert(1)>\n",
        "[l]: javascript:alert(1)\n[l][]  [m][l]  [l]",
    ])
    nb = new_notebook(cells=[new_markdown_cell(payloads)])
    feedback = autograde.feedback_notebook(nb, None, {})
    page, _ = HTMLExporter().from_notebook_node(feedback)
    assert not _dangerous_urls(page), _dangerous_urls(page)
    assert "alert(1)" in page                                        # shown, as text


def test_lone_surrogates_in_outputs_are_written(tmp_path):
    """An output holding a lone surrogate (a JSON escape from the kernel): the feedback is
    written (the surrogate replaced), and the score with it."""
    to_run = autograde.merge(source_notebook(), submission(ADD, RELU))
    executed = copy.deepcopy(to_run)
    for cell in executed.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="bad \ud800 end")]
    line = json.dumps({"notebook": NOTEBOOK, "executed": nbformat.writes(executed), "stopped": None,
                       "statuses": {str(i): "ok" for i, c in enumerate(to_run.cells) if c.cell_type == "code"}})
    assert "\\ud800" in line                  # as the runner sends it: a JSON escape
    result = json.loads(line)
    scores, fb = autograde.score_notebook(to_run, source_notebook(), result)
    autograde.write_feedback(tmp_path, ASSIGNMENT, {"alice": {NOTEBOOK: fb}})
    written = (tmp_path / "autograded" / "alice" / ASSIGNMENT / NOTEBOOK).read_text(encoding="utf-8")
    assert "bad \ufffd end" in nbformat.reads(written, as_version=4).cells[1].outputs[0].text


def test_names_are_escaped_in_an_ascii_terminal(tmp_path, monkeypatch):
    """File names with a newline or letters outside ASCII, in a terminal whose encoding is
    ASCII (PYTHONIOENCODING=ascii): the run ends with its grades, and no line is forged."""
    _require_sandbox()
    pytest.importorskip("nbgrader")
    course = tmp_path / "course"
    _make_course(course)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x")
    forged = "mallory_escape: 2 of 2 (1.0 s)"
    for student, name in [("mallory_newline", f"a\n{forged}\nb.bin"), ("mallory_accent", "donn\u00e9es.bin")]:
        d = course / "submitted" / student / ASSIGNMENT
        d.mkdir(parents=True)
        nbformat.write(submission(ADD, RELU), str(d / NOTEBOOK))
        os.link(outside, d / name)                        # refused: a hard link, named in the message
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict", write_through=True)
    monkeypatch.setattr(sys, "stdout", out)
    rc = autograde_main([ASSIGNMENT, "--course-dir", str(course)])
    monkeypatch.undo()
    text = out.buffer.getvalue().decode("ascii")
    assert rc == 0, text
    lines = text.splitlines()
    assert forged not in lines and any("a\\nmallory_escape" in ln for ln in lines), text
    assert any("donn\\xe9es.bin is a hard link" in ln for ln in lines), text
    with autograde.gradebook(course / "gradebook.db") as gb:
        for student in ("mallory_newline", "mallory_accent"):
            assert {g.name: g.score for g in gb.find_submission_notebook("tiny", ASSIGNMENT, student).grades} == {
                CHECK_ADD: 0.0, CHECK_RELU: 0.0}


def test_the_comparison_outside_the_sandbox_accepts_right_and_refuses_wrong():
    """Every grader of verify.VERIFIERS that checks one result (the collectives' are below):
    the course's own kernel called as the kernel would (runner.VERIFY_SOURCE) is right outside,
    a result slightly off or of the input is not."""
    import utils
    if not utils.SIMULATE:
        pytest.skip("the autograde grades in simulation (no GPU is passed into the sandbox): the calls it "
                    "verifies run on the CPU")
    from test_graders import REFERENCE_LAUNCHERS
    calls_of = {}
    exec(runner.VERIFY_SOURCE, calls_of)
    for grader, v in verify.VERIFIERS.items():
        if not isinstance(v, verify.Verifier):
            continue
        plan = [dict(grader=grader, fn="f", make=v.make, shapes=verify._shapes(v.shapes))]
        for fn, right in [(REFERENCE_LAUNCHERS[grader][0](), True), (lambda *a: a[0] * 1.001 + 0.01, False),
                          (lambda *a: a[-1], False)]:
            path = Path(tempfile.mktemp())
            try:
                calls_of["_autograde_call"]({"f": fn}, [dict(plan[0], seed=4242)], str(path))
                data = base64.b64encode(path.read_bytes()).decode()
            except Exception:
                data = ""
            finally:
                path.unlink(missing_ok=True)
            why = verify.compare(plan, {"seed": 4242, "status": "ok", "message": "", "data": data})
            assert (why == "") == right, (grader, right, why)
    # what the runner is told to call, from the instructor's check cells
    found, unverified = verify.plans(source_notebook())
    assert [c["fn"] for c in found["tiny-check-1"]] == ["add"] and [c["fn"] for c in found["tiny-check-2"]] == ["relu"]
    assert unverified == {}


COLLECTIVES = ROOT / "solutions" / "13_collectives.ipynb"
COLLECTIVE_CHECKS = {"13_collectives-check-1": "ring_reduce_scatter", "13_collectives-check-2": "ring_all_gather",
                     "13_collectives-check-3": "ring_all_reduce"}


def _collective_plans() -> dict:
    found, unverified = verify.plans(nbformat.read(str(COLLECTIVES), as_version=4))
    assert unverified == {}, unverified
    return found


def _solution_functions() -> dict:
    """Lesson 13's solution cells, run as the notebook runs them (its setup's names)."""
    import torch
    import torch.distributed as dist

    from kernels.collectives import chunk_bounds
    ns = {"torch": torch, "dist": dist, "chunk_bounds": chunk_bounds}
    for cell in nbformat.read(str(COLLECTIVES), as_version=4).cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            exec(cell.source, ns)
    return ns


def _ranks_reply(plan: list, ns: dict, seed: int = 4242) -> dict:
    """What the runner sends back after the kernel ran ``plan`` (runner.VERIFY_SOURCE) on ``ns``."""
    calls_of = {}
    exec(runner.VERIFY_SOURCE, calls_of)
    path = Path(tempfile.mktemp())
    try:
        calls_of["_autograde_call"](ns, [dict(c, seed=seed + 1000 * k) for k, c in enumerate(plan)], str(path))
        return {"seed": seed, "status": "ok", "message": "", "data": base64.b64encode(path.read_bytes()).decode()}
    finally:
        path.unlink(missing_ok=True)


def _records(reply: dict) -> list:
    """The results of a reply: ``[[header, body], ...]``."""
    import struct
    data, at, out = base64.b64decode(reply["data"]), 0, []
    while at < len(data):
        head_len, body_len = struct.unpack_from("<II", data, at)
        out.append([json.loads(data[at + 8:at + 8 + head_len]), data[at + 8 + head_len:at + 8 + head_len + body_len]])
        at += 8 + head_len + body_len
    return out


def _packed(reply: dict, records: list) -> dict:
    import struct
    data = b"".join(struct.pack("<II", len(h := json.dumps(head).encode()), len(body)) + h + body
                    for head, body in records)
    return dict(reply, data=base64.b64encode(data).decode())


def test_the_collectives_are_verified_as_ranks_outside_the_sandbox():
    """Lesson 13's check cells are planned (run again as ranks), not scored from the kernel's
    report only; the solution's ring reduce-scatter, all-gather and all-reduce are right
    outside; a wrong chunk index, an all-reduce that skips a step or the all-gather, an
    all-gather that ignores its owners, and tampered values and headers are refused with a
    message."""
    import ast

    from kernels import collectives as kc
    found = _collective_plans()
    assert {gid: [c["fn"] for c in calls] for gid, calls in found.items()} == {
        gid: [fn] for gid, fn in COLLECTIVE_CHECKS.items()}
    for calls in found.values():   # (the runner sends the plan to the kernel as its repr)
        assert [c["kind"] for c in calls] == ["ranks"] and ast.literal_eval(repr(calls)) == calls
    rs, ag, ar = (found[gid] for gid in COLLECTIVE_CHECKS)
    solution = _solution_functions()
    t0 = time.monotonic()
    for plan in (rs, ag, ar):
        assert verify.compare(plan, _ranks_reply(plan, solution)) == "", plan[0]["fn"]
    print(f"the three collectives run again as ranks: {time.monotonic() - t0:.2f} s")

    def own_rank(x, rank, world):
        kc.ring_reduce_scatter(x, rank, world)
        return rank

    def skipping_a_step(x, rank, world):
        bounds = kc.chunk_bounds(x.numel(), world)
        for step in range(world - 2):
            kc._step(x, (rank - step) % world, (rank - step - 1) % world, bounds, rank, world, add=True)
        kc.ring_all_gather(x, rank, world, (rank + 1) % world)
        return x

    for plan, fn, expect in [
            (rs, own_rank, "chunk 0, whose index rank 0 returned, is not the sum of that chunk over the ranks"),
            (rs, lambda x, r, w: (kc.ring_reduce_scatter(x, r, w), 0)[1], "two ranks claim one chunk"),
            (rs, lambda x, r, w: None, "rank 0 returned 'None', not the index of a chunk"),
            (rs, lambda x, r, w: kc.ring_reduce_scatter(x, r, w) + 0.5, "rank 0 returned '1.5'"),
            (ar, skipping_a_step, "rank 0's x is not the sum of every rank's x"),
            (ar, lambda x, r, w: kc.ring_reduce_scatter(x, r, w), "rank 0's x is not the sum of every rank's x"),
            (ag, lambda x, r, w, owned: kc.ring_all_gather(x, r, w, (r + 1) % w), "is not the values of its owner"),
            (ag, lambda x, r, w, owned: None, "it still holds the marker -777777.25 written into it"),
            (ag, lambda x, r, w, owned: None, "chunk 0 on rank 1 is not the values of its owner, rank 0: 1 of 1 values "
             "differ (largest error")]:
        why = verify.compare(plan, _ranks_reply(plan, {plan[0]["fn"]: fn}))
        assert expect in why and why.endswith("this check earns no points"), (plan[0]["fn"], expect, why)


def test_a_changed_or_malformed_reply_of_ranks_earns_nothing():
    """The collectives' replies changed on their way (a value, the index a rank returned, a
    header), of the wrong count or dtype, cut short, failed or missing: a message, never an
    exception."""
    import struct
    rs, ag, ar = (_collective_plans()[gid] for gid in COLLECTIVE_CHECKS)
    solution = _solution_functions()
    replies = {name: _ranks_reply(plan, solution) for name, plan in (("rs", rs), ("ag", ag), ("ar", ar))}
    count = sum(ag[0]["worlds"]) * len(ag[0]["sizes"])      # one result a rank, size and world

    def one_more(records):           # the last value of the last rank's x, plus one
        head, body = records[-1]
        records[-1][1] = body[:-4] + struct.pack("<f", struct.unpack("<f", body[-4:])[0] + 1.0)

    def index_of_the_rank_before(records):
        records[-1][0]["returned"] = records[-2][0]["returned"]

    def as_float64(records):
        records[0][0]["dtype"], records[0][1] = "float64", records[0][1] * 2

    for name, plan, change, expect in [
            ("ar", ar, one_more, "rank 2's x is not the sum of every rank's x: 1 of 1003 values differ"),
            ("rs", rs, index_of_the_rank_before, "two ranks claim one chunk"),
            ("rs", rs, lambda r: r[-1][0].update(returned=[1]), "a result's description was not valid"),
            ("rs", rs, lambda r: r[-1][0].update(returned=True), "a result's description was not valid"),
            ("ag", ag, lambda r: r[0][0].update(dtype=["float32"]), "a result's description was not valid"),
            ("ag", ag, lambda r: r.pop(), f"{count - 1} results came back, not {count}"),
            ("ag", ag, lambda r: r.append(r[-1]), f"{count + 1} results came back, not {count}"),
            ("ar", ar, as_float64, "rank 0's x came back as float64 of shape (1,), not float32 of shape (1,)"),
            ("ar", ar, lambda r: r[0][0].update(dtype="int32"), "not of floating-point numbers")]:
        records = _records(replies[name])
        change(records)
        why = verify.compare(plan, _packed(replies[name], records))
        assert expect in why and why.endswith("this check earns no points"), (name, expect, why)
    data = base64.b64decode(replies["ar"]["data"])
    for reply, expect in [
            (None, "no valid reply"), ({"seed": True, "status": "ok"}, "no valid reply"),
            (dict(replies["ar"], status="error", message="RankError: rank 1 raised ValueError"),
             "failed: RankError: rank 1 raised ValueError: this check earns no points"),
            (dict(replies["ar"], data=base64.b64encode(data[:-3]).decode()), "the results were cut short"),
            (dict(replies["ar"], data="not base64!"), "were not valid: this check earns no points")]:
        why = verify.compare(ar, reply)
        assert expect in why, (expect, why)


# --------------------------------------------------------------------------------------
# Sandboxes run directly: keyrings, files in each tmpfs, the cgroup on an error
# --------------------------------------------------------------------------------------
_KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}
KEYS_AND_FILES = """\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, KEYCTL = %(nr)r
def add(desc, ring):
    return libc.syscall(ctypes.c_long(ADD_KEY), b"user", desc.encode(), b"payload", ctypes.c_size_t(7),
                        ctypes.c_long(ring))
for ring, name in ((-4, "user"), (-5, "user-session"), (-3, "session")):
    print("added", name, add(%(mark)r + "-" + name, ring))
persistent = libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_long(22), ctypes.c_long(-1), ctypes.c_long(-4))
print("added persistent", persistent > 0 and add(%(mark)r + "-persistent", persistent))
print("keys:", open("/proc/keys").read().replace(chr(10), " | "))
for d in ("/tmp", "/dev/shm", %(cache)r):
    n = 0
    try:
        os.mkdir(os.path.join(d, "many"))
        while n < %(tries)d:
            open(os.path.join(d, "many", str(n)), "w").close()
            n += 1
    except OSError as e:
        pass
    print("files in", d, n)
"""


def _run_direct(tmp: Path, code: str, limits) -> str:
    stage = tmp / f"stage-{len(list(tmp.iterdir()))}"
    stage.mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell(code)]), str(stage / "k.ipynb"))
    for p in (tmp, stage, stage / "k.ipynb"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    res = sandbox.run_sandbox(stage, ["k.ipynb"], limits=limits, uid=sandbox.SANDBOX_UID)["k.ipynb"]
    assert "executed" in res, res
    return _outputs_text(nbformat.reads(res["executed"], as_version=4))


def test_each_sandbox_has_its_own_keyrings_and_limited_files(tmp_path):
    """Keys a sandbox adds (user, user-session, session and persistent keyrings) are not seen by
    the next sandbox of the same user, nor the grader's session keyring by either; every
    writable tmpfs holds at most its number of files."""
    _require_sandbox()
    nr = _KEYCTL.get(platform.machine())
    if nr is None:
        pytest.skip(f"keyctl's number is not known here ({platform.machine()})")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(nr[1]), ctypes.c_long(1), None) < 0:     # a session keyring of the test's own
        pytest.skip(f"keyctl is not allowed here: {os.strerror(ctypes.get_errno())}")
    libc.syscall(ctypes.c_long(nr[0]), b"user", b"grader-session-key", b"secret", ctypes.c_size_t(6),
                 ctypes.c_long(-3))
    limits = sandbox.Limits(cell_timeout=60, notebook_timeout=120, tmp_mb=64, tmp_files=1000)
    tmp_path.chmod(0o755)
    first = _run_direct(tmp_path, KEYS_AND_FILES % dict(nr=nr, mark="leak-first", cache=str(ROOT / ".cache"),
                                                        tries=1500), limits)
    second = _run_direct(tmp_path, KEYS_AND_FILES % dict(nr=nr, mark="leak-second", cache=str(ROOT / ".cache"),
                                                         tries=10), limits)
    assert "added user" in first and "leak-first-user" in first, first           # the keys were made
    assert "leak-first" not in second, second
    assert "grader-session-key" not in first + second
    counts = {line.split()[2]: int(line.split()[3]) for line in first.splitlines() if line.startswith("files in")}
    assert len(counts) == 3 and all(n < 1000 for n in counts.values()), (counts, first)


def test_a_cgroup_is_removed_when_a_run_fails(tmp_path, monkeypatch):
    """An error while a sandbox runs (here: reading its log) leaves no memory cgroup behind."""
    _require_sandbox()
    if sandbox.Cgroup.where()[0] is None:
        pytest.skip(f"no memory cgroup here: {sandbox.Cgroup.where()[1]}")

    def broken(*a, **k):
        raise RuntimeError("the log could not be read")
    monkeypatch.setattr(sandbox, "_Tail", broken)
    before = _own_cgroups()
    with pytest.raises(RuntimeError, match="the log could not be read"):
        _run_direct(tmp_path, "print(1)", sandbox.Limits(cell_timeout=30, notebook_timeout=60))
    assert _own_cgroups() == before
