"""Faults in emulated kernels become Python exceptions, and the process keeps running.

On a GPU these bugs corrupt the CUDA context (or hang it) instead of raising, so these
tests only run in simulation.
"""
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cuda_sources import REVERSE_DYNAMIC

import utils

pytestmark = pytest.mark.skipif(not utils.SIMULATE, reason="fault injection would corrupt a real GPU context")


def k(src, name):
    return utils.cuda_kernel(src, name)


DIVERGENT = r"""
__global__ void half_barrier(float* x) {
    if (threadIdx.x < 16) {
        __syncthreads();
    }
    x[threadIdx.x] = 1.0f;
}
"""


def test_divergent_syncthreads_names_kernel_block_threads_and_line():
    t = time.perf_counter()
    with pytest.raises(utils.KernelFault) as e:
        k(DIVERGENT, "half_barrier")[2, 64](torch.zeros(64))
    assert time.perf_counter() - t < 5
    msg = str(e.value)
    assert "half_barrier" in msg and "block (0,0,0)" in msg
    assert "threads 0-15: wait at __syncthreads() on line 4" in msg
    assert "threads 16-63: already returned" in msg


EARLY_RETURN = r"""
__global__ void early_return(const float* x, float* y, int n) {
    __shared__ float s[128];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;          // the threads past n never reach the barrier
    s[threadIdx.x] = x[i];
    __syncthreads();
    y[i] = s[(threadIdx.x + 1) % blockDim.x];
}
"""


def test_early_return_before_barrier():
    x = torch.randn(200)
    y = torch.zeros(200)
    with pytest.raises(utils.KernelFault, match=r"block \(1,0,0\)[\s\S]*threads 72-127: already returned"):
        k(EARLY_RETURN, "early_return")[2, 128](x, y, 200)


TWO_BARRIERS = r"""
__global__ void two_barriers(float* x) {
    if (threadIdx.x % 2) { __syncthreads(); } else { __syncthreads(); }
    x[threadIdx.x] = 1.0f;
}
"""


def test_different_barriers_in_if_else():
    with pytest.raises(utils.KernelFault, match="different __syncthreads"):
        k(TWO_BARRIERS, "two_barriers")[1, 32](torch.zeros(32))


WARP_DIVERGE = r"""
__global__ void partial_shuffle(float* x) {
    float v = x[threadIdx.x];
    if (threadIdx.x % 32 < 16) v += __shfl_down_sync(0xffffffff, v, 1);
    x[threadIdx.x] = v;
}
"""


def test_warp_collective_missing_lanes():
    with pytest.raises(utils.KernelFault,
                       match=r"__shfl_down_sync\(mask=0xffffffff\) on line 4[\s\S]*already returned"):
        k(WARP_DIVERGE, "partial_shuffle")[1, 64](torch.zeros(64))


OOB = r"""
__global__ void shift(const float* x, float* y, int n, int offset) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i + offset];
}
__global__ void store_at(float* y, long long at) {
    if (threadIdx.x == 0) y[at] = 1.0f;
}
"""


def test_read_past_the_end_names_the_argument():
    x = torch.randn(1024)
    y = torch.zeros(1024)
    with pytest.raises(utils.KernelFault, match=r"shift: .*read `x\[1024\]`, past the end of argument `x` "
                                                r"\(1024 elements"):
        k(OOB, "shift")[4, 256](x, y, 1024, 1)
    assert torch.equal(y, torch.zeros(1024))  # a faulting launch changes nothing


def test_read_before_the_start():
    x = torch.randn(1024)
    y = torch.zeros(1024)
    with pytest.raises(utils.KernelFault, match=r"read `x\[-\d+\]`, before the start of argument `x`"):
        k(OOB, "shift")[4, 256](x, y, 1024, -5000)


def test_write_past_the_end_and_before_the_start():
    y = torch.zeros(1000)
    with pytest.raises(utils.KernelFault, match=r"store_at: .*wrote `y\[1024\]`, past the end of argument `y`"):
        k(OOB, "store_at")[1, 32](y, 1024)
    with pytest.raises(utils.KernelFault, match=r"wrote `y\[-2000\]`, before the start of argument `y`"):
        k(OOB, "store_at")[1, 32](y, -2000)


def test_write_just_past_the_end_is_caught_by_the_canary():
    y = torch.zeros(1001)  # 4004 bytes: the buffer is padded to 4016, so y[1001] is slack
    with pytest.raises(utils.KernelFault, match=r"store_at wrote past the last element of `y`"):
        k(OOB, "store_at")[1, 32](y, 1001)


def test_in_place_kernels_share_one_buffer():
    src = r"""
__global__ void twice(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""
    x = torch.randn(300)
    ref = 2 * x
    k(src, "twice")[3, 128](x, x, 300)  # the same tensor in and out
    assert torch.equal(x, ref)
    z = torch.arange(10.0)
    with utils.race_detection(False):  # thread i reads what thread i-1 writes: a race on a GPU
        k(src, "twice")[1, 32](z[1:], z[:-1], 9)  # overlapping views see each other's memory
    assert torch.equal(z[:-1], 2 * torch.arange(1.0, 10.0))
    with pytest.raises(utils.KernelRace, match=r"data race on `x\[0\]`"):
        k(src, "twice")[1, 32](z[1:], z[:-1], 9)


CRASHES = r"""
#include <cstdlib>
__global__ void null_write(float* p) { p[threadIdx.x] = 1.0f; }
__global__ void divide(const int* x, int* y) { y[threadIdx.x] = 100 / x[threadIdx.x]; }
__global__ void asserts(const float* x) { assert(x[threadIdx.x] >= 0.0f); }
__global__ void aborts(int* x) { if (threadIdx.x == 3) abort(); }
__device__ int deep(int d) { volatile char pad[4096]; pad[0] = (char)d; return d <= 0 ? pad[0] : deep(d - 1) + pad[0]; }
__global__ void recurse(int* out) { out[0] = deep(1 << 20); }
__global__ void wild(float* out) { float* p = (float*)0x100000000000ULL; out[0] = p[threadIdx.x]; }
"""


def test_crashes_become_exceptions_and_the_process_survives(emulator_only):
    with pytest.raises(utils.KernelFault, match="null pointer"):
        k(CRASHES, "null_write")[1, 4](None)
    with pytest.raises(utils.KernelFault, match="division"):
        k(CRASHES, "divide")[1, 4](torch.tensor([1, 2, 0, 4], dtype=torch.int32), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(utils.KernelFault,
                       match=r"assert\(x\[threadIdx.x\] >= 0.0f\) failed on line 5 in thread \(2,0,0\)"):
        k(CRASHES, "asserts")[1, 4](torch.tensor([1.0, 2.0, -1.0, 3.0]))
    with pytest.raises(utils.KernelFault, match=r"abort\(\)"):
        k(CRASHES, "aborts")[1, 8](torch.zeros(8, dtype=torch.int32))
    with pytest.raises(utils.KernelFault, match="stack"):
        k(CRASHES, "recurse")[1, 1](torch.zeros(1, dtype=torch.int32))
    with pytest.raises(utils.KernelFault, match="not inside any tensor argument"):
        k(CRASHES, "wild")[1, 1](torch.zeros(1))
    # ... and kernels still run afterwards
    src = "__global__ void one(float* y) { y[threadIdx.x] = 1.0f; }"
    y = torch.zeros(32)
    k(src, "one")[1, 32](y)
    assert torch.equal(y, torch.ones(32))


RACY = r"""
__global__ void shift_left(const float* x, float* y) {
    __shared__ float s[256];
    int t = threadIdx.x;
    s[t] = x[t];
    // BUG: no __syncthreads() here; thread t reads what thread t-1 wrote
    y[t] = t > 0 ? s[t - 1] : 0.0f;
}
"""


def test_random_schedule_exposes_a_missing_syncthreads():
    kr = k(RACY, "shift_left")
    x = torch.arange(1.0, 257.0)
    y = torch.zeros(256)
    ref = torch.cat([torch.zeros(1), x[:-1]])
    with pytest.raises(utils.KernelRace, match=r"`s\[0\]` .*thread \(1,0,0\) of block \(0,0,0\) reads it on line 7.*"
                                                r"thread \(0,0,0\) of block \(0,0,0\) wrote it on line 5"):
        kr[1, 256](x, y)  # the race detector sees it whatever the order
    with utils.race_detection(False):  # without it, only a random order shows the bug
        kr[1, 256](x, y)  # threads in order: every writer ran before its reader, the bug hides
        assert torch.equal(y, ref)
        y.zero_()
        with utils.emulation_schedule("random", seed=1):
            kr[1, 256](x, y)
        assert not torch.equal(y, ref)
        # the same seed gives the same schedule: failures can be replayed
        y2 = torch.zeros(256)
        with utils.emulation_schedule("random", seed=1):
            kr[1, 256](x, y2)
        assert torch.equal(y.nan_to_num(-1.0), y2.nan_to_num(-1.0))


def test_shared_memory_is_separate_per_block_and_dynamic_memory_is_poisoned():
    src = r"""
__global__ void first_read(float* out) {
    extern __shared__ float s[];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[threadIdx.x];  // never written: garbage on a GPU
}
"""
    out = torch.zeros(64)
    k(src, "first_read")[2, 32, 128](out)
    assert torch.isnan(out).all()


def test_invalid_launch_configuration_from_cpp_is_reported():
    # validated in Python before the launch
    with pytest.raises(ValueError):
        k(DIVERGENT, "half_barrier")[(1, 70000), 32](torch.zeros(32))


SPIN = r"""
__global__ void spin(volatile int* flag) {
    while (flag[0] == 0) { }   // waits for a write that never comes
}
"""


def test_interrupt_stops_a_hung_kernel(python_gets_sigint):
    """The notebook's interrupt button (SIGINT) stops a kernel that never ends."""
    import signal
    import threading
    ks = k(SPIN, "spin")
    timer = threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    timer.start()
    t = time.perf_counter()
    with pytest.raises(KeyboardInterrupt, match="spin interrupted"):
        ks[1, 1](torch.zeros(1, dtype=torch.int32))
    assert time.perf_counter() - t < 5
    timer.join()


def test_portable_ucontext_fallback(monkeypatch):
    """The fiber switch used where there is no hand-written one (arm64): same results."""
    monkeypatch.setenv("COURSE_EMU_UCONTEXT", "1")
    src = EARLY_RETURN.replace("if (i >= n) return;          // the threads past n never reach the barrier",
                               "float v = i < n ? x[i] : 0.0f;")
    src = src.replace("s[threadIdx.x] = x[i];", "s[threadIdx.x] = v;")
    src = src.replace("y[i] = s[(threadIdx.x + 1) % blockDim.x];",
                      "float w = __shfl_xor_sync(0xffffffff, v, 1);\n"
                      "    if (i < n) y[i] = s[(threadIdx.x + 1) % blockDim.x] + w;")
    kk = k(src + "\n// ucontext build\n", "early_return")
    x = torch.arange(200.0)
    y = torch.zeros(200)
    kk[2, 128](x, y, 200)
    xp = torch.cat([x, torch.zeros(56)]).view(2, 128)
    ref = (xp.roll(-1, 1) + xp.view(2, 64, 2).flip(2).reshape(2, 128)).reshape(-1)[:200]
    assert torch.equal(y, ref)
    with pytest.raises(utils.KernelFault, match="already returned"):
        k(EARLY_RETURN + "\n// ucontext build\n", "early_return")[2, 128](x, y, 200)


def test_host_api_symbols_and_events(emulator_only):
    """Host-side helpers used by load_inline code: constant memory and events. Emulated
    code is plain C++, so a host helper can be called from a kernel to test it cheaply."""
    src = r"""
__constant__ float coeff[4];
void host_side(float* out_ms) {
    float c[4] = {1.0f, 2.0f, 3.0f, 0.0f};
    cudaMemcpyToSymbol(coeff, c, sizeof c);
    cudaEvent_t a, b;
    cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a); cudaEventRecord(b); cudaEventSynchronize(b);
    cudaEventElapsedTime(out_ms, a, b);
    cudaEventDestroy(a); cudaEventDestroy(b);
}
__global__ void poly(const float* x, float* y, int n, float* ms) {
    if (threadIdx.x == 0) host_side(ms);
    __syncthreads();
    int i = threadIdx.x;
    if (i < n) y[i] = coeff[0] + x[i] * (coeff[1] + x[i] * coeff[2]);
}
"""
    ms = torch.full((1,), -1.0)
    x = torch.randn(100)
    y = torch.zeros(100)
    k(src, "poly")[1, 128](x, y, 100, ms)
    assert 0.0 <= ms.item() < 1000.0
    torch.testing.assert_close(y, 1 + x * (2 + x * 3))


def test_static_shared_spelling():
    src = r"""
__global__ void reverse(const float* x, float* y) {
    static __shared__ float s[64];
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = s[63 - threadIdx.x];
}
"""
    x = torch.randn(64)
    y = torch.zeros(64)
    with utils.emulation_schedule("random", seed=3):
        k(src, "reverse")[1, 64](x, y)
    assert torch.equal(y, x.flip(0))


SHARED_OVERRUN = r"""
#define BLOCK 256
// A prefix-sum style loop that forgets the bound: the last threads write s[t + stride] past
// the end. (`+=` on the guard is caught too, not only a plain store.)
__global__ void tree_past_the_end(const float* x, float* out, int n) {
    __shared__ float s[BLOCK];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = 1; stride < blockDim.x; stride *= 2) {
        s[t + stride] += s[t];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}
__global__ void before_the_start(float* out) {
    __shared__ double d[8];
    int t = threadIdx.x;
    d[t - 1] = 1.0;  // thread 0 writes d[-1]
    out[t] = 0.0f;
}
__global__ void tile_2d(float* out) {
    __shared__ float tile[4][5];   // arrays of arrays and scalars are still plain shared memory
    __shared__ int counter;
    int t = threadIdx.x;
    tile[t / 5][t % 5] = t;
    if (t == 0) counter = 1;
    __syncthreads();
    out[t] = tile[t / 5][t % 5] + counter;
}
"""


def test_write_past_a_shared_array_names_the_array_and_the_barrier():
    # (the kernel also races: thread t writes s[t + stride] while thread t + stride reads it)
    with pytest.raises(utils.KernelFault) as info, utils.race_detection(False):
        k(SHARED_OVERRUN, "tree_past_the_end")[4, 256](torch.randn(1000), torch.zeros(4), 1000)
    msg = str(info.value)
    assert "s[256], past the end of the __shared__ array `s` (256 elements" in msg
    assert "before the __syncthreads() on line 13" in msg and "block (0,0,0)" in msg


def test_write_before_a_shared_array_is_caught_when_the_block_ends():
    with pytest.raises(utils.KernelFault, match=r"d\[-1\], before the start of the __shared__ array `d` "
                                                r"\(8 elements.*before the block ended"):
        k(SHARED_OVERRUN, "before_the_start")[1, 8](torch.zeros(8))


def test_guarded_shared_arrays_behave_as_before():
    out = torch.zeros(20)
    k(SHARED_OVERRUN, "tile_2d")[1, 20](out)
    assert torch.equal(out, torch.arange(1, 21, dtype=torch.float32))


def test_dynamic_shared_memory_the_launch_did_not_ask_for():
    """The classic: extern __shared__ used, but the launch's third parameter forgotten."""
    x, y = torch.randn(64), torch.zeros(64)
    kern = k(REVERSE_DYNAMIC, "reverse_kernel")
    with pytest.raises(utils.KernelFault, match=r"wrote byte 0 of the dynamic \(extern __shared__\) shared memory, "
                                                r"but the launch asked for 0 bytes.*third launch parameter"):
        kern[1, 64](x, y)
    with pytest.raises(utils.KernelFault, match=r"byte 64 .*asked for 64 bytes.*elements instead of bytes"):
        kern[1, 64, 64](x, y)           # 64 elements, but 64 bytes
    # whatever the first byte of the first float past the end (it may match the guard pattern,
    # leaving the second byte the first changed one), the report names the float's first byte
    first = x[16:17].view(torch.uint8)
    for low_byte in range(256):
        first[0] = low_byte
        with pytest.raises(utils.KernelFault, match=r"wrote byte 64 of the dynamic"):
            kern[1, 64, 64](x, y)
    kern[1, 64, 64 * 4](x, y)
    assert torch.equal(y, x.flip(0))
