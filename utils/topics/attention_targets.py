"""Attention's benchmarks as the spec names them (lesson 10): SDPA per backend and
FlexAttention as baselines, and the H100 targets per dtype, mask and pass
(``AttentionTarget``). The measurements themselves are in ``benchmarks/attention.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._spec import Target


# ----------------------------------------------------------------------------------------
# Benchmarks: SDPA per backend and FlexAttention
# ----------------------------------------------------------------------------------------
def _sdpa(backend: str | None):
    """fn(q, k, v, causal=False) running torch's SDPA with one backend (None: torch picks)."""
    def factory(dynamic=False):
        import torch.nn.functional as F

        if backend is None:
            return lambda q, k, v, causal=False: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]

        def fn(q, k, v, causal=False):
            with sdpa_kernel([which]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn
    return factory


def _flex(dynamic=False):
    """FlexAttention (torch.compile'd), with a block mask for the causal case."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def causal_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def fn(q, k, v, causal=False):
        if not causal:
            return compiled(q, k, v)
        key = (q.shape[-2], k.shape[-2], str(q.device))
        if key not in masks:
            masks[key] = create_block_mask(causal_mod, None, None, q.shape[-2], k.shape[-2], device=q.device)
        return compiled(q, k, v, block_mask=masks[key])
    return fn


@dataclass(frozen=True)
class AttentionTarget(Target):
    """A target at one (B, H, N, d) shape that holds for each causal flag and dtype listed,
    for the forward or for the forward and backward together."""
    causal: tuple = (False, True)
    dtypes: tuple = ("float16", "bfloat16")
    backward: bool = False

    def evaluate(self, rows) -> list[dict]:
        """One result per dtype and mask: the course's kernel against the baseline, as a ratio
        of TFLOP/s (same shape, same work); ``value`` None where either was not measured."""
        kind = "forward+backward" if self.backward else "forward"
        label = self.baseline_label or "SDPA flash"
        goal = f">= {label}" if self.threshold == 1 else f">= {self.threshold:.0%} of {label}"
        out = []
        for dtype in self.dtypes:
            for causal in self.causal:
                sel = [r for r in rows if r.get("topic") == "attention" and not r.get("sweep")
                       and tuple(r.get("shape") or ()) == tuple(self.shape) and r.get("dtype") == dtype
                       and r.get("causal") == causal and r.get("pass") == kind]
                mine = next((r for r in sel if r.get("lang") == self.lang and (
                    r.get("version") == self.version if self.version else r.get("reference"))), None)
                base = next((r for r in sel if r.get("lang") == "torch" and r.get("version") == self.baseline), None)
                value = (mine["tflops"] / base["tflops"]) if (mine and base and mine.get("tflops")
                                                               and base.get("tflops")) else None
                config = f"[{dtype}, {'causal' if causal else 'full'}, {kind}]"
                met = None if value is None else bool(value >= self.threshold)
                out.append(dict(topic="attention", lang=self.lang,
                                variant=mine["variant"] if mine else f"{self.lang} (reference) {config}",
                                shape=list(self.shape), goal=goal, value=value, threshold=self.threshold,
                                unit="ratio_to_torch", met=met,
                                versus=label, dtype=dtype, causal=causal, **{"pass": kind}))
                if met is False and self.if_missed:
                    out[-1]["why"] = self.if_missed
        return out


def _targets():
    out = []
    for n_shape in ((4, 32, 4096, 64), (4, 32, 4096, 128), (1, 32, 16384, 64), (1, 32, 16384, 128)):
        out.append(AttentionTarget("triton", "torch", 1.0, shape=n_shape, baseline="flash",
                                   baseline_label="SDPA flash"))
        out.append(AttentionTarget("triton", "torch", 1.0, shape=n_shape, baseline="flash",
                                   baseline_label="SDPA flash (forward + backward)", backward=True))
    out.append(AttentionTarget("triton", "torch", 0.9, shape=(4, 32, 4096, 64), baseline="default",
                               baseline_label="SDPA default", causal=(False,), dtypes=("float16",)))
    out.append(AttentionTarget("cuda", "torch", 0.5, shape=(4, 32, 4096, 64), baseline="flash",
                               baseline_label="SDPA flash", causal=(False,), dtypes=("float16",),
                               if_missed="v3 copies each K and V tile into shared memory synchronously (no cp.async "
                                         "double buffering, two block-wide barriers per tile) and passes the scores "
                                         "through shared memory between its two wmma products; FlashAttention-2 "
                                         "prefetches the next tile while it computes and keeps P in registers"))
    return out


def _sweep(sizes):
    return [tuple(s) for s in sizes.attention_sweep_shapes]

