"""Where things are in the course repository."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # runtime/ sits in the repository root
KERNELS_DIR = ROOT / "kernels"
#: ``#include "common.h"`` in any CUDA C++ source of the course resolves here.
CUDA_INCLUDE_DIR = KERNELS_DIR / "cuda"
RESULTS_DIR = ROOT / "benchmarks" / "results"
#: Compiled kernels and extensions (git-ignored).
CACHE_DIR = ROOT / ".cache"
