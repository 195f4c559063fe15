"""Beyond one launch, on a GPU: a copy overlapped with compute on two CUDA streams, the course's
LayerNorm launchers replayed as CUDA graphs, and what breaks a graph's capture (lesson 13).

    python -m benchmarks.lessons.streams_and_graphs            # prints, writes <gpu>-streams-graphs.json
    python -m benchmarks.lessons.streams_and_graphs --out DIR  # (default DIR: benchmarks/results/lessons)

Three parts, each measurement on its own: one that fails is recorded as its error and the
others still run (about 20 s of measuring on an H200).

1. Streams and events. A 256 MiB copy from pinned host memory to the GPU (``non_blocking=True``)
   on a side stream, beside matmuls of about the same time on the main stream; timed with CUDA
   events: each alone, one after the other on one stream, and on the two streams at once. The same
   from pageable memory, which the host cannot hand over without waiting. A profiler trace of
   one serial and two overlapped runs: ``<gpu>-streams-trace.json.gz`` (opens in
   ui.perfetto.dev), and its GPU intervals in the JSON, which ``timeline`` and ``plot_streams``
   draw on any machine.
2. CUDA graphs of launch-bound launchers. The course's LayerNorm forward (CUDA C++, Triton,
   Numba) at 4096x4096 and at 64x1024, float32 and bfloat16 (Numba: float32 only):
   ``triton.testing.do_bench`` of the launcher as called and of a replay of it captured in a
   CUDA graph (``launch_overhead.graph_of``); the time per call of each in a loop (100 back to
   back between two synchronisations); and the host's time per call (back-to-back calls
   without synchronisation, divided by their number).
3. What breaks capture: ``.item()`` in the captured function; a Numba kernel launched on
   Numba's default stream, beside the same kernel through ``utils.numba_launch`` (torch's
   stream); an output allocated in each call (it lives in the graph's memory, and the next
   replay overwrites it); an input whose shape changes after capture. Each capture runs on a
   fresh stream; after each case the GPU is checked to be usable still, and after a failed
   capture whether ``torch.randn`` still draws on the GPU (a failed capture leaves torch's
   generator in capture mode until a capture succeeds).

``summarize(result)`` turns the JSON into the lesson's rows, ``timeline(intervals)`` the trace's
intervals into lanes, one per stream, and ``plot_streams(result)`` draws them; none needs a GPU.
Without a GPU the script measures nothing, says where the recorded numbers are and exits with 2.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import utils  # noqa: E402
from benchmarks.lessons import load_gpu_record  # noqa: E402
from benchmarks.lessons.launch_overhead import graph_of, host_us, loop_us  # noqa: E402

RESULT = "{gpu}-streams-graphs.json"
TRACE = "{gpu}-streams-trace.json.gz"
COPY_BYTES = 256 << 20
MM_N = 4096
LN_SHAPES = [(4096, 4096), (64, 1024)]
LN_DTYPES = {"cuda": ("float32", "bfloat16"), "triton": ("float32", "bfloat16"), "numba": ("float32",)}
#: the profiled runs, in order; a pause between them leaves a gap in the GPU's timeline
PHASES = ("one stream: copy, then compute", "two streams: copy beside compute",
          "two streams: copy beside compute")
PHASE_GAP_US = 500.0
CAPTURE_CASES = {
    "item": "x.abs().max().item() inside the captured function",
    "numba_default_stream": "Numba kernel[grid, block](cuda.as_cuda_array(x), ...): Numba's default stream",
    "numba_launch": "the same kernel through utils.numba_launch: torch's current stream",
    "new_output_each_call": "a launcher that allocates its output in each call",
    "changing_shape": "captured at 64x1024, then called with a 128x1024 input",
}


# ---------------------------------------------------------------------------------------
# What the lesson calls on the recorded JSON (no GPU needed)
# ---------------------------------------------------------------------------------------
def overlap_fraction(copy_ms: float, kernel_ms: float, serial_ms: float, overlapped_ms: float) -> float:
    """How much of the shorter of the two (copy, kernel) the second stream hid: the time saved
    over running them one after the other, over the shorter one's time. 1.0: it was hidden
    whole (the overlapped run took as long as the longer one alone); 0.0: nothing overlapped."""
    shorter = min(copy_ms, kernel_ms)
    return round((serial_ms - overlapped_ms) / shorter, 3) if shorter > 0 else 0.0


def short_name(name: str, width: int = 48) -> str:
    """A kernel's name as a label: no ``void``, no argument list, at most ``width`` characters."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    if "(" in name and not name.startswith("Memcpy") and not name.startswith("Memset"):
        name = name[:name.index("(")]
    return name if len(name) <= width else name[:width - 3] + "..."


def gpu_intervals(trace) -> list[dict]:
    """The GPU's kernels, copies and memsets in a profiler trace (a path to a Chrome trace,
    ``.json`` or ``.json.gz``, or its dict), in the order they started: ``name`` (shortened),
    ``kind`` (kernel, copy or memset), ``stream`` and ``start_us``/``end_us`` from the first
    one's start."""
    kinds = {"kernel": "kernel", "gpu_memcpy": "copy", "gpu_memset": "memset"}
    events = [e for e in utils.load_trace(trace) if e.get("cat") in kinds]
    if not events:
        return []
    t0 = min(float(e["ts"]) for e in events)
    out = []
    for e in sorted(events, key=lambda e: float(e["ts"])):
        start = float(e["ts"]) - t0
        stream = (e.get("args") or {}).get("stream", e.get("tid"))
        out.append(dict(name=short_name(str(e.get("name", ""))), kind=kinds[e["cat"]],
                        stream=int(stream) if str(stream).lstrip("-").isdigit() else str(stream),
                        start_us=round(start, 2), end_us=round(start + float(e["dur"]), 2)))
    return out


def split_phases(intervals: list[dict], gap_us: float = PHASE_GAP_US, names=PHASES) -> list[dict]:
    """The bursts of GPU work in ``intervals``, cut where the GPU idled longer than ``gap_us``:
    ``name`` (from ``names`` when there are as many bursts as names), ``start_us``, ``end_us``
    and ``intervals`` (those of the burst, in the order they started)."""
    bursts, end = [], None
    for iv in sorted(intervals, key=lambda iv: iv["start_us"]):
        if end is None or iv["start_us"] > end + gap_us:
            bursts.append([])
            end = iv["end_us"]
        bursts[-1].append(iv)
        end = max(end, iv["end_us"])
    labels = list(names) if len(names) == len(bursts) else [f"burst {i + 1}" for i in range(len(bursts))]
    return [dict(name=label, start_us=b[0]["start_us"], end_us=max(iv["end_us"] for iv in b), intervals=b)
            for label, b in zip(labels, bursts)]


def _union(spans):
    """The spans (start, end) merged where they touch or overlap, in order."""
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def timeline(intervals: list[dict]) -> dict:
    """Plot data of some GPU intervals (``gpu_intervals``), one lane per stream, times from the
    first interval's start:

    * ``lanes``: ``[{stream, label, bars: [(start_us, length_us, name, kind)], busy_us}]``, in
      stream order; ``label`` says what the stream ran (``stream 7: copies and kernels``);
    * ``span_us``: from the first start to the last end;
    * ``concurrent_us``: the time two streams or more were busy at once (the overlap)."""
    if not intervals:
        return dict(lanes=[], span_us=0.0, concurrent_us=0.0)
    t0 = min(iv["start_us"] for iv in intervals)
    streams = sorted({iv["stream"] for iv in intervals}, key=lambda s: (isinstance(s, str), s))
    lanes, edges = [], []
    for s in streams:
        mine = sorted((iv for iv in intervals if iv["stream"] == s), key=lambda iv: iv["start_us"])
        kinds = {iv["kind"] for iv in mine}
        what = " and ".join(many for one, many in (("copy", "copies"), ("kernel", "kernels"), ("memset", "memsets"))
                            if one in kinds)
        busy = _union([(iv["start_us"] - t0, iv["end_us"] - t0) for iv in mine])
        for a, b in busy:
            edges += [(a, 1), (b, -1)]
        lanes.append(dict(stream=s, label=f"stream {s}: {what}",
                          bars=[(round(iv["start_us"] - t0, 2), round(iv["end_us"] - iv["start_us"], 2), iv["name"],
                                 iv["kind"]) for iv in mine],
                          busy_us=round(sum(b - a for a, b in busy), 2)))
    concurrent, running, last = 0.0, 0, 0.0
    for t, step in sorted(edges, key=lambda e: (e[0], e[1])):  # ends before starts at the same instant
        if running >= 2:
            concurrent += t - last
        running += step
        last = t
    span = max(iv["end_us"] for iv in intervals) - t0
    return dict(lanes=lanes, span_us=round(span, 2), concurrent_us=round(concurrent, 2))


def capture_outcome(case: str, r: dict) -> str:
    """One sentence on what happened to a capture case of ``result["capture"]``."""
    if r.get("captured") is False:
        said = f"capture failed: {r.get('error')}"
        if r.get("randn_after") not in (None, "works"):
            said += f"; after it torch.randn on the GPU raised {r['randn_after']}"
            if r.get("randn_after_a_good_capture") == "works":
                said += " (until a capture succeeded)"
        return said
    if r.get("captured") is None:
        return f"the case did not run to the end: {r.get('error')}"
    if case in ("numba_default_stream", "numba_launch"):
        if r.get("replay_ran_kernel"):
            return "captured: the replay runs the kernel on the new input"
        said = ("captured without error, but the replay did not run the kernel: it ran once, outside the graph, "
                "while the graph was being captured")
        if r.get("warnings"):
            said += f" (torch warned: {r['warnings'][0].split('. ')[0]})"
        return said
    if case == "new_output_each_call":
        if r.get("kept_changed"):
            return ("captured, but the output kept after replay 1 changed at replay 2: it lives in the graph's "
                    f"memory, which every replay overwrites (it now holds the {r.get('kept_holds')} input's result)")
        return "captured; the output kept after replay 1 did not change"
    if case == "changing_shape":
        shape = "x".join(map(str, r.get("replay_output_shape") or []))
        new = "x".join(map(str, r.get("new_input_shape") or []))
        if r.get("replay_matches_old_input"):
            return (f"captured, but after the input became {new} the replay still gives {shape}, "
                    "the old input's result: the graph reads the old tensor at the old shape")
        return f"captured; after the input became {new} the replay gives {shape}"
    return "captured" if r.get("captured") else f"capture failed: {r.get('error')}"


def summarize(result: dict) -> dict:
    """The lesson's rows from a recorded result (the JSON this script writes):

    * ``streams``: ``[{run, ms}]`` (copy alone, compute alone, one stream, two streams, and the
      same from pageable memory when recorded), ``overlap_fraction``, ``copy_gbps``;
    * ``graphs``: ``[{launcher, dtype, shape, eager_us, graph_us, speedup, loop_eager_us, loop_graph_us,
      loop_speedup, host_us, replay_host_us}]`` (or ``error``), largest shape first (the JSON's
      ``graphs.method`` says what each column measures);
    * ``capture``: ``[{case, what, captured, outcome}]``.
    A part that failed on the GPU gives ``[{"error": ...}]``."""
    out = dict(streams=[], overlap_fraction=None, copy_gbps=None, graphs=[], capture=[])
    s = result.get("streams") or {}
    if "error" in s:
        out["streams"].append(dict(error=s["error"]))
    elif s:
        for key, run in (("copy_ms", "copy alone (side stream)"), ("kernel_ms", "compute alone (main stream)"),
                         ("serial_ms", "one stream: copy, then compute"),
                         ("overlapped_ms", "two streams: copy beside compute")):
            if key in s:
                out["streams"].append(dict(run=run, ms=s[key]))
        p = s.get("pageable") or {}
        for key, run in (("copy_ms", "pageable: copy alone"), ("serial_ms", "pageable: one stream"),
                         ("overlapped_ms", "pageable: two streams")):
            if key in p:
                out["streams"].append(dict(run=run, ms=p[key]))
        out["overlap_fraction"] = s.get("overlap_fraction")
        out["copy_gbps"] = s.get("copy_gbps")
    g = result.get("graphs") or {}
    if "error" in g:
        out["graphs"].append(dict(error=g["error"]))
    for r in sorted(g.get("rows", []), key=lambda r: (-r["shape"][0] * r["shape"][1], r["dtype"] != "float32",
                                                      r["lang"])):
        row = dict(launcher=r["lang"], dtype=r["dtype"], shape="x".join(map(str, r["shape"])))
        if "error" in r:
            row["error"] = r["error"]
        else:
            row.update(eager_us=r["eager_us"], graph_us=r["graph_us"],
                       speedup=round(r["eager_us"] / r["graph_us"], 2) if r["graph_us"] else None,
                       loop_eager_us=r.get("loop_eager_us"), loop_graph_us=r.get("loop_graph_us"),
                       loop_speedup=(round(r["loop_eager_us"] / r["loop_graph_us"], 2)
                                     if r.get("loop_eager_us") and r.get("loop_graph_us") else None),
                       host_us=r.get("host_us"), replay_host_us=r.get("replay_host_us"))
        out["graphs"].append(row)
    c = result.get("capture") or {}
    if "error" in c:
        out["capture"].append(dict(error=c["error"]))
    for case, what in CAPTURE_CASES.items():
        if case in c:
            out["capture"].append(dict(case=case, what=what, captured=c[case].get("captured"),
                                       outcome=capture_outcome(case, c[case])))
    return out


def format_rows(rows: list[dict]) -> str:
    """Rows of dicts as a plain text table (the keys of the first row as its columns; floats
    with 4 significant digits)."""
    if not rows:
        return "(none)"
    cols = list(dict.fromkeys(k for r in rows for k in r))

    def cell(v):
        return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
    table = [cols] + [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in table)


def load_recorded(path=None) -> tuple[dict, str | None]:
    """The recorded result (``path``, else the newest GPU's ``<gpu>-streams-graphs.json`` in
    ``benchmarks/results/lessons/``) and the GPU's short name."""
    return load_gpu_record(RESULT, "streams_and_graphs", path)


def plot_streams(result: dict, ax=None):
    """The recorded trace as lanes, one per stream: the one-stream run above, the first
    two-stream run below, both from their own start, so the saved time shows at the right."""
    from matplotlib.patches import Patch, Rectangle

    from utils.plots import _new_axes
    phases = (result.get("trace") or {}).get("phases") or []
    picked = [p for p in phases if p["name"] == PHASES[0]][:1] + [p for p in phases if p["name"] == PHASES[1]][:1]
    picked = picked or phases[:2]
    if not picked:
        raise ValueError("the result has no trace intervals to draw "
                         f"({(result.get('trace') or {}).get('error', 'no trace')})")
    rows = [(p["name"], lane) for p in picked for lane in timeline(p["intervals"])["lanes"]]
    fig, ax = _new_axes(ax, (10, 0.9 + 0.6 * len(rows)))
    colors = {"copy": "#e69f00", "kernel": "#0072b2", "memset": "#999999"}
    end = 0.0
    for i, (_, lane) in enumerate(rows):
        for start, length, _, kind in lane["bars"]:
            ax.add_patch(Rectangle((start / 1e3, i + 0.15), max(length, 1e-3) / 1e3, 0.7,
                                   facecolor=colors.get(kind, "#999999"), edgecolor="white", linewidth=0.5))
            end = max(end, start + length)
    ax.set_xlim(0, end / 1e3 * 1.02)
    ax.set_ylim(len(rows), 0)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [f"{name}\n{lane['label']}" for name, lane in rows],
                  fontsize=7)
    ax.set_xlabel("time (ms from the run's first GPU activity)")
    ax.legend(handles=[Patch(facecolor=colors["copy"], label="host-to-device copy"),
                       Patch(facecolor=colors["kernel"], label="kernel")],
              loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=7)
    ax.set_title(f"a copy and matmuls on one stream, then on two ({result.get('gpu', 'GPU')})", fontsize=9)
    return fig


# ---------------------------------------------------------------------------------------
# Measurements (on a GPU)
# ---------------------------------------------------------------------------------------
def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def error_of(e: BaseException) -> dict:
    """``error``: the first line of the exception raised first (an exception raised while
    handling another keeps it as its ``__context__``), and ``error_after``: the last one's."""
    chain, cur = [e], e
    while (cur.__cause__ or cur.__context__) is not None and len(chain) < 5:
        cur = cur.__cause__ or cur.__context__
        chain.append(cur)
    out = dict(error=first_line(chain[-1]))
    if len(chain) > 1:
        out["error_after"] = first_line(e)
    return out


def gpu_usable() -> bool:
    """Whether the GPU still runs work after a failed capture."""
    try:
        torch.cuda.synchronize()
        return float(torch.ones(4, device="cuda").add_(1).sum()) == 8.0
    except Exception:
        return False


def randn_error() -> str | None:
    """None when torch's default CUDA generator draws numbers; else the first line of its error.
    A capture that fails leaves the generator in capture mode: ``torch.randn`` on the GPU then
    raises until a capture succeeds (``recapture``)."""
    try:
        torch.randn(4, device="cuda")
        torch.cuda.synchronize()
        return None
    except Exception as e:
        return first_line(e)


def recapture() -> None:
    """One small capture that succeeds: it takes torch's default CUDA generator out of the
    capture mode that a failed capture leaves it in (``runtime.graphs``, where the graders use it too)."""
    from runtime.graphs import recover_after_failed_capture
    recover_after_failed_capture()


def event_ms(fn, reps: int = 5) -> float:
    """Milliseconds between two CUDA events recorded on the current stream around ``fn()``,
    median of ``reps`` runs after one warm-up run."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 4)


def measure_streams(trace_path: Path) -> tuple[dict, dict]:
    """Part 1: (the timings, the trace's record)."""
    n = COPY_BYTES // 4
    pinned = torch.empty(n, dtype=torch.float32, pin_memory=True).fill_(1.0)
    pageable = torch.ones(n, dtype=torch.float32)
    dst = torch.empty(n, dtype=torch.float32, device="cuda")
    a = torch.randn(MM_N, MM_N, device="cuda")
    b = torch.randn(MM_N, MM_N, device="cuda")
    c = torch.empty(MM_N, MM_N, device="cuda")
    main_stream = torch.cuda.current_stream()
    side = torch.cuda.Stream()

    def copy_on_side(src):
        side.wait_stream(main_stream)  # the copy starts after what the main stream did before it
        with torch.cuda.stream(side):
            dst.copy_(src, non_blocking=True)

    copy_ms = event_ms(lambda: (copy_on_side(pinned), main_stream.wait_stream(side)))
    mm_ms = event_ms(lambda: torch.mm(a, b, out=c))
    reps = max(1, round(copy_ms / mm_ms))

    def compute():
        for _ in range(reps):
            torch.mm(a, b, out=c)

    def serial(src=pinned):
        dst.copy_(src, non_blocking=True)
        compute()

    def overlapped(src=pinned):
        copy_on_side(src)
        compute()
        main_stream.wait_stream(side)  # the main stream goes on once the copy is done too

    def issue_ms(fn):  # the host's time to issue fn, not waiting for the GPU
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        torch.cuda.synchronize()
        return round(dt * 1e3, 3)

    kernel_ms = event_ms(compute)
    serial_ms = event_ms(serial)
    overlapped_ms = event_ms(overlapped)
    streams = dict(
        copy=f"{COPY_BYTES >> 20} MiB of float32, pinned host memory to the GPU, non_blocking=True, on a side stream",
        compute=f"{reps} x torch.mm of {MM_N}x{MM_N} float32 on the main stream (as many as take the copy's time)",
        method="CUDA events on the main stream around each run (the two-stream run: the side stream waits for the "
               "main one before the copy, the main one for the side one after the compute); median of 5 runs "
               "(pageable: 3). host_issue_ms: the host's time to issue one two-stream run",
        copy_ms=copy_ms, kernel_ms=kernel_ms, serial_ms=serial_ms, overlapped_ms=overlapped_ms,
        overlap_fraction=overlap_fraction(copy_ms, kernel_ms, serial_ms, overlapped_ms),
        copy_gbps=round(COPY_BYTES / copy_ms / 1e6, 1),
        host_issue_ms=dict(pinned=issue_ms(overlapped)),
    )
    print(f"streams: copy {copy_ms:.3f} ms, compute {kernel_ms:.3f} ms, one stream {serial_ms:.3f} ms, "
          f"two streams {overlapped_ms:.3f} ms (overlap {streams['overlap_fraction']:.0%})", flush=True)
    try:
        p_copy = event_ms(lambda: (copy_on_side(pageable), main_stream.wait_stream(side)), reps=3)
        p_serial = event_ms(lambda: serial(pageable), reps=3)
        p_over = event_ms(lambda: overlapped(pageable), reps=3)
        streams["pageable"] = dict(copy_ms=p_copy, serial_ms=p_serial, overlapped_ms=p_over,
                                   overlap_fraction=overlap_fraction(p_copy, kernel_ms, p_serial, p_over))
        streams["host_issue_ms"]["pageable"] = issue_ms(lambda: overlapped(pageable))
        print(f"streams, pageable source: copy {p_copy:.3f} ms, two streams {p_over:.3f} ms", flush=True)
    except Exception as e:
        streams["pageable"] = error_of(e)

    # the trace: one serial run, then two overlapped ones, a pause after each
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for run in (serial, overlapped, overlapped):
                run()
                torch.cuda.synchronize()
                time.sleep(2 * PHASE_GAP_US / 1e6)
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))  # a name ending in .gz: written gzipped
        intervals = gpu_intervals(trace_path)
        trace = dict(file=trace_path.name, bytes=trace_path.stat().st_size,
                     runs=list(PHASES), phases=split_phases(intervals))
        print(f"trace: {trace_path} ({trace['bytes']:,} bytes, {len(intervals)} GPU intervals in "
              f"{len(trace['phases'])} runs)", flush=True)
    except Exception as e:
        trace = error_of(e)
    return streams, trace


def measure_graphs() -> dict:
    """Part 2: each LayerNorm launcher eager and as a graph replay, at each shape and dtype."""
    import torch.nn.functional as F

    import kernels
    from utils.topics.layernorm import layernorm_input

    from triton.testing import do_bench

    def bench_us(fn):
        ms, lo, hi = do_bench(fn, quantiles=[0.5, 0.2, 0.8])
        return round(ms * 1e3, 2), round(lo * 1e3, 2), round(hi * 1e3, 2)

    rows = []
    for shape in LN_SHAPES:
        for dname in ("float32", "bfloat16"):
            dtype = getattr(torch, dname)
            if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
                continue
            x, w, b = layernorm_input(shape, seed=0, device="cuda", dtype=dtype)
            ref = F.layer_norm(x.float(), (shape[1],), w.float(), b.float(), 1e-5)
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-3
            for lang in ("cuda", "triton", "numba"):
                if dname not in LN_DTYPES[lang]:
                    continue
                row = dict(lang=lang, dtype=dname, shape=list(shape))
                try:
                    f = kernels.get("layernorm", lang)
                    y = f(x, w, b)
                    if not torch.allclose(y.float(), ref, atol=tol, rtol=tol):
                        raise AssertionError(f"wrong result: max error {float((y.float() - ref).abs().max()):.3g}")
                    box = {}

                    def call(f=f, box=box):
                        box["y"] = f(x, w, b)
                    graph = graph_of(call)
                    graph.replay()
                    torch.cuda.synchronize()
                    row["graph_equals_eager"] = bool(torch.equal(box["y"], y))
                    row["eager_us"], row["eager_us_p20"], row["eager_us_p80"] = bench_us(lambda f=f: f(x, w, b))
                    row["graph_us"], row["graph_us_p20"], row["graph_us_p80"] = bench_us(graph.replay)
                    row["speedup"] = round(row["eager_us"] / row["graph_us"], 2)
                    row["loop_eager_us"] = loop_us(lambda f=f: f(x, w, b))
                    row["loop_graph_us"] = loop_us(graph.replay)
                    row["loop_speedup"] = round(row["loop_eager_us"] / row["loop_graph_us"], 2)
                    row["host_us"] = host_us(lambda f=f: f(x, w, b))
                    row["replay_host_us"] = host_us(graph.replay)
                    del graph, box
                except Exception as e:
                    row.update(error_of(e))
                rows.append(row)
                print("graphs", " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return dict(
        launcher="kernels.get('layernorm', lang)(x, w, b): the reference version of each language",
        method="eager_us: triton.testing.do_bench of the launcher as called (median, 20th/80th percentiles; "
               "do_bench clears the L2 before each call, which gives the host a head start); graph_us: the same "
               "of a replay of one call captured by launch_overhead.graph_of; speedup: eager_us / graph_us. "
               "loop_eager_us, loop_graph_us: wall time of 100 calls (or replays) back to back between two "
               "synchronisations, divided by 100, median of 5 (a loop's time per call); loop_speedup: their "
               "ratio. host_us, replay_host_us: wall time of 30 back-to-back calls (or replays) without the "
               "final synchronisation, divided by 30, median of 7 (the host's time to issue one)",
        rows=rows)


def try_capture(fn) -> tuple[object, dict]:
    """(the graph or None, a record: ``captured``, ``error``, ``warnings``, ``gpu_usable_after``;
    after a failed capture, ``randn_after``, and ``randn_after_a_good_capture`` when that
    broke). ``fn`` runs once first, on a side stream; the capture runs on a fresh stream, and
    the current stream is put back whatever happens (a capture that raised leaves its stream
    current)."""
    prev = torch.cuda.current_stream()
    graph, rec = torch.cuda.CUDAGraph(), dict(captured=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            side = torch.cuda.Stream()
            side.wait_stream(prev)
            with torch.cuda.stream(side):
                fn()
            prev.wait_stream(side)
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
                fn()
            torch.cuda.synchronize()
            rec["captured"] = True
        except Exception as e:
            graph = None
            rec.update(error_of(e))
        finally:
            torch.cuda.set_stream(prev)
    rec["warnings"] = [str(w.message).strip().splitlines()[0][:300] for w in caught if str(w.message).strip()]
    rec["gpu_usable_after"] = gpu_usable()
    if not rec["captured"]:
        rec["randn_after"] = randn_error() or "works"
        if rec["randn_after"] != "works":
            try:
                recapture()
                rec["randn_after_a_good_capture"] = randn_error() or "works"
            except Exception as e:
                rec["randn_after_a_good_capture"] = first_line(e)
    return graph, rec


def case_item() -> dict:
    x = torch.randn(1 << 20, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    y = torch.empty_like(x)

    def normalize():
        scale = x.abs().max().item()  # the host waits for the GPU to have this number
        torch.div(x, scale, out=y)
    return try_capture(normalize)[1]


def case_numba_streams() -> dict:
    """The same Numba kernel launched raw (Numba's default stream) and through numba_launch."""
    import numpy as np

    from numba import cuda

    @cuda.jit
    def scale(x, y, a):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = a * x[i]

    n = 1 << 20
    blocks = (n + 255) // 256
    gen = torch.Generator(device="cuda").manual_seed(0)  # not the default one, which captures use
    out = {}
    for case in ("numba_default_stream", "numba_launch"):
        try:
            x = torch.randn(n, device="cuda", generator=gen)
            y = torch.zeros_like(x)
            if case == "numba_default_stream":
                xa, ya = cuda.as_cuda_array(x), cuda.as_cuda_array(y)

                def launch(xa=xa, ya=ya):
                    scale[blocks, 256](xa, ya, np.float32(2.0))
            else:
                def launch(x=x, y=y):
                    utils.numba_launch(scale, blocks, 256, x, y, np.float32(2.0))
            launch()  # compiles (and, through numba_launch, looks up the compiled kernel)
            launch()
            torch.cuda.synchronize()
            graph, rec = try_capture(launch)
            if graph is not None:
                x.copy_(torch.randn(n, device="cuda", generator=gen))
                y.zero_()
                torch.cuda.synchronize()
                graph.replay()
                torch.cuda.synchronize()
                rec["replay_ran_kernel"] = bool(torch.equal(y, 2 * x))
            out[case] = rec
        except Exception as e:
            out[case] = dict(captured=None, **error_of(e), gpu_usable_after=gpu_usable())
    return out


def case_new_output() -> dict:
    """A launcher that allocates its output: the tensor kept from replay 1, after replay 2."""
    import torch.nn.functional as F

    import kernels
    from utils.topics.layernorm import layernorm_input
    f = kernels.get("layernorm", "triton")
    x, w, b = layernorm_input((64, 1024), seed=0, device="cuda")
    first, second = x.clone(), layernorm_input((64, 1024), seed=1, device="cuda")[0]
    box = {}

    def call():
        box["y"] = f(x, w, b)  # a new y each call: torch.empty_like inside the launcher
    graph = graph_of(call)
    x.copy_(first)
    graph.replay()
    torch.cuda.synchronize()
    kept = box["y"]            # "the result of replay 1", kept by reference
    snapshot = kept.clone()    # what keeping it safely takes: a copy
    x.copy_(second)
    graph.replay()
    torch.cuda.synchronize()

    def matches(t, inp):
        return bool(torch.allclose(t, F.layer_norm(inp, (1024,), w, b, 1e-5), atol=1e-3, rtol=1e-3))
    holds = "second" if matches(kept, second) else "first" if matches(kept, first) else "neither"
    return dict(captured=True, launcher="kernels.get('layernorm', 'triton')", shape=[64, 1024],
                kept_changed=not bool(torch.equal(kept, snapshot)), kept_holds=holds,
                clone_holds_first=matches(snapshot, first), gpu_usable_after=gpu_usable())


def case_changing_shape() -> dict:
    """Captured at one shape; the function's input then changes shape; the graph is replayed."""
    import torch.nn.functional as F

    import kernels
    from utils.topics.layernorm import layernorm_input
    f = kernels.get("layernorm", "triton")
    old, w, b = layernorm_input((64, 1024), seed=0, device="cuda")
    new = layernorm_input((128, 1024), seed=1, device="cuda")[0]
    inp, box = {"x": old}, {}

    def call():
        box["y"] = f(inp["x"], w, b)
    graph = graph_of(call)
    inp["x"] = new                 # what the Python function would read now
    eager = f(inp["x"], w, b)      # called from Python: 128 rows
    graph.replay()                 # replayed: the kernels as captured, on the old tensor's memory
    torch.cuda.synchronize()
    got = box["y"]

    def matches(t, inp):
        return t.shape == inp.shape and bool(torch.allclose(t, F.layer_norm(inp, (1024,), w, b, 1e-5),
                                                            atol=1e-3, rtol=1e-3))
    return dict(captured=True, launcher="kernels.get('layernorm', 'triton')", captured_shape=list(old.shape),
                new_input_shape=list(new.shape), eager_output_shape=list(eager.shape),
                replay_output_shape=list(got.shape), replay_matches_old_input=matches(got, old),
                replay_matches_new_input=matches(got, new), gpu_usable_after=gpu_usable())


def measure_capture() -> dict:
    """Part 3: each case on its own; one that raises is recorded as its error."""
    out = {}
    for name, run in (("item", case_item), ("numba", case_numba_streams),
                      ("new_output_each_call", case_new_output), ("changing_shape", case_changing_shape)):
        try:
            got = run()
            if name == "numba":
                out.update(got)
            else:
                out[name] = got
        except Exception as e:
            torch.cuda.set_stream(torch.cuda.default_stream())
            rec = dict(captured=None, **error_of(e), gpu_usable_after=gpu_usable())
            if name == "numba":
                out.update(numba_default_stream=rec, numba_launch=dict(rec))
            else:
                out[name] = rec
        for case in (("numba_default_stream", "numba_launch") if name == "numba" else (name,)):
            print(f"capture {case}: {capture_outcome(case, out[case])}", flush=True)
        if randn_error():  # a capture failed where none was meant to: the next case starts clean
            try:
                recapture()
            except Exception as e:
                print(f"after {name}: {first_line(e)}", flush=True)
    return out


def machine() -> dict:
    import importlib.metadata

    import triton

    def version(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None
    return dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda,
                triton=triton.__version__, numba_cuda=version("numba-cuda"), python=platform.python_version(),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **utils.source_commit())


def print_summary(data: dict) -> None:
    s = summarize(data)
    print("\n== streams and events")
    print(format_rows(s["streams"]))
    if s["overlap_fraction"] is not None:
        print(f"overlap fraction {s['overlap_fraction']:.2f}, copy {s['copy_gbps']} GB/s")
    trace = data.get("trace") or {}
    for p in trace.get("phases", []):
        t = timeline(p["intervals"])
        print(f"  {p['name']}: {t['span_us'] / 1e3:.3f} ms on the GPU, "
              f"{t['concurrent_us'] / 1e3:.3f} ms of it with two streams busy")
    print("\n== CUDA graphs of the LayerNorm launchers (us per call)")
    print(format_rows(s["graphs"]))
    print("\n== what breaks capture")
    for r in s["capture"]:
        print(f"{r.get('case', '?')}: {r.get('outcome', r.get('error'))}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(utils.LESSON_RESULTS_DIR))
    args = p.parse_args(argv)
    if utils.SIMULATE:
        print(f"This measures CUDA streams and graphs on a GPU; this machine runs in simulation ({utils.REASON}): "
              f"nothing was measured. The recorded numbers are in benchmarks/results/lessons/"
              f"{RESULT.format(gpu='<gpu>')} (summarize(), plot_streams() in this script read them).")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = utils.gpu_slug(torch.cuda.get_device_name(0))
    t0 = time.time()
    data = machine()
    data.update(result=RESULT.format(gpu=gpu), streams=None, trace=None, graphs=None, capture=None)

    def streams():
        data["streams"], data["trace"] = measure_streams(out / TRACE.format(gpu=gpu))

    def graphs():
        data["graphs"] = measure_graphs()

    def capture():
        data["capture"] = measure_capture()
    for part, run in (("streams", streams), ("graphs", graphs), ("capture", capture)):
        try:
            run()
        except Exception as e:
            data[part] = error_of(e)
            if part == "streams":
                data["trace"] = dict(error="not traced: the streams part failed")
        try:  # the next part starts on the default stream, with the memory of this one given back
            torch.cuda.set_stream(torch.cuda.default_stream())
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception as e:
            print(f"after {part}: {first_line(e)}", flush=True)
    data["seconds"] = round(time.time() - t0, 1)
    path = out / RESULT.format(gpu=gpu)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print_summary(data)
    failed = [k for k in ("streams", "trace", "graphs", "capture") if "error" in (data.get(k) or {})]
    failed += [f"graphs {r['lang']} {r['dtype']} {r['shape']}" for r in (data.get("graphs") or {}).get("rows", [])
               if "error" in r]
    failed += [f"capture {case}" for case, r in (data.get("capture") or {}).items()
               if isinstance(r, dict) and r.get("captured") is None]
    print(f"\nwrote {path} in {data['seconds']} s" + (f"; errors in: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
