"""The course's runtime: what every kernel stands on, beneath ``kernels`` and ``utils``.

    runtime.config      GPU or simulation, decided once, before numba or triton is imported
    runtime.paths       where things are in the repository
    runtime.backends    one interface per language (CUDA C++ on nvcc/NVRTC or the course's
                        emulator, Numba on numba-cuda or its simulator, Triton on a GPU or its
                        interpreter) and the launch recordings the graders read
    runtime.interop     torch tensors <-> Numba arrays
    runtime.graphs      CUDA Graphs: torch's on a GPU, a model of capture and replay in simulation
    runtime.tma         TMA tensor maps for the Hopper kernels of lesson 12
    runtime.inputs      the input rules every launcher applies
    runtime.occupancy   the CUDA occupancy calculator
    runtime.progress    progress bars on long sweeps

Every kernel module imports this package first, and so does ``utils`` (the learner's front door,
above both): it switches the simulators on before numba or triton loads, which is why
``import kernels`` or ``import utils`` comes before ``import numba`` / ``import triton``.
Nothing here imports ``kernels`` or ``utils``.
"""
# The order of these imports is the point (config first): not sorted.
# isort: skip_file
from .config import DEVICE, MODE, PROBLEM_SIZES, REASON, SIMULATE, SIZES, describe  # noqa: F401  (first!)
from . import paths  # noqa: F401
from .paths import ROOT, KERNELS_DIR, CUDA_INCLUDE_DIR, RESULTS_DIR  # noqa: F401

from .backends.cuda import *  # noqa: F403  cuda_kernel, load_inline, emulation_schedule, ...
from .backends.numba.simulator import *  # noqa: F403  simulator patches (applied in simulation)
from .interop import *  # noqa: F403  torch <-> numba arrays
from .occupancy import *  # noqa: F403  occupancy: the CUDA occupancy calculator, GPUS
from .progress import *  # noqa: F403  progress bars on long sweeps
from .inputs import *  # noqa: F403  check_input: the input rules of every launcher
from .dist import *  # noqa: F403  run_ranks: N processes joined by torch.distributed (lesson 13)
from .graphs import *  # noqa: F403  CUDAGraph, graph: torch's on a GPU, a capture model in simulation (lesson 13)
from .tma import *  # noqa: F403  tensor_map: TMA tensor maps for hopper.h (lesson 12)
from .backends.triton import compat as triton_compat  # noqa: F401  tanh, do_bench, autotune that work in both modes
from .backends.triton import interpreter as triton_sim  # noqa: F401  races and poison in Triton's interpreter, its driver
from .backends.numba.races import SimulatorMemoryError, SimulatorRaceError  # noqa: F401
from .backends import Backend, BACKENDS, backend_of, record_launches  # noqa: F401  one interface to the three

import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import sys as _sys

#: The runtime's modules that used to live in ``utils`` (``utils.config`` ... ``utils.backends``).
MODULES = ("config", "paths", "interop", "inputs", "occupancy", "progress", "backends")


class _Alias(_abc.MetaPathFinder, _abc.Loader):
    """Imports ``<package>.<old>[.rest]`` as the module ``<new>[.rest]`` itself: one module
    object under two names, so state set through either name is the same state."""

    def __init__(self, package: str, names: dict):
        self.package, self.names = package, names

    def _target(self, fullname: str):
        head, _, rest = fullname.partition(".")
        if head != self.package or not rest:
            return None
        first, _, tail = rest.partition(".")
        new = self.names.get(first)
        return None if new is None else new + ("." + tail if tail else "")

    def find_spec(self, fullname, path=None, target=None):
        new = self._target(fullname)
        if new is None or _util.find_spec(new) is None:
            return None
        return _util.spec_from_loader(fullname, self, is_package=hasattr(_importlib.import_module(new), "__path__"))

    def create_module(self, spec):
        return _importlib.import_module(self._target(spec.name))

    def exec_module(self, module):
        pass  # the module under its own name is already executed


def alias_package(package: str, names: dict) -> None:
    """Make ``package.<old>`` (and its submodules) import the runtime's modules ``names[old]``:
    ``utils`` keeps its earlier paths (``import utils.backends.cuda``) this way. The modules
    imported already get their old names now; the others on first import."""
    if not any(isinstance(f, _Alias) and f.package == package for f in _sys.meta_path):
        _sys.meta_path.insert(0, _Alias(package, dict(names)))
    parent = _sys.modules[package]
    for old, new in names.items():
        prefix = new + "."
        for name, mod in list(_sys.modules.items()):
            if name == new or name.startswith(prefix):
                _sys.modules.setdefault(package + "." + old + name[len(new):], mod)
        if new in _sys.modules and not hasattr(parent, old):  # utils.occupancy stays the function
            setattr(parent, old, _sys.modules[new])
