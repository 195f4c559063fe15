"""Cross-entropy's frame, shared by the CUDA C++, Numba and Triton launchers: ``IGNORE_INDEX``,
the input rules, the outputs each kind of launcher fills and the PyTorch references.

    check_ce_inputs(logits, targets, op)       logits 2-D float (rows, V), targets int64 (rows,), or a clear error
    prepare_forward(logits, targets, ...)      the inputs checked, and loss and lse per row to fill
    prepare_backward(logits, targets, lse, dloss, ...)   the same for the gradient (over the logits if inplace)
    prepare_mean_loss(logits, targets, ...)    the same for a launcher of the mean loss and its gradient
    cross_entropy_ref, cross_entropy_loss_ref  torch's gradient of the mean loss, and the mean loss

A row whose target is ``ignore_index`` (-100, as torch's) adds nothing and gets a zero gradient.
"""
from __future__ import annotations

import torch

from runtime.inputs import INT32_MAX, check_indices, check_input

IGNORE_INDEX = -100
LOGIT_DTYPES = (torch.float32, torch.bfloat16)


def check_ce_inputs(logits, targets, op, dtypes=LOGIT_DTYPES, ignore_index=IGNORE_INDEX):
    """(logits, targets, ignore_index) checked: logits 2-D float (rows, V), targets int64 (rows,),
    both contiguous; ignore_index an int."""
    logits = check_input(logits, "logits", ndim=2, max_numel=INT32_MAX, op=op, dtypes=dtypes)
    targets = check_indices(targets, "targets", op=op, what="class indices")
    if tuple(targets.shape) != (logits.shape[0],):
        raise ValueError(f"{op}: targets must have shape ({logits.shape[0]},), one class per row of logits, "
                         f"got {tuple(targets.shape)}")
    if logits.shape[0] and logits.shape[1] == 0:
        raise ValueError(f"{op}: logits has no columns (V = 0): there is no class to predict")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{op}: ignore_index must be an int, got {type(ignore_index).__name__}")
    return logits, targets, ignore_index


def prepare_forward(logits, targets, ignore_index, dtypes=LOGIT_DTYPES):
    """cross_entropy_forward's inputs checked and its outputs made: (logits, targets,
    ignore_index, loss per row, lse per row), the outputs float32 (rows,) for a kernel to fill."""
    logits, targets, ignore_index = check_ce_inputs(logits, targets, "cross_entropy_forward", dtypes, ignore_index)
    loss, lse = torch.empty(2, logits.shape[0], dtype=torch.float32, device=logits.device)
    return logits, targets, ignore_index, loss, lse


def _grad_output(logits, inplace):
    return logits if inplace else torch.empty_like(logits)  # in place: over the logits themselves


def prepare_backward(logits, targets, lse, dloss, ignore_index, inplace, dtypes=LOGIT_DTYPES):
    """cross_entropy_backward's inputs checked (lse and dloss float32, one value per row of
    logits) and its output made: (logits, targets, lse, dloss, ignore_index, grad)."""
    op = "cross_entropy_backward"
    logits, targets, ignore_index = check_ce_inputs(logits, targets, op, dtypes, ignore_index)
    lse = check_input(lse, "lse", ndim=1, op=op)
    dloss = check_input(dloss, "dloss", ndim=1, op=op)
    for t, name in ((lse, "lse"), (dloss, "dloss")):
        if t.shape[0] != logits.shape[0]:
            raise ValueError(f"{op}: {name} must have one value per row of logits ({logits.shape[0]}), "
                             f"got {tuple(t.shape)}")
    return logits, targets, lse, dloss, ignore_index, _grad_output(logits, inplace)


def prepare_mean_loss(logits, targets, ignore_index, inplace, dtypes=LOGIT_DTYPES):
    """The inputs of a launcher of the mean loss checked and its outputs made: (logits, targets,
    ignore_index, loss, grad), loss a 0-d float32 0 for the kernels to add into (NaN for no
    rows: the mean of nothing, as torch's), grad over the logits when ``inplace``."""
    logits, targets, ignore_index = check_ce_inputs(logits, targets, "cross_entropy", dtypes, ignore_index)
    loss = torch.zeros((), dtype=torch.float32, device=logits.device)
    if logits.shape[0] == 0:
        loss.fill_(float("nan"))
    return logits, targets, ignore_index, loss, _grad_output(logits, inplace)


def cross_entropy_ref(logits, targets, ignore_index=IGNORE_INDEX):
    """torch's answer for the topic's reference: d(mean loss)/d logits, in the logits' dtype."""
    x = logits.detach().clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(x, targets.long(), ignore_index=ignore_index).backward()
    return x.grad


def cross_entropy_loss_ref(logits, targets, ignore_index=IGNORE_INDEX):
    return torch.nn.functional.cross_entropy(logits, targets.long(), ignore_index=ignore_index)
