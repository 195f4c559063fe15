"""The model's Triton matmuls (kernels/triton/linear.py): the bias epilogue and split-K against
float64, on awkward shapes, transposed operands and strided outputs; every split count gives
the sum of the whole K; bad input is refused."""
import pytest
import torch

import utils
from kernels.triton.linear import (
    MIN_SPLIT_K,
    SPLIT_TILE,
    linear,
    linear_into,
    linear_ref,
    matmul_into,
    splits_for,
    tma_layouts,
)


@pytest.fixture(autouse=True, scope="module")
def _one_config():
    """On a GPU, autotune over the small config only: these tests check values at many small
    shapes, and timing every config at each new shape would take minutes of compiling."""
    from kernels.triton import linear as lin
    saved = {}
    for name in ("linear_autotuned", "linear_tma_autotuned"):
        tuner = getattr(lin, name)
        if hasattr(tuner, "configs") and hasattr(tuner, "cache"):   # triton.autotune's Autotuner (a GPU)
            saved[name] = tuner.configs
            # the config with the smallest tile and fewest stages: one that fits any GPU's shared memory
            tuner.configs = [min(tuner.configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"],
                                                               c.num_stages))]
    yield
    for name, configs in saved.items():
        getattr(lin, name).configs = configs


def _rand(*shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(utils.DEVICE)


def _bound(a, b, out_dtype):
    """fp32 sums of K products (|error| grows like K * 2^-24 * sum |a||b|), plus one rounding to out's dtype."""
    mag = a.double().abs() @ b.double().abs()
    ulp = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[out_dtype]
    return a.shape[1] * 2.0 ** -24 * mag + ulp * mag + 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,N,K", [(37, 45, 5 * MIN_SPLIT_K + 7), (1, 33, 3 * MIN_SPLIT_K),
                                   (65, 1, 2 * MIN_SPLIT_K - 1)])
def test_split_k_matches_float64(dtype, M, N, K):
    a = _rand(K, M, dtype=dtype, seed=1).t()            # a transposed operand, as dY^T is read
    b = _rand(K, N, dtype=dtype, seed=2)
    want = a.double() @ b.double()
    bound = _bound(a, b, torch.float32)
    wide = torch.full((M, N + 3), float("nan"), device=utils.DEVICE)
    out = wide[:, 1:N + 1]                                  # a strided view; its neighbours must stay poisoned
    for splits in (1, 2, 3, 7, None):
        out.fill_(float("nan"))
        matmul_into(a, b, out, splits=splits)
        assert bool(((out.double() - want).abs() <= bound).all()), f"splits={splits}"
        assert bool(wide[:, 0].isnan().all()) and bool(wide[:, N + 1:].isnan().all()), "wrote outside out"


def test_splits_for_fills_the_gpu_only_when_needed():
    sms, t = 132, SPLIT_TILE
    assert splits_for(6 * t, 6 * t, 128 * MIN_SPLIT_K, sms) == 8        # 36 tiles (a 768 x 768 dW on a GPU): split
    assert splits_for(128 * t, 6 * t, 3 * MIN_SPLIT_K, sms) == 1        # 768 tiles: enough already
    assert splits_for(6 * t, 6 * t, MIN_SPLIT_K, sms) == 1              # too short a K to split
    assert splits_for(0, 0, MIN_SPLIT_K - 1, sms) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_bias_in_the_epilogue(dtype, bias):
    M, N, K = 33, 70, 45
    x, w = _rand(M, K, dtype=dtype, seed=3), _rand(N, K, dtype=dtype, seed=4)
    b = _rand(N, dtype=dtype, seed=5) if bias else None
    y = linear(x, w, b)
    assert y.dtype == dtype and y.shape == (M, N)
    want = linear_ref(x, w, b)
    bound = _bound(x, w.t(), dtype) + (0 if b is None else b.double().abs() * 2.0 ** -7)
    assert bool(((y.double() - want).abs() <= bound).all())
    out = torch.full((M, N), float("nan"), dtype=torch.float32, device=utils.DEVICE)
    linear(x, w, b, out=out)                                     # a float32 result of half operands
    assert bool(((out.double() - want).abs() <= _bound(x, w.t(), torch.float32) + 1e-5).all())


def test_empty_and_zero_k():
    a, b = _rand(4, 0, dtype=torch.float32, seed=6), _rand(0, 3, dtype=torch.float32, seed=7)
    out = torch.full((4, 3), float("nan"), device=utils.DEVICE)
    assert bool((matmul_into(a, b, out) == 0).all())
    bias = _rand(3, dtype=torch.float32, seed=8)
    y = linear(a, b.t(), bias)
    assert torch.equal(y.cpu(), bias.cpu().expand(4, 3))
    assert matmul_into(_rand(0, 5, dtype=torch.float32, seed=9), _rand(5, 2, dtype=torch.float32, seed=9),
                       torch.empty(0, 2, device=utils.DEVICE)).shape == (0, 2)


def test_bad_input():
    a, b = _rand(4, 5, dtype=torch.float32, seed=10), _rand(5, 3, dtype=torch.float32, seed=11)
    with pytest.raises(ValueError, match="shape"):
        matmul_into(a, b, torch.empty(3, 4, device=utils.DEVICE))
    with pytest.raises(TypeError, match="float"):
        matmul_into(a, b, torch.empty(4, 3, dtype=torch.int32, device=utils.DEVICE))
    with pytest.raises(ValueError, match="splits"):
        matmul_into(a, b, torch.empty(4, 3, device=utils.DEVICE), splits=0)
    with pytest.raises((TypeError, ValueError)):
        matmul_into(a, b.double(), torch.empty(4, 3, device=utils.DEVICE))
    with pytest.raises(ValueError, match="multiplied"):
        linear(a, _rand(3, 4, dtype=torch.float32, seed=12))
    with pytest.raises(ValueError, match="b must be"):
        linear(a, b.t(), _rand(4, dtype=torch.float32, seed=13))
    with pytest.raises(TypeError, match="b must be a float"):
        linear(a, b.t(), torch.arange(3, device=utils.DEVICE))


@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_tma_path_reads_transposed_operands(a_t, b_t, bias):
    """The persistent TMA kernel on each stored layout (a or b transposed, as dY^T and W^T are),
    a bias in its epilogue, half operands into bfloat16 or float32. Every stored row is 16-byte
    aligned (sizes that are multiples of 8), none a multiple of the tiles: the edges are TMA's
    zero fill and clipped stores."""
    M, N, K = 40, 56, 72
    a = _rand(K, M, dtype=torch.bfloat16, seed=14).t() if a_t else _rand(M, K, dtype=torch.bfloat16, seed=14)
    b = _rand(N, K, dtype=torch.bfloat16, seed=15).t() if b_t else _rand(K, N, dtype=torch.bfloat16, seed=15)
    bb = _rand(N, dtype=torch.bfloat16, seed=16) if bias else None
    want = a.double() @ b.double() + (0 if bb is None else bb.double())
    for odt in (torch.float32, torch.bfloat16):
        out = torch.full((M, N), float("nan"), dtype=odt, device=utils.DEVICE)
        linear_into(a, b, out, bb, 1, tma=True)
        bound = _bound(a, b, odt) + (0 if bb is None else bb.double().abs() * 2.0 ** -7)
        assert bool(((out.double() - want).abs() <= bound).all()), odt


def test_tma_refused_where_it_cannot_read():
    a = _rand(8, 9, dtype=torch.bfloat16, seed=17)                 # rows of 18 bytes: not 16-byte aligned
    b = _rand(9, 16, dtype=torch.bfloat16, seed=18)
    out = torch.empty(8, 16, dtype=torch.float32, device=utils.DEVICE)
    assert tma_layouts(a, b, out) is None
    with pytest.raises(ValueError, match="TMA cannot read"):
        linear_into(a, b, out, None, 1, tma=True)
    linear_into(a, b, out)                                           # the blocked kernel instead
    assert bool(((out.double() - a.double() @ b.double()).abs() <= _bound(a, b, torch.float32)).all())


def test_no_timing_while_a_graph_is_captured(monkeypatch):
    """A first call inside a CUDA Graph capture cannot time the candidates: it takes the rule,
    and keeps nothing, so the first call outside the capture still times them."""
    from kernels.triton import linear as lin
    monkeypatch.setattr(lin, "CHOICES", {})
    monkeypatch.setattr(lin, "_capturing", lambda: True)
    monkeypatch.setattr(lin, "_choose", lambda *args: pytest.fail("timed inside a capture"))
    a, b = _rand(20, 70, dtype=torch.bfloat16, seed=19), _rand(70, 24, dtype=torch.bfloat16, seed=20)
    out = torch.full((20, 24), float("nan"), device=utils.DEVICE)
    linear_into(a, b, out)
    assert lin.CHOICES == {}
    assert bool(((out.double() - a.double() @ b.double()).abs() <= _bound(a, b, torch.float32)).all())
