"""C = A @ B^T on Hopper in Triton (lesson 12): both operands K-major, as nn.Linear computes
``x @ weight.T``; bfloat16 A (M, K) and B (N, K), float32 sums, bfloat16 C (M, N).

Versions (``VERSIONS``; ``hopper_gemm`` is the reference):

    v1  persistent (a program per SM, tiles in GROUP_M order) with TMA descriptors on A, B and C
        hopper_gemm_v1: lesson 06's persistent TMA matmul (kernels/triton/matmul.py: its tile
        order, its launch, its allocator for the descriptors) with B read as stored, (N, K):
        B's block is [BLOCK_N, BLOCK_K] and the product is ``tl.dot(a, b.T)``. The transpose
        moves no data: on a GPU wgmma reads B's tile from shared memory K-major as it lies
    v2  v1 warp-specialised: a producer warp group issues the TMA loads, two consumer warp groups the wgmmas
        hopper_gemm_v2: the tile loop is ``tl.range(..., warp_specialize=True)``. For sm_90 Triton
        (3.6 here) runs its Hopper pass (``add_hopper_warpspec`` in
        ``triton/backends/nvidia/compiler.py``, third_party/nvidia/hopper in Triton's source):
        it splits the loop into a producer partition, which waits for a free buffer and issues
        the TMA copies into it (A's block as two halves of BLOCK_M / 2 rows), and two consumer
        partitions, each taking one half of the tile's rows, which wait for a full buffer, run
        the wgmmas and the epilogue and hand the buffer back, through mbarriers; the consumers
        ask for 232 registers a thread (``requestedRegisters``, set by setmaxnreg). It acts
        only on a kernel of num_warps=4 (a warp group per partition) with num_stages > 1; the
        kernel then runs 12 warps. With num_warps=8 the flag is dropped without a word and the
        loop is only software-pipelined, as v1's is; so v2's configs are of 4 warps.
        (tl.range's docstring in 3.6 still says Blackwell only; kernels compiled on an H200
        have the ``ttg.warp_specialize`` op with two partitions.)

On a GPU the tile sizes are autotuned over a few configs of 128 x 256, 256 x 128 or 128 x 128 tiles
(``runtime.backends.triton.compat.autotune``). In simulation Triton's interpreter runs the
first, small config (32 x 32 x 32) on 4 programs, one program after another: the descriptors'
loads fill the parts past the tensor's edge with zeros as TMA does, and the loop options of
``tl.range`` (``warp_specialize``, ``num_stages``) are ignored, so v2 runs there as v1 does:
its results are checked, its overlap is a GPU's alone.

The input rules are the frame's (kernels/frames/hopper.py, ``prepare_linear``): K is padded to a
multiple of 8 so that rows are 16 bytes apart, as TMA needs; a C whose rows are not (N not a
multiple of 8) is written to an aligned buffer and copied.
"""
from __future__ import annotations

import torch

import runtime  # configures the interpreter before triton loads
from kernels._launch import version_index
from kernels.frames.hopper import hopper_ref, hopper_torch, prepare_linear  # noqa: F401  (the rules, the references)
from kernels.triton.matmul import TMA_SHAPES, _tile_of, aligned_empty, launch_tma, tma_ok
from runtime.backends.triton.compat import autotune

import triton
import triton.language as tl

#: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages[, EPILOGUE_SUBTILE]) of the
#: warp-specialised kernel on a GPU, 4 warps each (a warp group a partition). On an H200 (Triton
#: 3.6) 128 x 256 x 64 with 3 stages was the fastest or within 1% of it at 4096^3, 8192^3,
#: 16384 x 768 x 3072 and 16384 x 3072 x 768, and 256 x 128 x 64 at 4095 x 4097 x 4093; 2 stages
#: and 128 x 128 tiles were 3-20% slower (one timing each). With EPILOGUE_SUBTILE (C stored in
#: two halves, 32 KB of C staged, not 64 KB: room for a fourth stage of 128 x 256) Triton 3.6's
#: Hopper warp-specialisation pass fails (``NVGPUWarpSpecialization``: PassManager::run failed).
WS_SHAPES = [(128, 256, 64, 8, 4, 3), (256, 128, 64, 8, 4, 3), (128, 256, 64, 16, 4, 3), (128, 128, 64, 8, 4, 4)]
#: What simulation runs: small tiles, so the interpreter is quick.
SIM_CONFIG = (32, 32, 32, 8, 4, 2)


def _configs(shapes, **extra):
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": g, **extra,
                           **({"EPILOGUE_SUBTILE": rest[0]} if rest else {})}, num_warps=w, num_stages=s)
            for m, n, k, g, w, s, *rest in ([SIM_CONFIG] if runtime.SIMULATE else shapes)]


@triton.jit
def hopper_gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                       EPILOGUE_SUBTILE: tl.constexpr = False):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    # B as stored, (N, K): a block is BLOCK_N rows of B, BLOCK_K long, K contiguous like A's
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1], block_shape=[BLOCK_N, BLOCK_K])
    # EPILOGUE_SUBTILE: C stored as two halves of BLOCK_N / 2 columns, so half the shared memory
    # stages C (room for one more stage of A and B) and the second half's conversion overlaps the first's store
    C_BLOCK_N: tl.constexpr = BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, C_BLOCK_N])
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # one program per SM walks the tiles pid, pid + NUM_SMS, ... (warp_specialize=False: a plain loop)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_of(tile, num_m, num_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])   # out-of-range parts read as 0
            b = b_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
            acc = tl.dot(a, b.T, acc)                         # (BLOCK_M, BLOCK_K) @ (BLOCK_K, BLOCK_N)
        if EPILOGUE_SUBTILE:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)                    # columns [0, BLOCK_N / 2) and the rest
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], left.to(c_ptr.dtype.element_ty))
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], right.to(c_ptr.dtype.element_ty))
        else:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))  # clipped at the edges


hopper_v1_kernel = autotune(configs=_configs(TMA_SHAPES, WARP_SPECIALIZE=False), key=["M", "N", "K"])(
    hopper_gemm_kernel)
hopper_v2_kernel = autotune(configs=_configs(WS_SHAPES, WARP_SPECIALIZE=True), key=["M", "N", "K"])(
    hopper_gemm_kernel)


def _gemm(kern, a, b, op):
    a, b, c, M, N, K = prepare_linear(a, b, op=op)
    if c.numel() == 0 or K == 0:
        return c   # nothing to sum: prepare_linear's C is already zero
    if tma_ok(c):
        return launch_tma(kern, a, b, c, M, N, K)
    c2 = aligned_empty(M, N, c.dtype, c.device)   # rows 16 bytes apart for the C descriptor
    launch_tma(kern, a, b, c2, M, N, K)
    return c.copy_(c2)


def hopper_gemm_v1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: C = A @ B^T, persistent with TMA descriptors, B read K-major as stored."""
    return _gemm(hopper_v1_kernel, a, b, "hopper_gemm_v1")


def hopper_gemm_v2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2: v1 with the tile loop warp-specialised (producer and consumer warp groups) on a GPU."""
    return _gemm(hopper_v2_kernel, a, b, "hopper_gemm_v2")


VERSIONS = version_index(__doc__, v1=hopper_gemm_v1, v2=hopper_gemm_v2)
#: v1: on the H200 (benchmarks/results/tune/h200-hopper-tune-triton.json, each config timed alone
#: beside cuBLAS) v1 autotuned reached 0.92x cuBLAS at 4096^3 and 1.03x at 8192^3, v2 0.90x and
#: 0.97x: at 8192^3 v2 was 6% slower in that run and 11% in the record before it. v2's
#: specialisation pays where a tile's loop is short; on these square shapes Triton's software
#: pipeline of v1 (8 warps, 3 stages of 128 x 256 x 64) already keeps the tensor cores fed.
REFERENCE = "v1"
hopper_gemm = VERSIONS[REFERENCE][1]
