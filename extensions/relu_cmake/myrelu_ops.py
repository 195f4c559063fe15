"""Ship the CMake-built ReLU operators: build, load, make them first-class PyTorch ops, export
them to ONNX and run them in ONNX Runtime.

    import myrelu_ops
    lib = myrelu_ops.build("build")            # cmake configure + build -> build/libmyrelu_ops.so
    myrelu_ops.load(lib)                        # torch.ops.myrelu.relu / relu_backward
    myrelu_ops.register_torch()                 # fake kernels + autograd: torch.compile, gradcheck
    table = myrelu_ops.register_onnx()          # the ONNX node's schema + the exporter's translation
    torch.onnx.export(model, (x,), dynamo=True, custom_translation_table=table).save("model.onnx")
    session = myrelu_ops.onnxruntime_session("model.onnx")

Nothing here needs the course: pass ``emulator=True`` to ``build`` (and ``course_root``) only
to compile the CUDA source for the course's CPU emulator instead of with nvcc.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
LIBRARY_NAME = "libmyrelu_ops.so"


# --------------------------------------------------------------------------------------
# 1. CMake
# --------------------------------------------------------------------------------------
def cmake_commands(build_dir, *, emulator: bool, course_root=None) -> list[list[str]]:
    """The two commands that build the project: configure, then build."""
    bin_dir = os.path.dirname(sys.executable)   # cmake and ninja from pip live beside python
    cmake = shutil.which("cmake", path=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))
    if cmake is None:
        raise RuntimeError("cmake not found: `pip install cmake` (the course's requirements.txt has it)")
    configure = [cmake, "-S", str(HERE), "-B", str(build_dir),
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",  # where TorchConfig.cmake is
                 f"-DPython3_EXECUTABLE={sys.executable}",                 # this Python, not another one
                 "-DCMAKE_BUILD_TYPE=Release"]
    ninja = shutil.which("ninja", path=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))
    if ninja:
        configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    configure.append(f"-DCOURSE_EMULATOR={'ON' if emulator else 'OFF'}")
    if emulator:
        configure.append(f"-DCOURSE_ROOT={course_root}")
    return [configure, [cmake, "--build", str(build_dir)]]


def build(build_dir, *, emulator: bool = False, course_root=None, verbose: bool = False) -> Path:
    """Configure and build into ``build_dir``; returns the path of the shared library.
    A second call only rebuilds what changed."""
    build_dir = Path(build_dir).resolve()
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    # One build at a time in a folder: two processes (a notebook and a test) may share it.
    with open(build_dir.parent / f".{build_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = build_dir / "CMakeCache.txt"
        # CMake caches what it found (Torch_DIR, the compilers, the languages) on the first
        # configure and keeps it: a folder configured for another torch, or for the other
        # mode (emulator or nvcc), would build the wrong thing. Start such a folder afresh.
        wanted = [f"Torch_DIR:PATH={Path(torch.utils.cmake_prefix_path) / 'Torch'}",
                  f"COURSE_EMULATOR:BOOL={'ON' if emulator else 'OFF'}"]
        if cache.is_file() and not all(line in cache.read_text() for line in wanted):
            shutil.rmtree(build_dir)
        for cmd in cmake_commands(build_dir, emulator=emulator, course_root=course_root):
            t0 = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{(r.stdout + r.stderr)[-4000:]}")
            if verbose:
                print(f"$ {' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}"
                      f"   ({time.perf_counter() - t0:.1f} s)")
    return build_dir / LIBRARY_NAME


def load(library) -> None:
    """dlopen the library: its TORCH_LIBRARY block registers torch.ops.myrelu.*"""
    if not hasattr(torch.ops.myrelu, "relu"):
        torch.ops.load_library(str(library))


# --------------------------------------------------------------------------------------
# 2. First-class PyTorch ops: fake kernels and autograd
# --------------------------------------------------------------------------------------
def _relu_fake(x):
    # Shapes, dtype and device of the result, without running anything: what torch.compile
    # and torch.export trace with ("fake" tensors have no data).
    return torch.empty_like(x)


def _relu_backward_fake(grad_out, x):
    torch._check(grad_out.shape == x.shape, lambda: "grad_out and x must have the same shape")
    return torch.empty_like(x)


def _relu_setup_context(ctx, inputs, output):
    (x,) = inputs
    ctx.save_for_backward(x)


def _relu_backward(ctx, grad_out):
    (x,) = ctx.saved_tensors
    return torch.ops.myrelu.relu_backward(grad_out, x)   # the CUDA backward kernel


_registered_torch = False


def register_torch() -> None:
    """Fake kernels for both ops and the autograd formula of relu (once per process)."""
    global _registered_torch
    if _registered_torch:
        return
    torch.library.register_fake("myrelu::relu", _relu_fake)
    torch.library.register_fake("myrelu::relu_backward", _relu_backward_fake)
    torch.library.register_autograd("myrelu::relu", _relu_backward, setup_context=_relu_setup_context)
    _registered_torch = True


# --------------------------------------------------------------------------------------
# 3. ONNX and ONNX Runtime
# --------------------------------------------------------------------------------------
#: The ONNX domain of the node. onnxruntime-extensions runs Python custom ops of this domain only.
ONNX_DOMAIN = "ai.onnx.contrib"
ONNX_OP = "MyRelu"


def _onnx_schema():
    from onnx.defs import OpSchema
    return OpSchema(ONNX_OP, ONNX_DOMAIN, 1, doc="y = max(x, 0), elementwise",
                    inputs=[OpSchema.FormalParameter("X", "T")],
                    outputs=[OpSchema.FormalParameter("Y", "T")],
                    type_constraints=[("T", ["tensor(float)"], "float32, like the ONNX Runtime op")])


def relu_to_onnx(x):
    """The exporter's translation of torch.ops.myrelu.relu: one MyRelu node of ONNX_DOMAIN."""
    import onnxscript
    return onnxscript.values.Opset(ONNX_DOMAIN, 1)[ONNX_OP](x)


def register_onnx() -> dict:
    """Tell ONNX the node's signature (the exporter checks every node against a schema) and
    return the translation table, ``custom_translation_table`` of ``torch.onnx.export``."""
    import onnx
    if not onnx.defs.has(ONNX_OP, ONNX_DOMAIN):
        onnx.defs.register_schema(_onnx_schema())
    return {torch.ops.myrelu.relu.default: relu_to_onnx}


_ort_device = "cpu"
_ort_calls = 0


def _ort_relu(x):
    """ONNX Runtime's implementation of MyRelu: numpy in, numpy out, through the CUDA kernel."""
    global _ort_calls
    _ort_calls += 1
    y = torch.ops.myrelu.relu(torch.from_numpy(x).to(_ort_device))
    return y.cpu().numpy()


_ort_op = None


def onnxruntime_session(model_path, *, device="cpu", providers=("CPUExecutionProvider",)):
    """An InferenceSession that can run MyRelu: onnxruntime-extensions' library, registered
    with the session, calls back into ``_ort_relu`` (the op runs its kernel on ``device``)."""
    global _ort_op, _ort_device
    import onnxruntime as ort
    import onnxruntime_extensions as ortx
    assert ortx.default_opset_domain() == ONNX_DOMAIN
    if _ort_op is None:
        _ort_op = ortx.onnx_op(op_type=ONNX_OP, inputs=[ortx.PyCustomOpDef.dt_float],
                               outputs=[ortx.PyCustomOpDef.dt_float])(_ort_relu)
    _ort_device = device
    options = ort.SessionOptions()
    options.register_custom_ops_library(ortx.get_library_path())
    return ort.InferenceSession(str(model_path), options, providers=list(providers))


def onnxruntime_calls() -> int:
    """How many times ONNX Runtime has called the custom op in this process."""
    return _ort_calls
