"""Do simulation and the GPU give the same verdicts? Every mistake of the exercise catalogs
(``tests/mistakes/``) and every kernel of the graders' own tests (``tests/grader_kernels.py``)
is graded in the current mode, and each verdict (accepted or rejected, with the first line of
the message) is printed.

    COURSE_SIMULATE=1 python3 -m benchmarks.simulators.sim_vs_gpu   # the simulation side
    python3 -m benchmarks.simulators.sim_vs_gpu --record            # on a GPU: the recorded side

``--record`` (on a GPU only) writes ``benchmarks/results/simulators/sim-vs-gpu.json`` and ``.md`` with
the commit measured; with ``--only`` it records the entries graded into the file's other
verdicts (each entry keeps the commit it was graded at), so a new or changed catalog is
recorded without grading every other one again:

    python3 -m benchmarks.simulators.sim_vs_gpu --record --only mistake:10_attention/

``tests/test_sim_vs_gpu.py`` recomputes the simulation side in CI and compares it with the
recorded GPU side: every verdict must agree, except the mistakes that only simulation can catch
(races and undefined behaviour, each entry's ``sim_only`` reason).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))

import mistakes as M  # noqa: E402  (tests/mistakes)

import utils  # noqa: E402

RESULTS = utils.SIMULATOR_RESULTS_DIR
OUT_JSON = RESULTS / "sim-vs-gpu.json"
OUT_MD = RESULTS / "sim-vs-gpu.md"

#: The graders' test kernels that only simulation can reject: races (the emulator runs threads
#: in random orders and records every access; a GPU's warps may happen to run in step) and
#: undefined behaviour. Catalog entries say the same with their ``sim_only`` field.
SIM_ONLY_KERNELS = {
    "nb_sum_no_barrier": "a race: on a GPU the warps of a block may happen to run in step",
    "cu_sum_no_barrier": "a race: on a GPU the warps of a block may happen to run in step",
    "cu_row_max_no_barrier": "a race: on a GPU warp 0 may happen to read scratch after the others wrote it",
    "cu_relu_barrier_in_branch": "undefined behaviour: a barrier only some threads reach may pass on a GPU",
    "cu_sum_too_many_threads": "undefined behaviour: a write past a __shared__ array may land unnoticed on a GPU",
    "cu_sum_shared_bytes_in_elements":
        "undefined behaviour: a write past dynamic shared memory may land unnoticed on a GPU",
}

#: The grader of a test kernel, from its name (longest prefix first).
_GRADER_OF = [("relu_backward", "check_relu_backward"), ("relu_2d", "check_relu_2d"), ("relu", "check_relu"),
              ("add_2d", "check_add_2d"), ("add", "check_add"), ("gelu", "check_gelu"), ("sum", "check_sum"),
              ("row_max", "check_row_max"), ("softmax", "check_softmax"), ("matmul", "check_matmul"),
              ("tma_transpose", "check_tma_transpose")]
_NOT_LAUNCHERS = {"have_cuda_kernel", "relu_stub_kernel"}


def grader_kernels() -> dict[str, tuple[str, object]]:
    """``name -> (grader name, launcher)`` for every launcher of tests/grader_kernels.py."""
    import inspect

    import grader_kernels as K
    out = {}
    for name, fn in vars(K).items():
        if name.startswith("_") or name in _NOT_LAUNCHERS or not inspect.isfunction(fn) \
                or fn.__module__ != K.__name__:
            continue
        if name.startswith("cu_") and not K.have_cuda_kernel():
            continue
        bare = name.split("_", 1)[1] if name.startswith(("nb_", "cu_")) else name
        grader = next((g for p, g in _GRADER_OF if bare.startswith(p)), None)
        if grader is not None:
            out[name] = (grader, fn)
    return out


def _first_line(msg: str) -> str:
    lines = [ln for ln in msg.strip().splitlines() if ln.strip()]
    # "check_x failed on <input>:" says where, the next line says what
    if len(lines) > 1 and lines[0].rstrip().endswith(":"):
        return lines[1].strip()
    return lines[0].strip() if lines else ""


def grade_kernel(grader: str, fn) -> M.Verdict:
    import contextlib
    import io
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            getattr(utils, grader)(fn)
    except Exception as e:  # any error rejects, as in a notebook
        return M.Verdict("rejected", str(e) if isinstance(e, utils.GradingError) else f"{type(e).__name__}: {e}")
    return M.Verdict("accepted", "")


#: Entries whose launch leaves a GPU's CUDA context unusable (an illegal memory access: every
#: later CUDA call of the process fails). They are graded last, so they decide only their own verdict.
GRADED_LAST = {
    "mistake:07_ship_it/fake_calls_kernel": "the fake kernel launches the real kernel on a fake tensor's "
                                            "pointer: an illegal memory access on a GPU",
    "kernel:cu_sum_too_many_threads": "more threads than its shared array: an illegal memory access on a GPU",
    "kernel:cu_sum_shared_bytes_in_elements": "dynamic shared memory sized in elements, not bytes: an illegal "
                                              "memory access on a GPU",
    "mistake:11_gpt/ce_target_logit_axis": "the target's logit read along the other axis, far past the logits: "
                                           "an illegal memory access on a GPU",
}


def groups() -> list[str]:
    """The entries' groups: the graders' kernels, then one per exercise, or one per entry of an
    exercise whose catalog says ``ISOLATE`` (why one entry's failure ends its process's CUDA
    context). On a GPU each group is graded in a process of its own, so an illegal memory
    access or a trap decides no other group's verdicts."""
    out = ["kernel:"]
    for ex in M.exercises():
        if getattr(M.load(ex), "ISOLATE", None):
            out += [f"mistake:{ex}/{m.name}" for m in M.catalog(ex)]
        else:
            out.append(f"mistake:{ex}/")
    return out


def run(only: str | None = None, log=print) -> dict[str, dict]:
    """Every verdict of the current mode: ``{"mistake:05_softmax/triton_no_other": {...}}``."""
    jobs = []  # (key, grade, fields): the graders' kernels first, then the catalogs
    for name, (grader, fn) in grader_kernels().items():
        jobs.append((f"kernel:{name}", lambda grader=grader, fn=fn: grade_kernel(grader, fn),
                     {"grader": grader, "expected": "accepted" if name.endswith("_ok") else "rejected",
                      "sim_only": SIM_ONLY_KERNELS.get(name)}))
    for ex in M.exercises():
        for m in M.catalog(ex):
            jobs.append((f"mistake:{ex}/{m.name}", lambda ex=ex, m=m: M.verdict(ex, m),
                         {"expected": m.verdict, "sim_only": m.sim_only}))
    jobs.sort(key=lambda job: job[0] in GRADED_LAST)  # stable: the order above otherwise
    out: dict[str, dict] = {}
    for key, grade, fields in jobs:
        one_entry = only is not None and only.startswith("mistake:") and not only.endswith("/")
        if only and (key != only if one_entry else only not in key):
            continue  # one entry's key: that entry alone, not the others whose names begin with it
        t = time.perf_counter()
        v = grade()
        out[key] = {"verdict": v.verdict, "message": _first_line(v.message), **fields,
                    "seconds": round(time.perf_counter() - t, 2)}
        log(f"{key}: {v.verdict} {out[key]['message'][:120]}")
    return out


def sim_only_reasons() -> dict[str, str]:
    """The entries that a GPU may accept while simulation rejects them, with why."""
    out = {f"kernel:{k}": v for k, v in SIM_ONLY_KERNELS.items()}
    for ex, m in M.all_mistakes():
        if m.sim_only:
            out[f"mistake:{ex}/{m.name}"] = m.sim_only
    return out


def disagreements(sim: dict[str, dict], gpu: dict[str, dict]) -> list[str]:
    """Where the two sides' verdicts differ, other than the listed simulation-only catches."""
    allowed = sim_only_reasons()
    bad = []
    for key in sorted(set(sim) & set(gpu)):
        s, g = sim[key]["verdict"], gpu[key]["verdict"]
        if s == g or (key in allowed and s == "rejected"):
            continue
        bad.append(f"{key}: simulation {s} ({sim[key]['message'][:150]}), GPU {g} ({gpu[key]['message'][:150]})")
    return bad


def write_markdown(data: dict) -> None:
    """sim-vs-gpu.md from the recorded verdicts (sim-vs-gpu.json's ``data``)."""
    results = data["verdicts"]
    lines = [f"# Verdicts on {data['machine']['gpu']} ({utils.commit_str(data)}, {data['date'][:10]})", "",
             "Each catalog mistake (`tests/mistakes/`) and each grader test kernel (`tests/grader_kernels.py`), "
             "graded on the GPU. `tests/test_sim_vs_gpu.py` compares these verdicts with the simulation's.", "",
             "| entry | expected | GPU verdict | first line of the message |", "|---|---|---|---|"]
    for key, r in sorted(results.items()):
        msg = r["message"].replace("|", "\\|")[:160]
        lines.append(f"| {key} | {r['expected']} | {r['verdict']} | {msg} |")
    lines += ["", "Rejected in simulation only (races and undefined behaviour that a GPU may not show):", ""]
    lines += [f"* {k}: {v}" for k, v in sorted(data["sim_only"].items())]
    OUT_MD.write_text("\n".join(lines) + "\n")


def write(results: dict[str, dict], merge: bool = False) -> None:
    commit = utils.source_commit().get("commit")
    results = {k: {**v, "commit": commit} for k, v in results.items()}
    if merge and OUT_JSON.exists():   # --only: the other entries keep their verdicts (and commits)
        old = json.loads(OUT_JSON.read_text())
        results = {**{k: {"commit": old.get("commit"), **v} for k, v in old.get("verdicts", {}).items()}, **results}
    data = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"gpu": utils.describe().splitlines()[0] if not utils.SIMULATE else "simulation"},
            **utils.source_commit(), "mode": "simulation" if utils.SIMULATE else "gpu",
            "sim_only": sim_only_reasons(), "verdicts": results}
    try:
        import torch
        if torch.cuda.is_available():
            data["machine"]["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    RESULTS.mkdir(parents=True, exist_ok=True)
    OUT_JSON.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    write_markdown(data)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", action="store_true",
                    help="on a GPU: write benchmarks/results/simulators/sim-vs-gpu.json and .md")
    ap.add_argument("--only", help="grade only the entries whose key contains this text")
    ap.add_argument("--jobs", type=int, default=4, help="on a GPU: groups graded at the same time (default 4)")
    ap.add_argument("--json", help=argparse.SUPPRESS)  # a group's worker: write its verdicts here
    args = ap.parse_args(argv)
    if args.record and utils.SIMULATE:
        ap.error("--record records the GPU side: run it on a GPU, without COURSE_SIMULATE")
    t = time.perf_counter()
    if args.json:
        Path(args.json).write_text(json.dumps(run(args.only)))
        return 0
    # on a GPU, one process per group: a CUDA context broken by one entry breaks no other group
    chosen = [g for g in groups() if not args.only or args.only in g]
    if utils.SIMULATE or not chosen:
        results = run(args.only)
    else:
        import subprocess
        import tempfile
        results = {}
        with tempfile.TemporaryDirectory() as d:
            # a few groups at a time: each process compiles for a while, the GPU is mostly idle
            pending = [(group, Path(d) / f"{k}.json") for k, group in enumerate(chosen)]
            running = []
            while pending or running:
                while pending and len(running) < args.jobs:
                    group, out = pending.pop(0)
                    cmd = [sys.executable, __file__, "--only", group, "--json", str(out)]
                    running.append((group, out, subprocess.Popen(cmd)))
                group, out, proc = running.pop(0)
                proc.wait()
                if out.exists():
                    results.update(json.loads(out.read_text()))
                else:
                    print(f"group {group}: its process wrote no verdicts", flush=True)
    print(f"{len(results)} verdicts in {time.perf_counter() - t:.0f} s "
          f"({'simulation' if utils.SIMULATE else 'GPU'}); "
          f"{sum(r['verdict'] != r['expected'] for r in results.values())} differ from the catalogs' expectations")
    if args.record:
        write(results, merge=bool(args.only))
        print(f"wrote {OUT_JSON.relative_to(ROOT)} and {OUT_MD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
