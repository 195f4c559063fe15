"""The store tracker (runtime/backends/stores.py): who wrote each element of a graded call's
memory. Each test runs a small call under ``record_launches(stores=...)`` and reads the status
of each element of what it returned."""
from __future__ import annotations

import numpy as np
import torch
from grader_kernels import read_only_kernel

import utils
from runtime.backends import stores
from runtime.backends.launches import record_launches
from utils import grading

import triton
import triton.language as tl

N = 300


@triton.jit
def _relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def _relu(x, y, n=None):
    n = x.numel() if n is None else n
    _relu_kernel[(triton.cdiv(n, 128),)](x, y, n, BLOCK=128)


def statuses(fn):
    """The status names of the elements of ``fn(x)`` (a Counter-like dict), for a fresh input."""
    x = torch.randn(N, device=utils.DEVICE)
    x[x == 0] = 1.0
    tracker = stores.StoreTracker((x,))
    with grading._Allocations().active(), record_launches(stores=tracker):  # torch.empty poisoned, as graded
        out = fn(x)
        if utils.DEVICE.type == "cuda":
            torch.cuda.synchronize()
    tracker.finish()
    assert tracker.broken is None, tracker.broken
    st = tracker.statuses(out)
    if st is None:
        return None
    values, counts = torch.unique(st, return_counts=True)
    return {stores.status_name(int(v)): int(c) for v, c in zip(values, counts)}


def test_a_kernel_writes_every_element():
    def fn(x):
        y = torch.empty_like(x)
        _relu(x, y)
        return y
    assert statuses(fn) == {"kernel": N}


def test_a_cast_of_a_kernel_output_is_still_the_kernels():
    def fn(x):
        y = torch.empty_like(x)
        _relu(x, y)
        return y.to(torch.float64).clone()
    assert statuses(fn) == {"kernel": N}


def test_zeros_the_kernel_leaves_are_a_fill_not_the_host():
    def fn(x):
        y = torch.zeros_like(x)
        _relu(x, y)          # stores 0.0 over 0.0 where x < 0: no byte changes there
        return y
    got = statuses(fn)
    assert set(got) == {"kernel", "filled"} and got["kernel"] + got["filled"] == N, got


def test_a_write_through_numpy_is_the_host():
    def fn(x):
        y = torch.empty_like(x)
        _relu(x, y, N // 2)
        if y.device.type == "cpu":
            y.numpy()[N // 2:] = 1.0
        else:  # the values made on the host, where no torch operator saw them
            y[N // 2:].copy_(torch.from_numpy(np.ones(N - N // 2, dtype=np.float32)))
        return y
    assert statuses(fn) == {"kernel": N // 2, "host": N - N // 2}


def test_a_copy_from_a_host_buffer_is_the_host():
    def fn(x):
        y = torch.empty_like(x)
        read_only_kernel[(1,)](x, N, BLOCK=512)
        y.copy_(torch.from_numpy(np.maximum(x.cpu().numpy(), 0)))
        return y
    assert statuses(fn) == {"host": N}


def test_elements_set_one_by_one_from_python_are_the_host():
    def fn(x):
        y = torch.zeros_like(x)
        for i in range(4):
            y[i] = 2.0
        _relu(x[4:], y[4:])
        return y
    got = statuses(fn)
    assert got["host"] == 4 and got["kernel"] + got.get("filled", 0) == N - 4, got


def test_a_kernel_that_rewrites_the_value_already_there_leaves_it_as_it_was():
    def fn(x):
        y = x.clone()        # a copy of the input: relu keeps every positive element as it is
        _relu(y, y)
        return y
    got = statuses(fn)
    assert set(got) == {"kernel", "input"}, got


def test_memory_nobody_watched_is_unknown_until_a_launch_writes_it():
    def fn(x):
        y = torch.from_numpy(np.zeros(N, dtype=np.float32)).to(x.device)
        return y
    got = statuses(fn)
    # on the CPU from_numpy makes memory the tracker never saw; on a GPU .to() copies it (the host)
    assert got is None or got == {"host": N}, got


def test_the_tracker_never_raises_into_the_call():
    tracker = stores.StoreTracker(())
    tracker.launch_start((object(), [1, 2], {"a": None}))
    tracker.launch_end()
    tracker.finish()
    assert tracker.broken is None
    assert tracker.statuses("not a tensor") is None
