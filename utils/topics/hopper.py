"""Hopper's machinery (lesson 12): TMA tiles completed through mbarriers, one wgmma tile, and
C = A @ B^T built from them (bfloat16 A (M, K) and B (N, K), both K-major as nn.Linear keeps x
and its weight; float32 sums). The kernels include ``kernels/cuda/hopper.h``; the
benchmarks measure ``kernels/{cuda,triton}/hopper.py`` against cuBLAS.

Three graders, one per exercise:

    check_tma_transpose(fn)   fn(x) -> x.T for bfloat16 x (R, C): TMA boxes through shared memory
    check_wgmma_tile(fn)      fn(a, b) -> a @ b.T for M, N, K <= 64: one wgmma tile
    check_hopper_gemm(fn)     fn(a, b) -> a @ b.T for any shape: the pipelined GEMM (and the reference)

Each names the Hopper mistakes by what the emulator reports (a phase that never completes, a
swizzle the TMA copy and the descriptor disagree on, a stage overwritten while a wgmma reads it,
half a warpgroup, ...) and, on a GPU, by what the GPU did (a trap from hopper.h's mbarrier
time limit, a misaligned address) or by what the wrong values look like (the coordinates of a
box swapped, the k-steps of a descriptor not advanced, scale_d, the accumulator layout).
"""
from __future__ import annotations

import re

import torch

from kernels.frames.hopper import hopper_torch

from ..grading import Case, Grader, GradingError, Output, grade, guarded_input, success
from ._spec import Baseline, Spec, Target, generator
from .matmul import UNIT_ROUNDOFF, accumulation_atol, flops

BF16 = 2     # bytes per bfloat16
BOX = 64     # the exercises' TMA box and wgmma tile: 64 x 64 (64 bfloat16 = one 128-byte row)
KSTEP = 16   # K of one wgmma


def hopper_ref64(a, b):
    """C = A @ B^T in float64."""
    return a.double() @ b.double().T


def transpose_ref64(x):
    return x.double().T.contiguous()


def hopper_input(shape, seed=0, device=None):
    """A (M, K) and B (N, K) in bfloat16, entries in [-1, 1): sums of K products near sqrt(K)."""
    from runtime.config import DEVICE
    device = device or DEVICE
    g = generator(seed, device)
    M, N, K = shape
    a = (2 * torch.rand(M, K, generator=g, device=device) - 1).to(torch.bfloat16)
    b = (2 * torch.rand(N, K, generator=g, device=device) - 1).to(torch.bfloat16)
    return a, b


def nbytes(shape) -> int:
    """A and B read once, C written once, all bfloat16."""
    M, N, K = shape
    return BF16 * (M * K + N * K + M * N)


def hopper_flops(shape) -> int:
    M, N, K = shape
    return flops((M, N, K))


def tolerance(a, b, out_dtype=torch.bfloat16) -> dict:
    """float32 sums of exact bfloat16 products (atol), and C rounded once to bfloat16 (rtol)
    when it is returned in bfloat16."""
    atol = accumulation_atol(a.double(), b.double().T) if a.numel() and b.numel() else 0.0
    rtol = 2 * UNIT_ROUNDOFF[torch.bfloat16] if out_dtype == torch.bfloat16 else 2 * UNIT_ROUNDOFF[torch.float32]
    return dict(atol=atol, rtol=rtol)


def spec_tolerance(inputs, ref):
    t = tolerance(inputs[0], inputs[1])
    return t["atol"] + t["rtol"] * ref.abs()


# ----------------------------------------------------------------------------------------
# What the emulator and the GPU report, turned into the cause
# ----------------------------------------------------------------------------------------
_TX = ("the bytes announced by mbarrier_arrive_expect_tx must be the bytes the TMA loads of that phase bring: "
       "the whole box of each load, rows x columns x sizeof(element), even where the box hangs over the edge "
       "of the tensor (TMA fills the outside with zeros and counts those bytes too).")
_PHASE = ("a wait names the parity of the phase it waits for, and the parity flips each time the barrier "
          "completes: a stage used for the n-th time (n = k_tile / STAGES) waits for parity n % 2; on a barrier "
          "that never completed, a wait for parity 1 returns at once.")
_RELEASE = ("the producer must wait until the consumers released a stage (mbarrier_wait(&empty[s], phase ^ 1)) "
            "before a TMA load overwrites it, and the consumers release it (mbarrier_arrive(&empty[s])) only "
            "after wgmma_wait<0>() says their wgmma finished reading it.")
_NO_RELEASE = ("the producer waits for a stage the consumers never release: after the wgmma of a stage is "
               "waited for, every consumer thread arrives on its empty barrier (initialised with 128 arrivals).")
_SWIZZLE = ("the wgmma descriptor must describe the tile as the TMA copy wrote it: smem_descriptor(tile, "
            "SWIZZLE_128B) for a tensor map made with swizzle=128 (and no other stride or swizzle).")
_WARPGROUP = ("a wgmma is issued by a whole warpgroup, 128 threads in step (threads 128 g .. 128 g + 127): "
              "launch a multiple of 128 threads and let every thread of the warpgroup reach every wgmma.")
_WAIT = ("wgmma is asynchronous: its accumulators are undefined until wgmma_commit() and wgmma_wait<0>() "
         "(after every wgmma, before the accumulators are read or the tiles reused).")
_TMA_WAIT = ("the tile may be read only after the mbarrier says the TMA load landed: every thread waits "
             "(mbarrier_wait(&bar, phase)) before reading it.")
_ALIGN = ("a TMA tile in shared memory must be 128-byte aligned, 1024-byte aligned for the 128-byte swizzle: "
          "__shared__ alignas(1024) ..., or round a dynamic buffer's address up.")
_GPU_STOP = ("on a GPU, hopper.h stops a kernel whose mbarrier wait lasts more than 2 s (a phase that never "
             "completes: announced bytes that are not the boxes' bytes, an arrival missing, a wait for the "
             "wrong phase, a stage never released) and a block that is not whole warpgroups issuing a wgmma; "
             "the host then sees this error and the process's CUDA context is lost: restart the notebook's "
             "kernel. Run the check in simulation (COURSE_SIMULATE=1) for the report that names the cause.")


_START = ("the producer's first wait on a stage's empty barrier must pass at once: wait for parity 1 (the phase "
          "\"before the first\", complete from the start), mbarrier_wait(&empty[s], phase ^ 1); waiting for phase 0 "
          "waits for the consumers to release a stage they never received.")
_WAITS = re.compile(r"waits for phase (\d+) \(parity \d\) with (\d+) of its (\d+) arrivals missing")


def _explain_hang(low: str) -> str | None:
    """The cause of a block whose mbarrier waits never complete (the emulator's report lists
    each barrier waited on: its phase, and the arrivals and bytes missing)."""
    waits = [tuple(int(v) for v in m) for m in _WAITS.findall(low)]
    if "skipped phase" in low:
        return _PHASE
    if "transaction bytes missing" in low or "more than announced" in low:
        return _TX
    released = [w for w in waits if w[2] > 1 and w[1] == w[2]]   # a barrier of many arrivals: none came
    if released and any(w[0] == 0 for w in released) and any(w[0] == 0 and w[2] == 1 for w in waits):
        return _START
    if released:
        return _NO_RELEASE
    return _TX + " " + _PHASE


def race_on_store(text: str) -> str | None:
    """Two threads storing one element of the output: the store's index, not a missing barrier."""
    if "c_ptr" in text or "out_ptr" in text:
        return ("two threads store the same element: the store's index is wrong. d[i] of thread t (warp t / 32, "
                "lane t % 32) is row 16 * warp + lane / 4 + 8 * (i / 2 % 2), column 8 * (i / 4) + 2 * (lane % 4) + "
                "i % 2 of the accumulator layout, at c_ptr[row * N + col]; a transposed element lands on others.")
    return None


def explain_hopper(case, text: str) -> str | None:
    """The cause of an emulator report or a GPU error of Hopper code, or None (the harness's)."""
    low = text.lower()
    if "never completes" in low:
        return _explain_hang(low)
    if "one arrival more" in low:
        return _RELEASE
    if "wgmma" in low and "never waited" in low:
        return _WAIT
    if "transaction" in low or "bytes than announced" in low or "more bytes" in low or "expect_tx" in low:
        return _TX
    if "overwrit" in low or "still reads" in low:
        return _RELEASE
    if "twice for the same phase" in low or "phase bit" in low:
        return _PHASE
    if "swizzle" in low or "8-row stride" in low or "stride byte offset" in low:
        return _SWIZZLE
    if "warpgroup" in low:
        return _WARPGROUP
    if "tma" in low and "never waited" in low:
        return _TMA_WAIT
    if "aligned" in low:
        return _ALIGN
    if "phase" in low:
        return _TX + " " + _PHASE
    if "unspecified launch failure" in low or "illegal instruction" in low:
        return _GPU_STOP
    return None


# ----------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------
def _draw(g: Grader, shape):
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g.gen))
    return hopper_input(shape, seed=seed, device="cpu")


def _bf16_inputs(*values):
    def make():
        pairs = [guarded_input(v, torch.bfloat16) for v in values]
        return tuple(p[0] for p in pairs), [p[1] for p in pairs]
    return make


def _refused(fn, make, words) -> str | None:
    """The first line of the error ``fn`` raised on these inputs when it names one of ``words``
    (a clear refusal), else None (it computed something: the case is graded)."""
    try:
        inputs, _ = make()
        fn(*inputs)
    except GradingError:
        raise
    except Exception as e:
        if any(w in str(e).lower() for w in words):
            return str(e).splitlines()[0]
    return None


_ROW_WORDS = ("16 bytes", "16-byte", "multiple of 16", "multiple of 8")


def _odd_k_note(refused, what: str) -> str:
    return "" if refused is None else f"; {what} (rows TMA cannot address) refused with a clear error"


# ----------------------------------------------------------------------------------------
# Exercise 1: a TMA box through an mbarrier (a transpose)
# ----------------------------------------------------------------------------------------
def check_tma_transpose(fn, *, seed=None):
    """``fn(x)`` must return ``x.T`` (a new (C, R) bfloat16 tensor) for bfloat16 x (R, C), with
    each 64 x 64 box of x loaded by TMA into shared memory and written out transposed.

    The shapes have edges in both directions (boxes hanging over the tensor). One more input
    has rows of 13 elements (26 bytes), which TMA cannot address: the function may transpose it
    anyway or refuse it with an error that names the 16 bytes."""
    from runtime.config import SIZES
    g = Grader("check_tma_transpose", fn, seed)

    def case_of(shape):
        x = (2 * torch.rand(*shape, generator=g.gen) - 1).to(torch.bfloat16)
        return Case(f"x of {shape[0]} x {shape[1]} (bfloat16)", (x,), transpose_ref64(x), make=_bf16_inputs(x),
                    extra=dict(shape=tuple(shape)))

    cases = [case_of(s) for s in SIZES.hopper_transpose_shapes]
    odd = case_of((5, 13))
    refused = _refused(fn, odd.make, _ROW_WORDS)
    if refused is None:
        cases.append(odd)

    def diagnose(run, got, bad):
        R, C = run.case.extra["shape"]
        x = run.case.values[0].double()
        if not bool(torch.isfinite(got).all()):
            return _TMA_WAIT + " (NaN is what shared memory holds before anything lands there.)"
        # out[c, r] comes from box (r // BOX, c // BOX): right on the diagonal boxes only
        bi = (torch.arange(C)[:, None] // BOX).expand(C, R)
        bj = (torch.arange(R)[None, :] // BOX).expand(C, R)
        diag = bi == bj
        if bool(bad.any()) and not bool((bad & diag).any()) and bool((~diag).any()):
            return ("right on the boxes of the diagonal only: tma_load_2d takes the box's column first, then its "
                    "row: tma_load_2d(tile, x_map, col0, row0, &bar).")
        if got.shape == x.shape[::-1] and R == C and torch.equal(got, x):
            return "the output is x itself, not its transpose: out[c][r] = x[r][c]."
        return ("check the indices: element (r, c) of the box is tile[r * BOX + c] (x's row row0 + r, column "
                "col0 + c), and it goes to out[(col0 + c) * R + row0 + r].")

    def outputs(case):
        R, C = case.extra["shape"]
        return [Output("out", case.expected, shape=(C, R), dtypes=(torch.bfloat16,), tol=dict(atol=0.0, rtol=0.0),
                       noun="the output", diagnose=diagnose)]

    worst = grade(g, cases, outputs, inputs=("x",), explain_error=explain_hopper, race_report_hint=race_on_store,
                  guard_hint="is every store inside the output (row0 + r < R and col0 + c < C)? A box that hangs "
                             "over the tensor's edge holds zeros there, which must not be written out.")
    text = ", ".join(f"{r}x{c}" for r, c in (cs.extra["shape"] for cs in cases))
    success("check_tma_transpose", cases, worst, f"shapes {text}" + _odd_k_note(refused, "5x13"))


# ----------------------------------------------------------------------------------------
# Exercises 2 and 3: one wgmma tile, and the whole product
# ----------------------------------------------------------------------------------------
def _alternatives(a, b, K):
    """What the usual wgmma mistakes compute instead of A @ B^T (float64), with their cause."""
    a, b = a.double(), b.double()
    out = []
    steps = -(-K // KSTEP)
    if steps > 1:
        last = (steps - 1) * KSTEP
        out.append((a[:, last:] @ b[:, last:].T,
                    "only the last k-step of 16 is in C: scale_d = 0 replaces the accumulators, so only the first "
                    "wgmma of a tile may pass 0 (start from zero); the others pass 1 (accumulate)."))
        out.append((a[:, :KSTEP] @ b[:, :KSTEP].T,
                    "only the first k-step of 16 is in C: every k-step must run, each on the next 16 columns "
                    "of K (the descriptors + 2 per step)."))
    # k-steps advanced 16 bytes (+1) instead of 32 (+2): step s reads 8-column chunks s and s + 1
    weights = torch.zeros(K, dtype=torch.float64)
    for k0 in range(0, K, BOX):
        for s in range(BOX // KSTEP):
            weights[min(k0 + 8 * s, K):min(k0 + 8 * s + 16, k0 + BOX, K)] += 1
    if steps > 1:
        out.append(((a * weights) @ b.T,
                    "the k-steps overlap: a k-step of 16 bfloat16 is 32 bytes, + 2 in the descriptor's 16-byte "
                    "units (da + 2 * ks), not + 1."))
    return out


def _layout_alternatives(a, b):
    """The accumulators stored with the rows and columns of the fragment exchanged, or C^T."""
    c = hopper_ref64(a, b)
    return [(c.T, "C is stored transposed: d[i] of thread t is row 16 * warp + lane / 4 + 8 * (i / 2 % 2), column "
                  "8 * (i / 4) + 2 * (lane % 4) + i % 2, and C[row, col] is c_ptr[row * N + col].")]


def _close(got, alt, tol):
    return got.shape == alt.shape and bool(((got - alt).abs() <= tol["atol"] + 1e-2 * alt.abs()).all())


def _gemm_diagnose(tile: bool):
    def diagnose(run, got, bad):
        a, b = run.case.values
        M, N, K = run.case.extra["shape"]
        tol = run.case.extra["tol"]
        if not bool(torch.isfinite(got).all()):
            return _WAIT + " (Or a tile was read before its TMA load landed: " + _TMA_WAIT + ")"
        for alt, text in _alternatives(a, b, min(K, BOX) if tile else K):
            if _close(got, alt, tol) and K > KSTEP:
                return text
        if M == N:
            for alt, text in _layout_alternatives(a, b):
                if _close(got, alt, tol):
                    return text
        if not tile and K > BOX:
            full = (K // BOX) * BOX
            if full < K and _close(got, hopper_ref64(a[:, :full], b[:, :full]), tol):
                return (f"the last k-tile ({K - full} columns of K) is missing: the loop runs over cdiv(K, 64) "
                        "k-tiles; TMA fills the part of the last box past K with zeros.")
            if _close(got, hopper_ref64(a[:, :BOX], b[:, :BOX]), tol):
                return "only the first k-tile is in C: every k-tile's loads and wgmma must run."
        rows, cols = bad.any(dim=1), bad.any(dim=0)
        return ("check the accumulator layout of the store (d[i] of thread t is C[16 * (t / 32) + (t % 32) / 4 + "
                "8 * (i / 2 % 2)][8 * (i / 4) + 2 * (t % 4) + i % 2]), the descriptors (smem_descriptor(tile, "
                "SWIZZLE_128B), + 2 per k-step) and the boxes' coordinates (column first). "
                f"{int(rows.sum())} of {M} rows and {int(cols.sum())} of {N} columns are wrong.")
    return diagnose


def _grade_gemm(name, fn, seed, shapes, *, tile: bool, dtypes):
    g = Grader(name, fn, seed)

    def case_of(shape, note=""):
        a, b = _draw(g, shape)
        M, N, K = shape
        return Case(f"A {M}x{K} @ B {N}x{K}^T (bfloat16{note})", (a, b), hopper_ref64(a, b),
                    make=_bf16_inputs(a, b), extra=dict(shape=tuple(shape), tol=tolerance(a, b, dtypes[-1])))

    cases = [case_of(s) for s in shapes]
    odd_shape = (7, 9, 20) if tile else (33, 40, 100)
    odd = case_of(odd_shape, ", K not a multiple of 8")
    refused = _refused(fn, odd.make, _ROW_WORDS)
    if refused is None:
        cases.append(odd)

    def outputs(case):
        M, N, K = case.extra["shape"]
        return [Output("c", case.expected, shape=(M, N), dtypes=dtypes, tol=case.extra["tol"], noun="C",
                       diagnose=_gemm_diagnose(tile))]

    worst = grade(g, cases, outputs, inputs=("a", "b"), explain_error=explain_hopper, race_report_hint=race_on_store,
                  guard_hint="is every store of the accumulators inside C (row < M and col < N)? A tile that hangs "
                             "over the edge computes rows and columns C does not have.")
    text = ", ".join("x".join(map(str, cs.extra["shape"])) for cs in cases)
    success(name, cases, worst, f"shapes {text}" + _odd_k_note(refused, f"K = {odd_shape[2]}"))


def check_wgmma_tile(fn, *, seed=None):
    """``fn(a, b)`` must return C = A @ B^T (float32, (M, N)) for bfloat16 A (M, K) and B (N, K)
    with M, N, K <= 64: one 64 x 64 wgmma tile whose operands TMA loaded, stored inside C only."""
    from runtime.config import SIZES
    _grade_gemm("check_wgmma_tile", fn, seed, [tuple(s) for s in SIZES.hopper_tile_shapes], tile=True,
                dtypes=(torch.float32, torch.bfloat16))


def check_hopper_gemm(fn, *, seed=None):
    """``fn(a, b)`` must return C = A @ B^T for bfloat16 A (M, K) and B (N, K) of any shape: float32
    sums of the exact bfloat16 products, C in float32 or bfloat16 (rounded once, as nn.Linear
    returns it). The shapes have tails in M, N and K, and K of one to several 64-column tiles (an
    odd number: a two-stage ring goes round with its phases flipping); one more has K = 100, not a
    multiple of 8: computed, or refused with an error that names the 16 bytes of a TMA row."""
    from runtime.config import SIZES
    _grade_gemm("check_hopper_gemm", fn, seed, [tuple(s) for s in SIZES.hopper_grader_shapes], tile=False,
                dtypes=(torch.float32, torch.bfloat16))


def _cutlass():
    """CUTLASS's SM90 GEMM (kernels/cuda/hopper_cutlass.cu, CuTe's collectives) as baselines, on a
    GPU: nvcc builds it, and only a Hopper GPU runs its PTX (``kernels.cuda.hopper.cutlass_gemm``)."""
    from runtime.config import SIMULATE
    if SIMULATE:
        return []
    from kernels.cuda.hopper import cutlass_gemm
    return [Baseline(f"CUTLASS {c}x1", f"cutlass{c}", f"CUTLASS 4.2's SM90 GEMM (CuTe's collectives): TMA, wgmma, "
                     f"warp-specialised cooperative, persistent, {c} x 1 clusters",
                     lambda dynamic=False, c=c: (lambda a, b: cutlass_gemm(a, b, cluster=c))) for c in (2, 1)]


SPEC = Spec(
    name="hopper", title="GEMM bf16 on Hopper (TMA + wgmma)", lesson="12_hopper", reference=hopper_ref64,
    make_input=hopper_input, nbytes=nbytes, flops=hopper_flops, tolerance=spec_tolerance,
    checks={"check_tma_transpose": check_tma_transpose, "check_wgmma_tile": check_wgmma_tile,
            "check_hopper_gemm": check_hopper_gemm},
    baselines=[Baseline("torch", "linear", "F.linear (cuBLAS), bf16 in and out, fp32 accumulation",
                        lambda dynamic=False: hopper_torch)] + _cutlass(),
    baseline_label="cuBLAS bf16",
    targets=[Target("cuda", "torch", 0.9, shape=(4096, 4096, 4096),
                    if_missed="v5 (persistent, grouped tile order) reached 0.84x cuBLAS at 4096^3 and 0.96x at "
                              "8192^3 on the H200 (results/tune/h200-hopper-tune.json): at 4096^3 its 512 tiles of "
                              "128 x 256 are 3.9 waves of 132 SMs and each tile only 64 k-tiles deep. Not in the "
                              "ladder: clusters sharing B's tiles by TMA multicast (the emulator does not model "
                              "clusters; CUTLASS's kernel in 1x1 and 2x1 clusters is the record's CUTLASS rows), "
                              "a ping-pong of two consumer tiles"),
             Target("cuda", "torch", 0.9, shape=(8192, 8192, 8192)),
             Target("triton", "torch", 0.9, shape=(4096, 4096, 4096)),
             Target("triton", "torch", 0.9, shape=(8192, 8192, 8192))],
    out_dtypes=(torch.bfloat16, torch.float32),
    result_shape=lambda shape: shape[:2],
    main_shapes=lambda sizes: [tuple(s) for s in sizes.hopper_bench_shapes],
    sweep_shapes=lambda sizes: [(n, n, n) for n in sizes.hopper_sweep],
    check_shapes=lambda sizes: [tuple(s) for s in sizes.hopper_bench_check_shapes],
    sweep_label="M N K (square matrices, n = M = N = K)",
)
