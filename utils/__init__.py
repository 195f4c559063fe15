"""The course's helpers, all importable from ``utils`` itself.

``import utils`` must come before ``import numba`` or ``import triton``: it decides
whether the course runs on a GPU or in simulation and configures both before they load.

    import utils
    utils.DEVICE          # the torch device of the course ("cuda" or "cpu")
    utils.SIMULATE        # True without a GPU (or with COURSE_SIMULATE=1)
    utils.SIZES           # problem sizes for this mode
"""
# The order of these imports is the point (the runtime first, guard last): not sorted.
# isort: skip_file
import runtime as _runtime  # configures GPU or simulation before numba/triton load (first!)
from runtime.config import DEVICE, MODE, PROBLEM_SIZES, REASON, SIMULATE, SIZES, describe  # noqa: F401
from runtime import paths  # noqa: F401
from runtime.paths import ROOT, KERNELS_DIR, CUDA_INCLUDE_DIR, RESULTS_DIR  # noqa: F401
from runtime.paths import (RECORDS_DIR, LESSON_RESULTS_DIR, SIMULATOR_RESULTS_DIR,  # noqa: F401
                           TUNE_RESULTS_DIR, VALIDATION_DIR)

from runtime.backends.cuda import *  # noqa: F403  cuda_kernel, load_inline, emulation_schedule, ...
from runtime.backends.numba.simulator import *  # noqa: F403  simulator patches (applied in simulation)
from runtime.interop import *  # noqa: F403  torch <-> numba arrays
from runtime.occupancy import *  # noqa: F403  occupancy: the CUDA occupancy calculator, GPUS
from runtime.progress import *  # noqa: F403  progress bars on long sweeps
from runtime.inputs import *  # noqa: F403  check_input: the input rules of every launcher
from runtime.dist import *  # noqa: F403  run_ranks: N processes joined by torch.distributed (lesson 13)
from runtime.graphs import CUDAGraph, CaptureError, capture, graph  # noqa: F401  lesson 13: CUDA Graphs in both modes
from runtime.tma import tensor_map  # noqa: F401  lesson 12: TMA tensor maps in both modes
from runtime import triton_compat, triton_sim  # noqa: F401  Triton in both modes; races and poison in its interpreter
from runtime.backends.numba.races import SimulatorMemoryError, SimulatorRaceError  # noqa: F401
from runtime.backends import Backend, BACKENDS, backend_of, record_launches  # noqa: F401  one interface to the three
from runtime.cute import CuteError, CuteUnavailable, cute_run  # noqa: F401  lesson 12: CuTe's C++ on the host (g++)
from runtime.cute_layouts import *  # noqa: F403  lesson 12: cute_layout, the layout algebra, partitions, evaluated by CuTe
from .check import *  # noqa: F403  tolerance table, assert_close
from .grading import POISON_BITS, GradingError, check_shared, check_traffic, show_rejection  # noqa: F401  the harness
from .topics import CHECKS as _CHECKS, topic  # noqa: F401  one spec per topic (utils/topics/<topic>.py)
from .topics.gelu import gelu_tanh_ref  # noqa: F401
from .topics.gpt import check_gpt_op  # noqa: F401  lesson 11: your kernels in the GPT
from kernels.collectives import bus_bandwidth, chunk_bounds, ring_all_reduce  # noqa: F401  lesson 13: the ring
from kernels.data_parallel import BucketedDDP, ZeroAdamW  # noqa: F401  lesson 13: DDP and ZeRO-1 from scratch
from .topics.collectives import *  # noqa: F403  lesson 13: check_reduce_scatter, check_all_gather, check_all_reduce
from .topics.graphs import *  # noqa: F403  lesson 13: check_graph_safe, check_make_graphed
globals().update(_CHECKS)  # check_relu, check_gelu, check_sum, check_softmax, ...: every topic's graders
from .bench import *  # noqa: F403  bench, recorded results
from .plots import *  # noqa: F403  bandwidth plots, index maps, reduction trees, draw_layout (CuTe)
from .source_view import *  # noqa: F403  show(kernel): the source, PTX or SASS of a kernel of any language
from .report import *  # noqa: F403  environment report
from .ship import *  # noqa: F403  check_custom_op: lesson 07's grader
from .profile import profile, Profile  # noqa: F401  counters of one launch (emulator or ncu)
from .gpt import *  # noqa: F403  lesson 11's GPT: GPT, GPTConfig, gradient_check, course_text, train_gpt

# The modules' earlier paths, which learners' code may import (`from utils.triton_compat import tanh`,
# `import runtime.backends.cuda`, `runtime.config.SIMULATE`): the runtime's modules under their old names,
# the same module objects (runtime.alias_package).
import sys as _sys
import kernels.ops as gpt_ops  # noqa: F401  lesson 11 reads `utils.gpt_ops`: the ops of kernels/ops.py
_runtime.alias_package(__name__, {"triton_compat": "runtime.backends.triton.compat",
                                  "triton_sim": "runtime.backends.triton.interpreter",
                                  "gpt_ops": "kernels.ops",
                                  **{m: f"runtime.{m}" for m in _runtime.MODULES}})

# Last: graders, the harness and torch's comparisons as imported now are the ones that grade
# (utils/guard.py); a notebook that replaces one of them earns no points for its checks.
from . import guard as _guard
_guard.install(_sys.modules[__name__])
