"""Attention (lesson 10): ``softmax(Q Kᵀ / √d) V`` per batch and head, from three kernels to
FlashAttention, forward and backward.

Layout: ``q`` (B, H, Nq, d), ``k`` and ``v`` (B, H, Nk, d), the output ``o`` (B, H, Nq, d) and
the logsumexp ``L`` (B, H, Nq) that a FlashAttention forward saves for its backward:
``L[i] = log Σ_j exp(S[i, j])`` with ``S = Q Kᵀ / √d``, in natural log, in float32.

The causal mask is aligned to the bottom right, as FlashAttention aligns it: query ``i`` sees
key ``j`` when ``j <= i + Nk - Nq``. With ``Nq == Nk`` that is ``j <= i``, what
``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` computes; with
``Nq < Nk`` (new queries after a cache of keys) the last query sees every key; with
``Nq > Nk`` the first ``Nq - Nk`` queries see no key at all. Such a row has output 0 and
``L = +inf`` (FlashAttention's convention: the backward's ``exp(S - L)`` is then 0, not NaN).

The graders:

* ``check_attention(fn, causal=False, dtype=torch.float32, lse=False)``: ``fn(q, k, v)`` (and
  ``causal=True`` as a keyword when grading the causal mask) returns ``o`` or ``(o, L)``;
  ``lse=True`` requires ``L``.
* ``check_attention_backward(fn, causal=False, dtype=torch.float32)``:
  ``fn(q, k, v, o, L, do)`` returns ``(dq, dk, dv)``.

FLOPs: ``4 B H Nq Nk d`` for a forward (two products of ``2 Nq Nk d``), half of it causal,
3.5 times it for a forward and a backward (the backward recomputes ``Q Kᵀ`` and does four
more products: 2.5 times the forward). The benchmarks of this topic (several dtypes, the
causal mask, forward and backward, SDPA's backends as baselines) are in
``benchmarks/attention.py``.

This module holds the spec; the topic's pieces live beside it, and every name stays reachable
from here: ``attention_ref.py`` (float64 references, tolerances, inputs), ``attention_grade.py``
(the graders and their diagnoses), ``attention_targets.py`` (baselines and H100 targets).
"""
from __future__ import annotations

import torch

from ._spec import Baseline, Spec
from .attention_grade import *  # noqa: F403  the graders and their diagnoses
from .attention_grade import (  # noqa: F401
                            _AttentionGrader,
                            _backward_diagnosis,
                            _Case,
                            _describe,
                            _draw_cases,
                            _explains,
                            _flash_variant,
                            _forward_diagnosis,
                            _lse_diagnosis,
                            check_attention,
                            check_attention_backward,
)

# The topic's pieces, all reachable from this module as before the split:
from .attention_ref import *  # noqa: F403  references, tolerances, inputs
from .attention_ref import (  # noqa: F401
                            _bench_shape_input,
                            _probabilities,
                            _spec_tolerance,
                            attention_flops,
                            attention_input,
                            attention_nbytes,
                            attention_ref64,
)
from .attention_targets import *  # noqa: F403  baselines and targets
from .attention_targets import AttentionTarget, _flex, _sdpa, _sweep, _targets  # noqa: F401

SPEC = Spec(
    name="attention", title="Attention", lesson="10_attention",
    reference=attention_ref64, make_input=attention_input,
    nbytes=attention_nbytes, flops=attention_flops, tolerance=_spec_tolerance,
    out_dtypes=(torch.float32, torch.float16, torch.bfloat16),
    checks={"check_attention": check_attention, "check_attention_backward": check_attention_backward},
    baselines=[
        Baseline("SDPA flash", "flash", "F.scaled_dot_product_attention with the FlashAttention-2 backend",
                 _sdpa("flash")),
        Baseline("SDPA cuDNN", "cudnn", "F.scaled_dot_product_attention with the cuDNN backend", _sdpa("cudnn")),
        Baseline("SDPA efficient", "efficient", "F.scaled_dot_product_attention with the memory-efficient backend",
                 _sdpa("efficient")),
        Baseline("SDPA default", "default", "F.scaled_dot_product_attention, the backend torch picks", _sdpa(None)),
        Baseline("FlexAttention", "flex", "torch.nn.attention.flex_attention, torch.compile'd", _flex),
    ],
    baseline_label="SDPA flash",
    targets=_targets(),
    main_shapes=lambda sizes: [tuple(s) for s in sizes.attention_bench_shapes],
    sweep_shapes=_sweep, sweep_label="sequence length N (Nq = Nk)",
    check_shapes=lambda sizes: [tuple(s) for s in sizes.attention_bench_check_shapes],
)

