"""The course's helpers, all importable from ``utils`` itself.

``import utils`` must come before ``import numba`` or ``import triton``: it decides
whether the course runs on a GPU or in simulation and configures both before they load.

    import utils
    utils.DEVICE          # the torch device of the course ("cuda" or "cpu")
    utils.SIMULATE        # True without a GPU (or with COURSE_SIMULATE=1)
    utils.SIZES           # problem sizes for this mode
"""
from .config import DEVICE, MODE, PROBLEM_SIZES, REASON, SIMULATE, SIZES, describe  # noqa: F401  (first!)
from . import paths  # noqa: F401
from .paths import ROOT, KERNELS_DIR, CUDA_INCLUDE_DIR, RESULTS_DIR  # noqa: F401

from .cuda import *  # noqa: F401,F403  cuda_kernel, load_inline, emulation_schedule, ...
from .numba_sim import *  # noqa: F401,F403  simulator patches (applied in simulation)
from .interop import *  # noqa: F401,F403  torch <-> numba arrays
from .check import *  # noqa: F401,F403  tolerance table, assert_close
from .graders import *  # noqa: F401,F403  check_relu, check_gelu, check_sum, check_softmax, ...
from .bench import *  # noqa: F401,F403  bench, recorded results
from .plots import *  # noqa: F401,F403  bandwidth plots, index maps, reduction trees
from .occupancy import *  # noqa: F401,F403  occupancy: the CUDA occupancy calculator, GPUS
from .progress import *  # noqa: F401,F403  progress bars on long sweeps
from .report import *  # noqa: F401,F403  environment report
from .inputs import *  # noqa: F401,F403  check_input: the input rules of every launcher
from . import triton_compat  # noqa: F401,E402  tanh, do_bench, autotune that work in both modes
from .ship import *  # noqa: F401,F403  check_custom_op: lesson 07's grader
from . import triton_sim  # noqa: F401,E402  races and poison in Triton's interpreter, its driver
from .sim_race import SimulatorRaceError  # noqa: F401,E402
from .profile import profile, Profile  # noqa: F401,E402  counters of one launch (emulator or ncu)

# Last: graders that a notebook cannot switch off by rebinding them (utils/guard.py).
from . import guard as _guard  # noqa: E402
_guard.install(__import__("sys").modules[__name__])
