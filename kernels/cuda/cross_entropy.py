"""Softmax cross-entropy in CUDA C++: launchers for ``cross_entropy.cu``.

    cross_entropy(logits, targets)      the reference (v3): (mean loss, d loss / d logits)
    cross_entropy_unfused(...)          v1: forward, mean and backward as three kernels
    cross_entropy_fused(...)            v2: one kernel, the row read twice and written once
    cross_entropy_fused4(...)           v3: v2 with 4 values per load and store
    cross_entropy_forward(logits, targets)               -> (loss per row, lse per row)
    cross_entropy_backward(logits, targets, lse, dloss)  -> d logits, for an upstream dloss per row

``logits`` is (rows, V), float32 or bfloat16; ``targets`` (rows,) int64. A row whose target
is ``ignore_index`` (-100, as torch's) adds nothing and gets a zero gradient; the mean is
over the other rows. ``inplace=True`` writes the gradient over the logits (their values are
not needed after the backward): no second (rows, V) buffer.
"""
from __future__ import annotations

import functools

import torch

import utils
from kernels._launch import version_index
from utils.inputs import INT32_MAX, check_input, check_tensor  # noqa: F401  (the shared input rules)

SOURCE = utils.KERNELS_DIR / "cuda" / "cross_entropy.cu"
IGNORE_INDEX = -100
#: Threads per row block (fewer in simulation, where each thread is a fiber).
ROW_THREADS = 64 if utils.SIMULATE else 1024
LOGIT_DTYPES = (torch.float32, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def kernel(name: str):
    return utils.cuda_kernel(SOURCE, name)


def check_ce_inputs(logits, targets, op, dtypes=LOGIT_DTYPES):
    """(logits, targets) checked: logits 2-D float (rows, V), targets int64 (rows,); contiguous."""
    logits = check_input(logits, "logits", ndim=2, max_numel=INT32_MAX, op=op, dtypes=dtypes)
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"{op}: targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.dtype != torch.int64:
        raise TypeError(f"{op}: targets must be int64 (class indices), got {targets.dtype}: "
                        "convert it with targets.long()")
    if targets.device.type != utils.DEVICE.type:
        raise ValueError(f"{op}: targets is on {targets.device}, but the kernels run on {utils.DEVICE}: "
                         "move it with targets.to(utils.DEVICE)")
    if tuple(targets.shape) != (logits.shape[0],):
        raise ValueError(f"{op}: targets must have shape ({logits.shape[0]},), one class per row of logits, "
                         f"got {tuple(targets.shape)}")
    if logits.shape[0] and logits.shape[1] == 0:
        raise ValueError(f"{op}: logits has no columns (V = 0): there is no class to predict")
    return logits, targets.contiguous()


def check_ignore_index(ignore_index, op):
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{op}: ignore_index must be an int, got {type(ignore_index).__name__}")
    return ignore_index


def _suffix(x):
    return "_bf16" if x.dtype == torch.bfloat16 else ""


def cross_entropy_forward(logits, targets, ignore_index=IGNORE_INDEX):
    """(loss per row, lse per row), both float32 (rows,): two passes over each row."""
    op = "cross_entropy_forward"
    logits, targets = check_ce_inputs(logits, targets, op)
    ignore_index = check_ignore_index(ignore_index, op)
    rows, cols = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        kernel(f"cross_entropy_forward{_suffix(logits)}_kernel")[rows, ROW_THREADS](
            logits, targets, loss, lse, cols, ignore_index)
    return loss, lse


def _backward(logits, targets, lse, dloss, stride, ignore_index, inplace):
    rows, cols = logits.shape
    grad = logits if inplace else torch.empty_like(logits)
    if rows:
        kernel(f"cross_entropy_backward{_suffix(logits)}_kernel")[rows, ROW_THREADS](
            logits, targets, lse, dloss, stride, grad, cols, ignore_index)
    return grad


def cross_entropy_backward(logits, targets, lse, dloss, ignore_index=IGNORE_INDEX, inplace=False):
    """d logits = (softmax - onehot) * dloss[r] for each row, zero for ignored rows. ``lse``:
    the forward's logsumexp per row; ``dloss``: the upstream gradient of each row's loss."""
    op = "cross_entropy_backward"
    logits, targets = check_ce_inputs(logits, targets, op)
    ignore_index = check_ignore_index(ignore_index, op)
    rows = logits.shape[0]
    lse = check_input(lse, "lse", ndim=1, op=op)
    dloss = check_input(dloss, "dloss", ndim=1, op=op)
    for t, name in ((lse, "lse"), (dloss, "dloss")):
        if t.shape[0] != rows:
            raise ValueError(f"{op}: {name} must have one value per row of logits ({rows}), got {tuple(t.shape)}")
    return _backward(logits, targets, lse, dloss, 1, ignore_index, inplace)


def cross_entropy_unfused(logits, targets, ignore_index=IGNORE_INDEX, inplace=False):
    """v1: the forward kernel (max, then sum: two reads), a one-block mean, then the backward
    kernel (a third read, one write). Returns (mean loss, d loss / d logits)."""
    op = "cross_entropy"
    logits, targets = check_ce_inputs(logits, targets, op)
    ignore_index = check_ignore_index(ignore_index, op)
    rows, cols = logits.shape
    loss_rows, lse = cross_entropy_forward(logits, targets, ignore_index)
    loss = torch.empty((), dtype=torch.float32, device=logits.device)
    scale = torch.empty(1, dtype=torch.float32, device=logits.device)
    if rows == 0:
        loss.fill_(float("nan"))  # the mean of nothing, as torch's
        return loss, logits if inplace else torch.empty_like(logits)
    kernel("cross_entropy_mean_kernel")[1, 256 if not utils.SIMULATE else 64](
        loss_rows, targets, loss, scale, rows, ignore_index)
    return loss, _backward(logits, targets, lse, scale, 0, ignore_index, inplace)


def cross_entropy_fused(logits, targets, ignore_index=IGNORE_INDEX, inplace=False):
    """v2: count the rows that count (one small block), then one kernel: the online
    logsumexp in one read of the row, the gradient of the mean in a second read and one
    write (over the logits when ``inplace``). Returns (mean loss, d loss / d logits)."""
    op = "cross_entropy"
    logits, targets = check_ce_inputs(logits, targets, op)
    ignore_index = check_ignore_index(ignore_index, op)
    rows, cols = logits.shape
    loss = torch.zeros((), dtype=torch.float32, device=logits.device)
    grad = logits if inplace else torch.empty_like(logits)
    if rows == 0:
        loss.fill_(float("nan"))
        return loss, grad
    count = torch.empty(1, dtype=torch.float32, device=logits.device)
    kernel("cross_entropy_count_kernel")[1, 256 if not utils.SIMULATE else 64](targets, rows, ignore_index, count)
    kernel(f"cross_entropy_fused{_suffix(logits)}_kernel")[rows, ROW_THREADS](
        logits, targets, count, loss, grad, cols, ignore_index)
    return loss, grad


def cross_entropy_fused4(logits, targets, ignore_index=IGNORE_INDEX, inplace=False):
    """v3: v2 with 4 values per load and store (16 bytes in float32, 8 in bfloat16), when
    V % 4 == 0 and the tensors are aligned; v2 otherwise. Returns (mean loss, d logits)."""
    op = "cross_entropy"
    logits, targets = check_ce_inputs(logits, targets, op)
    ignore_index = check_ignore_index(ignore_index, op)
    rows, cols = logits.shape
    grad = logits if inplace else torch.empty_like(logits)
    if rows == 0 or cols % 4 or logits.data_ptr() % 16 or grad.data_ptr() % 16:
        return cross_entropy_fused(logits, targets, ignore_index, inplace)
    loss = torch.zeros((), dtype=torch.float32, device=logits.device)
    count = torch.empty(1, dtype=torch.float32, device=logits.device)
    kernel("cross_entropy_count_kernel")[1, 256 if not utils.SIMULATE else 64](targets, rows, ignore_index, count)
    kernel(f"cross_entropy_fused4{_suffix(logits)}_kernel")[rows, ROW_THREADS](
        logits, targets, count, loss, grad, cols, ignore_index)
    return loss, grad


VERSIONS = version_index(SOURCE, v1=cross_entropy_unfused, v2=cross_entropy_fused, v3=cross_entropy_fused4)
REFERENCE = "v3"
cross_entropy = VERSIONS[REFERENCE][1]


def cross_entropy_ref(logits, targets, ignore_index=IGNORE_INDEX):
    """torch's answer for the topic's reference: d(mean loss)/d logits, in the logits' dtype."""
    x = logits.detach().clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(x, targets.long(), ignore_index=ignore_index).backward()
    return x.grad


def cross_entropy_loss_ref(logits, targets, ignore_index=IGNORE_INDEX):
    return torch.nn.functional.cross_entropy(logits, targets.long(), ignore_index=ignore_index)
