"""Bad input to the launchers a learner calls: a clear error or a correct result, never a crash
or a silent wrong answer (CONTRIBUTING.md, "Input rules").

Every launcher of every language (each topic's VERSIONS, BACKWARD_VERSIONS, FORWARDS and
BACKWARDS, and relu_backward, add_2d, row_max, rmsnorm, rmsnorm_backward) gets the kinds that
launch no kernel:

* each tensor argument in turn of the wrong dtype, on the wrong device, or not a tensor: a
  TypeError/ValueError that names the argument and says how to fix it;
* empty inputs (no elements, no rows, no columns, no queries, no keys): an empty result of the
  right shape, or the value an empty reduction has.

Each language's main launcher of each topic (and both designs of the attention backward) also
gets the kinds that run kernels, compared with a float64 reference: non-contiguous views, sizes
that are not multiples of a block (1, 17), 0-d and 3-D tensors, a LayerNorm without bias,
attention with Nq != Nk, N = 1 and an unusual head dimension; and mismatched shapes or dtypes
between arguments, which are refused.
"""
import math
import re

import pytest
import torch
import torch.nn.functional as F

import kernels
import utils
from kernels.frames.attention import attention_backward_ref, attention_ref, causal_mask

LANGS = ("cuda", "numba", "triton")
OTHER_DEVICE = "meta" if utils.SIMULATE else "cpu"
F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16


def rn(*shape, dtype=F32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(utils.DEVICE)


# ---------------------------------------------------------------------------------------
# float64 references
def ref_attention(q, k, v, causal=False):
    """(o, L): L = +inf for a query that sees no key."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), -math.inf)
    lse = torch.logsumexp(s, -1)
    return attention_ref(q, k, v, causal), lse.masked_fill(lse == -math.inf, math.inf)


def ref_norm_backward(dy, x, w, *stats, rms=False):
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    if rms:
        F.rms_norm(x64, (x.shape[-1],), w64, 1e-5).backward(dy.double())
        return x64.grad, w64.grad
    b64 = torch.zeros_like(w64, requires_grad=True)
    F.layer_norm(x64, (x.shape[-1],), w64, b64, 1e-5).backward(dy.double())
    return x64.grad, w64.grad, b64.grad


def norm_stats(x, rms=False):
    x64 = x.double().reshape(-1, x.shape[-1])
    if rms:
        return (1 / torch.sqrt((x64 * x64).mean(-1) + 1e-5)).float(),
    return x64.mean(-1).float(), (1 / torch.sqrt(x64.var(-1, unbiased=False) + 1e-5)).float()


def _row_max(x):
    x = x.double()
    return torch.full(x.shape[:-1], -math.inf, dtype=x.dtype) if x.shape[-1] == 0 else x.amax(-1)


# ---------------------------------------------------------------------------------------
# The families of launchers: argument names, valid small inputs, the float64 reference.
class Family:
    def __init__(self, names, good, ref, dtype=F32):
        self.names, self.good, self.ref, self.dtype = names, good, ref, dtype


def _qkv(B=1, H=2, nq=9, nk=9, d=16, dtype=F32):
    return rn(B, H, nq, d, dtype=dtype), rn(B, H, nk, d, dtype=dtype, seed=1), rn(B, H, nk, d, dtype=dtype, seed=2)


def _attn_bwd_args(q, k, v, causal=False):
    o, lse = ref_attention(q, k, v, causal)
    return q, k, v, o.to(q.dtype), lse.float(), rn(*q.shape, dtype=q.dtype, seed=4)


def _ln_bwd_args(x, rms=False):
    w = rn(x.shape[-1], seed=1)
    return (rn(*x.shape, seed=3), x, w) + norm_stats(x, rms)


FAMILIES = {
    "relu": Family(("x",), lambda: (rn(37),), lambda x: torch.relu(x.double())),
    "gelu": Family(("x",), lambda: (rn(37),), lambda x: F.gelu(x.double(), approximate="tanh")),
    "relu_backward": Family(("grad_out", "x"), lambda: (rn(5, 6, seed=1), rn(5, 6)),
                            lambda g, x: torch.where(x.double() > 0, g.double(), 0.0)),
    "add": Family(("x", "y"), lambda: (rn(5, 6), rn(5, 6, seed=1)), lambda x, y: x.double() + y.double()),
    "add_2d": Family(("x", "y"), lambda: (rn(5, 6), rn(5, 6, seed=1)), lambda x, y: x.double() + y.double()),
    "sum": Family(("x",), lambda: (rn(37),), lambda x: x.double().sum()),
    "row_max": Family(("x",), lambda: (rn(3, 7),), _row_max),
    "softmax": Family(("x",), lambda: (rn(3, 7),), lambda x: torch.softmax(x.double(), -1)),
    "matmul": Family(("a", "b"), lambda: (rn(5, 6), rn(6, 7, seed=1)), lambda a, b: a.double() @ b.double()),
    "matmul_fp16": Family(("a", "b"), lambda: (rn(5, 6, dtype=F16), rn(6, 7, dtype=F16, seed=1)),
                          lambda a, b: a.double() @ b.double(), F16),
    "layernorm": Family(("x", "w", "b"), lambda: (rn(3, 7), rn(7, seed=1), rn(7, seed=2)),
                        lambda x, w, b: F.layer_norm(x.double(), (x.shape[-1],), w.double(),
                                                     None if b is None else b.double(), 1e-5)),
    "rmsnorm": Family(("x", "w"), lambda: (rn(3, 7), rn(7, seed=1)),
                      lambda x, w: F.rms_norm(x.double(), (x.shape[-1],), w.double(), 1e-5)),
    "layernorm_backward": Family(("dy", "x", "w", "mean", "rstd"), lambda: _ln_bwd_args(rn(3, 7)),
                                 ref_norm_backward),
    "rmsnorm_backward": Family(("dy", "x", "w", "rstd"), lambda: _ln_bwd_args(rn(3, 7), rms=True),
                               lambda *a: ref_norm_backward(*a, rms=True)),
    # lesson 12: C = A @ B^T, both operands K-major, bfloat16 only (TMA and wgmma)
    "hopper": Family(("a", "b"), lambda: (rn(5, 24, dtype=BF16), rn(7, 24, dtype=BF16, seed=1)),
                     lambda a, b: a.double() @ b.double().T, BF16),
    "attention": Family(("q", "k", "v"), _qkv, ref_attention),
    "attention_fp16": Family(("q", "k", "v"), lambda: _qkv(dtype=F16), ref_attention, F16),
    "attention_backward": Family(("q", "k", "v", "o", "lse", "do"), lambda: _attn_bwd_args(*_qkv()),
                                 lambda q, k, v, o, lse, do, causal=False:
                                 attention_backward_ref(q, k, v, do, causal)),
}


def launchers(lang):
    """``[(name, family, launcher, main)]``: every launcher of one language; ``main`` marks the
    one each topic's module calls the reference (and both designs of the attention backward)."""
    out = []

    def table(topic, family, tab="VERSIONS", ref="REFERENCE", prefix=None):
        mod = kernels.module(topic, lang)
        for v, entry in getattr(mod, tab).items():
            fn = entry if callable(entry) else entry[1]
            fam = family(v) if callable(family) else family
            main = v == getattr(mod, ref) or tab == "BACKWARDS"
            out.append((f"{prefix or topic}.{v}", fam, fn, main))
        return mod

    m = table("relu", "relu")
    out.append(("relu_backward", "relu_backward", m.relu_backward, True))
    table("gelu", "gelu")
    m = table("add", "add")
    out.append(("add_2d", "add_2d", m.add_2d, True))
    m = table("reduction", "sum", prefix="sum")
    out.append(("row_max", "row_max", m.row_max, True))
    table("softmax", "softmax")
    table("matmul", "matmul")
    table("matmul_fp16", "matmul_fp16")
    m = table("layernorm", "layernorm")
    out.append(("rmsnorm", "rmsnorm", m.rmsnorm, True))
    table("layernorm", "layernorm_backward", "BACKWARD_VERSIONS", "BACKWARD_REFERENCE", "layernorm_backward")
    out.append(("rmsnorm_backward", "rmsnorm_backward", m.rmsnorm_backward, True))
    if lang != "numba":  # Numba has no TMA or wgmma (lesson 12, section 12)
        table("hopper", "hopper")
    table("attention", lambda v: "attention_fp16" if lang == "cuda" and v == "v3" else "attention", "FORWARDS",
          prefix="attention_forward")
    table("attention", "attention_backward", "BACKWARDS", prefix="attention_backward")
    return out


ALL = [(lang, name, fam, fn) for lang in LANGS for name, fam, fn, _ in launchers(lang)]
MAIN = [(lang, name, fam, fn) for lang in LANGS for name, fam, fn, main in launchers(lang) if main]


def _ids(cases):
    return [f"{lang}-{name}" for lang, name, _, _ in cases]


# ---------------------------------------------------------------------------------------
# Comparing with the float64 reference
def assert_matches(got, want, what=""):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) >= len(want), f"{what}: got {type(got).__name__}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_matches(g, w, f"{what}[{i}]")
        return
    assert isinstance(got, torch.Tensor), f"{what}: got {type(got).__name__}, not a tensor"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    assert got.device.type == utils.DEVICE.type, f"{what}: on {got.device}"
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    finite = torch.isfinite(w)
    assert torch.equal(torch.isfinite(g), finite) and torch.equal(g[~finite], w[~finite]), \
        f"{what}: non-finite values differ: {g.flatten()[:8].tolist()} vs {w.flatten()[:8].tolist()}"
    if not bool(finite.any()):
        return
    tol = 2e-2 if got.dtype in (torch.float16, torch.bfloat16) else 2e-4
    scale = max(1.0, float(w[finite].abs().max()))
    err = float((g[finite] - w[finite]).abs().max())
    assert err <= tol * scale, f"{what}: max error {err:.3g} (tolerance {tol * scale:.3g}, dtype {got.dtype})"


def check_call(fn, fam, args, expect="ref", **kw):
    """Call ``fn(*args)``: ``expect`` is "ref" (the float64 reference's result), an exception
    type and the regex its message must match, or ("ref or", type, regex) for either."""
    ref = FAMILIES[fam].ref
    if expect == "ref" or expect[0] == "ref or":
        try:
            got = fn(*args, **kw)
        except Exception as e:
            if expect == "ref" or not isinstance(e, expect[1]):
                raise
            assert re.search(expect[2], str(e)), f"message {str(e)!r}"
            return
        assert_matches(got, ref(*args, **kw), fn.__name__)
        return
    err, pattern = expect
    with pytest.raises(err, match=pattern):
        fn(*args, **kw)


# ---------------------------------------------------------------------------------------
# Every launcher: wrong dtype, wrong device, not a tensor; empty inputs
@pytest.mark.parametrize("lang,name,fam,fn", ALL, ids=_ids(ALL))
def test_wrong_dtype_device_or_type_is_refused_clearly(lang, name, fam, fn):
    family = FAMILIES[fam]
    good = family.good()
    for i, arg in enumerate(family.names):
        def call(value):
            args = list(good)
            args[i] = value
            return fn(*args)
        with pytest.raises(TypeError, match=rf"\b{arg} must be .*float.*, got torch.int32: convert it with {arg}\."):
            call(torch.ones(good[i].shape, dtype=torch.int32, device=utils.DEVICE))
        with pytest.raises(ValueError, match=rf"\b{arg} is on {OTHER_DEVICE}.*move it with {arg}\.to\(utils.DEVICE\)"):
            call(torch.empty(good[i].shape, dtype=good[i].dtype, device=OTHER_DEVICE))
        with pytest.raises(TypeError, match=rf"\b{arg} must be a torch.Tensor, got list"):
            call(good[i].tolist())


def _empties(fam):
    """Inputs with nothing to compute, as tuples of arguments."""
    dt = FAMILIES[fam].dtype
    e = lambda *s: rn(*s, dtype=dt)  # noqa: E731
    if fam in ("relu", "gelu", "sum"):
        return [(e(0),), (e(3, 0),)]
    if fam in ("row_max", "softmax"):
        return [(e(0, 5),), (e(4, 0),)]
    if fam in ("relu_backward", "add", "add_2d"):
        return [(e(0, 5), e(0, 5)), (e(5, 0), e(5, 0))]
    if fam.startswith("matmul"):
        return [(e(0, 5), e(5, 3)), (e(4, 0), e(0, 3)), (e(4, 5), e(5, 0))]
    if fam == "hopper":
        return [(e(0, 5), e(3, 5)), (e(4, 0), e(3, 0)), (e(4, 5), e(0, 5))]
    if fam == "layernorm":
        return [(e(0, 7), e(7), e(7)), (e(4, 0), e(0), e(0))]
    if fam == "rmsnorm":
        return [(e(0, 7), e(7)), (e(4, 0), e(0))]
    if fam.endswith("norm_backward"):
        n = 2 if fam.startswith("layer") else 1
        return [(e(0, 7), e(0, 7), e(7)) + (e(0),) * n, (e(4, 0), e(4, 0), e(0)) + (e(4),) * n]
    if fam.startswith("attention"):
        cases = [_qkv(nq=0, dtype=dt), _qkv(nk=0, dtype=dt), _qkv(B=0, dtype=dt)]
        if fam == "attention_backward":
            cases = [_attn_bwd_args(*c) for c in cases]
        return cases
    raise KeyError(fam)


@pytest.mark.parametrize("lang,name,fam,fn", ALL, ids=_ids(ALL))
def test_empty_input_gives_an_empty_result(lang, name, fam, fn):
    for args in _empties(fam):
        kw = {"stats": True} if fam in ("layernorm", "rmsnorm") else {}
        got = fn(*args, **kw)
        if fam in ("layernorm", "rmsnorm"):
            # The statistics of rows with no columns are NaN (torch's mean of nothing), not
            # whatever memory the outputs were allocated in.
            x = args[0]
            y, stats = got[0], got[1:]
            assert_matches(y, FAMILIES[fam].ref(*args), name)
            for s in stats:
                assert s.shape == (x.shape[0],) and (x.shape[1] or bool(torch.isnan(s).all())), s
            continue
        if fam.endswith("norm_backward"):
            assert_matches(got, ref_norm_backward(*args, rms=fam.startswith("rms")), name)
            continue
        if fam == "attention_backward":
            q, k, v = args[:3]
            assert_matches(got, (torch.zeros(q.shape), torch.zeros(k.shape), torch.zeros(v.shape)), name)
            continue
        assert_matches(got, FAMILIES[fam].ref(*args), name)


# ---------------------------------------------------------------------------------------
# The main launchers: awkward inputs that run kernels
def _kinds(fam):
    """kind -> (arguments, expectation) for ``check_call``."""
    dt = FAMILIES[fam].dtype
    r = lambda *s, seed=0: rn(*s, dtype=dt, seed=seed)  # noqa: E731
    if fam in ("relu", "gelu", "sum"):
        return {"transposed": ((r(6, 5).t(),), "ref"), "step": ((r(40)[::3],), "ref"), "one": ((r(1),), "ref"),
                "17": ((r(17),), "ref"), "0-d": ((torch.tensor(-1.5, device=utils.DEVICE),), "ref"),
                "3-D": ((r(2, 3, 5),), "ref")}
    if fam == "relu_backward":
        return {"transposed": ((r(6, 5, seed=1).t(), r(6, 5).t()), "ref"),
                "0-d": ((torch.tensor(2.0, device=utils.DEVICE), torch.tensor(0.5, device=utils.DEVICE)), "ref"),
                "mismatched shapes": ((r(4, 5), r(1, 5)),
                                      (ValueError, r"grad_out has shape \(4, 5\) but x has \(1, 5\)"))}
    if fam in ("add", "add_2d"):
        kinds = {"transposed": ((r(6, 5).t(), r(6, 5, seed=1).t()), "ref"),
                 "y transposed": ((r(5, 6), r(6, 5, seed=1).t()), "ref"),
                 "column step": ((r(4, 10)[:, ::2], r(4, 10, seed=1)[:, ::2]), "ref"),
                 "17": ((r(1, 17), r(1, 17, seed=1)), "ref"),
                 "mismatched shapes": ((r(4, 5), r(1, 5)), (ValueError, r"no broadcasting"))}
        if fam == "add":
            kinds["0-d"] = ((torch.tensor(1.5, device=utils.DEVICE), torch.tensor(2.0, device=utils.DEVICE)), "ref")
        else:
            kinds["1-D"] = ((r(7), r(7, seed=1)), (ValueError, r"2-D"))
        return kinds
    if fam in ("row_max", "softmax"):
        return {"transposed": ((r(6, 5).t(),), "ref"), "row step": ((r(10, 5)[::2],), "ref"),
                "1 x 1": ((r(1, 1),), "ref"), "17 columns": ((r(3, 17),), "ref"),
                "1-D": ((r(7),), (ValueError, r"2-D")), "3-D": ((r(2, 3, 5),), (ValueError, r"2-D"))}
    if fam.startswith("matmul"):
        other = F32 if dt == F16 else F16
        return {"a transposed": ((r(5, 17).t(), r(5, 9, seed=1)), "ref"),
                "b transposed": ((r(9, 5), r(9, 5, seed=1).t()), "ref"),
                "1 x 1 x 1": ((r(1, 1), r(1, 1, seed=1)), "ref"), "17 x 5 x 33": ((r(17, 5), r(5, 33, seed=1)), "ref"),
                "K mismatch": ((r(5, 6), r(7, 7)), (ValueError, r"cannot be multiplied")),
                "1-D": ((r(6), r(6, 7)), (ValueError, r"a must be 2-D")),
                "dtypes differ": ((r(5, 6), rn(6, 7, dtype=other)), (TypeError, r"b must be"))}
    if fam == "hopper":
        return {"a transposed": ((r(24, 5).t(), r(9, 24, seed=1)), "ref"),
                "b a column slice": ((r(9, 16), r(5, 32, seed=1)[:, ::2]), "ref"),
                "1 x 1 x 1": ((r(1, 1), r(1, 1, seed=1)), "ref"),
                "17 x 33 x 5": ((r(17, 5), r(33, 5, seed=1)), "ref"),
                "K mismatch": ((r(5, 6), r(7, 7)), (ValueError, r"the same K")),
                "1-D": ((r(6), r(7, 6)), (ValueError, r"a must be 2-D")),
                "dtypes differ": ((r(5, 6), rn(7, 6, dtype=F16)), (TypeError, r"b must be"))}
    if fam in ("layernorm", "rmsnorm"):
        wb = lambda c: (r(c, seed=1), r(c, seed=2))[:2 if fam == "layernorm" else 1]  # noqa: E731
        kinds = {"x transposed": ((r(6, 5).t(),) + wb(6), "ref"),
                 "w strided": ((r(4, 6), r(12, seed=5)[::2]) + wb(6)[1:], "ref"),
                 "1-D": ((r(7),) + wb(7), "ref"), "3-D": ((r(2, 3, 7),) + wb(7), "ref"),
                 "1 x 1": ((r(1, 1),) + wb(1), "ref"), "17 columns": ((r(3, 17),) + wb(17), "ref"),
                 "w of another length": ((r(3, 7), r(8)) + wb(7)[1:], (ValueError, r"w must have shape \(7,\)"))}
        if fam == "layernorm":
            kinds["no bias"] = ((r(3, 7), r(7, seed=1), None), "ref")
        return kinds
    if fam.endswith("norm_backward"):
        rms = fam.startswith("rms")
        args = lambda x: _ln_bwd_args(x, rms)  # noqa: E731
        t = lambda a: tuple(z.t().contiguous().t() if z.dim() == 2 else z for z in a)  # noqa: E731
        good = args(r(3, 7))
        return {"dy and x transposed": (t(args(r(3, 7))), "ref"), "1 x 1": (args(r(1, 1)), "ref"),
                "17 columns": (args(r(3, 17)), "ref"), "3-D": (args(r(2, 3, 5)), "ref"),
                "dy of another shape": ((r(4, 7),) + good[1:], (ValueError, r"dy must have x's shape")),
                "stats of another length": (good[:3] + (r(4),) * (1 if rms else 2),
                                            (ValueError, r"one value per row of x \(3\)"))}
    if fam.startswith("attention") and fam != "attention_backward":
        other = torch.bfloat16 if dt == F16 else F16  # a dtype the launcher takes, but not q's
        q, k, v = _qkv(dtype=dt)
        return {"transposed": (tuple(rn(1, 9, 2, 16, dtype=dt, seed=s).transpose(1, 2) for s in range(3)), "ref"),
                "Nq < Nk": (_qkv(nq=5, nk=9, dtype=dt), "ref"),
                "Nq > Nk, causal": (_qkv(nq=9, nk=5, dtype=dt) + (True,), "ref"),
                "N = 1": (_qkv(nq=1, nk=1, dtype=dt), "ref"),
                "Nq = 1, causal": (_qkv(nq=1, nk=9, dtype=dt) + (True,), "ref"),
                "3-D": ((q[:, 0], k[:, 0], v[:, 0]), "ref"),
                "d = 20": (_qkv(d=20, dtype=dt), ("ref or", ValueError, r"d = 20 is not supported")),
                "mixed dtypes": ((q, k.to(other), v), (TypeError, r"one dtype")),
                "k and v of other lengths": ((q, k, v[:, :, :5]), (ValueError, r"same B, H and d"))}
    if fam == "attention_backward":
        q, k, v, o, lse, do = _attn_bwd_args(*_qkv())
        t = lambda z: z.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
        return {"q, k, v transposed": ((t(q), t(k), t(v), o, lse, do), "ref"),
                "o, do transposed": ((q, k, v, t(o), lse, t(do)), "ref"),
                "Nq < Nk": (_attn_bwd_args(*_qkv(nq=5, nk=9)), "ref"),
                "N = 1": (_attn_bwd_args(*_qkv(nq=1, nk=1)), "ref"),
                "3-D": (tuple(z[:, 0] for z in (q, k, v, o, lse, do)), "ref"),
                "lse of another shape": ((q, k, v, o, lse[..., :-1], do),
                                         (ValueError, r"lse must have shape \(1, 2, 9\)"))}
    raise KeyError(fam)


MAIN_KINDS = [(lang, name, fam, fn, kind) for lang, name, fam, fn in MAIN for kind in _kinds(fam)]


@pytest.mark.parametrize("lang,name,fam,fn,kind", MAIN_KINDS,
                         ids=[f"{lang}-{name}-{kind}" for lang, name, _, _, kind in MAIN_KINDS])
def test_awkward_input_to_a_main_launcher(lang, name, fam, fn, kind):
    args, expect = _kinds(fam)[kind]
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    check_call(fn, fam, args, expect)
    for a, b in zip(args, before):  # a launcher never writes into its inputs
        assert not isinstance(a, torch.Tensor) or torch.equal(a, b), f"{name} changed an input"
