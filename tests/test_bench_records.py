"""One record per GPU: which record a topic's numbers come from, the GPU's name, and whether a
GPU validation call is due (``python -m benchmarks --stale``)."""
from __future__ import annotations

import importlib
import json
import subprocess
from pathlib import Path

import pytest

import utils
from benchmarks import run as brun
from benchmarks import validation

ub = importlib.import_module("utils.bench")  # the module (utils.bench is the function)
ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "benchmarks" / "results" / "records"


def _row(topic, variant, gbps, **kw):
    return dict(topic=topic, variant=variant, lang=variant.split()[0], version="v1", reference=True,
                shape=[1 << 20], bytes=8 << 20, median_ms=1.0, p20_ms=0.9, p80_ms=1.1, gbps=gbps,
                fraction_of_copy=gbps / 1000, **kw)


def _record(folder: Path, name: str, gpu: str, date: str, copy: float, topics: dict, **extra) -> Path:
    """A GPU's record with one row per topic (``{topic: GB/s}``)."""
    copy_row = _row("copy", "copy", copy)
    data = dict(schema=1, machine=dict(name=name, gpu=gpu), date=date, commit="a" * 40, copy=copy_row,
                rows=[copy_row] + [_row(t, "triton v1", g) for t, g in topics.items()], failed=[],
                sweeps={}, notes=[], targets=[dict(topic=t, lang="triton", variant="triton v1", shape=[1 << 20],
                                                   goal=">= 1 GB/s", value=g, threshold=1.0, unit="gbps",
                                                   met=True) for t, g in topics.items()])
    data.update(extra)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def two_gpus(tmp_path, monkeypatch):
    """An H100 record (relu, softmax, attention; softmax re-measured later with --update) and
    a newer H200 record (relu, softmax), plus files that are not GPU records."""
    h100 = _record(tmp_path, "h100", "NVIDIA H100 80GB HBM3", "2026-01-01T00:00:00Z", 3000.0,
                   {"relu": 100.0, "softmax": 101.0, "attention": 102.0},
                   sweeps={"relu": {"triton v1": [[4096, 10.0]]}},
                   notes=["softmax re-measured on 2026-03-01T00:00:00Z at commit bbbbbbbbbbbb with `...`"])
    h200 = _record(tmp_path, "h200", "NVIDIA H200", "2026-02-01T00:00:00Z", 4200.0,
                   {"relu": 200.0, "softmax": 201.0},
                   topic_commits={"relu": dict(commit="c" * 40, commit_dirty=False, date="2026-02-01T00:00:00Z"),
                                  "softmax": dict(commit="c" * 40, commit_dirty=False, date="2026-02-01T00:00:00Z")})
    # not records: a smoke test, a dry run, a lesson's own file without a schema
    _record(tmp_path, "h200-quick", "NVIDIA H200", "2027-01-01T00:00:00Z", 1.0, {"relu": 1.0})
    _record(tmp_path, "simulated", "none", "2027-01-01T00:00:00Z", 1.0, {"relu": 1.0}, simulated=True)
    (tmp_path / "h100-lesson11.json").write_text(json.dumps({"date": "2027-01-01", "rows": [_row("relu", "x", 1.0)]}))
    monkeypatch.setattr(ub, "RECORDS_DIR", tmp_path)
    return h100, h200


def test_each_topic_comes_from_its_most_recent_record(two_gpus, capsys):
    h100, h200 = two_gpus
    assert [(r["machine"], r["gpu"], r["path"]) for r in utils.recorded_gpus()] == [
        ("h100", "H100", h100), ("h200", "H200", h200)]   # the H100's --update of March is the newest
    assert utils.recorded_gpus()[0]["date"] == "2026-03-01T00:00:00Z"
    # relu: both GPUs have it, the H200's is newer; attention: only the H100 has it;
    # softmax: the H100 re-measured it after the H200's run (the note of that --update)
    assert utils.recorded_file("relu") == h200 and utils.recorded_gpu("relu") == "H200"
    assert utils.recorded_file("attention") == h100 and utils.recorded_gpu("attention") == "H100"
    assert utils.recorded_file("softmax") == h100
    assert [r["gbps"] for r in utils.recorded("relu")] == [200.0]
    assert [r["gbps"] for r in utils.recorded("attention")] == [102.0]
    # the roofline, targets, machine and label of the same record
    assert utils.copy_roofline(topic="relu") == 4200.0
    assert utils.copy_roofline(topic="attention") == 3000.0
    assert utils.recorded_targets("relu")[0]["value"] == 200.0
    assert utils.recorded_machine(topic="relu")["record"] == "h200.json"
    assert utils.recorded_label("relu") == "NVIDIA H200, 2026-02-01, commit cccccccccccc"
    assert utils.recorded_label("softmax").startswith("NVIDIA H100 80GB HBM3, 2026-03-01")
    # without a topic: the record measured most recently
    assert utils.recorded_gpu() == "H100" and utils.copy_roofline() == 3000.0
    # a path given is that file
    assert [r["gbps"] for r in utils.recorded("relu", path=h100)] == [100.0]
    assert utils.recorded_gpu("relu", path=h100) == "H100"
    assert capsys.readouterr().out == ""


def test_a_topic_date_of_its_own_wins_over_the_files(two_gpus):
    h100, h200 = two_gpus
    data = json.loads(h200.read_text())
    data["topic_commits"]["softmax"]["date"] = "2026-04-01T00:00:00Z"   # an --update of softmax in April
    h200.write_text(json.dumps(data))
    assert utils.recorded_file("softmax") == h200 and utils.recorded_gpu("softmax") == "H200"
    assert "2026-04-01" in utils.recorded_label("softmax")


def test_tables_name_the_gpu_of_the_record_used(two_gpus, capsys):
    utils.show_recorded("attention")
    assert capsys.readouterr().out.startswith("Recorded on NVIDIA H100 80GB HBM3; recorded 2026-01-01")
    utils.show_recorded("relu")
    out = capsys.readouterr().out
    assert out.startswith("Recorded on NVIDIA H200;") and "copy roofline: 4,200 GB/s" in out
    utils.show_targets("relu")
    assert capsys.readouterr().out.startswith("relu targets, recorded on NVIDIA H200, 2026-02-01")
    utils.show_results("relu")
    assert "recorded on NVIDIA H200, 2026-02-01" in capsys.readouterr().out.splitlines()[0]
    live = ub.BenchResult("triton v1", 3.0, 2.9, 3.1, 0.01, 32768, True)
    utils.compare(live, "attention")
    assert "Recorded on NVIDIA H100 80GB HBM3" in capsys.readouterr().out
    rows = utils.compare_runs("relu", shape=(1 << 20,))     # every GPU's record of the topic
    assert [r["file"] for r in rows] == ["h200.json", "h100.json"]


def test_a_sweep_comes_from_the_most_recent_record_that_has_one(two_gpus, capsys):
    h100, h200 = two_gpus
    # relu's numbers come from the H200, which has no sweep: the sweep is the H100's
    assert utils.recorded_file("relu") == h200 and utils.recorded_file("relu", sweep=True) == h100
    assert utils.recorded_sweep("relu") == {"triton v1": [(4096, 10.0)]}
    assert utils.recorded_sweep("relu", h200) == {}
    assert "No recorded size sweep for 'relu' in h200.json." in capsys.readouterr().out


def test_nothing_recorded(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ub, "RECORDS_DIR", tmp_path)
    assert utils.recorded_gpus() == [] and utils.recorded_gpu() is None and utils.recorded_gpu("relu") is None
    assert utils.recorded_file("relu") is None and utils.recorded_label("relu") is None
    assert utils.recorded("relu") == [] and utils.copy_roofline(topic="relu") is None
    assert "No recorded GPU results" in capsys.readouterr().out


@pytest.mark.parametrize("name, short, slug", [
    ("NVIDIA H200", "H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "H100", "h100"),
    ("NVIDIA A100-SXM4-80GB", "A100", "a100"),
    ("NVIDIA L40S", "L40S", "l40s"),
    ("Tesla T4", "T4", "t4"),
    ("NVIDIA GH200 480GB", "GH200", "gh200"),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090", "geforce-rtx-4090"),
])
def test_gpu_names(name, short, slug):
    assert utils.gpu_short_name(name) == short
    assert utils.gpu_slug(name) == brun.gpu_slug(name) == slug


def test_the_validation_script_names_its_summary_by_the_same_rule():
    script = (ROOT / ".ci" / "gpu-validate.sh").read_text()
    body = "\n".join(ln for ln in script.splitlines() if not ln.startswith("#"))
    assert "gpu_slug" in body and "-validation.txt" in body and "h100" not in body
    assert "code: " in body


def test_the_refusal_without_a_gpu_lists_every_record(two_gpus):
    text = brun.records_line(two_gpus[0].parent)
    assert text.index("h100.json") < text.index("h200.json")     # newest first
    assert "NVIDIA H200" in text and "h100-lesson11" not in text and "quick" not in text


# ---------------------------------------------------------------------------------------
# Existing callers: the H100's record is still read where they ask for it
# ---------------------------------------------------------------------------------------
def test_existing_callers_still_read_the_h100_record():
    assert utils.RESULTS_FILE == REAL / "h100.json"
    data = json.loads(utils.RESULTS_FILE.read_text())
    assert utils.recorded_gpu(path=utils.RESULTS_FILE) == "H100"
    assert utils.recorded_machine(utils.RESULTS_FILE)["gpu"] == data["machine"]["gpu"]
    assert utils.copy_roofline(utils.RESULTS_FILE) == data["copy"]["gbps"]
    relu = [r for r in data["rows"] if r["topic"] == "relu"]
    assert utils.recorded("relu", path=utils.RESULTS_FILE) == relu
    # a topic that only the H100 measured comes from its record by default
    only_h100 = {r["topic"] for r in data["rows"]} - {t for g in utils.recorded_gpus() if g["machine"] != "h100"
                                                       for t in g["topics"]}
    for topic in only_h100:
        assert utils.recorded_file(topic) == utils.RESULTS_FILE and utils.recorded_gpu(topic) == "H100"


def test_the_real_records_follow_the_rule():
    """Each topic of the committed records comes from the record that measured it last."""
    records = {g["path"]: json.loads(g["path"].read_text()) for g in utils.recorded_gpus()}
    assert REAL / "h100.json" in records
    for topic in {t for g in utils.recorded_gpus() for t in g["topics"]}:
        dates = {p: ub._topic_date(d, topic) for p, d in records.items()
                 if any(r.get("topic") == topic for r in d["rows"] + d.get("failed", []))}
        assert utils.recorded_file(topic) == max(dates, key=dates.get), topic


# ---------------------------------------------------------------------------------------
# Is a GPU validation call due?
# ---------------------------------------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _summary(folder: Path, name: str, code: str, date: str = "2026-11-29T10:00Z") -> Path:
    path = folder / f"{name}-validation.txt"
    path.write_text(f"GPU validation run on NVIDIA H200: unit tests + ...\ncode: {code}\ndate: {date}\n"
                    "gpu: NVIDIA H200, 580.159.04, 143771 MiB\n")
    return path


@pytest.fixture
def course_repo(tmp_path):
    repo = tmp_path / "course"
    (repo / "kernels").mkdir(parents=True)
    (repo / "kernels" / "relu.py").write_text("v1\n")
    (repo / "README.md").write_text("readme\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return repo, _git(repo, "rev-parse", "HEAD").strip()


def test_validation_is_due_after_a_change_to_the_code(course_repo, tmp_path):
    repo, head = course_repo
    results = tmp_path / "results"
    results.mkdir()
    _summary(results, "h200", f"commit {head[:12]}")
    text, due = validation.validation_report(results, repo)
    assert due is False and "nothing under runtime/, kernels/" in text and f"commit {head[:12]}" in text
    (repo / "README.md").write_text("not code\n")                 # outside the five folders
    assert validation.validation_report(results, repo)[1] is False
    (repo / "kernels" / "relu.py").write_text("v2\n")             # edited, not committed
    (repo / "utils").mkdir()
    (repo / "utils" / "new.py").write_text("x\n")                 # new, not committed
    text, due = validation.validation_report(results, repo)
    assert due is True and "2 file(s)" in text and "(2 of them not committed yet)" in text
    assert "kernels/relu.py, utils/new.py" in text and "validation call is due" in text
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "two")
    text, due = validation.validation_report(results, repo)
    assert due is True and "2 file(s)" in text and "not committed" not in text
    # a newer summary at the new commit: nothing is due; the CPU's summary is not a GPU's
    _summary(results, "h100", f"commit {_git(repo, 'rev-parse', 'HEAD')[:12]}", date="2026-11-30T10:00Z")
    _summary(results, "cpu", "commit 0000000", date="2027-01-01T00:00Z")
    text, due = validation.validation_report(results, repo)
    assert due is False and "h100-validation.txt" in text


def test_validation_says_unknown_instead_of_guessing(course_repo, tmp_path):
    repo, head = course_repo
    results = tmp_path / "results"
    results.mkdir()
    _summary(results, "h200", "commit 0123456789ab")              # a commit this copy lacks
    text, due = validation.validation_report(results, repo)
    assert due is None and "unknown" in text
    _summary(results, "h200", f"commit {head[:12]}")
    text, due = validation.validation_report(results, tmp_path)   # no git repository there
    assert due is None and "unknown" in text
    _summary(results, "h200", "commit unknown")
    text, due = validation.validation_report(results, repo)
    assert due is None and "does not name the commit" in text
    (results / "h200-validation.txt").unlink()
    text, due = validation.validation_report(results, repo)
    assert due is True and "no <gpu>-validation.txt" in text


def test_the_h100_summary_names_the_commit_of_its_last_call():
    v = validation.read_validation(utils.VALIDATION_DIR / "h100-validation.txt")
    assert v["commit"] and len(v["commit"]) >= 7 and not v["dirty"]


def test_stale_reports_the_validation_with_an_older_commit_of_this_repo(tmp_path, capsys):
    """``--stale`` against a summary whose commit is an older real commit of the course."""
    last = subprocess.run(["git", "-C", str(ROOT), "log", "-n", "1", "--format=%H", "--", "kernels"],
                          capture_output=True, text=True)
    if last.returncode != 0 or not last.stdout.strip():
        pytest.skip("no git history of kernels/ in this copy")
    older = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", last.stdout.strip() + "^"],
                           capture_output=True, text=True)
    if older.returncode != 0:
        pytest.skip("this copy's git lacks the commit before the last change to kernels/ (a shallow clone)")
    commit = older.stdout.strip()
    _summary(tmp_path, "h200", f"commit {commit[:12]}")
    assert brun.main(["--stale", "--out", str(tmp_path), "--validation-dir", str(tmp_path)]) == brun.EXIT_OK
    out = capsys.readouterr().out
    paragraph = " ".join(out.split("\n\n")[-1].split())
    changed = validation.changes_since(commit[:12])["changed"]
    since = f"tested commit {commit[:12]}. Since then {len(changed)} file(s) under runtime/, kernels/"
    assert changed and since in paragraph
    assert "A validation call is due" in paragraph and changed[0] in paragraph


def test_recorded_gpu_file_takes_the_newest_gpu_that_has_the_file(two_gpus, tmp_path, monkeypatch):
    # the H100's record is the most recent (its softmax was re-measured after the H200's run);
    # both GPUs have ncu counters (simulators/), only the H200 a print-loss file (lessons/)
    lessons, sims = tmp_path / "lessons", tmp_path / "simulators"
    for kind, folder in (("LESSON_RESULTS_DIR", lessons), ("SIMULATOR_RESULTS_DIR", sims),
                         ("TUNE_RESULTS_DIR", tmp_path / "tune")):
        folder.mkdir(exist_ok=True)
        monkeypatch.setattr(ub, kind, folder)
    (lessons / "h200-print-loss.json").write_text("{}")
    (sims / "ncu-h100.json").write_text("{}")
    (sims / "ncu-h200.json").write_text("{}")
    assert [g["gpu"] for g in utils.recorded_gpus()] == ["H100", "H200"]
    assert utils.recorded_gpu_file("ncu-{gpu}.json") == (sims / "ncu-h100.json", "H100")
    assert utils.recorded_gpu_file("{gpu}-print-loss.json") == (lessons / "h200-print-loss.json", "H200")
    # a folder given is the only one looked in
    assert utils.recorded_gpu_file("{gpu}-print-loss.json", sims) == (None, None)
    assert utils.recorded_gpu_file("ncu-{gpu}.json", sims) == (sims / "ncu-h100.json", "H100")
    # the lesson11 file exists for the H100 only (beside the records); a GPU with no benchmark
    # record is named by its stem
    assert utils.recorded_gpu_file("{gpu}-lesson11.json") == (tmp_path / "h100-lesson11.json", "H100")
    (lessons / "b200-tf32.json").write_text("{}")
    assert utils.recorded_gpu_file("{gpu}-tf32.json") == (lessons / "b200-tf32.json", "B200")
    assert utils.recorded_gpu_file("{gpu}-nothing.txt") == (None, None)
    with pytest.raises(ValueError, match=r"\{gpu\}"):
        utils.recorded_gpu_file("h200-print-loss.json")


def test_every_lesson_reads_the_newest_gpu_recording():
    """A notebook names no GPU's file: it asks for the newest one (recorded_gpu_file,
    recorded_file), so that a re-recording on another GPU reaches every lesson."""
    import re
    pinned = re.compile(r"""["'](?:ncu-)?[ahbl]\d{2,4}[a-z]?[-.][\w.-]*["']""")
    hits = [f"{nb.name}: {m.group(0)}" for nb in sorted((ROOT / "notebooks").glob("*.ipynb"))
            for cell in json.loads(nb.read_text())["cells"] if cell["cell_type"] == "code"
            for m in pinned.finditer("".join(cell["source"]))]
    assert not hits, "notebooks read one GPU's file by name: " + "; ".join(hits)


def test_every_recording_a_lesson_reads_is_where_it_looks():
    """The files the notebooks read, by pattern (``utils.recorded_gpu_file``) or through a
    results folder's name (``utils.LESSON_RESULTS_DIR / "gpt-train.json"``), are there."""
    import re
    by_pattern = re.compile(r"""recorded_gpu_file\(\s*["']([^"']+)["']""")
    by_folder = re.compile(r"""utils\.([A-Z_]*(?:RESULTS|RECORDS|VALIDATION)_DIR)\s*/\s*["']([^"']+)["']""")
    read, missing = [], []
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"])
            for pattern in by_pattern.findall(src):
                read.append(pattern)
                if utils.recorded_gpu_file(pattern)[0] is None:
                    missing.append(f"{nb.name}: {pattern}")
            for folder, name in by_folder.findall(src):
                read.append(name)
                if not (getattr(utils, folder) / name).is_file():
                    missing.append(f"{nb.name}: utils.{folder} / {name!r}")
    assert len(read) >= 10, read   # the lessons read them: a pattern that no longer finds them reads nothing
    assert not missing, "notebooks read files that are not there: " + "; ".join(missing)


def test_a_call_that_failed_or_was_cut_short_is_no_validation(course_repo, tmp_path):
    """A summary at this very commit still leaves a validation due when its tests failed, or when
    its time budget stopped them (``BUDGET_S``)."""
    repo, head = course_repo
    results = tmp_path / "results"
    results.mkdir()

    def report_after(tail: str):
        path = _summary(results, "h200", f"commit {head[:12]}")
        path.write_text(path.read_text() + tail)
        return validation.validation_report(results, repo)

    text, due = report_after("wall time: 209 s with 16 workers; pytest exit code 1\n\n== summary ==\n"
                             "FAILED tests/test_lint.py::test_ruff_check_passes - AssertionError\n"
                             "1 failed, 2305 passed\n")
    assert due is True and "did not pass (pytest exit code 1; 1 failed, first tests/test_lint.py" in text
    text, due = report_after("wall time: 250 s with 16 workers; pytest exit code 124\n"
                             "cut short: BUDGET_S=250 s ran out before every test ran (what ran is counted below)\n")
    assert due is True and "cut short by its time budget" in text
    passed = report_after("wall time: 183 s with 15 workers; pytest exit code 0\n\n== summary ==\n2745 passed\n")
    assert passed[1] is False
