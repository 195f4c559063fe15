"""Profiling CUDA C++ kernels: the emulator's counters in simulation, Nsight Compute on a GPU.

In simulation a kernel is compiled once more, as a *profiling variant* of its library (cached
apart, so normal launches keep their speed): with the race detector's ``-fsanitize=thread``
instrumentation every load and store of kernel code reaches the emulator, and with
``-fsanitize-coverage=trace-pc`` so does the start of every basic block. The emulator
(``emu/cuda_emu.h``, "profiling") groups the accesses of a warp into warp-wide instruction
instances and counts them as Nsight Compute does; this module reads the counters, names the
source lines and arrays, and turns them into ncu-named metrics, per-site rows, sentences and a
trace of the accesses (see ``runtime/backends/profile_report.py`` for the result, ``docs/cuda-emulator.md``).

On a GPU the same call runs ``ncu`` on that one launch in a subprocess and parses its CSV.
"""
from __future__ import annotations

import contextlib
import csv
import ctypes
import functools
import io
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ... import paths

#: What g++ needs for the profiling variant (besides the race detector's flags): a hook at every
#: basic block; no tail calls, so that every hook's return address lies in the caller's code; and
#: no scalar replacement of aggregates, which would load a float4 as four floats (a GPU loads it
#: with one 16-byte instruction).
COVERAGE = "-fsanitize-coverage=trace-pc"
FLAGS = ["-DEMU_PROFILE", COVERAGE, "-fno-optimize-sibling-calls", "-fno-tree-sra"]
#: Accesses kept for ``Profile.trace`` (pictures of small launches); a larger launch has no trace.
TRACE_CAP = 1 << 18
SECTOR = 32
# The emulator's own functions keep out of the basic-block hook with an attribute that g++ knows
# from version 12 on (clang: no_sanitize("coverage")); without it the hook would call itself.
_COVERAGE_PROBE = """
#if defined(__clang__)
#define NOCOV __attribute__((no_sanitize("coverage")))
#else
#define NOCOV __attribute__((no_sanitize_coverage))
#endif
extern "C" NOCOV void __sanitizer_cov_trace_pc() {}
int f(int x) { return x ? 1 : 2; }
"""


@functools.lru_cache(maxsize=None)
def flags(cxx: str) -> list[str]:
    """FLAGS for this compiler: without the basic-block hook where the compiler cannot keep the
    emulator's functions out of it (g++ 11 and older): then divergence is not counted."""
    try:
        proc = subprocess.run([cxx, COVERAGE, "-Werror=attributes", "-x", "c++", "-c", "-", "-o", os.devnull],
                              input=_COVERAGE_PROBE, capture_output=True, text=True, timeout=60)
        ok = proc.returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return FLAGS if ok else [f for f in FLAGS if f != COVERAGE]


# ---------------------------------------------------------------------------------------
# The emulator's counters (layouts as in cuda_emu.h)
# ---------------------------------------------------------------------------------------
SITE_FIELDS = ["requests", "sectors", "ideal_sectors", "wavefronts", "ideal_wavefronts", "lanes",
               "possible_lanes", "bytes", "kind", "size", "region", "stride", "has_stride",
               "worst_wavefronts", "worst_bank", "worst_lanes", "used", "first_offset", "worst_stride",
               "has_worst_stride"]
BB_FIELDS = ["instances", "lanes", "possible_lanes"]
TRACE_FIELDS = ["block", "thread", "space", "op", "region", "offset", "size", "pcid", "instr", "shared_array"]
_LL, _P = ctypes.c_longlong, ctypes.c_void_p


class _Result(ctypes.Structure):
    _fields_ = [("npc", _LL), ("pcs", _P), ("sites", _P), ("bbs", _P),
                ("atomics_global", _LL), ("atomics_shared", _LL), ("hot_region", _LL), ("hot_offset", _LL),
                ("hot_count", _LL), ("bytes_read", _LL), ("bytes_written", _LL), ("bytes_touched", _LL),
                ("trace", _P), ("trace_n", _LL), ("trace_overflow", _LL), ("instr", _LL), ("pc_overflow", _LL),
                ("lost", _LL)]


@contextlib.contextmanager
def one_thread():
    """torch on one thread for a while: the arrays here are small (at most 2^18 rows), and on a
    busy machine a parallel op can wait far longer for its threads than it computes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _int64s(ptr: int, rows: int, cols: int) -> torch.Tensor:
    if rows == 0 or not ptr:
        return torch.zeros((0, cols), dtype=torch.int64)
    raw = bytearray(ctypes.string_at(ptr, rows * cols * 8))
    return torch.frombuffer(raw, dtype=torch.int64).view(rows, cols)


class Recorder:
    """Collects the counters of one launch of a profiling library (passed to _emulator.launch)."""

    def __init__(self, trace_cap: int | None = None):
        self.trace_cap = TRACE_CAP if trace_cap is None else trace_cap
        self.raw = None
        self.regions = []

    def begin(self, lib, groups):
        # Each argument buffer, and where its start would sit in a GPU allocation (torch's CUDA
        # allocator hands out 512-byte aligned blocks; a view starts at its storage offset), so
        # that sectors are counted against the GPU's alignment, not the emulator's.
        self.regions = []
        los, lens, phases = [], [], []
        for g in groups:
            first = min(g["members"], key=lambda m: m[1].data_ptr())
            t = first[1]
            try:
                phase = (t.data_ptr() - t.untyped_storage().data_ptr()) % 256
            except (RuntimeError, NotImplementedError):
                phase = 0
            los.append(g["buf"].start)
            lens.append(g["hi"] - g["lo"])
            phases.append(phase)
            self.regions.append({"lo": g["lo"], "members": [(k, m.data_ptr(), m.numel() * m.element_size(),
                                                             m.element_size()) for k, m, _ in g["members"]]})
        n = len(los)
        arr = lambda v: (ctypes.c_ulonglong * max(1, n))(*v)  # noqa: E731
        f = lib.lib.emu_prof_begin
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong]
        if f(n, arr(los), arr(lens), arr(phases), self.trace_cap) != 0:
            raise MemoryError("cannot allocate the profiler's counters")

    def end(self, lib, collect: bool):
        try:
            if collect:
                with one_thread():
                    self.raw = self._read(lib)
        finally:
            lib.lib.emu_prof_end()

    def _read(self, lib) -> dict:
        lib.lib.emu_prof_result.restype = ctypes.POINTER(_Result)
        r = lib.lib.emu_prof_result().contents
        npc = int(r.npc)
        pcs = _int64s(r.pcs, npc, 1).view(-1).tolist()
        sites = _int64s(r.sites, npc * 2, len(SITE_FIELDS))
        bbs = _int64s(r.bbs, npc, len(BB_FIELDS))
        trace = _int64s(r.trace, int(r.trace_n), len(TRACE_FIELDS)) if r.trace_n else None
        name_of = lib.lib.emu_prof_shared_name
        name_of.restype = ctypes.c_char_p
        name_of.argtypes = [ctypes.c_int]
        shared_ids = set(sites[1::2, SITE_FIELDS.index("region")].tolist())
        if trace is not None:
            shared_ids |= set(torch.unique(trace[:, TRACE_FIELDS.index("shared_array")]).tolist())
        shared_names = {}
        for i in shared_ids:
            if i >= 0:
                nm = name_of(int(i))
                shared_names[int(i)] = nm.decode() if nm else "a __shared__ variable"
        return {"pcs": pcs, "sites": sites, "bbs": bbs, "trace": trace,
                "trace_overflow": bool(r.trace_overflow), "pc_overflow": bool(r.pc_overflow),
                "lost": bool(r.lost),
                "atomics_global": int(r.atomics_global), "atomics_shared": int(r.atomics_shared),
                "hot": (int(r.hot_region), int(r.hot_offset), int(r.hot_count)),
                "bytes_read": int(r.bytes_read), "bytes_written": int(r.bytes_written),
                "bytes_touched": int(r.bytes_touched),
                "shared_names": shared_names}

    def argument_at(self, region: int, offset: int) -> tuple[int, int, int]:
        """(argument index, byte offset in that argument, element size) of a byte of a buffer."""
        reg = self.regions[region]
        addr = reg["lo"] + offset
        for k, ptr, nbytes, esz in reg["members"]:
            if ptr <= addr < ptr + max(nbytes, 1):
                return k, addr - ptr, esz
        k, ptr, _, esz = reg["members"][0]
        return k, addr - ptr, esz


# ---------------------------------------------------------------------------------------
# From counters to metrics, sites and sentences
# ---------------------------------------------------------------------------------------
OPS = {0: "ld", 1: "st", 2: "atom"}
GLOBAL = "l1tex__t_{what}_pipe_lsu_mem_global_op_{op}.sum"
SHARED_WAVES = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum"
SHARED_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum"
SHARED_INSTS = "sm__sass_inst_executed_op_shared_{op}.sum"
LANES_RATIO = "smsp__thread_inst_executed_per_inst_executed.ratio"


def analyze(raw: dict, rec: Recorder, lib, params, grid: tuple, block: tuple,
            atom_kinds: dict | None = None, predicated=()) -> dict:
    """The profile of one launch from the counters: metrics, sites, summary, trace, extras.
    ``atom_kinds`` (atom_kinds_from_sass) says which source lines' global atomics are
    reductions (``red``: the old value unused); None: unknown, every global atomic is
    counted as ``atom`` and ``op_red`` is absent."""
    from . import _racecheck
    # (a piece of a split access carries its index above bit 48 of its code address)
    pcs = [pc & ((1 << 48) - 1) for pc in raw["pcs"]]
    lines = _racecheck.source_lines(lib.path, pcs, lib.filename) if pcs else []
    src = lib.source.splitlines()
    F = {f: i for i, f in enumerate(SITE_FIELDS)}
    sites: dict[tuple, dict] = {}
    for row_i, row in enumerate(raw["sites"].tolist()):
        if not row[F["used"]]:
            continue
        pcid, space = divmod(row_i, 2)
        line = lines[pcid] if pcid < len(lines) else None
        op = OPS.get(row[F["kind"]], "ld")
        if space == 0:
            k, off, esz = rec.argument_at(row[F["region"]], row[F["first_offset"]])
            name = params[k].name if k < len(params) else f"argument {k + 1}"
        else:
            name = raw["shared_names"].get(row[F["region"]], "shared memory")
        key = (line, name, space, op)
        s = sites.get(key)
        if s is None:
            s = sites[key] = {"line": line, "name": name, "space": "global" if space == 0 else "shared", "op": op,
                              "requests": 0, "sectors": 0 if space == 0 else None,
                              "ideal_sectors": 0 if space == 0 else None,
                              "wavefronts": None if space == 0 else 0, "ideal_wavefronts": None if space == 0 else 0,
                              "bank_conflicts": None if space == 0 else 0, "lanes": 0, "possible_lanes": 0,
                              "bytes": 0, "size": row[F["size"]],
                              "stride_bytes": row[F["stride"]] if row[F["has_stride"]] else None,
                              "worst_wavefronts": 0, "worst_bank": None, "worst_lanes": 0, "worst_stride": None,
                              "code": src[line - 1].strip() if line and 0 < line <= len(src) else ""}
        s["requests"] += row[F["requests"]]
        s["lanes"] += row[F["lanes"]]
        s["possible_lanes"] += row[F["possible_lanes"]]
        s["bytes"] += row[F["bytes"]]
        if space == 0:
            s["sectors"] += row[F["sectors"]]
            s["ideal_sectors"] += row[F["ideal_sectors"]]
        else:
            s["wavefronts"] += row[F["wavefronts"]]
            s["ideal_wavefronts"] += row[F["ideal_wavefronts"]]
            s["bank_conflicts"] = s["wavefronts"] - s["ideal_wavefronts"]
            if row[F["worst_wavefronts"]] > s["worst_wavefronts"]:
                s["worst_wavefronts"], s["worst_bank"], s["worst_lanes"] = (
                    row[F["worst_wavefronts"]], row[F["worst_bank"]], row[F["worst_lanes"]])
                s["worst_stride"] = row[F["worst_stride"]] if row[F["has_worst_stride"]] else None
    site_list = sorted(sites.values(), key=lambda s: (s["line"] or 0, s["space"], s["op"], s["name"]))
    for s in site_list:
        s["avg_lanes"] = s["lanes"] / s["requests"] if s["requests"] else 0.0
        if s["space"] == "global" and s["op"] == "atom" and atom_kinds is not None \
                and atom_kinds.get(s["line"]) == "red":
            s["op"] = "red"
        if s["space"] == "global" and s["op"] in ("atom", "red") and getattr(atom_kinds, "aggregated", False):
            s["sectors"] = s["requests"]  # one lane per warp, one sector per request

    metrics: dict[str, float] = {}
    for op in ("ld", "st", "atom", "red"):
        g = [s for s in site_list if s["space"] == "global" and s["op"] == op]
        if op == "red" and atom_kinds is None:
            continue  # not known without the machine code: absent, not 0
        metrics[GLOBAL.format(what="requests", op=op)] = sum(s["requests"] for s in g)
        metrics[GLOBAL.format(what="sectors", op=op)] = sum(s["sectors"] for s in g)
    for op in ("ld", "st"):
        sh = [s for s in site_list if s["space"] == "shared" and s["op"] == op]
        metrics[SHARED_WAVES.format(op=op)] = sum(s["wavefronts"] for s in sh)
        metrics[SHARED_CONFLICTS.format(op=op)] = sum(s["bank_conflicts"] for s in sh)
        metrics[SHARED_INSTS.format(op=op)] = sum(s["requests"] for s in sh)
    metrics["smem_requests_ld"] = metrics[SHARED_INSTS.format(op="ld")]
    metrics["smem_requests_st"] = metrics[SHARED_INSTS.format(op="st")]

    # Divergence: active lanes per warp-level instance of each basic block of the kernel's own
    # code (blocks of the emulator, which have no line in the kernel's file, are left out).
    # A `__shared__` declaration runs no instruction on a GPU; here it is a C++ static whose
    # first-use guard is a branch: left out too.
    declares = {i + 1 for i, text in enumerate(src) if "__shared__" in text}
    # A body nvcc predicates (see predicated_lines) is issued with every lane that reached its
    # `if`: in Nsight Compute's ratio it counts as its surroundings do, so its blocks are left
    # out of the ratio here. Its lanes with the predicate off still idle: the sentences, which
    # come from the lanes that did the work, say so.
    predicated = set(predicated or ())
    branches: dict[int, list[int]] = {}
    inst = lanes = work_inst = work_lanes = 0
    for pcid, (n_inst, n_lanes, n_possible) in enumerate(raw["bbs"].tolist()):
        line = lines[pcid] if pcid < len(lines) else None
        if not n_inst or line is None or line in declares:
            continue
        work_inst += n_inst
        work_lanes += n_lanes
        if line not in predicated:
            inst += n_inst
            lanes += n_lanes
        b = branches.setdefault(line, [0, 0, 0])
        b[0] += n_inst
        b[1] += n_lanes
        b[2] += n_possible
    if inst:
        metrics[LANES_RATIO] = lanes / inst
    # the lanes that did the work, predicated bodies with only the lanes whose condition held
    # (no Nsight Compute name: its predicate-on ratio also counts inside the instructions)
    working_lanes = work_lanes / work_inst if work_inst else None

    sectors_total = sum(s["sectors"] for s in site_list if s["space"] == "global")
    hot_region, hot_offset, hot_count = raw["hot"]
    hot = None
    if hot_region >= 0 and hot_count:
        k, off, esz = rec.argument_at(hot_region, hot_offset)
        hot = f"{params[k].name if k < len(params) else 'argument ' + str(k + 1)}[{off // max(esz, 1)}]"
    atomics = {"count": raw["atomics_global"] + raw["atomics_shared"], "global": raw["atomics_global"],
               "shared": raw["atomics_shared"], "address": hot, "address_count": hot_count if hot else 0}
    # Bytes needed: every distinct byte the kernel read, once, plus every distinct byte it wrote,
    # once (an element updated in place must come in and go out: it counts twice, as the
    # other simulators' profiles count it).
    needed, moved = raw["bytes_read"] + raw["bytes_written"], sectors_total * SECTOR
    out = {"metrics": metrics, "sites": site_list, "bytes_needed": needed, "bytes_moved": moved,
           "atomics": atomics, "branches": branches,
           "working_lanes": working_lanes}
    out["summary"] = summarize(site_list, branches, atomics, grid, block, predicated)
    if raw["pc_overflow"] or raw["lost"]:  # said first: the numbers above are incomplete
        out["summary"].insert(0, "the counts are incomplete: " + (
            "the kernel has more than 4096 memory instructions and basic blocks, and the last ones were counted "
            "together" if raw["pc_overflow"] else "the profiler ran out of memory, and some accesses were not counted"))
    if needed and moved > 1.1 * needed and not atomics["count"]:
        out["summary"].append(f"the launch moves {_num(moved / needed)}x the bytes it needs ({moved} bytes in "
                              f"32-byte sectors for {needed} bytes read or written)")
    out["trace"], out["trace_names"] = _trace(raw, rec, params, lines)
    return out


def _trace(raw, rec: Recorder, params, lines):
    t = raw["trace"]
    if t is None or raw["trace_overflow"]:
        return None, None
    cols = dict(zip(TRACE_FIELDS, t.t().contiguous()))  # one contiguous row per field
    thread, space, region = cols["thread"], cols["space"], cols["region"]
    offset = cols["offset"]
    arg = torch.full_like(thread, -1)
    for r, reg in enumerate(rec.regions):
        sel = (space == 0) & (region == r)
        if not bool(sel.any()):
            continue
        if len(reg["members"]) == 1:
            k, ptr, _, _ = reg["members"][0]
            arg[sel] = k
            offset[sel] -= ptr - reg["lo"]
        else:  # aliasing arguments: the one each byte falls in
            for i in sel.nonzero().view(-1).tolist():
                k, off, _ = rec.argument_at(r, int(offset[i]))
                arg[i], offset[i] = k, off
    line_of = torch.tensor([ln or 0 for ln in lines] or [0], dtype=torch.int64)
    pcid = cols["pcid"].clamp(max=len(line_of) - 1)
    shared_array = cols["shared_array"]
    # (the dense index of the shared array among the names below, -1 for global accesses)
    ids = [i for i in torch.unique(shared_array).tolist() if i >= 0]
    dense = torch.full_like(shared_array, -1)
    for j, i in enumerate(ids):
        dense[shared_array == i] = j
    trace = {"block": cols["block"], "thread": thread, "warp": thread // 32, "lane": thread % 32,
             "space": space, "op": cols["op"], "arg": arg, "offset": offset, "size": cols["size"],
             "line": line_of[pcid], "instr": cols["instr"], "shared_array": dense}
    names: dict = {k: p.name for k, p in enumerate(params)}
    shared = [raw["shared_names"].get(i, "shared memory") for i in ids]
    if shared:
        names[-1] = shared[0] if len(shared) == 1 else " / ".join(shared)
    names["shared"] = shared
    return trace, names


def _verb(op: str, past: bool = False) -> str:
    return {"ld": "read", "st": "wrote" if past else "write", "atom": "updated" if past else "update",
            "red": "updated" if past else "update"}[op]


def _noun(op: str) -> str:
    return {"ld": "load", "st": "store", "atom": "atomic", "red": "atomic"}[op]


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}"


def summarize(sites: list[dict], branches: dict, atomics: dict, grid: tuple, block: tuple,
              predicated=frozenset()) -> list[str]:
    """Plain-English sentences about the wasteful sites, worst first."""
    found: list[tuple[float, str]] = []
    for s in sites:
        where = f"`{s['name']}` (line {s['line']})" if s["line"] else f"`{s['name']}`"
        if not s["requests"]:
            continue
        partial = s["lanes"] < 0.9 * s["possible_lanes"]
        # (an atomic's extra sectors are its lanes' turns on one address: the sentence on
        # contention below says it)
        if s["space"] == "global" and s["op"] in ("ld", "st") and s["sectors"] > s["ideal_sectors"] * 1.2 + 0.5:
            per, ideal = s["sectors"] / s["requests"], s["ideal_sectors"] / s["requests"]
            stride, size = s["stride_bytes"], s["size"]
            if partial:
                why = (f"only {_num(s['lanes'] / s['requests'])} of {_num(s['possible_lanes'] / s['requests'])} "
                       "lanes take part (a branch that splits the warp), so the sectors are partly unused")
            elif stride is not None and abs(stride) > size:
                why = f"neighbouring threads {_verb(s['op'])} addresses {abs(stride)} bytes apart"
            elif stride is not None and stride == size:
                why = ("the warp's addresses are contiguous but do not start at a 32-byte boundary "
                       "(a misaligned start: each request spills into one more sector)")
            else:
                why = "the lanes' addresses are scattered"
            found.append(((s["sectors"] - s["ideal_sectors"]) * SECTOR,
                          f"each warp's {_noun(s['op'])} of {where} touches {_num(per)} sectors where "
                          f"{_num(max(ideal, 1))} would do: {why}"))
        if s["space"] == "shared" and s["bank_conflicts"] > 0:
            per, ideal = s["worst_wavefronts"], max(1, round(s["ideal_wavefronts"] / s["requests"]))
            stride = s["worst_stride"]
            hint = ""
            if stride and stride % 4 == 0 and (stride // 4) % 2 == 0:
                words = abs(stride) // 4
                hint = (f"; pad the row to {words + 1}" if words % 32 == 0 else
                        f"; neighbouring lanes are {words} words apart, so lanes {32 // math.gcd(words, 32)} "
                        "apart share a bank: have neighbouring lanes use neighbouring words")
            what = f"{s['worst_lanes']} lanes hit bank {s['worst_bank']}" if s["worst_bank"] is not None else ""
            found.append((s["bank_conflicts"] * SECTOR,
                          f"the {_noun(s['op'])} {'to' if s['op'] != 'ld' else 'of'} {where} takes {per} wavefronts "
                          f"where {ideal} would do{': ' + what if what else ''}{hint}"))
    # Divergence, where a memory access shows it (its line is exact; a basic block's line is
    # only roughly where it starts): the accesses of a line run with fewer lanes than the warps have.
    by_line: dict = {}
    for s in sites:
        if s["line"] and s["possible_lanes"]:
            b = by_line.setdefault(s["line"], [0, 0, 0])
            b[0] += s["requests"]
            b[1] += s["lanes"]
            b[2] += s["possible_lanes"]
    shown = False
    all_req = sum(b[0] for b in by_line.values())
    for line, (n_req, n_lanes, n_possible) in sorted(by_line.items()):
        if n_lanes < 0.9 * n_possible:
            shown = True
        # (a line that runs rarely, such as one thread per block writing the block's result, is
        # no waste worth a sentence)
        if n_lanes < 0.9 * n_possible and n_req >= 0.05 * all_req:
            how = ("the compiler predicates this short `if`: the warp issues it with every lane and the "
                   "others idle through it" if line in predicated else
                   "a branch sends the threads of one warp different ways (divergence), and the warp runs "
                   "each way in turn")
            found.append(((n_possible - n_lanes) / 32 * SECTOR,
                          f"line {line} runs with {_num(n_lanes / n_req)} of {_num(n_possible / n_req)} lanes per "
                          f"warp on average: {how}; make the condition the same for all 32 threads of "
                          "a warp (e.g. on threadIdx.x / 32) or rearrange the work"))
    all_inst = sum(b[0] for b in branches.values())
    all_lanes, all_possible = sum(b[1] for b in branches.values()), sum(b[2] for b in branches.values())
    if not shown and all_possible and all_lanes < 0.9 * all_possible:
        found.append(((all_possible - all_lanes) / 32 * SECTOR,
                      f"warps run their code with {_num(all_lanes / all_inst)} of {_num(all_possible / all_inst)} "
                      "lanes on average: branches send the threads of a warp different ways (divergence)"))
    nthreads = block[0] * block[1] * block[2]
    if nthreads % 32:
        found.append((0, f"blocks of {nthreads} threads: the last warp of each block has only {nthreads % 32} of 32 "
                         "lanes; a multiple of 32 threads per block keeps every lane busy"))
    nblocks = grid[0] * grid[1] * grid[2]
    if atomics["address"] and atomics["address_count"] >= 32 and atomics["address_count"] > nblocks:
        found.append((atomics["address_count"] * SECTOR,
                      f"{atomics['address_count']} atomic updates of `{atomics['address']}` all go to one address "
                      "and are serialized: combine values within each block first (shared memory or warp "
                      "shuffles), then one atomic per block"))
    found.sort(key=lambda x: -x[0])
    return [s for _, s in found]


# ---------------------------------------------------------------------------------------
# Registers and atomics from NVRTC (when the wheels are there)
# ---------------------------------------------------------------------------------------
_GPU_INFO: dict = {}


def gpu_compile_info(kernel, arch: str = "sm_90") -> dict:
    """ptxas's resources of the kernel (as ``cuda_resources``) and whether its global atomics
    are reductions (see atom_kinds_from_sass), from NVRTC and nvdisasm; kept in memory and on
    disk (.cache/profile-info). {} when NVRTC is missing or rejects the code."""
    import json

    from . import _toolchain as tc
    nv = tc.nvrtc()
    if nv is None:
        return {}
    key = tc.cache_key("profile-info-2", kernel.text, kernel.name, arch, nv.version,
                       tc.headers_digest(kernel.include_dir))
    if key in _GPU_INFO:
        return _GPU_INFO[key]
    path = Path(paths.CACHE_DIR) / "profile-info" / f"{key}.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        info = {}
        try:
            # One compile and one disassembly: -lineinfo changes no instruction and no resource,
            # so the SASS without its line comments is the plain one (tests/test_toolchain.py).
            res, mangled = tc.compile_for_gpu(kernel.text, kernel.name, kernel.filename, kernel.include_dir, arch,
                                              "profile", extra=["-lineinfo"])
            info["resources"] = {**tc.resources(res.log, res.ptx, mangled), "arch": arch}
            try:
                lined = tc.sass(res.cubin, mangled, line_info=True)
                info["sass"] = tc.without_line_comments(lined)
                info["predicated_lines"] = predicated_lines(lined, kernel.filename)
            except Exception:  # no nvdisasm: RED and ATOM cannot be told apart
                pass
            tc.write_atomic(path, json.dumps(info).encode())
        except Exception:  # NVRTC rejects the code (the launch itself says why): no registers
            info = {}
    if "sass" in info:
        info["atom_kinds"] = atom_kinds_from_sass(info["sass"])
    _GPU_INFO[key] = info
    return info


def predicated_lines(sass: str, filename: str) -> list[int]:
    """The lines of the kernel's own file whose machine instructions all run under a guard
    predicate (``@P1``, ``@!P0``): a short ``if`` body that nvcc turned into predicated
    instructions instead of a branch. Every lane that reached the ``if`` executes them (the
    predicate only switches the result off), so Nsight Compute counts the warp's lanes there,
    not the lanes whose condition held. From SASS with line information (``-lineinfo``,
    ``nvdisasm -g``)."""
    base = Path(filename).name
    line, mine = None, False
    guarded: dict[int, bool] = {}
    for text in sass.splitlines():
        m = re.match(r'\s*//## File "([^"]*)", line (\d+)', text)
        if m:
            mine, line = Path(m.group(1)).name == base, int(m.group(2))
            continue
        ins = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
        if not ins or not mine or line is None or ins.group(2) == "NOP":
            continue
        guard = ins.group(1) is not None and not re.match(r"@!?U?PT\b", ins.group(1))
        guarded[line] = guarded.get(line, True) and guard
    return sorted(ln for ln, g in guarded.items() if g)


def atom_kinds_from_sass(sass: str):
    """Whether the kernel's global atomics return the old value (``ATOMG``: ncu's ``op_atom``) or
    not (``REDG``, a reduction: ``op_red``). PTX cannot tell (NVRTC writes ``atom`` for both;
    ptxas turns an unused result into a reduction), the machine code can. {} when the kernel has
    no global atomic, a mapping that gives the one kind for every line when all are alike, None
    when both kinds occur (the machine code has no line numbers here)."""
    kinds = set()
    for ln in sass.splitlines():
        m = re.search(r"\b(REDG|RED|ATOMG|ATOM)\.", ln)
        if m:
            kinds.add("red" if m.group(1).startswith("RED") else "atom")
    if not kinds:
        return {}
    if len(kinds) == 1:
        return _AllKinds(kinds.pop(), aggregated=atomics_aggregated(sass))
    return None


def atomics_aggregated(sass: str) -> bool:
    """Whether nvcc aggregated the kernel's global atomics across the warp. For an integer
    atomic (add, sub, min, max, and, or, xor) to an address that is the same for every thread,
    nvcc counts the active lanes (VOTEU.ANY), combines their operands (POPC of the vote for a
    constant, REDUX for values), and one lane issues the atomic under a predicate: the hardware
    sees one lane per warp, so 1 sector per request (Nsight Compute on an H100: 2048 requests,
    2048 sectors for 2^16 threads' atomicAdd(counter, 1), against 32 sectors per request for a
    float atomicAdd, which is never aggregated)."""
    return bool(re.search(r"\bVOTEU\.ANY\b", sass) and re.search(r"\b(U?POPC|REDUX)\b", sass)
                and re.search(r"@!?P\d\s+(REDG|ATOMG)\.", sass))


class _AllKinds(dict):
    """Every line's global atomics are of one kind."""

    def __init__(self, kind: str, aggregated: bool = False):
        super().__init__()
        self.kind = kind
        self.aggregated = aggregated  # one lane per warp issues them (see atomics_aggregated)

    def get(self, key, default=None):
        return self.kind


# ---------------------------------------------------------------------------------------
# Nsight Compute on a GPU
# ---------------------------------------------------------------------------------------
#: The metrics asked from ncu (the contract's names).
NCU_METRICS = [GLOBAL.format(what=w, op=op) for w in ("requests", "sectors") for op in ("ld", "st", "atom", "red")] + \
    [SHARED_WAVES.format(op=op) for op in ("ld", "st")] + [SHARED_CONFLICTS.format(op=op) for op in ("ld", "st")] + \
    [SHARED_INSTS.format(op=op) for op in ("ld", "st")] + \
    [LANES_RATIO, "launch__registers_per_thread", "launch__shared_mem_per_block_static",
     "launch__shared_mem_per_block_dynamic", "launch__occupancy_limit_blocks", "launch__occupancy_limit_registers",
     "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps", "sm__maximum_warps_per_active_cycle_pct"]


def find_ncu() -> str | None:
    """``ncu`` on PATH, else in $CUDA_HOME/bin (or $CUDA_PATH, /usr/local/cuda*/bin)."""
    found = shutil.which("ncu")
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
             *sorted(str(p) for p in Path("/usr/local").glob("cuda-*"))[::-1]]
    for home in homes:
        if home and Path(home, "bin", "ncu").exists():
            return str(Path(home, "bin", "ncu"))
    return None


_UNIT_SCALE = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def _number(value: str, unit: str):
    v = value.strip().replace(",", "")
    if v in ("", "n/a", "N/A"):
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    m = re.fullmatch(r"([kKMGTmun]?)(byte|sector|request|inst|warp|block|register|thread|wavefront|cycle|B)?",
                     unit or "")
    if m and m.group(2) and m.group(1):
        x *= _UNIT_SCALE[m.group(1)]
    return int(x) if x.is_integer() and "." not in v else x


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu's ``--csv --page raw`` output as one dict per profiled launch ({metric: value}, plus
    "Kernel Name" and the other identifying columns as strings). Lines before the header (the
    program's own output, ``==PROF==`` messages) are skipped; the row after the header holds
    the units."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(ln for ln in lines[start:] if ln.startswith('"')))))
    header, units, data = rows[0], rows[1] if len(rows) > 1 else [], rows[2:]
    if units and units[0].strip().isdigit():  # no units row
        data, units = rows[1:], [""] * len(header)
    out = []
    for row in data:
        rec: dict = {}
        for i, name in enumerate(header):
            if i >= len(row):
                break
            if "__" in name or name.startswith(("launch", "sm", "l1tex", "dram")):
                val = _number(row[i], units[i] if i < len(units) else "")
                if val is not None:
                    rec[name] = val
            else:
                rec[name] = row[i]
        out.append(rec)
    return out


_NCU_SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[2])
import torch
import runtime
spec = torch.load(sys.argv[1], weights_only=False)
k = runtime.cuda_kernel(spec["source"], spec["name"])
args = spec["args"]
k[spec["grid"], spec["block"], spec["shared"]](*args)
torch.cuda.synchronize()
torch.save([a if isinstance(a, torch.Tensor) else None for a in args], sys.argv[1] + ".out")
"""


def run_ncu(kernel, grid, block, shared: int, args, timeout: float = 600) -> dict:
    """Profile one launch under Nsight Compute (in a subprocess, on this GPU): the metrics as
    ncu measured them. The launch's results are copied back into the tensors passed."""
    ncu = find_ncu()
    if ncu is None:
        raise RuntimeError("profiling on a GPU needs Nsight Compute (`ncu`), which is neither on PATH nor in "
                           "$CUDA_HOME/bin; install Nsight Compute, or profile in simulation "
                           "(COURSE_SIMULATE=1)")
    base = kernel.name.split("<")[0].strip()
    with tempfile.TemporaryDirectory(prefix="course-ncu-") as d:
        spec = Path(d, "launch.pt")
        script = Path(d, "launch.py")
        script.write_text(_NCU_SCRIPT)
        source = kernel.filename if kernel.include_dir is not None else kernel.text
        torch.save({"source": source, "name": kernel.name, "grid": grid, "block": block, "shared": shared,
                    "args": list(args)}, spec)
        log = Path(d, "ncu.csv")  # (the CSV apart from the program's own output)
        env = dict(os.environ, COURSE_SIMULATE="0")
        # An older ncu may lack --print-units or a metric: the second try asks for less.
        for units, metrics in ((["--print-units", "base"], NCU_METRICS),
                               ([], [m for m in NCU_METRICS if m != "launch__shared_mem_per_block_dynamic"])):
            cmd = [ncu, "--csv", "--page", "raw", *units, "--metrics", ",".join(metrics),
                   "--kernel-name-base", "function", "--kernel-name", f"regex:^{re.escape(base)}$",
                   "--launch-count", "1", "--log-file", str(log), sys.executable, str(script), str(spec),
                   str(paths.ROOT)]
            log.unlink(missing_ok=True)
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            text = log.read_text() if log.exists() else proc.stdout
            launches = parse_ncu_csv(text)
            if proc.returncode == 0 and launches:
                break
        else:
            tail = "\n".join((text + proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"Nsight Compute could not profile {kernel.name} (exit code {proc.returncode}):\n{tail}")
        out = Path(str(spec) + ".out")
        if out.exists():
            for a, b in zip(args, torch.load(out, weights_only=False)):
                if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                    a.copy_(b.to(a.device))
    m = launches[0]
    return {k: v for k, v in m.items() if k in NCU_METRICS}


def from_ncu(metrics: dict, args, params=None) -> dict:
    """What a GPU's profile holds, from ncu's ``metrics`` for a launch with ``args``: ncu counts
    sectors (``bytes_moved``), not the distinct bytes a kernel needs, so ``bytes_needed`` is an
    upper bound of them, never below what simulation counts for the same launch: what the loads
    moved, at most every byte of the tensors passed (a storage passed twice counted once), plus
    what the stores moved, at most every byte of the tensors the kernel may write (all of them,
    less those whose parameter in ``params`` is a pointer to const). A kernel that fetches whole
    sectors for a few bytes of each therefore still shows its ratio; one that reads the same data
    twice shows it in simulation only. None without a tensor."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    const = [bool(getattr(p, "is_const_pointer", False)) for p in (params or ())]

    def distinct_bytes(ts) -> int:
        spans: dict = {}
        for t in ts:
            if t.numel():
                st = t.untyped_storage()
                key = (st.data_ptr(), t.device)
                spans[key] = max(spans.get(key, 0), st.nbytes())
        return sum(spans.values())

    sectors = [metrics.get(GLOBAL.format(what="sectors", op=op)) for op in ("ld", "st", "atom", "red")]
    moved = SECTOR * sum(sectors) if sectors and all(v is not None for v in sectors) else None
    needed = None
    if tensors:
        writable = [a for i, a in enumerate(args) if isinstance(a, torch.Tensor) and not (i < len(const) and const[i])]
        loads = SECTOR * sum(v or 0 for v in sectors[:1] + sectors[2:])
        stores = SECTOR * sum(v or 0 for v in sectors[1:])
        every, written = distinct_bytes(tensors), distinct_bytes(writable)
        needed = (min(loads, every) + min(stores, written)) if moved is not None else every
    return {"metrics": metrics, "backend": "ncu", "bytes_moved": moved, "bytes_needed": needed}


def cuda_profile(k, grid, block, shared: int, args) -> "Profile":  # noqa: F821  (imported in the body)
    """The `utils.Profile` of one launch of a ``cuda_kernel`` kernel (``k.profile[...]`` calls this)."""
    from ..profile_report import MIN_REGISTERS, Profile, occupancy_of
    data = k._profile_run(grid, block, shared, args)
    info = gpu_compile_info(k) if k.simulated else {}
    metrics = data.pop("metrics")
    res = info.get("resources")
    nthreads = block[0] * block[1] * block[2]
    if res:
        # A launch gets at least 16 registers per thread whatever ptxas needs: Nsight Compute shows
        # 16 on an H100 for a kernel of 10 (benchmarks/results/simulators/ncu-h100.json).
        metrics.setdefault("launch__registers_per_thread", max(MIN_REGISTERS, res["registers"]))
        metrics.setdefault("launch__shared_mem_per_block_static", res["shared_bytes"])
    occ = occupancy_of(nthreads, metrics.get("launch__registers_per_thread"),
                       (metrics.get("launch__shared_mem_per_block_static") or 0) + shared)
    if occ is not None:
        for key, v in (getattr(occ, "limits", None) or {}).items():
            metrics.setdefault(key, v)
        theo = getattr(occ, "theoretical", None)
        if theo is not None and not (isinstance(theo, float) and math.isnan(theo)):
            metrics.setdefault("sm__maximum_warps_per_active_cycle_pct", 100.0 * theo)
    data.pop("branches", None)
    launch = {"grid": tuple(grid), "block": tuple(block), "shared": shared}
    return Profile(k.name, data.pop("backend"), metrics, occupancy=occ, launch=launch, resources=res, **data)
