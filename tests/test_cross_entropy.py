"""Cross-entropy launchers in every language and version against the float64 reference
(ignore_index, rows around +-500, bfloat16, in place), the halves the model's autograd uses,
bad input, and check_cross_entropy on right kernels and on the three classic mistakes."""
import pytest
import torch

import kernels
import utils
from utils.topics.cross_entropy import cross_entropy_input, cross_entropy_loss_ref64, cross_entropy_ref64

LANGS = kernels.LANGUAGES
ALL_VERSIONS = [(lang, name) for lang in LANGS for name, _ in kernels.versions("cross_entropy", lang)]
BF16_LANGS = ("cuda", "triton")


def _close(got, want, tol):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()  # the kernels' device may be a GPU
    assert got.shape == want.shape
    err = (got - want).abs()
    assert bool((err <= tol * (1 + want.abs())).all()), f"max error {float(err.max()):.3g}"


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_matches_float64_with_ignored_rows_and_large_logits(lang, version):
    fn = kernels.get("cross_entropy", lang, version)
    for shape in [(1, 1), (6, 260)]:
        x, t = cross_entropy_input(shape, seed=1)
        loss, grad = fn(x, t)
        assert loss.shape == () and grad.shape == x.shape and grad.dtype == x.dtype
        _close(loss, cross_entropy_loss_ref64(x, t), 1e-4)
        _close(grad, cross_entropy_ref64(x, t), 1e-4)
        x2 = x.clone()
        loss2, grad2 = fn(x2, t, inplace=True)
        assert grad2.data_ptr() == x2.data_ptr(), "inplace=True writes the gradient over the logits"
        _close(grad2, cross_entropy_ref64(x, t), 1e-4)
    # no row counts: NaN loss and zero gradient, as torch's
    loss, grad = fn(x, torch.full_like(t, -100))
    assert torch.isnan(loss) and bool((grad == 0).all())


@pytest.mark.parametrize("lang", BF16_LANGS)
def test_bfloat16_logits(lang):
    fn = kernels.get("cross_entropy", lang)
    x, t = cross_entropy_input((6, 300), seed=2, dtype=torch.bfloat16)
    loss, grad = fn(x, t)
    assert grad.dtype == torch.bfloat16
    _close(loss, cross_entropy_loss_ref64(x, t), 1e-4)
    want = cross_entropy_ref64(x, t)
    assert float((grad.double() - want).abs().max()) <= 2 ** -8 * float(want.abs().max()) + 1e-6


@pytest.mark.parametrize("lang", LANGS)
def test_forward_and_backward_halves(lang):
    """What an autograd function calls: loss and lse per row, then the backward for any dloss."""
    mod = kernels.module("cross_entropy", lang)
    x, t = cross_entropy_input((7, 45), seed=3)
    loss_rows, lse = mod.cross_entropy_forward(x, t)
    xd = x.double().requires_grad_(True)
    want = torch.nn.functional.cross_entropy(xd, t, reduction="none")
    _close(loss_rows, want.detach(), 1e-4)
    _close(lse, torch.logsumexp(x.double(), -1), 1e-5)
    dloss = torch.randn(7, device=x.device)
    want.backward(dloss.double())
    _close(mod.cross_entropy_backward(x, t, lse, dloss), xd.grad, 1e-4)


@pytest.mark.parametrize("lang", LANGS)
def test_bad_input_is_refused_clearly(lang):
    fn = kernels.get("cross_entropy", lang)
    x, t = cross_entropy_input((4, 9))
    with pytest.raises(TypeError, match=r"targets must be int64 .*targets.long\(\)"):
        fn(x, t.int())
    with pytest.raises(TypeError, match=r"logits must be float32"):
        fn(x.double(), t)
    with pytest.raises(ValueError, match=r"targets must have shape \(4,\)"):
        fn(x, t[:3])
    with pytest.raises(ValueError, match=r"logits must be 2-D"):
        fn(x[0], t)
    with pytest.raises(ValueError, match=r"logits is on meta.*logits.to\(utils.DEVICE\)"):
        fn(x.to("meta"), t)
    with pytest.raises(ValueError, match=r"targets is on meta"):
        fn(x, t.to("meta"))
    with pytest.raises(ValueError, match=r"no columns"):
        fn(torch.empty(4, 0, device=x.device), t)
    loss, grad = fn(torch.empty(0, 9, device=x.device), t[:0])  # no rows: the mean of nothing
    assert torch.isnan(loss) and grad.shape == (0, 9)
    # a transposed (non-contiguous) view is copied, and a target outside [0, V) gives NaN, never a stray read
    loss, grad = fn(x.t().contiguous().t(), t)
    _close(grad, cross_entropy_ref64(x, t), 1e-4)
    bad = t.clone()
    bad[0] = 9
    assert torch.isnan(fn(x, bad)[0])


def test_grader_accepts_the_reference_kernels():
    utils.check_cross_entropy(kernels.get("cross_entropy", "triton"))
    utils.check_cross_entropy(kernels.get("cross_entropy", "cuda"), dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------
# The classic mistakes, each a Triton kernel (fast in the interpreter) with the diagnosis it must get
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _mistaken_kernel(x_ptr, t_ptr, loss_ptr, g_ptr, rows, cols, n_valid, MISTAKE: tl.constexpr,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=float("-inf"))
    t = tl.load(t_ptr + row)
    if MISTAKE == 1:   # no max subtracted
        m = 0.0
    else:
        m = tl.max(x, axis=0)
    s = tl.sum(tl.exp(x - m), axis=0)
    lse = m + tl.log(s)
    x_t = tl.load(x_ptr + row * cols + t, mask=t != -100, other=0.0)
    denom = n_valid
    if MISTAKE == 2:   # the sum, not the mean
        denom = 1.0
    if MISTAKE == 3:   # ignored rows counted in the mean
        denom = rows * 1.0
    keep = t != -100
    g = (tl.exp(x - lse) - tl.where(offs == t, 1.0, 0.0)) / denom
    g = tl.where(keep, g, 0.0)
    tl.store(g_ptr + row * cols + offs, g, mask=mask)
    tl.atomic_add(loss_ptr, tl.where(keep, (lse - x_t) / denom, 0.0))


def _mistaken(mistake):
    def fn(x, t):
        rows, cols = x.shape
        n_valid = float(sum(1 for v in t.tolist() if v != -100))
        loss = torch.zeros((), device=x.device)
        g = torch.empty_like(x)
        _mistaken_kernel[(rows,)](x, t, loss, g, rows, cols, max(n_valid, 1.0), MISTAKE=mistake,
                                  BLOCK=triton.next_power_of_2(cols))
        return loss, g
    return fn


@pytest.mark.parametrize("mistake,cause", [
    (1, r"subtract the row's max before exp"),
    (2, r"the sum over the \d+ counted rows, not their mean"),
    (3, r"divided by all \d+ rows, but \d+ have the target ignore_index"),
])
def test_grader_names_the_mistake(mistake, cause):
    with pytest.raises(utils.GradingError, match=cause):
        utils.check_cross_entropy(_mistaken(mistake), seed=5)
