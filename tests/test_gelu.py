"""GELU launchers in every language and version, and the PyTorch baselines: agreement with
the float64 tanh-GELU reference, awkward sizes, edge cases and input checks."""
import sys

import pytest
import torch

import kernels
import utils
from kernels.cuda import gelu as gelu_cuda
from kernels.frames import gelu as gelu_frame

LANGS = kernels.LANGUAGES
ALL_VERSIONS = [(lang, name) for lang in LANGS for name, _ in kernels.versions("gelu", lang)]
# Awkward sizes: one element, less than a float4, a float4 plus a tail, around a block of
# 256 threads (CUDA C++, Numba) and of 1024 elements (Triton, v2's 4 x 256), and several blocks.
SIZES = [1, 3, 4, 5, 255, 257, 1023, 1025, 4099]
# float32 results against a float64 reference: a few float32 ulps.
TOL = utils.TOLERANCES[torch.float32]  # the course's one tolerance table


#: The float64 tanh-GELU of the topic's spec (utils/topics/gelu.py), checked against the
#: formula in tests/test_topics.py.
gelu64 = utils.topic("gelu").reference


def inputs(*shape, scale=3.0):
    """Random values plus the points where GELU changes character: 0, the tails, around -3."""
    x = scale * torch.randn(*shape, device=utils.DEVICE)
    flat = x.view(-1)
    special = torch.tensor([0.0, -0.0, 1e-6, -1e-6, -3.0, 3.0, -9.0, 9.0, -30.0, 30.0, -100.0, 100.0])
    k = min(flat.numel(), special.numel())
    flat[:k] = special[:k].to(flat.device)
    return x


def assert_gelu(y, x):
    assert y.shape == x.shape and y.dtype == torch.float32 and y.device == x.device
    torch.testing.assert_close(y.double(), gelu64(x), **TOL)


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
@pytest.mark.parametrize("n", SIZES)
def test_gelu_matches_float64_reference(lang, version, n):
    gelu = kernels.get("gelu", lang, version)
    x = inputs(n)
    y = gelu(x)
    assert y.data_ptr() != x.data_ptr(), "a launcher returns a new tensor"
    assert_gelu(y, x)


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_gelu_empty_and_shapes(lang, version):
    gelu = kernels.get("gelu", lang, version)
    for shape in [(0,), (0, 5), (3, 0)]:
        x = torch.empty(shape, device=utils.DEVICE)
        y = gelu(x)
        assert y.shape == x.shape and y.numel() == 0
    x = inputs(7, 3, 5)
    assert_gelu(gelu(x), x)  # any shape: the kernels see the flat array


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_gelu_strided_and_misaligned_input(lang, version):
    gelu = kernels.get("gelu", lang, version)
    base = inputs(19, 37)
    for x in (base.t(), base[:, 1:], base[::2]):       # transposed, offset rows, every other row
        assert not x.is_contiguous()
        assert_gelu(gelu(x), x)
    x = base.view(-1)[1:1 + 4 * 100 + 3]                # contiguous, 4 bytes past 16-byte alignment
    assert x.data_ptr() % 16 != 0
    assert_gelu(gelu(x), x)


@pytest.mark.parametrize("lang", LANGS)
def test_gelu_refuses_other_float_dtypes(lang):
    """(int32, another device and a list are refused by every launcher: tests/test_bad_inputs.py.)"""
    gelu = kernels.get("gelu", lang)
    for dtype in (torch.float64, torch.float16):
        with pytest.raises(TypeError, match="float32"):
            gelu(torch.zeros(8, dtype=dtype, device=utils.DEVICE))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf * 0 in the simulators
def test_special_values_follow_pytorch():
    """inf, -inf and nan give what PyTorch's own GELU gives (x * something: -inf -> nan)."""
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 88.0, -88.0, 0.0],
                     device=utils.DEVICE)
    expected = torch.nn.functional.gelu(x, approximate="tanh")
    for lang, version in ALL_VERSIONS:
        y = kernels.get("gelu", lang, version)(x)
        torch.testing.assert_close(y, expected, **TOL, equal_nan=True,
                                   msg=lambda m: f"{lang} {version}: {m}")


def test_pytorch_baselines_agree():
    x = inputs(4099)
    assert_gelu(gelu_frame.gelu_ref(x), x)
    assert gelu_frame.gelu_ref(x).dtype == torch.float32
    for name, (description, fn) in gelu_frame.BASELINES.items():
        if name != "torch.compile":  # compiles for tens of seconds on a CPU: the slow test below
            assert_gelu(fn(x), x)
    for lang in LANGS:  # one definition, in the frame, that every language's module re-exports
        mod = kernels.module("gelu", lang)
        assert mod.gelu_unfused_torch is gelu_frame.gelu_unfused_torch and mod.BASELINES is gelu_frame.BASELINES


@pytest.mark.slow
def test_torch_compile_baseline():
    """torch.compile of the op-by-op formula: compiles for tens of seconds on a CPU."""
    x = inputs(4099)
    assert_gelu(gelu_frame.gelu_compiled(x), x)


def test_unfused_is_one_op_per_step():
    """The unfused baseline really is unfused: nine elementwise aten ops, where F.gelu is one."""
    from torch.profiler import ProfilerActivity, profile
    x = inputs(1000)

    def aten_ops(fn):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn(x)
        return [e.name for e in prof.events()
                if e.name.startswith("aten::") and e.name not in ("aten::empty", "aten::empty_like",
                                                                   "aten::empty_strided")]

    unfused = aten_ops(gelu_frame.gelu_unfused_torch)
    fused = aten_ops(gelu_frame.gelu_torch)
    compute = [op for op in unfused if op in ("aten::mul", "aten::add", "aten::tanh")]
    assert len(compute) == 9, unfused
    assert "aten::gelu" in fused and not any(op in fused for op in ("aten::mul", "aten::tanh"))


def test_cuda_vectorized_kernel_uses_16_byte_accesses():
    """v2's whole point: its loads and stores are ld/st.global.v4.f32 (PTX from NVRTC's wheel)."""
    try:
        ptx = utils.cuda_ptx(gelu_cuda.SOURCE, "gelu_vec4_kernel")
    except utils.ToolkitMissing as e:
        if sys.platform == "linux":
            raise  # requirements.txt installs NVRTC's wheel on Linux
        pytest.skip(f"no PTX here: {e}")
    assert "ld.global.nc.v4.f32" in ptx or "ld.global.v4.f32" in ptx
    assert "st.global.v4.f32" in ptx
    # v1, by contrast, moves one float per instruction.
    v1 = utils.cuda_ptx(gelu_cuda.SOURCE, "gelu_kernel")
    bodies = {chunk.split("(")[0].strip(): chunk for chunk in v1.split(".entry")[1:]}
    v1_body = [b for name, b in bodies.items() if "gelu_kernel" in name and "vec4" not in name]
    assert v1_body and "ld.global" in v1_body[0] and "v4.f32" not in v1_body[0]


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_gelu_passes_the_course_grader(lang, version, capsys):
    utils.check_gelu(kernels.get("gelu", lang, version))
    assert capsys.readouterr().out.strip(), "the grader prints one line on success"
