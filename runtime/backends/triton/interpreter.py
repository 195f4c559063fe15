"""Triton's interpreter made stricter, and published Triton code made to run in it.

Applied by ``import utils`` in simulation only (``TRITON_INTERPRET=1``); on a GPU it does
nothing. ``TRITON_SIM_PATCHES`` lists what was changed.

* **Races between programs.** The interpreter runs a launch's programs one after another,
  so two programs storing to one element without an atomic always give the last
  program's value, where a GPU gives either, or a mix. Every ``tl.load``, ``tl.store`` and
  ``tl.atomic_*`` of a launch is recorded by element address; a plain store to an element
  that another program of the launch stored, loaded or updated atomically (or a load or
  atomic of an element another program stored) raises :class:`SimulatorRaceError`
  naming both programs, the argument and the element. Atomics never race with atomics,
  and a program that has taken a lock with ``tl.atomic_cas`` is trusted with what it does
  while holding it (the layer-norm tutorial's pattern). ``COURSE_RACECHECK=0`` turns it off.
* **Out-of-bounds accesses.** A lane that a load, store or atomic performs (mask on) outside
  every tensor argument of the launch (the elements each view reaches through its strides)
  raises :class:`SimulatorMemoryError` naming the program, argument, offset and line, with the
  fix (a mask, or an off-by-one between mask and offsets). The interpreter read whatever lay
  there, or crashed the process with a segmentation fault far from any tensor. Always on.
* **Poison for masked-off lanes.** A ``tl.load(ptr, mask=m)`` without ``other=`` leaves the
  masked-off lanes undefined on a GPU; the interpreter gives 0, which hides a forgotten
  ``other=0.0`` in a sum. Here they read NaN (floats) or the type's most negative
  (unsigned: largest) value, so a missing ``other`` shows up in the result.
* **Tensor-core numerics** (``runtime/backends/triton/tensor_core.py``). ``tl.dot`` of float32 tiles follows
  ``input_precision`` as an H100 does: "tf32" (Triton's default on NVIDIA GPUs, unless
  ``TRITON_F32_DEFAULT`` or ``allow_tf32=False`` say otherwise) reads the inputs as TF32,
  "tf32x3" sums three TF32 products, "ieee" is exact float32; the interpreter computed all
  three exactly. ``tl.dot`` of bfloat16 widens the inputs to float32 (the interpreter
  multiplied their raw uint16 bits), and casts to bfloat16 round to nearest even (it
  truncated).
* **bfloat16 arithmetic** (``_patch_bf16_arithmetic``). The builder's binary and unary float
  operations (``+``, ``*``, ``/``, ``exp``, ``sqrt``...), fma, rsqrt and negation of bfloat16
  values compute on the values and round each result to nearest even, as the GPU does (the
  interpreter ran them on the raw uint16 bits: 1.0 + 1.0 gave about 3e38).
* **libdevice** (``runtime/backends/libdevice.py``, shared with Numba's simulator). ``libdevice.asin(x)``,
  ``tl.extra.cuda.libdevice.tanh(x)``, ``fast_expf``, ``fadd_rz``... failed on every call
  (the generic module holds stubs that only a GPU compiler replaces, and the interpreter's
  builder had no extern calls). Each ``__nv_*`` symbol but ``jn``/``yn`` now has a NumPy
  twin; a name NVIDIA's module lacks raises the error a GPU's compiler would.
* **Globals a GPU refuses.** A kernel that reads a module-level ``int``, ``float``, ``bool``,
  string, container or tensor (``if MODE == FAST:`` with ``FAST = 1``) runs in the
  interpreter, but a GPU's Triton compiler refuses it: only globals made with
  ``tl.constexpr(...)`` (and functions, modules, dtypes) may be read. Here it raises the
  same ``NameError`` at launch, for the kernel and every ``@triton.jit`` function it calls.
* **Profiling.** During ``runtime/backends/triton/profile.py`` every load, store and
  atomic is also reported to the profiler (``profiler``), which counts the bytes and the
  masked-off lanes of each program.
* **A driver.** ``triton.runtime.driver.active`` raises "0 active drivers" without a GPU.
  A small driver answers the calls published code makes:
  ``get_active_torch_device()`` (``utils.DEVICE``), ``get_current_device()``,
  ``get_current_target()``, ``utils.get_device_properties(...)`` (an H100's numbers:
  see ``H100_PROPERTIES``), ``get_benchmarker()`` and what ``triton.testing.do_bench``
  needs. An unchanged ``@triton.autotune`` then works: no config is timed, all report the
  same time, so the first config is used, as ``utils.triton_compat.autotune`` does. Timings in
  simulation are CPU times and say nothing about a GPU.
"""
from __future__ import annotations

import inspect
import os
import sys
import time

from .._simulated import patch_once
from ..numba.races import RACECHECK, SimulatorMemoryError, SimulatorRaceError

__all__ = ["TRITON_SIM_PATCHES", "H100_PROPERTIES"]

#: What the course changes in Triton's interpreter, one line each (empty on a GPU).
TRITON_SIM_PATCHES: list[str] = []

#: What ``driver.active.utils.get_device_properties`` answers in simulation: an H100 SXM
#: (cudaGetDeviceProperties on sm_90). Tutorials size their launches from these.
H100_PROPERTIES = {
    "max_shared_mem": 232448,        # bytes per block, opt-in (227 KiB)
    "max_num_regs": 65536,           # registers per SM
    "multiprocessor_count": 132,
    "warpSize": 32,
    "sm_clock_rate": 1980000,        # kHz
    "mem_clock_rate": 2619000,       # kHz
    "mem_bus_width": 5120,           # bits
}


# ---------------------------------------------------------------------------------------
# Race detection.
# ---------------------------------------------------------------------------------------
class _Shadow:
    """For one storage of the launch's tensors: per element, the last program that
    stored, loaded or updated it atomically, and the line it did so at (NumPy arrays, so
    a whole block of a program is checked at once)."""

    def __init__(self, start, nbytes, granule):
        import numpy as np
        self.start, self.end, self.g = start, start + nbytes, granule
        self.n = nbytes // granule + 1
        self.pid, self.site = {}, {}
        self.np = np

    def table(self, kind):
        if kind not in self.pid:
            self.pid[kind] = self.np.full(self.n, -1, dtype=self.np.int64)
            self.site[kind] = self.np.zeros(self.n, dtype=self.np.int32)
        return self.pid[kind], self.site[kind]


class _Launch:
    """What one launch has touched, by storage."""

    def __init__(self, name, tensors, storages, extents=()):
        import numpy as np
        self.name = name
        self.tensors = tensors   # [(argument name, first address, itemsize, numel, shape)]
        self.extents = list(extents)  # [(argument name, first byte, end byte, itemsize, numel)]
        self.lo = np.array([e[1] for e in self.extents], dtype=np.int64)
        self.hi = np.array([e[2] for e in self.extents], dtype=np.int64)
        self.shadows = [_Shadow(*st) for st in sorted(storages)]
        self.starts = np.array([sh.start for sh in self.shadows], dtype=np.int64)
        self.sites: list = []    # (file, line) of each recorded access, by site id
        self.patched_langs: set = set()  # the language modules patched in this launch (see patch_lang)
        self.site_ids: dict = {}
        self.locked = set()      # programs that took a lock with atomic_cas


_launch: list = [None]

#: The profiler of a ``runtime/backends/triton/profile.py`` launch, or None: every load,
#: store and atomic is reported to it as well.
profiler: list = [None]


def _profile(builder, ptrs, mask, kind):
    p = profiler[0]
    if p is not None:
        p.access(builder, ptrs, mask, kind)


def _program(builder):
    x, y, z = builder.grid_idx
    gx, gy, _ = builder.grid_dim
    return x + gx * (y + gy * z)


def _pid_tuple(builder, p):
    gx, gy, _ = builder.grid_dim
    return (p % gx, (p // gx) % gy, p // (gx * gy))


def _site():
    """The line of kernel code that made the current call (the first frame outside
    Triton and this module)."""
    import triton
    skip = (os.path.dirname(triton.__file__), os.path.dirname(__file__))
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(skip):
        f = f.f_back
    return (f.f_code.co_filename, f.f_lineno) if f is not None else ("?", 0)


def _element(launch, addr):
    for name, start, itemsize, numel, shape in launch.tensors:
        if start <= addr < start + itemsize * numel:
            flat = (addr - start) // itemsize
            if len(shape) > 1:
                import numpy as np
                return f"{name}[{', '.join(str(int(i)) for i in np.unravel_index(flat, shape))}]"
            return f"{name}[{flat}]"
    return f"the element at address {addr:#x}"


def _report(builder, launch, addr, first, first_kind, second, second_kind):
    (p, psite), (c, csite) = first, second
    both_store = first_kind == second_kind == "store"
    lines = [
        f"data race in Triton kernel `{launch.name}` on {_element(launch, addr)}:",
        f"  {first_kind} by program {_pid_tuple(builder, p)} at {_describe_site(psite)}",
        f"  {second_kind} by program {_pid_tuple(builder, c)} at {_describe_site(csite)}",
        "The programs of one launch run in no fixed order and cannot wait for each other, so "
        "on a GPU these happen in either order or at once"
        + (" and one of the values is lost." if both_store else
           ": the load sees the value before or after the store."),
        "Fix: give each program its own elements (check the offsets: pid * BLOCK + "
        "tl.arange(0, BLOCK), and the mask), or combine the programs' results with "
        "tl.atomic_add (or another tl.atomic_*)."]
    _launch[0] = None  # the rest of the launch unwinds unchecked
    raise SimulatorRaceError("\n".join(lines))


def _record(builder, ptrs, mask, kind):
    launch = _launch[0]
    if launch is None or not launch.shadows:
        return
    import numpy as np
    p = _program(builder)
    if kind == "atomic_cas":
        launch.locked.add(p)
        kind = "atomic"
    addrs = np.asarray(ptrs.data).astype(np.int64, copy=False)
    if mask is not None:
        addrs = addrs[np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)]
    addrs = addrs.ravel()
    if addrs.size == 0:
        return
    site = _site()
    sid = launch.site_ids.get(site)
    if sid is None:
        sid = launch.site_ids[site] = len(launch.sites)
        launch.sites.append(site)
    # What this access conflicts with: plain stores of other programs always; loads and
    # atomics of other programs only if this is a plain store.
    against = ("store", "load", "atomic") if kind == "store" else ("store",)
    which = np.searchsorted(launch.starts, addrs, side="right") - 1
    for k in np.unique(which):
        if k < 0:
            continue  # not a tensor argument's memory: nothing to compare with
        sh = launch.shadows[k]
        sel = addrs if len(launch.shadows) == 1 else addrs[which == k]
        sel = sel[sel < sh.end]
        idx = (sel - sh.start) // sh.g
        for other in against:
            if other not in sh.pid:
                continue
            prev = sh.pid[other][idx]
            bad = (prev >= 0) & (prev != p)
            if p in launch.locked and bad.any():  # both under a lock: ordered by it
                bad &= ~np.isin(prev, list(launch.locked))
            if bad.any():
                j = int(np.argmax(bad))
                first = (int(prev[j]), launch.sites[int(sh.site[other][idx[j]])])
                _report(builder, launch, int(sel[j]), first, other, (p, site), kind)
        pid, sites = sh.table(kind)
        pid[idx] = p
        sites[idx] = sid


def _check_bounds(builder, ptrs, mask, kind):
    """Every lane that a load, store or atomic really performs (its mask on) must touch
    memory of one of the launch's tensor arguments, as the CUDA emulator and
    compute-sanitizer's memcheck require; the interpreter read whatever lay there (or
    crashed the process far from any tensor). Raises ``SimulatorMemoryError``."""
    launch = _launch[0]
    if launch is None or not launch.extents:
        return
    import numpy as np
    addrs = np.asarray(ptrs.data).astype(np.int64, copy=False)
    masked = False
    if mask is not None:
        keep = np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)
        masked = not bool(keep.all())  # an unmasked tl.load passes a mask of all lanes
        addrs = addrs[keep]
    addrs = addrs.ravel()
    if addrs.size == 0:
        return
    size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    inside = np.zeros(addrs.shape, dtype=bool)
    for lo, hi in zip(launch.lo, launch.hi):
        inside |= (addrs >= lo) & (addrs + size <= hi)
    if inside.all():
        return
    addr = int(addrs[int(np.argmin(inside))])
    verb = {"load": "loads", "store": "stores to", "atomic": "updates", "atomic_cas": "updates"}[kind]
    where = _describe_site(_site())
    program = _pid_tuple(builder, _program(builder))
    # the argument the address is nearest to, and on which side of it the address lies
    gaps = [(addr - hi if addr >= hi else lo - addr, e) for e, lo, hi in zip(launch.extents, launch.lo, launch.hi)]
    gap, (name, lo, hi, itemsize, numel) = min(gaps, key=lambda g: g[0])
    _launch[0] = None  # the rest of the launch unwinds unchecked
    if gap > 1 << 20:
        raise SimulatorMemoryError(
            f"out-of-bounds access in Triton kernel `{launch.name}`: program {program} {verb} address "
            f"{addr:#x} at {where}, which is not inside any tensor argument: an offset far out of "
            "range (a wrong stride or program id?). On a GPU this is an illegal memory access.")
    side = "past the end" if addr >= hi else "before the start"
    offset = (addr - lo) // itemsize
    if addr < lo:
        fix = ("The offset is negative: check how the offsets are computed (offs - 1 at offs = 0?), "
               "and mask the lanes that go below 0.")
    elif masked:  # the mask is there, but it lets this lane through: it tests other offsets
        fix = ("The access has a mask, yet a lane it keeps goes out of bounds: the mask tests other "
               "offsets than the address uses. Either the lane's offset is shifted (an off-by-one, such "
               "as x_ptr + offs + 1 under mask=offs < n?), or the base it is added to is too far: a row "
               "starts at row * (its number of columns), not row * BLOCK. Load and store at the "
               "offsets the mask tests, from the right base.")
    else:
        fix = ("Mask the lanes past the end: tl.load(ptrs, mask=offs < n, other=0.0), "
               "tl.store(ptrs, y, mask=offs < n).")
    raise SimulatorMemoryError(
        f"out-of-bounds access in Triton kernel `{launch.name}`: program {program} {verb} "
        f"{name} + {offset} at {where}, {side} of `{name}`'s tensor ({numel} element"
        f"{'s' if numel != 1 else ''}, offsets 0..{(hi - lo) // itemsize - 1}). On a GPU this reads or writes "
        f"another tensor's memory, or stops the program with an illegal memory access. {fix}")


def _describe_site(site):
    from ..numba.sites import describe_site
    return describe_site(site)


def _extent(t):
    """(first byte, end byte) of the elements a tensor view can reach through its strides."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    lo = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0)
    return t.data_ptr() + lo * t.element_size(), t.data_ptr() + (hi + 1) * t.element_size()


def _tensors_in(name, v, depth=0):
    """The tensors of one argument: itself, those in a tuple or list, a descriptor's base."""
    if hasattr(v, "data_ptr") and hasattr(v, "element_size") and hasattr(v, "stride"):
        return [(name, v)]
    if depth < 3 and isinstance(v, (tuple, list)):
        return [t for k, item in enumerate(v) for t in _tensors_in(f"{name}[{k}]", item, depth + 1)]
    base = getattr(v, "base", None)
    if depth < 3 and base is not None and base is not v:
        return _tensors_in(name, base, depth + 1)
    return []


def _extents(fn, args, kwargs):
    """[(argument name, first byte, end byte, itemsize, numel)] of a launch's tensors."""
    try:
        sig = inspect.signature(fn)
        bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
    except (TypeError, ValueError):
        return []
    out = []
    for name, v in bound.arguments.items():
        for label, t in _tensors_in(name, v):
            out.append((label, *_extent(t), t.element_size(), t.numel()))
    return out


def _tensor_args(fn, args, kwargs):
    """The tensor arguments of a launch: [(name, address, itemsize, numel, shape)], and
    their storages: [(first address, bytes, smallest itemsize on it)]."""
    try:
        sig = inspect.signature(fn)
        # Launch options (num_warps, num_stages, ...) are not parameters of the kernel.
        bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items()
                                          if k in sig.parameters})
    except (TypeError, ValueError):
        return [], []
    out, storages = [], {}
    for name, v in bound.arguments.items():
        if hasattr(v, "data_ptr") and hasattr(v, "element_size"):
            out.append((name, v.data_ptr(), v.element_size(), v.numel(), tuple(v.shape)))
            try:
                st = v.untyped_storage()
                start, nbytes = st.data_ptr(), st.nbytes()
            except (AttributeError, RuntimeError):
                start, nbytes = v.data_ptr(), v.element_size() * v.numel()
            g = min(storages.get(start, (0, v.element_size()))[1], v.element_size())
            storages[start] = (nbytes, g)
    return out, [(start, nbytes, g) for start, (nbytes, g) in storages.items()]


# ---------------------------------------------------------------------------------------
# Poison for masked-off lanes.
# ---------------------------------------------------------------------------------------
def _poison(dtype_np, shape):
    import numpy as np
    dt = np.dtype(dtype_np)
    if dt.kind == "f":
        return np.full(shape, np.nan, dtype=dt)
    if dt.kind == "i":
        return np.full(shape, np.iinfo(dt).min, dtype=dt)
    if dt.kind == "u":
        return np.full(shape, np.iinfo(dt).max, dtype=dt)
    return np.zeros(shape, dtype=dt)  # bool: nothing implausible to give


# ---------------------------------------------------------------------------------------
# A driver for the interpreter.
# ---------------------------------------------------------------------------------------
class _CpuEvent:
    """``torch.cuda.Event(enable_timing=True)`` on the CPU's clock."""

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0

    def synchronize(self):
        pass


class _CpuDeviceInterface:
    """The part of ``torch.cuda`` that ``triton.testing.do_bench`` uses."""

    Event = _CpuEvent

    @staticmethod
    def synchronize(device=None):
        pass

    @staticmethod
    def current_device():
        return 0


class _SimDriverUtils:
    @staticmethod
    def get_device_properties(device=None):
        return dict(H100_PROPERTIES)


class _SimDriver:
    """``triton.runtime.driver.active`` in simulation."""

    utils = _SimDriverUtils()

    @staticmethod
    def is_active():
        return True

    def get_active_torch_device(self):
        from ...config import DEVICE
        return DEVICE

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    def get_device_interface(self):
        return _CpuDeviceInterface

    def get_empty_cache_for_benchmark(self):
        import torch
        return torch.empty(1 << 20, dtype=torch.int8)  # a CPU has no L2 to flush worth timing

    def clear_cache(self, cache):
        cache.zero_()

    def get_benchmarker(self):
        return _autotune_bench


class _WarmedUp:
    """What ``kernel.warmup(...)`` gives in simulation. The interpreter compiles nothing,
    so the compiled kernel's figures are placeholders of a typical small H100 kernel:
    enough for the occupancy arithmetic of published code (fused-softmax tutorial)."""

    n_regs = 32
    n_spills = 0

    class metadata:  # mirrors CompiledKernel.metadata
        shared = 1024
        num_warps = 4

    def __init__(self, fn):
        self.fn = fn

    def _init_handles(self):
        pass

    def __getitem__(self, grid):
        return self.fn[grid]


def _warmup(self, *args, grid=None, **kwargs):
    return _WarmedUp(self)


def _autotune_bench(kernel_call, quantiles=None, **kwargs):
    """What ``@triton.autotune`` times each config with in simulation: nothing. CPU times
    of the interpreter say nothing about a GPU, and running every config of a published
    matmul takes minutes; every config gets the same time, so the first one is used
    (the launch itself then runs it)."""
    return [1.0, 1.0, 1.0] if quantiles is not None else 1.0


# ---------------------------------------------------------------------------------------
# Globals that a GPU's compiler refuses.
# ---------------------------------------------------------------------------------------
_GLOBAL_NAMES: dict = {}   # code object -> the names it loads as globals


def _global_names(code) -> tuple[str, ...]:
    names = _GLOBAL_NAMES.get(code)
    if names is None:
        import dis
        found = []
        stack = [code]
        while stack:
            c = stack.pop()
            found += [ins.argval for ins in dis.get_instructions(c) if ins.opname == "LOAD_GLOBAL"]
            stack += [k for k in c.co_consts if hasattr(k, "co_code")]
        names = _GLOBAL_NAMES[code] = tuple(dict.fromkeys(found))
    return names


def _refused_global(value) -> bool:
    """What Triton's code generator refuses to read from a kernel's globals: plain Python and
    torch/numpy values (it takes constexprs, dtypes, functions, classes and modules)."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return False  # a namedtuple: Triton takes it
    if isinstance(value, (bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset)):
        return True
    return type(value).__module__.split(".")[0] in ("torch", "numpy") and not callable(value)


def check_globals(jit_fn, _seen=None) -> None:
    """Raise the ``NameError`` a GPU's Triton compiler raises for a global that is not a
    ``tl.constexpr``, in ``jit_fn`` or any ``@triton.jit`` function it reaches."""
    if os.environ.get("TRITON_ALLOW_NON_CONSTEXPR_GLOBALS", "0") == "1":
        return
    seen = set() if _seen is None else _seen
    fn = getattr(jit_fn, "fn", jit_fn)   # a @triton.jit function, or the Python function it wraps
    if id(fn) in seen or not hasattr(fn, "__code__"):
        return
    seen.add(id(fn))
    scope = fn.__globals__
    for name in _global_names(fn.__code__):
        if name not in scope:
            continue
        value = scope[name]
        if _refused_global(value):
            shown = repr(value) if len(repr(value)) <= 40 else type(value).__name__
            raise NameError(
                f"Cannot access global variable {name} from within @jit'ed function {fn.__name__}: a GPU's Triton "
                f"compiler refuses it (the interpreter alone would run it). Kernels can only read globals made "
                f"with tl.constexpr: write `{name} = tl.constexpr({shown})`, or pass it as a tl.constexpr argument.")
        if hasattr(value, "fn") and hasattr(value, "run"):   # another @triton.jit function
            check_globals(value, seen)


def _patch_bf16_arithmetic(B, interp, tl, tensor_core):
    """bfloat16 is kept as raw uint16 bits in the interpreter, and its builder's arithmetic ran
    NumPy on those bits. Each float operation with a bfloat16 operand now widens (exactly) to
    float32, computes, and rounds a float result back to bfloat16 bits, as an sm_90 GPU's bf16
    instructions round each result once."""
    import numpy as np

    def wide(h):
        return tensor_core.bf16_bits_to_f32(h.data) if h.dtype.scalar == tl.bfloat16 else h.data

    def narrow(out, like):
        if out.dtype == np.bool_:
            return interp.TensorHandle(out, tl.int1)
        return interp.TensorHandle(tensor_core.f32_to_bf16_bits(out), like.dtype.scalar)

    def is_bf16(*hs):
        return any(h.dtype.scalar == tl.bfloat16 for h in hs)

    original_binary, original_unary, original_fma = B.binary_op, B.unary_op, B.create_fma

    def binary_op(self, lhs, rhs, op):
        if not is_bf16(lhs, rhs):
            return original_binary(self, lhs, rhs, op)
        with np.errstate(all="ignore"):
            return narrow(np.asarray(op(wide(lhs), wide(rhs))), lhs if lhs.dtype.scalar == tl.bfloat16 else rhs)

    def unary_op(self, arg, op):
        if not is_bf16(arg):
            return original_unary(self, arg, op)
        with np.errstate(all="ignore"):
            return narrow(np.asarray(op(wide(arg)), dtype=np.float32), arg)

    def create_fma(self, x, y, z):
        if not is_bf16(x, y, z):
            return original_fma(self, x, y, z)
        product = np.multiply(wide(x), wide(y), dtype=np.float64)
        return narrow(np.add(product, wide(z), dtype=np.float64).astype(np.float32), z)

    def create_rsqrt(self, arg):
        if not is_bf16(arg):
            return interp.TensorHandle(1 / np.sqrt(arg.data), arg.dtype.scalar)
        return narrow((1 / np.sqrt(wide(arg))).astype(np.float32), arg)

    B.binary_op, B.unary_op, B.create_fma, B.create_rsqrt = binary_op, unary_op, create_fma, create_rsqrt
    # the lambdas of the class (create_fadd, create_exp, ...) call self.binary_op / self.unary_op,
    # so they pick these up; fneg went through np.negative on the bits: now through unary_op too
    B.create_fneg = lambda self, arg: self.unary_op(arg, np.negative)


def _patch_libdevice(interp, np_dtype) -> None:
    """libdevice calls computed by ``libdevice.py`` (the interpreter raised on every one)."""
    import triton.language as tl
    try:
        from triton.language.extra import libdevice as generic
        from triton.language.extra.cuda import libdevice as nvidia
    except ImportError:  # a Triton built without the CUDA backend: nothing to patch
        return
    from .. import libdevice

    def create_extern_elementwise(self, lib_name, lib_path, symbol, args, ret_type, is_pure):
        scalar = getattr(ret_type, "scalar", ret_type)  # a block's type names its elements' type
        data = libdevice.evaluate(symbol, [a.data for a in args], np_dtype(scalar))
        return interp.TensorHandle(data, scalar)

    interp.InterpreterBuilder.create_extern_elementwise = create_extern_elementwise

    def refused(name):
        def call(*args, **kwargs):
            raise AttributeError(
                f"libdevice.{name} is not in NVIDIA's libdevice (triton.language.extra.cuda.libdevice), "
                "so a GPU's Triton compiler refuses it too")
        return call

    original_patch_lang = interp._patch_lang

    def patch_lang(fn):
        # The interpreter patches the language again at every call of a device function
        # (tl.max, tl.sum, ...: about a millisecond each, in every iteration of a loop), though
        # the launch patched the same modules already: within one launch, once per set of them.
        launch = _launch[0]
        if launch is not None:
            langs = tuple(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
            if langs in launch.patched_langs:
                return interp._LangPatchScope()
            launch.patched_langs.add(langs)
        scope = original_patch_lang(fn)
        # On a GPU, Triton's compiler sends the generic module's calls to the backend's
        # module; here the generic names point at NVIDIA's functions, given the
        # interpreter's semantic as triton.language's builtins are. A device function
        # patches again inside a launch: the functions are then patched already.
        builtins = [(n, m) for n, m in inspect.getmembers(nvidia) if tl.core.is_builtin(m)]
        for name, member in builtins:
            interp._patch_attr(nvidia, name, member, interp.interpreter_builder, scope)
        if builtins:
            for name, member in inspect.getmembers(generic, inspect.isfunction):
                if not name.startswith("_"):
                    scope.set_attr(generic, name, getattr(nvidia, name, None) or refused(name))
        return scope

    interp._patch_lang = patch_lang


# ---------------------------------------------------------------------------------------
# Patching the interpreter.
# ---------------------------------------------------------------------------------------
@patch_once("TRITON_INTERPRET")
def apply() -> bool:
    """Patch Triton's interpreter (idempotent); does nothing on a GPU."""
    try:
        import numpy as np

        import triton.language as tl
        from triton.runtime import interpreter as interp
        from triton.runtime.driver import driver
    except ImportError:  # a Triton without the interpreter this module knows
        return False
    # The course's own modules are imported outside that try: an error in them must show,
    # not silently switch every interpreter patch off.
    from . import tensor_core
    B = interp.InterpreterBuilder
    np_dtype = interp._get_np_dtype
    import triton.language as tl
    _XCHG_BITS = {4: (np.int32, tl.int32), 8: (np.int64, tl.int64)}

    original_load = B.create_masked_load
    original_store = B.create_masked_store
    original_rmw = B.create_atomic_rmw
    original_cas = B.create_atomic_cas

    # The trailing arguments (cache and eviction policies, volatility) differ between Triton
    # releases, so they are passed on untouched.
    def create_masked_load(self, ptrs, mask, other, *rest, **kw):
        if other is None:
            dtype_tt = ptrs.get_element_ty()
            other = interp.TensorHandle(_poison(np_dtype(dtype_tt), ptrs.data.shape), dtype_tt)
        _check_bounds(self, ptrs, mask, "load")
        _record(self, ptrs, mask, "load")
        _profile(self, ptrs, mask, "load")
        return original_load(self, ptrs, mask, other, *rest, **kw)

    def create_masked_store(self, ptrs, value, mask, *rest, **kw):
        _check_bounds(self, ptrs, mask, "store")
        _record(self, ptrs, mask, "store")
        _profile(self, ptrs, mask, "store")
        return original_store(self, ptrs, value, mask, *rest, **kw)

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, *rest, **kw):
        _check_bounds(self, ptr, mask, "atomic")
        _record(self, ptr, mask, "atomic")
        _profile(self, ptr, mask, "atomic")
        if rmwOp == interp._ir.ATOMIC_OP.XCHG and val.data.dtype.kind == "f" and val.data.dtype.itemsize in _XCHG_BITS:
            # tl.atomic_xchg of floats, which a GPU exchanges as bits: the interpreter's C++ side
            # takes integers only, so the float's bits go through as an integer of its width.
            np_int, tl_int = _XCHG_BITS[val.data.dtype.itemsize]
            bits = interp.TensorHandle(val.data.view(np_int), tl_int)
            old = original_rmw(self, rmwOp, ptr, bits, mask, *rest, **kw)
            return interp.TensorHandle(old.data.view(val.data.dtype), val.dtype.scalar)
        return original_rmw(self, rmwOp, ptr, val, mask, *rest, **kw)

    def create_atomic_cas(self, ptr, cmp, val, *rest, **kw):
        _check_bounds(self, ptr, None, "atomic_cas")
        _record(self, ptr, None, "atomic_cas")
        _profile(self, ptr, None, "atomic")
        return original_cas(self, ptr, cmp, val, *rest, **kw)

    B.create_masked_load = create_masked_load
    B.create_masked_store = create_masked_store
    B.create_atomic_rmw = create_atomic_rmw
    B.create_atomic_cas = create_atomic_cas
    TRITON_SIM_PATCHES.append(
        "tl.load with a mask and no `other`: masked-off lanes read NaN (ints: the type's "
        "most negative value), not 0")

    original_dot = B.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        # float32 x float32 runs on the tensor cores of an H100 unless input_precision="ieee":
        # the inputs are read as TF32 (see tensor_core.py). The interpreter computed
        # every precision exactly, so a kernel right only in float32 passed here.
        if a.dtype.scalar == tl.float32 and b.dtype.scalar == tl.float32:
            precision = getattr(input_precision, "name", None) or "ieee"
            return interp.TensorHandle(
                tensor_core.f32_dot(a.data, b.data, d.data, precision), d.dtype.scalar)
        # bfloat16 is stored as raw uint16 bits in the interpreter: widen it (exactly) to
        # float32 first, or np.matmul multiplies the bit patterns as integers.
        if tl.bfloat16 not in (a.dtype.scalar, b.dtype.scalar):
            return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        a_data, b_data = (tensor_core.bf16_bits_to_f32(h.data) if h.dtype.scalar == tl.bfloat16
                          else h.data for h in (a, b))
        return interp.TensorHandle(np.matmul(a_data, b_data, dtype=d.data.dtype) + d.data,
                                   d.dtype.scalar)

    B.create_dot = create_dot

    _patch_bf16_arithmetic(B, interp, tl, tensor_core)
    TRITON_SIM_PATCHES.append(
        "arithmetic, comparisons and math functions on bfloat16 compute on the values (widened to "
        "float32, the result rounded to nearest even), where the interpreter computed on the raw "
        "uint16 bits: 1.0 + 1.0 gave a number near 3e38")

    original_cast = B.cast_impl

    def cast_impl(self, src, dst_type):
        # The interpreter truncated float32 -> bfloat16 (a GPU rounds to nearest even) and
        # converted bfloat16 <-> float64 or integers as if the raw bits were integers.
        src_bf16 = src.dtype.scalar == tl.bfloat16
        dst_bf16 = dst_type.scalar == tl.bfloat16
        if src_bf16 == dst_bf16:
            return original_cast(self, src, dst_type)
        dst_np = np_dtype(dst_type)
        data = tensor_core.cast_bf16(src.data, src_bf16, dst_np)
        return interp.TensorHandle(data.astype(dst_np, copy=False), dst_type.scalar)

    B.cast_impl = cast_impl
    TRITON_SIM_PATCHES.append(
        "tl.dot on bfloat16: the inputs are widened to float32 (the interpreter multiplied "
        "their raw bits); casts to bfloat16 round to nearest even, and bfloat16 <-> "
        "float64 or integer casts convert values, not bits")
    TRITON_SIM_PATCHES.append(
        "tl.dot on float32 follows input_precision as an H100 does: 'tf32' (the default, "
        "TRITON_F32_DEFAULT or allow_tf32 aside) reads the inputs as TF32, 'tf32x3' sums "
        "three TF32 products, 'ieee' is exact float32")

    _patch_libdevice(interp, np_dtype)
    TRITON_SIM_PATCHES.append(
        "libdevice (triton.language.extra.libdevice, tl.extra.cuda.libdevice): every __nv_* "
        "function but jn/yn computed as a GPU computes it (runtime/backends/libdevice.py), where the interpreter "
        "failed on each call")

    original_call = interp.GridExecutor.__call__

    def __call__(self, *args_dev, **kwargs):
        if _launch[0] is None:  # a launch, not a device function called from one
            check_globals(self.fn)
        if _launch[0] is not None:
            return original_call(self, *args_dev, **kwargs)
        tensors, storages = _tensor_args(self.fn, args_dev, kwargs)
        _launch[0] = _Launch(getattr(self.fn, "__name__", "kernel"), tensors,
                             storages if RACECHECK else [], _extents(self.fn, args_dev, kwargs))
        try:
            return original_call(self, *args_dev, **kwargs)
        except interp.InterpreterError as e:
            # Raise the report itself, not the interpreter's repr() of it.
            if isinstance(e.__cause__, (SimulatorRaceError, SimulatorMemoryError)):
                raise e.__cause__.with_traceback(None) from None
            raise
        finally:
            _launch[0] = None

    __call__.__wrapped__ = original_call
    interp.GridExecutor.__call__ = __call__
    # The interpreter's own warmup() (inherited) compiles nothing and returns None.
    interp.InterpretedFunction.warmup = _warmup
    TRITON_SIM_PATCHES.append(
        "globals: a kernel that reads a module-level value that is not a tl.constexpr raises "
        "the NameError a GPU's Triton compiler raises")
    if RACECHECK:
        TRITON_SIM_PATCHES.append(
            "race detection: two programs of one launch touching one element, one of them "
            "with a plain tl.store, raise SimulatorRaceError (COURSE_RACECHECK=0 turns it off)")

    # Also where a GPU build of Triton finds a driver (COURSE_SIMULATE=1 on a GPU machine):
    # in simulation the course's device is the CPU.
    driver.set_active(_SimDriver())
    TRITON_SIM_PATCHES.append(
            "triton.runtime.driver.active: get_active_torch_device() is utils.DEVICE, "
        "device properties are an H100's, triton.autotune uses the first config "
        "untimed; kernel.warmup(...) gives placeholder register and shared-memory "
        "figures")
    return True


def is_applied() -> bool:
    return apply.applied


apply()
