"""Graders: check a learner's kernel and explain what is wrong, in words.

    utils.check_relu(relu_triton)          # prints one line, or raises GradingError

Each grader takes ``fn``, a launcher that takes contiguous float32 tensors on
``utils.DEVICE`` and returns its result, and on every call:

* draws fresh random inputs (a new seed each call; a failure names it, and
  ``check_xxx(fn, seed=...)`` repeats the same inputs) of awkward sizes from
  ``utils.SIZES.grader_sizes`` / ``grader_shapes``: 1, 7, 1023, 1025, 2^k+1, ...;
* puts every input inside a larger buffer whose extra elements hold NaN, so a read
  past the end turns the result into NaN instead of a plausible number;
* while ``fn`` runs, makes ``torch.empty``, ``torch.empty_like``, ``torch.empty_strided``
  and ``Tensor.new_empty`` hand out tensors filled with a recognisable NaN and
  surrounded by guard elements: afterwards, elements still holding that NaN were
  never written, and changed guard elements were written past an end;
* runs ``fn`` a second time (in simulation, CUDA C++ kernels under the emulator's random
  thread order) and compares: a result that changes between runs is a race;
* compares with a float64 reference using ``utils.TOLERANCES``, and names the wrong
  elements as index ranges, with a hint about the usual cause.

A stub that raises ``NotImplementedError`` is reported as "not solved yet".
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import struct

import torch

from . import check as _check
from .config import DEVICE, SIMULATE, SIZES

__all__ = [
    "GradingError",
    "show_rejection",
    "check_add",
    "check_add_2d",
    "check_relu",
    "check_relu_2d",
    "check_relu_backward",
    "check_gelu",
    "check_sum",
    "check_row_max",
    "check_softmax",
    "gelu_tanh_ref",
    "POISON_BITS",
]


class GradingError(AssertionError):
    """A kernel gave a wrong result; the message says where and what usually causes it."""


# --------------------------------------------------------------------------------------
# Poisoned, guarded memory
# --------------------------------------------------------------------------------------
#: float32 bit pattern of the NaN that fresh outputs are filled with ("never written").
POISON_BITS = 0x7FF0DEAD
#: float32 bit pattern of the NaN around the grader's inputs ("read past the end").
INPUT_GUARD_BITS = 0x7FF1BAD0
#: Guard elements before and after each buffer: wider than any sensible block, so an
#: unmasked tail block writes into the guard, never into someone else's memory.
GUARD = 16384

_ORIG = dict(
    empty=torch.empty,
    empty_like=torch.empty_like,
    empty_strided=torch.empty_strided,
    new_empty=torch.Tensor.new_empty,
)


def _poison_fill(t: torch.Tensor, bits: int) -> None:
    """Fill ``t`` with a NaN of the given float32 bit pattern (any NaN for other floats)."""
    if t.numel() == 0:
        return
    if t.dtype == torch.float32:
        t.view(torch.int32).fill_(bits)
    elif t.dtype.is_floating_point:
        t.fill_(float("nan"))
    elif t.dtype in (torch.int32, torch.int64, torch.int16):
        t.fill_(0x5A5A)  # a recognisable garbage value: uninitialised counters are a bug
    # bool / uint8: left as they are


def _is_poison(t: torch.Tensor, bits: int) -> torch.Tensor:
    if t.dtype == torch.float32:
        return t.view(torch.int32) == bits
    if t.dtype.is_floating_point:
        return torch.isnan(t)
    if t.dtype in (torch.int32, torch.int64, torch.int16):
        return t == 0x5A5A
    return torch.zeros(t.shape, dtype=torch.bool, device=t.device)


class _Guarded:
    """A tensor that is a view into the middle of a larger, poisoned buffer."""

    def __init__(self, shape, dtype, device, bits, how):
        shape = tuple(int(s) for s in shape)
        self.numel = math.prod(shape)
        self.buf = _ORIG["empty"](self.numel + 2 * GUARD, dtype=dtype, device=device)
        _poison_fill(self.buf, bits)
        self.bits = bits
        self.how = how
        self.view = self.buf[GUARD:GUARD + self.numel].view(shape)

    def written_before(self) -> int:
        return int((~_is_poison(self.buf[:GUARD], self.bits)).sum())

    def written_after(self) -> int:
        return int((~_is_poison(self.buf[GUARD + self.numel:], self.bits)).sum())

    def first_written_after(self) -> int:
        m = ~_is_poison(self.buf[GUARD + self.numel:], self.bits)
        idx = torch.nonzero(m)
        return int(idx[-1]) + 1 if idx.numel() else 0

    def never_written(self) -> torch.Tensor:
        return _is_poison(self.view, self.bits)


_SUPPORTED = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


class _Allocations:
    """While active, fresh torch tensors are poisoned and guarded; all are remembered."""

    def __init__(self):
        self.records: list[_Guarded] = []

    def _wrap(self, t: torch.Tensor, how: str) -> torch.Tensor:
        if (not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.requires_grad
                or t.device.type == "meta" or t.numel() == 0):
            return t
        if t.dtype in _SUPPORTED and t.is_contiguous():
            g = _Guarded(t.shape, t.dtype, t.device, POISON_BITS, how)
            self.records.append(g)
            return g.view
        _poison_fill(t, POISON_BITS)
        return t

    @contextlib.contextmanager
    def active(self):
        def empty(*args, **kwargs):
            if kwargs.get("out") is not None:
                return _ORIG["empty"](*args, **kwargs)
            return self._wrap(_ORIG["empty"](*args, **kwargs), "torch.empty")

        def empty_like(*args, **kwargs):
            return self._wrap(_ORIG["empty_like"](*args, **kwargs), "torch.empty_like")

        def empty_strided(*args, **kwargs):
            return self._wrap(_ORIG["empty_strided"](*args, **kwargs), "torch.empty_strided")

        def new_empty(self_t, *args, **kwargs):
            return self._wrap(_ORIG["new_empty"](self_t, *args, **kwargs), "Tensor.new_empty")

        torch.empty, torch.empty_like, torch.empty_strided = empty, empty_like, empty_strided
        torch.Tensor.new_empty = new_empty
        try:
            yield self
        finally:
            torch.empty = _ORIG["empty"]
            torch.empty_like = _ORIG["empty_like"]
            torch.empty_strided = _ORIG["empty_strided"]
            torch.Tensor.new_empty = _ORIG["new_empty"]

    def find(self, t) -> _Guarded | None:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return None
        for g in self.records:
            if (g.view.data_ptr() == t.data_ptr() and g.numel == t.numel() and g.view.dtype == t.dtype
                    and t.is_contiguous()):
                return g
        return None


def _poison_allocator(numel: int) -> None:
    """Best effort for outputs allocated in C++ (``torch::empty`` in an extension), which
    the Python-level patches cannot reach: fill a block of the output's size with the
    poison and free it. Allocators (torch's CUDA caching allocator above all) tend to hand
    the same block to the next request of that size, so unwritten elements show the poison."""
    if numel <= 0:
        return
    block = _ORIG["empty"](numel, dtype=torch.float32, device=DEVICE)
    _poison_fill(block, POISON_BITS)
    del block


def _guarded_input(values: torch.Tensor) -> tuple[torch.Tensor, _Guarded]:
    """``values`` copied to ``DEVICE`` into the middle of a NaN-guarded buffer."""
    g = _Guarded(values.shape, torch.float32, DEVICE, INPUT_GUARD_BITS, "input")
    g.view.copy_(values.to(torch.float32))
    g.orig = values.to(torch.float32).contiguous()
    return g.view, g


# --------------------------------------------------------------------------------------
# Running fn
# --------------------------------------------------------------------------------------
def _fresh_seed() -> int:
    return struct.unpack("<I", os.urandom(4))[0] % 1_000_000


def _sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _utils_attr(name):
    import utils  # the package is fully imported by the time a grader runs
    return getattr(utils, name, None)


def _fault_hint(msg: str) -> str:
    low = msg.lower()
    if "data race on" in low:  # the emulator's race report names both accesses and the fix
        return "two threads touch the same element without synchronization: the report above says where and how to fix it."
    if "third launch parameter" in low:
        return ("extern __shared__ memory is as large as the launch says, in bytes: "
                "k[grid, block, n_elements * 4](...) for n_elements floats.")
    if "__shared__ array" in low:
        return ("a thread wrote outside a __shared__ array: its size is fixed when the kernel is compiled "
                "(BLOCK), so every index into it (threadIdx.x, t + stride) must stay below BLOCK, and the "
                "kernel must be launched with at most BLOCK threads per block.")
    if any(w in low for w in ("out of bounds", "out-of-bounds", "past the end", "before the start",
                              "out of range", "index")):
        return "a thread read or wrote outside a tensor: is every access guarded by the bounds check (idx < n)?"
    if any(w in low for w in ("syncthreads", "barrier", "diverg", "deadlock")):
        return ("not every thread of the block reached the same __syncthreads(): keep barriers outside "
                "`if (idx < n)` and make every thread run the same number of loop iterations around them.")
    if "segmentation" in low or "crash" in low or "signal" in low:
        return "the kernel crashed: usually a pointer used past the end of its tensor."
    return "read the message above: it names the kernel and what went wrong."


class _Case:
    """One input set: its label, input values (CPU), the float64 reference and how to build inputs."""

    def __init__(self, label, values, expected, make=None, extra=None):
        self.label = label
        self.values = values            # tuple of CPU float32 tensors
        self.expected = expected        # CPU float64 tensor
        self.make = make                # optional: () -> (inputs, guards) for special layouts
        self.extra = extra or {}
        self.numel = expected.numel() if expected.dim() else values[0].numel()


class _Run:
    def __init__(self, out, inputs, in_guards, allocs):
        self.out = out
        self.inputs = inputs
        self.in_guards = in_guards
        self.allocs = allocs


class _Grader:
    def __init__(self, name, fn, seed):
        if not callable(fn):
            raise TypeError(f"{name} expects a function (your launcher), got {type(fn).__name__}")
        self.name = name
        self.fn = fn
        self.user_seed = seed
        self.seed = _fresh_seed() if seed is None else int(seed)
        self.gen = torch.Generator().manual_seed(self.seed)
        self.case = None

    # -- failure -----------------------------------------------------------------------
    def fail(self, what: str, hint: str | None = None, cause=None):
        where = f" on {self.case.label}" if self.case is not None else ""
        text = f"{self.name} failed{where}:\n{what}"
        if hint:
            text += f"\nHint: {hint}"
        text += f"\n(Inputs came from seed {self.seed}: {self.name}(fn, seed={self.seed}) repeats them.)"
        err = GradingError(text)
        if cause is not None:
            raise err from cause
        raise err

    # -- one call of fn ------------------------------------------------------------------
    def call(self, case: _Case, schedule_seed=None) -> _Run:
        if case.make is not None:
            inputs, in_guards = case.make()
        else:
            pairs = [_guarded_input(v) for v in case.values]
            inputs = tuple(p[0] for p in pairs)
            in_guards = [p[1] for p in pairs]
        allocs = _Allocations()
        _poison_allocator(case.expected.numel())
        sched = _utils_attr("emulation_schedule") if schedule_seed is not None else None
        ctx = sched("random", seed=schedule_seed) if sched is not None else contextlib.nullcontext()
        fault_cls = _utils_attr("KernelFault")
        try:
            with ctx, allocs.active():
                out = self.fn(*inputs)
                _sync()
        except NotImplementedError as e:
            msg = str(e) or "the function raises NotImplementedError"
            if "not solved yet" not in msg:
                msg = f"not solved yet: {msg}"
            raise GradingError(msg) from None
        except GradingError:
            raise
        except Exception as e:  # noqa: BLE001  every failure of fn becomes a diagnosis
            # A stub raised inside a kernel reaches us wrapped: Triton's interpreter wraps it in
            # an InterpreterError, a GPU compile turns it into a CompilationError.
            text = f"{e}\n{e.__cause__ or ''}"
            stub = re.search(r"not solved yet[^'\"\n]*", text)
            if stub:
                raise GradingError(stub.group(0).rstrip()) from None
            if fault_cls is not None and isinstance(e, fault_cls):
                self.fail(f"the kernel faulted: {e}", _fault_hint(str(e)), cause=e)
            if isinstance(e, IndexError):
                self.fail(f"{type(e).__name__}: {e}", _fault_hint("index out of range"), cause=e)
            self.fail(f"your function raised {type(e).__name__}: {e}",
                      "the inputs are float32 tensors on utils.DEVICE; the traceback above "
                      "shows where it failed.", cause=e)
        return _Run(out, inputs, in_guards, allocs)

    # -- checks on one run -----------------------------------------------------------------
    def output_tensor(self, run: _Run, shape, *, scalar=False, dtypes=(torch.float32,)) -> torch.Tensor:
        out = run.out
        if out is None:
            self.fail("your function returned None: return the output tensor.")
        if isinstance(out, (tuple, list)) and len(out) == 1:
            out = out[0]
        if not isinstance(out, torch.Tensor):
            if scalar and isinstance(out, (int, float)):
                out = torch.tensor(float(out), dtype=torch.float64, device=DEVICE)
            elif hasattr(out, "__array__") or hasattr(out, "__cuda_array_interface__") or hasattr(out, "copy_to_host"):
                try:
                    out = torch.as_tensor(out.copy_to_host() if SIMULATE and hasattr(out, "copy_to_host") else out,
                                          device=DEVICE)
                except Exception:  # noqa: BLE001
                    self.fail(f"your function returned a {type(out).__name__}: return a torch tensor "
                              "(utils.from_numba turns a Numba array into one).")
            else:
                self.fail(f"your function returned a {type(out).__name__}, not a torch tensor.")
        if out.device.type != DEVICE.type:
            self.fail(f"the result is on {out.device}, but the course runs on {DEVICE}: "
                      "create the output on the input's device (torch.empty_like(x)).")
        if scalar:
            if out.numel() != 1:
                self.fail(f"the result has shape {tuple(out.shape)}: a sum is one number "
                          "(a 0-d tensor or a tensor of shape (1,)).")
            dtypes = dtypes + (torch.float64,)
        elif tuple(out.shape) != tuple(shape):
            hint = None
            if out.numel() == math.prod(shape):
                hint = f"the number of elements is right: reshape the output to {tuple(shape)} (out.view(x.shape))."
            self.fail(f"the result has shape {tuple(out.shape)}, expected {tuple(shape)}.", hint)
        if out.dtype not in dtypes:
            self.fail(f"the result has dtype {out.dtype}, expected {dtypes[0]}.",
                      "allocate the output with the input's dtype (torch.empty_like(x)).")
        return out

    def check_guards(self, run: _Run, out: torch.Tensor, *, out_noun="output"):
        for g in run.allocs.records:
            is_out = g.view.data_ptr() == out.data_ptr()
            noun = f"the {out_noun}" if is_out else f"a temporary of shape {tuple(g.view.shape)} made with {g.how}"
            after, before = g.written_after(), g.written_before()
            if after:
                far = g.first_written_after()
                self.fail(f"wrote {after} element{'s' if after > 1 else ''} past the end of {noun} "
                          f"(up to {far} element{'s' if far > 1 else ''} beyond it).",
                          "is the last block masked (idx < n)? Threads of the tail block past n must not store.")
            if before:
                self.fail(f"wrote {before} element{'s' if before > 1 else ''} before the start of {noun}.",
                          "an index went negative: look for an off-by-one (i - 1) in the store's index.")
    def check_input_guards(self, run: _Run, names):
        for i, g in enumerate(run.in_guards):
            if g.written_after() or g.written_before():
                name = names[i] if i < len(names) else f"input {i}"
                self.fail(f"wrote outside input {name} (past its end or before its start).",
                          "is every store masked, and does it go to the output, not the input?")

    def check_inputs_unchanged(self, run: _Run, names):
        for i, g in enumerate(run.in_guards):
            now = g.view.detach().cpu().contiguous().view(torch.int32)
            if not torch.equal(now, g.orig.view(torch.int32)):
                name = names[i] if i < len(names) else f"input {i}"
                changed = int((now != g.orig.view(torch.int32)).sum())
                self.fail(f"your kernel changed its input {name} ({changed} element{'s' if changed > 1 else ''}).",
                          f"write the result into a new output tensor, not into {name} "
                          f"(for example out = torch.empty_like({name})).")

    def check_unwritten(self, run: _Run, out: torch.Tensor, hint_fn=None, case=None):
        g = run.allocs.find(out)
        if g is not None:
            mask = g.never_written().detach().cpu().reshape(out.shape)
        elif out.dtype == torch.float32:
            # not one of ours (made in C++, or by torch.zeros): the poison bit pattern can
            # only be there if the allocator reused a poisoned block and no one wrote it
            mask = (out.detach().contiguous().view(torch.int32) == POISON_BITS).cpu()
        else:
            return
        if bool(mask.any()):
            where = _check.describe_positions(mask) if mask.dim() else "the result"
            hint = hint_fn(case, mask) if hint_fn else None
            if hint is None:
                hint = ("is the grid large enough (cdiv(n, BLOCK) blocks), and is the last block launched? "
                        "Does every element get a thread?")
            one = int(mask.sum()) == 1
            self.fail(f"{where} {'was' if one else 'were'} never written "
                      f"({'it still holds' if one else 'they still hold'} the grader's NaN marker).", hint)


def _label_n(n):
    return f"an input of {n} element{'s' if n != 1 else ''}"


def _label_shape(shape):
    return f"a {shape[0]}x{shape[1]} input"


def _race_indices(cases) -> set[int]:
    """Which cases are run twice. On a GPU every one (cheap); in simulation one mid-size
    case with several blocks, since simulated threads are slow."""
    if not SIMULATE:
        return set(range(len(cases)))
    best = min(range(len(cases)), key=lambda i: (abs(cases[i].numel - 1024), -cases[i].numel))
    return {best}


def _same(a: torch.Tensor, b: torch.Tensor, atol, rtol) -> bool:
    return not bool(_check.mismatch_mask(a, b, atol=atol, rtol=rtol).any())


def _run_cases(g: _Grader, cases, *, names, shape_of, scalar=False, tol_of=None,
               unwritten_hint=None, diagnose=None, dtypes=(torch.float32,)):
    """The common loop: run, check structure, guards, races, unwritten, inputs, values."""
    race = _race_indices(cases)
    # a mid-size case first: several blocks and a tail, so the first failure has a telling pattern
    first = min(range(len(cases)), key=lambda i: (abs(cases[i].numel - 1024), -cases[i].numel))
    order = [first] + [i for i in range(len(cases)) if i != first]
    worst = 0.0
    for i in order:
        case = cases[i]
        g.case = case
        run = g.call(case)
        out = g.output_tensor(run, shape_of(case), scalar=scalar, dtypes=dtypes)
        g.check_guards(run, out)
        g.check_input_guards(run, names)
        tol = tol_of(case) if tol_of else _check.tolerance(torch.float32)
        got = out.detach().to("cpu", torch.float64).reshape(case.expected.shape)
        g.check_unwritten(run, out, unwritten_hint or _tail_hint, case)
        if i in race:
            run2 = g.call(case, schedule_seed=g.seed + i)
            out2 = g.output_tensor(run2, shape_of(case), scalar=scalar, dtypes=dtypes)
            got2 = out2.detach().to("cpu", torch.float64).reshape(case.expected.shape)
            if not _same(got, got2, tol["atol"], tol["rtol"]):
                diff = _check.mismatch_mask(got, got2, atol=tol["atol"], rtol=tol["rtol"])
                where = f"{_check.describe_positions(diff)} differ" if diff.dim() else "the result differs"
                first = torch.nonzero(diff)[0].tolist() if diff.dim() else []
                pos = tuple(first)
                g.fail(f"the result changes between runs: a race? {where} between two runs on the "
                       f"same input (first run {float(got[pos]):.7g}, second run {float(got2[pos]):.7g}; "
                       f"expected {float(case.expected[pos]):.7g}).",
                       "threads read shared memory that other threads write: is a __syncthreads() "
                       "(cuda.syncthreads()) missing between writing and reading it? Or several threads "
                       "update the same element without an atomic. (Elements that no thread writes also "
                       "change between runs: they hold whatever memory held before.)")
        g.check_inputs_unchanged(run, names)
        bad = _check.mismatch_mask(got, case.expected, **tol)
        if bool(bad.any()):
            hint = diagnose(case, got, bad) if diagnose else None
            msg = _check.describe_mismatch(got, case.expected, mask=bad, what="result", **tol)
            g.fail(msg, hint)
        worst = max(worst, _check.max_abs_err(got, case.expected))
    return worst


def _success(name, cases, worst, sizes_text):
    print(f"{name}: correct on {len(cases)} inputs ({sizes_text}), max error {worst:.3g}")


def _sizes_text(sizes):
    return f"sizes {min(sizes)} .. {max(sizes)}"


def _shapes_text(shapes):
    return "shapes " + ", ".join(f"{r}x{c}" for r, c in shapes)


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------
def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def _with_zeros(gen, x, frac=0.1):
    """Exact zeros (and negative zeros) in about ``frac`` of the places: the edge of ReLU."""
    m = torch.rand(x.shape, generator=gen) < frac
    x = x.clone()
    x[m] = 0.0
    neg = m & (torch.rand(x.shape, generator=gen) < 0.5)
    x[neg] = -0.0
    return x


def _sizes():
    return list(SIZES.grader_sizes)


def _shapes():
    return [tuple(s) for s in SIZES.grader_shapes]


# --------------------------------------------------------------------------------------
# Elementwise graders
# --------------------------------------------------------------------------------------
def _tail_hint(case, mask):
    """Hints for never-written elements of a 1-D result."""
    if mask.dim() != 1:
        return None
    n = mask.numel()
    r = _check.index_ranges(mask)
    if len(r) != 1 or r[0][1] != n - 1:
        return None
    start = r[0][0]
    if start == 0:
        return "nothing was written: is the kernel launched, with at least one block, on the output tensor?"
    if n - start < start:
        return ("only the last elements are missing: is the grid rounded up (cdiv(n, BLOCK) blocks, "
                "not n // BLOCK), so the tail block is launched?")
    return (f"only the first {start} elements were written: do all blocks work (the index needs "
            "blockIdx.x * blockDim.x + threadIdx.x), and is the grid large enough / is the last block launched?")


def _shift_hint(got, expected_fn):
    """A hint when the result looks like the right answer shifted by one element."""
    flat, exp = got.reshape(-1), expected_fn().reshape(-1)
    tol = _check.tolerance(torch.float32)
    bad = _check.mismatch_mask(flat, exp, **tol)
    if bool(bad[-1]) and int(bad.sum()) == 1:
        return ("only the last element is wrong: does it read one past the end (x[i + 1])? "
                "Past the end of the input the grader puts NaN.")
    if flat.numel() < 3:
        return None
    tol = _check.tolerance(torch.float32)
    inner = slice(1, -1)
    if _same(flat[:-1][inner], exp[1:][inner], **tol) or _same(flat[1:][inner], exp[:-1][inner], **tol):
        return "the result is the right answer shifted by one element: an off-by-one in the index (i + 1 or i - 1)?"
    return None


def check_add(fn, *, seed=None):
    """``fn(x, y)`` must return ``x + y`` for 1-D float32 tensors."""
    g = _Grader("check_add", fn, seed)
    sizes = _sizes()
    cases = []
    for n in sizes:
        x, y = _randn(g.gen, n), _randn(g.gen, n)
        cases.append(_Case(_label_n(n), (x, y), x.double() + y.double()))

    def diagnose(case, got, bad):
        x, y = (v.double() for v in case.values)
        if _same(got, 2 * x, **_check.tolerance(torch.float32)):
            return "the result is x + x: is y read from the right pointer?"
        return _shift_hint(got, lambda: case.expected)

    worst = _run_cases(g, cases, names=("x", "y"), shape_of=lambda c: c.expected.shape,
                       unwritten_hint=_tail_hint, diagnose=diagnose)
    _success("check_add", cases, worst, _sizes_text(sizes))


def _swap_hint_2d(case, mask):
    """Whole trailing columns (or rows) never written, in a non-square matrix: the grid's
    x and y were swapped, so one dimension is covered only up to the other's extent."""
    if mask.dim() != 2:
        return None
    rows, cols = mask.shape
    full_cols = mask.all(dim=0)
    full_rows = mask.all(dim=1)
    band_cols = bool(full_cols.any()) and bool((mask == full_cols.unsqueeze(0)).all())
    band_rows = bool(full_rows.any()) and bool((mask == full_rows.unsqueeze(1)).all())
    if rows != cols and (band_cols or band_rows):
        return ("whole columns (or rows) at the end were never written: rows and columns look swapped: "
                "did you use blockIdx.x for the row? x is the fastest-varying index and should give the "
                "column, with the grid sized (cdiv(cols, BLOCK_X), cdiv(rows, BLOCK_Y)).")
    return None


def _transposed_hint(got, expected):
    if expected.dim() != 2 or expected.shape[0] == expected.shape[1] or expected.numel() < 2:
        return None
    tol = _check.tolerance(torch.float32)
    if _same(got.reshape(-1), expected.t().reshape(-1), **tol):
        return ("rows and columns look swapped: did you use blockIdx.x for the row? The element at "
                "(row, col) lives at row * cols + col.")
    return None


def check_add_2d(fn, *, seed=None):
    """``fn(a, b)`` must return ``a + b`` for 2-D float32 matrices of awkward, non-square shapes."""
    g = _Grader("check_add_2d", fn, seed)
    shapes = _shapes()
    cases = []
    for s in shapes:
        a, b = _randn(g.gen, *s), _randn(g.gen, *s)
        cases.append(_Case(_label_shape(s), (a, b), a.double() + b.double()))

    def diagnose(case, got, bad):
        return _transposed_hint(got, case.expected) or _first_row_hint(bad)

    worst = _run_cases(g, cases, names=("a", "b"), shape_of=lambda c: c.expected.shape,
                       unwritten_hint=_swap_hint_2d, diagnose=diagnose)
    _success("check_add_2d", cases, worst, _shapes_text(shapes))


def _first_row_hint(bad):
    if bad.dim() != 2 or bad.shape[0] < 2:
        return None
    if not bool(bad[0].any()) and float(bad[1:].any(dim=1).float().mean()) > 0.5:
        return "the first row is right but the others are not: is the row stride used?"
    return None


def check_relu(fn, *, seed=None):
    """``fn(x)`` must return ``relu(x)`` (``max(x, 0)``) for a 1-D float32 tensor."""
    g = _Grader("check_relu", fn, seed)
    sizes = _sizes()
    cases = []
    for n in sizes:
        x = _with_zeros(g.gen, _randn(g.gen, n))
        cases.append(_Case(_label_n(n) + " (with negatives and exact zeros)", (x,), x.double().clamp_min(0)))

    def diagnose(case, got, bad):
        x = case.values[0].double()
        if _same(got, x, **_check.tolerance(torch.float32)):
            return "the result equals the input: negative values must become 0."
        if _same(got, x.abs(), **_check.tolerance(torch.float32)):
            return "the result is |x|: negative values must become 0, not positive."
        if bool((x[bad] < 0).all()):
            return "only negative inputs are wrong: relu(x) is 0 for x < 0 (fmaxf(x, 0.f))."
        return _shift_hint(got, lambda: case.expected)

    worst = _run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape,
                       unwritten_hint=_tail_hint, diagnose=diagnose)
    _success("check_relu", cases, worst, _sizes_text(sizes))


def check_relu_2d(fn, *, seed=None):
    """``fn(x)`` must return ``relu(x)`` for a 2-D strided view: ``x`` is a column slice of a
    wider matrix, so ``x.stride(0) > x.shape[1]`` (a pitched matrix). The result may be a
    new contiguous tensor of ``x``'s shape."""
    g = _Grader("check_relu_2d", fn, seed)
    shapes = _shapes()
    cases = []
    for rows, cols in shapes:
        pad, off = 5 + cols // 3, 2
        wide = _with_zeros(g.gen, _randn(g.gen, rows, cols + pad))
        x = wide[:, off:off + cols]

        def make(wide=wide, off=off, cols=cols):
            w, guard = _guarded_input(wide)
            return (w[:, off:off + cols],), [guard]
        c = _Case(_label_shape((rows, cols)) + f" (a column slice of a {rows}x{cols + pad} matrix, "
                  f"row stride {cols + pad})", (x,), x.double().clamp_min(0), make=make,
                  extra=dict(wide=wide, off=off))
        cases.append(c)

    def diagnose(case, got, bad):
        rows, cols = case.expected.shape
        flat = case.extra["wide"].reshape(-1)[case.extra["off"]:case.extra["off"] + rows * cols]
        nostride = flat.double().clamp_min(0).reshape(rows, cols)
        if rows > 1 and _same(got, nostride, **_check.tolerance(torch.float32)):
            return ("the first row is right but the others are not: is the row stride used? "
                    f"Row r starts at x + r * x.stride(0) ({cols + 5 + cols // 3} here), not x + r * cols.")
        return _first_row_hint(bad) or _transposed_hint(got, case.expected)

    worst = _run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape,
                       unwritten_hint=_swap_hint_2d, diagnose=diagnose)
    _success("check_relu_2d", cases, worst, _shapes_text(shapes))


def check_relu_backward(fn, *, seed=None):
    """``fn(grad_out, x)`` must return ``grad_out * (x > 0)`` (the gradient is 0 at x == 0)."""
    g = _Grader("check_relu_backward", fn, seed)
    sizes = _sizes()
    cases = []
    for n in sizes:
        go = _randn(g.gen, n)
        x = _with_zeros(g.gen, _randn(g.gen, n), frac=0.2)
        cases.append(_Case(_label_n(n) + " (x with exact zeros)", (go, x),
                           go.double() * (x.double() > 0).double()))

    def diagnose(case, got, bad):
        go, x = (v.double() for v in case.values)
        tol = _check.tolerance(torch.float32)
        if _same(got, go * (x >= 0).double(), **tol):
            return "at x == 0 the result must be 0: use x > 0, not x >= 0 (as torch does)."
        if _same(got, x.clamp_min(0), **tol) or _same(got, (x > 0).double(), **tol):
            return "the result ignores grad_out: the gradient is grad_out where x > 0, else 0."
        if _same(got, go * (go > 0).double(), **tol):
            return "the mask comes from grad_out: it must come from x (the forward input)."
        return _shift_hint(got, lambda: case.expected)

    worst = _run_cases(g, cases, names=("grad_out", "x"), shape_of=lambda c: c.expected.shape,
                       diagnose=diagnose)
    _success("check_relu_backward", cases, worst, _sizes_text(sizes))


def gelu_tanh_ref(x: torch.Tensor) -> torch.Tensor:
    """The tanh-approximation GELU of the lesson, in float64: 0.5 x (1 + tanh(0.79788456 (x + 0.044715 x^3)))."""
    x = x.double()
    return 0.5 * x * (1.0 + torch.tanh(0.79788456 * (x + 0.044715 * x * x * x)))


def check_gelu(fn, *, seed=None):
    """``fn(x)`` must return the tanh-approximation GELU of ``x`` (see ``gelu_tanh_ref``).

    Inputs stay within |x| <= 9, where ``tanh(u) = (exp(2u) - 1) / (exp(2u) + 1)`` is still
    finite in float32, so every usual way of writing tanh is accepted.
    """
    g = _Grader("check_gelu", fn, seed)
    sizes = _sizes()
    cases = []
    for n in sizes:
        x = (_randn(g.gen, n) * 2.5).clamp_(-9.0, 9.0)
        x = _with_zeros(g.gen, x, frac=0.02)
        cases.append(_Case(_label_n(n), (x,), gelu_tanh_ref(x)))

    def diagnose(case, got, bad):
        x = case.values[0].double()
        tol = _check.tolerance(torch.float32)
        erf = torch.nn.functional.gelu(x)
        if _check.max_abs_err(got, erf) < _check.max_abs_err(got, case.expected) or _same(got, erf, **tol):
            return ("this looks like the erf GELU (torch.nn.functional.gelu default); the lesson asks for the "
                    "tanh approximation: 0.5 * x * (1 + tanh(0.79788456 * (x + 0.044715 * x^3))).")
        if _same(got, x.clamp_min(0), **tol):
            return "the result is relu(x), not GELU."
        if bool(torch.isnan(got[bad]).any()) and bool((x[bad].abs() > 4).all()):
            return "NaN for large |x|: exp overflows; write tanh(u) as 1 - 2 / (exp(2u) + 1)."
        return _shift_hint(got, lambda: case.expected) or (
            "check the constants (0.79788456, 0.044715) and the x^3 term against the formula.")

    worst = _run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape, diagnose=diagnose)
    _success("check_gelu", cases, worst, _sizes_text(sizes))


# --------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------
def _exact_sum_values(gen, n):
    """Random values whose every partial sum is exact in float32 (multiples of a power of
    two, small enough that no partial sum reaches 2^24 units), none of them zero.

    So a right float32 sum in ANY order (tree, atomics, grid-stride, Kahan) gets the exact
    answer, while a sum that misses even one element is wrong by at least one unit.
    """
    units = max(2, min(1024, (2 ** 24 - 1) // max(n, 1)))
    scale = 2.0 ** math.floor(math.log2(4.0 / units))
    k = torch.randint(1, units + 1, (n,), generator=gen)
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1, 1)
    return (k * sign).to(torch.float32) * scale, scale


def check_sum(fn, *, seed=None):
    """``fn(x)`` must return the sum of a 1-D float32 tensor: a 0-d or 1-element tensor.

    The inputs are random multiples of a power of two whose partial sums are all exact in
    float32, so a right kernel (tree, atomics, any order) is exact and the tolerance can be
    tight: ``atol + rtol * |sum|`` of ``TOLERANCES[float32]``, never more than a quarter
    of the smallest input value, which is what missing one element would cost.
    """
    g = _Grader("check_sum", fn, seed)
    sizes = _sizes()
    cases = []
    for n in sizes:
        x, scale = _exact_sum_values(g.gen, n)
        c = _Case(_label_n(n), (x,), x.double().sum(), extra=dict(scale=scale))
        c.numel = n
        cases.append(c)

    def tol_of(case):
        t = _check.tolerance(torch.float32)
        allowed = min(t["atol"] + t["rtol"] * abs(float(case.expected)), case.extra["scale"] / 4)
        return dict(atol=allowed, rtol=0.0)

    def probe(values):
        """The learner's result on a diagnostic input, or None when that run fails."""
        c = _Case("probe", (values.to(torch.float32),), values.double().sum())
        try:
            run = g.call(c)
            return float(g.output_tensor(run, (), scalar=True).reshape(-1)[0])
        except GradingError:
            return None

    def cut_hint(n, k):
        if n - k < k:
            return (f"the result misses the last {n - k} element{'s' if n - k > 1 else ''}: is the grid "
                    "rounded up (cdiv(n, BLOCK)), and does the tail block load with a mask (0 past the end)?")
        return (f"the result is the sum of the first {k} elements only: only the first block's partial "
                "sum reaches the result. Add every block's partial sum (atomicAdd, or a second pass over "
                "the partial sums).")

    def diagnose(case, got, bad):
        x = case.values[0].double()
        n = x.numel()
        v = float(got.reshape(-1)[0])
        if math.isnan(v):
            return ("the sum is NaN, so the kernel used memory that nobody wrote: an accumulator made with "
                    "torch.empty (use torch.zeros for an atomicAdd target); x past its end (the grader puts "
                    "NaN there: is every load masked, idx < n?); or shared memory read before another thread "
                    "wrote it (is a __syncthreads() missing after filling it and after each tree step?).")
        near = case.extra["scale"] / 4
        if abs(v) <= near:
            return "the result is 0: nothing was added. Is the kernel launched with at least one block (cdiv(n, BLOCK))?"
        # Which elements reached the result? Partial sums of random data can coincide, so ask the
        # kernel itself: summing ones counts the elements it adds, and ones on a prefix (or a
        # suffix) say which ones.
        count = probe(torch.ones(n))
        if count is not None and count == round(count) and 0 < count < n:
            k = int(count)
            if probe(torch.cat([torch.ones(k), torch.zeros(n - k)])) == k:
                return cut_hint(n, k)
            if probe(torch.cat([torch.zeros(n - k), torch.ones(k)])) == k:
                t = n - k
                return f"the result misses the first {t} element{'s' if t > 1 else ''}: an off-by-one in the index?"
        if count is not None and count == round(count) and count > n:
            return (f"summing {n} ones gave {int(count)}: some elements are added more than once. Does each "
                    "thread (or each grid-stride step) start at its own index, and is each block's partial "
                    "sum added exactly once (by one thread)?")
        prefix = torch.cumsum(x, 0)[:-1]          # prefix[k-1] = sum of the first k elements
        hits = torch.nonzero((prefix - v).abs() <= near).reshape(-1)
        if hits.numel():
            ks = [int(h) + 1 for h in hits.tolist()]
            k = ks[-1]
            if n - k >= k:
                # a block size is the likely cut; other hits are partial sums that match by chance
                pow2 = [c for c in ks if c >= 32 and c & (c - 1) == 0]
                k = pow2[0] if pow2 else k
            return cut_hint(n, k)
        suffix = torch.flip(torch.cumsum(torch.flip(x, (0,)), 0), (0,))[1:]   # suffix[t-1] = sum of x[t:]
        hits = torch.nonzero((suffix - v).abs() <= near).reshape(-1)
        if hits.numel():
            t = int(hits[0]) + 1
            return f"the result misses the first {t} element{'s' if t > 1 else ''}: an off-by-one in the index?"
        return ("the sum is off: in a shared-memory tree, is there a __syncthreads() after each step "
                "(a missing barrier lets a thread read a partial sum before it is written)? Is shared "
                "memory filled with 0 for threads past n? Are the block partial sums all added?")

    worst = _run_cases(g, cases, names=("x",), shape_of=lambda c: (), scalar=True, tol_of=tol_of,
                       unwritten_hint=lambda c, m: ("the result was never written (or an accumulator made with "
                                                 "torch.empty was added to: use torch.zeros for an "
                                                 "atomicAdd target)."),
                       diagnose=diagnose)
    _success("check_sum", cases, worst, _sizes_text(sizes))


def _row_cases(g, shapes, kinds):
    """2-D inputs whose rows cycle through ``kinds``: (label, scale, offset) per row."""
    cases = []
    for rows, cols in shapes:
        x = _randn(g.gen, rows, cols)
        labels = []
        for r in range(rows):
            label, scale, offset = kinds[r % len(kinds)]
            x[r] = x[r] * scale + offset
            labels.append(label)
        cases.append((x, labels))
    return cases


def check_row_max(fn, *, seed=None):
    """``fn(x)`` must return the maximum of each row of a 2-D tensor: shape ``(rows,)``.

    Some rows are entirely negative (a running max started at 0 fails them), and the maximum
    is put in the last column of some rows (a loop that misses the tail fails them).
    """
    g = _Grader("check_row_max", fn, seed)
    shapes = _shapes()
    kinds = [("mixed", 1.0, 0.0), ("all negative", 1.0, -50.0), ("max in the last column", 1.0, 0.0),
             ("large", 100.0, 0.0), ("max in the first column", 1.0, 0.0)]
    cases = []
    for x, labels in _row_cases(g, shapes, kinds):
        for r, label in enumerate(labels):
            if label == "max in the last column":
                x[r, -1] = x[r].max() + 1.0
            elif label == "max in the first column":
                x[r, 0] = x[r].max() + 1.0
        c = _Case(_label_shape(tuple(x.shape)), (x,), x.double().amax(dim=1), extra=dict(labels=labels))
        cases.append(c)

    def diagnose(case, got, bad):
        x = case.values[0].double()
        labels = case.extra["labels"]
        bad_rows = [r for r in range(x.shape[0]) if bool(bad[r])]
        if bad_rows and all(float(x[r].max()) < 0 for r in bad_rows) and bool((got[bad] == 0).all()):
            return ("rows whose values are all negative came out as 0: start the running maximum at "
                    "-INFINITY (or the row's first element), and fill masked/past-the-end lanes with -inf, not 0.")
        if bad_rows and all(labels[r] == "max in the last column" for r in bad_rows):
            return "only rows whose maximum is in the last column are wrong: does the loop cover the whole row (its tail)?"
        if bad_rows and all(labels[r] == "max in the first column" for r in bad_rows):
            return "only rows whose maximum is in the first column are wrong: is column 0 skipped (off by one)?"
        if x.shape[0] > 1 and x.shape[1] > 1 and got.numel() == x.shape[0]:
            col = x.amax(dim=0)
            if col.numel() >= got.numel() and _same(got, col[:got.numel()], atol=0, rtol=0):
                return "this looks like the maximum over dim 0 (down the columns): take it along each row."
        return ("is every row handled by its own block/program (row = blockIdx.x), and does each row start at "
                "x + row * n_cols?")

    worst = _run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape,
                       unwritten_hint=lambda c, m: ("these rows' results were never written: is there one block "
                                                 "(or program) per row, and does the grid have rows blocks?"),
                       diagnose=diagnose)
    _success("check_row_max", cases, worst, _shapes_text(shapes))


def check_softmax(fn, *, seed=None):
    """``fn(x)`` must return ``softmax(x, dim=-1)`` of a 2-D float32 tensor.

    Rows of large magnitude (values near +-1000, or spread over hundreds) overflow ``exp``
    unless the row maximum is subtracted first.
    """
    g = _Grader("check_softmax", fn, seed)
    shapes = _shapes()
    kinds = [("ordinary", 1.0, 0.0), ("spread 5", 5.0, 0.0), ("around 500", 1.0, 500.0),
             ("spread 300", 300.0, 0.0), ("around -1000", 2.0, -1000.0)]
    cases = []
    for x, labels in _row_cases(g, shapes, kinds):
        c = _Case(_label_shape(tuple(x.shape)) + " (some rows with values in the hundreds)", (x,),
                  torch.softmax(x.double(), dim=-1), extra=dict(labels=labels))
        cases.append(c)

    def diagnose(case, got, bad):
        x = case.values[0].double()
        tol = _check.tolerance(torch.float32)
        labels = case.extra["labels"]
        nonfinite_rows = (~torch.isfinite(got)).any(dim=1)
        small = torch.tensor([labels[r] in ("ordinary", "spread 5") for r in range(x.shape[0])])
        if bool(nonfinite_rows.any()):
            rows = torch.nonzero(nonfinite_rows).reshape(-1).tolist()
            small_rows_right = not bool(bad[small].any())
            if small_rows_right and all(not bool(small[r]) for r in rows):
                return ("got inf/nan on rows with large values: subtract the row max before exp "
                        "(exp(1000) overflows float32; softmax(x) = softmax(x - max(x))).")
        if x.shape[0] > 1 and _same(got, torch.softmax(x, dim=0), **tol):
            return "looks like softmax over dim 0 (down each column): softmax is over the last dim, along each row."
        sums = got.sum(dim=1)
        off = ~((sums - 1).abs() <= 1e-4)           # NaN sums count as off
        if bool(off.any()):
            finite_off = off & torch.isfinite(sums)
            r = int(torch.nonzero(finite_off if bool(finite_off.any()) else off)[0])
            return (f"rows do not sum to 1 (row {r} sums to {float(sums[r]):.6g}): is each row divided by the "
                    "sum over the whole row (every block/chunk of it)?")
        return "compare one row by hand: max, then exp(x - max), then divide by their sum."

    worst = _run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape, diagnose=diagnose)
    _success("check_softmax", cases, worst, _shapes_text(shapes))


def show_rejection(check, *args, **kwargs) -> GradingError:
    """Run a grader on a kernel that is wrong on purpose and print its diagnosis.

    For lessons that show what a grader says about a typical mistake. If the grader accepts
    the kernel, this raises, so a lesson can never silently show nothing.
    """
    try:
        check(*args, **kwargs)
    except GradingError as e:
        print("REJECTED:", e)
        return e
    raise AssertionError(f"{check.__name__} accepted a kernel that is wrong on purpose")
