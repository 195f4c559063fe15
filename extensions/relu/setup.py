"""Build the ReLU extension:  python setup.py build_ext --inplace   (or: pip install .)

The result is one importable shared library, myrelu.cpython-<version>-<platform>.so, that
holds both the pybind11 module (`import myrelu`) and the `torch.ops.myrelu` operators.

The one switch: inside the course (its root on PYTHONPATH, as the notebooks and tests set
it), CUDAExtension and BuildExtension come from `utils.extension`. On a machine with an
NVIDIA GPU those ARE torch's own classes; without one they build the same two source files
against the course's CPU emulator. Outside the course this is a plain PyTorch project.
"""
from setuptools import setup

try:
    import utils  # noqa: F401  (the course's root is on PYTHONPATH)
except ImportError:
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension
else:
    from utils.extension import BuildExtension, CUDAExtension

setup(
    name="myrelu",
    version="0.1.0",
    ext_modules=[
        CUDAExtension(
            name="myrelu",                          # -> TORCH_EXTENSION_NAME, PyInit_myrelu
            sources=["relu.cpp", "relu_kernel.cu"],  # .cpp -> g++, .cu -> nvcc
            # -g0: no debug information. Python's own compiler flags ask for it (-g), and
            # for PyTorch's headers it is about a third of the build time.
            extra_compile_args={"cxx": ["-O2", "-g0"], "nvcc": ["-O3"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
