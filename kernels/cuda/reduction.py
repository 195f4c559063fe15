"""Reductions in CUDA C++: launchers for the kernels of ``reduction.cu``, whose header lists the
versions.

    sum(x)        the reference (v5)
    row_max(x)    the max of each row of a 2-D tensor, one block per row
    sum_racy(x)   v0, the data race of lesson 04 (wrong on purpose, never benchmarked)

Every ``sum`` launcher returns a 0-d float32 tensor on ``runtime.DEVICE``; the sum of an
empty tensor is 0, as with ``torch.sum``.
"""
from __future__ import annotations

import torch

import runtime
from kernels._launch import cdiv, cuda_kernels, cuda_source, sm_count, version_index, whole_warps  # noqa: F401  (lesson 04: red_cuda.sm_count())
from kernels.frames.reduction import (  # the frame: input rules and references, shared by the three languages
    num_blocks_grid_stride,
    row_max_frame,
    row_max_input,  # noqa: F401  (importable from here too)
    row_max_ref,  # noqa: F401
    sum_frame,
    sum_input,  # noqa: F401
    sum_ref,  # noqa: F401
)
from runtime.inputs import INT32_MAX

SOURCE = runtime.KERNELS_DIR / "cuda" / "reduction.cu"
BLOCK_SIZE = 256        # threads per block; a power of two (the shared-memory trees need it)
FINAL_BLOCK = 1024      # the one block of the second pass


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


def source(name: str, path=SOURCE) -> str:
    """The text of one kernel or helper of reduction.cu (or of ``path``): its comment block and
    its body. ``print(source("sum_warp_kernel"))`` shows a learner exactly the code that runs."""
    return cuda_source(name, path)


def _check_int_range(n: int, what: str) -> None:
    if n > INT32_MAX:
        raise ValueError(f"{what} indexes with int: at most {INT32_MAX} elements, got {n}")


def _one_thread_per_element(x: torch.Tensor, name: str, shared_bytes: int = 0) -> torch.Tensor:
    """Launch a kernel with one thread per element that accumulates into out[0]."""
    def launch(x, out, n):
        _check_int_range(n, name)
        grid = cdiv(n, BLOCK_SIZE)
        if shared_bytes:
            kernel(name)[grid, BLOCK_SIZE, shared_bytes](x, out, n)
        else:
            kernel(name)[grid, BLOCK_SIZE](x, out, n)
    return sum_frame(x, launch)


def sum_racy(x: torch.Tensor) -> torch.Tensor:
    """WRONG on purpose: every thread does ``out[0] += x[i]`` (lesson 04's data race).
    Runs without the emulator's race detector, which would stop it: the demo shows what
    the race does to the result."""
    with runtime.race_detection(False):
        return _one_thread_per_element(x, "sum_racy_kernel")


def sum_racy_lockstep(x: torch.Tensor) -> torch.Tensor:
    """WRONG on purpose: the race with a warp's lockstep load-then-store written out
    (without the race detector, as ``sum_racy``)."""
    with runtime.race_detection(False):
        return _one_thread_per_element(x, "sum_racy_lockstep_kernel")


def sum_atomic(x: torch.Tensor) -> torch.Tensor:
    """v1: one atomicAdd per element."""
    return _one_thread_per_element(x, "sum_atomic_kernel")


def sum_interleaved(x: torch.Tensor) -> torch.Tensor:
    """v2: shared-memory tree with interleaved addressing, one atomicAdd per block."""
    return _one_thread_per_element(x, "sum_interleaved_kernel", BLOCK_SIZE * 4)


def sum_sequential(x: torch.Tensor) -> torch.Tensor:
    """v3: shared-memory tree with sequential addressing, one atomicAdd per block."""
    return _one_thread_per_element(x, "sum_sequential_kernel", BLOCK_SIZE * 4)


def sum_warp(x: torch.Tensor) -> torch.Tensor:
    """v4: warp-shuffle block reduction, one atomicAdd per block."""
    return _one_thread_per_element(x, "sum_warp_kernel")


def sum_two_pass(x: torch.Tensor) -> torch.Tensor:
    """v5: grid-stride + float4 + warp shuffles, one partial per block, then one block sums them."""
    def launch(x, out, n):
        if x.data_ptr() % 16:
            # float4 loads need 16-byte aligned addresses; a view that starts mid-storage
            # (x[1:]) may not be. A fresh copy is aligned.
            x = x.clone()
        blocks = num_blocks_grid_stride(n, BLOCK_SIZE)
        partials = torch.empty(blocks, dtype=torch.float32, device=x.device)
        kernel("sum_partials_kernel")[blocks, BLOCK_SIZE](x, partials, n)
        kernel("sum_final_kernel")[1, FINAL_BLOCK](partials, out, blocks)
    return sum_frame(x, launch)


def row_max(x: torch.Tensor) -> torch.Tensor:
    """The max of each row of a 2-D tensor: shape (rows,). -inf for rows of length 0."""
    def launch(x, out, rows, cols):
        _check_int_range(x.numel(), "row_max_kernel")
        threads = whole_warps(cdiv(cols, 4))  # about 4 columns per thread
        kernel("row_max_kernel")[rows, threads](x, out, cols)
    return row_max_frame(x, launch)


#: name -> (one line, launcher), naive to best. ``python -m benchmarks`` measures each one
#: except v0, which is wrong on purpose (its description says "demo only").
VERSIONS = version_index(
    SOURCE, v0=sum_racy, v1=sum_atomic, v2=sum_interleaved, v3=sum_sequential, v4=sum_warp, v5=sum_two_pass)
REFERENCE = "v5"
sum = VERSIONS[REFERENCE][1]  # the topic's launcher is called sum
