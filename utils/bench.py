"""Timing kernels, and reading the GPU numbers recorded for the course.

Live timings
------------
``bench(fn, *args, nbytes=...)`` times ``fn(*args)`` and returns a :class:`BenchResult`:

* on a GPU with ``triton.testing.do_bench``: CUDA events around each call, the L2 cache
  flushed before each one, many calls; the median and the 20th/80th percentiles in ms, and
  GB/s = ``nbytes`` / median. ``nbytes`` is what the kernel must move: bytes read plus
  bytes written (ReLU of n floats: ``2 * 4 * n``).
* in simulation with ``time.perf_counter`` over a few calls. That measures the simulator
  on the CPU, which says nothing about a GPU: the result is marked ``simulated=True`` and
  prints as "simulated on the CPU: not a GPU timing".

Recorded results
----------------
``python -m benchmarks`` measures every kernel of the course on a GPU and writes that GPU's
record, ``benchmarks/results/records/<gpu>.json`` (``RECORDS_DIR``): ``h100.json`` on an H100,
``h200.json`` on an H200 (``gpu_slug`` names it). Each GPU keeps its own record. Notebooks
never hard-code a GPU number: they read the records through ``recorded``, ``recorded_sweep``,
``copy_roofline``, ``recorded_machine``, ``recorded_gpu``, ``recorded_targets`` and
``show_recorded``, which work on any machine. A GPU's other recordings (a profiler trace, a
probe, Nsight Compute's counters) sit in the other kinds of ``benchmarks/results/``,
``lessons/`` (``LESSON_RESULTS_DIR``), ``simulators/`` and ``tune/``, named ``<gpu>-...`` or
``...-<gpu>...``; ``recorded_gpu_file`` finds the newest GPU's one.

Which record a topic's numbers come from: called without ``path``, every function reads, for
the topic it is asked about, the most recent record that has that topic. A record is a
``*.json`` of ``benchmarks/results/records/`` with a top-level ``"schema"`` and ``"rows"`` (not a
``-quick`` smoke test, not a simulated dry run); ``recorded_gpus()`` lists them. "Most recent"
is the date that topic was measured in each record: ``topic_commits[topic]["date"]``, else
the date of the ``--update`` run that re-measured it (its line in ``notes``), else the
record's ``date``; the label of a table or plot names that record's GPU, date and commit.
Without a topic, a function reads the record measured most recently. A ``path`` given
means that file, whatever it holds.

Every recorded file names the git commit it was measured at (``source_commit`` writes it,
``recorded_commit`` and ``recorded_label`` read it), so a number can be traced to the code
that produced it. A file recorded before that was added shows the commit as unknown.

Schema of a record, ``<gpu>.json`` (``"schema": 1``)::

    {
      "schema": 1,
      "machine": {"name": "h100", "gpu": "NVIDIA H100 80GB HBM3", "sm_count": 132,
                  "compute_capability": "9.0", "memory_gib": 79.1, "driver": "...",
                  "cuda": "13.0", "torch": "2.11.0", "triton": "3.6.0", "numba": "...",
                  "numba_cuda": "0.30.x", "python": "3.12.x"},
      "date": "2026-01-31T12:00:00Z",          # UTC, when the run started
      "commit": "0123abcd...",                 # the git commit measured (40 hex), or null
      "commit_dirty": false,                   # uncommitted changes to the code measured;
                                               # null when unknown (see source_commit)
      "topic_commits": {"softmax": {"commit": ..., "commit_dirty": ..., "date": ...}, ...},
                                               # per topic: --update re-measures some topics;
                                               # "date" (when that topic was measured) is
                                               # missing from records written before it
      "command": "python -m benchmarks ...",
      "timing": "how the numbers were taken (do_bench, warmup, rep)",
      "sizes": {"n": 268435456, "softmax_shapes": [[32768, 1024], ...], "sweep": [4096, ...]},
      "copy": {<a row, below>},               # the roofline: device-to-device copy
      "rows": [                                # one per (kernel, shape) that passed its check
        {"topic": "relu",                      # relu | gelu | reduction | softmax | copy
         "variant": "triton v2",               # "<lang> <version>", "torch", "torch.compile",
                                               # "torch op-by-op" (unfused GELU), "copy"
         "lang": "triton",                     # cuda | numba | triton | torch
         "version": "v2",                      # the key in VERSIONS; eager/compile/unfused for torch
         "reference": true,                    # the topic module's REFERENCE version
         "description": "...",
         "shape": [268435456],                 # [n] or [rows, cols]
         "bytes": 2147483648,                  # bytes read + bytes written
         "median_ms": 0.7, "p20_ms": 0.69, "p80_ms": 0.71,
         "gbps": 3000.0,                       # bytes / median, 1 GB = 1e9 bytes
         "fraction_of_copy": 0.99}             # gbps / copy gbps of the same run
      ],
      "failed": [{"topic", "variant", "lang", "version", "shape",
                  "status": "failed check" | "unsupported" | "error" | "crashed" | "timed out"
                            | "skipped",     # unsupported: the launcher refuses that shape
                  "reason": "..."}],
      "sweeps": {"relu": {"triton v2": [[4096, 12.5], [16384, 48.0], ...], ...}, ...},
                                               # [n_elements, GB/s] per size, for the plots
      "targets": [{"topic", "lang", "variant", "shape", "goal", "value", "threshold",
                   "unit", "met"}],            # unit: "fraction_of_copy", "gbps" or
                                               # "ratio_to_torch"; met: true/false/null
      "notes": ["..."],
      "wall_s": 300.0                          # how long the run took
    }
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from runtime.config import SIMULATE
from runtime.paths import LESSON_RESULTS_DIR, RECORDS_DIR, ROOT, SIMULATOR_RESULTS_DIR, TUNE_RESULTS_DIR

__all__ = [
    "BenchResult",
    "bench",
    "RESULTS_FILE",
    "load_recorded",
    "recorded",
    "recorded_sweep",
    "recorded_failures",
    "recorded_targets",
    "copy_roofline",
    "recorded_machine",
    "recorded_gpu",
    "recorded_gpus",
    "recorded_file",
    "recorded_gpu_file",
    "gpu_short_name",
    "gpu_slug",
    "recorded_commit",
    "recorded_label",
    "source_commit",
    "commit_str",
    "recorded_launch_overhead",
    "stale_note",
    "show_recorded",
    "show_targets",
    "show_results",
    "recorded_rows",
    "compare_runs",
    "compare",
]

#: The H100's record, for code that names it. The functions below do not read it by default:
#: they pick, per topic, the most recent record of any GPU (``recorded_file``).
RESULTS_FILE = RECORDS_DIR / "h100.json"

SIMULATED_LABEL = "simulated on the CPU: not a GPU timing"


# --------------------------------------------------------------------------------------
# Live timing
# --------------------------------------------------------------------------------------
@dataclass
class BenchResult:
    """One timing: ``median_ms`` with the 20th/80th percentiles, and GB/s at the median."""

    name: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    gbps: float | None
    nbytes: int
    simulated: bool

    def __str__(self) -> str:
        label = f"{self.name}: " if self.name else ""
        spread = f"(p20 {_fmt_ms(self.p20_ms)}, p80 {_fmt_ms(self.p80_ms)})"
        if self.simulated:
            return f"{label}{_fmt_ms(self.median_ms)} ms per call {spread}, {SIMULATED_LABEL}"
        bw = f", {self.gbps:,.0f} GB/s" if self.gbps is not None else ""
        return f"{label}median {_fmt_ms(self.median_ms)} ms {spread}{bw}"

    def as_dict(self) -> dict:
        return asdict(self)


def _fmt_ms(ms: float) -> str:
    if ms is None or not math.isfinite(ms):
        return "?"
    if ms >= 100:
        return f"{ms:,.0f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.4f}"


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (what numpy and torch do by default)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _gbps(nbytes: int, ms: float) -> float | None:
    if not nbytes or ms is None or ms <= 0:
        return None
    return nbytes / (ms * 1e-3) / 1e9


def _bench_cpu(call: Callable[[], object], warmup: float, rep: float) -> list[float]:
    """Wall-clock times (ms) of a few calls. One untimed call first: it compiles and caches."""
    if warmup > 0:
        call()
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
        elapsed = time.perf_counter() - start
        # At least 3 calls when they are quick (under a second together), then more until
        # `rep` ms are spent; a slow simulated call is timed once rather than hold a cell.
        if len(times) >= 100:
            break
        if len(times) < 3 and elapsed < 1.0:
            continue
        if elapsed * 1e3 >= rep:
            break
    return times


def bench(fn: Callable, *args, nbytes: int | None, name: str = "", warmup: float = 25,
          rep: float = 100) -> BenchResult:
    """Time ``fn(*args)``: the median and 20th/80th percentiles in ms, and GB/s.

    ``nbytes``: bytes the call must read plus write (``None`` or 0: no GB/s).
    ``warmup`` and ``rep``: milliseconds spent warming up and timing, as in
    ``triton.testing.do_bench``. In simulation one untimed call warms up (it compiles),
    then a few calls are timed with ``time.perf_counter``; the result is marked simulated.
    """
    if not callable(fn):
        raise TypeError(f"bench needs a function to call, got {type(fn).__name__}")
    if nbytes is not None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int (bytes read + written), got {nbytes!r}")
    if warmup < 0 or rep <= 0:
        raise ValueError(f"warmup must be >= 0 and rep > 0 (milliseconds), got {warmup} and {rep}")

    def call():
        return fn(*args)

    if SIMULATE:
        times = sorted(_bench_cpu(call, warmup, rep))
        med, p20, p80 = (_quantile(times, q) for q in (0.5, 0.2, 0.8))
        simulated = True
    else:
        # triton.testing.do_bench (same signature in Triton 3.x): CUDA events, L2 flushed
        # before every call, `warmup`/`rep` in ms; with quantiles it returns a list in the
        # order asked for.
        import triton.testing

        med, p20, p80 = triton.testing.do_bench(call, warmup=warmup, rep=rep,
                                                quantiles=[0.5, 0.2, 0.8])
        simulated = False
    return BenchResult(name=name, median_ms=float(med), p20_ms=float(p20), p80_ms=float(p80),
                       gbps=_gbps(nbytes or 0, float(med)), nbytes=int(nbytes or 0),
                       simulated=simulated)


# --------------------------------------------------------------------------------------
# Recorded results: one record per GPU, the most recent one per topic
# --------------------------------------------------------------------------------------
# A GPU's model in its name: H100, H200, GH200, A100, L40S, A10G, T4, A6000.
_GPU_MODEL = re.compile(r"\b[A-Z]{1,2}\d{1,4}[A-Z]?\b")
# The note an --update run leaves: "layernorm, softmax re-measured on 2026-11-27T06:43:46Z at ..."
_REMEASURED = re.compile(r"([\w, ]+) re-measured on (\S+)")


def gpu_short_name(gpu: str | None) -> str | None:
    """The short name of a GPU: ``"H100"`` for ``"NVIDIA H100 80GB HBM3"``, ``"H200"`` for
    ``"NVIDIA H200"``, ``"A100"`` for ``"NVIDIA A100-SXM4-80GB"``; a name without a model
    number only loses ``"NVIDIA "`` (``"GeForce RTX 4090"``). None for None."""
    if not gpu:
        return None
    name = str(gpu).strip()
    m = _GPU_MODEL.search(name)
    return m.group(0) if m else re.sub(r"^NVIDIA\s+", "", name)


def gpu_slug(gpu: str | None) -> str:
    """The stem of a GPU's files in ``benchmarks/results/*/`` (``h200`` for ``"NVIDIA H200"``:
    ``h200.json``, ``h200-validation.txt``): the short name in lower case. The one rule for
    ``python -m benchmarks`` and ``.ci/gpu-validate.sh``."""
    return re.sub(r"[^a-z0-9]+", "-", (gpu_short_name(gpu) or "").lower()).strip("-") or "gpu"


def _is_record(path: Path, data) -> bool:
    """A GPU's record: top-level ``schema`` and ``rows``; not a smoke test or a dry run."""
    return (isinstance(data, dict) and "schema" in data and isinstance(data.get("rows"), list)
            and not data.get("simulated") and not path.stem.endswith("-quick"))


def _topic_date(data: dict, topic: str | None) -> str:
    """When ``topic`` was measured in a record (ISO, UTC): its own date in ``topic_commits``,
    else that of the ``--update`` run that re-measured it (``notes``), else the record's."""
    date = str(data.get("date") or "")
    if topic is None:
        return date
    own = ((data.get("topic_commits") or {}).get(topic) or {}).get("date")
    if own:
        return str(own)
    for note in data.get("notes") or ():
        m = _REMEASURED.match(str(note))
        if m and topic in m.group(1).split(", "):
            date = max(date, m.group(2))
    return date


def _sweep_topics(data: dict) -> set:
    """The topics with a size sweep in a record (``sweeps``, or rows marked ``sweep``)."""
    return ({t for t, s in (data.get("sweeps") or {}).items() if s}
            | {r.get("topic") for r in data.get("rows", []) if r.get("sweep")})


# path -> ((mtime, size), summary or None): a record's facts, read once per version of the file
_SUMMARIES: dict = {}


def _summary(path: Path) -> dict | None:
    """What choosing among records needs from one file; None when it is not a record."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_size)
    hit = _SUMMARIES.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    summary = None
    try:
        text = path.read_text()
        data = json.loads(text) if '"schema"' in text and '"rows"' in text else None
    except (OSError, ValueError):
        data = None
    if _is_record(path, data):
        topics = ({r.get("topic") for r in data["rows"]} | {f.get("topic") for f in data.get("failed") or []}) - {None}
        dates = {t: _topic_date(data, t) for t in topics}
        machine = data.get("machine") or {}
        summary = dict(machine=machine.get("name") or path.stem, gpu=gpu_short_name(machine.get("gpu")),
                       gpu_name=machine.get("gpu"), date=max([str(data.get("date") or ""), *dates.values()]),
                       path=path, topics=sorted(topics), topic_dates=dates, sweeps=sorted(_sweep_topics(data) - {None}))
    _SUMMARIES[path] = (key, summary)
    return summary


def _records(directory=None) -> list[dict]:
    """Every GPU's record in ``directory`` (default ``benchmarks/results/records/``), newest first."""
    folder = Path(directory) if directory is not None else RECORDS_DIR
    if not folder.is_dir():
        return []
    found = [s for s in (_summary(p) for p in sorted(folder.glob("*.json"))) if s]
    return sorted(found, key=lambda s: (s["date"], s["path"].name), reverse=True)


def recorded_gpus(directory=None) -> list[dict]:
    """One entry per GPU's record, newest first: ``machine`` (``"h200"``), ``gpu`` (``"H200"``),
    ``gpu_name`` (``"NVIDIA H200"``), ``date`` (its most recent measurement), ``path`` and the
    ``topics`` it holds. [] when nothing is recorded."""
    return [{k: s[k] for k in ("machine", "gpu", "gpu_name", "date", "path", "topics")}
            for s in _records(directory)]


def recorded_file(topic: str | None = None, path=None, *, sweep: bool = False, directory=None) -> Path | None:
    """The record a topic's numbers come from: the one that measured ``topic`` most recently
    (with ``sweep=True``: its size sweep); without a topic, the record measured most recently.
    A ``path`` given is that file. None when no record has it."""
    if path is not None:
        return Path(path)
    records = _records(directory)
    if topic is None:
        return records[0]["path"] if records else None
    having = [s for s in records if topic in (s["sweeps"] if sweep else s["topic_dates"])]
    if not having:
        return None
    return max(having, key=lambda s: (s["topic_dates"].get(topic, s["date"]), s["date"], s["path"].name))["path"]


def _gpu_file_dirs() -> tuple[Path, ...]:
    """The kinds of ``benchmarks/results/`` that hold one GPU's files, in the order
    ``recorded_gpu_file`` looks in them: ``lessons/``, ``simulators/``, ``tune/``, ``records/``."""
    return (LESSON_RESULTS_DIR, SIMULATOR_RESULTS_DIR, TUNE_RESULTS_DIR, RECORDS_DIR)


def recorded_gpu_file(pattern: str, directory=None) -> tuple[Path | None, str | None]:
    """A lesson's GPU recording that is not a benchmark record (a profiler trace, Nsight
    Compute's counters, a probe), named from its GPU: ``pattern`` holds ``{gpu}``, the GPU's
    file stem (``"{gpu}-print-loss.json"`` is ``h200-print-loss.json`` on an H200). Returns
    ``(path, gpu)`` for the GPU recorded most recently that has the file (``gpu`` its short
    name, ``"H200"``), else for any GPU whose file is there; ``(None, None)`` when none is.
    The file is looked for in ``directory``, else in each kind of ``benchmarks/results/`` that
    holds one GPU's files (``LESSON_RESULTS_DIR``, ``SIMULATOR_RESULTS_DIR``,
    ``TUNE_RESULTS_DIR``, ``RECORDS_DIR``); which GPU is newest, in the records."""
    if "{gpu}" not in pattern:
        raise ValueError(f"recorded_gpu_file: the pattern {pattern!r} must hold {{gpu}}, "
                         "as in '{gpu}-print-loss.json'")
    folders = (Path(directory),) if directory is not None else _gpu_file_dirs()
    for rec in recorded_gpus():
        name = pattern.format(gpu=gpu_slug(rec["gpu_name"] or rec["gpu"]))
        for folder in folders:
            if (folder / name).is_file():
                return folder / name, rec["gpu"]
    # a file from a GPU with no benchmark record: its stem is all there is to name it by
    head, _, tail = pattern.partition("{gpu}")
    for folder in folders:
        for path in sorted(folder.glob(f"{head}*{tail}")):
            stem = path.name[len(head):len(path.name) - len(tail)]
            if re.fullmatch(r"[a-z0-9-]+", stem):
                return path, stem.upper()
    return None, None


def _resolve(path, topic: str | None = None) -> Path | None:
    """The file to read: ``path`` if given, else the topic's record, else (a topic no record
    has) the most recent record, whose answer then says the topic is not there."""
    return recorded_file(topic, path) or recorded_file(None, path)


def _where(path, p: Path | None) -> str:
    """The file(s) an answer comes from, for a message."""
    if path is not None or p is None:
        return Path(path).name if path is not None else "benchmarks/results/records/"
    names = [s["path"].name for s in _records()]
    return names[0] if len(names) == 1 else f"any GPU's record ({', '.join(names)})"


def _nothing_recorded(path: Path | None, why: str) -> None:
    where = f" ({path})" if path is not None else ""
    print(f"No recorded GPU results: {why}{where}. "
          "They are written by `python -m benchmarks` on a GPU.")


def load_recorded(path=None, quiet: bool = False, topic: str | None = None) -> dict | None:
    """A whole results file as a dict, or None (with a one-line note) if there is none: ``path``,
    else the record of ``topic`` (the most recent one that has it), else the most recent record."""
    p = _resolve(path, topic)
    if p is None:
        if not quiet:
            _nothing_recorded(None, f"no GPU's record in {RECORDS_DIR.parent.name}/{RECORDS_DIR.name}/ yet")
        return None
    if not p.is_file():
        if not quiet:
            _nothing_recorded(p, "the file does not exist yet")
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        if not quiet:
            _nothing_recorded(p, f"the file cannot be read ({e})")
        return None
    if not isinstance(data, dict) or not isinstance(data.get("rows", []), list):
        if not quiet:
            _nothing_recorded(p, "the file is not a results file")
        return None
    return data


def recorded(topic: str, path=None) -> list[dict]:
    """The recorded rows of a topic (``relu``, ``gelu``, ``reduction``, ``softmax``, ``copy``).

    Each row is a dict with ``topic, variant, lang, version, shape, bytes, median_ms,
    p20_ms, p80_ms, gbps, fraction_of_copy`` (and ``reference``, ``description``).
    """
    p = _resolve(path, topic)
    data = load_recorded(p)
    if data is None:
        return []
    rows = [r for r in data.get("rows", []) if r.get("topic") == topic]
    if not rows:
        print(f"No recorded GPU results for {topic!r} in {_where(path, p)}.")
    return rows


def recorded_sweep(topic: str, path=None) -> dict[str, list[tuple[int, float]]]:
    """``{variant: [(n_elements, GB/s), ...]}`` from the recorded size sweep of a topic: that of
    the most recent record with a sweep of it (``recorded_file(topic, sweep=True)``, whose GPU
    may differ from that of the topic's other numbers), or of ``path``."""
    p = recorded_file(topic, path, sweep=True) or _resolve(path, topic)
    data = load_recorded(p)
    if data is None:
        return {}
    sweep = data.get("sweeps", {}).get(topic, {})
    if not sweep:
        print(f"No recorded size sweep for {topic!r} in {_where(path, p)}.")
    return {variant: [(int(n), float(g)) for n, g in points] for variant, points in sweep.items()}


def recorded_failures(topic: str | None = None, path=None) -> list[dict]:
    """Kernels the benchmark did not time (a failed check, an error, out of time), with why."""
    data = load_recorded(path, topic=topic)
    if data is None:
        return []
    return [r for r in data.get("failed", []) if topic is None or r.get("topic") == topic]


def recorded_targets(topic: str | None = None, path=None) -> list[dict]:
    """The course's performance targets as recorded: goal, measured value, met or not."""
    data = load_recorded(path, topic=topic)
    if data is None:
        return []
    return [t for t in data.get("targets", []) if topic is None or t.get("topic") == topic]


def copy_roofline(path=None, topic: str | None = None) -> float | None:
    """GB/s of a device-to-device copy in the recorded run: the practical ceiling. With
    ``topic``, the copy of the record that topic's numbers come from (the same GPU and run);
    without, that of the most recent record."""
    data = load_recorded(path, topic=topic)
    if data is None:
        return None
    copy = data.get("copy") or {}
    gbps = copy.get("gbps")
    return float(gbps) if gbps is not None else None


def recorded_machine(path=None, topic: str | None = None) -> dict:
    """The GPU and software versions of the recorded run, with its ``date``, ``command``,
    ``timing``, ``commit`` (None when the file does not name one) and ``record`` (the file's
    name). With ``topic``, the record that topic's numbers come from."""
    p = _resolve(path, topic)
    data = load_recorded(p)
    if data is None:
        return {}
    info = dict(data.get("machine", {}))
    for key in ("date", "command", "timing"):
        if key in data:
            info[key] = data[key]
    info["commit"] = data.get("commit")
    info["record"] = p.name
    return info


def recorded_gpu(topic: str | None = None, path=None) -> str | None:
    """The short name of the GPU a topic's recorded numbers come from (``"H200"``, ``"H100"``);
    without a topic, that of the most recent record. None when nothing is recorded."""
    data = load_recorded(path, quiet=True, topic=topic)
    return gpu_short_name((data or {}).get("machine", {}).get("gpu"))


# --------------------------------------------------------------------------------------
# Which code was measured
# --------------------------------------------------------------------------------------
#: A copy of the course without its git history (files sent to a GPU machine, an unpacked
#: archive) cannot ask git; set this variable to the commit's hash before measuring there.
COMMIT_ENV = "COURSE_COMMIT"

# Outputs of a measuring run: their changes do not make the measured code differ from the commit.
_NOT_CODE = ("benchmarks/results", "artifacts")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def source_commit() -> dict:
    """The git commit of the code about to be measured, for a results file:
    ``{"commit": 40 hex digits or None, "commit_dirty": bool or None}``.

    ``$COURSE_COMMIT`` wins (then whether files changed since is unknown: None); otherwise
    git's ``HEAD`` of the course, dirty when tracked or new files outside the results differ
    from it. Without either the commit is None, written as ``null``: unknown, never guessed.
    """
    given = os.environ.get(COMMIT_ENV, "").strip()
    if given:
        if not all(c in "0123456789abcdefABCDEF" for c in given) or not 7 <= len(given) <= 40:
            raise ValueError(f"${COMMIT_ENV} must be a git commit hash (7 to 40 hex digits), got {given!r}")
        return {"commit": given.lower(), "commit_dirty": None}
    head = _git("rev-parse", "--verify", "HEAD")
    if not head:
        return {"commit": None, "commit_dirty": None}
    status = _git("status", "--porcelain", "--", ".", *(f":!{p}" for p in _NOT_CODE))
    return {"commit": head.strip(), "commit_dirty": None if status is None else bool(status.strip())}


def commit_str(info: dict) -> str:
    """``commit 1a2b3c4d5e6f``, ``... plus uncommitted changes``, or ``commit unknown``."""
    sha = info.get("commit")
    if not sha:
        return "commit unknown"
    dirty = " plus uncommitted changes" if info.get("commit_dirty") else ""
    return f"commit {sha[:12]}{dirty}"


def _commit_info(data: dict, topic: str | None) -> dict:
    """A topic re-measured with ``--update`` has a commit of its own; else the file's."""
    return (data.get("topic_commits") or {}).get(topic) or data


def recorded_commit(topic: str | None = None, path=None) -> str | None:
    """The git commit the recorded GPU numbers (of ``topic``, if given) were measured at,
    or None when the file does not say (recorded before results named their commit)."""
    data = load_recorded(path, quiet=True, topic=topic)
    return _commit_info(data, topic).get("commit") or None if data else None


def recorded_label(topic: str | None = None, path=None) -> str | None:
    """Where the recorded numbers (of ``topic``, if given) come from, for a plot title or a table:
    the GPU, the date that topic was measured and the commit, ``"NVIDIA H200, 2026-11-29, commit
    1a2b3c4d5e6f"``, with a note when its kernels changed since; None without a record."""
    p = _resolve(path, topic)
    data = load_recorded(p, quiet=True) if p is not None else None
    if data is None:
        return None
    label = _label(data, topic)
    return label + f" ({STALE_LABEL})" if topic and stale_note(topic, p) else label


def _label(data: dict, topic: str | None) -> str:
    gpu = data.get("machine", {}).get("gpu", "a GPU")
    date = _topic_date(data, topic)[:10]  # a topic measured again later (--update) has its own date
    return ", ".join(p for p in (gpu, date, commit_str(_commit_info(data, topic))) if p)


#: What a table or plot of a topic says when its kernels changed since they were measured.
STALE_LABEL = "measured on an earlier version of this kernel"


def stale_note(topic: str, path=None) -> str | None:
    """``"measured on an earlier version of this kernel"`` (with why) when ``topic``'s sources
    here differ from those its recorded numbers measured (``utils/sources.py`` hashes
    them; ``python -m benchmarks --update --stale`` measures again), else None."""
    data = load_recorded(path, quiet=True, topic=topic)
    if not data or not ((data.get("topic_sources") or {}).get(topic) or {}).get("hash"):
        return None  # a file from before source hashes: which version it measured is unknown
    from .sources import stale_topics
    why = stale_topics(data, [topic]).get(topic)
    return f"{STALE_LABEL} ({why})" if why else None


#: Per-launch host cost recorded by ``python -m benchmarks.lessons.launch_overhead`` on the GPU machine.
LAUNCH_OVERHEAD_FILE = LESSON_RESULTS_DIR / "launch-overhead.json"


def recorded_launch_overhead(path=None) -> dict[str, float]:
    """Microseconds per launch (median) by launcher, as recorded on the GPU machine; {} if
    there is no record (with a one-line note)."""
    p = Path(path) if path is not None else LAUNCH_OVERHEAD_FILE
    try:
        data = json.loads(p.read_text())
        return {name: float(r["median_us"]) for name, r in data["per_launch"].items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"No recorded launch overhead ({p}: {type(e).__name__}). "
              "`python -m benchmarks.lessons.launch_overhead` on a GPU writes it.")
        return {}


def _machine_line(data: dict, topic: str | None = None) -> str:
    m = data.get("machine", {})
    parts = [m.get("gpu", "unknown GPU")]
    date = _topic_date(data, topic)[:10]
    if date:
        parts.append(f"recorded {date}")
    parts.append(commit_str(_commit_info(data, topic)))
    versions = ", ".join(f"{k} {m[k]}" for k in ("torch", "triton", "numba_cuda", "cuda") if m.get(k))
    if versions:
        parts.append(versions)
    return "; ".join(parts)


def _shape_str(shape) -> str:
    if not shape:
        return "?"
    shape = list(shape)
    if len(shape) == 1:
        n = int(shape[0])
        if n > 0 and n & (n - 1) == 0 and n >= 1024:
            return f"2^{n.bit_length() - 1}"
        return str(n)
    return "x".join(str(int(s)) for s in shape)


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def show_recorded(topic: str, path=None) -> None:
    """Print the recorded GPU numbers of a topic as a table, labelled with the GPU, date and
    commit of the record they come from (the most recent that has the topic, or ``path``)."""
    p = _resolve(path, topic)
    data = load_recorded(p)
    if data is None:
        return
    rows = [r for r in data.get("rows", []) if r.get("topic") == topic]
    failed = [r for r in data.get("failed", []) if r.get("topic") == topic]
    if not rows and not failed:
        print(f"No recorded GPU results for {topic!r} in {_where(path, p)}.")
        return
    print(f"Recorded on {_machine_line(data, topic)}")
    note = stale_note(topic, p)
    if note:
        print(f"Note: {note}")
    roof = (data.get("copy") or {}).get("gbps")
    if roof:
        print(f"copy roofline: {roof:,.0f} GB/s (device-to-device copy, bytes read + written)")
    header = f"{'kernel':<22} {'shape':>12} {'median ms':>10} {'p20..p80 ms':>19} {'GB/s':>7} {'% of copy':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        name = r.get("variant", "?") + (" *" if r.get("reference") else "")
        spread = f"{_fmt_ms(r.get('p20_ms'))}..{_fmt_ms(r.get('p80_ms'))}"
        frac = r.get("fraction_of_copy")
        print(f"{name:<22} {_shape_str(r.get('shape')):>12} {_fmt_ms(r.get('median_ms')):>10} "
              f"{spread:>19} {_num(r.get('gbps'), ',.0f'):>7} "
              f"{('-' if frac is None else f'{100 * frac:.1f}%'):>9}")
    if any(r.get("reference") for r in rows):
        print("* the course's reference version in that language")
    for r in failed:
        print(f"not timed: {r.get('variant')} {_shape_str(r.get('shape'))}: "
              f"{r.get('status')} ({r.get('reason', '')})")


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """Lines of a table whose columns line up: ``align`` has one letter per column, "l" or "r"
    (default: the first column left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(str(c).ljust(w) if a == "l" else str(c).rjust(w)
                         for c, w, a in zip(cells, widths, align)).rstrip()
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def _target_measured(t: dict) -> str:
    value, unit = t.get("value"), t.get("unit")
    if value is None:
        return "-"
    if unit == "fraction_of_copy":
        return f"{100 * value:.1f}% of copy"
    if unit == "gbps":
        return f"{value:,.0f} GB/s"
    if unit == "tflops":
        return f"{value:,.1f} TFLOP/s"
    return f"{value:.2f}x"   # the goal names what it is a ratio to


def _target_status(t: dict) -> str:
    return {True: "met", False: "MISSED"}.get(t.get("met"), "not measured")


def _field_is(row: dict, key: str, want) -> bool:
    """``row[key] == want``; a tuple, list or set ``want`` (other than a shape) is a choice of
    values, and None matches a row that does not record the field."""
    if key == "shape":
        return list(row.get(key) or []) == list(want)
    if isinstance(want, (tuple, list, set, frozenset)):
        return row.get(key) in want
    return row.get(key) == want


def show_targets(topic: str, path=None, **where) -> list[dict]:
    """Print the course's recorded performance targets for a topic as a table: the kernel, the
    shape (and dtype, mask and pass where targets have them), the goal, what was measured and
    whether it was met; under each missed target, why (the reason recorded with it). ``where``
    keeps the targets whose fields equal the values given (``shape=(4, 32, 4096, 64)``; a tuple
    is a choice of values, None a field the target does not record). The first line names the
    record's GPU, date and commit. Returns the missed ones."""
    p = _resolve(path, topic)
    data = load_recorded(p, quiet=True) if p is not None else None
    targets = recorded_targets(topic, p)
    for key, want in where.items():
        key = key.rstrip("_")
        targets = [t for t in targets if _field_is(t, key, want)]
    if not targets:
        print(f"No recorded targets for {topic!r}" + (f" with {where}" if where else "") + ".")
        return []
    print(f"{topic} targets, recorded on {_run_label(data, topic, p, stale=False)}")
    note = stale_note(topic, p)
    if note:
        print(f"Note: {note}")
    keys = [k for k in _CONFIG_KEYS if any(k in t for t in targets)]
    rows = [[_base_variant(t.get("variant", "?")), _shape_str(t.get("shape"))]
            + ([_config_name(t, keys)] if keys else [])
            + [t.get("goal", ""), _target_measured(t), _target_status(t)] for t in targets]
    header = ["kernel", "shape"] + (["configuration"] if keys else []) + ["goal", "measured", "status"]
    table = _table(header, rows, "lr" + ("l" if keys else "") + "llr").split("\n")
    print("\n".join(table[:2]))
    said = set()
    for t, line in zip(targets, table[2:]):
        print(line)
        if t.get("met") is False and t.get("why"):
            if t["why"] in said:
                print("    why: as above")
            else:
                said.add(t["why"])
                print(textwrap.fill(t["why"], width=100, initial_indent="    why: ", subsequent_indent="         "))
    missed = [t for t in targets if t.get("met") is False]
    met = sum(t.get("met") is True for t in targets)
    print(f"{met} of {len(targets)} targets met" + (f", {len(missed)} missed" if missed else ""))
    return missed


# --------------------------------------------------------------------------------------
# Compact tables of recorded rows
# --------------------------------------------------------------------------------------
#: What distinguishes one measurement of a variant from another, besides its shape.
_CONFIG_KEYS = ("dtype", "causal", "pass")


def recorded_rows(topic: str, path=None) -> list[dict]:
    """The recorded rows of a topic in a GPU record's form, from the topic's record (or the
    record ``path``) or from a topic's own benchmark file whose rows are lists under
    ``"forward"`` and ``"backward"`` (``benchmarks/lessons/layernorm_forward_backward.py``:
    ``version``, ``ms``, ``ms_p20``, ``copy_fraction``)."""
    data = load_recorded(_resolve(path, topic), quiet=True)
    if data is None:
        return []
    if data.get("rows"):
        return [r for r in data["rows"] if r.get("topic") == topic]
    rows = []
    for part in ("forward", "backward"):
        for r in data.get(part) or []:
            rows.append({"topic": topic, "variant": r.get("version"), "pass": part, "dtype": r.get("dtype"),
                         "shape": r.get("shape"), "median_ms": r.get("ms"), "p20_ms": r.get("ms_p20"),
                         "p80_ms": r.get("ms_p80"), "gbps": r.get("gbps"),
                         "fraction_of_copy": r.get("copy_fraction")})
    return rows


def _run_label(data: dict, topic: str, path, stale: bool = True) -> str:
    """The GPU, date and commit of a results file, for a table's title."""
    if data.get("rows") or "schema" in data:
        return (recorded_label(topic, path) if stale else _label(data, topic)) or ""
    commit = data.get("commit")
    info = commit if isinstance(commit, dict) else {"commit": commit}
    return ", ".join(p for p in (data.get("gpu", "a GPU"), str(data.get("date", ""))[:10], commit_str(info)) if p)


def _base_variant(name: str) -> str:
    return str(name).split(" [")[0]


def _config_name(r: dict, keys) -> str:
    parts = []
    for k in keys:
        v = r.get(k)
        if k == "shape":
            parts.append(_shape_str(v))
        elif k == "causal":
            parts.append("causal" if v else "full")
        elif k == "pass":
            parts.append({"forward": "fwd", "backward": "bwd", "forward+backward": "fwd+bwd"}.get(v, str(v)))
        else:
            parts.append(str(v))
    return " ".join(parts)


def show_results(topic: str, path=None, *, metric: str | None = None, sweep: bool = False, **where) -> None:
    """Print a topic's recorded GPU results as one compact table: a line per kernel, a column
    per configuration (shape, and dtype, mask or pass where those vary), best first.

    ``where`` keeps the rows whose fields equal the given values (``shape=(4, 32, 4096, 64)``,
    ``dtype="float16"``, ``causal=True``, ``pass_="forward"``; a tuple is a choice of values, None a
    field the row does not record). ``metric``: ``"tflops"`` (the
    default where the rows have it), ``"gbps"`` or ``"ms"``. ``sweep=True`` shows the size
    sweep's rows instead of the main ones. ``path``: another results file (default: the topic's
    record, the most recent that has it). The title names the record's GPU, date and commit.
    """
    p = _resolve(path, topic)
    data = load_recorded(p)
    if data is None:
        return
    rows = [r for r in recorded_rows(topic, p) if bool(r.get("sweep")) == sweep]
    for key, want in where.items():
        key = key.rstrip("_")
        if key == "shape":
            want = list(want)
        rows = [r for r in rows if _field_is(r, key, want)]
    if not rows:
        print(f"No recorded GPU results for {topic!r} in {_where(path, p)}"
              + (f" with {where}" if where else "") + ".")
        return
    metric = metric or ("tflops" if any(r.get("tflops") for r in rows) else "gbps")
    if metric not in ("tflops", "gbps", "ms"):
        raise ValueError(f"show_results: metric must be 'tflops', 'gbps' or 'ms', got {metric!r}")
    keys = [k for k in ("shape", *_CONFIG_KEYS)
            if len({repr(r.get(k)) for r in rows}) > 1]
    configs = sorted({_config_name(r, keys) for r in rows},
                     key=lambda c: next(i for i, r in enumerate(rows) if _config_name(r, keys) == c))
    table: dict[str, dict[str, float]] = {}
    reference = set()
    for r in rows:
        v = r.get("median_ms") if metric == "ms" else r.get(metric)
        name = _base_variant(r.get("variant"))
        table.setdefault(name, {})[_config_name(r, keys)] = v
        if r.get("reference"):
            reference.add(name)
    fmt = {"tflops": ",.0f", "gbps": ",.0f", "ms": ".3f"}[metric]
    first = configs[0]
    order = sorted(table, key=lambda n: (table[n].get(first) is None,
                                         (1 if metric == "ms" else -1) * (table[n].get(first) or 0)))
    unit = {"tflops": "TFLOP/s", "gbps": "GB/s", "ms": "ms (median)"}[metric]
    fixed = ", ".join(f"{k} {_shape_str(v) if k == 'shape' else v}" for k, v in
                      ((k, rows[0].get(k)) for k in ("shape", *_CONFIG_KEYS) if k not in keys)
                      if v is not None)
    print(f"{topic}, {unit}" + (f", {fixed}" if fixed else "") + f"; recorded on {_run_label(data, topic, p)}")
    body = [[n + (" *" if n in reference else "")] + [_num(table[n].get(c), fmt) for c in configs] for n in order]
    print(_table(["kernel", *configs], body))
    if reference:
        print("* the course's reference version in that language")


def compare_runs(topic: str, paths=None, *, shape, variants=None, **where) -> list[dict]:
    """Print the same kernels at the same shape from several results files, one line each:
    the run (GPU, date, commit), the median and the 20th..80th percentile times, and GB/s. A wide
    p20..p80 range, or a time that does not grow with the bytes, says the call waited on the
    host (Python, the launch) rather than on the GPU. ``paths=None``: every GPU's record that
    has the topic, the one that measured it most recently first. Returns the rows printed."""
    if paths is None:
        having = [s for s in _records() if topic in s["topic_dates"]]
        paths = [s["path"] for s in sorted(having, key=lambda s: s["topic_dates"][topic], reverse=True)]
    out = []
    for p in paths:
        data = load_recorded(p, quiet=True)
        if data is None:
            print(f"{Path(p).name}: not recorded")
            continue
        label = _run_label(data, topic, p)
        for r in recorded_rows(topic, p):
            if list(r.get("shape") or []) != list(shape) or r.get("sweep"):
                continue
            if variants is not None and _base_variant(r.get("variant")).lower() not in \
                    [v.lower() for v in variants]:
                continue
            # a field the file does not record (a GPU record has no pass or dtype for a forward-only,
            # float32-only topic) matches any value
            if any(r.get(k.rstrip("_")) not in (None, v) for k, v in where.items()):
                continue
            out.append({**r, "file": Path(p).name, "run": label})
    if not out:
        print(f"No recorded {topic} rows at {_shape_str(shape)}.")
        return out
    body = [[_base_variant(r["variant"]), r["file"], r.get("pass") or "forward",
             _num(None if r.get("median_ms") is None else 1e3 * r["median_ms"], ",.1f"),
             f"{_num(None if r.get('p20_ms') is None else 1e3 * r['p20_ms'], ',.1f')}.."
             f"{_num(None if r.get('p80_ms') is None else 1e3 * r['p80_ms'], ',.1f')}",
             _num(r.get("gbps"), ",.0f")] for r in out]
    print(f"{topic} at {_shape_str(shape)}" + "".join(f", {k.rstrip('_')} {v}" for k, v in where.items()))
    for f, label in dict((r["file"], r["run"]) for r in out).items():
        print(f"  {f}: {label}")
    print(_table(["kernel", "file", "pass", "median us", "p20..p80 us", "GB/s"], body, "lllrrr"))
    return out


def compare(results: BenchResult | Iterable[BenchResult], topic: str, path=None) -> None:
    """Print live timings next to the recorded GPU numbers of the same kernels.

    A live result is matched to a recorded row by its ``name``: the recorded ``variant``
    (``"triton v2"``, ``"torch"``) or a language alone (``"triton"``: its reference version).
    Sizes differ between a simulated run and the recorded one, so compare GB/s, not ms.
    """
    if isinstance(results, BenchResult):
        results = [results]
    results = list(results)
    p = _resolve(path, topic)
    data = load_recorded(p, quiet=True) if p is not None else None
    rows = [r for r in (data or {}).get("rows", []) if r.get("topic") == topic]
    if data is None:
        print(f"No recorded GPU results ({p or _where(path, p)}): showing the live timings only.")
    elif not rows:
        print(f"No recorded GPU results for {topic!r}: showing the live timings only.")
    else:
        print(f"Recorded on {_machine_line(data, topic)}")
    header = f"{'kernel':<22} {'here':>34} | {'recorded GB/s':>13} {'% of copy':>9} {'shape':>11}"
    print(header)
    print("-" * len(header))
    for res in results:
        row = _match(res.name, rows)
        if res.simulated:
            here = f"{_fmt_ms(res.median_ms)} ms (simulated)"
        else:
            here = f"{_fmt_ms(res.median_ms)} ms, {_num(res.gbps, ',.0f')} GB/s"
        if row is None:
            rec = f"{'-':>13} {'-':>9} {'':>11}"
        else:
            frac = row.get("fraction_of_copy")
            rec = (f"{_num(row.get('gbps'), ',.0f'):>13} "
                   f"{('-' if frac is None else f'{100 * frac:.1f}%'):>9} "
                   f"{_shape_str(row.get('shape')):>11}")
        print(f"{res.name or '?':<22} {here:>34} | {rec}")
    if any(r.simulated for r in results):
        print(f"'here' is {SIMULATED_LABEL}; the recorded columns are GPU timings.")


def _match(name: str, rows: list[dict]) -> dict | None:
    """The recorded row for a live result's name; the largest shape when several match."""
    if not name:
        return None
    key = name.strip().lower()
    hits = [r for r in rows if str(r.get("variant", "")).lower() == key]
    if not hits:
        hits = [r for r in rows if str(r.get("lang", "")).lower() == key and r.get("reference")]
    if not hits:
        return None
    return max(hits, key=lambda r: math.prod(r.get("shape") or [0]))
