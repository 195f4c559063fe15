"""Source sites in messages: how the simulators' diagnoses name a line of kernel code.

Shared by Numba's simulator (``simulator.py``), its race detector (``races.py``) and Triton's
interpreter (``../triton/interpreter.py``), so none of them imports another for it."""
from __future__ import annotations

import linecache
import os


def describe_site(site) -> str:
    """``(filename, line)`` -> ``"relu.py:12 `y[i] = x[i]`"`` (a notebook cell: "line 12 of its notebook cell")."""
    filename, lineno = site
    text = linecache.getline(filename, lineno).strip()
    if "ipykernel_" in filename or filename.startswith("<ipython-input"):
        where = f"line {lineno} of its notebook cell"  # the cell's file name means nothing
    else:
        where = f"{os.path.basename(filename)}:{lineno}"
    return f"{where} `{text}`" if text else where
