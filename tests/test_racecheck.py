"""The CUDA C++ emulator's race detector: each kind of race is reported with both sides
named, and the race-free versions of the same kernels (atomics, barriers, __syncwarp) are not."""
import pytest
import torch

import utils

pytestmark = pytest.mark.skipif(not utils.SIMULATE, reason="race detection is part of the CPU emulator")


def k(src, name):
    return utils.cuda_kernel(src, name)


BLOCK_SUM = r"""
__global__ void block_sum(const float* x_ptr, float* out_ptr, int n) {
    __shared__ float s[128];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x_ptr[i] : 0.0f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        BARRIER
    }
    if (t == 0) UPDATE;
}
"""


def block_sum(barrier="__syncthreads();", update="atomicAdd(out_ptr, s[0])"):
    return k(BLOCK_SUM.replace("BARRIER", barrier).replace("UPDATE", update), "block_sum")


def run_sum(kern, n=1000):
    out = torch.zeros(1)
    kern[(n + 127) // 128, 128](torch.ones(n), out, n)
    return out.item()


def test_detection_is_on_by_default_and_can_be_switched_off():
    kern = block_sum()
    assert kern._lib.racecheck
    assert run_sum(kern) == 1000.0
    racy = block_sum(update="out_ptr[0] += s[0]")
    with utils.race_detection(False):
        assert run_sum(racy) == 1000.0  # blocks run one after another here: the right sum
        assert not racy._lib.racecheck
    with pytest.raises(utils.KernelRace):
        run_sum(racy)


def test_global_race_between_blocks_names_both_blocks_the_line_and_atomicadd():
    with pytest.raises(utils.KernelFault) as info:
        run_sum(block_sum(update="out_ptr[0] += s[0]"))
    msg = str(info.value)
    assert isinstance(info.value, utils.KernelRace)
    assert msg.startswith("block_sum: data race on `out_ptr[0]` (global memory)")
    assert "thread (0,0,0) of block (1,0,0) reads it on line 12" in msg
    assert "thread (0,0,0) of block (0,0,0) wrote it on line 12" in msg
    assert "`if (t == 0) out_ptr[0] += s[0];`" in msg
    assert "use atomicAdd" in msg


def test_missing_barrier_in_shared_memory_names_both_threads_and_lines():
    with pytest.raises(utils.KernelRace) as info:
        run_sum(block_sum(barrier=""))
    msg = str(info.value)
    assert "data race on `s[1]` (shared memory)" in msg
    assert "thread (1,0,0) of block (0,0,0) writes it on line 9" in msg
    assert "thread (0,0,0) of block (0,0,0) read it on line 9" in msg
    assert "__syncthreads() after line 9" in msg


def test_barrier_between_two_lines_is_suggested():
    src = r"""
__global__ void reverse(const float* x_ptr, float* y_ptr) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = x_ptr[t];
    y_ptr[t] = s[63 - t];
}
"""
    with pytest.raises(utils.KernelRace) as info:
        k(src, "reverse")[1, 64](torch.randn(64), torch.zeros(64))
    msg = str(info.value)
    # thread 31 read s[32] before thread 32 (another warp) wrote it, with no barrier between
    assert "`s[32]`" in msg and "thread (32,0,0) of block (0,0,0) writes it on line 5" in msg
    assert "thread (31,0,0) of block (0,0,0) read it on line 6" in msg
    assert "no barrier between them: put a __syncthreads() between line 5 and line 6" in msg
    fixed = src.replace("    y_ptr[t]", "    __syncthreads();\n    y_ptr[t]")
    y = torch.zeros(64)
    x = torch.randn(64)
    k(fixed, "reverse")[1, 64](x, y)
    assert torch.equal(y, x.flip(0))


WARP_SHIFT = r"""
__global__ void warp_shift(const float* x_ptr, float* y_ptr) {
    __shared__ float s[32];
    int lane = threadIdx.x;
    s[lane] = x_ptr[lane];
    SYNC
    y_ptr[lane] = s[(lane + 1) % 32];
}
"""


def test_lanes_of_one_warp_need_syncwarp():
    with pytest.raises(utils.KernelRace) as info:
        k(WARP_SHIFT.replace("SYNC", ""), "warp_shift")[1, 32](torch.randn(32), torch.zeros(32))
    msg = str(info.value)
    assert "intra-warp hazard" in msg and "lanes 0 and 1 of one warp" in msg
    assert "independent thread scheduling" in msg
    for sync in ("__syncwarp();", "__syncwarp(0xffffffffu);", "__syncthreads();"):
        x, y = torch.randn(32), torch.zeros(32)
        k(WARP_SHIFT.replace("SYNC", sync), "warp_shift")[1, 32](x, y)
        assert torch.equal(y, x.roll(-1))


def test_partial_syncwarp_orders_only_the_lanes_in_its_mask():
    src = r"""
__global__ void pairs(float* y_ptr) {
    __shared__ float s[32];
    int lane = threadIdx.x;
    s[lane] = lane;
    if (lane < 16) {
        __syncwarp(0x0000ffffu);
        y_ptr[lane] = s[READ];
    } else {
        __syncwarp(0xffff0000u);
        y_ptr[lane] = s[lane];
    }
}
"""
    y = torch.zeros(32)
    k(src.replace("READ", "15 - lane"), "pairs")[1, 32](y)  # within the lower half: synchronized
    assert torch.equal(y[:16], torch.arange(15.0, -1.0, -1.0))
    with pytest.raises(utils.KernelRace, match="intra-warp hazard"):
        k(src.replace("READ", "lane + 16"), "pairs")[1, 32](y)  # an upper lane's value: no common barrier


def test_atomics_do_not_race_with_each_other_but_with_plain_writes():
    src = r"""
__global__ void histogram(const int* bins_ptr, int* count_ptr, int n) {
    __shared__ int local[4];
    int t = threadIdx.x;
    if (t < 4) local[t] = 0;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + t;
    if (i < n) atomicAdd(&local[bins_ptr[i]], 1);
    PLAIN
    __syncthreads();
    if (t < 4) atomicAdd(&count_ptr[t], local[t]);
}
"""
    bins = torch.randint(0, 4, (1000,), dtype=torch.int32)
    count = torch.zeros(4, dtype=torch.int32)
    k(src.replace("PLAIN", ""), "histogram")[8, 128](bins, count, 1000)
    assert torch.equal(count, torch.bincount(bins, minlength=4).to(torch.int32))
    with pytest.raises(utils.KernelRace, match=r"`local\[0\]` .*atomically updated|`local\[0\]` .*atomically updates"):
        k(src.replace("PLAIN", "if (t == 5) local[0] = 7;"), "histogram")[8, 128](bins, count, 1000)


def test_threadfence_last_block_pattern_is_not_a_race():
    # The CUDA samples' threadFenceReduction: each block writes its partial sum, fences,
    # counts itself with an atomic; the last block to arrive reads every partial.
    src = r"""
__device__ unsigned int blocks_done = 0;
__global__ void fence_sum(const float* x_ptr, float* partial_ptr, float* out_ptr, int n) {
    __shared__ bool am_last;
    __shared__ float s[64];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x_ptr[i] : 0.0f;
    __syncthreads();
    for (int stride = 32; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) {
        partial_ptr[blockIdx.x] = s[0];
        __threadfence();
        unsigned int ticket = atomicInc(&blocks_done, gridDim.x);
        am_last = (ticket == gridDim.x - 1);
    }
    __syncthreads();
    if (am_last && t == 0) {
        float total = 0.0f;
        for (int b = 0; b < gridDim.x; ++b) total += partial_ptr[b];
        out_ptr[0] = total;
        blocks_done = 0;
    }
}
"""
    out = torch.zeros(1)
    k(src, "fence_sum")[16, 64](torch.ones(1000), torch.zeros(16), out, 1000)
    assert out.item() == 1000.0
    # The samples' version writes the total over partial 0, which block 0 wrote: the fence and
    # the ticket order that write before the last block's too.
    partial = torch.zeros(16)
    k(src.replace("out_ptr[0] = total;", "partial_ptr[0] = total;"), "fence_sum")[16, 64](
        torch.ones(1000), partial, out, 1000)
    assert partial[0].item() == 1000.0
    # without the fence the last block may read a partial that is not written yet
    with pytest.raises(utils.KernelRace, match=r"`partial_ptr\[0\]`"):
        k(src.replace("__threadfence();", ""), "fence_sum")[16, 64](torch.ones(1000), torch.zeros(16), out, 1000)
    with pytest.raises(utils.KernelRace, match=r"`partial_ptr\[0\]`"):
        k(src.replace("__threadfence();", "").replace("out_ptr[0] = total;", "partial_ptr[0] = total;"),
          "fence_sum")[16, 64](torch.ones(1000), torch.zeros(16), out, 1000)


def test_dynamic_shared_memory_and_2d_blocks_are_checked():
    src = r"""
__global__ void transpose_tile(const float* x_ptr, float* y_ptr) {
    extern __shared__ float tile[];
    int tx = threadIdx.x, ty = threadIdx.y;
    tile[ty * 16 + tx] = x_ptr[ty * 16 + tx];
    BARRIER
    y_ptr[ty * 16 + tx] = tile[tx * 16 + ty];
}
"""
    x = torch.randn(16, 16)
    y = torch.zeros(16, 16)
    k(src.replace("BARRIER", "__syncthreads();"), "transpose_tile")[1, (16, 16), 16 * 16 * 4](x, y)
    assert torch.equal(y, x.t())
    with pytest.raises(utils.KernelRace) as info:
        k(src.replace("BARRIER", ""), "transpose_tile")[1, (16, 16), 16 * 16 * 4](x, y)
    msg = str(info.value)
    assert "data race on `tile[16]` (shared memory)" in msg and "thread (0,1,0) of block (0,0,0) writes it" in msg


def test_each_block_its_own_elements_and_grid_stride_loops_are_race_free():
    src = r"""
__global__ void scale(const float* x_ptr, float* y_ptr, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y_ptr[i] = 2.0f * x_ptr[i];
}
"""
    x = torch.randn(5000)
    y = torch.zeros(5000)
    k(src, "scale")[7, 96](x, y, 5000)
    assert torch.equal(y, 2 * x)
    k(src, "scale")[7, 96](y, y, 5000)  # in place: each element read and written by one thread
    assert torch.equal(y, 4 * x)


def test_the_course_racy_demo_kernel_is_reported():
    from kernels.cuda import reduction
    src = reduction.kernel("sum_racy_kernel")
    with pytest.raises(utils.KernelRace, match=r"`out_ptr\[0\]`"):
        src[4, 256](torch.ones(1000), torch.zeros(()), 1000)
    assert reduction.sum_racy(torch.ones(1000)).item() > 0  # the demo itself runs without the detector


def test_a_race_leaves_the_tensors_unchanged_and_the_next_launch_works():
    out = torch.full((1,), 5.0)
    with pytest.raises(utils.KernelRace):
        block_sum(update="out_ptr[0] += s[0]")[8, 128](torch.ones(1000), out, 1000)
    assert out.item() == 5.0
    assert run_sum(block_sum()) == 1000.0


# ---------------------------------------------------------------------------------------
# Undefined warp behaviour: reported, not given a meaning
# ---------------------------------------------------------------------------------------
SHUFFLE = r"""
__global__ void warp_reduce(const float* x_ptr, float* out_ptr) {
    float v = x_ptr[threadIdx.x];
    for (int offset = 16; offset > 0; offset /= 2) {
        unsigned mask = MASK;
        v += __shfl_down_sync(mask, v, offset);
    }
    if (threadIdx.x == 0) out_ptr[0] = v;
}
"""


def test_shuffle_from_a_lane_outside_the_mask_is_a_fault():
    x, out = torch.ones(32), torch.zeros(1)
    k(SHUFFLE.replace("MASK", "0xffffffffu"), "warp_reduce")[1, 32](x, out)
    assert out.item() == 32.0
    # a published pattern: only the lanes that add take part, so lane 0 reads lane 16, which
    # the mask leaves out (undefined on a GPU)
    shrinking = SHUFFLE.replace("unsigned mask = MASK;",
                                "unsigned mask = __ballot_sync(0xffffffffu, threadIdx.x < offset);")
    shrinking = shrinking.replace("        v += __shfl", "        if (threadIdx.x < offset) v += __shfl")
    with pytest.raises(utils.KernelFault, match=r"__shfl_down_sync on line 6: lane 0 of warp 0 reads lane 16, "
                                                r"which is not in the mask 0x0000ffff"):
        k(shrinking, "warp_reduce")[1, 32](x, out)


def test_shuffle_from_a_lane_the_block_does_not_have_is_a_fault():
    with pytest.raises(utils.KernelFault, match=r"reads lane 16, which does not exist \(the block has 16 threads\)"):
        k(SHUFFLE.replace("MASK", "0xffffffffu"), "warp_reduce")[1, 16](torch.ones(16), torch.zeros(1))


def test_warp_collectives_with_masks_that_leave_out_the_lane_or_disagree():
    src = r"""
__global__ void votes(int* out_ptr) {
    int lane = threadIdx.x;
    unsigned mask = MASK;
    out_ptr[lane] = __ballot_sync(mask, lane % 2);
}
"""
    out = torch.zeros(32, dtype=torch.int32)
    k(src.replace("MASK", "0xffffffffu"), "votes")[1, 32](out)
    assert (out == 0xAAAAAAAA - 2**32).all()
    with pytest.raises(utils.KernelFault, match=r"__ballot_sync on line 5: lane 16 calls it with mask 0x0000ffff, "
                                                r"which does not include the lane itself"):
        k(src.replace("MASK", "0x0000ffffu"), "votes")[1, 32](out)
    with pytest.raises(utils.KernelFault, match=r"lanes named in mask .* disagree"):
        k(src.replace("MASK", "lane < 16 ? 0xffffffffu : 0xfffffffeu | (1u << lane)"), "votes")[1, 32](out)
