"""``python -m benchmarks``: see ``benchmarks/__init__.py``."""
import sys

import utils  # noqa: F401  (configures the backend before numba/triton load)

from .run import main

if __name__ == "__main__":
    sys.exit(main())
