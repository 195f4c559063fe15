"""The toolchain without a CUDA toolkit: PTX, SASS and resources from NVIDIA's wheels, NVRTC's
verdict on emulated kernels, warnings, failed compiles, and the laptop mode of the suite."""
import os
import platform
import shutil
import sys
from pathlib import Path

import pytest
import torch

import runtime
import utils
from runtime.backends.cuda import _toolchain as tc

RELU = r"""
__global__ void relu_kernel(const float* x_ptr, float* y_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = fmaxf(x_ptr[i], 0.0f);
}
"""
# 64 live floats per thread, with at most 32 registers (two blocks of 1024 threads per SM): ptxas
# must spill.
SPILLS = r"""
__global__ void __launch_bounds__(1024, 2) spill_kernel(const float* x_ptr, float* y_ptr, int n) {
    float acc[64];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    #pragma unroll
    for (int k = 0; k < 64; ++k) acc[k] = x_ptr[(i + k * 977) % n];
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < 64; ++k) s += acc[k] * acc[(k * 7) % 64];
    if (i < n) y_ptr[i] = s;
}
"""
WHEELS_EXPECTED = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")
needs_nvrtc = pytest.mark.skipif(tc.nvrtc() is None and not WHEELS_EXPECTED,
                                 reason="NVIDIA publishes no NVRTC wheel for this platform")


def _system_roots_ever() -> list[str]:
    """Every place a system toolkit could be, including the variables laptop mode removed."""
    roots = {"/usr/local/cuda", *tc.HIDDEN.values()}
    for v in tc.SYSTEM_CUDA_VARIABLES:
        if os.environ.get(v):
            roots.add(os.environ[v])
    for r in list(roots):
        if os.path.exists(r):
            roots.add(os.path.realpath(r))
    return sorted(r for r in roots if r)


def test_the_wheels_are_there_where_nvidia_publishes_them():
    if not WHEELS_EXPECTED:
        pytest.skip("no NVIDIA wheels for this platform")
    assert tc.nvrtc() is not None, "NVRTC missing: requirements.txt installs nvidia-cuda-nvrtc on Linux"
    assert tc.find_tool("nvdisasm") is not None, "nvdisasm missing: requirements.txt installs nvidia-cuda-nvdisasm"


@needs_nvrtc
def test_ptx_sass_and_resources_of_a_kernel():
    ptx = utils.cuda_ptx(RELU, "relu_kernel", arch="sm_90")
    assert ".target sm_90" in ptx and ".entry _Z11relu_kernelPKfPfi" in ptx and "max.f32" in ptx
    sass = utils.cuda_sass(RELU, "relu_kernel", arch="sm_90")
    assert "LDG" in sass and "STG" in sass and "FMNMX" in sass and "EXIT" in sass
    assert ".text._Z11relu_kernelPKfPfi" in sass and not sass.rstrip().endswith("NOP ;")
    res = utils.cuda_resources(RELU, "relu_kernel", arch="sm_90")
    assert 4 <= res["registers"] <= 32
    assert res["spill_stores"] == res["spill_loads"] == res["shared_bytes"] == res["local_bytes"] == 0
    assert res["max_threads_per_block"] == 1024 and res["arch"] == "sm_90"


@needs_nvrtc
def test_lineinfo_changes_no_instruction_and_no_resource():
    """utils.profile compiles a kernel once, with -lineinfo, for its SASS, its registers and the
    lines nvcc predicated: that is only right if the plain compile gives the same."""
    src = ("__global__ void k(float* out_ptr, const float* x_ptr, int n) {\n"
           "    __shared__ float s[128];\n"
           "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
           "    s[threadIdx.x] = i < n ? x_ptr[i] : 0.0f;\n"
           "    __syncthreads();\n"
           "    if (threadIdx.x == 0) atomicAdd(out_ptr, s[0] + s[127]);\n"
           "    if (i < n) out_ptr[1 + i] = atomicAdd(out_ptr + 1, 1.0f);\n"
           "}\n")
    plain, mangled = tc.compile_for_gpu(src, "k", "k.cu", None, "sm_90", "profile")
    lined, _ = tc.compile_for_gpu(src, "k", "k.cu", None, "sm_90", "profile", extra=["-lineinfo"])
    with_lines = tc.sass(lined.cubin, mangled, line_info=True)
    assert '//## File "' in with_lines and ("ATOM" in with_lines or "RED" in with_lines)
    assert tc.without_line_comments(with_lines) == tc.sass(plain.cubin, mangled)
    assert tc.resources(lined.log, lined.ptx, mangled) == tc.resources(plain.log, plain.ptx, mangled)


@needs_nvrtc
def test_resources_show_spills_shared_memory_and_launch_bounds():
    res = utils.cuda_resources(SPILLS, "spill_kernel", arch="sm_90")
    assert res["registers"] <= 32
    assert res["spill_stores"] > 0 and res["spill_loads"] > 0 and res["local_bytes"] > 0
    assert res["max_threads_per_block"] == 1024
    bounded = RELU.replace("__global__ void", "__global__ void __launch_bounds__(256)")
    assert utils.cuda_resources(bounded, "relu_kernel")["max_threads_per_block"] == 256
    shared = r"""
template <int BLOCK>
__global__ void tile_kernel(const float* x_ptr, float* y_ptr) {
    __shared__ float tile[BLOCK];
    tile[threadIdx.x] = x_ptr[threadIdx.x];
    __syncthreads();
    y_ptr[threadIdx.x] = tile[BLOCK - 1 - threadIdx.x];
}
template __global__ void tile_kernel<128>(const float*, float*);
"""
    res = utils.cuda_resources(shared, "tile_kernel<128>", arch="sm_80")
    assert res["shared_bytes"] == 128 * 4 and res["arch"] == "sm_80"
    assert "tile_kernel" in utils.cuda_sass(shared, "tile_kernel<128>", arch="sm_80")


@needs_nvrtc
def test_arch_default_and_bad_arch():
    assert tc.default_arch() == ("sm_90" if not torch.cuda.is_available()
                                 else "sm_%d%d" % torch.cuda.get_device_capability())
    with pytest.raises(ValueError, match="sm_90"):
        utils.cuda_ptx(RELU, "relu_kernel", arch="hopper")
    with pytest.raises(utils.CudaCompileError, match="no __global__ function named `nope`"):
        utils.cuda_ptx(RELU, "nope")


def test_without_the_wheels_toolkit_features_say_what_to_install(monkeypatch):
    monkeypatch.setattr(tc, "_NVRTC", [None])
    with pytest.raises(utils.ToolkitMissing, match=r"nvidia-cuda-nvrtc.*requirements\.txt"):
        utils.cuda_ptx(RELU, "relu_kernel")
    monkeypatch.setattr(tc, "find_tool", lambda name: None)
    with pytest.raises(utils.ToolkitMissing, match="nvidia-cuda-nvdisasm"):
        tc.sass(b"", "k")
    # ... and emulated kernels still build and run (the GPU-compiler check needs NVRTC)
    k = utils.cuda_kernel(RELU.replace("relu_kernel", "relu_nonvrtc_kernel"), "relu_nonvrtc_kernel")
    x = torch.randn(300, device=utils.DEVICE)
    y = torch.empty(300, device=utils.DEVICE)
    k[2, 256](x, y, 300)
    torch.testing.assert_close(y, x.relu())


GPU_REJECTS = {
    "a host function called from a kernel": (r"""
float twice(float v) { return 2.0f * v; }
__global__ void host_call_kernel(float* y_ptr, int n) {
    int i = threadIdx.x;
    if (i < n) y_ptr[i] = twice(y_ptr[i]);
}
""", "host_call_kernel", r"host_call_kernel\.cu\(2\).*__device__"),
    "atomicMax on a float*": (r"""
__global__ void fmax_kernel(const float* x_ptr, float* out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicMax(out_ptr, x_ptr[i]);
}
""", "fmax_kernel", r"fmax_kernel\.cu\(4\).*atomicMax"),
}


@needs_nvrtc
@pytest.mark.skipif(not utils.SIMULATE, reason="on a GPU the kernel is compiled by NVRTC anyway")
@pytest.mark.parametrize("what", list(GPU_REJECTS))
def test_simulation_rejects_what_a_gpu_compiler_rejects(what):
    src, name, pattern = GPU_REJECTS[what]
    for _ in range(2):  # the second time from the cache, with the same message
        with pytest.raises(utils.CudaCompileError, match=rf"(?s)NVRTC.*{pattern}"):
            utils.cuda_kernel(src, name)


@pytest.mark.skipif(not utils.SIMULATE, reason="the emulator's compiler warnings")
def test_warnings_of_the_learners_code_show_and_the_emulators_do_not(capfd):
    src = r"""
__device__ float pick(float v) { if (v > 0.0f) return v; }
__global__ void warn_kernel(float* y_ptr, unsigned n) {
    for (int i = 0; i < n; ++i) y_ptr[i] = pick(y_ptr[i]);
}
"""
    utils.cuda_kernel(src, "warn_kernel")
    err = capfd.readouterr().err
    assert "warn_kernel.cu:2" in err and "return" in err
    assert "warn_kernel.cu:4" in err and "sign" in err
    assert "cuda_emu.h" not in err
    utils.cuda_kernel(RELU, "relu_kernel")
    assert capfd.readouterr().err == ""


@pytest.mark.skipif(not utils.SIMULATE, reason="uses the emulator's compiler")
def test_a_failed_compile_stops_the_older_kernel_of_that_name():
    good = RELU.replace("relu_kernel", "stale_kernel")
    old = utils.cuda_kernel(good, "stale_kernel")
    x = torch.randn(10)
    y = torch.empty(10)
    old[1, 32](x, y, 10)
    with pytest.raises(utils.CudaCompileError):
        utils.cuda_kernel(good.replace("fmaxf", "fmaxff"), "stale_kernel")
    with pytest.raises(utils.CudaCompileError, match="the last compile of `stale_kernel` failed"):
        old[1, 32](x, y, 10)
    new = utils.cuda_kernel(good, "stale_kernel")  # fixed: both run again
    new[1, 32](x, y, 10)
    old[1, 32](x, y, 10)
    torch.testing.assert_close(y, x.relu())


def test_emulator_cache_key_follows_compiler_flags_and_headers(monkeypatch):
    cxx = tc.host_compiler()
    key = tc.emulator_key(cxx, tc.EMU_FLAGS)
    assert tc.emulator_key(cxx, tc.EMU_FLAGS + ["-DX"]) != key
    monkeypatch.setattr(tc, "compiler_version", lambda c: "another compiler")
    assert tc.emulator_key(cxx, tc.EMU_FLAGS) != key
    monkeypatch.undo()
    monkeypatch.setattr(tc, "headers_digest", lambda d=None: "changed")
    assert tc.emulator_key(cxx, tc.EMU_FLAGS) != key
    for flags in (tc.EMU_FLAGS, tc.extension_flags()):  # one set of flags for every build
        assert "-fstack-clash-protection" in flags and "-w" not in flags


@pytest.mark.skipif(not tc.no_system_cuda(), reason="laptop mode (COURSE_NO_SYSTEM_CUDA=1, set by ./course test)")
def test_laptop_mode_uses_no_system_toolkit():
    """Nothing the course uses may come from a CUDA toolkit installed on the machine."""
    import numba.cuda  # noqa: F401  numba-cuda loads libcudart at import
    roots = _system_roots_ever()
    for v in tc.SYSTEM_CUDA_VARIABLES:
        assert v not in os.environ, f"{v} is still set"
    assert shutil.which("nvcc") is None or not any(shutil.which("nvcc").startswith(r) for r in roots)
    assert not any(Path(d, "nvcc").exists() for d in os.environ.get("PATH", "").split(os.pathsep) if d)
    if utils.SIMULATE and tc.nvrtc() is not None:
        utils.cuda_ptx(RELU, "relu_kernel")  # loads NVRTC and runs nvdisasm's lookup below
    found = [str(p) for p in (tc.nvrtc() and tc.nvrtc().path, tc.find_tool("nvdisasm"), tc.find_tool("ptxas"),
                              tc.find_tool("nvcc"), tc.find_library("libcudart.so")) if p] + tc.include_dirs()
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    loaded = sorted({line.split()[-1] for line in maps.splitlines() if "/" in line and ".so" in line})
    for path in found + loaded:
        real = os.path.realpath(path)
        assert not any(real.startswith(r + os.sep) or path.startswith(r + os.sep) for r in roots), \
            f"{path} comes from a system CUDA toolkit"
    assert tc.system_roots() == []


@pytest.mark.skipif(not utils.SIMULATE, reason="on a GPU, nvcc itself rejects the source")
def test_load_inline_rejects_a_torch_cuda_check_without_its_header(tmp_path):
    cuda = r"""
#include <torch/extension.h>
__global__ void fill_kernel(float* y_ptr) { y_ptr[threadIdx.x] = 1.0f; }
torch::Tensor fill(torch::Tensor y) {
    fill_kernel<<<1, 32>>>(y.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""
    decl = "torch::Tensor fill(torch::Tensor y);"
    # With the header, C10_CUDA_KERNEL_LAUNCH_CHECK builds and runs: tests/inline_ops.py's
    # extension (which tests/test_load_inline.py builds too: torch compiles it once for both)
    # includes c10/cuda/CUDAException.h and checks its launches with it.
    import inline_ops
    assert "#include <c10/cuda/CUDAException.h>" in inline_ops.CUDA
    assert "C10_CUDA_KERNEL_LAUNCH_CHECK();" in inline_ops.CUDA
    mod = inline_ops.build()
    x = torch.randn(100)
    assert torch.equal(mod.relu(x), torch.relu(x))
    # The same extension name with a source that lacks the header: rejected before any build.
    with pytest.raises(utils.CudaCompileError,
                       match=r"(?s)cuda\.cu\(6\).*C10_CUDA_KERNEL_LAUNCH_CHECK.*CUDAException\.h"):
        utils.load_inline(inline_ops.NAME, decl, cuda, functions=["fill"])
    with pytest.raises(utils.CudaCompileError, match=f"the last build of extension `{inline_ops.NAME}` failed"):
        mod.relu(x)  # the older build must not be graded
    from utils.extension import translate_source
    src = tmp_path / "fill.cu"
    src.write_text(cuda)
    with pytest.raises(utils.CudaCompileError, match=r"fill\.cu\(6\)"):
        translate_source(src, tmp_path / "out")


#: load_inline sources: host code (torch, a launch, pybind's declarations) around the kernels
#: of GPU_REJECTS; NVRTC compiles the kernels only, with the learner's line numbers.
INLINE_HOST = r"""
torch::Tensor run(torch::Tensor y) {
    KERNEL<<<1, 32>>>(ARGS);
    return y;
}
"""
INLINE_REJECTS = {
    "a host function called from a kernel": (r"""#include <torch/extension.h>
#include "common.h"
float twice(float v) { return 2.0f * v; }
__global__ void host_call_kernel(float* y_ptr, int n) {
    int i = threadIdx.x;
    if (i < n) y_ptr[i] = twice(y_ptr[i]);
}
""" + INLINE_HOST.replace("KERNEL", "host_call_kernel").replace("ARGS", "y.data_ptr<float>(), y.numel()"),
        r"cuda\.cu\(3\).*__device__"),
    "atomicMax on a float*": (r"""#include <torch/extension.h>
__global__ void fmax_kernel(const float* x_ptr, float* out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicMax(out_ptr, x_ptr[i]);
}
""" + INLINE_HOST.replace("KERNEL", "fmax_kernel").replace("ARGS", "y.data_ptr<float>(), y.data_ptr<float>(), 1"),
        r"cuda\.cu\(4\).*atomicMax"),
}
INLINE_GOOD = r"""#include <torch/extension.h>
#include <vector>
#include "common.h"
namespace py = pybind11;
constexpr int BLOCK = 256;
struct Scale { float a; Scale(float v) : a(v) {} __device__ float operator()(float x) const { return a * x; } };
float host_factor() { return 2.0f; }  // host only: no kernel calls it
template <typename T>
__device__ T relu(T v) { return v > T(0) ? v : T(0); }
__global__ void scaled_relu_kernel(const float* x_ptr, float* y_ptr, Scale s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = s(relu(x_ptr[i]));
}
torch::Tensor scaled_relu(torch::Tensor x) {
    CHECK_INPUT(x);
    auto y = torch::empty_like(x);
    int n = x.numel();
    scaled_relu_kernel<<<cdiv(n, BLOCK), BLOCK>>>(x.data_ptr<float>(), y.data_ptr<float>(), Scale(host_factor()), n);
    return y;
}
"""


def test_device_part_keeps_the_kernels_on_their_lines():
    part = tc.device_part(INLINE_GOOD)
    src, kept = INLINE_GOOD.splitlines(), part.splitlines()
    assert len(kept) == len(src)
    for line in (3, 5, 9, 10, 11, 12, 13):  # common.h, a constant, the device function, the kernel
        assert kept[line - 1] == src[line - 1]
    for line in (1, 2, 4, 7, 14, 15, 17, 18, 19):  # torch, pybind, an unused host function, host code
        assert kept[line - 1] == ""
    assert tc.device_part("torch::Tensor f(torch::Tensor x) { return x; }") is None


@needs_nvrtc
@pytest.mark.skipif(not utils.SIMULATE, reason="on a GPU, nvcc itself compiles the kernels")
@pytest.mark.parametrize("what", list(INLINE_REJECTS))
def test_load_inline_rejects_kernels_a_gpu_compiler_rejects(what, tmp_path):
    src, pattern = INLINE_REJECTS[what]
    for _ in range(2):  # a failure is not cached: the second time says the same
        with pytest.raises(utils.CudaCompileError, match=rf"(?s)NVRTC.*{pattern}"):
            utils.load_inline("nvrtc_reject_ext", "torch::Tensor run(torch::Tensor y);", src, functions=["run"],
                              build_directory=str(tmp_path))
    assert not list(tmp_path.glob("*.so")), "the check comes before the (much longer) build"


@needs_nvrtc
@pytest.mark.skipif(not utils.SIMULATE, reason="on a GPU, nvcc itself compiles the kernels")
def test_nvrtc_accepts_correct_mixed_host_and_device_code():
    tc.nvrtc_check_device_code(INLINE_GOOD, "cuda.cu")
    tc.nvrtc_check_device_code(INLINE_GOOD, "cuda.cu")  # from the cache


@needs_nvrtc
@pytest.mark.skipif(not utils.SIMULATE, reason="on a GPU, nvcc itself compiles the kernels")
def test_setup_py_sources_reject_kernels_a_gpu_compiler_rejects(tmp_path):
    from utils.extension import translate_source
    src = tmp_path / "bad_kernel.cu"
    src.write_text(INLINE_REJECTS["atomicMax on a float*"][0])
    with pytest.raises(utils.CudaCompileError, match=r"(?s)NVRTC.*bad_kernel\.cu\(4\).*atomicMax"):
        translate_source(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    good = tmp_path / "good_kernel.cu"
    good.write_text(INLINE_GOOD)
    assert translate_source(good, tmp_path / "out").exists()


def test_precompiled_emulator_header_changes_nothing(tmp_path, monkeypatch):
    """Kernel libraries compiled with cuda_emu.h precompiled are the same, byte for byte, as
    those compiled from the header's source, with the same warnings and error messages."""
    from runtime.backends.cuda import _emulator
    from runtime.backends.cuda._source import adapt_for_emulator
    src = adapt_for_emulator("__global__ void k(int* y_ptr) {\n    int unused = 1;\n    y_ptr[threadIdx.x] = 1;\n}\n")
    bad = adapt_for_emulator('__global__ void k(int* y_ptr) {\n    atomicAdd(y_ptr, "one");\n}\n')
    results = []
    for precompiled in (True, False):
        monkeypatch.setattr(runtime.paths, "CACHE_DIR", tmp_path / str(precompiled))
        monkeypatch.setattr(_emulator, "_CACHE", {})
        monkeypatch.setattr(_emulator, "_PCH", {})
        if not precompiled:
            monkeypatch.setattr(_emulator, "precompiled_header", lambda cxx, flags: [])
        lib = _emulator.build(src, "k", "k.cu", None)
        with pytest.raises(utils.CudaCompileError) as err:
            _emulator.build(bad, "k", "bad.cu", None)
        results.append((lib.path.read_bytes(), lib.path.with_suffix(".warnings").read_text(), str(err.value)))
    if "Free Software Foundation" in tc.compiler_version(tc.host_compiler()):  # g++: it was used
        assert list((tmp_path / "True" / "cuda-emu-pch").rglob("*.gch"))
    assert "unused variable" in results[0][1] and "cuda_emu.h" in results[0][2]
    assert results[0] == results[1]
