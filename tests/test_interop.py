"""torch <-> Numba without copies, in simulation and on a GPU."""
import numpy as np
import pytest
import torch
from copy_kernels import copy_kernel

import utils

from numba import cuda


@cuda.jit
def double_1d(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] *= 2


@cuda.jit
def double_2d(x):
    r, c = cuda.grid(2)
    if r < x.shape[0] and c < x.shape[1]:
        x[r, c] *= 2


def _sync():
    if not utils.SIMULATE:
        torch.cuda.synchronize()


def test_kernel_writes_land_in_the_tensor():
    x = torch.arange(1000, dtype=torch.float32, device=utils.DEVICE)
    double_1d[4, 256](utils.to_numba(x))
    _sync()
    assert torch.equal(x.cpu(), 2 * torch.arange(1000, dtype=torch.float32))


def test_strided_and_transposed_views_are_written_in_place():
    base = torch.arange(6 * 10, dtype=torch.float32, device=utils.DEVICE).reshape(6, 10)
    want = base.clone()
    view = base[:, ::2]  # every other column: not contiguous
    assert not view.is_contiguous()
    double_2d[(1, 1), (8, 8)](utils.to_numba(view))
    want[:, ::2] *= 2
    t = base.T  # a transposed view
    double_2d[(1, 1), (16, 8)](utils.to_numba(t))
    _sync()
    assert torch.equal(base, 2 * want)


def test_from_numba_shares_memory():
    x = torch.zeros(8, device=utils.DEVICE)
    y = utils.from_numba(utils.to_numba(x))
    assert y.device.type == utils.DEVICE.type and y.shape == x.shape
    y[3] = 5.0
    assert x[3].item() == 5.0


def test_from_numba_of_a_numba_device_array():
    dev = cuda.device_array(16, dtype=np.float32)
    t = utils.from_numba(dev)
    assert t.device.type == utils.DEVICE.type and t.dtype == torch.float32 and t.shape == (16,)
    src = torch.arange(16, dtype=torch.float32, device=utils.DEVICE)
    copy_kernel[1, 32](utils.to_numba(src), dev, 16)
    _sync()
    assert torch.equal(t, src)  # the kernel wrote the memory the tensor views


def test_tensor_that_requires_grad_is_accepted():
    x = torch.ones(4, device=utils.DEVICE, requires_grad=True)
    double_1d[1, 32](utils.to_numba(x))
    _sync()
    assert x.detach().cpu().tolist() == [2.0] * 4


def test_bad_inputs_get_clear_errors():
    wrong = "meta" if utils.SIMULATE else "cpu"
    with pytest.raises(ValueError, match=r"move it with \.to\(utils\.DEVICE\)"):
        utils.to_numba(torch.zeros(3, device=wrong))
    with pytest.raises(TypeError, match="torch.Tensor"):
        utils.to_numba(np.zeros(3))
    with pytest.raises(TypeError, match="bfloat16"):
        utils.to_numba(torch.zeros(3, dtype=torch.bfloat16, device=utils.DEVICE))
    with pytest.raises(TypeError, match="device array"):
        utils.from_numba([1, 2, 3])


def test_launch_on_torchs_current_stream():
    x = torch.ones(64, device=utils.DEVICE)
    stream = utils.numba_stream()
    if utils.SIMULATE:  # torch's stream, which a simulated CUDA Graph captures (Numba's default, 0, it does not)
        assert not isinstance(stream, int) and "torch" in repr(stream)
    double_1d[1, 64, stream](utils.to_numba(x))
    _sync()
    assert x.cpu().tolist() == [2.0] * 64
