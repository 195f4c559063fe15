"""utils.extension: a setup.py project builds from the same sources with or without a GPU.

The project is written into a temporary directory: a .cu file with the kernel, its
launcher and the Python binding, and a plain .cpp helper.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import utils  # noqa: E402
from utils.extension import translate_source  # noqa: E402

KERNEL_CU = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include "common.h"

float scale_factor();  // from helper.cpp

__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}

torch::Tensor scale(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    CHECK_INPUT(x);
    auto y = torch::empty_like(x);
    int n = x.numel();
    if (n > 0) {
        scale_kernel<<<cdiv(n, 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), scale_factor(), n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("scale", &scale, "y = scale_factor() * x");
}
"""

HELPER_CPP = "float scale_factor() { return 2.5f; }\n"

SETUP_PY = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from setuptools import setup
from utils.extension import CUDAExtension, BuildExtension

setup(name="course_tiny_ext",
      ext_modules=[CUDAExtension("course_tiny_ext", ["tiny_kernel.cu", "helper.cpp"])],
      cmdclass={{"build_ext": BuildExtension}})
"""


@pytest.mark.slow  # (a build of torch's headers) what it proves, the default run proves as well:
# the setup.py project of lesson 02 (test_extension_project.py: launches, C10_CUDA_KERNEL_LAUNCH_CHECK,
# host code adapted, a .cu and a .cpp in one library) and load_inline (torch's headers and the
# emulator's in one translation unit); what is left is this project's shape, one .cu with everything
def test_setup_py_project_builds_and_runs(tmp_path):
    (tmp_path / "tiny_kernel.cu").write_text(KERNEL_CU)
    (tmp_path / "helper.cpp").write_text(HELPER_CPP)
    (tmp_path / "setup.py").write_text(SETUP_PY)
    env = dict(os.environ, MAX_JOBS="2")
    proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not list(tmp_path.glob("*.cu.cpp")), "translated sources belong in the build directory"
    so = next(tmp_path.glob("course_tiny_ext*.so"))
    spec = importlib.util.spec_from_file_location("course_tiny_ext", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.randn(1000, device=utils.DEVICE)
    assert torch.equal(mod.scale(x), 2.5 * x)
    with pytest.raises(RuntimeError, match="contiguous"):
        mod.scale(torch.randn(8, 8, device=utils.DEVICE).t())


def test_translation_keeps_lines_and_adapts_launches(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL_CU)
    out = translate_source(src, tmp_path / "out")
    text = out.read_text()
    assert out.parent == tmp_path / "out" and out.name == "k.cu.cpp"
    assert f'#line 1 "{src}"' in text
    assert "::emu::make_launch(scale_kernel" in text and "<<<" not in text
    assert "c10/cuda" not in text and ".is_cpu()" in text
    body = text.split("\n", 2)[2]
    assert body.count("\n") == KERNEL_CU.count("\n")  # line numbers unchanged
    plain = tmp_path / "plain.cpp"
    plain.write_text(HELPER_CPP)
    assert translate_source(plain, tmp_path / "out") == plain  # nothing to adapt: used as is
