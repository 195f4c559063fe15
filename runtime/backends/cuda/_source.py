"""Reading and adapting CUDA C++ source text (shared by the GPU and the CPU paths).

* `read_source`: a source string or a path to a ``.cu`` file -> (text, file name).
* `parse_params`: the parameter list of a ``__global__`` function -> names and C types.
* `adapt_for_emulator`: the few rewrites the CPU emulator needs (``<<<...>>>`` launches,
  ``extern __shared__`` arrays, CUDA-only headers and checks). Every rewrite keeps the
  line count, so compiler messages point at the learner's own lines.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: The exercise stub marker: a kernel containing it has not been written yet.
NOT_SOLVED_MARKER = "NOT_SOLVED_YET"


class CudaCompileError(RuntimeError):
    """A CUDA C++ source did not compile. The message holds the compiler's output, with
    line numbers in the learner's own source."""


def read_source(source, name: str) -> tuple[str, str, Path | None]:
    """``(text, file name for messages, directory for quoted includes or None)``."""
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source
                                    and source.strip().endswith((".cu", ".cuh", ".cpp"))):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"CUDA source file {path} does not exist")
        return path.read_text(), str(path), path.resolve().parent
    if not isinstance(source, str):
        raise TypeError(f"source must be CUDA C++ text or a path to a .cu file, got {type(source).__name__}")
    base = re.sub(r"\W", "_", name.split("<")[0].strip()) or "kernel"
    return source, f"{base}.cu", None


def strip_comments(text: str) -> str:
    """The text with comments blanked out (newlines kept, so offsets and lines still match)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def has_marker(text: str) -> bool:
    return NOT_SOLVED_MARKER in strip_comments(text)


# ---------------------------------------------------------------------------------------
# Parameter lists
# ---------------------------------------------------------------------------------------
#: C type name -> one-letter code (the same codes the emulator's C++ side computes).
TYPE_CODES = {
    "float": "f", "double": "d",
    "int": "i", "signed": "i", "signed int": "i", "int32_t": "i",
    "unsigned": "I", "unsigned int": "I", "uint32_t": "I",
    "long": "l", "long int": "l", "signed long": "l", "int64_t": "l", "ptrdiff_t": "l",
    "unsigned long": "L", "unsigned long int": "L", "size_t": "L", "uint64_t": "L",
    "long long": "q", "long long int": "q", "signed long long": "q",
    "unsigned long long": "Q", "unsigned long long int": "Q",
    "short": "h", "int16_t": "h", "unsigned short": "H", "uint16_t": "H",
    "char": "c", "signed char": "b", "int8_t": "b", "unsigned char": "B", "uint8_t": "B",
    "bool": "?", "void": "v",
    "half": "e", "__half": "e", "__nv_bfloat16": "E", "nv_bfloat16": "E",
}
#: codes -> the C spelling used in messages
CODE_NAMES = {"f": "float", "d": "double", "i": "int", "I": "unsigned int", "l": "long",
              "L": "unsigned long", "q": "long long", "Q": "unsigned long long", "h": "short",
              "H": "unsigned short", "c": "char", "b": "signed char", "B": "unsigned char",
              "?": "bool", "v": "void", "e": "__half", "E": "__nv_bfloat16"}


@dataclass
class Param:
    name: str
    ctype: str          # as written, e.g. "const float* __restrict__"
    code: str | None    # scalar code, "p<code>" / "pc<code>" for pointers, None if unknown

    @property
    def is_pointer(self) -> bool:
        return bool(self.code) and self.code.startswith("p")

    @property
    def is_const_pointer(self) -> bool:
        return bool(self.code) and self.code.startswith("pc")

    @property
    def pointee(self) -> str | None:
        if not self.is_pointer:
            return None
        return self.code[2:] if self.is_const_pointer else self.code[1:]


_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "__grid_constant__"}


def _type_code(ctype: str, subst: dict[str, str]) -> str | None:
    t = ctype.replace("*", " * ").replace("&", " & ")
    words = [w for w in t.split() if w]
    stars = words.count("*")
    if "&" in words or stars > 1:
        return None
    const = False
    if stars:
        k = words.index("*")
        before, words = words[:k], words[:k]
        const = "const" in before
    words = [w for w in words if w not in _QUALIFIERS]
    base = " ".join(words)
    base = subst.get(base, base)
    base = re.sub(r"^(std::|::)", "", base)
    code = TYPE_CODES.get(base)
    if stars:
        if code is None:
            code = "x"  # a struct or vector type (float4, __half, T): any tensor dtype
        return ("pc" if const else "p") + code
    return code


def _split_top(text: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def _template_args(name: str) -> list[str]:
    if "<" not in name:
        return []
    inner = name[name.index("<") + 1: name.rindex(">")]
    return [a.strip() for a in _split_top(inner)]


def parse_params(text: str, name: str) -> list[Param] | None:
    """The parameters of the ``__global__`` function ``name`` (which may carry template
    arguments, ``"k<float, 256>"``), or None when the source does not spell them out
    plainly (macros, ...)."""
    clean = strip_comments(text)
    base = name.split("<")[0].strip()
    best = None
    for m in re.finditer(r"\b" + re.escape(base) + r"\s*\(", clean):
        start = max(clean.rfind(";", 0, m.start()), clean.rfind("}", 0, m.start()), clean.rfind("#", 0, m.start()))
        head = clean[start + 1:m.start()]
        if "__global__" not in head:
            continue
        # the parameter list: up to the matching parenthesis
        j = _closing(clean, m.end() - 1, "(", ")")
        if j < 0:
            j = len(clean)
        best = (head, clean[m.end():j])
        if clean[j + 1:j + 200].lstrip().startswith("{"):
            break  # prefer the definition
    if best is None:
        return None
    head, plist = best
    subst: dict[str, str] = {}
    tm = re.search(r"template\s*<(.*)>", head, re.S)
    if tm:
        tparams = [p.strip() for p in _split_top(tm.group(1))]
        targs = _template_args(name)
        for k, tp in enumerate(tparams):
            words = re.sub(r"=.*", "", tp).split()
            if words and k < len(targs):
                subst[words[-1]] = targs[k]
    params = []
    plist = plist.strip()
    if plist in ("", "void"):
        return []
    for k, raw in enumerate(_split_top(plist)):
        raw = re.sub(r"=.*$", "", raw.strip(), flags=re.S).strip()
        raw = re.sub(r"\[\s*\]$", "*", raw)  # float x[] is float* x
        mm = re.match(r"^(.*?)([A-Za-z_]\w*)\s*$", raw, re.S)
        if not mm or not mm.group(1).strip():
            params.append(Param(f"argument {k + 1}", raw, _type_code(raw, subst)))
            continue
        ctype, pname = mm.group(1).strip(), mm.group(2)
        ctype = re.sub(r"\s+", " ", ctype)
        params.append(Param(pname, ctype, _type_code(ctype, subst)))
    return params


# ---------------------------------------------------------------------------------------
# Adapting a source for the CPU emulator
# ---------------------------------------------------------------------------------------
#: headers that only exist with a CUDA toolkit: their names are provided by cuda_emu.h
CUDA_ONLY_HEADERS = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*[<\"]("
    r"cuda_runtime(_api)?\.h|cuda\.h|device_launch_parameters\.h|device_functions\.h|"
    r"math_constants\.h|cuda_profiler_api\.h|"  # (cuda_fp16.h, cuda_bf16.h, mma.h: the emulator's own, in emu/)
    r"c10/cuda/[^>\"]*|ATen/cuda/[^>\"]*|ATen/cuda/CUDAContext\.h|torch/cuda\.h)[>\"][^\n]*$",
    re.M)

_EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\([^)]*\)\s*|alignas\s*\([^)]*\)\s*)*"
    r"([A-Za-z_][\w:<>, ]*?)\s*(?:__align__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\[\s*\]\s*;")


#: the other order of the words, as some published code writes it: `extern float __shared__ s[];`
_EXTERN_SHARED_AFTER_TYPE = re.compile(
    r"extern\s+(?!__shared__)([A-Za-z_][\w:<>, ]*?)\s+__shared__\s+(?:__align__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)"
    r"\s*\[\s*\]\s*;")


def _rewrite_extern_shared(text: str) -> str:
    # All `extern __shared__` arrays of a kernel alias the one dynamic buffer sized by the
    # launch, as on a GPU.
    text = _EXTERN_SHARED_AFTER_TYPE.sub(lambda m: f"extern __shared__ {m.group(1)} {m.group(2)}[];", text)
    return _EXTERN_SHARED.sub(
        lambda m: f"{m.group(1)}* const {m.group(2)} = ({m.group(1)}*)::emu::dyn_shared(\"{m.group(2)}\", "
                  f"sizeof({m.group(1)}));", text)


_SHARED_KEYWORD = re.compile(r"\b__shared__\b")
_SHARED_QUALIFIER = re.compile(r"^\s*(?:(?:__align__|alignas)\s*\([^)]*\)\s*)+")
_DECLARATOR = re.compile(r"^\s*([*&\s]*)\s*([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)$")


def _shared_decl(type_: str, name: str, dims: str, align: str | None = None) -> str:
    """One static __shared__ variable, placed in the emulator's shared-memory arena and
    registered there: poisoned at every block start and, for an array, between guard zones.
    ``align``: the alignment its declaration asks for (``__align__(128)``), kept there."""
    a = f", ({align})" if align else ""
    if not dims:
        return (f"__shared__ {type_}& {name} = ::emu::shared_new<{type_}{a}>(); "
                f"static ::emu::SharedReg emu_shared_reg_{name}((void*)&{name}, sizeof({name}));")
    g = f"emu_guarded_{name}"
    t = f"::emu::Guarded<{type_} {dims}{a}>"
    return (f"__shared__ {t}& {g} = ::emu::shared_new<{t}>(); "
            f"auto& {name} = {g}.v; "
            f"static ::emu::SharedReg emu_shared_reg_{name}((void*)&{name}, sizeof({name}), {g}.guard_before(), "
            f"{g}.post, \"{name}\", sizeof(std::remove_all_extents_t<std::remove_reference_t<"
            f"decltype({name})>>));")


_ALIGN_ARG = re.compile(r"(?:__align__|alignas)\s*\(([^)]*)\)")


def _alignment(qualifier: str) -> str | None:
    """The largest alignment ``__align__(n)`` / ``alignas(n)`` words ask for, as a C++
    expression; ``alignas(T)`` of a type is ``alignof(T)``."""
    args = [a.strip() for a in _ALIGN_ARG.findall(qualifier) if a.strip()]
    if not args:
        return None
    exprs = [a if re.match(r"^[\d(]|^(?:sizeof|alignof)\b", a) or a.isupper() else f"alignof({a})" for a in args]
    out = exprs[0]
    for e in exprs[1:]:
        out = f"(({out}) > ({e}) ? ({out}) : ({e}))"
    return out


def _register_shared(text: str) -> str:
    # Each static __shared__ variable (every declarator of `__shared__ float a[N], b[N];`)
    # lives in the emulator's shared-memory arena, away from its own state, and is
    # registered there: poisoned at the start of every block (a GPU block finds garbage
    # there, not the last block's data), an array between guard zones so that a write past
    # its end is reported. Line numbers are kept.
    out, pos = [], 0
    for m in _SHARED_KEYWORD.finditer(text):
        if m.start() < pos:
            continue
        end = text.find(";", m.end())
        if end < 0:
            break
        body = text[m.end():end]
        if any(c in body for c in "{}=") or re.search(r"\bextern\s*$", text[max(0, m.start() - 20):m.start()]):
            continue  # not a plain declaration: leave it to g++
        qualifier = _SHARED_QUALIFIER.match(body)
        align = _alignment(qualifier.group(0)) if qualifier else None
        body = _SHARED_QUALIFIER.sub("", body)
        parts = _split_top(body)
        first = re.match(r"^\s*((?:(?:volatile|const|unsigned|signed|long|short|struct)\s+)*"
                         r"[A-Za-z_][\w:]*(?:\s*<[^;]*>)?(?:\s+(?:int|long|char|short|double))*)\s*(.*)$",
                         parts[0], re.S)
        if not first:
            continue
        type_ = first.group(1).strip()
        decls = [first.group(2)] + parts[1:]
        pieces = []
        for d in decls:
            dm = _DECLARATOR.match(d)
            if not dm:
                pieces = None
                break
            stars = dm.group(1).replace(" ", "").replace("\n", "")
            pieces.append(_shared_decl(type_ + stars, dm.group(2), dm.group(3).strip(), align))
        if not pieces:
            continue
        out.append(text[pos:m.start()])
        out.append(" ".join(pieces) + "\n" * text.count("\n", m.start(), end))
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)


def _callee_start(text: str, end: int) -> int:
    """Start of the expression naming the kernel just before ``<<<`` (``ns::k<T>``)."""
    j = end
    while j > 0 and text[j - 1].isspace():
        j -= 1
    while True:
        if j > 0 and text[j - 1] == ">":  # template arguments
            j = max(_closing(text, j - 1, "<", ">", step=-1), 0)
        while j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
            j -= 1
        if j > 1 and text[j - 2:j] in ("::", "##"):  # ns::k, or a name pasted in a macro: pre##_kernel
            j -= 2
            while j > 0 and text[j - 1] in " \t":
                j -= 1
            continue
        return j


def rewrite_launches(text: str) -> str:
    """``k<<<g, b, smem, stream>>>(args)`` -> ``::emu::make_launch(k, "k", LINE, g, b, smem, stream)(args)``."""
    out, pos = [], 0
    # where to look: comments and string literals ("k<<<>>> failed") blanked, same offsets
    code = re.sub(r'"(?:\\.|[^"\\\n])*"', lambda m: '"' + " " * (len(m.group(0)) - 2) + '"', strip_comments(text))
    while True:
        i = code.find("<<<", pos)
        if i < 0:
            out.append(text[pos:])
            return "".join(out)
        j = code.find(">>>", i + 3)
        if j < 0:
            raise CudaCompileError("a `<<<` kernel launch has no matching `>>>`")
        s = _callee_start(text, i)
        callee = text[s:i].strip()
        cfg = text[i + 3:j]
        line = text.count("\n", 0, i) + 1
        out.append(text[pos:s])
        quoted = callee.replace('"', "")
        out.append(f'::emu::make_launch({callee}, "{quoted}", {line}, {cfg})')
        pos = j + 3


#: CUDA headers whose names the emulator provides only if a header of that name sits next to
#: cuda_emu.h (utils/cuda/emu/): then the include finds it; otherwise one clear error.
OPTIONAL_HEADERS = {"cuda_fp16.h": "__half (cuda_fp16.h)", "cuda_bf16.h": "__nv_bfloat16 (cuda_bf16.h)",
                    "mma.h": "wmma / tensor-core fragments (mma.h)",
                    "cuda_pipeline.h": "cuda_pipeline.h (memcpy_async)",
                    "cuda/pipeline": "cuda::pipeline", "cuda/barrier": "cuda::barrier",
                    "cooperative_groups/memcpy_async.h": "cooperative_groups::memcpy_async"}
#: NVIDIA's libraries, which run their own GPU code: never in the emulator. Each has a header
#: of its name in emu/ that stops with the same error where a header of the kernel's project
#: includes it (the kernel's own file gets it from check_supported, without g++).
LIBRARY_HEADERS = {"cublas_v2.h": "cuBLAS", "cublas.h": "cuBLAS", "cublasLt.h": "cuBLASLt", "cufft.h": "cuFFT",
                   "curand.h": "cuRAND", "curand_kernel.h": "cuRAND", "cusparse.h": "cuSPARSE",
                   "cusolverDn.h": "cuSOLVER", "cudnn.h": "cuDNN", "nccl.h": "NCCL"}
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]", re.M)
EMU_HEADER_DIR = Path(__file__).resolve().parent / "emu"


def check_supported(text: str, kernel: str | None = None) -> None:
    """One clear error for a CUDA feature the emulator does not have (instead of a cascade
    of g++ errors about names it never declared). With ``kernel``, also when that kernel
    synchronizes its grid (see `grid_sync_of`)."""
    for m in _INCLUDE.finditer(text):
        name = m.group(1)
        what = f"{LIBRARY_HEADERS[name]} ({name})" if name in LIBRARY_HEADERS else \
            OPTIONAL_HEADERS[name] if name in OPTIONAL_HEADERS and not (EMU_HEADER_DIR / name).exists() else None
        if what:
            line = text.count("\n", 0, m.start()) + 1
            raise CudaCompileError(f"line {line}: the CPU emulator does not support {what} "
                                   f"(#include <{name}>); this kernel runs only on a GPU")
    for pattern, what in ((r"\bcudaLaunchCooperativeKernel\b", "grid-wide synchronization (cooperative launches)"),
                          (r"\btex[123]D\w*\s*<|\bcudaTextureObject_t\b", "textures"),
                          (r"\bwmma::", "wmma / tensor-core fragments")):
        if what.startswith("wmma") and (EMU_HEADER_DIR / "mma.h").exists():
            continue
        m = re.search(pattern, strip_comments(text))
        if m:
            raise CudaCompileError(f"the CPU emulator does not support {what} (`{m.group(0).strip()}`); "
                                   "this kernel runs only on a GPU")
    sync = grid_sync_of(text, kernel) if kernel else None
    if sync:
        raise CudaCompileError(f"the CPU emulator does not support grid-wide synchronization (`{sync}`); "
                               "this kernel runs only on a GPU")


_CONTROL_WORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype", "defined",
                  "__launch_bounds__", "__attribute__", "__align__", "alignas", "static_assert"}
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*(?:<[^;{}()]*>\s*)?\(")


def _closing(code: str, i: int, open_: str, close: str, step: int = 1) -> int:
    """The index of the bracket that closes the one at ``i``, or -1; with ``step=-1``, read
    backwards, the index of the bracket that opens the closing one at ``i``."""
    depth = 0
    for j in range(i, len(code) if step > 0 else -1, step):
        if code[j] == open_:
            depth += step
        elif code[j] == close:
            depth -= step
        else:
            continue
        if depth == 0:
            return j
    return -1


def _function_bodies(code: str) -> dict[str, list[str]]:
    """Function name -> the bodies of its definitions in ``code`` (comments and strings blanked)."""
    bodies: dict[str, list[str]] = {}
    for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", code):
        if m.group(1) in _CONTROL_WORDS:
            continue
        close = _closing(code, m.end() - 1, "(", ")")
        if close < 0:
            continue
        head = re.match(r"(?:\s*(?:const|volatile|noexcept|override|final|&&?|->\s*[\w:<>,\s*&]+?))*\s*\{",
                        code[close + 1:close + 300])
        if head:
            start = close + head.end() - 1
            end = _closing(code, start, "{", "}")
            if end > 0:
                bodies.setdefault(m.group(1), []).append(code[start:end + 1])
    return bodies


def grid_sync_of(text: str, kernel: str) -> str | None:
    """What in kernel ``kernel`` (or in a function of the source it calls) synchronizes the
    whole grid (``grid.sync()`` on a ``this_grid()`` group), or None. Only such a kernel needs a
    cooperative launch: the other kernels of its source run, and a ``this_grid()`` used for
    ranks and sizes runs too, as in an ordinary launch on a GPU."""
    code = re.sub(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', "0", strip_comments(text))
    if "this_grid" not in code and "grid_group" not in code:
        return None
    names = set(re.findall(r"\bgrid_group\s*(?:const\s*)?[&*]?\s*([A-Za-z_]\w*)", code))
    names |= set(re.findall(r"\b([A-Za-z_]\w*)\s*=\s*(?:\w+\s*::\s*)*this_grid\s*\(\s*\)", code))
    names -= {"const", "this_grid"}
    alts = [r"\bthis_grid\s*\(\s*\)\s*\.\s*(?:sync|barrier_arrive)\s*\("]
    if names:
        n = "|".join(sorted(map(re.escape, names)))
        alts += [rf"\b(?:{n})\s*(?:\.|->)\s*(?:sync|barrier_arrive)\s*\(", rf"\bsync\s*\(\s*\*?\s*(?:{n})\s*\)"]
    sync = re.compile("|".join(alts))
    bodies = _function_bodies(code)
    todo, seen = [kernel.split("<")[0].split("::")[-1].strip()], set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for body in bodies.get(f, ()):
            m = sync.search(body)
            if m:
                found = re.sub(r"\s+", "", m.group(0))
                return found + ")" if found.endswith("(") else found
            todo += [c for c in _CALL.findall(body) if c in bodies and c not in seen]
    return None


def adapt_for_emulator(text: str, kernel: str | None = None) -> str:
    """The rewrites the emulator needs; line numbers are unchanged. With ``kernel``, the
    kernel that will be launched, whose grid-wide synchronization is rejected (other kernels
    of the source may still run)."""
    check_supported(text, kernel)
    return _rewrite_for_emulator(text)


def _rewrite_for_emulator(text: str) -> str:
    text = CUDA_ONLY_HEADERS.sub("", text)
    text = re.sub(r"\bstatic(\s+__shared__)\b", r"\1", text)  # __shared__ is already static here
    text = _rewrite_extern_shared(text)
    text = _register_shared(text)
    if "<<<" in text:
        text = rewrite_launches(text)
    return text


_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def project_headers(text: str, include_dir: Path) -> dict[str, str]:
    """The headers of the kernel's own folder that ``text`` includes with quotes, and those
    that they include in turn: path relative to ``include_dir`` -> its text with the rewrites
    of `adapt_for_emulator` (an ``extern __shared__`` array of a header is the launch's buffer
    too). Each starts with a ``#line`` that names the original, so g++'s messages point at it.
    The emulator's build puts them first on the include path."""
    root = include_dir.resolve()
    out: dict[str, str] = {}
    todo = [(text, root)]
    while todo:
        src, here = todo.pop()
        for name in _QUOTED_INCLUDE.findall(strip_comments(src)):
            # g++ looks beside the including file first, then on the include path
            path = next((p for p in ((here / name).resolve(), (root / name).resolve()) if p.is_file()), None)
            if path is None or not path.is_relative_to(root):
                continue
            rel = path.relative_to(root).as_posix()
            if rel in out:
                continue
            header = path.read_text(errors="replace")
            out[rel] = f'#line 1 "{path}"\n' + _rewrite_for_emulator(header)
            todo.append((header, path.parent))
    return out


def adapt_torch_host_code(text: str) -> str:
    """Host code written for CUDA tensors, made to accept the course's CPU tensors: the
    emulated "device" is the CPU (``x.is_cuda()`` -> ``x.is_cpu()``, ``kCUDA`` -> ``kCPU``)."""
    text = re.sub(r"\.is_cuda\s*\(\s*\)", ".is_cpu()", text)
    text = re.sub(r"\bkCUDA\b", "kCPU", text)
    text = re.sub(r"\.cuda\s*\(\s*\)", ".cpu()", text)
    text = re.sub(r"\btorch::Device\s*\(\s*\"cuda(:\d+)?\"\s*\)", 'torch::Device("cpu")', text)
    return text
