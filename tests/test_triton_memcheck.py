"""Triton's interpreter checks every access a kernel makes, as the CUDA emulator and
compute-sanitizer's memcheck do: a lane that loads, stores or updates memory outside the
launch's tensor arguments stops the launch with a SimulatorMemoryError that names the
program, the argument, the offset, the line and the fix."""
import pytest
import torch

import utils

import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(not utils.SIMULATE, reason="about Triton's interpreter")


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, MASK_LOAD: tl.constexpr, MASK_STORE: tl.constexpr,
                 SHIFT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if MASK_LOAD:
        x = tl.load(x_ptr + offs + SHIFT, mask=m, other=0.0)
    else:
        x = tl.load(x_ptr + offs + SHIFT)
    if MASK_STORE:
        tl.store(y_ptr + offs, x, mask=m)
    else:
        tl.store(y_ptr + offs, x)


def copy(x, y, mask_load=True, mask_store=True, shift=0):
    n = x.numel()
    _copy_kernel[(triton.cdiv(n, 256),)](x, y, n, BLOCK=256, MASK_LOAD=mask_load, MASK_STORE=mask_store,
                                         SHIFT=shift)


def test_a_masked_kernel_runs_and_is_not_reported():
    x = torch.randn(1000)
    y = torch.empty(1000)
    copy(x, y)
    assert torch.equal(x, y)


def test_an_unmasked_load_past_the_end_is_reported_with_its_fix():
    with pytest.raises(utils.SimulatorMemoryError) as e:
        copy(torch.randn(1000), torch.empty(1000), mask_load=False)
    msg = str(e.value)
    for part in ("Triton kernel `_copy_kernel`", "program (3, 0, 0) loads x_ptr + 1000",
                 "past the end of `x_ptr`'s tensor (1000 elements, offsets 0..999)",
                 "test_triton_memcheck.py", "mask=offs < n"):
        assert part in msg, (part, msg)


def test_an_unmasked_store_past_the_end_is_reported():
    with pytest.raises(utils.SimulatorMemoryError, match=r"stores to y_ptr \+ 1000 .*past the end of `y_ptr`"):
        copy(torch.randn(1000), torch.empty(1000), mask_store=False)


def test_a_mask_that_tests_other_offsets_is_called_an_off_by_one():
    with pytest.raises(utils.SimulatorMemoryError, match=r"loads x_ptr \+ 1000 .*off-by-one"):
        copy(torch.randn(1000), torch.empty(1000), shift=1)
    with pytest.raises(utils.SimulatorMemoryError,
                       match=r"x_ptr \+ -1 at .*before the start of `x_ptr`.*offset is negative"):
        copy(torch.randn(1000), torch.empty(1000), shift=-1)


@triton.jit
def _wild_kernel(x_ptr, y_ptr):
    offs = tl.arange(0, 16)
    tl.store(y_ptr + offs, tl.load(x_ptr + 100_000_000 + offs))


def test_a_wild_offset_is_reported_before_it_can_crash_the_process():
    # unchecked, the interpreter reads that address itself: a segmentation fault kills the kernel
    with pytest.raises(utils.SimulatorMemoryError, match="not inside any tensor argument"):
        _wild_kernel[(1,)](torch.randn(16), torch.empty(16))


@triton.jit
def _atomic_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(out_ptr + offs // BLOCK, tl.load(x_ptr + offs, mask=offs < n, other=0.0))


def test_an_atomic_past_the_end_is_reported():
    with pytest.raises(utils.SimulatorMemoryError,
                       match=r"updates out_ptr \+ 1 at .*past the end of `out_ptr`'s tensor "
                             r"\(1 element, offsets 0..0\)"):
        _atomic_kernel[(2,)](torch.randn(300), torch.zeros(1), 300, BLOCK=256)


@triton.jit
def _strided_kernel(x_ptr, y_ptr, s0, s1, M: tl.constexpr, N: tl.constexpr):
    r = tl.arange(0, M)[:, None]
    c = tl.arange(0, N)[None, :]
    tl.store(y_ptr + r * N + c, tl.load(x_ptr + r * s0 + c * s1))


def test_any_view_is_read_through_its_strides_without_a_report():
    for x in (torch.randn(64, 32).t(), torch.randn(32, 128)[:, ::2], torch.randn(32, 64).flip(0)):
        y = torch.empty(32, 64)
        _strided_kernel[(1,)](x, y, x.stride(0), x.stride(1), 32, 64)
        assert torch.equal(y, x)
    # and one element past a view is out of bounds, though its storage goes on
    base = torch.randn(40, 64)
    x = base[:32]
    with pytest.raises(utils.SimulatorMemoryError, match="past the end of `x_ptr`"):
        _strided_kernel[(1,)](x, torch.empty(33, 64), 64, 1, 64, 64)
