"""The ring all-reduce written from sends and receives (``kernels/collectives.py``) beside the
backend's own ``torch.distributed.all_reduce``, on N ranks: time per call, algorithm and bus
bandwidth, from 4 KB to 1 GB (lesson 13; the run on several GPUs).

    python -m benchmarks.lessons.collectives_bandwidth --backend nccl --world 2 --out DIR    # 2 GPUs
    python -m benchmarks.lessons.collectives_bandwidth --backend gloo --world 2 --max-bytes 4e6 --out DIR

Writes ``DIR/<gpus or cpu>-collectives-<backend>-<world>.json`` and a plot of the bus bandwidth
beside it (``.png``). Every size is checked first: the ring's result against ``all_reduce``'s on
the same inputs (integers in float32, so every order of the sum is exact), then timed: ``iters``
calls between two barriers (and, on GPUs, synchronisations), the median of ``reps`` such runs,
taken on rank 0. Bus bandwidth is nccl-tests' convention: algbw (bytes / time) x 2 (N - 1) / N.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import utils
from kernels import collectives as coll

OPS = ("torch all_reduce", "ring all_reduce")


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of 4 times 4 KB from ``min_bytes`` up to ``max_bytes`` (whole float32 values)."""
    out, b = [], 4096
    while b <= max_bytes:
        if b >= min_bytes:
            out.append(b)
        b *= 4
    return out


def _time(fn, sync, iters: int, reps: int) -> float:
    import torch.distributed as dist
    fn()  # warm-up (NCCL's communicators, gloo's buffers)
    times = []
    for _ in range(reps):
        sync()
        dist.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        times.append((time.perf_counter() - t) / iters)
    return statistics.median(times)


def measure(rank: int, world: int, byte_sizes: list[int], iters: int, reps: int) -> list[dict]:
    """One rank's part: check, then time each op at each size. Rank 0 returns the rows."""
    import torch.distributed as dist
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
    rows = []
    for nbytes in byte_sizes:
        n = nbytes // 4
        g = torch.Generator().manual_seed(rank * 7919 + n)
        x = torch.randint(-100, 100, (n,), generator=g).float().to(device)
        want = x.clone()
        dist.all_reduce(want)
        got = coll.ring_all_reduce(x.clone(), rank, world)
        ok = bool(torch.equal(got, want))
        buf = x.clone()
        for op, fn in zip(OPS, (lambda: dist.all_reduce(buf), lambda: coll.ring_all_reduce(buf, rank, world))):
            if not ok and op.startswith("ring"):
                rows.append(dict(op=op, bytes=nbytes, status="WRONG: the ring's sum differs from all_reduce's"))
                continue
            sec = _time(fn, sync, iters if nbytes < 2**26 else max(2, iters // 10), reps)
            rows.append(dict(op=op, bytes=nbytes, us=round(sec * 1e6, 2),
                             algbw_gbps=float(f"{nbytes / sec / 1e9:.4g}"),
                             busbw_gbps=float(f"{coll.bus_bandwidth(nbytes, sec, world) / 1e9:.4g}")))
    return rows if rank == 0 else []


def plot(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for op in OPS:
        pts = [(r["bytes"], r["busbw_gbps"]) for r in data["rows"] if r["op"] == op and "busbw_gbps" in r]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"all-reduce on {data['world']} ranks, {data['backend']} ({data['device']})")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("gloo", "nccl"), default="nccl" if torch.cuda.is_available() else "gloo")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--min-bytes", type=float, default=4096)
    p.add_argument("--max-bytes", type=float, default=2**30)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=str(utils.LESSON_RESULTS_DIR))
    args = p.parse_args(argv)
    byte_sizes = sizes(int(args.min_bytes), int(args.max_bytes))
    if not byte_sizes:
        p.error("no size between --min-bytes and --max-bytes (sizes are 4 KB times powers of 4)")
    rows = utils.run_ranks(measure, args.world, byte_sizes, args.iters, args.reps, backend=args.backend,
                           timeout_s=args.timeout)[0]
    device = torch.cuda.get_device_name(0) if args.backend == "nccl" else "CPU"
    data = dict(backend=args.backend, world=args.world, device=device, torch=torch.__version__,
                **utils.source_commit(), method=__doc__.split("\n\n")[2].replace("\n", " "), rows=rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{utils.gpu_slug(device) if args.backend == 'nccl' else 'cpu'}-collectives-{args.backend}-{args.world}"
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(data, out / f"{stem}.png")
    for r in rows:
        print(f"{r['op']:<18} {r['bytes']:>12,} B " + (f"{r['us']:>12.1f} us  busbw {r['busbw_gbps']:8.2f} GB/s"
                                                      if "us" in r else r["status"]), flush=True)
    print(f"wrote {out / stem}.json and .png")
    return 1 if any("status" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
