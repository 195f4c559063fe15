"""The attention topic's measurements (``python -m benchmarks --topics attention``).

Attention has more to measure than one tensor per shape: float16 and bfloat16, with and without
the causal mask, the forward and the forward + backward, and PyTorch's SDPA with each of its
backends (FlashAttention-2, cuDNN, memory-efficient, the default) and FlexAttention as
baselines. So the topic brings its own worker (``run_topic``, called by the harness), its own
targets' evaluation (``AttentionTarget.evaluate`` in utils/topics/attention.py) and its own plot
(``plot``: TFLOP/s against the sequence length).

Every row is a dict like the other topics' rows (``topic, variant, lang, version, shape, bytes,
median_ms, p20_ms, p80_ms, gbps, flops, tflops``) plus ``dtype`` ("float16", "bfloat16"),
``causal`` (bool), ``pass`` ("forward" or "forward+backward") and ``sweep`` (True for the
points of the length sweep). ``shape`` is (B, H, N, d) with Nq = Nk = N; the variant's name
carries the configuration: ``"triton v3 [float16, causal, forward]"``.

Every kernel is checked before it is timed: on awkward small shapes (N = 1, 17, 130, 1000) and
at the timed shape, where the float64 reference is computed for the first and the last head.
"""
from __future__ import annotations

import time
import traceback

import torch

import utils

TOPIC = "attention"
DTYPES = ("float16", "bfloat16")
PASSES = ("forward", "forward+backward")
#: The sweep: forward and forward + backward in float16, both masks.
SWEEP_DTYPE = "float16"


def _spec():
    return utils.topic(TOPIC)


def _dtype(name):
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def variant_name(base: str, dtype: str, causal: bool, kind: str) -> str:
    return f"{base} [{dtype}, {'causal' if causal else 'full'}, {kind}]"


def shape_key(shape, dtype, causal, kind, sweep=False) -> str:
    return ("sweep:" if sweep else "") + "x".join(map(str, shape)) + f"/{dtype}/{int(causal)}/{kind}"


# ---------------------------------------------------------------------------------------
# What is measured
# ---------------------------------------------------------------------------------------
class Contender:
    """One kernel or baseline: ``fwd(q, k, v, causal) -> o``; ``fwd_bwd`` is ``fwd`` made
    differentiable (an autograd.Function or torch's autograd), or None for forward only."""

    def __init__(self, base, lang, version, description, fwd, differentiable=False, reference=False,
                 supports=None):
        self.base, self.lang, self.version, self.description = base, lang, version, description
        self.fwd = fwd
        self.differentiable = differentiable
        self.reference = reference
        self.supports = supports or (lambda shape, dtype, causal, kind: True)


def contenders(languages=("cuda", "numba", "triton"), first_shape=None):
    import kernels
    out = []
    first = tuple(first_shape) if first_shape else None

    def at_first(shape, dtype, causal, kind):      # slow versions: one configuration only
        return tuple(shape) == first and dtype == "float16" and not causal and kind == "forward"

    if "triton" in languages:
        tri = kernels.module(TOPIC, "triton")
        out.append(Contender("triton v3", "triton", "v3", tri.VERSIONS["v3"][0],
                             lambda q, k, v, causal: tri.AttentionFunction.apply(q, k, v, causal),
                             differentiable=True, reference=True))
        for name in ("v1", "v2"):
            out.append(Contender(f"triton {name}", "triton", name, tri.VERSIONS[name][0],
                                 lambda q, k, v, causal, f=tri.VERSIONS[name][1]: f(q, k, v, causal),
                                 supports=at_first))
    if "cuda" in languages:
        cu = kernels.module(TOPIC, "cuda")
        out.append(Contender("cuda v3", "cuda", "v3", cu.VERSIONS["v3"][0],
                             lambda q, k, v, causal: cu.attention_flash(q, k, v, causal), reference=True,
                             supports=lambda shape, dtype, causal, kind: kind == "forward"))
        for name in ("v1", "v2"):
            out.append(Contender(f"cuda {name}", "cuda", name, cu.VERSIONS[name][0] + " (computed in float32)",
                                 lambda q, k, v, causal, f=cu.VERSIONS[name][1]: f(q, k, v, causal),
                                 supports=at_first))
    if "numba" in languages:
        nb = kernels.module(TOPIC, "numba")
        out.append(Contender("numba v3", "numba", "v3", nb.VERSIONS["v3"][0] + " (computed in float32)",
                             lambda q, k, v, causal: nb.attention_flash(q, k, v, causal), reference=True,
                             supports=at_first))
    for b in _spec().baselines:
        fn = b.factory(False)
        flex = b.version == "flex"
        out.append(Contender(b.variant, "torch", b.version, b.description, fn, differentiable=True,
                             supports=(lambda shape, dtype, causal, kind, f=flex:
                                       not f or (tuple(shape)[2:] == tuple(first)[2:] and dtype == "float16"))
                             if first else None))
    return out


# ---------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------
def _inputs(shape, dtype, seed, requires_grad=False):
    B, H, N, d = shape
    g = torch.Generator(device=utils.DEVICE).manual_seed(seed)
    return tuple(torch.randn(B, H, N, d, generator=g, device=utils.DEVICE).to(_dtype(dtype))
                 .requires_grad_(requires_grad) for _ in range(3))


def _heads(shape):
    B, H = shape[0], shape[1]
    return sorted({(0, 0), (B - 1, H - 1)})


def check(c: Contender, shape, dtype, causal, kind) -> str | None:
    """None if the contender is right on the awkward shapes and at ``shape``, else why not."""
    spec = _spec()
    from utils.topics import attention as A
    # The course's kernels also on the awkward shapes; PyTorch's own at the timed shape.
    shapes = ([tuple(s) for s in spec.check_shapes(_sizes())] if c.lang != "torch" else []) + [tuple(shape)]
    for s in shapes:
        q, k, v = _inputs(s, dtype, seed=11, requires_grad=kind != "forward")
        try:
            o = c.fwd(q, k, v, causal)
            do = None
            if kind != "forward":
                do = torch.randn_like(o)
                o.backward(do)
            torch.cuda.synchronize() if not utils.SIMULATE else None
        except ValueError as e:
            return f"unsupported at {s}: {e}"
        for b, h in _heads(s):
            qs, ks, vs = (t[b:b + 1, h:h + 1].detach() for t in (q, k, v))
            ref = A.attention_ref64(qs, ks, vs, causal)
            tol = A.output_tolerance(qs, ks, vs, causal, _dtype(dtype))
            got = o[b:b + 1, h:h + 1].detach().double()
            bad = ~((got - ref).abs() <= tol)
            if bool(bad.any()):
                return (f"o wrong at {s}, head ({b}, {h}): {int(bad.sum())} values, largest error "
                        f"{float((got - ref).abs().max()):.3g}")
            if kind != "forward":
                refs = A.attention_backward_ref64(qs, ks, vs, do[b:b + 1, h:h + 1], causal)
                tols = A.backward_tolerances(qs, ks, vs, do[b:b + 1, h:h + 1], causal, _dtype(dtype))
                for name, t, r, tl_ in zip(("dq", "dk", "dv"), (q, k, v), refs, tols):
                    g = t.grad[b:b + 1, h:h + 1].double()
                    bad = ~((g - r).abs() <= tl_)
                    if bool(bad.any()):
                        return (f"{name} wrong at {s}, head ({b}, {h}): {int(bad.sum())} values, largest error "
                                f"{float((g - r).abs().max()):.3g}")
        del q, k, v, o
    return None


def _sizes():
    from types import SimpleNamespace
    return SimpleNamespace(**utils.PROBLEM_SIZES[utils.MODE])


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------
def time_one(c: Contender, shape, dtype, causal, kind, warmup, rep):
    spec = _spec()
    q, k, v = _inputs(shape, dtype, seed=0, requires_grad=kind != "forward")
    if kind == "forward":
        def fn():
            with torch.no_grad():
                return c.fwd(q, k, v, causal)
    else:
        do = torch.randn_like(q)

        def fn():
            q.grad = k.grad = v.grad = None
            c.fwd(q, k, v, causal).backward(do)
    backward = kind != "forward"
    elem = 2 if dtype != "float32" else 4
    res = utils.bench(fn, nbytes=spec.nbytes(tuple(shape), elem, backward), name=c.base, warmup=warmup, rep=rep)
    flops = spec.flops(tuple(shape), causal, backward)
    return res, flops


def run_topic(events, sizes, *, skip=(), languages=None, sweep=True, main=True, deadline=None,
              sweep_deadline=None, warmup=25, rep=100):
    """The worker of topic attention: check, then time, every contender at every configuration."""
    from .harness import configure_torch_compile
    configure_torch_compile()    # FlexAttention compiles once per shape
    skip = set(skip)
    shapes = [tuple(s) for s in sizes.attention_bench_shapes]
    cs = contenders(tuple(languages or ("cuda", "numba", "triton")), shapes[0])
    dead = set()
    plan = [(shape, dtype, causal, kind, False) for shape in shapes for dtype in DTYPES
            for causal in (False, True) for kind in PASSES] if main else []
    if sweep:
        plan += [(tuple(s), SWEEP_DTYPE, causal, kind, True) for s in sizes.attention_sweep_shapes
                 for causal in (False, True) for kind in PASSES]
    sweep_bases = {"triton v3", "cuda v3", "SDPA flash", "SDPA cuDNN", "SDPA default"}
    for shape, dtype, causal, kind, is_sweep in plan:
        limit = sweep_deadline if is_sweep else deadline
        for c in cs:
            if kind != "forward" and not c.differentiable:
                continue
            if is_sweep and c.base not in sweep_bases:
                continue
            if not is_sweep and not c.supports(shape, dtype, causal, kind):
                continue
            variant = variant_name(c.base, dtype, causal, kind)
            key = f"{variant}@{shape_key(shape, dtype, causal, kind, is_sweep)}"
            if key in skip or variant in dead:
                continue
            meta = dict(topic=TOPIC, variant=variant, lang=c.lang, version=c.version, shape=list(shape),
                        dtype=dtype, causal=causal, **{"pass": kind}, sweep=is_sweep)
            if limit is not None and time.time() > limit:
                events.emit(event="failed", key=key, **meta, status="skipped", reason="out of time for this run")
                continue
            events.emit(event="start", key=key)
            try:
                why = check(c, shape, dtype, causal, kind)
                if why is None:
                    res, flops = time_one(c, shape, dtype, causal, kind, warmup, rep)
            except Exception as e:  # a contender that fails is recorded, the others go on
                why = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                traceback.print_exc()
            if why is not None:
                if why.startswith("unsupported") or "No available kernel" in why or "not supported" in why:
                    status = "unsupported"
                elif "Error" in why.split(":")[0]:
                    status = "error"
                else:
                    status = "failed check"
                events.emit(event="failed", key=key, **meta, status=status, reason=why)
                if status != "unsupported":
                    dead.add(variant)
                _free()
                continue
            events.emit(event="row", key=key, **meta, reference=c.reference, description=c.description,
                        bytes=res.nbytes, median_ms=res.median_ms, p20_ms=res.p20_ms, p80_ms=res.p80_ms,
                        gbps=res.gbps, simulated=res.simulated, flops=int(flops),
                        tflops=flops / (res.median_ms * 1e-3) / 1e12 if res.median_ms else None)
            _free()


def _free():
    if not utils.SIMULATE:
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------
# The plot
# ---------------------------------------------------------------------------------------
def plot(data, outdir, name):
    """TFLOP/s against N from the sweep rows: forward (top) and forward + backward (bottom),
    without and with the causal mask; the smaller head dimension solid, the larger dashed.
    None without sweep rows."""
    rows = [r for r in data.get("rows", []) if r.get("topic") == TOPIC and r.get("sweep") and r.get("tflops")]
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    colors = {}
    for (i, kind) in enumerate(PASSES):
        for j, causal in enumerate((False, True)):
            ax = axes[i][j]
            sel = [r for r in rows if r["pass"] == kind and r["causal"] == causal]
            dims = sorted({r["shape"][3] for r in sel})
            for base in sorted({r["variant"].split(" [")[0] for r in sel}):
                color = colors.setdefault(base, f"C{len(colors)}")
                for d, style in zip(dims, ("-", "--", ":", "-.")):
                    pts = sorted((r["shape"][2], r["tflops"]) for r in sel
                                 if r["variant"].split(" [")[0] == base and r["shape"][3] == d)
                    if pts:
                        ax.plot(*zip(*pts), style, marker="o", ms=3, color=color,
                                label=f"{base}, d = {d}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{kind}, {'causal' if causal else 'no mask'}, float16", fontsize=10)
            ax.grid(alpha=0.3)
            if i == 1:
                ax.set_xlabel("sequence length N (B x N = 16384 tokens, 32 heads)")
            if j == 0:
                ax.set_ylabel("TFLOP/s")
    axes[0][1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    gpu = data.get("machine", {}).get("gpu", "GPU")
    # the topic's own commit: an --update run keeps the file's date and commit for the other topics
    measured = data.get("topic_commits", {}).get(TOPIC) or data
    fig.suptitle(f"Attention on {gpu}, {utils.commit_str(measured)}", fontsize=10)
    from pathlib import Path
    path = Path(outdir) / f"{name}-{TOPIC}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
