"""Try matmul configurations on a GPU: correctness, then TFLOP/s at 4096^3 against torch.mm.

    python -m benchmarks.tune.matmul_tune [--size 4096] [--quick]

Prints one line per kernel (and per v4 tile shape), plus Triton's autotuned choice. Used to
pick VEC4_CONFIG in kernels/cuda/matmul.py; the recorded numbers come from `python -m
benchmarks --topics matmul`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import kernels
import utils
from kernels.cuda import matmul as cm


def tflops(fn, M, N, K):
    import triton
    ms = triton.testing.do_bench(fn, warmup=25, rep=200)
    return 2 * M * N * K / (ms * 1e-3) / 1e12, ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args()
    if utils.SIMULATE:
        sys.exit("matmul_tune needs a GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    # correctness, awkward shapes
    for (M, N, K) in [(127, 255, 63), (1000, 1000, 1000), (256, 256, 1), (129, 260, 68)]:
        for lang in ("cuda", "numba", "triton"):
            mod = kernels.module("matmul", lang)
            for v, (_, f) in mod.VERSIONS.items():
                for dt in getattr(mod, "INPUT_DTYPES", {}).get(v, (torch.float32,)):
                    a = torch.randn(M, K, device="cuda").to(dt)
                    b = torch.randn(K, N, device="cuda").to(dt)
                    c = f(a, b)
                    ref = a.double() @ b.double()
                    err = ((c.double() - ref).abs() / (ref.abs() + 1)).max().item()
                    print(f"check {lang} {v} {str(dt)[6:]} {M}x{N}x{K}: max rel err {err:.2e}")
        for name in cm.VEC4_KERNELS:
            if K % 4 == 0 and N % 4 == 0:
                a = torch.randn(M, K, device="cuda")
                b = torch.randn(K, N, device="cuda")
                err = (cm.matmul_vec4(a, b, name) - a @ b).abs().max().item()
                print(f"check {name} {M}x{N}x{K}: {err:.2e}")
    S = args.size
    for M, N, K in [(S, S, S), (2048, 2048, 2048), (1024, 1024, 1024), (4095, 4097, 4093)]:
        print(f"--- {M}x{N}x{K}")
        a = torch.randn(M, K, device="cuda")
        b = torch.randn(K, N, device="cuda")
        ah, bh = a.half(), b.half()
        t_ref, _ = tflops(lambda: torch.mm(a, b), M, N, K)
        t_ref16, _ = tflops(lambda: torch.mm(ah, bh), M, N, K)
        print(f"torch.mm fp32 (no TF32) {t_ref:.1f} TFLOP/s; fp16 {t_ref16:.1f}")
        for v in ("v1", "v2", "v3", "v4"):
            if v == "v1" and M > 4096:
                continue
            t, ms = tflops(lambda: kernels.get("matmul", "cuda", v)(a, b), M, N, K)
            print(f"cuda {v} {t:.1f} TFLOP/s ({100 * t / t_ref:.0f}% of fp32 torch.mm) {ms:.2f} ms")
        if K % 4 == 0 and N % 4 == 0:
            for name in cm.VEC4_KERNELS:
                t, ms = tflops(lambda: cm.matmul_vec4(a, b, name), M, N, K)
                print(f"cuda v4 {name} {t:.1f} TFLOP/s ({100 * t / t_ref:.0f}%)")
        t, _ = tflops(lambda: cm.matmul_wmma(ah, bh), M, N, K)
        print(f"cuda v5 wmma fp16 {t:.1f} TFLOP/s ({100 * t / t_ref16:.0f}% of fp16 torch.mm)")
        t0 = time.time()
        from kernels.triton import matmul as tm
        t, _ = tflops(lambda: tm.matmul_fp16(ah, bh), M, N, K)
        print(f"triton fp16 {t:.1f} TFLOP/s ({100 * t / t_ref16:.0f}% of fp16 torch.mm) "
              f"best {tm.matmul_fp16_kernel.best_config} (tuning+bench {time.time() - t0:.0f}s)")
        t0 = time.time()
        t, _ = tflops(lambda: tm.matmul_fp32(a, b), M, N, K)
        print(f"triton fp32 {t:.1f} TFLOP/s ({100 * t / t_ref:.0f}% of fp32 torch.mm) "
              f"best {tm.matmul_fp32_kernel.best_config} (tuning+bench {time.time() - t0:.0f}s)")
        if M <= 2048:
            for v in ("v1", "v2"):
                t, _ = tflops(lambda: kernels.get("matmul", "numba", v)(a, b), M, N, K)
                print(f"numba {v} {t:.2f} TFLOP/s")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
