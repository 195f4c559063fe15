"""The course's kernels, one file per topic and language.

    kernels/cuda/<op>.cu     CUDA C++ source        kernels/cuda/<op>.py     its launchers
    kernels/numba/<op>.py    numba.cuda.jit kernels and launchers
    kernels/triton/<op>.py   @triton.jit kernels and launchers
    kernels/frames/<op>.py   what the three languages' launchers share: the input rules, the
                             steps around the kernels (check, allocate, skip empty input),
                             shared constants and the PyTorch references
    kernels/_launch.py       what every launcher needs (cdiv, sm_count, version_index, ...)
    kernels/ops.py           the kernels as torch.library ops (torch.ops.course.X), above them

A language's module imports its topic's frame from ``kernels.frames``, never from another
language's module; a frame imports only the runtime, ``kernels._launch`` and other frames.
Every launcher takes torch tensors on ``runtime.DEVICE`` and returns torch tensors, so
notebooks, exercises, tests and benchmarks call the same code. ``kernels.get`` is the
one loader:

    relu = kernels.get("relu", "triton")          # the reference launcher
    sum_v2 = kernels.get("reduction", "cuda", "v2")
"""
from __future__ import annotations

import importlib

import runtime  # noqa: F401  (configures simulation before numba/triton load)

LANGUAGES = ("cuda", "numba", "triton")


def module(topic: str, lang: str):
    """The module ``kernels.<lang>.<topic>``."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    return importlib.import_module(f"kernels.{lang}.{topic}")


def get(topic: str, lang: str, version: str | None = None):
    """The launcher of a topic in a language: its reference version, or the named one.

    Each topic module has ``VERSIONS``: an ordered dict ``name -> (description, launcher)``
    and ``REFERENCE``, the name of its best version.
    """
    mod = module(topic, lang)
    name = version or mod.REFERENCE
    try:
        return mod.VERSIONS[name][1]
    except KeyError:
        raise KeyError(f"{lang} {topic} has versions {list(mod.VERSIONS)}, not {name!r}") from None


def versions(topic: str, lang: str):
    """``[(name, description)]`` of a topic's versions, in the order they improve."""
    return [(k, v[0]) for k, v in module(topic, lang).VERSIONS.items()]
