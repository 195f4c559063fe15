"""Tile sizes for the Triton attention kernels on a GPU: time every candidate config of the
forward and of the two backward kernels at the benchmark shapes, next to SDPA's backends, and
write what was measured (``python -m benchmarks.tune.attention_tune OUT.json``).

Each config is checked against SDPA's output (float16, the error a correct kernel makes is
below 2e-2 here) before it is timed; a config that does not compile (too much shared memory)
or is wrong is recorded as such. The best configs go into FWD_CANDIDATES, BWD_KV_CANDIDATES
and BWD_Q_CANDIDATES of kernels/triton/attention.py, the short lists the autotuner picks from.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch
import torch.nn.functional as F

import utils  # noqa: F401  (picks the GPU or the interpreter before triton loads)
from kernels.triton import attention as A

import triton
import triton.language as tl

FWD = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4), (128, 32, 4, 4), (64, 64, 4, 3),
       (64, 128, 4, 3), (128, 128, 8, 2), (128, 64, 8, 4), (64, 64, 4, 4)]
KV = [(32, 128, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3), (16, 128, 4, 3), (32, 128, 8, 2),
      (64, 128, 8, 2), (32, 128, 4, 4)]
Q = [(128, 32, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (64, 64, 4, 3), (128, 16, 4, 3), (128, 32, 8, 2),
     (128, 64, 8, 2), (128, 32, 4, 4)]
SHAPES = [(4, 32, 4096, 64), (4, 32, 4096, 128)]


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, quantiles=[0.5, 0.2, 0.8])


def measure(entry: dict, launch, max_err, tol: float, flops: int | None = None) -> dict:
    """One config: ``launch()`` once, then ``max_err()`` (its error against the reference); a
    config within ``tol`` is timed. ``entry`` gets max_err and ms (and tflops), or the error."""
    try:
        launch()
        torch.cuda.synchronize()
        err = max_err()
        entry["max_err"] = err
        if err > tol:
            entry["error"] = "wrong result"
        else:
            t = bench(launch)
            entry["ms"] = t[0]
            if flops is not None:
                entry["tflops"] = flops / t[0] / 1e9
    except Exception as e:
        entry["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return entry


def main(path):
    res = dict(commit=os.environ.get("COURSE_COMMIT"), gpu=torch.cuda.get_device_name(0), torch=torch.__version__,
               triton=triton.__version__, fwd=[], bwd_kv=[], bwd_q=[], sdpa=[], notes=[])
    t_start = time.time()

    def save():
        res["wall_s"] = round(time.time() - t_start, 1)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    for shape in SHAPES:
        B, H, N, D = shape
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, H, N, D, generator=g, device="cuda", dtype=torch.float16) for _ in range(3))
            fl = A.LOG2E / math.sqrt(D)
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            flops = 4 * B * H * N * N * D // (2 if causal else 1)
            # --- SDPA per backend, forward and forward + backward
            for name, be in [("default", None)] + list(backends.items()):
                try:
                    def f_fwd(be=be):
                        if be is None:
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        with sdpa_kernel([be]):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    t = bench(f_fwd)
                    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
                    do = torch.randn_like(q)

                    def f_fb(be=be):
                        qg.grad = kg.grad = vg.grad = None
                        if be is None:
                            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                        else:
                            with sdpa_kernel([be]):
                                o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                        o.backward(do)
                    tb = bench(f_fb)
                    res["sdpa"].append(dict(shape=shape, causal=causal, backend=name, fwd_ms=t[0],
                                            fwd_tflops=flops / t[0] / 1e9, fwdbwd_ms=tb[0],
                                            fwdbwd_tflops=3.5 * flops / tb[0] / 1e9))
                except Exception as e:
                    res["sdpa"].append(dict(shape=shape, causal=causal, backend=name, error=str(e)[:200]))
                print(res["sdpa"][-1], flush=True)
            save()
            # --- forward configs
            o = torch.empty_like(q)
            lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
            for cfg in FWD:
                bm, bn, w, st = cfg

                def launch():
                    A.attn_flash_fwd_kernel[(triton.cdiv(N, bm), B * H)](
                        q, k, v, o, lse, H, N, N, D, fl, 0, *A._strides(q), *A._strides(k), *A._strides(v),
                        *A._strides(o), N, CAUSAL=causal, IEEE=False, EVEN_D=True, ACC_DT=tl.float32,
                        BLOCK_D=D, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
                entry = measure(dict(shape=shape, causal=causal, cfg=cfg), launch,
                                lambda: float((o.float() - ref.float()).abs().max()), 2e-2, flops)
                res["fwd"].append(entry)
                print("fwd", entry, flush=True)
            save()
            # --- backward: the reference gradients from SDPA (flash) in float16
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
            do = torch.randn_like(q)
            F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(do)
            o_ok, lse_ok = A.attention_forward(q, k, v, causal)
            delta = (o_ok.float() * do.float()).sum(-1).contiguous()
            scale = 1.0 / math.sqrt(D)
            common = (H, N, N, D, A.LOG2E * scale, scale, 0)
            strides = (*A._strides(q), *A._strides(k), *A._strides(v), *A._strides(do))
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            for cfg in KV:
                bm, bn, w, st = cfg

                def launch():
                    A.attn_bwd_kv_kernel[(triton.cdiv(N, bn), B * H)](
                        q, k, v, do, lse_ok, delta, dq, dk, dv, *common, *strides, 0, 0, 0, 0, N,
                        CAUSAL=causal, ATOMIC_DQ=False, IEEE=False, ACC_DT=tl.float32, BLOCK_D=D,
                        BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
                entry = measure(dict(shape=shape, causal=causal, cfg=cfg), launch,
                                lambda: max(float((dk.float() - kg.grad.float()).abs().max()),
                                            float((dv.float() - vg.grad.float()).abs().max())), 5e-2)
                res["bwd_kv"].append(entry)
                print("kv", entry, flush=True)
            for cfg in Q:
                bm, bn, w, st = cfg

                def launch():
                    A.attn_bwd_q_kernel[(triton.cdiv(N, bm), B * H)](
                        q, k, v, do, lse_ok, delta, dq, *common, *strides, N,
                        CAUSAL=causal, IEEE=False, ACC_DT=tl.float32, BLOCK_D=D,
                        BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
                entry = measure(dict(shape=shape, causal=causal, cfg=cfg), launch,
                                lambda: float((dq.float() - qg.grad.float()).abs().max()), 5e-2)
                res["bwd_q"].append(entry)
                print("q", entry, flush=True)
            save()
            q = k = v = o = qg = kg = vg = None  # frees the GPU memory (a del would leave the closures above unbound)
            torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    try:
        main(sys.argv[1] if len(sys.argv) > 1 else "attention-tune.json")
    except Exception:
        traceback.print_exc()
        sys.exit(1)
