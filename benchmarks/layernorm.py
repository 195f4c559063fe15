"""The layernorm topic's measurements (``python -m benchmarks --topics layernorm``).

The harness's own worker measures the float32 forward of every version, at the main shapes and
in the size sweep, beside torch eager, torch.compile and Liger. This worker runs it, then adds
what one forward launcher per topic cannot say:

* the bfloat16 forward of every version that takes bfloat16 (``[bfloat16, forward]``), at the
  main shapes;
* a copy of the forward's bytes at each main shape, in both dtypes (``[float32, copy]``): the
  best a pass of that size can do, beside the roofline's 2 GB copy;
* the backward, dx, dw and db together (``[float32, backward]``, ``[bfloat16, backward]``),
  RMSNorm's forward and backward, at 4096 x 4096, beside torch eager (``aten`` LayerNorm
  backward; ``F.rms_norm`` and its autograd backward) and Liger where it is installed.

Bytes are counted honestly: forward x read and y written; backward x, dy, w, mean, rstd read and
dx, dw, db written (``layernorm_backward_bytes``); RMSNorm the same without mean and b.

Each row is a row like the others plus ``dtype`` and ``pass`` ("forward", "backward",
"rmsnorm forward", "rmsnorm backward"); its variant names them: ``"triton v3 [bfloat16, backward]"``.
The targets of these rows (``EXTRA_TARGETS``) are evaluated by ``evaluate``; the float32
forward's targets stay in the topic's spec.
"""
from __future__ import annotations

import torch

import utils

TOPIC = "layernorm"
EXTRA_SHAPE = (4096, 4096)
F = torch.nn.functional
EPS = 1e-5

#: (pass, dtype, langs, kind, threshold, shapes or None for the main shapes): kind "copy" is a
#: fraction of the copy roofline, "torch" a speed ratio to torch eager's row of the same pass.
EXTRA_TARGETS = [("forward", "bfloat16", ("cuda", "triton"), "copy", 0.9, None)] + [
    (pass_, dtype, ("cuda", "triton"), kind, threshold, [EXTRA_SHAPE])
    for pass_ in ("backward", "rmsnorm forward", "rmsnorm backward")
    for dtype in ("float32", "bfloat16")
    for kind, threshold in (("copy", 0.75), ("torch", 1.5))]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def variant_name(base: str, dtype: str, kind: str) -> str:
    return f"{base} [{dtype}, {kind}]"


def _spec():
    from utils.topics import layernorm as spec
    return spec


# ---------------------------------------------------------------------------------------
# Checks (float64 references; bfloat16 within its own rounding)
# ---------------------------------------------------------------------------------------
def _tol(dtype):
    return (1e-3, 1e-3) if dtype == torch.float32 else (3e-2, 3e-2)


def _bad(got, want, dtype, scale=1.0) -> str | None:
    atol, rtol = _tol(dtype)
    err = (got.double() - want).abs()
    ok = err <= atol * scale + rtol * want.abs()
    if bool(ok.all()):
        return None
    return f"{int((~ok).sum())} of {ok.numel()} values wrong, max error {float(err.max()):.3g}"


def check_case(kind, fn, shape, dtype, seed=7) -> str | None:
    spec = _spec()
    x, w, b = spec.layernorm_input(shape, seed=seed, dtype=dtype, device=utils.DEVICE)
    dy = torch.randn(shape, device=utils.DEVICE, generator=torch.Generator(utils.DEVICE).manual_seed(seed)).to(dtype)
    rows = shape[0]
    if kind == "copy":
        return _bad(fn(x, w, b), x.double(), dtype)
    if kind == "forward":
        y = fn(x, w, b)
        return _bad(y, spec.layernorm_ref64(x, w, b), dtype)
    if kind == "rmsnorm forward":
        return _bad(fn(x, w), spec.rmsnorm_ref64(x, w), dtype)
    if kind == "backward":
        m, r = spec.layernorm_stats64(x)
        mean, rstd = m.float(), r.float()
        dx, dw, db = fn(dy, x, w, mean, rstd)
        rdx, rdw, rdb = spec.layernorm_backward_ref64(dy, x, w, mean=mean, rstd=rstd)
        return (_bad(dx, rdx, dtype) or _bad(dw, rdw, dtype, rows ** 0.5) or _bad(db, rdb, dtype, rows ** 0.5))
    if kind == "rmsnorm backward":
        rstd = (1.0 / torch.sqrt((x.double() ** 2).mean(1) + EPS)).float()
        dx, dw = fn(dy, x, w, rstd)
        rdx, rdw = spec.rmsnorm_backward_ref64(dy, x, w)
        return _bad(dx, rdx, dtype) or _bad(dw, rdw, dtype, rows ** 0.5)
    raise ValueError(kind)


# ---------------------------------------------------------------------------------------
# What is measured
# ---------------------------------------------------------------------------------------
def contenders(languages):
    """(kind, base, lang, version, description, reference, fn, dtypes)."""
    import kernels
    out = []
    for lang in languages:
        try:
            mod = kernels.module(TOPIC, lang)
        except Exception:
            continue
        dts = ("float32", "bfloat16") if lang != "numba" else ("float32",)  # Numba: no bfloat16 in NumPy
        for v, (desc, f) in mod.VERSIONS.items():
            if lang != "numba":  # the float32 forward is the harness's own measurement
                out.append(("forward", f"{lang} {v}", lang, v, desc, v == mod.REFERENCE, f, ("bfloat16",)))
        for v, (desc, f) in getattr(mod, "BACKWARD_VERSIONS", {}).items():
            out.append(("backward", f"{lang} {v}", lang, v, desc, v == mod.BACKWARD_REFERENCE, f, dts))
        out.append(("rmsnorm forward", f"{lang} rmsnorm", lang, "rmsnorm", "RMSNorm forward", True, mod.rmsnorm, dts))
        out.append(("rmsnorm backward", f"{lang} rmsnorm_backward", lang, "rmsnorm_backward", "RMSNorm backward",
                    True, mod.rmsnorm_backward, dts))

    def ln_bwd(dy, x, w, mean, rstd):
        return torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[1]], mean[:, None], rstd[:, None], w, w,
                                                         [True, True, True])

    fused = getattr(torch.ops.aten, "_fused_rms_norm_backward", None)

    def rms_bwd(dy, x, w, rstd):
        if fused is not None and x.is_cuda:  # torch's own RMSNorm backward kernel, from the saved rstd
            return fused(dy, x, [x.shape[1]], rstd[:, None], w, [True, True])
        xr = x.detach().requires_grad_(True)
        wr = w.detach().requires_grad_(True)
        return torch.autograd.grad(F.rms_norm(xr, (x.shape[1],), wr, EPS), (xr, wr), dy)

    out += [
        # The bytes of one forward pass, copied: what the pass could take at best at that size
        # (a copy of 128 MB does not reach the rate of the 2 GB copy the roofline is).
        ("copy", "copy", "torch", "copy_same_bytes", "y.copy_(x): x read and y written, the forward's bytes",
         False, lambda x, w, b: torch.empty_like(x).copy_(x), ("float32", "bfloat16")),
        ("forward", "torch", "torch", "eager", "F.layer_norm", False,
         lambda x, w, b: F.layer_norm(x, (x.shape[1],), w, b, EPS), ("bfloat16",)),
        ("backward", "torch", "torch", "eager", "aten.native_layer_norm_backward (dx, dw, db)", False, ln_bwd,
         ("float32", "bfloat16")),
        ("rmsnorm forward", "torch", "torch", "eager", "F.rms_norm", False,
         lambda x, w: F.rms_norm(x, (x.shape[1],), w, EPS), ("float32", "bfloat16")),
        ("rmsnorm backward", "torch", "torch", "eager",
         "aten._fused_rms_norm_backward (dx, dw) from the saved rstd" if fused is not None else
         "F.rms_norm's autograd backward (its forward included: this torch has no RMSNorm backward op)", False, rms_bwd,
         ("float32", "bfloat16")),
    ]
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        out += [
            ("forward", "Liger", "torch", "liger", "Liger Kernel's LayerNorm (Triton)", False,
             lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS), ("bfloat16",)),
            ("rmsnorm forward", "Liger", "torch", "liger", "Liger Kernel's RMSNorm (Triton)", False,
             lambda x, w: LigerRMSNormFunction.apply(x, w, EPS), ("float32", "bfloat16")),
        ]
    except Exception:
        pass
    return out


def _bytes(kind, shape, itemsize):
    rows, cols = shape
    if kind in ("forward", "rmsnorm forward", "copy"):
        return 2 * itemsize * rows * cols
    if kind == "backward":
        return _spec().layernorm_backward_bytes(shape, itemsize)
    return itemsize * (3 * rows * cols + cols) + 4 * rows  # rmsnorm backward: x, dy, w, rstd; dx, dw


def _timed_inputs(kind, shape, dtype):
    spec = _spec()
    x, w, b = spec.layernorm_input(shape, seed=1, dtype=dtype, device=utils.DEVICE)
    if kind in ("forward", "copy"):
        return (x, w, b)
    if kind == "rmsnorm forward":
        return (x, w)
    dy = torch.randn(shape, device=utils.DEVICE).to(dtype)
    xf = x.float()
    if kind == "backward":
        return (dy, x, w, xf.mean(1), torch.rsqrt(xf.var(1, unbiased=False) + EPS))
    return (dy, x, w, torch.rsqrt(xf.pow(2).mean(1) + EPS))


def run_topic(events, sizes, *, skip=(), languages=None, sweep=True, main=True, deadline=None,
              sweep_deadline=None, warmup=25, rep=100):
    from . import harness
    from .topics import main_shapes

    languages = list(languages or ("cuda", "numba", "triton"))
    harness.run_topic(TOPIC, events, sizes, skip=skip, languages=languages, sweep=sweep, main=main,
                      deadline=deadline, sweep_deadline=sweep_deadline, warmup=warmup, rep=rep, generic=True)
    if not main:
        return
    fwd_shapes = main_shapes(TOPIC, sizes)
    extra_shape = EXTRA_SHAPE if not utils.SIMULATE else tuple(fwd_shapes[0])
    check_shapes = [(7, 3), (33, 4097), (1823, 781)] if not utils.SIMULATE else [(7, 3), (5, 257)]
    for kind, base, lang, version, desc, ref, fn, dts in contenders(languages):
        for dname in dts:
            dtype = DTYPES[dname]
            variant = variant_name(base, dname, kind)
            shapes = fwd_shapes if kind in ("forward", "copy") else [extra_shape]
            if f"{variant}@*" in skip:
                continue
            meta = dict(topic=TOPIC, variant=variant, lang=lang, version=version, dtype=dname, **{"pass": kind})
            why = None
            try:
                for s in check_shapes:
                    why = check_case(kind, fn, s, dtype)
                    if why:
                        why = f"at {s[0]}x{s[1]}: {why}"
                        break
            except (ValueError, TypeError) as e:
                events.emit(event="failed", key=f"{variant}@*", **meta, shape=None, status="unsupported",
                            reason=harness._short(e))
                continue
            except Exception as e:
                why = f"raised {type(e).__name__}: {harness._short(e)}"
            if why:
                events.emit(event="failed", key=f"{variant}@*", **meta, shape=None, status="failed check", reason=why)
                continue
            for shape in shapes:
                harness.time_row(events, meta, shape, fn, lambda: _timed_inputs(kind, shape, dtype),
                                 lambda args: _bytes(kind, shape, args[0].element_size()), skip=skip,
                                 deadline=deadline, warmup=warmup, rep=rep, reference=ref, description=desc,
                                 host=(ref or lang == "torch") and kind != "copy")


def evaluate(rows: list[dict]) -> list[dict]:
    """The targets of the bfloat16 forward, the backward and RMSNorm: the reference row of each
    language against the copy roofline or torch eager's row of the same pass, dtype and shape."""
    mine = [r for r in rows if r.get("topic") == TOPIC and r.get("pass")]
    shapes_all = sorted({tuple(r["shape"]) for r in mine if r.get("pass") == "forward"})
    out = []
    for kind, dname, langs, how, thr, shapes in EXTRA_TARGETS:
        for lang in langs:
            for shape in (shapes or shapes_all):
                r = next((r for r in mine if r["lang"] == lang and r.get("reference") and r["pass"] == kind
                          and r["dtype"] == dname and tuple(r["shape"]) == tuple(shape)), None)
                t = next((r for r in mine if r["lang"] == "torch" and r["version"] == "eager" and r["pass"] == kind
                          and r["dtype"] == dname and tuple(r["shape"]) == tuple(shape)), None)
                if how == "copy":
                    value = r.get("fraction_of_copy") if r else None
                    goal, unit = f">= {thr:.0%} of copy", "fraction_of_copy"
                else:
                    value = r["gbps"] / t["gbps"] if (r and t and t.get("gbps")) else None
                    goal, unit = f">= {thr:g}x torch eager", "ratio_to_torch"
                row = dict(topic=TOPIC, lang=lang, variant=r["variant"] if r else variant_name(lang, dname, kind),
                           shape=list(shape), goal=goal, value=value, threshold=thr, unit=unit,
                           met=None if value is None else bool(value >= thr), dtype=dname, **{"pass": kind})
                if how == "torch":
                    row["versus"] = f"torch eager {kind}"
                if row["met"] is False:
                    row["why"] = _why(kind, dname, shape, mine, r)
                out.append(row)
    return out


def _why(kind, dname, shape, rows, r) -> str:
    """What the record itself says about a missed target: first, whether the host set the time
    (the launcher's host time and the CUDA-graph replay, measured beside the row); else, for the
    forward, a copy of the same bytes in the same run; else what the kernel's own time was."""
    if _host_bound(r):
        return _host_why(r)
    if kind == "forward":
        copy = next((c for c in rows if c.get("pass") == "copy" and c["dtype"] == dname
                     and tuple(c["shape"]) == tuple(shape)), None)
        if copy and copy.get("fraction_of_copy") and r and r.get("gbps"):
            return (f"a plain copy of the same bytes (y.copy_(x), {dname}, {shape[0]}x{shape[1]}) reached "
                    f"{copy['fraction_of_copy']:.1%} of the 2 GB copy in this run, the ceiling of a pass this "
                    f"size; the kernel ran at {r['gbps'] / copy['gbps']:.0%} of that copy")
    return _host_why(r) or "not found yet"


def _host_bound(r) -> bool:
    """The row's call replayed from a CUDA graph (no host time) took under 90 % of its timed call."""
    return bool(r and r.get("median_ms") and r.get("graph_ms") and r["graph_ms"] < 0.9 * r["median_ms"])


def _host_why(r) -> str | None:
    """Whether the host or the kernel set a row's time, from what its run measured beside it:
    the launcher's host time per call (``host_us``) and the call replayed from a CUDA graph
    (``graph_ms``, the GPU's time alone)."""
    if not r or not r.get("median_ms") or r.get("host_us") is None:
        return None
    ms, host, graph = r["median_ms"], r["host_us"], r.get("graph_ms")
    said = f"timed at {ms * 1e3:.0f} us a call; its launcher's host time is {host:.0f} us a call"
    if not graph:
        return said
    frac = r.get("fraction_of_copy")
    at = f" ({frac * ms / graph:.0%} of copy)" if frac else ""
    said += f", and the same call replayed from a CUDA graph (no host time) takes {graph * 1e3:.0f} us{at}"
    return said + (": the host, not the kernel, sets the time" if _host_bound(r) else
                   ": the kernel itself sets the time")
