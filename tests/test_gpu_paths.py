"""The harness's GPU code paths that simulation would skip, exercised on a laptop.

On a GPU some things happen later or differently than in simulation, and CI (no GPU) would
never see them break. Each test here puts the laptop's process in the state a GPU's would be
in. CONTRIBUTING.md ("GPU code paths that simulation skips") lists these paths.

* **Launch hooks installed late.** ``import utils`` does not import ``numba.cuda`` on a GPU, so
  the hook that lets a grader see Numba launches goes in at the first recording after a
  notebook imports it (Triton's likewise, if Triton is imported late). That is the course's
  own doing, not tampering: a right answer must pass. A notebook that takes the hook off, or
  empties the hooks, or leaves the recording state changed, must still fail the check, with
  the name of what it changed.
* **Traffic measured by Nsight Compute.** On a GPU, ``utils.profile`` of a CUDA C++ launch
  reads ncu's counters, which count sectors but not the distinct bytes a kernel needs;
  ``check_traffic(..., reject=True)`` must still grade it.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import utils
from runtime.backends import launches
from runtime.backends.cuda import _profile
from runtime.backends.profile_report import Profile
from utils import guard

triton = pytest.importorskip("triton")
from grader_kernels import nb_relu_grid_stride_ok, relu_ok  # noqa: E402  (right answers)

REPLACED = "in this notebook: this check earns no points"
#: one right answer per backend whose launches reach the grader through a launch hook
RIGHT = {"numba": nb_relu_grid_stride_ok, "triton": relu_ok}


def _hook(label_start: str):
    """The registered hook of one backend, and the (class, attribute) it hooks here, hooked (on a
    GPU nothing is hooked until the first recording after the library's import)."""
    launches.install_hooks()
    hook = next(h for h in launches._HOOKS if h.label.startswith(label_start))
    cls, attr = hook.locate()[:2]
    return hook, cls, attr


@pytest.fixture
def unhooked(request):
    """The backend's launch method as the library defines it, with no hook of the course's:
    the state of a GPU process between ``import numba.cuda`` (after ``import utils``) and the
    first graded call. Afterwards the hook is back and nothing is left changed."""
    label = {"numba": "Numba", "triton": "Triton"}[request.param]
    _, cls, attr = _hook(label)
    hooked = vars(cls)[attr]
    mark = launches._MARK + attr
    type.__setattr__(cls, attr, hooked.__wrapped__)
    type.__delattr__(cls, mark)
    yield request.param, cls, attr
    launches.install_hooks()
    assert getattr(vars(cls)[attr], "_records_launches", False)
    assert guard.tampering() == [], "a change was left in place"


@pytest.mark.parametrize("unhooked", ["numba", "triton"], indirect=True)
def test_a_launch_hook_installed_at_the_first_check_grades_right_answers(unhooked, capsys):
    backend, cls, attr = unhooked
    assert not getattr(vars(cls)[attr], "_records_launches", False)
    assert guard.tampering() == []          # a hook not installed yet is not tampering
    utils.check_relu(RIGHT[backend])         # installs the hook, which the guard must accept
    assert "correct" in capsys.readouterr().out.lower()
    assert getattr(vars(cls)[attr], "_records_launches", False)
    assert guard.tampering() == []
    with utils.record_launches() as seen:
        RIGHT[backend](torch.randn(100, device=utils.DEVICE))
    assert [k.backend for k in seen.kernels] == [backend]


@pytest.mark.parametrize("backend", ["numba", "triton"])
def test_a_launch_hook_taken_off_is_named(backend):
    _, cls, attr = _hook({"numba": "Numba", "triton": "Triton"}[backend])
    hooked = vars(cls)[attr]
    type.__setattr__(cls, attr, hooked.__wrapped__)
    try:
        with pytest.raises(utils.GradingError) as e:
            utils.check_relu(RIGHT[backend])
        msg = str(e.value)
        assert REPLACED in msg and f"{cls.__qualname__}.{attr}" in msg, msg
    finally:
        type.__setattr__(cls, attr, hooked)
    assert guard.tampering() == []
    utils.check_relu(RIGHT[backend])


def test_the_hooks_emptied_are_named(monkeypatch):
    monkeypatch.setattr(launches, "_HOOKS", ())
    with pytest.raises(utils.GradingError) as e:
        utils.check_relu(relu_ok)
    assert REPLACED in str(e.value) and "runtime.backends.launches._HOOKS" in str(e.value), str(e.value)


def test_the_recording_state_left_inside_a_launch_is_named(monkeypatch):
    monkeypatch.setattr(launches._STATE, "inside", 1)
    with pytest.raises(utils.GradingError) as e:
        utils.check_relu(relu_ok)
    assert REPLACED in str(e.value) and "launches._STATE.inside" in str(e.value), str(e.value)


def test_a_recording_stopped_inside_the_launcher_is_named():
    def stops_the_recording(x):
        launches._ACTIVE.clear()            # what the grader would see from here on: nothing
        return torch.relu(x)

    with pytest.raises(utils.GradingError) as e:
        utils.check_relu(stops_the_recording)
    assert "launches._ACTIVE" in str(e.value) and "earns no points" in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------
# check_traffic on Nsight Compute's counters
# ---------------------------------------------------------------------------------------
def _ncu_profile(sectors_ld: int, sectors_st: int, args) -> Profile:
    """A Profile as a GPU's ``utils.profile`` makes it from ncu's metrics (``_profile.from_ncu``)."""
    metrics = {_profile.GLOBAL.format(what=w, op=op): 0 for w in ("requests", "sectors")
               for op in ("ld", "st", "atom", "red")}
    metrics[_profile.GLOBAL.format(what="sectors", op="ld")] = sectors_ld
    metrics[_profile.GLOBAL.format(what="sectors", op="st")] = sectors_st
    # relu_items_kernel(const float* x_ptr, float* y_ptr, int n)
    params = [SimpleNamespace(is_const_pointer=c) for c in (True, False, False)]
    data = _profile.from_ncu(metrics, args, params)
    return Profile("relu_items_kernel", data.pop("backend"), data.pop("metrics"), **data)


def test_ncu_counts_grade_traffic(capsys):
    n = 8 * 256 * 4
    x, y = torch.randn(n), torch.empty(n)
    coalesced = _ncu_profile(n * 4 // 32, n * 4 // 32, (x, y, n))
    assert coalesced.bytes_needed == 8 * n
    utils.check_traffic(coalesced, reject=True)
    assert "coalesced" in capsys.readouterr().out
    # in place (y is x): as many bytes in and out, as simulation counts them
    utils.check_traffic(_ncu_profile(n * 4 // 32, n * 4 // 32, (x, x, n)), reject=True)
    # four neighbours per thread: each warp request touches 16 sectors and uses 4 of them.
    # The bytes needed are bounded by what the tensors hold (8n read at most, 4n written):
    # 32n moved for at most 12n needed
    strided = _ncu_profile(4 * n * 4 // 32, 4 * n * 4 // 32, (x, y, n))
    assert strided.bytes_needed == 12 * n
    with pytest.raises(utils.GradingError, match=r"2\.7x the bytes it needs"):
        utils.check_traffic(strided, reject=True)


def test_ncu_needed_bytes_count_each_tensor_once():
    x = torch.randn(1000)
    # the same storage passed twice (in place) and a view of it: 4000 bytes, counted once
    assert _profile.from_ncu({}, (x, x, x[10:20], 1000))["bytes_needed"] == 4000
    assert _profile.from_ncu({}, (x, torch.empty(0), 3))["bytes_needed"] == 4000
    assert _profile.from_ncu({}, (7,))["bytes_needed"] is None


# ---------------------------------------------------------------------------------------
# What a GPU does where simulation reports: a fault found by the hardware, every case twice
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("error", [
    "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported",
    "CUDA error: device-side assert triggered",
    "CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address",
])
def test_a_fault_the_gpu_found_names_bounds_and_the_restart(error):
    def faults_on_the_gpu(x):
        raise RuntimeError(error)   # what torch, numba-cuda or Triton raise after such a launch

    with pytest.raises(utils.GradingError) as e:
        utils.check_relu(faults_on_the_gpu)
    msg = str(e.value)
    assert "outside a tensor" in msg and "restart the notebook's kernel" in msg and "COURSE_SIMULATE=1" in msg, msg


def test_on_a_gpu_every_case_runs_twice_and_grades_the_same(monkeypatch, capsys):
    from grader_kernels import relu_grid_rounded_down

    from utils import grading
    monkeypatch.setattr(grading, "SIMULATE", False)   # the GPU's path: every case run twice (races)
    assert grading._race_indices([object()] * 5) == set(range(5))
    utils.check_relu(relu_ok)
    assert "correct" in capsys.readouterr().out.lower()
    with pytest.raises(utils.GradingError, match="never written"):
        utils.check_relu(relu_grid_rounded_down)
