"""Lesson 07: the ReLU ops built by CMake, made first-class PyTorch ops (opcheck,
torch.compile(fullgraph=True), gradcheck), exported to ONNX and run in ONNX Runtime.

The CMake build takes tens of seconds on a CPU, so it happens once for the module, in the
build folder lesson 07 uses (.cache/, locked while building): whichever of the two runs second
only rebuilds what changed. The ops are loaded into this process once.
"""
import sys

import pytest
import torch

import runtime
import utils

sys.path.insert(0, str(utils.ROOT / "extensions" / "relu_cmake"))
import myrelu_ops

DEVICE = utils.DEVICE


@pytest.fixture(scope="module")
def ops():
    lib = myrelu_ops.build(runtime.paths.CACHE_DIR / "extensions" / "relu_cmake" / "build",
                           emulator=utils.SIMULATE, course_root=utils.ROOT)
    assert lib.is_file(), lib
    myrelu_ops.load(lib)
    myrelu_ops.register_torch()
    return torch.ops.myrelu


def test_cmake_library_registers_working_ops(ops):
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(1000, dtype=dtype, device=DEVICE)
        x[::9] = 0.0
        torch.testing.assert_close(ops.relu(x), torch.relu(x), rtol=0, atol=0)
        g = torch.randn_like(x)
        torch.testing.assert_close(ops.relu_backward(g, x), torch.where(x > 0, g, 0.0), rtol=0, atol=0)
    utils.check_relu(ops.relu)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        ops.relu(torch.zeros(4, dtype=torch.int32, device=DEVICE))


def test_opcheck(ops):
    x = torch.randn(33, 5, device=DEVICE, requires_grad=True)
    torch.library.opcheck(ops.relu.default, (x,))          # raises on the first failing check
    torch.library.opcheck(ops.relu_backward.default, (torch.randn(33, device=DEVICE), torch.randn(33, device=DEVICE)))


def test_opcheck_catches_a_wrong_fake_kernel(ops):
    # A fake kernel must describe the real result: one that gets the shape wrong is caught.
    torch.library.define("myrelu_test::twice", "(Tensor x) -> Tensor")
    torch.library.impl("myrelu_test::twice", "default", lambda x: torch.ops.myrelu.relu(x) * 2)
    torch.library.register_fake("myrelu_test::twice", lambda x: x.new_empty(x.shape[0] + 1))
    with pytest.raises(Exception, match="(?i)shape|size"):
        torch.library.opcheck(torch.ops.myrelu_test.twice.default, (torch.randn(8, device=DEVICE),))


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(torch.ops.myrelu.relu(x)) * 2


def test_compile_fullgraph_keeps_the_op_and_matches_eager(ops):
    torch.manual_seed(0)
    model = _Model().to(DEVICE)
    graphs = []

    def record(gm, example_inputs):   # a torch.compile backend that only looks at the graph
        graphs.append(gm)
        return gm.forward

    x = torch.randn(8, 16, device=DEVICE)
    torch.compile(model, fullgraph=True, backend=record)(x)
    targets = [n.target for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    # Dynamo records the op as called (the packet); no graph break, no Python fallback
    assert {torch.ops.myrelu.relu, torch.ops.myrelu.relu.default} & set(targets), targets

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)       # inductor
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = compiled(xa)
    torch.testing.assert_close(out, model(xb))
    out.sum().backward()
    model(xb).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad)


def test_gradcheck(ops):
    x = torch.randn(64, dtype=torch.float64, device=DEVICE)
    x = (x + 0.1 * x.sign()).requires_grad_()    # away from the kink at 0
    assert torch.autograd.gradcheck(ops.relu, (x,), eps=1e-6, atol=1e-8)
    assert torch.autograd.gradcheck(torch.compile(ops.relu, fullgraph=True, backend="aot_eager"), (x,),
                                    eps=1e-6, atol=1e-8)


def test_onnx_export_and_onnxruntime_round_trip(ops, tmp_path):
    import onnx
    # requirements.txt installs it; a GPU image that lacks it reports a skip, not a failure
    pytest.importorskip("onnxruntime_extensions", reason="onnxruntime-extensions is not installed")
    table = myrelu_ops.register_onnx()
    model = _Model().eval()                 # ONNX Runtime gets host arrays: the model is on the CPU
    x = torch.randn(8, 16)
    path = tmp_path / "model.onnx"
    torch.onnx.export(model.to(DEVICE), (x.to(DEVICE),), dynamo=True, custom_translation_table=table,
                      verbose=False).save(str(path))
    graph = onnx.load(str(path)).graph
    custom = [n for n in graph.node if n.domain == myrelu_ops.ONNX_DOMAIN]
    assert [n.op_type for n in custom] == [myrelu_ops.ONNX_OP], [(n.domain, n.op_type) for n in graph.node]

    # A provider that cannot load is dropped: the session runs on the CPU and says so.
    session = myrelu_ops.onnxruntime_session(path, device=DEVICE,
                                             providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    assert session.get_providers()[-1] == "CPUExecutionProvider"
    calls = myrelu_ops.onnxruntime_calls()
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    assert myrelu_ops.onnxruntime_calls() == calls + 1       # the custom op ran, not a stand-in
    with torch.no_grad():
        want = model(x.to(DEVICE)).cpu()
    torch.testing.assert_close(torch.from_numpy(got), want, **utils.tolerance(torch.float32))
