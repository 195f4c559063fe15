"""Softmax over the last dim of a 2-D tensor in CUDA C++: launchers for ``softmax.cu``, whose
header lists the versions.

    softmax(x)          the reference (v6)
    softmax_naive(x)    v1
    softmax_fused(x)    v2
    softmax_online(x)   v3
    softmax_onchip(x)   v5
"""
from __future__ import annotations

import torch

import runtime
from kernels._launch import cdiv, cuda_kernels, cuda_source, sm_count, version_index, whole_warps
from kernels.frames.softmax import (  # the frame: input rules and reference, shared by the three languages
    MAX_THREADS,
    check_fused_cols,
    softmax_frame,
    softmax_input,  # noqa: F401  (importable from here too)
    softmax_ref,  # noqa: F401
)

SOURCE = runtime.KERNELS_DIR / "cuda" / "softmax.cu"
#: Elements per thread the fused kernel can hold in registers (one kernel each).
FUSED_ITEMS = (1, 2, 4, 8, 16)
#: The longest row v2 can hold: 16 registers x 1024 threads.
FUSED_MAX_COLS = FUSED_ITEMS[-1] * MAX_THREADS


kernel = cuda_kernels(SOURCE)  # kernel(name): a kernel of the .cu file, compiled once


def source(name: str) -> str:
    """The text of one kernel or helper of softmax.cu (its comment block and body)."""
    return cuda_source(name, SOURCE)


def threads_for(cols: int, per_thread: int) -> int:
    """Whole warps, enough for ``per_thread`` columns each, at most 1024."""
    return whole_warps(cdiv(cols, per_thread), MAX_THREADS)


def softmax_naive(x: torch.Tensor) -> torch.Tensor:
    """v1: row max, then row sum of exp(x - max), then normalize: three kernels."""
    def launch(x, y, rows, cols):   # softmax_frame checked x, made y and skips an empty x
        row_max = torch.empty(rows, dtype=torch.float32, device=x.device)
        row_sum = torch.empty(rows, dtype=torch.float32, device=x.device)
        threads = threads_for(cols, 4)
        kernel("softmax_max_kernel")[rows, threads](x, row_max, cols)
        kernel("softmax_expsum_kernel")[rows, threads](x, row_max, row_sum, cols)
        n = x.numel()
        kernel("softmax_normalize_kernel")[cdiv(n, 256), 256](x, row_max, row_sum, y, n, cols)
    return softmax_frame(x, launch)


def fused_config(cols: int) -> tuple[int, int]:
    """(items per thread, threads) for v2: about 256 threads, more only for long rows."""
    items = next((k for k in FUSED_ITEMS if cols <= k * 256), FUSED_ITEMS[-1])
    return items, threads_for(cols, items)


def softmax_fused(x: torch.Tensor) -> torch.Tensor:
    """v2: one block per row, the row in registers: one read of x, one write of y."""
    def launch(x, y, rows, cols):
        check_fused_cols(cols, FUSED_ITEMS[-1])
        items, threads = fused_config(cols)
        kernel(f"softmax_fused{items}_kernel")[rows, threads](x, y, cols)
    return softmax_frame(x, launch)


def softmax_online(x: torch.Tensor) -> torch.Tensor:
    """v3: online softmax, one block per row: running max and rescaled sum, then the output."""
    def launch(x, y, rows, cols):
        # float4 needs every row to start on a 16-byte boundary: an aligned base and cols % 4 == 0.
        vec4 = int(cols % 4 == 0 and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0)
        threads = threads_for(cols, 16 if vec4 else 8)
        # A persistent grid: about 1024 threads per SM (one block of 1024 for long rows), each
        # block looping over rows, so that few rows are in flight and stay in L2 for pass 2.
        blocks = min(rows, sm_count() * max(1, MAX_THREADS // threads))
        kernel("softmax_online_kernel")[blocks, threads](x, y, rows, cols, vec4)
    return softmax_frame(x, launch)


#: Rows longer than this go to the online kernel. v2 can take rows up to FUSED_MAX_COLS, but
#: at 16 floats per thread it runs few blocks per SM; on an H100 the persistent online
#: kernel (v3) was faster from 16384 columns on (see benchmarks/results/records/h100.md).
ONLINE_FROM_COLS = 8192


def softmax_auto(x: torch.Tensor) -> torch.Tensor:
    """The reference: v2 for rows up to 8192 columns, v3 for longer rows."""
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[-1] > ONLINE_FROM_COLS:
        return softmax_online(x)
    return softmax_fused(x)


#: Vectors per thread v5 keeps in registers (SOFTMAX_ONCHIP_REG in softmax.cu).
ONCHIP_REG = 8


def onchip_stash_bytes() -> int:
    """Dynamic shared memory v5 may use for the rest of a row: this GPU's (or the emulator's)
    limit per block, less room for the static scratch."""
    return runtime.max_dynamic_shared() - 1024


def onchip_config(cols: int, vec4: bool) -> tuple[int, int] | None:
    """(threads, stash bytes) for v5, or None when the row does not fit on chip."""
    width = 4 if vec4 else 1
    n = cdiv(cols, width)
    threads = threads_for(n, ONCHIP_REG)
    stash = max(0, n - ONCHIP_REG * threads) * width * 4
    return (threads, stash) if stash <= onchip_stash_bytes() else None


def onchip_max_cols(vec4: bool = True) -> int:
    """The longest row v5 holds: registers of 1024 threads plus the shared-memory stash
    (90624 columns on an H100, fewer on GPUs with less shared memory per block)."""
    width = 4 if vec4 else 1
    return (ONCHIP_REG * MAX_THREADS + onchip_stash_bytes() // (4 * width)) * width


def softmax_onchip(x: torch.Tensor) -> torch.Tensor:
    """v5: one block per row, the row held in registers and shared memory: one read, one write."""
    def launch(x, y, rows, cols):
        vec4 = cols % 4 == 0 and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
        cfg = onchip_config(cols, vec4)
        if cfg is None:
            raise ValueError(f"rows of {cols} columns do not fit on one SM (at most {onchip_max_cols(vec4)} "
                             "columns in registers and shared memory): use the online softmax (v3)")
        threads, stash = cfg
        name = "softmax_onchip4_kernel" if vec4 else "softmax_onchip1_kernel"
        kernel(name)[rows, threads, stash](x, y, cols)
    return softmax_frame(x, launch)


def softmax_auto_onchip(x: torch.Tensor) -> torch.Tensor:
    """The reference: v5 while the row fits on chip (see onchip_max_cols), v3 beyond. On an
    H100, v5 was as fast as v2 on short rows and faster on long ones (benchmarks/results/records/h100.md)."""
    if isinstance(x, torch.Tensor) and x.dim() == 2:
        cols = x.shape[-1]
        if onchip_config(cols, vec4=cols % 4 == 0 and x.data_ptr() % 16 == 0) is None:
            return softmax_online(x)
    return softmax_onchip(x)


VERSIONS = version_index(
    SOURCE, v1=softmax_naive, v2=softmax_fused, v3=softmax_online, v4=softmax_auto, v5=softmax_onchip,
    v6=softmax_auto_onchip)
REFERENCE = "v6"
softmax = VERSIONS[REFERENCE][1]
