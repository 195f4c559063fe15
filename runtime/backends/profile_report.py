"""`Profile`: what one profiled launch did, the same object for every backend.

Each backend's ``profile()`` (``runtime/backends/<backend>/``) returns one; ``utils.profile``
picks the backend. The metrics are keyed by Nsight Compute's names, so simulation and a GPU
compare directly.
"""
from __future__ import annotations

import html

__all__ = ["Profile", "MIN_REGISTERS", "occupancy_of", "from_counts"]

_GLOBAL = "l1tex__t_{what}_pipe_lsu_mem_global_op_{op}.sum"
_LANES = "smsp__thread_inst_executed_per_inst_executed.ratio"
MIN_REGISTERS = 16


class Profile:
    """What one launch did, as counters (``metrics``, keyed by Nsight Compute's metric names),
    per source site (``sites``), in words (``summary``, worst first) and, for small launches
    in simulation, access by access (``trace``)."""

    def __init__(self, kernel: str, backend: str, metrics: dict, sites=None, summary=None, trace=None,
                 trace_names=None, bytes_needed=None, bytes_moved=None, atomics=None, occupancy=None,
                 launch=None, resources=None, **extra):
        self.kernel = kernel
        self.backend = backend
        self.metrics = dict(metrics)
        self.sites = list(sites or [])
        self.summary = list(summary or [])
        self.trace = trace
        self.trace_names = trace_names
        self.bytes_needed = bytes_needed
        self.bytes_moved = bytes_moved
        self.atomics = atomics
        self.occupancy = occupancy
        self.launch = launch or {}
        self.resources = resources
        self.extra = extra  # what else a backend reports (Triton: per_program), also as attributes

    def __getattr__(self, name):
        extra = self.__dict__.get("extra") or {}
        if name in extra:
            return extra[name]
        raise AttributeError(f"'Profile' object has no attribute {name!r}")

    # -- the table ------------------------------------------------------------------
    def _rows(self) -> list[tuple[str, str]]:
        m = self.metrics
        rows = []

        def num(x):
            if x is None:
                return "-"
            if isinstance(x, float) and not x.is_integer():
                return f"{x:,.2f}"
            return f"{int(x):,}"

        for op, what in (("ld", "global loads"), ("st", "global stores")):
            req, sec = m.get(_GLOBAL.format(what="requests", op=op)), m.get(_GLOBAL.format(what="sectors", op=op))
            if not req:
                continue
            per = f" ({sec / req:.1f} per request)" if req and sec is not None else ""
            rows.append((what, f"{num(req)} requests, {num(sec)} sectors{per}"))
        atom = [m.get(_GLOBAL.format(what="requests", op=op)) for op in ("atom", "red")]
        if any(a for a in atom if a):
            rows.append(("global atomics", f"{num(sum(a or 0 for a in atom))} requests"))
        for op, what in (("ld", "shared loads"), ("st", "shared stores")):
            req = m.get(f"sm__sass_inst_executed_op_shared_{op}.sum")
            waves = m.get(f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum")
            conf = m.get(f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum")
            if not req and not waves:
                continue
            rows.append((what, f"{num(req)} requests, {num(waves)} wavefronts, {num(conf)} bank conflicts"))
        if _LANES in m:
            rows.append(("active lanes per warp instruction", f"{m[_LANES]:.1f} of 32"))
        if self.bytes_moved is not None and self.bytes_needed is not None:
            ratio = f" ({self.bytes_moved / self.bytes_needed:.2f}x)" if self.bytes_needed else ""
            rows.append(("global bytes moved / needed", f"{num(self.bytes_moved)} / {num(self.bytes_needed)}{ratio}"))
        if self.atomics and self.atomics.get("count"):
            a = self.atomics
            hot = f"; most contended: {a['address']} ({a['address_count']:,} updates)" if a.get("address") else ""
            rows.append(("atomics", f"{a['count']:,}{hot}"))
        if "launch__registers_per_thread" in m:
            rows.append(("registers per thread", num(m["launch__registers_per_thread"])))
        if "sm__maximum_warps_per_active_cycle_pct" in m:
            lim = getattr(self.occupancy, "limiter", None)
            rows.append(("theoretical occupancy", f"{m['sm__maximum_warps_per_active_cycle_pct']:.0f}%"
                         + (f" (limited by {lim})" if lim else "")))
        return rows

    def _title(self) -> str:
        how = {"cuda-emulator": "counted in the CPU emulator", "numba-simulator": "counted in Numba's simulator",
               "triton-interpreter": "counted in Triton's interpreter", "ncu": "measured by Nsight Compute"}
        return f"profile of {self.kernel} ({how.get(self.backend, self.backend)})"

    def __repr__(self):
        rows = self._rows()
        w = max((len(k) for k, _ in rows), default=0)
        out = [self._title()] + [f"  {k.ljust(w)}  {v}" for k, v in rows]
        out += [f"  * {s}" for s in self.summary]
        return "\n".join(out)

    def _repr_html_(self):
        e = html.escape
        rows = "".join(f"<tr><td style='text-align:left'>{e(k)}</td><td style='text-align:left'>{e(v)}</td></tr>"
                       for k, v in self._rows())
        items = "".join(f"<li>{e(s)}</li>" for s in self.summary)
        return (f"<div><b>{e(self._title())}</b><table>{rows}</table>"
                + (f"<ul>{items}</ul>" if items else "") + "</div>")


def from_counts(res, kernel, kind: str) -> Profile:
    """A `Profile` from the dict a simulator's profiler returns (``kind`` names the backend)."""
    if isinstance(res, Profile):
        return res
    res = dict(res)
    name = res.pop("kernel", None) or getattr(kernel, "__name__", None) or \
        getattr(getattr(kernel, "fn", None), "__name__", None) or getattr(getattr(kernel, "py_func", None),
                                                                          "__name__", "kernel")
    return Profile(name, res.pop("backend", kind), res.pop("metrics", {}), **res)


def occupancy_of(block_size: int, registers, shared_per_block: int):
    """runtime.occupancy for this launch, when that module is there and the registers are known."""
    try:
        from ..occupancy import occupancy
    except ImportError:
        return None
    if not registers:
        return None
    try:
        return occupancy(block_size, registers_per_thread=int(registers), shared_per_block=int(shared_per_block))
    except Exception:  # an occupancy the calculator refuses (e.g. too many registers)
        return None
