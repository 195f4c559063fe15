"""Race detection in simulation: Numba's simulator and Triton's interpreter.

Each kind of race is reported with both sides named, and the race-free version of the
same kernel (atomics, barriers, cuda.syncwarp) is not reported. The course's own Numba
and Triton kernels run with detection on in every other test, so a false positive there
fails those tests too.
"""
import re

import numpy as np
import pytest
import torch
from copy_kernels import copy_tl_kernel

import utils

import triton
import triton.language as tl
from numba import cuda, float32

pytestmark = pytest.mark.skipif(not utils.SIMULATE, reason="race detection is a simulation feature")

THREADS = 64


# ---------------------------------------------------------------------------------------
# Numba kernels: each racy one next to its race-free twin.
# ---------------------------------------------------------------------------------------
def _block_sum_kernel(atomic):
    @cuda.jit
    def block_sum_kernel(x, out):
        # thread 0 of each block adds up the block's elements, then adds them to out[0]
        if cuda.threadIdx.x == 0:
            acc = float32(0.0)
            for i in range(cuda.blockIdx.x * THREADS, min((cuda.blockIdx.x + 1) * THREADS, x.size)):
                acc += x[i]
            if atomic:
                cuda.atomic.add(out, 0, acc)
            else:
                out[0] += acc  # every block's thread 0: a read-modify-write racing between blocks
    return block_sum_kernel


block_sum_plain_kernel = _block_sum_kernel(False)
block_sum_atomic_kernel = _block_sum_kernel(True)


def _tree_kernel(with_barrier):
    @cuda.jit
    def tree_kernel(x, out):
        s = cuda.shared.array(THREADS, float32)
        t = cuda.threadIdx.x
        s[t] = x[cuda.grid(1)]
        cuda.syncthreads()
        step = THREADS // 2
        while step > 0:
            if t < step:
                s[t] += s[t + step]
            if with_barrier:
                cuda.syncthreads()
            step //= 2
        if t == 0:
            out[cuda.blockIdx.x] = s[0]
    return tree_kernel


tree_no_barrier_kernel = _tree_kernel(False)
tree_kernel = _tree_kernel(True)


def _warp_kernel(with_syncwarp):
    @cuda.jit
    def warp_exchange_kernel(x, out):
        s = cuda.shared.array(32, float32)
        t = cuda.threadIdx.x
        s[t] = x[t]
        if with_syncwarp:
            cuda.syncwarp()
        out[t] = s[(t + 1) % 32]  # reads the neighbour lane's element
    return warp_exchange_kernel


warp_no_sync_kernel = _warp_kernel(False)
warp_sync_kernel = _warp_kernel(True)


@cuda.jit
def two_warps_no_barrier_kernel(x, out):
    s = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    s[t] = x[t]
    out[t] = s[THREADS - 1 - t]  # thread 0 reads what thread 63 (another warp) writes


def _arrays(n):
    x = utils.to_numba(torch.arange(n, dtype=torch.float32))
    out = utils.to_numba(torch.zeros(max(n // THREADS, 1)))
    return x, out


def _race(fn):
    with pytest.raises(utils.SimulatorRaceError) as info:
        fn()
    return str(info.value)


def test_numba_race_between_blocks():
    x, out = _arrays(4 * THREADS)
    msg = _race(lambda: block_sum_plain_kernel[4, THREADS](x, out))
    assert "block_sum_kernel" in msg and "out[0]" in msg and "global memory" in msg
    assert "thread 0 (warp 0, lane 0) of block (0, 0, 0)" in msg
    assert "thread 0 (warp 0, lane 0) of block (1, 0, 0)" in msg
    assert msg.count("`out[0] += acc") == 2  # both source lines
    assert "cuda.atomic.add" in msg


def test_numba_atomic_between_blocks_is_not_a_race():
    x, out = _arrays(4 * THREADS)
    block_sum_atomic_kernel[4, THREADS](x, out)
    assert out.copy_to_host()[0] == pytest.approx(float(np.arange(4 * THREADS).sum()))


def test_numba_missing_barrier_in_shared_memory():
    x, out = _arrays(2 * THREADS)
    msg = _race(lambda: tree_no_barrier_kernel[2, THREADS](x, out))
    assert "s[" in msg and "shared memory" in msg and "tree_kernel" in msg
    lines = [int(n) for n in re.findall(r":(\d+) `", msg)]
    assert len(lines) == 2
    lo, hi = sorted(lines)
    assert f"cuda.syncthreads() between line {lo} and line {hi}" in msg or \
        f"cuda.syncthreads() between two passes through line {lo}" in msg


def test_numba_barriers_make_the_tree_race_free():
    x, out = _arrays(2 * THREADS)
    tree_kernel[2, THREADS](x, out)
    expected = np.arange(2 * THREADS, dtype=np.float64).reshape(2, THREADS).sum(axis=1)
    np.testing.assert_allclose(out.copy_to_host(), expected)


def test_numba_race_between_warps_asks_for_syncthreads():
    x, out = _arrays(THREADS)
    out = utils.to_numba(torch.zeros(THREADS))
    msg = _race(lambda: two_warps_no_barrier_kernel[1, THREADS](x, out))
    assert "warp 0" in msg and "warp 1" in msg
    assert "cuda.syncthreads() between line" in msg


def test_numba_lanes_of_one_warp_need_syncwarp():
    x = utils.to_numba(torch.arange(32, dtype=torch.float32))
    out = utils.to_numba(torch.zeros(32))
    msg = _race(lambda: warp_no_sync_kernel[1, 32](x, out))
    assert "lanes of one warp" in msg and "Volta" in msg
    assert "cuda.syncwarp()" in msg


def test_numba_syncwarp_orders_lanes():
    x = utils.to_numba(torch.arange(32, dtype=torch.float32))
    out = utils.to_numba(torch.zeros(32))
    warp_sync_kernel[1, 32](x, out)
    np.testing.assert_array_equal(out.copy_to_host(), np.roll(np.arange(32, dtype=np.float32), -1))


def test_numba_race_is_the_graders_diagnosis():
    def racy_sum(t):
        out = torch.zeros(1, device=t.device)
        block_sum_plain_kernel[(t.numel() + THREADS - 1) // THREADS, THREADS](
            utils.to_numba(t), utils.to_numba(out))
        return out[0]

    with pytest.raises(utils.GradingError) as info:
        utils.check_sum(racy_sum)
    msg = str(info.value)
    assert "data race" in msg and "out[0]" in msg and "cuda.atomic.add" in msg


# ---------------------------------------------------------------------------------------
# Triton.
# ---------------------------------------------------------------------------------------
@triton.jit
def store_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    acc = tl.load(out_ptr)
    tl.store(out_ptr, acc + tl.sum(x))  # every program: a plain read-modify-write


@triton.jit
def atomic_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(x))


@triton.jit
def forgot_pid_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)  # every program writes the first block
    mask = offs < n
    tl.store(y_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def masked_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)  # no `other`: masked-off lanes are undefined
    tl.atomic_add(out_ptr, tl.sum(x))


def test_triton_race_between_programs_names_both():
    x, out = torch.rand(1000), torch.zeros(1)
    msg = _race(lambda: store_sum_kernel[(4,)](x, out, 1000, BLOCK=256))
    assert "store_sum_kernel" in msg and "out_ptr[0]" in msg
    assert "program (0, 0, 0)" in msg and "program (1, 0, 0)" in msg
    assert "tl.atomic_add" in msg


def test_triton_two_programs_storing_one_element():
    x, y = torch.rand(1000), torch.zeros(1000)
    msg = _race(lambda: forgot_pid_kernel[(4,)](x, y, 1000, BLOCK=256))
    assert "y_ptr[0]" in msg and msg.count("store by program") == 2
    assert "pid * BLOCK" in msg


def test_triton_atomics_are_not_races():
    x, out = torch.rand(1000), torch.zeros(1)
    atomic_sum_kernel[(4,)](x, out, 1000, BLOCK=256)
    assert out.item() == pytest.approx(x.double().sum().item(), rel=1e-5)


def test_triton_masked_lanes_read_poison():
    x, out = torch.rand(1000), torch.zeros(1)
    masked_sum_kernel[(4,)](x, out, 1000, BLOCK=256)
    assert torch.isnan(out).all()  # a forgotten other=0.0 shows up
    out.zero_()
    atomic_sum_kernel[(4,)](x, out, 1000, BLOCK=256)
    assert torch.isfinite(out).all()


def test_triton_driver_in_simulation():
    drv = triton.runtime.driver.active
    assert drv.get_active_torch_device() == utils.DEVICE
    props = drv.utils.get_device_properties(utils.DEVICE.index)
    assert props["multiprocessor_count"] == 132 and props["warpSize"] == 32
    assert props["max_shared_mem"] > 200_000 and props["max_num_regs"] == 65536
    assert drv.get_current_target().backend == "cuda"


def test_unchanged_triton_autotune_runs():
    autotuned_copy_kernel = triton.autotune(
        configs=[triton.Config({"BLOCK_SIZE": 128}), triton.Config({"BLOCK_SIZE": 256})], key=["n"])(copy_tl_kernel)
    x = torch.rand(1000)
    y = torch.zeros_like(x)
    autotuned_copy_kernel[lambda meta: (triton.cdiv(1000, meta["BLOCK_SIZE"]),)](x, y, 1000)
    torch.testing.assert_close(y, x)
    assert autotuned_copy_kernel.best_config.kwargs["BLOCK_SIZE"] == 128  # the first config


@cuda.jit
def block_accumulate_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[0] += x[i]


def test_numba_threads_of_one_block_accumulating_need_atomics():
    x = utils.to_numba(torch.ones(THREADS))
    out = utils.to_numba(torch.zeros(1))
    msg = _race(lambda: block_accumulate_kernel[1, THREADS](x, out))
    assert "write by thread 0" in msg and "read by thread 1" in msg
    assert "Fix: use cuda.atomic.add" in msg and "between" not in msg


def _half_warp_kernel(mask):
    @cuda.jit
    def half_warp_shuffle_kernel(x, out):
        t = cuda.threadIdx.x
        v = x[t]
        if t < 16:
            v += cuda.shfl_down_sync(mask, v, 8)
        out[t] = v
    return half_warp_shuffle_kernel


def test_numba_shuffle_from_a_lane_outside_the_mask_is_reported():
    x = utils.to_numba(torch.arange(32, dtype=torch.float32))
    out = utils.to_numba(torch.zeros(32))
    with pytest.raises(utils.SimulatorSyncError) as info:
        _half_warp_kernel(0x0000FFFF)[1, 32](x, out)
    msg = str(info.value)
    assert "undefined warp shuffle" in msg and "lane 8 reads lane 16" in msg
    assert "mask 0x0000ffff" in msg and "cuda.shfl_down_sync(mask, v, 8)" in msg  # the line


def test_numba_shuffle_within_the_mask_or_past_the_edge_is_defined():
    @cuda.jit
    def edge_kernel(x, out):
        t = cuda.threadIdx.x
        out[t] = cuda.shfl_down_sync(0xFFFFFFFF, x[t], 8)  # lanes 24-31: past the edge, own value

    x = utils.to_numba(torch.arange(32, dtype=torch.float32))
    out = utils.to_numba(torch.zeros(32))
    edge_kernel[1, 32](x, out)
    expected = np.concatenate([np.arange(8, 32), np.arange(24, 32)]).astype(np.float32)
    np.testing.assert_array_equal(out.copy_to_host(), expected)


def test_tutorials_survey_without_a_path_runs_nothing(capsys, tmp_path):
    from benchmarks.simulators import triton_tutorials
    assert triton_tutorials.main([str(tmp_path / "missing"), "--no-write"]) == 0
    assert "nothing run" in capsys.readouterr().out


@cuda.jit
def mismatched_syncwarp_kernel(out):
    t = cuda.threadIdx.x
    if t < 16:
        cuda.syncwarp(0x0000FFFF)
    else:
        cuda.syncwarp(0xFFFFFFFF)  # names lanes 0-15, which sync with another mask
    out[t] = t


def test_numba_syncwarp_with_mismatched_masks_is_reported():
    out = utils.to_numba(torch.zeros(32))
    with pytest.raises(utils.SimulatorSyncError) as info:
        mismatched_syncwarp_kernel[1, 32](out)
    msg = str(info.value)
    assert "threads 16-31 wait at cuda.syncwarp(mask=0xffffffff)" in msg
    assert "threads 0-15 returned without reaching it" in msg
