"""Profiling counters of Numba's CUDA simulator and Triton's interpreter
(runtime/backends/numba/profile.py, runtime/backends/triton/profile.py).

Every expected count is worked out by hand in the comment above it, by the rules Nsight
Compute counts with: a warp-wide access is one request; its sectors are the distinct
32-byte sectors its active lanes touch; a shared access takes as many wavefronts as the
most distinct 4-byte words any one of the 32 banks holds.
"""
import inspect

import pytest
import torch
from copy_kernels import copy_kernel, copy_tl_kernel

import runtime
import utils
from runtime.backends.numba import profile as sim_profile
from runtime.backends.triton import profile as triton_profile

import triton
import triton.language as tl
from numba import cuda, float32, float64

pytestmark = pytest.mark.skipif(not utils.SIMULATE, reason="profiling in simulation")

LD = "l1tex__t_{}_pipe_lsu_mem_global_op_ld.sum"
ST = "l1tex__t_{}_pipe_lsu_mem_global_op_st.sum"
RATIO = "smsp__thread_inst_executed_per_inst_executed.ratio"


def line_of(fn, text):
    """The line number of the first line of ``fn``'s source that contains ``text``."""
    fn = getattr(fn, "py_func", None) or getattr(fn, "fn", None) or fn
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, s in enumerate(lines) if text in s)


def site(p, name, op, space="global"):
    [s] = [s for s in p["sites"] if s["name"] == name and s["op"] == op and s["space"] == space]
    return s


# ---------------------------------------------------------------------------------------
# Global memory: coalescing.
# ---------------------------------------------------------------------------------------
@cuda.jit
def strided_kernel(x_ptr, y_ptr, n, STRIDE):
    i = cuda.grid(1)
    if i < n:
        y_ptr[i] = x_ptr[i * STRIDE]


def test_coalesced_copy_four_sectors_per_request():
    n = 256
    x, y = torch.randn(n), torch.zeros(n)
    p = sim_profile.profile_numba(copy_kernel, 2, 128, x, y, n)
    assert torch.equal(y, x)  # the launch really ran
    m = p["metrics"]
    # 256 threads = 8 warps; each warp reads 32 neighbouring floats = 128 bytes = 4 sectors.
    assert m[LD.format("requests")] == 8 and m[LD.format("sectors")] == 32
    assert m[ST.format("requests")] == 8 and m[ST.format("sectors")] == 32
    assert m[RATIO] == 32.0  # no lane idles
    s = site(p, "x_ptr", "ld")
    assert (s["line"], s["sectors"], s["ideal_sectors"], s["stride_bytes"], s["avg_lanes"]) == \
        (line_of(copy_kernel, "y_ptr[i] = x_ptr[i]"), 32, 32, 4, 32.0)
    # Needed: 1 KiB read + 1 KiB written; moved: 64 sectors of 32 bytes.
    assert p["bytes_needed"] == 2048 and p["bytes_moved"] == 2048
    assert p["backend"] == "numba-simulator" and p["kernel"] == "copy_kernel"
    assert p["summary"] == ["every warp access is coalesced and conflict-free, and no lane idles"]


@pytest.mark.parametrize("stride, sectors", [(2, 8), (32, 32)])
def test_strided_load_touches_more_sectors(stride, sectors):
    # Lane k reads x[k * stride]: 32 floats `4 * stride` bytes apart. Stride 2 spans 256
    # bytes (8 sectors); stride 32 puts each lane in its own sector (32).
    n = 64
    x, y = torch.randn(n * stride), torch.zeros(n)
    p = sim_profile.profile_numba(strided_kernel, 1, 64, x, y, n, stride)
    assert torch.equal(y, x[::stride])
    m = p["metrics"]
    assert m[LD.format("requests")] == 2 and m[LD.format("sectors")] == 2 * sectors
    assert m[ST.format("sectors")] == 8  # the store stays coalesced
    s = site(p, "x_ptr", "ld")
    assert (s["sectors"], s["ideal_sectors"], s["stride_bytes"]) == (2 * sectors, 8, 4 * stride)
    line = line_of(strided_kernel, "x_ptr[i * STRIDE]")
    assert p["summary"][0] == (f"each warp's load of `x_ptr` (line {line}) touches {sectors} "
                               f"sectors where 4 would do: neighbouring threads read addresses "
                               f"{4 * stride} bytes apart")
    # 2 * 32 sectors read for 256 bytes needed; the store moves what it needs.
    assert p["bytes_moved"] == 32 * (2 * sectors + 8) and p["bytes_needed"] == 512
    ratio = {2: "1.5", 32: "4.5"}[stride]
    assert p["summary"][-1] == (f"the launch moves {ratio}x the bytes it needs "
                                f"({p['bytes_moved']} bytes in 32-byte sectors for 512 bytes "
                                "read or written)")


def test_misaligned_by_one_element_touches_five_sectors():
    # x[1:] starts 4 bytes into its allocation (which a GPU aligns to 256 bytes): warp 0
    # reads bytes 4..131 of it, sectors 0..4 (5); warp 1 bytes 132..259, sectors 4..8 (5).
    n = 64
    base = torch.randn(n + 1)
    y = torch.zeros(n)
    p = sim_profile.profile_numba(copy_kernel, 1, 64, base[1:], y, n)
    assert torch.equal(y, base[1:])
    s = site(p, "x_ptr", "ld")
    assert (s["requests"], s["sectors"], s["ideal_sectors"]) == (2, 10, 8)
    assert "start 4 bytes past a 32-byte sector boundary" in p["summary"][0]
    assert site(p, "y_ptr", "st")["sectors"] == 8


@cuda.jit
def transpose_tile_kernel(x_ptr, y_ptr):
    # A (16, 16) block: warps are formed x fastest, so warp w holds rows 2w and 2w+1.
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    y_ptr[ty, tx] = x_ptr[tx, ty]


def test_2d_block_warps_are_x_fastest():
    # Store y[ty, tx]: a warp writes rows ty, ty+1 of a 16-float-wide array, 128
    # contiguous bytes: 4 sectors. Load x[tx, ty]: 16 rows 64 bytes apart, each row's two
    # floats (columns ty, ty+1, ty even) in one sector: 16 sectors. 256 threads = 8 warps.
    x = torch.randn(16, 16)
    y = torch.zeros(16, 16)
    p = sim_profile.profile_numba(transpose_tile_kernel, 1, (16, 16), x, y)
    assert torch.equal(y, x.T)
    m = p["metrics"]
    assert (m[ST.format("requests")], m[ST.format("sectors")]) == (8, 32)
    assert (m[LD.format("requests")], m[LD.format("sectors")]) == (8, 128)
    assert site(p, "x_ptr", "ld")["stride_bytes"] == 64


def test_partial_warp():
    # A block of 48 threads: warp 0 has 32 lanes (4 sectors), warp 1 has 16 (64 bytes: 2
    # sectors). Every line runs with all the lanes present: (32 + 16) / 2 per instance.
    n = 48
    x, y = torch.randn(n), torch.zeros(n)
    p = sim_profile.profile_numba(copy_kernel, 1, 48, x, y, n)
    m = p["metrics"]
    assert m[LD.format("requests")] == 2 and m[LD.format("sectors")] == 6
    assert m[RATIO] == 24.0
    assert site(p, "x_ptr", "ld")["avg_lanes"] == 24.0
    # No lane of a warp that exists idles: not reported as divergence.
    assert p["summary"] == ["every warp access is coalesced and conflict-free, and no lane idles"]


def test_bounds_check_leaves_lanes_idle():
    # n = 40 in a block of 64: warp 1 has 8 threads with i < n. The loads and stores of
    # warp 1 have 8 lanes (1 sector each); the lines before the `if` run with 32 lanes.
    n = 40
    x, y = torch.randn(64), torch.zeros(64)
    p = sim_profile.profile_numba(copy_kernel, 1, 64, x, y, n)
    s = site(p, "x_ptr", "ld")
    assert (s["requests"], s["sectors"], s["avg_lanes"]) == (2, 5, 20.0)
    # Lines `i = ...` and `if ...`: 2 instances of 32 lanes per warp (4 x 32); the copy
    # line: 32 + 8 lanes in 2 instances. (4 * 32 + 40) / 6.
    assert p["metrics"][RATIO] == pytest.approx((4 * 32 + 40) / 6)
    assert torch.equal(y[:n], x[:n]) and not y[n:].any()


# ---------------------------------------------------------------------------------------
# Shared memory: bank conflicts.
# ---------------------------------------------------------------------------------------
@cuda.jit
def column_kernel(x_ptr, y_ptr):
    tile = cuda.shared.array((32, 32), float32)
    t = cuda.threadIdx.x
    for r in range(32):
        tile[t, r] = x_ptr[r * 32 + t]  # lane t writes row t: 128 bytes apart, one bank
    cuda.syncthreads()
    y_ptr[t] = tile[0, t] + tile[0, 0]  # a row (32 banks) and a broadcast


@cuda.jit
def column_padded_kernel(x_ptr, y_ptr):
    tile = cuda.shared.array((32, 33), float32)
    t = cuda.threadIdx.x
    for r in range(32):
        tile[t, r] = x_ptr[r * 32 + t]  # rows 132 bytes apart: banks (t + r) % 32
    cuda.syncthreads()
    y_ptr[t] = tile[0, t] + tile[0, 0]


def test_shared_column_store_conflicts_and_padding():
    x, y = torch.randn(1024), torch.zeros(32)
    p = sim_profile.profile_numba(column_kernel, 1, 32, x, y)
    m = p["metrics"]
    # 32 stores (one per r), each: 32 lanes, 32 different words of bank r -> 32
    # wavefronts, 31 conflicts.
    assert m["sm__sass_inst_executed_op_shared_st.sum"] == 32
    assert m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"] == 32 * 32
    assert m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] == 32 * 31
    # Loads: a row (32 banks, 1 wavefront) and a broadcast of one word (1 wavefront).
    assert m["sm__sass_inst_executed_op_shared_ld.sum"] == 2
    assert m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"] == 2
    assert m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] == 0
    assert m["launch__shared_mem_per_block_static"] == 32 * 32 * 4
    s = site(p, "tile", "st", "shared")
    assert (s["requests"], s["wavefronts"], s["bank_conflicts"], s["stride_bytes"]) == \
        (32, 1024, 992, 128)
    line = line_of(column_kernel, "tile[t, r] = x_ptr")
    assert p["summary"][0] == (f"the store of `tile` (line {line}) takes 32 wavefronts where 1 "
                               "would do: in the worst request, 32 lanes hit different words of "
                               "bank 0 (neighbouring lanes' addresses are 128 bytes apart); pad "
                               "the row to 33 elements")
    assert torch.equal(y, x[::32] + x[0])  # tile[0, t] = x[32 * t]

    p = sim_profile.profile_numba(column_padded_kernel, 1, 32, x, y)
    m = p["metrics"]
    assert m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"] == 32
    assert m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] == 0
    assert m["launch__shared_mem_per_block_static"] == 32 * 33 * 4
    assert torch.equal(y, x[::32] + x[0])  # tile[0, t] = x[32 * t]


# ---------------------------------------------------------------------------------------
# Divergence.
# ---------------------------------------------------------------------------------------
@cuda.jit
def odd_even_kernel(y_ptr):
    i = cuda.grid(1)
    if cuda.threadIdx.x % 2:
        y_ptr[i] = 1.0
    else:
        y_ptr[i] = 2.0


@cuda.jit
def warp_aligned_kernel(y_ptr):
    i = cuda.grid(1)
    if cuda.threadIdx.x < 32:
        y_ptr[i] = 1.0
    else:
        y_ptr[i] = 2.0


def test_divergent_branch_against_warp_aligned_branch():
    y = torch.zeros(64)
    p = sim_profile.profile_numba(odd_even_kernel, 1, 64, y)
    # Per warp: `i = ...` (32 lanes), `if` (32), each branch's store (16 + 16): 96 lanes in
    # 4 instances. Each branch's store is its own request: 16 lanes 8 bytes apart over 128
    # bytes, 4 sectors; 2 warps x 2 branches.
    assert p["metrics"][RATIO] == 24.0
    assert p["metrics"][ST.format("requests")] == 4
    assert p["metrics"][ST.format("sectors")] == 16
    assert torch.equal(y, torch.tensor([2.0, 1.0] * 32))
    line = line_of(odd_even_kernel, "y_ptr[i] = 1.0")
    assert any(s.startswith(f"line {line} (`y_ptr[i] = 1.0`) runs with 16 active lanes")
               for s in p["summary"])

    p = sim_profile.profile_numba(warp_aligned_kernel, 1, 64, y)
    # Warp 0 takes the first branch, warp 1 the second: 3 instances of 32 lanes each.
    assert p["metrics"][RATIO] == 32.0
    assert p["metrics"][ST.format("requests")] == 2
    assert p["metrics"][ST.format("sectors")] == 8
    assert not any("active lanes" in s for s in p["summary"])


# ---------------------------------------------------------------------------------------
# Atomics.
# ---------------------------------------------------------------------------------------
@cuda.jit
def count_kernel(out_ptr):
    cuda.atomic.add(out_ptr, 0, 1.0)  # result unused: a RED instruction on a GPU


@cuda.jit
def ticket_kernel(out_ptr, ticket_ptr):
    ticket_ptr[cuda.grid(1)] = cuda.atomic.add(out_ptr, 0, 1.0)  # result used: ATOM


@cuda.jit
def one_per_block_kernel(out_ptr):
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(out_ptr, 0, 1.0)


def test_one_atomic_per_block_is_not_called_contended():
    out = torch.zeros(1)
    p = sim_profile.profile_numba(one_per_block_kernel, 4, 32, out)
    assert out.item() == 4 and p["atomics"]["address_count"] == 4
    assert p["metrics"]["l1tex__t_requests_pipe_lsu_mem_global_op_red.sum"] == 4
    assert not any("atomic updates" in s for s in p["summary"])


def test_atomics_to_one_address():
    out = torch.zeros(1)
    p = sim_profile.profile_numba(count_kernel, 4, 64, out)
    assert out.item() == 256  # ran exactly once
    m = p["metrics"]
    # 4 blocks x 2 warps: 8 requests, each to one sector.
    assert (m["l1tex__t_requests_pipe_lsu_mem_global_op_red.sum"],
            m["l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum"]) == (8, 8)
    assert m["l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum"] == 0
    line = line_of(count_kernel, "cuda.atomic.add")
    assert p["atomics"] == {"count": 256, "address": "out_ptr[0]", "address_count": 256,
                            "line": line}
    assert p["summary"] == [f"256 of the 256 atomic updates go to `out_ptr[0]` (line {line}): "
                            "a GPU serialises updates of one address"]

    out.zero_()
    tickets = torch.full((256,), -1.0)
    p = sim_profile.profile_numba(ticket_kernel, 4, 64, out, tickets)
    m = p["metrics"]
    assert m["l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum"] == 8
    assert m["l1tex__t_requests_pipe_lsu_mem_global_op_red.sum"] == 0
    assert sorted(tickets.tolist()) == list(range(256))


# ---------------------------------------------------------------------------------------
# The trace, races, errors.
# ---------------------------------------------------------------------------------------
def test_trace_of_a_small_launch():
    n = 64
    x, y = torch.randn(n), torch.zeros(n)
    p = sim_profile.profile_numba(copy_kernel, 2, 32, x, y, n)
    t = p["trace"]
    fields = {"block", "thread", "warp", "lane", "space", "op", "arg", "offset", "size",
              "line", "instr"}
    assert fields <= set(t)
    assert all(v.dtype == torch.int64 and v.shape == (128,) for v in t.values())
    assert p["trace_names"] == {0: "x_ptr", 1: "y_ptr"}
    loads = t["op"] == 0
    assert torch.equal(t["arg"][loads].unique(), torch.tensor([0]))
    assert torch.equal(t["offset"][loads].sort().values, torch.arange(n) * 4)
    # One instruction instance per warp and access: 2 blocks x (load + store).
    assert t["instr"].unique().numel() == 4
    for i in t["instr"].unique():
        lanes = t["lane"][t["instr"] == i]
        assert torch.equal(lanes.sort().values, torch.arange(32))


@cuda.jit
def racy_sum_kernel(x_ptr, out_ptr):
    out_ptr[0] += x_ptr[cuda.grid(1)]


def test_races_are_still_reported_while_profiling():
    if not runtime.backends.numba.races.RACECHECK:
        pytest.skip("race detection turned off (COURSE_RACECHECK=0)")
    with pytest.raises(utils.SimulatorRaceError, match="data race in kernel `racy_sum_kernel`"):
        sim_profile.profile_numba(racy_sum_kernel, 2, 32, torch.randn(64), torch.zeros(1))
    # And the next profile starts clean.
    x, y = torch.randn(32), torch.zeros(32)
    p = sim_profile.profile_numba(copy_kernel, 1, 32, x, y, 32)
    assert p["metrics"][LD.format("sectors")] == 4
    # A plain launch after a profile is checked for races as before.
    with pytest.raises(utils.SimulatorRaceError, match="data race in kernel `racy_sum_kernel`"):
        racy_sum_kernel[2, 32](utils.to_numba(torch.randn(64)), utils.to_numba(torch.zeros(1)))


def test_bad_arguments_and_gpu(monkeypatch):
    with pytest.raises(TypeError, match="numba.cuda.jit kernel"):
        sim_profile.profile_numba(lambda: None, 1, 1)
    with pytest.raises(TypeError, match="triton.jit kernel"):
        triton_profile.profile_triton(copy_kernel, (1,))
    monkeypatch.setattr(sim_profile, "SIMULATE", False)
    monkeypatch.setattr(triton_profile, "SIMULATE", False)
    with pytest.raises(NotImplementedError, match="utils.profile"):
        sim_profile.profile_numba(copy_kernel, 1, 32, torch.zeros(32), torch.zeros(32), 32)
    with pytest.raises(NotImplementedError, match="Nsight Compute"):
        triton_profile.profile_triton(copy_tl_kernel, (1,))


# ---------------------------------------------------------------------------------------
# Triton.
# ---------------------------------------------------------------------------------------
@triton.jit
def add_tl_kernel(x_ptr, z_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    a = tl.load(x_ptr + offs, mask=mask)
    b = tl.load(z_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, a + b, mask=mask)


@triton.jit
def sum_tl_kernel(x_ptr, out_ptr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offs)))


def test_triton_masked_lanes_of_a_ragged_copy():
    # n = 1000 with BLOCK_SIZE 256: 4 programs, 1024 lanes; the last program has 1000 - 768
    # = 232 elements, 24 lanes masked off: 24 / 1024 of all lanes, 24 / 256 of its own.
    n = 1000
    x, y = torch.randn(n), torch.zeros(n)
    p = triton_profile.profile_triton(copy_tl_kernel, (triton.cdiv(n, 256),), x, y, n,
                                   BLOCK_SIZE=256)
    assert torch.equal(y, x)
    m = p["metrics"]
    assert m["programs"] == 4
    assert m["masked_lane_fraction_ld"] == 24 / 1024 and m["masked_lane_fraction_st"] == 24 / 1024
    assert m["bytes_loaded"] == m["bytes_stored"] == 4000
    # 4000 contiguous bytes from a 32-byte aligned start: 125 sectors each way.
    assert m["sectors_ld"] == m["sectors_st"] == 125
    assert p["bytes_needed"] == 8000 and p["bytes_moved"] == 8000
    assert p["per_program"]["masked_lane_fraction_ld"].tolist() == [0, 0, 0, 24 / 256]
    assert p["per_program"]["bytes_loaded"].tolist() == [1024, 1024, 1024, 928]
    line = line_of(copy_tl_kernel, "tl.store(")
    assert f"2.34% of the lanes of the load of `x_ptr` on line {line} are masked off: the last " \
           "program covers 232 of its 256 elements" in p["summary"]
    s = site(p, "x_ptr", "ld")
    assert (s["line"], s["requests"], s["lanes"], s["active_lanes"]) == (line, 4, 1024, 1000)
    assert p["backend"] == "triton-interpreter" and p["trace"] is None


def test_triton_kernel_loading_twice_what_it_stores():
    n = 2048
    x, z, y = torch.randn(n), torch.randn(n), torch.zeros(n)
    p = triton_profile.profile_triton(add_tl_kernel, lambda meta: (n // meta["BLOCK_SIZE"],),
                                   x, z, y, n, BLOCK_SIZE=512)
    assert torch.equal(y, x + z)
    m = p["metrics"]
    # 4 programs; each loads 2 x 512 floats (4096 bytes) and stores 512 (2048 bytes).
    assert (m["programs"], m["bytes_loaded"], m["bytes_stored"]) == (4, 16384, 8192)
    assert (m["bytes_loaded_per_program"], m["bytes_stored_per_program"]) == (4096, 2048)
    assert m["masked_lane_fraction_ld"] == 0.0
    assert p["summary"] == ["each program loads 2 bytes per byte it stores (4096 bytes "
                            "loaded, 2048 stored per program)"]


def test_triton_atomics_to_one_address():
    x, out = torch.ones(1024), torch.zeros(1)
    p = triton_profile.profile_triton(sum_tl_kernel, (8,), x, out, BLOCK_SIZE=128)
    assert out.item() == 1024
    assert p["atomics"] == {"count": 8, "address": "out_ptr[0]", "address_count": 8}
    assert p["metrics"]["bytes_atomic"] == 8 * 4
    # One update per program is how programs combine their results: not worth a sentence.
    assert not any("atomic updates" in s for s in p["summary"])


@cuda.jit
def dynamic_shared_kernel(x_ptr, y_ptr):
    buf = cuda.shared.array(0, float32)  # sized by the launch
    t = cuda.threadIdx.x
    buf[2 * t] = x_ptr[t]  # lanes 8 bytes apart: 2 lanes per bank (banks 0, 2, ..., 30)
    cuda.syncthreads()
    y_ptr[t] = buf[2 * t]


def test_dynamic_shared_memory_with_a_two_way_conflict():
    x, y = torch.randn(32), torch.zeros(32)
    p = sim_profile.profile_numba(dynamic_shared_kernel, 1, 32, x, y, shared=256)
    assert torch.equal(y, x)
    m = p["metrics"]
    # Words 0, 2, ..., 62: bank b (even) holds words b and b + 32: 2 wavefronts, 1 conflict.
    assert m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"] == 2
    assert m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] == 1
    assert m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] == 1
    assert m["launch__shared_mem_per_block_static"] == 0  # dynamic, not static
    assert site(p, "buf", "st", "shared")["stride_bytes"] == 8


@triton.jit
def row_copy_tl_kernel(x_ptr, y_ptr, cols, BLOCK_SIZE: tl.constexpr):
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < cols
    row = tl.program_id(0) * cols
    tl.store(y_ptr + row + offs, tl.load(x_ptr + row + offs, mask=mask), mask=mask)


def test_triton_every_program_masks_lanes_and_launch_options_pass():
    # 8 rows of 100 floats, one program each with BLOCK_SIZE 128: 28 of 128 lanes off in
    # every program. num_warps is a launch option, not a kernel parameter.
    x, y = torch.randn(8, 100), torch.zeros(8, 100)
    p = triton_profile.profile_triton(row_copy_tl_kernel, (8,), x, y, 100, BLOCK_SIZE=128,
                                   num_warps=4)
    assert torch.equal(y, x)
    assert p["metrics"]["masked_lane_fraction_ld"] == 28 / 128
    line = line_of(row_copy_tl_kernel, "tl.store(")
    assert (f"21.9% of the lanes of the load of `x_ptr` on line {line} are masked off: each "
            "of the 8 programs uses 100 of its 128 lanes") in p["summary"]
    # Rows of 400 bytes: even rows start on a sector boundary (bytes 0..399 of their own:
    # sectors 0..12), odd rows 16 bytes past one (bytes 16..415: sectors 0..12), 13 each.
    assert p["metrics"]["sectors_ld"] == 8 * 13
    assert site(p, "x_ptr", "ld")["ideal_sectors"] == 8 * 13  # ceil(400 / 32)


@triton.jit
def overlapping_tl_kernel(x_ptr, y_ptr, BLOCK_SIZE: tl.constexpr):
    # Each program stores BLOCK_SIZE + 1 elements: its last one is the next program's first.
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, 2 * BLOCK_SIZE)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs), mask=offs <= (tl.program_id(0) + 1) * BLOCK_SIZE)


def test_triton_races_found_with_launch_options():
    # Launch options such as num_warps used to hide a launch's tensors from race detection.
    if not runtime.backends.numba.races.RACECHECK:
        pytest.skip("race detection turned off (COURSE_RACECHECK=0)")
    x, y = torch.randn(64), torch.zeros(64)
    with pytest.raises(utils.SimulatorRaceError, match="y_ptr\\[16\\]"):
        overlapping_tl_kernel[(3,)](x, y, BLOCK_SIZE=16, num_warps=2)


@cuda.jit
def grid_stride_kernel(x_ptr, y_ptr, n):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        y_ptr[i] = x_ptr[i]


def test_grid_stride_loop_matches_lanes_by_iteration():
    # 2 blocks of 32 threads over n = 240 in strides of 64: iterations 0-2 are full warps
    # (4 sectors); in iteration 3, block 0 covers 192..223 (32 lanes, 4 sectors) and block
    # 1 covers 224..239 (16 lanes, 2 sectors). Requests: 2 warps x 4 iterations.
    n = 240
    x, y = torch.randn(n), torch.zeros(n)
    p = sim_profile.profile_numba(grid_stride_kernel, 2, 32, x, y, n)
    assert torch.equal(y, x)
    s = site(p, "x_ptr", "ld")
    assert (s["requests"], s["sectors"], s["ideal_sectors"]) == (8, 30, 30)
    assert s["avg_lanes"] == (7 * 32 + 16) / 8
    # Lines per thread: the `for` line 5 times (4 iterations and the exit) or 4 times (3
    # and the exit, lanes 16-31 of block 1), the body 4 or 3 times. Block 0: 9 instances of
    # 32 lanes. Block 1: `for` 4 x 32 + 1 x 16, body 3 x 32 + 1 x 16.
    lanes = 9 * 32 + 4 * 32 + 16 + 3 * 32 + 16
    assert p["metrics"][RATIO] == pytest.approx(lanes / 18)


@cuda.jit
def double_kernel(x_ptr, y_ptr):
    s = cuda.shared.array(64, float64)
    t = cuda.threadIdx.x
    s[t] = x_ptr[t]
    cuda.syncthreads()
    y_ptr[t] = s[63 - t]


def test_float64_accesses():
    # Each of the 2 warps reads 32 doubles = 256 bytes: 8 sectors. Its shared store of 32
    # doubles touches 64 words, two in each bank: 2 wavefronts, the ideal for 8-byte
    # accesses, so no conflict.
    x, y = torch.randn(64, dtype=torch.float64), torch.zeros(64, dtype=torch.float64)
    p = sim_profile.profile_numba(double_kernel, 1, 64, x, y)
    m = p["metrics"]
    assert (m[LD.format("requests")], m[LD.format("sectors")]) == (2, 16)
    assert m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"] == 4
    assert m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] == 0
    assert site(p, "s", "st", "shared")["ideal_wavefronts"] == 4
    assert torch.equal(y, x.flip(0))


def test_numpy_arguments_count_from_their_own_allocation():
    # NumPy arrays are copied to the simulator's device arrays: their own allocations,
    # aligned like a GPU's, whatever NumPy's alignment.
    import numpy as np
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, dtype=np.float32)
    p = sim_profile.profile_numba(copy_kernel, 1, 64, x, y, 64)
    assert p["metrics"][LD.format("sectors")] == 8
    assert (y == x).all()  # the simulator copies the result back


@cuda.jit
def out_of_bounds_kernel(x_ptr):
    x_ptr[cuda.grid(1)] = 1.0


def test_a_faulting_kernel_raises_and_the_next_profile_is_clean():
    with pytest.raises(IndexError):
        sim_profile.profile_numba(out_of_bounds_kernel, 1, 64, torch.zeros(32))
    p = sim_profile.profile_numba(out_of_bounds_kernel, 1, 32, torch.zeros(32))
    assert p["metrics"][ST.format("sectors")] == 4 and p["metrics"][RATIO] == 32.0


@triton.jit
def every_other_tl_kernel(x_ptr, y_ptr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(y_ptr + offs, tl.load(x_ptr + 2 * offs))


def test_triton_strided_load_moves_twice_the_bytes():
    # 2 programs x 64 floats read 8 bytes apart: 512 bytes of sectors (16 per program) for
    # 256 bytes needed; the store is contiguous (8 sectors per program).
    x, y = torch.randn(256), torch.zeros(128)
    p = triton_profile.profile_triton(every_other_tl_kernel, (2,), x, y, BLOCK_SIZE=64)
    assert torch.equal(y, x[::2])
    m = p["metrics"]
    assert (m["sectors_ld"], m["sectors_st"], m["bytes_loaded"]) == (32, 16, 512)
    s = site(p, "x_ptr", "ld")
    assert (s["sectors"], s["ideal_sectors"]) == (32, 16)
    assert p["bytes_needed"] == 1024 and p["bytes_moved"] == 32 * 48
    line = line_of(every_other_tl_kernel, "tl.store(")
    assert p["summary"][0] == (f"the load of `x_ptr` on line {line} touches 32 sectors where "
                               "16 would do: its addresses are not contiguous")


@cuda.jit
def tree_interleaved_kernel(x_ptr, out_ptr):
    s = cuda.shared.array(256, float32)
    t = cuda.threadIdx.x
    s[t] = x_ptr[cuda.grid(1)]
    cuda.syncthreads()
    step = 1
    while step < 256:
        idx = 2 * step * t  # interleaved addressing: active lanes 8 * step bytes apart
        if idx < 256:
            s[idx] += s[idx + step]
        cuda.syncthreads()
        step *= 2
    if t == 0:
        out_ptr[cuda.blockIdx.x] = s[0]


@cuda.jit
def tree_sequential_kernel(x_ptr, out_ptr):
    s = cuda.shared.array(256, float32)
    t = cuda.threadIdx.x
    s[t] = x_ptr[cuda.grid(1)]
    cuda.syncthreads()
    step = 128
    while step > 0:
        if t < step:  # sequential addressing: the active lanes are neighbours
            s[t] += s[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        out_ptr[cuda.blockIdx.x] = s[0]


def test_reduction_tree_interleaved_against_sequential_addressing():
    x = torch.randn(1024)
    out = torch.zeros(4)
    p = sim_profile.profile_numba(tree_interleaved_kernel, 4, 256, x, out)
    assert torch.allclose(out, x.view(4, 256).sum(1), atol=1e-4)
    m = p["metrics"]
    # Per block, for each of s[idx] and s[idx + step] (and the store to s[idx]), steps 1,
    # 2, 4, ..., 128 have t < 128 / step lanes: warps 0-3 (2 words per bank: 2 wavefronts
    # each), warps 0-1 (4 each), then one warp with 32, 16, 8, 4, 2, 1 lanes at strides of
    # 8, 16, ... words: 8, 8, 8, 4, 2, 1 wavefronts. 12 requests, 47 wavefronts, 35
    # conflicts; 4 blocks. Loads add s[0] (1 per block); stores add s[t] (8 per block).
    assert m["sm__sass_inst_executed_op_shared_ld.sum"] == 2 * 4 * 12 + 4
    assert m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"] == 2 * 4 * 47 + 4
    assert m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] == 2 * 4 * 35
    assert m["sm__sass_inst_executed_op_shared_st.sum"] == 4 * 12 + 4 * 8
    assert m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"] == 4 * 47 + 4 * 8
    assert m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] == 4 * 35

    p = sim_profile.profile_numba(tree_sequential_kernel, 4, 256, x, out)
    assert torch.allclose(out, x.view(4, 256).sum(1), atol=1e-4)
    m = p["metrics"]
    # Steps 128, 64, 32: 4, 2, 1 full warps; then one warp with 16, 8, 4, 2, 1 lanes:
    # 12 requests per block and access, every one conflict-free.
    assert m["sm__sass_inst_executed_op_shared_ld.sum"] == 2 * 4 * 12 + 4
    assert m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"] == 2 * 4 * 12 + 4
    assert m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] == 0
    assert m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] == 0


def test_empty_launches():
    p = sim_profile.profile_numba(copy_kernel, 1, 32, torch.zeros(0), torch.zeros(0), 0)
    assert p["metrics"][LD.format("requests")] == 0 and p["sites"] == []
    assert p["summary"] == ["the launch made no access to global or shared memory"]
    assert p["bytes_needed"] == p["bytes_moved"] == 0
    p = triton_profile.profile_triton(copy_tl_kernel, (0,), torch.zeros(0), torch.zeros(0), 0,
                                   BLOCK_SIZE=32)
    assert p["metrics"]["programs"] == 0 and p["metrics"]["bytes_loaded"] == 0
    assert p["summary"] == ["the launch loaded and stored nothing"]


@cuda.jit
def row_view_kernel(x_ptr, y_ptr):
    # A 2-D grid of 2-D blocks; rows read through a view (x_ptr[r] is a row).
    c, r = cuda.grid(2)
    row = x_ptr[r]
    y_ptr[r, c] = row[c]


def test_2d_grid_block_order_and_row_views():
    x = torch.randn(4, 64)
    y = torch.zeros(4, 64)
    p = sim_profile.profile_numba(row_view_kernel, (2, 2), (32, 2), x, y)
    assert torch.equal(y, x)
    t = p["trace"]
    # Block (bx, by) is linear block bx + 2 * by; it covers rows 2 by, 2 by + 1 and
    # columns 32 bx .. 32 bx + 31. Offsets count from the start of the whole argument.
    loads = t["op"] == 0
    row = (t["block"][loads] // 2) * 2 + t["thread"][loads] // 32
    col = (t["block"][loads] % 2) * 32 + t["thread"][loads] % 32
    assert torch.equal(t["offset"][loads], (row * 64 + col) * 4)
    # Each warp reads 32 neighbouring floats of one row: 4 sectors; 4 blocks x 2 warps.
    assert p["metrics"][LD.format("requests")] == 8 and p["metrics"][LD.format("sectors")] == 32
