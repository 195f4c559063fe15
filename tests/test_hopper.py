"""Lesson 12, Hopper's machinery: the CUDA C++ GEMM ladder (kernels/cuda/hopper.cu) against the
float64 product on awkward shapes, its input rules, the TMA tensor maps' rules, the sm_90a
target, and the emulator's reports of the typical mistakes of TMA, mbarrier and wgmma code
(kernels/cuda/hopper_mistakes.cu: one kernel, each mistake switched on by an argument)."""
from __future__ import annotations

import math

import pytest
import torch

import utils
from kernels.cuda import hopper as H
from runtime.backends.cuda import _toolchain as tc

MISTAKES = H.SOURCE.with_name("hopper_mistakes.cu")
# the last: 9 tiles of 128 x 256 for the persistent versions' 4 blocks in simulation (and an N
# that is not a multiple of 8: v6 stores from registers)
SHAPES = [(128, 128, 64), (200, 130, 100), (1, 1, 1), (64, 300, 1000), (300, 518, 136)]
in_simulation = pytest.mark.skipif(not utils.SIMULATE, reason="the emulator's reports: on a GPU these mistakes hang, "
                                                              "race or fault the context")


def _inputs(m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16).to(utils.DEVICE)
    b = torch.randn(n, k, generator=g).to(torch.bfloat16).to(utils.DEVICE)
    return a, b


def _assert_close(c, a, b):
    ref = H.hopper_ref(a, b)
    assert c.dtype == torch.bfloat16 and tuple(c.shape) == tuple(ref.shape)
    # float32 sums of exact products, rounded once to bfloat16: half an ulp of bfloat16 (2^-8
    # relative), plus the float32 sums' error, small beside it
    tol = ref.abs() * 2.0 ** -8 + 1e-3 * math.sqrt(max(a.shape[1], 1))
    err = (c.double() - ref).abs()
    bad = int((err > tol).sum())
    assert not bad, f"{bad} of {err.numel()} wrong, max error {float(err.max()):.3g}"


@pytest.mark.parametrize("version", list(H.VERSIONS))
def test_versions_match_the_float64_product(version):
    fn = H.VERSIONS[version][1]
    for shape in SHAPES:
        a, b = _inputs(*shape, seed=sum(shape))
        _assert_close(fn(a, b), a, b)


def test_empty_and_zero_k():
    a, b = _inputs(5, 3, 0)
    assert torch.equal(H.hopper_gemm(a, b).float().cpu(), torch.zeros(5, 3))
    a, b = _inputs(0, 4, 8)
    assert H.hopper_gemm(a, b).shape == (0, 4)


def test_strided_and_offset_inputs_are_copied_for_tma():
    a, b = _inputs(40, 24, 48)
    a_view = torch.cat([a, a], dim=1)[:, 1:49]  # rows not 16-byte aligned: copied first
    _assert_close(H.hopper_gemm(a_view, b), a_view, b)


def test_bad_inputs_are_refused_clearly():
    a, b = _inputs(8, 8, 16)
    with pytest.raises(TypeError, match="bfloat16"):
        H.hopper_gemm(a.float(), b)
    with pytest.raises(ValueError, match="same K"):
        H.hopper_gemm(a, b[:, :8])
    with pytest.raises(ValueError, match="2-D"):
        H.hopper_gemm(a.reshape(-1), b)


@pytest.mark.skipif(utils.SIMULATE, reason="CUTLASS's SM90 kernels run on a Hopper GPU only")
@pytest.mark.parametrize("cluster", sorted(H.CUTLASS_VARIANTS))
def test_cutlass_gemm_matches_the_float64_product_on_a_gpu(cluster):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("CUTLASS's SM90 kernels need a Hopper GPU")
    for shape in SHAPES:  # N not a multiple of 8 (130, 1, 518): B and C padded for CUTLASS's TMA epilogue
        a, b = _inputs(*shape, seed=sum(shape))
        _assert_close(H.cutlass_gemm(a, b, cluster=cluster), a, b)


def test_cutlass_gemm_says_where_it_runs_and_refuses_bad_arguments():
    a, b = _inputs(8, 8, 16)
    with pytest.raises(ValueError, match="cluster must be one of"):
        H.cutlass_gemm(a, b, cluster=3)
    with pytest.raises(TypeError, match="bfloat16"):
        H.cutlass_gemm(a.float(), b)
    assert H.cutlass_gemm(a[:0], b).shape == (0, 8)
    if utils.SIMULATE:
        from runtime import cute
        with pytest.raises(cute.CuteUnavailable, match="only a Hopper GPU runs"):
            H.cutlass_gemm(a, b)
    source = H.cutlass_source()
    assert "KernelTmaWarpSpecializedCooperative" in source and source.startswith("template <int CLUSTER_M>")


def test_cutlass_library_needs_nvcc(monkeypatch):
    from runtime import cute
    monkeypatch.setattr(cute._toolchain, "find_tool", lambda name: None)
    monkeypatch.setattr(cute, "_LIBS", {})
    with pytest.raises(cute.CuteUnavailable, match="only nvcc compiles"):
        cute.gpu_library(H.CUTLASS_SOURCE)


def test_tensor_map_rules_are_checked_in_both_modes():
    t = torch.zeros(64, 64, dtype=torch.bfloat16, device=utils.DEVICE)
    m = utils.tensor_map(t, 64, 64)
    assert m.dtype == torch.uint8 and m.numel() == 128 and m.data_ptr() % 64 == 0
    assert utils.tensor_map(t, 64, 64) is m  # cached
    with pytest.raises(ValueError, match="at most 128 bytes"):
        utils.tensor_map(t, 64, 128)
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        utils.tensor_map(t, 64, 4, swizzle=0)
    with pytest.raises(ValueError, match="1 to 256"):
        utils.tensor_map(t, 300, 64)
    with pytest.raises(ValueError, match="2-D"):
        utils.tensor_map(t.reshape(-1), 64, 64)
    with pytest.raises(ValueError, match="16-byte aligned"):
        flat = torch.zeros(64 * 64 + 8, dtype=torch.bfloat16, device=utils.DEVICE)
        utils.tensor_map(flat[1:4097].view(64, 64), 64, 64)
    with pytest.raises(ValueError, match="row stride"):
        utils.tensor_map(torch.zeros(8, 12, dtype=torch.bfloat16, device=utils.DEVICE)[:, :8], 8, 8)
    with pytest.raises(ValueError, match="swizzle is 0"):
        utils.tensor_map(t, 64, 64, swizzle=96)


def test_hopper_code_compiles_for_sm_90a():
    text = H.SOURCE.read_text()
    assert tc.specific_arch(text, "sm_90") == "sm_90a"
    assert tc.specific_arch(text, "compute_90") == "compute_90a"
    assert tc.specific_arch(text, "sm_80") == "sm_80"
    assert tc.specific_arch("__global__ void k() {}", "sm_90") == "sm_90"


def test_ptxas_keeps_the_wgmma_pipeline_and_setmaxnreg():
    """No function call in a wgmma kernel (a printf, a non-inlined helper): else ptxas serialises
    every wgmma (C7510) and ignores setmaxnreg (C7507), which changes no result, only the speed.
    One build of hopper.cu for sm_90a by NVRTC (no GPU needed): ptxas's log covers every kernel."""
    if tc.nvrtc() is None:
        pytest.skip("NVRTC (the nvidia-cuda-nvrtc wheel) is not installed")
    from runtime.backends.cuda import _gpu
    log = _gpu.ptxas_log(H.SOURCE.read_text(), "hopper_gemm_v5_kernel", H.SOURCE.name, H.SOURCE.parent,
                         arch="sm_90")
    for v in H.VERSIONS:
        assert f"hopper_gemm_{v}_kernel" in log, log[-3000:]
    remarks = [ln for ln in log.splitlines() if "C7510" in ln or "C7507" in ln or "C7519" in ln]
    assert not remarks, "\n".join(remarks)


@pytest.fixture(scope="module")
def one_tile():
    if not utils.SIMULATE:
        pytest.skip("the emulator's reports: on a GPU these mistakes hang, race or fault the context")
    k = utils.cuda_kernel(MISTAKES, "one_tile_kernel")
    a, b = _inputs(64, 64, 128, seed=3)
    maps = utils.tensor_map(a, 64, 64), utils.tensor_map(b, 64, 64)

    def run(mistake):
        c = torch.full((64, 64), float("nan"))
        k[1, 128, 4 * 64 * 64 * 2 + 2048](*maps, c, mistake)
        assert a.data_ptr() and b.data_ptr()  # the maps hold the addresses of a and b: keep them alive
        return c
    return run, a.double() @ b.double().T


# mistake -> words the report must hold (its cause)
REPORTS = {
    1: ["already complete when it arrived", "arrive_expect_tx announced 8192 bytes"],
    2: ["a second time for the same phase", "Flip the phase bit"],
    3: ["SWIZZLE_128B", "reads it as SWIZZLE_64B"],
    4: ["not 128-byte aligned"],
    5: ["overwrites shared memory that the wgmma", "releases the stage"],
    6: ["only 64 of the 128 threads of warpgroup 0"],
    8: ["stride byte offset is 512 bytes", "1024 bytes apart"],
    9: ["wgmma issued on line", "never waited for"],
    10: ["TMA load issued on line", "never waited for"],
    11: ["wgmma on line", "wrote with ordinary stores", "fence_proxy_async()"],
}


def test_the_right_tile_is_the_product(one_tile):
    run, ref = one_tile
    c = run(0)
    assert torch.allclose(c.double(), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mistake", sorted(REPORTS))
def test_each_mistake_is_reported_with_its_cause(one_tile, mistake):
    run, _ = one_tile
    with pytest.raises(utils.KernelFault) as e:
        run(mistake)
    for words in REPORTS[mistake]:
        assert words in str(e.value), str(e.value)


def test_ordinary_stores_fenced_for_the_async_proxy_are_read_right(one_tile):
    run, ref = one_tile
    assert torch.allclose(run(12).double(), ref, rtol=1e-5, atol=1e-4)


@in_simulation
def test_a_staged_epilogue_without_its_fence_is_reported():
    """v6 writes C's tile with ordinary stores and stores it by TMA: without fence_proxy_async
    the emulator names the missing fence (the stores are the consumers', the read the TMA's)."""
    import tempfile
    from pathlib import Path
    tmp = Path(tempfile.mkdtemp())
    for f in ("hopper.h", "hopper_wgmma.h"):
        (tmp / f).write_text(H.HEADER.with_name(f).read_text())
    text = H.SOURCE.read_text()
    assert text.count("fence_proxy_async();") == 1
    (tmp / "hopper.cu").write_text(text.replace("fence_proxy_async();", ";"))
    a, b = _inputs(128, 256, 64, seed=4)
    c = torch.empty(128, 256, dtype=torch.bfloat16)
    a_map, b_map, c_map = (utils.tensor_map(a, 128, 64), utils.tensor_map(b, 256, 64), utils.tensor_map(c, 64, 64))
    k = utils.cuda_kernel(tmp / "hopper.cu", "hopper_gemm_v6_kernel")
    with pytest.raises(utils.KernelFault, match=r"tma_store_2d on line \d+ reads shared memory that thread \d+ "
                                                r"wrote with ordinary stores"):
        k[1, 384, 3 * 384 * 64 * 2 + 2 * 64 * 256 * 2 + 1024](a_map, b_map, c_map, c, 128, 256, 64, 8, 1)


def test_accumulators_read_before_the_wait_are_nan(one_tile):
    run, _ = one_tile
    assert bool(torch.isnan(run(7)).all())


@in_simulation
def test_a_pipeline_runs_in_any_thread_order():
    a, b = _inputs(130, 260, 640, seed=5)
    with utils.emulation_schedule("random", seed=11):
        for version in ("v2", "v3"):
            _assert_close(H.VERSIONS[version][1](a, b), a, b)
    # persistent blocks (4 in simulation) over 9 tiles: stages, phases and C's staging tile
    # carried from one tile to the next
    a, b = _inputs(300, 520, 200, seed=6)
    with utils.emulation_schedule("random", seed=12):
        for version in ("v5", "v6"):
            _assert_close(H.VERSIONS[version][1](a, b), a, b)
