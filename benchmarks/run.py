"""The benchmark run: the copy roofline, then each topic in a worker process, then the
results file, the summary and the plots. See ``benchmarks/__init__.py`` for the command."""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import utils
from utils import sources

from . import report, validation
from .harness import CUSTOM_WORKERS, Events, read_events, worker_main
from .topics import TOPICS, copy_bytes, main_shapes

ALL_TOPICS = tuple(TOPICS)  # the topics with a spec that has baselines, in lesson order
EXIT_OK, EXIT_ERROR, EXIT_NO_GPU = 0, 1, 2
# Seconds kept back, per topic still to run, when deciding whether a size sweep may go on.
RESERVE_PER_TOPIC = 60.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Check, then time, every kernel of the course on an NVIDIA GPU next to "
                    "PyTorch, torch.compile and the copy roofline; write the results file, a "
                    "markdown summary and plots. Exit codes: 0 done (with --stale: whether or not "
                    "topics are stale or a GPU validation call is due), 1 error, 2 no GPU here "
                    "(nothing measured).")
    p.add_argument("--topics", default=",".join(ALL_TOPICS),
                   help=f"comma-separated, from {', '.join(ALL_TOPICS)} (default: all)")
    p.add_argument("--langs", default="cuda,numba,triton",
                   help="languages of the course's kernels to measure (default: all)")
    p.add_argument("--quick", action="store_true",
                   help="smaller sizes, a short sweep and shorter timings: a smoke test; "
                        "writes <name>-quick.* so the full results stay as they are")
    p.add_argument("--no-sweep", action="store_true", help="skip the size sweeps (and the plots)")
    p.add_argument("--sweep-only", action="store_true",
                   help="measure only the size sweeps of --topics; with --update their other rows stay, so a "
                        "topic too long for one sitting can be measured in two (--no-sweep, then this). "
                        f"Topics with their own worker only: {', '.join(CUSTOM_WORKERS)}")
    p.add_argument("--out", default=str(utils.RECORDS_DIR),
                   help="where to write the results (default: benchmarks/results/records)")
    p.add_argument("--name", default=None,
                   help="file name stem of the results (default: from the GPU, h100 on an H100, h200 on "
                        "an H200); with --stale alone: check that record only")
    p.add_argument("--budget", type=float, default=0.0,
                   help="seconds for the whole run; sweeps are cut short to fit (default: no limit)")
    p.add_argument("--worker-timeout", type=float, default=900.0,
                   help="seconds before a worker that hangs is stopped (default: 900)")
    p.add_argument("--update", action="store_true",
                   help="re-measure only --topics and replace them in the existing results file, "
                        "keeping the other topics and its copy roofline (the new run's copy figure "
                        "goes into the notes)")
    p.add_argument("--stale", action="store_true",
                   help="alone: list the topics whose sources (kernels, launchers, spec: "
                        "utils/sources.py) changed since their most recent record (of any GPU) "
                        "measured them, and whether code changed since the last GPU validation call "
                        "(<gpu>-validation.txt), on any machine; with --update: re-measure those topics "
                        "into this GPU's record")
    p.add_argument("--validation-dir", default=str(utils.VALIDATION_DIR),
                   help="with --stale: where the GPU validation summaries, <gpu>-validation.txt, are "
                        "(default: benchmarks/results/validation)")
    p.add_argument("--simulated-dry-run", action="store_true",
                   help="without a GPU: run the whole pipeline on the simulation sizes, to test "
                        "the harness itself; needs --out (its timings time the simulators)")
    # Internal: one topic in a worker process.
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--events", default=None, help=argparse.SUPPRESS)
    p.add_argument("--skip-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--sweep-deadline", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    unknown = [t for t in args.topics if t not in TOPICS]
    if unknown:
        p.error(f"unknown topic(s) {unknown}: choose from {', '.join(ALL_TOPICS)}")
    if args.sweep_only and not args.worker and (args.no_sweep or any(t not in CUSTOM_WORKERS for t in args.topics)):
        p.error(f"--sweep-only takes --topics among {', '.join(CUSTOM_WORKERS)}, and no --no-sweep")
    if args.simulated_dry_run and args.out == str(utils.RECORDS_DIR):
        p.error("--simulated-dry-run needs --out DIR: its numbers must not land among the recorded results")
    given = argv if argv is not None else sys.argv[1:]
    args.topics_given = any(a == "--topics" or a.startswith("--topics=") for a in given)
    if args.stale and args.topics_given:
        p.error("--stale picks the topics itself: leave out --topics")
    args.langs = [s.strip() for s in args.langs.split(",") if s.strip()]
    bad = [s for s in args.langs if s not in ("cuda", "numba", "triton")]
    if bad:
        p.error(f"unknown language(s) {bad}: choose from cuda, numba, triton")
    return args


def sizes_for(quick: bool) -> SimpleNamespace:
    """GPU sizes from utils.PROBLEM_SIZES; --quick keeps the softmax shapes, shrinks the rest."""
    s = dict(utils.PROBLEM_SIZES[utils.MODE])
    if quick and not utils.SIMULATE:
        s["bench_n"] = 1 << 24
        s["bench_sizes"] = [1 << 16, 1 << 20, 1 << 24]
    return SimpleNamespace(**s)


def timing_params(quick: bool) -> dict:
    if utils.SIMULATE:
        return dict(warmup=1, rep=1)
    return dict(warmup=10, rep=40) if quick else dict(warmup=25, rep=100)


def records_line(results: Path) -> str:
    """Where the recorded results are: each GPU's record found, newest first, one line each."""
    rel = results.relative_to(utils.ROOT) if results.is_relative_to(utils.ROOT) else results
    found = utils.recorded_gpus(results)
    if not found:
        return f"No GPU's results are recorded in {rel}/ yet."
    lines = [f"The recorded results are in {rel}/, one record per GPU, newest first (a notebook shows each "
             "topic from its most recent record):"]
    for r in found:
        stem = r["path"].stem
        plots = f", {stem}-*.png (plots)" if any(results.glob(f"{stem}-*.png")) else ""
        lines.append(f"  {r['path'].name} (every number), {stem}.md (summary and targets){plots}: "
                     f"{r['gpu_name']}, {r['date'][:10]}; {', '.join(t for t in r['topics'] if t != 'copy')}")
    return "\n".join(lines)


def refuse_without_gpu() -> int:
    print(f"python -m benchmarks times kernels on an NVIDIA GPU, and this machine runs in "
          f"simulation ({utils.REASON}).\n"
          "Timing the simulators on a CPU would say nothing about a GPU, so nothing was measured.\n"
          f"{records_line(utils.RECORDS_DIR)}\n"
          'In a notebook: utils.show_recorded("relu"), utils.recorded_sweep("softmax").')
    return EXIT_NO_GPU


# --------------------------------------------------------------------------------------
# Machine and software
# --------------------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def gpu_slug(gpu_name: str) -> str:
    """The stem of a GPU's results (``h200`` on an "NVIDIA H200"): ``utils.gpu_slug``, the one
    rule that ``.ci/gpu-validate.sh`` uses as well."""
    return utils.gpu_slug(gpu_name)


def machine_info(name: str) -> dict:
    import torch

    import triton

    if utils.SIMULATE:
        return dict(name=name, gpu=f"none: simulated on the CPU ({platform.processor() or 'cpu'})",
                    torch=torch.__version__, triton=triton.__version__, numba=_version("numba"),
                    numba_cuda=_version("numba-cuda"), python=platform.python_version())
    props = torch.cuda.get_device_properties(0)
    return dict(
        name=name, gpu=props.name, sm_count=props.multi_processor_count,
        compute_capability=f"{props.major}.{props.minor}",
        memory_gib=round(props.total_memory / 2**30, 1), driver=_driver(), cuda=torch.version.cuda,
        torch=torch.__version__, triton=triton.__version__, numba=_version("numba"),
        numba_cuda=_version("numba-cuda") or _version("numba_cuda"), cuda_core=_version("cuda-core"),
        python=platform.python_version(),
    )


# --------------------------------------------------------------------------------------
# The copy roofline
# --------------------------------------------------------------------------------------
def measure_copy(n: int, sweep_ns, timing: dict, sweep: bool) -> tuple[dict, list]:
    import torch

    x = torch.randn(n, device=utils.DEVICE)
    y = torch.empty_like(x)
    y.copy_(x)
    if not torch.equal(x, y):
        raise RuntimeError("the device-to-device copy gave a wrong result: is the GPU healthy?")
    res = utils.bench(y.copy_, x, nbytes=copy_bytes(n), name="copy", **timing)
    row = dict(topic="copy", variant="copy", lang="torch", version="copy_", reference=False,
               description="y.copy_(x): device-to-device copy", shape=[n], bytes=copy_bytes(n),
               median_ms=res.median_ms, p20_ms=res.p20_ms, p80_ms=res.p80_ms, gbps=res.gbps)
    print(f"[copy] {report.shape_str([n])} floats: median {res.median_ms:.4f} ms, {res.gbps:,.0f} GB/s "
          "(the roofline every kernel is compared with)", flush=True)
    del x, y
    points = []
    if sweep:
        for m in sweep_ns:
            x = torch.randn(m, device=utils.DEVICE)
            y = torch.empty_like(x)
            r = utils.bench(y.copy_, x, nbytes=copy_bytes(m), name="copy", **timing)
            points.append([m, r.gbps])
            del x, y
    if not utils.SIMULATE:
        torch.cuda.empty_cache()
    return row, points


# --------------------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------------------
def _variant_of(key: str) -> str:
    return key.split("@", 1)[0]


def skip_set(events: list[dict]) -> tuple[set, list[str]]:
    """What a fresh worker must not redo, and the keys that were started but never finished."""
    skip, opened, closed = set(), [], set()
    for e in events:
        key = e.get("key")
        if not key:
            continue
        kind = e["event"]
        if kind == "start":
            opened.append(key)
        elif kind in ("row", "point", "paired"):
            skip.add(key)
            closed.add(key)
        elif kind == "failed":
            # A refused shape skips that shape only; anything else skips the variant.
            skip.add(key if e.get("status") == "unsupported" else f"{_variant_of(key)}@*")
            closed.add(key)
        elif kind == "note":  # a sweep point that failed: that variant leaves the sweep
            skip.add(_variant_of(key))
            closed.add(key)
    open_keys = [k for k in dict.fromkeys(opened) if k not in closed]
    return skip, open_keys


def run_worker(topic: str, args, events_path: Path, deadline: float | None,
               sweep_deadline: float | None) -> None:
    """Run a topic in worker processes until it is done, restarting after a crash."""
    ev = Events(events_path)
    last_progress = -1
    for attempt in range(6):
        events = read_events(events_path)
        skip, open_keys = skip_set(events)
        for key in open_keys:  # started by a worker that died: that kernel crashed it
            _record_crash(ev, topic, key, "crashed", "the worker process died while running it "
                          "(see the log)")
            skip.add(f"{_variant_of(key)}@*" if not key.startswith("sweep:") else _variant_of(key))
        if len(skip) == last_progress:
            print(f"[{topic}] no progress after a restart: giving up on this topic", flush=True)
            ev.emit(event="note", topic=topic, text="the worker kept failing; see the log")
            return
        last_progress = len(skip)
        skip_file = events_path.with_suffix(".skip.json")
        skip_file.write_text(json.dumps(sorted(skip)))
        cmd = [sys.executable, "-m", "benchmarks", "--worker", topic, "--events", str(events_path),
               "--skip-file", str(skip_file), "--langs", ",".join(args.langs)]
        if args.quick:
            cmd.append("--quick")
        if args.simulated_dry_run:
            cmd += ["--simulated-dry-run", "--out", args.out]
        if args.no_sweep:
            cmd.append("--no-sweep")
        if args.sweep_only:
            cmd.append("--sweep-only")
        if deadline:
            cmd += ["--deadline", str(deadline)]
        if sweep_deadline:
            cmd += ["--sweep-deadline", str(sweep_deadline)]
        timeout = args.worker_timeout
        if deadline:
            timeout = max(10.0, min(timeout, deadline - time.time() + 30))
        proc = subprocess.Popen(cmd, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            events = read_events(events_path)
            _, open_keys = skip_set(events)
            for key in open_keys:
                _record_crash(ev, topic, key, "timed out",
                              f"still running after the worker's {timeout:.0f} s: stopped")
            print(f"[{topic}] worker stopped after {timeout:.0f} s", flush=True)
            return
        if rc == 0:
            return
        print(f"[{topic}] worker exited with code {rc}; starting a fresh one", flush=True)


def _record_crash(ev: Events, topic: str, key: str, status: str, reason: str) -> None:
    if key.startswith("sweep:"):
        ev.emit(event="note", key=key, topic=topic,
                text=f"{key[6:]}: {status} in the size sweep ({reason})")
        return
    variant, shape = key.split("@", 1)
    lang, _, version = variant.partition(" ")
    ev.emit(event="failed", key=key, topic=topic, variant=variant, lang=lang, version=version,
            shape=[int(s) for s in shape.split("x")] if shape != "*" else None,
            status=status, reason=reason)


def _kill(proc: subprocess.Popen) -> None:
    """Stop a worker and its children (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def merge(events: list[dict]) -> tuple[list, list, dict, list]:
    """rows, failed, sweep {variant: [[n, gbps]]}, notes from a topic's events (last wins)."""
    rows, failed, points, notes, paired = {}, {}, {}, [], {}
    for e in events:
        kind = e["event"]
        if kind == "row":
            failed.pop(e["key"], None)
            rows[e["key"]] = {k: v for k, v in e.items() if k not in ("event", "key", "simulated")}
        elif kind == "failed":
            rows.pop(e["key"], None)
            failed[e["key"]] = {k: v for k, v in e.items() if k not in ("event", "key")}
        elif kind == "point" and e.get("gbps") is not None:
            points.setdefault(e["variant"], {})[int(e["n"])] = float(e["gbps"])
        elif kind == "note" and e.get("text") and e["text"] not in notes:
            notes.append(e["text"])
        elif kind == "paired":
            paired[e["key"].removeprefix("paired:")] = e
    for key, e in paired.items():  # a target's kernel and baseline timed in alternation
        if key in rows:
            rows[key]["paired"] = dict(baseline=e["baseline"], baseline_version=e["baseline_version"],
                                       ratios=e["ratios"])
    sweep = {v: [[n, g] for n, g in sorted(p.items())] for v, p in points.items()}
    return list(rows.values()), list(failed.values()), sweep, notes


# --------------------------------------------------------------------------------------
# The whole run
# --------------------------------------------------------------------------------------
def stale_report(path: Path, topics) -> dict[str, str]:
    """``{topic: why}``: the topics of the results file ``path`` whose recorded numbers are
    stale (see ``utils/sources.py``); every topic when there is no results file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {t: "no results file" for t in topics}
    return sources.stale_topics(data, topics)


def newest_records(results: Path, topics) -> dict[str, Path | None]:
    """``{topic: the most recent record (of any GPU) that has it, or None}``: the rule of
    ``utils.recorded_file``."""
    return {t: utils.recorded_file(t, directory=results) for t in topics}


def stale_across_gpus(results: Path, topics, name: str | None = None) -> tuple[dict[str, str], dict]:
    """``({topic: why}, {topic: record})``: each topic checked against its most recent record,
    or against the record ``<name>.json`` alone when a name is given."""
    if name:
        path = results / f"{name}.json"
        return stale_report(path, topics), {t: path for t in topics}
    records = newest_records(results, topics)
    stale, cache = {}, {}
    for t, path in records.items():
        if path is None:
            stale[t] = "never recorded"
            continue
        if path not in cache:
            cache[path] = json.loads(path.read_text())
        stale.update(sources.stale_topics(cache[path], [t]))
    return stale, records


def print_stale(results: Path, stale: dict[str, str], records: dict) -> None:
    """Which record each topic was checked against, then each stale topic with why."""
    by_file: dict[str, list[str]] = {}
    for t, path in records.items():
        if path is not None:
            by_file.setdefault(path.name, []).append(t)
    if by_file:
        gpus = {r["path"].name: r["gpu_name"] for r in utils.recorded_gpus(results)}
        print("Each topic against its most recent record: " + "; ".join(
            f"{f} ({gpus.get(f) or 'not a GPU record'}) for {', '.join(ts)}" for f, ts in by_file.items()) + ".")
    if not stale:
        print("Every topic was recorded from the sources here.")
    for t, why in stale.items():
        where = f" [{records[t].name}]" if records.get(t) is not None and why != "never recorded" else ""
        print(f"{t}: {why}{where}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.stale and not args.worker:
        # Stale topics and a due validation call are reported, not errors: the exit code stays 0.
        results = Path(args.out)
        stale, records = stale_across_gpus(results, args.topics, args.name)
        print_stale(results, stale, records)
        print()
        print(textwrap.fill(validation.validation_report(Path(args.validation_dir))[0], width=100,
                            break_on_hyphens=False))
        if not args.update:
            return EXIT_OK
        if not stale:
            print("--update --stale: every topic is up to date in its most recent record; nothing to measure.")
            return EXIT_OK
        args.topics = [t for t in args.topics if t in stale]
        print(f"--update --stale: re-measuring {', '.join(args.topics)}", flush=True)
    if utils.SIMULATE and not args.simulated_dry_run:
        return refuse_without_gpu()
    sizes = sizes_for(args.quick)
    timing = timing_params(args.quick)
    if args.worker:
        skip = json.loads(Path(args.skip_file).read_text()) if args.skip_file else []
        return worker_main(args.worker, args.events, sizes, skip=skip, languages=args.langs,
                           sweep=not args.no_sweep, main=not args.sweep_only, deadline=args.deadline,
                           sweep_deadline=args.sweep_deadline, **timing)

    import torch

    start = time.time()
    deadline = start + args.budget if args.budget else None
    if utils.SIMULATE:
        name = args.name or "simulated"
    else:
        name = args.name or gpu_slug(torch.cuda.get_device_name(0)) + ("-quick" if args.quick else "")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = utils.source_commit()  # the code measured; --update keeps each topic's own
    run_date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = dict(
        schema=1,
        machine=machine_info(name),
        date=run_date,
        **commit,
        command=" ".join(["python -m benchmarks"] + list(sys.argv[1:] if argv is None else argv)),
        timing=(f"triton.testing.do_bench (CUDA events, L2 flushed before each call), "
                f"warmup {timing['warmup']} ms, rep {timing['rep']} ms; median and 20th/80th "
                "percentiles; GB/s = (bytes read + bytes written) / median, 1 GB = 1e9 bytes")
        if not utils.SIMULATE else "time.perf_counter over a few calls of the simulators (dry run)",
        sizes=dict(n=sizes.bench_n, softmax_shapes=[list(s) for s in sizes.softmax_bench_shapes],
                   sweep=list(sizes.bench_sizes), softmax_sweep_cols=4096),
        copy=None, rows=[], failed=[], sweeps={}, targets=[], notes=[],
        # per topic: the commit and the date it was measured at (the most recent record of a
        # topic is decided by this date; utils.recorded_file)
        topic_commits={t: dict(commit, date=run_date) for t in args.topics},
        # the hash of each measured topic's sources, so a later checkout can tell stale numbers
        topic_sources={t: sources.topic_hash(t) for t in args.topics},
    )
    if utils.SIMULATE:
        data["simulated"] = True
    m = data["machine"]
    print(f"Benchmarking on {m['gpu']} (torch {m['torch']}, triton {m['triton']}, "
          f"numba-cuda {m['numba_cuda']}, CUDA {m.get('cuda')}, driver {m.get('driver')}), "
          f"{utils.commit_str(commit)}", flush=True)

    try:
        copy_row, copy_points = measure_copy(sizes.bench_n, sizes.bench_sizes, timing,
                                             sweep=not (args.no_sweep or args.update))
    except Exception as e:
        print(f"The copy roofline could not be measured: {type(e).__name__}: {e}", flush=True)
        data["notes"].append(f"copy roofline not measured: {e}")
        copy_row, copy_points = None, []
    data["copy"] = copy_row
    if copy_row:
        data["rows"].append(copy_row)
    if copy_points:
        data["sweeps"]["copy"] = {"copy": copy_points}
    roof = copy_row["gbps"] if copy_row else None

    target_topics = args.topics  # the topics whose targets the results file reports
    old_record = None  # --update: the record as it was, for the topics this run cannot finish
    remeasured_note = None
    if args.update:
        kept = load_kept(out / f"{name}.json", args.topics, args.langs, sweeps_only=args.sweep_only,
                         keep_sweeps=args.no_sweep)
        if kept is not None:
            old_record = json.loads((out / f"{name}.json").read_text())
        if kept is None:
            print(f"--update: no {out / (name + '.json')} to update; writing a new results file", flush=True)
        else:
            measured_copy = copy_row["gbps"] if copy_row else None
            data["notes"] = kept["notes"]
            remeasured_note = (f" re-measured on {data['date']} at {utils.commit_str(commit)} with "
                               f"`{data['command']}`"
                               + (f" (copy in that run: {measured_copy:,.0f} GB/s)" if measured_copy else ""))
            data["copy"], data["date"], data["command"] = kept["copy"], kept["date"], kept["command"]
            # The file's own commit is the full run's; each topic keeps the commit it was measured at.
            data["commit"], data["commit_dirty"] = kept["commit"], kept["commit_dirty"]
            data["topic_commits"] = {**kept["topic_commits"], **data["topic_commits"]}
            data["topic_sources"] = {**kept["topic_sources"], **data["topic_sources"]}
            data["rows"] = kept["rows"]
            data["failed"] = kept["failed"]
            data["sweeps"] = kept["sweeps"]
            roof = kept["copy"]["gbps"] if kept["copy"] else roof
            target_topics = kept["topics"]

    finished, unfinished = [], []  # --update: the topics measured whole, and those cut short

    def save():
        notes = data["notes"]
        if remeasured_note and (finished or unfinished):
            notes = notes + [", ".join(finished or ["nothing"]) + remeasured_note
                             + (f"; {', '.join(unfinished)}: cut short by the time budget, earlier numbers kept "
                                "where this run has none, still stale" if unfinished else "")]
        data_out = dict(data, notes=notes)
        report.add_fractions(data["rows"], roof)
        data["targets"] = report.evaluate_targets(
            data["rows"], target_topics, {t: main_shapes(t, sizes) for t in target_topics})
        data_out["targets"] = data["targets"]
        report.write_json(out / f"{name}.json", data_out)
        (out / f"{name}.md").write_text(report.markdown(data_out))

    save()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for i, topic in enumerate(args.topics):
            left = len(args.topics) - i - 1
            sweep_deadline = (deadline - RESERVE_PER_TOPIC * left - 20) if deadline else None
            print(f"== {topic} ==", flush=True)
            if deadline and time.time() > deadline:
                print(f"[{topic}] not measured: out of time (--budget {args.budget:.0f} s)", flush=True)
                keep_unmeasured(data, old_record, topic, rows=[])
                if old_record is None:
                    data["notes"].append(f"{topic}: not measured, the run was out of time")
                else:
                    unfinished.append(topic)
                continue
            events_path = Path(tmp) / f"{topic}.jsonl"
            run_worker(topic, args, events_path, deadline, sweep_deadline)
            rows, failed, sweep, notes = merge(read_events(events_path))
            cut = [f for f in failed if "out of time" in str(f.get("reason", ""))]
            data["rows"] += rows
            data["failed"] += [f for f in failed if f not in cut] if old_record is not None else failed
            if sweep:
                data["sweeps"].setdefault(topic, {}).update(sweep)
            data["notes"] += [f"{topic}: {n}" for n in notes]
            if cut:
                keep_unmeasured(data, old_record, topic, rows=rows)
                unfinished.append(topic)
            else:
                finished.append(topic)
            save()
    if not args.no_sweep:
        try:
            for p in report.plot_sweeps(data, out, name):
                print(f"plot: {p}", flush=True)
        except Exception as e:
            print(f"plots failed: {type(e).__name__}: {e}", flush=True)
            data["notes"].append(f"plots not written: {e}")
    data["wall_s"] = round(time.time() - start, 1)
    save()
    print_summary(data)
    print(f"\nwrote {out / (name + '.json')}, {out / (name + '.md')} in {data['wall_s']:.0f} s", flush=True)
    return EXIT_OK


def _row_key(r: dict) -> tuple:
    return (r.get("topic"), r.get("variant"), json.dumps(r.get("shape")), bool(r.get("sweep")))


def keep_unmeasured(data: dict, old: dict | None, topic: str, rows: list[dict]) -> None:
    """A topic this run did not finish (``rows``: what it measured of it, none if it was not
    started): it is not fresh, so it keeps the commit and source hash of its earlier record
    (``python -m benchmarks --stale`` still lists it) and, from an ``--update``'s earlier record
    (``old``), the rows, failures and sweeps this run has none of, rather than losing them."""
    for key in ("topic_commits", "topic_sources"):
        earlier = ((old or {}).get(key) or {}).get(topic)
        if earlier is None:
            data[key].pop(topic, None)
        else:
            data[key][topic] = earlier
    if old is None:
        return
    have = {_row_key(r) for r in rows}
    data["rows"] += [r for r in old.get("rows", []) if r.get("topic") == topic and _row_key(r) not in have]
    done = {(f.get("variant"), json.dumps(f.get("shape"))) for f in data["failed"] if f.get("topic") == topic}
    measured = {_row_key(r)[:3] for r in rows}
    data["failed"] += [f for f in old.get("failed", []) if f.get("topic") == topic
                       and (f.get("variant"), json.dumps(f.get("shape"))) not in done
                       and (topic, f.get("variant"), json.dumps(f.get("shape"))) not in measured]
    for variant, points in ((old.get("sweeps") or {}).get(topic) or {}).items():
        data["sweeps"].setdefault(topic, {}).setdefault(variant, points)
    data["notes"] += [n for n in old.get("notes", []) if n.startswith(f"{topic}:") and n not in data["notes"]]


def load_kept(path: Path, topics: list[str], langs=("cuda", "numba", "triton"), sweeps_only=False,
              keep_sweeps=False) -> dict | None:
    """What ``--update`` keeps of an existing results file: all but the rows of ``topics`` in
    ``langs`` (and their PyTorch baselines, which every run measures again); with
    ``sweeps_only``, all but their sweeps (the main shapes' rows and targets stay); with
    ``keep_sweeps`` (a run that measures no sweep, ``--no-sweep``), their sweeps as well."""
    if not path.exists():
        return None
    old = json.loads(path.read_text())
    if old.get("simulated"):
        return None
    drop = set(topics)
    redo = set(langs) | {"torch"}

    def stays(topic, lang, entry=None):
        if sweeps_only and entry is not None and not entry.get("sweep"):
            return True
        if keep_sweeps and (entry is None or entry.get("sweep")):  # a sweep (entry None: the sweeps table)
            return True
        return topic not in drop or lang not in redo

    def lang_of(variant):
        return "torch" if variant.startswith("torch") else variant.split(" ")[0]

    measured = [t for t in ALL_TOPICS if t in drop or any(r.get("topic") == t for r in old.get("rows", []))]
    return dict(
        copy=old.get("copy"), date=old.get("date"), command=old.get("command"), topics=measured,
        commit=old.get("commit"), commit_dirty=old.get("commit_dirty"),
        topic_commits={t: c for t, c in old.get("topic_commits", {}).items() if t not in drop},
        topic_sources={t: c for t, c in (old.get("topic_sources") or {}).items() if t not in drop},
        rows=[r for r in old.get("rows", []) if stays(r.get("topic"), r.get("lang"), r)],
        failed=[f for f in old.get("failed", []) if stays(f.get("topic"), f.get("lang"), f)],
        sweeps={t: {v: p for v, p in vs.items() if stays(t, lang_of(v))} for t, vs in old.get("sweeps", {}).items()},
        notes=[n for n in old.get("notes", []) if not any(n.startswith(f"{t}:") for t in drop)],
    )


def print_summary(data: dict) -> None:
    print("\n== targets ==")
    for t in data.get("targets", []):
        mark = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        print(f"{t['topic']:<10} {t['variant']:<18} {report.shape_str(t['shape']):>12}  "
              f"{t['goal']:<18} {report._value_str(t):<24} {mark}")
    if data.get("failed"):
        print("\n== not timed ==")
        for f in data["failed"]:
            print(f"{f['topic']:<10} {f['variant']:<18} {f['status']}: {f.get('reason', '')}")
