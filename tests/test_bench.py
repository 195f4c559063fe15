"""utils.bench (live timing, recorded results) and the benchmark harness (check, then time)."""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import utils
from benchmarks import harness, report
from benchmarks import run as brun
from benchmarks.topics import TOPICS

# `utils.bench` is the function; the module is utils/bench.py.
ub = importlib.import_module("utils.bench")

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------
# bench()
# --------------------------------------------------------------------------------------
def test_bench_times_a_call_and_labels_simulation():
    x = torch.randn(1000, device=utils.DEVICE)
    calls = []

    def fn(t):
        calls.append(1)
        return t * 2

    r = utils.bench(fn, x, nbytes=8 * x.numel(), name="double")
    assert isinstance(r, utils.BenchResult)
    assert len(calls) >= 2  # warm-up, then timed calls
    assert r.name == "double" and r.nbytes == 8000
    assert 0 < r.p20_ms <= r.median_ms <= r.p80_ms
    assert r.gbps == pytest.approx(8000 / (r.median_ms * 1e-3) / 1e9)
    assert r.simulated == utils.SIMULATE
    text = str(r)
    if utils.SIMULATE:
        assert "simulated on the CPU: not a GPU timing" in text
    else:
        assert "GB/s" in text and "simulated" not in text


def test_bench_without_bytes_has_no_bandwidth():
    r = utils.bench(lambda: None, nbytes=None)
    assert r.gbps is None and r.nbytes == 0


@pytest.mark.parametrize("kw, err", [
    (dict(nbytes=-1), ValueError),
    (dict(nbytes=1.5), ValueError),
    (dict(nbytes=8, rep=0), ValueError),
])
def test_bench_rejects_bad_arguments(kw, err):
    with pytest.raises(err):
        utils.bench(lambda: None, **kw)


def test_bench_rejects_a_non_callable():
    with pytest.raises(TypeError, match="function"):
        utils.bench(42, nbytes=8)


def test_bench_needs_nbytes_by_keyword():
    with pytest.raises(TypeError):
        utils.bench(lambda: None)  # nbytes is required: GB/s needs a stated byte count


# --------------------------------------------------------------------------------------
# Recorded results, from a small fixture file
# --------------------------------------------------------------------------------------
def _row(topic, variant, lang, version, shape, ms, gbps, frac, reference=False):
    return dict(topic=topic, variant=variant, lang=lang, version=version, reference=reference,
                description="", shape=shape, bytes=int(gbps * 1e9 * ms * 1e-3), median_ms=ms,
                p20_ms=ms * 0.99, p80_ms=ms * 1.01, gbps=gbps, fraction_of_copy=frac)


@pytest.fixture
def results_file(tmp_path):
    data = dict(
        schema=1,
        machine=dict(name="h100", gpu="NVIDIA H100 80GB HBM3", torch="2.11.0", triton="3.6.0",
                     numba_cuda="0.30.4", cuda="13.0"),
        date="2026-01-31T12:00:00Z",
        command="python -m benchmarks",
        copy=_row("copy", "copy", "torch", "copy_", [1 << 28], 0.72, 2990.0, 1.0),
        rows=[
            _row("copy", "copy", "torch", "copy_", [1 << 28], 0.72, 2990.0, 1.0),
            _row("relu", "cuda v1", "cuda", "v1", [1 << 28], 0.9, 2390.0, 0.80),
            _row("relu", "triton v2", "triton", "v2", [1 << 28], 0.72, 2980.0, 0.997, reference=True),
            _row("relu", "torch", "torch", "eager", [1 << 28], 0.72, 2985.0, 0.998),
            _row("softmax", "triton v1", "triton", "v1", [1024, 65536], 0.3, 1800.0, 0.6, reference=True),
        ],
        failed=[dict(topic="relu", variant="numba v0", lang="numba", version="v0", shape=None,
                     status="skipped", reason="a demonstration version, not benchmarked")],
        sweeps={"relu": {"triton v2": [[4096, 10.5], [1 << 28, 2980.0]], "torch": [[4096, 9.0]]}},
        targets=[dict(topic="softmax", lang="triton", variant="triton v1", shape=[1024, 65536],
                      goal=">= 2,200 GB/s", value=1800.0, threshold=2200.0, unit="gbps", met=False)],
    )
    p = tmp_path / "h100.json"
    p.write_text(json.dumps(data))
    return p


def test_recorded_reads_rows_of_a_topic(results_file):
    rows = utils.recorded("relu", path=results_file)
    assert [r["variant"] for r in rows] == ["cuda v1", "triton v2", "torch"]
    keys = {"topic", "variant", "lang", "version", "shape", "bytes", "median_ms", "p20_ms",
            "p80_ms", "gbps", "fraction_of_copy"}
    assert all(keys <= set(r) for r in rows)
    assert utils.recorded("softmax", path=results_file)[0]["shape"] == [1024, 65536]


def test_recorded_sweep_copy_machine(results_file):
    sweep = utils.recorded_sweep("relu", path=results_file)
    assert sweep == {"triton v2": [(4096, 10.5), (1 << 28, 2980.0)], "torch": [(4096, 9.0)]}
    assert utils.copy_roofline(path=results_file) == 2990.0
    m = utils.recorded_machine(path=results_file)
    assert m["gpu"] == "NVIDIA H100 80GB HBM3" and m["date"].startswith("2026-01-31")
    assert utils.recorded_targets("softmax", path=results_file)[0]["met"] is False
    assert utils.recorded_failures("relu", path=results_file)[0]["status"] == "skipped"


def test_show_recorded_prints_a_labelled_table(results_file, capsys):
    utils.show_recorded("relu", path=results_file)
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3" in out and "2026-01-31" in out
    assert "copy roofline: 2,990 GB/s" in out
    assert "triton v2 *" in out and "99.7%" in out and "2^28" in out
    assert "not timed: numba v0" in out


def test_compare_puts_live_next_to_recorded(results_file, capsys):
    live = [ub.BenchResult("triton v2", 3.0, 2.9, 3.1, 0.01, 32768, True),
            ub.BenchResult("cuda", 5.0, 4.9, 5.1, 0.01, 32768, True),  # no cuda reference row
            ub.BenchResult("torch", 0.01, 0.01, 0.01, 3.0, 32768, True)]
    utils.compare(live, "relu", path=results_file)
    out = capsys.readouterr().out.splitlines()
    line = next(s for s in out if s.startswith("triton v2"))
    assert "(simulated)" in line and "2,980" in line and "99.7%" in line
    line = next(s for s in out if s.startswith("cuda"))
    assert "2,390" not in line  # only a reference row answers for a bare language
    assert any("not a GPU timing" in s for s in out)


def test_missing_results_file_gives_empty_answers_and_a_note(tmp_path, capsys):
    p = tmp_path / "nothing.json"
    assert utils.recorded("relu", path=p) == []
    assert utils.recorded_sweep("relu", path=p) == {}
    assert utils.copy_roofline(path=p) is None
    assert utils.recorded_machine(path=p) == {}
    utils.show_recorded("relu", path=p)
    out = capsys.readouterr().out
    assert "No recorded GPU results" in out and "python -m benchmarks" in out
    assert len([s for s in out.splitlines() if s.strip()]) == 5  # one line per call


def test_broken_results_file_is_reported_not_raised(tmp_path, capsys):
    p = tmp_path / "h100.json"
    p.write_text("{ not json")
    assert utils.recorded("relu", path=p) == []
    assert "cannot be read" in capsys.readouterr().out


def test_unknown_topic_says_so(results_file, capsys):
    assert utils.recorded("matmul", path=results_file) == []
    assert "No recorded GPU results for 'matmul'" in capsys.readouterr().out


# --------------------------------------------------------------------------------------
# python -m benchmarks without a GPU
# --------------------------------------------------------------------------------------
def test_benchmark_command_refuses_without_a_gpu():
    env = dict(os.environ, COURSE_SIMULATE="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "benchmarks"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == brun.EXIT_NO_GPU == 2, p.stdout + p.stderr
    assert "simulation" in p.stdout and "nothing was measured" in p.stdout
    assert "h100.md" in p.stdout and "utils.show_recorded" in p.stdout
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("how", ["module", "file"])
def test_launch_overhead_benchmark_refuses_without_a_gpu(tmp_path, how):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["COURSE_SIMULATE"] = "1"
    # python -m from the course's root, or the script as a file from elsewhere (no PYTHONPATH)
    run = ["-m", "benchmarks.lessons.launch_overhead"] if how == "module" else \
        [str(ROOT / "benchmarks" / "lessons" / "launch_overhead.py")]
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run([sys.executable, *run, "--out", str(out)], cwd=ROOT if how == "module" else tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "simulation" in p.stdout and "launch-overhead.json" in p.stdout, p.stderr[-2000:]
    assert not list(out.iterdir()), "nothing is written without a GPU"
    recorded = json.loads((utils.LESSON_RESULTS_DIR / "launch-overhead.json").read_text())
    assert all(r["median_us"] > 0 for r in recorded["per_launch"].values())


def test_dry_run_needs_its_own_output_folder():
    with pytest.raises(SystemExit):
        brun.parse_args(["--simulated-dry-run"])
    with pytest.raises(SystemExit):
        brun.parse_args(["--topics", "conv2d"])


# --------------------------------------------------------------------------------------
# Check before time
# --------------------------------------------------------------------------------------
def _cases(topic, shapes):
    return [harness.CheckCase(topic, s, device=torch.device("cpu")) for s in shapes]


def _missing_tail(x):
    y = torch.relu(x)
    y.view(-1)[-1] = float("nan")  # as if the last element were never written
    return y


def _off_by_one(x):
    y = torch.relu(x).reshape(-1)
    return torch.cat([y[1:], y[:1]]).reshape(x.shape)


def _in_place(x):
    return x.relu_()


@pytest.mark.parametrize("fn, status, words", [
    (_missing_tail, "failed check", "never written"),
    (_off_by_one, "failed check", "values wrong"),
    (lambda x: torch.relu(x).double(), "failed check", "float64"),
    (lambda x: torch.relu(x)[:-1], "failed check", "shape"),
    (_in_place, "failed check", "changed its input"),
    (lambda x: 1 / 0, "error", "ZeroDivisionError"),
    (lambda x: (_ for _ in ()).throw(ValueError("too long")), "unsupported", "refuses"),
])
def test_check_rejects_wrong_relu_kernels(fn, status, words):
    verdict = harness.check(fn, _cases("relu", [(1,), (7,), (1025,)]))
    assert verdict is not None
    assert verdict[0] == status and words in verdict[1], verdict


def test_check_accepts_right_kernels():
    assert harness.check(lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
                         _cases("relu", [(1,), (1025,)])) is None
    # a different summation order is still right
    assert harness.check(lambda x: x.reshape(-1).flip(0).cumsum(0)[-1:].clone(),
                         _cases("reduction", [(7,), (1025,)])) is None
    assert harness.check(lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
                         _cases("gelu", [(1025,)])) is None
    assert harness.check(lambda x: torch.softmax(x, -1), _cases("softmax", [(7, 3), (5, 257)])) is None


def test_check_rejects_wrong_sums_and_softmaxes():
    def sum_skips_last_block(x):
        return x.reshape(-1)[:-256].sum().reshape(1)

    verdict = harness.check(sum_skips_last_block, _cases("reduction", [(1025,)]))
    assert verdict and verdict[0] == "failed check"

    def softmax_without_max(x):
        e = torch.exp(x)
        return e / e.sum(-1, keepdim=True)

    verdict = harness.check(softmax_without_max, _cases("softmax", [(7, 3)]))
    assert verdict and verdict[0] == "failed check"
    verdict = harness.check(lambda x: torch.softmax(x, 0), _cases("softmax", [(5, 257)]))
    assert verdict and verdict[0] == "failed check"
    # erf-GELU is a different formula from the tanh-GELU the course asks for
    verdict = harness.check(lambda x: torch.nn.functional.gelu(x), _cases("gelu", [(1025,)]))
    assert verdict and verdict[0] == "failed check"


def test_run_topic_never_times_a_wrong_kernel(tmp_path, monkeypatch):
    """The worker checks each kernel first: the wrong one is recorded, never timed."""
    right = harness.Variant("relu", "test right", "test", "right", "", True, lambda d=False: torch.relu)
    wrong = harness.Variant("relu", "test wrong", "test", "wrong", "", False,
                            lambda d=False: _off_by_one)
    def small_only(x):
        if x.numel() > 100:
            raise ValueError("at most 100 elements")
        return torch.relu(x)

    limited = harness.Variant("relu", "test limited", "test", "limited", "", False,
                              lambda d=False: small_only)
    monkeypatch.setattr(harness, "course_variants",
                        lambda topic, langs=None: ([wrong, limited, right], [], []))
    monkeypatch.setattr(harness, "baseline_variants", lambda topic: [])
    timed = []
    real_bench = utils.bench

    def spy(fn, *args, **kw):
        timed.append(kw.get("name"))
        return real_bench(fn, *args, **kw)

    monkeypatch.setattr(utils, "bench", spy)
    sizes = SimpleNamespace(bench_n=300, bench_sizes=[64, 256], softmax_bench_shapes=[(4, 8)])
    ev = tmp_path / "relu.jsonl"
    harness.run_topic("relu", harness.Events(ev), sizes, warmup=0, rep=1)
    rows, failed, sweep, notes = brun.merge(harness.read_events(ev))
    assert [r["variant"] for r in rows] == ["test right"]
    assert rows[0]["shape"] == [300] and rows[0]["median_ms"] > 0
    assert [(f["variant"], f["status"]) for f in failed] == [("test wrong", "failed check"),
                                                             ("test limited", "unsupported")]
    assert "test wrong" not in timed and "test limited" not in timed and "test right" in timed
    assert sorted(sweep) == ["test right"] and [n for n, _ in sweep["test right"]] == [64, 256]


def test_demo_versions_are_not_benchmarked():
    mod = SimpleNamespace(DEMO_ONLY=("v0",))
    assert harness.is_demo_only(mod, "v0", "one thread per element", None)
    assert harness.is_demo_only(SimpleNamespace(), "v0", "Demo only: a racy sum", None)
    assert not harness.is_demo_only(SimpleNamespace(), "v1", "one thread per element", None)


def test_a_crashed_worker_is_resumed_without_the_culprit():
    events = [
        dict(event="start", key="cuda v1@256"), dict(event="row", key="cuda v1@256"),
        dict(event="start", key="cuda v2@256"),  # the worker died here
        dict(event="failed", key="numba v0@*"),
        dict(event="start", key="sweep:cuda v1@64"), dict(event="point", key="sweep:cuda v1@64"),
    ]
    skip, open_keys = brun.skip_set(events)
    assert open_keys == ["cuda v2@256"]
    assert {"cuda v1@256", "numba v0@*", "sweep:cuda v1@64"} <= skip


# --------------------------------------------------------------------------------------
# Targets and the summary
# --------------------------------------------------------------------------------------
def test_targets_met_and_missed():
    rows = [
        _row("relu", "cuda v2", "cuda", "v2", [1 << 28], 0.72, 2960.0, 0.96, reference=True),
        _row("relu", "triton v1", "triton", "v1", [1 << 28], 0.8, 2700.0, 0.90, reference=True),
        _row("softmax", "triton v1", "triton", "v1", [1024, 65536], 0.3, 2300.0, 0.77, reference=True),
        _row("softmax", "torch", "torch", "eager", [1024, 65536], 0.5, 1460.0, 0.49),
    ]
    t = {(x["topic"], x["lang"], x["unit"]): x for x in report.evaluate_targets(rows, ["relu", "softmax"])}
    assert t[("relu", "cuda", "fraction_of_copy")]["met"] is True
    assert t[("relu", "triton", "fraction_of_copy")]["met"] is False
    assert t[("relu", "numba", "fraction_of_copy")]["met"] is None  # not measured
    assert t[("softmax", "triton", "ratio_to_torch")]["value"] == pytest.approx(2300 / 1460)
    assert t[("softmax", "triton", "gbps")]["met"] is True
    md = report.markdown(dict(machine=dict(gpu="GPU X"), rows=rows, targets=list(t.values()),
                              failed=[], copy=dict(gbps=3000.0, shape=[1 << 28])))
    assert "**missed**" in md and "GPU X" in md and "3,000 GB/s" in md


def test_a_target_timed_side_by_side_is_the_median_of_its_rounds(tmp_path, monkeypatch):
    """A kernel's target against its baseline at one shape is timed again in alternation; its
    value is the median of the rounds' ratios, the single run's ratio kept beside it."""
    import triton.testing
    shape = (4096, 4096, 4096)
    mine = harness.Variant("hopper", "cuda v5", "cuda", "v5", "", True, lambda d=False: None)
    base = harness.Variant("hopper", "torch", "torch", "linear", "", False, lambda d=False: None)
    calls, times = [], iter([1.0, 0.8, 1.0, 0.95, 1.0, 0.92, 1.0, 0.93, 1.0, 0.5])  # kernel, baseline, ...
    fns = {"cuda v5": lambda *x: calls.append("cuda v5"), "torch": lambda *x: calls.append("torch")}

    def fake_bench(fn, warmup, rep):
        fn()
        return next(times)

    monkeypatch.setattr(triton.testing, "do_bench", fake_bench)
    monkeypatch.setattr(TOPICS["hopper"], "inputs", lambda shape, seed=0, device=None: (None, None))
    ev = tmp_path / "hopper.jsonl"
    harness.paired_targets("hopper", [mine, base], fns, harness.Events(ev), [shape])
    assert calls == ["cuda v5", "torch"] * harness.PAIRED_ROUNDS   # alternating, one target: cuda at 4096^3
    events = harness.read_events(ev)
    assert brun.skip_set(events)[0] == {"paired:cuda v5@4096x4096x4096"}  # a resumed worker does not redo it
    events = [dict(event="row", key="cuda v5@4096x4096x4096",
                   **_row("hopper", "cuda v5", "cuda", "v5", list(shape), 1.0, 850.0, 0.2, reference=True)),
              dict(event="row", key="torch@4096x4096x4096",
                   **_row("hopper", "torch", "torch", "linear", list(shape), 0.85, 1000.0, 0.24))] + events
    rows, _, _, _ = brun.merge(events)
    assert rows[0]["paired"]["ratios"] == pytest.approx([0.8, 0.95, 0.92, 0.93, 0.5])
    t = next(x for x in report.evaluate_targets(rows, ["hopper"]) if x["lang"] == "cuda" and x["shape"] == list(shape))
    assert t["value"] == pytest.approx(0.92) and t["met"] is True       # timed apart: 0.85x, missed
    assert t["paired"] == dict(rounds=5, low=0.5, high=0.95, single_run=pytest.approx(0.85))
    text = report._value_str(t)
    assert text.startswith("0.920x") and "median of 5 rounds" in text and "timed apart 0.850x" in text
    rows[0]["paired"]["baseline_version"] = "other"   # paired with another baseline: the single run stands
    t = next(x for x in report.evaluate_targets(rows, ["hopper"]) if x["lang"] == "cuda" and x["shape"] == list(shape))
    assert t["value"] == pytest.approx(0.85) and t["met"] is False and "paired" not in t
    rows[0]["paired"].update(baseline_version="linear", ratios=[])   # no rounds recorded: the same
    t = next(x for x in report.evaluate_targets(rows, ["hopper"]) if x["lang"] == "cuda" and x["shape"] == list(shape))
    assert t["value"] == pytest.approx(0.85) and "paired" not in t


def test_topics_bytes():
    assert TOPICS["relu"].nbytes((1 << 28,)) == 2 * 4 * (1 << 28)
    assert TOPICS["reduction"].nbytes((1024,)) == 4 * 1024 + 4
    assert TOPICS["softmax"].nbytes((1024, 65536)) == 2 * 4 * 1024 * 65536


@pytest.mark.slow
def test_simulated_dry_run_end_to_end(tmp_path):
    """The whole pipeline (workers, merge, JSON, summary, plots) on simulation sizes."""
    env = dict(os.environ, COURSE_SIMULATE="1", PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    p = subprocess.run([sys.executable, "-m", "benchmarks", "--simulated-dry-run", "--out", str(tmp_path),
                        "--topics", "relu", "--langs", "triton"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads((tmp_path / "simulated.json").read_text())
    assert data["simulated"] is True and data["copy"]["gbps"] > 0
    variants = {r["variant"] for r in data["rows"] if r["topic"] == "relu"}
    assert {"torch", "torch.compile"} <= variants and any(v.startswith("triton") for v in variants)
    assert (tmp_path / "simulated.md").read_text().startswith("# Simulated dry run")
    assert data["topic_commits"]["relu"]["date"] == data["date"]  # when each topic was measured
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    named = os.environ.get("COURSE_COMMIT", "").strip()  # a copy sent without its history names it
    if named or head.returncode == 0:  # the file names the code measured
        expected = named or head.stdout.strip()
        assert data["commit"] == expected and data["topic_commits"]["relu"]["commit"] == data["commit"]
        assert f"commit {data['commit'][:12]}" in (tmp_path / "simulated.md").read_text()
    assert (tmp_path / "simulated-relu.png").stat().st_size > 1000


def test_update_keeps_the_other_topics_and_the_copy_roofline(tmp_path):
    """``--update --topics softmax`` replaces softmax only; relu and the roofline stay."""
    copy = dict(topic="copy", variant="copy", gbps=2990.0)
    old = dict(copy=copy, date="d0", command="python -m benchmarks",
               rows=[copy, dict(topic="relu", lang="cuda", variant="cuda v2", gbps=3000.0),
                     dict(topic="softmax", lang="cuda", variant="cuda v4", gbps=2000.0),
                     dict(topic="softmax", lang="triton", variant="triton v4", gbps=1900.0),
                     dict(topic="softmax", lang="torch", variant="torch", gbps=1400.0)],
               failed=[dict(topic="softmax", lang="cuda", variant="cuda v2", status="unsupported")],
               sweeps={"copy": {}, "relu": {"torch": []}, "softmax": {"torch": [], "cuda v4": [], "triton v4": []}},
               notes=["softmax: numba v1 left out", "relu: something"])
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(old))
    kept = brun.load_kept(path, ["softmax"])
    assert [r["topic"] for r in kept["rows"]] == ["copy", "relu"]
    assert kept["failed"] == [] and kept["sweeps"]["softmax"] == {} and kept["sweeps"]["relu"]
    only_cuda = brun.load_kept(path, ["softmax"], ["cuda"])  # Triton's softmax rows stay
    assert [r["variant"] for r in only_cuda["rows"]] == ["copy", "cuda v2", "triton v4"]
    assert set(only_cuda["sweeps"]["softmax"]) == {"triton v4"}
    assert kept["notes"] == ["relu: something"] and kept["copy"] == copy
    assert kept["commit"] is None and kept["topic_commits"] == {}  # a file from before commits
    assert kept["topics"] == ["relu", "softmax"]
    assert brun.load_kept(tmp_path / "missing.json", ["softmax"]) is None


def test_recorded_launch_overhead_reads_the_file_and_survives_its_absence(tmp_path, capsys):
    rec = utils.recorded_launch_overhead()
    assert rec and all(us > 0 for us in rec.values())
    assert utils.recorded_launch_overhead(tmp_path / "missing.json") == {}
    assert "No recorded launch overhead" in capsys.readouterr().out


# --------------------------------------------------------------------------------------
# Which commit was measured
# --------------------------------------------------------------------------------------
def _git_repo(path: Path) -> Path:
    def git(*args):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)
    path.mkdir()
    git("init", "-q")
    (path / "kernel.cu").write_text("// v1\n")
    (path / "benchmarks" / "results" / "records").mkdir(parents=True)
    git("add", "kernel.cu")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return path


def test_source_commit_names_head_and_uncommitted_code(tmp_path, monkeypatch):
    repo = _git_repo(tmp_path / "course")
    monkeypatch.setattr(ub, "ROOT", repo)
    monkeypatch.delenv(ub.COMMIT_ENV, raising=False)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert utils.source_commit() == {"commit": head, "commit_dirty": False}
    # A results file written by the run does not make the measured code differ ...
    (repo / "benchmarks" / "results" / "records" / "h100.json").write_text("{}")
    assert utils.source_commit()["commit_dirty"] is False
    # ... an edited kernel does, and the label says so.
    (repo / "kernel.cu").write_text("// v2\n")
    info = utils.source_commit()
    assert info == {"commit": head, "commit_dirty": True}
    assert utils.commit_str(info) == f"commit {head[:12]} plus uncommitted changes"


def test_source_commit_from_the_environment_or_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(ub, "ROOT", tmp_path)  # no git history here
    monkeypatch.delenv(ub.COMMIT_ENV, raising=False)
    assert utils.source_commit() == {"commit": None, "commit_dirty": None}
    assert utils.commit_str(utils.source_commit()).startswith("commit unknown")
    monkeypatch.setenv(ub.COMMIT_ENV, "ABCDEF1234567")
    assert utils.source_commit() == {"commit": "abcdef1234567", "commit_dirty": None}
    monkeypatch.setenv(ub.COMMIT_ENV, "main")
    with pytest.raises(ValueError, match="COURSE_COMMIT must be a git commit hash"):
        utils.source_commit()


def test_recorded_commit_is_shown_per_topic(results_file, capsys):
    data = json.loads(results_file.read_text())
    # A file recorded before results named their commit: unknown, never guessed.
    assert utils.recorded_commit(path=results_file) is None
    assert utils.recorded_label(path=results_file) == (
        "NVIDIA H100 80GB HBM3, 2026-01-31, commit unknown")
    full, redo = "1" * 40, "2" * 40
    data.update(commit=full, commit_dirty=False,
                topic_commits={"relu": dict(commit=full, commit_dirty=False),
                               "softmax": dict(commit=redo, commit_dirty=True)})
    results_file.write_text(json.dumps(data))
    assert utils.recorded_commit(path=results_file) == full
    assert utils.recorded_commit("softmax", path=results_file) == redo
    assert utils.recorded_machine(path=results_file)["commit"] == full
    assert utils.recorded_label("softmax", path=results_file).endswith(
        "commit 222222222222 plus uncommitted changes")
    # a topic re-measured later (--update) carries the date of that run, the others the file's
    data["notes"] = data.get("notes", []) + ["layernorm, softmax re-measured on 2026-02-03T10:00:00Z at commit 2"]
    results_file.write_text(json.dumps(data))
    assert "2026-02-03" in utils.recorded_label("softmax", path=results_file)
    assert "2026-01-31" in utils.recorded_label("relu", path=results_file)
    utils.show_recorded("relu", path=results_file)
    assert "commit 111111111111;" in capsys.readouterr().out
    md = report.markdown(data)
    assert "measured at commit 111111111111" in md
    assert "Re-measured later: softmax at commit 222222222222 plus uncommitted changes" in md


def test_update_of_the_sweep_only_keeps_the_main_rows(tmp_path):
    """``--update --sweep-only --topics attention`` (a topic measured in two sittings): the
    attention rows of the main shapes stay, its sweep rows are measured again."""
    main = dict(topic="attention", lang="triton", variant="triton v3 [float16, full, forward]", sweep=False)
    swept = dict(topic="attention", lang="triton", variant="triton v3 [float16, full, forward]", sweep=True)
    base = dict(topic="attention", lang="torch", variant="SDPA flash [float16, full, forward]", sweep=True)
    fail = dict(topic="attention", lang="cuda", variant="cuda v1 [float16, full, forward]", status="unsupported",
                sweep=False)
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(dict(rows=[main, swept, base], failed=[fail], sweeps={}, notes=[])))
    kept = brun.load_kept(path, ["attention"], sweeps_only=True)
    assert kept["rows"] == [main] and kept["failed"] == [fail]
    assert brun.load_kept(path, ["attention"])["rows"] == []
    with pytest.raises(SystemExit):
        brun.main(["--topics", "softmax", "--sweep-only"])  # a topic whose sweep needs its main shapes


def test_a_missed_target_says_why(monkeypatch):
    """A target's ``if_missed`` reason goes with it where it is missed, and only there."""
    from utils.topics._spec import Target
    monkeypatch.setattr(report, "TARGETS", [("relu", Target("triton", "copy", 0.95, if_missed="no vector loads")),
                                            ("relu", Target("cuda", "copy", 0.95, if_missed="unused"))])
    rows = [_row("relu", "cuda v2", "cuda", "v2", [1 << 28], 0.72, 2960.0, 0.99, reference=True),
            _row("relu", "triton v1", "triton", "v1", [1 << 28], 0.8, 2700.0, 0.90, reference=True)]
    t = {x["lang"]: x for x in report.evaluate_targets(rows, ["relu"])}
    assert t["triton"]["why"] == "no vector loads" and "why" not in t["cuda"]
    md = report.markdown(dict(machine=dict(gpu="GPU X"), rows=rows, targets=list(t.values()), failed=[],
                              copy=dict(gbps=3000.0, shape=[1 << 28])))
    assert "**missed**: no vector loads" in md


# --------------------------------------------------------------------------------------
# Source hashes: a recorded figure knows which version of the kernels it measured
# --------------------------------------------------------------------------------------
def test_every_recorded_topic_carries_the_hash_of_its_sources():
    data = json.loads((utils.RECORDS_DIR / "h100.json").read_text())
    recorded = {r["topic"] for r in data["rows"] if r.get("topic") != "copy"}
    hashes = data.get("topic_sources") or {}
    missing = sorted(t for t in recorded if not (hashes.get(t) or {}).get("hash"))
    assert not missing, f"h100.json has rows of {missing} without topic_sources hashes"
    for t in recorded:
        assert f"utils/topics/{t}.py" in hashes[t]["files"], t
        assert any(f.startswith("kernels/") for f in hashes[t]["files"]), t


def test_stale_topics_follow_the_sources(tmp_path, capsys):
    """A kernel file edited after the record marks its topic, and only it, stale; --stale lists it."""
    from utils import sources
    root = tmp_path / "course"
    files = {"utils/topics/relu.py": "spec", "kernels/cuda/relu.py": 'SOURCE = "relu.cu"\n',
             "kernels/cuda/relu.cu": '#include "common.h"\n', "kernels/cuda/common.h": "h",
             "kernels/triton/relu.py": "from kernels.cuda.relu import SOURCE\n",
             "utils/topics/gelu.py": "spec", "kernels/numba/gelu.py": "g"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    read = sources._reader(root)
    assert sources.topic_files("relu", read) == sorted(f for f in files if "gelu" not in f)
    data = dict(rows=[dict(topic="relu"), dict(topic="gelu")],
                topic_sources={t: sources.topic_hash(t, read) for t in ("relu", "gelu")})
    assert sources.stale_topics(data, ["relu", "gelu"], read) == {}
    (root / "kernels/cuda/common.h").write_text("h changed")  # an included header counts
    stale = sources.stale_topics(data, ["relu", "gelu", "softmax"], read)
    assert set(stale) == {"relu", "softmax"} and "changed" in stale["relu"] and stale["softmax"] == "never recorded"
    # the command line, and the note a notebook shows, on the real results file
    path = tmp_path / "h100.json"
    real = json.loads((utils.RECORDS_DIR / "h100.json").read_text())
    real["topic_sources"]["relu"] = sources.topic_hash("relu")
    real["topic_sources"]["gelu"] = {"hash": "0" * 16, "files": []}
    path.write_text(json.dumps(real))
    assert brun.main(["--stale", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gelu: sources changed" in out and "relu:" not in out
    assert ub.stale_note("relu", path) is None
    assert ub.stale_note("gelu", path).startswith("measured on an earlier version of this kernel")
    ub.show_recorded("gelu", path)
    assert "measured on an earlier version of this kernel" in capsys.readouterr().out
    assert "earlier version" in ub.recorded_label("gelu", path)


def test_topic_files_follow_every_import_and_the_frame(tmp_path):
    """Imports one after the other, an import in parentheses over several lines (its comments
    with parentheses of their own) and the topic's frame are all among the topic's files."""
    from utils import sources
    from utils.topics import TOPICS as ALL_TOPICS
    root = tmp_path / "course"
    files = {"utils/topics/relu.py": "spec", "kernels/_launch.py": "", "kernels/cuda/common.h": "h",
             "kernels/cuda/relu.py": "from kernels._launch import cdiv\nfrom kernels.cuda.helper import k\n",
             "kernels/cuda/helper.py": 'SOURCE = "relu.cu"\n', "kernels/cuda/relu.cu": '#include "common.h"\n',
             "kernels/frames/relu.py": "",  # the frame counts even where no language imports it
             "kernels/numba/relu.py": ("from kernels.frames.shared import (  # the rules (defined once)\n"
                                       "    a,  # noqa: F401  (importable)\n    b,\n)\n"
                                       "from kernels.frames import extra as x\n"),
             "kernels/frames/shared.py": "", "kernels/frames/extra.py": "",
             "kernels/triton/gelu.py": "from kernels.frames.gelu import g\n", "kernels/frames/gelu.py": ""}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    got = sources.topic_files("relu", sources._reader(root))
    assert got == sorted(f for f in files if "gelu" not in f)
    # the course's own topics: each with its frame; matmul_fp16's kernel is matmul.cu's
    for topic in ALL_TOPICS:
        assert f"kernels/frames/{topic}.py" in sources.topic_files(topic), topic
    assert {"kernels/cuda/matmul.cu", "kernels/frames/matmul.py"} <= set(sources.topic_files("matmul_fp16"))


# --------------------------------------------------------------------------------------
# The layout: the command at the top, the other scripts in rooms, results by kind
# --------------------------------------------------------------------------------------
#: benchmarks/'s own files at its top: the `python -m benchmarks` command and its modules.
CORE = {"__init__.py", "__main__.py", "run.py", "harness.py", "topics.py", "report.py", "validation.py",
        "attention.py", "layernorm.py", "matmul_fp16.py", "rerecord_gpu_run.sh"}
ROOMS = ("tune", "lessons", "simulators")


def test_the_command_is_at_the_top_and_every_other_script_in_a_room():
    top = ROOT / "benchmarks"
    files = {p.name for p in top.iterdir() if p.is_file()}
    assert files == CORE, f"move these into a room (tune/, lessons/, simulators/): {sorted(files - CORE)}"
    folders = {p.name for p in top.iterdir() if p.is_dir() and p.name != "__pycache__" and not p.name.startswith(".")}
    assert folders == {*ROOMS, "results"}


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_indexes_its_scripts_and_names_them_by_the_rule(room):
    folder = ROOT / "benchmarks" / room
    index = importlib.import_module(f"benchmarks.{room}").__doc__
    scripts = sorted(p for p in folder.iterdir() if p.suffix in (".py", ".sh") and p.name != "__init__.py")
    assert scripts, room
    for p in scripts:
        # lower_snake_case, named for what it measures: no lesson number, no "bench", no "_gpu"
        # that only says where it runs ("_vs_gpu" is a measurement); a GPU session is
        # <subject>_gpu_run.sh
        stem = p.stem[:-len("_gpu_run")] if p.suffix == ".sh" else p.stem
        assert p.suffix == ".py" or p.stem.endswith("_gpu_run"), p.name
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", stem), p.name
        assert not re.search(r"lesson|bench|(?<!_vs)_gpu(_|$)", stem), p.name
        # listed in the room's index, at the start of a line
        name = p.name if p.suffix == ".sh" else p.stem
        assert re.search(rf"^\s+{re.escape(name)}\s", index, re.M), f"{p.name} is missing from {room}/__init__.py"


def test_results_are_grouped_by_kind():
    kinds = {utils.RECORDS_DIR, utils.LESSON_RESULTS_DIR, utils.SIMULATOR_RESULTS_DIR, utils.TUNE_RESULTS_DIR,
             utils.VALIDATION_DIR}
    assert {k.parent for k in kinds} == {utils.RESULTS_DIR}
    top = {p for p in utils.RESULTS_DIR.iterdir() if not p.name.startswith(".")}
    assert top == kinds, f"not in a kind's folder: {sorted(p.name for p in top - kinds)}"
    # every GPU's record is in records/, and only there
    for kind in kinds - {utils.RECORDS_DIR}:
        assert not utils.recorded_gpus(kind), kind
    assert {g["machine"] for g in utils.recorded_gpus()} >= {"h100", "h200"}
    assert {p.name for p in utils.VALIDATION_DIR.iterdir()} >= {"cpu-validation.txt", "h100-validation.txt"}


def test_an_update_cut_short_keeps_the_earlier_numbers_and_stays_stale():
    """``--update`` out of time: a topic it never started keeps all its earlier rows, one it
    finished in part keeps the earlier rows it has no new ones for; neither gets this run's
    commit or source hash, so ``--stale`` still lists them."""
    from benchmarks import run as brun

    def row(topic, variant, shape, gbps):
        return dict(topic=topic, variant=variant, lang=variant.split()[0], shape=shape, gbps=gbps)

    old = dict(rows=[row("attention", "triton v3", [1, 2], 1.0), row("attention", "torch sdpa", [1, 2], 2.0),
                     row("layernorm", "cuda v5", [4, 4], 3.0), row("layernorm", "triton v3", [4, 4], 4.0)],
               failed=[dict(topic="layernorm", variant="numba v2", shape=[4, 4], reason="unsupported")],
               sweeps={"layernorm": {"triton v3": [[16, 1.0]]}},
               topic_commits={"attention": {"commit": "old-a"}, "layernorm": {"commit": "old-l"}},
               topic_sources={"attention": {"hash": "ha"}, "layernorm": {"hash": "hl"}},
               notes=["attention: an earlier note"])
    new = dict(rows=[row("layernorm", "cuda v5", [4, 4], 30.0)], failed=[], sweeps={}, notes=[],
               topic_commits={"attention": {"commit": "new"}, "layernorm": {"commit": "new"}},
               topic_sources={"attention": {"hash": "new"}, "layernorm": {"hash": "new"}})
    brun.keep_unmeasured(new, old, "attention", rows=[])
    brun.keep_unmeasured(new, old, "layernorm", rows=list(new["rows"]))
    got = {(r["topic"], r["variant"]): r["gbps"] for r in new["rows"]}
    assert got == {("attention", "triton v3"): 1.0, ("attention", "torch sdpa"): 2.0,
                   ("layernorm", "cuda v5"): 30.0, ("layernorm", "triton v3"): 4.0}  # new where measured
    assert new["topic_commits"] == old["topic_commits"] and new["topic_sources"] == old["topic_sources"]
    assert new["failed"] == old["failed"] and new["sweeps"] == old["sweeps"]
    assert new["notes"] == ["attention: an earlier note"]
    # with no earlier record, a topic cut short claims no commit or hash at all
    fresh = dict(rows=[], failed=[], sweeps={}, notes=[], topic_commits={"softmax": {}}, topic_sources={"softmax": {}})
    brun.keep_unmeasured(fresh, None, "softmax", rows=[])
    assert fresh["topic_commits"] == {} and fresh["topic_sources"] == {}


def test_an_update_without_sweeps_keeps_the_earlier_sweeps(tmp_path):
    from benchmarks import run as brun
    old = dict(rows=[dict(topic="relu", variant="triton v1", lang="triton", shape=[8], gbps=1.0),
                     dict(topic="relu", variant="triton v1", lang="triton", shape=[64], gbps=2.0, sweep=True)],
               failed=[], sweeps={"relu": {"triton v1": [[64, 2.0]]}}, notes=[])
    (tmp_path / "gpu.json").write_text(json.dumps(old))
    kept = brun.load_kept(tmp_path / "gpu.json", ["relu"], keep_sweeps=True)
    assert kept["sweeps"] == old["sweeps"] and [r["shape"] for r in kept["rows"]] == [[64]]
    dropped = brun.load_kept(tmp_path / "gpu.json", ["relu"])  # a run that measures the sweeps again
    assert dropped["sweeps"] == {"relu": {}} and dropped["rows"] == []


def test_matmul_worker_adds_checked_bfloat16_rows(tmp_path, monkeypatch):
    """The matmul_fp16 worker: the harness's float16 rows, then bfloat16 rows of the Triton
    versions and cuBLAS, each version checked first; a wrong bfloat16 product is not timed, and
    the bfloat16 targets compare the reference row with torch.mm's."""
    from benchmarks import matmul_fp16 as mm
    sizes = brun.sizes_for(quick=True)
    monkeypatch.setattr(harness, "run_topic", lambda *a, **k: None)   # the float16 part: tested above
    wrong = ("triton wrong", "triton", "wrong", "drops the last column", False,
             lambda a, b: torch.cat([(a @ b)[:, :-1], torch.zeros(a.shape[0], 1, dtype=a.dtype, device=a.device)], 1))
    monkeypatch.setattr(mm, "contenders", lambda real=mm.contenders: real() + [wrong])
    ev = tmp_path / "events.jsonl"
    mm.run_topic(harness.Events(ev), sizes, languages=["triton"], warmup=0, rep=1)
    events = harness.read_events(ev)
    rows = [e for e in events if e["event"] == "row"]
    assert {r["variant"] for r in rows} >= {"triton v2 [bfloat16]", "triton v3 [bfloat16]", "torch [bfloat16]"}
    assert all(r["dtype"] == "bfloat16" and r["tflops"] > 0 for r in rows)
    bad = [e for e in events if e["event"] == "failed" and e["variant"] == "triton wrong [bfloat16]"]
    assert bad and "values wrong" in bad[0]["reason"] and not any(r["variant"].startswith("triton wrong") for r in rows)
    shape = (4096, 4096, 4096)
    fake = [dict(topic="matmul_fp16", lang="triton", variant="triton v3 [bfloat16]", reference=True, dtype="bfloat16",
                 shape=list(shape), median_ms=1.0),
            dict(topic="matmul_fp16", lang="torch", variant="torch [bfloat16]", reference=False, dtype="bfloat16",
                 shape=list(shape), median_ms=0.95)]
    got = {tuple(t["shape"]): t for t in mm.evaluate(fake)}
    assert got[shape]["value"] == pytest.approx(0.95) and got[shape]["met"] is True
    assert got[(4095, 4097, 4093)]["met"] is None   # not measured


def test_a_missed_layernorm_target_says_whether_the_host_or_the_kernel_set_its_time():
    from benchmarks import layernorm as bl
    row = dict(median_ms=0.100, fraction_of_copy=0.40, host_us=95.0, graph_ms=0.050)
    why = bl._host_why(row)
    assert "95 us" in why and "50 us" in why and "80% of copy" in why and "the host, not the kernel" in why
    row.update(graph_ms=0.098)
    assert "the kernel itself sets the time" in bl._host_why(row)
    assert bl._host_why(dict(median_ms=0.1)) is None  # measured without the probes: no claim
    assert "host time is 95 us" in bl._host_why(dict(median_ms=0.1, host_us=95.0, graph_ms=None))


def test_a_host_bound_forward_says_so_before_the_copy_of_its_bytes():
    from benchmarks import layernorm as bl
    copy = dict(**{"pass": "copy"}, dtype="bfloat16", shape=[8, 8], fraction_of_copy=0.8, gbps=800.0)
    row = dict(median_ms=0.047, fraction_of_copy=0.34, gbps=340.0, host_us=65.0, graph_ms=0.024)
    assert "the host, not the kernel" in bl._why("forward", "bfloat16", (8, 8), [copy], row)
    row.update(graph_ms=0.046)  # the kernel's own time: the copy of the same bytes is the comparison
    assert "a plain copy of the same bytes" in bl._why("forward", "bfloat16", (8, 8), [copy], row)

