"""AdamW in every language and version against torch.optim.AdamW over 10 steps (a flat buffer
and a list of tensors, with clipping through grad_scale), the gradient norm, bad input, and
check_adamw / check_grad_norm on right kernels and on the classic mistakes."""
import pytest
import torch

import kernels
import utils
from utils.topics.adamw import adamw_step64

LANGS = kernels.LANGUAGES
ALL_VERSIONS = [(lang, name) for lang in LANGS for name, _ in kernels.versions("adamw", lang)]


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_ten_steps_match_torch_adamw(lang, version):
    fn = kernels.get("adamw", lang, version)
    mod = kernels.module("adamw", lang)
    torch.manual_seed(0)
    shapes = [(300,), (7, 11)]
    dev = utils.DEVICE
    params = [torch.randn(s).to(dev) for s in shapes]  # drawn on the CPU: the same numbers on every device
    ms, vs = [torch.zeros(s, device=dev) for s in shapes], [torch.zeros(s, device=dev) for s in shapes]
    ref = [torch.nn.Parameter(p.double().clone()) for p in params]
    opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)
    for t in range(1, 11):
        grads = [3 * torch.randn(s).to(dev) for s in shapes]
        norm, scale = mod.grad_norm(grads, max_norm=1.0)  # clipping, the factor left on the device
        fn(params, grads, ms, vs, step=t, lr=1e-2, beta1=0.9, beta2=0.95, weight_decay=0.1, grad_scale=scale)
        for r, g in zip(ref, grads):
            r.grad = g.double()
        want = torch.nn.utils.clip_grad_norm_(ref, 1.0)
        torch.testing.assert_close(norm.double(), want, rtol=1e-5, atol=1e-5)
        opt.step()
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.double(), r.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lang", LANGS)
def test_bad_input_is_refused_clearly(lang):
    fn = kernels.get("adamw", lang)
    dev = utils.DEVICE
    p, g, m = (torch.randn(10, device=dev) for _ in range(3))
    v = torch.rand(10, device=dev)  # a second moment is never negative
    with pytest.raises(ValueError, match=r"step must be an int >= 1"):
        fn(p, g, m, v, step=0)
    with pytest.raises(TypeError, match=r"grads must be float32"):
        fn(p, g.double(), m, v, step=1)
    with pytest.raises(ValueError, match=r"exp_avg has shape \(9,\) but params has \(10,\)"):
        fn(p, g, m[:9], v, step=1)
    with pytest.raises(ValueError, match=r"exp_avg_sq is on meta"):
        fn(p, g, m, v.to("meta"), step=1)
    with pytest.raises(ValueError, match=r"params must be contiguous"):
        fn(torch.randn(10, 2, device=dev)[:, 0], g, m, v, step=1)
    e = torch.empty(0, device=dev)
    assert fn(e, e, e, e, step=1) is e
    # a strided gradient is copied; the result is still right
    g2 = torch.randn(10, 2, device=dev)[:, 0]
    want = adamw_step64(p, g2, m, v, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2)[0]
    fn(p, g2, m, v, step=1)
    torch.testing.assert_close(p.double(), want, rtol=1e-5, atol=1e-6)


def test_graders_accept_right_kernels():
    utils.check_adamw(kernels.get("adamw", "triton"))
    utils.check_grad_norm(kernels.module("adamw", "cuda").grad_norm)


def _mistaken(variant):
    """An AdamW with a classic mistake: the Triton kernel called with wrong factors."""
    mod = kernels.module("adamw", "triton")

    def fn(p, g, m, v, *, step, lr, beta1, beta2, eps, weight_decay):
        h = mod.check_hyper(step, lr, beta1, beta2, eps, weight_decay)
        if variant == "no bias correction":
            h["step_size"], h["inv_sqrt_bc2"] = lr, 1.0
        if variant == "decay without lr":
            h["lr_wd"] = weight_decay
        s = torch.ones(1, device=p.device)  # the gradient's scale: on the kernels' device, as p
        mod.adamw_kernel[(1,)](p, g, m, v, s, h["lr_wd"], h["beta1"], h["beta2"], h["step_size"],
                               h["inv_sqrt_bc2"], h["eps"], p.numel(), BLOCK_SIZE=4096)
    return fn


@pytest.mark.parametrize("variant,cause", [("no bias correction", r"lacks the bias corrections"),
                                           ("decay without lr", r"not multiplied by lr")])
def test_check_adamw_names_the_mistake(variant, cause):
    with pytest.raises(utils.GradingError, match=cause):
        utils.check_adamw(_mistaken(variant), seed=1)


def test_check_grad_norm_names_a_missing_sqrt():
    mod = kernels.module("adamw", "triton")

    def no_sqrt(x):
        norm, _ = mod.grad_norm(x)
        return norm * norm  # (a torch op: the diagnosis comes first)

    with pytest.raises(utils.GradingError, match=r"sum of squares: the norm is its square root"):
        utils.check_grad_norm(no_sqrt, seed=1)
