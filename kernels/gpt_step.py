"""Lesson 11's GPT training step written out on the course's kernels: the forward, the backward
and AdamW as a list of launches, no autograd and no torch elementwise operator.

    step = TrainStep(model, batch=16, T=1024, lr=6e-4)        # model: utils.GPT (its weights are used in place)
    loss = step(x, y)            # forward, backward, gradient clipping, AdamW: one training step
    step.forward(x, y)           # the forward and the loss only (no update)

Mixed precision as llm.c trains: the model's parameters stay float32 (the master weights) and
become views into one flat buffer; AdamW writes, in the same pass, a ``dtype`` (bfloat16) copy
that the matmuls read. Activations are ``dtype``; statistics, sums and gradients are float32
(``model``'s ``p.grad`` are views into one flat float32 buffer). With ``dtype=torch.float32``
the same launches run in float32 (the gradient check compares them with torch's autograd).

Every launch of one step, in order (B batch, T tokens, C width, L layers, V vocabulary):

    forward   embedding_position_kernel        x = wte[ids] + wpe[t]                 lesson 11 (embedding)
              per layer:
              residual_layernorm_kernel        x += previous MLP; h = LN1(x)         lesson 11 (fusion; plain LN first)
              matmul (+ bias)                  qkv = h W_qkv^T + b                   cuBLAS or lesson 06
              attention forward (v3)           y = causal softmax(q k^T / sqrt(d)) v lesson 10, into y's layout
              matmul (+ bias)                  a = y W_proj^T + b
              residual_layernorm_kernel        x += a; h = LN2(x)                    lesson 11
              matmul                           f = h W_fc^T
              bias_gelu_kernel                 g = gelu(f + b_fc)                    lesson 11 (fusion)
              matmul (+ bias)                  m = g W_fcproj^T + b
              residual_layernorm_kernel        x += m; h = LN_f(x)
              matmul                           logits = h wte^T                      (tied head)
              cross entropy: count + fused     loss, and d logits written over the logits  lesson 11
    backward  the same in reverse: matmuls for d input and d W (d W in float32, straight into
              the gradient buffer), column sums for the biases, bias_gelu_backward_kernel,
              attention backward (into dqkv's layout), LayerNorm backward partials with the
              residual's gradient added in the same pass (ADD_DX), the embedding's sorted
              scatter-add (v4) and a column sum for the positions
    update    grad-norm partials + finish (the clipping factor stays on the device),
              adamw_schedule_kernel (step and learning rate on the device), adamw_master_kernel
              twice (weights with decay, then without): float32 master weights and their copy

Two things stay torch operators, by design: ``torch.sort`` of the token ids (the embedding's
deterministic backward sorts them) and the ``zero_`` of the 4-byte loss accumulator. The
matmuls are cuBLAS (``matmul="torch"``) or lesson 06's Triton matmul (``matmul="triton"``: the bias
in its epilogue, the weight gradients split along K, kernels/triton/linear.py).

The shapes are fixed when the step is built: its buffers are allocated once, so a CUDA Graph
can capture ``step(x, y)`` (see ``benchmarks/lessons/gpt_train.py``). Call ``sync_weights()``
after changing the model's parameters from outside (the half copy is made from them).
"""
from __future__ import annotations

import math

import torch

import runtime  # configures the interpreter before triton loads
from kernels._launch import sm_count

import triton

__all__ = ["TrainStep", "MATMULS"]

#: Where the matmuls run.
MATMULS = ("torch", "triton")
# Launch settings picked on an H200 at GPT-2 124M's shapes (16384 x 768 bfloat16, a vocabulary
# of 50304) by benchmarks/tune/gpt_step_tune.py (record: benchmarks/results/tune/h200-gpt-step-tune.json).
#: The bias gradients' column sum: (rows a program adds, columns a program owns) for narrow
#: (<= 1024 columns) and wide matrices; a second kernel adds the parts. (64 x 128 took 1.5x longer.)
COLSUM = {"narrow": (16, 32), "wide": (16, 32)} if runtime.SIMULATE else {"narrow": (128, 128), "wide": (256, 64)}
#: The LayerNorm backward (the residual's gradient added): rows a program holds at once, warps,
#: persistent programs per SM. 8 x 4 warps x 2 a SM took 0.067 ms where lesson 09's defaults for
#: these rows (8 x 16 warps x 1 a SM) took 0.197 ms: fewer warps per row group and two programs
#: per SM keep more loads in flight.
LN_BACKWARD = (8, 4, 2)
#: The fused cross entropy: columns a loop step takes and warps. 4096 x 8 warps took 1.38 ms,
#: lesson 11's 32768 x 32 warps (Liger Kernel's choice for long rows) 2.84 ms, over 16384 rows.
CE_BLOCK, CE_WARPS = (256, 4) if runtime.SIMULATE else (4096, 8)
#: Elements per program of the elementwise kernels here (bias + GELU, AdamW, the norm).
ELEMENTWISE_BLOCK = 256 if runtime.SIMULATE else 2048
NORM_BLOCK = 256 if runtime.SIMULATE else 8192
#: Elements a parameter's slice of the flat buffers is aligned to (128 bytes of float32).
ALIGN = 32


class _Cublas:
    """The matmuls on torch (cuBLAS on a GPU). Half operands give a float32 product straight
    into the gradient buffer (cuBLAS accumulates in float32 and stores float32); on a CPU the
    operands are widened first (the same products and float32 sums)."""
    name = "torch"

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.widening = None     # whether cuBLAS stores a float32 product of half operands (checked once)

    def linear(self, x, w, b, out):
        """out = x w^T (+ b)."""
        if b is None:
            torch.mm(x, w.t(), out=out)
        else:
            torch.addmm(b, x, w.t(), out=out)

    def mm(self, a, b, out):
        """out = a b, out of any float dtype."""
        if out.dtype == a.dtype:
            torch.mm(a, b, out=out)
        elif self.cuda and self.widening is not False:
            try:
                torch.ops.aten.mm.dtype_out(a, b, out.dtype, out=out)
                self.widening = True
            except (RuntimeError, NotImplementedError):
                if self.widening:
                    raise
                self.widening = False   # a torch without it: the half product, then a cast (a copy)
                out.copy_(torch.mm(a, b))
        elif self.cuda:
            out.copy_(torch.mm(a, b))
        else:
            torch.mm(a.to(out.dtype), b.to(out.dtype), out=out)


class _Triton:
    """The matmuls on lesson 06's Triton kernels, as kernels/triton/linear.py extends them: the
    bias added in the epilogue; for each product the fastest, timed once, of v3 (persistent,
    TMA) and the blocked kernel with the weight gradients (a small matrix summed over every
    token) split along K so that their few tiles fill the GPU. The kernel takes strides and
    stores in C's dtype: transposed operands need no copy, and bfloat16 operands give a
    float32 product straight into the gradient buffer."""
    name = "triton"

    def linear(self, x, w, b, out):
        from kernels.triton.linear import linear_into
        linear_into(x, w.t(), out, b)     # the method timed fastest for this problem, once

    def mm(self, a, b, out):
        from kernels.triton.linear import linear_into
        linear_into(a, b, out)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class TrainStep:
    """One training step of ``model`` (a :class:`utils.GPT`) on the course's kernels, for
    batches of ``batch`` x ``T`` tokens. AdamW with GPT-2's grouping (decay on matrices and
    embeddings only), gradient clipping at ``clip`` (0: none), a linear warmup of ``warmup``
    steps to ``lr``."""

    def __init__(self, model, *, batch: int, T: int, lr: float = 1e-3, weight_decay: float = 0.1,
                 betas=(0.9, 0.95), eps: float = 1e-8, clip: float = 1.0, warmup: int = 1,
                 dtype: torch.dtype = torch.bfloat16, matmul: str = "torch"):
        if matmul not in MATMULS:
            raise ValueError(f"TrainStep: matmul must be one of {MATMULS}, got {matmul!r}")
        if dtype not in (torch.bfloat16, torch.float32):
            raise TypeError(f"TrainStep: dtype must be torch.bfloat16 or torch.float32, got {dtype}")
        cfg = model.cfg
        if T > cfg.block_size or T < 1 or batch < 1:
            raise ValueError(f"TrainStep: batch {batch} x T {T}: T must be in 1..block_size ({cfg.block_size})")
        if cfg.n_embd > 16384:
            raise ValueError("TrainStep: rows of more than 16384 columns (the fused LayerNorm's limit)")
        self.model, self.cfg = model, cfg
        self.B, self.T, self.dtype = batch, T, dtype
        self.lr, self.weight_decay, self.betas, self.eps = float(lr), float(weight_decay), betas, float(eps)
        self.clip, self.warmup = float(clip), max(1, int(warmup))
        dev = next(model.parameters()).device
        self.device = dev
        self.mat = _Cublas(dev) if matmul == "torch" else _Triton()
        self._flatten(model)
        self._allocate()

    # ------------------------------------------------------------------ parameters, buffers
    def _flatten(self, model):
        named = list(model.named_parameters())
        decay = [(n, p) for n, p in named if p.dim() >= 2]
        no_decay = [(n, p) for n, p in named if p.dim() < 2]
        offsets, at = {}, 0
        for n, p in decay + no_decay:
            offsets[n] = (at, p.numel(), tuple(p.shape))
            at += _aligned(p.numel())
        self.n_decay = sum(_aligned(p.numel()) for _, p in decay)
        self.n_total = at
        f32 = dict(dtype=torch.float32, device=self.device)
        self.p32 = torch.zeros(at, **f32)
        self.g32 = torch.zeros(at, **f32)
        self.m32 = torch.zeros(at, **f32)
        self.v32 = torch.zeros(at, **f32)
        half = self.dtype != torch.float32
        self.p16 = torch.zeros(at, dtype=self.dtype, device=self.device) if half else self.p32
        self.w, self.w16, self.g = {}, {}, {}
        with torch.no_grad():
            for n, p in named:
                o, k, shape = offsets[n]
                self.p32[o:o + k].copy_(p.detach().reshape(-1))
                p.data = self.p32[o:o + k].view(shape)
                p.grad = self.g32[o:o + k].view(shape)
                self.w[n] = p.data
                self.w16[n] = self.p16[o:o + k].view(shape)
                self.g[n] = p.grad
        self.sync_weights()

    @torch.no_grad()
    def sync_weights(self):
        """Make the half copy of the weights again from the float32 ones (after a change from outside)."""
        if self.p16 is not self.p32:
            self.p16.copy_(self.p32)

    def _allocate(self):
        cfg, B, T = self.cfg, self.B, self.T
        N, C, L, V = B * T, cfg.n_embd, cfg.n_layer, cfg.vocab_size
        act = dict(dtype=self.dtype, device=self.device)
        f32 = dict(dtype=torch.float32, device=self.device)
        self.N = N
        # saved for the backward (the residual stream before each LayerNorm, what each matmul read)
        self.res = torch.empty(L + 1, N, C, **act)      # x entering layer l; res[L]: entering LN_f
        self.res2 = torch.empty(L, N, C, **act)         # x after layer l's attention
        self.ln1, self.ln2 = torch.empty(L, N, C, **act), torch.empty(L, N, C, **act)
        self.stats = torch.empty(2 * L + 1, 2, N, **f32)  # (mean, rstd) of LN1 (l), LN2 (L + l), LN_f (2L)
        self.qkv = torch.empty(L, N, 3 * C, **act)
        self.att = torch.empty(L, N, C, **act)
        self.lse = torch.empty(L, B, cfg.n_head, T, **f32)
        self.fc = torch.empty(L, N, 4 * C, **act)       # before the bias
        self.gelu = torch.empty(L, N, 4 * C, **act)
        self.lnf = torch.empty(N, C, **act)
        self.logits = torch.empty(N, V, **act)          # then d logits, in place
        # scratch
        self.proj = torch.empty(N, C, **act)            # a projection's output, until the next LayerNorm adds it
        self.dres = torch.empty(N, C, **act)            # the residual stream's gradient
        self.dh = torch.empty(N, C, **act)
        self.datt = torch.empty(N, C, **act)
        self.dqkv = torch.empty(N, 3 * C, **act)
        self.dg = torch.empty(N, 4 * C, **act)
        self.colsum_parts = torch.empty(triton.cdiv(N, min(r for r, _ in COLSUM.values())), 4 * C, **f32)
        from kernels.triton.layernorm import bwd_config
        nrows, block, warps, parts = bwd_config(N, C, self.res.element_size())
        if not runtime.SIMULATE and block == 1024:     # the width the settings were picked at
            nrows, warps, per_sm = LN_BACKWARD
            parts = min(triton.cdiv(N, nrows), per_sm * sm_count())
        self.ln_bwd = nrows, block, warps, parts
        self.ln_parts = torch.empty(2, parts, C, **f32)
        self.loss = torch.zeros((), **f32)
        self.count = torch.empty(1, **f32)
        self.norm = torch.empty(1, **f32)
        self.scale = torch.ones(1, **f32)
        self.state = torch.zeros(2, **f32)              # [step, lr]
        self.norm_parts = torch.empty(triton.cdiv(self.n_total, NORM_BLOCK), **f32)

    # ------------------------------------------------------------------ the pieces
    def _heads(self, t):
        """q, k, v as (B, H, T, d) views of a (N, 3C) buffer laid out (B, T, 3, H, d)."""
        cfg = self.cfg
        H = cfg.n_head
        return t.view(self.B, self.T, 3, H, cfg.n_embd // H).permute(2, 0, 3, 1, 4)

    def _bhtd(self, t):
        """A (N, C) buffer as (B, H, T, d): the layout the attention output goes into."""
        H = self.cfg.n_head
        return t.view(self.B, self.T, H, self.cfg.n_embd // H).transpose(1, 2)

    def _layernorm(self, x, w, b, y, st, residual=None, h=None):
        """y = LN(x) (or h = x + residual; y = LN(h)), statistics into st = (mean, rstd)."""
        from kernels.triton.layernorm import layernorm_rows_kernel, rows_config
        from kernels.triton.residual_layernorm import residual_layernorm_kernel
        N, C = y.shape
        eps = self.cfg.eps
        if residual is None:
            nrows, block, warps = rows_config(C, y.element_size())
            layernorm_rows_kernel[(triton.cdiv(N, nrows),)](x, w, b, y, st[0], st[1], N, C, eps, ROWS=nrows,
                                                            BLOCK=block, EVICT="", num_warps=warps)
        else:
            block = triton.next_power_of_2(C)
            residual_layernorm_kernel[(N,)](x, residual, w, b, h, y, st[0], st[1], C, eps, BLOCK_SIZE=block,
                                            num_warps=min(16, max(1, block // 256)))

    def _layernorm_backward(self, dy, x, w, st, dx, dw, db, add):
        """dx (+)= LN's input gradient; dw, db = its weight's and bias's (float32)."""
        from kernels.triton.layernorm import _column_sum, layernorm_bwd_partials_kernel
        N, C = dy.shape
        nrows, block, warps, parts = self.ln_bwd
        pdw, pdb = self.ln_parts[0], self.ln_parts[1]
        layernorm_bwd_partials_kernel[(parts,)](dy, x, w, st[0], st[1], dx, pdw, pdb, N, C, ROWS=nrows, BLOCK=block,
                                                ADD_DX=add, num_warps=warps)
        _column_sum(pdw, dw)
        _column_sum(pdb, db)

    def _bias_grad(self, dy, out):
        """out (float32) = the sum of dy's rows."""
        from kernels.triton.bias_gelu import column_partials_kernel
        from kernels.triton.layernorm import _column_sum
        N, cols = dy.shape
        rows, bc = COLSUM["narrow" if cols <= 1024 else "wide"]
        parts = self.colsum_parts[:triton.cdiv(N, rows), :cols]
        column_partials_kernel[(parts.shape[0], triton.cdiv(cols, bc))](dy, parts, N, cols, ROWS=rows, BLOCK_C=bc)
        _column_sum(parts, out)

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The forward and the loss (a 0-d float32 tensor, this step's buffer); the logits'
        buffer then holds d loss / d logits."""
        from kernels.triton.attention import attention_forward
        from kernels.triton.bias_gelu import bias_gelu_kernel
        from kernels.triton.cross_entropy import (
            COUNT_BLOCK,
            IGNORE_INDEX,
            _block,
            cross_entropy_count_kernel,
            cross_entropy_fused_kernel,
        )
        from kernels.triton.embedding import _block as emb_block
        from kernels.triton.embedding import embedding_position_kernel
        self._check_batch(x, y)
        cfg, w, w16, mat = self.cfg, self.w, self.w16, self.mat
        N, C, L = self.N, cfg.n_embd, cfg.n_layer
        ids = self._ids = x.reshape(-1)
        embedding_position_kernel[(N, triton.cdiv(C, emb_block(C)))](
            ids, w["wte.weight"], w["wpe.weight"], self.res[0], cfg.vocab_size, C, self.T, BLOCK_SIZE=emb_block(C))
        for l in range(L):
            p = f"blocks.{l}."
            if l == 0:
                self._layernorm(self.res[0], w[p + "ln_1.weight"], w[p + "ln_1.bias"], self.ln1[0], self.stats[0])
            else:
                self._layernorm(self.res2[l - 1], w[p + "ln_1.weight"], w[p + "ln_1.bias"], self.ln1[l],
                                self.stats[l], residual=self.proj, h=self.res[l])
            mat.linear(self.ln1[l], w16[p + "attn.weight"], w16[p + "attn.bias"], self.qkv[l])
            q, k, v = self._heads(self.qkv[l])
            attention_forward(q, k, v, True, out=(self._bhtd(self.att[l]), self.lse[l]))
            mat.linear(self.att[l], w16[p + "attn_proj.weight"], w16[p + "attn_proj.bias"], self.proj)
            self._layernorm(self.res[l], w[p + "ln_2.weight"], w[p + "ln_2.bias"], self.ln2[l], self.stats[L + l],
                            residual=self.proj, h=self.res2[l])
            mat.linear(self.ln2[l], w16[p + "fc.weight"], None, self.fc[l])
            n = self.fc[l].numel()
            bias_gelu_kernel[(triton.cdiv(n, ELEMENTWISE_BLOCK),)](self.fc[l], w[p + "fc.bias"], self.gelu[l], n,
                                                                  4 * C, BLOCK_SIZE=ELEMENTWISE_BLOCK)
            mat.linear(self.gelu[l], w16[p + "fc_proj.weight"], w16[p + "fc_proj.bias"], self.proj)
        self._layernorm(self.res2[L - 1], w["ln_f.weight"], w["ln_f.bias"], self.lnf, self.stats[2 * L],
                        residual=self.proj, h=self.res[L])
        mat.linear(self.lnf, w16["wte.weight"], None, self.logits)
        # the loss: count the targets, then one program per row (the loss, and the gradient over the logits)
        targets = y.reshape(-1)
        self.loss.zero_()
        cross_entropy_count_kernel[(1,)](targets, N, IGNORE_INDEX, self.count, BLOCK_SIZE=COUNT_BLOCK)
        cross_entropy_fused_kernel[(N,)](self.logits, targets, self.count, self.loss, self.logits, cfg.vocab_size,
                                         IGNORE_INDEX, BLOCK_SIZE=min(CE_BLOCK, _block(cfg.vocab_size)),
                                         num_warps=CE_WARPS)
        return self.loss

    def _check_batch(self, x, y):
        want = (self.B, self.T)
        for name, t in (("x", x), ("y", y)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
                raise ValueError(f"TrainStep: {name} must be a {want} tensor of token ids (the step's shape), "
                                 f"got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
            if t.dtype != torch.int64 or t.device != self.device or not t.is_contiguous():
                raise TypeError(f"TrainStep: {name} must be contiguous int64 on {self.device}, "
                                f"got {t.dtype} on {t.device}")

    # ------------------------------------------------------------------ backward
    def backward(self):
        """Every gradient into the flat float32 buffer (``p.grad`` of the model), from the
        d logits the forward left in the logits' buffer."""
        from kernels.frames.embedding import CHUNK, chunk_partials
        from kernels.triton.attention import attention_backward
        from kernels.triton.bias_gelu import bias_gelu_backward_kernel, column_partials_kernel
        from kernels.triton.embedding import _block as emb_block
        from kernels.triton.embedding import embedding_backward_chunk_kernel, embedding_backward_join_kernel
        cfg, w, w16, g, mat = self.cfg, self.w, self.w16, self.g, self.mat
        N, C, L = self.N, cfg.n_embd, cfg.n_layer
        dlogits = self.logits
        mat.mm(dlogits, w16["wte.weight"], self.dh)                       # d lnf
        mat.mm(dlogits.t(), self.lnf, g["wte.weight"])                    # the head's part of d wte
        self._layernorm_backward(self.dh, self.res[L], w["ln_f.weight"], self.stats[2 * L], self.dres,
                                 g["ln_f.weight"], g["ln_f.bias"], add=False)
        for l in reversed(range(L)):
            p = f"blocks.{l}."
            # MLP: m = gelu(h W_fc^T + b_fc) W_fcproj^T + b_fcproj, d m = dres
            mat.mm(self.dres, w16[p + "fc_proj.weight"], self.dg)
            mat.mm(self.dres.t(), self.gelu[l], g[p + "fc_proj.weight"])
            self._bias_grad(self.dres, g[p + "fc_proj.bias"])
            n = self.dg.numel()
            bias_gelu_backward_kernel[(triton.cdiv(n, ELEMENTWISE_BLOCK),)](
                self.dg, self.fc[l], w[p + "fc.bias"], self.dg, n, 4 * C, BLOCK_SIZE=ELEMENTWISE_BLOCK)
            self._bias_grad(self.dg, g[p + "fc.bias"])
            mat.mm(self.dg.t(), self.ln2[l], g[p + "fc.weight"])
            mat.mm(self.dg, w16[p + "fc.weight"], self.dh)
            self._layernorm_backward(self.dh, self.res2[l], w[p + "ln_2.weight"], self.stats[L + l], self.dres,
                                     g[p + "ln_2.weight"], g[p + "ln_2.bias"], add=True)
            # attention: a = attention(q, k, v) W_proj^T + b_proj, d a = dres
            mat.mm(self.dres, w16[p + "attn_proj.weight"], self.datt)
            mat.mm(self.dres.t(), self.att[l], g[p + "attn_proj.weight"])
            self._bias_grad(self.dres, g[p + "attn_proj.bias"])
            q, k, v = self._heads(self.qkv[l])
            attention_backward(q, k, v, self._bhtd(self.att[l]), self.lse[l], self._bhtd(self.datt), True,
                               out=tuple(self._heads(self.dqkv)))
            self._bias_grad(self.dqkv, g[p + "attn.bias"])
            mat.mm(self.dqkv.t(), self.ln1[l], g[p + "attn.weight"])
            mat.mm(self.dqkv, w16[p + "attn.weight"], self.dh)
            self._layernorm_backward(self.dh, self.res[l], w[p + "ln_1.weight"], self.stats[l], self.dres,
                                     g[p + "ln_1.weight"], g[p + "ln_1.bias"], add=True)
        # the embeddings: tokens scatter-added into d wte (sorted, deterministic), positions summed over the batch
        ids = self._ids
        sorted_ids, perm = torch.sort(ids, stable=True)
        chunks, head, tail = chunk_partials(sorted_ids, C)
        grid, bd = (chunks, triton.cdiv(C, emb_block(C))), emb_block(C)
        embedding_backward_chunk_kernel[grid](sorted_ids, perm, self.dres, g["wte.weight"], head, tail, N,
                                              cfg.vocab_size, C, CHUNK=CHUNK, BLOCK_SIZE=bd)
        embedding_backward_join_kernel[grid](sorted_ids, head, tail, g["wte.weight"], N, cfg.vocab_size, C,
                                             CHUNK=CHUNK, BLOCK_SIZE=bd)
        dpos = g["wpe.weight"][:self.T].reshape(1, -1)
        column_partials_kernel[(1, triton.cdiv(self.T * C, 1024))](
            self.dres, dpos, self.B, self.T * C, ROWS=triton.next_power_of_2(self.B), BLOCK_C=1024)

    # ------------------------------------------------------------------ update
    def update(self):
        """Clip by the global norm (on the device) and AdamW over the flat buffers: two launches
        for the norm, one for the schedule, two for the weights."""
        from kernels.triton.adamw import (
            adamw_master_kernel,
            adamw_schedule_kernel,
            grad_norm_finish_kernel,
            grad_norm_partials_kernel,
        )
        n = self.n_total
        blocks = triton.cdiv(n, NORM_BLOCK)
        grad_norm_partials_kernel[(blocks,)](self.g32, n, self.norm_parts, 0, BLOCK_SIZE=NORM_BLOCK)
        grad_norm_finish_kernel[(1,)](self.norm_parts, blocks, self.clip, self.norm, self.scale, BLOCK_SIZE=1024)
        adamw_schedule_kernel[(1,)](self.state, self.lr, float(self.warmup))
        b1, b2 = self.betas
        half = self.p16 is not self.p32
        for lo, hi, wd in ((0, self.n_decay, self.weight_decay), (self.n_decay, n, 0.0)):
            if hi > lo:
                adamw_master_kernel[(triton.cdiv(hi - lo, ELEMENTWISE_BLOCK),)](
                    self.p32[lo:hi], self.g32[lo:hi], self.m32[lo:hi], self.v32[lo:hi], self.p16[lo:hi], self.scale,
                    self.state, wd, b1, b2, math.log2(b1), math.log2(b2), self.eps, hi - lo, HALF=half,
                    BLOCK_SIZE=ELEMENTWISE_BLOCK)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step; returns the loss of the batch (before the update), a 0-d
        float32 tensor on the device: this step's own buffer, overwritten by the next step."""
        loss = self.forward(x, y)
        self.backward()
        self.update()
        return loss

    @property
    def steps_taken(self) -> int:
        """The steps the optimizer has taken (read from the device)."""
        return int(self.state[0])
