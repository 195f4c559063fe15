"""Shared test setup: plots render off-screen, and `utils` is configured before numba/triton."""
import os
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")
# Numba's simulator pins its threads to the launching thread's core (quicker hand-offs on an
# idle machine). The suite runs two workers, and compiler builds, on two cores: two workers'
# launches may pin to the same core while the other core idles. Unpinned here (the
# notebooks' kernels inherit it).
os.environ.setdefault("COURSE_NUMBA_SIM_PIN", "0")
# One thread for torch's CPU operators (OpenMP, MKL), in the workers and in the notebooks' kernels
# they start. The suite's tensors are small and its processes already fill the cores: each
# torch process with a thread per core made OpenMP's threads wait on each other (and spin while
# they wait) on a machine where a core is rarely free, which doubled the CPU time of tests that
# grade in simulation (tests/test_mistakes.py's attention catalog: 24 s of CPU, 12 s with one
# thread). Set before torch is imported (`import utils` below), which reads it once.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest

import runtime
import utils  # noqa: F401  the learner's front door, as every notebook starts (before numba/triton)


@pytest.fixture
def emulator_only(monkeypatch):
    """For tests of the emulator itself that call host code from a kernel on purpose (NVRTC,
    which checks every emulated kernel, would rightly reject that code)."""
    from runtime.backends.cuda import _toolchain
    monkeypatch.setattr(_toolchain, "NVRTC_PARITY", False)


@pytest.fixture
def python_gets_sigint():
    """For the tests of interrupting a launch. A long test process has loaded many libraries
    before them, and one may have left SIGINT blocked or handled outside Python; a notebook's
    kernel starts with Python's own handler, so the tests start from there too."""
    import signal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.fixture
def allow_torch_ops(monkeypatch):
    """``allow_torch_ops("check_sum", {"sum"})``: let torch stand in for a kernel in a grader's
    test, as a topic's spec may allow. The guard's record of the table is updated with it (a
    notebook that changes the table is refused: tests/test_grader_guard.py); both are put back
    after the test."""
    from utils import grading, guard

    def allow(check, ops):
        monkeypatch.setitem(grading.TORCH_OPS_ALLOWED, check, frozenset(ops))
        record = guard._State.globals_
        for mod in ("utils.grading", "utils.topics"):
            if "TORCH_OPS_ALLOWED" in record.get(mod, {}):
                monkeypatch.setitem(record[mod], "TORCH_OPS_ALLOWED",
                                    guard._describe_value(grading.TORCH_OPS_ALLOWED, True))
    return allow


# ---------------------------------------------------------------------------------------
# The longest files first
# ---------------------------------------------------------------------------------------
# `./course test` runs on two workers with --dist loadfile: a file (a notebook above all) runs
# whole on one worker, so the run ends when the file that started last ends. Started longest
# first, the long files overlap and the short ones fill the gaps at the end. The length of a file
# is the time it took in the recorded cold run (benchmarks/results/validation/cpu-validation.txt,
# written by .ci/cold-run.sh) or, on a GPU, in that GPU's last validation run (<gpu>-validation.txt,
# .ci/gpu-validate.sh: there other files are the long ones, the GPT's training steps and the
# graders' autotuned kernels, and started late they made the run a third longer than its longest
# file); a file the record does not know yet (a new lesson) counts as
# NEW_FILE_SECONDS. xdist keeps this order only with its own reordering (by number of tests,
# which put the longest builds last) turned off, as --no-loadscope-reorder does (set here
# rather than in pyproject.toml: older pytest-xdist releases lack the option).
NEW_FILE_SECONDS = 30.0
_RECORD = runtime.paths.VALIDATION_DIR / "cpu-validation.txt"


def timing_record() -> Path:
    """The record the order comes from: this GPU's validation summary when there is one, else
    the cold CPU run's."""
    if runtime.config.SIMULATE:
        return _RECORD
    try:
        import torch

        from utils.bench import gpu_slug
        mine = runtime.paths.VALIDATION_DIR / f"{gpu_slug(torch.cuda.get_device_name())}-validation.txt"
    except Exception:  # no usable GPU after all: the CPU run's record
        return _RECORD
    return mine if mine.is_file() else _RECORD


def recorded_file_seconds(record=None) -> dict[str, float]:
    """{file relative to the course root: seconds} from the per-file table of the record."""
    import re
    seconds = {}
    try:
        text = (record or timing_record()).read_text()
    except OSError:
        return seconds
    for m in re.finditer(r"^\s*([0-9.]+) s\s+(?:\d+ items\s+)?(\S+\.(?:py|ipynb))\s*$", text, flags=re.M):
        seconds[m.group(2)] = float(m.group(1))
    return seconds


def longest_first(items, seconds: dict[str, float]):
    """``items`` reordered so that whole files come longest first; the order within a file
    and between files of the same length stays as collected."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::", 1)[0], len(first_seen))

    def key(item):
        path = item.nodeid.split("::", 1)[0]
        return -seconds.get(path, NEW_FILE_SECONDS), first_seen[path]

    return sorted(items, key=key)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    items[:] = longest_first(items, recorded_file_seconds())
