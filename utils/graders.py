"""Graders: check a learner's kernel and explain what is wrong, in words.

    utils.check_relu(relu_triton)          # prints one line, or raises GradingError

The shared harness (poisoned memory, races, the comparison with the float64 reference)
is ``utils/grading.py``; each topic's inputs and diagnoses are in ``utils/topics/<topic>.py``.
This module gathers every topic's graders under one flat name each.
"""
from __future__ import annotations

from .grading import POISON_BITS, GradingError, check_shared, check_traffic, show_rejection  # noqa: F401
from .topics import CHECKS, topic, TOPICS  # noqa: F401
from .topics.gelu import gelu_tanh_ref  # noqa: F401

globals().update(CHECKS)

__all__ = ["GradingError", "show_rejection", "check_traffic", "check_shared", "POISON_BITS", "gelu_tanh_ref", "topic", *CHECKS]
