"""Shared test setup: plots render off-screen, and `utils` is configured before numba/triton."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import utils  # noqa: E402,F401  (must come before any numba/triton import)
