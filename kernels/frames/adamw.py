"""AdamW's frame, shared by the CUDA C++, Numba and Triton launchers: the input rules, the
step's host-side arithmetic, the gradient norm's buffers, the grid caps and the PyTorch
references.

    adamw_tensors(params, grads, exp_avg, exp_avg_sq, grad_scale)
                                    each tensor checked before its launch: (p, g, m, v, n, scale)
    check_hyper(step, lr, beta1, beta2, eps, weight_decay)
                                    the hyperparameters checked, as the kernels take them
    prepare_grad_norm(grads, blocks_for)   grad_norm's inputs checked and its buffers made
    MAX_BLOCKS, NORM_BLOCKS         blocks of a grid-stride launch, and of the norm's first pass
    adamw_ref, grad_norm_ref        torch.optim.AdamW's step, and the float64 norm
"""
from __future__ import annotations

import itertools
import math

import torch

import runtime
from runtime.inputs import check_input, check_tensor

#: Blocks of a grid-stride launch: a few waves of an H100's 132 SMs; few in simulation.
MAX_BLOCKS = 8 if runtime.SIMULATE else 132 * 16
#: Blocks of the norm's first pass (its partial sums are added by one block).
NORM_BLOCKS = 4 if runtime.SIMULATE else 1024
DEFAULTS = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2)


def _as_lists(p, g, m, v, op):
    if isinstance(p, (list, tuple)):
        lists = [list(p), list(g), list(m), list(v)]
        if len({len(x) for x in lists}) != 1:
            raise ValueError(f"{op}: params, grads, exp_avg and exp_avg_sq must be lists of one length, got "
                             f"{[len(x) for x in lists]}")
        return list(zip(*lists))
    return [(p, g, m, v)]


def check_adamw_inputs(p, g, m, v, op="adamw"):
    """(p, g, m, v) checked: float32, one shape, on the device; p, m, v contiguous (written in place)."""
    for t, name in ((p, "params"), (g, "grads"), (m, "exp_avg"), (v, "exp_avg_sq")):
        check_tensor(t, name, op=op)
        if t.shape != p.shape:
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)} but params has {tuple(p.shape)}")
    for t, name in ((p, "params"), (m, "exp_avg"), (v, "exp_avg_sq")):
        if not t.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous: it is updated in place (a copy would not "
                             "reach your tensor)")
    return p, g.contiguous(), m, v


def check_hyper(step, lr, beta1, beta2, eps, weight_decay, op="adamw"):
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"{op}: step must be an int >= 1 (the step number, counted from 1), got {step!r}")
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"{op}: betas must lie in [0, 1), got ({beta1}, {beta2})")
    if lr < 0 or eps < 0 or weight_decay < 0:
        raise ValueError(f"{op}: lr, eps and weight_decay must be >= 0")
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    return dict(lr_wd=lr * weight_decay, beta1=beta1, beta2=beta2, step_size=lr / bc1,
                inv_sqrt_bc2=1.0 / math.sqrt(bc2), eps=eps)


def scale_tensor(grad_scale, device, op="adamw"):
    if grad_scale is None:
        return torch.ones(1, dtype=torch.float32, device=device)
    check_tensor(grad_scale, "grad_scale", op=op)
    if grad_scale.numel() != 1:
        raise ValueError(f"{op}: grad_scale must hold one number, got shape {tuple(grad_scale.shape)}")
    return grad_scale.reshape(1).contiguous()


def adamw_tensors(params, grads, exp_avg, exp_avg_sq, grad_scale):
    """The tensors of one step, each checked just before its launch (as the launchers of all
    three languages go): ``(p, g, m, v, n, s)`` for every non-empty tensor, ``s`` the gradient
    scale on its device."""
    for p, g, m, v in _as_lists(params, grads, exp_avg, exp_avg_sq, "adamw"):
        p, g, m, v = check_adamw_inputs(p, g, m, v)
        n = p.numel()
        if n:
            yield p, g, m, v, n, scale_tensor(grad_scale, p.device)


def prepare_grad_norm(grads, blocks_for):
    """grad_norm's inputs checked and its buffers made, for the three languages:
    ``(pieces, partials, norm, scale)``. ``pieces``: (flat gradient, blocks, offset) for each
    non-empty gradient, whose ``blocks_for(numel)`` blocks write their partial sums of squares
    to ``partials[offset:offset + blocks]`` (zeros); ``norm`` (0-d) and ``scale`` (1 element):
    float32, for the finishing kernel."""
    tensors = list(grads) if isinstance(grads, (list, tuple)) else [grads]
    flat = [check_input(t, "grads", op="grad_norm").reshape(-1) for t in tensors]
    device = flat[0].device if flat else runtime.DEVICE
    blocks = [blocks_for(t.numel()) for t in flat]
    pieces = [(t, b, offset) for t, b, offset in zip(flat, blocks, itertools.accumulate([0] + blocks)) if b]
    partials = torch.zeros(max(1, sum(blocks)), dtype=torch.float32, device=device)
    norm = torch.empty((), dtype=torch.float32, device=device)
    scale = torch.empty(1, dtype=torch.float32, device=device)
    return pieces, partials, norm, scale


def adamw_ref(params, grads, exp_avg, exp_avg_sq, *, step=3, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
              weight_decay=0.1):
    """torch.optim.AdamW's step ``step`` from the state (exp_avg, exp_avg_sq) given: the new params."""
    p = params.detach().clone().requires_grad_(True)
    opt = torch.optim.AdamW([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay, foreach=False)
    p.grad = grads.detach().clone().to(p.dtype)
    opt.state[p] = {"step": torch.tensor(float(step - 1)), "exp_avg": exp_avg.detach().clone().to(p.dtype),
                    "exp_avg_sq": exp_avg_sq.detach().clone().to(p.dtype)}
    opt.step()
    return p.detach()


def grad_norm_ref(grads):
    tensors = list(grads) if isinstance(grads, (list, tuple)) else [grads]
    return torch.sqrt(sum((t.double() ** 2).sum() for t in tensors))
