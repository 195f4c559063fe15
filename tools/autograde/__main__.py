"""``python -m tools.autograde``: see the package's docstring."""
import sys

from tools.autograde import main

sys.exit(main())
