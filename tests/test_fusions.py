"""The fusions of lesson 11, bias + GELU and residual add + LayerNorm, in every language and
version against float64, their bad input, and their graders on right and wrong kernels."""
import pytest
import torch

import kernels
import utils
from utils.topics.bias_gelu import bias_gelu_backward_ref64, bias_gelu_input, bias_gelu_ref64
from utils.topics.residual_layernorm import residual_layernorm_input, residual_layernorm_ref64

LANGS = kernels.LANGUAGES


@pytest.mark.parametrize("lang", LANGS)
def test_bias_gelu_versions_and_backward(lang):
    mod = kernels.module("bias_gelu", lang)
    x, b = bias_gelu_input((5, 77), seed=1)
    for name, (_, fn) in mod.VERSIONS.items():
        torch.testing.assert_close(fn(x, b).double(), bias_gelu_ref64(x, b), rtol=1e-5, atol=1e-5)
    dy = torch.randn(5, 77, device=x.device)
    torch.testing.assert_close(mod.bias_gelu_backward(dy, x, b).double(), bias_gelu_backward_ref64(dy, x, b),
                               rtol=1e-5, atol=1e-5)
    # the backward is autograd's gradient of the forward
    z = (x.double() + b.double()).requires_grad_(True)
    torch.nn.functional.gelu(z, approximate="tanh").backward(dy.double())
    torch.testing.assert_close(bias_gelu_backward_ref64(dy, x, b), z.grad)
    with pytest.raises(ValueError, match=r"b must have shape \(77,\)"):
        mod.bias_gelu(x, b[:5])
    with pytest.raises(ValueError, match=r"b is on meta"):
        mod.bias_gelu(x, b.to("meta"))
    with pytest.raises(TypeError, match=r"x must be float32"):
        mod.bias_gelu(x.double(), b)
    assert mod.bias_gelu(torch.empty(0, 77, device=x.device), b).shape == (0, 77)
    torch.testing.assert_close(mod.bias_gelu(x.t().contiguous().t(), b).double(), bias_gelu_ref64(x, b),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lang", LANGS)
def test_residual_layernorm_versions(lang):
    mod = kernels.module("residual_layernorm", lang)
    x, r, w, b = residual_layernorm_input((7, 77), seed=2)
    for name, (_, fn) in mod.VERSIONS.items():
        h, y, mean, rstd = fn(x, r, w, b, stats=True)
        assert torch.equal(h, x + r)
        torch.testing.assert_close(y.double(), residual_layernorm_ref64(x, r, w, b), rtol=1e-4, atol=2e-4)
        torch.testing.assert_close(mean.double(), (x + r).double().mean(-1), rtol=1e-5, atol=1e-5)
    h, y = mod.residual_layernorm(x.reshape(7, 1, 77), r.reshape(7, 1, 77), w, b)  # any leading dims
    assert h.shape == y.shape == (7, 1, 77)
    with pytest.raises(ValueError, match=r"r has shape \(6, 77\) but x has \(7, 77\)"):
        mod.residual_layernorm(x, r[:6], w, b)
    with pytest.raises(ValueError, match=r"w must have shape \(77,\)"):
        mod.residual_layernorm(x, r, w[:5], b)
    empty = torch.empty(0, 77, device=x.device)
    h, y = mod.residual_layernorm(empty, empty, w, b)
    assert h.shape == y.shape == (0, 77)


def test_graders_accept_right_kernels():
    utils.check_bias_gelu(kernels.get("bias_gelu", "cuda"))
    utils.check_bias_gelu_backward(kernels.module("bias_gelu", "triton").bias_gelu_backward)
    utils.check_residual_layernorm(kernels.get("residual_layernorm", "triton"))


def test_graders_name_the_mistakes():
    tri = kernels.module("bias_gelu", "triton")
    import triton

    def bias_outside(x, b):
        y = torch.empty_like(x)
        tri.bias_gelu_kernel[(triton.cdiv(x.numel(), 256),)](x, torch.zeros_like(b), y, x.numel(), x.shape[1],
                                                            BLOCK_SIZE=256)
        tri.bias_add_kernel[(triton.cdiv(x.numel(), 256),)](y, b, y, x.numel(), x.shape[1], BLOCK_SIZE=256)
        return y
    with pytest.raises(utils.GradingError, match=r"bias was added after the GELU"):
        utils.check_bias_gelu(bias_outside, seed=1)

    def backward_at_x(dy, x, b):
        return tri.bias_gelu_backward(dy, x, torch.zeros_like(b))
    with pytest.raises(utils.GradingError, match=r"gelu' is taken at x, not at x \+ b"):
        utils.check_bias_gelu_backward(backward_at_x, seed=1)

    rl = kernels.module("residual_layernorm", "triton")

    def normalizes_x(x, r, w, b):
        h, _ = rl.residual_layernorm(x, r, w, b)
        _, y = rl.residual_layernorm(x, torch.zeros_like(r), w, b)
        return h, y
    with pytest.raises(utils.GradingError, match=r"y is the LayerNorm of x: it normalizes h = x \+ r"):
        utils.check_residual_layernorm(normalizes_x, seed=1)


@pytest.mark.parametrize("lang", LANGS)
def test_residual_layernorm_wide_rows(lang):
    """Rows wider than the values CUDA v2 keeps in registers (32 a lane of the row's warp): the
    rest are re-read from h; every language gets the same wide row."""
    cols = 32 * 32 + 37
    x, r, w, b = residual_layernorm_input((3, cols), seed=5)
    h, y, mean, rstd = kernels.get("residual_layernorm", lang)(x, r, w, b, stats=True)
    assert torch.equal(h, x + r)
    torch.testing.assert_close(y.double(), residual_layernorm_ref64(x, r, w, b), rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("lang", LANGS)
def test_bias_gelu_many_rows(lang):
    """More rows than one pass of the grid covers (CUDA's threads loop over groups of 4 rows),
    and a row count that is no multiple of 4."""
    mod = kernels.module("bias_gelu", lang)
    x, b = bias_gelu_input((37, 77), seed=3)
    dy = torch.randn(37, 77, device=x.device)
    for name, (_, fn) in mod.VERSIONS.items():
        torch.testing.assert_close(fn(x, b).double(), bias_gelu_ref64(x, b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mod.bias_gelu_backward(dy, x, b).double(), bias_gelu_backward_ref64(dy, x, b),
                               rtol=1e-5, atol=1e-5)
