"""triton kernels of the course (see kernels/__init__.py)."""
import utils  # noqa: F401  (must come before numba/triton)
