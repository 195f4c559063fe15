"""The shape of tools/ (the instructors' tools) beside utils/ (what learners import): utils never
imports tools, no module of tools imports one that imports it back, and the autograde's runner
starts alone, as the sandbox starts it (by path, in isolated mode, nothing of the course on
its path)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import import_graph
import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tools" / "autograde" / "runner.py"


def _sources(package: str) -> dict[str, tuple[str, bool]]:
    return import_graph.sources(package)


def _imports(mod: str, text: str, is_pkg: bool) -> set[str]:
    """Every module of the course ``text`` imports (utils, tools and what they import)."""
    return import_graph.imports(mod, text, is_pkg, _ALL)


_ALL = import_graph.sources("runtime", "kernels", "utils", "tools", "benchmarks", "extensions", "tests")


def _graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    return import_graph.graph(sources)


_cycles = import_graph.cycles


def test_utils_never_imports_tools():
    bad = sorted(f"{mod} imports {name}" for mod, (text, is_pkg) in _sources("utils").items()
                 for name in _imports(mod, text, is_pkg) if name == "tools" or name.startswith("tools."))
    assert not bad, "utils/ is what learners import; it must not reach tools/:\n" + "\n".join(bad)


def test_the_instructor_tools_live_in_tools_not_utils():
    assert {"tools.autograde", "tools.nbtools"} <= set(_sources("tools"))
    in_utils = {m.rpartition(".")[2] for m in _sources("utils")}
    assert not in_utils & {"autograde", "nbtools"}, "utils/ holds an instructor tool again"


def test_tools_has_no_import_circles():
    cycles = _cycles(_graph(_sources("tools")))
    assert not cycles, "import circles among tools modules:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("module, lazy_import", [
    ("tools.autograde.runner", "from .scoring import STATUSES"),
    ("tools.autograde.sandbox", "from tools.autograde import grade_submissions"),
])
def test_the_circle_check_finds_a_lazy_import_that_closes_a_circle(module, lazy_import):
    sources = _sources("tools")
    text, is_pkg = sources[module]
    sources[module] = (text + f"\n\ndef _late():\n    {lazy_import}\n", is_pkg)
    assert any(module in c for c in _cycles(_graph(sources)))


def test_the_runner_imports_nothing_of_the_course():
    text = RUNNER.read_text()
    names = _imports("tools.autograde.runner", text, False)
    first_party = {"runtime", "tools", "utils", "kernels", "benchmarks", "tests", "extensions"}
    assert not {n for n in names if n.split(".")[0] in first_party}, names


def test_the_runner_starts_alone_as_the_sandbox_starts_it():
    """``python -I runner.py CONFIG`` from an empty folder: with no course on sys.path it sets its
    limits and answers ready on its result pipe (what ``sandbox_status`` asks of a sandbox)."""
    r, w = os.pipe()
    config = dict(uid=None, fd=w, notebooks=[], max_procs=4096, memory=8 << 30, fsize=64 << 20)
    try:
        proc = subprocess.run([sys.executable, "-I", str(RUNNER), json.dumps(config)], pass_fds=(w,),
                              cwd="/", env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as f:
        reply = f.read().decode()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(reply.splitlines()[-1])["ready"] is True, reply
