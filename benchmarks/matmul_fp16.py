"""The matmul_fp16 topic's measurements (``python -m benchmarks --topics matmul_fp16``).

The harness's own worker measures every version in float16, at the main shapes and in the size
sweep, beside torch.mm (cuBLAS) and torch.compile. This worker runs it, then adds what one dtype
cannot say: the **bfloat16** product of every Triton version and of cuBLAS (``torch.mm`` in
bfloat16, fp32 accumulation) at the main shapes (on a GPU 4096³ and 4095 x 4097 x 4093), each
version checked first against the float64 product of the same bfloat16 inputs at awkward
shapes. The CUDA C++ versions (``nvcuda::wmma`` on ``half``) take float16 only.

Each row is a row like the harness's plus ``dtype``: ``"triton v3 [bfloat16]"``, ``"torch
[bfloat16]"``. Their targets (``EXTRA_TARGETS``) are evaluated by ``evaluate``; the float16
targets stay in the topic's spec.
"""
from __future__ import annotations

import torch

import utils

TOPIC = "matmul_fp16"
DTYPE = "bfloat16"
#: (shape, threshold): the reference Triton version against cuBLAS's bfloat16 product.
EXTRA_TARGETS = [((4096, 4096, 4096), 0.9), ((4095, 4097, 4093), 1.0)]
CHECK_SHAPES = {"gpu": [(1, 1, 1), (127, 33, 65), (257, 129, 1000)], "simulation": [(1, 1, 1), (33, 17, 40)]}


def variant_name(base: str) -> str:
    return f"{base} [{DTYPE}]"


def _inputs(shape, seed):
    from utils.topics.matmul import make_inputs
    return make_inputs(shape, seed, utils.DEVICE, torch.bfloat16)


def check_case(fn, shape, seed=7) -> str | None:
    """None, or what is wrong with ``fn``'s bfloat16 product at ``shape`` (M, N, K), against the
    float64 product of the same inputs within the topic's bfloat16 tolerance, with the memory the
    output will get poisoned first (as the harness's check does)."""
    from utils.topics.matmul import matmul_ref64, spec_tolerance

    from .harness import _poison
    a, b = _inputs(shape, seed)
    _poison(shape[0] * shape[1], a.device)
    c = fn(a, b)
    if utils.DEVICE.type == "cuda":
        torch.cuda.synchronize()  # an asynchronous launch error surfaces here
    if not isinstance(c, torch.Tensor) or tuple(c.shape) != tuple(shape[:2]):
        return f"returned {type(c).__name__} of shape {tuple(getattr(c, 'shape', ()))}, not {tuple(shape[:2])}"
    if c.dtype not in (torch.bfloat16, torch.float32):
        return f"returned {c.dtype}, not bfloat16 or float32"
    want = matmul_ref64(a, b)
    err = (c.double() - want).abs()
    ok = err <= spec_tolerance(torch.bfloat16)((a, b), want)  # fp32 sums, C rounded once to bfloat16
    if bool(ok.all()):
        return None
    return f"{int((~ok).sum())} of {ok.numel()} values wrong, max error {float(err.max()):.3g}"


def contenders():
    """(base, lang, version, description, reference, fn): the Triton versions and cuBLAS."""
    import kernels
    mod = kernels.module(TOPIC, "triton")
    out = [(f"triton {v}", "triton", v, desc, v == mod.REFERENCE, f) for v, (desc, f) in mod.VERSIONS.items()
           if v != "v1"]  # v1 is v2's exact-fp32 twin: C in float32, the same kernel
    out.append(("torch", "torch", "mm", "torch.mm (cuBLAS), bfloat16 in and out, fp32 accumulation", False, torch.mm))
    return out


def run_topic(events, sizes, *, skip=(), languages=None, sweep=True, main=True, deadline=None,
              sweep_deadline=None, warmup=25, rep=100):
    from . import harness
    from .topics import TOPICS, main_shapes

    languages = list(languages or ("cuda", "numba", "triton"))
    harness.run_topic(TOPIC, events, sizes, skip=skip, languages=languages, sweep=sweep, main=main,
                      deadline=deadline, sweep_deadline=sweep_deadline, warmup=warmup, rep=rep, generic=True)
    if not main or "triton" not in languages:
        return
    spec = TOPICS[TOPIC]
    checks = CHECK_SHAPES["simulation" if utils.SIMULATE else "gpu"]
    for base, lang, version, desc, ref, fn in contenders():
        variant = variant_name(base)
        if f"{variant}@*" in skip:
            continue
        meta = dict(topic=TOPIC, variant=variant, lang=lang, version=version, dtype=DTYPE)
        try:
            why = next((f"at {'x'.join(map(str, s))}: {w}" for s in checks if (w := check_case(fn, s))), None)
        except Exception as e:
            why = f"raised {type(e).__name__}: {harness._short(e)}"
        if why:
            events.emit(event="failed", key=f"{variant}@*", **meta, shape=None, status="failed check", reason=why)
            continue
        for shape in main_shapes(TOPIC, sizes):
            harness.time_row(events, meta, shape, fn, lambda: _inputs(shape, 1),
                             lambda args: spec.nbytes(shape),  # two bytes an element, as float16
                             skip=skip, deadline=deadline, warmup=warmup, rep=rep, reference=ref, description=desc)


def evaluate(rows: list[dict]) -> list[dict]:
    """The bfloat16 targets: the reference Triton row against cuBLAS's bfloat16 row at each shape."""
    mine = [r for r in rows if r.get("topic") == TOPIC and r.get("dtype") == DTYPE]
    out = []
    for shape, thr in EXTRA_TARGETS:
        r = next((r for r in mine if r["lang"] == "triton" and r.get("reference") and tuple(r["shape"]) == shape), None)
        t = next((r for r in mine if r["lang"] == "torch" and tuple(r["shape"]) == shape), None)
        value = r["median_ms"] and t["median_ms"] / r["median_ms"] if (r and t) else None
        goal = ">= torch.mm bf16" if thr == 1 else f">= {thr:.0%} of torch.mm bf16"
        out.append(dict(topic=TOPIC, lang="triton", variant=r["variant"] if r else variant_name("triton"),
                        shape=list(shape), goal=goal, value=value, threshold=thr, unit="ratio_to_torch",
                        met=None if value is None else bool(value >= thr), dtype=DTYPE, versus="torch.mm bf16"))
    return out
