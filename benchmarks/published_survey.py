"""Does published CUDA C++ compile in the course's CPU emulator as written?

    python benchmarks/published_survey.py [MIRROR]     # writes benchmarks/results/published-survey.json

MIRROR is a git clone of NVIDIA/cuda-samples (default: $COURSE_SURVEY_MIRROR). The script
reads the samples' sources from it at run time (no published code is kept in this
repository), copies each sample's directory with the samples' Common/ headers into a
temporary directory, finds every `__global__` function of the sample's .cu files, and asks
`utils.cuda_kernel(path, name)` for it: the emulator's whole build (the adapter, g++ with the
race detector's instrumentation). The result file records, per kernel, the sample, the name
and "ok" or the first line of the error. Without a mirror it says so and exits cleanly.
Compiling is checked, not running: a kernel's arguments come from its sample's host code.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("COURSE_SIMULATE", "1")

import utils  # noqa: E402

#: the sample directories surveyed (the introduction and the classic technique samples)
SAMPLES = ["Samples/0_Introduction", "Samples/2_Concepts_and_Techniques", "Samples/6_Performance",
           "Samples/3_CUDA_Features"]
SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".c", ".inc")
GLOBAL = re.compile(r"__global__\s+(?:static\s+|inline\s+|__launch_bounds__\s*\([^)]*\)\s*)*void\s+"
                    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(")


def git(mirror: Path, *args) -> str:
    return git_bytes(mirror, *args).decode("utf-8", errors="replace")


def git_bytes(mirror: Path, *args) -> bytes:
    return subprocess.run(["git", "-C", str(mirror), *args], capture_output=True, check=True).stdout


def main(argv):
    mirror = Path(argv[1] if len(argv) > 1 else os.environ.get("COURSE_SURVEY_MIRROR", ""))
    if not str(mirror) or not (mirror / "HEAD").exists() and not (mirror / ".git").exists():
        print("no mirror of NVIDIA/cuda-samples given (argument or COURSE_SURVEY_MIRROR): nothing surveyed")
        return 0
    commit = git(mirror, "rev-parse", "HEAD").strip()
    files = [f for f in git(mirror, "ls-tree", "-r", "--name-only", "HEAD").splitlines()]
    common = [f for f in files if f.startswith("Common/") and f.endswith((".h", ".cuh", ".hpp"))]
    sources = [f for f in files if f.endswith(".cu") and any(f.startswith(s + "/") for s in SAMPLES)]
    rows = []
    for src in sources:
        text = git(mirror, "show", f"HEAD:{src}")
        names = sorted(set(GLOBAL.findall(text)))
        if not names:
            continue
        sample_dir = str(Path(src).parent)
        with tempfile.TemporaryDirectory() as tmp:
            for f in files:
                if (f.startswith(sample_dir + "/") and f.endswith(SOURCE_SUFFIXES)) or f in common:
                    dest = Path(tmp) / (Path(f).name if f in common else Path(f).relative_to(sample_dir))
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        dest.write_bytes(git_bytes(mirror, "show", f"HEAD:{f}"))
                    except subprocess.CalledProcessError:  # listed in the mirror but not stored there
                        pass
            path = Path(tmp) / Path(src).relative_to(sample_dir)
            for name in names:
                t = time.perf_counter()
                try:
                    utils.cuda_kernel(path, name)
                    status, reason = "ok", ""
                except Exception as e:  # noqa: BLE001  every failure is recorded with its reason
                    status = type(e).__name__
                    lines = [ln for ln in str(e).splitlines() if "error" in ln or "does not support" in ln]
                    reason = (lines[0] if lines else str(e).splitlines()[0])[:300]
                    reason = reason.replace(tmp + "/", "").replace(str(ROOT) + "/", "")
                rows.append({"file": src, "kernel": name, "status": status, "reason": reason,
                             "seconds": round(time.perf_counter() - t, 2)})
                print(f"{status:18s} {src}:{name}  {reason[:120]}")
    ok = sum(r["status"] == "ok" for r in rows)
    course = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    record = {"course_commit": course.stdout.strip() or None,
              "source": "github.com/NVIDIA/cuda-samples", "commit": commit, "surveyed": SAMPLES,
              "kernels": len(rows), "compiled": ok, "failed": len(rows) - ok, "results": rows}
    out = ROOT / "benchmarks" / "results" / "published-survey.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{ok} of {len(rows)} kernels compiled; wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
