"""ReLU's frame, shared by the CUDA C++, Numba and Triton launchers: the input rules of the
backward and the PyTorch reference. (The forward takes the elementwise rule of every language,
``inputs_and_output`` of ``kernels/_launch.py``.)

    relu_backward_input(grad_out, x)   grad_out and x float32 of one shape, and a new grad_in
    relu_ref(x)                        torch.relu
"""
from __future__ import annotations

import torch

from kernels._launch import inputs_and_output


def relu_backward_input(grad_out, x, max_numel=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The input rules of every relu_backward, in all three languages: grad_out and x
    contiguous float32 tensors of one shape (or a clear error), and a new grad_in."""
    return inputs_and_output(grad_out, x, op="relu_backward", names=("grad_out", "x"), max_numel=max_numel,
                             hint="grad_out is the gradient of relu(x), of x's shape")


def relu_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)
