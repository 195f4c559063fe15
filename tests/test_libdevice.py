"""libdevice in simulation (Triton's interpreter and Numba's simulator): every NVIDIA libdevice
function a kernel can call runs (but jn/yn, which say so), with the GPU's rounding where it is
exact (explicit rounding modes, conversions, integer helpers) and the GPU's formulas for the
fast approximations, bit for bit the CUDA emulator's intrinsics."""
import inspect
import math
import re

import numpy as np
import pytest
import torch

import utils

import triton
import triton.language as tl
from numba import cuda
from numba.cuda import libdevice as ld
from triton.language.extra import libdevice

sim_only = pytest.mark.skipif(not utils.SIMULATE, reason="about the simulators")
pytestmark = sim_only

F32 = np.float32


def nv():
    from triton.language.extra.cuda import libdevice as nvidia
    return nvidia


def signatures():
    """(symbol, argument dtypes, result dtype) of every function of NVIDIA's libdevice module,
    read from its source: each entry maps argument types to a __nv_* symbol."""
    src = inspect.getsource(nv())
    entry = re.compile(r'\(((?:core\.dtype\("\w+"\),?\s*)+)\):\s*\("(__nv_\w+)",\s*core\.dtype\("(\w+)"\)\)')
    out = {}
    for args, symbol, ret in entry.findall(src):
        out.setdefault(symbol, (re.findall(r'"(\w+)"', args), ret))
    return out


NP = {"fp32": np.float32, "fp64": np.float64, "int32": np.int32, "uint32": np.uint32,
      "int64": np.int64, "uint64": np.uint64}


def sample(dtype, n=64, seed=0):
    rng = np.random.default_rng(seed)
    dt = np.dtype(NP[dtype])
    if dt.kind == "f":
        return (rng.random(n) * 0.9 + 0.05).astype(dt)  # in every function's domain (acosh aside)
    return rng.integers(1, 1000, n).astype(dt)


def test_every_nvidia_libdevice_symbol_has_a_twin_but_jn_and_yn():
    from runtime.backends.libdevice import LibdeviceNotSimulated, evaluate
    sigs = signatures()
    assert len(sigs) > 250, len(sigs)  # the parse found the module's table
    missing = []
    for symbol, (args, ret) in sigs.items():
        try:
            out = evaluate(symbol, [sample(a, seed=k) for k, a in enumerate(args)], NP[ret])
        except LibdeviceNotSimulated:
            missing.append(symbol)
            continue
        assert out.dtype == np.dtype(NP[ret]) and out.shape == (64,), (symbol, out.dtype, out.shape)
    assert sorted(missing) == ["__nv_jn", "__nv_jnf", "__nv_yn", "__nv_ynf"]


@pytest.mark.parametrize("name, ref", [
    ("asin", math.asin), ("acos", math.acos), ("atan", math.atan), ("sinh", math.sinh),
    ("tanh", math.tanh), ("erf", math.erf), ("erfc", math.erfc), ("expm1", math.expm1),
    ("log1p", math.log1p), ("lgamma", math.lgamma), ("tgamma", math.gamma), ("cbrt", np.cbrt),
    ("exp10", lambda v: 10.0 ** v), ("rsqrt", lambda v: 1 / math.sqrt(v)),
    ("normcdf", lambda v: 0.5 * math.erfc(-v / math.sqrt(2))),
])
def test_math_functions_are_the_named_function_rounded_once(name, ref):
    from runtime.backends.libdevice import evaluate
    x = np.linspace(0.05, 0.95, 37, dtype=F32)
    got = evaluate(f"__nv_{name}f", [x], F32)
    want = np.array([ref(float(v)) for v in x]).astype(F32)
    np.testing.assert_array_max_ulp(got, want, maxulp=1)
    got64 = evaluate(f"__nv_{name}", [x.astype(np.float64)], np.float64)
    np.testing.assert_allclose(got64, [ref(float(v)) for v in x], rtol=1e-14)


def test_sinpi_and_cospi_are_exact_at_half_integers():
    from runtime.backends.libdevice import evaluate
    x = np.array([0.5, 1.0, 1.5, 2.0, -0.5, 2.0 ** 22 + 0.5], F32)
    assert evaluate("__nv_cospif", [x], F32).tolist() == [0, -1, 0, 1, 0, 0]
    assert evaluate("__nv_sinpif", [x], F32).tolist() == [1, 0, -1, 0, -1, 1]


def ev(symbol, *args, out=F32):
    from runtime.backends.libdevice import evaluate
    return evaluate(symbol, [np.asarray(a) for a in args], out)


def test_explicit_rounding_modes_round_the_exact_result_in_their_direction():
    one, tiny = F32([1.0]), F32([2.0 ** -30])
    up = np.nextafter(F32(1), F32(2))
    assert ev("__nv_fadd_rn", one, tiny)[0] == 1 and ev("__nv_fadd_rz", one, tiny)[0] == 1
    assert ev("__nv_fadd_ru", one, tiny)[0] == up and ev("__nv_fadd_rd", one, tiny)[0] == 1
    assert ev("__nv_fadd_rd", -one, -tiny)[0] == -up and ev("__nv_fadd_rz", -one, -tiny)[0] == -1
    # ties go to the even neighbour
    assert ev("__nv_fadd_rn", one, F32([2.0 ** -24]))[0] == 1
    assert ev("__nv_fadd_rn", F32([1 + 2.0 ** -23]), F32([2.0 ** -24]))[0] == F32(1 + 2.0 ** -22)
    # an exact zero sum is -0 only when rounding down
    assert not np.signbit(ev("__nv_fadd_rn", one, -one)[0]) and np.signbit(ev("__nv_fadd_rd", one, -one)[0])
    lo, hi = ev("__nv_fdiv_rd", one, F32([3]))[0], ev("__nv_fdiv_ru", one, F32([3]))[0]
    assert float(lo) < 1 / 3 < float(hi) and np.nextafter(lo, F32(1)) == hi
    lo, hi = ev("__nv_fsqrt_rd", F32([2]))[0], ev("__nv_fsqrt_ru", F32([2]))[0]
    assert float(lo) < math.sqrt(2) < float(hi) and np.nextafter(lo, F32(2)) == hi
    assert ev("__nv_fsqrt_rn", F32([4]))[0] == 2 and ev("__nv_fsqrt_ru", F32([4]))[0] == 2
    assert ev("__nv_frcp_rz", F32([3]))[0] == ev("__nv_fdiv_rz", one, F32([3]))[0]
    # float64: dadd_ru of 1 and 2^-60 is the next double
    assert ev("__nv_dadd_ru", [1.0], [2.0 ** -60], out=np.float64)[0] == math.nextafter(1.0, 2.0)
    assert ev("__nv_dsqrt_rn", [2.0], out=np.float64)[0] == math.sqrt(2.0)
    # overflow: to infinity when rounding to nearest or away, else the largest float
    big = F32([3e38])
    assert np.isinf(ev("__nv_fmul_rn", big, F32([2]))[0])
    assert ev("__nv_fmul_rz", big, F32([2]))[0] == np.finfo(F32).max


def test_fma_rounds_once():
    a = F32([1 + 2.0 ** -23])
    c = F32([-(1 + 2.0 ** -22)])
    assert ev("__nv_fmaf", a, a, c)[0] == F32(2.0 ** -46)  # a * a + c exactly
    assert (a * a + c)[0] == 0  # what a separate multiply and add give
    assert ev("__nv_fmaf_rd", a, a, c)[0] == F32(2.0 ** -46)
    d = np.float64(1 + 2.0 ** -52)
    assert ev("__nv_fma", [d], [d], [-(1 + 2.0 ** -51)], out=np.float64)[0] == 2.0 ** -104


def test_conversions_saturate_and_round_as_cvt():
    x = F32([2.5, 3.5, -2.5, np.nan, 3e9, -3e9, -0.7])
    assert ev("__nv_float2int_rn", x, out=np.int32).tolist() == [2, 4, -2, 0, 2**31 - 1, -2**31, -1]
    assert ev("__nv_float2int_rz", x, out=np.int32).tolist() == [2, 3, -2, 0, 2**31 - 1, -2**31, 0]
    assert ev("__nv_float2uint_rd", x, out=np.uint32).tolist() == [2, 3, 0, 0, 3000000000, 0, 0]
    assert ev("__nv_float2ll_ru", F32([1e20, -1e20, 2.1]), out=np.int64).tolist() == [2**63 - 1, -2**63, 3]
    n = np.int32([16777217, 16777219])  # between two floats: 2^24 + 1 and 2^24 + 3
    assert ev("__nv_int2float_rn", n).tolist() == [16777216, 16777220]
    assert ev("__nv_int2float_rz", n).tolist() == [16777216, 16777218]
    assert ev("__nv_int2float_ru", n).tolist() == [16777218, 16777220]
    lo, hi = ev("__nv_double2float_rd", [0.1])[0], ev("__nv_double2float_ru", [0.1])[0]
    assert float(lo) < 0.1 < float(hi) and np.nextafter(lo, F32(1)) == hi


def test_integer_and_bit_helpers():
    i32 = np.int32
    assert ev("__nv_popc", i32([-1, 0xF0F0]), out=i32).tolist() == [32, 8]
    assert ev("__nv_clz", i32([1, 0, -1]), out=i32).tolist() == [31, 32, 0]
    assert ev("__nv_ffs", i32([0, 8, -2**31]), out=i32).tolist() == [0, 4, 32]
    assert ev("__nv_brev", i32([1]), out=i32).tolist() == [-2**31]
    assert ev("__nv_byte_perm", i32([0x33221100]), i32([0x77665544]), i32([0x7531]), out=i32).tolist() == [0x77553311]
    assert ev("__nv_mulhi", i32([2**30, -1]), i32([8, 1]), out=i32).tolist() == [2, -1]
    assert ev("__nv_umulhi", np.uint32([2**32 - 1]), np.uint32([2**32 - 1]), out=np.uint32).tolist() == [2**32 - 2]
    assert ev("__nv_mul24", i32([0x00FFFFFF]), i32([2]), out=i32).tolist() == [-2]  # 24 bits, signed
    assert ev("__nv_hadd", i32([2**31 - 1]), i32([2**31 - 1]), out=i32).tolist() == [2**31 - 1]  # no overflow
    assert ev("__nv_rhadd", i32([1]), i32([2]), out=i32).tolist() == [2]
    assert ev("__nv_sad", i32([1]), i32([5]), np.uint32([10]), out=i32).tolist() == [14]
    assert ev("__nv_float_as_int", F32([1.0]), out=i32).tolist() == [0x3F800000]
    assert ev("__nv_hiloint2double", i32([0x3FF00000]), i32([0]), out=np.float64).tolist() == [1.0]


@triton.jit
def _asin_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # the Triton tutorial's pattern (07-extern-functions): the generic libdevice module
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, libdevice.asin(x), mask=mask)


@triton.jit
def _gelu_tanh(x):
    # NVIDIA's module, from a device function
    c = 0.7978845608028654
    return 0.5 * x * (1 + tl.extra.cuda.libdevice.tanh(c * (x + 0.044715 * x * x * x)))


@triton.jit
def _gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, _gelu_tanh(x), mask=mask)


def test_published_patterns_run_in_the_interpreter():
    x = torch.rand(1000) * 2 - 1
    y = torch.empty_like(x)
    _asin_kernel[(triton.cdiv(1000, 256),)](x, y, 1000, BLOCK=256)
    torch.testing.assert_close(y, torch.asin(x), rtol=1.2e-7, atol=0)
    g = torch.empty_like(x)
    _gelu_kernel[(triton.cdiv(1000, 256),)](x, g, 1000, BLOCK=256)
    torch.testing.assert_close(g, torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-6, atol=1e-7)
    # after the launch, the modules are Triton's again (nothing leaks out of the interpreter)
    assert libdevice.asin.__module__ == "triton.language.extra.libdevice"


@triton.jit
def _jn_kernel(x_ptr, y_ptr):
    x = tl.load(x_ptr + tl.arange(0, 16))
    tl.store(y_ptr + tl.arange(0, 16), libdevice.jn(2, x))


@triton.jit
def _fast_tanh_kernel(x_ptr, y_ptr):
    x = tl.load(x_ptr + tl.arange(0, 16))
    tl.store(y_ptr + tl.arange(0, 16), libdevice.fast_tanhf(x))


def test_what_has_no_twin_or_is_not_nvidias_says_so():
    x, y = torch.rand(16), torch.empty(16)
    with pytest.raises(Exception, match="__nv_jnf has no twin in Triton's interpreter"):
        _jn_kernel[(1,)](x, y)
    with pytest.raises(Exception, match="fast_tanhf is not in NVIDIA's libdevice"):
        _fast_tanh_kernel[(1,)](x, y)


FAST_CUDA = r"""
__global__ void fast_kernel(const float* x_ptr, const float* y_ptr, float* out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = x_ptr[i], y = y_ptr[i];
        out_ptr[0 * n + i] = __expf(x);
        out_ptr[1 * n + i] = __logf(fabsf(x));
        out_ptr[2 * n + i] = __powf(fabsf(x), y);
        out_ptr[3 * n + i] = __exp10f(x);
        out_ptr[4 * n + i] = __log2f(fabsf(x));
        out_ptr[5 * n + i] = __fdividef(x, y);
    }
}
"""


@triton.jit
def _fast_triton_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    y = tl.load(y_ptr + offs, mask=mask, other=1.0)
    tl.store(out_ptr + 0 * n + offs, libdevice.fast_expf(x), mask=mask)
    tl.store(out_ptr + 1 * n + offs, libdevice.fast_logf(tl.abs(x)), mask=mask)
    tl.store(out_ptr + 2 * n + offs, libdevice.fast_powf(tl.abs(x), y), mask=mask)
    tl.store(out_ptr + 3 * n + offs, libdevice.fast_exp10f(x), mask=mask)
    tl.store(out_ptr + 4 * n + offs, libdevice.fast_log2f(tl.abs(x)), mask=mask)
    tl.store(out_ptr + 5 * n + offs, libdevice.fast_dividef(x, y), mask=mask)


@cuda.jit
def _fast_numba_kernel(x, y, out):
    i = cuda.grid(1)
    n = x.size
    if i < n:
        out[0 * n + i] = ld.fast_expf(x[i])
        out[1 * n + i] = ld.fast_logf(abs(x[i]))
        out[2 * n + i] = ld.fast_powf(abs(x[i]), y[i])
        out[3 * n + i] = ld.fast_exp10f(x[i])
        out[4 * n + i] = ld.fast_log2f(abs(x[i]))
        out[5 * n + i] = ld.fast_fdividef(x[i], y[i])


def _fast_numba(x, y, out):
    n = x.numel()
    _fast_numba_kernel[(n + 255) // 256, 256](utils.to_numba(x), utils.to_numba(y), utils.to_numba(out))


def test_fast_approximations_match_the_cuda_emulators_intrinsics_bit_for_bit():
    g = torch.Generator().manual_seed(5)
    n = 1000
    x = torch.rand(n, generator=g) * 160 - 80
    y = torch.randn(n, generator=g) * 4
    y[:3] = torch.tensor([2.0 ** 127, -3e38, 2.0 ** 126])  # __fdividef's 0 range, and its edge
    cuda_out, triton_out, numba_out = torch.empty(6 * n), torch.empty(6 * n), torch.empty(6 * n)
    utils.cuda_kernel(FAST_CUDA, "fast_kernel")[(n + 255) // 256, 256](x, y, cuda_out, n)
    _fast_triton_kernel[(triton.cdiv(n, 256),)](x, y, triton_out, n, BLOCK=256)
    _fast_numba(x, y, numba_out)
    for k, name in enumerate(["expf", "logf", "powf", "exp10f", "log2f", "fdividef"]):
        a = cuda_out[k * n:(k + 1) * n].view(torch.int32)
        assert torch.equal(a, triton_out[k * n:(k + 1) * n].view(torch.int32)), ("triton", name)
        assert torch.equal(a, numba_out[k * n:(k + 1) * n].view(torch.int32)), ("numba", name)


@cuda.jit
def _numba_libdevice_kernel(x, out, bits):
    i = cuda.grid(1)
    if i < x.size:
        s, c = ld.sincosf(x[i])
        m, e = ld.frexpf(x[i])
        out[0, i] = s * s + c * c
        out[1, i] = m * ld.exp2f(ld.int2float_rn(e))
        out[2, i] = ld.fadd_rd(x[i], ld.float_as_int(1.0) * 0.0)
        out[3, i] = ld.tanhf(x[i])
        bits[i] = ld.popc(i) + ld.clz(i)


def test_numba_libdevice_runs_in_the_simulator():
    kernel = _numba_libdevice_kernel
    x = torch.linspace(-3, 3, 64)
    out, bits = torch.empty(4, 64), torch.empty(64, dtype=torch.int32)
    kernel[1, 64](utils.to_numba(x), utils.to_numba(out), utils.to_numba(bits))
    torch.testing.assert_close(out[0], torch.ones(64), rtol=1e-6, atol=0)
    assert torch.equal(out[1], x)  # frexp's mantissa times 2^exponent is x again, exactly
    assert torch.equal(out[2], x)
    torch.testing.assert_close(out[3].double(), torch.tanh(x.double()), rtol=2e-7, atol=1e-7)
    assert bits.tolist() == [bin(i).count("1") + (32 - i.bit_length()) for i in range(64)]
