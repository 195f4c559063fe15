"""Run Triton's official tutorials, unchanged, in simulation (Triton's interpreter).

    python -m benchmarks.simulators.triton_tutorials PATH/TO/triton/python/tutorials [--timeout 300]

The tutorials are not part of this repository: point the script at a checkout of
triton-lang/triton (or a folder holding its ``python/tutorials/NN-*.py``); without one it
says so and exits cleanly. Each tutorial runs in a fresh process with
``COURSE_SIMULATE=1`` after ``import utils``, exactly as written, with one exception:
the ``triton.testing.perf_report`` sweeps at their end (``benchmark.run(...)``) are not
run, since they time GPU-sized problems and say nothing on a CPU; the survey records
that they were skipped. Everything before them (the kernels, their launches, the
tutorial's own correctness checks) runs.

Writes ``benchmarks/results/simulators/triton-tutorials-simulation.json``: for each tutorial its
outcome (``ok``, ``failed``, ``timeout``), seconds, and for a failure the exception and
the tutorial line it came from. For the two tutorials known to fail, a ``diagnosis`` runs
what decides between the course and Triton's interpreter, twice: with the course's patches
(``import utils``) and with Triton's interpreter alone.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (not runtime.paths.SIMULATOR_RESULTS_DIR: the tutorials import the runtime in their own processes)
RESULT = ROOT / "benchmarks" / "results" / "simulators" / "triton-tutorials-simulation.json"

# What was found out about a failure by hand, written next to the automatic outcome.
NOTES = {
    "04-low-memory-dropout.py": "needs the `tabulate` package (not a course requirement) to "
                                "print its tables; installed for the recorded run",
    "05-layer-norm.py": "the failing assert compares db with torch's own float16 gradient, which "
                        "is computed on the CPU here; `diagnosis` measures both against float64 at "
                        "the tutorial's size, with the course's patches and without them: the "
                        "interpreter's gradients stay within the tutorial's atol 1e-2, torch's CPU "
                        "float16 layer_norm backward does not. The reference is what fails, and "
                        "the course's patches change nothing",
    "07-extern-functions.py": "the tutorial asserts x.is_cuda on its own tensors, which live on the "
                              "CPU in simulation. Past that line (`diagnosis`: a copy without it), "
                              "libdevice.asin runs with the course's patches (every __nv_* function "
                              "but jn/yn has a NumPy twin, runtime/backends/libdevice.py); "
                              "stock Triton's interpreter fails there, since "
                              "triton.language.extra.libdevice holds stubs that only the GPU "
                              "compiler replaces ('cannot convert None ... to tensor')",
}

# Runs in the child process: the course first, then the tutorial as its own __main__.
_CHILD = r"""
import json, runpy, sys, traceback
sys.path.insert(0, {root!r})
import utils  # noqa: F401  (simulation set-up: interpreter, driver, race checks)
import triton.testing
skipped = []
def _skip(self, *args, **kwargs):
    skipped.append([b.plot_name for b in (self.benchmarks if isinstance(self.benchmarks, list)
                                          else [self.benchmarks])])
triton.testing.Mark.run = _skip
path = {path!r}
out = {{"skipped_benchmarks": skipped}}
try:
    runpy.run_path(path, run_name="__main__")
    out["outcome"] = "ok"
except BaseException as e:  # noqa: BLE001  every failure is a result of the survey
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
    out["outcome"] = "failed"
    out["error"] = type(e).__name__
    out["message"] = str(e).strip().splitlines()[-1][:400] if str(e).strip() else ""
    if frames:
        out["line"] = frames[-1].lineno
        out["code"] = (frames[-1].line or "").strip()
print("@@SURVEY@@" + json.dumps(out))
"""


def run_one(path: Path, timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_RACECHECK",)}
    env["COURSE_SIMULATE"] = "1"
    env["MPLBACKEND"] = "Agg"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT), path=str(path))],
                              capture_output=True, text=True, env=env, cwd=str(path.parent),
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"outcome": "timeout", "seconds": round(time.perf_counter() - t0, 1),
                "message": f"did not finish within {timeout:.0f} s in the interpreter"}
    seconds = round(time.perf_counter() - t0, 1)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@SURVEY@@")]
    if not marker:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return {"outcome": "failed", "seconds": seconds, "error": f"exit code {proc.returncode}",
                "message": tail[0][:400]}
    out = json.loads(marker[-1][len("@@SURVEY@@"):])
    out["seconds"] = seconds
    return out


# The layer-norm tutorial's gradients against float64, in a child process: with the
# course's patches ("on": import utils) or Triton's interpreter alone ("off"). The tutorial's
# kernels and autograd function are taken from its text up to its benchmark (its own test
# and benchmark are not run; its device line is replaced, since without the course the
# interpreter has no active driver to ask).
_LN_CHILD = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
if {hooks!r} == "on":
    sys.path.insert(0, {root!r})
    import utils  # noqa: F401
import torch, triton
src = open({path!r}).read()
src = src[:src.index("@triton.testing.perf_report")]
src = src.replace("DEVICE = triton.runtime.driver.active.get_active_torch_device()", "DEVICE = torch.device('cpu')")
g = {{"__name__": "layer_norm_tutorial"}}
exec(compile(src, {path!r}, "exec"), g)
M, N, dtype = 1151, 8192, torch.float16  # the tutorial's test_layer_norm call
torch.manual_seed(0)
w = torch.rand(N, dtype=dtype, requires_grad=True)
b = torch.rand(N, dtype=dtype, requires_grad=True)
x = (-2.3 + 0.5 * torch.randn(M, N, dtype=dtype)).requires_grad_(True)
dy = .1 * torch.randn_like(x)
g["layer_norm"](x, (N,), w, b, 1e-5).backward(dy)
tri = [t.grad.clone() for t in (x, w, b)]
x.grad = w.grad = b.grad = None
torch.nn.functional.layer_norm(x, (N,), w, b, 1e-5).backward(dy)
ref16 = [t.grad.clone() for t in (x, w, b)]
x64, w64, b64 = (t.detach().double().requires_grad_(True) for t in (x, w, b))
torch.nn.functional.layer_norm(x64, (N,), w64, b64, 1e-5).backward(dy.double())
out = {{}}
for name, t, r16, r64 in zip(("dx", "dw", "db"), tri, ref16, (x64.grad, w64.grad, b64.grad)):
    out[name] = {{"triton_vs_float64": round(float((t.double() - r64).abs().max()), 4),
                 "torch_cpu_float16_vs_float64": round(float((r16.double() - r64).abs().max()), 4),
                 "triton_vs_torch": round(float((t.double() - r16.double()).abs().max()), 4)}}
print("@@SURVEY@@" + json.dumps(out))
"""


# The extern-functions tutorial past its `assert x.is_cuda` line: a copy without that line,
# run with the course's patches ("on") or Triton's interpreter alone ("off"; its device line
# replaced, as above). Records where it stops.
_EXTERN_CHILD = r"""
import json, os, runpy, sys, tempfile, traceback
os.environ["TRITON_INTERPRET"] = "1"
if {hooks!r} == "on":
    sys.path.insert(0, {root!r})
    import utils  # noqa: F401
import torch, triton  # noqa: F401
src = open({path!r}).read().replace("assert x.is_cuda and output_triton.is_cuda", "pass")
src = src.replace("DEVICE = triton.runtime.driver.active.get_active_torch_device()", "DEVICE = torch.device('cpu')")
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(src)
out = {{}}
try:
    runpy.run_path(f.name, run_name="__main__")
    out["outcome"] = "ok"
except BaseException as e:  # noqa: BLE001
    frames = [fr for fr in traceback.extract_tb(e.__traceback__) if fr.filename == f.name]
    out = {{"outcome": "failed", "error": type(e).__name__, "message": str(e).strip()[:300],
           "code": (frames[-1].line or "").strip() if frames else ""}}
os.unlink(f.name)
print("@@SURVEY@@" + json.dumps(out))
"""


def _run_diagnosis(template: str, path: Path, timeout: float) -> dict:
    """``template`` in a child process with the course's patches and without them."""
    out = {}
    env = {k: v for k, v in os.environ.items() if k != "COURSE_SIMULATE"}
    for hooks in ("on", "off"):
        code = template.format(hooks=hooks, root=str(ROOT), path=str(path))
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                                  env={**env, "COURSE_SIMULATE": "1"} if hooks == "on" else env)
        except subprocess.TimeoutExpired:
            out[f"course_patches_{hooks}"] = "timeout"
            continue
        marker = [line for line in proc.stdout.splitlines() if line.startswith("@@SURVEY@@")]
        out[f"course_patches_{hooks}"] = json.loads(marker[-1][len("@@SURVEY@@"):]) if marker else \
            (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return out


#: tutorial -> (what the diagnosis does, its child script)
DIAGNOSES = {
    "05-layer-norm.py": ("max |error| of dx, dw, db against float64 at M=1151, N=8192, float16, seed 0",
                         _LN_CHILD),
    "07-extern-functions.py": ("the tutorial without its `assert x.is_cuda` line: where it stops", _EXTERN_CHILD),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path", nargs="?", help="folder of the tutorials (triton/python/tutorials)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per tutorial")
    ap.add_argument("--only", nargs="*", help="run only tutorials whose name contains one of these")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--source", default="", help="where the tutorials came from (recorded)")
    args = ap.parse_args(argv)
    folder = Path(args.path) if args.path else None
    if folder is not None and (folder / "python" / "tutorials").is_dir():
        folder = folder / "python" / "tutorials"
    if folder is None or not folder.is_dir():
        print("no tutorials folder given (or not found): pass the path of triton's "
              "python/tutorials; nothing run")
        return 0
    files = sorted(p for p in folder.glob("*.py") if re.match(r"\d\d-", p.name))
    if args.only:
        files = [p for p in files if any(o in p.name for o in args.only)]
    results = {}
    for p in files:
        r = run_one(p.resolve(), args.timeout)
        r["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        if p.name in NOTES and r["outcome"] != "ok":
            r["note"] = NOTES[p.name]
        if p.name in DIAGNOSES and r["outcome"] != "ok":
            what, template = DIAGNOSES[p.name]
            r["diagnosis"] = {"what": what, **_run_diagnosis(template, p.resolve(), args.timeout)}
            print(json.dumps(r["diagnosis"]), flush=True)
        results[p.name] = r
        reason = "" if r["outcome"] == "ok" else \
            f": {r.get('error', '')} {r.get('message', '')} (line {r.get('line', '?')})"
        print(f"{p.name}: {r['outcome']} in {r['seconds']} s{reason}", flush=True)
    counts = {k: sum(1 for r in results.values() if r["outcome"] == k) for k in ("ok", "failed", "timeout")}
    print("counts:", counts)
    if args.no_write:
        return 0
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=ROOT).stdout.strip()
    except OSError:
        commit = "unknown"
    import triton
    record = {
        "what": "Triton's official tutorials run unchanged in simulation (Triton's interpreter, "
                "after import utils); perf_report sweeps skipped",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "triton": triton.__version__},
        "command": "python -m benchmarks.simulators.triton_tutorials PATH",
        "tutorials_source": args.source,
        "counts": counts,
        "results": results,
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
