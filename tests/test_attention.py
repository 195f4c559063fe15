"""Attention in every language and version against float64 on awkward shapes (N = 1, Nq != Nk,
tails, rows with no visible key), the backward's two designs, bad input, autograd (gradcheck,
opcheck), and the graders: right kernels written unusual ways are accepted, and each classic
mistake gets its diagnosis.

The graders' test kernels are written the way a learner writes them: one FlashAttention forward
and one backward in Triton, each with a ``MISTAKE`` switch, so every wrong kernel differs from
the right one by exactly one mistake.
"""
import math
import re

import pytest
import torch

import kernels
import kernels.ops  # the torch.library ops (torch.ops.course.attention)
import utils
from utils.topics import attention as spec

import triton
import triton.language as tl

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
OTHER_DEVICE = "meta" if utils.SIMULATE else "cpu"


# =======================================================================================
# The graders' test kernels
# =======================================================================================
# Mistakes of the forward (MISTAKE = one of these). A kernel may read a global only if it is a
# tl.constexpr: a GPU's Triton compiler refuses a plain int there.
RIGHT = tl.constexpr(0)
NO_SCALE = tl.constexpr(1)        # softmax(Q Kᵀ) V: the 1/√d forgotten
NO_RESCALE_ACC = tl.constexpr(2)  # acc not multiplied by alpha when the max grows
NO_RESCALE_SUM = tl.constexpr(3)  # l not multiplied by alpha
DIAG_EXCLUDED = tl.constexpr(4)   # causal mask j < i (the diagonal hidden)
DIAG_PLUS_ONE = tl.constexpr(5)   # causal mask j <= i + 1
NO_EMPTY_GUARD = tl.constexpr(6)  # exp(-inf - (-inf)) = NaN on rows that see no key
SAVE_MAX = tl.constexpr(7)        # L = m instead of m + log(l)
DROP_TAIL = tl.constexpr(8)       # loop over Nk // BLOCK_N tiles: the last partial tile dropped
FP16_ACC = tl.constexpr(9)        # the accumulator kept in float16
NO_LSE = tl.constexpr(10)         # L allocated but never written

FORWARD_MISTAKES = dict(no_scale=NO_SCALE, no_rescale_acc=NO_RESCALE_ACC, no_rescale_sum=NO_RESCALE_SUM,
                        diag_excluded=DIAG_EXCLUDED, diag_plus_one=DIAG_PLUS_ONE, no_empty_guard=NO_EMPTY_GUARD,
                        save_max=SAVE_MAX, drop_tail=DROP_TAIL, fp16_acc=FP16_ACC, no_lse=NO_LSE)


@triton.jit
def fa_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, l_ptr, Nq, Nk, scale,
                  D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
                  MISTAKE: tl.constexpr, REVERSE: tl.constexpr, EXP2: tl.constexpr):
    pid, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + bh * Nq * D + offs_m[:, None] * D + offs_d[None, :], mask=offs_m[:, None] < Nq, other=0.0)
    m = tl.full([BM], float("-inf"), tl.float32)
    l = tl.zeros([BM], tl.float32)
    if MISTAKE == FP16_ACC:
        acc = tl.zeros([BM, D], tl.float16)
    else:
        acc = tl.zeros([BM, D], tl.float32)
    if MISTAKE == DROP_TAIL:
        n_tiles = Nk // BN
    else:
        n_tiles = tl.cdiv(Nk, BN)
    for t in range(0, n_tiles):
        if REVERSE:
            j = n_tiles - 1 - t     # a different tile order: last tile first
        else:
            j = t
        offs_n = j * BN + tl.arange(0, BN)
        k = tl.load(k_ptr + bh * Nk * D + offs_n[:, None] * D + offs_d[None, :], mask=offs_n[:, None] < Nk, other=0.0)
        v = tl.load(v_ptr + bh * Nk * D + offs_n[:, None] * D + offs_d[None, :], mask=offs_n[:, None] < Nk, other=0.0)
        s = tl.dot(q, tl.trans(k))
        if MISTAKE != NO_SCALE:
            s = s * scale
        if EXP2:
            s = s * 1.4426950408889634      # scores in log2 units: exp(x) = exp2(x log2 e)
        keep = offs_n[None, :] < Nk
        if CAUSAL:
            if MISTAKE == DIAG_EXCLUDED:
                keep = keep & (offs_n[None, :] < offs_m[:, None] + Nk - Nq)
            elif MISTAKE == DIAG_PLUS_ONE:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + Nk - Nq + 1)
            else:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + Nk - Nq)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        if MISTAKE == NO_EMPTY_GUARD:
            shift = m_new
        else:
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        if EXP2:
            p = tl.exp2(s - shift[:, None])
            alpha = tl.exp2(m - shift)
        else:
            p = tl.exp(s - shift[:, None])
            alpha = tl.exp(m - shift)
        if MISTAKE == NO_RESCALE_SUM:
            l = l + tl.sum(p, 1)
        else:
            l = l * alpha + tl.sum(p, 1)
        pv = tl.dot(p.to(v.dtype), v)
        if MISTAKE == NO_RESCALE_ACC:
            acc = acc + pv
        elif MISTAKE == FP16_ACC:
            acc = (acc * alpha[:, None] + pv).to(tl.float16)
        else:
            acc = acc * alpha[:, None] + pv
        m = m_new
    if MISTAKE == NO_EMPTY_GUARD:
        o = acc / l[:, None]
        lse = m + tl.log(l)
    else:
        o = tl.where(l[:, None] > 0, acc / tl.where(l > 0, l, 1.0)[:, None], 0.0)
        lse = tl.where(l > 0, m + tl.log(tl.where(l > 0, l, 1.0)), float("inf"))
    if EXP2:
        lse = tl.where(l > 0, (m + tl.log2(tl.where(l > 0, l, 1.0))) * 0.6931471805599453, float("inf"))
    if MISTAKE == SAVE_MAX:
        lse = m
    tl.store(o_ptr + bh * Nq * D + offs_m[:, None] * D + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < Nq)
    if MISTAKE != NO_LSE:
        tl.store(l_ptr + bh * Nq + offs_m, lse, mask=offs_m < Nq)


def fa_forward(mistake=RIGHT, reverse=False, exp2=False, block=32):
    """A launcher fn(q, k, v, causal=False) -> (o, L) with the given mistake."""
    def fn(q, k, v, causal=False):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        B, H, nq, d = q.shape
        nk = k.shape[2]
        o = torch.empty_like(q)
        lse = torch.empty((B, H, nq), dtype=torch.float32, device=q.device)
        fa_fwd_kernel[(triton.cdiv(nq, block), B * H)](q, k, v, o, lse, nq, nk, 1.0 / math.sqrt(d), D=d, BM=block,
                                                      BN=block, CAUSAL=causal, MISTAKE=mistake.value, REVERSE=reverse,
                                                      EXP2=exp2)
        return o, lse
    return fn


# Mistakes of the backward.
NO_ATOMIC_DQ = tl.constexpr(1)    # dq += ... as a load and a store from every key tile: a race
NO_DELTA = tl.constexpr(2)        # dS = P ∘ dP, D forgotten
BWD_NO_SCALE = tl.constexpr(3)    # dq and dk without the 1/√d
BACKWARD_MISTAKES = dict(no_atomic_dq=NO_ATOMIC_DQ, no_delta=NO_DELTA, no_scale=BWD_NO_SCALE)


@triton.jit
def fa_bwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, l_ptr, do_ptr, dq_ptr, dk_ptr, dv_ptr, Nq, Nk, scale,
                  D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
                  MISTAKE: tl.constexpr):
    # One program per tile of keys: dK, dV in registers; dQ added into a float32 buffer.
    pid, bh = tl.program_id(0), tl.program_id(1)
    offs_n = pid * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    kv = bh * Nk * D + offs_n[:, None] * D + offs_d[None, :]
    k = tl.load(k_ptr + kv, mask=offs_n[:, None] < Nk, other=0.0)
    v = tl.load(v_ptr + kv, mask=offs_n[:, None] < Nk, other=0.0)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    for start in range(0, Nq, BM):
        offs_m = start + tl.arange(0, BM)
        qo = bh * Nq * D + offs_m[:, None] * D + offs_d[None, :]
        rows = offs_m[:, None] < Nq
        q = tl.load(q_ptr + qo, mask=rows, other=0.0)
        o = tl.load(o_ptr + qo, mask=rows, other=0.0)
        do = tl.load(do_ptr + qo, mask=rows, other=0.0)
        lse = tl.load(l_ptr + bh * Nq + offs_m, mask=offs_m < Nq, other=float("inf"))
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        if MISTAKE == NO_DELTA:
            delta = delta * 0.0
        s = tl.dot(q, tl.trans(k)) * scale
        p = tl.exp(s - lse[:, None])
        keep = offs_n[None, :] < Nk
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + Nk - Nq)
        p = tl.where(keep, p, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        if MISTAKE != BWD_NO_SCALE:
            ds = ds * scale
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
        dq_part = tl.dot(ds.to(k.dtype), k)
        dq_ptrs = dq_ptr + qo
        if MISTAKE == NO_ATOMIC_DQ:
            tl.store(dq_ptrs, tl.load(dq_ptrs, mask=rows, other=0.0) + dq_part, mask=rows)
        else:
            tl.atomic_add(dq_ptrs, dq_part, mask=rows)
    tl.store(dk_ptr + kv, dk.to(dk_ptr.dtype.element_ty), mask=offs_n[:, None] < Nk)
    tl.store(dv_ptr + kv, dv.to(dv_ptr.dtype.element_ty), mask=offs_n[:, None] < Nk)


def fa_backward(mistake=RIGHT, block=32):
    """A launcher fn(q, k, v, o, L, do, causal=False) -> (dq, dk, dv) with the given mistake."""
    def fn(q, k, v, o, lse, do, causal=False):
        q, k, v, o, lse, do = (t.contiguous() for t in (q, k, v, o, lse, do))
        B, H, nq, d = q.shape
        nk = k.shape[2]
        dq = torch.zeros((B, H, nq, d), dtype=torch.float32, device=q.device)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        fa_bwd_kernel[(triton.cdiv(nk, block), B * H)](q, k, v, o, lse, do, dq, dk, dv, nq, nk, 1.0 / math.sqrt(d),
                                                      D=d, BM=block, BN=block, CAUSAL=causal, MISTAKE=mistake.value)
        return dq.to(q.dtype), dk, dv
    return fn


# =======================================================================================
# Every version against float64
# =======================================================================================
def inputs(B, H, nq, nk, d, dtype, seed=0):
    q, k, v = spec.make_qkv(torch.Generator().manual_seed(seed), B, H, nq, nk, d, dtype)
    return q.to(utils.DEVICE), k.to(utils.DEVICE), v.to(utils.DEVICE)


def assert_forward(out, q, k, v, causal, dtype, lse=None):
    qc, kc, vc = (t.cpu() for t in (q, k, v))
    ref = spec.attention_ref64(qc, kc, vc, causal)
    tol = spec.output_tolerance(qc, kc, vc, causal, dtype)
    assert out.shape == q.shape and out.dtype in (dtype, F32) and out.device.type == utils.DEVICE.type
    got = out.detach().double().cpu()
    bad = ~((got - ref).abs() <= tol)
    assert not bool(bad.any()), f"{int(bad.sum())} wrong, max error {float((got - ref).abs().max()):.3g}"
    if lse is not None:
        lref = spec.attention_lse64(qc, kc, causal)
        lgot = lse.detach().double().cpu()
        fin = torch.isfinite(lref)
        assert torch.equal(torch.isinf(lgot), ~fin) and bool((lgot[~fin] > 0).all()), "L = +inf where no key"
        assert bool(((lgot - lref).abs()[fin] <= spec.lse_tolerance(qc, kc, causal, dtype)[fin]).all())


def assert_backward(bwd, q, k, v, causal, dtype, seed, label):
    """``bwd`` (a BACKWARDS launcher), given the float64 forward's o and L and a random dO,
    gives dq, dk and dv within spec.backward_tolerances of float64."""
    qc, kc, vc = (t.cpu() for t in (q, k, v))
    o = spec.attention_ref64(qc, kc, vc, causal).to(dtype).to(utils.DEVICE)
    lse = spec.attention_lse64(qc, kc, causal).float().to(utils.DEVICE)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(utils.DEVICE)
    got = bwd(q, k, v, o, lse, do, causal)
    refs = spec.attention_backward_ref64(qc, kc, vc, do.cpu(), causal)
    tols = spec.backward_tolerances(qc, kc, vc, do.cpu(), causal, dtype)
    for name, a, r, t in zip(("dq", "dk", "dv"), got, refs, tols):
        err = (a.double().cpu() - r).abs()
        assert bool((err <= t).all()), f"{label} {name}: max error {float(err.max()):.3g}"


#: (B, H, Nq, Nk, d, causal): one query and one key; Nq < Nk, neither a multiple of any tile;
#: Nq > Nk with the causal mask (the first 23 queries see no key).
SHAPES = [(1, 1, 1, 1, 16, False), (1, 1, 1, 1, 16, True), (1, 2, 17, 70, 32, True), (2, 1, 40, 17, 64, True)]
#: The same kinds, smaller: for the versions that run one query row per program (or per block).
ROW_SHAPES = [(1, 1, 1, 1, 16, False), (1, 1, 9, 70, 32, True), (1, 1, 12, 5, 16, True)]
TRITON_DTYPES = {"v1": (F16,), "v2": (F16,), "v3": (F16, BF16, F32)}
ROW_VERSIONS = ("v1", "v2")        # one program per query row (v1's softmax, v2)


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_triton_forward_matches_float64(version):
    from kernels.triton import attention as tri
    fwd = tri.FORWARDS[version]
    for dtype in TRITON_DTYPES[version]:
        for B, H, nq, nk, d, causal in (ROW_SHAPES if version in ROW_VERSIONS else SHAPES):
            q, k, v = inputs(B, H, nq, nk, d, dtype)
            o, lse = fwd(q, k, v, causal)
            assert_forward(o, q, k, v, causal, dtype, lse)
            assert torch.equal(kernels.get("attention", "triton", version)(q, k, v, causal), o)


def test_triton_forward_takes_views_any_d_and_3d():
    """Strided views (B, N, H, d) -> (B, H, N, d) without a copy, d not a power of two, and
    3-D (B, N, d) tensors as one head."""
    from kernels.triton import attention as tri
    g = torch.Generator().manual_seed(3)
    base = torch.randn(2, 33, 3, 3 * 24, generator=g).to(F16).to(utils.DEVICE)   # (B, N, H, 3 d), d = 24
    q, k, v = (base[..., i * 24:(i + 1) * 24].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    o = tri.attention(q, k, v, causal=True)
    assert_forward(o, q, k, v, True, F16)
    q3, k3, v3 = (t[:, 0] for t in (q, k, v))
    o3, lse3 = tri.attention_forward(q3, k3, v3)
    assert o3.shape == q3.shape and lse3.shape == q3.shape[:2]
    assert_forward(o3.unsqueeze(1), q3.unsqueeze(1), k3.unsqueeze(1), v3.unsqueeze(1), False, F16)


@pytest.mark.parametrize("design", ["separate", "atomic"])
def test_triton_backward_matches_float64(design):
    from kernels.triton import attention as tri
    bwd = tri.BACKWARDS[design][1]
    for dtype, (B, H, nq, nk, d, causal) in [(F16, (1, 2, 17, 70, 32, True)), (F32, (2, 1, 40, 17, 16, True)),
                                             (BF16, (1, 1, 33, 33, 64, False))]:
        q, k, v = inputs(B, H, nq, nk, d, dtype)
        assert_backward(bwd, q, k, v, causal, dtype, seed=5, label=f"{design} {dtype}")


def test_triton_bad_input_is_refused_clearly():
    from kernels.triton import attention as tri
    q, k, v = inputs(1, 1, 5, 5, 16, F16)
    with pytest.raises(TypeError, match="one dtype"):
        tri.attention(q, k.float(), v)
    with pytest.raises(TypeError, match="float32 or float16 or bfloat16"):
        tri.attention(q.double(), k.double(), v.double().int())
    with pytest.raises(ValueError, match="4-D"):
        tri.attention(q[0, 0, 0], k[0, 0, 0], v[0, 0, 0])
    with pytest.raises(ValueError, match="same B, H and d"):
        tri.attention(q, k[..., :8], v[..., :8])
    with pytest.raises(ValueError, match="utils.DEVICE"):
        tri.attention(q.to(OTHER_DEVICE), k.to(OTHER_DEVICE), v.to(OTHER_DEVICE))
    with pytest.raises(ValueError, match="larger than"):
        big = torch.zeros(1, 1, 2, 300, dtype=F16, device=utils.DEVICE)
        tri.attention(big, big, big)
    # Empty: no keys (every query sees nothing: o = 0, L = +inf), no queries.
    o, lse = tri.attention_forward(q, k[:, :, :0], v[:, :, :0])
    assert bool((o == 0).all()) and bool(torch.isinf(lse).all())
    assert tri.attention(q[:, :, :0], k, v).shape == (1, 1, 0, 16)


def test_triton_autograd_function_and_op_gradcheck():
    """float64, small: the autograd.Function and the torch.library op (kernels/ops.py) against
    finite differences, through the Triton kernels (the interpreter in simulation)."""
    from kernels.triton import attention as tri
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 5, 16, generator=g, dtype=torch.float64).to(utils.DEVICE).requires_grad_()
               for _ in range(3))
    # fast_mode: the Jacobian along random directions, a few calls instead of one per element.
    assert torch.autograd.gradcheck(lambda a, b, c: tri.AttentionFunction.apply(a, b, c, True), (q, k, v),
                                    eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=True)
    assert torch.autograd.gradcheck(lambda a, b, c: kernels.ops.attention_op(a, b, c, False), (q, k, v),
                                    eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=True)


def test_triton_op_passes_opcheck():
    q, k, v = inputs(1, 2, 17, 17, 16, F32)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.course.attention.default, (q, k, v, True))


@pytest.mark.parametrize("lang", ["cuda", "numba"])
@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_cuda_and_numba_forward_match_float64(lang, version):
    """float32 for the SIMT versions; CUDA v3 (wmma) in float16, one head dimension (each is a
    kernel of its own, compiled once). Numba runs in a Python thread per CUDA thread in
    simulation: its shapes are the small ones."""
    fwd = kernels.module("attention", lang).FORWARDS[version]
    wmma = lang == "cuda" and version == "v3"
    dtype = F16 if wmma else F32
    shapes = ROW_SHAPES if (lang == "numba" or version != "v3") else SHAPES
    for B, H, nq, nk, d, causal in shapes:
        q, k, v = inputs(B, H, nq, nk, 32 if wmma else d, dtype)
        o, lse = fwd(q, k, v, causal)
        assert_forward(o, q, k, v, causal, dtype, lse)


@pytest.mark.parametrize("lang", ["cuda", "numba"])
@pytest.mark.parametrize("design", ["separate", "atomic"])
def test_cuda_and_numba_backward_match_float64(lang, design):
    bwd = kernels.module("attention", lang).BACKWARDS[design][1]
    for B, H, nq, nk, d, causal in [(1, 1, 9, 20, 32, True), (1, 2, 12, 5, 16, True)]:
        q, k, v = inputs(B, H, nq, nk, d, F32)
        assert_backward(bwd, q, k, v, causal, F32, seed=7, label=f"{lang} {design}")


def test_cuda_wmma_refuses_what_it_cannot_take():
    from kernels.cuda import attention as cu
    q, k, v = inputs(1, 1, 5, 5, 48, F16)
    with pytest.raises(ValueError, match="d = 48 is not supported"):
        cu.attention(q, k, v)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        cu.attention(q.float(), k.float(), v.float())
    with pytest.raises(TypeError, match="one dtype"):
        cu.attention(q, k.to(BF16), v)
    with pytest.raises(ValueError, match="larger than"):
        cu.attention_rowwise(*inputs(1, 1, 3, 3, 160, F32))


# =======================================================================================
# The graders
# =======================================================================================
def rejects(grader, fn, *patterns, **kw):
    with pytest.raises(utils.GradingError) as info:
        grader(fn, **kw)
    msg = str(info.value)
    for p in patterns:
        assert re.search(p, msg, re.IGNORECASE | re.DOTALL), f"{p!r} not in:\n{msg}"
    return msg


def accepts(grader, fn, capsys, **kw):
    grader(fn, **kw)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(grader.__name__ + ": correct on"), out


def test_accepts_exp2_kernel_that_visits_tiles_in_reverse(capsys):
    """Right, written unusually: exp2 with log2(e) folded into the scale (L converted back to
    natural log), and the last tile of keys first. With the causal mask a row's first tile may
    then hide every key, which a right kernel survives (its shift stays 0 while the max is -inf)."""
    accepts(utils.check_attention, fa_forward(reverse=True, exp2=True), capsys, causal=True, dtype=F16, lse=True)


@pytest.mark.parametrize("mistake,causal,patterns", [
    ("no_scale", False, [r"without the 1/√d scale"]),
    ("no_rescale_acc", False, [r"accumulator is not rescaled"]),
    ("no_rescale_sum", False, [r"running sum is not rescaled"]),
    ("diag_excluded", True, [r"off by one on the diagonal", r"excludes the diagonal"]),
    ("diag_plus_one", True, [r"off by one on the diagonal", r"one key too many"]),
    ("no_empty_guard", True, [r"NaN on rows", r"see no key", r"m == -inf"]),
    ("save_max", False, [r"row maximum", r"m \+ log\(l\)"]),
    ("drop_tail", False, [r"cdiv\(Nk, BLOCK_N\)"]),
    ("fp16_acc", False, [r"accumulated in", r"float32"]),
    ("no_lse", False, [r"of L (was|were) never written", r"L not saved"]),
])
def test_forward_mistake_is_diagnosed(mistake, causal, patterns):
    rejects(utils.check_attention, fa_forward(FORWARD_MISTAKES[mistake]), *patterns, causal=causal, dtype=F16,
            lse=True)


def test_lse_required_but_not_returned():
    rejects(utils.check_attention, lambda q, k, v: fa_forward()(q, k, v)[0], r"returned only o", r"\(o, L\)",
            lse=True, dtype=F16)


def test_causal_check_needs_a_causal_argument():
    rejects(utils.check_attention, lambda q, k, v: fa_forward()(q, k, v), r"no `causal` argument", causal=True)


def test_rows_never_written_name_the_grid():
    def grid_rounded_down(q, k, v):
        B, H, nq, d = q.shape
        o, lse = fa_forward()(q[:, :, :(nq // 32) * 32], k, v)
        out = torch.empty_like(q)
        out[:, :, :o.shape[2]] = o
        return out
    rejects(utils.check_attention, grid_rounded_down, r"never written", r"cdiv\(Nq, BLOCK_M\)", dtype=F16)


def test_accepts_backward_with_atomic_dq(capsys):
    accepts(utils.check_attention_backward, fa_backward(), capsys, causal=True, dtype=F16)


@pytest.mark.parametrize("mistake,patterns", [
    ("no_atomic_dq", [r"race", r"atomic"]),
    ("no_delta", [r"D is missing"]),
    ("no_scale", [r"√d too large"]),
])
def test_backward_mistake_is_diagnosed(mistake, patterns):
    if mistake == "no_atomic_dq" and not utils.SIMULATE:
        pytest.skip("on a GPU a lost update shows only when programs happen to collide")
    rejects(utils.check_attention_backward, fa_backward(BACKWARD_MISTAKES[mistake]), *patterns, causal=True,
            dtype=F16)


def test_graders_report_stubs():
    def stub(*args, **kwargs):
        raise NotImplementedError("not solved yet: write the kernel")
    rejects(utils.check_attention, stub, r"^not solved yet: write the kernel")
    rejects(utils.check_attention_backward, stub, r"^not solved yet: write the kernel")


# =======================================================================================
# The benchmark's own pieces: targets per configuration, the plot
# =======================================================================================
def _row(base, lang, version, tflops, dtype="float16", causal=False, kind="forward", shape=(4, 32, 4096, 64),
         reference=False, sweep=False):
    from benchmarks.attention import variant_name
    return dict(topic="attention", variant=variant_name(base, dtype, causal, kind), lang=lang, version=version,
                reference=reference, shape=list(shape), dtype=dtype, causal=causal, sweep=sweep, tflops=tflops,
                **{"pass": kind})


def test_attention_targets_are_evaluated_per_dtype_mask_and_pass():
    from benchmarks import report
    rows = [_row("triton v3", "triton", "v3", 330.0, reference=True), _row("SDPA flash", "torch", "flash", 300.0),
            _row("SDPA default", "torch", "default", 440.0),
            _row("triton v3", "triton", "v3", 250.0, causal=True, reference=True),
            _row("SDPA flash", "torch", "flash", 280.0, causal=True)]
    out = [t for t in report.evaluate_targets(rows, ["attention"]) if t["shape"] == [4, 32, 4096, 64]]
    full = next(t for t in out if t["dtype"] == "float16" and not t["causal"] and t["pass"] == "forward"
                and t["versus"] == "SDPA flash" and t["lang"] == "triton")
    assert full["value"] == pytest.approx(1.1) and full["met"] is True and full["variant"].startswith("triton v3")
    causal = next(t for t in out if t["causal"] and t["pass"] == "forward" and t["dtype"] == "float16"
                  and t["lang"] == "triton" and t["versus"] == "SDPA flash")
    assert causal["value"] == pytest.approx(250 / 280) and causal["met"] is False
    default = next(t for t in out if t["versus"] == "SDPA default")
    assert default["value"] == pytest.approx(0.75) and default["goal"] == ">= 90% of SDPA default"
    unmeasured = [t for t in out if t["dtype"] == "bfloat16"]
    assert unmeasured and all(t["value"] is None and t["met"] is None for t in unmeasured)


def test_attention_plot_of_the_sweep(tmp_path):
    from benchmarks.attention import plot
    rows = [_row(b, "torch" if b.startswith("SDPA") else "triton", "x", tf * n / 4096, causal=c, kind=k,
                 shape=(16384 // n, 32, n, 64), sweep=True)
            for b, tf in (("triton v3", 300.0), ("SDPA flash", 280.0)) for n in (1024, 4096)
            for c in (False, True) for k in ("forward", "forward+backward")]
    path = plot(dict(rows=rows, machine=dict(gpu="test GPU"), date="2026-01-01"), tmp_path, "h100")
    assert path.exists() and path.stat().st_size > 10_000
    assert plot(dict(rows=[]), tmp_path, "none") is None


def test_triton_autotuning_candidates_by_head_dimension():
    from kernels.triton import attention as tri
    configs = tri._configs(tri.FWD_CANDIDATES)
    for d in (16, 64, 128):
        picked = tri._prune_by_head_dim(configs, {}, BLOCK_D=d)
        want = tri.FWD_CANDIDATES[64 if d <= 64 else 128]
        assert sorted((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in picked) == \
            sorted(want)
