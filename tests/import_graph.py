"""The course's import graph, read from the sources without importing anything: what the tests
of the house's shape share (tests/test_backends.py, test_ops.py, test_tools_layout.py)."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    """``runtime/backends/__init__.py`` -> ``runtime.backends``."""
    parts = list(Path(path).resolve().relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(*packages: str) -> dict[str, tuple[str, bool]]:
    """module -> (its text, whether it is a package's ``__init__.py``), for every file of
    ``packages`` (folders of the course root)."""
    return {module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py")
            for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))
            if ".cache" not in p.parts and "build" not in p.parts}


@functools.lru_cache(maxsize=None)
def _import_nodes(text: str) -> tuple:
    """Each import statement of ``text`` (at module level or inside a function), in the order of
    ``ast.walk``: ``(False, None, 0, (name, ...))`` for ``import a, b``, ``(True, module, level,
    (name, ...))`` for ``from module import name, ...``. Parsing every file of the course is most of the time of
    a graph, and the tests build many graphs of nearly the same files: each text is parsed once."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out.append((False, None, 0, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            out.append((True, node.module, node.level, tuple(a.name for a in node.names)))
    return tuple(out)


def imports(mod: str, text: str, is_pkg: bool, known) -> set[str]:
    """The modules of ``known`` that ``mod`` imports, at module level or inside a function (a
    lazy import that closes a circle is still a circle: it only hides it until that call).
    ``from pkg import x`` counts ``pkg.x`` where that is a module, else ``pkg``."""
    package = mod if is_pkg else mod.rpartition(".")[0]
    deps = set()
    for is_from, module, level, aliases in _import_nodes(text):
        if not is_from:
            names = list(aliases)
        else:
            if level:
                base = package.split(".")
                base = base[:len(base) - (level - 1)]
                target = ".".join(base + ([module] if module else []))
            else:
                target = module or ""
            subs = [f"{target}.{a}" for a in aliases]
            names = [s for s in subs if s in known] or [target]
        for n in names:
            while n and n not in known:  # `import runtime.backends.cuda._toolchain` -> that module
                n = n.rpartition(".")[0]
            if n and n != mod:
                deps.add(n)
    return deps


def graph(srcs: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the modules of ``srcs`` it imports."""
    return {mod: imports(mod, text, is_pkg, srcs) for mod, (text, is_pkg) in srcs.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every circle a depth-first walk of ``g`` meets, each as ``[a, b, ..., a]``."""
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                found.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    return found
