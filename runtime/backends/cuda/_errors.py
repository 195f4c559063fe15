"""Errors of the CUDA C++ runtime."""
from ._source import CudaCompileError  # noqa: F401  (defined next to the source reader)


class KernelFault(RuntimeError):
    """A kernel went wrong while running: a barrier that not every thread reaches, a read
    or write outside a tensor argument, a crash in kernel code. The message names the
    kernel and says which threads were where."""
