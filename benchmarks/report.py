"""Turning measurements into ``<name>.json``, ``<name>.md`` and the plots.

The schema of the JSON file is documented at the top of ``utils/bench.py``, which reads it.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from utils.bench import commit_str

from .topics import TOPICS

# The course's targets, from each topic's spec (utils/topics/<topic>.py), as
# (topic, Target). Target.kind "copy" = fraction of the copy roofline measured in the same run;
# "torch" = speed relative to a PyTorch baseline at the same shape; "gbps" = GB/s; "tflops" =
# TFLOP/s. Target.version names the course's version measured (default: the reference).
TARGETS = [(name, t) for name, spec in TOPICS.items() for t in spec.targets]

TOPIC_TITLES = {**{name: spec.title for name, spec in TOPICS.items()}, "copy": "Copy"}


def add_fractions(rows: list[dict], copy_gbps: float | None) -> None:
    for r in rows:
        g = r.get("gbps")
        r["fraction_of_copy"] = (g / copy_gbps) if (g and copy_gbps) else None


def evaluate_targets(rows: list[dict], topics, shapes: dict | None = None) -> list[dict]:
    """Each target of the measured topics: the reference version's number, met or not.

    A target whose kernel was not measured is listed with ``value`` None and ``met`` None.
    ``shapes``: ``{topic: [shape, ...]}``, the shapes the targets apply to (default: those
    measured).
    """
    out = []
    for topic, target in TARGETS:
        if topic not in topics:
            continue
        if hasattr(target, "evaluate"):   # a target that knows its configurations (dtype, mask, pass)
            out += target.evaluate(rows)
            continue
        spec = TOPICS[topic]
        lang, kind, thr = target.lang, target.kind, target.threshold
        # a spec's plain target is the float32 forward's: rows of other passes and dtypes (the
        # layernorm worker's backward, bfloat16, RMSNorm) have targets of their own, below
        rows_t = [r for r in rows if r.get("dtype", "float32") == "float32" and r.get("pass", "forward") == "forward"]
        mine = [r for r in rows_t if r["topic"] == topic and r["lang"] == lang
                and (r.get("version") == target.version if target.version else r.get("reference"))]
        base = next((b for b in spec.baselines if b.version == target.baseline), spec.baselines[0])
        torch_rows = {tuple(r["shape"]): r for r in rows_t
                      if r["topic"] == topic and r["lang"] == "torch" and r["version"] == base.version}
        if target.shape is not None:
            shapes_t = [tuple(target.shape)]
        elif shapes and topic in shapes:
            shapes_t = [tuple(s) for s in shapes[topic]]
        else:
            shapes_t = sorted({tuple(r["shape"]) for r in rows if r["topic"] == topic}, key=_size)
        by_shape = {tuple(r["shape"]): r for r in mine}
        for shape in shapes_t:
            r = by_shape.get(tuple(shape))
            variant = r["variant"] if r else f"{lang} {target.version or '(reference)'}"
            if kind == "copy":
                goal = f">= {thr:.0%} of copy"
                value = r.get("fraction_of_copy") if r else None
                unit = "fraction_of_copy"
            elif kind == "torch":
                label = target.baseline_label or spec.baseline_label
                goal = f">= {label}" if thr == 1 else f">= {thr:.0%} of {label}"
                t = torch_rows.get(tuple(shape))
                # same shape, same bytes: the ratio of GB/s is the ratio of speeds
                value = (r["gbps"] / t["gbps"]) if (r and t and t.get("gbps")) else None
                unit = "ratio_to_torch"
                paired = (r or {}).get("paired")
                if not (paired and paired.get("baseline_version") == base.version and paired.get("ratios")):
                    paired = None  # timed against another baseline, or no rounds: the single run stands
                elif value is not None:
                    single, value = value, statistics.median(paired["ratios"])
            elif kind == "tflops":
                goal = f">= {thr:,.0f} TFLOP/s"
                value = r.get("tflops") if r else None
                unit = "tflops"
            else:
                goal = f">= {thr:,.0f} GB/s"
                value = r.get("gbps") if r else None
                unit = "gbps"
            row = dict(topic=topic, lang=lang, variant=variant, shape=list(shape), goal=goal,
                       value=value, threshold=thr, unit=unit, met=None if value is None else bool(value >= thr))
            if kind == "torch":
                row["versus"] = label
                if paired and value is not None:
                    row["paired"] = dict(rounds=len(paired["ratios"]), low=min(paired["ratios"]),
                                         high=max(paired["ratios"]), single_run=single)
            if row["met"] is False and getattr(target, "if_missed", None):
                row["why"] = target.if_missed
            out.append(row)
    if "layernorm" in topics:
        from .layernorm import evaluate
        out += evaluate(rows)
    if "matmul_fp16" in topics:
        from .matmul_fp16 import evaluate as evaluate_bf16
        out += evaluate_bf16(rows)
    return out


def _size(shape) -> int:
    return int(math.prod(shape))


def shape_str(shape) -> str:
    if shape is None:
        return "-"
    shape = list(shape)
    if len(shape) == 1:
        n = int(shape[0])
        if n >= 1024 and n & (n - 1) == 0:
            return f"2^{n.bit_length() - 1}"
        return str(n)
    return "x".join(str(int(s)) for s in shape)


def _value_str(t: dict) -> str:
    v = t.get("value")
    if v is None:
        return "not measured"
    if t["unit"] == "fraction_of_copy":
        return f"{100 * v:.1f}% of copy"
    if t["unit"] == "ratio_to_torch":
        p = t.get("paired")
        alone = f"; timed apart {p['single_run']:.3f}x" if p and p.get("single_run") is not None else ""
        return f"{v:.3f}x {t.get('versus', 'torch')}" + (
            f" (median of {p['rounds']} rounds timed side by side, {p['low']:.3f}-{p['high']:.3f}{alone})" if p else "")
    if t["unit"] == "tflops":
        return f"{v:,.1f} TFLOP/s"
    return f"{v:,.0f} GB/s"


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def markdown(data: dict) -> str:
    m = data.get("machine", {})
    if data.get("simulated"):
        lines = ["# Simulated dry run: these are simulator timings on a CPU, not GPU results", ""]
    else:
        lines = [f"# Recorded GPU results: {m.get('gpu', '?')}", ""]
    lines.append(f"Written by `{data.get('command', 'python -m benchmarks')}` on {data.get('date', '?')}, "
                 f"measured at {commit_str(data)}. "
                 "Notebooks read the numbers from the JSON file beside this one through `utils.bench`.")
    redone = {t: c for t, c in (data.get("topic_commits") or {}).items()
              if c.get("commit") != data.get("commit") or c.get("commit_dirty") != data.get("commit_dirty")}
    if redone:
        lines.append("Re-measured later: " + "; ".join(f"{t} at {commit_str(c)}" for t, c in sorted(redone.items()))
                     + ".")
    lines.append("")
    soft = ", ".join(f"{k} {m[k]}" for k in ("driver", "cuda", "torch", "triton", "numba", "numba_cuda",
                                                "python") if m.get(k))
    lines.append(f"Software: {soft}.  ")
    lines.append(f"Timing: {data.get('timing', '')}")
    lines.append("")
    copy = data.get("copy") or {}
    if copy.get("gbps"):
        lines.append(f"**Copy roofline:** {copy['gbps']:,.0f} GB/s (device-to-device copy of "
                     f"{shape_str(copy.get('shape'))} floats, bytes read + written).")
    else:
        lines.append("**Copy roofline:** not measured.")
    lines.append("")
    targets = data.get("targets", [])
    if targets:
        met = sum(1 for t in targets if t["met"])
        missed = sum(1 for t in targets if t["met"] is False)
        unmeasured = sum(1 for t in targets if t["met"] is None)
        lines += ["## Targets", "",
                  f"{met} met, {missed} missed, {unmeasured} not measured.", "",
                  "| topic | kernel | shape | goal | measured | |", "|---|---|---|---|---|---|"]
        for t in targets:
            mark = {True: "met", False: "**missed**", None: "not measured"}[t["met"]]
            if t.get("why"):
                mark += f": {t['why']}"
            lines.append(f"| {t['topic']} | {t['variant']} | {shape_str(t['shape'])} | {t['goal']} | "
                         f"{_value_str(t)} | {mark} |")
        lines.append("")
    rows = data.get("rows", [])
    topics = []
    for r in rows:
        if r["topic"] != "copy" and r["topic"] not in topics:
            topics.append(r["topic"])
    for topic in topics:
        # A compute-bound topic (its rows count FLOPs) shows TFLOP/s where others show % of copy.
        compute = any(r.get("tflops") for r in rows if r["topic"] == topic)
        lines += [f"## {TOPIC_TITLES.get(topic, topic)}", "",
                  f"| kernel | shape | median ms | p20 ms | p80 ms | GB/s | {'TFLOP/s' if compute else '% of copy'} |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["topic"] != topic:
                continue
            name = r["variant"] + (" (reference)" if r.get("reference") else "")
            frac = r.get("fraction_of_copy")
            last = (f"{r['tflops']:.1f}" if r.get("tflops") else "-") if compute else (
                "-" if frac is None else f"{100 * frac:.1f}%")
            lines.append(f"| {name} | {shape_str(r['shape'])} | {r['median_ms']:.4f} | {r['p20_ms']:.4f} | "
                         f"{r['p80_ms']:.4f} | {r['gbps']:,.0f} | {last} |")
        lines.append("")
        img = Path(f"{data.get('machine', {}).get('name', 'gpu')}-{topic}.png")
        if topic in data.get("sweeps", {}) or topic in CUSTOM_PLOTS:
            lines += [f"![{topic}: GB/s against size]({img.name})", ""]
    failed = data.get("failed", [])
    if failed:
        lines += ["## Not timed", "", "| topic | kernel | shape | status | why |", "|---|---|---|---|---|"]
        for f in failed:
            why = str(f.get("reason", "")).replace("|", "\\|")
            lines.append(f"| {f['topic']} | {f['variant']} | {shape_str(f.get('shape'))} | "
                         f"{f['status']} | {why} |")
        lines.append("")
    notes = data.get("notes", [])
    if notes:
        lines += ["## Notes", ""] + [f"* {n}" for n in notes] + [""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------
_LANG_STYLE = {"cuda": "-", "triton": "-.", "numba": "--", "torch": ":", "copy": (0, (1, 3))}
# Tableau 20: enough distinct colours for every version of a topic.
_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
           "#f7b6d2", "#dbdb8d", "#9edae5"]


def _style_by_language(ax, refs: set) -> None:
    """Line style by language, bold for each language's reference version, legend outside."""
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_") and ln.get_gid() != "roofline"]
    for k, ln in enumerate(lines):
        label = ln.get_label()
        lang = label.split(" ")[0].split(".")[0]
        ln.set_linestyle(_LANG_STYLE.get(lang, "-"))
        ln.set_color("grey" if label.startswith("copy") else _COLORS[k % len(_COLORS)])
        ln.set_linewidth(2.4 if label in refs else 1.2)
        if label in refs:
            ln.set_label(f"{label} (reference)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


#: Topics that draw their own plot: ``<module>.plot(data, outdir, name)`` (None: nothing to draw).
CUSTOM_PLOTS = {"attention": "benchmarks.attention"}


def plot_sweeps(data: dict, outdir: Path, name: str) -> list[Path]:
    """One PNG per topic: GB/s against the number of elements, with the copy roofline
    (drawn by ``utils.plot_bandwidth``, the same function the notebooks use)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import utils

    written = []
    roof = (data.get("copy") or {}).get("gbps")
    copy_sweep = data.get("sweeps", {}).get("copy", {}).get("copy", [])
    gpu = data.get("machine", {}).get("gpu", "GPU")
    date = str(data.get("date", ""))[:10]
    simulated = bool(data.get("simulated"))
    for topic, curves in data.get("sweeps", {}).items():
        if topic == "copy" or not curves:
            continue
        curves = {v: [tuple(p) for p in pts] for v, pts in sorted(curves.items()) if pts}
        if copy_sweep:
            curves["copy (same sizes)"] = [tuple(p) for p in copy_sweep]
        title = f"{TOPIC_TITLES.get(topic, topic)}: bandwidth against size"
        xlabel = TOPICS[topic].sweep_label if topic in TOPICS else "elements"
        fig = utils.plot_bandwidth(curves, roof, title=title, xlabel=xlabel,
                                   recorded_on=None if simulated else f"{gpu}, {date}",
                                   label_simulated=simulated)
        _style_by_language(fig.axes[0], refs={r["variant"] for r in data.get("rows", [])
                                              if r["topic"] == topic and r.get("reference")})
        path = outdir / f"{name}-{topic}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    import importlib
    for topic, module in CUSTOM_PLOTS.items():
        path = importlib.import_module(module).plot(data, outdir, name)
        if path is not None:
            written.append(path)
    return written
