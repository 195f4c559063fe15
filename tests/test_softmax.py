"""Softmax launchers in every language and version: float64 references on awkward shapes,
large inputs (max subtraction), -inf entries, edge cases, input checks and the long-row
(online) path."""
import pytest
import torch

import kernels
import utils

LANGS = kernels.LANGUAGES
ALL_VERSIONS = [(lang, name) for lang in LANGS for name, _ in kernels.versions("softmax", lang)]
# One column; fewer columns than a warp; around a warp, a block and a float4; a row that
# needs several loop steps in the CUDA C++ and Numba kernels. (LONG_ROW takes several steps
# of the online Triton kernel, 8192 columns each.)
SHAPES = [(1, 1), (7, 3), (19, 37), (5, 257), (3, 1025), (2, 4099)]
#: Longer than one block/program can hold (16384 columns): the online path.
LONG_ROW = (2, 16384 + 1000)
TOL = utils.TOLERANCES[torch.float32]  # the course's one tolerance table
OTHER_DEVICE = "meta" if utils.SIMULATE else "cpu"


softmax64 = utils.topic("softmax").reference  # float64, from the topic's spec


def assert_softmax(y, x):
    assert y.shape == x.shape and y.dtype == torch.float32 and y.device.type == utils.DEVICE.type
    torch.testing.assert_close(y.double(), softmax64(x), **TOL)


def supports(lang, version, cols):
    """v2 (fused) holds the row in one block's registers, CUDA C++ v5 in registers and
    shared memory: they refuse longer rows."""
    mod = kernels.module("softmax", lang)
    if version == "v5" and lang == "cuda":
        return cols <= mod.onchip_max_cols(vec4=False)
    return not (version == "v2" and cols > mod.FUSED_MAX_COLS)


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_softmax_matches_float64(lang, version):
    fn = kernels.get("softmax", lang, version)
    for shape in SHAPES:
        x = 5 * torch.randn(shape, device=utils.DEVICE)
        y = fn(x)
        assert y.data_ptr() != x.data_ptr(), "a launcher returns a new tensor"
        assert_softmax(y, x)


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_softmax_large_values_need_the_max(lang, version):
    """exp(100) overflows float32: without subtracting the row max this gives inf/inf = NaN."""
    fn = kernels.get("softmax", lang, version)
    x = 100 + 50 * torch.randn(9, 70, device=utils.DEVICE)
    x[3] = 1e4  # a constant row of huge values: uniform 1/70
    x[5] = -1e4  # and of hugely negative ones: exp underflows to 0 without the max
    y = fn(x)
    assert torch.isfinite(y).all(), "NaN or inf: is the row max subtracted before exp?"
    assert_softmax(y, x)


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_softmax_minus_inf_entries(lang, version):
    """Masked entries (-inf, as in causal attention) get 0; the rest still sums to 1."""
    fn = kernels.get("softmax", lang, version)
    x = torch.randn(6, 45, device=utils.DEVICE)
    x[:, 40:] = float("-inf")
    x[2, :] = float("-inf")
    x[2, 44] = 1.0  # one finite value left: probability 1
    y = fn(x)
    assert_softmax(y, x)
    assert y[2, 44].item() == 1.0


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_softmax_edge_cases(lang, version):
    fn = kernels.get("softmax", lang, version)
    for shape in [(0, 5), (3, 0), (0, 0)]:
        y = fn(torch.empty(shape, device=utils.DEVICE))
        assert y.shape == shape
    x = torch.randn(33, 18, device=utils.DEVICE)
    assert_softmax(fn(x.t()), x.t())  # non-contiguous: over the last dim of the view
    big = torch.randn(4 * 65 + 1, device=utils.DEVICE)
    view = big[1:].view(4, 65)  # contiguous, but not 16-byte aligned
    assert_softmax(fn(view), view)


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_softmax_rejects_bad_input(lang, version):
    fn = kernels.get("softmax", lang, version)
    with pytest.raises(TypeError, match="float32"):
        fn(torch.ones(2, 8, dtype=torch.float64, device=utils.DEVICE))
    with pytest.raises(ValueError, match="2-D"):
        fn(torch.ones(8, device=utils.DEVICE))
    with pytest.raises(ValueError, match="2-D"):
        fn(torch.ones(2, 3, 4, device=utils.DEVICE))
    with pytest.raises(ValueError, match="utils.DEVICE"):
        fn(torch.ones(2, 8, device=OTHER_DEVICE))
    with pytest.raises(TypeError):
        fn([[1.0, 2.0]])


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_softmax_long_rows(lang, version):
    """Rows longer than one block: the online versions and the reference handle them, the
    fused version refuses with a message that points to the online one."""
    fn = kernels.get("softmax", lang, version)
    x = 5 * torch.randn(LONG_ROW, device=utils.DEVICE)
    x[1, -1] = 60.0  # the max in the last column: the tail and the rescaling both matter
    if supports(lang, version, LONG_ROW[1]):
        assert_softmax(fn(x), x)
    else:
        with pytest.raises(ValueError, match="online"):
            fn(x)


@pytest.mark.parametrize("kind", ["65536", "longest float4 row", "longest scalar row"])
def test_onchip_rows_held_in_registers_and_shared_memory(kind):
    """CUDA C++ v5 keeps the part of a row that registers cannot hold in shared memory (on an
    H100: 128 KiB of it at 65536 columns, all 227 KiB for the longest rows). The longest rows
    depend on this GPU's shared memory per block, so they are computed, not written down."""
    sm = kernels.module("softmax", "cuda")
    cols = {"65536": 65536, "longest float4 row": sm.onchip_max_cols(vec4=True),
            "longest scalar row": sm.onchip_max_cols(vec4=False) - 1}[kind]  # odd: the scalar kernel
    if sm.onchip_config(cols, vec4=cols % 4 == 0) is None:
        pytest.skip(f"this GPU's shared memory per block cannot hold {cols} columns")
    x = 5 * torch.randn(2, cols, device=utils.DEVICE)
    x[0, -1] = 60.0  # the max in the last column: it sits in the shared-memory part
    assert_softmax(sm.softmax_onchip(x), x)


def test_onchip_refuses_rows_too_long_for_one_sm():
    sm = kernels.module("softmax", "cuda")
    cols = sm.onchip_max_cols(vec4=True) + 4
    with pytest.raises(ValueError, match="online"):
        sm.softmax_onchip(torch.randn(1, cols, device=utils.DEVICE))
    x = torch.randn(1, cols, device=utils.DEVICE)
    assert_softmax(sm.softmax(x), x)  # the reference falls back to the online kernel


@pytest.mark.parametrize("lang", LANGS)
def test_online_rescaling(lang):
    """Increasing rows make the online running max grow at every step (every rescale runs)."""
    online = kernels.get("softmax", lang, "v3")
    x = torch.linspace(-50, 50, 3 * 1500, device=utils.DEVICE).reshape(3, 1500)
    x[1] = x[1].flip(0)  # decreasing: the max comes first, no rescale at all
    assert_softmax(online(x), x)


@pytest.mark.parametrize("lang", LANGS)
def test_reference_handles_every_benchmark_shape_kind(lang):
    """The reference picks by row length: short rows (fused) and long rows (online)."""
    mod = kernels.module("softmax", lang)
    assert mod.REFERENCE == list(mod.VERSIONS)[-1]
    assert mod.softmax is mod.VERSIONS[mod.REFERENCE][1]
    for cols in (1000, mod.FUSED_MAX_COLS, mod.FUSED_MAX_COLS + 1):
        x = 3 * torch.randn(1, cols, device=utils.DEVICE)
        assert_softmax(mod.softmax(x), x)


# --------------------------------------------------------------------------------------
# The grader rejects the wrong softmaxes lesson 05 warns about.
def test_grader_rejects_no_max_subtraction():
    def no_max(x):
        e = torch.exp(x)
        return e / e.sum(dim=-1, keepdim=True)

    with pytest.raises(utils.GradingError, match="max"):
        utils.check_softmax(no_max)


def test_grader_rejects_wrong_dim():
    with pytest.raises(utils.GradingError, match="dim 0"):
        utils.check_softmax(lambda x: kernels.get("softmax", "triton")(x.t().contiguous()).t().contiguous())
