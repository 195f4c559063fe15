"""Sweep the launch settings of lesson 11's written-out training step (``kernels/gpt_step.py``)
at GPT-2 124M's shapes on a GPU: the fused residual + LayerNorm forward, the LayerNorm backward
that adds the residual's gradient, and the bias gradients' column sum. Every setting is checked
against the step's current one (the same values), then timed with ``triton.testing.do_bench``
(median) beside a copy of the same bytes in the same run.

    python -m benchmarks.tune.gpt_step_tune --out DIR [--budget SECONDS]

Writes ``DIR/gpt-step-tune.json`` after each part. The settings ``kernels/gpt_step.py`` uses
were picked from such a run (its header names the record).
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

N, C = 16 * 1024, 768          # GPT-2 124M, batch 16 x 1024 tokens
V = 50304                      # GPT-2's vocabulary, padded
RES: dict = {"shape": [N, C], "dtype": "bfloat16", "ln_forward": [], "ln_backward": [], "bias_grad": [],
             "cross_entropy": [], "copy": {}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=240)
    args = ap.parse_args(argv)
    if utils.DEVICE.type != "cuda":
        raise SystemExit("a GPU sweep: run it on a GPU")
    from kernels._launch import sm_count
    from kernels.triton.bias_gelu import column_partials_kernel
    from kernels.triton.layernorm import _column_sum, layernorm_bwd_partials_kernel
    from kernels.triton.residual_layernorm import residual_layernorm_kernel

    import triton
    from triton.testing import do_bench
    deadline = time.time() + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpt-step-tune.json"

    def save():
        path.write_text(json.dumps(RES, indent=1) + "\n")

    bf = dict(dtype=torch.bfloat16, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(N, C, generator=gen, **bf)
    r = torch.randn(N, C, generator=gen, **bf)
    w = torch.rand(C, generator=gen, device="cuda") + 0.5
    b = torch.randn(C, generator=gen, device="cuda")
    src, dst = torch.empty(4 * N * C, **bf), torch.empty(4 * N * C, **bf)
    for k in (2, 3, 4):    # copies of the bytes each kernel moves: k tensors of N x C bfloat16
        RES["copy"][f"{k} x N x C"] = do_bench(lambda k=k: dst[:k * N * C // 2].copy_(src[:k * N * C // 2]))
    save()

    # residual + LayerNorm forward: reads x, r; writes h, y (4 tensors)
    ref = None
    for warps in (1, 2, 4, 8, 16):
        h, y, st = torch.empty_like(x), torch.empty_like(x), torch.empty(2, N, device="cuda")

        def fwd(warps=warps, h=h, y=y, st=st):
            residual_layernorm_kernel[(N,)](x, r, w, b, h, y, st[0], st[1], C, 1e-5, BLOCK_SIZE=1024,
                                            num_warps=warps)
        fwd()
        ref = y.clone() if ref is None else ref
        RES["ln_forward"].append({"num_warps": warps, "ms": do_bench(fwd), "same": bool(torch.equal(y, ref))})
    save()

    # LayerNorm backward with the residual's gradient added (ADD_DX): reads dy, x, dx; writes dx
    dy = torch.randn(N, C, generator=gen, **bf)
    st = torch.empty(2, N, device="cuda")
    h, y = torch.empty_like(x), torch.empty_like(x)
    residual_layernorm_kernel[(N,)](x, r, w, b, h, y, st[0], st[1], C, 1e-5, BLOCK_SIZE=1024, num_warps=4)
    base = torch.randn(N, C, generator=gen, **bf)
    want = None
    sms = sm_count()
    for rows in (1, 2, 4, 8):
        for warps in (2, 4, 8, 16):
            if rows * 1024 // (warps * 32) < 2:     # fewer than 2 values a thread
                continue
            for per_sm in (1, 2, 4, 8):
                if time.time() > deadline:
                    break
                parts = min(triton.cdiv(N, rows), per_sm * sms)
                pdw = torch.empty(parts, C, device="cuda")
                pdb = torch.empty(parts, C, device="cuda")
                dw, db = torch.empty(C, device="cuda"), torch.empty(C, device="cuda")
                dx = base.clone()

                def bwd(rows=rows, warps=warps, parts=parts, pdw=pdw, pdb=pdb, dw=dw, db=db, dx=dx):
                    dx.copy_(base)
                    layernorm_bwd_partials_kernel[(parts,)](dy, h, w, st[0], st[1], dx, pdw, pdb, N, C, ROWS=rows,
                                                            BLOCK=1024, ADD_DX=True, num_warps=warps)
                    _column_sum(pdw, dw)
                    _column_sum(pdb, db)
                bwd()
                got = torch.cat([dx.float().reshape(-1), dw, db])
                want = got if want is None else want
                copy = do_bench(lambda dx=dx: dx.copy_(base))
                RES["ln_backward"].append({"rows": rows, "num_warps": warps, "programs_per_sm": per_sm,
                                           "parts": parts, "ms": do_bench(bwd) - copy,
                                           "max_diff": float((got - want).abs().max())})
        save()

    # the bias gradients: the column sums of (N, cols) bfloat16
    for cols in (C, 3 * C, 4 * C):
        g = torch.randn(N, cols, generator=gen, **bf)
        want = g.float().sum(0)
        for rows in (32, 64, 128, 256):
            for bc in (64, 128, 256):
                if time.time() > deadline:
                    break
                parts = torch.empty(triton.cdiv(N, rows), cols, device="cuda")
                out = torch.empty(cols, device="cuda")

                def colsum(rows=rows, bc=bc, parts=parts, out=out, g=g):
                    column_partials_kernel[(parts.shape[0], triton.cdiv(cols, bc))](g, parts, N, cols, ROWS=rows,
                                                                                      BLOCK_C=bc)
                    _column_sum(parts, out)
                colsum()
                RES["bias_grad"].append({"cols": cols, "rows": rows, "block_c": bc, "ms": do_bench(colsum),
                                         "max_diff": float((out - want).abs().max())})
        save()
    # the fused cross entropy over (N, V) bfloat16 logits, the gradient written over them
    from kernels.triton.cross_entropy import cross_entropy_count_kernel, cross_entropy_fused_kernel
    logits = (torch.randn(N, V, generator=gen, device="cuda") * 2).bfloat16()
    targets = torch.randint(0, V, (N,), generator=gen, device="cuda")
    count, loss = torch.empty(1, device="cuda"), torch.zeros((), device="cuda")
    cross_entropy_count_kernel[(1,)](targets, N, -100, count, BLOCK_SIZE=1024)
    work = logits.clone()
    RES["copy"]["N x V (the logits, read and written once)"] = do_bench(lambda: work.copy_(logits))
    want = None
    for block in (4096, 8192, 16384, 32768):
        for warps in (8, 16, 32):
            if time.time() > deadline:
                break

            def ce(block=block, warps=warps):
                work.copy_(logits)
                loss.zero_()
                cross_entropy_fused_kernel[(N,)](work, targets, count, loss, work, V, -100, BLOCK_SIZE=block,
                                                 num_warps=warps)
            ce()
            got = work[:64].float()
            want = got if want is None else want
            restore = do_bench(lambda: work.copy_(logits))
            RES["cross_entropy"].append({"block": block, "num_warps": warps, "ms": do_bench(ce) - restore,
                                         "loss": float(loss), "max_diff": float((got - want).abs().max())})
    save()
    best = {k: min((row for row in RES[k] if row.get("same", True) and row.get("max_diff", 0) < 0.05),
                   key=lambda row: row["ms"], default=None) for k in ("ln_forward", "ln_backward", "cross_entropy")}
    RES["best"] = best
    save()
    print(json.dumps(best, indent=1))
    for cols in (C, 3 * C, 4 * C):
        rows = [row for row in RES["bias_grad"] if row["cols"] == cols]
        if rows:
            print("bias grad", cols, min(rows, key=lambda row: row["ms"]))
    print("copies", RES["copy"])


if __name__ == "__main__":
    main()
