"""C = A @ B^T on Hopper's tensor cores in CUDA C++ (lesson 12): launchers for the kernels of
``hopper.cu``, whose header lists the versions; the machinery (TMA, mbarriers, wgmma) is
``hopper.h``.

    hopper_gemm(a, b)   the reference (v5): bfloat16 A (M, K), B (N, K) -> bfloat16 C (M, N)
    header_index()      what each function of hopper.h does
    cutlass_gemm(a, b)  CUTLASS 4.2's SM90 GEMM (hopper_cutlass.cu), built from CuTe's collectives:
                        a baseline beside the ladder, on a Hopper GPU only

On a GPU the kernels need a Hopper (sm_90); in simulation the emulator runs them anywhere.
"""
from __future__ import annotations

import ctypes

import torch

import runtime
from kernels._launch import cdiv, cuda_header, cuda_kernels, cuda_source, sm_count, version_index
from kernels.frames.hopper import hopper_ref, hopper_torch, prepare_linear  # noqa: F401  (importable from here too)
from runtime.tma import tensor_map

SOURCE = runtime.KERNELS_DIR / "cuda" / "hopper.cu"
HEADER = SOURCE.with_name("hopper.h")  # TMA, mbarriers, wgmma: inline PTX on a GPU, emulated otherwise
BK = 64  # K per tile: 64 bfloat16, one 128-byte swizzled row
GROUP_M = 8  # v5, v6: tile-rows per group of the persistent tile order

kernel = cuda_kernels(SOURCE)


def source(name: str, path=SOURCE) -> str:
    """The text of one kernel or helper of hopper.cu (or of ``path``, such as hopper.h)."""
    return cuda_source(name, path)


def header_index() -> str:
    """The header comment of hopper.h: what each of its functions does."""
    return cuda_header(HEADER)


def _check_gpu() -> None:
    if not runtime.SIMULATE:
        major, _ = torch.cuda.get_device_capability(runtime.DEVICE)
        if major != 9:
            raise RuntimeError(f"hopper.cu's kernels use TMA and wgmma, which only a Hopper GPU (sm_90) has; this "
                               f"one is sm_{major}{_}. Run them in simulation (COURSE_SIMULATE=1), or use lesson 06's")


def _launch(a, b, name: str, bm: int, bn: int, stages: int, threads: int):
    a, b, c, M, N, K = prepare_linear(a, b, op=name)
    if c.numel() == 0 or K == 0:
        return c
    _check_gpu()
    a_map = tensor_map(a, bm, BK, swizzle=128)
    b_map = tensor_map(b, bn, BK, swizzle=128)
    shared = stages * (bm + bn) * BK * 2 + 1024  # + the rounding up to 1024 bytes
    kernel(f"{name}_kernel")[(cdiv(N, bn), cdiv(M, bm)), threads, shared](a_map, b_map, c, M, N, K)
    return c


def hopper_gemm_v1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v1: TMA + wgmma, one warpgroup per 128 x 128 tile, one stage."""
    return _launch(a, b, "hopper_gemm_v1", 128, 128, 1, 128)


def hopper_gemm_v2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v2: a 4-stage mbarrier pipeline."""
    return _launch(a, b, "hopper_gemm_v2", 128, 128, 4, 128)


def hopper_gemm_v3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v3: a producer warpgroup and two consumer warpgroups, 128 x 256 tiles, 4 stages."""
    return _launch(a, b, "hopper_gemm_v3", 128, 256, 4, 384)


def hopper_gemm_v4(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v4: v3 with one wgmma group in flight while the next is issued."""
    return _launch(a, b, "hopper_gemm_v4", 128, 256, 4, 384)


def _launch_persistent(a, b, name: str, stages: int, staged: bool):
    a, b, c, M, N, K = prepare_linear(a, b, op=name)
    if c.numel() == 0 or K == 0:
        return c
    _check_gpu()
    bm, bn = 128, 256
    a_map = tensor_map(a, bm, BK, swizzle=128)
    b_map = tensor_map(b, bn, BK, swizzle=128)
    # C's map needs rows of a multiple of 16 bytes: otherwise the kernel stores from registers
    tma_store = int(staged and N % 8 == 0)
    c_map = tensor_map(c, 64, 64, swizzle=128) if tma_store else a_map
    shared = stages * (bm + bn) * BK * 2 + (2 * 64 * bn * 2 if staged else 0) + 1024
    grid = min(cdiv(M, bm) * cdiv(N, bn), sm_count())
    kernel(f"{name}_kernel")[grid, 384, shared](a_map, b_map, c_map, c, M, N, K, GROUP_M, tma_store)
    return c


def hopper_gemm_v5(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v5: v4 persistent, one block per SM walking 128 x 256 tiles in grouped order, 4 stages."""
    return _launch_persistent(a, b, "hopper_gemm_v5", 4, staged=False)


def hopper_gemm_v6(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """v6: v5 with C staged in shared memory and stored by TMA, 3 stages."""
    return _launch_persistent(a, b, "hopper_gemm_v6", 3, staged=True)


CUTLASS_SOURCE = SOURCE.with_name("hopper_cutlass.cu")
#: hopper_cutlass.cu's variants: clusters of blocks along M -> its number.
CUTLASS_VARIANTS = {1: 0, 2: 1}


_CUTLASS_LIB = []


def cutlass_source() -> str:
    """hopper_cutlass.cu's ``Sm90Gemm``: the GEMM as CUTLASS's builders assemble it from CuTe's
    collectives (the mainloop's TMA and wgmma, the epilogue, the tile scheduler)."""
    text = CUTLASS_SOURCE.read_text()
    start = text.index("template <int CLUSTER_M>")
    return text[start:text.index("    static typename Gemm::Arguments", start)].rstrip() + "\n    ...\n};"


def _cutlass_library():
    """hopper_cutlass.cu's library, its functions' argument types declared (once a process)."""
    if _CUTLASS_LIB:
        return _CUTLASS_LIB[0]
    from runtime import cute
    lib = cute.gpu_library(CUTLASS_SOURCE)
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.cutlass_gemm.argtypes = [i, p, p, p, i, i, i, ctypes.c_longlong, i, p, p, ctypes.c_char_p, i]
    lib.cutlass_gemm.restype = i
    lib.cutlass_gemm_workspace.argtypes = [i, i, i, i, i]
    lib.cutlass_gemm_workspace.restype = ctypes.c_size_t
    _CUTLASS_LIB.append(lib)
    return lib


def cutlass_gemm(a: torch.Tensor, b: torch.Tensor, cluster: int = 2) -> torch.Tensor:
    """C = A @ B^T by CUTLASS's SM90 GEMM (warp-specialised, cooperative, 128 x 256 x 64 tiles,
    persistent), in clusters of ``cluster`` x 1 blocks that share B's tiles by TMA multicast.
    Built by nvcc on first use (``runtime.cute.gpu_library``, about a minute): a Hopper GPU
    only, since the emulator does not run CUTLASS's own PTX."""
    from runtime import cute
    if cluster not in CUTLASS_VARIANTS:
        raise ValueError(f"cutlass_gemm: cluster must be one of {sorted(CUTLASS_VARIANTS)}, got {cluster!r}")
    a, b, c, M, N, K = prepare_linear(a, b, op="cutlass_gemm")
    if c.numel() == 0 or K == 0:
        return c
    if runtime.SIMULATE:
        raise cute.CuteUnavailable("cutlass_gemm runs CUTLASS's SM90 kernels, inline PTX that only a Hopper GPU "
                                   "runs (the emulator runs hopper.h's functions, not CUTLASS's): the ladder's "
                                   "versions run here, and lesson 12's CuTe section shows CUTLASS's layouts.")
    _check_gpu()
    lib = _cutlass_library()
    variant = CUTLASS_VARIANTS[cluster]
    out = c
    if N % 8:  # CUTLASS's TMA epilogue needs C's rows a multiple of 16 bytes: B padded with zero rows
        n8 = cdiv(N, 8) * 8
        b = torch.cat([b, b.new_zeros(n8 - N, K)])
        out, N = torch.empty(M, n8, dtype=c.dtype, device=c.device), n8
    sms = sm_count()
    size = lib.cutlass_gemm_workspace(variant, M, N, K, sms)
    workspace = torch.empty(max(int(size), 1), dtype=torch.uint8, device=c.device)
    error = ctypes.create_string_buffer(512)
    status = lib.cutlass_gemm(variant, a.data_ptr(), b.data_ptr(), out.data_ptr(), M, N, K, out.stride(0), sms,
                              workspace.data_ptr(), torch.cuda.current_stream(c.device).cuda_stream, error,
                              len(error))
    if status != 0:
        raise RuntimeError(f"cutlass_gemm: CUTLASS refused or failed: {error.value.decode()}")
    return c if out is c else c.copy_(out[:, :c.shape[1]])


#: name -> (one line, launcher), naive to best.
VERSIONS = version_index(SOURCE, v1=hopper_gemm_v1, v2=hopper_gemm_v2, v3=hopper_gemm_v3, v4=hopper_gemm_v4,
                         v5=hopper_gemm_v5, v6=hopper_gemm_v6)
#: v5: on the H200 (benchmarks/results/tune/h200-hopper-tune.json) v5 and v6 were within 2-3% of
#: each other at 4096^3 and 8192^3, v5 ahead at 4096^3 and at 4095 x 4097 x 4093 (v6 has 3 stages
#: to v5's 4); GROUP_M 8 and 16 were within 2%, 1 was 1-4% slower.
REFERENCE = "v5"
hopper_gemm = VERSIONS[REFERENCE][1]
