"""Check, then time: the measurements of one topic.

Every kernel is checked against a float64 reference before it is timed, at awkward sizes
and at the size it is timed at. A kernel that raises or returns a wrong result is recorded
as such and never timed: a fast wrong kernel is not a result.

The worker (``python -m benchmarks --worker TOPIC``) runs one topic and appends one JSON
object per line to an events file, so the parent process keeps everything measured before
a crash (an illegal memory access leaves the CUDA context unusable; the parent then starts
a fresh worker that skips what is done and the kernel that crashed).
"""
from __future__ import annotations

import json
import math
import os
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

import utils

from .topics import TOPICS, check_shapes, main_shapes, sweep_shapes

# Words in a version's description that mark it as a demonstration, not a kernel to time
# (a racy v0 shown to explain why a barrier is needed). A topic module can also list such
# versions in ``DEMO_ONLY = ("v0",)``, or a launcher can carry ``launcher.demo_only = True``.
DEMO_MARKERS = ("demo only", "demo-only", "(demo)", "wrong on purpose", "deliberately wrong",
                "broken on purpose", "racy on purpose", "not for benchmarking")


@dataclass
class Variant:
    topic: str
    variant: str        # "triton v2", "torch", "torch.compile", ...
    lang: str           # cuda | numba | triton | torch
    version: str
    description: str
    reference: bool
    make: Callable      # make(dynamic: bool) -> fn(x)

    @property
    def compiled(self) -> bool:
        """torch.compile: every new shape is a compilation of its own (seconds)."""
        return self.lang == "torch" and self.version == "compile"

    def meta(self) -> dict:
        return dict(topic=self.topic, variant=self.variant, lang=self.lang, version=self.version)


def shape_key(shape) -> str:
    return "x".join(str(int(s)) for s in shape)


def is_demo_only(module, name: str, description: str, launcher) -> bool:
    if name in set(getattr(module, "DEMO_ONLY", ()) or ()):
        return True
    if getattr(launcher, "demo_only", False):
        return True
    text = (description or "").lower()
    return any(m in text for m in DEMO_MARKERS)


def course_variants(topic: str, languages=None) -> tuple[list[Variant], list[dict], list[str]]:
    """The topic's versions in every language found: (variants, skipped/failed, notes).

    A language without this topic yet is a note, not an error: lessons grow one at a time.
    """
    import kernels

    found, failed, notes = [], [], []
    for lang in languages or kernels.LANGUAGES:
        modname = f"kernels.{lang}.{topic}"
        try:
            mod = kernels.module(topic, lang)
            versions = list(mod.VERSIONS.items())
            reference = getattr(mod, "REFERENCE", None)
        except ModuleNotFoundError as e:
            if e.name == modname:
                notes.append(f"{lang} {topic}: no {modname.replace('.', '/')}.py yet")
                continue
            failed.append(dict(topic=topic, variant=f"{lang} (all)", lang=lang, version="*",
                               shape=None, status="error", reason=f"import failed: {e}"))
            continue
        except Exception as e:  # a syntax error, a missing VERSIONS: report it, go on
            failed.append(dict(topic=topic, variant=f"{lang} (all)", lang=lang, version="*",
                               shape=None, status="error",
                               reason=f"{modname} failed to load: {type(e).__name__}: {e}"))
            continue
        for name, entry in versions:
            try:
                description, launcher = entry
            except (TypeError, ValueError):
                failed.append(dict(topic=topic, variant=f"{lang} {name}", lang=lang, version=name,
                                   shape=None, status="error",
                                   reason="VERSIONS entries must be (description, launcher)"))
                continue
            if is_demo_only(mod, name, description, launcher):
                failed.append(dict(topic=topic, variant=f"{lang} {name}", lang=lang, version=name,
                                   shape=None, status="skipped",
                                   reason="a demonstration version, not benchmarked"))
                continue
            found.append(Variant(topic, f"{lang} {name}", lang, name, str(description),
                                 name == reference, (lambda dynamic=False, f=launcher: f)))
    return found, failed, notes


def baseline_variants(topic: str) -> list[Variant]:
    return [Variant(topic, b.variant, "torch", b.version, b.description, False, b.factory)
            for b in TOPICS[topic].baselines]


# --------------------------------------------------------------------------------------
# Checking
# --------------------------------------------------------------------------------------
class CheckCase:
    """One input shape: the inputs, their float64 reference and the allowed error."""

    def __init__(self, topic: str, shape, seed: int = 0, device=None):
        t = TOPICS[topic]
        self.topic, self.shape = topic, tuple(int(s) for s in shape)
        self.inputs = t.inputs(self.shape, seed=seed, device=device or utils.DEVICE)
        self.x = self.inputs[0]
        self.ref = t.reference(*self.inputs)
        self.tol = t.tolerance(self.inputs, self.ref)
        self.out_shape = t.out_shape(self.shape)
        self.out_numel = t.out_numel(self.shape)
        self.scalar = t.scalar_output


def _flops(spec, shape, median_ms) -> dict:
    """``flops`` and ``tflops`` for a compute-bound topic (one whose spec counts FLOPs)."""
    if spec.flops is None:
        return {}
    flops = int(spec.flops(shape))
    return dict(flops=flops, tflops=flops / (median_ms * 1e-3) / 1e12 if median_ms else None)


def _poison(numel: int, device) -> None:
    """Leave NaN in freed memory of the output's size: on a GPU the caching allocator hands
    that block to the kernel's ``torch.empty``, so an element it never writes reads NaN."""
    if torch.device(device).type == "cuda" and numel > 0:
        p = torch.full((numel,), float("nan"), device=device)
        del p


def compare_output(case: CheckCase, out) -> str | None:
    """None if ``out`` is right, else what is wrong, in words."""
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, not a torch.Tensor"
    if out.dtype not in TOPICS[case.topic].out_dtypes:
        return f"returned {out.dtype}, expected {TOPICS[case.topic].out_dtypes[0]}"
    if out.device.type != case.x.device.type:
        return f"returned a tensor on {out.device}, expected {case.x.device}"
    if case.scalar:
        if out.numel() != 1:
            return f"returned {out.numel()} values ({tuple(out.shape)}), expected one number"
        out = out.reshape(())
    elif tuple(out.shape) != case.out_shape:
        return f"returned shape {tuple(out.shape)}, expected {case.out_shape}"
    diff = (out.double() - case.ref).abs()
    bad = ~(diff <= case.tol)  # NaN compares False: unwritten (poisoned) elements are bad
    nbad = int(bad.sum())
    if nbad == 0:
        return None
    flat_bad = bad.reshape(-1)
    first = int(flat_bad.nonzero()[0, 0])
    got = float(out.reshape(-1)[first])
    want = float(case.ref.reshape(-1)[first])
    hint = " (never written?)" if math.isnan(got) else ""
    if case.scalar and abs(got) == 2.0 ** 24:
        hint = (" (2^24: a single float32 running sum stops growing there, each addend below "
                "1 is rounded away)")
    return (f"{nbad} of {out.numel()} values wrong; first at flat index {first}: "
            f"got {got:.7g}{hint}, expected {want:.7g}")


def check(fn, cases: list[CheckCase]) -> tuple[str, str] | None:
    """Run ``fn`` on each case. None if all are right, else ``(status, reason)`` with status
    "failed check" (a wrong result), "unsupported" (a launcher's ValueError: it refuses
    this shape, e.g. rows longer than it handles) or "error" (it raised anything else)."""
    for case in cases:
        before = [x.clone() for x in case.inputs]
        _poison(case.out_numel, case.x.device)
        where = f"at shape {shape_key(case.shape)}"
        try:
            out = fn(*case.inputs)
            if case.x.device.type == "cuda":
                torch.cuda.synchronize()  # an asynchronous launch error surfaces here
        except NotImplementedError as e:
            return "error", f"{where}: not implemented: {e}"
        except ValueError as e:
            return "unsupported", f"{where}: the launcher refuses it: {_short(e)}"
        except Exception as e:
            return "error", f"{where}: raised {type(e).__name__}: {_short(e)}"
        reason = compare_output(case, out)
        changed = False
        for x, b in zip(case.inputs, before):
            if not torch.equal(x, b):
                x.copy_(b)  # the next kernel checked on this case gets the real input
                changed = True
        if reason:
            return "failed check", f"{where}: {reason}"
        if changed:
            return "failed check", f"{where}: the kernel changed its input"
        del out, before
    return None


def _short(e: BaseException, limit: int = 300) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= limit else s[:limit] + "..."


def cuda_context_ok() -> bool:
    """False after a sticky error (illegal address, launch failure): nothing more can run."""
    if utils.SIMULATE:
        return True
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:
        return False


# --------------------------------------------------------------------------------------
# The worker: one topic, events to a file
# --------------------------------------------------------------------------------------
class Events:
    def __init__(self, path):
        self.path = path

    def emit(self, **event) -> None:
        _progress(event)
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _progress(e: dict) -> None:
    """A line of the log for each result, as it comes."""
    kind, topic = e.get("event"), e.get("topic", "")
    if kind == "row":
        print(f"[{topic}] {e['variant']:<16} {shape_key(e['shape']):>12}  median {e['median_ms']:.4f} ms "
              f"(p20 {e['p20_ms']:.4f}, p80 {e['p80_ms']:.4f})  {e['gbps'] or 0:,.0f} GB/s", flush=True)
    elif kind == "failed":
        print(f"[{topic}] {e['variant']:<16} {e['status']}: {e.get('reason', '')}", flush=True)
    elif kind == "note":
        print(f"[{topic}] note: {e.get('text', '')}", flush=True)
    elif kind == "point":
        print(f"[{topic}] sweep {e['variant']:<16} n={e['n']:<10} {e['gbps'] or 0:,.0f} GB/s", flush=True)


def read_events(path) -> list[dict]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut short by a crash
    except FileNotFoundError:
        pass
    return out


class ContextLost(RuntimeError):
    pass


def configure_torch_compile() -> None:
    """Static shapes, one compilation per shape, for every shape measured.

    By default torch.compile turns a function dynamic when it sees a second shape, and the
    dynamic kernel is tuned for none of them (on an H100 a compiled sum of 2^28 floats took
    seconds). A learner who compiles a function for one size gets a static kernel: measure
    that. The cache limit must then hold one entry per shape.
    """
    import torch._dynamo

    cfg = torch._dynamo.config
    cfg.automatic_dynamic_shapes = False
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 256))


def host_us(fn: Callable, args, n: int = 30, reps: int = 7) -> float:
    """Microseconds of host time per call of ``fn(*args)``: ``n`` calls back to back after a
    synchronisation (few enough that the GPU's queue never fills and holds the host back), until
    the last one returns; median of ``reps``."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn(*args)
        times.append((time.perf_counter() - t) / n * 1e6)
    torch.cuda.synchronize()
    return round(sorted(times)[len(times) // 2], 2)


def graph_ms(fn: Callable, args, warmup: float = 25, rep: float = 100) -> float | None:
    """Milliseconds of one call of ``fn(*args)`` replayed from a CUDA graph, timed as every row
    is (``do_bench``, the L2 flushed before each replay): the GPU's time without the host's
    between the launches. None where the call cannot be captured."""
    import triton.testing
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(*args)
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(g.replay, warmup=warmup, rep=rep))
    except Exception:
        torch.cuda.synchronize()
        return None


def time_row(events: "Events", meta: dict, shape, fn: Callable, make_args: Callable, nbytes: Callable, *,
             skip=(), deadline: float | None = None, warmup: float = 25, rep: float = 100, host: bool = False,
             **fields) -> None:
    """For a topic's own worker: time ``fn(*make_args())`` at ``shape`` (its check done) and emit
    its row, or why there is none: measured by an earlier worker (in ``skip``), out of time past
    ``deadline``, or an error while timing, which ends the worker if the CUDA context is lost.
    ``meta``: the row's topic, variant, lang, version (and dtype, pass); ``nbytes(args)``: the
    bytes it must move; ``fields``: the rest of the row (reference, description). With ``host``
    (on a GPU) the row also gets ``host_us``, the launcher's host time per call, and ``graph_ms``,
    the call's time replayed from a CUDA graph: whether the host or the kernel sets ``median_ms``."""
    key = f"{meta['variant']}@{shape_key(shape)}"
    if key in skip:
        return
    if deadline is not None and time.time() > deadline:
        events.emit(event="failed", key=key, **meta, shape=list(shape), status="skipped",
                    reason="out of time for this run")
        return
    events.emit(event="start", key=key)
    try:
        args = make_args()
        nb = nbytes(args)
        res = utils.bench(fn, *args, nbytes=nb, name=meta["variant"], warmup=warmup, rep=rep)
        if host and not res.simulated:
            fields = dict(fields, host_us=host_us(fn, args), graph_ms=graph_ms(fn, args, warmup, rep))
    except Exception as e:
        events.emit(event="failed", key=key, **meta, shape=list(shape), status="error",
                    reason=f"while timing: {type(e).__name__}: {_short(e)}")
        if not cuda_context_ok():
            raise ContextLost(key)
        return
    events.emit(event="row", key=key, **meta, **fields, shape=list(shape), bytes=nb, median_ms=res.median_ms,
                p20_ms=res.p20_ms, p80_ms=res.p80_ms, gbps=res.gbps, simulated=res.simulated,
                **_flops(TOPICS[meta["topic"]], shape, res.median_ms))
    del args
    _free()


#: Topics that measure more than one tensor per shape (several dtypes, masks, forward and
#: backward) bring their own worker: ``<module>.run_topic(events, sizes, **same keywords)``.
CUSTOM_WORKERS = {"attention": "benchmarks.attention", "layernorm": "benchmarks.layernorm",
                  "matmul_fp16": "benchmarks.matmul_fp16"}


#: Rounds of a target's paired timing against its baseline (``paired_targets``).
PAIRED_ROUNDS = 5


def paired_targets(topic: str, passed: list, fns: dict, events: Events, shapes, deadline=None, skip=()) -> None:
    """Each target of ``topic`` that compares a kernel with a baseline at one shape, timed again
    in alternation: kernel, baseline, kernel, ... ``PAIRED_ROUNDS`` times (``do_bench``, 50 ms
    each), the ratio of each round kept. A GPU's clock moves with its power and temperature
    over seconds (on the H200, cuBLAS's bfloat16 GEMM at 8192^3 ran between 572 and 714 TFLOP/s
    within one process: results/tune/h200-hopper-tune-inputs.json), so two numbers timed a
    minute apart may differ by more than the kernels do; the median of ratios timed side by
    side does not drift with it. The target's value is that median (``report.evaluate_targets``);
    the single run's ratio stays beside it."""
    spec = TOPICS[topic]
    shapes = {tuple(s) for s in shapes}
    for target in spec.targets:
        if getattr(target, "kind", None) != "torch" or target.shape is None \
                or hasattr(target, "evaluate") or tuple(target.shape) not in shapes:
            continue
        base_version = next((b.version for b in spec.baselines if b.version == target.baseline),
                            spec.baselines[0].version)
        mine = next((v for v in passed if v.lang == target.lang
                     and (v.version == target.version if target.version else v.reference)), None)
        base = next((v for v in passed if v.lang == "torch" and v.version == base_version), None)
        shape = tuple(target.shape)
        key = f"paired:{mine.variant if mine else ''}@{shape_key(shape)}"
        if mine is None or base is None or key in skip:
            continue
        if deadline is not None and time.time() > deadline:
            break
        import triton.testing
        inputs = TOPICS[topic].inputs(shape, seed=0, device=utils.DEVICE)  # the timed shape's inputs
        ratios = []
        try:
            for _ in range(PAIRED_ROUNDS):
                ms = [triton.testing.do_bench(lambda f=fns[v.variant], x=inputs: f(*x), warmup=10, rep=50)
                      for v in (mine, base)]
                ratios.append(ms[1] / ms[0])
        except Exception as e:  # timed before: a failure here is noted, the single run's number stands
            events.emit(event="note", topic=topic, text=f"paired timing of {mine.variant} at {shape_key(shape)} "
                                                         f"failed: {type(e).__name__}: {_short(e)}")
            continue
        finally:
            inputs = None
            _free()
        events.emit(event="paired", key=key, topic=topic, variant=mine.variant, baseline=base.variant,
                    baseline_version=base.version, shape=list(shape), ratios=ratios)


def run_topic(topic: str, events: Events, sizes, *, skip=(), languages=None, sweep: bool = True,
              main: bool = True, deadline: float | None = None, sweep_deadline: float | None = None,
              warmup: float = 25, rep: float = 100, generic: bool = False) -> None:
    """Check and time every variant of a topic at its main shapes, then the size sweep
    (``main=False``: the sweep only, for topics with their own worker; ``generic``: this
    measurement even for a topic with its own worker, which calls it for its plain part)."""
    if topic in CUSTOM_WORKERS and not generic:
        import importlib
        return importlib.import_module(CUSTOM_WORKERS[topic]).run_topic(
            events, sizes, skip=skip, languages=languages, sweep=sweep, main=main, deadline=deadline,
            sweep_deadline=sweep_deadline, warmup=warmup, rep=rep)
    if not main:
        if generic:
            return
        raise ValueError(f"{topic}: its sweep is timed for the variants its main shapes checked; measure both")
    configure_torch_compile()
    warnings.filterwarnings("ignore", message=".*under-utilization.*")  # Numba, small sizes
    t = TOPICS[topic]
    skip = set(skip)
    variants, failed, notes = course_variants(topic, languages)
    variants += baseline_variants(topic)
    for n in notes:
        events.emit(event="note", topic=topic, text=n)
    for f in failed:
        key = f"{f['variant']}@*"
        if key not in skip:
            events.emit(event="failed", key=key, **f)

    def out_of_time(limit):
        return limit is not None and time.time() > limit

    def check_and_time(v, fn, cases, shape):
        """``(verdict, None)`` when ``fn`` fails a case, else ``(None, its timing at the last case)``."""
        verdict = check(fn, cases)
        if verdict is not None:
            return verdict, None
        try:
            return None, utils.bench(fn, *cases[-1].inputs, nbytes=t.nbytes(shape), name=v.variant,
                                     warmup=warmup, rep=rep)
        except Exception as e:
            return ("error", f"while timing: {type(e).__name__}: {_short(e)}"), None

    # --- main shapes -------------------------------------------------------------------
    shapes = main_shapes(topic, sizes)
    small = [CheckCase(topic, s, seed=1) for s in check_shapes(topic, utils.SIMULATE)]
    passed: list[Variant] = []
    fns: dict[str, Callable] = {}
    for v in variants:
        if f"{v.variant}@*" in skip:
            continue  # failed, crashed or hung in an earlier worker
        first_key = f"{v.variant}@{shape_key(shapes[0])}"
        try:
            fn = v.make(False)
        except Exception as e:
            for shape in shapes:
                key = f"{v.variant}@{shape_key(shape)}"
                if key not in skip:
                    events.emit(event="failed", key=key, **v.meta(), shape=list(shape),
                                status="error", reason=f"could not be set up: {_short(e)}")
            continue
        ok_any = False
        for i, shape in enumerate(shapes):
            key = f"{v.variant}@{shape_key(shape)}"
            if key in skip:
                ok_any = True  # measured by an earlier worker
                continue
            if out_of_time(deadline):
                events.emit(event="failed", key=key, **v.meta(), shape=list(shape),
                            status="skipped", reason="out of time for this run")
                continue
            events.emit(event="start", key=key)
            case = CheckCase(topic, shape, seed=0)
            # The awkward sizes once per variant (with its first shape), then each shape.
            # torch.compile is checked at the timed shapes only: each awkward size would be
            # one more compilation, and it compiles PyTorch's own ops.
            extra = small if (key == first_key and not v.compiled) else []
            verdict, res = check_and_time(v, fn, extra + [case], shape)
            if verdict is not None:
                status, reason = verdict
                events.emit(event="failed", key=key, **v.meta(), shape=list(shape),
                            status=status, reason=reason)
                del case
                if not cuda_context_ok():
                    events.emit(event="failed", key=key, **v.meta(), shape=list(shape),
                                status="crashed", reason=f"{reason}; it left the CUDA context unusable")
                    raise ContextLost(key)
                if status == "unsupported":
                    continue  # a shape it does not take; the others may be fine
                break  # a wrong kernel is not timed at its other shapes either
            ok_any = True
            events.emit(event="row", key=key, **v.meta(), reference=v.reference,
                        description=v.description, shape=list(shape), bytes=t.nbytes(shape),
                        median_ms=res.median_ms, p20_ms=res.p20_ms, p80_ms=res.p80_ms,
                        gbps=res.gbps, simulated=res.simulated, **_flops(t, shape, res.median_ms))
            del case
        if ok_any:
            passed.append(v)
            fns[v.variant] = fn
        _free()
    small.clear()
    _free()
    if not utils.SIMULATE:
        paired_targets(topic, passed, fns, events, shapes, deadline, skip)

    # --- size sweep: checked at every size too -------------------------------------------
    if not sweep:
        return
    dead = {v.variant for v in passed if f"sweep:{v.variant}" in skip}
    for si, shape in enumerate(sweep_shapes(topic, sizes)):
        if out_of_time(sweep_deadline):
            events.emit(event="note", topic=topic,
                        text=f"size sweep stopped before {shape_key(shape)}: out of time")
            break
        todo = [v for v in passed if v.variant not in dead and v.variant in fns
                and f"sweep:{v.variant}@{shape_key(shape)}" not in skip
                and not (v.compiled and si % 2)]  # torch.compile: every other size
        if not todo:
            continue
        case = CheckCase(topic, shape, seed=2)
        n = int(math.prod(shape))
        for v in todo:
            fn = fns[v.variant]
            key = f"sweep:{v.variant}@{shape_key(shape)}"
            events.emit(event="start", key=key)
            verdict, res = check_and_time(v, fn, [case], shape)
            if verdict is not None:
                dead.add(v.variant)
                events.emit(event="note", key=key, topic=topic,
                            text=f"{v.variant} left out of the size sweep from "
                                 f"{shape_key(shape)} on: {verdict[0]}: {verdict[1]}")
                if not cuda_context_ok():
                    raise ContextLost(key)
                continue
            events.emit(event="point", key=key, topic=topic, variant=v.variant, n=n,
                        shape=list(shape), gbps=res.gbps, median_ms=res.median_ms)
        del case
        _free()


def _free():
    if not utils.SIMULATE:
        torch.cuda.empty_cache()


def worker_main(topic: str, events_path: str, sizes, **kw) -> int:
    """Entry of a worker process: exit 0 when done, 3 after a crash that broke CUDA."""
    events = Events(events_path)
    try:
        run_topic(topic, events, sizes, **kw)
    except ContextLost as e:
        print(f"[{topic}] {e} broke the CUDA context: a fresh worker will carry on", flush=True)
        return 3
    except Exception as e:
        events.emit(event="note", topic=topic,
                    text=f"the {topic} worker stopped: {type(e).__name__}: {_short(e)}")
        traceback.print_exc()
        return 1
    return 0
