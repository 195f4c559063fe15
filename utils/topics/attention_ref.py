"""Attention's float64 references, tolerances and inputs (lesson 10): what every result is
compared with, how far a right kernel may be from it in each dtype, and the inputs that expose
the usual mistakes. The graders are in ``attention_grade.py``, the spec in ``attention.py``.
"""
from __future__ import annotations

import math

import torch

from ._spec import generator

#: Unit roundoff of each input dtype (half an ulp at 1).
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
EPS32 = 2.0 ** -24
#: Half the smallest subnormal of each dtype: what rounding a tiny value to it can lose.
UNDERFLOW = {torch.float32: 2.0 ** -150, torch.float16: 2.0 ** -25, torch.bfloat16: 2.0 ** -134}
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
#: Head dimensions the course's tensor-core kernels take (tl.dot and wmma need multiples of 16).
HEAD_DIMS = (16, 32, 64, 128)
#: The dtype codes of a benchmark configuration (``BenchConfig.dtype``).
BENCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}



# ----------------------------------------------------------------------------------------
# The float64 reference
# ----------------------------------------------------------------------------------------
def scale_of(d: int) -> float:
    return 1.0 / math.sqrt(d)


def visible(nq: int, nk: int, device=None) -> torch.Tensor:
    """(nq, nk) bool: key j is visible to query i under the causal mask (bottom-right aligned)."""
    i = torch.arange(nq, device=device).unsqueeze(1)
    j = torch.arange(nk, device=device).unsqueeze(0)
    return j <= i + (nk - nq)


def scores64(q, k, causal=False, scale=None):
    """S = Q Kᵀ · scale in float64, -inf where the causal mask hides a key."""
    d = q.shape[-1]
    s = (q.double() @ k.double().transpose(-1, -2)) * (scale_of(d) if scale is None else scale)
    if causal:
        s = s.masked_fill(~visible(q.shape[-2], k.shape[-2], s.device), float("-inf"))
    return s


def _probabilities(s):
    """P = softmax(S) along the keys, 0 on a row with no visible key; and L (+inf there)."""
    m = s.amax(dim=-1, keepdim=True) if s.shape[-1] else torch.full(s.shape[:-1] + (1,), float("-inf"),
                                                                       dtype=s.dtype, device=s.device)
    empty = torch.isinf(m) & (m < 0)
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    e = torch.exp(s - m_safe)
    l = e.sum(dim=-1, keepdim=True)
    p = torch.where(empty, torch.zeros_like(e), e / torch.where(empty, torch.ones_like(l), l))
    lse = torch.where(empty, torch.full_like(m, float("inf")),
                      m_safe + torch.log(torch.where(empty, torch.ones_like(l), l)))
    return p, lse.squeeze(-1)


def attention_ref64(q, k, v, causal=False):
    """``softmax(Q Kᵀ / √d) V`` in float64 (a row with no visible key gives 0)."""
    p, _ = _probabilities(scores64(q, k, causal))
    return p @ v.double()


def attention_lse64(q, k, causal=False):
    """The logsumexp of each query's scores, natural log, float64; +inf for a row with no key."""
    return _probabilities(scores64(q, k, causal))[1]


def attention_backward_ref64(q, k, v, do, causal=False):
    """(dq, dk, dv) of ``o = attention(q, k, v)`` for the upstream gradient ``do``, float64."""
    scale = scale_of(q.shape[-1])
    p, _ = _probabilities(scores64(q, k, causal))
    do, v64 = do.double(), v.double()
    dv = p.transpose(-1, -2) @ do
    dp = do @ v64.transpose(-1, -2)
    delta = (p * dp).sum(dim=-1, keepdim=True)          # = rowsum(dO ∘ O)
    ds = p * (dp - delta)
    dq = scale * (ds @ k.double())
    dk = scale * (ds.transpose(-1, -2) @ q.double())
    return dq, dk, dv


# ----------------------------------------------------------------------------------------
# Tolerances: from the dtype and the number of keys
# ----------------------------------------------------------------------------------------
def _unit(dtype, nk: int, d: int) -> float:
    """The relative error a right kernel may make in one probability (and one product term):
    the input dtype's roundoff (P is rounded to it before the P V product on tensor cores),
    plus float32 sums over the keys and the head dimension."""
    return UNIT_ROUNDOFF[dtype] + 4.0 * EPS32 * math.sqrt(max(nk, d, 1))


def _row_smax(s):
    """The largest |score| of each query row (..., Nq, 1), 0 for a row with no visible key."""
    finite = torch.where(torch.isfinite(s), s.abs(), torch.zeros_like(s))
    return finite.amax(dim=-1, keepdim=True) if s.shape[-1] else torch.zeros(s.shape[:-1] + (1,), dtype=s.dtype)


def output_tolerance(q, k, v, causal=False, dtype=None, factor: float = 3.0):
    """Allowed |o - ref| per element: ``factor * unit * (P |V|)``, the bound on what rounding the
    probabilities to ``dtype`` and summing over Nk keys can do, plus one rounding of o to
    ``dtype`` (a kernel returns o in its inputs' dtype), plus float32 rounding of exp() of
    large scores."""
    dtype = dtype or q.dtype
    nk, d = k.shape[-2], q.shape[-1]
    s = scores64(q, k, causal)
    p, _ = _probabilities(s)
    unit = _unit(dtype, nk, d) + 4.0 * EPS32 * _row_smax(s)   # exp(x) of a float32 x of size |x|
    weight = p @ v.double().abs()
    ref = p @ v.double()
    flush = UNDERFLOW[dtype] * v.double().abs().sum(dim=-2, keepdim=True)   # P below 2^-24 flushed (l >= 1)
    # A float32 running sum of terms of one sign and size drifts: each step rounds the same
    # way, up to EPS32 * n / 2 of the result over n steps (not sqrt(n)). n is the row's
    # effective number of keys, 1 / sum(p^2): a row of 8192 equal scores summed one key
    # after another, as a right float32 kernel may do, is off by about 1e-4 on an H100.
    p2 = (p * p).sum(dim=-1, keepdim=True)
    n_eff = torch.where(p2 > 0, 1.0 / p2.clamp_min(1e-300), torch.zeros_like(p2))
    drift = EPS32 * 0.5 * n_eff * ref.abs()
    return factor * (unit * weight + flush) + drift + UNIT_ROUNDOFF[dtype] * ref.abs() + 1e-30


def lse_tolerance(q, k, causal=False, dtype=None, factor: float = 4.0):
    """Allowed |L - ref|: the scores are float32 sums of products of ``dtype`` values (a kernel
    may round Q · scale to ``dtype`` first), L = m + log(l) in float32."""
    dtype = dtype or q.dtype
    s = scores64(q, k, causal)
    finite = torch.where(torch.isfinite(s), s.abs(), torch.zeros_like(s))
    smax = finite.amax(dim=-1) if s.shape[-1] else torch.zeros(s.shape[:-1], dtype=s.dtype)
    nk, d = k.shape[-2], q.shape[-1]
    return factor * (UNIT_ROUNDOFF[dtype] * smax + 4.0 * EPS32 * math.sqrt(max(nk, d, 1)) * (1.0 + smax))


def backward_tolerances(q, k, v, do, causal=False, dtype=None, factor: float = 4.0, o=None):
    """Allowed errors of (dq, dk, dv): each is a product whose terms a right kernel rounds to
    ``dtype`` once (P and dS before the tensor-core products), with float32 sums. ``o``: the
    forward's output the kernel is given (rounded to ``dtype``); D = rowsum(dO ∘ o) inherits its
    rounding, which is allowed exactly (without it, as if o were rounded to ``dtype``)."""
    dtype = dtype or q.dtype
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = scale_of(d)
    s = scores64(q, k, causal)
    p, _ = _probabilities(s)
    smax = _row_smax(s)
    unit = _unit(dtype, max(nq, nk), d) + 4.0 * EPS32 * smax
    # float32 work: sums over the keys or the head dimension, exp() of a score of size smax
    unit32 = 4.0 * EPS32 * (math.sqrt(max(nq, nk, d, 1)) + smax)
    do64, v64, q64, k64 = do.double(), v.double(), q.double(), k.double()
    o_exact = p @ v64
    dp = do64 @ v64.transpose(-1, -2)
    dp_abs = do64.abs() @ v64.abs().transpose(-1, -2)
    d_abs = (do64.abs() * o_exact.abs()).sum(dim=-1, keepdim=True) + (p * dp_abs).sum(dim=-1, keepdim=True)
    # Each term of dS = P ∘ (dP - D): rounded once to ``dtype`` (before the tensor-core products),
    # and off by float32 rounding in P, dP and D. D itself is a float32 sum: a D summed in float16
    # is off by 2^-11 |D|, which this bound does not allow where |dP - D| is small.
    ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))
    if o is None:
        d_err = UNIT_ROUNDOFF[dtype] * (do64.abs() * o_exact.abs()).sum(dim=-1, keepdim=True)
    else:
        d_err = (do64.abs() * (o.double() - p @ v64).abs()).sum(dim=-1, keepdim=True)
    ds_bound = unit * ds.abs() + unit32 * p * (dp_abs + d_abs) + p * d_err
    # P and dS rounded to float16 flush values below its smallest subnormal (2^-24) to 0:
    # an absolute error of up to 2^-25 in each term, whatever its size.
    flush = UNDERFLOW[dtype]
    tiny = 1e-30
    tol_dv = factor * (((unit * p).transpose(-1, -2) @ do64.abs())
                       + flush * do64.abs().sum(dim=-2, keepdim=True)) + tiny
    tol_dq = factor * scale * ((ds_bound @ k64.abs()) + flush * k64.abs().sum(dim=-2, keepdim=True)) + tiny
    tol_dk = factor * scale * ((ds_bound.transpose(-1, -2) @ q64.abs())
                               + flush * q64.abs().sum(dim=-2, keepdim=True)) + tiny
    return tol_dq, tol_dk, tol_dv


# ----------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------
#: What the scores of query ``i`` do along the keys, for ``i % 6`` (``make_qkv``): where its max is.
ROW_KINDS = ("rising: max in the last tile", "falling: max at key 0, the first tile", "random",
             "rising by half: max in the last tile", "a spike of +110 at key 0 (first tile)",
             "a spike of +110 at the middle key (a middle tile)")
#: The columns of V in the cases where V is constant along the keys (``kind="flat"``, ``"d_large"``).
D_COLS = torch.tensor([4.0 / 3.0, 0.7, -1.1, 1.9])
#: V's constant part in the ``d_large`` case: multiples of 1/8, so O = C is exact in float16.
D_LARGE_COLS = torch.tensor([4.0, 2.125, -3.375, 5.625])
#: The score of the spikes (rows of kinds 4 and 5): e^110 overflows float32, whose largest exp
#: argument is about 88.7, so a running max that forgets earlier tiles turns into inf and NaN.
SPIKE = 110.0


def make_qkv(gen, B, H, nq, nk, d, dtype=torch.float32, kind="mixed", device="cpu"):
    """q, k, v on ``device``, values exactly representable in ``dtype``.

    ``kind="mixed"``: random values, plus directions along which each query's scores rise, fall
    or spike, so that the rows' largest scores come in the first tile of keys, a middle one and
    the last one. Query ``i`` is of kind ``i % 6`` (``ROW_KINDS``): 0 scores rising by about 20
    along the keys, most at the last two (its max in the last tile); 1 falling (its max at key 0,
    the first tile); 2 random; 3 rising by half as much; 4 a spike of about +110 at key 0; 5 a
    spike of about +110 at the middle key. Rows whose maximum comes late need the running max
    and the rescaling of the accumulator and the sum; rows whose maximum comes first need the
    running max carried from tile to tile; a spike so far above the later tiles makes a running
    max taken over the current tile only overflow exp() (e^110 is inf in float32).
    ``kind="flat"``: every score exactly 0 (q = 0), so each output is the mean of V's rows; V's
    columns are constant along the keys and large (about 100), so the sum of P V over the keys
    passes float16's largest value (65504) when Nk >= 700: an accumulator kept in float16
    overflows, a float32 one does not.
    ``kind="d_large"`` (for a backward case): every score 0 (q = 0), K about 1, V's rows share a
    large constant part ``D_LARGE_COLS`` (and dO, drawn by the grader, follows it), so D = rowsum(dO
    ∘ O) is large (about 15 d) while dP - D stays small: D summed in float16 is off by far more
    than a right kernel's rounding of dS, and every key moves dq the same way.
    """
    if kind == "d_large":
        q = torch.zeros(B, H, nq, d)
        k = 1.0 + 0.1 * torch.randn(B, H, nk, d, generator=gen)
        # keys in pairs C + r, C - r (r a multiple of 1/64): O = mean(V) = C exactly, in any dtype
        r = torch.round(0.05 * 64 * torch.randn(B, H, (nk + 1) // 2, d, generator=gen)) / 64
        v = (D_LARGE_COLS.repeat(d // 4 + 1)[:d] + torch.stack([r, -r], dim=-2).flatten(-3, -2)[..., :nk, :])
        if nk % 2:
            v[..., -1, :] = D_LARGE_COLS.repeat(d // 4 + 1)[:d]
    elif kind == "flat":
        q = torch.zeros(B, H, nq, d)
        k = torch.randn(B, H, nk, d, generator=gen)
        cols = 75.0 * D_COLS.repeat(d // 4 + 1)[:d]
        v = cols.expand(B, H, nk, d).clone() * (1 + 0.01 * torch.randn(B, H, 1, 1, generator=gen))
    else:
        q = torch.randn(B, H, nq, d, generator=gen)
        k = torch.randn(B, H, nk, d, generator=gen)
        v = torch.randn(B, H, nk, d, generator=gen)
        kinds = torch.arange(nq) % len(ROW_KINDS)
        # Direction 0: k's component ramps from -3 to 3 along the keys; queries rise (+), fall
        # (-), stay flat (0) or rise by half. The score varies by amp * 6 / sqrt(d) along a
        # row: about 20.
        ramp = torch.linspace(-3.0, 3.0, max(nk, 1))[:nk] if nk > 1 else torch.zeros(nk)
        k[..., 0] = ramp + 0.1 * k[..., 0]
        amp = 20.0 * math.sqrt(d) / 6.0
        sign = torch.tensor([1.0, -1.0, 0.0, 0.5, 0.0, 0.0])[kinds]
        q[..., 0] = amp * sign + 0.1 * q[..., 0]
        # The last two keys stand out along it (about +3 in a rising row's score): by the ramp
        # alone a row's max came after key 128 in only some draws, so a kernel that goes by
        # chunks of 128 keys (one per thread) and forgets to rescale passed in 18 of 400 draws.
        if nk > 2:
            k[..., -2:, 0] += 1.0
        # Directions 1 and 2: a spike of about +110 at key 0 (rows of kind 4) and at the middle
        # key (kind 5); small elsewhere, so the other rows' scores hardly change.
        big = math.sqrt(SPIKE * math.sqrt(d))
        q[..., 1:3] *= 0.1
        k[..., 1:3] *= 0.1
        q[..., 1] = torch.where(kinds == 4, big, q[..., 1])
        q[..., 2] = torch.where(kinds == 5, big, q[..., 2])
        if nk:
            k[..., 0, 1] = big
            k[..., nk // 2, 2] = big
    q, k, v = (t.to(dtype).to(device) for t in (q, k, v))
    return q, k, v


def _bench_shape_input(shape, seed=0, device=None, dtype=torch.float16):
    from runtime.config import DEVICE
    device = device or DEVICE
    B, H, N, d = (int(s) for s in shape)
    g = generator(seed, device)
    q, k, v = (torch.randn(B, H, N, d, generator=g, device=device).to(dtype) for _ in range(3))
    return q, k, v


def attention_input(shape, seed=0, device=None):
    """The benchmark's inputs of ``shape = (B, H, N, d)``: q, k, v, float16 on the GPU (the
    dtype the targets are for) and float32 in simulation (the dtype every kernel takes)."""
    from runtime.config import SIMULATE
    return _bench_shape_input(shape, seed, device, torch.float32 if SIMULATE else torch.float16)


def attention_nbytes(shape, elem: int = 2, backward: bool = False) -> int:
    """Bytes one call must move at the least: q, k, v read and o written (and L, 4 bytes a
    row); a backward also reads o, dO and L and writes dq, dk and dv."""
    B, H, N, d = shape
    fwd = elem * 4 * B * H * N * d + 4 * B * H * N
    if not backward:
        return fwd
    return fwd + elem * 5 * B * H * N * d + 4 * B * H * N + elem * 3 * B * H * N * d


def attention_flops(shape, causal: bool = False, backward: bool = False) -> float:
    """4·B·H·N²·d for a forward (Nq = Nk = N), halved for causal, ×3.5 for forward + backward."""
    B, H, N, d = shape
    f = 4 * B * H * N * N * d
    if causal:
        f //= 2
    return f * 7 // 2 if backward else f


def _spec_tolerance(inputs, ref):
    q, k, v = inputs[:3]
    return output_tolerance(q.cpu(), k.cpu(), v.cpu(), causal=False).to(ref.device)

