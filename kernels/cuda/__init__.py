"""cuda kernels of the course (see kernels/__init__.py): ``<topic>.cu`` and its launchers,
``<topic>.py``, which import what they share with Numba and Triton from ``kernels/frames/<topic>.py``."""
import runtime  # noqa: F401  (must come before numba/triton)
