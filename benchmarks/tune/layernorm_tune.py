"""Sweep the tuning knobs of the LayerNorm/RMSNorm kernels and of Triton's fp16/bf16 matmul on
a GPU, in one run: every configuration is checked against PyTorch, then timed with
``triton.testing.do_bench`` (median) beside the copy roofline measured in the same run.

    python -m benchmarks.tune.layernorm_tune --out DIR [--budget S] [--parts host:40,ln:150,bwd:60,mm:110,probe:120]

Writes ``DIR/tune.json`` after every measurement (a run cut short keeps what it measured).
The configurations the kernels use by default were picked from such a run; the recorded
numbers come from ``python -m benchmarks`` and ``benchmarks/lessons/layernorm_forward_backward.py``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

import utils

F = torch.nn.functional
SHAPES = [(4096, 4096), (4096, 16384), (65536, 512)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
RES: dict = {"ln": [], "bwd": [], "mm": [], "host": [], "graph": [], "probe": [], "errors": []}
OUT = [None]
DEADLINE = [float("inf")]


def save():
    OUT[0].write_text(json.dumps(RES, indent=1, default=str))


def left() -> float:
    return DEADLINE[0] - time.time()


def bench(fn, warmup=10, rep=40):
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2, 0.8])


def err(where, e):
    RES["errors"].append(f"{where}: {type(e).__name__}: {str(e)[:400]}")
    print("ERROR", where, type(e).__name__, str(e)[:300], flush=True)


def inputs(shape, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(shape, device="cuda", generator=g) * 2 + 0.5).to(dtype)
    w = (torch.randn(shape[1], device="cuda", generator=g)).to(dtype)
    b = (torch.randn(shape[1], device="cuda", generator=g)).to(dtype)
    return x, w, b


def close(got, want, dtype):
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    return bool(torch.allclose(got.float(), want.float(), atol=tol, rtol=tol))


def record(part, **row):
    RES[part].append(row)
    save()
    msg = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
    print(part, msg, flush=True)


def time_fwd(part, name, fn, shape, dtype, ref=None, nbytes=None, **extra):
    if left() < 5:
        return
    try:
        if ref is not None:
            out = fn()
            out = out[0] if isinstance(out, tuple) else out
            if not close(out, ref, DTYPES[dtype] if isinstance(dtype, str) else dtype):
                record(part, name=name, shape=list(shape), dtype=dtype, status="WRONG",
                       max_err=float((out.float() - ref.float()).abs().max()), **extra)
                return
        ms, lo, hi = bench(fn)
        gbps = nbytes / ms / 1e6 if nbytes else None
        record(part, name=name, shape=list(shape), dtype=dtype, ms=ms, p20=lo, p80=hi, gbps=gbps,
               frac=gbps / RES["copy_gbps"] if gbps else None, **extra)
    except Exception as e:
        err(f"{part} {name} {shape} {dtype} {extra}", e)


# ---------------------------------------------------------------------------------------
def part_ln():
    import kernels
    from kernels.triton import layernorm as tln

    import triton
    cln = kernels.module("layernorm", "cuda")
    nln = kernels.module("layernorm", "numba")
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except Exception as e:
        LigerLayerNormFunction = None
        RES["liger"] = f"not importable: {e}"
    for shape in SHAPES:
        for dname, dtype in DTYPES.items():
            x, w, b = inputs(shape, dtype)
            ref = F.layer_norm(x.float(), (shape[1],), w.float(), b.float(), 1e-5).to(dtype)
            nbytes = 2 * x.numel() * x.element_size()
            rows, cols = shape
            time_fwd("ln", "torch eager", lambda: F.layer_norm(x, (cols,), w, b, 1e-5), shape, dname, ref, nbytes)
            if LigerLayerNormFunction is not None:
                time_fwd("ln", "liger", lambda: LigerLayerNormFunction.apply(x, w, b, 1e-5), shape, dname, ref, nbytes)
            time_fwd("ln", "triton v3 (launcher)", lambda: tln.layernorm(x, w, b), shape, dname, ref, nbytes,
                     config=list(tln.rows_config(cols, x.element_size())))
            time_fwd("ln", "triton v2 (launcher)", lambda: tln.layernorm_row(x, w, b), shape, dname, ref, nbytes)
            # Triton: ROWS x warps
            y = torch.empty_like(x)
            mean = torch.empty(rows, device="cuda")
            rstd = torch.empty(rows, device="cuda")
            block = triton.next_power_of_2(cols)
            for nrows in (1, 2, 4, 8, 16):
                if nrows * block * x.element_size() > 65536 or nrows * block < 1024:
                    continue
                for warps in (4, 8, 16):
                    if nrows * block // (32 * warps) < 4 or nrows * block // (32 * warps) > 32:
                        continue

                    def run(nrows=nrows, warps=warps):
                        tln.layernorm_rows_kernel[(triton.cdiv(rows, nrows),)](
                            x, w, b, y, mean, rstd, rows, cols, 1e-5, ROWS=nrows, BLOCK=block, num_warps=warps)
                        return y
                    time_fwd("ln", "triton rows kernel", run, shape, dname, ref, nbytes, rows_=nrows, warps=warps)
            # CUDA v5: (items, rows per block, threads)
            if hasattr(cln, "vec_configs"):
                time_fwd("ln", "cuda (launcher)", lambda: cln.layernorm(x, w, b), shape, dname, ref, nbytes)
                for cfg in cln.vec_configs(cols, x.element_size()):
                    time_fwd("ln", "cuda vec", lambda cfg=cfg: cln.layernorm_vec(x, w, b, config=cfg), shape, dname,
                             ref, nbytes, config=list(cfg))
            if dtype == torch.float32:
                time_fwd("ln", "numba v3 (launcher)", lambda: nln.layernorm(x, w, b), shape, dname, ref, nbytes)
                if cols <= nln.REG_MAX_COLS:
                    time_fwd("ln", "numba v2 (launcher)", lambda: nln.layernorm_reg(x, w, b), shape, dname, ref, nbytes)
            torch.cuda.empty_cache()


def part_bwd():
    import kernels
    from kernels.triton import layernorm as tln
    cln = kernels.module("layernorm", "cuda")
    nln = kernels.module("layernorm", "numba")
    from utils.topics.layernorm import layernorm_backward_bytes
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception:
        LigerLayerNormFunction = LigerRMSNormFunction = None
    for shape in [(4096, 4096)]:
        for dname, dtype in DTYPES.items():
            if left() < 10:
                return
            x, w, b = inputs(shape, dtype)
            dy = torch.randn(shape, device="cuda").to(dtype)
            xf = x.float()
            mean = xf.mean(1)
            rstd = torch.rsqrt(xf.var(1, unbiased=False) + 1e-5)
            rdx, rdw, rdb = torch.ops.aten.native_layer_norm_backward(dy.float(), xf, [shape[1]], mean[:, None],
                                                                      rstd[:, None], w.float(), b.float(),
                                                                      [True, True, True])
            nb = layernorm_backward_bytes(shape, x.element_size())
            msq = torch.rsqrt(xf.pow(2).mean(1) + 1e-5)

            def sums_close(got, want):  # dw, db: sums over the rows
                return bool(torch.allclose(got.float(), want, rtol=5e-2, atol=shape[0] ** .5 * 5e-2))

            def ok(out, rms=False):
                dx, dw = out[0], out[1]
                if rms:
                    xr = xf.detach().requires_grad_(True)
                    wr = w.float().detach().requires_grad_(True)
                    yr = F.rms_norm(xr, (shape[1],), wr, 1e-5)
                    gx, gw = torch.autograd.grad(yr, (xr, wr), dy.float())
                    return close(dx, gx, dtype) and sums_close(dw, gw)
                return close(dx, rdx, dtype) and sums_close(dw, rdw) and sums_close(out[2], rdb)

            def tb(name, fn, rms=False, **extra):
                if left() < 5:
                    return
                try:
                    out = fn()
                    if not ok(out, rms):
                        record("bwd", name=name, shape=list(shape), dtype=dname, status="WRONG", **extra)
                        return
                    ms, lo, hi = bench(fn)
                    gbps = (nb if not rms else nb - 4 * shape[1] * x.element_size() // 2) / ms / 1e6
                    record("bwd", name=name, shape=list(shape), dtype=dname, ms=ms, p20=lo, p80=hi, gbps=gbps,
                           frac=gbps / RES["copy_gbps"], **extra)
                except Exception as e:
                    err(f"bwd {name} {shape} {dname} {extra}", e)

            tb("torch eager ln bwd", lambda: torch.ops.aten.native_layer_norm_backward(
                dy, x, [shape[1]], mean[:, None], rstd[:, None], w, b, [True, True, True]))
            for tile in (4096, 8192, 16384):
                for per_sm in (1, 2, 4):
                    tln.BWD_TILE_BYTES, tln.BWD_PROGRAMS_PER_SM = tile, per_sm
                    tln.bwd_config.cache_clear()
                    tb("triton ln bwd", lambda: tln.layernorm_backward(dy, x, w, mean, rstd), tile=tile, per_sm=per_sm,
                       config=list(tln.bwd_config(*shape, x.element_size())))
            tln.BWD_TILE_BYTES, tln.BWD_PROGRAMS_PER_SM = 8192, 2
            tln.bwd_config.cache_clear()
            if hasattr(cln, "bwd_vec_configs"):
                for cfg in cln.bwd_vec_configs(shape[0], shape[1], x.element_size()):
                    tb("cuda ln bwd", lambda cfg=cfg: cln.layernorm_backward_vec(dy, x, w, mean, rstd, config=cfg),
                       config=list(cfg))
            if dtype == torch.float32:
                tb("numba ln bwd (launcher)", lambda: nln.layernorm_backward(dy, x, w, mean, rstd))
            # RMSNorm: forward and backward
            yref = F.rms_norm(xf, (shape[1],), w.float(), 1e-5).to(dtype)
            fb = 2 * x.numel() * x.element_size()
            time_fwd("ln", "torch eager rms fwd", lambda: F.rms_norm(x, (shape[1],), w, 1e-5), shape, dname, yref, fb)
            time_fwd("ln", "triton rms fwd", lambda: tln.rmsnorm(x, w), shape, dname, yref, fb)
            if hasattr(cln, "vec_configs"):
                time_fwd("ln", "cuda rms fwd", lambda: cln.rmsnorm(x, w), shape, dname, yref, fb)
            if LigerRMSNormFunction is not None:
                time_fwd("ln", "liger rms fwd", lambda: LigerRMSNormFunction.apply(x, w, 1e-5), shape, dname, yref, fb)
            tb("triton rms bwd", lambda: tln.rmsnorm_backward(dy, x, w, msq), rms=True)
            if hasattr(cln, "vec_configs"):
                tb("cuda rms bwd", lambda: cln.rmsnorm_backward(dy, x, w, msq), rms=True)

            def torch_rms_bwd():
                xr = x.detach().requires_grad_(True)
                wr = w.detach().requires_grad_(True)
                yr = F.rms_norm(xr, (shape[1],), wr, 1e-5)
                return torch.autograd.grad(yr, (xr, wr), dy)
            tb("torch eager rms fwd+bwd (autograd)", torch_rms_bwd, rms=True)
            if LigerLayerNormFunction is not None:
                xr = x.detach().requires_grad_(True)
                wr = w.detach().requires_grad_(True)
                br = b.detach().requires_grad_(True)
                yl = LigerLayerNormFunction.apply(xr, wr, br, 1e-5)
                tb("liger ln bwd", lambda: torch.autograd.grad(yl, (xr, wr, br), dy, retain_graph=True))
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------
def part_mm():
    from kernels.triton import matmul as tm

    import triton
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = [(4096, 4096, 4096), (4095, 4097, 4093)]
    tma_cfgs = [(128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4), (256, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4),
                (128, 128, 64, 8, 4, 4), (128, 128, 128, 8, 8, 3), (128, 256, 64, 16, 8, 3), (256, 128, 64, 8, 8, 4)]
    ptr_cfgs = [(128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4), (256, 128, 64, 8, 8, 3), (128, 128, 64, 8, 4, 4),
                (128, 256, 32, 8, 8, 4)]
    for (M, N, K) in shapes:
        for dname, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
            if left() < 10:
                return
            a = torch.randn(M, K, device="cuda").to(dtype)
            bm = torch.randn(K, N, device="cuda").to(dtype)
            ref = torch.mm(a, bm)
            fl = 2 * M * N * K

            def tmm(name, fn, **extra):
                if left() < 5:
                    return
                try:
                    c = fn()
                    rel = float(((c.float() - ref.float()).abs().max()) / (ref.float().abs().max()))
                    if rel > 2e-2:
                        record("mm", name=name, shape=[M, N, K], dtype=dname, status="WRONG", rel=rel, **extra)
                        return
                    ms, lo, hi = bench(fn, warmup=25, rep=100)
                    record("mm", name=name, shape=[M, N, K], dtype=dname, ms=ms, p20=lo, p80=hi,
                           tflops=fl / ms / 1e9, **extra)
                except Exception as e:
                    err(f"mm {name} {M}x{N}x{K} {dname} {extra}", e)

            tmm("torch.mm", lambda: torch.mm(a, bm))
            c = torch.empty(M, N, device="cuda", dtype=dtype)
            if tm.tma_ok(a, bm, c):
                for (bm_, bn, bk, g, nw, st) in tma_cfgs:
                    tmm("tma persistent", lambda: tm.launch_tma(tm.matmul_tma_kernel, a, bm, c, M, N, K, BLOCK_M=bm_,
                                                                  BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g, num_warps=nw,
                                                                  num_stages=st),
                        cfg=[bm_, bn, bk, g, nw, st])
            for (bm_, bn, bk, g, nw, st) in ptr_cfgs:
                def run(bm_=bm_, bn=bn, bk=bk, g=g, nw=nw, st=st):
                    grid = (triton.cdiv(M, bm_) * triton.cdiv(N, bn),)
                    tm.matmul_kernel[grid](a, bm, c, M, N, K, a.stride(0), a.stride(1), bm.stride(0), bm.stride(1),
                                           c.stride(0), c.stride(1), BLOCK_M=bm_, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g,
                                           EXACT_FP32=False, num_warps=nw, num_stages=st)
                    return c
                tmm("pointer (v2 kernel)", run, cfg=[bm_, bn, bk, g, nw, st])
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------
def part_host():
    """Host cost per call of every reference launcher, and CUDA graphs: launch-overhead.json;
    then where a LayerNorm launcher's host time goes, step by step."""
    import benchmarks.lessons.launch_overhead as lo
    import kernels
    from kernels.frames.layernorm import check_norm_inputs, row_stats
    from kernels.triton import layernorm as tln

    lo.main(["--out", str(OUT[0].parent)])
    x, w, b = inputs((4, 512), torch.float32)
    y, mean, rstd = torch.empty_like(x), torch.empty(4, device="cuda"), torch.empty(4, device="cuda")
    steps = {
        "check_norm_inputs(x, w, b)": lambda: check_norm_inputs(x, w, b, op="layernorm", dtypes=tln.DTYPES, bias=True),
        "torch.empty_like(x) + 2 x row_stats(x)": lambda: (torch.empty_like(x), row_stats(x), row_stats(x)),
        "tln.rows_config(cols, 4) (cached)": lambda: tln.rows_config(512, 4),
        "triton layernorm_rows_kernel[grid](9 args, ROWS, BLOCK, num_warps)": lambda: tln.layernorm_rows_kernel[(1,)](
            x, w, b, y, mean, rstd, 4, 512, 1e-5, ROWS=4, BLOCK=512, num_warps=2),
        "triton layernorm (whole launcher)": lambda: tln.layernorm(x, w, b),
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
        "x.data_ptr() x 6": lambda: [t.data_ptr() for t in (x, w, b, y, mean, rstd)],
    }
    for lang in ("cuda", "numba"):
        steps[f"{lang} layernorm (whole launcher)"] = lambda f=kernels.get("layernorm", lang): f(x, w, b)
    # A compiled Triton kernel called directly: what is left without the JIT's per-call work
    try:
        ck = tln.layernorm_rows_kernel[(1,)](x, w, b, y, mean, rstd, 4, 512, 1e-5, ROWS=4, BLOCK=512, num_warps=2)
        RES["triton_compiled_type"] = type(ck).__name__
        for label, args in (("without constexprs", (x, w, b, y, mean, rstd, 4, 512, 1e-5)),
                            ("with constexprs", (x, w, b, y, mean, rstd, 4, 512, 1e-5, 4, 512))):
            try:
                y.zero_()
                ck[(1, 1, 1)](*args)
                torch.cuda.synchronize()
                ok = close(y, F.layer_norm(x, (512,), w, b, 1e-5), torch.float32)
                RES.setdefault("triton_direct", {})[label] = ok
                if ok:
                    steps[f"triton CompiledKernel[grid](...) {label}"] = lambda a=args: ck[(1, 1, 1)](*a)
            except Exception as e:
                err(f"triton direct {label}", e)
    except Exception as e:
        err("triton compiled kernel", e)
    for name, fn in steps.items():
        try:
            r = lo.per_launch_us(fn)
            record("host", name=name, **r)
        except Exception as e:
            err(f"host {name}", e)


def graph_of(fn):
    """A CUDA graph of one call of ``fn``: its replay is the launcher's GPU work without its
    host time (``launch_overhead.graph_of``)."""
    from benchmarks.lessons.launch_overhead import graph_of as captured
    return captured(fn)


def host_us(fn):
    """The host's microseconds per call of ``fn``, back to back (``launch_overhead.host_us``)."""
    from benchmarks.lessons.launch_overhead import host_us as issued
    return issued(fn)


def part_probe():
    """Where each LayerNorm/RMSNorm launcher's time goes, at every shape and dtype it runs:
    do_bench of the launcher as called, do_bench of a CUDA graph of one call (the kernels
    alone), the host's time per call (back-to-back calls, no synchronisation), and a copy of
    the same bytes."""
    import kernels
    from utils.topics.layernorm import layernorm_backward_bytes
    langs = {lang: kernels.module("layernorm", lang) for lang in ("cuda", "triton", "numba")}
    for shape in SHAPES:
        for dname, dtype in DTYPES.items():
            if left() < 10:
                return
            x, w, b = inputs(shape, dtype)
            dy = torch.randn(shape, device="cuda").to(dtype)
            y = torch.empty_like(x)
            fb = 2 * x.numel() * x.element_size()
            calls = [("copy_ (same bytes)", "copy", lambda: y.copy_(x), fb)]
            for lang, m in langs.items():
                if dtype != torch.float32 and lang == "numba":
                    continue
                _, mean, rstd = m.layernorm(x, w, b, stats=True)
                _, r = m.rmsnorm(x, w, stats=True)
                calls += [(f"{lang} layernorm", "forward", lambda m=m: m.layernorm(x, w, b), fb),
                          (f"{lang} rmsnorm", "rms forward", lambda m=m: m.rmsnorm(x, w), fb)]
                if shape == (4096, 4096):
                    nb = layernorm_backward_bytes(shape, x.element_size())
                    calls += [(f"{lang} layernorm_backward", "backward",
                               lambda m=m, mean=mean, rstd=rstd: m.layernorm_backward(dy, x, w, mean, rstd), nb),
                              (f"{lang} rmsnorm_backward", "rms backward",
                               lambda m=m, r=r: m.rmsnorm_backward(dy, x, w, r), nb)]
            for name, pass_, fn, nbytes in calls:
                if left() < 5:
                    return
                row = dict(name=name, pass_=pass_, shape=list(shape), dtype=dname)
                try:
                    row["ms"] = bench(fn)[0]
                    row["frac"] = nbytes / row["ms"] / 1e6 / RES["copy_gbps"]
                    row["host_us"] = host_us(fn)
                except Exception as e:
                    err(f"probe {name} {shape} {dname}", e)
                    continue
                try:
                    g = graph_of(fn)
                    row["graph_ms"] = bench(g.replay)[0]
                    row["graph_frac"] = nbytes / row["graph_ms"] / 1e6 / RES["copy_gbps"]
                except Exception as e:
                    row["graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                record("probe", **row)
            torch.cuda.empty_cache()


def part_probe2():
    """Where the host time of the LayerNorm launchers goes (cProfile of 200 calls, the top
    functions by own time), the backward's kernels timed apart (the main kernel, the column
    sums), and CUDA v5's configurations at the long and short rows, each as a CUDA graph."""
    import cProfile
    import io
    import pstats

    import kernels
    langs = {lang: kernels.module("layernorm", lang) for lang in ("cuda", "triton", "numba")}
    shape = (4096, 4096)
    RES["profiles"] = {}
    for dname, dtype in DTYPES.items():
        x, w, b = inputs(shape, dtype)
        dy = torch.randn(shape, device="cuda").to(dtype)
        for lang, m in langs.items():
            if lang == "numba" and dtype != torch.float32:
                continue
            _, mean, rstd = m.layernorm(x, w, b, stats=True)
            for name, fn in ((f"{lang} layernorm {dname}", lambda m=m: m.layernorm(x, w, b)),
                             (f"{lang} layernorm_backward {dname}",
                              lambda m=m, mean=mean, rstd=rstd: m.layernorm_backward(dy, x, w, mean, rstd))):
                if left() < 5:
                    return
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(200):
                    fn()
                prof.disable()
                torch.cuda.synchronize()
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
                RES["profiles"][name] = buf.getvalue()[-6000:]
                print(name, buf.getvalue()[-2500:], flush=True)
                save()
    # the CUDA vec backward's kernels apart
    cln = langs["cuda"]
    for dname, dtype in DTYPES.items():
        x, w, b = inputs(shape, dtype)
        dy = torch.randn(shape, device="cuda").to(dtype)
        _, mean, rstd = cln.layernorm(x, w, b, stats=True)
        rows, cols = shape
        vec, items, threads, parts, acc_shared = cln.bwd_vec_config(rows, cols, x.element_size(), True)
        dx = torch.empty_like(x)
        p = torch.empty(2, parts, cols, device="cuda")
        dw = torch.empty(cols, device="cuda", dtype=dtype)
        db = torch.empty(cols, device="cuda", dtype=dtype)
        t = cln._CTYPE[dtype]
        k = cln.kernel(f"layernorm_bwd_vec_kernel<{t}, {vec}, {items}, false, {'true' if acc_shared else 'false'}>")
        cs = cln.kernel(f"column_sum_vec_kernel<{t}>")
        shared = cln._bwd_shared(cols, False, acc_shared)
        for label, fn in (("cuda bwd main kernel", lambda: k[parts, threads, shared](dy, x, w, mean, rstd, dx, p,
                                                                                    rows, cols)),
                          ("cuda column sum (dw and db)", lambda: cs[(cln.cdiv(cols, 32), 2), (32, cln.COLSUM_SLICES)](
                              p, dw, db, parts, cols))):
            try:
                ms = bench(fn)[0]
                record("probe", name=label, shape=list(shape), dtype=dname, ms=ms,
                       config=[vec, items, threads, parts, acc_shared])
            except Exception as e:
                err(f"probe2 {label} {dname}", e)
    # CUDA v5's forward configurations, each as a CUDA graph of the launcher
    for shp in ((4096, 16384), (65536, 512), (4096, 4096)):
        for dname, dtype in DTYPES.items():
            x, w, b = inputs(shp, dtype)
            ref = F.layer_norm(x.float(), (shp[1],), w.float(), b.float(), 1e-5).to(dtype)
            nbytes = 2 * x.numel() * x.element_size()
            for cfg in cln.vec_configs(shp[1], x.element_size()):
                if left() < 5:
                    return

                def fn(cfg=cfg):
                    return cln.layernorm_vec(x, w, b, config=cfg)
                try:
                    if not close(fn(), ref, dtype):
                        record("probe", name="cuda v5 config", shape=list(shp), dtype=dname, config=list(cfg),
                               status="WRONG")
                        continue
                    ms = bench(graph_of(fn).replay)[0]
                    record("probe", name="cuda v5 config (graph)", shape=list(shp), dtype=dname, config=list(cfg),
                           ms=ms, graph_frac=nbytes / ms / 1e6 / RES["copy_gbps"])
                except Exception as e:
                    err(f"probe2 v5 {shp} {dname} {cfg}", e)
            torch.cuda.empty_cache()


def part_bwd3():
    """The backward's configurations at 4096 x 4096, each timed as a CUDA graph of one launcher
    call (its kernels without its host time): CUDA vec's (ITEMS, threads, blocks, SHARED), and
    Triton's programs per SM and tile."""
    import kernels
    from kernels.triton import layernorm as tln
    from utils.topics.layernorm import layernorm_backward_bytes
    cln = kernels.module("layernorm", "cuda")
    shape = (4096, 4096)
    tile0, per_sm0 = tln.BWD_TILE_BYTES, tln.BWD_PROGRAMS_PER_SM
    for dname, dtype in DTYPES.items():
        x, w, b = inputs(shape, dtype)
        dy = torch.randn(shape, device="cuda").to(dtype)
        _, mean, rstd = cln.layernorm(x, w, b, stats=True)
        xf = x.float()
        rdx = torch.ops.aten.native_layer_norm_backward(dy.float(), xf, [shape[1]], mean[:, None], rstd[:, None],
                                                        w.float(), b.float(), [True, True, True])[0]
        nb = layernorm_backward_bytes(shape, x.element_size())

        def tg(name, fn, **extra):
            if left() < 5:
                return
            try:
                if not close(fn()[0], rdx, dtype):
                    record("bwd", name=name, dtype=dname, status="WRONG", **extra)
                    return
                ms = bench(graph_of(fn).replay)[0]
                record("bwd", name=name, shape=list(shape), dtype=dname, graph_ms=ms,
                       graph_frac=nb / ms / 1e6 / RES["copy_gbps"], **extra)
            except Exception as e:
                err(f"bwd3 {name} {dname} {extra}", e)
        tg("torch eager ln bwd (graph)", lambda: torch.ops.aten.native_layer_norm_backward(
            dy, x, [shape[1]], mean[:, None], rstd[:, None], w, b, [True, True, True]))
        for cfg in cln.bwd_vec_configs(*shape, x.element_size()):
            tg("cuda ln bwd (graph)", lambda cfg=cfg: cln.layernorm_backward_vec(dy, x, w, mean, rstd, config=cfg),
               config=list(cfg))
        for tile in (4096, 8192, 16384):
            for per_sm in (1, 2, 3, 4):
                tln.BWD_TILE_BYTES, tln.BWD_PROGRAMS_PER_SM = tile, per_sm
                tln.bwd_config.cache_clear()
                tg("triton ln bwd (graph)", lambda: tln.layernorm_backward(dy, x, w, mean, rstd), tile=tile,
                   per_sm=per_sm, config=list(tln.bwd_config(*shape, x.element_size())))
        tln.BWD_TILE_BYTES, tln.BWD_PROGRAMS_PER_SM = tile0, per_sm0
        tln.bwd_config.cache_clear()
        torch.cuda.empty_cache()


def part_fwd2():
    """Triton v3's eviction hint and warps at the shapes where the first sweep disagreed."""
    from kernels.triton import layernorm as tln

    import triton
    for shape, dname in (((4096, 16384), "bfloat16"), ((4096, 4096), "bfloat16"), ((4096, 16384), "float32"),
                         ((4096, 4096), "float32"), ((65536, 512), "bfloat16")):
        dtype = DTYPES[dname]
        x, w, b = inputs(shape, dtype)
        ref = F.layer_norm(x.float(), (shape[1],), w.float(), b.float(), 1e-5).to(dtype)
        nbytes = 2 * x.numel() * x.element_size()
        rows, cols = shape
        y = torch.empty_like(x)
        mean = torch.empty(rows, device="cuda")
        rstd = torch.empty(rows, device="cuda")
        block = triton.next_power_of_2(cols)
        nrows, _, warps = tln.rows_config(cols, x.element_size())
        for evict in ("", "evict_first"):
            for wp in sorted({warps, 8, 16}):
                def run(evict=evict, wp=wp):
                    tln.layernorm_rows_kernel[(triton.cdiv(rows, nrows),)](
                        x, w, b, y, mean, rstd, rows, cols, 1e-5, ROWS=nrows, BLOCK=block, EVICT=evict, num_warps=wp)
                    return y
                time_fwd("ln", "triton rows kernel", run, shape, dname, ref, nbytes, rows_=nrows, warps=wp,
                         evict=evict)
        time_fwd("ln", "triton v2 (launcher)", lambda: tln.layernorm_row(x, w, b), shape, dname, ref, nbytes)
        time_fwd("ln", "triton v3 (launcher)", lambda: tln.layernorm(x, w, b), shape, dname, ref, nbytes,
                 config=[nrows, block, warps])
        # the same bytes moved by a plain copy: how close to the big copy a pass of this size gets
        time_fwd("ln", "copy_ of x (same bytes)", lambda: y.copy_(x), shape, dname, None, nbytes)


def part_numba2():
    import kernels
    nln = kernels.module("layernorm", "numba")
    for shape in ((4096, 16384), (4096, 4096), (65536, 512)):
        x, w, b = inputs(shape, torch.float32)
        ref = F.layer_norm(x, (shape[1],), w, b, 1e-5)
        time_fwd("ln", "numba v3 (launcher)", lambda: nln.layernorm(x, w, b), shape, "float32", ref,
                 2 * x.numel() * 4)


def part_bwd2():
    from kernels.triton import layernorm as tln
    from utils.topics.layernorm import layernorm_backward_bytes
    shape = (4096, 4096)
    for dname, dtype in DTYPES.items():
        x, w, b = inputs(shape, dtype)
        dy = torch.randn(shape, device="cuda").to(dtype)
        xf = x.float()
        mean = xf.mean(1)
        rstd = torch.rsqrt(xf.var(1, unbiased=False) + 1e-5)
        rdx = torch.ops.aten.native_layer_norm_backward(dy.float(), xf, [shape[1]], mean[:, None], rstd[:, None],
                                                        w.float(), b.float(), [True, True, True])[0]
        nb = layernorm_backward_bytes(shape, x.element_size())
        for tile in (16384, 32768, 65536):
            for per_sm in (1, 2):
                tln.BWD_TILE_BYTES, tln.BWD_PROGRAMS_PER_SM = tile, per_sm
                tln.bwd_config.cache_clear()
                cfg = list(tln.bwd_config(*shape, x.element_size()))
                try:
                    out = tln.layernorm_backward(dy, x, w, mean, rstd)
                    if not close(out[0], rdx, dtype):
                        record("bwd", name="triton ln bwd", dtype=dname, status="WRONG", config=cfg)
                        continue
                    ms, lo, hi = bench(lambda: tln.layernorm_backward(dy, x, w, mean, rstd))
                    record("bwd", name="triton ln bwd", shape=list(shape), dtype=dname, ms=ms, gbps=nb / ms / 1e6,
                           frac=nb / ms / 1e6 / RES["copy_gbps"], tile=tile, per_sm=per_sm, config=cfg)
                except Exception as e:
                    err(f"bwd2 {dname} {tile} {per_sm}", e)


def part_mm2():
    import kernels
    from kernels.triton import matmul as tm
    torch.backends.cuda.matmul.allow_tf32 = False
    M, N, K = 4095, 4097, 4093
    for dname, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        a = torch.randn(M, K, device="cuda").to(dtype)
        bm = torch.randn(K, N, device="cuda").to(dtype)
        ref = torch.mm(a, bm)
        fl = 2 * M * N * K

        def padded(cfg):
            a2, b2 = tm.aligned_copy(a), tm.aligned_copy(bm)
            c2 = tm.aligned_empty(M, N, dtype, a.device)
            bm_, bn, bk, g, nw, st = cfg
            tm.launch_tma(tm.matmul_tma_kernel, a2, b2, c2, M, N, K, BLOCK_M=bm_, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g,
                          num_warps=nw, num_stages=st)
            return c2.contiguous()
        for name, fn, extra in (("torch.mm", lambda: torch.mm(a, bm), {}),
                                ("tma padded", lambda: padded(tm.TMA_SHAPES[0]), {"cfg": list(tm.TMA_SHAPES[0])}),
                                ("tma padded", lambda: padded(tm.TMA_SHAPES[1]), {"cfg": list(tm.TMA_SHAPES[1])}),
                                ("triton v3 (launcher, autotuned)", lambda: kernels.get("matmul_fp16", "triton")(a, bm),
                                 {})):
            try:
                c = fn()
                rel = float(((c.float() - ref.float()).abs().max()) / (ref.float().abs().max()))
                if rel > 2e-2:
                    record("mm", name=name, dtype=dname, status="WRONG", rel=rel, **extra)
                    continue
                ms, lo, hi = bench(fn, warmup=25, rep=100)
                record("mm", name=name, shape=[M, N, K], dtype=dname, ms=ms, tflops=fl / ms / 1e9, **extra)
            except Exception as e:
                err(f"mm2 {name} {dname}", e)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=float, default=300)
    p.add_argument("--parts", default="host:35,ln:130,bwd:55,mm:105",
                   help="parts with their share of seconds")
    args = p.parse_args()
    end = time.time() + args.budget
    OUT[0] = Path(args.out) / "tune.json"
    OUT[0].parent.mkdir(parents=True, exist_ok=True)
    RES.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__, commit=utils.source_commit())
    import triton
    RES["triton"] = triton.__version__
    n = 1 << 28
    a = torch.empty(n, device="cuda")
    bb = torch.empty_like(a)
    ms, _, _ = bench(lambda: bb.copy_(a), warmup=25, rep=100)
    RES["copy_gbps"] = 8 * n / ms / 1e6
    print("copy GB/s", RES["copy_gbps"], flush=True)
    for item in args.parts.split(","):
        part, _, share = item.partition(":")
        t = time.time()
        DEADLINE[0] = min(end, t + float(share or 1e9))
        try:
            globals()[f"part_{part}"]()
        except Exception as e:
            err(f"part {part}", e)
            traceback.print_exc()
        RES.setdefault("part_s", {})[part] = round(time.time() - t, 1)
        save()
    print("done; errors:", len(RES["errors"]), flush=True)


if __name__ == "__main__":
    main()
