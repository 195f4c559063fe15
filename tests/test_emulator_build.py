"""The CPU emulator compiles a .cu file once for all of its kernels: the first kernel built
gives a library with an entry point for each plain __global__ function of the source, and
the others come from it. A kernel that cannot have such an entry gets a library of its own,
with the same messages as before."""
import sys
import uuid
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import utils
from runtime.backends.cuda import _emulator
from runtime.backends.cuda._source import adapt_for_emulator

pytestmark = pytest.mark.skipif(not utils.SIMULATE, reason="the CPU emulator's build")

TWO = r"""
__global__ void scale_kernel(const float* x_ptr, float* y_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = 2.0f * x_ptr[i];
}
template <typename T>
__global__ void copy_kernel(const T* x_ptr, T* y_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = x_ptr[i];
}
__global__ void twice_kernel(float* y_ptr) { y_ptr[threadIdx.x] *= 2.0f; }
__global__ void twice_kernel(int* y_ptr) { y_ptr[threadIdx.x] *= 2; }
__global__ void shift_kernel(const float* x_ptr, float* y_ptr, int n) {
    int unused = 0;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = x_ptr[i] + 1.0f;
}
"""


@pytest.fixture
def compiles(monkeypatch):
    """The list of the compiles g++ runs. The caches in memory start empty; each test's
    sources are new to the disk cache (a fresh token), whose files the test then removes."""
    for name, empty in (("_CACHE", {}), ("_SHARED", {}), ("_SHARED_FAILED", set())):
        monkeypatch.setattr(_emulator, name, empty)
    seen, outs, real = [], [], _emulator._compile

    def counted(full, out, *args):
        seen.append(full)
        outs.append(out)
        return real(full, out, *args)
    monkeypatch.setattr(_emulator, "_compile", counted)
    yield seen
    for out in outs:
        for suffix in (".so", ".warnings", ".failed"):
            out.with_suffix(suffix).unlink(missing_ok=True)


def fresh(text: str) -> str:
    return f"// {uuid.uuid4()}\n{text}"


def test_kernels_of_one_source_share_one_compile(tmp_path, compiles, capsys):
    path = tmp_path / "two.cu"
    path.write_text(fresh(TWO))
    assert _emulator.entry_kernels(TWO) == ("scale_kernel", "shift_kernel")
    scale = utils.cuda_kernel(path, "scale_kernel")
    shift = utils.cuda_kernel(path, "shift_kernel")
    assert len(compiles) == 1 and scale._lib.path == shift._lib.path
    assert capsys.readouterr().err.count("unused variable") == 2  # shown at each build, as before
    x = torch.arange(8, dtype=torch.float32)
    y = torch.zeros(8)
    scale[1, 8](x, y, 8)
    assert torch.equal(y, 2 * x)
    shift[1, 8](x, y, 8)
    assert torch.equal(y, x + 1)
    # a template instantiation: its own library
    copy = utils.cuda_kernel(path, "copy_kernel<float>")
    assert len(compiles) == 2 and copy._lib.path != scale._lib.path
    copy[1, 8](x, y, 8)
    assert torch.equal(y, x)
    # an overloaded name has no entry: its own build says what it said before
    with pytest.raises(utils.CudaCompileError, match="no __global__ function named `twice_kernel`"):
        utils.cuda_kernel(path, "twice_kernel")
    assert len(compiles) == 3
    # a new process: from the disk cache, no compile
    _emulator._CACHE.clear()
    _emulator._SHARED.clear()
    again = utils.cuda_kernel(path, "shift_kernel")
    assert len(compiles) == 3 and again._lib.path == shift._lib.path
    again[1, 8](x, y, 8)
    assert torch.equal(y, x + 1)


def test_fallbacks_keep_the_messages(tmp_path, compiles):
    # an entry that cannot be formed (a kernel the preprocessor removes): each kernel alone
    path = tmp_path / "gone.cu"
    path.write_text(fresh("#if 0\n__global__ void gone_kernel(float* y_ptr) {}\n#endif\n"
                    "__global__ void live_kernel(float* y_ptr) { y_ptr[threadIdx.x] = 1.0f; }\n"
                    "__global__ void other_kernel(float* y_ptr) { y_ptr[threadIdx.x] = 2.0f; }\n"))
    live = utils.cuda_kernel(path, "live_kernel")
    assert len(compiles) == 2 and "live_kernel" in compiles[1] and "emu_run_0" not in compiles[1]
    utils.cuda_kernel(path, "other_kernel")
    assert len(compiles) == 3  # the library of all kernels is not tried again
    y = torch.zeros(4)
    live[1, 4](y)
    assert torch.equal(y, torch.ones(4))
    # a compile error in the learner's code: the message of a kernel's own library
    bad = adapt_for_emulator(fresh("__global__ void a_kernel(float* y_ptr) { y_ptr[0] = undefined_name; }\n"
                             "__global__ void b_kernel(float* y_ptr) { y_ptr[0] = 1.0f; }\n"))
    errors = []
    for build in (_emulator.build, _emulator._build_one):
        with pytest.raises(utils.CudaCompileError) as err:
            build(bad, "b_kernel", "bad.cu", None)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "bad.cu:2" in errors[0] and "undefined_name" in errors[0]
    # a function declared but not defined is named
    missing = tmp_path / "missing.cu"
    missing.write_text(fresh("__device__ float helper(float v);\n"
                       "__global__ void a_kernel(float* y_ptr) { y_ptr[0] = helper(y_ptr[0]); }\n"
                       "__global__ void b_kernel(float* y_ptr) { y_ptr[0] = 1.0f; }\n"))
    with pytest.raises(utils.CudaCompileError, match=r"`helper\(float\)` is declared but not defined"):
        utils.cuda_kernel(missing, "b_kernel")


RACY = r"""
__global__ void neighbour_kernel(float* y_ptr) {
    __shared__ float s[64];
    s[threadIdx.x] = threadIdx.x;
    y_ptr[threadIdx.x] = s[(threadIdx.x + 1) % 64];   // no __syncthreads(): a race
}
"""


@pytest.mark.parametrize("split", [True, False], ids=["runtime object", "whole"])
def test_a_library_with_and_without_the_shared_runtime_object(split, monkeypatch):
    """With g++ the launcher's machinery comes from one object linked into every library; built
    whole (another compiler, or that object could not be made) a library behaves the same: it
    runs, names an out-of-bounds read, and reports a race."""
    if not split:
        monkeypatch.setattr(_emulator, "runtime_object", lambda cxx, flags: [])
    elif not _emulator.runtime_object(_emulator.compiler(), list(_emulator.CXX_FLAGS)):
        pytest.skip("the host compiler is not g++: libraries are built whole")
    tag = uuid.uuid4().hex[:8]  # a source of its own: no library from the cache
    k = utils.cuda_kernel(TWO.replace("2.0f * x_ptr[i]", f"2.0f * x_ptr[i]; // {tag}"), "scale_kernel")
    x, y = torch.randn(100), torch.zeros(100)
    k[1, 128](x, y, 100)
    torch.testing.assert_close(y, 2 * x)
    with pytest.raises(utils.KernelFault, match=r"read `x_ptr\[100\]`, past the end of argument `x_ptr`"):
        k[1, 128](x, y, 1000)
    with pytest.raises(utils.KernelRace):
        utils.cuda_kernel(RACY + f"// {tag}\n", "neighbour_kernel")[1, 64](torch.zeros(64))
