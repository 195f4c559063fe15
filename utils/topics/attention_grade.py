"""Attention's graders (lesson 10): the cases they draw, the harness for functions that
return several tensors, and the diagnoses that turn a wrong result into its likely cause.
``check_attention`` grades a forward, ``check_attention_backward`` a backward; both are
exported as ``utils.check_attention`` and ``utils.check_attention_backward`` through the spec
in ``attention.py``.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch

from .. import check as _check
from ..grading import INPUT_GUARD_BITS, Case, Grader, GradingError, Output, _Guarded, grade, in_order, success
from .attention_ref import (
    D_LARGE_COLS,
    DTYPE_NAMES,
    ROW_KINDS,
    UNIT_ROUNDOFF,
    _probabilities,
    attention_backward_ref64,
    attention_lse64,
    attention_ref64,
    backward_tolerances,
    lse_tolerance,
    make_qkv,
    output_tolerance,
    scale_of,
    scores64,
    visible,
)


# ----------------------------------------------------------------------------------------
# Grading: the cases
# ----------------------------------------------------------------------------------------
def _label(B, H, nq, nk, d, dtype, causal, note=""):
    mask = ", causal" if causal else ""
    return (f"q {B}x{H}x{nq}x{d}, k and v {B}x{H}x{nk}x{d} ({DTYPE_NAMES[dtype]}{mask}{note})")


def _padded(t: torch.Tensor, dtype):
    """``t`` as ``dtype`` on the course's device, inside a buffer of NaN (reads past either
    end give NaN), and the guard record that says whether anything wrote outside it."""
    from runtime.config import DEVICE
    g = _Guarded(t.shape, dtype, DEVICE, INPUT_GUARD_BITS, "input")
    g.view.copy_(t.to(dtype))
    g.orig = g.view.detach().clone()
    return g.view, g


@dataclass
class _Case:
    label: str
    shape: tuple            # B, H, nq, nk, d
    values: tuple           # CPU tensors of dtype (q, k, v[, o, lse, do])
    layout: str = "contiguous"   # or "bnhd": q, k, v given as (B, N, H, d) tensors permuted to (B, H, N, d)
    kind: str = "mixed"
    note: str = ""


def _shapes(backward=False):
    from runtime.config import SIZES
    return [tuple(int(x) for x in s) for s in (SIZES.attention_grader_shapes if not backward
                                              else SIZES.attention_backward_grader_shapes)]


def _make_inputs(case: _Case):
    """The case's tensors on the device in guarded buffers, in the case's layout."""
    guards, out = [], []
    for i, t in enumerate(case.values):
        if case.layout == "bnhd" and i < 3:
            view, g = _padded(t.transpose(1, 2).contiguous(), t.dtype)
            out.append(view.transpose(1, 2))
        else:
            view, g = _padded(t, t.dtype)
            out.append(view)
        guards.append(g)
    return tuple(out), guards


def _accepts_causal(fn) -> bool | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return "causal" in sig.parameters or any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())


class _AttentionGrader(Grader):
    """A Grader that passes ``causal=True`` to a causal check's function and names the
    attention outputs (o, L, dq, ...) in its messages about them."""

    def __init__(self, name, fn, seed, causal):
        super().__init__(name, fn, seed)
        self.causal = causal
        if causal and _accepts_causal(fn) is False:
            raise GradingError(f"{name} failed:\nyour function takes no `causal` argument, but this check "
                               "grades the causal mask: add `causal=False` to its parameters and pass it to "
                               "the kernel (CAUSAL: tl.constexpr in Triton).")
        inner = fn
        self.fn = (lambda *a: inner(*a, causal=True)) if causal else inner

    def as_tensor(self, out, what, shape, dtypes):
        from runtime.config import DEVICE
        if not isinstance(out, torch.Tensor):
            self.fail(f"{what} is a {type(out).__name__}, not a torch tensor.")
        if out.device.type != DEVICE.type:
            self.fail(f"{what} is on {out.device}, but the course runs on {DEVICE}: create it on the "
                      "input's device (torch.empty_like(q)).")
        self.check_shape(out, shape, what, reshape="reshape it to {shape}")
        if out.dtype not in dtypes:
            want = " or ".join(DTYPE_NAMES.get(d, str(d)) for d in dtypes)
            self.fail(f"{what} has dtype {out.dtype}, expected {want}.")
        return out


#: A write past the end of an attention output: a tile at the end of the rows or keys.
_GUARD_HINT = ("is every store masked? A tile at the end of the rows (or of the keys) reaches past them: mask the "
               "rows >= Nq (and keys >= Nk) in tl.store / with an if in CUDA.")


def _unwritten_text(what):
    def text(mask):
        rows = mask.reshape(-1, mask.shape[-1]).any(dim=-1) if mask.dim() >= 2 else mask.reshape(-1)
        return (f"{_rows_text(mask)} of {what} {'was' if int(mask.sum()) == 1 else 'were'} never written (still the "
                f"grader's NaN marker, {int(rows.sum())} of {rows.numel()} rows).")
    return text


def _output(name, expected, shape, dtypes, tol, unwritten_hint, **hooks):
    """An attention output as the grading loop checks it: its tolerance one allowed error per
    element, its messages in rows of (batch, head)."""
    return Output(name, expected, shape=shape, dtypes=dtypes, tol=tol, noun=name,
                  convert=lambda g, value, o: g.as_tensor(value, o.name, o.result_shape, o.dtypes),
                  unwritten_text=_unwritten_text(name), unwritten_hint=unwritten_hint,
                  mismatch=lambda got, want: _wrong(got, want, tol),
                  describe=lambda got, want, bad: _describe_wrong(got, want, tol, name, bad), **hooks)


def _graded_case(case: _Case, expected):
    """The grading loop's Case for an attention case (``extra["attn"]``); ``expected``: its first
    output's float64 reference."""
    return Case(case.label, case.values, expected, make=lambda: _make_inputs(case), extra=dict(attn=case))


def _race_case(cases):
    """The case run twice (in simulation and on a GPU): several tiles, of about 2048 elements."""
    return {min(range(len(cases)), key=lambda i: abs(cases[i].numel - 2048))}


def _rows_text(mask):
    """'rows 17..31 of batch 0, head 1' style text for a (B, H, N[, d]) mask."""
    m = mask
    if m.dim() == 4:
        m = m.any(dim=-1)
    if m.dim() != 3:
        return _check.describe_positions(m.reshape(-1))
    parts = []
    for b in range(m.shape[0]):
        for h in range(m.shape[1]):
            r = _check.index_ranges(m[b, h])
            if r:
                parts.append(f"{_check.format_ranges(r, noun='rows')} (batch {b}, head {h})")
    more = len(parts) - 3
    text = "; ".join(parts[:3]) + (f"; and {more} more heads" if more > 0 else "")
    return text


def _wrong(got, ref, tol):
    """The wrong values: beyond the tolerance, or not the reference's inf where it is inf (an
    L row that sees no key)."""
    bad = ~((got - ref).abs() <= tol)
    # NaN where the reference is NaN never happens (the reference has none); inf L rows:
    if bool(torch.isinf(ref).any()):
        inf = torch.isinf(ref)
        bad = bad & ~(inf & (got == ref))
        bad = bad | (inf & (got != ref))
    return bad


def _describe_wrong(got, ref, tol, what, bad):
    idx = torch.nonzero(bad)[0].tolist()
    pos = tuple(idx)
    err = (got - ref).abs()
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    err = torch.where(torch.isinf(ref) & (got == ref), torch.zeros_like(err), err)
    worst = float(err.max())
    where = _rows_text(bad)
    return (f"{int(bad.sum())} of {bad.numel()} values of {what} are wrong: {where}.\n"
            f"First wrong: {what}[{', '.join(map(str, pos))}] = {float(got[pos]):.7g}, expected "
            f"{float(ref[pos]):.7g} (allowed error there {float(tol[pos] if tol.dim() else tol):.2g}); "
            f"largest error {worst:.3g}.")


def _describe(got, ref, tol, what):
    """(the message, the wrong values) of ``got`` against ``ref``; (None, ...) where it is right."""
    bad = _wrong(got, ref, tol)
    if not bool(bad.any()):
        return None, bad
    return _describe_wrong(got, ref, tol, what, bad), bad


# ----------------------------------------------------------------------------------------
# Diagnoses: what the classic mistakes compute instead
# ----------------------------------------------------------------------------------------
_TILES = (16, 32, 64, 128, 256)


def _flash_variant(q, k, v, causal, block, *, rescale_acc=True, rescale_sum=True, drop_tail=False,
                   scale=None, carry_max=True):
    """A FlashAttention forward in float64 over key tiles of ``block``, with a mistake switched
    on. NaN where no key was summed (0 / 0)."""
    s = scores64(q, k, causal, scale)
    nk = s.shape[-1]
    shape = s.shape[:-1]
    m = torch.full(shape, float("-inf"), dtype=torch.float64)
    l = torch.zeros(shape, dtype=torch.float64)
    acc = torch.zeros(shape + (v.shape[-1],), dtype=torch.float64)
    stop = (nk // block) * block if drop_tail else nk
    for j0 in range(0, stop, block):
        st = s[..., j0:j0 + block]
        m_new = torch.maximum(m, st.amax(dim=-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(st - m_safe.unsqueeze(-1))
        alpha = torch.exp(m - m_safe)
        l = (l * alpha if rescale_sum else l) + p.sum(dim=-1)
        acc = (acc * alpha.unsqueeze(-1) if rescale_acc else acc) + p @ v.double()[..., j0:j0 + block, :]
        m = m_new if carry_max else m
    return acc / l.unsqueeze(-1)


def _close(a, b, tol, frac=0.98):
    """Most of ``a`` matches ``b`` within 4x the tolerance (NaN matches NaN or 0: a kernel may
    guard 0 / 0)."""
    if a.shape != b.shape:
        return False
    ok = ((a - b).abs() <= 4 * tol + 1e-6 * b.abs()) | (torch.isnan(a) & torch.isnan(b)) | (
        torch.isnan(b) & (a == 0))
    return float(ok.double().mean()) >= frac


def _explains(got, alt, ref, tol, frac=0.98, rel=0.0):
    """``alt`` (what a mistake computes) differs from the right answer here, and ``got`` is it:
    judged where either is wrong, so that a mistake which spoils one row is not "explained" by
    another that spoils a different row (every other row agrees anyway). ``rel``: the relative
    rounding of the learner's arithmetic, added to the tolerance of got against alt (a mistake
    whose values are far larger than the right ones is rounded in proportion to them)."""
    tol = torch.as_tensor(tol, dtype=ref.dtype).expand_as(ref)
    alt_wrong = ~((alt - ref).abs() <= tol)
    if not bool(alt_wrong.any()):
        return False
    region = alt_wrong | ~((got - ref).abs() <= tol)
    return _close(got[region], alt[region], (tol + rel * alt.abs())[region], frac)


def _precision_hint(rel, nk, dtype, long_row):
    """Small errors only: the precision of the arithmetic."""
    low = ("TF32 (tl.dot of float32 without input_precision=\"ieee\") or float16"
           if dtype == torch.float32 else "float16 or bfloat16")
    where = f" on a long row of {nk} equal scores" if long_row else ""
    return (f"small errors (up to {rel:.1%} of Σ P|V|){where}: the sums look computed or accumulated in {low}. "
            "Keep the accumulator and the running sum in float32 (tl.zeros(..., dtype=tl.float32), a float "
            "accumulator fragment in wmma) and round o once, when it is stored.")


def _masked_attention(q, k, v, vis):
    """Attention with the visibility mask ``vis`` (Nq, Nk); 0 on a row that sees no key."""
    p, _ = _probabilities(scores64(q, k, False).masked_fill(~vis, float("-inf")))
    return p @ v


def _causal_tile_hint(q, k, v, got, ref, tol):
    """The causal mistakes of a tiled loop: the offset Nk - Nq with its sign flipped, or the
    loop's end ``hi`` one tile of queries short (the last rows of each tile miss keys)."""
    nq, nk = q.shape[-2], k.shape[-2]
    i = torch.arange(nq).unsqueeze(1)
    j = torch.arange(nk).unsqueeze(0)
    if nq != nk:
        for hi_block in (None,) + _TILES:
            vis = j <= i + (nq - nk)
            if hi_block is not None:   # with the loop's end hi = (pid + 1) * BLOCK_M + Nk - Nq as given
                vis = vis & (j < (i // hi_block + 1) * hi_block + nk - nq)
            if _explains(got, _masked_attention(q, k, v, vis), ref, tol, frac=0.95):
                return ("the causal mask's offset has its sign flipped: query i sees key j when j <= i + Nk - Nq "
                        "(aligned to the bottom right: with Nq < Nk the last query sees every key), not "
                        "j <= i + Nq - Nk. With Nq == Nk the two agree, which is why only Nq != Nk shows it.")
    for block in _TILES:
        vis = (j <= i + nk - nq) & (j < (i // block) * block + nk - nq)
        if _explains(got, _masked_attention(q, k, v, vis), ref, tol, frac=0.95):
            return (f"the loop over keys ends one tile early (it looks like tiles of {block} queries): the last "
                    "query of tile pid, row (pid + 1) * BLOCK_M - 1, sees keys up to (pid + 1) * BLOCK_M - 1 + Nk "
                    "- Nq, so hi = (pid + 1) * BLOCK_M + Nk - Nq (at most Nk, at least 0), not pid * BLOCK_M + "
                    "Nk - Nq.")
    return None


def _forward_diagnosis(case, dtype, causal, got, bad, tol):
    q, k, v = (t.double() for t in case.values[:3])
    B, H, nq, nk, d = case.shape
    ref = attention_ref64(q, k, v, causal)
    finite = torch.isfinite(got)
    weight = _probabilities(scores64(q, k, causal))[0] @ v.abs()
    rel = float(((got - ref).abs() / weight.clamp_min(1e-6)).nan_to_num(math.inf).max())
    if case.kind == "flat" and (rel < 0.05 or not bool(finite.all())):
        # Every score is 0 here, so the max never moves: only the precision of the sums matters.
        if not bool(finite.all()) and bool(torch.isinf(got).any()):
            return (f"o is inf on a row of {nk} equal scores whose values are about 100: the sum of P V passed "
                    "float16's largest value, 65504: the sums look accumulated in float16. Keep the accumulator "
                    "and the running sum in float32 (tl.zeros(..., dtype=tl.float32), a float accumulator fragment "
                    "in wmma) and round o once, when it is stored.")
        return _precision_hint(rel, nk, dtype, True)
    if causal:
        hint = _causal_tile_hint(q, k, v, got, ref, tol)
        if hint:
            return hint
    # Tile-by-tile mistakes first (a row of keys shorter than the tile gives 0 / 0), for the usual
    # key-tile sizes.
    for block in _TILES:
        if nk % block and _explains(got, _flash_variant(q, k, v, causal, block, drop_tail=True), ref, tol, 0.95):
            if nk < block:
                return (f"no key was used at all: with Nk = {nk} keys, fewer than a tile ({block}?), a loop over "
                        "Nk // BLOCK_N tiles runs zero times. Loop over cdiv(Nk, BLOCK_N) tiles and mask the keys "
                        ">= Nk in the last one (other=0.0 for K and V, -inf for their scores).")
            return (f"the keys past the last whole tile are missing (it looks like tiles of {block} keys, and "
                    f"Nk = {nk} is not a multiple of it): loop over cdiv(Nk, BLOCK_N) tiles and mask the keys "
                    ">= Nk in the last one (other=0.0 for K and V, -inf for their scores).")
    if not causal:
        # The last tile's padding keys (loaded as 0.0) left in the softmax with a score of 0.
        for block in _TILES:
            pad = -nk % block
            if pad and nk > 1:
                zeros = torch.zeros(*k.shape[:-2], pad, d, dtype=k.dtype)
                alt = attention_ref64(q, torch.cat([k, zeros], -2), torch.cat([v, zeros], -2), False)
                if _explains(got, alt, ref, tol, 0.95):
                    return (f"the keys past the end of the last tile count (it looks like tiles of {block} keys, and "
                            f"Nk = {nk} is not a multiple of it): loaded as 0.0 they get a score of 0 and a share of "
                            "the softmax. Set the scores of keys >= Nk to -inf before the max "
                            "(tl.where(offs_n < Nk, s, float('-inf'))).")
    if not bool(finite.all()):
        return ("some outputs are NaN or inf: is the running max subtracted before exp (and the mask applied "
                "as -inf before the max, with masked lanes loaded with other=0.0)? A row whose first tile of keys "
                "is all masked needs its max shift set to 0 while the max is still -inf.")
    if _explains(got, attention_ref64(q * math.sqrt(d), k, v, causal), ref, tol):
        return ("the result is softmax(Q Kᵀ) V without the 1/√d scale: multiply the scores by "
                f"1/√d = {scale_of(d):.4g} (in an exp2 kernel, fold it into qk_scale = log2(e)/√d).")
    if _explains(got, attention_ref64(q / math.sqrt(d), k, v, causal), ref, tol):
        return "the scores look scaled by 1/d instead of 1/√d (or the scale is applied twice)."
    if causal:
        for shift, text in ((-1, "excludes the diagonal: query i must see key i (j <= i, not j < i)"),
                            (1, "lets each query see one key too many: key j is visible for j <= i, not j <= i + 1")):
            vis = torch.arange(nk).unsqueeze(0) <= torch.arange(nq).unsqueeze(1) + (nk - nq) + shift
            p, _ = _probabilities(scores64(q, k, False).masked_fill(~vis, float("-inf")))
            if _explains(got, p @ v, ref, tol, frac=0.95):
                return f"the causal mask is off by one on the diagonal: it {text} (with Nq != Nk, j <= i + Nk - Nq)."
        if _explains(got, attention_ref64(q, k, v, False), ref, tol):
            return "the result has no causal mask: hide key j from query i when j > i + Nk - Nq."
        if nq != nk:
            top_left = torch.arange(nk).unsqueeze(0) <= torch.arange(nq).unsqueeze(1)
            p, _ = _probabilities(scores64(q, k, False).masked_fill(~top_left, float("-inf")))
            if _explains(got, p @ v, ref, tol, frac=0.95):
                return ("the causal mask is aligned to the top left (j <= i); the course aligns it to the bottom "
                        "right, as FlashAttention does: j <= i + Nk - Nq.")
    for block in _TILES:
        for acc_ok, sum_ok, text in (
                (False, True, "the accumulator is not rescaled when the running max grows: multiply acc by "
                              "alpha = exp(m_old - m_new) before adding the new tile's P V"),
                (True, False, "the running sum is not rescaled when the running max grows: l = l * alpha + "
                              "rowsum(P), with alpha = exp(m_old - m_new)"),
                (False, False, "neither the accumulator nor the running sum is rescaled when the running max "
                               "grows: both need * alpha = exp(m_old - m_new) before the new tile is added"),
                (None, None, "the running max is not carried from one tile to the next (m = m_new is missing): m "
                             "stays -inf, so alpha = exp(m - m_new) is 0 at every tile and everything summed before "
                             "the last tile is dropped; rows whose largest score comes in an early tile show it")):
            if acc_ok is None:
                alt = _flash_variant(q, k, v, causal, block, carry_max=False)
            else:
                alt = _flash_variant(q, k, v, causal, block, rescale_acc=acc_ok, rescale_sum=sum_ok)
            if _explains(got, alt, ref, tol, frac=0.95):
                return text + f" (it looks like tiles of {block} keys)."
    if rel < 0.05:
        return _precision_hint(rel, nk, dtype, False)
    # Rows whose maximum is in their first tile right, the others wrong: a rescaling problem.
    rows_bad = bad.any(dim=-1)
    rising = torch.arange(nq) % len(ROW_KINDS) == 0
    falling = torch.arange(nq) % len(ROW_KINDS) == 1
    if nk > 16 and bool(rows_bad[..., rising].float().mean() > 0.5) and not bool(rows_bad[..., falling].any()):
        return ("the rows whose largest score comes late are wrong, those whose largest score is among the first "
                "keys are right: when a new tile raises the running max, the accumulator and the running sum "
                "must both be multiplied by exp(m_old - m_new).")
    return ("compare one row by hand: S = q · Kᵀ / √d, m = max S, P = exp(S - m) / Σ exp(S - m), o = P V. "
            "Check the strides of the batch and head dimensions, and the masks of the last tiles.")


#: exp(x) is inf in float32 from x = 88.73 on.
EXP_OVERFLOW = 88.7


def _tile_overflow_rows(s, block):
    """Query rows where a running max taken over the current tile only overflows exp(): an
    earlier tile's max exceeds a later tile's by more than float32's exp range."""
    nk = s.shape[-1]
    fin = torch.where(torch.isfinite(s), s, torch.full_like(s, -1e300))
    prev = torch.full(s.shape[:-1], -1e300, dtype=s.dtype)
    rows = torch.zeros(s.shape[:-1], dtype=torch.bool)
    for j0 in range(0, nk, block):
        tile = fin[..., j0:j0 + block].amax(dim=-1)
        rows |= (prev - tile > EXP_OVERFLOW) & (tile > -1e299)
        prev = torch.maximum(prev, tile)
    return rows


def _nan_diagnosis(case, causal, got, got_l):
    """The likely cause of NaN in o: the running max, or the -inf it starts from."""
    q, k = (t.double() for t in case.values[:2])
    s = scores64(q, k, causal)
    bad_rows = ~torch.isfinite(got).all(dim=-1)
    for block in _TILES:
        rows = _tile_overflow_rows(s, block)
        if bool(rows.any()) and bool((bad_rows <= rows).all()):
            return ("NaN only on rows whose largest score comes in an early tile, far above the later tiles' "
                    f"(it looks like tiles of {block} keys): the running max is taken over the current tile only. "
                    "It must be the max of everything seen so far, m_new = max(m, rowmax(S_tile)) "
                    "(tl.maximum(m, tl.max(s, 1))); with the tile's own max, alpha = exp(m_old - m_new) is "
                    "e^(more than 88), inf in float32, and inf / inf is NaN.")
    first = ("NaN on the first tile, where the running max m is still -inf: ")
    if got_l is not None and bool(bad_rows.any()):
        lb = got_l[bad_rows]
        if bool((torch.isinf(lb) & (lb > 0)).all()):
            return (first + "p = exp(s - m) with the old max is exp(+inf) = inf there (L = m + log(l) came out "
                    "+inf): compute p with the new max, p = exp(s - m_new), after m_new = max(m, rowmax(s)).")
        if bool(torch.isnan(lb).all()):
            return (first + "alpha looks inverted: exp(m_new - m) is exp(+inf) = inf there, and l * alpha = "
                    "0 * inf is NaN (L came out NaN too). The factor that rescales the old sums is "
                    "alpha = exp(m - m_new): 0 on the first tile, at most 1 after.")
    return (first + "p must use the new max, p = exp(s - m_new), and alpha = exp(m - m_new) (not its inverse, "
            "which is inf on the first tile); a row whose keys are all masked keeps m = -inf, so shift by 0 "
            "while the max is -inf (tl.where(m_new == -inf, 0, m_new)). NaN also comes from a key loaded past "
            "the end without other=0.0.")


def _lse_diagnosis(case, causal, got_l, bad):
    q, k = (t.double() for t in case.values[:2])
    s = scores64(q, k, causal)
    lse = attention_lse64(q, k, causal)
    m = s.amax(dim=-1)
    fin = torch.isfinite(lse)
    tol = 1e-3 * (1 + lse.abs())
    def near(a):
        return bool(((got_l - a).abs()[fin] <= tol[fin]).float().mean() > 0.9)
    if bool(fin.any()) and bool((torch.isinf(got_l[fin]) & (got_l[fin] < 0)).all()):
        return ("L is -inf on every row: the running max m is still -inf at the end, so L = m + log(l) = -inf. "
                "The running max is not carried from one tile to the next (m = m_new is missing at the end of "
                "the loop's body): m stays -inf, alpha = exp(m - m_new) is 0 at every tile, and everything summed "
                "before the last tile is dropped.")
    if near(m):
        return ("L holds the row maximum of the scores, not the logsumexp: save L = m + log(l), where l is the "
                "running sum of exp(S - m).")
    if near(lse / math.log(2)):
        return ("L looks like the logsumexp in base 2 (m2 + log2(l) of an exp2 kernel): save it in natural log, "
                "L = (m2 + log2(l)) * ln(2), or use it consistently in your own backward and say so.")
    if near(torch.log(torch.exp(s - m.unsqueeze(-1)).nan_to_num(0).sum(dim=-1))):
        return "L looks like log(l) alone: the logsumexp is m + log(l), with m the running max."
    if near(lse * math.sqrt(q.shape[-1])):
        return "L looks computed from unscaled scores: the scores are Q Kᵀ / √d."
    return "L[i] = log Σ_j exp(S[i, j]) with S = Q Kᵀ / √d: m + log(l) from the running max m and sum l."


# ----------------------------------------------------------------------------------------
# The forward grader
# ----------------------------------------------------------------------------------------
def _draw_cases(g, dtype, causal, backward=False):
    cases = []
    # Single-query and single-key inputs last: on them several mistakes give the same wrong
    # answer, so the first failure should come from a case where they differ.
    shapes = sorted(_shapes(backward), key=lambda s: min(s[2], s[3]) == 1)
    for B, H, nq, nk, d in shapes:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g.gen))
        q, k, v = make_qkv(torch.Generator().manual_seed(seed), B, H, nq, nk, d, dtype)
        cases.append(_Case(_label(B, H, nq, nk, d, dtype, causal), (B, H, nq, nk, d), (q, k, v)))
    return cases


def _flat_case(g, dtype, causal, nk, d=64):
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g.gen))
    B, H, nq = 1, 1, 16
    q, k, v = make_qkv(torch.Generator().manual_seed(seed), B, H, nq, nk, d, dtype, kind="flat")
    return _Case(_label(B, H, nq, nk, d, dtype, causal, ", every score 0: a long sum"), (B, H, nq, nk, d),
                 (q, k, v), kind="flat")


#: Keys of the small case of equal scores graded first: sum P V reaches 640 x 142, past float16's
#: largest value (65504), so an accumulator kept in float16 overflows; one program in simulation.
OVERFLOW_KEYS = 640


def _layout_case(g, dtype, causal):
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g.gen))
    B, H, nq, nk, d = 2, 2, 31, 31, 32
    q, k, v = make_qkv(torch.Generator().manual_seed(seed), B, H, nq, nk, d, dtype)
    return _Case(_label(B, H, nq, nk, d, dtype, causal, "; q, k, v transposed views of (B, N, H, d) tensors"),
                 (B, H, nq, nk, d), (q, k, v), layout="bnhd")


def check_attention(fn, *, causal: bool = False, dtype=torch.float32, lse: bool = False, seed=None):
    """``fn(q, k, v)`` must return ``softmax(q kᵀ / √d) v`` per batch and head, or ``(o, L)``.

    q (B, H, Nq, d), k and v (B, H, Nk, d), all of ``dtype`` (float32, float16 or bfloat16).
    o has q's shape, in ``dtype`` or float32; L (B, H, Nq) float32 is the logsumexp of each
    query's scores (natural log; +inf for a query with no visible key). It is checked when
    ``fn`` returns it, and required with ``lse=True``. With ``causal=True`` the grader calls
    ``fn(q, k, v, causal=True)``: key j is visible to query i when j <= i + Nk - Nq.

    The shapes are awkward on purpose: N = 1, 17, 31, 130, Nq != Nk (with the causal mask and
    Nq > Nk some queries see no key), d = 16 .. 128, several batches and heads, a long row of
    equal scores (a float16 running sum drifts), and q, k, v as transposed views of
    (B, N, H, d) tensors (compute with them, or refuse with an error that says "contiguous").
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"check_attention: dtype must be float32, float16 or bfloat16, got {dtype}")
    from runtime.config import SIZES
    g = _AttentionGrader("check_attention", fn, seed, causal)
    # A row of equal scores first: an accumulator kept in float16 overflows there, by far, on every
    # draw. Any other failure on it is reported after the other cases, which say more.
    attn = [_flat_case(g, dtype, causal, OVERFLOW_KEYS, d=16)] + _draw_cases(g, dtype, causal)
    attn.append(_flat_case(g, dtype, causal, int(SIZES.attention_long_keys)))
    layout = _layout_case(g, dtype, causal)
    refused = _try_layout(g, layout)
    if refused is None:
        attn.append(layout)
    cases = [_graded_case(c, attention_ref64(*c.values[:3], causal=causal)) for c in attn]
    for case in cases:
        case.extra["tol"] = output_tolerance(*case.values[:3], causal=causal, dtype=dtype)
    checked_lse = []

    def o_hint(run, got, bad):
        c = run.case.extra["attn"]
        hint = _forward_diagnosis(c, dtype, causal, got, bad, run.case.extra["tol"])
        if _all_zero(got, run.case.expected):
            hint = _zero_output_hint(g, cases, causal) or hint
        return hint

    def l_hint(run, got, bad):
        c = run.case.extra["attn"]
        if causal and c.shape[2] > c.shape[3]:
            empty = ~visible(c.shape[2], c.shape[3]).any(dim=1)
            if bool(bad[..., empty].any()) and not bool(bad[..., ~empty].any()):
                return ("the queries that see no key must save L = +inf (so that the backward's exp(S - L) is 0 "
                        "for them): m + log(l) there is -inf + log(0).")
        return _lse_diagnosis(c, causal, got, bad)

    def outputs(case):
        c = case.extra["attn"]
        q, k, v = c.values[:3]
        B, H, nq, nk, d = c.shape
        return [_output("o", case.expected, (B, H, nq, d), (torch.float32, dtype), case.extra["tol"],
                        "is every query row written? The grid needs cdiv(Nq, BLOCK_M) programs per batch and head "
                        "(the last tile of queries is partial), and each program stores its rows.",
                        nan_hint=lambda run, nan: _nan_diagnosis(c, causal, run.got["o"], run.got.get("L")),
                        nan_where=_rows_text, diagnose=o_hint),
                _output("L", attention_lse64(q, k, causal=causal), (B, H, nq), (torch.float32,),
                        lse_tolerance(q, k, causal=causal, dtype=dtype),
                        "save L for every query row at the end of the forward (L not saved?).",
                        diagnose=l_hint, counted=False)]

    def unpack(run):
        out = run.out
        o, l = out, None
        if isinstance(out, (tuple, list)):
            if len(out) == 2:
                o, l = out
            elif len(out) == 1:
                o = out[0]
            else:
                g.fail(f"your function returned {len(out)} values: return o, or (o, L).")
        if o is None:
            g.fail("your function returned None: return the output tensor o (or (o, L)).")
        if lse and l is None:
            g.fail("your function returned only o: this check also grades the logsumexp the backward needs.",
                   "return (o, L) where L (B, H, Nq), float32, holds m + log(l) of each query row: save it at the "
                   "end of the forward (tl.store(L_ptr + ..., m + tl.log(l))).")
        return (o,) if l is None else (o, l)   # L is graded when it is returned

    def no_key_rows(run):
        if "L" in run.got:
            checked_lse.append(run.case)
        B, H, nq, nk, d = run.case.extra["attn"].shape
        if causal and nq > nk:
            # NaN on exactly the rows that see no key: the classic mistake, named before a float16
            # output's NaN could be taken for the grader's "never written" marker.
            o64 = run.got["o"]
            empty = ~visible(nq, nk).any(dim=1)
            nan_rows = torch.isnan(o64).any(dim=-1)
            if bool(nan_rows[..., empty].all()) and not bool(nan_rows[..., ~empty].any()):
                g.fail(f"o is NaN on rows {int(empty.nonzero()[0])}..{int(empty.nonzero()[-1])}: the queries that "
                       "see no key.",
                       f"with Nq = {nq} > Nk = {nk} the causal mask (aligned to the bottom right, j <= i + Nk - Nq) "
                       "leaves these queries no visible key: their running max stays -inf, exp(-inf - (-inf)) is "
                       "NaN and l = 0. Shift by 0 while the max is -inf (tl.where(m == -inf, 0, m)), and write o = 0 "
                       "(and L = +inf) where l == 0.")

    def put_off(run, output, message, hint):
        # a wrong row of equal scores is reported last, unless it is the float16 accumulator it tests
        return run.case.extra["attn"].kind == "flat" and (
            output.name == "L" or ("float16" not in hint and "accumulated in" not in hint))

    worst = grade(g, cases, outputs, inputs=("q", "k", "v"), unpack=unpack, check=no_key_rows, order=in_order,
                  races=_race_case, guard_hint=_GUARD_HINT, defer=put_off,
                  race_hint="a tile of scores or of P kept in shared memory needs a barrier between writing it "
                            "and reading it, and another before it is overwritten by the next tile.")
    extra = "" if refused is None else "; refuses transposed q, k, v clearly"
    what = "o and L" if checked_lse else "o"
    shapes = ", ".join("x".join(map(str, c.shape)) for c in attn if c.layout == "contiguous")
    views = ", ".join("x".join(map(str, c.shape)) for c in attn if c.layout != "contiguous")
    shapes += f"; as transposed views: {views}" if views else ""   # every input counted is listed
    success("check_attention", cases, worst,
            f"{what}, {DTYPE_NAMES[dtype]}{', causal' if causal else ''}; B x H x Nq x Nk x d = {shapes}{extra}")


def _all_zero(got, ref):
    """o is 0 on every row where the reference is not (the value a kernel writes where l is not > 0)."""
    rows = ref.abs().amax(dim=-1) > 0
    return bool(rows.any()) and bool((got.abs().amax(dim=-1)[rows] == 0).all())


def _zero_output_hint(g, cases, causal):
    """o all 0: the loop over keys never ran (its end ``hi`` short, for every tile of queries
    the case has), or l ended NaN or 0 (then a right kernel's guard writes 0). A case with several
    tiles of queries tells them apart: a short ``hi`` leaves its later tiles some keys."""
    big = [c for c in cases if c.extra["attn"].kind == "mixed" and c.extra["attn"].shape[2] >= 100
           and c.extra["attn"].layout == "contiguous"]
    if not big:
        return None
    got = g.probe_outputs(big[0])
    if got is None:
        return None
    case = big[0].extra["attn"]
    o_got = got["o"]
    q, k, v = (t.double() for t in case.values[:3])
    ref = attention_ref64(q, k, v, causal)
    if _all_zero(o_got, ref):
        return ("o is 0 on every row, on every input (with 130 queries too): what a kernel writes for a row whose "
                "running sum l is not > 0, so l came out 0 or NaN. NaN comes from the first tile, where the "
                "running max m is -inf: alpha = exp(m_new - m) (inverted) is exp(+inf) = inf there, and l * alpha "
                "= 0 * inf is NaN; the factor that rescales the old sums is alpha = exp(m - m_new), 0 on the first "
                "tile. (Or the loop over keys never runs: check its end.)")
    if causal:
        return _causal_tile_hint(q, k, v, o_got, ref, big[0].extra["tol"])
    return None


def _try_layout(g, case):
    """None if ``fn`` takes transposed views (its result is checked like any case), else the
    first line of its error when that error says "contiguous"."""
    try:
        (ins, _guards) = _make_inputs(case)
        g.fn(*ins)
    except Exception as e:
        if "contiguous" in str(e).lower():
            return str(e).splitlines()[0]
    return None


# ----------------------------------------------------------------------------------------
# The backward grader
# ----------------------------------------------------------------------------------------
def _backward_inputs(case: _Case, dtype, causal, gen):
    q, k, v = case.values[:3]
    o = attention_ref64(q, k, v, causal).to(dtype)
    lse = attention_lse64(q, k, causal).to(torch.float32)
    do = torch.randn(o.shape, generator=gen)
    if case.kind == "d_large":   # dO along O's large constant part: D = rowsum(dO ∘ O) is large
        do = D_LARGE_COLS.repeat(o.shape[-1] // 4 + 1)[:o.shape[-1]] + 0.3 * do
    return (q, k, v, o, lse, do.to(dtype))


def _d_large_case(g, dtype, causal):
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g.gen))
    B, H, nq, nk, d = 1, 1, 16, 64, 64
    q, k, v = make_qkv(torch.Generator().manual_seed(seed), B, H, nq, nk, d, dtype, kind="d_large")
    return _Case(_label(B, H, nq, nk, d, dtype, causal, ", every score 0, D = rowsum(dO ∘ O) about 1000"),
                 (B, H, nq, nk, d), (q, k, v), kind="d_large")


def _fitted_delta_error(case, causal, dq, rq, tq):
    """If dq's error is what an error in D alone gives (dS = P ∘ (dP - D) moves by -P δD_i on
    row i, so dq by -scale δD_i (P K)_i), the δD of each row relative to Σ|dO ∘ O|; else None."""
    q, k, v, o, lse, do = (t.double() for t in case.values)
    p, _ = _probabilities(scores64(q, k, causal))
    u = -scale_of(q.shape[-1]) * (p @ k)                    # dq per unit of δD, each row
    err = dq - rq
    uu = (u * u).sum(dim=-1)
    fit = torch.where(uu > 0, (err * u).sum(dim=-1) / uu.clamp_min(1e-300), torch.zeros_like(uu))
    resid = (err - fit.unsqueeze(-1) * u).norm(dim=-1)
    wrong = (err.abs() > tq).any(dim=-1)             # judged on the wrong rows only
    if not bool(wrong.any()) or not bool((resid <= 0.3 * err.norm(dim=-1) + 1e-12)[wrong].all()):
        return None
    scale_d = (do.abs() * o.abs()).sum(dim=-1).clamp_min(1e-30)
    return float((fit.abs() / scale_d)[wrong].max())


def _backward_diagnosis(case, causal, which, gots, refs, tols):
    low = case.values[0].dtype in (torch.float16, torch.bfloat16)
    rel = {torch.float16: 4e-3, torch.bfloat16: 3e-2}.get(case.values[0].dtype, 0.0) if low else 0.0
    q, k, v, o, lse, do = (t.double() for t in case.values)
    B, H, nq, nk, d = case.shape
    names = ("dq", "dk", "dv")
    wrong = [n for n in names if n in which]
    sc = math.sqrt(d)
    dq, dk, dv = gots
    rq, rk, rv = refs
    tq, tk, tv = tols
    if "dv" not in wrong and _explains(dq, rq * sc, rq, tq) and _explains(dk, rk * sc, rk, tk):
        return ("dv is right, dq and dk are √d too large: the scores were scaled by 1/√d in the forward, so "
                "dq = scale · dS K and dk = scale · dSᵀ Q.")
    if causal and _explains(dv, attention_backward_ref64(q, k, v, do, False)[2], rv, tv):
        return "the backward ignores the causal mask: recompute P with the same mask as the forward (P = 0 above it)."
    # D = rowsum(dO ∘ O): the usual slips
    p, _ = _probabilities(scores64(q, k, causal))
    dp = do @ v.transpose(-1, -2)
    for delta, text in ((torch.zeros_like(dp[..., :1]), "D is missing: dS = P ∘ (dP - D)"),
                        (do.sum(dim=-1, keepdim=True), "D looks like rowsum(dO): it is rowsum(dO ∘ O)"),
                        ((do * o).sum(dim=-2, keepdim=True).sum(dim=-1, keepdim=True).expand_as(dp[..., :1]),
                         "D looks summed over the rows too: D_i = Σ_c dO[i, c] O[i, c], one number per query")):
        ds = p * (dp - delta)
        alt_dq = (ds @ k) / sc
        if "dv" not in wrong and _explains(dq, alt_dq, rq, tq, rel=rel):
            return text + " (dv is right: P is recomputed correctly)."
    if "dv" not in wrong:
        rel = _fitted_delta_error(case, causal, dq, rq, tq)
        if rel is not None and 0 < rel < 0.02:
            return (f"dq is off the way a slightly wrong D makes it (by up to {rel:.2g} of Σ|dO ∘ O| on a row), and "
                    "dv is right: D = rowsum(dO ∘ O) looks multiplied or summed in float16. Convert to float32 "
                    "before the product and the sum: tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1).")
    if wrong == ["dq"]:
        return ("dk and dv are right but dq is not: dq gets a contribution from every tile of keys. With one "
                "program (block) per key tile, add into dq with tl.atomic_add (atomicAdd); or compute dq in a "
                "pass of its own, one program per query tile looping over the keys.")
    if "dv" in wrong:
        l_as_max = torch.exp(scores64(q, k, causal) - scores64(q, k, causal).amax(dim=-1, keepdim=True))
        if _explains(dv, l_as_max.nan_to_num(0).transpose(-1, -2) @ do, rv, tv):
            return "P is recomputed as exp(S - max): use the saved logsumexp, P = exp(S - L), which is normalized."
        return ("dv = Pᵀ dO is wrong, so P is recomputed wrongly: P = exp(Q Kᵀ / √d - L) with the L the forward "
                "saved (mind the masks of the last, partial tiles of queries and keys).")
    return ("dv is right; check dP = dO Vᵀ, D = rowsum(dO ∘ O), dS = P ∘ (dP - D), then dq = scale · dS K and "
            "dk = scale · dSᵀ Q.")


_DQ_RACE = ("dq gets a contribution from every tile of keys: with one program (block) per key tile, several "
            "programs update the same rows of dq, so each update must be atomic (tl.atomic_add, atomicAdd into a "
            "float32 buffer); or compute dq in a pass of its own, one program per tile of queries looping over "
            "the keys.")


def check_attention_backward(fn, *, causal: bool = False, dtype=torch.float32, seed=None):
    """``fn(q, k, v, o, L, do)`` must return ``(dq, dk, dv)``, the gradients of
    ``o = attention(q, k, v)`` for the upstream gradient ``do``.

    q, k, v, o and do are of ``dtype``; o and L (float32 logsumexp, +inf for a query with no
    visible key) are the forward's outputs, computed in float64 and rounded. The gradients may
    be of ``dtype`` or float32. With ``causal=True``: ``fn(..., causal=True)``.
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"check_attention_backward: dtype must be float32, float16 or bfloat16, got {dtype}")
    g = _AttentionGrader("check_attention_backward", fn, seed, causal)
    base = _draw_cases(g, dtype, causal, backward=True) + [_d_large_case(g, dtype, causal)]
    attn = []
    for c in base:
        vals = _backward_inputs(c, dtype, causal, g.gen)
        attn.append(_Case(c.label, c.shape, vals, kind=c.kind))
    cases = []
    for c in attn:
        q, k, v, o, lse, do = c.values
        refs = attention_backward_ref64(q, k, v, do, causal)
        cases.append(_graded_case(c, refs[0]))
        cases[-1].extra.update(refs=refs, tols=backward_tolerances(q, k, v, do, causal, dtype, o=o))

    def outputs(case):
        B, H, nq, nk, d = case.extra["attn"].shape
        unwritten = ("is every row written? The last tile of queries (for dq) or of keys (for dk and dv) is partial: "
                     "the grid needs cdiv(N, BLOCK) programs.")
        return [_output(name, ref, (B, H, n, d), (torch.float32, dtype), tol, unwritten)
                for name, ref, tol, n in zip(("dq", "dk", "dv"), case.extra["refs"], case.extra["tols"],
                                             (nq, nk, nk))]

    def unpack(run):
        out = run.out
        if out is None:
            g.fail("your function returned None: return (dq, dk, dv).")
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            g.fail(f"your function returned {type(out).__name__}"
                   f"{f' of {len(out)} values' if isinstance(out, (tuple, list)) else ''}: return (dq, dk, dv).")
        return tuple(out)

    def diagnosis(run, wrong):
        gots = tuple(run.got[n] for n in ("dq", "dk", "dv"))
        return _backward_diagnosis(run.case.extra["attn"], causal, wrong, gots, run.case.extra["refs"],
                                   run.case.extra["tols"])

    # a race report names both accesses; in an attention backward it is nearly always dq
    worst = grade(g, cases, outputs, inputs=("q", "k", "v", "o", "L", "dO"), unpack=unpack, order=in_order,
                  races=_race_case, guard_hint=_GUARD_HINT, race_hint=_DQ_RACE, race_report_hint=_DQ_RACE,
                  report_all=diagnosis)
    shapes = ", ".join("x".join(map(str, c.shape)) for c in attn)
    success("check_attention_backward", cases, worst,
            f"dq, dk, dv, {DTYPE_NAMES[dtype]}{', causal' if causal else ''}; B x H x Nq x Nk x d = {shapes}")
