"""One spec per topic: ``utils.topic("softmax")`` is everything the course knows about
softmax apart from its kernels and its lesson (see ``utils/topics/_spec.py``).

Adding a topic: write ``utils/topics/<name>.py`` with its graders and ``SPEC``, and add
the module to ``_MODULES`` below. Its graders then become ``utils.check_...``, the
benchmarks measure it (if it has baselines) and ``tests/test_topics.py`` checks it.
"""
from __future__ import annotations

import importlib

from ._spec import Baseline, Spec, Target  # noqa: F401

#: In lesson order.
_MODULES = ("add", "relu", "gelu", "reduction", "softmax", "matmul", "matmul_fp16", "layernorm", "attention",
            "cross_entropy", "embedding", "adamw",
            "bias_gelu", "residual_layernorm", "hopper")

#: name -> Spec, in lesson order.
TOPICS: dict[str, Spec] = {}
for _m in _MODULES:
    _spec = importlib.import_module(f"{__name__}.{_m}").SPEC
    TOPICS[_spec.name] = _spec

#: Every grader of every topic, by name (``check_relu``, ...): exported from ``utils``.
CHECKS = {name: fn for spec in TOPICS.values() for name, fn in spec.checks.items()}

# What each grader lets a launcher compute with torch (Spec.torch_ops_allowed).
from ..grading import TORCH_OPS_ALLOWED  # noqa: E402

TORCH_OPS_ALLOWED.update({name: frozenset(spec.torch_ops_allowed) for spec in TOPICS.values() for name in spec.checks})


def topic(name: str) -> Spec:
    """The spec of one topic: inputs, float64 reference, tolerance, bytes, targets, graders."""
    try:
        return TOPICS[name]
    except KeyError:
        raise KeyError(f"no topic {name!r}: the course has {', '.join(TOPICS)}") from None


def benchmarked() -> list[str]:
    """The topics ``python -m benchmarks`` measures, in lesson order."""
    return [n for n, s in TOPICS.items() if s.benchmarked]
