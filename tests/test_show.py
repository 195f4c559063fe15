"""utils.show: a kernel of any language, its source and (CUDA C++ anywhere, the others on a GPU)
its PTX and SASS."""
import pytest

import utils
import utils.config
import kernels.numba.relu as numba_relu
import kernels.triton.relu as triton_relu

RELU_CU = utils.KERNELS_DIR / "cuda" / "relu.cu"


@pytest.fixture(scope="module")
def relu_cuda():
    return utils.cuda_kernel(RELU_CU, "relu_kernel")


def test_source_of_each_language(relu_cuda, capsys):
    utils.show(numba_relu.relu_kernel)
    utils.show(triton_relu.relu_kernel)
    utils.show(relu_cuda)
    out = capsys.readouterr().out
    assert out.count("def relu_kernel(") == 2                 # Numba's and Triton's Python source
    assert "cuda.grid" in out and "tl.program_id" in out
    cuda = utils.kernel_text(relu_cuda)
    assert cuda.lstrip().startswith("//")                    # the comment above the kernel comes with it
    assert "__global__ void relu_kernel(" in cuda and cuda.rstrip().endswith("}")
    assert "relu_vec4_kernel" not in cuda                    # one kernel, not the whole file
    assert utils.kernel_text(RELU_CU, name="relu_kernel") == cuda


def test_cuda_ptx_and_sass_of_one_kernel(relu_cuda):
    ptx = utils.kernel_text(relu_cuda, "ptx")
    assert ptx.startswith(".entry") and ptx.count(".entry") == 1 and "relu_kernel" in ptx
    assert "ld.global" in ptx and "max.f32" in ptx
    sass = utils.kernel_text(relu_cuda, "SASS")
    assert "FMNMX" in sass and "EXIT" in sass


def test_python_functions_and_classes():
    text = utils.kernel_text(utils.bench)
    assert text.startswith("def bench(")
    assert utils.kernel_text(utils.BenchResult).startswith("@dataclass")


def test_clear_errors(relu_cuda):
    with pytest.raises(TypeError, match="name the kernel"):
        utils.show(RELU_CU)
    with pytest.raises(KeyError, match="no_such_kernel"):
        utils.show(RELU_CU, name="no_such_kernel")
    with pytest.raises(ValueError, match="what must be one of"):
        utils.show(relu_cuda, "assembly")
    with pytest.raises(ValueError, match="not 'ttir'"):
        utils.show(relu_cuda, "ttir")
    with pytest.raises(TypeError, match="Python function.*pass the kernel it launches"):
        utils.show(utils.bench, "ptx")


@pytest.mark.skipif(not utils.SIMULATE, reason="in simulation only")
def test_numba_and_triton_ptx_need_a_gpu():
    for k in (numba_relu.relu_kernel, triton_relu.relu_kernel):
        with pytest.raises(RuntimeError, match="compiles nothing.*on a GPU"):
            utils.show(k, "ptx")


class _Compiled:
    def __init__(self, ptx):
        self.asm = {"ptx": ptx, "ttir": "module {}"}


def test_what_a_gpu_shows_of_triton_and_numba(monkeypatch):
    """On a GPU: the variants Triton and Numba compiled at their launches (stand-ins here)."""
    monkeypatch.setattr(utils.config, "SIMULATE", False)

    class JITFunction:
        __module__ = "triton.runtime.jit"
        device_caches = {0: ({"k1": _Compiled("// first"), "k2": _Compiled("// latest")}, None, None, None, None)}

    assert utils.kernel_text(JITFunction(), "ptx") == "// latest"
    assert utils.kernel_text(JITFunction(), "ttir") == "module {}"
    JITFunction.device_caches = {}
    with pytest.raises(RuntimeError, match="launch it once"):
        utils.kernel_text(JITFunction(), "ptx")

    class CUDADispatcher:
        __module__ = "numba.cuda.dispatcher"

        def inspect_asm(self):
            return {"(float32[::1],)": ".entry relu"}

    assert utils.kernel_text(CUDADispatcher(), "ptx") == "// signature (float32[::1],)\n.entry relu"
