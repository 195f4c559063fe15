"""What torch.compile writes around a custom op, recorded on a GPU for lesson 07.

    python -m benchmarks.lessons.output_code [--out FILE] [--commit SHA]

Builds the CMake project in extensions/relu_cmake (into .cache/), compiles a small function
that calls torch.ops.myrelu.relu between PyTorch's own pointwise ops, and keeps the Python
module inductor generates (TORCH_LOGS=output_code), without its benchmark harness, in
benchmarks/results/lessons/<gpu>-output-code.txt (named from the GPU: h100-output-code.txt on an
H100).
Lesson 07 shows that file on machines without a GPU.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The function compiled: two pointwise chains with the custom op between them.
PROGRAM = r'''
import sys, torch
sys.path.insert(0, sys.argv[1])
import myrelu_ops
myrelu_ops.load(sys.argv[2])
myrelu_ops.register_torch()

def f(x, w):
    h = torch.ops.myrelu.relu(x * 2.0 + 1.0)
    return torch.nn.functional.gelu(h) * w

x = torch.randn(1 << 20, device="cuda")
w = torch.randn(1 << 20, device="cuda")
y = torch.compile(f, fullgraph=True)(x, w)
torch.testing.assert_close(y, f(x, w))
'''


#: what the logging module puts before every line of TORCH_LOGS output
_LOG_PREFIX = re.compile(r"^[VIWE]\d{4} [\d:.]+ +\d+ \S+\] (\[[^]]*\] )*\[__output_code\] ?", flags=re.M)


def generated_module(log: str) -> str:
    """The output_code log holds the generated module after 'Output code:', each line behind a
    logging prefix; keep the module up to the benchmark harness that inductor appends."""
    code = _LOG_PREFIX.sub("", log)
    start = code.find("Output code:")
    if start >= 0:
        code = code[start:].split("\n", 1)[1]
    elif "async_compile" not in code:
        raise RuntimeError("no generated code in the log: did TORCH_LOGS=output_code take effect?\n" + log[-3000:])
    end = re.search(r"^def (get_args|benchmark_compiled_module)\(", code, flags=re.M)
    return code[: end.start()].rstrip() + "\n" if end else code


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="default: benchmarks/results/lessons/<gpu>-output-code.txt")
    ap.add_argument("--commit", default="", help="the git commit measured (written in the header)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU: inductor writes Triton only for CUDA tensors", file=sys.stderr)
        return 1
    if args.out is None:
        from runtime.paths import LESSON_RESULTS_DIR
        from utils.bench import gpu_slug  # the one naming rule of GPU records
        args.out = str(LESSON_RESULTS_DIR / f"{gpu_slug(torch.cuda.get_device_name(0))}-output-code.txt")

    ext = ROOT / "extensions" / "relu_cmake"
    sys.path.insert(0, str(ext))
    import myrelu_ops
    lib = myrelu_ops.build(ROOT / ".cache" / "extensions" / "relu_cmake" / "build", verbose=True)
    env = dict(os.environ, TORCH_LOGS="output_code",
               TORCHINDUCTOR_CACHE_DIR=str(ROOT / ".cache" / "inductor-output-code"))
    r = subprocess.run([sys.executable, "-c", PROGRAM, str(ext), str(lib)], env=env,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-5000:], file=sys.stderr)
        return 1
    code = generated_module(r.stdout + r.stderr)
    header = (f"# torch.compile(f, fullgraph=True) with TORCH_LOGS=output_code on "
              f"{torch.cuda.get_device_name()}, torch {torch.__version__}, python {platform.python_version()}"
              f"{', commit ' + args.commit if args.commit else ''}\n"
              "# f(x, w) = gelu(torch.ops.myrelu.relu(x * 2.0 + 1.0)) * w   (benchmarks/lessons/output_code.py)\n")
    Path(args.out).write_text(header + code)
    print(f"wrote {args.out} ({len(code.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
