"""Shared test setup: plots render off-screen, and `utils` is configured before numba/triton."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import utils  # noqa: E402,F401  (must come before any numba/triton import)


import pytest  # noqa: E402


@pytest.fixture
def emulator_only(monkeypatch):
    """For tests of the emulator itself that call host code from a kernel on purpose (NVRTC,
    which checks every emulated kernel, would rightly reject that code)."""
    from utils.backends.cuda import _toolchain
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
