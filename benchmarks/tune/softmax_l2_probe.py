"""The settings behind Triton softmax v4 (kernels/triton/softmax.py), tried on a GPU at the
widest benchmark shape: one program per SM against more, 32 warps against 16.

    python -m benchmarks.tune.softmax_l2_probe [--out FILE.json]

The recorded runs are benchmarks/results/lessons/<gpu>-softmax-l2-probe.json (each names its
commit); lesson 05 reads the newest GPU's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import kernels.triton.softmax as sm
import utils


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if utils.SIMULATE:
        print("no GPU: nothing to measure")
        return 2
    import triton.testing
    rows, cols = 1024, 65536
    spec = utils.topic("softmax")
    x = spec.make_input((rows, cols), seed=0)
    ref = spec.reference(x)
    nbytes = spec.nbytes((rows, cols))
    sms = sm.sm_count()

    def l2(programs, warps):
        def run(x):
            y = torch.empty_like(x)
            sm.softmax_l2_kernel[(programs,)](x, y, rows, cols, BLOCK_SIZE=sm.L2_BLOCK, num_warps=warps)
            return y
        return run

    tries = {
        "torch.softmax": lambda x: torch.softmax(x, dim=-1),
        "triton v3 (online)": sm.softmax_online,
        f"triton v4: {sms} programs, 32 warps": l2(sms, 32),
        f"triton v4: {sms} programs, 16 warps": l2(sms, 16),
        f"triton v4: {2 * sms} programs, 32 warps": l2(2 * sms, 32),
    }
    out = dict(shape=[rows, cols], gpu=torch.cuda.get_device_name(0), **utils.source_commit(), results={})
    for name, fn in tries.items():
        err = (fn(x).double() - ref).abs().max().item()
        ms = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=200)
        gbps = nbytes / (ms * 1e-3) / 1e9
        out["results"][name] = dict(median_ms=ms, gbps=gbps, max_err=err)
        print(f"{name:<36} {ms * 1e3:8.1f} us {gbps:8,.0f} GB/s  max err {err:.1e}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
