"""What the Numba and Triton backends share: in simulation, patches applied once to the
library's simulator, a race detector that a module's ``RACECHECK`` flag switches, and
profiles that the backend package's ``profile.py`` counts."""
from __future__ import annotations

import contextlib
import functools
import os

from ..config import SIMULATE


def patch_once(env: str):
    """Decorate a simulator's ``apply() -> bool`` (which patches it, False where it cannot):
    it runs in simulation only, with the library's simulator switched on (``<env>=1``), and
    once; it returns whether the patch is in place, which ``apply.applied`` says too."""
    def wrap(patch):
        @functools.wraps(patch)
        def apply() -> bool:
            if not apply.applied and SIMULATE and os.environ.get(env) == "1":
                apply.applied = bool(patch())
            return apply.applied
        apply.applied = False
        return apply
    return wrap


class SimulatedBackend:
    name: str
    title: str
    #: the module whose ``RACECHECK`` says whether simulated launches are checked for races
    races = None

    def owns(self, kernel) -> bool:
        """A kernel of this backend: an object of the ``numba`` (or ``triton``) package."""
        return (type(kernel).__module__ or "").startswith(self.name)

    @contextlib.contextmanager
    def race_detection(self, enabled: bool = True):
        """Check simulated launches for races inside the block, or not (a GPU has no checker)."""
        was = self.races.RACECHECK
        self.races.RACECHECK = bool(enabled)
        try:
            yield
        finally:
            self.races.RACECHECK = was

    def _profile_module(self):
        """The package's ``profile.py`` (imported there, by a relative import)."""
        raise NotImplementedError

    def counters(self):
        """The module that counts a simulated launch (``profile.py``); a clear error without it."""
        try:
            return self._profile_module()
        except ImportError:
            raise NotImplementedError(f"profiling {self.title.split()[0]} kernels is not available in this version "
                                      f"of the course (runtime/backends/{self.name}/profile.py is missing)") from None
