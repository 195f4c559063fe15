"""Everything a kernel can do wrong, thrown at the CUDA C++ emulator in one process: each is
reported clearly, and the process (a notebook's kernel) survives all of them."""
import signal
import threading
import time

import pytest
import torch

import utils

# exit() and abort() in a kernel on purpose: NVRTC rightly rejects them, so its check is off here.
pytestmark = [pytest.mark.skipif(not utils.SIMULATE, reason="the CPU emulator's fault handling"),
              pytest.mark.usefixtures("emulator_only")]

ABUSE = r"""
#include <cassert>
#include <cstdlib>
__global__ void overrun(float* out, long long k) {
    __shared__ float s[256], after[256];          // two arrays in one declaration
    s[threadIdx.x] = 1.0f;
    after[threadIdx.x] = 2.0f;
    if (threadIdx.x == 0) s[256 + k] = 3.0f;     // k elements past the end (k < 0: before the start)
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x] + after[threadIdx.x];
}
__global__ void read_far(float* out, long long k) {
    __shared__ float s[64];
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x + k];
}
__global__ void dynamic_far(float* out, long long k) {
    extern __shared__ float d[];
    d[threadIdx.x] = 1.0f;
    if (threadIdx.x == 0) d[k] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = d[threadIdx.x];
}
__global__ void wild(float* out, long long address) { out[0] = *(float*)address; }
__device__ int deep(int d) { volatile char pad[1024]; pad[0] = (char)d; return d <= 0 ? pad[0] : deep(d - 1) + pad[0]; }
__global__ void recurse(int* out) { out[0] = deep(1 << 22); }
__global__ void exits(int* x) { if (threadIdx.x == 3) exit(3); }
__global__ void aborts(int* x) { if (threadIdx.x == 5) abort(); }
__global__ void asserts(const float* x) { assert(x[threadIdx.x] >= 0.0f); }
__global__ void spin_then_fault(volatile int* flag) { while (flag[0] == 0) { } }
__global__ void fine(float* y) { y[threadIdx.x] = 1.0f + threadIdx.x; }
"""


def kern(name):
    return utils.cuda_kernel(ABUSE, name)


def still_works():
    y = torch.zeros(64)
    kern("fine")[1, 64](y)
    assert torch.equal(y, torch.arange(1.0, 65.0))


@pytest.mark.parametrize("k", [0, 15, 16, 1000, 16_000, 17_000, 300_000, 1 << 22, 1 << 25, -257, -272, -273, -300_000])
def test_shared_overruns_of_every_size_are_reported_as_overruns(k):
    with pytest.raises(utils.KernelFault) as info, utils.race_detection(False):
        kern("overrun")[2, 256](torch.zeros(256), k)
    msg = str(info.value)
    if -272 <= k < 16:  # inside a guard zone of `s`
        where = "before the start" if k < 0 else "past the end"
        assert f"wrote s[{256 + k}], {where} of the __shared__ array `s`" in msg
    elif 0 <= k < 32:
        assert "before the start of the __shared__ array `after`" in msg
    else:
        assert "shared memory" in msg and ("past the end" in msg or "before the" in msg)
        assert "far out of range" in msg
    still_works()


def test_reads_far_outside_shared_memory_and_dynamic_overruns():
    with pytest.raises(utils.KernelFault, match=r"read shared memory \d+ bytes .*far out of range"):
        kern("read_far")[1, 64](torch.zeros(64), 1 << 24)
    with pytest.raises(utils.KernelFault, match="extern __shared__"):
        kern("dynamic_far")[1, 32, 128](torch.zeros(32), 1 << 20)
    with pytest.raises(utils.KernelFault, match="third launch parameter"):
        kern("dynamic_far")[1, 32, 128](torch.zeros(32), 40)
    still_works()


def test_wild_pointers_recursion_exit_abort_and_assert():
    for address in (0, 8, 0x100000000000, 0x7FFFFFFFF000, -4096):
        with pytest.raises(utils.KernelFault, match="null pointer|not inside any tensor argument"):
            kern("wild")[1, 1](torch.zeros(1), address)
    with pytest.raises(utils.KernelFault, match="overflowed its stack"):
        kern("recurse")[1, 1](torch.zeros(1, dtype=torch.int32))
    with pytest.raises(utils.KernelFault, match=r"exit\(3\) called in a kernel on thread \(3,0,0\)"):
        kern("exits")[1, 8](torch.zeros(8, dtype=torch.int32))
    with pytest.raises(utils.KernelFault, match=r"thread \(5,0,0\) .*abort\(\)"):
        kern("aborts")[1, 8](torch.zeros(8, dtype=torch.int32))
    # <cassert> included after the emulator's header: condition, line and thread are kept
    with pytest.raises(utils.KernelFault,
                       match=r"assert\(x\[threadIdx.x\] >= 0.0f\) failed on line 30 in thread \(1,0,0\)"):
        kern("asserts")[1, 2](torch.tensor([1.0, -1.0]))
    still_works()


def test_interrupts_during_and_after_faulting_launches(python_gets_sigint):
    # a far overrun first: it must not have damaged the emulator's saved signal handlers
    with pytest.raises(utils.KernelFault), utils.race_detection(False):
        kern("overrun")[2, 256](torch.zeros(256), 17_000)
    spin = kern("spin_then_fault")  # compiled before the timer starts
    # The interrupts go to the main thread, as a notebook's stop button reaches its kernel: a
    # signal sent to the whole process may be taken by any thread (timers, simulator workers).
    timer = threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt, match="interrupted"):
        spin[1, 1](torch.zeros(1, dtype=torch.int32))
    timer.join()
    # after the faulting launches, an interrupt is Python's again
    with pytest.raises(KeyboardInterrupt):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        time.sleep(1)
    still_works()
