"""CUDA Graphs in both modes (runtime/graphs.py): a capture records the launches on torch's stream
and a replay runs them again on the same memory, in simulation as on a GPU; what breaks a
capture on a GPU breaks the simulated one (host synchronisations, ``to_numba``), and a Numba
launch on Numba's own stream is left out of it."""
import gc
import warnings

import numpy as np
import pytest
import torch

import utils
from runtime import graphs

import triton
import triton.language as tl
from numba import cuda

DEV = utils.DEVICE
sim_only = pytest.mark.skipif(not utils.SIMULATE, reason="the capture model itself (on a GPU: torch's own graph)")

TWICE = r"""
__global__ void twice_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}"""


@triton.jit
def add_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@cuda.jit
def scale_kernel(x, out, a):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = a * x[i]


def _sync():
    if not utils.SIMULATE:
        torch.cuda.synchronize()


def _warm(fn):
    fn()
    _sync()


def test_replay_runs_every_language_again_on_the_same_memory():
    n = 1000
    k = utils.cuda_kernel(TWICE, "twice_kernel")
    x, y, z, w = (torch.randn(n, device=DEV) for _ in range(4))

    def step():
        k[(n + 255) // 256, 256](x, y, n)                                                   # y = 2x
        add_one_kernel[(triton.cdiv(n, 256),)](y, z, n, BLOCK=256)                          # z = 2x + 1
        t = z * 3                                                                           # a torch operator
        utils.numba_launch(scale_kernel, (n + 127) // 128, 128, t, w, np.float32(0.5))     # w = 1.5 (2x + 1)
    _warm(step)
    g = utils.CUDAGraph()
    with utils.graph(g):
        step()
    for _ in range(2):
        x.copy_(torch.randn(n, device=DEV))
        w.zero_()
        g.replay()
        _sync()
        torch.testing.assert_close(w, 1.5 * (2 * x + 1))


@sim_only
def test_a_capture_records_launches_without_running_them():
    n = 300
    k = utils.cuda_kernel(TWICE, "twice_kernel")
    x, y = torch.randn(n), torch.full((n,), float("nan"))
    g = utils.CUDAGraph()
    with utils.record_launches() as seen, utils.graph(g):
        k[2, 256](x, y, n)
    assert torch.isnan(y).all(), "a captured launch ran during the capture"
    assert g.kernels == ["cuda:twice_kernel"] and [s.name for s in seen.kernels] == ["twice_kernel"]
    with utils.record_launches() as seen:
        g.replay()
    assert torch.equal(y, 2 * x) and [s.name for s in seen.kernels] == ["twice_kernel"]


@sim_only
def test_an_allocation_in_the_capture_is_kept_and_overwritten_by_each_replay():
    x = torch.randn(100)
    box = {}

    def call():
        out = torch.empty_like(x)
        add_one_kernel[(1,)](x, out, 100, BLOCK=128)
        box["y"] = out
    g = utils.CUDAGraph()
    with utils.graph(g):
        call()
    g.replay()
    kept = box["y"]
    first = kept.clone()
    x.copy_(torch.randn(100))
    g.replay()
    assert torch.equal(kept, x + 1) and not torch.equal(kept, first)


#: What the GPU says (torch 2.11 on an H200): a value read on the host, and a tensor copied to it.
NOT_PERMITTED, NO_COPY = "not permitted when stream is capturing", "Cannot copy between CPU and CUDA tensors during"


@pytest.mark.parametrize("sync, says", [
    (lambda t: t.item(), NOT_PERMITTED), (lambda t: bool(t.sum() > 0), NOT_PERMITTED),
    (lambda t: float(t.max()), NOT_PERMITTED), (lambda t: print(t), NOT_PERMITTED),
    (lambda t: torch.equal(t, t + 1), NOT_PERMITTED), (lambda t: t.tolist(), NO_COPY), (lambda t: t.cpu(), NO_COPY),
], ids=["item", "bool", "float", "print", "equal", "tolist", "cpu"])
def test_a_host_synchronisation_breaks_the_capture(sync, says):
    x = torch.randn(64, device=DEV)
    g = utils.CUDAGraph()
    _, err = graphs.capture(g, lambda: sync(x[:1]))
    assert err is not None and says in str(err), err
    # afterwards the machine works as before: torch's generator, a capture and its replay
    torch.randn(4, device=DEV)
    y = torch.zeros(64, device=DEV)
    g2 = utils.CUDAGraph()
    _, err = graphs.capture(g2, lambda: add_one_kernel[(1,)](x, y, 64, BLOCK=64))
    assert err is None, err
    g2.replay()
    _sync()
    torch.testing.assert_close(y, x + 1)


@pytest.mark.skipif(utils.SIMULATE, reason="torch's capture on a GPU (a simulated one destroys no CUDA graph)")
def test_the_garbage_collector_waits_while_a_gpu_capture_runs():
    """A failed capture's graph lives in a reference cycle (its exception's traceback); were the
    collector to destroy it during a later capture, that capture would break ("operation failed
    due to a previous error during capture", seen on an H200)."""
    seen = []
    x, y = torch.randn(64, device=DEV), torch.zeros(64, device=DEV)
    _, err = graphs.capture(utils.CUDAGraph(), lambda: seen.append(gc.isenabled()) or x[:1].item())
    assert err is not None and seen == [False] and gc.isenabled()
    _, err = graphs.capture(utils.CUDAGraph(), lambda: seen.append(gc.isenabled()) or add_one_kernel[(1,)](
        x, y, 64, BLOCK=64))
    assert err is None and seen == [False, False] and gc.isenabled()
    with pytest.raises(ZeroDivisionError), utils.graph(utils.CUDAGraph()):
        1 / 0
    assert gc.isenabled()


def test_to_numba_inside_a_capture_is_refused_with_the_way_out():
    x, out = torch.randn(64, device=DEV), torch.zeros(64, device=DEV)
    _, err = graphs.capture(utils.CUDAGraph(), lambda: scale_kernel[1, 64](utils.to_numba(x), utils.to_numba(out),
                                                                         np.float32(2)))
    assert isinstance(err, utils.CaptureError) and "numba_launch" in str(err), err


@sim_only
def test_a_numba_launch_on_numbas_own_stream_runs_at_capture_and_is_left_out():
    x, out = torch.randn(64), torch.zeros(64)
    xa, oa = utils.to_numba(x), utils.to_numba(out)
    g = utils.CUDAGraph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with utils.graph(g):
            scale_kernel[1, 64](xa, oa, np.float32(2))
    assert any("The CUDA Graph is empty" in str(w.message) for w in caught)
    assert torch.equal(out, 2 * x), "the launch on Numba's own stream did not run at capture"
    out.zero_()
    g.replay()
    assert not out.any(), "the replay ran a launch the capture never recorded"
    g2 = utils.CUDAGraph()
    with utils.graph(g2):                                     # on torch's stream: recorded
        scale_kernel[1, 64, utils.numba_stream()](xa, oa, np.float32(2))
    assert g2.kernels == ["numba:scale_kernel"]


@sim_only
def test_misuse_is_refused_as_torch_refuses_it():
    g = utils.CUDAGraph()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    x = torch.zeros(4)
    with utils.graph(g):
        x.add_(1)
    with pytest.raises(RuntimeError, match="holds a capture already"):
        with utils.graph(g):
            pass
    with pytest.raises(utils.CaptureError, match="inside another capture"):
        with utils.graph(utils.CUDAGraph()):
            g.replay()
    g.replay()
    assert torch.equal(x, torch.full((4,), 2.0))  # one add at capture (torch ops run), one at replay
    g.reset()
    with pytest.raises(TypeError, match="CUDAGraph"):
        utils.graph(object())
    assert not graphs.capturing()
