"""Warp primitives, barrier checks and speed of the patched Numba CUDA simulator.

The kernels here run unchanged on a GPU (where Numba compiles them for real), so the
shuffle and reduction tests double as a check that the simulator agrees with the
hardware; the tests of the patch itself (divergence errors, scheduler) are
simulation-only.
"""
import threading

import numpy as np
import pytest
from copy_kernels import copy_kernel

import utils
from kernels.numba.reduction import block_sum

from numba import cuda, float32

FULL = 0xFFFFFFFF
sim_only = pytest.mark.skipif(not utils.SIMULATE, reason="tests the CUDA simulator patch")


# ---------------------------------------------------------------------------------------
# Reference semantics of the shuffles (PTX shfl.sync, width 32, lane operand mod 32).
# ---------------------------------------------------------------------------------------
def ref_shuffle(vals, kind, args, nthreads):
    out = np.empty_like(vals)
    for t in range(nthreads):
        warp, lane = divmod(t, 32)
        width = min(32, nthreads - 32 * warp)  # lanes present in this warp
        b = int(args[t]) & 31
        src = {"idx": b, "up": lane - b, "down": lane + b, "xor": lane ^ b}[kind]
        ok = 0 <= src < width
        out[t] = vals[32 * warp + src] if ok else vals[t]
    return out


@cuda.jit
def shuffle_kernel(vals, args, out_idx, out_up, out_down, out_xor):
    t = cuda.threadIdx.x
    v = vals[t]
    a = args[t]
    out_idx[t] = cuda.shfl_sync(FULL, v, a + 32)  # the source lane is taken modulo 32
    out_up[t] = cuda.shfl_up_sync(FULL, v, a)
    out_down[t] = cuda.shfl_down_sync(FULL, v, a)
    out_xor[t] = cuda.shfl_xor_sync(FULL, v, a)


@pytest.mark.parametrize("nthreads", [64, 48])  # two full warps; a full and a half warp
def test_each_shuffle_matches_reference(nthreads):
    rng = np.random.default_rng(nthreads)
    vals = rng.standard_normal(nthreads).astype(np.float32)
    args = rng.integers(0, 32, nthreads).astype(np.int32)
    # A source lane missing from a partial warp is undefined on a GPU (and an error here, see
    # test_shuffle_from_a_lane_that_does_not_exist): in the half warp, offsets below
    # 16 - lane keep every kind of shuffle inside it.
    tail = np.arange(nthreads) >= nthreads - nthreads % 32
    args[tail] = [rng.integers(0, 16 - lane) for lane in np.arange(nthreads)[tail] % 32]
    outs = [np.zeros(nthreads, np.float32) for _ in range(4)]
    shuffle_kernel[1, nthreads](vals, args, *outs)
    for kind, got in zip(["idx", "up", "down", "xor"], outs):
        want = ref_shuffle(vals, kind, args, nthreads)
        np.testing.assert_array_equal(got, want, err_msg=f"shfl {kind}")


@cuda.jit
def partial_warp_sum_kernel(x, out):
    t = cuda.threadIdx.x
    v = x[t]
    offset = 16
    while offset > 0:
        v += cuda.shfl_down_sync(FULL, v, offset)
        offset //= 2
    if t == 0:
        out[0] = v


@sim_only
def test_shuffle_from_a_lane_that_does_not_exist():
    # A block of min(cols, 64) = 16 threads doing a whole-warp reduction: lane 0 reads
    # lane 16, which the block does not have (the CUDA emulator reports it the same way).
    with pytest.raises(utils.SimulatorSyncError, match=r"lane 0 reads lane 16, .*which does not exist"
                       r" \(the block has 16 threads"):
        partial_warp_sum_kernel[1, 16](np.ones(16, np.float32), np.zeros(1, np.float32))
    out = np.zeros(1, np.float32)
    partial_warp_sum_kernel[1, 32](np.ones(32, np.float32), out)  # a whole warp: fine
    assert out[0] == 32


@cuda.jit
def shuffle_int64_kernel(vals, out):
    t = cuda.threadIdx.x
    out[t] = cuda.shfl_xor_sync(FULL, vals[t], 1)


def test_shuffle_keeps_64_bit_values():
    vals = (np.arange(32, dtype=np.int64) << 40) + 7
    out = np.zeros(32, np.int64)
    shuffle_int64_kernel[1, 32](vals, out)
    np.testing.assert_array_equal(out, vals[np.arange(32) ^ 1])


@cuda.jit
def syncwarp_kernel(x, out):
    buf = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    buf[t] = x[t] * 2
    cuda.syncwarp()  # each warp's writes are visible to its lanes; no block barrier needed
    lane = t % 32
    out[t] = buf[t - lane + (lane + 1) % 32]  # the next lane's value, within the warp


def test_syncwarp_orders_shared_memory_within_a_warp():
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(64, np.float32)
    syncwarp_kernel[1, 64](x, out)
    t = np.arange(64)
    np.testing.assert_array_equal(out, 2 * x[t - t % 32 + (t % 32 + 1) % 32])


@cuda.jit
def vote_kernel(x, ballot, any_, all_):
    t = cuda.threadIdx.x
    p = x[t] > 0
    ballot[t] = cuda.ballot_sync(FULL, p)
    any_[t] = cuda.any_sync(FULL, p)
    all_[t] = cuda.all_sync(FULL, p)


def test_votes():
    x = np.full(64, -1.0, np.float32)
    x[[3, 5, 31]] = 1.0  # warp 0 has three positive lanes (lane 31 is the sign bit)
    x[32:] = 1.0         # warp 1 is all positive
    ballot, any_, all_ = (np.zeros(64, np.int32) for _ in range(3))
    vote_kernel[1, 64](x, ballot, any_, all_)
    bits = (1 << 3) | (1 << 5) | (1 << 31)
    assert (ballot[:32] == bits - (1 << 32)).all()  # returned as a signed 32-bit int
    assert (ballot[32:] == -1).all()  # 0xffffffff as a signed 32-bit int
    assert any_.tolist() == [1] * 64
    assert all_.tolist() == [0] * 32 + [1] * 32


# ---------------------------------------------------------------------------------------
# A warp-shuffle block reduction: lesson 04's block_sum.
# ---------------------------------------------------------------------------------------
@cuda.jit
def block_sum_kernel(x, out):
    scratch = cuda.shared.array(32, float32)
    i = cuda.grid(1)
    v = block_sum(x[i] if i < x.size else float32(0.0), scratch)  # warp shuffles, then warp 0
    if cuda.threadIdx.x == 0:
        out[cuda.blockIdx.x] = v


def test_warp_shuffle_block_reduction():
    n, threads = 1000, 128  # the last block is partly past the end
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    blocks = (n + threads - 1) // threads
    out = np.zeros(blocks, np.float32)
    block_sum_kernel[blocks, threads](x, out)
    want = [x[b * threads:(b + 1) * threads].astype(np.float64).sum() for b in range(blocks)]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@cuda.jit
def warps_2d_kernel(out):
    # Lanes are numbered by the linear thread id x + y*blockDim.x, as on the GPU.
    t = cuda.threadIdx.x + cuda.threadIdx.y * cuda.blockDim.x
    out[t] = cuda.shfl_xor_sync(FULL, t, 16)


def test_warps_are_formed_from_linear_thread_ids_in_2d_blocks():
    out = np.zeros(64, np.int32)
    warps_2d_kernel[1, (8, 8)](out)
    np.testing.assert_array_equal(out, np.arange(64) ^ 16)


@cuda.jit
def syncthreads_count_kernel(x, out):
    t = cuda.threadIdx.x
    p = 1 if x[t] > 0 else 0  # the predicate is an int on a real GPU
    out[0, t] = cuda.syncthreads_count(p)
    out[1, t] = cuda.syncthreads_and(p)
    out[2, t] = cuda.syncthreads_or(p)


def test_syncthreads_count_and_or():
    x = np.array([1, -1] * 32, np.float32)
    out = np.zeros((3, 64), np.int32)
    syncthreads_count_kernel[1, 64](x, out)
    assert out[0].tolist() == [32] * 64
    assert out[1].tolist() == [0] * 64
    assert out[2].tolist() == [1] * 64


# ---------------------------------------------------------------------------------------
# Simulation only: divergence is diagnosed, the scheduler is the patched one.
# ---------------------------------------------------------------------------------------
@cuda.jit
def early_return_kernel(x, n):
    sh = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    if t >= n:
        return  # a bug: these threads never reach the barrier below
    sh[t] = x[t]
    cuda.syncthreads()
    x[t] = sh[(t + 1) % n]


@sim_only
def test_divergent_syncthreads_raises_and_names_the_threads():
    x = np.zeros(64, np.float32)
    with pytest.raises(utils.SimulatorSyncError) as info:
        early_return_kernel[2, 64](x, 40)
    msg = str(info.value)
    assert "block (0, 0, 0)" in msg and "early_return_kernel" in msg
    assert "threads 0-39 wait at cuda.syncthreads()" in msg
    assert "threads 40-63 returned without reaching it" in msg
    # The simulator is usable again after the error.
    x = np.arange(8, dtype=np.float32)
    early_return_kernel[1, 8](x, 8)
    np.testing.assert_array_equal(x, np.roll(np.arange(8, dtype=np.float32), -1))


@cuda.jit
def two_barriers_kernel(x):
    t = cuda.threadIdx.x
    if t < 16:
        cuda.syncthreads()
    else:
        cuda.syncthreads()
    x[t] = t


@sim_only
def test_threads_at_different_barriers_raise():
    with pytest.raises(utils.SimulatorSyncError, match="different barriers"):
        two_barriers_kernel[1, 32](np.zeros(32, np.float32))


@cuda.jit
def divergent_shuffle_kernel(x):
    t = cuda.threadIdx.x
    if t % 32 < 16:
        x[t] = cuda.shfl_down_sync(FULL, x[t], 1)  # lanes 16-31 are named but never come


@sim_only
def test_divergent_warp_shuffle_raises():
    with pytest.raises(utils.SimulatorSyncError) as info:
        divergent_shuffle_kernel[1, 32](np.zeros(32, np.float32))
    msg = str(info.value)
    assert "threads 0-15 wait at cuda.shfl_down_sync(mask=0xffffffff)" in msg
    assert "threads 16-31 returned" in msg


@cuda.jit
def half_mask_kernel(x, out):
    t = cuda.threadIdx.x
    if t < 16:  # the mask names exactly the lanes that take this branch: correct
        out[t] = cuda.shfl_xor_sync(0x0000FFFF, x[t], 1)


@cuda.jit
def activemask_kernel(mask):
    t = cuda.threadIdx.x
    if t < 8:
        return
    if t < 20:
        mask[t] = cuda.activemask()
    else:
        mask[t] = cuda.activemask()


@sim_only
def test_partial_mask_and_activemask():
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    half_mask_kernel[1, 32](x, out)
    np.testing.assert_array_equal(out[:16], x[:16][np.arange(16) ^ 1])
    mask = np.zeros(32, np.int64)
    activemask_kernel[1, 32](mask)
    # Lanes 0-7 have returned; lanes 8-19 and 20-31 run the two branches apart.
    assert (mask[8:20] == 0x000FFF00).all()
    assert (mask[20:] == 0xFFF00000).all()


@cuda.jit
def raising_kernel(x):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    if t == 5:
        x[1000] = 1.0  # out of bounds
    cuda.syncthreads()


@sim_only
def test_kernel_exception_names_the_thread_and_unwinds_waiting_threads():
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\] ctaid=\[0, 0, 0\]"):
        raising_kernel[1, 32](np.zeros(32, np.float32))
    # The waiting threads were unwound: the next launch runs normally.
    test_syncthreads_count_and_or()


@cuda.jit
def elementwise_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 2 * x[i]


@sim_only
def test_speed_patch_is_applied_and_elementwise_reuses_one_os_thread():
    from runtime.backends.numba import simulator as numba_sim

    from numba.cuda.simulator import kernel
    assert kernel.BlockManager is numba_sim._BlockManager
    assert any("scheduler" in p for p in utils.NUMBA_SIM_PATCHES)
    x = np.arange(4099, dtype=np.float32)
    out = np.zeros_like(x)
    before = threading.active_count()
    elementwise_kernel[(x.size + 255) // 256, 256](x, out)
    np.testing.assert_array_equal(out, 2 * x)
    # The stock simulator starts one OS thread per CUDA thread; the patched one runs a
    # barrier-free kernel on a single reused worker.
    assert threading.active_count() - before <= 1


@cuda.jit
def barrier_heavy_kernel(out):
    t = cuda.threadIdx.x
    for _ in range(8):
        cuda.syncthreads()
    out[cuda.grid(1)] = t  # each block its own elements: blocks writing one element race


@sim_only
def test_barriers_do_not_leak_os_threads():
    out = np.zeros(512, np.int32)
    barrier_heavy_kernel[2, 256](out)  # warms the worker pool up to one block
    count = threading.active_count()
    barrier_heavy_kernel[2, 256](out)
    assert threading.active_count() == count
    np.testing.assert_array_equal(out, np.tile(np.arange(256), 2))


def test_gpu_leaves_simulator_unpatched():
    from runtime.backends.numba import simulator as numba_sim
    assert numba_sim.is_applied() == utils.SIMULATE
    assert bool(utils.NUMBA_SIM_PATCHES) == utils.SIMULATE


@cuda.jit
def spin_kernel(flag):
    t = cuda.threadIdx.x
    if t == 0:
        while flag[0] == 0:  # waits for thread 1, which runs only after thread 0 yields
            pass
    else:
        flag[0] = 1


@sim_only
def test_interrupt_stops_a_kernel_stuck_in_a_loop(python_gets_sigint):
    import signal
    import time

    from numba.cuda.simulator import kernel

    # Threads run one at a time until they block or return, so thread 0 spins forever
    # here; what matters is that Ctrl-C (a notebook's interrupt button) still stops it.
    launch_over = threading.Event()

    def interrupt_while_launched():
        # Like a learner pressing the stop button again when nothing happens: one SIGINT
        # every half second while the launch runs (on a loaded machine the first one can
        # arrive before the launch is under way), never after it, for 30 s at most.
        deadline = time.monotonic() + 30
        while not launch_over.is_set() and time.monotonic() < deadline:
            time.sleep(0.5)
            if kernel._kernel_context is not None and not launch_over.is_set():
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    sender = threading.Thread(target=interrupt_while_launched, daemon=True)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            spin_kernel[1, 2](np.zeros(1, np.int32))
    finally:
        # a resend racing with the end of the launch must not interrupt the test itself
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        launch_over.set()
        sender.join()
        signal.signal(signal.SIGINT, previous)
    test_syncthreads_count_and_or()  # and the simulator works normally afterwards
    _profiled_launch_finishes()


def _profiled_launch_finishes():
    """A launch that utils.profile traces line by line finishes, after an interrupt too.

    Cancelling a pending interrupt once left CPython's "asynchronous exception pending" flag
    set; a thread with a trace function then spun forever on the first line of the next
    function it called (a suite's worker hung on the next profiled launch). Run in a thread
    with a deadline, so that a regression fails here instead of hanging the suite.
    """
    from runtime.backends.numba import profile as sim_profile
    result = {}

    def run():
        x = np.arange(64, dtype=np.float32)
        y = np.zeros_like(x)
        result["profile"] = sim_profile.profile_numba(copy_kernel, 1, 64, x, y, 64)
        result["y"] = y

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert "profile" in result, "a profiled launch after an interrupt did not finish within 60 s"
    assert np.array_equal(result["y"], np.arange(64, dtype=np.float32))


@sim_only
def test_a_profiled_launch_finishes_after_an_interrupt_is_cancelled():
    """The cancel alone (an interrupt that found its thread already done) leaves no flag set."""
    from runtime.backends.numba import simulator
    w = simulator._idle_worker()
    with simulator._pool_lock:
        simulator._pool.append(w)
    simulator._cancel_async_exc(w)
    _profiled_launch_finishes()


@cuda.jit
def _noop_kernel(a):
    pass


@sim_only
@pytest.mark.parametrize("grid, block, what", [((1, 70000), 32, "65535"), (1, 2048, "1024"),
                                               (1, (4, 4, 128), "z <= 64")])
def test_launches_a_gpu_refuses_raise(grid, block, what):
    # a GPU answers these with CUDA_ERROR_INVALID_VALUE: the simulator must not run them
    with pytest.raises(RuntimeError, match=what):
        _noop_kernel[grid, block](np.zeros(1, np.float32))
