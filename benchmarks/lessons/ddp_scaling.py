"""Data parallelism on several GPUs (the run of lesson 13 on 2 or 4 GPUs): lesson 11's GPT
trained on one GPU and on N, with the same global batch, under the DDP written from scratch
(``kernels/data_parallel.py``'s ``BucketedDDP``), torch's ``DistributedDataParallel``, the naive
all-reduce after the backward, and ZeRO-1 (``ZeroAdamW``): tokens/s, scaling, loss curves, memory.

    python -m benchmarks.lessons.ddp_scaling --backend nccl --world 2           # 2 GPUs, GPT-2 124M
    python -m benchmarks.lessons.ddp_scaling --backend nccl --world 4 --out DIR
    python -m benchmarks.lessons.ddp_scaling --backend gloo --world 2 --tiny    # a laptop: a tiny GPT, CPU ranks

Writes ``DIR/<gpu or cpu>-ddp-scaling-<backend>-<world>.json`` and a plot beside it (``.png``;
default DIR ``benchmarks/results/lessons``).

Every mode trains the same model from the same weights on the same global batch: each step draws
``global_batch`` sequences from one generator seeded by the step, and rank r takes rows
r, r + N, ...; one GPU takes them all. So every mode computes the same averaged gradient, up to
the order of the additions, and the loss curves of all modes must agree with one GPU's: that is
checked (within ``LOSS_RTOL``) before any tokens/s is reported. The modes:

    single      one rank, no communication: the baseline of the scaling efficiency
    ours        BucketedDDP: buckets all-reduced asynchronously while the backward runs
    torch       torch.nn.parallel.DistributedDataParallel, the same bucket size
    naive       the backward first, then one all-reduce per gradient (no buckets, no overlap)
    zero        no DDP wrapper; ZeroAdamW reduce-scatters the gradients, steps its shard with the
                course's AdamW kernel and all-gathers the parameters (the others use torch's AdamW)

A step is timed on rank 0 between a barrier and the step's end (a synchronisation on GPUs),
after ``warmup`` untimed steps; tokens/s is ``global_batch x seq`` over the median step.
Scaling efficiency is tokens/s on N ranks over N x one rank's. On GPUs the model runs the
course's kernels (``backend="course"``) under bfloat16 autocast; ``--tiny`` runs torch's
operators in float32 (a CPU has no course kernels to time, only their simulation).

NCCL ranks are spawned (``runtime.run_ranks``), so the function each rank runs lives in this
module; NVLink multicast stays off in every rank.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import utils

MODES = ("single", "ours", "torch", "naive", "zero")
#: How far a mode's loss may stray from one rank's at the same step (the order of additions differs).
LOSS_RTOL = 2e-3
TINY = dict(vocab_size=128, block_size=32, n_layer=2, n_head=2, n_embd=64)


def global_batch(step: int, n: int, seq: int, vocab: int):
    """The step's ``n`` sequences of ``seq + 1`` tokens, the same on every rank (seeded by the step)."""
    g = torch.Generator().manual_seed(10_000 + step)
    ids = torch.randint(vocab, (n, seq + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _naive_sync(model, world: int) -> None:
    """The gradients averaged after the backward: one blocking all-reduce per tensor."""
    import torch.distributed as dist
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(world)
            dist.all_reduce(p.grad)


def rank_run(rank: int, world: int, mode: str, cfg: dict, course: bool, batch: int, steps: int, warmup: int,
             bucket_mb: float) -> dict:
    """One rank's part of one mode: the losses of every step, the step times, memory."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from kernels.data_parallel import BucketedDDP, ZeroAdamW
    from utils.gpt import GPT, GPTConfig
    gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    config = GPTConfig(**cfg)
    model = GPT(config, backend="course" if course else "torch", seed=0).to(device)
    wrapped = model
    if mode == "ours":
        wrapped = BucketedDDP(model, bucket_mb=bucket_mb)
    elif mode == "torch":
        wrapped = DistributedDataParallel(model, bucket_cap_mb=bucket_mb,
                                          device_ids=[device.index] if gpu else None)
    if mode == "zero":
        opt = ZeroAdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=gpu)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else None
    losses, times = [], []
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    for step in range(warmup + steps):
        x, y = global_batch(step, batch, config.block_size, config.vocab_size)
        x, y = x[rank::world].to(device), y[rank::world].to(device)
        if world > 1:
            dist.barrier()
        if gpu:
            torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if amp is not None:
            with amp:
                _, loss = wrapped(x, y)
        else:
            _, loss = wrapped(x, y)
        loss.backward()
        if mode == "naive" and world > 1:
            _naive_sync(model, world)
        opt.step()
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        # the global batch's loss: the mean of the ranks' (equal shares of the batch)
        total = loss.detach().float().reshape(1).clone()
        if world > 1:
            dist.all_reduce(total)
        losses.append(float(total) / world)
    moments = ("exp_avg", "exp_avg_sq")
    state = opt.state_bytes() if mode == "zero" else sum(
        v.numel() * v.element_size() for s in opt.state.values() for k, v in s.items() if k in moments)
    return dict(losses=losses, times=times[warmup:], state_bytes=state,
                peak_bytes=torch.cuda.max_memory_allocated() if gpu else None,
                params=sum(p.numel() for p in model.parameters()))


def run(backend: str, world: int, modes, cfg: dict, course: bool, batch: int, steps: int, warmup: int,
        bucket_mb: float, timeout_s: float) -> dict:
    """Every mode, its losses checked against one rank's first: ``{mode: result}``."""
    from benchmarks.lessons.ddp_scaling import rank_run as fn  # importable by name: NCCL's ranks are spawned
    if batch % world:
        raise ValueError(f"the global batch ({batch}) must divide by the number of ranks ({world})")
    out = {}
    for mode in modes:
        n = 1 if mode == "single" else world
        ranks = utils.run_ranks(fn, n, mode, cfg, course, batch, steps, warmup, bucket_mb, backend=backend,
                                timeout_s=timeout_s)
        r0 = ranks[0]
        med = statistics.median(r0["times"]) if r0["times"] else float("nan")
        out[mode] = dict(world=n, losses=r0["losses"], step_ms=[round(t * 1e3, 3) for t in r0["times"]],
                         median_ms=round(med * 1e3, 3), tokens_per_s=round(batch * cfg["block_size"] / med, 1),
                         state_bytes_per_rank=[r["state_bytes"] for r in ranks],
                         peak_bytes_per_rank=[r["peak_bytes"] for r in ranks], params=r0["params"])
    if "single" in out:
        ref = out["single"]["losses"]
        for mode, res in out.items():
            worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(res["losses"], ref))
            res["loss_rel_diff_vs_single"] = worst
            res["losses_agree"] = worst <= LOSS_RTOL
            if mode != "single":
                res["speedup_vs_single"] = round(res["tokens_per_s"] / out["single"]["tokens_per_s"], 3)
                res["scaling_efficiency"] = round(res["speedup_vs_single"] / res["world"], 3)
    if "ours" in out and "torch" in out:
        out["ours"]["vs_torch_ddp"] = round(out["ours"]["tokens_per_s"] / out["torch"]["tokens_per_s"], 3)
    return out


def plot(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    for mode, res in data["modes"].items():
        a.plot(res["losses"], label=f"{mode} ({res['world']} rank{'s' if res['world'] > 1 else ''})", lw=1)
    a.set_xlabel("step")
    a.set_ylabel("loss of the global batch")
    a.legend(fontsize=7)
    names = list(data["modes"])
    b.bar(names, [data["modes"][m]["tokens_per_s"] / 1e3 for m in names], color="#4292c6")
    b.set_ylabel("thousand tokens/s")
    b.set_title(f"{data['device']}, {data['backend']}, {data['world']} ranks", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("gloo", "nccl"), default="nccl")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument("--tiny", action="store_true", help="a tiny GPT on torch's operators, float32 (a laptop)")
    p.add_argument("--batch", type=int, default=None, help="global batch in sequences (default 32, tiny 8)")
    p.add_argument("--seq", type=int, default=None, help="tokens a sequence (default 1024, tiny 32)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default=str(utils.LESSON_RESULTS_DIR))
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"--modes: unknown {bad}; choose from {', '.join(MODES)}")
    if args.world < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--world and --steps must be at least 1, --warmup at least 0")
    if args.backend == "nccl" and torch.cuda.device_count() < args.world:
        print(f"ddp_scaling: {args.world} NCCL ranks need {args.world} GPUs, this machine has "
              f"{torch.cuda.device_count()}: nothing measured (on a laptop: --backend gloo --tiny)")
        return 2
    cfg = dict(TINY) if args.tiny else dict(vars(utils.gpt.GPT2_124M))
    cfg.pop("eps", None)
    if args.seq:
        cfg["block_size"] = args.seq
    batch = args.batch or (8 if args.tiny else 32)
    course = args.backend == "nccl" and not args.tiny
    modes_out = run(args.backend, args.world, modes, cfg, course, batch, args.steps, args.warmup, args.bucket_mb,
                    args.timeout)
    gpu = args.backend == "nccl"
    device = torch.cuda.get_device_name(0) if gpu else f"CPU ({platform.machine()})"
    stem = f"{utils.gpu_slug(device) if gpu else 'cpu'}-ddp-scaling-{args.backend}-{args.world}"
    data = dict(backend=args.backend, world=args.world, device=device, torch=torch.__version__,
                **utils.source_commit(), method=" ".join(__doc__.split("\n\n")[2].split()), config=cfg,
                kernels="course, bfloat16 autocast" if course else "torch, float32", global_batch=batch,
                steps=args.steps, warmup=args.warmup, bucket_mb=args.bucket_mb, modes=modes_out)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(data, out / f"{stem}.png")
    ok = all(r.get("losses_agree", True) for r in modes_out.values())
    for mode, r in modes_out.items():
        extra = "".join(f", {k} {r[k]}" for k in ("speedup_vs_single", "scaling_efficiency", "vs_torch_ddp") if k in r)
        print(f"{mode:7s} {r['world']} rank(s): {r['tokens_per_s']:12,.0f} tokens/s, median step "
              f"{r['median_ms']:.2f} ms, state {max(r['state_bytes_per_rank']):,} B a rank{extra}; "
              f"losses agree with one rank's: {r.get('losses_agree')}")
    print(f"wrote {out / (stem + '.json')} and .png")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
