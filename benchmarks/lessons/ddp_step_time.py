"""Lesson 13's data parallelism on the CPU: the training step of a small GPT under the bucketed,
overlapped DDP written from scratch (``kernels/data_parallel.py``'s ``BucketedDDP``) beside torch's
``DistributedDataParallel``, on N gloo ranks of this machine; and the optimizer state each rank
holds under plain DDP with AdamW and under ZeRO-1 (``ZeroAdamW``).

    python -m benchmarks.lessons.ddp_step_time                     # 2 ranks, about a minute
    python -m benchmarks.lessons.ddp_step_time --world 2 --steps 10 --out DIR

Writes ``DIR/cpu-ddp-step-time.json`` (default ``benchmarks/results/lessons``). Each rank builds
the same GPT twice (rank 0's weights, broadcast by either wrapper), one under each DDP, each with
torch's AdamW, and trains both on the rank's own random batches, the two step by step in turns
(which goes first alternates). The warm-up steps check first: the two losses must agree (at two
ranks bit for bit); then each timed step is forward, backward with the gradients' all-reduce,
and the optimizer step, from a barrier to the step's end, the slowest rank's time kept; the
medians and their ratio (from scratch / torch) are reported. Each rank runs on cpu_count / N
threads. The state bytes are exp_avg and exp_avg_sq: torch's AdamW's after the steps, and
ZeroAdamW's shard on each rank.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("COURSE_SIMULATE", "1")  # the CPU: torch's kernels, nothing simulated

import torch

import utils
from kernels.data_parallel import BucketedDDP, ZeroAdamW
from utils.gpt import GPT, GPTConfig

OUT_NAME = "cpu-ddp-step-time.json"
NAMES = ("from scratch", "torch DDP")


def _batches(rank: int, n: int, vocab: int, batch: int, seq: int):
    g = torch.Generator().manual_seed(1000 + rank)
    ids = [torch.randint(vocab, (batch, seq + 1), generator=g) for _ in range(n)]
    return [(t[:, :-1], t[:, 1:]) for t in ids]


def measure(rank: int, world: int, cfg: dict, batch: int, seq: int, warmup: int, steps: int, bucket_mb: float,
            threads: int) -> dict:
    """One rank's part: both DDPs trained side by side; the losses, step times and state bytes."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(threads)
    config = GPTConfig(**cfg)
    runs = []
    for wrap in (lambda m: BucketedDDP(m, bucket_mb=bucket_mb),
                 lambda m: DistributedDataParallel(m, bucket_cap_mb=bucket_mb)):
        model = GPT(config, seed=rank)  # a different start on each rank: the wrapper copies rank 0's
        ddp = wrap(model)
        runs.append(dict(model=model, ddp=ddp, opt=torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1),
                         losses=[], times=[]))

    def step(run, x, y):
        dist.barrier()
        t = time.perf_counter()
        run["opt"].zero_grad(set_to_none=True)
        _, loss = run["ddp"](x, y)
        loss.backward()
        run["opt"].step()
        run["times"].append(time.perf_counter() - t)
        run["losses"].append(loss.item())

    batches = _batches(rank, warmup + steps, config.vocab_size, batch, seq)
    for i, (x, y) in enumerate(batches):
        if i == warmup:  # the check before any timing: the warm-up steps' losses
            close = all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(*(r["losses"] for r in runs)))
            agree = torch.tensor([float(close)])
            dist.all_reduce(agree, op=dist.ReduceOp.MIN)  # every rank stops, or none
            if not agree.item():
                break
        for run in (runs if i % 2 == 0 else runs[::-1]):
            step(run, x, y)
    torch_state = sum(v.nbytes for s in runs[1]["opt"].state.values() for k, v in s.items()
                      if k in ("exp_avg", "exp_avg_sq"))
    zero = ZeroAdamW(runs[0]["model"].parameters(), lr=1e-3, weight_decay=0.1)
    return dict(losses=[r["losses"] for r in runs], times=[r["times"][warmup:] for r in runs],
                params=sum(p.numel() for p in runs[0]["model"].parameters()),
                torch_adamw_state=torch_state, zero_state=zero.state_bytes(), zero_shard=list(zero.shard),
                buckets=[len(b.params) for b in runs[0]["ddp"].buckets])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2, help="ranks (processes), default 2")
    p.add_argument("--steps", type=int, default=40, help="timed steps of each DDP (default 40)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps that check the losses first (default 3)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq", type=int, default=64, help="tokens a sequence (the GPT's block size)")
    p.add_argument("--batch", type=int, default=8, help="sequences a rank a step")
    p.add_argument("--bucket-mb", type=float, default=2.0, help="bucket size of both DDPs in MB (default 2)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=str(utils.LESSON_RESULTS_DIR))
    args = p.parse_args(argv)
    if args.world < 1 or args.steps < 1 or args.warmup < 1:
        p.error("--world, --steps and --warmup must be at least 1 (the warm-up steps are the check)")
    threads = max(1, (os.cpu_count() or 1) // args.world)
    cfg = dict(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads, n_embd=args.embd)
    outs = utils.run_ranks(measure, args.world, cfg, args.batch, args.seq, args.warmup, args.steps, args.bucket_mb,
                           threads, timeout_s=args.timeout)
    ours, theirs = outs[0]["losses"]
    losses_equal = all(o["losses"][0] == o["losses"][1] for o in outs)
    max_diff = max(abs(a - b) for o in outs for a, b in zip(*o["losses"]))
    timed = all(len(t) == args.steps for o in outs for t in o["times"])
    data = dict(world=args.world, threads_per_rank=threads, backend="gloo",
                machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                torch=torch.__version__, python=platform.python_version(), **utils.source_commit(),
                method=" ".join(__doc__.split("\n\n")[2].split()), config=cfg, batch=args.batch,
                bucket_mb=args.bucket_mb, buckets=len(outs[0]["buckets"]), params=outs[0]["params"],
                warmup=args.warmup, steps=args.steps, losses_equal=losses_equal, max_loss_diff=max_diff,
                losses={NAMES[0]: ours, NAMES[1]: theirs})
    if timed:
        # a step is as slow as its slowest rank
        per_step = [[max(o["times"][k][i] for o in outs) for i in range(args.steps)] for k in range(2)]
        med = [statistics.median(t) for t in per_step]
        paired = statistics.median(a / b for a, b in zip(*per_step))
        data.update(step_ms={n: [round(t * 1e3, 3) for t in ts] for n, ts in zip(NAMES, per_step)},
                    median_ms={n: round(m * 1e3, 3) for n, m in zip(NAMES, med)}, ratio=round(med[0] / med[1], 4),
                    paired_ratio=round(paired, 4))
    data["state_bytes"] = dict(ddp_adamw_per_rank=[o["torch_adamw_state"] for o in outs],
                               zero_adamw_per_rank=[o["zero_state"] for o in outs],
                               zero_shards=[o["zero_shard"] for o in outs])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_NAME).write_text(json.dumps(data, indent=1) + "\n")
    print(f"GPT of {data['params']:,} parameters on {args.world} gloo ranks ({threads} threads each), "
          f"{data['buckets']} buckets of {args.bucket_mb:g} MB")
    print(f"losses over {len(ours)} steps: " + ("equal to the bit" if losses_equal else
                                                f"largest difference {max_diff:.3g}"))
    if timed:
        print(f"median step: from scratch {med[0] * 1e3:.1f} ms, torch DDP {med[1] * 1e3:.1f} ms, "
              f"ratio {data['ratio']:.3f} (median of the steps' own ratios {paired:.3f})")
    else:
        print("NOT TIMED: the warm-up losses of the two DDPs disagree")
    sb = data["state_bytes"]
    print(f"AdamW state a rank: plain DDP {sb['ddp_adamw_per_rank'][0]:,} B on every rank, "
          f"ZeRO-1 {sb['zero_adamw_per_rank']} B")
    print(f"wrote {out / OUT_NAME}")
    return 0 if timed else 1


if __name__ == "__main__":
    sys.exit(main())
