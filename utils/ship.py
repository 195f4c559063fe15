"""The grader of lesson 07: is an operator first-class in PyTorch?

``check_custom_op(op, ref)`` checks, in this order and with a plain-words message for the
first thing that is wrong: the fake kernel against the real output, the gradient against the
reference's, ``torch.library.opcheck``, and ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import logging
import re

import torch

from runtime.config import DEVICE

from . import guard as _guard
from .check import assert_close, tolerance
from .grading import GradingError, kernel_work, refuse_torch_operator, stub_message

__all__ = ["check_custom_op"]


def _close(actual, expected, what: str) -> None:
    try:
        assert_close(actual, expected, what=what)
    except GradingError:
        raise
    except AssertionError as e:
        raise GradingError(str(e)) from None


def _run(what: str, fn, hint: str):
    try:
        return fn()
    except GradingError:
        raise
    except Exception as e:  # every failure becomes a diagnosis
        stub = stub_message(e)
        if stub:
            raise GradingError(stub) from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:400]
        raise GradingError(f"{what} failed: {type(e).__name__}: {first}\n  hint: {hint}") from e


def check_custom_op(op, ref, *, seed: int = 0) -> None:
    """``op``: a one-input operator (``torch.library.custom_op``, or ``torch.ops.ns.name``);
    ``ref``: the PyTorch function it must equal, with its gradient."""
    _guard.verify("check_custom_op")  # a grader, the harness or torch's comparisons replaced: no points
    refuse_torch_operator(op, "check_custom_op")  # torch's own operator: its answers are torch's
    from torch._subclasses.fake_tensor import FakeTensorMode

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(37, 29, generator=gen).to(DEVICE)
    x = x + 0.1 * x.sign()            # away from kinks (ReLU at 0), where gradients are ambiguous
    real, why = kernel_work(op, x, what="the op's result")
    _close(real, ref(x), "the op's result")
    if why:
        raise GradingError(f"check_custom_op: {why}")

    # 1. the fake kernel: same shape, dtype and device as the real result, without running it
    def fake_out(t):
        # A fake kernel that runs the real one fails inside FakeTensorMode, which logs the whole
        # traceback at error level before raising: the message below says it in one line.
        log = logging.getLogger("torch._subclasses.fake_tensor")
        level = log.level
        log.setLevel(logging.CRITICAL)
        try:
            with FakeTensorMode() as mode:
                ft = mode.from_tensor(t)
                out = op(ft)
                return out, out is ft or getattr(out, "_base", None) is ft
        finally:
            log.setLevel(level)
    fake_hint = ("is a fake kernel registered (op.register_fake / torch.library.register_fake)? It must only "
                 "describe the result (torch.empty_like(x)), never run the real kernel: fake tensors hold no data")
    fake, aliased = _run("calling the op on a fake tensor", lambda: fake_out(x), fake_hint)
    if aliased:
        raise GradingError("the fake kernel returns its input x (or a view of it), but the real op returns a new "
                           "tensor\n  hint: return a new, empty tensor shaped like x: torch.empty_like(x)")
    for attr in ("shape", "dtype", "device"):
        if getattr(fake, attr) != getattr(real, attr):
            raise GradingError(f"the fake kernel says the result's {attr} is {getattr(fake, attr)}, the real "
                               f"op returns {getattr(real, attr)}\n  hint: torch.empty_like(x) describes "
                               "an elementwise result")
    # A second dtype: a fake kernel that hard-codes float32 (torch.empty(x.shape)) must show. Only the
    # fake kernel runs (the real kernel may take float32 only); the reference says what is expected.
    x2 = x.double()
    fake2, _ = _run("calling the op on a fake float64 tensor", lambda: fake_out(x2), fake_hint)
    want = ref(x2)
    for attr in ("shape", "dtype", "device"):
        if getattr(fake2, attr) != getattr(want, attr):
            raise GradingError(f"given a {x2.dtype} input, the fake kernel says the result's {attr} is "
                               f"{getattr(fake2, attr)}, but it should be {getattr(want, attr)}\n  hint: the fake "
                               "kernel follows its input's dtype and device: torch.empty_like(x), not "
                               "torch.empty(x.shape)")

    # 2. autograd: the op's gradient equals the reference's
    xa, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    grad_out = torch.randn(x.shape, generator=gen).to(DEVICE)
    ya = _run("calling the op on a tensor that requires grad", lambda: op(xa),
              "is an autograd formula registered (op.register_autograd)?")
    if not ya.requires_grad:
        raise GradingError("the op's result does not require grad: no autograd formula is registered\n"
                           "  hint: op.register_autograd(backward, setup_context=setup_context)")
    try:
        ya.backward(grad_out, retain_graph=True)
    except Exception as e:
        err = e  # the lambda below runs inside this block, but Python unbinds e after it
        empty = re.search(r"not enough values to unpack \(expected \d+, got 0\)", str(err))
        _run("the backward pass", lambda: (_ for _ in ()).throw(err),
             "ctx.saved_tensors is empty: setup_context must save what backward needs, "
             "ctx.save_for_backward(x)" if empty else "backward(ctx, grad_out) returns dL/dx, one tensor of x's shape")
    ref(xr).backward(grad_out)
    _close(xa.grad, xr.grad, "the gradient dL/dx")

    # 3. PyTorch's own checks of the registrations
    _run("torch.library.opcheck", lambda: torch.library.opcheck(op, (x.clone().requires_grad_(),)),
         "the message names the check that failed (test_faketensor: the fake kernel, "
         "test_autograd_registration: the autograd formula, test_aot_dispatch_dynamic: the "
         "backward is traced too, so it must call operators with fake kernels, not launch a kernel)")

    # 4. one graph with torch.compile, and the same numbers
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: op(t * 2.0) + 1.0, fullgraph=True, backend="aot_eager")
    xc = x.clone().requires_grad_()
    out = _run("torch.compile(fullgraph=True)", lambda: compiled(xc),
               "fullgraph=True fails on a graph break: an op without a fake kernel is one")
    _close(out, ref(x * 2.0) + 1.0, "the compiled function's result")
    torch._dynamo.reset()
    print(f"check_custom_op: fake kernel, gradient (max error "
          f"{(xa.grad - xr.grad).abs().max().item():.3g}), opcheck and torch.compile(fullgraph=True) "
          f"all agree on a {tuple(x.shape)} input, tolerance {tolerance(x.dtype)}")
