"""Profiling counters from Numba's CUDA simulator (Triton's interpreter: ``../triton/profile.py``).

    p = utils.profile(numba_kernel, grid, block, *args)      # through utils.profile
    d = profile_numba(kernel, grid, block, *args)            # the dict behind it

It runs the launch once, in simulation, and returns a dict
``{"backend", "kernel", "metrics", "sites", "summary", "trace", "trace_names",
"bytes_needed", "bytes_moved", "atomics"}``.

Numba (``profile_numba``)
-------------------------
The simulator runs each CUDA thread as Python code, one thread at a time. During a
profiled launch every array argument and shared array is wrapped
(``races._Profiled``), so each element access of each thread is recorded with
its source position (line and bytecode offset), the byte offset and the size. The
accesses are then grouped as a GPU groups them: the lanes of a warp (32 consecutive
linear thread ids, x fastest) that execute the same source position for the same time
(the k-th execution of that position by each lane) form one warp-wide instruction, one
*request*. From the requests the counters follow Nsight Compute's definitions:

* global memory: the sectors of a request are the distinct 32-byte aligned sectors its
  active lanes touch (``l1tex__t_sectors_pipe_lsu_mem_global_op_*``). Offsets count from
  the start of the tensor's allocation, which a GPU aligns to 256 bytes, so a view that
  starts one element in is misaligned here as it is there;
* shared memory: the wavefronts of a request are the largest number of distinct 4-byte
  words that fall in one of the 32 banks (lanes reading one word share it); bank conflicts
  are the wavefronts beyond the ideal (1, 2 for 8-byte and 4 for 16-byte elements);
* atomics: a ``cuda.atomic.*`` whose result the kernel ignores is a reduction
  (``op_red``: the GPU compiles it to a RED instruction), one whose result is used an
  ``op_atom``; the most contended element is named with its count;
* divergence (``smsp__thread_inst_executed_per_inst_executed.ratio``): the simulator has
  no machine instructions, so source lines stand in for them. Each thread's lines are
  followed with ``sys.settrace``; the lanes of a warp that run a line for the same time
  are one warp-level instance, and the ratio is the average number of lanes per instance.
  A GPU counts machine instructions (several per line, more on the long lines), so the
  ratio is an approximation, exact when every line runs with the same lanes.

Where it can differ from Nsight Compute: the compiler may merge two reads of one element
(``x[i] * x[i]`` is one load on a GPU, two requests here), widen neighbouring reads into
one vector load, or keep a value in a register across a loop; and divergence is counted
per line, not per machine instruction. What it cannot count: caches (every request goes
to L1 and its sectors are counted, as ncu's l1tex counters do), registers and occupancy
(there is no machine code), timings.

Cost: the accesses are recorded by the wrapped arrays, and the lines by a ``sys.settrace``
function that runs at every Python call and line of the launch, so a profiled launch
takes several times as long as a plain one (a 2^16-thread elementwise launch: about one
second of CPU time on a 2-core machine, against 0.2 s unprofiled). The trace is kept
when a launch makes at most ``TRACE_LIMIT`` accesses.

On a GPU it does not run: the profile of a real launch comes from Nsight Compute.
"""
from __future__ import annotations

import dis
import os
import sys
import time

from ...config import SIMULATE

__all__ = ["profile_numba"]

#: A trace (for pictures) is kept for launches of at most this many accesses.
TRACE_LIMIT = 1 << 18

_OPS = ("ld", "st", "atom", "red")
_OP_NAMES = {"ld": "load", "st": "store", "atom": "atomic", "red": "atomic"}


def _on_gpu_error(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"{what} counts accesses in simulation only (utils.SIMULATE is False: this machine "
        "has a GPU). On a GPU, profile a CUDA C++ kernel with utils.profile(...), which runs "
        "Nsight Compute on the launch, or run Nsight Compute (ncu) on your script.")


def _fmt(x) -> str:
    """A count or average for a sentence: 4, 4.5, 0.25."""
    if abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    return f"{x:.2f}".rstrip("0").rstrip(".") if abs(x) < 10 else f"{x:.1f}"


def _source_line(filename, line) -> str:
    import linecache
    return linecache.getline(filename, line).strip()


# =======================================================================================
# Numba
# =======================================================================================
class _NumbaProfiler:
    """Collects one launch's accesses (called from ``races.py``'s wrapped arrays and
    the scheduler of ``simulator.py``)."""

    def __init__(self, fn):
        self.fn = fn
        self.shared = {}      # allocation site -> key (negative ints: -1, -2, ...)
        # key (argument index, or a negative int for a shared array) -> dict(name, space,
        # itemsize, shape, strides, shift, nbytes)
        self.keys = {}
        self.sites = {}       # (code, lasti, key, op) -> site id
        self.site_info = []   # site id -> (code, line, key, op)
        self.rec = []         # (block, tid, site, byte offset) per element access
        self.block = 0        # the running thread's linear block index and thread id
        self.tid = 0
        # Divergence: the (code, line) each thread runs, in order, by (block, tid).
        self.lines: dict = {}
        self.ev: list = []           # the running thread's list
        self.traced_codes: dict = {}
        skip = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.abspath(os.__file__))]  # the standard library
        for mod in ("numba", "numba.cuda", "numpy"):  # numba.cuda: numba-cuda's own folder
            m = sys.modules.get(mod)
            if m is not None and getattr(m, "__file__", None):
                skip.append(os.path.dirname(os.path.abspath(m.__file__)))
        self.skip = tuple(d + os.sep for d in skip)
        self.tracer = self._make_tracer()

    # -- the launch's arrays ----------------------------------------------------------
    def argument(self, a, name, index):
        """Register argument ``index`` (a NumPy array) and return its key."""
        data = a.__array_interface__["data"][0]
        # The allocation the array lives in: a GPU aligns it to 256 bytes, so the
        # sector and alignment arithmetic counts from there.
        root = a
        while isinstance(getattr(root, "base", None), type(a)):
            root = root.base
        start = root.__array_interface__["data"][0]
        owner = getattr(root, "base", None)
        try:
            import torch
            if isinstance(owner, torch.Tensor):
                start = owner.untyped_storage().data_ptr()
        except ImportError:
            pass
        self.keys[index] = {"name": name, "space": "global", "itemsize": a.itemsize,
                            "shape": a.shape, "strides": a.strides,
                            "shift": (data - start) % 256}
        return index

    def shared_array(self, a, name, site, dynamic):
        """Register the shared array allocated at ``site`` (file, line) and return its key
        (-1, -2, ... in the order of first allocation). All views of the dynamic shared
        memory are one array."""
        where = "dynamic" if dynamic else site
        key = self.shared.get(where)
        if key is None:
            key = self.shared[where] = -1 - len(self.shared)
            self.keys[key] = {"name": name, "space": "shared", "itemsize": a.itemsize,
                              "shape": a.shape, "strides": a.strides, "shift": 0,
                              "nbytes": 0 if dynamic else a.nbytes}
        return key

    # -- the scheduler's calls ----------------------------------------------------------
    def begin_block(self, linear, threads):
        self.block = linear

    def set_thread(self, tid):
        self.tid = tid
        key = (self.block, tid)
        ev = self.lines.get(key)
        if ev is None:
            ev = self.lines[key] = []
        self.ev = ev

    # -- accesses ------------------------------------------------------------------------
    def new_site(self, frame, key, op):
        """The id of a new access site: a source position (code, bytecode offset), the
        array it accesses and the kind of access (op 0 load, 1 store, 2 atomic)."""
        code = frame.f_code
        kind = ("ld", "st", None)[op] or _atomic_kind(code, frame.f_lasti)
        sid = self.sites[(code, frame.f_lasti, key, op)] = len(self.site_info)
        self.site_info.append((code, frame.f_lineno, key, kind))
        return sid

    def access(self, arr, idx, op, frame):
        """One access of kernel code (races.py inlines the 1-D case)."""
        sid = self.sites.get((frame.f_code, frame.f_lasti, arr._key, op))
        if sid is None:
            sid = self.new_site(frame, arr._key, op)
        block, tid, rec = self.block, self.tid, self.rec
        for off in arr.offsets(idx):
            rec.append((block, tid, sid, off))

    # -- divergence: a line tracer ------------------------------------------------------
    def _make_tracer(self):
        """sys.settrace functions (closures: the tracer runs at every call and line of
        the launch, so it keeps its lookups local)."""
        traced, skip, prof = self.traced_codes, self.skip, self

        def line(frame, event, arg):
            if event == "line":  # grouped into warp instances after the launch
                prof.ev.append((frame.f_code, frame.f_lineno))
            return line

        def tracer(frame, event, arg):
            want = traced.get(frame.f_code)
            if want is None:
                # Kernel code and device functions; not the simulator, the course's
                # runtime, NumPy, the standard library or generated code ("<string>").
                f = frame.f_code.co_filename
                want = traced[frame.f_code] = not (f.startswith("<")
                                                   or os.path.abspath(f).startswith(skip))
            return line if want else None

        return tracer


_next_op_cache: dict = {}


def _atomic_kind(code, lasti) -> str:
    """"red" when the kernel discards the atomic's result (the call is followed by
    POP_TOP): the GPU compiles such an atomic to a RED instruction, counted under
    ``op_red``; "atom" otherwise."""
    ins = _next_op_cache.get(code)
    if ins is None:
        ins = _next_op_cache[code] = [(i.offset, i.opname) for i in dis.get_instructions(code)]
    # f_lasti may point into the call's inline cache (3.11+): the next instruction is the
    # first one after it.
    nxt = next((name for off, name in ins if off > lasti), None)
    return "red" if nxt == "POP_TOP" else "atom"


def _to_numba_args(args):
    out = []
    for a in args:
        if type(a).__module__.startswith("torch") and hasattr(a, "data_ptr"):
            from ...interop import to_numba
            a = to_numba(a)
        out.append(a)
    return out


def profile_numba(kernel, griddim, blockdim, *args, shared=0) -> dict:
    """Run a ``numba.cuda.jit`` kernel once in Numba's CUDA simulator and count its
    memory requests, sectors, shared-memory wavefronts and bank conflicts, active lanes
    and atomics (see the module's documentation). torch tensors may be passed directly;
    ``shared`` is the dynamic shared memory in bytes."""
    if not SIMULATE:
        raise _on_gpu_error("profile_numba")
    from . import races as sim_race
    from . import simulator as numba_sim
    if not numba_sim.is_applied():
        raise RuntimeError("profile_numba needs the course's simulator patch "
                           "(import utils before numba)")
    fn = getattr(kernel, "py_func", None) or getattr(kernel, "fn", None)
    if fn is None or not callable(kernel) or not hasattr(kernel, "__getitem__"):
        raise TypeError(f"profile_numba expects a numba.cuda.jit kernel, got "
                        f"{type(kernel).__name__}")
    if getattr(kernel, "_device", False):
        raise TypeError(f"`{fn.__name__}` is a device function (device=True): profile the "
                        "kernel that calls it")
    if sim_race._T.prof is not None:
        raise RuntimeError("profile_numba cannot run inside another profiled launch")
    prof = _NumbaProfiler(fn)
    args = _to_numba_args(args)
    import gc
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of small tuples, none in a cycle (see races.begin_launch)
    sim_race._T.prof = prof
    t0 = time.perf_counter()
    try:
        config = (griddim, blockdim) if not shared else (griddim, blockdim, 0, shared)
        kernel[config](*args)
    finally:
        sim_race._T.prof = None
        if gc_was_on:
            gc.enable()
    run_s = time.perf_counter() - t0
    from numba.cuda.simulator.kernel import normalize_kernel_dimensions
    gdim, bdim = normalize_kernel_dimensions(griddim, blockdim)
    result = _numba_counts(prof, tuple(gdim), tuple(bdim), fn.__name__)
    result["run_seconds"] = run_s
    return result


def _unique_rows(*cols, inverse=False, counts=False):
    """``np.unique(np.stack(cols, 1), axis=0)`` (with the inverse and counts if asked),
    by a lexsort of the columns: several times faster than NumPy's row-wise unique."""
    import numpy as np
    n = len(cols[0])
    order = np.lexsort(cols[::-1])
    new = np.zeros(n, dtype=bool)
    if n:
        new[0] = True
    for c in cols:
        sc = c[order]
        new[1:] |= sc[1:] != sc[:-1]
    starts = np.flatnonzero(new)
    rows = np.stack([c[order[starts]] for c in cols], axis=1)
    out = [rows]
    if inverse:
        inv = np.empty(n, dtype=np.int64)
        inv[order] = np.cumsum(new) - 1
        out.append(inv)
    if counts:
        out.append(np.diff(np.append(starts, n)))
    return out[0] if len(out) == 1 else tuple(out)


def _occurrence(blk, tid, key):
    """For each event (in execution order per thread): how many events of the same thread
    with the same key came before it."""
    import numpy as np
    n = len(key)
    order = np.lexsort((np.arange(n), key, tid, blk))  # stable: execution order last
    new = np.ones(n, dtype=bool)
    sb, st, sk = blk[order], tid[order], key[order]
    new[1:] = (sb[1:] != sb[:-1]) | (st[1:] != st[:-1]) | (sk[1:] != sk[:-1])
    starts = np.flatnonzero(new)
    occ = np.empty(n, dtype=np.int64)
    occ[order] = np.arange(n) - starts[np.cumsum(new) - 1]
    return occ


def _numba_counts(prof: _NumbaProfiler, gdim, bdim, name) -> dict:
    import numpy as np
    threads = bdim[0] * bdim[1] * bdim[2]
    nblocks = gdim[0] * gdim[1] * gdim[2]
    metrics = {"launch__block_size": threads, "launch__grid_size": nblocks}
    static = sum(k["nbytes"] for k in prof.keys.values() if k["space"] == "shared")
    metrics["launch__shared_mem_per_block_static"] = static

    # ---- divergence --------------------------------------------------------------------
    div_sites = []
    if any(prof.lines.values()):
        # Lanes of a warp are matched by (line, how many times the lane ran it before):
        # each match is one warp-level instance of the line.
        ids: dict = {}
        e_line, e_blk, e_tid = [], [], []
        for (b, t), ev in prof.lines.items():
            e_line.extend([ids.setdefault(k, len(ids)) for k in ev])
            e_blk.extend([b] * len(ev))
            e_tid.extend([t] * len(ev))
        e_line, e_blk, e_tid = (np.array(v, dtype=np.int64) for v in (e_line, e_blk, e_tid))
        occ = _occurrence(e_blk, e_tid, e_line)
        inst, lanes = _unique_rows(e_blk, e_tid >> 5, e_line, occ, counts=True)
        metrics["smsp__thread_inst_executed_per_inst_executed.ratio"] = \
            float(lanes.sum() / len(lanes))
        present = np.minimum(32, threads - 32 * inst[:, 1])
        keys = list(ids)
        n_inst = np.bincount(inst[:, 2], minlength=len(keys))
        n_lanes = np.bincount(inst[:, 2], weights=lanes, minlength=len(keys))
        n_present = np.bincount(inst[:, 2], weights=present, minlength=len(keys))
        for j, (code, line) in enumerate(keys):
            div_sites.append({"line": line, "function": code.co_name, "file": code.co_filename,
                              "instances": int(n_inst[j]),
                              "avg_lanes": float(n_lanes[j] / n_inst[j]),
                              "lane_fraction": float(n_lanes[j] / n_present[j])})

    # ---- memory ---------------------------------------------------------------------------
    n = len(prof.rec)
    sites = []
    atomics = {"count": 0, "address": None, "address_count": 0}
    bytes_needed = bytes_moved = 0
    trace = None
    for op in _OPS:
        metrics[f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum"] = 0
        metrics[f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum"] = 0
    for op in ("ld", "st"):
        metrics[f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum"] = 0
        metrics[f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum"] = 0
        metrics[f"sm__sass_inst_executed_op_shared_{op}.sum"] = 0
    if n:
        R = np.array(prof.rec, dtype=np.int64)
        blk, tid, sid, off = R[:, 0], R[:, 1], R[:, 2], R[:, 3]
        info = prof.site_info
        nsites = len(info)
        s_key = np.array([i[2] for i in info], dtype=np.int64)
        s_op = np.array([_OPS.index(i[3]) for i in info], dtype=np.int64)
        s_line = np.array([i[1] for i in info], dtype=np.int64)
        s_size = np.array([prof.keys[i[2]]["itemsize"] for i in info], dtype=np.int64)
        s_shift = np.array([prof.keys[i[2]]["shift"] for i in info], dtype=np.int64)
        s_global = np.array([prof.keys[i[2]]["space"] == "global" for i in info])

        # Lanes are matched by (site, how many times this lane has executed it before).
        occ = _occurrence(blk, tid, sid)
        warp = tid >> 5
        ukeys, inst = _unique_rows(blk, warp, sid, occ, inverse=True)
        ninst = len(ukeys)
        i_site = ukeys[:, 2]
        i_lanes = np.bincount(inst, minlength=ninst)  # one access per lane per instance
        size = s_size[sid]
        rglobal = s_global[sid]

        i_sectors = np.zeros(ninst, dtype=np.int64)
        i_ideal = np.zeros(ninst, dtype=np.int64)
        i_wave = np.zeros(ninst, dtype=np.int64)
        i_ideal_wave = np.zeros(ninst, dtype=np.int64)
        # Global: distinct 32-byte sectors per request (an element can straddle two).
        g = np.flatnonzero(rglobal)
        if g.size:
            a = off[g] + s_shift[sid[g]]
            first, last = a // 32, (a + size[g] - 1) // 32
            two = first != last
            gi = np.concatenate([inst[g], inst[g][two]])
            sec = np.concatenate([first, last[two]])
            pairs = _unique_rows(gi, sec)
            i_sectors += np.bincount(pairs[:, 0], minlength=ninst)
            elems = _unique_rows(inst[g], off[g])
            distinct = np.bincount(elems[:, 0], minlength=ninst)
            i_ideal += -(-distinct * s_size[i_site] // 32) * s_global[i_site]
            # bytes the kernel needed: each distinct global element read once, and each one
            # written once (an in-place update comes in and goes out).
            keyed = _unique_rows(s_key[sid[g]], off[g], size[g], np.minimum(s_op[sid[g]], 1))
            bytes_needed = int(keyed[:, 2].sum())
        # Shared: words per bank per request.
        sh = np.flatnonzero(~rglobal)
        if sh.size:
            words_per = np.maximum(1, size[sh] // 4)
            reps = words_per.max()
            wi, ww = [], []
            for w in range(reps):
                m = words_per > w
                wi.append(inst[sh][m])
                ww.append(off[sh][m] // 4 + w)
            words = _unique_rows(np.concatenate(wi), np.concatenate(ww))
            # distinct words per (request, bank): the request's wavefronts are the most
            # any bank holds
            per_bank_keys, per_bank = _unique_rows(words[:, 0], words[:, 1] % 32, counts=True)
            np.maximum.at(i_wave, per_bank_keys[:, 0], per_bank)
            i_ideal_wave = np.where(~s_global[i_site], np.maximum(1, s_size[i_site] // 4), 0)
        i_conf = np.maximum(0, i_wave - i_ideal_wave)

        # Per site.
        def per_site(v):
            return np.bincount(i_site, weights=v, minlength=nsites)
        req = np.bincount(i_site, minlength=nsites)
        sec_s, ideal_s = per_site(i_sectors), per_site(i_ideal)
        wave_s, conf_s, lanes_s = per_site(i_wave), per_site(i_conf), per_site(i_lanes)
        ideal_wave_s = per_site(i_ideal_wave)
        # The first request of each site (lowest block, warp, occurrence): its stride.
        first_inst = np.full(nsites, -1, dtype=np.int64)
        o = np.lexsort((ukeys[:, 3], ukeys[:, 1], ukeys[:, 0], i_site))
        firsts = o[np.r_[True, i_site[o][1:] != i_site[o][:-1]]]
        first_inst[i_site[firsts]] = firsts
        in_first = first_inst[i_site[inst]] == inst
        fr = np.flatnonzero(in_first)
        for s in range(nsites):
            code, line, key, opname = info[s]
            k = prof.keys[key]
            sel = fr[sid[fr] == s]
            lane = tid[sel] & 31
            o = np.argsort(lane, kind="stable")
            lane, offs = lane[o], off[sel][o]
            stride = int(offs[1] - offs[0]) if len(lane) > 1 else None
            site = {"line": int(line), "name": k["name"], "space": k["space"],
                    "op": "atom" if opname in ("atom", "red") else opname,
                    "requests": int(req[s]), "avg_lanes": float(lanes_s[s] / max(1, req[s])),
                    "stride_bytes": stride, "file": code.co_filename,
                    "first_offset": int(offs.min() + k["shift"]) if len(offs) else 0,
                    "itemsize": k["itemsize"]}
            if k["space"] == "global":
                # (a global access has no banks: wavefronts and conflicts are truly 0)
                site.update(sectors=int(sec_s[s]), ideal_sectors=int(ideal_s[s]),
                            wavefronts=0, ideal_wavefronts=0, bank_conflicts=0)
                metrics[f"l1tex__t_requests_pipe_lsu_mem_global_op_{opname}.sum"] += int(req[s])
                metrics[f"l1tex__t_sectors_pipe_lsu_mem_global_op_{opname}.sum"] += int(sec_s[s])
            else:
                site.update(sectors=0, ideal_sectors=0, wavefronts=int(wave_s[s]),
                            ideal_wavefronts=int(ideal_wave_s[s]), bank_conflicts=int(conf_s[s]))
                if opname in ("ld", "st"):
                    metrics[f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{opname}.sum"] += \
                        int(wave_s[s])
                    metrics[f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{opname}.sum"] \
                        += int(conf_s[s])
                    metrics[f"sm__sass_inst_executed_op_shared_{opname}.sum"] += int(req[s])
                if wave_s[s] > ideal_wave_s[s]:  # the worst request, for the sentence
                    site.update(_worst_request(s, i_site, i_wave, inst, tid, off))
            sites.append(site)
        bytes_moved = 32 * int(sec_s.sum())

        # Atomics: how many, and the element most of them hit.
        at = np.flatnonzero(s_op[sid] >= 2)
        if at.size:
            pairs, counts = _unique_rows(s_key[sid[at]], off[at], counts=True)
            j = int(np.argmax(counts))
            key, o = int(pairs[j, 0]), int(pairs[j, 1])
            atomics = {"count": int(at.size), "address": _element_name(prof.keys[key], o),
                       "address_count": int(counts[j]),
                       "line": int(s_line[sid[at][np.flatnonzero(
                           (s_key[sid[at]] == key) & (off[at] == o))[0]]])}

        if n <= TRACE_LIMIT:
            import torch
            trace = {"block": blk, "thread": tid, "warp": warp, "lane": tid & 31,
                     "space": (~rglobal).astype(np.int64),
                     "op": np.minimum(s_op[sid], 2), "arg": np.where(rglobal, s_key[sid], -1),
                     "offset": off, "size": size, "line": s_line[sid], "instr": inst,
                     # which shared array (0, 1, ... in trace_names["shared"]); -1: global
                     "shared_array": np.where(rglobal, -1, -1 - s_key[sid])}
            trace = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64))
                     for k, v in trace.items()}

    trace_names = {k: v["name"] for k, v in prof.keys.items() if v["space"] == "global"}
    shared_names = [prof.keys[k]["name"] for k in sorted(prof.keys, reverse=True) if k < 0]
    if shared_names:
        trace_names[-1] = ", ".join(shared_names)
        trace_names["shared"] = shared_names

    sites.sort(key=lambda s: (s["line"], s["space"], s["op"]))
    summary = _numba_summary(sites, div_sites, atomics, nblocks)
    if bytes_needed and bytes_moved > 1.1 * bytes_needed and not atomics["count"]:
        summary.append(f"the launch moves {_fmt(bytes_moved / bytes_needed)}x the bytes it needs "
                       f"({bytes_moved} bytes in 32-byte sectors for {bytes_needed} bytes "
                       "read or written)")
    for s in sites:
        s.pop("file", None)
    return {"backend": "numba-simulator", "kernel": name, "metrics": metrics,
            "sites": sites, "summary": summary, "trace": trace, "trace_names": trace_names,
            "bytes_needed": bytes_needed, "bytes_moved": bytes_moved, "atomics": atomics,
            "divergence": sorted(({k: v for k, v in d.items() if k != "file"}
                                  for d in div_sites), key=lambda d: d["line"])}


def _worst_request(s, i_site, i_wave, inst, tid, off) -> dict:
    """The bank conflict of site ``s``'s request with the most wavefronts: the bank most
    lanes hit, how many different words of it they hit, and the distance between
    neighbouring active lanes' addresses."""
    import numpy as np
    mine = np.flatnonzero(i_site == s)
    worst = mine[np.argmax(i_wave[mine])]
    sel = np.flatnonzero(inst == worst)
    o = np.argsort(tid[sel] & 31, kind="stable")
    offs = off[sel][o]
    words = np.unique(offs // 4)
    banks, cnt = np.unique(words % 32, return_counts=True)
    return {"worst_bank": int(banks[np.argmax(cnt)]), "worst_bank_words": int(cnt.max()),
            "worst_stride_bytes": int(offs[1] - offs[0]) if len(offs) > 1 else None}


def _element_name(k, off) -> str:
    """``x[5]`` or ``tile[3, 7]``: the element at byte offset ``off`` of an array."""
    idx, rest = [], off
    for s in k["strides"]:
        q, rest = divmod(rest, s) if s else (0, rest)
        idx.append(q)
    return f"{k['name']}[{', '.join(str(int(i)) for i in idx)}]"


def _numba_summary(sites, div_sites, atomics, nblocks) -> list:
    """Plain-English sentences, the costliest first (by the bytes or the lane-slots it
    wastes)."""
    items = []  # (waste, sentence)
    for s in sites:
        what = f"{_OP_NAMES[s['op']]} of `{s['name']}` (line {s['line']})"
        req = max(1, s["requests"])
        if s["space"] == "global":
            per, ideal = s["sectors"] / req, s["ideal_sectors"] / req
            if s["sectors"] <= s["ideal_sectors"]:
                continue
            why = ""
            stride, size = s["stride_bytes"], s["itemsize"]
            if s["avg_lanes"] < 31.5 and s["requests"] > 0 and stride is not None:
                why = (f": only {_fmt(s['avg_lanes'])} lanes of a warp take part on average "
                       f"(the others took another branch or finished), {abs(stride)} bytes "
                       "apart")
            elif stride is not None and abs(stride) > size:
                verb = {"ld": "read", "st": "write"}.get(s["op"], "update")
                why = f": neighbouring threads {verb} addresses {abs(stride)} bytes apart"
            elif stride == size and s["first_offset"] % 32:
                why = (f": the warp's bytes start {s['first_offset'] % 32} bytes past a "
                       "32-byte sector boundary, so one more sector is touched")
            items.append(((s["sectors"] - s["ideal_sectors"]) * 32,
                          f"each warp's {what} touches {_fmt(per)} sectors where "
                          f"{_fmt(ideal)} would do{why}"))
        elif s["op"] in ("ld", "st") and s["bank_conflicts"] > 0:
            per, ideal = s["wavefronts"] / req, s["ideal_wavefronts"] / req
            why = ""
            if s.get("worst_bank_words", 0) > 1:
                stride = s["worst_stride_bytes"]
                worst = "" if s["requests"] == 1 else "in the worst request, "
                why = (f": {worst}{s['worst_bank_words']} lanes hit different words of bank "
                       f"{s['worst_bank']}")
                if stride:
                    why += f" (neighbouring lanes' addresses are {abs(stride)} bytes apart)"
                if stride and stride % 128 == 0:
                    why += f"; pad the row to {stride // s['itemsize'] + 1} elements"
            items.append((s["bank_conflicts"] * 32,
                          f"the {what} takes {_fmt(per)} wavefronts where {_fmt(ideal)} "
                          f"would do{why}"))
    # Lines where the lanes of a warp idle, if they idle in at least 5% of all the lane
    # slots of the launch (one thread per block finishing the work is not worth a line).
    slots = 32 * sum(d["instances"] for d in div_sites)
    for d in div_sites:
        idle = d["instances"] * 32 * (1 - d["lane_fraction"])
        if d["lane_fraction"] < 0.9 and idle >= 0.05 * slots:
            text = _source_line(d["file"], d["line"])
            lanes = _fmt(d["avg_lanes"])
            items.append((idle, f"line {d['line']} (`{text}`) runs with {lanes} active "
                                f"{'lane' if lanes == '1' else 'lanes'} per warp on average: "
                                "the other lanes of the warp took another branch or "
                                "finished, and wait"))
    # One atomic per block to one address is the usual way to combine blocks: worth a
    # sentence only when the blocks' threads contend more than that.
    if atomics["address_count"] > max(1, nblocks):
        items.append((atomics["address_count"] * 32,
                      f"{atomics['address_count']} of the {atomics['count']} atomic updates go "
                      f"to `{atomics['address']}` (line {atomics['line']}): a GPU serialises "
                      "updates of one address"))
    items.sort(key=lambda t: -t[0])
    out = [t for _, t in items]
    if not out:
        out.append("every warp access is coalesced and conflict-free, and no lane idles"
                   if sites else "the launch made no access to global or shared memory")
    return out
