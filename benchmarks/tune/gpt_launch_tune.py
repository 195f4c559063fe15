"""Sweep what lesson 11's training step launches besides its norms (``gpt_step_tune`` has
those), on a GPU, at GPT-2 124M's shapes (batch 16 x 1024 tokens):

* every matmul of the step, forward and backward, on cuBLAS (as ``kernels/gpt_step.py``'s
  ``_Cublas`` calls it) and on the Triton linear (``kernels/triton/linear.py``) with 1, 2, 4,
  8 and 16 splits of K and with ``splits_for``'s choice, each checked against cuBLAS;
* the Triton cross-entropy launcher (``kernels/triton/cross_entropy.py``: CONFIGS) at
  lesson 11's benchmark shape, 8192 x 50304, float32 and bfloat16, beside torch.compile;
* the whole step (``TrainStep``) with each matmul backend, a few steps after warmup.

    python -m benchmarks.tune.gpt_launch_tune --out DIR [--budget SECONDS] [--parts matmuls,cross_entropy,step]

Times are ``triton.testing.do_bench`` medians. Writes ``DIR/gpt-launch-tune.json`` after each part.
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

import utils

N, C, V = 16 * 1024, 768, 50304
RES: dict = {"tokens": N, "width": C, "vocab": V, "matmuls": [], "cross_entropy": [], "step": []}


def _matmuls():
    """(name, a, b, out dtype, bias?) of one layer's and the head's matmuls: out = a b (+ bias)."""
    return [("qkv fwd", (N, C), (C, 3 * C), "bf16", True), ("proj fwd", (N, C), (C, C), "bf16", True),
            ("fc fwd", (N, C), (C, 4 * C), "bf16", False), ("fcproj fwd", (N, 4 * C), (4 * C, C), "bf16", True),
            ("head fwd", (N, C), (C, V), "bf16", False),
            ("d head input", (N, V), (V, C), "bf16", False), ("d wte (head)", (V, N), (N, C), "f32", False),
            ("d fcproj W", (C, N), (N, 4 * C), "f32", False), ("d fc input", (N, 4 * C), (4 * C, C), "bf16", False),
            ("d fcproj input", (N, C), (C, 4 * C), "bf16", False),
            ("d fc W", (4 * C, N), (N, C), "f32", False), ("d proj W", (C, N), (N, C), "f32", False),
            ("d proj input", (N, C), (C, C), "bf16", False),
            ("d qkv W", (3 * C, N), (N, C), "f32", False), ("d qkv input", (N, 3 * C), (3 * C, C), "bf16", False)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--parts", default="matmuls,cross_entropy,step", help="comma-separated parts to run")
    args = ap.parse_args(argv)
    if utils.DEVICE.type != "cuda":
        raise SystemExit("a GPU sweep: run it on a GPU")
    deadline = time.time() + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpt-launch-tune.json"

    def save():
        path.write_text(json.dumps(RES, indent=1) + "\n")

    RES.update(device=torch.cuda.get_device_name(), commit=utils.source_commit())
    gen = torch.Generator(device="cuda").manual_seed(0)
    parts = {"matmuls": _matmul_part, "cross_entropy": _cross_entropy_part, "step": _step_part}
    for name in args.parts.split(","):
        parts[name](gen, deadline, save, args)
        torch.cuda.empty_cache()
    save()


def _matmul_part(gen, deadline, save, args):
    from kernels.gpt_step import _Cublas
    from kernels.triton.linear import linear_into, splits_for

    from triton.testing import do_bench
    cub = _Cublas(torch.device("cuda"))
    for name, (m, k), (k2, n), odt, has_bias in _matmuls():
        if time.time() > deadline:
            break
        # operands laid out as the step reads them: a weight gradient's a is dY^T (a transposed
        # view), a forward's b is W^T (W as nn.Linear stores it, (out, in))
        transposed = name.endswith(" W") or "wte" in name
        a = (torch.randn(k, m, generator=gen, device="cuda").bfloat16().t() if transposed
             else torch.randn(m, k, generator=gen, device="cuda").bfloat16())
        w = torch.randn(n, k2, generator=gen, device="cuda").bfloat16() if name.endswith("fwd") else None
        b = w.t() if w is not None else torch.randn(k2, n, generator=gen, device="cuda").bfloat16()
        out = torch.empty(m, n, device="cuda", dtype=torch.float32 if odt == "f32" else torch.bfloat16)
        bias = torch.randn(n, generator=gen, device="cuda").bfloat16() if has_bias else None
        if bias is not None:
            def cublas():
                cub.linear(a, w, bias, out)
        else:
            def cublas():
                cub.mm(a, b, out)
        cublas()
        want = out.float().clone()
        flop = 2 * m * n * k
        row = {"name": name, "M": m, "N": n, "K": k, "out": odt, "bias": has_bias, "a_transposed": transposed,
               "cublas_ms": do_bench(cublas), "triton": {}, "splits_for": splits_for(m, n, k)}
        row["cublas_tflops"] = flop / row["cublas_ms"] / 1e9
        variants = [("tma", 1, True)] + [(str(sp), sp, False)
                                         for sp in ((1,) if has_bias else sorted({1, 2, 4, 8, 16, row["splits_for"]}))]
        for label, splits, tma in variants:
            def tri(splits=splits, tma=tma):
                linear_into(a, b, out, bias, splits, tma)
            try:
                tri()
            except Exception as e:      # a layout TMA cannot read: recorded, not fatal
                row["triton"][label] = {"error": f"{type(e).__name__}: {e}"[:300]}
                continue
            err = float((out.float() - want).abs().max() / (want.abs().max() + 1e-30))
            ms = do_bench(tri)
            row["triton"][label] = {"ms": ms, "tflops": flop / ms / 1e9, "rel_err": err}
        best = min(((k, v) for k, v in row["triton"].items() if "ms" in v), key=lambda kv: kv[1]["ms"])
        row["best"], row["best_vs_cublas"] = best[0], row["cublas_ms"] / best[1]["ms"]
        chosen = row["triton"].get(str(row["splits_for"]))
        row["chosen_vs_cublas"] = row["cublas_ms"] / chosen["ms"] if chosen else None
        RES["matmuls"].append(row)
        tma_ms = row["triton"]["tma"].get("ms", float("nan"))
        print(f"{name:14s} {m}x{n}x{k} cuBLAS {row['cublas_ms']:.3f} ms; Triton best {best[1]['ms']:.3f} ms "
              f"({best[0]}), tma {tma_ms:.3f} ms, splits_for {row['splits_for']}: "
              f"{row['chosen_vs_cublas'] if row['chosen_vs_cublas'] else float('nan'):.2f}x cuBLAS", flush=True)
        save()


def _cross_entropy_part(gen, deadline, save, args):
    """The Triton cross-entropy launcher at lesson 11's benchmark shape."""
    from benchmarks.lessons.gpt_kernels import ce_problem  # lesson 11's benchmark problem (8192 x 50304)
    from kernels.triton import cross_entropy as ce

    from triton.testing import do_bench
    for dtype in (torch.float32, torch.bfloat16):
        x, t, _, torch_ce = ce_problem(dtype)
        rows = x.shape[0]
        compiled = torch.compile(torch_ce)
        compiled(x)
        entry = {"dtype": str(dtype).split(".")[-1], "shape": [rows, V], "compile_ms": do_bench(lambda: compiled(x)),
                 "configs": []}
        size = x.element_size()
        old = ce.CONFIGS[size]
        try:
            for block in (2048, 4096, 8192, 32768):
                for warps in (4, 8, 16, 32):
                    if time.time() > deadline:
                        break
                    ce.CONFIGS[size] = (block, warps)
                    loss, _ = ce.cross_entropy_fused(x, t)
                    entry["configs"].append({"block": block, "num_warps": warps, "loss": float(loss),
                                             "ms": do_bench(lambda: ce.cross_entropy_fused(x, t))})
        finally:
            ce.CONFIGS[size] = old
        entry["best"] = min(entry["configs"], key=lambda r: r["ms"], default=None)
        RES["cross_entropy"].append(entry)
        print("cross entropy", entry["dtype"], "compile", round(entry["compile_ms"], 3), "best", entry["best"],
              flush=True)
        save()


def _step_part(gen, deadline, save, args):
    """The whole step, with each matmul backend."""
    from kernels.gpt_step import TrainStep
    cfg = utils.GPTConfig(vocab_size=V, block_size=1024, n_layer=12, n_head=12, n_embd=C)
    xs = torch.randint(0, V, (16, 1024), generator=gen, device="cuda")
    ys = torch.randint(0, V, (16, 1024), generator=gen, device="cuda")
    for matmul in ("torch", "triton"):
        if time.time() > deadline:
            break
        model = utils.GPT(cfg, "torch", seed=0).cuda()
        step = TrainStep(model, batch=16, T=1024, matmul=matmul)
        for _ in range(3):
            step(xs, ys)
        torch.cuda.synchronize()
        calls = _time_matmul_calls(step, xs, ys)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step(xs, ys)
        torch.cuda.synchronize()
        ms = 1000 * (time.perf_counter() - t0) / args.steps
        RES["step"].append({"matmul": matmul, "ms_per_step": ms, "tokens_per_s": 16 * 1024 / ms * 1000,
                            "loss": float(loss), "matmul_ms": sum(c["ms"] for c in calls.values()),
                            "matmul_calls": calls})
        print("step", RES["step"][-1], flush=True)
        save()
        del model, step
        torch.cuda.empty_cache()


def _time_matmul_calls(step, xs, ys):
    """GPU time of each matmul call of one step, by (method, M, N, K, layout): CUDA events
    around every call (the rest of the step runs between them, untimed)."""
    mat, events = step.mat, []

    def timed(method):
        fn = getattr(mat, method)

        def wrapper(a, b, *rest):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(a, b, *rest)
            end.record()
            k, n = (b.shape[1], b.shape[0]) if method == "linear" else b.shape
            events.append(((method, a.shape[0], n, k, "aT" if a.stride(0) == 1 else "a", str(rest[-1].dtype)),
                           start, end))
        return wrapper
    mat.linear, mat.mm = timed("linear"), timed("mm")
    try:
        step(xs, ys)
        torch.cuda.synchronize()
    finally:
        del mat.linear, mat.mm
    out: dict = {}
    for key, start, end in events:
        entry = out.setdefault(" ".join(map(str, key)), {"calls": 0, "ms": 0.0})
        entry["calls"] += 1
        entry["ms"] += start.elapsed_time(end)
    return out


if __name__ == "__main__":
    main()
