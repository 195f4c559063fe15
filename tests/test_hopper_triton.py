"""Lesson 12 in Triton (kernels/triton/hopper.py): C = A @ B^T with TMA descriptors and a
persistent schedule, every version against the float64 product on awkward shapes (K not a
multiple of 8, so padded; N not a multiple of 8, so C written through an aligned buffer; empty
and K == 0), strided input, and the input rules. On a GPU the same tests run on the GPU, with
one larger shape that gives programs more than one tile each."""
from __future__ import annotations

import pytest
import torch

import kernels
import utils
from kernels.triton import hopper as H
from utils.topics.matmul import make_inputs, tolerance_for

SHAPES = [(1, 1, 1), (37, 45, 29), (130, 132, 72), (64, 48, 40), (0, 4, 8), (4, 0, 8), (5, 3, 0)]
if not utils.SIMULATE:
    SHAPES.append((2100, 2400, 264))  # 17 x 10 tiles of 128 x 256: more tiles than the H200's 132 SMs


def _inputs(shape, seed):
    """bfloat16 A (M, K) and B (N, K), entries in [-1, 1)."""
    a, b_kn = make_inputs(shape, seed=seed, dtype=torch.bfloat16)
    return a, b_kn.T.contiguous()


def _close(c, a, b):
    ref = H.hopper_ref(a, b)
    assert c.dtype == torch.bfloat16 and tuple(c.shape) == tuple(ref.shape)
    # float32 sums of K products (atol), then one rounding to bfloat16 (rtol), as for lesson 06's
    # bfloat16 matmul; tolerance_for takes B as (K, N)
    tol = tolerance_for(a, b.T, ref, dtype=torch.bfloat16)
    torch.testing.assert_close(c.double(), ref, atol=tol["atol"], rtol=tol["rtol"])


def test_versions_are_read_from_the_index():
    assert list(H.VERSIONS) == ["v1", "v2"]
    assert kernels.get("hopper", "triton") is H.hopper_gemm is H.VERSIONS[H.REFERENCE][1]
    assert all(desc and desc in H.__doc__ for desc, _ in H.VERSIONS.values())


@pytest.mark.parametrize("version", list(H.VERSIONS))
def test_versions_match_the_float64_product(version):
    fn = H.VERSIONS[version][1]
    for shape in SHAPES:
        a, b = _inputs(shape, seed=sum(shape))
        c = fn(a, b)
        _close(c, a, b)
        if shape[2] == 0:
            assert not bool(c.any()), f"{shape}: a sum of no products is 0"


@pytest.mark.parametrize("version", list(H.VERSIONS))
def test_strided_and_offset_inputs(version):
    fn = H.VERSIONS[version][1]
    a, b = _inputs((40, 24, 48), seed=3)
    a_view = torch.cat([a, a], dim=1)[:, 1:49]   # rows 96 elements apart, starting 2 bytes in
    b_view = torch.cat([b, b], dim=0)[::2]       # every other row
    assert not a_view.is_contiguous() and not b_view.is_contiguous()
    _close(fn(a_view, b_view), a_view, b_view)


@pytest.mark.parametrize("version", list(H.VERSIONS))
def test_bad_inputs_are_refused_clearly(version):
    fn = H.VERSIONS[version][1]
    a, b = _inputs((8, 16, 24), seed=1)
    with pytest.raises(TypeError, match=r"hopper_gemm_v\d: a must be bfloat16, got torch.float32"):
        fn(a.float(), b)
    with pytest.raises(TypeError, match=r"b must be bfloat16, got torch.float16"):
        fn(a, b.half())
    with pytest.raises(ValueError, match=r"a must be 2-D, got shape \(24,\)"):
        fn(a[0], b)
    with pytest.raises(ValueError, match=r"a is \(8, 24\) and b is \(16, 23\).*same K"):
        fn(a, b[:, :23])
    with pytest.raises(TypeError, match=r"a must be a torch.Tensor"):
        fn(a.tolist(), b)
