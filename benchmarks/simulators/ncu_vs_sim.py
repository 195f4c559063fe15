"""The course's profiler in simulation against Nsight Compute on an H100, case by case.

The ncu side is recorded (``benchmarks/results/simulators/ncu-h100.json``, written on the GPU
by ``benchmarks/simulators/ncu_gpu_run.sh``); the simulated side is computed here with
``utils.profile`` for every case of ``benchmarks/simulators/ncu_patterns.py``. Writes
``benchmarks/results/simulators/ncu-vs-sim.json`` and ``.md``: both sides, their ratio and a
verdict per metric, and every metric left out with the reason. ``tests/test_ncu_vs_sim.py``
recomputes the simulated side in CI.

    COURSE_SIMULATE=1 python -m benchmarks.simulators.ncu_vs_sim
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(ROOT))

import utils  # noqa: E402
from benchmarks.simulators.ncu_patterns import CASES  # noqa: E402

RESULTS = utils.SIMULATOR_RESULTS_DIR
NCU_JSON = RESULTS / "ncu-h100.json"
OUT_JSON = RESULTS / "ncu-vs-sim.json"
OUT_MD = RESULTS / "ncu-vs-sim.md"

#: How close the simulation must come: within 10% of ncu, and equal for the simple patterns'
#: memory counters (requests, sectors, wavefronts, bank conflicts are properties of the access
#: pattern, so there is nothing to approximate).
TOLERANCE = 0.10

_G = "l1tex__t_{}_pipe_lsu_mem_global_op_{}.sum"
GLOBAL = [_G.format(w, op) for w in ("requests", "sectors") for op in ("ld", "st", "atom", "red")]
SHARED = [f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum" for op in ("ld", "st")] + \
         [f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum" for op in ("ld", "st")] + \
         [f"sm__sass_inst_executed_op_shared_{op}.sum" for op in ("ld", "st")]
COUNTS = GLOBAL + SHARED
LANES = "smsp__thread_inst_executed_per_inst_executed.ratio"
LAUNCH = ["launch__registers_per_thread", "launch__shared_mem_per_block_static",
          "launch__occupancy_limit_blocks", "launch__occupancy_limit_registers",
          "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps",
          "sm__maximum_warps_per_active_cycle_pct"]
COMPARED = COUNTS + [LANES] + LAUNCH
#: Not an ncu metric: the bytes of the global sectors both sides moved, (ld + st + atom + red
#: sectors) x 32 on the ncu side, ``Profile.bytes_moved`` in simulation. The one memory figure the Triton
#: interpreter can give (it runs a program's block as whole arrays: no warps, no requests).
BYTES = "global bytes moved (sectors x 32)"

#: Why a metric has no simulated value, by backend (the reasons the .md table prints).
LEFT_OUT = {
    ("triton", "requests"): ("requests depend on the vector width Triton's compiler picks for each "
                             "load (16-byte accesses where it can prove alignment); the interpreter "
                             "runs a program's block as whole arrays, with no warps"),
    ("triton", "sectors"): "compared as bytes moved (the interpreter has no warps to group into requests)",
    ("triton", "shared"): ("Triton's compiler places reductions' scratch in shared memory itself; "
                           "the interpreter has no shared memory"),
    ("triton", "lanes"): "the interpreter has no threads: it reports the fraction of masked-off lanes instead",
    ("triton", "launch"): ("registers, shared memory and occupancy come from Triton's compiler on a GPU; "
                           "the interpreter compiles nothing"),
    ("cuda", "launch"): ("not in the simulated profile: occupancy needs the registers from ptxas "
                         "(utils.cuda_resources, which needs NVRTC) and the GPU's limits (utils.occupancy)"),
    ("cuda", "other"): "not produced by the emulator's profiler",
}


#: Cases where the simulation counts differently from the hardware, and why (read from the
#: SASS: ``utils.cuda_sass``). The CI test expects exactly these to fail (strictly: once the
#: counting is fixed, the entry must go).
KNOWN: dict[str, str] = {}


def _family(metric: str) -> str:
    if metric in LAUNCH:
        return "launch"
    if metric == LANES:
        return "lanes"
    if "shared" in metric:
        return "shared"
    if "requests" in metric:
        return "requests"
    if "sectors" in metric:
        return "sectors"
    return "other"


def left_out_reason(backend: str, metric: str) -> str:
    return LEFT_OUT.get((backend, _family(metric))) or LEFT_OUT[("cuda", "other")]


def simulate(case):
    """``utils.profile`` of one case (the launch runs once), and the seconds it took.
    NotImplementedError where this version of the course cannot profile the kernel's kind."""
    made = case.make_args(utils.DEVICE)
    args, kwargs = made
    k = case.load()
    t0 = time.perf_counter()
    if case.backend == "cuda":
        p = utils.profile(k, case.grid, case.block, *args, shared=case.shared)
    else:
        p = utils.profile(k, case.grid, *args, **kwargs)
    return p, time.perf_counter() - t0


#: The shared-memory occupancy limit depends on the carveout the driver configures for a
#: launch (Nsight Compute's launch__shared_mem_config_size: 32 KiB for most of these launches,
#: 16 or 100 KiB for others), a choice the simulation does not model: ``utils.profile`` gives
#: the limit at the largest carveout (the most blocks that could ever fit). So the comparison
#: computes the simulated limit with ``utils.occupancy`` at the driver's carveout, from the
#: simulated registers and shared memory.
SMEM_LIMIT = "launch__occupancy_limit_shared_mem"
CONFIG = "launch__shared_mem_config_size"


def occupancy_at(block_size: int, registers: int, shared: int, carveout: int):
    return utils.occupancy(block_size, registers_per_thread=registers, shared_per_block=shared,
                           gpu="H100", carveout=carveout)


def sim_values(case, p, ncu: dict | None = None) -> dict:
    """The simulated metrics to compare (ncu names), plus BYTES; with ``ncu`` (the recorded
    counters), the shared-memory limit at the driver's carveout."""
    out = {m: p.metrics[m] for m in COMPARED if m in p.metrics}
    if p.bytes_moved is not None:
        out[BYTES] = p.bytes_moved
    regs = p.metrics.get("launch__registers_per_thread")
    static = p.metrics.get("launch__shared_mem_per_block_static")
    if SMEM_LIMIT in out and ncu and CONFIG in ncu and regs and static is not None:
        threads = 1
        for b in case.block:
            threads *= b
        occ = occupancy_at(threads, int(regs), int(static) + case.shared, int(ncu[CONFIG]))
        out[SMEM_LIMIT] = occ.limits[SMEM_LIMIT]
    return out


def ncu_values(ncu: dict) -> dict:
    out = {m: ncu[m] for m in COMPARED if m in ncu}
    sectors = [ncu.get(_G.format("sectors", op)) for op in ("ld", "st", "atom", "red")]
    if all(x is not None for x in sectors):
        out[BYTES] = 32 * sum(sectors)
    return out


def verdict(metric: str, hw, sim, exact: bool) -> str:
    """'exact', 'ok' (within TOLERANCE) or 'FAIL ...'."""
    if hw == sim:
        return "exact"
    if exact and metric in COUNTS:
        return "FAIL (must be exact)"
    if hw == 0:
        return "FAIL (ncu counts 0)"
    return "ok" if abs(sim - hw) <= TOLERANCE * abs(hw) else "FAIL (off by more than 10%)"


def compare_case(case, hw: dict, sim: dict) -> dict:
    """Every metric ncu recorded for the case: both sides and the verdict, or why the
    simulation has no value."""
    rows, left_out = [], {}
    for metric in [*COMPARED, BYTES]:
        if metric not in hw:
            continue
        if metric not in sim:
            left_out[metric] = left_out_reason(case.backend, metric)
            continue
        h, s = hw[metric], sim[metric]
        rows.append({"metric": metric, "ncu": h, "sim": s,
                     "ratio": (s / h) if h else (1.0 if s == h else None),
                     "verdict": verdict(metric, h, s, case.exact)})
    return {"rows": rows, "left_out": left_out}


def _head() -> str:
    import subprocess
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def load_ncu(path=NCU_JSON) -> dict:
    return json.loads(Path(path).read_text())


def run(cases=None, ncu_path=NCU_JSON) -> dict:
    recorded = load_ncu(ncu_path)
    result = {"ncu": {k: recorded[k] for k in ("commit", "gpu", "ncu_version")},
              "commit": os.environ.get("COURSE_COMMIT") or _head(),
              "tolerance": TOLERANCE, "cases": {}}
    for case in (cases or CASES.values()):
        raw = recorded["cases"][case.name]["ncu"]
        hw = ncu_values(raw)
        try:
            p, seconds = simulate(case)
        except NotImplementedError as e:
            result["cases"][case.name] = {"kernel": case.kernel, "backend": case.backend, "kind": case.kind,
                                          "exact": case.exact, "what": case.what, "not_simulated": str(e),
                                          "rows": [], "left_out": {m: str(e) for m in hw}}
            print(f"{case.name:22s} not simulated: {e}", flush=True)
            continue
        cmp = compare_case(case, hw, sim_values(case, p, raw))
        cmp["ncu_left_out"] = {m: hw[m] for m in cmp["left_out"]}
        if case.backend == "triton":  # what the interpreter reports instead of warps and requests
            cmp["sim_extra"] = {k: v for k, v in p.metrics.items() if k.startswith(("masked_lane", "bytes_"))}
        result["cases"][case.name] = {"kernel": case.kernel, "backend": case.backend, "kind": case.kind,
                                      "exact": case.exact, "what": case.what, "sim_backend": p.backend,
                                      "sim_seconds": round(seconds, 3), **cmp}
        bad = [r["metric"] for r in cmp["rows"] if r["verdict"].startswith("FAIL")]
        print(f"{case.name:22s} {seconds:5.2f} s  {len(cmp['rows'])} compared  "
              f"{'FAIL: ' + ', '.join(bad) if bad else 'ok'}", flush=True)
    return result


def _short(metric: str) -> str:
    return (metric.replace("l1tex__t_", "").replace("_pipe_lsu_mem_global_op_", " global ")
            .replace("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_", "wavefronts shared ")
            .replace("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_", "bank conflicts shared ")
            .replace("sm__sass_inst_executed_op_shared_", "instructions shared ")
            .replace(".sum", "").replace(".ratio", ""))


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not float(x).is_integer():
        return f"{x:,.2f}"
    return f"{int(x):,}"


def to_markdown(result: dict) -> str:
    n = result["ncu"]
    lines = [
        "# The course's profiler in simulation against Nsight Compute",
        "",
        f"ncu side: {n['gpu']}, Nsight Compute {n['ncu_version']}, measured at commit {n['commit']} "
        "(`benchmarks/results/simulators/ncu-h100.json`). Simulated side: `utils.profile` on a CPU, "
        f"computed at commit {result['commit']} by `python -m benchmarks.simulators.ncu_vs_sim`.",
        "",
        f"Verdicts: *exact*; *ok*, within {int(result['tolerance'] * 100)}%; cases marked exact must "
        "match their memory counters (requests, sectors, wavefronts, bank conflicts) exactly. "
        "Metrics ncu counted as 0 on both sides are listed once per case as zeros. "
        "The simulated shared-memory occupancy limit is computed at the carveout the driver chose "
        "for the launch (ncu's launch__shared_mem_config_size), which the simulation does not model.",
        "",
    ]
    fails = [(c, r) for c, d in result["cases"].items() for r in d["rows"] if r["verdict"].startswith("FAIL")]
    lines += [f"**{sum(len(d['rows']) for d in result['cases'].values())} comparisons in "
              f"{len(result['cases'])} cases, {len(fails)} failing"
              + (f", in {len({c for c, _ in fails})} of the cases" if fails else "") + ".**", "",
              "| case | kind | compared | exact | within 10% | failing | simulated in |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for name, d in result["cases"].items():
        v = [r["verdict"] for r in d["rows"]]
        took = "not simulated" if "not_simulated" in d else f"{d['sim_seconds']:.2f} s"
        lines.append(f"| {name} | {d['kind']} | {len(v)} | {v.count('exact')} | {v.count('ok')} | "
                     f"{sum(x.startswith('FAIL') for x in v)} | {took} |")
    lines += ["", "Why the failing cases fail (read from the kernels' SASS):", ""]
    lines += [f"- **{c}**: {why}." for c, why in KNOWN.items() if c in {n for n, _ in fails}]
    unexplained = sorted({c for c, _ in fails} - set(KNOWN))
    if unexplained:
        lines.append(f"- not yet explained: {', '.join(unexplained)}.")
    lines.append("")
    for name, d in result["cases"].items():
        lines += [f"## {name} ({d['kernel']}, {d['kind']}{', exact' if d['exact'] else ''})", ""]
        if "not_simulated" in d:
            lines += [f"{d['what']}. Not simulated: {d['not_simulated']}", ""]
            continue
        lines += [f"{d['what']}. Simulated in {d['sim_seconds']:.2f} s ({d['sim_backend']}).", ""]
        nonzero = [r for r in d["rows"] if not (r["ncu"] == 0 and r["sim"] == 0)]
        zeros = [_short(r["metric"]) for r in d["rows"] if r["ncu"] == 0 and r["sim"] == 0]
        if nonzero:
            lines += ["| metric | ncu | simulation | sim / ncu | verdict |", "|---|---:|---:|---:|---|"]
            for r in nonzero:
                ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
                lines.append(f"| {_short(r['metric'])} | {_fmt(r['ncu'])} | {_fmt(r['sim'])} | {ratio} "
                             f"| {r['verdict']} |")
            lines.append("")
        if zeros:
            lines += ["Zero on both sides: " + ", ".join(zeros) + ".", ""]
        if d["left_out"]:
            hw = d.get("ncu_left_out", {})
            shown = {m: v for m, v in hw.items() if v}
            if shown:  # the hardware's numbers, beside the simulation's (of other quantities)
                lines += ["| ncu only | ncu |", "|---|---:|"]
                lines += [f"| {_short(m)} | {_fmt(v)} |" for m, v in shown.items()] + [""]
            reasons = {}
            for m, why in d["left_out"].items():
                reasons.setdefault(why, []).append(_short(m))
            lines += [f"Left out: {', '.join(ms)}: {why}." for why, ms in reasons.items()] + [""]
            if d.get("sim_extra"):
                lines += ["Simulated, with no ncu counterpart: " + ", ".join(
                    f"{k} {_fmt(v)}" for k, v in d["sim_extra"].items()) + ".", ""]
    return "\n".join(lines)


def main():
    result = run()
    OUT_JSON.write_text(json.dumps(result, indent=1) + "\n")
    OUT_MD.write_text(to_markdown(result))
    print(f"wrote {OUT_JSON.relative_to(ROOT)} and {OUT_MD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
