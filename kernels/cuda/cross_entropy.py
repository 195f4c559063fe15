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

import torch

import runtime
from kernels._launch import cuda_kernels, version_index
from kernels.frames.cross_entropy import (  # the frame: input rules and references, shared by the three languages
    IGNORE_INDEX,
    LOGIT_DTYPES,  # noqa: F401  (importable from here too)
    check_ce_inputs,  # noqa: F401
    cross_entropy_loss_ref,  # noqa: F401
    cross_entropy_ref,  # noqa: F401
    prepare_backward,
    prepare_forward,
    prepare_mean_loss,
)

SOURCE = runtime.KERNELS_DIR / "cuda" / "cross_entropy.cu"
#: Threads per row block (fewer in simulation, where each thread is a fiber).
ROW_THREADS = 64 if runtime.SIMULATE else 1024


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


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
