"""Matrix multiplication (lesson 06): tiles, register blocking, tensor cores. The first
compute-bound topic: its benchmarks count FLOPs (2 M N K) as well as bytes.

Shapes are (M, N, K): C (M, N) = A (M, K) @ B (K, N). This topic is the float32 product
(SIMT CUDA versions, Numba, Triton with exact fp32 products) against ``torch.mm`` with TF32
off; ``matmul_fp16`` is the tensor-core product (fp16 inputs, fp32 accumulation).
"""
from __future__ import annotations

import math
import re

import torch

from runtime.backends import cuda as _cuda

from .. import check as _check
from ..grading import Case, Grader, GradingError, guarded_input, run_cases, success
from ._spec import FLOAT, Baseline, Spec, Target, generator

#: Unit roundoff (half an ulp at 1) of each input dtype: a result rounded once to it.
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
#: TF32 keeps 10 bits of mantissa, as float16 does: products of float32 inputs rounded so.
TF32_UNIT_ROUNDOFF = 2.0 ** -11
#: H100 SXM peak throughput (NVIDIA's data sheet, dense): the compute roofs of lesson 06.
PEAK_TFLOPS = {"fp32 (SIMT FMA)": 66.9, "tf32 tensor core": 494.7, "fp16/bf16 tensor core": 989.4}


def flops(shape) -> int:
    M, N, K = shape
    return 2 * M * N * K


def nbytes_of(elem_in: int, elem_out: int):
    """Bytes one product must move at the least: A and B read once, C written once."""
    def nbytes(shape) -> int:
        M, N, K = shape
        return elem_in * (M * K + K * N) + elem_out * M * N
    return nbytes


def matmul_ref64(a, b):
    return a.double() @ b.double()


def make_inputs(shape, seed=0, device=None, dtype=torch.float32):
    """A (M, K) and B (K, N) with entries in [-1, 1): sums of K products stay near sqrt(K)."""
    from runtime.config import DEVICE
    device = device or DEVICE
    g = generator(seed, device)
    M, N, K = shape
    a = (2 * torch.rand(M, K, generator=g, device=device) - 1).to(dtype)
    b = (2 * torch.rand(K, N, generator=g, device=device) - 1).to(dtype)
    return a, b


def matmul_input(shape, seed=0, device=None):
    return make_inputs(shape, seed, device, torch.float32)


def accumulation_atol(a, b, unit: float = UNIT_ROUNDOFF[torch.float32]) -> float:
    """The error a float32 sum of K products may have, in any order: a few times
    sqrt(K) roundings of the largest partial sum (|A| @ |B| bounds every partial sum)."""
    K = a.shape[1] if a.dim() == 2 else 0
    if K == 0 or a.numel() == 0 or b.numel() == 0:
        return 0.0
    scale = float((a.double().abs() @ b.double().abs()).max())
    return 8.0 * math.sqrt(K) * unit * scale + 1e-30


def tolerance_for(a, b, ref, *, dtype=torch.float32, allow_tf32=False) -> dict:
    """Allowed |C - ref| <= atol + rtol |ref|: fp32 accumulation (atol), plus one rounding of
    C to the input dtype (rtol) for a kernel that returns C in that dtype, as torch.mm does.
    With ``allow_tf32``, products of float32 inputs rounded to TF32 (10-bit mantissa)."""
    atol = accumulation_atol(a, b)
    if allow_tf32 and dtype == torch.float32:
        atol += accumulation_atol(a, b, TF32_UNIT_ROUNDOFF)
    rtol = 2 * UNIT_ROUNDOFF[dtype] if dtype != torch.float32 else _check.tolerance(torch.float32)["rtol"]
    return dict(atol=atol, rtol=rtol)


def spec_tolerance(dtype):
    def tol(inputs, ref):
        t = tolerance_for(inputs[0], inputs[1], ref, dtype=dtype)
        return t["atol"] + t["rtol"] * ref.abs()
    return tol


# ----------------------------------------------------------------------------------------
# The grader
# ----------------------------------------------------------------------------------------
def _label(shape, dtype, note=""):
    M, N, K = shape
    what = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    return f"A {M}x{K} @ B {K}x{N} ({what}{note})"


def _padded(t: torch.Tensor, dtype):
    """``t`` as ``dtype`` on the course's device, inside a buffer of NaN: reading past
    either end gives NaN (guarded_input does this for float32, with guard checks)."""
    from runtime.config import DEVICE
    n = t.numel()
    buf = torch.full((n + 2 * 4096,), float("nan"), dtype=dtype, device=DEVICE)
    view = buf[4096:4096 + n].view(t.shape)
    view.copy_(t.to(dtype))
    return view


def _make(values, dtype, transpose_b=False):
    def make():
        a, b = values
        if dtype == torch.float32:
            ga, guard_a = guarded_input(a)
            if transpose_b:  # B given as the transpose of a contiguous (N, K) tensor
                gbt, guard_b = guarded_input(b.t().contiguous())
                return (ga, gbt.t()), [guard_a, guard_b]
            gb, guard_b = guarded_input(b)
            return (ga, gb), [guard_a, guard_b]
        pa = _padded(a, dtype)
        pb = _padded(b.t().contiguous(), dtype).t() if transpose_b else _padded(b, dtype)
        return (pa, pb), []
    return make


def _alternatives(a, b):
    """What the classic index mistakes compute instead of A @ B, for square matrices."""
    return [
        (a @ b.t(), "B is read transposed: element (k, col) of B, a K x N row-major matrix, is "
                    "b[k * N + col], not b[col * K + k]."),
        (a.t() @ b, "A is read transposed: element (row, k) of A, an M x K row-major matrix, is "
                    "a[row * K + k], not a[k * M + row]."),
        ((a @ b).t(), "C is written transposed: element (row, col) of C goes to c[row * N + col]; "
                      "x (the fastest-varying thread index) should give the column."),
        (a.t() @ b.t(), "both A and B are read transposed: a[row * K + k] and b[k * N + col]."),
    ]


_LOAD_BARRIER = ("threads read a shared tile before every thread has written it: put a __syncthreads() "
                 "(cuda.syncthreads()) between loading a tile and using it.")
_OVERWRITE_BARRIER = ("right on a single tile, wrong with several: a thread starts loading the next tile "
                      "while others still read the current one. Put a __syncthreads() (cuda.syncthreads()) "
                      "at the end of the loop body, before the next tile overwrites the shared tiles.")
_EDGES = ("a tile reached past the edge of A or B: are the edges masked? Load 0 where row >= M or k >= K "
          "(A) and where k >= K or col >= N (B), and store only where row < M and col < N.")


def check_matmul(fn, *, dtype=torch.float32, allow_tf32=False, seed=None):
    """``fn(a, b)`` must return ``a @ b`` for A (M, K) and B (K, N) of ``dtype``.

    The result may be float32 or ``dtype`` (rounded once, as torch.mm does); the sums must
    be accumulated in float32 (``allow_tf32=True`` accepts TF32 products of float32 inputs).
    The shapes are awkward on purpose: not multiples of any tile, K = 1, K = 0 (C = 0),
    empty matrices. One more input gives B transposed (a non-contiguous view): the function
    may compute with it or refuse it with an error that says "contiguous".
    """
    from runtime.config import SIMULATE, SIZES
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"check_matmul: dtype must be float32, float16 or bfloat16, got {dtype}")
    g = Grader("check_matmul", fn, seed)
    shapes = [tuple(s) for s in SIZES.matmul_grader_shapes]
    if dtype != torch.float32:
        shapes.append((8, 8, 2048 if not SIMULATE else 512))  # a long K: a 16-bit sum drifts visibly
    out_dtypes = (torch.float32,) if dtype == torch.float32 else (torch.float32, dtype)

    def case_of(shape, note="", transpose_b=False):
        a, b = make_inputs(shape, seed=int(torch.randint(0, 2**31 - 1, (1,), generator=g.gen)), device="cpu",
                           dtype=dtype)
        return Case(_label(shape, dtype, note), (a, b), matmul_ref64(a, b), make=_make((a, b), dtype, transpose_b),
                    extra=dict(shape=shape, tol=tolerance_for(a, b, None, dtype=dtype, allow_tf32=allow_tf32)))

    cases = [case_of(s) for s in shapes]
    probe_shape = tuple(SIZES.matmul_probe_shape)

    def run_probe(shape):
        """fn on a fresh input of ``shape``: (right?, got, the case)."""
        c = case_of(shape)
        (a, b), _ = c.make()
        try:
            out = fn(a, b)
        except Exception:
            return False, None, c
        got = out.detach().to("cpu", torch.float64)
        ok = got.shape == c.expected.shape and not bool(_check.mismatch_mask(got, c.expected, **c.extra["tol"]).any())
        return ok, got, c

    def diagnose(case, got, bad):
        a, b = (v.double() for v in case.values)
        M, N, K = case.extra["shape"]
        finite = torch.isfinite(got)
        # Errors far below one term of the sum, growing with K: the arithmetic's precision.
        rel = float(((got - case.expected).abs()[finite] / (a.abs() @ b.abs()).clamp_min(1e-30)[finite]).max()) \
            if bool(finite.any()) else math.inf
        if bool(finite.all()) and rel < 5e-3 and K >= 16:
            low = "float16/bfloat16" if dtype != torch.float32 else "TF32 or float16"
            return (f"small errors that grow with K (up to {rel:.1e} of sum |a||b|): the sums look accumulated in "
                    f"{low}. Keep the accumulator in float32 (float acc; tl.zeros(..., dtype=tl.float32); "
                    "wmma::fragment<accumulator, ..., float>)" + (
                        "; for float32 inputs, tl.dot(..., input_precision=\"ieee\") avoids TF32"
                        if dtype == torch.float32 else "") + ".")
        ok_full, got_p, probe = run_probe(probe_shape)
        if not ok_full:
            if got_p is not None and got_p.shape == probe.expected.shape:
                pa, pb = (v.double() for v in probe.values)
                for alt, text in _alternatives(pa, pb):
                    if same_loose(got_p, alt):
                        return (f"the result looks like a different product: {text} (Or the kernel assumes a "
                                "contiguous layout: index with the strides, a.stride(0), a.stride(1), b.stride(0), "
                                "b.stride(1).)")
            if not bool(finite.all()):
                return ("some results are NaN: " + _LOAD_BARRIER + " (The emulator fills shared memory with "
                        "NaN when a block starts.)")
            if one_tile_ok():
                if _is_triton(fn):
                    return ("right on a single tile, wrong with several along K: does each step load the next "
                            "tile? Advance both pointer tiles after each step (a_ptrs += BLOCK_K * stride_ak; "
                            "b_ptrs += BLOCK_K * stride_bk), or add k0 * stride to the offsets.")
                return _OVERWRITE_BARRIER + " (Or the load misses the tile's offset k0 along K.)"
            return ("wrong even when every dimension is a multiple of the tile: check the index of each load "
                    "(A[row, k0 + tx] at a[row * K + k0 + tx], B[k0 + ty, col] at b[(k0 + ty) * N + col]) "
                    "and the barriers around the use of the tiles. A kernel given strides must use them in every "
                    "index and pointer step: a transposed or sliced B has b.stride(0) != N and b.stride(1) != 1.")
        # Right on the probe: the mistake is at the edges.
        swapped = _swapped_grid(bad, M, N)
        if swapped:
            return swapped
        if not bool(finite.all()):
            if _is_triton(fn):
                return ("NaN at the edges: a masked load without other= gives undefined values where the mask is "
                        "off (here the grader's NaN marker), and one NaN spoils every sum it enters. Load 0 outside "
                        "A and B: tl.load(..., mask=..., other=0.0).")
            return ("NaN at the edges: a tile read past the end of A or B, where the grader keeps NaN. " + _EDGES)
        rows_bad, cols_bad = bad.any(dim=1), bad.any(dim=0)
        return (f"right on {probe_shape[0]}x{probe_shape[1]}x{probe_shape[2]} but wrong on {M}x{N}x{K}, which is "
                "not a multiple of the tile: " + _EDGES +
                f" ({int(rows_bad.sum())} of {M} rows and {int(cols_bad.sum())} of {N} columns are affected.)")

    def same_loose(got, alt):
        return got.shape == alt.shape and bool(((got - alt).abs() <= 1e-3 * (1 + alt.abs())).all())

    # A transposed (non-contiguous) B: computed right, or refused in so many words.
    t_shape = shapes[0]
    t_case = case_of(t_shape, ", B a transposed view", transpose_b=True)
    refused = None
    try:
        (ta, tb), _ = t_case.make()
        fn(ta, tb)
    except Exception as e:
        if "contiguous" in str(e).lower():
            refused = str(e).splitlines()[0]
    if refused is None:
        cases.append(t_case)

    def one_tile_ok():
        """Right on a 16 x 16 x 16 product (one tile of C and one step along K for tiles of
        16 or more: nothing is overwritten), also in a random thread order? A race there
        means the barrier between loading a tile and using it is missing."""
        ok, _, _ = run_probe((16, 16, 16))
        if ok and SIMULATE:
            with _cuda.emulation_schedule("random", seed=g.seed):
                ok, _, _ = run_probe((16, 16, 16))
        return ok

    try:
        worst = run_cases(g, cases, names=("a", "b"), shape_of=lambda c: c.expected.shape,
                          tol_of=lambda c: c.extra["tol"], diagnose=diagnose, dtypes=out_dtypes)
    except GradingError as e:
        # The shared harness names a race or a fault in general terms; a matmul has two
        # barriers and masked edges, so say which one.
        text, hint = str(e), None
        if "changes between runs" in text or "differ between" in text or "has a race" in text:
            hint = (_OVERWRITE_BARRIER if one_tile_ok() else _LOAD_BARRIER)
        elif "faulted" in text and re.search(r"past the end|before the start|out of range|outside", text):
            hint = _EDGES
        if hint is None:
            raise
        if "\nHint: " not in text:   # the race report has no hint line: add one
            text = re.sub(r"(?=\n\(Inputs came from seed)", "\nHint: ", text, count=1)
        raise GradingError(re.sub(r"\nHint: .*?(?=\n\(Inputs came from seed)", lambda _: "\nHint: " + hint, text,
                                  flags=re.S)) from None
    text = "shapes " + ", ".join("x".join(map(str, c.extra["shape"])) for c in cases if "transposed" not in c.label)
    success("check_matmul", cases, worst, text + ("" if refused is None else "; refuses a transposed B clearly"))


def _swapped_grid(bad, M, N):
    """The grid's axes swapped: the blocks cover a cdiv(N, T) x cdiv(M, T) tiling instead of
    cdiv(M, T) x cdiv(N, T), so exactly the elements outside that rectangle are wrong."""
    rows = torch.arange(M)[:, None]
    cols = torch.arange(N)[None, :]
    for t in (16, 32, 64, 128):
        covered = (rows < t * math.ceil(N / t)) & (cols < t * math.ceil(M / t))
        if bool((~covered).any()) and torch.equal(bad, ~covered):
            return (f"the grid's axes are swapped: the blocks cover {t * math.ceil(N / t)} rows and "
                    f"{t * math.ceil(M / t)} columns, as if M and N were exchanged. The grid's first axis "
                    "runs along what its program ids index first: (cdiv(N, TILE), cdiv(M, TILE)) when blockIdx.x "
                    "gives the column (CUDA, Numba), (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)) when program_id(0) gives "
                    "the row (Triton).")
    return None


def _is_triton(fn) -> bool:
    """Does ``fn`` launch a Triton kernel it names (a global of its module)?"""
    code = getattr(fn, "__code__", None)
    glb = getattr(fn, "__globals__", {})
    names = code.co_names if code is not None else ()
    return any(type(glb.get(n)).__module__.startswith("triton") for n in names)


def matmul_spec(**fields) -> Spec:
    """The Spec of a topic of lesson 06 (matmul, matmul_fp16): the reference, the FLOPs and
    the shapes are the same for both; ``fields`` give the rest."""
    return Spec(
        lesson="06_matmul", reference=matmul_ref64, result_shape=lambda shape: shape[:2], flops=flops,
        main_shapes=lambda sizes: [tuple(s) for s in sizes.matmul_bench_shapes],
        sweep_shapes=lambda sizes: [(n, n, n) for n in sizes.matmul_sweep],
        sweep_label="M N K (square matrices, n = M = N = K)",
        check_shapes=lambda sizes: [tuple(s) for s in sizes.matmul_bench_check_shapes],
        **fields)


SPEC = matmul_spec(
    name="matmul", title="Matmul fp32", make_input=matmul_input,
    nbytes=nbytes_of(FLOAT, FLOAT),
    tolerance=spec_tolerance(torch.float32),
    checks={"check_matmul": check_matmul},
    # cuBLAS float32 with TF32 off: the exact fp32 product the SIMT kernels compute.
    baselines=[Baseline("torch", "mm", "torch.mm (cuBLAS), fp32, TF32 off",
                        lambda dynamic=False: _mm_fp32())],
    baseline_label="torch.mm fp32",
    targets=[Target("cuda", "torch", 0.7, shape=(4096, 4096, 4096))],
)


def _mm_fp32():
    torch.backends.cuda.matmul.allow_tf32 = False  # the course's fp32 kernels do exact fp32 FMAs
    return torch.mm
