"""Hunt for graders that depend on the draw: grade every mistake-catalog entry, and every
solution cell (with the check cell after it), under many fresh seeds, and print each verdict
or message that is not what the catalog says, with the seed that repeats it.

The suite grades each entry once per run on a fresh seed, so an entry that fails on one draw
in fifty fails one CI run in fifty. Run this after changing a grader, its inputs or its
diagnoses (laptop mode; about 1 s per grading):

    COURSE_NO_SYSTEM_CUDA=1 python tests/seed_sweep.py --seeds 8 [--only 09] [--solutions]
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import mistakes as M

import utils  # noqa: F401  (before numba/triton: picks the simulator or the GPU)


def solution_entries(exercise: str) -> list[M.Mistake]:
    """One entry per solution cell that changes nothing: the solution itself, which its check
    cell must accept on every draw. A cell is found by a line no other solution cell has."""
    cells = M._cells(exercise)
    solutions = [src for _, src, _, sol in cells if sol]
    out = []
    for i, src, _, sol in cells:
        if not sol:
            continue
        lines = [ln for ln in src.splitlines()
                 if ln.strip() and src.count(ln) == 1 and sum(ln in s for s in solutions) == 1]
        if lines:
            out.append(M.Mistake(f"solution-cell-{i}", lines[0], lines[0], lines[0], verdict="accepted"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=4, help="gradings of each entry, each on a fresh seed")
    ap.add_argument("--only", default="", help="exercises whose name starts with this (e.g. 09)")
    ap.add_argument("--solutions", action="store_true", help="grade the solutions, not the catalogs")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.solutions:
        entries = [(ex, m) for ex in M.exercises() for m in solution_entries(ex)]
    else:
        entries = M.all_mistakes()
    entries = [(ex, m) for ex, m in entries if ex.startswith(args.only)]
    start, failures = time.time(), 0
    for ex, m in entries:
        grader = M._GRADERS.setdefault(ex, M.Grader(ex))
        for _ in range(args.seeds):
            verdict = grader.grade(m)
            problems = M.explain(ex, m, verdict)
            if problems:
                failures += 1
                seed = re.search(r"Inputs came from seed (\d+)", verdict.message)
                print(f"DEPENDS ON THE DRAW (seed {seed.group(1) if seed else 'not named'}): {problems[0]}\n",
                      flush=True)
        print(f"{ex}/{m.name}: {args.seeds} gradings ({time.time() - start:.0f} s)", flush=True)
    print(f"{failures} of {len(entries) * args.seeds} gradings not as the catalog says")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
