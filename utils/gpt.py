"""Lesson 11's GPT: GPT-2's architecture on torch's kernels or on the course's.

    cfg = utils.GPTConfig(vocab_size=96, block_size=32, n_layer=2, n_head=2, n_embd=32)
    model = utils.GPT(cfg, backend="course", matmul="torch")   # or backend="torch", matmul="triton"
    logits, loss = model(idx, targets)

    utils.gradient_check(cfg)          # the course's model against torch's: loss and every gradient
    text = utils.course_text()         # the course's own prose: the corpus, nothing downloaded
    tok = utils.CharTokenizer(text)    # character level
    utils.train_gpt(model, data, steps=..., ...)   # AdamW, returns the losses

The model: token + position embeddings, ``n_layer`` blocks (LayerNorm, causal attention,
residual add, LayerNorm, MLP with GELU, residual add), a final LayerNorm and an LM head that
shares the token embedding's weight (tied). Which kernel runs each operator is ``model.ops``
(``kernels/ops.py``).
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import torch
import torch.nn as nn

from kernels.ops import OP_NAMES, Ops, ops_for
from runtime.config import DEVICE
from runtime.paths import ROOT

__all__ = ["GPTConfig", "GPT", "CharTokenizer", "course_text", "char_dataset", "get_batch", "make_optimizer",
           "train_gpt", "gradient_check", "GradientReport", "save_checkpoint", "load_checkpoint",
           "GPT2_124M", "copy_weights", "ops_for", "Ops", "OP_NAMES", "evaluate", "GRAD_TOL", "race_checks_off"]


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50304
    block_size: int = 1024     # the longest sequence (rows of the position embedding)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    eps: float = 1e-5          # LayerNorm's

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig: {name} must be at least 1, got {getattr(self, name)}")


#: GPT-2 small: 124M parameters (the vocabulary padded to 50304, a multiple of 128).
GPT2_124M = GPTConfig()


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        C = cfg.n_embd
        self.ln_1 = nn.LayerNorm(C, eps=cfg.eps)
        self.attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=cfg.eps)
        self.fc = nn.Linear(C, 4 * C)
        self.fc_proj = nn.Linear(4 * C, C)
        self.n_head = cfg.n_head

    def forward(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        B, T, C = x.shape
        H = self.n_head
        h = ops.layernorm(x, self.ln_1.weight, self.ln_1.bias, self.ln_1.eps)
        qkv = ops.linear(h, self.attn.weight, self.attn.bias)
        q, k, v = qkv.view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)      # each (B, H, T, d)
        y = ops.attention(q, k, v)
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + ops.linear(y, self.attn_proj.weight, self.attn_proj.bias)
        h = ops.layernorm(x, self.ln_2.weight, self.ln_2.bias, self.ln_2.eps)
        h = ops.gelu(ops.linear(h, self.fc.weight, self.fc.bias))
        return x + ops.linear(h, self.fc_proj.weight, self.fc_proj.bias)


class GPT(nn.Module):
    """GPT-2. ``backend``: "torch" or "course" (the course's kernels, see ``kernels/ops.py``);
    ``matmul``: "torch" (cuBLAS) or "triton" (lesson 06's matmul); ``ops``: an explicit
    :class:`Ops` (one operator replaced by yours, say) instead of the two switches."""

    def __init__(self, cfg: GPTConfig, backend: str = "torch", matmul: str = "torch", ops: Ops | None = None,
                 seed: int | None = 0):
        super().__init__()
        self.cfg = cfg
        self.backend, self.matmul = backend, matmul
        self.ops = ops if ops is not None else ops_for(backend, matmul)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.eps)
        if seed is not None:
            self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0):
        """GPT-2's initialization, drawn from a generator of ``seed`` on the CPU (the same
        weights on every device): normal(0, 0.02), the projections into the residual stream
        scaled by 1/sqrt(2 n_layer), biases 0, LayerNorms 1 and 0."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.startswith("ln") or ".ln_" in name:
                val = torch.ones(p.shape) if name.endswith("weight") else torch.zeros(p.shape)
            elif name.endswith("bias"):
                val = torch.zeros(p.shape)
            else:
                std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if name.endswith("proj.weight") else 0.02
                val = torch.randn(p.shape, generator=gen) * std
            p.copy_(val.to(p.dtype))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"GPT: sequence of {T} tokens, longer than block_size {self.cfg.block_size}")
        ops = self.ops
        x = ops.embedding(idx, self.wte.weight) + self.wpe.weight[:T]
        for block in self.blocks:
            x = block(x, ops)
        x = ops.layernorm(x, self.ln_f.weight, self.ln_f.bias, self.ln_f.eps)
        logits = ops.linear(x, self.wte.weight, None)                 # the tied LM head
        loss = None
        if targets is not None:
            loss = ops.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, n: int, temperature: float = 1.0, gen: torch.Generator | None = None):
        for _ in range(n):
            logits, _ = self(idx[:, -self.cfg.block_size:])
            p = torch.softmax(logits[:, -1].float() / temperature, dim=-1)
            nxt = torch.multinomial(p.cpu(), 1, generator=gen).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def copy_weights(dst: GPT, src: GPT) -> GPT:
    dst.load_state_dict(src.state_dict())
    return dst


# ------------------------------------------------------------------------------------------
# The corpus: the course's own prose, character level
# ------------------------------------------------------------------------------------------
def course_text(root: Path | str | None = None) -> str:
    """The markdown of the course's lessons (``notebooks/*.ipynb``, in order) and its README:
    the text the character-level model learns. Read at run time from the course's files."""
    root = Path(root) if root is not None else ROOT
    parts = []
    for nb in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        for c in cells:
            if c["cell_type"] == "markdown":
                src = c["source"]
                parts.append("".join(src) if isinstance(src, list) else src)
    readme = root / "README.md"
    if readme.exists():
        parts.append(readme.read_text(encoding="utf-8"))
    return "\n\n".join(p.strip() for p in parts if p.strip()) + "\n"


class CharTokenizer:
    """One token per character of the text it is built from (sorted, so the same text gives
    the same ids)."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        try:
            return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)
        except KeyError as e:
            raise ValueError(f"CharTokenizer: character {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def char_dataset(val_fraction: float = 0.1, root=None):
    """``(tokenizer, train_ids, val_ids)`` of :func:`course_text`: the last ``val_fraction``
    of the text is held out for validation."""
    text = course_text(root)
    tok = CharTokenizer(text)
    ids = tok.encode(text)
    n_val = int(len(ids) * val_fraction)
    return tok, ids[:-n_val] if n_val else ids, ids[-n_val:] if n_val else ids[:0]


def get_batch(data: torch.Tensor, batch: int, T: int, gen: torch.Generator, device=None):
    """``(x, y)`` of ``batch`` random windows of T tokens, y shifted by one."""
    if len(data) <= T:
        raise ValueError(f"get_batch: {len(data)} tokens, need more than T = {T}")
    ix = torch.randint(len(data) - T, (batch,), generator=gen)
    x = torch.stack([data[i:i + T] for i in ix.tolist()])
    y = torch.stack([data[i + 1:i + 1 + T] for i in ix.tolist()])
    return (x.to(device), y.to(device)) if device is not None else (x, y)


# ------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------
def make_optimizer(model: GPT, lr: float = 1e-3, weight_decay: float = 0.1, betas=(0.9, 0.95), fused=None):
    """AdamW with GPT-2's grouping: weight decay on matrices and embeddings, none on biases and
    LayerNorm weights."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {}
    if fused is not None:
        kw["fused"] = fused
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8, **kw)


def train_gpt(model: GPT, data: torch.Tensor, *, steps: int, batch: int, T: int, lr: float = 1e-3,
              opt=None, seed: int = 0, gen: torch.Generator | None = None, clip: float | None = 1.0,
              log_every: int = 0, time_limit: float | None = None, warmup: int = 0):
    """AdamW steps on random windows of ``data``; returns the list of losses (one per step).
    ``gen`` (a torch.Generator) draws the batches: pass the same one to resume."""
    device = next(model.parameters()).device
    opt = opt if opt is not None else make_optimizer(model, lr)
    gen = gen if gen is not None else torch.Generator().manual_seed(seed)
    losses = []
    t0 = time.perf_counter()
    model.train()
    for step in range(steps):
        if warmup:
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, (step + 1) / warmup)
        x, y = get_batch(data, batch, T, gen, device)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}  loss {losses[-1]:.4f}  ({time.perf_counter() - t0:.1f} s)")
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            break
    return losses


@torch.no_grad()
def evaluate(model: GPT, data: torch.Tensor, *, batch: int, T: int, batches: int = 8, seed: int = 1234) -> float:
    """The mean loss over ``batches`` fixed random windows of ``data``."""
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    total = 0.0
    for _ in range(batches):
        x, y = get_batch(data, batch, T, gen, device)
        total += float(model(x, y)[1])
    model.train(was)
    return total / batches




def save_checkpoint(path, model: GPT, opt, gen: torch.Generator | None = None, step: int = 0):
    """Everything a run needs to go on exactly where it stopped: the weights, the optimizer's
    moments and step counts, the data generator's state and the step."""
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "cfg": dataclasses.asdict(model.cfg),
                "gen": gen.get_state() if gen is not None else None, "step": step}, path)


def load_checkpoint(path, model: GPT, opt, gen: torch.Generator | None = None) -> int:
    """Loads a :func:`save_checkpoint` into ``model``, ``opt`` (and ``gen``); returns its step."""
    ck = torch.load(path, map_location=next(model.parameters()).device, weights_only=False)
    if GPTConfig(**ck["cfg"]) != model.cfg:
        raise ValueError(f"load_checkpoint: the checkpoint's config {ck['cfg']} is not the model's {model.cfg}")
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    if gen is not None and ck["gen"] is not None:
        gen.set_state(ck["gen"].cpu())   # a generator's state is a CPU byte tensor, whatever its device
    return int(ck["step"])


# ------------------------------------------------------------------------------------------
# The gradient check: a model on the course's kernels against the same model on torch's
# ------------------------------------------------------------------------------------------
#: The parameter names and the operator whose backward writes their gradient first.
def _param_op(name: str) -> str:
    if name.startswith("wte"):
        return "embedding + LM head (linear)"
    if name.startswith("wpe"):
        return "embedding"
    if "ln" in name:
        return "layernorm"
    return "linear"


@dataclasses.dataclass
class GradientReport:
    """The loss and every parameter's gradient of one model against a reference model."""
    dtype: torch.dtype
    loss: float
    loss_ref: float
    rows: list            # (name, max |g - g_ref|, max |g_ref|, relative error)
    tol: float

    @property
    def loss_diff(self) -> float:
        return abs(self.loss - self.loss_ref)

    @property
    def max_rel(self) -> float:
        return max([r[3] for r in self.rows] + [self.loss_diff / max(abs(self.loss_ref), 1e-30)])

    @property
    def max_abs(self) -> float:
        return max(r[1] for r in self.rows)

    @property
    def ok(self) -> bool:
        return self.max_rel <= self.tol

    def worst(self, n: int = 3):
        return sorted(self.rows, key=lambda r: -r[3])[:n]

    def __str__(self):
        lines = [f"{self.dtype}: loss {self.loss:.10g} vs torch {self.loss_ref:.10g} (|diff| {self.loss_diff:.2g}); "
                 f"{len(self.rows)} gradients, largest relative error {self.max_rel:.2g} "
                 f"(tolerance {self.tol:.0e}): {'PASS' if self.ok else 'FAIL'}"]
        for name, ab, ref, rel in self.worst():
            lines.append(f"  {name:28s} max |diff| {ab:.2g}  (max |grad| {ref:.2g}, relative {rel:.2g})")
        return "\n".join(lines)


#: Relative error (max |g - g_ref| / max |g_ref|, per parameter) the gradient check accepts.
#: float64: lesson 10's attention backward keeps the logsumexp L in float32 (as FlashAttention
#: does), so even a float64 model carries float32's rounding of L into its gradients: about
#: 3e-7 relative (the forward, LayerNorm and GELU agree with torch to 1e-15).
GRAD_TOL = {torch.float64: 1e-6, torch.float32: 2e-4}


def _grads(model: GPT, x, y):
    model.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def gradient_check(cfg: GPTConfig, *, backend: str = "course", matmul: str = "torch", ops: Ops | None = None,
                   dtype=torch.float64, batch: int = 2, T: int | None = None, seed: int = 0,
                   device=None) -> GradientReport:
    """One forward and backward of the model on ``backend`` (or ``ops``) against torch's, same
    weights, same batch, in ``dtype``: the loss and every parameter's gradient."""
    device = device if device is not None else DEVICE
    T = T or cfg.block_size
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(cfg.vocab_size, (batch, T), generator=gen).to(device)
    y = torch.randint(cfg.vocab_size, (batch, T), generator=gen).to(device)
    ref = GPT(cfg, "torch", seed=seed).to(device, dtype)
    mine = GPT(cfg, backend, matmul, ops=ops, seed=None).to(device, dtype)
    copy_weights(mine, ref)
    loss_ref, g_ref = _grads(ref, x, y)
    loss, g = _grads(mine, x, y)
    rows = []
    for name, gr in g_ref.items():
        d = float((g[name] - gr).abs().max())
        scale = float(gr.abs().max())
        rows.append((name, d, scale, d / max(scale, 1e-30)))
    return GradientReport(dtype, loss, loss_ref, rows, GRAD_TOL.get(dtype, 2e-4))




def race_checks_off():
    """A context in which the Triton interpreter does not record accesses for race detection
    (simulation only; a GPU has no checker): the model's kernels are race-checked by their own
    lessons and tests, and a model step runs about twice as fast without it."""
    from runtime.backends import BACKENDS
    triton_backend = [b for b in BACKENDS if b.name == "triton"][0]
    return triton_backend.race_detection(False)


