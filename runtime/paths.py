"""Where things are in the course repository."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # runtime/ sits in the repository root
KERNELS_DIR = ROOT / "kernels"
#: ``#include "common.h"`` in any CUDA C++ source of the course resolves here.
CUDA_INCLUDE_DIR = KERNELS_DIR / "cuda"
#: What was measured, one folder per kind (who reads it); ``benchmarks/__init__.py`` lists them.
RESULTS_DIR = ROOT / "benchmarks" / "results"
#: Each GPU's benchmark record (``python -m benchmarks``): ``<gpu>.json``, ``<gpu>.md``, ``<gpu>-<topic>.png``.
RECORDS_DIR = RESULTS_DIR / "records"
#: What the lessons show from a GPU run (``benchmarks/lessons/``, the probes of ``benchmarks/tune/``).
LESSON_RESULTS_DIR = RESULTS_DIR / "lessons"
#: The course's simulators and profiler: their speed, and their answers beside the GPU's
#: (``benchmarks/simulators/``).
SIMULATOR_RESULTS_DIR = RESULTS_DIR / "simulators"
#: The tuning sweeps of ``benchmarks/tune/``.
TUNE_RESULTS_DIR = RESULTS_DIR / "tune"
#: The summaries of the validation runs: ``<gpu>-validation.txt`` (``.ci/gpu-validate.sh``),
#: ``cpu-validation.txt`` (``.ci/cold-run.sh``).
VALIDATION_DIR = RESULTS_DIR / "validation"
#: Compiled kernels and extensions (git-ignored).
CACHE_DIR = ROOT / ".cache"
