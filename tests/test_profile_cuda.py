"""utils.profile for CUDA C++ kernels in the CPU emulator: every expected count below is worked
out by hand from the access pattern (32 lanes per warp, 32-byte sectors, 32 banks of 4 bytes),
as Nsight Compute counts them. The parsing of ncu's CSV (the GPU path) is tested on a sample."""
import time

import pytest
import torch
from cuda_sources import REVERSE_DYNAMIC

import runtime
import utils

sim = pytest.mark.skipif(not utils.SIMULATE, reason="the emulator's counters (on a GPU, ncu measures)")

LD_REQ = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
LD_SEC = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
ST_REQ = "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"
ST_SEC = "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
SH_LD_WAVES = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
SH_ST_WAVES = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"
SH_LD_CONF = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
SH_ST_CONF = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
SH_LD_REQ = "sm__sass_inst_executed_op_shared_ld.sum"
SH_ST_REQ = "sm__sass_inst_executed_op_shared_st.sum"
LANES = "smsp__thread_inst_executed_per_inst_executed.ratio"

COPY = r"""
__global__ void copy_kernel(const float* x_ptr, float* y_ptr, int n, int stride, int offset) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y_ptr[i] = x_ptr[(long long)i * stride + offset];
}
"""
N = 4096  # 16 blocks of 256 threads: 128 warps


@pytest.fixture(scope="module")
def copy():
    return utils.cuda_kernel(COPY, "copy_kernel")


def lanes(p):
    """The ratio of active lanes, or 32.0 standing in for it where this compiler has no
    basic-block hook (g++ before 12: the ratio is absent then, which is checked here)."""
    from runtime.backends.cuda import _profile, _toolchain
    if _profile.COVERAGE in _profile.flags(_toolchain.host_compiler()):
        return p.metrics[LANES]
    assert LANES not in p.metrics
    return None


def site(p, name, op):
    found = [s for s in p.sites if s["name"] == name and s["op"] == op]
    assert len(found) == 1, p.sites
    return found[0]


@sim
@pytest.mark.parametrize("stride,offset,sectors", [(1, 0, 4), (2, 0, 8), (32, 0, 32), (1, 1, 5)])
def test_global_loads_count_the_sectors_of_each_warp(copy, stride, offset, sectors):
    x = torch.randn(N * stride + offset)
    y = torch.zeros(N)
    p = utils.profile(copy, N // 256, 256, x, y, N, stride, offset)
    assert torch.equal(y, x[offset::stride][:N])  # the launch really ran
    m = p.metrics
    assert p.backend == "cuda-emulator" and p.kernel == "copy_kernel"
    assert m[LD_REQ] == 128 and m[LD_SEC] == 128 * sectors
    assert m[ST_REQ] == 128 and m[ST_SEC] == 128 * 4  # the store is coalesced in every case
    assert lanes(p) in (32.0, None)
    ld = site(p, "x_ptr", "ld")
    assert ld["line"] == 4 and ld["space"] == "global" and ld["requests"] == 128
    assert ld["sectors"] == 128 * sectors and ld["ideal_sectors"] == 128 * 4
    assert ld["stride_bytes"] == 4 * stride and ld["avg_lanes"] == 32.0
    assert p.bytes_needed == 2 * 4 * N and p.bytes_moved == 32 * 128 * (sectors + 4)
    if sectors == 4:
        assert p.summary == []
    else:
        ratio = (sectors + 4) / 8
        assert p.summary[-1] == (f"the launch moves {ratio:.1f}x the bytes it needs ({32 * 128 * (sectors + 4)} bytes "
                                 f"in 32-byte sectors for {8 * N} bytes read or written)").replace(".0x", "x")
        first = p.summary[0]
        assert first.startswith(f"each warp's load of `x_ptr` (line 4) touches {sectors} sectors where 4 would do")
        if stride > 1:
            assert f"neighbouring threads read addresses {4 * stride} bytes apart" in first
        else:
            assert "32-byte boundary" in first


INPLACE = r"""
__global__ void relu_inplace(float* x_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x_ptr[i] = fmaxf(x_ptr[i], 0.0f);
}
"""


@sim
def test_bytes_needed_count_an_element_updated_in_place_in_and_out():
    # read once and written once: a perfect in-place kernel moves exactly what it needs
    k = utils.cuda_kernel(INPLACE, "relu_inplace")
    x = torch.randn(N)
    want = x.clamp(min=0)
    p = k.profile[N // 256, 256](x, N)
    assert torch.equal(x, want)
    assert p.bytes_needed == 2 * 4 * N and p.bytes_moved == 2 * 4 * N


@sim
def test_launch_syntax_and_the_table(copy):
    x, y = torch.randn(32 * N), torch.zeros(N)
    p = copy.profile[N // 256, 256](x, y, N, 32, 0)
    q = utils.profile(copy, N // 256, 256, x, y, N, 32, 0)
    assert p.metrics == q.metrics and p.sites == q.sites and p.summary == q.summary
    text = repr(p)
    assert text.startswith("profile of copy_kernel (counted in the CPU emulator)")
    assert "global loads" in text and "32.0 per request" in text
    assert "touches 32 sectors where 4 would do: neighbouring threads read addresses 128 bytes apart" in text
    html = p._repr_html_()
    assert "<table>" in html and "128 bytes apart" in html
    assert isinstance(p, utils.Profile)


FLOAT4 = r"""
__global__ void copy4_kernel(const float4* x_ptr, float4* y_ptr, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) y_ptr[i] = x_ptr[i];
}
"""


@sim
def test_float4_is_one_request_of_16_sectors_per_warp():
    k = utils.cuda_kernel(FLOAT4, "copy4_kernel")
    x, y = torch.randn(N), torch.zeros(N)
    p = k.profile[N // 4 // 256, 256](x, y, N // 4)
    assert torch.equal(x, y)
    warps = N // 4 // 32
    assert p.metrics[LD_REQ] == warps and p.metrics[LD_SEC] == 16 * warps
    assert p.metrics[ST_REQ] == warps and p.metrics[ST_SEC] == 16 * warps
    assert site(p, "x_ptr", "ld")["size"] == 16 and p.summary == []


BANKS = r"""
__global__ void bank_kernel(const float* x_ptr, float* y_ptr, int stride) {
    __shared__ float tile[32 * 33];
    int t = threadIdx.x;
    tile[t * stride] = x_ptr[t];
    __syncthreads();
    y_ptr[t] = tile[t * stride];
}
"""


@sim
@pytest.mark.parametrize("stride,waves", [(32, 32), (33, 1), (1, 1)])
def test_shared_bank_conflicts(stride, waves):
    k = utils.cuda_kernel(BANKS, "bank_kernel")
    x, y = torch.randn(32), torch.zeros(32)
    p = k.profile[1, 32](x, y, stride)
    assert torch.equal(x, y)
    m = p.metrics
    assert m[SH_ST_REQ] == 1 and m[SH_ST_WAVES] == waves and m[SH_ST_CONF] == waves - 1
    assert m[SH_LD_REQ] == 1 and m[SH_LD_WAVES] == waves and m[SH_LD_CONF] == waves - 1
    assert m["smem_requests_st"] == 1 and m["smem_requests_ld"] == 1
    st = site(p, "tile", "st")
    assert st["space"] == "shared" and st["line"] == 5 and st["wavefronts"] == waves
    assert st["bank_conflicts"] == waves - 1 and st["sectors"] is None
    if waves > 1:
        assert p.summary[0] == ("the store to `tile` (line 5) takes 32 wavefronts where 1 would do: 32 lanes hit "
                                "bank 0; pad the row to 33")
    else:
        assert p.summary == []


BROADCAST = r"""
__global__ void broadcast_kernel(const float* x_ptr, float* y_ptr) {
    __shared__ float s[32];
    int t = threadIdx.x;
    s[t] = x_ptr[t];
    __syncthreads();
    y_ptr[t] = s[0] + s[t];
}
"""


@sim
def test_a_broadcast_read_is_one_wavefront():
    k = utils.cuda_kernel(BROADCAST, "broadcast_kernel")
    x, y = torch.randn(32), torch.zeros(32)
    p = k.profile[1, 32](x, y)
    assert torch.allclose(y, x[0] + x)
    # two loads on line 7, s[0] (all lanes: one word) and s[t]: one wavefront each
    assert p.metrics[SH_LD_REQ] == 2 and p.metrics[SH_LD_WAVES] == 2 and p.metrics[SH_LD_CONF] == 0


DIVERGE = r"""
__global__ void branch_kernel(const float* x_ptr, float* y_ptr, int n, int warp_aligned) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int t = threadIdx.x;
    bool odd = warp_aligned ? (t / 32) % 2 : t % 2;
    if (odd) y_ptr[i] = x_ptr[i];
}
"""


@sim
def test_divergence_odd_threads_against_odd_warps():
    k = utils.cuda_kernel(DIVERGE, "branch_kernel")
    x = torch.randn(N)
    y = torch.zeros(N)
    p = k.profile[N // 256, 256](x, y, N, 0)
    assert torch.equal(y[1::2], x[1::2]) and not y[0::2].any()
    ld = site(p, "x_ptr", "ld")
    assert ld["requests"] == 128 and ld["avg_lanes"] == 16.0  # every warp, half of its lanes
    assert ld["sectors"] == 128 * 4 and ld["ideal_sectors"] == 128 * 2
    assert lanes(p) is None or lanes(p) < 32.0
    assert any(s.startswith("line 6 runs with 16 of 32 lanes per warp on average") for s in p.summary), p.summary
    y.zero_()
    q = k.profile[N // 256, 256](x, y, N, 1)
    ld = site(q, "x_ptr", "ld")
    assert ld["requests"] == 64 and ld["avg_lanes"] == 32.0 and ld["sectors"] == 64 * 4  # half of the warps
    assert lanes(q) in (32.0, None) and q.summary == []


ATOMIC = r"""
__global__ void count_kernel(float* out_ptr) {
    atomicAdd(out_ptr, 1.0f);
}
__global__ void ticket_kernel(int* counter_ptr, int* ticket_ptr) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    ticket_ptr[i] = atomicAdd(counter_ptr, 1);
}
__global__ void spread_kernel(float* out_ptr) {
    atomicAdd(&out_ptr[blockIdx.x * blockDim.x + threadIdx.x], 1.0f);
}
"""
ATOM_REQ = "l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum"
ATOM_SEC = "l1tex__t_sectors_pipe_lsu_mem_global_op_atom.sum"
RED_REQ = "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum"
RED_SEC = "l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum"


def atomics(p):
    """(requests, sectors) of the launch's global atomics, ATOM and RED together."""
    m = p.metrics
    return m[ATOM_REQ] + m.get(RED_REQ, 0), m[ATOM_SEC] + m.get(RED_SEC, 0)


@sim
def test_many_blocks_atomically_adding_to_one_address():
    k = utils.cuda_kernel(ATOMIC, "count_kernel")
    out = torch.zeros(1)
    p = k.profile[64, 32](out)
    assert out.item() == 2048.0
    # one request per warp; the 32 lanes take turns on the one address: a sector each (as an
    # H100 counts it: benchmarks/results/simulators/ncu-h100.json, 65536 sectors for 2048 requests)
    assert atomics(p) == (64, 64 * 32)
    if RED_REQ in p.metrics:  # the machine code says RED: the old value is not used
        assert p.metrics[RED_REQ] == 64 and p.metrics[ATOM_REQ] == 0
    assert p.atomics == {"count": 2048, "global": 2048, "shared": 0, "address": "out_ptr[0]", "address_count": 2048}
    assert p.summary[0].startswith("2048 atomic updates of `out_ptr[0]` all go to one address")
    assert p.metrics[LD_REQ] == 0 and p.metrics[ST_REQ] == 0


@sim
def test_an_atomic_whose_old_value_is_used_is_atom():
    k = utils.cuda_kernel(ATOMIC, "ticket_kernel")
    counter, tickets = torch.zeros(1, dtype=torch.int32), torch.full((64,), -1, dtype=torch.int32)
    p = k.profile[2, 32](counter, tickets)
    assert sorted(tickets.tolist()) == list(range(64))
    if RED_REQ in p.metrics:  # the machine code is known: nvcc aggregated the integer atomic,
        # one lane per warp issues it (as an H100 counts it: one sector per request)
        assert p.metrics[ATOM_REQ] == 2 and p.metrics[RED_REQ] == 0
        assert atomics(p) == (2, 2)
    else:
        assert atomics(p) == (2, 64)


@sim
def test_atomics_to_distinct_addresses_take_one_turn_per_sector():
    k = utils.cuda_kernel(ATOMIC, "spread_kernel")
    out = torch.zeros(256)
    p = k.profile[4, 64](out)
    assert (out == 1).all()
    assert atomics(p) == (8, 8 * 4)
    assert p.atomics["address_count"] == 1 and not any("atomic updates" in s for s in p.summary)


STRUCTS = r"""
struct Particle { float x, y, z; };
__global__ void aos_kernel(const Particle* p_ptr, float* out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { Particle p = p_ptr[i]; out_ptr[i] = p.x + p.y + p.z; }
}
"""


@sim
def test_a_struct_of_three_floats_is_three_loads_as_on_a_gpu():
    k = utils.cuda_kernel(STRUCTS, "aos_kernel")
    x, y = torch.randn(3 * N), torch.zeros(N)
    p = k.profile[N // 256, 256](x, y, N)
    assert torch.allclose(y, x.view(N, 3).sum(1))
    # three 4-byte loads per particle; each warp's load covers 32 x 12 bytes = 12 sectors
    assert p.metrics[LD_REQ] == 3 * 128 and p.metrics[LD_SEC] == 3 * 128 * 12
    assert p.summary[0].startswith("each warp's load of `p_ptr` (line 5) touches 12 sectors where 4 would do")


@sim
def test_partial_warps_in_a_block_of_48(copy):
    n = 48 * 4
    x, y = torch.randn(n), torch.zeros(n)
    p = copy.profile[4, 48](x, y, n, 1, 0)
    assert torch.equal(x, y)
    # per block: a warp of 32 lanes (4 sectors) and one of 16 lanes (64 bytes, 64-byte aligned: 2 sectors)
    assert p.metrics[LD_REQ] == 8 and p.metrics[LD_SEC] == 4 * (4 + 2)
    assert lanes(p) in (24.0, None)
    assert site(p, "x_ptr", "ld")["avg_lanes"] == 24.0
    assert any("blocks of 48 threads" in s for s in p.summary)


TWO_D = r"""
__global__ void copy2d_kernel(const float* x_ptr, float* y_ptr, int w, int transpose) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    y_ptr[row * w + col] = transpose ? x_ptr[col * w + row] : x_ptr[row * w + col];
}
"""


@sim
def test_2d_blocks_form_warps_x_fastest():
    k = utils.cuda_kernel(TWO_D, "copy2d_kernel")
    w = 64
    x, y = torch.randn(w, w), torch.zeros(w, w)
    p = k.profile[(4, 4), (16, 16)](x, y, w, 0)
    assert torch.equal(x, y)
    # a warp is 2 rows of 16 threads: 2 runs of 64 bytes, 64-byte aligned: 4 sectors
    warps = 16 * 8
    assert p.metrics[LD_REQ] == warps and p.metrics[LD_SEC] == 4 * warps
    assert p.metrics[ST_SEC] == 4 * warps
    p = k.profile[(4, 4), (16, 16)](x, y, w, 1)
    assert torch.equal(x.t(), y)
    # transposed read: 16 columns 256 bytes apart, the warp's two rows share each sector
    assert p.metrics[LD_SEC] == 16 * warps and p.metrics[ST_SEC] == 4 * warps


GRID_STRIDE = r"""
__global__ void scale_kernel(const float* x_ptr, float* y_ptr, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y_ptr[i] = 2.0f * x_ptr[i];
}
"""


@sim
def test_grid_stride_loop_one_request_per_warp_and_iteration():
    k = utils.cuda_kernel(GRID_STRIDE, "scale_kernel")
    x, y = torch.randn(N), torch.zeros(N)
    p = k.profile[4, 256](x, y, N)  # 4 iterations per thread
    assert torch.equal(y, 2 * x)
    assert p.metrics[LD_REQ] == 4 * 8 * 4 and p.metrics[LD_SEC] == 4 * 4 * 8 * 4
    assert site(p, "x_ptr", "ld")["line"] == 4 and p.summary == []
    n = N + 16  # the last iteration: 16 threads of one warp
    x, y = torch.randn(n), torch.zeros(n)
    p = k.profile[4, 256](x, y, n)
    assert torch.equal(y, 2 * x)
    assert p.metrics[LD_REQ] == 4 * 8 * 4 + 1 and p.metrics[LD_SEC] == 4 * 4 * 8 * 4 + 2


@sim
def test_empty_grid_counts_nothing(copy):
    x, y = torch.randn(8), torch.zeros(8)
    p = copy.profile[0, 256](x, y, 8, 1, 0)
    assert not y.any()
    assert p.metrics[LD_REQ] == 0 and p.metrics[LD_SEC] == 0 and p.sites == [] and p.summary == []
    assert LANES not in p.metrics  # no instruction ran: no ratio (absent, not a made-up number)
    assert p.bytes_needed == 0 and p.bytes_moved == 0


@sim
def test_a_fault_under_profile_is_raised_as_usual(copy):
    x, y = torch.randn(N), torch.zeros(N)
    with pytest.raises(utils.KernelFault, match="past the end of argument `x_ptr`"):
        copy.profile[N // 256, 256](x, y, N, 1, 100)
    # and the library still works afterwards
    p = copy.profile[N // 256, 256](x, y, N, 1, 0)
    assert p.metrics[LD_SEC] == 128 * 4


RACY = r"""
__global__ void racy_sum(const float* x_ptr, float* out_ptr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out_ptr[0] += x_ptr[i];
}
"""


@sim
def test_a_race_under_profile_is_reported_as_usual():
    k = utils.cuda_kernel(RACY, "racy_sum")
    with pytest.raises(utils.KernelRace):
        k.profile[2, 32](torch.ones(64), torch.zeros(1), 64)


@sim
def test_profiling_with_race_detection_off_and_a_random_schedule():
    k = utils.cuda_kernel(RACY, "racy_sum")
    out = torch.zeros(1)
    with utils.race_detection(False), utils.emulation_schedule("random", seed=3):
        p = k.profile[2, 32](torch.ones(64), out, 64)
    assert out.item() == 64.0  # blocks and threads run one at a time here: no update is lost
    assert p.metrics[LD_REQ] == 2 + 2 and p.metrics[ST_REQ] == 2  # x_ptr[i] and out_ptr[0] per warp
    assert site(p, "out_ptr", "st")["sectors"] == 2 and site(p, "x_ptr", "ld")["sectors"] == 8


@sim
def test_without_the_basic_block_hook_divergence_is_absent(monkeypatch):
    # (g++ before 12 cannot keep the emulator's own functions out of the hook: no ratio then)
    from runtime.backends.cuda import _profile
    monkeypatch.setattr(_profile, "flags", lambda cxx: [f for f in _profile.FLAGS if f != _profile.COVERAGE])
    k = utils.cuda_kernel(DIVERGE, "branch_kernel")
    x, y = torch.randn(N), torch.zeros(N)
    p = k.profile[N // 256, 256](x, y, N, 0)
    assert LANES not in p.metrics and site(p, "x_ptr", "ld")["avg_lanes"] == 16.0
    assert torch.equal(y[1::2], x[1::2])


def test_this_compiler_has_the_basic_block_hook():
    from runtime.backends.cuda import _profile, _toolchain
    cxx = _toolchain.host_compiler()
    version = _toolchain.compiler_version(cxx)
    import re
    m = re.search(r"g\+\+.* (\d+)\.\d+", version)
    if m and int(m.group(1)) < 12:
        assert _profile.COVERAGE not in _profile.flags(cxx)
    else:
        assert _profile.COVERAGE in _profile.flags(cxx)


@sim
def test_an_unsolved_exercise_is_not_profiled():
    k = utils.cuda_kernel(COPY.replace("if (i < n)", "NOT_SOLVED_YET();\n    if (i < n)"), "copy_kernel")
    with pytest.raises(NotImplementedError, match="not solved yet"):
        k.profile[1, 32](torch.randn(32), torch.zeros(32), 32, 1, 0)


@sim
def test_bad_arguments(copy):
    x, y = torch.randn(N), torch.zeros(N)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        copy.profile[1, 256](x, y, N)
    with pytest.raises(TypeError, match="float64"):
        copy.profile[1, 256](x.double(), y, N, 1, 0)
    with pytest.raises(ValueError, match="at most 1024 threads"):
        copy.profile[1, 2048](x, y, N, 1, 0)
    with pytest.raises(TypeError, match="grid, block"):
        copy.profile[1](x, y, N, 1, 0)
    with pytest.raises(TypeError, match="configuration"):
        copy.profile(x, y, N, 1, 0)
    with pytest.raises(TypeError, match="block size is missing"):
        utils.profile(copy, 1)
    with pytest.raises(TypeError, match="utils.cuda_kernel, numba.cuda.jit or triton.jit"):
        utils.profile(lambda: None, 1, 1)
    with pytest.raises(TypeError, match="unexpected keyword"):
        utils.profile(copy, 1, 256, x, y, N, 1, 0, block=3)


@sim
def test_the_trace_of_a_small_launch(copy):
    n = 64
    x, y = torch.randn(n), torch.zeros(n)
    p = copy.profile[2, 32](x, y, n, 1, 0)
    t = p.trace
    assert set(t) >= {"block", "thread", "warp", "lane", "space", "op", "arg", "offset", "size", "line", "instr"}
    assert all(v.dtype == torch.int64 and v.shape == (2 * n,) for v in t.values())
    loads = t["op"] == 0
    assert torch.equal(t["arg"][loads], torch.zeros(n, dtype=torch.int64))  # x_ptr is argument 0
    assert torch.equal(t["arg"][~loads], torch.ones(n, dtype=torch.int64))
    order = torch.argsort(t["block"][loads] * 32 + t["thread"][loads])
    assert torch.equal(t["offset"][loads][order], 4 * torch.arange(n))
    assert t["instr"].unique().numel() == 4  # 2 warps, a load and a store each
    assert (t["line"] == 4).all() and (t["size"] == 4).all() and (t["space"] == 0).all()
    assert p.trace_names[0] == "x_ptr" and p.trace_names[1] == "y_ptr"


@sim
def test_the_trace_of_shared_accesses():
    k = utils.cuda_kernel(BANKS, "bank_kernel")
    p = k.profile[1, 32](torch.randn(32), torch.zeros(32), 33)
    t = p.trace
    sh = t["space"] == 1
    assert sh.sum() == 64 and (t["arg"][sh] == -1).all()
    assert torch.equal(t["offset"][sh & (t["op"] == 1)].sort().values, 4 * 33 * torch.arange(32))
    assert p.trace_names[-1] == "tile"


@sim
def test_profiling_keeps_the_normal_library_unchanged(copy):
    assert not copy._lib.profile  # normal launches use the normal build
    copy.profile[1, 32](torch.randn(32), torch.zeros(32), 32, 1, 0)
    assert copy._prof_lib.profile and copy._prof_lib.path != copy._lib.path


@sim
def test_a_2_16_elementwise_launch_profiles_within_2_s(copy):
    n = 1 << 16
    x, y = torch.randn(n), torch.zeros(n)
    copy.profile[n // 256, 256](x, y, n, 1, 0)  # builds (cold) and warms up
    start = time.perf_counter()
    p = copy.profile[n // 256, 256](x, y, n, 1, 0)
    took = time.perf_counter() - start
    assert p.metrics[LD_SEC] == n // 8
    assert took < 4.0  # 2 s on an idle 2-core machine (docs/cuda-emulator.md); headroom for a loaded one


@sim
def test_dynamic_shared_memory_is_named_and_counted():
    k = utils.cuda_kernel(REVERSE_DYNAMIC, "reverse_kernel")
    x, y = torch.randn(64), torch.zeros(64)
    p = utils.profile(k, 1, 64, x, y, shared=64 * 4)
    assert torch.equal(y, x.flip(0))
    assert site(p, "buf", "st")["wavefronts"] == 2 and site(p, "buf", "ld")["wavefronts"] == 2
    assert p.metrics[SH_ST_CONF] == 0 and p.metrics[SH_LD_CONF] == 0
    assert p.trace_names[-1] == "buf" and p.trace_names["shared"] == ["buf"]


@sim
def test_a_large_launch_has_no_trace_but_all_its_counters(copy, monkeypatch):
    from runtime.backends.cuda import _profile
    monkeypatch.setattr(_profile, "TRACE_CAP", 100)
    x, y = torch.randn(N), torch.zeros(N)
    p = copy.profile[N // 256, 256](x, y, N, 1, 0)
    assert p.trace is None and p.metrics[LD_SEC] == 128 * 4


class _FakeOccupancy:
    theoretical = 0.5
    limiter = "registers"
    limits = {"launch__occupancy_limit_registers": 2, "launch__occupancy_limit_warps": 8,
              "launch__occupancy_limit_blocks": 32, "launch__occupancy_limit_shared_mem": 32}


@sim
def test_occupancy_comes_from_the_occupancy_calculator_with_the_kernels_registers(copy, monkeypatch):
    import sys
    import types

    from runtime.backends.cuda import _profile
    calls = []
    fake = types.ModuleType("runtime.occupancy")
    fake.occupancy = lambda block, registers_per_thread, shared_per_block: calls.append(
        (block, registers_per_thread, shared_per_block)) or _FakeOccupancy()
    monkeypatch.setitem(sys.modules, "runtime.occupancy", fake)
    monkeypatch.setattr(_profile, "gpu_compile_info", lambda k: {"resources": {"registers": 40, "shared_bytes": 128}})
    p = copy.profile[1, 96, 256](torch.randn(96), torch.zeros(96), 96, 1, 0)
    assert calls == [(96, 40, 128 + 256)]
    assert p.metrics["launch__registers_per_thread"] == 40
    assert p.metrics["launch__shared_mem_per_block_static"] == 128
    assert p.metrics["launch__occupancy_limit_registers"] == 2
    assert p.metrics["sm__maximum_warps_per_active_cycle_pct"] == 50
    assert isinstance(p.occupancy, _FakeOccupancy)
    assert "theoretical occupancy" in repr(p) and "limited by registers" in repr(p)


@sim
def test_without_nvrtc_registers_and_occupancy_are_absent(copy, monkeypatch):
    from runtime.backends.cuda import _profile
    monkeypatch.setattr(_profile, "gpu_compile_info", lambda k: {})
    p = copy.profile[1, 32](torch.randn(32), torch.zeros(32), 32, 1, 0)
    assert "launch__registers_per_thread" not in p.metrics and p.occupancy is None
    assert "sm__maximum_warps_per_active_cycle_pct" not in p.metrics


@sim
def test_registers_from_nvrtc_when_it_is_installed(copy):
    from runtime.backends.cuda import _toolchain
    if _toolchain.nvrtc() is None:
        pytest.skip("NVRTC (pip package nvidia-cuda-nvrtc) is not installed")
    p = copy.profile[1, 32](torch.randn(32), torch.zeros(32), 32, 1, 0)
    res = utils.cuda_resources(COPY, "copy_kernel")
    assert 0 < res["registers"] < 16
    # a launch gets at least 16 registers per thread: what ncu shows for this kernel on an H100
    assert p.metrics["launch__registers_per_thread"] == 16 and p.resources["registers"] == res["registers"]


def test_numba_and_triton_kernels_go_to_the_simulators_profiler(monkeypatch):
    import sys
    import types
    kern = type("Dispatcher", (), {"__module__": "numba.cuda.dispatcher", "__name__": "relu_kernel"})()
    monkeypatch.delattr(runtime.backends.numba, "profile", raising=False)
    monkeypatch.setitem(sys.modules, "runtime.backends.numba.profile", None)
    with pytest.raises(NotImplementedError, match="Numba"):
        utils.profile(kern, 1, 32)
    fake = types.ModuleType("runtime.backends.numba.profile")
    fake.profile_numba = lambda k, grid, block, *args, shared=0: {
        "metrics": {LD_REQ: 3}, "sites": [], "summary": ["s"], "trace": None, "backend": "numba-simulator"}
    monkeypatch.setitem(sys.modules, "runtime.backends.numba.profile", fake)
    fake_triton = types.ModuleType("runtime.backends.triton.profile")
    fake_triton.profile_triton = lambda k, grid, *args, **kw: {
        "metrics": {LD_REQ: 5}, "sites": [], "summary": [], "trace": None, "backend": "triton-interpreter",
        "per_program": {"bytes_loaded": [8, 8]}}
    monkeypatch.delattr(runtime.backends.triton, "profile", raising=False)
    monkeypatch.setitem(sys.modules, "runtime.backends.triton.profile", fake_triton)
    p = utils.profile(kern, 1, 32)
    assert p.backend == "numba-simulator" and p.metrics[LD_REQ] == 3 and p.summary == ["s"]
    tk = type("JITFunction", (), {"__module__": "triton.runtime.jit", "__name__": "add_kernel"})()
    p = utils.profile(tk, (4,), 1, 2, BLOCK=8)
    assert p.backend == "triton-interpreter" and p.metrics[LD_REQ] == 5
    assert p.per_program == {"bytes_loaded": [8, 8]}  # a backend's extras are attributes too
    with pytest.raises(AttributeError):
        p.no_such_thing
    assert "Numba's simulator" not in repr(p)


# --------------------------------------------------------------------------------------
# The GPU path: Nsight Compute's CSV
# --------------------------------------------------------------------------------------
NCU_SAMPLE = '''==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "copy_kernel" - 0: 0%....50%....100% - 3 passes
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum","l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum","launch__registers_per_thread","sm__maximum_warps_per_active_cycle_pct","smsp__thread_inst_executed_per_inst_executed.ratio"
"","","","","","","","","","","","","request","sector","register/thread","%",""
"0","4242","python3.12","127.0.0.1","copy_kernel(const float *, float *, int, int, int)","1","7","(256, 1, 1)","(16, 1, 1)","0","9.0","0","128","4,096","16","100","32"
'''  # noqa: E501  (ncu's CSV as it prints it)


def test_ncu_csv_parsing():
    from runtime.backends.cuda._profile import parse_ncu_csv
    rows = parse_ncu_csv(NCU_SAMPLE)
    assert len(rows) == 1
    r = rows[0]
    assert r["Kernel Name"].startswith("copy_kernel")
    assert r[LD_REQ] == 128 and r[LD_SEC] == 4096 and isinstance(r[LD_SEC], int)
    assert r["launch__registers_per_thread"] == 16 and r["sm__maximum_warps_per_active_cycle_pct"] == 100
    assert r[LANES] == 32 and r[SH_LD_CONF] == 0
    assert parse_ncu_csv("==PROF== no kernels were profiled\n") == []


def test_a_profile_from_ncus_counters_shows_the_same_table():
    from runtime.backends.cuda._profile import parse_ncu_csv
    p = utils.Profile("copy_kernel", "ncu", parse_ncu_csv(NCU_SAMPLE)[0], bytes_moved=4096 * 32)
    text = repr(p)
    assert text.startswith("profile of copy_kernel (measured by Nsight Compute)")
    assert "global loads" in text and "128 requests, 4,096 sectors (32.0 per request)" in text
    assert "active lanes per warp instruction  32.0 of 32" in text and "theoretical occupancy" in text
    assert p.sites == [] and p.summary == [] and p.trace is None


def test_ncu_missing_is_said_clearly(monkeypatch):
    from runtime.backends.cuda import _profile
    monkeypatch.setattr(_profile, "find_ncu", lambda: None)
    with pytest.raises(RuntimeError, match="Nsight Compute"):
        _profile.run_ncu(type("K", (), {"name": "k"})(), (1, 1, 1), (1, 1, 1), 0, ())


def test_atomic_kinds_from_the_machine_code():
    from runtime.backends.cuda._profile import atom_kinds_from_sass
    red = "        /*00a0*/                   REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR6][R2.64], R11 ;"
    atom = "        /*00b0*/                   ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, R9, desc[UR6][R8.64], R13 ;"
    shared = "        /*0120*/                   ATOMS.POPC.INC.32 RZ, [UR4] ;"
    assert atom_kinds_from_sass(red + "\n" + shared).get(7) == "red"
    assert atom_kinds_from_sass(atom).get(3) == "atom"
    assert atom_kinds_from_sass(shared) == {}
    assert atom_kinds_from_sass(red + "\n" + atom) is None


FAKE_NCU = """#!/bin/sh
# stands in for an older Nsight Compute (no --print-units): checks the command line, writes a recorded CSV
case "$*" in
  *"--print-units"*) echo "==ERROR== unrecognised option '--print-units'" >&2; exit 1 ;;
  *"--csv --page raw --metrics l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,"*"regex:^copy_kernel$"*) ;;
  *) echo "unexpected command line: $*" >&2; exit 3 ;;
esac
while [ "$1" != "--log-file" ]; do shift; done
cat "$(dirname "$0")/sample.csv" > "$2"
echo "the program's own output"
"""


def test_run_ncu_builds_the_command_and_reads_the_metrics(tmp_path, monkeypatch):
    from runtime.backends.cuda import _profile
    (tmp_path / "sample.csv").write_text(NCU_SAMPLE)
    ncu = tmp_path / "ncu"
    ncu.write_text(FAKE_NCU)
    ncu.chmod(0o755)
    monkeypatch.setattr(_profile, "find_ncu", lambda: str(ncu))
    kern = type("K", (), {"name": "copy_kernel", "text": COPY, "filename": "copy_kernel.cu", "include_dir": None})()
    m = _profile.run_ncu(kern, (16, 1, 1), (256, 1, 1), 0, (torch.zeros(4), torch.zeros(4), 4, 1, 0))
    assert m[LD_REQ] == 128 and m[LD_SEC] == 4096 and "Kernel Name" not in m
    monkeypatch.setattr(_profile, "find_ncu", lambda: "/bin/false")
    with pytest.raises(RuntimeError, match="Nsight Compute could not profile copy_kernel"):
        _profile.run_ncu(kern, (16, 1, 1), (256, 1, 1), 0, ())


@pytest.mark.skipif(utils.SIMULATE, reason="needs a GPU: Nsight Compute measures the launch")
def test_on_a_gpu_nsight_compute_measures_the_same_counts(copy):
    from runtime.backends.cuda import _profile
    if _profile.find_ncu() is None:
        pytest.skip("Nsight Compute (ncu) is not installed")
    x = torch.randn(32 * N + 1, device=utils.DEVICE)
    y = torch.zeros(N, device=utils.DEVICE)
    p = copy.profile[N // 256, 256](x, y, N, 1, 1)  # misaligned by one element
    assert p.backend == "ncu"
    assert torch.equal(y, x[1:N + 1])  # the launch ran once and its result came back
    assert p.metrics[LD_REQ] == N // 32 and p.metrics[LD_SEC] == 5 * N // 32
    assert p.metrics[ST_REQ] == N // 32 and p.metrics[ST_SEC] == 4 * N // 32
    p = copy.profile[N // 256, 256](x, y, N, 32, 0)
    assert p.metrics[LD_SEC] == 32 * N // 32
    assert "32.0 per request" in repr(p)
    with pytest.raises(TypeError, match="is on cpu"):  # said at once, not as "ncu failed"
        copy.profile[N // 256, 256](x.cpu(), y, N, 1, 0)


def test_predicated_lines_from_sass_with_line_information():
    # A short `if` body compiled to guarded instructions (line 76), a line with a guarded exit
    # but also an unguarded compare (line 82), another file's line (not the kernel's), and the
    # always-true predicate PT, which guards nothing.
    from runtime.backends.cuda._profile import predicated_lines
    sass = """
	//## File "/tmp/x/reduction.cu", line 75
        /*0280*/                   ISETP.NE.AND P1, PT, R3, RZ, PT ;
	//## File "/tmp/x/reduction.cu", line 76
        /*0290*/              @!P1 IADD3 R0, R6, UR5, RZ ;
        /*02a0*/              @!P1 LDS R2, [R5] ;
        /*02f0*/              @!P1 STS [R5], R2 ;
	//## File "/tmp/x/reduction.cu", line 82
        /*00f0*/                   ISETP.NE.AND P0, PT, R6, RZ, PT ;
        /*0330*/               @P0 EXIT ;
	//## File "/tmp/x/common.h", line 9
        /*0340*/               @P2 FADD R1, R1, R2 ;
	//## File "/tmp/x/reduction.cu", line 90
        /*0350*/               @PT FADD R1, R1, R2 ;
"""
    assert predicated_lines(sass, "kernels/cuda/reduction.cu") == [76]
