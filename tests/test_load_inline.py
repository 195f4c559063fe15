"""utils.load_inline: torch's load_inline on a GPU, the emulated build on a CPU. The same
extension-style sources (``<<<...>>>`` launches, C10_CUDA_KERNEL_LAUNCH_CHECK, the CUDA
host API, ``functions=[...]`` or a hand-written PYBIND11_MODULE) run unchanged in both.

Each build takes tens of seconds (torch/extension.h is heavy), so the tests share one module
(tests/inline_ops.py, its bindings written by hand; lesson 02 builds the ``functions=[...]``
form) and torch's build cache makes a rerun instant.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import inline_ops
from inline_ops import CPP, CUDA, PYBIND

import utils

DEV = utils.DEVICE
GEN = torch.Generator().manual_seed(7)


@pytest.fixture(scope="module")
def ext():
    return inline_ops.build()


def test_module_functions_match_torch(ext):
    for n in (1, 1000, 4099):
        x = torch.randn(n, generator=GEN).to(DEV)
        assert torch.equal(ext.relu(x), torch.relu(x))
        torch.testing.assert_close(ext.block_sum(x).double(), x.double().sum().reshape(1), rtol=1e-5, atol=1e-4)
    assert ext.relu(torch.empty(0, device=DEV)).numel() == 0


def test_host_api(ext):
    x = torch.randn(777, generator=GEN)
    assert torch.equal(ext.relu_host_api(x), torch.relu(x))


def test_checks_in_host_code(ext):
    wrong = torch.randn(8) if DEV.type == "cuda" else torch.empty(8, device="meta")
    with pytest.raises(RuntimeError, match="must be"):
        ext.relu(wrong)
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.block_sum(torch.randn(8, 8, device=DEV).t())
    with pytest.raises(RuntimeError, match="float32"):
        ext.relu(torch.randn(8, device=DEV, dtype=torch.float64))


def test_printf_shows_in_output(ext, capfd):
    ext.hello(42)
    out = capfd.readouterr().out
    assert "hello 42 from block 0" in out and "hello 42 from block 1" in out


def test_random_schedule_applies(ext):
    x = torch.randn(3000, generator=GEN).to(DEV)
    with utils.emulation_schedule("random", seed=5):
        s = ext.block_sum(x)
    torch.testing.assert_close(s.double(), x.double().sum().reshape(1), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not utils.SIMULATE, reason="a divergent barrier would hang or corrupt a real GPU")
def test_kernel_fault_in_extension(ext):
    with pytest.raises(utils.KernelFault, match=r"half_barrier_kernel[\s\S]*threads 0-15: wait at __syncthreads\(\)"):
        ext.bad_barrier(torch.zeros(64))
    assert torch.equal(ext.relu(torch.tensor([-1.0, 2.0], device=DEV)), torch.tensor([0.0, 2.0], device=DEV))


def test_user_written_pybind_module(ext):
    assert "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)" in PYBIND   # bindings written by hand
    for n in (1000, 10, 0):
        x = torch.randn(n, generator=GEN).to(DEV)
        out = ext.warp_sums(x)
        ref = torch.nn.functional.pad(x.double(), (0, -n % 32)).view(-1, 32).sum(1)
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4)


def test_not_solved_yet_needs_no_build():
    src = CUDA.replace("if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;", "// TODO (1 line)\n    NOT_SOLVED_YET;")
    mod = utils.load_inline("course_test_inline_todo", CPP, src, functions=["relu", "block_sum"])
    with pytest.raises(NotImplementedError, match="not solved yet: relu still has a TODO"):
        mod.relu(torch.zeros(4, device=DEV))
    mod2 = utils.load_inline("course_test_inline_todo2", "", (CUDA + PYBIND).replace("return v;", "NOT_SOLVED_YET;"))
    with pytest.raises(NotImplementedError, match="warp_sums"):
        mod2.warp_sums(torch.zeros(4, device=DEV))
