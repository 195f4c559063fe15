"""ReLU launchers in every language and version: results, edge cases, input checks."""
import pytest
import torch

import kernels
import utils

LANGS = kernels.LANGUAGES
ALL_VERSIONS = [(lang, name) for lang in LANGS for name, _ in kernels.versions("relu", lang)]
# Awkward sizes: empty, one element, less than a float4, a float4 plus a tail, one past a block.
SIZES = [0, 1, 3, 5, 257, 1025, 4099]


def randn_with_zeros(*shape):
    """Random values with exact zeros and negative zeros mixed in (ReLU's edge cases)."""
    x = torch.randn(*shape, device=utils.DEVICE)
    flat = x.view(-1)
    flat[::7] = 0.0
    flat[3::11] = -0.0
    return x


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
@pytest.mark.parametrize("n", SIZES)
def test_relu_matches_torch(lang, version, n):
    relu = kernels.get("relu", lang, version)
    x = randn_with_zeros(n)
    y = relu(x)
    assert y.shape == x.shape and y.dtype == torch.float32 and y.device == x.device
    assert y.data_ptr() != x.data_ptr() or n == 0, "a launcher returns a new tensor"
    torch.testing.assert_close(y, torch.relu(x), rtol=0, atol=0)


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_relu_keeps_shape_and_handles_strided_input(lang, version):
    relu = kernels.get("relu", lang, version)
    base = randn_with_zeros(19, 37)
    for x in (base.t(), base[:, 1:], base[::2]):       # transposed, offset, strided
        assert not x.is_contiguous()
        y = relu(x)
        assert y.shape == x.shape
        torch.testing.assert_close(y, torch.relu(x), rtol=0, atol=0)
    x = base.view(-1)[1:1 + 4 * 100]                    # contiguous but not 16-byte aligned
    torch.testing.assert_close(relu(x), torch.relu(x), rtol=0, atol=0)


@pytest.mark.parametrize("lang", LANGS)
def test_relu_refuses_float64(lang):
    """(int32, another device and a list are refused by every launcher: tests/test_bad_inputs.py.)"""
    with pytest.raises(TypeError, match="float32"):
        kernels.get("relu", lang)(torch.zeros(8, dtype=torch.float64, device=utils.DEVICE))


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("shape", [(0,), (1,), (1025,), (19, 37)])
def test_relu_backward(lang, shape):
    relu_backward = kernels.module("relu", lang).relu_backward
    x = randn_with_zeros(*shape)
    g = torch.randn(*shape, device=utils.DEVICE)
    got = relu_backward(g, x)
    expected = torch.where(x > 0, g, torch.zeros_like(g))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # the same as autograd's gradient of torch.relu
    xr = x.clone().requires_grad_()
    torch.relu(xr).backward(g)
    torch.testing.assert_close(got, xr.grad, rtol=0, atol=0)
    with pytest.raises(ValueError, match="shape"):
        relu_backward(torch.ones(3, device=utils.DEVICE), torch.ones(4, device=utils.DEVICE))


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_relu_passes_the_course_grader(lang, version, capsys):
    utils.check_relu(kernels.get("relu", lang, version))
    assert capsys.readouterr().out.strip(), "the grader prints one line on success"
