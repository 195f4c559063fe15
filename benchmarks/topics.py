"""What is measured for each topic, read from the topic's spec (``utils/topics/<topic>.py``):
inputs, the float64 reference, bytes moved, the allowed error and the PyTorch baselines.

Bytes are what a kernel must move at the least: every input element read once and every
output element written once (a sum writes one float). GB/s is bytes / median time.
"""
from __future__ import annotations

from types import SimpleNamespace

from runtime.config import PROBLEM_SIZES
from utils.topics import TOPICS as _SPECS
from utils.topics import benchmarked
from utils.topics._spec import FLOAT, Baseline, Spec, numel  # noqa: F401  (re-exported)

#: The benchmarked topics, name -> Spec (``make_input``, ``reference``, ``tolerance``,
#: ``nbytes``, ``baselines``, ``targets``, shapes).
TOPICS: dict[str, Spec] = {name: _SPECS[name] for name in benchmarked()}


def copy_bytes(n: int) -> int:
    return 2 * FLOAT * n


def main_shapes(topic: str, sizes) -> list[tuple]:
    """The shapes a topic is measured at (the targets' shapes)."""
    return [tuple(s) for s in TOPICS[topic].main_shapes(sizes)]


def sweep_shapes(topic: str, sizes) -> list[tuple]:
    """The shapes of the size sweep."""
    return [tuple(s) for s in TOPICS[topic].sweep_shapes(sizes)]


def check_shapes(topic: str, simulate: bool) -> list[tuple]:
    """Awkward shapes every kernel must get right before it is timed (tails, one element)."""
    sizes = SimpleNamespace(**PROBLEM_SIZES["simulation" if simulate else "gpu"])
    return [tuple(s) for s in TOPICS[topic].check_shapes(sizes)]


#: Lesson 11's topics (the kernels its GPT trains on). Their launchers return several tensors
#: (the loss and the gradient; h and y) or update in place (AdamW, the embedding's gradient),
#: so ``python -m benchmarks.lessons.gpt_kernels`` measures them, not the harness above; their H100 goals
#: are each topic module's ``TARGETS``.
LESSON11 = ("cross_entropy", "embedding", "adamw", "bias_gelu", "residual_layernorm")
