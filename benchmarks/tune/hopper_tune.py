"""The knobs of lesson 12's CUDA C++ GEMM ladder on a Hopper GPU: every version checked, then
v4, v5 and v6 timed against cuBLAS at 4096^3, 8192^3 and 4095 x 4097 x 4093 for each tile
order of the persistent versions (GROUP_M of kernels/cuda/hopper.py), and the compiler's
resources (registers, spills) of each kernel; optionally v4 and v6 under Nsight Compute's
speed-of-light section, and what hopper.h's choices cost: v4 and v5 built against copies
of the header that differ in one of them (``VARIANTS``), with ptxas's remarks on each build.

    python -m benchmarks.tune.hopper_tune [--out DIR] [--groups 1,8,16] [--ncu] [--variants] [--triton] [--inputs]

``--triton`` times instead each config of the Triton kernels on its own, checked first, beside
cuBLAS: v1's (``TMA_SHAPES``) and v2's (``WS_SHAPES``), which the autotuner picks from per shape,
and the candidates of ``TRITON_CANDIDATES``.

Writes DIR/hopper-tune.json (and DIR/hopper-ncu-<version>.txt); prints one line per timing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import utils
from benchmarks.lessons.hopper_ladder import SHAPES, check, inputs
from kernels.cuda import hopper as H

_LOAD = '    asm volatile("cp.async.bulk.tensor.2d.shared::cluster'
_TRAP = 'if (globaltimer_ns() - start > COURSE_MBARRIER_TIMEOUT_NS) asm volatile("trap;");'
_WAIT = ("    if (mbarrier_try_wait(bar, phase)) return;\n    uint64_t start = globaltimer_ns();\n"
         "    while (!mbarrier_try_wait(bar, phase))\n        " + _TRAP)
#: name -> replacements in hopper.h: the header as it is; with the tensor-map acquire fence
#: before every TMA load (as it was); with a printf (a function call) before the wait's trap (as
#: it was); without the wait's time limit
VARIANTS = {
    "as is": [],
    "a fence before every load": [(_LOAD, "    tma_acquire(map);\n" + _LOAD)],
    "printf before the trap": [(_TRAP, _TRAP.replace('asm volatile("trap;");', '{ printf("hopper.h: an mbarrier '
                                                     'wait timed out\\n"); asm volatile("trap;"); }'))],
    "plain spin, no time limit": [(_WAIT, "    while (!mbarrier_try_wait(bar, phase)) {}")],
}


def ptxas_remarks(source: Path, name: str) -> str:
    """ptxas's performance remarks (C75xx) on one kernel, built by NVRTC as the course builds it."""
    from runtime.backends.cuda import _gpu
    log = _gpu.ptxas_log(source.read_text(), name, source.name, source.parent)
    return "\n".join(ln for ln in log.splitlines() if "C75" in ln or "spill" in ln or "Used" in ln)


def header_variants(out: Path, rec: dict) -> None:
    import tempfile

    from kernels._launch import cuda_kernels

    from triton.testing import do_bench
    header = H.HEADER.read_text()
    original = H.kernel
    rec["variants"] = []
    for label, subs in VARIANTS.items():
        text = header
        for old, new in subs:
            if old not in text:
                raise SystemExit(f"variant {label!r}: {old[:60]!r} is not in hopper.h")
            text = text.replace(old, new)
        tmp = Path(tempfile.mkdtemp(prefix="hopper-variant-"))
        (tmp / "hopper.h").write_text(text)
        shutil.copy(H.HEADER.with_name("hopper_wgmma.h"), tmp)
        shutil.copy(H.SOURCE, tmp)
        H.kernel = cuda_kernels(tmp / "hopper.cu")
        try:
            for v in ("v4", "v5"):
                try:
                    remarks = ptxas_remarks(tmp / "hopper.cu", f"hopper_gemm_{v}_kernel")
                except Exception as e:
                    remarks = f"(no remarks: {type(e).__name__}: {str(e)[:200]})"
                fn = H.VERSIONS[v][1]
                why = check(fn)
                row = dict(variant=label, version=v, check=why or "ok", ptxas=remarks)
                if not why:
                    for shape in SHAPES[:2]:
                        ab = inputs(shape, seed=1)
                        ms = do_bench(lambda: fn(*ab), warmup=25, rep=100)
                        row[f"tflops {'x'.join(map(str, shape))}"] = 2 * shape[0] * shape[1] * shape[2] / ms / 1e9
                rec["variants"].append(row)
                print(f"variant {label!r} {v}: {json.dumps(row)}", flush=True)
        finally:
            H.kernel = original
        (out / "hopper-tune.json").write_text(json.dumps(rec, indent=1) + "\n")


_NCU_CHILD = r"""
import sys, torch
from kernels.cuda import hopper as H
from benchmarks.lessons.hopper_ladder import inputs
a, b = inputs((4096, 4096, 4096), seed=1)
fn = H.VERSIONS[sys.argv[1]][1]
for _ in range(3):
    fn(a, b)
torch.cuda.synchronize()
"""


#: Triton configs tried beside the kernels' own: v1 (8 warps, no warp specialisation) with C
#: stored in two halves (EPILOGUE_SUBTILE), which leaves room for a fourth stage of 128 x 256. On
#: the H200 none beat v1's own configs at 4096^3 or 8192^3 (h200-hopper-tune-triton.json).
TRITON_CANDIDATES = {"v1": [(128, 256, 64, 8, 8, 4, True), (256, 128, 64, 8, 8, 4, True), (128, 256, 64, 8, 8, 3, True),
                            (128, 256, 64, 16, 8, 4, True)]}


def triton_configs(out: Path) -> None:
    """Each config of Triton v1 and v2 timed alone at ``SHAPES`` beside cuBLAS (and both as autotuned)."""
    from kernels.triton import hopper as T
    from runtime.backends.triton.compat import autotune

    from triton.testing import do_bench
    rec = dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               **utils.source_commit(), rows=[])
    fns = {"v1 autotuned": T.hopper_gemm_v1, "v2 autotuned": T.hopper_gemm_v2}
    for v, shapes in (("v1", T.TMA_SHAPES + TRITON_CANDIDATES["v1"]), ("v2", T.WS_SHAPES)):
        for cfg in T._configs(shapes, WARP_SPECIALIZE=v == "v2"):
            kern = autotune(configs=[cfg], key=["M", "N", "K"])(T.hopper_gemm_kernel)
            name = (f"{v} {cfg.kwargs['BLOCK_M']}x{cfg.kwargs['BLOCK_N']}x{cfg.kwargs['BLOCK_K']} "
                    f"g{cfg.kwargs['GROUP_M']} w{cfg.num_warps} s{cfg.num_stages}"
                    + (" subtile" if cfg.kwargs.get("EPILOGUE_SUBTILE") else ""))
            fns[name] = lambda a, b, kern=kern, op=f"hopper_gemm_{v}": T._gemm(kern, a, b, op)
    checks = {}
    for name, fn in fns.items():
        try:
            checks[name] = check(fn) or "ok"
        except Exception as e:
            checks[name] = f"raised {type(e).__name__}: {str(e)[:300]}"
        print(f"check {name}: {checks[name]}", flush=True)
    rec["checks"] = checks
    for shape in SHAPES:
        ab = inputs(shape, seed=1)
        flop = 2 * shape[0] * shape[1] * shape[2]
        base = do_bench(lambda: H.hopper_torch(*ab), warmup=25, rep=100)
        rec["rows"].append(dict(variant="cublas", shape=list(shape), median_ms=base, tflops=flop / base / 1e9))
        for name, fn in fns.items():
            if checks[name] != "ok":
                continue
            ms = do_bench(lambda: fn(*ab), warmup=25, rep=100)
            rec["rows"].append(dict(variant=f"triton {name}", shape=list(shape), median_ms=ms, tflops=flop / ms / 1e9,
                                    vs_cublas=base / ms))
            print(f"triton {name:34s} {shape}: {flop / ms / 1e9:6.1f} TFLOP/s  {base / ms:5.3f}x cuBLAS", flush=True)
        for v, kern in (("v1", T.hopper_v1_kernel), ("v2", T.hopper_v2_kernel)):
            best = list(getattr(kern, "cache", {}).values())[-1:]  # the config it picked for this shape
            rec.setdefault("autotuned", {})[f"{v} {'x'.join(map(str, shape))}"] = str(best[0]) if best else None
            print(f"{v} autotuned at {shape}: {best[0] if best else None}", flush=True)
        (out / "hopper-tune-triton.json").write_text(json.dumps(rec, indent=1) + "\n")


def input_kinds(out: Path) -> None:
    """The references' speed on the benchmarks' inputs (utils/topics/hopper.py: uniform in [-1, 1))
    and on the ladder's (normal), timed alternately, three times each, after Triton's autotuner
    picked its config on one kind or the other (``_INPUT_CHILD``, a process each)."""
    rec = dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               **utils.source_commit(), runs=[])
    for first in ("uniform", "normal"):
        p = subprocess.run([sys.executable, "-c", _INPUT_CHILD, first], capture_output=True, text=True, timeout=300)
        print(p.stdout[-4000:], p.stderr[-2000:], flush=True)
        rec["runs"].append(dict(autotuned_on=first, returncode=p.returncode,
                                rows=[json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]))
        (out / "hopper-tune-inputs.json").write_text(json.dumps(rec, indent=1) + "\n")


_INPUT_CHILD = r"""
import json, sys, torch
from triton.testing import do_bench
from benchmarks.lessons.hopper_ladder import inputs
from kernels.cuda import hopper as H
from kernels.triton import hopper as T
from utils.topics.hopper import hopper_input
first = sys.argv[1]
for shape in [(8192, 8192, 8192), (4096, 4096, 4096)]:
    kinds = {"uniform": hopper_input(shape, seed=0), "normal": inputs(shape, seed=1)}
    order = [first] + [k for k in kinds if k != first]
    T.hopper_gemm_v1(*kinds[order[0]])  # the autotuner picks its config on this kind
    torch.cuda.synchronize()
    picked = [str(c) for c in T.hopper_v1_kernel.cache.values()][-1:]
    flop = 2 * shape[0] * shape[1] * shape[2]
    fns = (("triton v1", T.hopper_gemm_v1), ("cuda v5", H.hopper_gemm_v5), ("cublas", H.hopper_torch))
    for rep in range(3):
        for kind in order:
            for name, fn in fns:
                ms = do_bench(lambda: fn(*kinds[kind]), warmup=25, rep=100)
                print(json.dumps(dict(shape=list(shape), kind=kind, rep=rep, variant=name, median_ms=ms,
                                      tflops=flop / ms / 1e9, autotuned=picked)), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("artifacts/tune"))
    ap.add_argument("--groups", default="1,8,16")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--variants", action="store_true", help="only the header variants")
    ap.add_argument("--triton", action="store_true", help="only the Triton configs, each alone")
    ap.add_argument("--inputs", action="store_true", help="only: does the kind of input change the speed?")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.triton:
        triton_configs(args.out)
        return
    if args.inputs:
        input_kinds(args.out)
        return
    from triton.testing import do_bench
    rec = dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               **utils.source_commit(), resources={}, checks={}, rows=[])
    for v in H.VERSIONS:
        try:
            rec["resources"][v] = utils.cuda_resources(H.SOURCE, f"hopper_gemm_{v}_kernel")
        except Exception as e:
            rec["resources"][v] = {"error": str(e)[:300]}
        print(f"resources {v}: {rec['resources'][v]}", flush=True)
    for v, (_, fn) in H.VERSIONS.items():
        try:
            why = check(fn)
        except Exception as e:
            why = f"raised {type(e).__name__}: {str(e)[:300]}"
        rec["checks"][v] = why or "ok"
        print(f"check {v}: {why or 'ok'}", flush=True)
    if args.variants:
        header_variants(args.out, rec)
        return
    groups = [int(g) for g in args.groups.split(",")]
    default = H.GROUP_M
    for shape in SHAPES:
        ab = inputs(shape, seed=1)
        flop = 2 * shape[0] * shape[1] * shape[2]
        ms = do_bench(lambda: H.hopper_torch(*ab), warmup=25, rep=100)
        base = ms
        rec["rows"].append(dict(variant="cublas", shape=list(shape), median_ms=ms, tflops=flop / ms / 1e9))
        print(f"cublas        {shape}: {flop / ms / 1e9:6.1f} TFLOP/s", flush=True)
        for v in ("v3", "v4", "v5", "v6"):
            if rec["checks"].get(v) != "ok":
                continue
            for g in (groups if v in ("v5", "v6") else [default]):
                H.GROUP_M = g
                fn = H.VERSIONS[v][1]
                ms = do_bench(lambda: fn(*ab), warmup=25, rep=100)
                rec["rows"].append(dict(variant=v, group_m=g, shape=list(shape), median_ms=ms,
                                        tflops=flop / ms / 1e9, vs_cublas=base / ms))
                print(f"{v} group {g:2d}  {shape}: {flop / ms / 1e9:6.1f} TFLOP/s  {base / ms:5.3f}x cuBLAS",
                      flush=True)
        H.GROUP_M = default
        (args.out / "hopper-tune.json").write_text(json.dumps(rec, indent=1) + "\n")
    ncu = shutil.which("ncu")
    if args.ncu and ncu:
        for v in ("v4", "v6"):
            t0 = time.time()
            p = subprocess.run([ncu, "--section", "SpeedOfLight", "--section", "Occupancy", "--kernel-name",
                                f"regex:hopper_gemm_{v}", "--launch-skip", "2", "--launch-count", "1", sys.executable,
                                "-c", _NCU_CHILD, v], capture_output=True, text=True, timeout=240,
                               env=dict(os.environ))
            (args.out / f"hopper-ncu-{v}.txt").write_text(p.stdout[-20000:] + p.stderr[-4000:])
            print(f"ncu {v}: {time.time() - t0:.0f} s, rc {p.returncode}", flush=True)
    (args.out / "hopper-tune.json").write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {args.out / 'hopper-tune.json'}")


if __name__ == "__main__":
    main()
