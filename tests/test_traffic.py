"""utils.check_traffic: advice (or, where an exercise says so, rejection) from the bytes a
profiled launch moved against the bytes it needed."""
import types

import pytest

import utils


def fake_profile(moved, needed, summary=()):
    return types.SimpleNamespace(bytes_moved=moved, bytes_needed=needed, summary=list(summary),
                                 backend="cuda-emulator")


def test_coalesced_traffic_passes_quietly(capsys):
    p = fake_profile(8192, 8192)
    assert utils.check_traffic(p) is p
    out = capsys.readouterr().out
    assert "1.00x" in out and "coalesced" in out and "advice" not in out


def test_a_little_slack_for_misaligned_starts(capsys):
    utils.check_traffic(fake_profile(8192 + 64, 8192), reject=True)  # 2 extra sectors: fine
    assert "coalesced" in capsys.readouterr().out


def test_strided_traffic_gets_advice_with_the_ratio_and_the_worst_site(capsys):
    worst = "each warp's load of `x` (line 7) touches 16 sectors where 4 would do"
    utils.check_traffic(fake_profile(4 * 8192, 8192, [worst, "second"]))
    out = capsys.readouterr().out
    assert out.startswith("advice: your kernel moves 4.0x the bytes it needs")
    assert worst in out and "second" not in out


def test_reject_only_when_asked():
    with pytest.raises(utils.GradingError, match=r"moves 4\.0x the bytes it needs"):
        utils.check_traffic(fake_profile(4 * 8192, 8192), reject=True)
    with pytest.raises(utils.GradingError, match=r"1\.5x"):
        utils.check_traffic(fake_profile(12288, 8192), max_ratio=1.1, reject=True)


def test_a_profile_without_byte_counts_is_advice_and_never_a_pass(capsys):
    unmeasured = types.SimpleNamespace(bytes_moved=None, bytes_needed=None, backend="ncu")
    utils.check_traffic(unmeasured)
    assert "not measured" in capsys.readouterr().out
    with pytest.raises(utils.GradingError, match=r"not measured .* a check that measured nothing cannot pass"):
        utils.check_traffic(unmeasured, reject=True)


def test_a_launch_that_moved_nothing_fails():
    with pytest.raises(utils.GradingError, match=r"moved no byte of global memory"):
        utils.check_traffic(fake_profile(0, 0))


ITEMS_SRC = r"""
__global__ void relu_items_kernel(const float* __restrict__ x_ptr, float* __restrict__ y_ptr, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int threads = gridDim.x * blockDim.x;
    for (int k = 0; k < 4; ++k) {
        int idx = INDEX;
        if (idx < n) y_ptr[idx] = fmaxf(x_ptr[idx], 0.0f);
    }
}
"""


emulator = pytest.mark.skipif(not utils.SIMULATE, reason="the emulator's counters (on a GPU, ncu measures)")


@emulator
@pytest.mark.parametrize("index, ratio", [("t + k * threads", None), ("4 * t + k", "4.0x")])
def test_exercise_7_kernels_in_the_emulator(index, ratio, capsys):
    # Lesson 02's exercise 7: a grid-stride step passes, neighbours per thread move 4x the bytes.
    if not hasattr(utils, "profile"):
        pytest.skip("utils.profile is not in this copy of the course")
    import torch
    k = utils.cuda_kernel(ITEMS_SRC.replace("INDEX", index), "relu_items_kernel")
    x = torch.randn(4 * 256 * 4)
    y = torch.empty_like(x)
    if ratio is None:
        utils.check_traffic(k, 4, 256, x, y, x.numel(), reject=True)
        assert "1.00x" in capsys.readouterr().out
    else:
        with pytest.raises(utils.GradingError, match=ratio) as e:
            utils.check_traffic(k, 4, 256, x, y, x.numel(), reject=True)
        assert "16 sectors where 4 would do" in str(e.value)
    assert torch.equal(y, torch.relu(x))      # the profiled launch really ran


def test_on_a_gpu_without_ncu_traffic_is_not_graded_and_says_so(monkeypatch, capsys):
    import importlib

    from utils import grading

    def no_ncu(*a, **k):
        raise RuntimeError("profiling on a GPU needs Nsight Compute (`ncu`)\nmore")
    monkeypatch.setattr(grading, "SIMULATE", False)
    monkeypatch.setattr(importlib.import_module("utils.profile"), "profile", no_ncu)  # the checks' profiler
    assert utils.check_traffic(object(), 1, 32) is None
    assert "not measured on this GPU (profiling on a GPU needs Nsight Compute (`ncu`))" in capsys.readouterr().out
    # graded: the results were checked by the grader; the traffic grade is given in simulation,
    # and the check says so loudly instead of printing a pass
    assert utils.check_traffic(object(), 1, 32, reject=True) is None
    out = capsys.readouterr().out
    assert "traffic: NOT GRADED on this GPU" in out and "COURSE_SIMULATE=1" in out and "coalesced" not in out
    monkeypatch.setattr(grading, "SIMULATE", True)       # in simulation a failure is a failure
    with pytest.raises(RuntimeError):
        utils.check_traffic(object(), 1, 32)


# --- check_shared: bank conflicts and divergence of a block tree ---------------------------
TREE_SRC = r"""
__global__ void tree_kernel(const float* __restrict__ x_ptr, float* out_ptr, int n) {
    extern __shared__ float sdata[];
    unsigned int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    sdata[t] = (i < n) ? x_ptr[i] : 0.0f;
    __syncthreads();
    STEPS
    if (t == 0) atomicAdd(out_ptr, sdata[0]);
}
"""
TREES = {
    "sequential": """for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sdata[t] += sdata[t + s];
        __syncthreads();
    }""",
    "interleaved": """for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        if (t % (2 * s) == 0) sdata[t] += sdata[t + s];
        __syncthreads();
    }""",
    "strided index": """for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        unsigned int index = 2 * s * t;
        if (index < blockDim.x) sdata[index] += sdata[index + s];
        __syncthreads();
    }""",
}


@emulator
@pytest.mark.parametrize("tree, advice", [("sequential", None), ("interleaved", "lanes active"),
                                          ("strided index", "bank conflicts")])
def test_check_shared_on_the_three_trees(tree, advice, capsys):
    if not hasattr(utils, "profile"):
        pytest.skip("utils.profile is not in this copy of the course")
    import torch
    k = utils.cuda_kernel(TREE_SRC.replace("STEPS", TREES[tree]), "tree_kernel")
    x, out = torch.randn(4 * 256), torch.zeros(())
    if advice is None:
        utils.check_shared(k, 4, 256, x, out, x.numel(), shared=1024, reject=True)
        assert "no bank conflicts" in capsys.readouterr().out
    else:
        utils.check_shared(k, 4, 256, x, out, x.numel(), shared=1024)
        said = capsys.readouterr().out
        assert said.startswith("advice: your kernel is right, but") and advice in said
        with pytest.raises(utils.GradingError, match=advice):
            utils.check_shared(k, 4, 256, x, torch.zeros(()), x.numel(), shared=1024, reject=True)
    assert out.item() == pytest.approx(x.sum().item(), abs=1e-3)    # the launch really ran


def test_check_shared_reads_a_profile(capsys):
    m = {"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": 760,
         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": 560,
         "smsp__thread_inst_executed_per_inst_executed.ratio": 31.4}
    p = types.SimpleNamespace(metrics=m, summary=["a 16-way bank conflict on line 9"], backend="ncu")
    assert utils.check_shared(p) is p
    out = capsys.readouterr().out
    assert "560 of its 760 shared-memory wavefronts are bank conflicts (a 16-way bank conflict" in out
    utils.check_shared(types.SimpleNamespace(metrics={}, backend="triton-interpreter"))
    assert "not measured" in capsys.readouterr().out
