"""A launcher must launch the learner's kernel: the graders record the kernels a call launches
and the torch operators it runs (runtime/backends/launches.py), and reject a right answer that
torch computed, or that no kernel computed."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kernels
import utils
from runtime.backends import launches

import triton  # after utils: it sets up the interpreter or the GPU
import triton.language as tl


def rejected(grader, fn, *patterns):
    with pytest.raises(utils.GradingError) as info:
        grader(fn)
    msg = str(info.value)
    for p in patterns:
        assert re.search(p, msg), f"{p!r} not in:\n{msg}"
    return msg


@pytest.mark.parametrize("grader, fn, names", [
    ("check_softmax", lambda x: torch.softmax(x, -1), r"torch\.softmax \(aten\._softmax\) computed them"),
    ("check_matmul", lambda a, b: a @ b, r"a @ b \(torch\.mm\) \(aten\.mm\) computed them"),
    ("check_relu", lambda x: torch.relu(x), r"torch\.relu \(aten\.relu\) computed them"),
    ("check_sum", lambda x: x.sum().reshape(1), r"torch\.sum \(aten\.sum\) computed them"),
])
def test_torch_computing_the_answer_is_rejected_by_name(grader, fn, names):
    msg = rejected(getattr(utils, grader), fn, r"your function returned the right values, but ", names,
                   r"launch your kernel")
    print(msg)


def test_a_launcher_that_launches_nothing_is_rejected():
    def numpy_relu(x):  # right values, computed outside torch and without a kernel
        return torch.from_numpy(np.maximum(x.detach().cpu().numpy(), 0)).to(x.device)
    rejected(utils.check_relu, numpy_relu, r"returned the right values, but it launched no kernel")


@triton.jit
def _relu_rows_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


def test_a_right_kernel_with_allocations_views_copies_and_casts_is_accepted(capsys):
    def relu(x):
        flat = x.contiguous().view(-1).to(torch.float32)         # views, copies, casts
        y = torch.zeros(flat.shape, device=x.device)             # allocation and fill
        scratch = torch.empty_like(flat).reshape(1, -1)          # an unused temporary
        _relu_rows_kernel[(triton.cdiv(flat.numel(), 256),)](flat, y, flat.numel(), BLOCK=256)
        del scratch
        return y.view(x.shape).clone()
    utils.check_relu(relu)
    assert "check_relu: correct on" in capsys.readouterr().out


def test_a_cuda_kernel_is_recorded_and_accepted(capsys):
    relu = kernels.get("relu", "cuda")
    x = torch.randn(300, device=utils.DEVICE)
    with utils.record_launches() as seen:
        relu(x)
    assert seen.kernels and all(k.backend == "cuda" for k in seen.kernels), seen
    assert not seen.computing_ops(), seen  # the emulator's own tensor work inside the launch is not counted


def test_part_computed_by_torch_is_rejected_unless_the_spec_allows_it(allow_torch_ops, capsys):
    def partial_sums_then_torch(x):  # a kernel for the blocks, torch for the last step
        n = x.numel()
        partial = torch.empty(triton.cdiv(n, 128), device=x.device)
        _block_sum_kernel[(partial.numel(),)](x, partial, n, BLOCK=128)
        return partial.sum().reshape(1)
    rejected(utils.check_sum, partial_sums_then_torch, r"torch\.sum \(aten\.sum\) computed them")
    allow_torch_ops("check_sum", {"sum"})
    utils.check_sum(partial_sums_then_torch)
    assert "check_sum: correct on" in capsys.readouterr().out


@triton.jit
def _block_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + tl.program_id(0), tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0)))


def test_every_spec_names_only_graders_it_has():
    for spec in utils.topics.TOPICS.values():
        assert isinstance(spec.torch_ops_allowed, tuple)
        for name in spec.checks:
            assert utils.grading.TORCH_OPS_ALLOWED[name] == frozenset(spec.torch_ops_allowed)


def test_an_operator_of_an_extension_counts_as_its_kernel():
    lib = torch.library.Library("course_launch_test", "FRAGMENT")  # kept alive below
    torch.library.define("course_launch_test::relu", "(Tensor x) -> Tensor", lib=lib)
    torch.library.impl("course_launch_test::relu", "CompositeExplicitAutograd", lambda x: x.clamp(min=0), lib=lib)
    x = torch.randn(10)
    with utils.record_launches() as seen:
        torch.ops.course_launch_test.relu(x)
    assert seen.kernels == [launches.Launch("extension", "course_launch_test.relu")]
    assert seen.verdict() is None  # what the op does inside is the extension's own work


def test_is_extension_function():
    assert not launches.is_extension_function(torch.relu)
    assert not launches.is_extension_function(len)
    assert not launches.is_extension_function(lambda x: x)


def test_launch_hooks_cost_nothing_outside_a_recording():
    x = torch.randn(64, device=utils.DEVICE)
    y = torch.empty_like(x)
    _relu_rows_kernel[(1,)](x, y, 64, BLOCK=64)  # no recording: nothing kept anywhere
    assert not launches._ACTIVE
    with utils.record_launches(torch_ops=False) as seen:
        _relu_rows_kernel[(1,)](x, y, 64, BLOCK=64)
        torch.relu(x)
    assert seen.kernels == [launches.Launch("triton", "_relu_rows_kernel")] and not seen.torch_ops


def test_the_gpu_hooks_record_launches_and_skip_warmups():
    """The GPU launch paths cannot run here; their hook is the same wrapper, on the same
    signatures: numba-cuda's CUDADispatcher.call(args, launch_config) and Triton's
    JITFunction.run(*args, grid, warmup, **kwargs)."""
    from runtime.backends.numba import backend as nb
    from runtime.backends.triton import backend as tb

    def scale_kernel(x):
        pass

    def add_kernel(x):
        pass

    class Dispatcher:  # numba-cuda: kernel[grid, block](...) ends in dispatcher.call
        py_func = staticmethod(scale_kernel)

        def call(self, args, launch_config):
            return args

    class JITFunction:  # triton: kernel[grid](...) and autotuners end in run
        fn = staticmethod(add_kernel)

        def run(self, *args, grid, warmup, **kwargs):
            return args

    Dispatcher.call = launches.recorded("numba", nb._name)(Dispatcher.call)
    JITFunction.run = launches.recorded("triton", tb._name, tb._warmup)(JITFunction.run)
    with utils.record_launches() as seen:
        Dispatcher().call((1,), None)
        JITFunction().run(1, grid=(1,), warmup=True)    # kernel.warmup(...): compiles only
        JITFunction().run(1, grid=(1,), warmup=False)
    assert seen.kernels == [launches.Launch("numba", "scale_kernel"), launches.Launch("triton", "add_kernel")]


def test_a_launcher_that_needs_no_launch_for_one_element_is_accepted(capsys):
    def tree_sum(x):  # passes of per-block sums until one value is left: none for one element
        x = x.reshape(-1)
        while x.numel() > 1:
            partial = torch.empty(triton.cdiv(x.numel(), 128), device=x.device)
            _block_sum_kernel[(partial.numel(),)](x, partial, x.numel(), BLOCK=128)
            x = partial
        return x.clone()
    utils.check_sum(tree_sum)
    assert "check_sum: correct on" in capsys.readouterr().out
