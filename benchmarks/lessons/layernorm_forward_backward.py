"""LayerNorm / RMSNorm on a GPU, forward AND backward: the part ``python -m benchmarks``
does not measure (its harness times one forward launcher per topic).

Checks every version against float64 on awkward shapes and on each timed shape first, then
times it with ``triton.testing.do_bench`` (median, 20th/80th percentiles) beside the copy
roofline, torch eager, torch.compile and Liger Kernel (when installed). Writes JSON:

    python -m benchmarks.lessons.layernorm_forward_backward --out benchmarks/results/lessons/h100-layernorm.json

Bytes: forward reads x and writes y; backward reads x, dy, w, mean, rstd and writes dx, dw,
db (``utils.topics.layernorm.layernorm_backward_bytes``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

import kernels
import utils
from utils.topics import layernorm as spec

SHAPES = [(4096, 4096), (4096, 16384), (65536, 512), (4096, 1024)]
CHECK = [(1823, 781), (1, 1), (7, 3), (33, 4097), (3, 20000)]
F = torch.nn.functional


DEADLINE = [float("inf")]


def bench(fn):
    from triton.testing import do_bench
    if time.time() > DEADLINE[0]:
        raise TimeoutError("out of time (--budget)")
    ms, lo, hi = do_bench(fn, quantiles=[0.5, 0.2, 0.8], warmup=25, rep=100)
    return ms, lo, hi


def ok_forward(f, dtype):
    worst = 0.0
    for shape in CHECK:
        x, w, b = spec.layernorm_input(shape, seed=7, dtype=dtype)
        try:
            y, mean, rstd = f(x, w, b)
        except ValueError:
            continue  # a version that refuses rows this long says so (the reference takes them)
        ref = spec.layernorm_ref64(x, w, b)
        tol = utils.tolerance(dtype)
        scale = x.double().abs().amax(dim=1, keepdim=True) * w.double().abs().max()
        err = (y.double() - ref).abs()
        allowed = tol["atol"] + tol["rtol"] * ref.abs() + 2 ** -22 * scale * (1 if dtype == torch.float32 else 256)
        if not bool((err <= allowed).all()):
            return f"wrong at {shape}: max error {float(err.max()):.3g}"
        m64, r64 = spec.layernorm_stats64(x)
        if (not torch.allclose(mean.double(), m64, rtol=1e-5, atol=1e-4)
                or not torch.allclose(rstd.double(), r64, rtol=1e-3)):
            return f"wrong mean/rstd at {shape}"
        worst = max(worst, float(err.max()))
    return None


def ok_backward(f, dtype):
    for shape in CHECK[:4]:
        x, w, _ = spec.layernorm_input(shape, seed=8, dtype=dtype)
        dy = torch.randn(shape, device=x.device).to(dtype)
        m64, r64 = spec.layernorm_stats64(x)
        dx, dw, db = f(dy, x, w, m64.float(), r64.float())
        rdx, rdw, rdb = spec.layernorm_backward_ref64(dy, x, w, mean=m64.float(), rstd=r64.float())
        tol = 1e-3 if dtype == torch.float32 else 5e-2
        for got, want, name in ((dx, rdx, "dx"), (dw, rdw, "dw"), (db, rdb, "db")):
            err = (got.double() - want).abs()
            if not bool((err <= tol * (1 + want.abs()) * (shape[0] ** 0.5 if name != "dx" else 1)).all()):
                return f"{name} wrong at {shape}: max error {float(err.max()):.3g}"
    return None


def fails(res, what, name, dtype, check, f) -> bool:
    """Whether ``check(f, dtype)`` (ok_forward or ok_backward) finds ``f`` wrong; the failure
    is recorded and printed."""
    try:
        bad = check(f, dtype)
    except Exception as e:
        bad = f"raised {type(e).__name__}: {e}"
    if bad:
        res["failures"].append(f"{what} {name} {dtype}: {bad}")
        print("FAIL", name, dtype, bad)
    return bool(bad)


def timed_row(res, name, dtype, shape, timing, nbytes) -> dict:
    """One result: ``timing`` is bench()'s (median, 20th, 80th percentile) in ms."""
    ms, lo, hi = timing
    gbps = nbytes / ms / 1e6
    return dict(version=name, dtype=str(dtype).replace("torch.", ""), shape=list(shape), ms=ms, ms_p20=lo,
                ms_p80=hi, gbps=gbps, copy_fraction=gbps / res["copy_gbps"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=float, default=0.0, help="seconds; later timings are skipped")
    args = p.parse_args()
    if args.budget:
        DEADLINE[0] = time.time() + args.budget
    res = {}
    try:
        run(res)
    finally:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))
        print("failures:", res.get("failures"))


def run(res):
    res.update(commit=utils.source_commit() if hasattr(utils, "source_commit") else None,
               gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               method="triton.testing.do_bench median (20th/80th percentiles), warmup 25 ms, rep 100 ms",
               bytes_forward="read x + write y", bytes_backward="read x, dy, w, mean, rstd; write dx, dw, db",
               forward=[], backward=[], rmsnorm=[], failures=[])
    n = 1 << 28
    a = torch.empty(n, device="cuda")
    b = torch.empty_like(a)
    ms, _, _ = bench(lambda: b.copy_(a))
    res["copy_gbps"] = 2 * 4 * n / ms / 1e6
    a = b = None  # frees the GPU memory
    print("copy", res["copy_gbps"])

    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction  # noqa: F401  (liger is usable only with both)
    except Exception as e:
        LigerLayerNormFunction = None
        res["liger"] = f"not importable: {e}"

    # ---------------- forward
    fwd = []
    for lang in ("cuda", "triton", "numba"):
        mod = kernels.module("layernorm", lang)
        for v, (desc, f) in mod.VERSIONS.items():
            fwd.append((f"{lang} {v}", lambda x, w, b, f=f: f(x, w, b, stats=True),
                        (torch.float32, torch.bfloat16) if lang == "triton" else (torch.float32,)))
    fwd.append(("torch eager", lambda x, w, b: torch.ops.aten.native_layer_norm(x, [x.shape[1]], w, b, 1e-5),
                (torch.float32, torch.bfloat16)))
    comp = torch.compile(lambda x, w, b: F.layer_norm(x, (x.shape[1],), w, b, 1e-5), dynamic=False)
    fwd.append(("torch.compile", lambda x, w, b: (comp(x, w, b), None, None), (torch.float32, torch.bfloat16)))
    if LigerLayerNormFunction is not None:
        fwd.append(("liger", lambda x, w, b: (LigerLayerNormFunction.apply(x, w, b, 1e-5), None, None),
                    (torch.float32, torch.bfloat16)))
    for name, f, dtypes in fwd:
        for dtype in dtypes:
            if name.startswith(("cuda", "triton", "numba")) and fails(res, "forward", name, dtype, ok_forward, f):
                continue
            for shape in SHAPES:
                x, w, bb = spec.layernorm_input(shape, seed=1, dtype=dtype)
                try:
                    timing = bench(lambda: f(x, w, bb))
                except Exception as e:
                    res["failures"].append(f"forward {name} {dtype} {shape}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                row = timed_row(res, name, dtype, shape, timing, 2 * x.numel() * x.element_size())
                res["forward"].append(row)
                print("fwd", name, row["dtype"], shape, f"{row['gbps']:.0f} GB/s {row['copy_fraction']:.0%}")

    # ---------------- backward
    bwd = []
    for lang in ("cuda", "triton", "numba"):
        mod = kernels.module("layernorm", lang)
        for v, (desc, f) in mod.BACKWARD_VERSIONS.items():
            bwd.append((f"{lang} {v}", f, (torch.float32, torch.bfloat16) if lang == "triton" else (torch.float32,)))

    def torch_bwd(dy, x, w, mean, rstd):
        return torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[1]], mean[:, None], rstd[:, None], w, w,
                                                         [True, True, True])
    bwd.append(("torch eager", torch_bwd, (torch.float32, torch.bfloat16)))
    for name, f, dtypes in bwd:
        for dtype in dtypes:
            if name != "torch eager" and fails(res, "backward", name, dtype, ok_backward, f):
                continue
            for shape in SHAPES:
                x, w, _ = spec.layernorm_input(shape, seed=1, dtype=dtype)
                dy = torch.randn(shape, device="cuda").to(dtype)
                mean = x.float().mean(dim=1)
                rstd = torch.rsqrt(x.float().var(dim=1, unbiased=False) + 1e-5)
                try:
                    timing = bench(lambda: f(dy, x, w, mean, rstd))
                except Exception as e:
                    res["failures"].append(f"backward {name} {dtype} {shape}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                row = timed_row(res, name, dtype, shape, timing, spec.layernorm_backward_bytes(shape, x.element_size()))
                res["backward"].append(row)
                print("bwd", name, row["dtype"], shape, f"{row['gbps']:.0f} GB/s {row['copy_fraction']:.0%}")
    if LigerLayerNormFunction is not None:
        for dtype in (torch.float32, torch.bfloat16):
            for shape in SHAPES:
                x, w, bb = spec.layernorm_input(shape, seed=1, dtype=dtype)
                x.requires_grad_(True), w.requires_grad_(True), bb.requires_grad_(True)
                y = LigerLayerNormFunction.apply(x, w, bb, 1e-5)
                dy = torch.randn_like(y)
                row = timed_row(res, "liger", dtype, shape,
                                bench(lambda: torch.autograd.grad(y, (x, w, bb), dy, retain_graph=True)),
                                spec.layernorm_backward_bytes(shape, x.element_size()))
                res["backward"].append(row)
                print("bwd liger", dtype, shape, f"{row['gbps']:.0f}")

    # ---------------- RMSNorm forward
    for lang in ("cuda", "triton", "numba"):
        mod = kernels.module("layernorm", lang)
        for shape in SHAPES:
            x, w, _ = spec.layernorm_input(shape, seed=1)
            x = torch.randn_like(x)
            if not torch.allclose(mod.rmsnorm(x, w).double(), spec.rmsnorm_ref64(x, w), atol=1e-4, rtol=1e-4):
                res["failures"].append(f"rmsnorm {lang} wrong at {shape}")
                continue
            res["rmsnorm"].append(timed_row(res, f"{lang} rmsnorm", torch.float32, shape,
                                            bench(lambda: mod.rmsnorm(x, w, stats=True)), 2 * x.numel() * 4))
    for shape in SHAPES:
        x = torch.randn(shape, device="cuda")
        w = torch.randn(shape[1], device="cuda")
        res["rmsnorm"].append(timed_row(res, "torch F.rms_norm", torch.float32, shape,
                                        bench(lambda: F.rms_norm(x, (shape[1],), w, 1e-5)), 2 * x.numel() * 4))
    for r in res["rmsnorm"]:
        print("rms", r["version"], r["shape"], f"{r['gbps']:.0f}")


if __name__ == "__main__":
    main()
