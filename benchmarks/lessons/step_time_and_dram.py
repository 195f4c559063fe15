"""GPU measurements that lessons 06 and 08 show from benchmarks/results/lessons/: the time of a
training step with and without print(loss) (``<gpu>-print-loss.json``), and the DRAM bytes of
every matmul version (``<gpu>-matmul-dram.json``). ``step_time_and_dram_gpu_run.sh`` runs it.

    python -m benchmarks.lessons.step_time_and_dram steptime OUT.json   # training step with and without print(loss)
    python -m benchmarks.lessons.step_time_and_dram dram                # every matmul version once, for ncu
    python -m benchmarks.lessons.step_time_and_dram collect RAW.csv ORDER.json OUT.json

``dram`` runs each matmul version of the benchmark once between ``torch.cuda._sleep`` marker
kernels; under ``ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum`` the launches
between two markers are that version's, so ``collect`` sums their DRAM bytes (the bytes the
kernel really moved, not the minimum a matmul must move). Every version is checked against
torch.mm before it is measured.
"""
import csv
import io
import json
import statistics
import sys
import time
from pathlib import Path

import torch

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import kernels
import utils

SHAPE = tuple(utils.PROBLEM_SIZES["gpu"]["matmul_bench_shapes"][0])
MARK = "spin_kernel"   # the kernel torch.cuda._sleep launches


def _meta():
    return {**utils.source_commit(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}


def steptime(out):
    """Per-step time of a small training loop, with print(loss) every step (the host waits
    for the GPU each step) and without (losses kept on the GPU, read once at the end)."""
    res = []
    for width, batch in [(4096, 8192), (1024, 256), (256, 64)]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                    torch.nn.Linear(width, 10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(batch, width, device="cuda")
        target = torch.randint(0, 10, (batch,), device="cuda")

        def step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), target)
            loss.backward()
            opt.step()
            return loss

        steps = 20 if width == 4096 else 200
        row = {"width": width, "batch": batch, "steps": steps}
        for mode in ("print", "no print"):
            times = []
            for rep in range(6):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                total = torch.zeros((), device="cuda")
                for _ in range(steps):
                    loss = step()
                    if mode == "print":
                        print(f"loss {loss.item():.4f}", file=sys.stderr)  # the host waits here
                    else:
                        total += loss.detach()
                last = total.item()  # one wait at the end
                torch.cuda.synchronize()
                if rep:   # the first repetition warms up
                    times.append((time.perf_counter() - t0) / steps * 1e3)
            row[mode] = {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}
        print(row, last)
        res.append(row)
    with open(out, "w") as f:
        json.dump({**_meta(), "what": "ms per training step (Linear-GELU-Linear, SGD), "
                   "print(loss.item()) every step vs losses summed on the GPU and read once",
                   "rows": res}, f, indent=1)


def _variants():
    for topic, dtype in (("matmul", torch.float32), ("matmul_fp16", torch.float16)):
        for lang in kernels.LANGUAGES:
            try:
                names = list(kernels.module(topic, lang).VERSIONS)
            except Exception:
                continue
            for v in names:
                yield topic, dtype, f"{lang} {v}", kernels.get(topic, lang, v)
        yield topic, dtype, "torch", torch.mm


def dram():
    m, n, k = SHAPE
    order = []
    for topic, dtype, name, fn in _variants():
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        ref = (a.double() @ b.double())
        try:
            c = fn(a, b)   # warm-up: compile, autotune
            torch.cuda.synchronize()
            err = ((c.double() - ref).abs().max() / ref.abs().max()).item()
            ok = err < (1e-2 if dtype == torch.float16 else 1e-4)
        except Exception as e:
            print(topic, name, "FAILED", e)
            continue
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        torch.cuda._sleep(1000)
        fn(a, b)
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        order.append({"topic": topic, "variant": name, "checked": ok, "max_rel_err": err})
        print(topic, name, "ok" if ok else "WRONG", err, flush=True)
    with open("/tmp/dram-order.json", "w") as f:
        json.dump(order, f)


def collect(raw, order_path, out):
    text = open(raw).read()
    text = text[text.index('"ID"'):]
    rows = list(csv.DictReader(io.StringIO(text)))[1:]   # the second line holds the units
    order = json.load(open(order_path))
    segs, cur, inside = [], [], False
    for r in rows:
        if MARK in r["Kernel Name"]:
            if inside:
                segs.append(cur)
            cur, inside = [], not inside
        elif inside:
            cur.append(r)
    assert len(segs) == len(order), (len(segs), len(order))
    m, n, k = SHAPE
    res = []
    for o, seg in zip(order, segs):
        num = lambda r, key: float(r[key].replace(",", ""))  # noqa: E731
        rd = sum(num(r, "dram__bytes_read.sum") for r in seg)
        wr = sum(num(r, "dram__bytes_write.sum") for r in seg)
        res.append({**o, "shape": [m, n, k], "kernels": [r["Kernel Name"][:80] for r in seg],
                    "dram_read_bytes": rd, "dram_write_bytes": wr, "flops": 2 * m * n * k})
    json.dump({**_meta(), "what": "DRAM bytes (ncu dram__bytes_read.sum + dram__bytes_write.sum, "
               "caches flushed before the launch) of one call of each matmul version", "rows": res},
              open(out, "w"), indent=1)
    for r in res:
        print(r["topic"], r["variant"], f"{(r['dram_read_bytes'] + r['dram_write_bytes']) / 1e6:.0f} MB")


if __name__ == "__main__":
    {"steptime": steptime, "dram": dram, "collect": collect}[sys.argv[1]](*sys.argv[2:])
