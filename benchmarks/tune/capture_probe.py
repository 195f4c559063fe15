"""Which host read inside a CUDA graph capture breaks a later capture, and what recovers it
(on a GPU). Each scenario runs in a fresh process; the JSON record lists what each step raised.

    python -m benchmarks.tune.capture_probe [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

SCENARIO = textwrap.dedent(r'''
import gc, json, sys, threading
import torch, triton, triton.language as tl
import utils
from runtime import graphs

@triton.jit
def add_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

READS = {"item": lambda t: t.item(), "bool": lambda t: bool(t.sum() > 0), "float": lambda t: float(t.max()),
         "print": lambda t: print(t), "equal": lambda t: torch.equal(t, t + 1), "tolist": lambda t: t.tolist(),
         "cpu": lambda t: t.cpu(), "numpy": lambda t: t.cpu().numpy()}
steps, recover, follow, warm = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4] == "warm"
log = []
DEV = utils.DEVICE
x = torch.randn(64, device=DEV)
y = torch.zeros(64, device=DEV)
if warm:
    add_one_kernel[(1,)](x, y, 64, BLOCK=64)

def collect_during(fn):
    """fn, with Python's collector made to run at the next allocations, as it may at any time."""
    def run():
        old = gc.get_threshold()
        gc.set_threshold(1, 1, 1)
        try:
            junk = [[] for _ in range(100)]  # allocations: the collector runs if it is enabled
            del junk
        finally:
            gc.set_threshold(*old)
        return fn()
    return run


def capture_with_torch_graph(g2, fn):
    """torch.cuda.graph itself, without the course's wrapper (the collector runs on)."""
    try:
        with torch.cuda.graph(g2):
            fn()
        return None, None
    except Exception as e:
        graphs.recover_after_failed_capture()
        return None, e


def follow_up(tag):
    y.zero_()
    torch.randn(4, device=DEV)
    g2 = utils.CUDAGraph()
    fn = (lambda: add_one_kernel[(1,)](x, y, 64, BLOCK=64)) if follow == "triton" else (lambda: y.copy_(x + 1))
    if recover in ("gc_torch_graph", "gc_course_graph"):
        fn = collect_during(fn)
    if recover == "gc_torch_graph" and not utils.SIMULATE:
        _, err = capture_with_torch_graph(g2, fn)
    else:
        _, err = graphs.capture(g2, fn)
    if err is None:
        g2.replay()
        if not utils.SIMULATE:
            torch.cuda.synchronize()
        ok = bool(torch.equal(y, x + 1))
        log.append({"step": tag, "ok": ok})
    else:
        log.append({"step": tag, "error": f"{type(err).__name__}: {err}"[:300]})

for s in steps:
    g = utils.CUDAGraph()
    _, err = graphs.capture(g, lambda: READS[s](x[:1]))
    err_text = f"{type(err).__name__}: {err}"[:200] if err else None
    log.append({"step": s, "capture_error": err_text,
                "threads": [t.name for t in threading.enumerate()]})
    if recover.startswith("gc_"):   # the failed graph in a reference cycle, as a traceback leaves it
        cycle = [g, err]
        cycle.append(cycle)
        del cycle
    if utils.SIMULATE:
        pass
    elif recover == "new_stream":
        torch.cuda.graph.default_capture_stream = None
    elif recover == "sync":
        torch.cuda.synchronize(); torch.cuda.empty_cache()
    del g, err
    try:
        follow_up("after " + s)
    except Exception as e:
        log.append({"step": "after " + s, "raised": f"{type(e).__name__}: {e}"[:300]})
print("JSON" + json.dumps(log))
''')

SCENARIOS = [
    ("tolist", "none", "triton", "cold"), ("tolist", "none", "triton", "warm"), ("tolist", "none", "torch", "warm"),
    ("cpu", "none", "triton", "warm"), ("numpy", "none", "triton", "warm"),
    ("item,bool,float,print,equal,tolist,cpu", "none", "triton", "warm"),
    ("item,bool,float,print,equal,tolist,cpu", "none", "triton", "cold"),
    ("tolist", "new_stream", "triton", "warm"), ("tolist", "sync", "triton", "warm"),
    ("tolist,tolist", "none", "triton", "warm"), ("item,tolist", "none", "triton", "warm"),
    # a failed capture's graph in a reference cycle, collected during the next capture
    ("item", "gc_torch_graph", "triton", "warm"), ("item", "gc_course_graph", "triton", "warm"),
    ("tolist", "gc_torch_graph", "triton", "warm"), ("tolist", "gc_course_graph", "triton", "warm"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    results = []
    fd, script = tempfile.mkstemp(suffix=".py", prefix="capture_probe_")   # @triton.jit needs a file
    with os.fdopen(fd, "w") as f:
        f.write(SCENARIO)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for sc in SCENARIOS:
        proc = subprocess.run([sys.executable, script, *sc], capture_output=True, text=True, timeout=180, env=env)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("JSON")), None)
        res = {"scenario": list(sc), "rc": proc.returncode,
               "log": json.loads(line[4:]) if line else None, "stderr": proc.stderr[-1500:] if not line else ""}
        results.append(res)
        print(json.dumps(res), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
