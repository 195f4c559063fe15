"""Measure the cases of ``benchmarks/simulators/ncu_patterns.py`` on a GPU: Nsight Compute's
counters, timings, and the other recordings the profiling lesson shows (a torch.profiler trace
of a small training loop, compute-sanitizer on racy and out-of-bounds kernels).

``benchmarks/simulators/ncu_gpu_run.sh`` runs the whole batch on the GPU machine; each step is
a subcommand here, and each also runs in simulation (``COURSE_SIMULATE=1``), where it
launches the same kernels in the emulator, so the script is tested before the GPU call:

    python -m benchmarks.simulators.ncu_run launches ORDER.json   # every case once, between
        cudaProfilerStart/Stop (run it under `ncu --profile-from-start off`): the order of
        ncu's launches is the order of ORDER.json
    python -m benchmarks.simulators.ncu_run time TIMES.json       # triton.testing.do_bench of each case
    python -m benchmarks.simulators.ncu_run collect RAW.csv ORDER.json TIMES.json OUT.json [NCU_VERSION]
    python -m benchmarks.simulators.ncu_run loop [TRACE.json.gz]  # a tiny training loop, print(loss) each step
    python -m benchmarks.simulators.ncu_run sanitize              # racy and out-of-bounds kernels
"""
from __future__ import annotations

import csv
import gzip
import json
import os
import platform
import sys
from pathlib import Path

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import utils
from benchmarks.simulators.ncu_patterns import CASES, launch

#: The counters recorded for every case: the profiling contract's metrics (Nsight Compute
#: names), the launch's occupancy limits, and a few more that explain them.
METRICS = [
    *(f"l1tex__t_{what}_pipe_lsu_mem_global_op_{op}.sum"
      for what in ("requests", "sectors") for op in ("ld", "st", "atom", "red")),
    *(f"l1tex__data_{what}_mem_shared_op_{op}.sum"
      for what in ("pipe_lsu_wavefronts", "bank_conflicts_pipe_lsu") for op in ("ld", "st")),
    "sm__sass_inst_executed_op_shared_ld.sum", "sm__sass_inst_executed_op_shared_st.sum",
    "smsp__thread_inst_executed_per_inst_executed.ratio",
    "launch__registers_per_thread", "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "launch__occupancy_limit_blocks", "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps",
    "sm__maximum_warps_per_active_cycle_pct",
]
#: Not in the contract: they explain the ones above (the sum behind the ratio, the lanes a
#: predicate switched off, the hits behind the sectors, the kernel's own duration).
EXTRA_METRICS = [
    "smsp__inst_executed.sum", "smsp__thread_inst_executed.sum",
    "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld_lookup_hit.sum",
    "dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum",
    "launch__grid_size", "launch__block_size",
    # the shared memory the driver configured for the launch (its carveout) and kept per block:
    # the shared-memory occupancy limit depends on both
    "launch__shared_mem_config_size", "launch__shared_mem_per_block_driver",
]


def _sync():
    if not utils.SIMULATE:
        torch.cuda.synchronize()


def cmd_launches(order_path: str) -> None:
    """Every case once between cudaProfilerStart and Stop, after a warm-up launch (which
    compiles it, and lets Triton pick its configuration) outside that window."""
    dev = utils.DEVICE
    for case in CASES.values():
        launch(case, case.make_args(dev))
    _sync()
    order = []
    for case in CASES.values():
        made = case.make_args(dev)
        _sync()
        if not utils.SIMULATE:
            torch.cuda.profiler.start()
        launch(case, made)
        _sync()
        if not utils.SIMULATE:
            torch.cuda.profiler.stop()
        order.append({"case": case.name, "kernel": case.kernel})
        print(f"launched {case.name}", flush=True)
    Path(order_path).write_text(json.dumps(order, indent=1))


def cmd_time(times_path: str) -> None:
    """Median, 20th and 80th percentile of each case's launch with ``do_bench``; GB/s from
    the case's byte count (what the kernel needs to read and write, each byte once)."""
    import triton.testing
    out = {}
    for case in CASES.values():
        made = case.make_args(utils.DEVICE)
        fn = lambda: launch(case, made)  # noqa: E731
        if utils.SIMULATE:  # the interpreter cannot time: just check the call works
            fn()
            out[case.name] = {"bytes": case.bytes}
            continue
        med, p20, p80 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
        row = {"bytes": case.bytes, "median_ms": med, "p20_ms": p20, "p80_ms": p80,
               "gbps": case.bytes / (med * 1e-3) / 1e9}
        # At 2^16 elements a kernel takes microseconds, close to the host's launch cost, so
        # do_bench measures launch overhead too; a CUDA graph replays the launches without
        # the host, which leaves the kernel's own time.
        try:
            g = triton.testing.do_bench_cudagraph(fn, rep=100, quantiles=[0.5, 0.2, 0.8])
            row.update(graph_median_ms=g[0], graph_p20_ms=g[1], graph_p80_ms=g[2],
                       graph_gbps=case.bytes / (g[0] * 1e-3) / 1e9)
        except Exception as e:  # recorded, not fatal
            row["graph_error"] = f"{type(e).__name__}: {e}"[:200]
        out[case.name] = row
        print(f"{case.name:24s} {med * 1e3:8.2f} us  {row['gbps']:8.1f} GB/s", flush=True)
    Path(times_path).write_text(json.dumps(out, indent=1))


def _number(text: str):
    """An ncu CSV value as int or float ("1,024" -> 1024); None if it is not a number."""
    t = text.replace(",", "").strip()
    if t in ("", "n/a"):
        return None
    try:
        return int(t)
    except ValueError:
        try:
            return float(t)
        except ValueError:
            return None


def parse_raw_csv(text: str) -> list[dict]:
    """The rows of ``ncu --csv --page raw``: one dict per profiled launch, metric -> value
    (the kernel's name and id kept as text). ncu's own ==PROF== lines are skipped."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        return []
    header, body = rows[0], rows[1:]
    if body and body[0] and body[0][0] in ("", "ID") and not body[0][0].isdigit():
        body = body[1:]  # the units row
    out = []
    for r in body:
        d = {}
        for k, v in zip(header, r):
            if k in ("Kernel Name", "ID", "Device", "CC"):
                d[k] = v
            else:
                n = _number(v)
                if n is not None:
                    d[k] = n
        out.append(d)
    return out


def cmd_collect(raw_path, order_path, times_path, out_path, ncu_version="") -> None:
    """Join ncu's launches (in order) with the cases and the timings into one JSON file."""
    rows = parse_raw_csv(Path(raw_path).read_text())
    order = json.loads(Path(order_path).read_text())
    times = json.loads(Path(times_path).read_text())
    if len(rows) != len(order):
        raise SystemExit(f"ncu profiled {len(rows)} launches for {len(order)} cases")
    cases = {}
    for want, row in zip(order, rows):
        name = row.get("Kernel Name", "")
        if want["kernel"] not in name:
            raise SystemExit(f"launch {row.get('ID')} is {name!r}, expected {want['kernel']} ({want['case']})")
        wanted = set(METRICS) | set(EXTRA_METRICS)
        cases[want["case"]] = {"kernel_name": name,
                               "ncu": {k: v for k, v in row.items() if k in wanted},
                               "timing": times.get(want["case"], {})}
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (simulation)"
    result = {
        "commit": os.environ.get("COURSE_COMMIT", "unknown"),
        "gpu": gpu,
        "ncu_version": ncu_version.strip(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "metrics": METRICS, "extra_metrics": EXTRA_METRICS,
        "timing_note": ("triton.testing.do_bench, milliseconds per launch (median, p20, p80); "
                        "graph_*: do_bench_cudagraph (no host launch cost); gbps = bytes / median, "
                        "bytes = what the kernel needs to read and write, each byte once"),
        "cases": cases,
    }
    Path(out_path).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out_path}: {len(cases)} cases")


def cmd_loop(trace_path: str | None = None, steps: int = 6) -> None:
    """A tiny training loop that prints the loss every step. ``print(loss)`` needs the
    value on the host, so each step the host waits for the GPU there (in the trace: a long
    cudaStreamSynchronize / memcpy on the host while the GPU finishes the step's kernels)."""
    torch.manual_seed(0)
    dev = utils.DEVICE
    # On a GPU each step's matrix products take tens of milliseconds, far longer than the host
    # needs to queue them, so the host reaches print(loss) early and waits there. On a CPU
    # (where this only checks that the loop runs) the sizes are small.
    width, batch = (256, 512) if utils.SIMULATE else (4096, 8192)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width, device=dev)
    target = torch.randint(0, 10, (batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")  # the sync: the host waits here for the GPU

    step()  # warm-up: cuBLAS handles and kernels loaded outside the trace
    if trace_path is None:
        for _ in range(steps):
            step()
        return
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if not utils.SIMULATE else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
    raw = str(trace_path).removesuffix(".gz")
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as f, gzip.open(trace_path, "wb") as g:
        g.write(f.read())
    os.remove(raw)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def sanitizer_cases() -> dict:
    """name -> (what it is, a function that launches it): the racy and out-of-bounds
    kernels of the emulator's tests, for compute-sanitizer's racecheck and memcheck."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from test_emulator_faults import OOB, SHARED_OVERRUN
    from test_racecheck import BLOCK_SUM, WARP_SHIFT

    dev = utils.DEVICE
    k = utils.cuda_kernel
    n = 1000

    def block_sum(barrier="__syncthreads();", update="atomicAdd(out_ptr, s[0])"):
        kern = k(BLOCK_SUM.replace("BARRIER", barrier).replace("UPDATE", update), "block_sum")
        return lambda: kern[(n + 127) // 128, 128](torch.ones(n, device=dev), torch.zeros(1, device=dev), n)

    return {
        "block_sum": ("block_sum, correct (barriers, one atomicAdd per block)", block_sum()),
        "missing_barrier": ("block_sum without the barrier in its shared-memory tree (shared race)",
                            block_sum(barrier="")),
        "global_race": ("block_sum with out_ptr[0] += s[0] in every block (global race between blocks)",
                        block_sum(update="out_ptr[0] += s[0]")),
        "warp_shift": ("warp_shift without __syncwarp (lanes of one warp race in shared memory)",
                       lambda: k(WARP_SHIFT.replace("SYNC", ""), "warp_shift")[1, 32](
                           torch.randn(32, device=dev), torch.zeros(32, device=dev))),
        "read_past_end": ("shift(offset=1): reads x[1024] of 1024 (global out-of-bounds read)",
                          lambda: k(OOB, "shift")[4, 256](torch.randn(1024, device=dev),
                                                          torch.zeros(1024, device=dev), 1024, 1)),
        "write_past_end": ("store_at(1024): writes y[1024] of 1000 (global out-of-bounds write)",
                           lambda: k(OOB, "store_at")[1, 32](torch.zeros(1000, device=dev), 1024)),
        "shared_overrun": ("tree_past_the_end: writes s[256] of a 256-float __shared__ array",
                           lambda: k(SHARED_OVERRUN, "tree_past_the_end")[4, 256](
                               torch.randn(1000, device=dev), torch.zeros(4, device=dev), 1000)),
    }


def cmd_sanitize(*names) -> None:
    """Launch the named sanitizer cases (all if none), each followed by a synchronize. On a
    GPU a faulting launch poisons the CUDA context, so run each out-of-bounds case in its
    own process. In simulation the emulator's own reports are printed."""
    cases = sanitizer_cases()
    for name in names or cases:
        title, fn = cases[name]
        print(f"=== {name}: {title}", flush=True)
        try:
            # the emulator's race detector, in simulation (off for the overrun, which also races)
            with utils.race_detection(utils.SIMULATE and name != "shared_overrun"):
                fn()
                _sync()
            print(f"=== {name}: returned", flush=True)
        except Exception as e:  # the emulator raises; the GPU may too
            print(f"=== {name}: {type(e).__name__}: {e}", flush=True)


def main(argv):
    cmds = {"launches": cmd_launches, "time": cmd_time, "collect": cmd_collect,
            "loop": cmd_loop, "sanitize": cmd_sanitize}
    if not argv or argv[0] not in cmds:
        raise SystemExit(__doc__)
    cmds[argv[0]](*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
