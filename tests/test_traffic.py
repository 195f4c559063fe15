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


def test_a_profile_without_byte_counts_is_reported_not_judged(capsys):
    utils.check_traffic(types.SimpleNamespace(bytes_moved=None, bytes_needed=None, backend="ncu"),
                        reject=True)
    assert "not measured" in capsys.readouterr().out


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


def test_on_a_gpu_without_ncu_traffic_is_not_graded(monkeypatch, capsys):
    from utils import grading

    def no_ncu(*a, **k):
        raise RuntimeError("profiling on a GPU needs Nsight Compute (`ncu`)\nmore")
    monkeypatch.setattr(grading, "SIMULATE", False)
    monkeypatch.setattr(grading, "_utils_attr", lambda name: no_ncu)
    assert utils.check_traffic(object(), 1, 32, reject=True) is None
    assert "not measured on this GPU (profiling on a GPU needs Nsight Compute (`ncu`))" in capsys.readouterr().out
    monkeypatch.setattr(grading, "SIMULATE", True)       # in simulation a failure is a failure
    with pytest.raises(RuntimeError):
        utils.check_traffic(object(), 1, 32)
