"""Profiling counters from Triton's interpreter.

    p = utils.profile(triton_kernel, grid, *args, **meta)    # through utils.profile
    d = profile_triton(kernel, grid, *args, **kwargs)        # the dict behind it

It runs the launch once, in simulation, and returns a dict
``{"backend", "kernel", "metrics", "sites", "summary", "trace", "trace_names",
"bytes_needed", "bytes_moved", "atomics"}`` plus ``per_program``.

The interpreter runs each program (one instance of the kernel over a whole block of
elements) with NumPy. Every ``tl.load``, ``tl.store`` and ``tl.atomic_*`` is recorded
with its pointers and mask. The interpreter does not know how a compiled kernel spreads a
block over warps and registers, so there are no per-warp counters, and none of the keys
are Nsight Compute metric names: ``bytes_loaded`` (bytes of the unmasked lanes of every
load) is not ``dram__bytes_read.sum`` (which a cache or a repeated load changes), and the
sectors are counted per program access, not per warp request. The keys:

* ``programs``: the number of programs of the launch (the grid's size);
* ``bytes_loaded``, ``bytes_stored``: bytes of the lanes that are not masked off;
* ``bytes_loaded_per_program``, ``bytes_stored_per_program``: their averages;
* ``masked_lane_fraction_ld``, ``masked_lane_fraction_st``: the fraction of the lanes
  of all loads (stores) that their mask turns off;
* ``sectors_ld``, ``sectors_st``: distinct 32-byte sectors each load (store) of each
  program touches, summed (``bytes_moved`` is their total times 32).

``per_program`` holds the bytes and masked fractions of each program (torch tensors
indexed by the linear program id, x fastest), and ``sites`` one record per source line
of a load, store or atomic (``requests`` there counts the line's executions by programs).

On a GPU it does not run: the profile of a real launch comes from Nsight Compute.
"""
from __future__ import annotations

import inspect
import time

from ...config import SIMULATE
from ..numba.profile import _fmt, _on_gpu_error

__all__ = ["profile_triton"]


class _TritonProfiler:
    """Collects one interpreted launch's loads, stores and atomics (called from the
    patched builder of ``interpreter.py``)."""

    def __init__(self, fn, tensors):
        self.fn = fn
        self.tensors = tensors   # [(name, first address, itemsize, numel, shape)]
        self.sites = {}          # (file, line, kind) -> site id
        self.site_info = []      # (file, line, kind)
        # per access: (program, site, lanes, active lanes, itemsize, sectors, tensor index)
        self.rec = []
        self.elements = []       # (tensor index, element addresses) of each access
        self.atomic_addrs = []
        self.programs = 0        # the launch's grid size, seen at the first access

    def access(self, builder, ptrs, mask, kind):
        import numpy as np

        from .interpreter import _program, _site
        if not self.programs:
            gx, gy, gz = builder.grid_dim
            self.programs = gx * gy * gz
        site = _site()
        key = (site[0], site[1], kind)
        sid = self.sites.get(key)
        if sid is None:
            sid = self.sites[key] = len(self.site_info)
            self.site_info.append(key)
        addrs = np.asarray(ptrs.data).astype(np.int64, copy=False).ravel()
        lanes = addrs.size
        first = int(addrs[0]) if lanes else 0
        if mask is not None:
            m = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).ravel()
            addrs = addrs[m]
        itemsize = int(ptrs.get_element_ty().primitive_bitwidth) // 8 or 1
        active = addrs.size
        sectors = int(np.unique(addrs // 32).size) if active else 0
        # The tensor the pointers point into (by the first active lane, else the first).
        tensor = self._tensor(int(addrs[0]) if active else first)
        self.rec.append((_program(builder), sid, lanes, active, itemsize, sectors, tensor))
        if active:
            # stores and atomics are keyed apart from loads (an in-place update needs both)
            self.elements.append((addrs * 2 + (kind != "load"), itemsize))
            if kind == "atomic":
                self.atomic_addrs.append(addrs)

    def _tensor(self, addr):
        for i, (_, start, itemsize, numel, _) in enumerate(self.tensors):
            if start <= addr < start + itemsize * numel:
                return i
        return -1


def profile_triton(kernel, grid, *args, **kwargs) -> dict:
    """Run a ``triton.jit`` kernel once in Triton's interpreter and count, per program and
    in total, the bytes loaded and stored, the masked-off lanes and the sectors touched
    (see the module's documentation). ``grid`` is a tuple or a callable of the meta-
    parameters, as in ``kernel[grid](...)``."""
    if not SIMULATE:
        raise _on_gpu_error("profile_triton")
    from . import interpreter as triton_sim
    if not triton_sim.is_applied():
        raise RuntimeError("profile_triton needs Triton's interpreter (TRITON_INTERPRET=1, "
                           "set by import utils before import triton)")
    from triton.runtime.jit import KernelInterface
    # Through @triton.autotune, @triton.heuristics and utils.autotune to the Python function.
    fn, jitted = kernel, False
    while hasattr(fn, "fn") and hasattr(fn, "__getitem__") and not inspect.isfunction(fn):
        jitted = jitted or isinstance(fn, KernelInterface)
        fn = fn.fn
    if not jitted or not inspect.isfunction(fn):
        raise TypeError(f"profile_triton expects a triton.jit kernel, got "
                        f"{type(kernel).__name__}")
    if triton_sim.profiler[0] is not None:
        raise RuntimeError("profile_triton cannot run inside another profiled launch")
    tensors, _ = triton_sim._tensor_args(fn, args, kwargs)
    prof = _TritonProfiler(fn, tensors)
    triton_sim.profiler[0] = prof
    t0 = time.perf_counter()
    try:
        kernel[grid](*args, **kwargs)
    finally:
        triton_sim.profiler[0] = None
    result = _triton_counts(prof, fn.__name__)
    result["run_seconds"] = time.perf_counter() - t0
    return result


def _ratio_words(a, b) -> str:
    """4 and 1 -> "4 bytes per byte"; 8 and 4 -> "2 bytes per byte"."""
    return f"{_fmt(a / b)} {'byte' if a == b else 'bytes'} per byte"


def _triton_counts(prof: _TritonProfiler, name) -> dict:
    import numpy as np
    rec = np.array(prof.rec, dtype=np.int64).reshape(-1, 7)
    prog, sid, lanes, active, isz, sectors, tens = rec.T
    kinds = [k for _, _, k in prof.site_info]
    s_kind = np.array([["load", "store", "atomic"].index(k) for k in kinds], dtype=np.int64)
    kind = s_kind[sid] if len(rec) else np.zeros(0, np.int64)
    programs = prof.programs
    nbytes = active * isz

    def total(sel, v):
        return int(v[sel].sum())

    ld, st, atm = kind == 0, kind == 1, kind == 2
    metrics = {
        "programs": programs,
        "bytes_loaded": total(ld, nbytes),
        "bytes_stored": total(st, nbytes),
        "bytes_atomic": total(atm, nbytes),
        "sectors_ld": total(ld, sectors),
        "sectors_st": total(st, sectors),
    }
    for key, sel in (("ld", ld), ("st", st)):
        n = total(sel, lanes)
        if n:
            metrics[f"masked_lane_fraction_{key}"] = 1.0 - total(sel, active) / n
    if programs:
        metrics["bytes_loaded_per_program"] = metrics["bytes_loaded"] / programs
        metrics["bytes_stored_per_program"] = metrics["bytes_stored"] / programs
    per_program = {
        "bytes_loaded": np.bincount(prog[ld], weights=nbytes[ld], minlength=programs),
        "bytes_stored": np.bincount(prog[st], weights=nbytes[st], minlength=programs),
    }
    lanes_ld = np.bincount(prog[ld], weights=lanes[ld], minlength=programs)
    act_ld = np.bincount(prog[ld], weights=active[ld], minlength=programs)
    lanes_st = np.bincount(prog[st], weights=lanes[st], minlength=programs)
    act_st = np.bincount(prog[st], weights=active[st], minlength=programs)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_program["masked_lane_fraction_ld"] = np.where(lanes_ld > 0, 1 - act_ld / lanes_ld, 0)
        per_program["masked_lane_fraction_st"] = np.where(lanes_st > 0, 1 - act_st / lanes_st, 0)
    import torch
    per_program = {k: torch.from_numpy(np.asarray(v, dtype=np.float64))
                   for k, v in per_program.items()}

    # Sites, one per tl.load / tl.store / tl.atomic_* line.
    sites, summary_items = [], []
    names = [t[0] for t in prof.tensors]
    for s, (filename, line, k) in enumerate(prof.site_info):
        sel = sid == s
        n_lanes, n_act = int(lanes[sel].sum()), int(active[sel].sum())
        t = tens[sel][tens[sel] >= 0]
        arg = names[int(t[0])] if len(t) else None  # None: no tensor argument's memory
        of = f" of `{arg}`" if arg else ""
        size = int(isz[sel][0])
        ideal = int((-(-active[sel] * isz[sel] // 32)).sum())
        # "requests" here are executions of the line by a program (a whole block of
        # lanes), not warp requests.
        site = {"line": int(line), "name": arg, "space": "global",
                "op": {"load": "ld", "store": "st", "atomic": "atom"}[k],
                "requests": int(sel.sum()), "lanes": n_lanes, "active_lanes": n_act,
                "avg_lanes": n_act / max(1, int(sel.sum())),
                "masked_fraction": 1 - n_act / n_lanes if n_lanes else 0.0,
                "bytes": n_act * size, "sectors": int(sectors[sel].sum()),
                "ideal_sectors": ideal, "wavefronts": 0, "bank_conflicts": 0,
                "stride_bytes": None}
        sites.append(site)
        if site["masked_fraction"] > 0:
            per = lanes[sel]
            act = active[sel]
            partial = np.flatnonzero(act < per)
            if len(partial) == 1:
                j = partial[0]
                p = int(prog[sel][j])
                who = ("the last program" if p == programs - 1 else f"program {p}")
                detail = f"{who} covers {int(act[j])} of its {int(per[j])} elements"
            elif len(partial) == int(sel.sum()) and len(set(zip(act, per))) == 1:
                detail = (f"each of the {len(partial)} programs uses {int(act[0])} of its "
                          f"{int(per[0])} lanes")
            else:
                detail = (f"{len(partial)} of its {int(sel.sum())} executions run with lanes "
                          "masked off")
            summary_items.append((n_lanes - n_act, f"{_fmt(100 * site['masked_fraction'])}% "
                                  f"of the lanes of the {k}{of} on line {line} are "
                                  f"masked off: {detail}"))
        if site["sectors"] > ideal > 0:
            summary_items.append(((site["sectors"] - ideal) * 32,
                                  f"the {k}{of} on line {line} touches "
                                  f"{site['sectors']} sectors where {ideal} would do: its "
                                  "addresses are not contiguous"))
    summary_items.sort(key=lambda t: -t[0])
    summary = [t for _, t in summary_items]
    if metrics["bytes_stored"] and metrics["bytes_loaded"]:
        ratio = _ratio_words(metrics["bytes_loaded"], metrics["bytes_stored"])
        summary.append(f"each program loads {ratio} it stores "
                       f"({_fmt(metrics['bytes_loaded_per_program'])} bytes loaded, "
                       f"{_fmt(metrics['bytes_stored_per_program'])} stored per program)")
    if not prof.rec:
        summary.append("the launch loaded and stored nothing")

    # Bytes needed: each distinct element read once, and each one written once. Atomics: the
    # most contended element.
    bytes_needed = 0
    if prof.elements:
        allk = np.concatenate([a for a, _ in prof.elements])
        itemsizes = np.concatenate([np.full(a.size, n, np.int64) for a, n in prof.elements])
        _, first = np.unique(allk, return_index=True)
        bytes_needed = int(itemsizes[first].sum())
    atomics = {"count": 0, "address": None, "address_count": 0}
    if prof.atomic_addrs:
        a = np.concatenate(prof.atomic_addrs)
        u, c = np.unique(a, return_counts=True)
        j = int(np.argmax(c))
        from .interpreter import _element, _Launch
        atomics = {"count": int(a.size), "address": _element(_Launch(name, prof.tensors, []),
                                                              int(u[j])),
                   "address_count": int(c[j])}
        if c[j] > max(1, programs):  # more than one update per program
            summary.append(f"{int(c[j])} of the {int(a.size)} atomic updates go to "
                           f"`{atomics['address']}`: a GPU serialises updates of one address")
    return {"backend": "triton-interpreter", "kernel": name, "metrics": metrics,
            "sites": sorted(sites, key=lambda s: (s["line"], s["op"])), "summary": summary,
            "trace": None, "per_program": per_program, "bytes_needed": bytes_needed,
            "bytes_moved": 32 * (metrics["sectors_ld"] + metrics["sectors_st"]
                                 + total(atm, sectors)),
            "atomics": atomics}

