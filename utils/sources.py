"""Which source files a topic's recorded numbers measured, and one hash of them.

A topic's numbers in a GPU's record (``benchmarks/results/records/<gpu>.json``) depend on its kernels
and launchers (``kernels/{cuda,numba,triton}/<topic>.py``, ``kernels/cuda/<topic>.cu``), its frame
(``kernels/frames/<topic>.py``: the input rules and the steps around the kernels that the three
languages share), the kernel modules and headers those import or include (``kernels/cuda/common.h``,
another topic's module or frame), and its spec (``utils/topics/<topic>.py``: inputs, bytes,
baselines). ``topic_files`` follows
those imports and includes; ``topic_hash`` hashes the files' paths and contents. A run of
``python -m benchmarks`` writes each measured topic's hash into the results file
(``topic_sources``); ``python -m benchmarks --stale`` lists the topics whose files changed
since their most recent record measured them, and ``--update --stale`` measures only those
again.

The runtime (``runtime/``, ``utils/``, the launch path, the harness) is left out on purpose: a change
there would mark every topic stale, and its effect on a kernel's speed is what the
launch-overhead record (``benchmarks/lessons/launch_overhead.py``) measures.

This module reads files only (no torch, nothing of the course), so ``utils.bench`` can ask it
whether a recorded figure is stale on any machine, and ``python -m benchmarks`` which topics to
measure again.
"""
from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = ("cuda", "numba", "triton")
HASH_CHARS = 16

#: ``from kernels.x import a, b`` (to the end of its line) or ``from kernels.x import (...)`` (to the
#: closing parenthesis, over several lines), read in the text without its comments.
_PY_FROM = re.compile(r"^[ \t]*from[ \t]+kernels((?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_COMMENT = re.compile(r"#[^\n]*")
_PY_IMPORT = re.compile(r"^\s*import\s+kernels((?:\.\w+)+)", re.M)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([\w./-]+)"', re.M)
_CU_FILE = re.compile(r'["\'/](\w+\.(?:cu|cuh|h))["\']')


def _reader(root: Path) -> Callable[[str], bytes | None]:
    def read(rel: str) -> bytes | None:
        p = root / rel
        return p.read_bytes() if p.is_file() else None
    return read


def git_reader(commit: str, root: Path = ROOT) -> Callable[[str], bytes | None]:
    """Reads files as they were at ``commit`` (for records measured at an earlier commit)."""
    def read(rel: str) -> bytes | None:
        out = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{rel}"], capture_output=True)
        return out.stdout if out.returncode == 0 else None
    return read


def _module_file(dotted: str, read) -> str | None:
    """``kernels/<a>/<b>.py`` (or a package's ``__init__.py``) for ``kernels.<a>.<b>``."""
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        return None
    base = "kernels/" + "/".join(parts)
    for rel in (base + ".py", base + "/__init__.py"):
        if read(rel) is not None:
            return rel
    return None


def _deps(rel: str, text: str, read) -> list[str]:
    out = []
    if rel.endswith(".py"):
        code = _COMMENT.sub("", text)
        for mod, names in _PY_FROM.findall(code):
            found = _module_file(mod, read) if mod else None
            if found and not found.endswith("__init__.py"):
                out.append(found)
            for name in re.findall(r"\w+", names):
                if name != "as":
                    sub = _module_file(f"{mod}.{name}", read)
                    if sub and not sub.endswith("__init__.py"):
                        out.append(sub)
        for mod in _PY_IMPORT.findall(code):
            found = _module_file(mod, read)
            if found and not found.endswith("__init__.py"):
                out.append(found)
        # a launcher that loads a .cu file names it in a string ("layernorm.cu")
        folder = rel.rsplit("/", 1)[0]
        for name in _CU_FILE.findall(text):
            out.append(f"{folder}/{name}")
    else:
        folder = rel.rsplit("/", 1)[0]
        out += [f"{folder}/{name}" for name in _INCLUDE.findall(text)]
    return out


def topic_files(topic: str, read: Callable[[str], bytes | None] | None = None) -> list[str]:
    """The files (paths from the course root, sorted) that ``topic``'s measurements depend on."""
    read = read or _reader(ROOT)
    todo = [f"utils/topics/{topic}.py", f"kernels/cuda/{topic}.cu", f"kernels/frames/{topic}.py"]
    todo += [f"kernels/{lang}/{topic}.py" for lang in LANGUAGES]
    seen: dict[str, bytes] = {}
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        data = read(rel)
        if data is None:
            continue
        seen[rel] = data
        if rel.startswith("kernels/"):
            todo += _deps(rel, data.decode("utf-8", "replace"), read)
    return sorted(seen)


def topic_hash(topic: str, read: Callable[[str], bytes | None] | None = None) -> dict:
    """``{"hash": 16 hex digits, "files": [...]}``: a hash of the paths and contents of
    ``topic_files(topic)``. The same sources give the same hash on any machine."""
    read = read or _reader(ROOT)
    files = topic_files(topic, read)
    h = hashlib.sha256()
    for rel in files:
        data = read(rel) or b""
        h.update(rel.encode() + b"\0" + data.replace(b"\r\n", b"\n") + b"\0")
    return {"hash": h.hexdigest()[:HASH_CHARS], "files": files}


def stale_topics(data: dict, topics, read=None) -> dict[str, str]:
    """``{topic: why}`` for each of ``topics`` whose recorded numbers in the results ``data``
    no longer describe the sources here: recorded with another hash, recorded without one,
    or not recorded at all."""
    recorded = data.get("topic_sources") or {}
    measured = {r.get("topic") for r in data.get("rows", [])} | {f.get("topic") for f in data.get("failed", [])}
    out = {}
    for topic in topics:
        if topic not in measured:
            out[topic] = "never recorded"
            continue
        old = (recorded.get(topic) or {}).get("hash")
        if not old:
            out[topic] = "recorded without a source hash"
            continue
        now = topic_hash(topic, read)["hash"]
        if now != old:
            out[topic] = f"sources changed since it was recorded (hash {old} then, {now} now)"
    return out
