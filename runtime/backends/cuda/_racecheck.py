"""Race detection in the CUDA C++ emulator: the switch, the compiler flags and the report.

The kernel's translation unit is compiled with g++'s ``-fsanitize=thread`` instrumentation
but linked without its runtime: every load and store of kernel code calls a ``__tsan_*``
function that ``emu/cuda_emu.h`` defines, which checks the access against a shadow of
shared memory and of the tensor arguments (the rules are in the header). The first race
stops the launch; this module turns what the emulator recorded into a `KernelRace` naming
the kernel, the array and index, both threads and blocks, both source lines and the fix.

On by default in simulation. ``COURSE_EMU_RACECHECK=0`` turns it off for the process, and
``with utils.race_detection(False):`` for a few launches (e.g. to watch a racy kernel
compute a wrong answer). Off, kernels are compiled without the instrumentation and run at
full speed.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import threading

from ._errors import KernelFault

ENV = "COURSE_EMU_RACECHECK"
#: what g++ needs to call the checker at every access (line tables name the source lines)
FLAGS = ["-DEMU_RACECHECK", "-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0", "-g1"]
_state = threading.local()


class KernelRace(KernelFault):
    """Two threads of a kernel access the same memory without synchronization, at least
    one of them with a plain write: a data race. The message names both accesses and the fix."""


def default() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def enabled() -> bool:
    st = getattr(_state, "stack", None)
    return st[-1] if st else default()


@contextlib.contextmanager
def race_detection(enabled: bool = True):
    """Check emulated CUDA C++ launches for data races (``True``, the default in simulation)
    or not (``False``) inside the ``with`` block. On a GPU this does nothing; use
    ``compute-sanitizer --tool racecheck`` there."""
    st = getattr(_state, "stack", None)
    if st is None:
        st = _state.stack = []
    st.append(bool(enabled))
    try:
        yield
    finally:
        st.pop()


class RaceInfo(ctypes.Structure):
    _fields_ = [("space", ctypes.c_int), ("region", ctypes.c_int), ("offset", ctypes.c_ulonglong),
                ("size", ctypes.c_int), ("kind_now", ctypes.c_int), ("kind_then", ctypes.c_int),
                ("tid_now", ctypes.c_int * 3), ("tid_then", ctypes.c_int * 3),
                ("block_now", ctypes.c_int * 3), ("block_then", ctypes.c_int * 3),
                ("pc_now", ctypes.c_ulonglong), ("pc_then", ctypes.c_ulonglong),
                ("same_block", ctypes.c_int), ("same_warp", ctypes.c_int),
                ("lane_now", ctypes.c_int), ("lane_then", ctypes.c_int), ("where", ctypes.c_char * 256)]


def source_lines(lib_path, pcs: list[int], filename: str) -> list[int | None]:
    """The line of ``filename`` each code offset of the library belongs to (None: unknown).
    With inlined helpers the innermost frame in the kernel's own file wins."""
    tool = shutil.which("addr2line")
    wanted = [pc for pc in pcs if pc]
    if not tool or not wanted:
        return [None] * len(pcs)
    try:
        out = subprocess.run([tool, "-a", "-i", "-e", str(lib_path), *[hex(pc - 1) for pc in wanted]],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return [None] * len(pcs)
    frames: list[list[str]] = []
    for line in out.splitlines():
        if line.startswith("0x"):
            frames.append([])
        elif frames:
            frames[-1].append(line.strip())
    found = {}
    for pc, fr in zip(wanted, frames):
        for f in fr:
            name, _, num = f.split(" ")[0].rpartition(":")
            # a relative #line name comes back joined to the compiler's working directory
            if (name == filename or name.endswith("/" + filename)) and num.isdigit():
                found[pc] = int(num)
                break
    return [found.get(pc) for pc in pcs]


_KINDS = {0: "reads", 1: "writes", 2: "atomically updates"}
_KINDS_PAST = {0: "read", 1: "wrote", 2: "atomically updated"}


def _fmt(v) -> str:
    return f"({v[0]},{v[1]},{v[2]})"


def report(kname: str, info: RaceInfo, lib, where_global: str | None) -> KernelRace:
    """The exception for the race the emulator stopped at."""
    ln_now, ln_then = source_lines(lib.path, [info.pc_now, info.pc_then], getattr(lib, "filename", ""))
    src = getattr(lib, "source", "").splitlines()

    def at(ln):
        if ln is None:
            return "on an unknown line"
        code = src[ln - 1].strip() if 0 < ln <= len(src) else ""
        return f"on line {ln}" + (f" (`{code}`)" if code else "")

    where = where_global if info.space == 1 else info.where.decode("utf-8", "replace")
    me = f"thread {_fmt(info.tid_now)} of block {_fmt(info.block_now)}"
    other = f"thread {_fmt(info.tid_then)} of block {_fmt(info.block_then)}"
    first = (f"{kname}: data race on `{where}` ({'shared' if info.space == 0 else 'global'} memory): "
             f"{me} {_KINDS[info.kind_now]} it {at(ln_now)}, and {other} {_KINDS_PAST[info.kind_then]} it "
             f"{at(ln_then)}")
    if ln_now and ln_then and ln_now != ln_then:
        a, b = sorted((ln_then, ln_now))
        between = f"between line {a} and line {b}"
    elif ln_now:
        between = f"after line {ln_now}, so that one thread's pass over it ends before another's begins"
    else:
        between = "between the two accesses"
    if not info.same_block:
        rmw = info.kind_now != 2 and info.kind_then != 2 and ln_now == ln_then
        fix = ("Blocks run in any order and cannot wait for each other, so a plain read-modify-write of one "
               "element by several blocks loses updates: use atomicAdd (or atomicMax, ...) for the update, or write "
               "one partial result per block and combine them in a second kernel."
               if rmw or 1 in (info.kind_now, info.kind_then) and 0 in (info.kind_now, info.kind_then) else
               "Blocks run in any order and cannot wait for each other: give each block its own elements, or make "
               "the update an atomic (atomicAdd, atomicMax, ...).")
        if 2 in (info.kind_now, info.kind_then):
            fix = ("An atomic and a plain write of the same element by different blocks race: make every update "
                   "of it atomic.")
        return KernelRace(f"{first}. {fix}")
    if info.same_warp:
        fix = (f"The two threads are lanes {info.lane_then} and {info.lane_now} of one warp. Since Volta (independent "
               "thread scheduling) the lanes of a warp do not run in lockstep, and one may run ahead of another: "
               f"put a __syncthreads() {between} (or a __syncwarp(), if only the lanes of one warp share "
               "this data)" + ("; or make every update atomic." if 2 in (info.kind_now, info.kind_then) else "."))
        return KernelRace(f"{first}, with no __syncwarp() between them (an intra-warp hazard). {fix}")
    if 2 in (info.kind_now, info.kind_then):
        fix = f"make every update of it atomic, or put a __syncthreads() {between}."
    else:
        fix = f"put a __syncthreads() {between} (every thread of the block must reach it)."
    return KernelRace(f"{first}, with no barrier between them: {fix}")
