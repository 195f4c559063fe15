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

import runtime
from kernels._launch import version_index
from runtime.inputs import INT32_MAX, check_indices, check_input

SOURCE = runtime.KERNELS_DIR / "cuda" / "cross_entropy.cu"
IGNORE_INDEX = -100
#: Threads per row block (fewer in simulation, where each thread is a fiber).
ROW_THREADS = 64 if runtime.SIMULATE else 1024
LOGIT_DTYPES = (torch.float32, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def kernel(name: str):
    return runtime.cuda_kernel(SOURCE, name)


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


def _ctype(x):
    return "__nv_bfloat16" if x.dtype == torch.bfloat16 else "float"


#: Threads of the one-block kernels (the mean and the count).
ONE_BLOCK_THREADS = 64 if runtime.SIMULATE else 256


def cross_entropy_forward(logits, targets, ignore_index=IGNORE_INDEX):
    """(loss per row, lse per row), both float32 (rows,): two passes over each row."""
    logits, targets, ignore_index, loss, lse = prepare_forward(logits, targets, ignore_index)
    rows, cols = logits.shape
    if rows:
        kernel(f"cross_entropy_forward_kernel<{_ctype(logits)}>")[rows, ROW_THREADS](
            logits, targets, loss, lse, cols, ignore_index)
    return loss, lse


def _backward(logits, targets, lse, dloss, stride, ignore_index, grad):
    rows, cols = logits.shape
    if rows:
        kernel(f"cross_entropy_backward_kernel<{_ctype(logits)}>")[rows, ROW_THREADS](
            logits, targets, lse, dloss, stride, grad, cols, ignore_index)
    return grad


def cross_entropy_backward(logits, targets, lse, dloss, ignore_index=IGNORE_INDEX, inplace=False):
    """d logits = (softmax - onehot) * dloss[r] for each row, zero for ignored rows. ``lse``:
    the forward's logsumexp per row; ``dloss``: the upstream gradient of each row's loss."""
    logits, targets, lse, dloss, ignore_index, grad = prepare_backward(logits, targets, lse, dloss, ignore_index,
                                                                       inplace)
    return _backward(logits, targets, lse, dloss, 1, ignore_index, grad)


def cross_entropy_unfused(logits, targets, ignore_index=IGNORE_INDEX, inplace=False):
    """v1: the forward kernel (max, then sum: two reads), a one-block mean, then the backward
    kernel (a third read, one write). Returns (mean loss, d loss / d logits)."""
    logits, targets, ignore_index, loss, grad = prepare_mean_loss(logits, targets, ignore_index, inplace)
    rows = logits.shape[0]
    if rows:
        loss_rows, lse = cross_entropy_forward(logits, targets, ignore_index)
        scale = torch.empty(1, dtype=torch.float32, device=logits.device)
        kernel("cross_entropy_mean_kernel")[1, ONE_BLOCK_THREADS](loss_rows, targets, loss, scale, rows, ignore_index)
        _backward(logits, targets, lse, scale, 0, ignore_index, grad)
    return loss, grad


def _fused(logits, targets, ignore_index, inplace, vec4):
    logits, targets, ignore_index, loss, grad = prepare_mean_loss(logits, targets, ignore_index, inplace)
    rows, cols = logits.shape
    if rows:
        count = torch.empty(1, dtype=torch.float32, device=logits.device)
        kernel("cross_entropy_count_kernel")[1, ONE_BLOCK_THREADS](targets, rows, ignore_index, count)
        four = vec4 and cols % 4 == 0 and logits.data_ptr() % 16 == 0 and grad.data_ptr() % 16 == 0
        kernel(f"cross_entropy_fused{4 if four else ''}_kernel<{_ctype(logits)}>")[rows, ROW_THREADS](
            logits, targets, count, loss, grad, cols, ignore_index)
    return loss, grad


def cross_entropy_fused(logits, targets, ignore_index=IGNORE_INDEX, inplace=False):
    """v2: count the rows that count (one small block), then one kernel: the online
    logsumexp in one read of the row, the gradient of the mean in a second read and one
    write (over the logits when ``inplace``). Returns (mean loss, d loss / d logits)."""
    return _fused(logits, targets, ignore_index, inplace, vec4=False)


def cross_entropy_fused4(logits, targets, ignore_index=IGNORE_INDEX, inplace=False):
    """v3: v2 with 4 values per load and store (16 bytes in float32, 8 in bfloat16), when
    V % 4 == 0 and the tensors are aligned; v2 otherwise. Returns (mean loss, d logits)."""
    return _fused(logits, targets, ignore_index, inplace, vec4=True)


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
