"""The course's kernels as ``torch.library`` ops, every one of them, in one namespace
(``torch.ops.course.X``), each with a fake kernel (so ``torch.compile`` and ``opcheck`` can trace it
without running it: the fake kernel says what the outputs look like) and its autograd (so eager
autograd runs the course's backward kernels).

    torch.ops.course.X              its kernels                                    called here as
    layernorm_triton (+ _backward)  lesson 09's Triton LayerNorm -> y, mean, rstd  layernorm_op(x, w, b, eps)
    attention (+ _backward)         lesson 10's Triton FlashAttention-2 -> o, L    attention_op(q, k, v, causal) -> o
    gelu                            lesson 03's Triton GELU (backward in torch operators)
    linear (+ _backward)            lesson 06's Triton matmul: x W^T + b
    embedding (+ _backward)         lesson 11's Triton gather, sorted scatter-add backward
    cross_entropy                   lesson 11's fused Triton loss + gradient -> loss, dlogits

The ops sit above the kernels: they import the kernel modules (``kernels/<lang>/<topic>.py``),
which never import this one. They import them when an op first runs, so that ``import utils``
(which imports this module for lesson 11's GPT) does not load every Triton kernel module.

Lesson 11's GPT calls the ops through :class:`Ops` (lesson 11 reads this module as
``utils.gpt_ops``):

    OPS["course"]       the operators of lesson 11's model on the course's kernels
    OPS["torch"]        the same operators on torch's kernels
    ops_for(backend, matmul)  an :class:`Ops` for ``backend`` "torch" | "course" and ``matmul``
                        "torch" (cuBLAS, or the CPU's BLAS) | "triton" (lesson 06's Triton matmul)

Each operator of the model, and whose kernel runs it with ``backend="course"``:

    layernorm     lesson 09's Triton LayerNorm, forward and backward (``course::layernorm_triton``)
    attention     lesson 10's Triton FlashAttention-2, causal, forward and backward (``course::attention``)
    gelu          lesson 03's Triton GELU kernel forward (``course::gelu``); its backward is
                  the derivative in torch operators until a GELU backward kernel exists
    linear        ``matmul="triton"``: lesson 06's Triton matmul for x W^T and for both gradients
                  (``course::linear``); ``matmul="torch"``: torch's matmul (cuBLAS on a GPU)
    embedding     lesson 11's Triton gather, and its backward: the ids sorted, one owner per row of
                  the table (deterministic) (``course::embedding``); float32 tables
    cross_entropy lesson 11's fused Triton cross entropy: the loss and its gradient in one pass over
                  the logits, the gradient kept for the backward (``course::cross_entropy``);
                  float32 or bfloat16 logits
    (float64, for the gradient check, takes torch's embedding and cross entropy: those kernels
    are float32/bfloat16 only)

The kernels of embedding, cross entropy, AdamW and the fused bias + GELU / residual + LayerNorm
are plugged in through ``Ops`` too (``Ops.replace``): the gradient check and the grader of
lesson 11 swap one operator at a time.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["Ops", "OPS", "ops_for", "OP_NAMES", "gelu_tanh", "gelu_tanh_backward", "layernorm_op",
           "layernorm_backward_op", "attention_op"]

#: The operators of the model, in the order a block calls them.
OP_NAMES = ("embedding", "layernorm", "linear", "attention", "gelu", "cross_entropy")

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation (GPT-2's), in torch operators."""
    return F.gelu(x, approximate="tanh")


def gelu_tanh_backward(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """d gelu / dx * dy for the tanh approximation, in torch operators (computed in float32 or
    better): with u = sqrt(2/pi)(x + 0.044715 x^3) and t = tanh(u),
    gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi)(1 + 3 * 0.044715 x^2)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    t = torch.tanh(_SQRT_2_OVER_PI * (xf + 0.044715 * xf * xf * xf))
    d = 0.5 * (1 + t) + 0.5 * xf * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * xf * xf)
    return (dy.to(d.dtype) * d).to(dy.dtype)


# ------------------------------------------------------------------------------------------
# GELU: lesson 03's Triton kernel, launched here for float32 and float64 (the kernel is
# dtype-generic; its launcher takes float32 only); bfloat16 goes through float32.
# ------------------------------------------------------------------------------------------
def _gelu_launch(x: torch.Tensor) -> torch.Tensor:
    import numpy as np

    from kernels.triton.gelu import BLOCK_SIZE, gelu_kernel

    import triton
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x.contiguous()
    y = torch.empty_like(work)
    n = work.numel()
    if n:
        with np.errstate(over="ignore"):
            gelu_kernel[(triton.cdiv(n, BLOCK_SIZE),)](work, y, n, BLOCK_SIZE=BLOCK_SIZE)
    return y.to(x.dtype)


@torch.library.custom_op("course::gelu", mutates_args=())
def _gelu_op(x: torch.Tensor) -> torch.Tensor:
    return _gelu_launch(x)


@_gelu_op.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _gelu_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return gelu_tanh_backward(dy, x)


_gelu_op.register_autograd(_gelu_backward, setup_context=_gelu_setup)


# ------------------------------------------------------------------------------------------
# Linear: y = x W^T + b with lesson 06's Triton matmul (exact fp32 products for float32,
# tensor cores with fp32 sums for bfloat16/float16), and the same kernel for both gradients:
# dx = dy W, dW = dy^T x (transposed views: the kernel takes strides, no copies).
# ------------------------------------------------------------------------------------------
def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from kernels.triton.matmul import matmul_fp16, matmul_fp32
    if a.dtype == torch.float32:
        return matmul_fp32(a, b)
    if a.dtype in (torch.float16, torch.bfloat16):
        return matmul_fp16(a, b)
    raise TypeError(f"linear (Triton matmul): float32, float16 or bfloat16 inputs, got {a.dtype}: "
                    "use matmul='torch' for float64")


@torch.library.custom_op("course::linear", mutates_args=())
def _linear_op(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = _mm(x, w.t())
    if b is not None:
        y += b
    return y


@_linear_op.register_fake
def _(x, w, b):
    return x.new_empty(x.shape[0], w.shape[0])


@torch.library.custom_op("course::linear_backward", mutates_args=())
def _linear_backward_op(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                        has_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx = _mm(dy, w)
    dw = _mm(dy.t(), x)
    db = dy.sum(0, dtype=torch.float32).to(dy.dtype) if has_bias else dy.new_zeros(0)
    return dx, dw, db


@_linear_backward_op.register_fake
def _(dy, x, w, has_bias):
    return torch.empty_like(x), torch.empty_like(w), dy.new_empty(dy.shape[1] if has_bias else 0)


def _linear_setup(ctx, inputs, output):
    x, w, b = inputs
    ctx.save_for_backward(x, w)
    ctx.has_bias = b is not None


def _linear_backward(ctx, dy):
    x, w = ctx.saved_tensors
    dx, dw, db = torch.ops.course.linear_backward(dy.contiguous(), x, w, ctx.has_bias)
    return dx, dw, (db if ctx.has_bias else None)


_linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)


def _autocast_dtype(device_type: str):
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def linear_triton(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w.T + b`` over the last dim of x, on the Triton matmul. Under autocast the
    operands are cast to the autocast dtype first, as ``F.linear`` would be."""
    dt = _autocast_dtype(x.device.type)
    if dt is not None:
        x, w = x.to(dt), w.to(dt)
        b = b.to(dt) if b is not None else None
    lead = x.shape[:-1]
    y = torch.ops.course.linear(x.reshape(-1, x.shape[-1]), w, b)
    return y.reshape(*lead, w.shape[0])


# ------------------------------------------------------------------------------------------
# LayerNorm: lesson 09's Triton kernels (kernels/triton/layernorm.py). The op returns, besides
# y, the statistics the backward needs (float32; float64 for float64 x, what gradcheck needs).
# ------------------------------------------------------------------------------------------
@torch.library.custom_op("course::layernorm_triton", mutates_args=())
def layernorm_op(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y, mean, rstd of LayerNorm over the last dim (the Triton kernels)."""
    from kernels.triton.layernorm import layernorm
    return layernorm(x, w, b, eps, stats=True)


@layernorm_op.register_fake
def _(x, w, b, eps):
    rows = x.numel() // x.shape[-1] if x.shape[-1] else x.numel()
    st = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.empty_like(x), x.new_empty(rows, dtype=st), x.new_empty(rows, dtype=st)


@torch.library.custom_op("course::layernorm_triton_backward", mutates_args=())
def layernorm_backward_op(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor,
                          rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from kernels.triton.layernorm import layernorm_backward
    return layernorm_backward(dy, x, w, mean, rstd)


@layernorm_backward_op.register_fake
def _(dy, x, w, mean, rstd):
    return torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)


def _layernorm_setup(ctx, inputs, output):
    x, w, b, eps = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, w, mean, rstd)


def _layernorm_backward(ctx, dy, dmean, drstd):
    # mean and rstd are saved statistics, not outputs anyone differentiates
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = layernorm_backward_op(dy.contiguous(), x, w, mean, rstd)
    return dx, dw, db, None


layernorm_op.register_autograd(_layernorm_backward, setup_context=_layernorm_setup)


# ------------------------------------------------------------------------------------------
# Attention: lesson 10's Triton FlashAttention-2 (kernels/triton/attention.py), forward v3 and
# the "separate" backward. The op returns o and L, the logsumexp the backward needs.
# ------------------------------------------------------------------------------------------
@torch.library.custom_op("course::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from kernels.triton.attention import attention_forward
    o, lse = attention_forward(q, k, v, causal)
    return o, lse


@_attention_op.register_fake
def _(q, k, v, causal):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("course::attention_backward", mutates_args=())
def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                           lse: torch.Tensor, do: torch.Tensor,
                           causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from kernels.triton.attention import attention_backward
    return attention_backward(q, k, v, o, lse, do, causal)


@_attention_backward_op.register_fake
def _(q, k, v, o, lse, do, causal):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _attention_setup(ctx, inputs, output):
    q, k, v, causal = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal = causal


def _attention_backward(ctx, do, dlse):
    # L is an output for the backward's sake; its own gradient is not supported (None or 0).
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.course.attention_backward(q, k, v, o, lse, do.contiguous(), ctx.causal)
    return dq, dk, dv, None


_attention_op.register_autograd(_attention_backward, setup_context=_attention_setup)


def attention_op(q, k, v, causal=False):
    """The torch.library op ``course::attention`` (o only): works with torch.compile and autograd."""
    return torch.ops.course.attention(q, k, v, bool(causal))[0]


# ------------------------------------------------------------------------------------------
# The model's LayerNorm, attention and GELU on the ops above.
# ------------------------------------------------------------------------------------------
def layernorm_course(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    if x.dtype != w.dtype and x.dtype != torch.float64:
        w, b = w.to(x.dtype), b.to(x.dtype)
    return torch.ops.course.layernorm_triton(x, w, b, eps)[0]


def attention_course(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of (B, H, T, d) q, k, v on lesson 10's FlashAttention."""
    return torch.ops.course.attention(q, k, v, True)[0]


def gelu_course(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.course.gelu(x)


# ------------------------------------------------------------------------------------------
# Embedding and cross entropy: lesson 11's kernels (kernels/triton/embedding.py and
# cross_entropy.py), for float32 tables and float32/bfloat16 logits; other dtypes (float64 in
# the gradient check) go to torch's.
# ------------------------------------------------------------------------------------------
@torch.library.custom_op("course::embedding", mutates_args=())
def _embedding_op(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    from kernels.triton.embedding import embedding
    return embedding(ids, weight)


@_embedding_op.register_fake
def _(ids, weight):
    return weight.new_empty(*ids.shape, weight.shape[1])


@torch.library.custom_op("course::embedding_backward", mutates_args=())
def _embedding_backward_op(ids: torch.Tensor, dout: torch.Tensor, vocab: int) -> torch.Tensor:
    from kernels.triton.embedding import embedding_backward
    dweight = torch.zeros(vocab, dout.shape[-1], dtype=torch.float32, device=dout.device)
    return embedding_backward(ids.reshape(-1), dout.reshape(-1, dout.shape[-1]).float(), dweight)


@_embedding_backward_op.register_fake
def _(ids, dout, vocab):
    return dout.new_empty(vocab, dout.shape[-1], dtype=torch.float32)


def _embedding_setup(ctx, inputs, output):
    ids, weight = inputs
    ctx.save_for_backward(ids)
    ctx.vocab = weight.shape[0]


def _embedding_backward(ctx, dout):
    (ids,) = ctx.saved_tensors
    return None, torch.ops.course.embedding_backward(ids, dout.contiguous(), ctx.vocab)


_embedding_op.register_autograd(_embedding_backward, setup_context=_embedding_setup)


def embedding_course(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if weight.dtype != torch.float32:
        return F.embedding(ids, weight)
    return torch.ops.course.embedding(ids, weight)


@torch.library.custom_op("course::cross_entropy", mutates_args=())
def _cross_entropy_op(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean loss and its gradient with respect to the logits, in one pass (fused)."""
    from kernels.triton.cross_entropy import cross_entropy
    return cross_entropy(logits, targets)


@_cross_entropy_op.register_fake
def _(logits, targets):
    return logits.new_empty((), dtype=torch.float32), torch.empty_like(logits)


def _ce_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])


def _ce_backward(ctx, dloss, dgrad):
    (grad,) = ctx.saved_tensors
    return grad * dloss.to(grad.dtype), None


_cross_entropy_op.register_autograd(_ce_backward, setup_context=_ce_setup)


def cross_entropy_course(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if logits.dtype not in (torch.float32, torch.bfloat16):
        return _cross_entropy_torch(logits, targets)
    return torch.ops.course.cross_entropy(logits.contiguous(), targets.contiguous())[0]


def _cross_entropy_torch(logits, targets):
    # float32 at least (bfloat16 logits under autocast are upcast, as autocast would do)
    return F.cross_entropy(logits if logits.dtype == torch.float64 else logits.float(), targets)


def _attention_torch(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _layernorm_torch(x, w, b, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


@dataclasses.dataclass(frozen=True)
class Ops:
    """The operators a model calls, and which kernels run them. ``sources`` names, for each
    operator, where its kernel comes from (shown in the lesson and in check reports)."""
    embedding: Callable
    layernorm: Callable
    linear: Callable
    attention: Callable
    gelu: Callable
    cross_entropy: Callable
    sources: tuple = ()

    def replace(self, **fns) -> "Ops":
        """A copy with some operators replaced (``ops.replace(gelu=my_gelu)``)."""
        unknown = set(fns) - set(OP_NAMES)
        if unknown:
            raise ValueError(f"Ops.replace: no operator {sorted(unknown)}; the model's operators are {OP_NAMES}")
        src = dict(self.sources)
        src.update({k: "yours" for k in fns})
        return dataclasses.replace(self, **fns, sources=tuple(src.items()))

    def source(self, name: str) -> str:
        return dict(self.sources).get(name, "?")


_TORCH_SOURCES = (("embedding", "torch F.embedding"), ("layernorm", "torch F.layer_norm"),
                  ("linear", "torch F.linear"), ("attention", "torch SDPA (causal)"),
                  ("gelu", "torch F.gelu (tanh)"), ("cross_entropy", "torch F.cross_entropy"))

TORCH_OPS = Ops(embedding=F.embedding, layernorm=_layernorm_torch, linear=F.linear, attention=_attention_torch,
                gelu=gelu_tanh, cross_entropy=_cross_entropy_torch, sources=_TORCH_SOURCES)

COURSE_OPS = Ops(embedding=embedding_course, layernorm=layernorm_course, linear=F.linear, attention=attention_course,
                 gelu=gelu_course, cross_entropy=cross_entropy_course,
                 sources=(("embedding", "lesson 11: Triton gather, sorted scatter-add bwd (float32; torch in float64)"),
                          ("layernorm", "lesson 09: Triton LayerNorm fwd + bwd"),
                          ("linear", "torch matmul (cuBLAS on a GPU)"),
                          ("attention", "lesson 10: Triton FlashAttention-2 fwd + bwd"),
                          ("gelu", "lesson 03: Triton GELU fwd (bwd in torch)"),
                          ("cross_entropy",
                           "lesson 11: Triton fused loss + gradient (float32/bf16; torch in float64)")))

OPS = {"torch": TORCH_OPS, "course": COURSE_OPS}
BACKENDS = tuple(OPS)
MATMULS = ("torch", "triton")


def ops_for(backend: str = "torch", matmul: str = "torch") -> Ops:
    """The operators for ``backend`` ("torch" | "course") with ``matmul`` ("torch" | "triton")."""
    if backend not in OPS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if matmul not in MATMULS:
        raise ValueError(f"matmul must be one of {MATMULS}, got {matmul!r}")
    ops = OPS[backend]
    if matmul == "triton":
        src = dict(ops.sources)
        src["linear"] = "lesson 06: Triton matmul fwd + bwd"
        ops = dataclasses.replace(ops, linear=linear_triton, sources=tuple(src.items()))
    return ops
