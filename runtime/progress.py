"""Progress bars for long sweeps: a widget in JupyterLab, a text bar in a terminal, and
nothing at all under pytest/nbval or in a log, so test output stays clean.

    for n in runtime.progress(utils.SIZES.bench_sizes, desc="sizes"):
        ...

Set ``COURSE_PROGRESS=1`` to force bars on, ``COURSE_PROGRESS=0`` to turn them off.
"""
from __future__ import annotations

import os
import sys

__all__ = ["progress", "progress_enabled"]

ENV = "COURSE_PROGRESS"


def _in_jupyter() -> bool:
    """True in a Jupyter kernel (JupyterLab, Notebook), where tqdm draws a widget."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def progress_enabled() -> bool:
    """Whether ``progress`` draws a bar here."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("0", "false", "no", "off"):
        return False
    if forced in ("1", "true", "yes", "on"):
        return True
    # pytest sets PYTEST_CURRENT_TEST while a test runs, and a notebook kernel that nbval
    # starts inherits it: no bars in test logs.
    if "PYTEST_CURRENT_TEST" in os.environ:
        return False
    if _in_jupyter():
        return True
    stream = sys.stderr
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


def progress(iterable=None, desc: str | None = None, total: int | None = None, **kwargs):
    """``tqdm.auto.tqdm`` over ``iterable``, switched off where nobody watches.

    Works as an iterator wrapper or, with ``iterable=None`` and ``total``, as a manual
    bar: ``with runtime.progress(total=10) as bar: ... bar.update()``. Extra keyword
    arguments go to tqdm. When disabled it still iterates and accepts ``update`` and
    ``set_postfix`` (as tqdm's ``disable=True`` does): only the drawing is skipped.
    """
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    enabled = progress_enabled()
    kwargs.setdefault("disable", not enabled)
    kwargs.setdefault("dynamic_ncols", True)
    if enabled and _in_jupyter():
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm  # plain text bar: tqdm.auto would warn without a kernel
    return tqdm(iterable, desc=desc, total=total, **kwargs)
