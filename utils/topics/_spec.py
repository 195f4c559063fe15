"""What a topic is: the one record that graders, benchmarks, tests and lessons read.

A topic (relu, gelu, reduction, softmax, ...) is one operation taught in one lesson and
written in each language under ``kernels/<lang>/<topic>.py``. Its facts live in
``utils/topics/<topic>.py`` as a ``Spec``; nothing else restates them:

* the inputs the benchmarks and tests draw (``make_input``), and the shapes they use in
  each mode, read from ``utils.SIZES`` (the tables of ``runtime/config.py``);
* the float64 ``reference`` every result is compared with;
* the allowed error of a benchmark check (``tolerance``), built from ``utils.TOLERANCES``;
* the bytes (and FLOPs) one call must move at the least, for GB/s (and TFLOP/s);
* the performance ``targets`` on the course's GPU and the PyTorch ``baselines``;
* the graders (``checks``) with the topic's own diagnoses.
"""
from __future__ import annotations

import functools
import math
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from runtime.backends import launches as _launches

from ..check import tolerance as _tolerance

FLOAT = 4  # bytes per float32
EPS32 = 2.0 ** -24  # unit roundoff of float32


#: The names of a topic's references: ``relu_ref64``, ``attention_lse64``, ``layernorm_stats64``,
#: ``gelu_tanh_ref``. Each is recorded when a graded function calls it (below).
REFERENCE_NAME = re.compile(r"(_ref|64)$")


class _InReference(threading.local):
    depth = 0


_IN_REFERENCE = _InReference()


def _recording_reference(fn, where: str):
    """``fn``, which also tells every launch recording running now (a graded call,
    ``utils.record_launches``) that the course's reference ran: the grader then refuses the call
    ("the course's own reference ... computed them"). The grader's own calls of its references
    run outside any recording, and cost one test of a list."""
    @functools.wraps(fn)
    def reference(*args, **kwargs):
        if not _launches._ACTIVE or _IN_REFERENCE.depth:
            return fn(*args, **kwargs)
        for rec in _launches._ACTIVE:
            rec.__dict__.setdefault("references", []).append(f"{where}.{fn.__name__}")
        _IN_REFERENCE.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _IN_REFERENCE.depth -= 1
    reference.__course_reference__ = fn
    return reference


def record_references(module_name: str) -> None:
    """Make every reference function of a topic module (``REFERENCE_NAME``) known to launch
    recordings, wherever the topic's modules import it: ``Spec`` does this for the module that
    defines its reference, so that every topic's graders refuse the reference returned."""
    mod = sys.modules.get(module_name)
    if mod is None:
        return
    package = module_name.rsplit(".", 1)[0]
    where = "utils.topics." + module_name.rsplit(".", 1)[-1]
    wrapped = {}
    for name, value in list(vars(mod).items()):
        if (callable(value) and getattr(value, "__module__", None) == module_name and REFERENCE_NAME.search(name)
                and not hasattr(value, "__course_reference__") and isinstance(value, type(numel))):
            wrapped[id(value)] = (value, _recording_reference(value, where))
    if not wrapped:
        return
    for mname, m in list(sys.modules.items()):
        if m is None or not (mname == package or mname.startswith(package + ".")):
            continue
        for name, value in list(vars(m).items()):
            hit = wrapped.get(id(value))
            if hit is not None and hit[0] is value:
                setattr(m, name, hit[1])


def _graded_everywhere(check):
    """``utils.grading.graded(check)``, put in place of ``check`` in every topic module that
    holds it (so that ``utils.topics.<topic>.check_x`` is the same graded function)."""
    from ..grading import graded
    wrapped = graded(check)
    if wrapped is check:
        return check
    for mname, m in list(sys.modules.items()):
        if m is None or not mname.startswith("utils.topics"):
            continue
        for name, value in list(vars(m).items()):
            if value is check:
                setattr(m, name, wrapped)
    return wrapped


def numel(shape) -> int:
    return int(math.prod(shape))


@dataclass(frozen=True)
class Target:
    """A performance goal of the reference version of ``lang`` on the course's GPU.

    ``kind``: "copy" (a fraction of the copy roofline measured in the same run), "torch"
    (speed relative to a PyTorch baseline at the same shape), "gbps" (GB/s) or "tflops"
    (TFLOP/s, for a topic whose spec counts ``flops``).
    ``shape``: the one shape the goal applies to; None means every main benchmark shape.
    """
    lang: str
    kind: str
    threshold: float
    shape: tuple | None = None
    version: str | None = None          # the course's version measured; None: the reference
    baseline: str | None = None         # kind "torch": the baseline's version; None: the first
    baseline_label: str | None = None   # kind "torch": how the goal names it; None: the spec's
    #: why the goal is missed where it is (what the kernel does that the best ones do not),
    #: shown beside a missed target in the results; None where nobody has found out yet
    if_missed: str | None = None


@dataclass
class Baseline:
    """A PyTorch version measured beside the course's kernels."""
    variant: str            # "torch", "torch.compile", "torch op-by-op"
    version: str            # "eager", "compile", "unfused"
    description: str
    factory: Callable[[bool], Callable]   # factory(dynamic) -> fn(*inputs)


def eager(fn):
    return lambda dynamic=False: fn


def compiled(fn):
    # Static shapes: one compilation per shape measured (see benchmarks.harness.configure_torch_compile).
    return lambda dynamic=False: torch.compile(fn, dynamic=False)


def generator(seed: int, device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


# ----------------------------------------------------------------------------------------
# The usual answers for a topic whose inputs are one float32 tensor of ``shape``.
# ----------------------------------------------------------------------------------------
def float32_tol() -> tuple[float, float]:
    t = _tolerance(torch.float32)
    return float(t["atol"]), float(t["rtol"])


def elementwise_tol(inputs, ref):
    """``atol + rtol * |ref|`` of ``utils.TOLERANCES[float32]``, element by element."""
    atol, rtol = float32_tol()
    return atol + rtol * ref.abs()


def exact_tol(inputs, ref):
    return torch.zeros((), dtype=ref.dtype, device=ref.device)


def elementwise_bytes(shape) -> int:
    """One float read and one written per element."""
    return 2 * FLOAT * numel(shape)


def shapes_1d(sizes, key):
    return [(int(n),) for n in getattr(sizes, key)]


@dataclass
class Spec:
    name: str                     # kernels/<lang>/<name>.py
    title: str                    # for tables and plots
    lesson: str                   # notebooks/<lesson>.ipynb teaches it
    reference: Callable           # (*inputs) -> float64 result
    make_input: Callable          # (shape, seed=0, device=None) -> tensor or tuple of tensors
    nbytes: Callable              # shape -> bytes one call must read + write at the least
    tolerance: Callable = elementwise_tol   # (inputs, ref) -> allowed |out - ref|, broadcastable
    flops: Callable | None = None           # shape -> floating-point operations (compute-bound topics)
    checks: dict = field(default_factory=dict)      # grader name -> grader, exported from utils
    baselines: list = field(default_factory=list)   # measured by `python -m benchmarks`
    targets: list = field(default_factory=list)
    baseline_label: str = "torch"           # how a "torch" target names the first baseline
    scalar_output: bool = False             # the result is one number (a sum)
    out_dtypes: tuple = (torch.float32,)    # the result dtypes accepted (matmul_fp16: also float16)
    result_shape: Callable | None = None    # shape -> the result's shape; None: the input's shape
    main_shapes: Callable = lambda sizes: [(int(sizes.bench_n),)]
    sweep_shapes: Callable = lambda sizes: [(int(n),) for n in sizes.bench_sizes]
    check_shapes: Callable = lambda sizes: shapes_1d(sizes, "bench_check_sizes")
    sweep_label: str = "elements"           # the x axis of the size sweep's plot
    # Aten operators a graded launcher may run besides allocation, views, fills, copies and casts
    # (runtime/backends/launches.py), where the exercise says so: e.g. ("sum",) for a launcher
    # whose exercise finishes the per-block partial sums with torch.
    torch_ops_allowed: tuple = ()

    def __post_init__(self):
        # the references of this topic, returned by a graded function, are refused by name
        module = getattr(self.reference, "__module__", None)
        if module and module.startswith("utils.topics."):
            record_references(module)
            self.reference = getattr(sys.modules[module], self.reference.__name__, self.reference)
        # every grader refuses torch's answer and the reference's, however it reports success
        self.checks = {name: _graded_everywhere(fn) for name, fn in self.checks.items()}

    @property
    def benchmarked(self) -> bool:
        return bool(self.baselines)

    def inputs(self, shape, seed=0, device=None) -> tuple:
        """The benchmark's (and tests') inputs of ``shape``, always as a tuple."""
        x = self.make_input(tuple(shape), seed=seed, device=device)
        return tuple(x) if isinstance(x, (tuple, list)) else (x,)

    def out_shape(self, shape) -> tuple:
        if self.result_shape is not None:
            return tuple(self.result_shape(tuple(shape)))
        return (1,) if self.scalar_output else tuple(shape)

    def out_numel(self, shape) -> int:
        return numel(self.out_shape(shape))
