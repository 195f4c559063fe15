"""The backend switch and the problem sizes: the one place where the course decides
whether kernels run on a real NVIDIA GPU or in simulation on the CPU.

Rules
-----
* With a CUDA GPU visible to torch, everything runs for real on ``cuda``.
* Without one, or with ``COURSE_SIMULATE=1`` in the environment, everything runs in
  simulation on ``cpu``:
    - Numba kernels run in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``),
    - Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``),
    - CUDA C++ kernels run in the course's CPU emulator (``utils.cuda_kernel``).

Numba reads ``NUMBA_ENABLE_CUDASIM`` once, when it is first imported, so this module
must run before anything imports numba. ``import utils`` does that, which is why every
notebook starts with it.
"""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import torch

ENV_SIMULATE = "COURSE_SIMULATE"


def _want_simulation() -> tuple[bool, str]:
    forced = os.environ.get(ENV_SIMULATE, "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True, f"{ENV_SIMULATE}={os.environ[ENV_SIMULATE]} forces simulation"
    if not torch.cuda.is_available():
        return True, "no CUDA GPU is visible to torch"
    return False, f"found {torch.cuda.get_device_name(0)}"


SIMULATE, REASON = _want_simulation()
#: "gpu" or "simulation": use it to pick sizes, labels and recorded numbers.
MODE = "simulation" if SIMULATE else "gpu"
#: The torch device every tensor of the course lives on.
DEVICE = torch.device("cpu" if SIMULATE else "cuda")


def _configure_simulators() -> None:
    wanted = "1" if SIMULATE else "0"
    if "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != wanted:
        raise RuntimeError(
            "numba was imported before `import utils`, so it cannot be switched to "
            f"{'its CUDA simulator' if SIMULATE else 'the real GPU'} any more. "
            "Restart the kernel and run `import utils` first."
        )
    os.environ["NUMBA_ENABLE_CUDASIM"] = wanted
    # Triton reads TRITON_INTERPRET when a kernel is decorated with @triton.jit.
    os.environ["TRITON_INTERPRET"] = wanted


_configure_simulators()


# --------------------------------------------------------------------------------------
# Problem sizes. GPU sizes fill an H100; simulated sizes keep every cell to seconds.
# Measured on a 2-core CPU: the course's patched Numba simulator runs about 10,000 threads/s
# in barrier-heavy kernels (stock: about 600/s; see benchmarks/results/simulators/numba-simulator-speed.json),
# the Triton interpreter takes 0.5-1 ms per program, and the CUDA C++ emulator runs millions
# of threads/s (benchmarks/results/simulators/emulator-speed.json). Awkward (non power-of-two) sizes on
# purpose: they exercise the tail block.
# --------------------------------------------------------------------------------------
PROBLEM_SIZES = {
    "gpu": dict(
        # lesson 01-03: elementwise demos
        elementwise_n=(1 << 24) + 3,
        matrix_shape=(1823, 781),
        # lesson 04: reductions
        reduction_n=(1 << 24) + 7,
        # lesson 05: softmax demo shape and the benchmark shapes
        softmax_shape=(1823, 781),
        softmax_bench_shapes=[(32768, 1024), (8192, 4096), (4096, 16384), (1024, 65536)],
        # lesson 05: rows too long for one block (the online softmax)
        softmax_long_shape=(1024, 65536),
        # benchmark sweeps (elements)
        bench_sizes=[1 << k for k in range(12, 29, 2)],
        bench_n=1 << 28,
        # graders: awkward sizes, a 2-D shape, a large size
        grader_sizes=[1, 7, 1023, 1025, (1 << 16) + 1, (1 << 22) + 5],
        # rows of at most 8193 columns: a one-row-per-program Triton softmax (BLOCK =
        # next_power_of_2(cols) <= 16384) must still fit.
        grader_shapes=[(1, 1), (7, 3), (1823, 781), (33, 4097), (65, 8193)],
        # benchmarks: awkward sizes every kernel must get right before it is timed
        bench_check_sizes=[1, 7, 1025, (1 << 20) + 3],
        bench_check_shapes=[(1, 1), (7, 3), (33, 4097)],
        # lesson 06: matmul (M, N, K). The demo, the benchmark shapes (4096^3 and an odd
        # shape), the sweep (n^3), the grader's awkward shapes (K = 1, K = 0, empty, not
        # multiples of any tile) and the probes its diagnoses run on a wrong kernel.
        matmul_shape=(1000, 1000, 1000),
        matmul_bench_shapes=[(4096, 4096, 4096), (4095, 4097, 4093)],
        matmul_sweep=[256, 512, 1024, 2048, 4096],
        matmul_grader_shapes=[(127, 255, 63), (256, 256, 256), (1, 1, 1), (300, 7, 1), (64, 512, 300),
                              (5, 3, 0), (0, 4, 3), (4, 0, 3)],
        matmul_probe_shape=(256, 256, 256),
        matmul_bench_check_shapes=[(1, 1, 1), (300, 7, 1), (127, 255, 63)],
        # lesson 12: Hopper. The graders' shapes: transposes (R, C) with boxes over both edges;
        # one wgmma tile (M, N, K <= 64); the pipelined C = A @ B^T (M, N, K) with tails in M, N
        # and K, K of one, three and several 64-column tiles (a two-stage ring goes round), empty
        # matrices, K = 0; the benchmark shapes, the sweep and the shapes checked before timing.
        hopper_transpose_shapes=[(130, 200), (64, 64), (1, 8), (37, 72), (1000, 2008), (0, 8)],
        hopper_tile_shapes=[(37, 50, 24), (64, 64, 64), (1, 64, 8), (64, 3, 40), (17, 33, 64), (5, 6, 0)],
        hopper_grader_shapes=[(130, 200, 264), (64, 64, 64), (1, 1, 8), (200, 70, 520), (65, 129, 192),
                              (1000, 1500, 1000), (0, 5, 8), (3, 4, 0)],
        hopper_bench_shapes=[(4096, 4096, 4096), (8192, 8192, 8192), (4095, 4097, 4093)],
        hopper_sweep=[1024, 2048, 4096, 8192],
        hopper_bench_check_shapes=[(1, 1, 8), (130, 200, 264), (4095, 4097, 4093)],
        # lesson 09: LayerNorm demo shape, benchmark shapes, awkward shapes checked before timing
        layernorm_shape=(1823, 781),
        layernorm_bench_shapes=[(4096, 4096), (4096, 16384), (65536, 512)],
        layernorm_check_shapes=[(1, 1), (7, 3), (1823, 781), (33, 4097)],
        # lesson 10: attention, the demo shape (B, H, N, d), shapes (B, H, Nq, Nk, d) for the graders
        # (N = 1, 17, 31, 130, Nq != Nk both ways, d = 16 .. 128, several batches and heads, and large ones), the
        # length of the long row of equal scores, the benchmark shapes (B, H, N, d) and the
        # sweep of N at a fixed number of tokens (B * N = 16384), and the awkward shapes every
        # kernel must get right before it is timed.
        attention_shape=(4, 16, 2048, 64),
        attention_grader_shapes=[(1, 1, 1, 1, 16), (1, 2, 17, 17, 32), (2, 1, 31, 31, 64), (1, 1, 130, 130, 128),
                                 (2, 2, 17, 130, 16), (1, 1, 40, 17, 64), (2, 3, 1000, 1000, 64),
                                 (1, 2, 1029, 4097, 128)],
        attention_backward_grader_shapes=[(1, 1, 1, 1, 16), (1, 2, 17, 17, 32), (2, 1, 31, 31, 64),
                                          (1, 1, 130, 130, 128), (1, 2, 17, 70, 16), (1, 1, 40, 17, 32),
                                          (2, 3, 1000, 1000, 64)],
        attention_long_keys=8192,
        attention_bench_shapes=[(4, 32, 4096, 64), (4, 32, 4096, 128), (1, 32, 16384, 64), (1, 32, 16384, 128)],
        attention_sweep_shapes=[(16384 // n, 32, n, d) for d in (64, 128)
                                for n in (512, 1024, 2048, 4096, 8192, 16384)],
        attention_bench_check_shapes=[(1, 1, 1, 16), (1, 2, 17, 32), (2, 3, 130, 64), (1, 2, 1000, 128)],
    ),
    "simulation": dict(
        elementwise_n=4099,
        matrix_shape=(37, 61),
        reduction_n=2051,
        softmax_shape=(13, 100),
        softmax_bench_shapes=[(8, 256), (4, 1024)],
        softmax_long_shape=(2, 20000),
        bench_sizes=[1 << k for k in range(8, 13, 2)],
        bench_n=1 << 12,
        grader_sizes=[1, 7, 1023, 1025, (1 << 11) + 1],
        # a wide and a tall matrix (a row/column swap leaves a band unwritten in one of them)
        grader_shapes=[(1, 1), (7, 3), (19, 37), (23, 13), (5, 257)],
        bench_check_sizes=[1, 7, 1025],
        bench_check_shapes=[(1, 1), (7, 3), (5, 257)],
        matmul_shape=(70, 50, 40),
        matmul_bench_shapes=[(64, 64, 64), (33, 65, 31)],
        matmul_sweep=[16, 32, 64],
        matmul_grader_shapes=[(37, 45, 29), (1, 1, 1), (20, 7, 1), (9, 33, 70), (5, 3, 0), (0, 4, 3), (4, 0, 3)],
        matmul_probe_shape=(64, 64, 64),
        matmul_bench_check_shapes=[(1, 1, 1), (20, 7, 1), (37, 45, 29)],
        hopper_transpose_shapes=[(130, 200), (64, 64), (1, 8), (37, 72), (0, 8)],
        hopper_tile_shapes=[(37, 50, 24), (64, 64, 64), (1, 64, 8), (64, 3, 40), (17, 33, 64), (5, 6, 0)],
        hopper_grader_shapes=[(130, 200, 264), (64, 64, 64), (1, 1, 8), (200, 70, 520), (65, 129, 192),
                              (0, 5, 8), (3, 4, 0)],
        hopper_bench_shapes=[(128, 256, 128), (130, 200, 264)],
        hopper_sweep=[64, 128, 256],
        hopper_bench_check_shapes=[(1, 1, 8), (130, 200, 264)],
        layernorm_shape=(13, 100),
        layernorm_bench_shapes=[(8, 256), (4, 1024)],
        layernorm_check_shapes=[(1, 1), (7, 3), (5, 257)],
        attention_shape=(1, 2, 96, 32),
        attention_grader_shapes=[(1, 1, 1, 1, 16), (1, 2, 17, 17, 32), (2, 1, 31, 31, 64), (1, 1, 130, 130, 128),
                                 (2, 2, 17, 130, 16), (1, 1, 40, 17, 64)],
        attention_backward_grader_shapes=[(1, 1, 1, 1, 16), (1, 2, 17, 17, 32), (2, 1, 31, 31, 64),
                                          (1, 1, 130, 130, 64), (1, 2, 17, 70, 16), (1, 1, 40, 17, 32)],
        attention_long_keys=2048,
        attention_bench_shapes=[(1, 2, 64, 32), (1, 1, 37, 16)],
        attention_sweep_shapes=[(2, 2, 16, 16), (1, 2, 32, 16), (1, 1, 64, 16)],
        attention_bench_check_shapes=[(1, 1, 1, 16), (1, 2, 17, 32), (2, 1, 31, 64)],
    ),
}

#: What any CUDA GPU accepts in a launch, checked the same way in simulation: the grid's
#: (x, y, z) maximum, the block's (x, y, z) maximum and the threads of one block.
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024

#: The sizes of the current mode, as attributes: ``utils.SIZES.elementwise_n``.
SIZES = SimpleNamespace(**PROBLEM_SIZES[MODE])


def describe() -> str:
    """One line saying how the course runs here and why."""
    if SIMULATE:
        return (f"Running in SIMULATION on the CPU ({REASON}): Numba's CUDA simulator, "
                "Triton's interpreter and the course's CUDA C++ emulator.")
    return f"Running on the GPU ({REASON}): kernels run for real on {DEVICE}."
