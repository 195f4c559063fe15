"""A patch to Numba's CUDA simulator, applied only when the course runs in simulation.

Numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) runs each CUDA thread of a block as a
Python thread. Out of the box (numba-cuda 0.30) it

* has no warp-level primitives (``cuda.shfl_*_sync``, ``cuda.syncwarp``, votes), so the
  warp-shuffle reductions of the course would not run on a CPU;
* lets a divergent ``cuda.syncthreads()`` pass silently: if some threads ``return`` before
  a barrier the others simply carry on, where a GPU hangs or computes garbage;
* is slow: one OS thread is created per CUDA thread and a manager thread polls them in a
  busy loop, about 9,000 threads/s, or 600/s when the kernel has barriers.

This module replaces the simulator's block scheduler (``kernel.BlockManager``) with one
that fixes all three, adds the warp primitives to the simulator's fake ``cuda`` module,
and finds ``cuda.shared.array`` call sites without reading source files. It keeps the
rest of the simulator as it is (``threadIdx``, shared and local arrays, atomics,
``print`` inside kernels, exceptions naming the thread and block). On a GPU ``apply()``
does nothing. ``NUMBA_SIM_PATCHES`` lists what was changed.

How the scheduler works
-----------------------
The CUDA threads of a block run one at a time, in ``threadIdx`` order, on a small pool
of reusable OS threads. Exactly one of them holds the "baton" (runs Python) at any
moment; the others sleep on their own lock. A thread runs until it

* **returns**: its OS thread goes straight on with the next thread of the block that has
  not started yet, with no thread switch at all (so elementwise kernels are fast);
* **reaches a barrier** (``syncthreads``, a warp collective): it records its arrival and
  hands the baton to the next thread. The last thread to arrive completes the barrier,
  hands every waiting thread its result and carries on; the others resume in turn.

When no thread can run and some are still waiting, the barrier can never complete: the
block diverged. The scheduler then raises :class:`SimulatorSyncError` naming the kernel,
the block, where each group of threads waits and which threads returned without
reaching the barrier, instead of hanging or silently passing.

Warps are 32 consecutive linear thread ids, ``tid = x + y*bdx + z*bdx*bdy``, as on the
GPU. A warp collective completes when every lane named in its ``mask`` (and present in
the block: the last warp of a 48-thread block has 16 lanes) has reached a collective of
the same kind with the same mask; each lane then reads the others' values from the
warp's buffer. Shuffles follow the PTX rules: the lane operand is taken modulo 32, and a
lane whose source is outside the warp (``shfl_up``/``shfl_down`` past the edge) gets its
own value back. A source lane inside the warp but outside the mask is undefined on a GPU,
so it raises :class:`SimulatorSyncError` instead of being given a meaning; so does a source
lane that does not exist (a block of 16 threads shuffling down by 16), as the CUDA emulator
reports it.

``activemask()`` is rebuilt the same way: a lane waits until the other lanes of its warp
that have not returned reach an ``activemask()`` too, and learns which lanes reached the
same call site, the lanes a GPU would run converged there.

Speed (``python -m benchmarks.simulators.numba_sim_speed``, recorded in
``benchmarks/results/simulators/numba-simulator-speed.json``): on a 2-core CPU about 400,000
threads/s without barriers (the stock simulator: 6,000-12,000) and about 10,000 threads/s
for a 256-thread tree reduction with 9 barriers (stock: 600-1,400). The OS threads are
pinned to one core during a launch, which makes each hand-over cheaper
(``COURSE_NUMBA_SIM_PIN=0`` turns that off). A shorter ``sys.setswitchinterval`` only
adds forced GIL hand-overs here, so the interval is left alone.

What it cannot show: timings and true concurrency (threads run in one fixed order, so
a race shows up as a wrong answer or not at all, deterministically, never
intermittently). A thread that spins waiting for another thread of its block (a lock, a
flag) never lets that thread run and loops forever; the notebook's interrupt button
(Ctrl-C) stops it cleanly. Memory coalescing, bank conflicts and divergence are not
timed either, but they are counted: ``runtime/backends/numba/profile.py`` (through
``utils.profile``) records every access of a launch and groups the lanes of each warp as
a GPU does.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings
from collections import deque

import numpy as np

from ...config import MAX_BLOCK, MAX_GRID, MAX_THREADS_PER_BLOCK
from .._simulated import patch_once
from . import races as sim_race
from .races import SimulatorRaceError
from .sites import describe_site

__all__ = ["NUMBA_SIM_PATCHES", "SimulatorSyncError", "SimulatorRaceError"]

#: What the course changes in Numba's CUDA simulator, one line each (empty on a GPU).
NUMBA_SIM_PATCHES: list[str] = []

_FULL_MASK = 0xFFFFFFFF


class SimulatorSyncError(RuntimeError):
    """A barrier or warp collective that not every thread it names reaches."""


class _Abort(BaseException):
    """Unwinds a waiting simulated thread when its block fails (not catchable by
    ``except Exception`` in kernel code)."""


# ---------------------------------------------------------------------------------------
# Formatting helpers for diagnoses.
# ---------------------------------------------------------------------------------------
def _ranges(ids) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    ids = sorted(ids)
    out, start, prev = [], None, None
    for i in ids:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)


def _plural(ids, one="thread", many="threads") -> str:
    return f"{one if len(ids) == 1 else many} {_ranges(ids)}"


def _site_of(frame) -> tuple[str, int]:
    return frame.f_code.co_filename, frame.f_lineno


_describe_site = describe_site  # shared with the race detector and Triton's interpreter (sites.py)


# ---------------------------------------------------------------------------------------
# Warp collectives: how each computes its lanes' results once all of them arrived.
# ``arrivals`` maps lane -> (value, arg); returns lane -> result.
# ---------------------------------------------------------------------------------------
def _shfl(select):
    def combine(arrivals):
        out = {}
        for lane, (value, arg) in arrivals.items():
            src = select(lane, int(arg) & 31)  # PTX uses the low 5 bits of the operand
            # A source outside the warp or outside the mask gives the lane its own value.
            out[lane] = arrivals[src][0] if src in arrivals else value
        return out
    return combine


def _to_i32(v: int) -> int:
    """ballot_sync returns a signed 32-bit int on the GPU: lane 31 is the sign bit."""
    return v - (1 << 32) if v >= (1 << 31) else v


def _ballot_bits(arrivals):
    bits = 0
    for lane, (value, _) in arrivals.items():
        if value:
            bits |= 1 << lane
    return bits


def _vote(fn):
    def combine(arrivals):
        result = fn(arrivals)
        return dict.fromkeys(arrivals, result)
    return combine


def _match_any(arrivals):
    out = {}
    for lane, (value, _) in arrivals.items():
        out[lane] = sum(1 << other for other, (v, _) in arrivals.items() if v == value)
    return out


def _match_all(arrivals):
    values = [v for v, _ in arrivals.values()]
    same = all(v == values[0] for v in values)
    mask = sum(1 << lane for lane in arrivals) if same else 0
    return dict.fromkeys(arrivals, (mask, same))


# The lane each shuffle reads from (itself past the edge of the warp, as in PTX).
_SHFL_SOURCE = {
    "shfl_sync": lambda lane, src: src,
    "shfl_up_sync": lambda lane, d: lane - d if lane - d >= 0 else lane,
    "shfl_down_sync": lambda lane, d: lane + d if lane + d < 32 else lane,
    "shfl_xor_sync": lambda lane, m: lane ^ m,
}

_WARP_OPS = {
    "syncwarp": _vote(lambda a: None),
    **{kind: _shfl(select) for kind, select in _SHFL_SOURCE.items()},
    "ballot_sync": _vote(lambda a: _to_i32(_ballot_bits(a))),
    "all_sync": _vote(lambda a: all(bool(v) for v, _ in a.values())),
    "any_sync": _vote(lambda a: any(bool(v) for v, _ in a.values())),
    "eq_sync": _vote(lambda a: len({bool(v) for v, _ in a.values()}) == 1),
    "match_any_sync": _match_any,
    "match_all_sync": _match_all,
}


# ---------------------------------------------------------------------------------------
# The scheduler.
# ---------------------------------------------------------------------------------------
class _Worker(threading.Thread):
    """An OS thread that runs simulated CUDA threads, one after the other.

    The simulator's ``FakeCUDAModule`` reads ``threading.current_thread().threadIdx``
    (and calls ``.syncthreads()`` on it), so a worker carries the indices of the CUDA
    thread it is running and implements the barriers.
    """

    def __init__(self):
        super().__init__(name="cudasim-worker", daemon=True)
        self.wake = threading.Lock()
        self.wake.acquire()  # locked = asleep; whoever hands us the baton releases it
        self.block = None
        self.tid = -1
        self.thread_id = -1
        self.threadIdx = self.blockIdx = None
        self.result = None
        self.waiting_for = None  # (kind, site, ...) while parked at a barrier
        self.cpu = None  # the core this worker is pinned to, if any
        self.in_kernel = False  # inside kernel code (where an interrupt may be raised)

    # -- the thread's life -------------------------------------------------------------
    def run(self):
        while True:
            try:
                self.wake.acquire()
                block = self.block
                if block is None:  # woken without work: nothing to do but sleep again
                    continue
                block.work(self)
            except _Abort:  # an interrupt that arrived just outside kernel code
                continue

    # -- barriers, called from kernel code through FakeCUDAModule ---------------------
    def syncthreads(self, kind="syncthreads", value=None, site=None):
        if site is None:
            site = _site_of(sys._getframe(2))
        return self.block.arrive_block(self, kind, value, site)

    def syncthreads_count(self, value):
        return self.syncthreads("syncthreads_count", value, _site_of(sys._getframe(2)))

    def syncthreads_and(self, value):
        return self.syncthreads("syncthreads_and", value, _site_of(sys._getframe(2)))

    def syncthreads_or(self, value):
        return self.syncthreads("syncthreads_or", value, _site_of(sys._getframe(2)))

    def warp_op(self, kind, mask, value, arg, site):
        return self.block.arrive_warp(self, kind, mask, value, arg, site)


_pool: list[_Worker] = []  # idle workers, reused across blocks and launches
_pool_lock = threading.Lock()
_dim3_cache: dict = {}

# Handing the baton from one OS thread to another costs about 20 us when the two sit on
# different cores (the wake-up crosses cores twice: once for the lock, once for the
# GIL) and about 6 us on the same core. Only one simulated thread runs at a time, so the
# workers lose nothing by sharing one core: each launch pins them to the core the
# launching thread is on (Linux only; skipped where affinity cannot be set, and turned
# off with COURSE_NUMBA_SIM_PIN=0).
_pin = {"cpu": None, "enabled": hasattr(os, "sched_setaffinity")
        and os.environ.get("COURSE_NUMBA_SIM_PIN", "1") != "0"}


def _current_cpu():
    try:
        with open("/proc/thread-self/stat", "rb") as f:
            stat = f.read()
        # Field 39 ("processor"); fields are counted after the ")" closing the name.
        return int(stat[stat.rindex(b")") + 2:].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def _choose_cpu():
    if _pin["enabled"]:
        cpu = _current_cpu()
        if cpu is None:
            _pin["enabled"] = False
        _pin["cpu"] = cpu


def _set_async_exc(w: _Worker, exc_type) -> None:
    """Raise ``exc_type`` in worker ``w`` at its next bytecode (None cancels: use
    :func:`_cancel_async_exc`, which also clears the flag a cancel leaves behind)."""
    if w.ident is None:
        return
    _async_exc(w.ident, exc_type)


def _async_exc(ident: int, exc_type) -> None:
    obj = ctypes.py_object(exc_type) if exc_type is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), obj)


class _FlagCleared(BaseException):
    """Raised in the launching thread by :func:`_cancel_async_exc`, and caught there."""


def _cancel_async_exc(w: _Worker) -> None:
    """Cancel an ``_Abort`` that ``w`` has not raised yet, and clear what cancelling leaves.

    ``PyThreadState_SetAsyncExc(id, NULL)`` sets the interpreter's "asynchronous exception
    pending" flag even though it cancels (CPython 3.11 and 3.12), and only a thread that
    then raises one clears it. Left set, every thread stops at every call to look for an
    exception that is not there; a thread with a trace function, as ``utils.profile``'s
    launches run, looks again forever at the first line of the next function it calls
    (100% of a core, no progress). So the launching thread raises one in itself, here,
    and catches it: that clears the flag.
    """
    _set_async_exc(w, None)
    try:
        _async_exc(threading.get_ident(), _FlagCleared)
        for _ in range(10_000):  # raised at the first check, within a few bytecodes
            pass
    except _FlagCleared:
        return
    _async_exc(threading.get_ident(), None)  # not raised (cannot happen): never leave it pending


def _idle_worker() -> _Worker:
    w = None
    with _pool_lock:
        if _pool:
            w = _pool.pop()
    if w is None:
        w = _Worker()
        w.start()
    cpu = _pin["cpu"]
    if _pin["enabled"] and cpu is not None and w.cpu != cpu:
        try:
            os.sched_setaffinity(w.native_id, {cpu})
            w.cpu = cpu
        except OSError:  # not allowed here (some containers): run unpinned
            _pin["enabled"] = False
    return w


def _thread_indices(block_dim):
    """The ``threadIdx`` of each linear thread id: x fastest, the order warps are formed in."""
    key = tuple(block_dim)
    if key not in _dim3_cache:
        from numba.cuda.simulator.kernelapi import Dim3
        bx, by, bz = key
        _dim3_cache[key] = [Dim3(t % bx, (t // bx) % by, t // (bx * by))
                            for t in range(bx * by * bz)]
    return _dim3_cache[key]


class _Block:
    """One thread block of one launch: its threads, barriers and warp buffers."""

    def __init__(self, fn, args, grid_point, block_dim, debug, linear=0):
        from numba.cuda.simulator.kernelapi import Dim3
        self.fn, self.args, self.debug = fn, args, debug
        self.block_dim = tuple(block_dim)
        self.blockIdx = Dim3(*grid_point)
        self.indices = _thread_indices(block_dim)
        self.n = len(self.indices)
        self.next_new = 0       # next linear tid to start
        self.n_done = 0
        self.exited: set[int] = set()
        self.ready: deque = deque()  # workers whose barrier completed, waiting to resume
        self.block_waiting: dict[int, _Worker] = {}   # tid -> worker at a syncthreads
        self.warp_waiting: dict[int, dict[int, _Worker]] = {}  # warp -> lane -> worker
        self.active_waiting: dict[int, dict[int, _Worker]] = {}  # at cuda.activemask()
        self.error = None       # (exception, traceback) that ends the launch
        self.abort = False
        self.running = None     # the worker holding the baton
        self.interval = 0       # barriers completed so far (race detection's clock)
        self.warp_intervals = [0] * ((self.n + 31) // 32)  # warp collectives completed
        self.key = tuple(grid_point)
        self.linear = linear  # x + y*gridDim.x + z*gridDim.x*gridDim.y
        self.done = threading.Lock()
        self.done.acquire()

    # -- running threads ---------------------------------------------------------------
    def run(self):
        """Run the whole block; called by the launching thread."""
        if self.n == 0:
            return
        sim_race.begin_block(self.n, self.linear)
        first = _idle_worker()
        first.block = self
        first.wake.release()
        try:
            # Wake up now and then so that Ctrl-C / a notebook's interrupt button is
            # handled even while the simulated threads never give control back.
            while not self.done.acquire(timeout=0.2):
                pass
        except KeyboardInterrupt:
            self._interrupt()
            raise
        if self.error is not None:
            exc, tb = self.error
            raise exc.with_traceback(tb)

    def _interrupt(self):
        """Stop the block after a KeyboardInterrupt, even one stuck in an endless loop
        (say, a thread spinning on a flag that a thread still to run would set)."""
        self.abort = True  # no new thread starts; waiting ones unwind when woken
        w = self.running
        if w is not None and w.in_kernel:
            # Raise _Abort inside the running thread's kernel code at its next bytecode.
            _set_async_exc(w, _Abort)
        finished = self.done.acquire(timeout=5.0)
        if w is not None:
            _cancel_async_exc(w)  # never leave it pending for a later block
        if not finished:
            warnings.warn("the interrupted simulated kernel did not stop within 5 s; "
                          "restart the notebook's kernel if the next launch misbehaves")

    def work(self, w: _Worker):
        """Start new threads of the block on worker ``w`` until none is left."""
        fn, args = self.fn, self.args
        # A profiled launch (utils.sim_profile) follows the lines each thread runs, to
        # count the active lanes of a warp at each line.
        tracer = sim_race._T.prof.tracer if sim_race._T.prof is not None else None
        if tracer is not None:
            sys.settrace(tracer)
        while self.next_new < self.n and not self.abort:
            tid = self.next_new
            self.next_new += 1
            w.tid = w.thread_id = tid
            w.threadIdx = self.indices[tid]
            w.blockIdx = self.blockIdx
            self.running = w
            sim_race.set_thread(self.key, tid, self.interval, self.warp_intervals[tid >> 5])
            w.in_kernel = True
            try:
                if self.debug:
                    import numpy as np
                    with np.errstate(divide="raise"):
                        fn(*args)
                else:
                    fn(*args)
            except _Abort:
                pass
            except (SimulatorSyncError, SimulatorRaceError) as e:
                self.fail(e, e.__traceback__)
            except Exception as e:  # name the thread and block, as the simulator does
                msg = f"tid={list(w.threadIdx)} ctaid={list(self.blockIdx)}"
                msg = f"{msg}: {e}" if str(e) else msg
                try:
                    err = type(e)(msg)
                except Exception:
                    err = RuntimeError(msg)
                self.fail(err, e.__traceback__)
            w.in_kernel = False
            self.exited.add(tid)
            self.n_done += 1
        if tracer is not None:
            sys.settrace(None)
        # Nothing left to start here: park this worker and pass the baton on.
        w.block = None
        w.tid = w.thread_id = -1
        with _pool_lock:
            _pool.append(w)
        self.pass_baton()

    def pass_baton(self):
        """Wake the next thread to run. The caller must touch nothing afterwards."""
        if self.abort:
            self._release_all_waiting()
        if self.ready:
            self.ready.popleft().wake.release()
        elif self.next_new < self.n and not self.abort:
            w = _idle_worker()
            w.block = self
            w.wake.release()
        elif self.n_done == self.next_new:  # every started thread has finished
            self.done.release()
        elif self.active_waiting:
            # Lanes at activemask() wait for the rest of their warp to catch up; nothing
            # else can run, so the lanes that will come have come: answer them.
            for warp in list(self.active_waiting):
                self._release_active(warp, None)
            self.ready.popleft().wake.release()
        else:
            # Threads are waiting and none can run: a barrier that can never complete.
            self.fail(SimulatorSyncError(self._diagnose_deadlock()), None)
            self._release_all_waiting()
            if self.ready:
                self.ready.popleft().wake.release()
            else:  # cannot happen; never leave the launching thread waiting
                self.done.release()

    def _release_all_waiting(self):
        for w in list(self.block_waiting.values()):
            self.ready.append(w)
        self.block_waiting.clear()
        for waiting in (self.warp_waiting, self.active_waiting):
            for lanes in waiting.values():
                self.ready.extend(lanes.values())
            waiting.clear()

    def resume(self, w: _Worker):
        """Thread ``w`` runs again (after a barrier or warp collective)."""
        sim_race.set_thread(self.key, w.tid, self.interval, self.warp_intervals[w.tid >> 5])

    def fail(self, exc, tb):
        if self.error is None:
            self.error = (exc, tb)
        self.abort = True

    def park(self, w: _Worker):
        """Hand the baton on and sleep until this thread's barrier completes."""
        self.pass_baton()
        w.wake.acquire()
        self.running = w
        if self.abort:
            raise _Abort()
        self.resume(w)
        result, w.result, w.waiting_for = w.result, None, None
        return result

    # -- __syncthreads and friends ---------------------------------------------------
    def arrive_block(self, w: _Worker, kind, value, site):
        if self.abort:
            raise _Abort()
        w.waiting_for = (kind, site)
        w.result = value
        self.block_waiting[w.tid] = w
        if len(self.block_waiting) < self.n:
            return self.park(w)
        # Last to arrive: check that everyone met at the same barrier, then release.
        waiting = self.block_waiting
        groups: dict = {}
        for tid, other in waiting.items():
            groups.setdefault(other.waiting_for, []).append(tid)
        if len(groups) > 1:
            lines = [f"  {_plural(tids)} wait at cuda.{k}() at {_describe_site(s)}"
                     for (k, s), tids in groups.items()]
            del waiting[w.tid]  # this thread leaves by the exception; the others unwind
            w.waiting_for = None
            raise SimulatorSyncError(
                f"threads of block {tuple(self.blockIdx)} in kernel `{self.fn.__name__}` "
                "meet at different barriers:\n" + "\n".join(lines) + "\n"
                "Every thread of a block must reach the same cuda.syncthreads() (a "
                "barrier inside an `if` that not all threads take is a bug on a GPU).")
        self.interval += 1
        result = None
        if kind != "syncthreads":
            values = [bool(other.result) for other in waiting.values()]
            result = {"syncthreads_count": sum(values),
                      "syncthreads_and": int(all(values)),
                      "syncthreads_or": int(any(values))}[kind]
        for tid in sorted(waiting):
            other = waiting[tid]
            other.result = result
            if other is not w:
                self.ready.append(other)
        waiting.clear()
        w.result = w.waiting_for = None
        self.resume(w)
        return result

    # -- warp collectives ----------------------------------------------------------------
    def arrive_warp(self, w: _Worker, kind, mask, value, arg, site):
        if self.abort:
            raise _Abort()
        warp, lane = divmod(w.tid, 32)
        present = (1 << min(32, self.n - 32 * warp)) - 1  # lanes that exist in this warp
        mask = int(mask) & _FULL_MASK & present
        if not (mask >> lane) & 1:
            raise SimulatorSyncError(
                f"lane {lane} of warp {warp} (thread {w.tid}) of block "
                f"{tuple(self.blockIdx)} calls cuda.{kind}() with mask {int(mask):#010x}, "
                "which does not include its own lane: the calling lane must be in the mask.")
        w.waiting_for = (kind, site, mask)
        w.result = (value, arg)
        lanes = self.warp_waiting.setdefault(warp, {})
        lanes[lane] = w
        members = [i for i in range(32) if (mask >> i) & 1]
        if any(i not in lanes or lanes[i].waiting_for[2] != mask for i in members):
            return self.park(w)
        kinds = {lanes[i].waiting_for[0] for i in members}
        if len(kinds) > 1:
            lines = [f"  {_plural([i for i in members if lanes[i].waiting_for[0] == k], 'lane', 'lanes')}"
                     f" wait at cuda.{k}()" for k in sorted(kinds)]
            del lanes[lane]  # this lane leaves by the exception; the others unwind
            w.waiting_for = None
            raise SimulatorSyncError(
                f"lanes of warp {warp} in block {tuple(self.blockIdx)} of kernel "
                f"`{self.fn.__name__}` meet at different warp operations with mask "
                f"{mask:#010x}:\n" + "\n".join(lines))
        if kind in _SHFL_SOURCE:
            self._check_shuffle_sources(w, kind, mask, members, lanes, present, site)
        group = {i: lanes.pop(i) for i in members}
        if not lanes:
            del self.warp_waiting[warp]
        self.warp_intervals[warp] += 1
        results = _WARP_OPS[kind]({i: o.result for i, o in group.items()})
        for i in members:
            other = group[i]
            other.result = results[i]
            if other is not w:
                self.ready.append(other)
        result = w.result
        w.result = w.waiting_for = None
        self.resume(w)
        return result

    def _check_shuffle_sources(self, w, kind, mask, members, lanes, present, site):
        """A lane reading a lane of its warp that is not in the mask gets an undefined
        value on a GPU: report it instead of giving it a meaning."""
        select, named = _SHFL_SOURCE[kind], set(members)
        bad, absent = [], []
        for i in members:
            src = select(i, int(lanes[i].result[1]) & 31)
            if src != i and src not in named:
                (bad if (present >> src) & 1 else absent).append((i, src))
        if not bad and not absent:
            return
        warp = w.tid // 32
        del lanes[w.tid % 32]  # this lane leaves by the exception; the others unwind
        w.waiting_for = None
        if absent:
            # A partial warp (a block that is not a multiple of 32 threads): the source
            # lane does not exist, and what the GPU returns for it is undefined.
            pairs = ", ".join(f"lane {i} reads lane {src}" for i, src in absent[:8])
            more = f" (and {len(absent) - 8} more)" if len(absent) > 8 else ""
            nlanes = bin(present).count("1")
            raise SimulatorSyncError(
                f"undefined warp shuffle in kernel `{self.fn.__name__}`, block "
                f"{tuple(self.blockIdx)}, warp {warp}: cuda.{kind}() at "
                f"{_describe_site(site)}: {pairs}{more}, which does not exist (the block has "
                f"{self.n} thread{'s' * (self.n != 1)}, so warp {warp} has only {nlanes} "
                f"lane{'s' * (nlanes != 1)}).\n"
                "Fix: keep every source lane inside the block (shuffle offsets smaller than "
                "the number of threads), or give the block a multiple of 32 threads.")
        pairs = ", ".join(f"lane {i} reads lane {src}" for i, src in bad[:8])
        more = f" (and {len(bad) - 8} more)" if len(bad) > 8 else ""
        raise SimulatorSyncError(
            f"undefined warp shuffle in kernel `{self.fn.__name__}`, block "
            f"{tuple(self.blockIdx)}, warp {warp}: cuda.{kind}() with mask {mask:#010x} at "
            f"{_describe_site(site)}: {pairs}{more}, outside the mask. On a GPU the value a "
            "lane reads from a lane outside the mask is undefined.\n"
            "Fix: name every lane the shuffle reads in the mask (0xffffffff when the whole "
            "warp takes part), or do not use the values of the lanes whose source is outside it.")

    # -- activemask -------------------------------------------------------------------
    def arrive_active(self, w: _Worker, site):
        """``activemask()``: the lanes of the warp that execute this call together.

        Threads run one at a time here, so "together" is rebuilt: a lane waits until
        every lane of its warp that has not returned has reached an ``activemask()``
        (or nothing else can run), and gets the lanes that reached the same call site.
        """
        if self.abort:
            raise _Abort()
        warp, lane = divmod(w.tid, 32)
        w.waiting_for = ("activemask", site)
        lanes = self.active_waiting.setdefault(warp, {})
        lanes[lane] = w
        alive = sum(1 for t in range(32 * warp, min(32 * warp + 32, self.n))
                    if t not in self.exited)
        if len(lanes) < alive:
            return self.park(w)
        self._release_active(warp, w)
        result = w.result
        w.result = w.waiting_for = None
        return result

    def _release_active(self, warp, current):
        lanes = self.active_waiting.pop(warp)
        masks: dict = {}
        for lane, other in lanes.items():
            masks[other.waiting_for[1]] = masks.get(other.waiting_for[1], 0) | (1 << lane)
        for lane in sorted(lanes):
            other = lanes[lane]
            other.result = masks[other.waiting_for[1]]
            if other is not current:
                self.ready.append(other)

    # -- diagnosis -----------------------------------------------------------------------
    def _diagnose_deadlock(self) -> str:
        name, bid = self.fn.__name__, tuple(self.blockIdx)
        groups: dict = {}
        for tid, w in self.block_waiting.items():
            kind, site = w.waiting_for
            groups.setdefault((f"cuda.{kind}()", site), []).append(tid)
        for warp, lanes in self.warp_waiting.items():
            for lane, w in lanes.items():
                kind, site, mask = w.waiting_for
                groups.setdefault((f"cuda.{kind}(mask={mask:#010x})", site), []).append(w.tid)
        lines = [f"  {_plural(tids)} wait at {what} at {_describe_site(site)}"
                 for (what, site), tids in sorted(groups.items(), key=lambda g: min(g[1]))]
        if self.exited:
            lines.append(f"  {_plural(self.exited)} returned without reaching it")
        only_block = not self.warp_waiting
        head = ("cuda.syncthreads() was not reached by every thread" if only_block
                else "a warp collective was not reached by every lane its mask names")
        hint = ("Every thread of a block must reach every cuda.syncthreads(): keep the "
                "barrier outside `if`s and early `return`s, and guard only the work."
                if only_block else
                "Every lane named in the mask must call the same warp operation: keep it "
                "outside `if`s and early `return`s, or pass a mask of the lanes that do.")
        dims = "" if self.block_dim[1:] == (1, 1) else \
            " (thread = threadIdx.x + threadIdx.y*blockDim.x + threadIdx.z*blockDim.x*blockDim.y)"
        return (f"{head} in block {bid} of kernel `{name}` ({self.n} threads){dims}:\n"
                + "\n".join(lines) + "\n" + hint)


def _check_launch_limits(name, grid, block):
    """A GPU refuses these launches (CUDA_ERROR_INVALID_VALUE); the simulator would run them."""
    g = (tuple(grid) + (1, 1, 1))[:3]
    b = (tuple(block) + (1, 1, 1))[:3]
    if any(a > m for a, m in zip(g, MAX_GRID)):
        raise RuntimeError(f"kernel `{name}` launched with grid {g}: a GPU refuses it "
                           "(CUDA_ERROR_INVALID_VALUE). The grid is at most (2**31-1, 65535, 65535): "
                           "put the large dimension on x.")
    if b[0] * b[1] * b[2] > MAX_THREADS_PER_BLOCK or any(a > m for a, m in zip(b, MAX_BLOCK)):
        raise RuntimeError(f"kernel `{name}` launched with blocks of {b} threads: a GPU refuses "
                           "it. A block has at most 1024 threads (x, y <= 1024, z <= 64).")


class _BlockManager:
    """Drop-in for ``numba.cuda.simulator.kernel.BlockManager`` (same constructor and
    ``run`` signature), running the block with the scheduler above."""

    def __init__(self, f, grid_dim, block_dim, debug):
        _check_launch_limits(getattr(f, "__name__", "kernel"), tuple(grid_dim), tuple(block_dim))
        self._f, self._grid_dim, self._block_dim, self._debug = f, grid_dim, block_dim, debug

    def run(self, grid_point, *args):
        args = sim_race.launch_arguments(self._f, args)
        gx, gy = self._grid_dim[0], self._grid_dim[1]
        linear = grid_point[0] + gx * (grid_point[1] + gy * grid_point[2])
        _Block(self._f, args, grid_point, self._block_dim, self._debug, linear).run()


# ---------------------------------------------------------------------------------------
# Patching the simulator.
# ---------------------------------------------------------------------------------------
def _warp_method(kind, has_arg):
    if kind == "syncwarp":
        def method(self, mask=_FULL_MASK):
            return threading.current_thread().warp_op(
                kind, mask, None, 0, _site_of(sys._getframe(1)))
    elif has_arg:
        def method(self, mask, value, arg):
            return threading.current_thread().warp_op(
                kind, mask, value, arg, _site_of(sys._getframe(1)))
    else:
        def method(self, mask, value):
            return threading.current_thread().warp_op(
                kind, mask, value, 0, _site_of(sys._getframe(1)))
    method.__name__ = kind
    method.__doc__ = f"cuda.{kind} with warp semantics (course patch of the CUDA simulator)."
    return method


def _activemask(self):
    """cuda.activemask(): the lanes of the warp that make this call together."""
    w = threading.current_thread()
    return w.block.arrive_active(w, _site_of(sys._getframe(1)))


def _lanemask_lt(self):
    return (1 << (threading.current_thread().tid % 32)) - 1


def _shared_array(self, shape, dtype, alignment=None):
    """``cuda.shared.array`` keyed by its call site like the original, but found with
    ``sys._getframe`` instead of ``traceback.extract_stack``, which reads source files
    and cost more than the rest of a typical thread."""
    import numpy as np

    from numba.cuda import types
    from numba.cuda.np import numpy_support
    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:  # dynamic shared memory: one buffer sized by the launch
        dtype = np.dtype(dtype)
        count = self._dynshared_size // dtype.itemsize
        res = np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
        if sim_race.watching():
            return sim_race.wrap_shared(res, _site_of(sys._getframe(1)), dynamic=True)
        return res
    caller = _site_of(sys._getframe(1))
    res = self._allocations.get(caller)
    if res is None:
        res = np.empty(shape, dtype)
        if sim_race.watching():
            res = sim_race.wrap_shared(res, caller)
        self._allocations[caller] = res
    return res


#: numba.cuda.libdevice functions that return through pointers (a tuple in Numba), built from
#: the twins of what they compute
_LIBDEVICE_PAIRS = {
    "sincos": lambda ev, x, f: (ev("sin" + f, x), ev("cos" + f, x)),
    "sincospi": lambda ev, x, f: (ev("sinpi" + f, x), ev("cospi" + f, x)),
    "frexp": lambda ev, x, f: tuple(np.frexp(x)),
    "modf": lambda ev, x, f: tuple(np.modf(x)),
}


def _patch_libdevice() -> int:
    """``numba.cuda.libdevice``'s functions, stubs that return None in the simulator,
    computed by the twins the Triton interpreter also uses (``runtime/backends/libdevice.py``).
    Returns how many functions were patched."""
    try:
        from numba.cuda import libdevice as module
        from numba.cuda.libdevicefuncs import functions
    except ImportError:
        return 0
    from .. import libdevice as twins

    def make(symbol, ret, ins, outs):
        name = symbol[len("__nv_"):]
        in_types = [np.dtype(str(a.ty)) for a in ins]

        def call(*args):
            if len(args) != len(in_types):
                raise TypeError(f"libdevice.{name}() takes {len(in_types)} arguments, got {len(args)}")
            values = [np.asarray(v, dtype=t) for v, t in zip(args, in_types)]
            if not outs:
                return twins.evaluate(symbol, values, np.dtype(str(ret)))[()]
            base = name[:-1] if name.endswith("f") and name[:-1] in _LIBDEVICE_PAIRS else name
            pair = _LIBDEVICE_PAIRS.get(base)
            if pair is None:
                raise twins.LibdeviceNotSimulated(
                    f"libdevice.{name} has no twin in Numba's simulator: it runs only on a GPU")
            suffix = "f" if in_types[0] == np.float32 else ""
            result = pair(lambda s, x: twins.evaluate("__nv_" + s, [x], in_types[0])[()], values[0], suffix)
            return tuple(np.asarray(r)[()] for r in result)
        call.__name__ = call.__qualname__ = name
        call.__doc__ = getattr(getattr(module, name, None), "__doc__", None)
        return call

    count = 0
    for symbol, (ret, args) in functions.items():
        name = symbol[len("__nv_"):]
        if hasattr(module, name):
            setattr(module, name, make(symbol, ret, [a for a in args if not a.is_ptr],
                                       [a for a in args if a.is_ptr]))
            count += 1
    return count


@patch_once("NUMBA_ENABLE_CUDASIM")
def apply() -> bool:
    """Patch the simulator (idempotent). Does nothing on a GPU; returns whether applied."""
    from numba.cuda.simulator import kernel, kernelapi

    kernel.BlockManager = _BlockManager
    NUMBA_SIM_PATCHES.append(
        "block scheduler: threads run one at a time on reused OS threads pinned to one "
        "core (no polling); a divergent cuda.syncthreads() raises SimulatorSyncError; a grid "
        "or block over the GPU's limits raises as the launch would on a GPU")

    mod = kernelapi.FakeCUDAModule
    added = []
    for kind in _WARP_OPS:
        if not hasattr(mod, kind):
            has_arg = kind.startswith("shfl")
            setattr(mod, kind, _warp_method(kind, has_arg))
            added.append(kind)
    for name, fn in (("activemask", _activemask), ("lanemask_lt", _lanemask_lt)):
        if not hasattr(mod, name):
            setattr(mod, name, fn)
            added.append(name)
    if added:
        NUMBA_SIM_PATCHES.append("warp primitives: cuda." + ", cuda.".join(added))

    kernelapi.FakeCUDAShared.array = _shared_array
    for name in ("add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min",
                 "nanmax", "nanmin", "cas", "compare_and_swap"):
        original = getattr(kernelapi.FakeCUDAAtomic, name, None)
        if original is not None:
            setattr(kernelapi.FakeCUDAAtomic, name,
                    sim_race.atomic_method(original, has_index=name != "compare_and_swap"))
    NUMBA_SIM_PATCHES.append(
        "race detection: accesses to array arguments and shared arrays are checked; two "
        "threads of a block in one barrier interval, or two blocks, touching one element "
        "with a plain write raise SimulatorRaceError (COURSE_RACECHECK=0 turns it off)")
    NUMBA_SIM_PATCHES.append("cuda.shared.array: call site found with sys._getframe")
    if _patch_libdevice():
        NUMBA_SIM_PATCHES.append(
            "numba.cuda.libdevice: computed as a GPU computes it (runtime/backends/libdevice.py, "
            "shared with Triton's interpreter), where the simulator's functions returned None")

    original_call = kernel.FakeCUDAKernel.__call__

    def __call__(self, *args):
        # A launch (not a device-function call from inside a kernel): pin the workers
        # to the launching thread's core for its duration. The GIL switch interval is
        # left alone: with one runnable thread at a time a shorter one only adds forced
        # GIL hand-offs (measured in benchmarks/simulators/numba_sim_speed.py).
        if self._device or kernel._kernel_context is not None:
            return original_call(self, *args)
        _choose_cpu()
        sim_race.begin_launch(getattr(self.fn, "__name__", "kernel"))
        try:
            return original_call(self, *args)
        finally:
            sim_race.end_launch()

    __call__.__wrapped__ = original_call
    kernel.FakeCUDAKernel.__call__ = __call__

    original_getitem = kernel.FakeCUDAKernel.__getitem__

    def __getitem__(self, configuration):
        # kernel[grid, block, stream, shared]: the simulator drops the stream; a CUDA Graph's
        # capture needs it (a launch on Numba's default stream is not captured)
        out = original_getitem(self, configuration)
        out.stream = configuration[2] if isinstance(configuration, tuple) and len(configuration) > 2 else 0
        return out

    __getitem__.__wrapped__ = original_getitem
    kernel.FakeCUDAKernel.__getitem__ = __getitem__
    NUMBA_SIM_PATCHES.append("kernel[grid, block, stream]: the stream is kept (CUDA Graph captures read it)")
    return True


class TorchStream:
    """What ``utils.numba_stream()`` gives in simulation: torch's current stream, for a launch
    ``kernel[grid, block, utils.numba_stream()]`` (a simulated CUDA Graph captures such a launch;
    one on Numba's default stream, 0, it does not)."""

    def __repr__(self):
        return "<torch's current stream (simulated)>"

    def synchronize(self):
        pass


TORCH_STREAM = TorchStream()


def on_torch_stream(k) -> bool:
    """Whether a configured simulated kernel launches on torch's stream."""
    return getattr(k, "stream", 0) is TORCH_STREAM


def is_applied() -> bool:
    return apply.applied


apply()
