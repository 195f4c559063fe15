"""Does published CUDA C++ run in the course's CPU emulator as written?

    python -m benchmarks.simulators.published_survey [--mirrors DIR] [--only TEXT ...] [--no-write]

Each case of the table below names a kernel of a well-known public repository (NVIDIA's
CUDA samples, karpathy/llm.c's training kernels, siboehm/SGEMM_CUDA, the NVIDIA developer
blog's code samples, the GPU MODE lectures), how its own host code launches it, inputs for
it and a torch reference. The published text is read at run time
from a git mirror of its repository (``DIR/owner+name`` or ``DIR/owner+name/repo``, default
``$COURSE_SURVEY_MIRRORS``); no published code is kept in this repository. For each case:

1. The kernel's file is compiled **as it is**, with the files of its directory (and, for
   the CUDA samples, their ``Common/`` helper headers) beside it, through
   ``utils.cuda_kernel(path, name)``: the emulator's whole build, race detection included.
2. If the file's host code cannot compile here (cuBLAS, a ``main`` using what the emulator
   lacks), its **device part** is compiled instead: the file's kernels, device functions,
   types and macros as written, the host code blanked (``_toolchain.device_part``, the
   extraction the NVRTC check uses; quoted includes of the same directory get the same
   treatment). The result file says which, and why the whole file failed.
3. The kernel is launched with the grid, block and shared memory its host code uses (on
   smaller problems: the emulator runs every thread on the CPU), outputs poisoned with NaN,
   and compared with torch (float64 where it matters).

Writes ``benchmarks/results/simulators/published-survey.json``: per kernel "ok" or the reason (and, for
the failures understood, a note), and the mirrors' commits. Prints the counts. Without
mirrors it says so, prints the recorded counts and exits cleanly.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
if not __package__:  # run as a file, not with -m: the course's root on the path
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("COURSE_SIMULATE", "1")

import torch  # noqa: E402

import utils  # noqa: E402
from runtime.backends.cuda import _toolchain  # noqa: E402

RESULT = utils.SIMULATOR_RESULTS_DIR / "published-survey.json"
SAMPLES, LLMC, SGEMM = "NVIDIA/cuda-samples", "karpathy/llm.c", "siboehm/SGEMM_CUDA"
BLOG, GPUMODE = "NVIDIA-developer-blog/code-samples", "gpu-mode/lectures"
#: files of a repository that every kernel of it may include, copied beside the kernel's file
SHARED_HEADERS = {SAMPLES: "Common/"}
SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".c", ".inc")


# ---------------------------------------------------------------------------------------
# The case table
# ---------------------------------------------------------------------------------------
@dataclass
class Case:
    repo: str
    path: str
    kernel: str          # the name given to utils.cuda_kernel, template arguments included
    run: Callable        # run(k, get): launches k as its host code does, asserts on the result
    note: str = ""


CASES: list[Case] = []


def case(repo: str, path: str, kernel: str, note: str = ""):
    def add(fn):
        CASES.append(Case(repo, path, kernel, fn, note))
        return fn
    return add


DEV = utils.DEVICE
_gen = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen).to(dtype).to(DEV)


def randint(lo, hi, *shape, dtype=torch.int32):
    return torch.randint(lo, hi, shape, generator=_gen, dtype=torch.int64).to(dtype).to(DEV)


def poison(*shape, dtype=torch.float32):
    """An output buffer: NaN (or -1 for integers), so an element never written is seen."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=DEV)
    return torch.full(shape, -1, dtype=dtype, device=DEV)


def close(got, want, rtol=1e-4, atol=1e-5, what="result"):
    """got (any dtype) against want (computed in float64 from the same inputs)."""
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    if g.shape != w.shape:
        raise AssertionError(f"{what}: shape {tuple(g.shape)}, expected {tuple(w.shape)}")
    bad = ~torch.isclose(g, w, rtol=rtol, atol=atol)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {g.numel()} elements differ, first at flat index "
                             f"{i}: got {g.flatten()[i].item():.6g}, expected {w.flatten()[i].item():.6g}")


def equal(got, want, what="result"):
    close(got, want, rtol=0, atol=0, what=what)


def cdiv(a, b):
    return (a + b - 1) // b


def bf16_close(got, want, what="result"):
    # one bfloat16 rounding of the output (8 bits of mantissa) plus that of the float math
    close(got, want, rtol=1.6e-2, atol=1e-2, what=what)


# ----- NVIDIA/cuda-samples ---------------------------------------------------------------
@case(SAMPLES, "Samples/0_Introduction/vectorAdd/vectorAdd.cu", "vectorAdd")
def _(k, get):
    n = 50_000
    a, b, c = randn(n), randn(n), poison(n)
    k[cdiv(n, 256), 256](a, b, c, n)
    close(c, a.double() + b.double())


for _tile, _sizes in ((32, (64, 96, 128)), (16, (48, 32, 80))):
    def _run(k, get, tile=_tile, sizes=_sizes):
        hA, wA, wB = sizes
        A, B, C = randn(hA, wA), randn(wA, wB), poison(hA, wB)
        k[(wB // tile, hA // tile), (tile, tile)](C, A, B, wA, wB)
        close(C, A.double() @ B.double(), rtol=1e-4, atol=1e-4)
    case(SAMPLES, "Samples/0_Introduction/matrixMul/matrixMul.cu", f"MatrixMulCUDA<{_tile}>")(_run)


REDUCTION = "Samples/2_Concepts_and_Techniques/reduction/reduction_kernel.cu"


def _reduce(k, threads, per_thread, n=10_000, max_blocks=None, dtype=torch.int32):
    """The sample's reduce() wrapper: blocks of `threads`, each thread loading `per_thread`
    elements first; shared memory as it sizes it. Integers: the partial sums are exact."""
    blocks = cdiv(n, threads * per_thread)
    if max_blocks:
        blocks = min(blocks, max_blocks)
    x = randint(-100, 100, n, dtype=dtype) if not dtype.is_floating_point else randn(n, dtype=dtype)
    out = poison(blocks, dtype=dtype)
    smem = (2 if threads <= 32 else 1) * threads * x.element_size()
    k[blocks, threads, smem](x, out, n)
    return x, out, blocks


def _block_sums(x, size, blocks):
    pad = torch.zeros(blocks * size, dtype=torch.float64)
    pad[:x.numel()] = x.cpu().double()
    return pad.view(blocks, size).sum(1)


for _name, _per in (("reduce0<int>", 1), ("reduce1<int>", 1), ("reduce2<int>", 1), ("reduce3<int>", 2),
                    ("reduce4<int, 256>", 2), ("reduce5<int, 256>", 2)):
    def _run(k, get, per=_per):
        x, out, blocks = _reduce(k, 256, per)
        equal(out, _block_sums(x, 256 * per, blocks), what="partial sums")
    case(SAMPLES, REDUCTION, _name)(_run)


@case(SAMPLES, REDUCTION, "reduce6<int, 256, false>")
def _(k, get):
    x, out, blocks = _reduce(k, 256, 2, max_blocks=8)  # grid-stride: the partial sums add to the total
    equal(out.sum().reshape(1), x.double().sum().reshape(1), what="total")


@case(SAMPLES, REDUCTION, "reduce7<float, 256, false>",
      note="undefined warp behaviour, reported rightly: after the block's partial sums, lanes 0-7 call "
           "warpReduceSum with the mask __ballot_sync gave them (0xff), whose shuffles with offsets 16..1 "
           "read lanes outside it; a GPU leaves those values undefined")
def _(k, get):
    x, out, blocks = _reduce(k, 256, 2, max_blocks=8, dtype=torch.float32)
    close(out.double().sum().reshape(1), x.double().sum().reshape(1), rtol=1e-5, atol=1e-3, what="total")


@case(SAMPLES, REDUCTION, "cg_reduce<float>")
def _(k, get):
    x, out, blocks = _reduce(k, 256, 1, max_blocks=8, dtype=torch.float32)
    close(out.double().sum().reshape(1), x.double().sum().reshape(1), rtol=1e-5, atol=1e-3, what="total")


@case(SAMPLES, REDUCTION, "multi_warp_cg_reduce<float, 256, 64>")
def _(k, get):
    x, out, blocks = _reduce(k, 256, 2, max_blocks=8, dtype=torch.float32)
    close(out.double().sum().reshape(1), x.double().sum().reshape(1), rtol=1e-5, atol=1e-3, what="total")


TRANSPOSE = "Samples/6_Performance/transpose/transpose.cu"
for _name, _is_copy in (("copy", True), ("copySharedMem", True), ("transposeNaive", False),
                        ("transposeCoalesced", False), ("transposeNoBankConflicts", False),
                        ("transposeDiagonal", False)):
    def _run(k, get, is_copy=_is_copy):
        w = h = 96  # TILE_DIM 32, BLOCK_ROWS 16; square, as the sample runs them (copySharedMem's
        # bounds check compares xIndex with height: it is right for square matrices only)
        x, y = randn(h, w), poison(w * h)
        k[(w // 32, h // 32), (32, 16)](y, x, w, h)
        equal(y, (x if is_copy else x.t()).reshape(-1))
    case(SAMPLES, TRANSPOSE, _name)(_run)


@case(SAMPLES, "Samples/2_Concepts_and_Techniques/scalarProd/scalarProd_kernel.cuh", "scalarProdGPU")
def _(k, get):
    vectors, elements = 16, 2048
    a, b, c = randn(vectors, elements), randn(vectors, elements), poison(vectors)
    k[128, 256](c, a, b, vectors, elements)
    close(c, (a.double() * b.double()).sum(1), rtol=1e-4, atol=1e-4)


HISTOGRAM = "Samples/2_Concepts_and_Techniques/histogram/histogram256.cu"


def _histogram256(get, n_words=6144, partials=240):
    data = randint(0, 2**31, n_words)  # four bytes per word, each a bin
    part = poison(partials * 256, dtype=torch.int32)
    get("histogram256Kernel")[partials, 192](part, data, n_words)
    ref = torch.bincount(data.cpu().view(torch.uint8).long(), minlength=256).double()
    return part, ref


@case(SAMPLES, HISTOGRAM, "histogram256Kernel")
def _(k, get):
    part, ref = _histogram256(get)
    equal(part.view(240, 256).double().sum(0), ref, what="bins summed over the partial histograms")


@case(SAMPLES, HISTOGRAM, "mergeHistogram256Kernel")
def _(k, get):
    part, ref = _histogram256(get)
    hist = poison(256, dtype=torch.int32)
    k[256, 256](hist, part, 240)
    equal(hist, ref)


HISTOGRAM64 = "Samples/2_Concepts_and_Techniques/histogram/histogram64.cu"


def _histogram64(get, n_bytes=40_000):
    """The sample's histogram64(): partial histograms of 64 * 240 bytes each, then merged."""
    data = randint(0, 256, n_bytes, dtype=torch.uint8)
    count = cdiv(n_bytes, 64 * 240)
    part = poison(count * 64, dtype=torch.int32)
    get("histogram64Kernel")[count, 64](part, data, n_bytes // 16)
    ref = torch.bincount((data.cpu() >> 2).long(), minlength=64).double()  # the top 6 bits of each byte
    return part, count, ref


@case(SAMPLES, HISTOGRAM64, "histogram64Kernel")
def _(k, get):
    part, count, ref = _histogram64(get)
    equal(part.view(count, 64).double().sum(0), ref, what="bins summed over the partial histograms")


@case(SAMPLES, HISTOGRAM64, "mergeHistogram64Kernel")
def _(k, get):
    part, count, ref = _histogram64(get)
    hist = poison(64, dtype=torch.int32)
    k[64, 256](hist, part, count)
    equal(hist, ref)


@case(SAMPLES, "Samples/0_Introduction/simpleAtomicIntrinsics/simpleAtomicIntrinsics_kernel.cuh", "testKernel")
def _(k, get):
    blocks, threads = 4, 256
    n = blocks * threads
    d = torch.zeros(11, dtype=torch.int32, device=DEV)
    d[8] = d[10] = 0xFF
    k[blocks, threads](d)
    got = d.tolist()
    inc = dec = 0
    for _i in range(n):
        inc = 0 if inc >= 17 else inc + 1
        dec = 137 if dec == 0 or dec > 137 else dec - 1
    band, bxor = 0xFF, 0xFF
    for i in range(n):
        band &= 2 * i + 7
        bxor ^= i
    want = [10 * n, -10 * n, None, n - 1, 0, inc, dec, None, band, -1, bxor]
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:  # atomicExch and atomicCAS: some thread's index
            assert 0 <= g < n, f"element {i}: {g} is no thread's index"
        else:
            assert g == w, f"element {i}: got {g}, expected {w}"


SHFL_SCAN = "Samples/2_Concepts_and_Techniques/shfl_scan/shfl_scan.cu"


@case(SAMPLES, SHFL_SCAN, "shfl_scan_test")
def _(k, get):
    blocks, threads = 8, 256
    x = randint(0, 10, blocks * threads)
    data, partial = x.clone(), poison(blocks, dtype=torch.int32)
    k[blocks, threads, threads // 32 * 4](data, 32, partial)
    ref = x.view(blocks, threads).cumsum(1)
    equal(data, ref.reshape(-1))
    equal(partial, ref[:, -1])


@case(SAMPLES, SHFL_SCAN, "uniform_add")
def _(k, get):
    blocks, threads = 8, 256
    n = blocks * threads
    x, sums = randint(0, 100, n), randint(0, 1000, blocks)
    data = x.clone()
    k[blocks - 1, threads](data[threads:], sums, n)
    equal(data, torch.cat([x[:threads], (x[threads:].view(blocks - 1, threads) + sums[:blocks - 1, None]).reshape(-1)]))


@case(SAMPLES, "Samples/0_Introduction/clock/clock.cu", "timedReduction")
def _(k, get):
    blocks, threads = 8, 256
    x = randn(2 * threads)
    out, timer = poison(blocks), torch.zeros(2 * blocks, dtype=torch.int64, device=DEV)
    k[blocks, threads, 2 * threads * 4](x, out, timer)
    equal(out, x.min().expand(blocks))  # every block reduces the same input, as in the sample


VOTE = "Samples/0_Introduction/simpleVoteIntrinsics/simpleVote_kernel.cuh"


@case(SAMPLES, VOTE, "VoteAnyKernel1")
def _(k, get):
    n = 256
    x = (randint(0, 40, n) == 0).to(torch.int32)  # rare ones: some warps have none
    x[:32] = 0
    out = poison(n, dtype=torch.int32)
    k[1, n](x, out, n)  # one block of four warps, as the sample launches it
    want = (x.view(-1, 32).amax(1, keepdim=True) != 0).expand(-1, 32).reshape(-1)
    equal(out != 0, want)


@case(SAMPLES, VOTE, "VoteAllKernel2")
def _(k, get):
    n = 256
    x = (randint(0, 40, n) != 0).to(torch.int32)  # rare zeros: some warps have none
    x[:32] = 1
    out = poison(n, dtype=torch.int32)
    k[1, n](x, out, n)
    want = (x.view(-1, 32).amin(1, keepdim=True) != 0).expand(-1, 32).reshape(-1)
    equal(out != 0, want)


@case(SAMPLES, "Samples/3_CUDA_Features/warpAggregatedAtomicsCG/warpAggregatedAtomicsCG.cu", "filter_arr")
def _(k, get):
    n = 5000
    src = randint(-10, 10, n)
    dst, count = poison(n, dtype=torch.int32), torch.zeros(1, dtype=torch.int32, device=DEV)
    k[cdiv(n, 512), 512](dst, count, src, n)
    want = src[src > 0]
    assert int(count) == want.numel(), f"counted {int(count)} positive elements, expected {want.numel()}"
    equal(dst[:want.numel()].sort().values, want.sort().values, what="the elements kept")


@case(SAMPLES, "Samples/2_Concepts_and_Techniques/sortingNetworks/bitonicSort.cu", "bitonicSortShared")
def _(k, get):
    batch, length = 4, 1024
    keys = randint(0, 2**31, batch * length).view(torch.int32)
    vals = torch.arange(batch * length, dtype=torch.int32, device=DEV)
    dk, dv = poison(batch * length, dtype=torch.int32), poison(batch * length, dtype=torch.int32)
    k[batch * length // 1024, 512](dk, dv, keys, vals, length, 1)
    ukeys = keys.view(batch, length).long() & 0xFFFFFFFF  # uint keys
    equal(dk.view(batch, length).long() & 0xFFFFFFFF, ukeys.sort(1).values, what="keys")
    equal(keys[dv.long()], dk, what="values moved with their keys")


@case(SAMPLES, "Samples/2_Concepts_and_Techniques/scan/scan.cu", "scanExclusiveShared")
def _(k, get):
    batch, length = 4, 1024
    x = randint(0, 1000, batch * length)
    y = poison(batch * length, dtype=torch.int32)
    k[batch * length // 1024, 256](y, x, length)
    v = x.view(batch, length)
    equal(y, (v.cumsum(1) - v).reshape(-1))


SCAN = "Samples/2_Concepts_and_Techniques/scan/scan.cu"


def _scan_large(get, length=8192):
    """The sample's scanExclusiveLarge(): 1024-element scans, a scan of their totals, an update."""
    x = randint(0, 1000, length)
    y, buf = poison(length, dtype=torch.int32), poison(length // 1024, dtype=torch.int32)
    get("scanExclusiveShared")[length // 1024, 256](y, x, 1024)
    get("scanExclusiveShared2")[cdiv(length // 1024, 256), 256](buf, y, x, length // 1024, length // 1024)
    return x, y, buf


@case(SAMPLES, SCAN, "scanExclusiveShared2")
def _(k, get):
    x, y, buf = _scan_large(get)
    totals = x.view(-1, 1024).sum(1)
    equal(buf, totals.cumsum(0) - totals)


@case(SAMPLES, SCAN, "uniformUpdate")
def _(k, get):
    x, y, buf = _scan_large(get)
    k[x.numel() // 1024, 256](y, buf)
    equal(y, x.cumsum(0) - x)


@case(SAMPLES, "Samples/2_Concepts_and_Techniques/threadFenceReduction/threadFenceReduction_kernel.cuh",
      "reduceSinglePass<256, false>",
      note="the last block reads and overwrites the other blocks' partial sums after __threadfence() "
           "and an atomicInc ticket, which orders them on a GPU: not a race")
def _(k, get):
    n, threads, blocks = 10_000, 256, 8
    x, out = randn(n), poison(blocks)
    k[blocks, threads, threads * 4](x, out, n)
    close(out[:1].double(), x.double().sum().reshape(1), rtol=1e-5, atol=1e-3, what="total in out[0]")


@case(SAMPLES, "Samples/0_Introduction/simpleTemplates/simpleTemplates.cu", "testKernel<float>")
def _(k, get):
    threads = 32
    x, y = randn(threads), poison(threads)
    k[1, threads, threads * 4](x, y)
    close(y, x.double() * threads)


# ----- karpathy/llm.c dev/cuda (training kernels) ----------------------------------------
GELU_S = math.sqrt(2.0 / math.pi)


def _gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(GELU_S * (x + 0.044715 * x ** 3)))


def _gelu_grad(x):
    t = torch.tanh(GELU_S * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + x * 0.5 * (1 - t * t) * GELU_S * (1 + 3 * 0.044715 * x * x)


BF = torch.bfloat16


def _llmc_elementwise(path: str, names: tuple[str, str], ref, inputs: int, odd_n: bool = False):
    """llm.c's bfloat16 elementwise kernels, ``kernel(out, *inputs, n)``: the first of ``names``
    does one element a thread, the second 8 (one 128-bit load); ``ref`` gives ``out`` from the
    inputs in float64. ``odd_n``: the first runs at an n that is not a multiple of 128 too."""
    for name, per in zip(names, (1, 8)):
        def run(k, get, per=per):
            n = 4096 + (13 if odd_n and per == 1 else 0)
            xs = [randn(n, dtype=BF) for _ in range(inputs)]
            out = poison(n, dtype=BF)
            k[cdiv(n, 128 * per), 128](out, *xs, n)
            bf16_close(out, ref(*(x.double() for x in xs)))
        case(LLMC, path, name)(run)


_llmc_elementwise("dev/cuda/gelu_forward.cu", ("gelu_forward_kernel1", "gelu_forward_kernel2"), _gelu, 1, odd_n=True)
_llmc_elementwise("dev/cuda/gelu_backward.cu", ("gelu_backward1", "gelu_backward2"),
                  lambda x, dout: _gelu_grad(x) * dout, 2)
_llmc_elementwise("dev/cuda/residual_forward.cu", ("residual_forward_kernel1", "residual_forward_kernel2"),
                  lambda a, b: a + b, 2)

for _name, _unit in (("encoder_forward_kernel1", "bt"), ("encoder_forward_kernel2", "btc"),
                     ("encoder_forward_kernel3", "btc8")):
    def _run(k, get, unit=_unit):
        B, T, C, V = 2, 16, 64, 50
        tok = randint(0, V, B, T)
        wte, wpe, out = randn(V, C, dtype=BF), randn(T, C, dtype=BF), poison(B, T, C, dtype=BF)
        n = {"bt": B * T, "btc": B * T * C, "btc8": B * T * C // 8}[unit]
        k[cdiv(n, 128), 128](out, tok, wte, wpe, B, T, C)
        bf16_close(out, wte.double()[tok.long()] + wpe.double()[None])
    case(LLMC, "dev/cuda/encoder_forward.cu", _name)(_run)


for _name in ("adamw_kernel1", "adamw_kernel2"):
    def _run(k, get):
        n, lr, b1, b2, eps, wd, step = 3000, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3
        p, g, m, v = randn(n), randn(n), randn(n) * 0.1, randn(n).abs() * 0.01
        p0, m0, v0 = p.double(), m.double(), v.double()
        c1, c2 = 1 - b1 ** step, 1 - b2 ** step
        k[cdiv(n, 512), 512](p, g, m, v, n, lr, b1, b2, c1, c2, eps, wd)
        m1 = b1 * m0 + (1 - b1) * g.double()
        v1 = b2 * v0 + (1 - b2) * g.double() ** 2
        close(m, m1, what="m")
        close(v, v1, what="v")
        close(p, p0 - lr * (m1 / c1 / ((v1 / c2).sqrt() + eps) + wd * p0), what="params")
    case(LLMC, "dev/cuda/adamw.cu", _name)(_run)


def _probs(B, T, V):
    return torch.softmax(randn(B, T, V).double(), -1).float()


@case(LLMC, "dev/cuda/crossentropy_forward.cu", "crossentropy_forward_kernel1")
def _(k, get):
    B, T, V = 4, 32, 100
    probs, tgt, loss = _probs(B, T, V), randint(0, V, B, T), poison(B, T)
    k[cdiv(B * T, 128), 128](loss, probs, tgt, B, T, V)
    close(loss, -probs.double().gather(2, tgt.long()[..., None]).squeeze(2).log())


@case(LLMC, "dev/cuda/crossentropy_softmax_backward.cu", "crossentropy_softmax_backward_kernel1")
def _(k, get):
    B, T, V = 4, 8, 100
    probs, tgt, dloss = _probs(B, T, V), randint(0, V, B, T), randn(B, T)
    dlogits = randn(B, T, V)
    d0 = dlogits.double()
    k[cdiv(B * T * V, 256), 256](dlogits, dloss, probs, tgt, B, T, V)
    onehot = torch.nn.functional.one_hot(tgt.long(), V).double()
    close(dlogits, d0 + (probs.double() - onehot) * dloss.double()[..., None])


def _softmax_case(name, grid, block, shared):
    def _run(k, get):
        N, C = 32, 200
        x, y = randn(N, C) * 3, poison(N, C)
        k[grid(N), block, shared(block)](y, x, N, C)
        close(y, torch.softmax(x.double(), -1), rtol=1e-4, atol=1e-6)
    case(LLMC, "dev/cuda/softmax_forward.cu", name)(_run)


# grid and shared memory as the file's host functions compute them (block 128; kernel 3: 32)
_softmax_case("softmax_forward_kernel1", lambda N: cdiv(N, 128), 128, lambda b: 0)
_softmax_case("softmax_forward_kernel2", lambda N: N, 128, lambda b: b * 4)
_softmax_case("softmax_forward_kernel3", lambda N: N, 32, lambda b: b * 4)
_softmax_case("softmax_forward_kernel4", lambda N: N, 128, lambda b: b // 32 * 4)
_softmax_case("softmax_forward_online_kernel1", lambda N: cdiv(N, 128), 128, lambda b: 0)
_softmax_case("softmax_forward_online_kernel2", lambda N: cdiv(N * 32, 128), 128, lambda b: 0)
_softmax_case("softmax_forward_kernel7", lambda N: N, 128, lambda b: 2 * b // 32 * 4)
_softmax_case("softmax_forward_online_kernel8", lambda N: cdiv(N * 32, 128), 128, lambda b: 0)


def _layernorm_ref(x, w, b):
    x = x.double()
    mean = x.mean(-1)
    rstd = 1.0 / (x.var(-1, unbiased=False) + 1e-5).sqrt()
    return (x - mean[:, None]) * rstd[:, None] * w.double() + b.double(), mean, rstd


for _name, _grid in (("layernorm_forward_kernel1", lambda N: cdiv(N, 128)),
                     ("layernorm_forward_kernel3", lambda N: cdiv(N * 32, 128)),
                     ("layernorm_forward_kernel4", lambda N: cdiv(N * 32, 128)),
                     ("layernorm_forward_kernel5", lambda N: N)):
    def _run(k, get, grid=_grid):
        N, C = 24, 96
        x, w, b = randn(N, C), randn(C), randn(C)
        out, mean, rstd = poison(N, C), poison(N), poison(N)
        k[grid(N), 128](out, mean, rstd, x, w, b, N, C)
        ro, rm, rr = _layernorm_ref(x, w, b)
        close(out, ro, what="out")
        close(mean, rm, what="mean")
        close(rstd, rr, what="rstd")
    case(LLMC, "dev/cuda/layernorm_forward.cu", _name)(_run)


@case(LLMC, "dev/cuda/layernorm_forward.cu", "mean_kernel")
def _(k, get):
    N, C, block = 24, 96, 128
    x, mean = randn(N, C), poison(N)
    k[N, block, block * 4](mean, x, N, C, block)
    close(mean, x.double().mean(-1))


@case(LLMC, "dev/cuda/layernorm_forward.cu", "rstd_kernel")
def _(k, get):
    N, C, block = 24, 96, 128
    x, rstd = randn(N, C), poison(N)
    mean = x.double().mean(-1).float()
    k[N, block, block * 4](rstd, x, mean, N, C, block)
    close(rstd, _layernorm_ref(x, torch.ones(C), torch.zeros(C))[2])


@case(LLMC, "dev/cuda/layernorm_forward.cu", "normalization_kernel")
def _(k, get):
    B, T, C = 2, 12, 96
    x, w, b, out = randn(B * T, C), randn(C), randn(C), poison(B * T, C)
    ro, rm, rr = _layernorm_ref(x, w, b)
    k[cdiv(B * T * C, 256), 256](out, x, rm.float(), rr.float(), w, b, B, T, C)
    close(out, ro)


@case(LLMC, "dev/cuda/layernorm_forward.cu", "layernorm_forward_kernel6")
def _(k, get):
    N, C, block_y = 24, 96, 4  # block_size 128: blocks of (32, 4), (2 + 4) * C floats of shared memory
    x, w, b = randn(N, C), randn(C), randn(C)
    out, mean, rstd = poison(N, C), poison(N), poison(N)
    k[cdiv(N, block_y), (32, block_y), (2 + block_y) * C * 4](out, mean, rstd, x, w, b, N, C)
    ro, rm, rr = _layernorm_ref(x, w, b)
    close(out, ro, what="out")
    close(mean, rm, what="mean")
    close(rstd, rr, what="rstd")


def _encoder_backward(k, grid):
    B, T, C, V = 2, 8, 64, 10
    tok, dout = randint(0, V, B, T), randn(B, T, C)
    dwte, dwpe = torch.zeros(V, C, device=DEV), torch.zeros(T, C, device=DEV)
    k[grid(B, T, C), 128](dwte, dwpe, dout, tok, B, T, C)
    want_wte = torch.zeros(V, C, dtype=torch.float64).index_add_(0, tok.cpu().long().reshape(-1),
                                                                  dout.cpu().double().reshape(-1, C))
    close(dwte, want_wte, what="dwte")
    close(dwpe, dout.double().sum(0), what="dwpe")


@case(LLMC, "dev/cuda/encoder_backward.cu", "encoder_backward_kernel1")
def _(k, get):
    _encoder_backward(k, lambda B, T, C: cdiv(B * T * C, 128))


@case(LLMC, "dev/cuda/encoder_backward.cu", "encoder_backward_kernel2")
def _(k, get):
    _encoder_backward(k, lambda B, T, C: cdiv(C, 128))


@case(LLMC, "dev/cuda/permute.cu", "permute_kernel")
def _(k, get):
    d = (6, 7, 5, 8)
    x, y = randn(*d), poison(math.prod(d))
    k[cdiv(x.numel(), 256), 256](x, y, *d)
    equal(y, x.permute(3, 2, 0, 1).reshape(-1))  # (dim1, dim2, dim3, dim4) -> (dim4, dim3, dim1, dim2)


for _c in CASES:
    if _c.kernel == "softmax_forward_kernel7":
        _c.note = ("a real race, harmless here: in the last loop a thread whose unrolled indices pass the "
                   "row's end reads y[min(C - 1, ...)] = y[C - 1] while the thread that owns y[C - 1] "
                   "divides and writes it; the value read is never used")
    elif _c.kernel == "layernorm_forward_kernel5":
        _c.note = ("a real race by the CUDA memory model, harmless in practice: all 32 lanes of a warp write "
                   "the same value to shared_sum[warp_id] (the file says a `lane_id == 0` guard is \"not "
                   "needed\"); plain concurrent writes to one address are a race")


# ----- siboehm/SGEMM_CUDA (the "how to optimize a CUDA matmul" kernels) ------------------
def _sgemm(k, grid, block, M=128, N=128, K=128):
    A, B, C = randn(M, K), randn(K, N), randn(M, N)
    alpha, beta = 1.5, 0.5
    want = alpha * (A.double() @ B.double()) + beta * C.double()
    k[grid(M, N), block](M, N, K, alpha, A, B, beta, C)
    close(C, want, rtol=1e-4, atol=1e-3)


#: Kernels 5 to 9 launch alike: a block of 256 threads for each 128 x 128 tile of C.
_TILES_128 = (lambda M, N: (cdiv(N, 128), cdiv(M, 128)), 256, (128, 128, 64))
for _file, _name, _grid, _block, _mnk in (
        ("1_naive", "sgemm_naive", lambda M, N: (cdiv(M, 32), cdiv(N, 32)), (32, 32), (100, 72, 64)),
        ("2_kernel_global_mem_coalesce", "sgemm_global_mem_coalesce<32>",
         lambda M, N: (cdiv(M, 32), cdiv(N, 32)), 1024, (100, 72, 64)),
        ("3_kernel_shared_mem_blocking", "sgemm_shared_mem_block<32>",
         lambda M, N: (cdiv(M, 32), cdiv(N, 32)), 1024, (64, 96, 64)),
        ("4_kernel_1D_blocktiling", "sgemm1DBlocktiling<64, 64, 8, 8>",
         lambda M, N: (cdiv(N, 64), cdiv(M, 64)), 512, (128, 128, 64)),
        ("5_kernel_2D_blocktiling", "sgemm2DBlocktiling<128, 128, 8, 8, 8>", *_TILES_128),
        ("6_kernel_vectorize", "sgemmVectorize<128, 128, 8, 8, 8>", *_TILES_128),
        ("7_kernel_resolve_bank_conflicts", "sgemmResolveBankConflicts<128, 128, 8, 8, 8>", *_TILES_128),
        ("8_kernel_bank_extra_col", "sgemmResolveBankExtraCol<128, 128, 8, 8, 8>", *_TILES_128),
        ("9_kernel_autotuned", "sgemmAutotuned<128, 128, 16, 8, 8>", *_TILES_128)):
    def _run(k, get, grid=_grid, block=_block, mnk=_mnk):
        _sgemm(k, grid, block, *mnk)
    case(SGEMM, f"src/kernels/{_file}.cuh", _name)(_run)


# ----- NVIDIA-developer-blog/code-samples (the "CUDA C++" blog series) -------------------
SHARED_MEMORY = "series/cuda-cpp/shared-memory/shared-memory.cu"


@case(BLOG, SHARED_MEMORY, "staticReverse")
def _(k, get):
    d = randint(0, 1000, 64)
    x = d.clone()
    k[1, 64](d, 64)
    equal(d, x.flip(0))


@case(BLOG, SHARED_MEMORY, "dynamicReverse")
def _(k, get):
    d = randint(0, 1000, 64)
    x = d.clone()
    k[1, 64, 64 * 4](d, 64)
    equal(d, x.flip(0))


COALESCING = "series/cuda-cpp/coalescing-global/coalescing.cu"


@case(BLOG, COALESCING, "offset<float>")
def _(k, get):
    n, s = 4096, 3
    a = randn(n * 33)
    want = a.double().clone()
    want[s:s + n] += 1
    k[n // 256, 256](a, s)
    close(a, want)


@case(BLOG, COALESCING, "stride<float>")
def _(k, get):
    n, s = 4096, 5
    a = randn(n * 33)
    want = a.double().clone()
    want[0:n * s:s] += 1
    k[n // 256, 256](a, s)
    close(a, want)


@case(BLOG, "posts/mixed-precision/haxpy.cu", "haxpy",
      note="`half a` is passed by value (a Python float, rounded to half). The emulator defines no "
           "__CUDA_ARCH__: the kernel's `#else` branch, in float, runs instead of its half2 branch")
def _(k, get):
    n, a = 1001, 2.0
    x, y = randn(n, dtype=torch.float16), randn(n, dtype=torch.float16)
    want = a * x.double() + y.double()
    k[cdiv(n, 256), 256](n, a, x, y)
    close(y, want, rtol=2e-3, atol=2e-3)  # one float16 rounding


BLOG_TRANSPOSE = "series/cuda-cpp/transpose/transpose.cu"
for _name, _is_copy in (("copy", True), ("copySharedMem", True), ("transposeNaive", False),
                        ("transposeCoalesced", False), ("transposeNoBankConflicts", False)):
    def _run(k, get, is_copy=_is_copy):
        n = 64  # TILE_DIM 32, BLOCK_ROWS 8; the width is gridDim.x * TILE_DIM (square matrices)
        x, y = randn(n, n), poison(n * n)
        k[(n // 32, n // 32), (32, 8)](y, x)
        equal(y, (x if is_copy else x.t()).reshape(-1))
    case(BLOG, BLOG_TRANSPOSE, _name)(_run)


# ----- gpu-mode/lectures (lecture 9: reductions, after "Programming Massively Parallel Processors") --
for _file, _name in (("simple_reduce", "SimpleSumReductionKernel"), ("shared_reduce", "SharedMemoryReduction"),
                     ("control_divergence_reduce", "FixDivergenceKernel")):
    def _run(k, get):
        x = randn(2048)
        want = x.double().sum().reshape(1)
        out = poison(1)
        k[1, 1024](x, out)  # one block of size / 2 threads, as the lecture launches it
        close(out, want, rtol=1e-5, atol=1e-3)
    case(GPUMODE, f"lecture_009/{_file}.cu", _name)(_run)


@case(GPUMODE, "lecture_009/reduce_coarsening.cu", "CoarsenedReduction")
def _(k, get):
    n = 10_000
    x, out = randn(n), torch.zeros(1, device=DEV)
    k[cdiv(n, 1024 * 2), 1024](x, out, n)
    close(out, x.double().sum().reshape(1), rtol=1e-5, atol=1e-3)


# ---------------------------------------------------------------------------------------
# Running the table
# ---------------------------------------------------------------------------------------
def find_mirror(base: Path, repo: str) -> Path | None:
    owner, name = repo.split("/")
    for d in (base / f"{owner}+{name}" / "repo", base / f"{owner}+{name}", base / name):
        if (d / "HEAD").exists() or (d / ".git").exists():
            return d
    return None


def git(mirror: Path, *args) -> bytes:
    return subprocess.run(["git", "-C", str(mirror), *args], capture_output=True, check=True).stdout


def first_error(e: Exception, tmp: str = "") -> str:
    lines = [ln for ln in str(e).splitlines() if " error" in ln or "does not support" in ln or "error:" in ln]
    text = (lines[0] if lines else (str(e).splitlines() or [type(e).__name__])[0]).strip()
    return (text.replace(tmp + "/", "") if tmp else text)[:300]


class Checkout:
    """The files a case needs, written from a mirror into a temporary directory."""

    def __init__(self, mirror: Path, repo: str):
        self.mirror, self.repo = mirror, repo
        self.files = git(mirror, "ls-tree", "-r", "--name-only", "HEAD").decode().splitlines()
        self.commit = git(mirror, "rev-parse", "HEAD").decode().strip()

    def text(self, path: str) -> str:
        return git(self.mirror, "show", f"HEAD:{path}").decode("utf-8", errors="replace")

    def write(self, path: str, dest: Path, device_only: bool) -> Path:
        """The kernel's directory (and the repository's shared headers) under ``dest``;
        with ``device_only``, every file reduced to its device part. The kernel's path."""
        folder = str(Path(path).parent)
        shared = SHARED_HEADERS.get(self.repo)
        for f in self.files:
            beside = str(Path(f).parent) == folder
            if not f.endswith(SOURCE_SUFFIXES) or not (beside or (shared and f.startswith(shared)
                                                                  and "/" not in f[len(shared):])):
                continue
            text = self.text(f)
            if device_only:
                text = device_only_text(text)
            (dest / Path(f).name).write_text(text)
        return dest / Path(path).name


_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"[^"]+"')
_LIBRARY_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](cublas_v2|cublasLt|cublas_api)\.h[>"]')


def device_only_text(text: str) -> str:
    """The device part of a published file (``_toolchain.device_part``), with its quoted
    includes of files beside it kept (they are reduced the same way)."""
    part = _toolchain.device_part(text)
    if part is None:
        return text  # no device code: types, constants, macros only
    lines, orig = part.split("\n"), text.split("\n")
    for i, line in enumerate(orig):
        if _QUOTED_INCLUDE.match(line) and i < len(lines):
            lines[i] = line
        elif _LIBRARY_INCLUDE.match(line) and i < len(lines):
            # cuBLAS's headers include cuda_fp16.h and cuda_bf16.h: code that names __half
            # or __nv_bfloat16 after including only them compiles with nvcc
            lines[i] = "#include <cuda_bf16.h>"  # (the emulator's includes its cuda_fp16.h)
    return "\n".join(lines)


def run_case(c: Case, checkout: Checkout) -> dict:
    # These kernels are published GPU code: the check that makes a learner's code fail here
    # when NVRTC would reject it is off (on a whole file, NVRTC rejects the host code, as
    # utils.cuda_kernel does on a GPU, where only the device part can be given to it).
    parity, _toolchain.NVRTC_PARITY = _toolchain.NVRTC_PARITY, False
    try:
        return _run_case(c, checkout)
    finally:
        _toolchain.NVRTC_PARITY = parity


def compile_quietly(src: Path, name: str):
    """utils.cuda_kernel, without printing g++'s warnings about published code."""
    with contextlib.redirect_stderr(io.StringIO()):
        return utils.cuda_kernel(src, name)


def _run_case(c: Case, checkout: Checkout) -> dict:
    row = {"repo": c.repo, "path": c.path, "kernel": c.kernel}
    if c.note:
        row["note"] = c.note
    t0 = time.perf_counter()
    kernels: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        whole, part = Path(tmp) / "file", Path(tmp) / "device"
        whole.mkdir()
        part.mkdir()
        src = checkout.write(c.path, whole, device_only=False)
        try:
            k = compile_quietly(src, c.kernel)
            row["compiled"] = "whole file"
        except utils.CudaCompileError as e:
            row["whole_file_error"] = first_error(e, str(whole))
            src = checkout.write(c.path, part, device_only=True)
            try:
                k = compile_quietly(src, c.kernel)
                row["compiled"] = "device part"
            except utils.CudaCompileError as e2:
                row.update(status="compile error", reason=first_error(e2, str(part)),
                           seconds=round(time.perf_counter() - t0, 2))
                return row

        def get(name):  # another kernel of the same file, compiled the same way
            if name not in kernels:
                kernels[name] = compile_quietly(src, name)
            return kernels[name]
        try:
            c.run(k, get)
            row["status"], row["reason"] = "ok", ""
        except utils.KernelRace as e:
            # The detector's verdict is the result; the values are checked without it too.
            row["status"], row["reason"] = "race reported", str(e).strip()[:600]
            try:
                with utils.race_detection(False):
                    c.run(k, get)
                row["without_race_detection"] = "ok"
            except Exception as e2:
                row["without_race_detection"] = f"{type(e2).__name__}: {first_error(e2, tmp)}"
        except AssertionError as e:
            row["status"], row["reason"] = "wrong result", str(e).splitlines()[0][:300]
        except Exception as e:  # every failure is a result of the survey
            row["status"] = type(e).__name__
            row["reason"] = first_error(e, tmp)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mirrors", default=os.environ.get("COURSE_SURVEY_MIRRORS", ""),
                    help="folder holding git mirrors named owner+name (default $COURSE_SURVEY_MIRRORS)")
    ap.add_argument("--only", nargs="*", help="run only cases whose kernel or path contains one of these")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    base = Path(args.mirrors) if args.mirrors else None
    checkouts = {}
    for repo in sorted({c.repo for c in CASES}):
        m = find_mirror(base, repo) if base else None
        if m is not None:
            checkouts[repo] = Checkout(m, repo)
    if not checkouts:
        print("no mirrors given (--mirrors DIR or COURSE_SURVEY_MIRRORS): nothing surveyed")
        if RESULT.exists():
            rec = json.loads(RESULT.read_text())
            n = rec.get("counts", {})
            print(f"recorded at commit {rec.get('commit')}: {n.get('ok')} of {n.get('kernels')} published "
                  f"kernels ran as written and matched torch")
            for repo, c in rec.get("per_repo", {}).items():
                print(f"  {repo}: {c['ok']} of {c['kernels']}")
        return 0
    cases = [c for c in CASES if c.repo in checkouts]
    if args.only:
        cases = [c for c in cases if any(o in c.kernel or o in c.path for o in args.only)]
    rows = []
    for c in cases:
        r = run_case(c, checkouts[c.repo])
        rows.append(r)
        how = r.get("compiled", "-")
        print(f"{r['status']:14s} {c.repo}:{c.path}:{c.kernel} [{how}, {r['seconds']} s] {r['reason'][:150]}",
              flush=True)
        if "whole_file_error" in r:
            print(f"{'':14s} (whole file: {r['whole_file_error'][:150]})", flush=True)
    counts = {"kernels": len(rows), "ok": sum(r["status"] == "ok" for r in rows)}
    counts["failed"] = counts["kernels"] - counts["ok"]
    counts["whole file"] = sum(r.get("compiled") == "whole file" for r in rows)
    counts["device part"] = sum(r.get("compiled") == "device part" for r in rows)
    per_repo = {repo: {"kernels": sum(r["repo"] == repo for r in rows),
                       "ok": sum(r["repo"] == repo and r["status"] == "ok" for r in rows)} for repo in checkouts}
    print(f"{counts['ok']} of {counts['kernels']} published kernels ran as written and matched torch "
          f"({counts['whole file']} compiled as whole files, {counts['device part']} as their device part)")
    for repo, n in per_repo.items():
        print(f"  {repo}: {n['ok']} of {n['kernels']}")
    if args.no_write or args.only:
        return 0
    course = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    record = {"what": "published CUDA C++ kernels compiled as written and launched in the CPU emulator "
                      "(race detection on), results compared with torch",
              "commit": course or None,
              "command": "python -m benchmarks.simulators.published_survey --mirrors DIR",
              "mirrors": {repo: f"github.com/{repo}@{co.commit}" for repo, co in checkouts.items()},
              "counts": counts, "per_repo": per_repo, "results": rows}
    RESULT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
