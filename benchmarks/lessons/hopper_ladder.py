"""Lesson 12's GEMM ladder on a Hopper GPU: every CUDA C++ version of kernels/cuda/hopper.cu
(and of kernels/triton/hopper.py when it exists) and CUTLASS's SM90 GEMM (hopper_cutlass.cu,
built by nvcc: a minute) checked, timed against cuBLAS, and the
typical mistakes of kernels/cuda/hopper_mistakes.cu run on the GPU beside what the emulator reports.

    python -m benchmarks.lessons.hopper_ladder [--out FILE] [--quick]

Each version is first checked against the float64 product at awkward shapes (tails in M, N
and K, K not a multiple of 8). Then C = A @ B^T, bfloat16 in and out, float32 accumulation, is
timed with triton.testing.do_bench (median, on random inputs) at 4096^3, 8192^3 and
4095 x 4097 x 4093, beside torch's F.linear (cuBLAS) on the same inputs: TFLOP/s = 2 M N K /
time. Each mistake runs in its own process with a time limit (some hang on a GPU, one faults
the CUDA context): what happened there (an error, a hang, a wrong or a right result) is
recorded next to the emulator's report, which tests/test_hopper.py checks.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

import utils
from benchmarks.lessons import load_gpu_record
from kernels.cuda import hopper as H

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4095, 4097, 4093)]
CHECKS = [(1, 1, 1), (127, 33, 65), (257, 300, 1000), (128, 256, 64)]
MISTAKES = {0: "the right kernel", 1: "arrive_expect_tx announces half the bytes", 2: "the phase bit not flipped",
            3: "a wgmma descriptor with another swizzle than the tensor map's", 4: "a tile not 128-byte aligned",
            5: "a TMA load into a tile a wgmma still reads", 6: "half a warpgroup issues the wgmma",
            7: "the accumulators read before wgmma_wait", 8: "a wrong stride byte offset in a descriptor",
            9: "wgmma never waited for", 10: "TMA loads never waited for",
            11: "a tile written by ordinary stores, not fenced for the async proxy",
            12: "the same tile, fenced (fence_proxy_async): right"}
RESULT = "{gpu}-hopper-ladder.json"
OUT = utils.LESSON_RESULTS_DIR / RESULT.format(gpu="h200")


def contenders():
    out = [(f"cuda {v}", desc, f) for v, (desc, f) in H.VERSIONS.items()]
    try:
        from kernels.triton import hopper as T
        out += [(f"triton {v}", desc, f) for v, (desc, f) in T.VERSIONS.items()]
    except ImportError:
        pass
    for cluster in (1, 2):
        out.append((f"cutlass {cluster}x1", f"CUTLASS's SM90 GEMM (CuTe collectives), cooperative, {cluster} x 1 "
                    "clusters", lambda a, b, cluster=cluster: H.cutlass_gemm(a, b, cluster=cluster)))
    out.append(("cublas", "torch F.linear (cuBLAS), bfloat16 in and out", H.hopper_torch))
    return out


def inputs(shape, seed=0):
    m, n, k = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
    return a, b


def check(fn) -> str | None:
    for shape in CHECKS:
        a, b = inputs(shape, seed=sum(shape))
        c = fn(a, b)
        torch.cuda.synchronize()
        ref = H.hopper_ref(a, b)
        err = (c.double() - ref).abs()
        tol = ref.abs() * 2.0 ** -8 + 1e-3 * shape[2] ** 0.5
        if c.shape != ref.shape or not bool((err <= tol).all()):
            return f"at {shape}: {int((err > tol).sum())} wrong of {err.numel()}, max error {float(err.max()):.3g}"
    return None


def time_rows(log) -> list[dict]:
    from triton.testing import do_bench
    rows = []
    for name, desc, fn in contenders():
        try:
            why = check(fn)
        except Exception as e:
            why = f"raised {type(e).__name__}: {str(e)[:300]}"
        if why:
            rows.append(dict(variant=name, description=desc, status="failed check", reason=why))
            log(f"{name}: FAILED CHECK {why}")
            continue
        for shape in SHAPES:
            ab = inputs(shape, seed=1)
            ms = do_bench(lambda ab=ab: fn(*ab), warmup=25, rep=100)
            tflops = 2 * shape[0] * shape[1] * shape[2] / ms / 1e9
            rows.append(dict(variant=name, description=desc, shape=list(shape), median_ms=ms, tflops=tflops))
            log(f"{name:12s} {shape}: {ms * 1e3:8.1f} us  {tflops:6.1f} TFLOP/s")
    for r in rows:
        base = next((x for x in rows if x["variant"] == "cublas" and x.get("shape") == r.get("shape")), None)
        if base and r.get("median_ms"):
            r["vs_cublas"] = base["median_ms"] / r["median_ms"]
    return rows


_CHILD = r"""
import sys, json, torch, utils
from pathlib import Path
m = int(sys.argv[1])
k = utils.cuda_kernel(Path("kernels/cuda/hopper_mistakes.cu"), "one_tile_kernel")
g = torch.Generator(device="cuda").manual_seed(3)
a = torch.randn(64, 128, device="cuda", generator=g).to(torch.bfloat16)
b = torch.randn(64, 128, device="cuda", generator=g).to(torch.bfloat16)
maps = utils.tensor_map(a, 64, 64), utils.tensor_map(b, 64, 64)
c = torch.full((64, 64), float("nan"), device="cuda")
try:
    k[1, 128, 4 * 64 * 64 * 2 + 2048](*maps, c, m)
    torch.cuda.synchronize()
except Exception as e:
    print(json.dumps({"outcome": "error", "detail": f"{type(e).__name__}: {str(e)[:300]}"}))
    sys.exit(0)
ref = a.double() @ b.double().T
if m == 7:
    out = {"outcome": "ran", "nan": int(torch.isnan(c).sum()), "detail": "per-thread dump of the accumulators"}
else:
    err = (c.double() - ref).abs()
    ok = bool((err <= ref.abs() * 1e-5 + 1e-3).all())
    out = {"outcome": "right result" if ok else "wrong result", "max_error": float(err.nan_to_num(1e30).max()),
           "nan": int(torch.isnan(c).sum())}
print(json.dumps(out))
"""


def mistakes(log) -> dict:
    out = {}
    env = dict(os.environ)
    procs = {m: subprocess.Popen([sys.executable, "-c", _CHILD, str(m)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env) for m in MISTAKES}
    deadline = time.time() + 45
    for m, p in procs.items():
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - time.time()))
            line = next((ln for ln in reversed(so.splitlines()) if ln.startswith("{")), None)
            rec = json.loads(line) if line else {"outcome": "crashed", "detail": se[-400:]}
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            rec = {"outcome": "hang", "detail": "killed after the time limit: the kernel never finished"}
        rec["mistake"] = MISTAKES[m]
        out[str(m)] = rec
        log(f"mistake {m} ({MISTAKES[m]}): {rec['outcome']} {rec.get('max_error', '')} {rec.get('detail', '')[:150]}")
    return out


def resources() -> dict:
    res = {}
    for v in H.VERSIONS:
        try:
            res[v] = utils.cuda_resources(H.SOURCE, f"hopper_gemm_{v}_kernel")
        except Exception as e:
            res[v] = {"error": str(e)[:300]}
    return res


def load_recorded(path=None) -> tuple[dict, str | None]:
    """The recorded ladder (``path``, else the newest GPU's ``<gpu>-hopper-ladder.json`` in
    ``benchmarks/results/lessons/``) and the GPU's short name."""
    return load_gpu_record(RESULT, "hopper_ladder", path)


def format_rows(rec: dict) -> str:
    """The timed rows as a table: TFLOP/s at each shape and the ratio to cuBLAS."""
    shapes = [tuple(s) for s in dict.fromkeys(tuple(r["shape"]) for r in rec["rows"] if r.get("shape"))]
    head = f"{'version':12s}" + "".join(f"{'x'.join(map(str, s)):>26s}" for s in shapes)
    lines = [head]
    for name in dict.fromkeys(r["variant"] for r in rec["rows"]):
        cells = []
        for s in shapes:
            r = next((r for r in rec["rows"] if r["variant"] == name and tuple(r.get("shape") or ()) == s), None)
            cells.append(f"{r['tflops']:7.0f} TFLOP/s {r['vs_cublas']:5.2f}x" if r and r.get("tflops") else
                         f"{'(failed check)':>26s}")
        lines.append(f"{name:12s}" + "".join(f"{c:>26s}" for c in cells))
    return "\n".join(lines)


def plot_ladder(rec: dict, shape=(4096, 4096, 4096), ax=None):
    """TFLOP/s of each version at ``shape``, cuBLAS as a line."""
    from utils.plots import _new_axes, variant_color
    rows = [r for r in rec["rows"] if tuple(r.get("shape") or ()) == tuple(shape) and r.get("tflops")]
    mine = [r for r in rows if r["variant"] != "cublas"]
    base = next((r for r in rows if r["variant"] == "cublas"), None)
    fig, ax = _new_axes(ax, (7, 3.2))
    ax.bar([r["variant"] for r in mine], [r["tflops"] for r in mine],
           color=[variant_color(r["variant"]) for r in mine])
    if base:
        ax.axhline(base["tflops"], color="black", linestyle="--", linewidth=1)
        ax.text(len(mine) - 0.5, base["tflops"], " cuBLAS", va="bottom", ha="right")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"C = A @ B^T, bfloat16, {'x'.join(map(str, shape))}, on the {utils.gpu_short_name(rec.get('gpu'))}")
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--quick", action="store_true", help="4096^3 only")
    args = ap.parse_args()
    if args.quick:
        SHAPES[:] = SHAPES[:1]
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)
    rec = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, python=platform.python_version(),
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **utils.source_commit(),
               method=" ".join(__doc__.split("\n\n")[2].split()))
    rec["resources"] = resources()
    log(f"resources: {json.dumps(rec['resources'])}")
    rec["mistakes"] = mistakes(log)
    rec["rows"] = time_rows(log)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
