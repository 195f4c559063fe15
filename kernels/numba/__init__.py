"""numba kernels of the course (see kernels/__init__.py)."""
import runtime  # noqa: F401  (must come before numba/triton)
