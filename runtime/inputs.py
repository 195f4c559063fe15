"""The input rules every launcher of the course follows, in one place.

A launcher takes float32 torch tensors on ``utils.DEVICE`` (some take other float dtypes).
Anything else gets a clear ``TypeError``/``ValueError`` that says what is wrong and how to
fix it; a non-contiguous tensor is made contiguous (a copy), because kernels index raw
memory as a flat array. Every topic's checks (``check_norm_inputs``, ``check_operands``,
``check_qkv``, ...) are built on ``check_tensor``, so one kind of mistake reads the same
in every launcher; ``check_indices`` is its int64 form (token ids, class indices).
"""
from __future__ import annotations

import torch

from .config import DEVICE

# check_tensor and check_same_shape stay out of the flat API: every utils.check_* there is a
# grader (tests/test_grader_guard.py), and launchers import them from here.
__all__ = ["check_input", "INT32_MAX"]

#: Kernels that index with a 32-bit ``int`` cannot address more elements than this.
INT32_MAX = 2**31 - 1

FLOAT32 = (torch.float32,)
#: Every launcher checks its tensors on every call, so the check is part of each launch's host
#: cost: ``t.is_cuda`` is a flag, ``t.device.type`` builds a device object each time.
_ON_CUDA = DEVICE.type == "cuda"


def dtype_name(dt) -> str:
    """``float32`` for ``torch.float32``: the name that follows ``torch.`` in code."""
    return str(dt).replace("torch.", "")


def check_tensor(t, name: str = "x", *, op: str | None = None, dtypes=FLOAT32) -> torch.Tensor:
    """``t`` itself when it is a torch tensor of one of ``dtypes`` on the course's device, else a
    clear error: ``TypeError`` for a non-tensor or a wrong dtype, ``ValueError`` for a wrong
    device. ``name`` is the argument's name in messages, ``op`` the launcher's name."""
    if isinstance(t, torch.Tensor) and t.dtype in dtypes and (t.is_cuda if _ON_CUDA else t.device.type == DEVICE.type):
        return t  # the common case, decided without building a message or a device object
    who = f"{op}: " if op else ""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{who}{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(dtype_name(d) for d in dtypes)
        fix = f"{name}.float()" if dtypes[0] == torch.float32 else f"{name}.to(torch.{dtype_name(dtypes[0])})"
        raise TypeError(f"{who}{name} must be {want}, got {t.dtype}: convert it with {fix}")
    raise ValueError(f"{who}{name} is on {t.device}, but the kernels run on {DEVICE}: "
                     f"move it with {name}.to(utils.DEVICE)")


def is_plain(t, dtypes=FLOAT32) -> bool:
    """True when ``t`` is what a launcher takes as it is: a contiguous torch tensor of one of
    ``dtypes`` on the course's device. The launchers' fast path asks this, once per tensor, and
    leaves anything else to ``check_tensor`` and friends, which say what is wrong or make the copy."""
    return (isinstance(t, torch.Tensor) and t.dtype in dtypes and t.is_contiguous() and
            (t.is_cuda if _ON_CUDA else t.device.type == DEVICE.type))


def check_indices(t, name: str, *, op: str, what: str) -> torch.Tensor:
    """``t`` as a contiguous int64 tensor on the course's device (token ids, class indices), or
    the errors of ``check_tensor``; ``what`` names the indices in the dtype's message."""
    if isinstance(t, torch.Tensor) and t.dtype != torch.int64:
        raise TypeError(f"{op}: {name} must be int64 ({what}), got {t.dtype}: convert it with {name}.long()")
    return check_tensor(t, name, op=op, dtypes=(torch.int64,)).contiguous()


def check_input(x, name: str = "x", *, ndim: int | None = None, max_numel: int | None = None,
                op: str | None = None, dtypes=FLOAT32) -> torch.Tensor:
    """``x`` as a contiguous tensor (float32 unless ``dtypes`` says otherwise) on the course's
    device, or a clear error.

    ``name`` is the argument's name in messages, ``op`` the launcher's name, ``ndim`` the
    number of dimensions the kernel needs, ``max_numel`` the most elements its index type
    can address (for example ``INT32_MAX``).
    """
    who = f"{op}: " if op else ""
    check_tensor(x, name, op=op, dtypes=dtypes)
    if ndim is not None and x.dim() != ndim:
        hint = f": reshape it with {name}.reshape(-1, {name}.shape[-1])" if ndim == 2 else ""
        raise ValueError(f"{who}{name} must be {ndim}-D, got shape {tuple(x.shape)}{hint}")
    if max_numel is not None and x.numel() > max_numel:
        raise ValueError(f"{who}{name} has {x.numel()} elements, more than the kernel's index "
                         f"type can address ({max_numel}): split the tensor")
    return x.contiguous()


def check_same_shape(a: torch.Tensor, b: torch.Tensor, names=("x", "y"), *, op: str | None = None,
                     hint: str = "") -> None:
    """A clear ``ValueError`` when two checked tensors differ in shape (no broadcasting)."""
    if a.shape != b.shape:
        who = f"{op}: " if op else ""
        raise ValueError(f"{who}{names[0]} has shape {tuple(a.shape)} but {names[1]} has {tuple(b.shape)}"
                         f"{': ' + hint if hint else ''}")
