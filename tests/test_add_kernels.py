"""The vector and matrix add launchers of lesson 01, in CUDA C++, Numba and Triton.

Awkward sizes (tails of every length), empty tensors, non-contiguous inputs, and bad
input that must give a clear error. Additions of float32 are exact in every language, so
results are compared bit for bit with torch.
"""
import pytest
import torch

import kernels
import utils

LANGS = list(kernels.LANGUAGES)
SIZES = [1, 7, 255, 256, 257, 1023, 1025, 4099]
SHAPES_2D = [(1, 1), (7, 3), (8, 32), (9, 33), (37, 61), (5, 257)]


def _versions():
    for lang in LANGS:
        for name in kernels.module("add", lang).VERSIONS:
            yield pytest.param(lang, name, id=f"{lang}-{name}")


def _randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(utils.DEVICE)


def _add_2d(lang):
    return kernels.module("add", lang).add_2d


def test_reference_is_a_version():
    for lang in LANGS:
        mod = kernels.module("add", lang)
        assert mod.REFERENCE in mod.VERSIONS
        assert kernels.get("add", lang) is mod.VERSIONS[mod.REFERENCE][1]
        assert mod.add is kernels.get("add", lang)


@pytest.mark.parametrize("lang,version", list(_versions()))
def test_add_awkward_sizes(lang, version):
    add = kernels.get("add", lang, version)
    for n in SIZES:
        x, y = _randn(n, seed=n), _randn(n, seed=n + 1)
        out = add(x, y)
        assert out.shape == x.shape and out.dtype == torch.float32 and out.device.type == utils.DEVICE.type
        assert torch.equal(out, x + y), f"{lang} {version}: wrong result for n={n}"
        assert out.data_ptr() not in (x.data_ptr(), y.data_ptr()), "the launcher must return a new tensor"


@pytest.mark.parametrize("lang,version", list(_versions()))
def test_add_keeps_shape_and_handles_views(lang, version):
    add = kernels.get("add", lang, version)
    x, y = _randn(3, 5, 7, seed=1), _randn(3, 5, 7, seed=2)
    assert torch.equal(add(x, y), x + y)
    # non-contiguous inputs: a transpose and a strided slice
    a, b = _randn(33, 17, seed=3), _randn(17, 33, seed=4)
    assert torch.equal(add(a.t(), b), a.t() + b)
    c, d = _randn(2 * 1025, seed=5), _randn(1025, seed=6)
    assert torch.equal(add(c[::2], d), c[::2] + d)
    # a view that starts mid-storage (not 16-byte aligned)
    e = _randn(1026, seed=7)
    assert torch.equal(add(e[1:], e[:-1]), e[1:] + e[:-1])


@pytest.mark.parametrize("lang,version", list(_versions()))
def test_add_empty(lang, version):
    add = kernels.get("add", lang, version)
    for shape in [(0,), (0, 5), (3, 0)]:
        x = torch.empty(shape, device=utils.DEVICE)
        out = add(x, x)
        assert out.shape == x.shape


@pytest.mark.parametrize("lang,version", list(_versions()))
def test_add_bad_input(lang, version):
    add = kernels.get("add", lang, version)
    x = _randn(10)
    with pytest.raises(TypeError, match="float32"):
        add(x.double(), x.double())
    with pytest.raises(TypeError, match="float32"):
        add(x, x.to(torch.int32))
    with pytest.raises(TypeError, match="torch.Tensor"):
        add(x, [1.0] * 10)
    with pytest.raises(ValueError, match="shape"):
        add(x, _randn(11))
    # a tensor on another device than the course's: the CPU on a GPU machine, "meta" here
    other = torch.device("cpu") if utils.DEVICE.type == "cuda" else torch.device("meta")
    with pytest.raises(ValueError, match="utils.DEVICE"):
        add(x, torch.empty(10, device=other))


@pytest.mark.parametrize("lang", LANGS)
def test_add_2d_shapes(lang):
    add_2d = _add_2d(lang)
    for i, shape in enumerate(SHAPES_2D):
        x, y = _randn(*shape, seed=10 + i), _randn(*shape, seed=20 + i)
        out = add_2d(x, y)
        assert out.shape == shape and out.is_contiguous()
        assert torch.equal(out, x + y), f"{lang} add_2d: wrong result for {shape}"


@pytest.mark.parametrize("lang", LANGS)
def test_add_2d_strided_views(lang):
    add_2d = _add_2d(lang)
    big = _randn(40, 70, seed=30)
    y = _randn(37, 61, seed=31)
    views = {
        "column slice": big[:37, 5:66],        # row stride 70, columns adjacent
        "every other row": _randn(74, 61, seed=32)[::2],
        "transpose": _randn(61, 37, seed=33).t(),  # columns not adjacent: copied
    }
    for what, v in views.items():
        assert torch.equal(add_2d(v, y), v + y), f"{lang} add_2d: wrong result for a {what}"
        assert torch.equal(add_2d(y, v), y + v), f"{lang} add_2d: wrong result for a {what} (second input)"


@pytest.mark.parametrize("lang", LANGS)
def test_add_2d_empty_and_bad_input(lang):
    add_2d = _add_2d(lang)
    for shape in [(0, 5), (4, 0)]:
        x = torch.empty(shape, device=utils.DEVICE)
        assert add_2d(x, x).shape == shape
    with pytest.raises(ValueError, match="2-D"):
        add_2d(_randn(10), _randn(10))
    with pytest.raises(ValueError, match="shape"):
        add_2d(_randn(4, 5), _randn(5, 4))
    with pytest.raises(TypeError, match="float32"):
        add_2d(_randn(4, 5).half(), _randn(4, 5).half())
