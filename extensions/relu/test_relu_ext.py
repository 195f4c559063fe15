"""Checks of the built extension. Run after `python setup.py build_ext --inplace`, from this folder:

    PYTHONPATH=../.. python -m pytest -q test_relu_ext.py

With the course on PYTHONPATH the tensors live on the course's device (the GPU, or the CPU
when the extension was built against the emulator); without it, on "cuda".
"""
import pytest
import torch

try:
    import utils
    DEVICE, COURSE = utils.DEVICE, True
except ImportError:
    DEVICE, COURSE = torch.device("cuda"), False

import myrelu


@pytest.mark.parametrize("n", [1, 7, 256, 1025, 4099])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_relu_matches_torch(n, dtype):
    x = torch.randn(n, dtype=dtype, device=DEVICE)
    x[::5] = 0.0
    for f in (myrelu.relu, torch.ops.myrelu.relu):
        torch.testing.assert_close(f(x), torch.relu(x), rtol=0, atol=0)


def test_shapes_and_strides():
    x = torch.randn(33, 65, device=DEVICE)
    for view in (x, x.t(), x[:, 3:40], x[::3]):
        y = myrelu.relu(view)
        assert y.shape == view.shape
        torch.testing.assert_close(y, torch.relu(view), rtol=0, atol=0)
    empty = torch.empty(0, device=DEVICE)
    assert myrelu.relu(empty).shape == (0,)


def test_bad_input_is_refused():
    with pytest.raises(RuntimeError, match="float32 or float64"):
        myrelu.relu(torch.zeros(4, dtype=torch.int32, device=DEVICE))
    if DEVICE.type == "cuda":
        with pytest.raises(RuntimeError, match="CUDA"):
            myrelu.relu(torch.zeros(4))
    with pytest.raises(RuntimeError, match="shape"):
        myrelu.relu_backward(torch.ones(3, device=DEVICE), torch.ones(4, device=DEVICE))


def test_backward_kernel_and_gradcheck():
    class MyReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.ops.myrelu.relu(x)

        @staticmethod
        def backward(ctx, grad_out):
            (x,) = ctx.saved_tensors
            return torch.ops.myrelu.relu_backward(grad_out, x)

    x = torch.randn(1025, device=DEVICE)
    x[::7] = 0.0
    g = torch.randn(1025, device=DEVICE)
    torch.testing.assert_close(myrelu.relu_backward(g, x), torch.where(x > 0, g, torch.zeros_like(g)),
                               rtol=0, atol=0)
    x64 = torch.randn(32, dtype=torch.float64, device=DEVICE)
    x64 = (x64 + 0.1 * x64.sign()).requires_grad_()   # away from the kink at 0
    assert torch.autograd.gradcheck(MyReLU.apply, (x64,), eps=1e-6, atol=1e-8)


@pytest.mark.skipif(not COURSE, reason="the course's graders are not on PYTHONPATH")
def test_course_graders():
    utils.check_relu(myrelu.relu)
    utils.check_relu(torch.ops.myrelu.relu)
    utils.check_relu_backward(torch.ops.myrelu.relu_backward)
