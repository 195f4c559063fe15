"""What nvcc accepts and NVRTC does not, made equal for the course's NVRTC compiles.

NVRTC (the compiler the course uses on a GPU, and as the check in simulation) compiles device
code only. Compared with nvcc it lacks two things that published kernels rely on:

* **The C standard headers.** nvcc compiles with the host compiler's ``<float.h>``,
  ``<stdlib.h>``, ``<math.h>``...; NVRTC has none, and stops at "cannot open source file".
  ``INCLUDE_DIR`` (``runtime/backends/cuda/nvrtc_include/``) holds small replacements, passed to NVRTC only
  (the emulator's g++ has the real ones): the macros device code may use (``FLT_MAX``,
  ``INT_MAX``, ``UINT32_MAX``, ``M_PI``, ``M_SQRT2``...), the types (``int32_t``, ``size_t``,
  ``FILE``), and the host-only functions (``rand``, ``exit``, ``fopen``, ``strlen``...)
  declared as *deleted device functions*: a kernel that calls one is refused with NVRTC's
  "it is a deleted function" at the learner's line. What NVRTC has built in stays its own:
  ``printf``, ``assert``, ``malloc``/``free``, ``memcpy``/``memset`` and the math functions.
* **Host code.** nvcc compiles host functions and variables for the CPU, and only refuses a
  host function that device code calls. NVRTC refuses every one, even a declaration.
  ``set_aside_host`` blanks the top-level host functions (declared or defined) and host
  variables that no device code names, keeping every line where it was, so NVRTC's line
  numbers stay the learner's. A host function that a kernel calls stays, and NVRTC refuses
  it, as nvcc refuses the call. A class that no device code names is set aside whole (its
  methods are host functions too); one that device code uses keeps its host methods, which
  NVRTC refuses (mark them ``__host__ __device__``).
  ``expand_includes`` puts the quoted headers of the kernel's folder in place (with
  ``#line`` marks), so that what they declare for the host is set aside too (cuda-samples'
  ``histogram_common.h`` declares its host functions, llm.c's ``common.h`` defines some).
"""
from __future__ import annotations

import re
from pathlib import Path

__all__ = ["INCLUDE_DIR", "set_aside_host", "expand_includes"]

#: The C standard headers for NVRTC (and their C++ names: <cfloat>, <cstdint>...).
INCLUDE_DIR = Path(__file__).resolve().parent / "nvrtc_include"

_DEVICE_MARK = re.compile(r"\b(__global__|__device__|__constant__|__managed__|__shared__)\b")
_NOT_A_FUNCTION = re.compile(r"\s*(template\s*<.*>\s*)?(struct|class|union|enum|typedef|using|namespace|"
                             r"static_assert)\b", re.S)
_CLASS = re.compile(r"(?:template\s*<.*>\s*)?(?:struct|class|union)\s+"
                    r"(?:(?:alignas|__align__|__attribute__)\s*\(+[^)]*\)+\s*)*(\w+)", re.S)
_FUNCTION_NAME = re.compile(r"[^=(]*?\b(\w+)\s*\(", re.S)
_VARIABLE_NAME = re.compile(r"(\w+)\s*(\[[^\]]*\]\s*)*(=|;|\{|\(|$)")
_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*["<]([^">]+)[">][^\n]*$', re.M)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once\b[^\n]*$", re.M)


def _skip_literal(code: str, i: int) -> int:
    """The offset just past the string or character literal that starts at ``i``."""
    q, n = code[i], len(code)
    i += 1
    while i < n and code[i] != q and code[i] != "\n":
        i += 2 if code[i] == "\\" else 1
    return i + 1


_OPENS_SCOPE = re.compile(r'\s*(inline\s+)?(namespace\b[^{;]*|extern\s*"C(\+\+)?"\s*)$')


def scan_declaration(code: str, start: int) -> tuple[int, int | None, bool]:
    """The top-level declaration that starts at ``start`` of ``code`` (comments blanked):
    ``(j, head_end, opens)``. ``j`` is the offset of its last character, the ``;`` or the ``}``
    that closes its body (or the ``;`` just after that ``}``), at least ``len(code)`` when it
    never ends; ``head_end`` is the offset of its body's ``{`` (None without a body); ``opens``
    says it is a namespace or an ``extern "C"`` block, whose contents are top-level
    declarations too (``j`` is then its ``{``)."""
    n, depth, head_end, j = len(code), 0, None, start
    while j < n:
        ch = code[j]
        if ch in "\"'":
            j = _skip_literal(code, j)
            continue
        if ch == "#" and not code[code.rfind("\n", 0, j) + 1:j].strip():
            e = code.find("\n", j)  # a directive inside a declaration (#pragma unroll) is part of it
            j = n if e < 0 else e
            continue
        if ch == "{":
            if depth == 0 and head_end is None:
                head_end = j
                if _OPENS_SCOPE.match(code[start:j]):
                    return j, head_end, True
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                k = j + 1
                while k < n and code[k] in " \t\n":
                    k += 1
                if k < n and code[k] == ";":  # struct S {...}; or an initializer
                    j = k
                break
        elif ch == ";" and depth == 0:
            break
        j += 1
    return j, head_end, False


def _declarations(code: str):
    """The top-level declarations of ``code`` (comments blanked): (start, end, head) for each,
    where ``head`` is the text before its body. Namespaces and ``extern "C" {`` blocks are
    entered; preprocessor lines are skipped."""
    n, i = len(code), 0
    while i < n:
        c = code[i]
        if c.isspace() or c == "}":
            i += 1
            continue
        if c == "#":
            while True:
                e = code.find("\n", i)
                if e < 0:
                    return
                if code[e - 1] != "\\":
                    break
                i = e + 1
            i = e
            continue
        start = i
        j, head_end, opens = scan_declaration(code, start)
        if opens:
            i = j + 1
            continue
        end = min(j + 1, n)
        yield start, end, code[start:head_end if head_end is not None else end]
        i = end


def set_aside_host(text: str, code: str | None = None) -> str:
    """``text`` with the top-level host functions and host variables that no device code
    names blanked out (newlines kept). ``code`` is ``text`` with its comments blanked (same
    length); by default comments are ignored only where they cannot matter."""
    code = text if code is None else code
    device, device_text, candidates, types = [], [], [], []
    for start, end, head in _declarations(code):
        if _DEVICE_MARK.search(head):
            # What device code names: the bodies (a kernel's own name in its head does not
            # make a host function of the same name device code).
            params = set(re.findall(r"(\w+)\s*(?:\[[^\]]*\]\s*)*(?=[,)=])", head[head.find("("):]))
            device.append((code[start + len(head):end], params))
            device_text.append(code[start:end])
            continue
        h = head.strip()
        t = _CLASS.match(h)
        if t and end > start + len(head):
            # A class with methods (host functions to NVRTC) that no device code names, not
            # even as a parameter type; plain structs stay (a macro or typedef may name them).
            if re.search(r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?[{;]", code[start + len(head):end]):
                types.append((start, end, t.group(1)))
            continue
        if re.match(r"(typedef|using)\b", h):
            device_text.append(h)  # a typedef of a class keeps the class
        if not h or _NOT_A_FUNCTION.match(h) or h.startswith(("extern \"C\" {", "static_assert")):
            continue
        if re.match(r'(extern\s*"C(\+\+)?"\s*)?template\b\s*(?!<)', h):  # explicit instantiation
            candidates.append((start, end, None))
            continue
        f = _FUNCTION_NAME.match(h)
        if f and "=" not in h[:f.end()] and not re.match(r"\s*(decltype|alignas|__attribute__)\b", h):
            candidates.append((start, end, f.group(1)))  # a host function, declared or defined
            continue
        # A host variable: the last name before =, [, ; or an initializer.
        names = [m.group(1) for m in _VARIABLE_NAME.finditer(h.split("=")[0])]
        if names:
            candidates.append((start, end, names[-1]))
    if not candidates and not types:
        return text
    all_device = "\n".join(device_text)
    candidates += [(start, end, name) for start, end, name in types
                   if not re.search(rf"(?<![\w.>]){re.escape(name)}\b", all_device)]
    out = list(text)
    for start, end, name in candidates:
        if name is not None and any(
                name not in params and re.search(rf"(?<![\w.>]){re.escape(name)}\b", body)
                for body, params in device):
            continue  # device code names it (not a parameter of the same name): NVRTC must
            # see it, and refuses a host function or variable, as nvcc refuses its use
        for k in range(start, end):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out)


def expand_includes(text: str, filename: str, folder: Path | None, strip=None) -> str:
    """``text`` with each ``#include "x.h"`` (or ``<x.h>``) of a file in ``folder`` replaced by that file's
    text between ``#line`` marks (once per file, as include guards and ``#pragma once`` do),
    recursively; ``strip`` turns each piece into what NVRTC gets (the host headers blanked)."""
    if folder is None:
        return text
    seen: set[Path] = set()

    def expand(t: str, name: str) -> str:
        t = strip(t) if strip else t
        pieces, last = [], 0
        for m in _LOCAL_INCLUDE.finditer(t):
            path = (folder / m.group(1))
            try:
                path = path.resolve()
                inside = path.is_file() and folder.resolve() in path.parents
            except OSError:
                inside = False
            if not inside:
                continue
            line = t.count("\n", 0, m.end()) + 2  # the number of the line after the include
            pieces.append(t[last:m.start()])
            if path not in seen:
                seen.add(path)
                body = _PRAGMA_ONCE.sub("", path.read_text(errors="replace"))
                inner = expand(body, m.group(1))
                pieces.append(f'#line 1 "{m.group(1)}"\n{inner}\n#line {line} "{name}"')
            last = m.end()
        pieces.append(t[last:])
        return "".join(pieces)

    return expand(text, filename)
