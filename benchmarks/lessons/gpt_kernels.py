"""Lesson 11's kernels on a GPU: fused cross-entropy, the embedding backward, AdamW with the
gradient norm, bias + GELU and residual add + LayerNorm, each checked against torch, then
timed with ``triton.testing.do_bench`` (median) beside torch eager, torch.compile where it
fits the time budget, the unfused pair of each fusion and the copy bandwidth of the same run.

    python -m benchmarks.lessons.gpt_kernels [--out FILE.json] [--budget 100]

Without ``--out`` it writes ``benchmarks/results/lessons/<gpu>-lesson11.json``, named from the GPU
(``utils.gpu_slug``: ``h100-lesson11.json`` on an H100, ``h200-lesson11.json`` on an H200);
a ``--smoke`` run writes nothing there unless given ``--out``.

The shapes are the GPT-2 124M training step's (16 x 1024 tokens, width 768, vocabulary 50304,
124,475,904 parameters). The targets come from each topic's ``TARGETS`` (utils/topics/*.py).
Sections run in order of priority and stop starting new ones past ``--budget`` seconds; the
JSON is rewritten after every row, so a run cut short still leaves what it measured.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
import traceback
from pathlib import Path

import torch

import kernels
import utils

T0 = time.time()
ROWS: list[dict] = []
OUT: dict = {}
#: --smoke: every section at small sizes on utils.DEVICE (also in simulation), one untimed call
#: each, to try the script before spending GPU time on it.
SMOKE = False
DEV = "cuda"


def size(gpu, small):
    return small if SMOKE else gpu


def save(path):
    OUT["rows"] = ROWS
    OUT["elapsed_s"] = round(time.time() - T0, 1)
    Path(path).write_text(json.dumps(OUT, indent=1))


def bench_ms(fn, rep=60):
    if SMOKE:
        t = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t)
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=10, rep=rep))


def row(path, topic, variant, shape, nbytes, ms, **extra):
    r = dict(topic=topic, variant=variant, shape=list(shape), median_ms=round(ms, 5),
             gbps=round(nbytes / ms / 1e6, 1) if nbytes else None, **extra)
    ROWS.append(r)
    print(f"[{topic}] {variant:<34} {str(tuple(shape)):<22} {ms:8.4f} ms"
          + (f"  {r['gbps']:8.1f} GB/s" if nbytes else ""), flush=True)
    save(path)


def section(name, budget):
    left = budget - (time.time() - T0)
    if left <= 0:
        print(f"[{name}] skipped: the time budget is spent", flush=True)
        OUT.setdefault("skipped", []).append(name)
        return False
    return True


def checked(name, cond, detail=""):
    OUT.setdefault("checks", {})[name] = bool(cond)
    if not cond:
        print(f"CHECK FAILED: {name} {detail}", flush=True)
    return bool(cond)


# ---------------------------------------------------------------------------------------
def copy_section(path):
    n = size(1 << 28, 1 << 12)
    x = torch.randn(n, device=DEV)
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x))
    row(path, "copy", "torch copy_", (n,), 8 * n, ms)
    OUT["copy_gbps"] = ROWS[-1]["gbps"]


def ce_problem(dtype):
    """The cross-entropy problem: the logits x (rows x V), the targets t (every 7th row
    ignored), the dtype's name, and torch's (loss, gradient) as a function of x."""
    rows, V = size(8192, 64), size(50304, 1000)
    name = "float32" if dtype == torch.float32 else "bfloat16"
    x = (2 * torch.randn(rows, V, device=DEV)).to(dtype)
    t = torch.randint(0, V, (rows,), device=DEV)
    t[::7] = -100

    def torch_ce(x):
        xx = x.detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(xx, t)
        loss.backward()
        return loss, xx.grad
    return x, t, name, torch_ce


def ce_section(path, dtype):
    x, t, name, torch_ce = ce_problem(dtype)
    rows, V = x.shape
    nbytes = 3 * x.element_size() * rows * V  # two reads and one write of the logits
    # the reference in float32 from the same (rounded) logits: what the kernels compute, every sum
    # in float32 (torch's own bfloat16 loss is rounded to bfloat16: 12.6875 for 12.773)
    want_loss, want_grad = torch_ce(x.float())
    for lang in ("triton", "cuda"):
        for v in reversed(kernels.module("cross_entropy", lang).VERSIONS):  # the best first
            fn = kernels.get("cross_entropy", lang, v)
            loss, grad = fn(x, t)
            grad_err = float((grad.float() - want_grad.float()).abs().max())
            ok = checked(f"cross_entropy {name} {lang} {v}",
                         abs(float(loss) - float(want_loss)) < 1e-3 * (1 + abs(float(want_loss)))
                         and grad_err < (1e-5 if name == "float32" else 2e-3))
            ms = bench_ms(lambda: fn(x, t))
            row(path, "cross_entropy", f"{lang} {v}", (rows, V), nbytes, ms, dtype=name, checked=ok)
        xi = x.clone()
        fn = kernels.get("cross_entropy", lang)
        ms = bench_ms(lambda: fn(xi, t, inplace=True))
        row(path, "cross_entropy", f"{lang} reference in place", (rows, V), nbytes, ms, dtype=name)
    ms = bench_ms(lambda: torch_ce(x))
    row(path, "cross_entropy", "torch eager", (rows, V), nbytes, ms, dtype=name)


def adamw_section(path):
    n = size(124_475_904, 4096)
    p = torch.randn(n, device=DEV)
    g = torch.randn(n, device=DEV)
    m = torch.zeros(n, device=DEV)
    v = torch.zeros(n, device=DEV)
    nbytes = 28 * n
    hp = dict(lr=6e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    SUB = size(1 << 20, 1024)
    # correctness: 3 steps against torch's fused AdamW on a copy
    ref = torch.nn.Parameter(p[: SUB].clone())
    opt = torch.optim.AdamW([ref], lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    for lang in ("triton", "cuda"):
        pp, mm, vv = p[: SUB].clone(), torch.zeros(SUB, device=DEV), torch.zeros(SUB, device=DEV)
        r = torch.nn.Parameter(p[: SUB].clone())
        o = torch.optim.AdamW([r], lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
        for step in range(1, 4):
            gg = torch.randn(SUB, device=DEV)
            kernels.get("adamw", lang)(pp, gg, mm, vv, step=step, **hp)
            r.grad = gg
            o.step()
        checked(f"adamw {lang} 3 steps vs torch fused", float((pp - r.detach()).abs().max()) < 1e-5)
    del ref, opt
    for lang in ("triton", "cuda"):
        for ver in ("v2", "v1"):
            fn = kernels.get("adamw", lang, ver)
            ms = bench_ms(lambda: fn(p, g, m, v, step=5, **hp))
            row(path, "adamw", f"{lang} {ver}", (n,), nbytes, ms)
    for kind in ("fused", "foreach"):
        prm = torch.nn.Parameter(p.clone())
        prm.grad = g.clone()
        opt = torch.optim.AdamW([prm], lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **{kind: True})
        opt.step()
        ms = bench_ms(opt.step)
        row(path, "adamw", f"torch AdamW {kind}=True", (n,), nbytes, ms)
        del prm, opt
    for lang in ("triton", "cuda"):
        gn = kernels.module("adamw", lang).grad_norm
        norm, _ = gn(g, 1.0)
        checked(f"grad_norm {lang}", abs(float(norm) - float(g.double().norm())) < 1e-3 * float(g.double().norm()))
        ms = bench_ms(lambda: gn(g, 1.0))
        row(path, "grad_norm", f"{lang}", (n,), 4 * n, ms)
    ms = bench_ms(lambda: torch.linalg.vector_norm(g))
    row(path, "grad_norm", "torch linalg.vector_norm", (n,), 4 * n, ms)


def embedding_section(path):
    N, V, D = size(16 * 1024, 256), size(50304, 500), size(768, 32)
    dout = torch.randn(N, D, device=DEV)
    dw = torch.zeros(V, D, device=DEV)
    nbytes = 4 * N * D + 8 * N + 2 * 4 * min(N, V) * D
    zipf = 1.0 / torch.arange(1, V + 1, device=DEV, dtype=torch.float64)
    for dist in ("uniform", "zipf"):
        # uniform ids: few repeats; Zipf's law (p(k) ~ 1/k, as words in text): the commonest id
        # holds about 9 % of the tokens, a run of about 1,500 equal ids after the sort
        ids = (torch.randint(0, V, (N,), device=DEV) if dist == "uniform"
               else torch.multinomial(zipf, N, replacement=True))
        runs = int(torch.bincount(ids, minlength=V).max())
        want = torch.ops.aten.embedding_dense_backward(dout, ids, V, -1, False)
        for lang in ("triton", "cuda"):
            for ver in ("v4", "v3", "v2"):
                fn = kernels.get("embedding", lang, ver)
                got = fn(ids, dout, torch.zeros(V, D, device=DEV))
                ok = checked(f"embedding_backward {lang} {ver} {dist}", float((got - want).abs().max()) < 1e-2)
                ms = bench_ms(lambda: fn(ids, dout, dw))
                row(path, "embedding_backward", f"{lang} {ver}", (N, V, D), nbytes, ms, checked=ok, ids=dist,
                    longest_run=runs)
        ms = bench_ms(lambda: torch.ops.aten.embedding_dense_backward(dout, ids, V, -1, False))
        row(path, "embedding_backward", "torch eager (embedding_dense_backward)", (N, V, D), nbytes, ms, ids=dist,
            longest_run=runs)
    w = torch.randn(V, D, device=DEV)
    for lang in ("triton", "cuda"):
        fn = kernels.module("embedding", lang).embedding
        checked(f"embedding forward {lang}", torch.equal(fn(ids, w), w[ids]))
        ms = bench_ms(lambda: fn(ids, w))
        row(path, "embedding", f"{lang}", (N, V, D), 8 * N * D + 8 * N, ms)
    ms = bench_ms(lambda: torch.nn.functional.embedding(ids, w))
    row(path, "embedding", "torch eager", (N, V, D), 8 * N * D + 8 * N, ms)


def fusion_section(path):
    R, C = size(16384, 64), size(3072, 300)
    x = torch.randn(R, C, device=DEV)
    b = torch.randn(C, device=DEV)
    want = torch.nn.functional.gelu(x + b, approximate="tanh")
    for lang in ("triton", "cuda"):
        for ver in ("v2", "v1"):
            fn = kernels.get("bias_gelu", lang, ver)
            ok = checked(f"bias_gelu {lang} {ver}", float((fn(x, b) - want).abs().max()) < 1e-4)
            ms = bench_ms(lambda: fn(x, b))
            row(path, "bias_gelu", f"{lang} {ver}", (R, C), 8 * R * C, ms, checked=ok)
    ms = bench_ms(lambda: torch.nn.functional.gelu(x + b, approximate="tanh"))
    row(path, "bias_gelu", "torch eager (x + b, then F.gelu)", (R, C), 8 * R * C, ms)
    R, C = size(16384, 64), size(768, 300)
    x, r = torch.randn(R, C, device=DEV), torch.randn(R, C, device=DEV)
    w, bb = torch.randn(C, device=DEV), torch.randn(C, device=DEV)
    want = torch.nn.functional.layer_norm(x + r, (C,), w, bb, 1e-5)
    for lang in ("triton", "cuda"):
        for ver in ("v2", "v1"):
            fn = kernels.get("residual_layernorm", lang, ver)
            h, y = fn(x, r, w, bb)
            ok = checked(f"residual_layernorm {lang} {ver}", float((y - want).abs().max()) < 1e-3)
            ms = bench_ms(lambda: fn(x, r, w, bb))
            row(path, "residual_layernorm", f"{lang} {ver}", (R, C), 16 * R * C, ms, checked=ok)

    # v2's kernel alone, its outputs allocated once: at this size (50 us of memory traffic) the
    # launcher's checks and four allocations can take the CPU longer than the kernel the GPU
    from kernels.cuda import residual_layernorm as cuda_rl
    from kernels.triton.residual_layernorm import residual_layernorm_kernel

    import triton
    h, y = torch.empty_like(x), torch.empty_like(x)
    mean, rstd = torch.empty(R, device=DEV), torch.empty(R, device=DEV)
    block = triton.next_power_of_2(C)
    launches = {
        "triton v2 kernel only": lambda: residual_layernorm_kernel[(R,)](
            x, r, w, bb, h, y, mean, rstd, C, 1e-5, BLOCK_SIZE=block, num_warps=min(16, max(1, block // 256))),
        "cuda v2 kernel only": lambda: cuda_rl.kernel("residual_layernorm_kernel")[
            triton.cdiv(R, cuda_rl.ROW_WARPS), 32 * cuda_rl.ROW_WARPS](x, r, w, bb, h, y, mean, rstd, R, C, 1e-5)}
    for name, launch in launches.items():
        y.zero_()
        launch()
        ok = checked(f"residual_layernorm {name}", float((y - want).abs().max()) < 1e-3)
        row(path, "residual_layernorm", name, (R, C), 16 * R * C, bench_ms(launch), checked=ok)

    def torch_rl():
        h = x + r
        return h, torch.nn.functional.layer_norm(h, (C,), w, bb, 1e-5)
    ms = bench_ms(torch_rl)
    row(path, "residual_layernorm", "torch eager (x + r, then F.layer_norm)", (R, C), 16 * R * C, ms)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None,
                    help="the JSON to write (default: benchmarks/results/lessons/<gpu>-lesson11.json, "
                         "from the GPU's name)")
    ap.add_argument("--budget", type=float, default=100.0, help="seconds after which no new section starts")
    ap.add_argument("--only", default=None, help="sections to run, comma-separated (default: all): copy,fusions")
    ap.add_argument("--smoke", action="store_true", help="small sizes, one untimed call each (works in simulation)")
    args = ap.parse_args(argv)
    global SMOKE, DEV
    SMOKE, DEV = args.smoke, utils.DEVICE
    if utils.SIMULATE and not SMOKE:
        print("lesson11 benchmarks need a GPU (--smoke tries the script in simulation)")
        return 1
    import triton

    class _Props:
        name, multi_processor_count = "none (smoke run)", 0
    props = _Props if SMOKE else torch.cuda.get_device_properties(0)
    if args.out is None:
        if SMOKE:
            print("--smoke needs --out: a smoke run's numbers must not land among the recorded results")
            return 1
        args.out = str(utils.LESSON_RESULTS_DIR / f"{utils.gpu_slug(props.name)}-lesson11.json")
    OUT.update(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **utils.source_commit(),
               machine=dict(gpu=props.name, sm_count=props.multi_processor_count, torch=torch.__version__,
                            triton=triton.__version__, cuda=torch.version.cuda, python=platform.python_version()),
               timing="triton.testing.do_bench median, warmup 10 ms, rep 60 ms",
               targets=_targets(),
               issue_anchors={"cross_entropy float32 torch eager ms": 6.58,
                              "cross_entropy float32 torch.compile ms": 3.38,
                              "cross_entropy bfloat16 torch eager ms": 7.82,
                              "cross_entropy bfloat16 torch.compile ms": 1.98,
                              "adamw torch fused ms": 1.42, "adamw torch foreach ms": 3.77})
    sections = [("copy", lambda: copy_section(args.out)),
                ("cross_entropy float32", lambda: ce_section(args.out, torch.float32)),
                ("cross_entropy bfloat16", lambda: ce_section(args.out, torch.bfloat16)),
                ("adamw", lambda: adamw_section(args.out)),
                ("embedding", lambda: embedding_section(args.out)),
                ("fusions", lambda: fusion_section(args.out)),
                ("cross_entropy bfloat16 compile", lambda: ce_compile(args.out, torch.bfloat16)),
                ("cross_entropy float32 compile", lambda: ce_compile(args.out, torch.float32))]
    for name, fn in sections:
        if SMOKE and "compile" in name:
            continue  # minutes of Inductor on a CPU; the script's compile path is ce_compile
        if args.only and name not in args.only.split(","):
            continue
        if not section(name, args.budget):
            continue
        try:
            fn()
        except Exception:
            OUT.setdefault("errors", {})[name] = traceback.format_exc()[-2000:]
            print(f"[{name}] FAILED:\n{traceback.format_exc()[-1500:]}", flush=True)
        if not SMOKE:
            torch.cuda.empty_cache()
        save(args.out)
    save(args.out)
    return 0


def _targets():
    """Every lesson-11 topic's H100 goals, as recorded beside the numbers."""
    import importlib

    from benchmarks.topics import LESSON11
    out = {}
    for name in LESSON11:
        mod = importlib.import_module(f"utils.topics.{name}")
        out[name] = [dict(lang=t.lang, kind=t.kind, threshold=t.threshold, shape=list(t.shape or ()))
                     for t in getattr(mod, "TARGETS", [])]
        if hasattr(mod, "TARGET_MS"):
            out[name + " ms"] = mod.TARGET_MS
    return out


def ce_compile(path, dtype):
    x, t, name, torch_ce = ce_problem(dtype)
    rows, V = x.shape
    c = torch.compile(torch_ce)
    c(x)
    ms = bench_ms(lambda: c(x))
    row(path, "cross_entropy", "torch.compile", (rows, V), 3 * x.element_size() * rows * V, ms, dtype=name)


if __name__ == "__main__":
    raise SystemExit(main())
