"""Prose must not contradict the recorded GPU results.

Numbers a cell can compute belong in cells (CONTRIBUTING.md), because recorded results change
when the benchmarks run again and typed-in prose does not. This test reads the prose a learner
reads (the markdown cells of notebooks/ and solutions/, README.md, CONTRIBUTING.md, docs/*.md)
and fails on:

* in a notebook, a speed ratio in words ("about half as fast", "3.1x slower", "twice as
  fast"): compute it in a cell from ``utils.recorded(...)`` instead (the markdown files
  describe CPU experiments in such words, and have no cells);
* a performance figure (GB/s, ms, µs, "% of copy" / "% of the roofline") that matches no
  value in a GPU's record (``benchmarks/results/records/<gpu>.json``: ``h100.json``, ``h200.json``,
  ...) or ``lessons/launch-overhead.json``: not a measured row,
  a copy roofline, a target's threshold, nor a recorded launch cost. A figure within 10% of
  a recorded value passes: re-recording moves numbers a little, a contradiction moves them more.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from utils import LESSON_RESULTS_DIR, RECORDS_DIR
from utils.bench import recorded_gpus

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.10

# "half as fast", "twice as slow", "3.1x slower", "3 times faster", "2× the speed"
RATIO = re.compile(
    r"(?i)\b(?:half|twice|a\s+third|(?:two|three|four|five|ten)\s+times|\d+(?:\.\d+)?\s*(?:[×x]|times))"
    r"\s+(?:as\s+(?:fast|slow|quick)|faster|slower|quicker|the\s+speed)\b")
# A number with a unit of speed or time. The number may carry thousands separators.
FIGURE = re.compile(
    r"(?i)(?<![\w.^])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s*"
    r"(GB/s|TB/s|ms\b|µs|us\b|%\s+of\s+(?:the\s+)?(?:copy|roofline))")


def _recorded_values() -> dict[str, list[float]]:
    """Every figure the results files hold, by unit: GB/s, ms, us and % of copy."""
    vals: dict[str, list[float]] = {"gbps": [], "ms": [], "us": [], "pct": []}
    records = [json.loads(r["path"].read_text()) for r in recorded_gpus(RECORDS_DIR)]
    assert records, f"no GPU's record in {RECORDS_DIR}"
    for data in records:
        rows = list(data.get("rows", [])) + [data.get("copy") or {}]
        for r in rows:
            vals["gbps"] += [r[k] for k in ("gbps",) if r.get(k) is not None]
            vals["ms"] += [r[k] for k in ("median_ms", "p20_ms", "p80_ms") if r.get(k) is not None]
            if r.get("fraction_of_copy") is not None:
                vals["pct"].append(100 * r["fraction_of_copy"])
        for t in data.get("targets", []):
            unit = t.get("unit")
            for v in (t.get("threshold"), t.get("value")):
                if v is None:
                    continue
                if unit == "fraction_of_copy":
                    vals["pct"].append(100 * v)
                elif unit == "gbps":
                    vals["gbps"].append(v)
    launch = json.loads((LESSON_RESULTS_DIR / "launch-overhead.json").read_text())
    for r in launch.get("per_launch", {}).values():
        vals["us"] += [r[k] for k in ("median_us", "min_us", "max_us") if r.get(k) is not None]
    return vals


def _unit(text: str) -> str:
    t = text.lower()
    if t.startswith("%"):
        return "pct"
    return {"gb/s": "gbps", "tb/s": "gbps", "ms": "ms", "µs": "us", "us": "us"}[t]


def contradictions(prose: str, recorded: dict[str, list[float]], ratios: bool = True) -> list[str]:
    """What in ``prose`` states a speed ratio (if ``ratios``), or a figure no results file holds."""
    found = [f"a speed ratio in words, {m.group(0)!r}: compute it in a cell"
             for m in (RATIO.finditer(prose) if ratios else ())]
    for m in FIGURE.finditer(prose):
        value = float(m.group(1).replace(",", ""))
        unit = _unit(m.group(2))
        if m.group(2).lower() == "tb/s":
            value *= 1000
        if not any(abs(value - v) <= TOLERANCE * abs(v) for v in recorded[unit]):
            found.append(f"{m.group(0)!r} matches no recorded value: read it from the results "
                         "in a cell, or correct it")
    return found


def _markdown_of(path: Path) -> list[tuple[str, str]]:
    """(where, text) of each piece of prose in a notebook or a markdown file."""
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text())
        return [(f"{path.relative_to(ROOT)} cell {i}", "".join(c["source"]))
                for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"]
    # Code blocks in a markdown file are commands and examples, not claims.
    return [(str(path.relative_to(ROOT)), re.sub(r"```.*?```", "", path.read_text(), flags=re.S))]


PROSE_FILES = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb"),
                      ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("docs/*.md")])


@pytest.mark.parametrize("path", PROSE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_prose_agrees_with_the_recorded_results(path):
    recorded = _recorded_values()
    problems = [f"{where}: {p}" for where, text in _markdown_of(path)
                for p in contradictions(text, recorded, ratios=path.suffix == ".ipynb")]
    assert not problems, "\n".join(problems)


def test_the_check_catches_what_it_should():
    recorded = {"gbps": [2992.0, 2200.0], "ms": [0.3002], "us": [18.04], "pct": [95.0, 100.3]}
    bad = ("The naive one is about half as fast. CUDA v1 is 3.1x slower and 2 times faster. "
           "It runs at 1,234 GB/s, takes 0.9 ms, launches in 40 µs, reaches 80% of copy.")
    found = contradictions(bad, recorded)
    assert len(found) == 7, found
    good = ("Targets: at least 95% of the copy bandwidth, 2,200 GB/s on long rows; a launch takes "
            "18 µs; the copy moves 3 TB/s; the naive kernel takes 0.30 ms. Shapes 32768×1024, "
            "blocks of 32 x 8, 2^24 and 1.5x the bytes are not speed claims.")
    assert contradictions(good, recorded) == []
    assert len(contradictions(bad, recorded, ratios=False)) == 4
