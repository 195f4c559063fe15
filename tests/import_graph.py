"""The course's import graph, read from the sources without importing anything: what the tests
of the house's shape share (tests/test_backends.py, test_ops.py, test_tools_layout.py)."""
from __future__ import annotations

import ast
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


def imports(mod: str, text: str, is_pkg: bool, known) -> set[str]:
    """The modules of ``known`` that ``mod`` imports, at module level or inside a function (a
    lazy import that closes a circle is still a circle: it only hides it until that call).
    ``from pkg import x`` counts ``pkg.x`` where that is a module, else ``pkg``."""
    package = mod if is_pkg else mod.rpartition(".")[0]
    deps = set()
    for node in ast.walk(ast.parse(text)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names]
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
