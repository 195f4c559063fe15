"""Lesson 11's laptop run: a character-level GPT on torch's kernels, on the CPU, trained on the
course's own prose (``utils.course_text()``: the lessons' markdown and the README, read from
the course's files) for about three minutes.

    python -m benchmarks.lessons.gpt_cpu_train                 # ~3 minutes, writes the record below
    python -m benchmarks.lessons.gpt_cpu_train --seconds 20 --out /tmp/x.json

Writes ``benchmarks/results/lessons/gpt-cpu-train.json``: the config, the training loss of every step,
the validation loss (the last 10 % of the text, never trained on) every ``--eval-every`` steps,
the final validation loss, a sample of generated text, the machine and the commit. Lesson 11
plots it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("COURSE_SIMULATE", "1")  # the CPU: torch's kernels, nothing simulated

import torch  # noqa: E402

import utils  # noqa: E402

OUT = utils.LESSON_RESULTS_DIR / "gpt-cpu-train.json"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=180.0, help="training time (default 180)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=96)
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    tok, train, val = utils.char_dataset(0.1)
    cfg = utils.GPTConfig(vocab_size=tok.vocab_size, block_size=args.T, n_layer=args.layers, n_head=args.heads,
                          n_embd=args.width)
    model = utils.GPT(cfg, backend="torch", seed=0)
    opt = utils.make_optimizer(model, lr=args.lr)
    gen = torch.Generator().manual_seed(0)
    print(f"corpus: {len(train) + len(val)} characters, vocabulary {tok.vocab_size}; model {model.num_params():,} "
          f"parameters; {args.seconds:.0f} s of training")
    losses, evals = [], []
    val_batches = 8
    evals.append((0, utils.evaluate(model, val, batch=args.batch, T=args.T, batches=val_batches)))
    t0 = time.perf_counter()
    step = 0
    while time.perf_counter() - t0 < args.seconds:
        losses += utils.train_gpt(model, train, steps=1, batch=args.batch, T=args.T, lr=args.lr, opt=opt, gen=gen,
                                  warmup=0)
        step += 1
        if step <= 20:                      # warmup of the learning rate
            for g in opt.param_groups:
                g["lr"] = args.lr * min(1.0, (step + 1) / 20)
        if step % args.eval_every == 0:
            evals.append((step, utils.evaluate(model, val, batch=args.batch, T=args.T, batches=val_batches)))
            print(f"step {step:5d}  train {losses[-1]:.3f}  val {evals[-1][1]:.3f}  "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    wall = time.perf_counter() - t0
    if evals[-1][0] != step:
        evals.append((step, utils.evaluate(model, val, batch=args.batch, T=args.T, batches=val_batches)))
    prompt = "The kernel"
    out = model.generate(tok.encode(prompt)[None], 200, temperature=0.8, gen=torch.Generator().manual_seed(0))
    sample = tok.decode(out[0])
    record = {
        "what": "character-level GPT on torch's kernels, CPU, trained on the course's prose (utils.course_text)",
        "config": {**vars(cfg), "batch": args.batch, "lr": args.lr, "params": model.num_params(),
                   "train_chars": len(train), "val_chars": len(val), "threads": args.threads},
        "seconds": wall, "steps": step, "tokens_per_s": step * args.batch * args.T / wall,
        "train_loss": losses, "val_loss": [[s, v] for s, v in evals],
        "final_val_loss": evals[-1][1], "uniform_loss": float(torch.log(torch.tensor(float(tok.vocab_size)))),
        "sample": sample,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "commit": utils.source_commit() if hasattr(utils, "source_commit") else None,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{step} steps in {wall:.0f} s; validation loss {evals[0][1]:.3f} -> {evals[-1][1]:.3f} "
          f"(uniform guess {record['uniform_loss']:.3f}); wrote {args.out}")
    print(sample)


if __name__ == "__main__":
    main()
