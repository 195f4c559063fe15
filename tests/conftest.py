"""Shared test setup: plots render off-screen, and `utils` is configured before numba/triton."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import utils  # noqa: E402,F401  (must come before any numba/triton import)


import pytest  # noqa: E402


@pytest.fixture
def emulator_only(monkeypatch):
    """For tests of the emulator itself that call host code from a kernel on purpose (NVRTC,
    which checks every emulated kernel, would rightly reject that code)."""
    from utils.cuda import _toolchain
    monkeypatch.setattr(_toolchain, "NVRTC_PARITY", False)
