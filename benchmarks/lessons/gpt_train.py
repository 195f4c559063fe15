"""Lesson 11 on a GPU: GPT-2 124M trained on torch's kernels and on the course's.

    python -m benchmarks.lessons.gpt_train                    # on a GPU: 124M, T = 1024, batch 16, bf16
    python -m benchmarks.lessons.gpt_train --tiny --steps 2   # on a laptop: a tiny model, float32, in simulation

The configurations (``CONFIGS``, in the order they run), each from the same initial weights
(``GPT(cfg, seed=0)``) on the same batches (drawn once from a seeded generator):

    torch eager              torch's kernels (SDPA attention, F.layer_norm, F.gelu, cuBLAS) under
                             bfloat16 autocast, torch's fused AdamW
    torch.compile            the same model through torch.compile (Inductor; ``aot_eager`` with --tiny)
    + cross entropy ...      the ablation (``ABLATION``): torch eager with the course's kernel of one
    + embedding (lesson 11)  operator swapped in at a time (kernels/ops.py), keeping the swaps before
                             it (``--ablation-steps`` steps each)
    course + cuBLAS          the training step written out on the course's kernels
                             (kernels/gpt_step.py: bfloat16 activations, fused, its own AdamW)
    course + Triton matmul   the same step with lesson 06's Triton matmul

Each trains ``--steps`` AdamW steps (gradient clipping at 1.0, a warmup of WARMUP_STEPS).
Recorded in ``<out>/gpt-train.json``: the loss of every step; tokens/s and ms/step over the
steps after ``--warmup`` (synchronized, wall clock); peak memory (``max_memory_allocated``);
a torch.profiler breakdown of ``--profile-steps`` steps (self device time per operator, the top
ones, each kernel attributed to its operator by ``attribute``, the sums per operator in
``by_op``, torch's elementwise operators in ``torch_elementwise``); and, for torch eager and the
two written-out steps, the whole training step captured in a CUDA Graph and replayed (ms/step
against the same step launched op by op); the goals (``GOALS``) and whether they are met.
``gpt-train.png`` plots the loss curves.

How agreement of the loss curves is judged (``agreement`` in the JSON): the first loss, from
identical weights and batch, must agree within 0.02 (bf16 rounding only); then over the last
quarter of the steps the mean loss of a configuration must differ from torch eager's by less
than the batch-to-batch noise, the standard deviation of torch eager's loss over those steps.

The corpus: the course's own prose as character ids (``utils.char_dataset``), nothing downloaded;
the vocabulary stays GPT-2's 50304 rows (only the first ~110 ids occur).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import utils  # noqa: E402

#: The configurations: (backend of the model's operators, matmul, torch.compile, the written-out step).
SETUP = {"torch eager": ("torch", "torch", False, False), "torch.compile": ("torch", "torch", True, False),
         "course + cuBLAS": ("course", "torch", False, True),
         "course + Triton matmul": ("course", "triton", False, True)}
#: The kernel-swap ablation: torch eager with the course's kernel of one operator swapped in at
#: a time, cumulatively (each configuration keeps the swaps before it), then the written-out
#: step ("course + cuBLAS": the fusions, bfloat16 activations, the flat AdamW).
ABLATION = (("+ cross entropy (lesson 11)", "cross_entropy"), ("+ attention (lesson 10)", "attention"),
            ("+ LayerNorm (lesson 09)", "layernorm"), ("+ GELU (lesson 03)", "gelu"),
            ("+ embedding (lesson 11)", "embedding"))
for _i, (_name, _op) in enumerate(ABLATION):
    SETUP[_name] = (tuple(op for _, op in ABLATION[:_i + 1]), "torch", False, False)
#: Every configuration, in the order a run trains them (the ablation between eager and the step).
CONFIGS = ("torch eager", "torch.compile", *(n for n, _ in ABLATION), "course + cuBLAS", "course + Triton matmul")


def ops_of(name):
    """The :class:`utils.Ops` of a configuration that runs the model's forward (not the step)."""
    backend, matmul, _, _ = SETUP[name]
    if isinstance(backend, tuple):   # an ablation step: torch's operators, some of them the course's
        course = utils.ops_for("course", matmul)
        ops = utils.ops_for("torch", matmul)
        src = dict(ops.sources)
        src.update({op: course.source(op) for op in backend})
        import dataclasses
        return dataclasses.replace(ops, **{op: getattr(course, op) for op in backend}, sources=tuple(src.items()))
    return utils.ops_for(backend, matmul)


STEP_SOURCES = {"step": "kernels/gpt_step.py: forward, backward and AdamW written out as launches",
                "fusions": "residual add + LayerNorm, bias + GELU (lesson 11), LayerNorm backward adding the "
                           "residual's gradient",
                "precision": "bfloat16 activations, float32 statistics, gradients and master weights",
                "optimizer": "AdamW over one flat buffer: 2 launches, plus 2 for the norm and 1 for the schedule"}


def _sync():
    if utils.DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _batches(n, batch, T, seed=0):
    _, train, _ = utils.char_dataset(0.1)
    gen = torch.Generator().manual_seed(seed)
    xs, ys = zip(*(utils.get_batch(train, batch, T, gen) for _ in range(n)))
    return torch.stack(xs).to(utils.DEVICE), torch.stack(ys).to(utils.DEVICE)


class Trainer:
    """One configuration: its model, optimizer and step function."""

    def __init__(self, name, cfg, args):
        backend, matmul, compiled, written_out = SETUP[name]
        self.name, self.args = name, args
        gpu = utils.DEVICE.type == "cuda"
        if written_out:
            from kernels.gpt_step import TrainStep
            self.model = utils.GPT(cfg, "torch", seed=0).to(utils.DEVICE)
            self.opt = None
            self.step_fn = TrainStep(self.model, batch=args.batch, T=args.T, lr=args.lr, warmup=WARMUP_STEPS,
                                     dtype=torch.bfloat16 if gpu else torch.float32, matmul=matmul)
            return
        self.step_fn = None
        self.model = utils.GPT(cfg, ops=ops_of(name), seed=0).to(utils.DEVICE)
        self.opt = utils.make_optimizer(self.model, lr=args.lr, fused=True if gpu else None)
        self.fwd = self.model
        if compiled:
            self.fwd = torch.compile(self.model, backend="inductor" if gpu else "aot_eager")
        # no cast cache: the same step is captured in a CUDA Graph below
        self.amp = torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False) if gpu else None

    def step(self, x, y):
        if self.step_fn is not None:
            return self.step_fn(x, y)
        if self.amp is not None:
            with self.amp:
                _, loss = self.fwd(x, y)
        else:
            _, loss = self.fwd(x, y)
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss.detach()


#: The learning rate's linear warmup (every configuration; the written-out step keeps it on the device).
WARMUP_STEPS = 20


def _lr_schedule(opt, lr, step, warmup=WARMUP_STEPS):
    if opt is None:   # the written-out step: its schedule runs on the device
        return
    for g in opt.param_groups:
        g["lr"] = lr * min(1.0, (step + 1) / warmup)


T_START = time.perf_counter()


def run_config(name, cfg, args, xs, ys, reserve=0.0):
    """Trains one configuration; stops early (and says so) when the run's time budget, less
    ``reserve`` seconds kept for the configurations still to come, is spent."""
    res = {"name": name}
    deadline = T_START + args.budget - reserve
    t_build = time.perf_counter()
    tr = Trainer(name, cfg, args)
    if utils.DEVICE.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses = []
    times = []
    steps = args.steps
    if args.ablation_steps and name.startswith("+ "):
        steps = min(steps, args.ablation_steps)
    for s in range(steps):
        _lr_schedule(tr.opt, args.lr, s)
        _sync()
        t0 = time.perf_counter()
        loss = tr.step(xs[s % len(xs)], ys[s % len(ys)])
        _sync()
        losses.append(float(loss))   # (after the timing: the written-out step reuses its loss buffer)
        times.append(time.perf_counter() - t0)
        if s == 0:
            res["first_step_s"] = times[0]   # compile, autotuning
        if time.perf_counter() > deadline and s + 1 >= args.warmup + 5:
            res["stopped_early"] = f"time budget: {s + 1} of {steps} steps"
            break
    res["losses"] = losses
    timed = times[args.warmup:] or times
    ms = 1000 * sum(timed) / len(timed)
    res.update(ms_per_step=ms, tokens_per_s=args.batch * args.T / (ms / 1000), timed_steps=len(timed),
               build_and_train_s=time.perf_counter() - t_build)
    if utils.DEVICE.type == "cuda":
        res["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
    res["profile"] = _profile(tr, xs, ys, args)
    if (args.graphs and name in ("torch eager", "course + cuBLAS", "course + Triton matmul")
            and utils.DEVICE.type == "cuda"
            and time.perf_counter() < deadline + 10):
        res["cuda_graph"] = _graph(tr, xs, ys, args)
    del tr
    if utils.DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    return res


def _profile(tr, xs, ys, args):
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if utils.DEVICE.type == "cuda" else [])
    n = args.profile_steps
    try:
        _sync()
        with profile(activities=acts) as prof:
            for s in range(n):
                tr.step(xs[s], ys[s])
            _sync()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    gpu = utils.DEVICE.type == "cuda"
    rows = []
    for ev in prof.key_averages():
        t = (ev.self_device_time_total if gpu else ev.self_cpu_time_total) / 1000 / n   # ms per step
        if t > 0:
            # a GPU kernel, or a CPU-side operator whose self device time repeats its kernels'
            kernel = "CUDA" in str(getattr(ev, "device_type", "")) if gpu else True
            rows.append({"op": ev.key, "ms_per_step": t, "calls_per_step": ev.count / n, "kernel": kernel})
    rows.sort(key=lambda r: -r["ms_per_step"])
    for r in rows:
        r["attributed"] = attribute(r["op"]) if r["kernel"] else None
    total = sum(r["ms_per_step"] for r in rows if r["kernel"])
    by_op = {}
    for r in rows:
        if r["kernel"]:
            by_op[r["attributed"]] = by_op.get(r["attributed"], 0.0) + r["ms_per_step"]
    # torch's own elementwise operators and copies (CPU-side rows: their self device time is their kernels')
    torch_ops = {r["op"]: {"ms_per_step": r["ms_per_step"], "calls_per_step": r["calls_per_step"]}
                 for r in rows if not r["kernel"] and r["op"] in TORCH_ELEMENTWISE}
    return {"device": "cuda" if gpu else "cpu", "steps": n, "total_ms_per_step": total,
            "what": ("self device time per step (total over GPU kernel rows)" if gpu
                     else "self CPU time per step"),
            "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1])), "torch_elementwise": torch_ops,
            "top": rows[:args.top]}


#: torch operators that are elementwise work or copies around the model's operators.
TORCH_ELEMENTWISE = ("aten::mul", "aten::mul_", "aten::add", "aten::add_", "aten::copy_", "aten::to", "aten::_to_copy",
                     "aten::sub", "aten::div", "aten::fill_", "aten::zero_", "aten::clone", "aten::cat",
                     "aten::sum", "aten::_foreach_mul_", "aten::_foreach_norm", "aten::addcmul_", "aten::lerp_")

#: How a GPU kernel's name tells its operator: (operator, substrings of kernel names), first match wins.
ATTRIBUTION = (
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "matmul_kernel", "gemv", "splitkreduce", "cublas",
                "linear_kernel", "linear_tma_kernel", "split_sum_kernel")),
    ("attention", ("flash", "attn_", "fmha", "efficient_attention", "attention")),
    ("LayerNorm", ("layer_norm", "layernorm", "gammabeta", "column_sum")),
    ("GELU", ("gelu",)),
    ("cross entropy", ("cross_entropy", "softmax", "nll_loss", "logsoftmax")),
    ("embedding", ("embedding", "indexselect", "index_select", "embedding_backward", "sort", "radix", "scan")),
    ("AdamW + clipping", ("adam", "grad_norm", "multi_tensor", "foreach", "norm")),
    ("bias gradients", ("column_partials", "reduce_kernel")),
    ("casts and copies", ("copy", "cast", "_to_copy", "convert")),
    ("other elementwise (torch)", ("elementwise", "vectorized", "fill", "mul", "add")),
    ("fused by Inductor", ("triton_",)),
)


def attribute(kernel: str) -> str:
    """The model operator a GPU kernel's name belongs to (lower case search, first match)."""
    k = kernel.lower()
    for op, keys in ATTRIBUTION:
        if any(key in k for key in keys):
            return op
    return "other"


def _graph(tr, xs, ys, args):
    """The whole step (forward, backward, clipping, AdamW) captured once and replayed."""
    try:
        for g in (tr.opt.param_groups if tr.opt is not None else ()):
            g["capturable"] = True
            g["lr"] = torch.tensor(args.lr, device=utils.DEVICE)
        sx, sy = xs[0].clone(), ys[0].clone()
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            for _ in range(3):
                tr.step(sx, sy)
        torch.cuda.current_stream().wait_stream(st)
        graph = torch.cuda.CUDAGraph()
        if tr.opt is not None:
            tr.opt.zero_grad(set_to_none=False)
        with torch.cuda.graph(graph):
            static_loss = tr.step(sx, sy)
        n = args.graph_steps

        def timed(fn):
            _sync()
            t0 = time.perf_counter()
            for s in range(n):
                sx.copy_(xs[s % len(xs)])
                sy.copy_(ys[s % len(ys)])
                fn()
            _sync()
            return 1000 * (time.perf_counter() - t0) / n
        eager_ms = timed(lambda: tr.step(sx, sy))
        graph_ms = timed(graph.replay)
        return {"steps": n, "eager_ms": eager_ms, "graph_ms": graph_ms, "saved_ms": eager_ms - graph_ms,
                "last_loss": float(static_loss)}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}


def agreement(configs):
    """Each configuration's loss curve against torch eager's over the SAME steps: the first loss, and
    the mean over the last quarter of the steps both ran (a configuration stopped early by the
    time budget is compared over its own last quarter, with eager's losses of those steps)."""
    ref = next(c for c in configs if c["name"] == "torch eager" and "losses" in c)
    out = {}
    for c in configs:
        if "losses" not in c or c is ref:
            continue
        n = min(len(c["losses"]), len(ref["losses"]))
        tail = max(1, n // 4)
        r = torch.tensor(ref["losses"][n - tail:n])
        m = torch.tensor(c["losses"][n - tail:n])
        noise = float(r.std()) if tail > 1 else float("nan")
        first = abs(c["losses"][0] - ref["losses"][0])
        diff = float(m.mean() - r.mean())
        ok = first < 0.02 and (math.isnan(noise) or abs(diff) < noise)
        out[c["name"]] = {"first_loss_diff": first, "steps_compared": [n - tail, n], "tail_steps": tail,
                          "tail_mean_diff": diff, "eager_tail_std": noise, "agrees": bool(ok)}
    return out


#: The goals of the written-out step: (what, configuration, baseline, kind, ratio).
GOALS = (("tokens/s >= 1.3 x torch eager", "course + cuBLAS", "torch eager", "speed", 1.3),
         ("tokens/s >= 1.0 x torch.compile", "course + cuBLAS", "torch.compile", "speed", 1.0),
         ("tokens/s >= 1.1 x torch.compile (llm.c's margin)", "course + cuBLAS", "torch.compile", "speed", 1.1),
         ("peak memory <= torch.compile's", "course + cuBLAS", "torch.compile", "memory", 1.0),
         ("tokens/s >= 0.9 x course + cuBLAS", "course + Triton matmul", "course + cuBLAS", "speed", 0.9))


def targets(configs):
    runs = {c["name"]: c for c in configs if "tokens_per_s" in c}
    out = []
    for what, name, base, kind, ratio in GOALS:
        row = {"goal": f"{name}: {what}", "config": name, "baseline": base, "value": None, "met": None}
        if name in runs and base in runs:
            if kind == "speed":
                row["value"] = runs[name]["tokens_per_s"] / runs[base]["tokens_per_s"]
                row["met"] = row["value"] >= ratio
            elif "peak_memory_gb" in runs[name] and "peak_memory_gb" in runs[base]:
                row["value"] = runs[name]["peak_memory_gb"] / runs[base]["peak_memory_gb"]
                row["met"] = row["value"] <= ratio
        out.append(row)
    return out


def plot(res, path):
    """Two panels: torch eager's loss, and each configuration's loss minus eager's (a 10-step
    running mean), so that curves that agree do not hide each other."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [c for c in res["configs"] if "losses" in c]
    eager = next((c for c in runs if c["name"] == "torch eager"), None)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if eager is not None:
        base = torch.tensor(eager["losses"])
        left.plot(base, color="k", lw=1)
        k = 10
        for i, c in enumerate(r for r in runs if r is not eager):
            diff = torch.tensor(c["losses"]) - base[:len(c["losses"])]
            smooth = diff.unfold(0, k, 1).mean(1) if len(diff) >= k else diff
            ablation = c["name"].startswith("+ ")
            right.plot(range(len(diff) - len(smooth), len(diff)), smooth, color=f"C{i}", lw=0.8 if ablation else 1.2,
                       ls=":" if ablation else "-", label=f"{c['name']} ({c['tokens_per_s'] / 1e3:.0f}k tok/s)")
        right.axhline(0, color="k", lw=0.8)
        right.legend(fontsize=7)
    left.set(xlabel="step", ylabel="training loss", yscale="log",
             title=f"torch eager ({eager['tokens_per_s'] / 1e3:.0f}k tok/s)" if eager else "")
    right.set(xlabel="step", ylabel="loss - eager's loss (10-step mean)", title="each configuration against eager")
    fig.suptitle(f"GPT-2 124M on the course's text, {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny model (for a laptop; float32, no autocast)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10, help="steps not timed (compile, autotuning)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--graph-steps", type=int, default=20)
    ap.add_argument("--no-graphs", dest="graphs", action="store_false")
    ap.add_argument("--top", type=int, default=80)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    ap.add_argument("--ablation-steps", type=int, default=None,
                    help="steps of the ablation's configurations (default: --steps)")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds for the whole run: later configurations "
                    "keep about 30 s each, a configuration past its share trains fewer steps")
    ap.add_argument("--out", type=Path, default=utils.LESSON_RESULTS_DIR)
    args = ap.parse_args(argv)
    if args.tiny:
        cfg = utils.GPTConfig(vocab_size=128, block_size=8, n_layer=1, n_head=2, n_embd=32)
        args.batch, args.T = 2, 8
        args.warmup = min(args.warmup, max(0, args.steps - 1))
        args.profile_steps = 1
        args.graph_steps = 2
    else:
        cfg = utils.GPT2_124M
    args.out.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.configs.split(",")]
    xs, ys = _batches(max(args.steps, args.profile_steps), args.batch, args.T)
    device = torch.cuda.get_device_name() if utils.DEVICE.type == "cuda" else "CPU (simulation)"
    res = {"what": "GPT-2 training step: torch eager, torch.compile, course kernels + cuBLAS, course kernels + Triton "
                   "matmul; same initial weights and batches",
           "device": device, "torch": torch.__version__, "config": {**vars(cfg), "batch": args.batch, "T": args.T},
           "autocast": "bfloat16" if utils.DEVICE.type == "cuda" else None, "steps": args.steps,
           "warmup": args.warmup, "commit": utils.source_commit(), "ops": {}, "configs": []}
    for k, name in enumerate(names):
        if name not in SETUP:
            raise SystemExit(f"unknown configuration {name!r}: choose from {', '.join(CONFIGS)}")
        if SETUP[name][3]:
            res["ops"][name] = {**STEP_SOURCES, "linear": utils.ops_for("course", SETUP[name][1]).source("linear")}
        else:
            res["ops"][name] = dict(ops_of(name).sources)
        t0 = time.perf_counter()
        try:
            with (utils.race_checks_off() if utils.SIMULATE else _null()):
                c = run_config(name, cfg, args, xs, ys, reserve=30.0 * (len(names) - 1 - k))
        except Exception as e:
            c = {"name": name, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        c["wall_s"] = time.perf_counter() - t0
        res["configs"].append(c)
        tps, ms = c.get("tokens_per_s", float("nan")), c.get("ms_per_step", float("nan"))
        line = (f"{name:24s} {tps:>10,.0f} tok/s  {ms:7.1f}"
                f" ms/step  peak {c.get('peak_memory_gb', float('nan')):5.1f} GB  loss {c['losses'][0]:.3f} -> "
                f"{c['losses'][-1]:.3f}  ({c['wall_s']:.0f} s)" if "losses" in c else f"{name}: {c['error']}")
        print(line, flush=True)
        if "cuda_graph" in c:
            print(f"{'':24s} CUDA Graph: {c['cuda_graph']}", flush=True)
        (args.out / "gpt-train.json").write_text(json.dumps(res, indent=1) + "\n")
    if any(c["name"] == "torch eager" and "losses" in c for c in res["configs"]):
        res["agreement"] = agreement(res["configs"])
        print(json.dumps(res["agreement"], indent=1))
    res["targets"] = targets(res["configs"])
    for t in res["targets"]:
        print(f"{t['goal']:60s} {t['value'] if t['value'] is None else round(t['value'], 3)}  met: {t['met']}")
    (args.out / "gpt-train.json").write_text(json.dumps(res, indent=1) + "\n")
    try:
        plot(res, args.out / "gpt-train.png")
    except Exception as e:
        print(f"no plot: {e}")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    main()
