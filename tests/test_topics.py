"""Every topic's spec (utils/topics/<topic>.py) is complete and agrees with the kernels,
the graders and the benchmarks that read it. A new topic is checked here as soon as its
module is listed in utils/topics/__init__.py."""
import importlib
import math
from types import SimpleNamespace

import pytest
import torch

import kernels
import utils
from runtime.config import PROBLEM_SIZES
from utils.topics import TOPICS, benchmarked

NAMES = list(TOPICS)
BENCHED = benchmarked()
MODES = list(PROBLEM_SIZES)


def sizes_of(mode):
    return SimpleNamespace(**PROBLEM_SIZES[mode])


#: Topics a language cannot express, with why (the lesson says so too).
NOT_WRITTEN = {("hopper", "numba"): "Numba has no TMA, mbarrier or wgmma (lesson 12)"}


@pytest.mark.parametrize("name", NAMES)
def test_spec_is_complete(name):
    spec = utils.topic(name)
    assert spec.name == name and spec.title and spec.checks
    assert (utils.ROOT / "notebooks" / f"{spec.lesson}.ipynb").exists(), spec.lesson
    for lang in kernels.LANGUAGES:
        if (name, lang) in NOT_WRITTEN:
            continue
        mod = kernels.module(name, lang)
        assert mod.REFERENCE in mod.VERSIONS
        assert all(description and callable(launcher) for description, launcher in mod.VERSIONS.values())
    for target in spec.targets:
        assert target.lang in kernels.LANGUAGES and target.kind in ("copy", "torch", "gbps")
        assert target.threshold > 0
        assert target.kind != "gbps" or target.shape is not None, "a GB/s goal names its shape"
    if spec.targets:
        assert spec.baselines, "targets are measured by the benchmarks, which need a baseline"


@pytest.mark.parametrize("name", NAMES)
def test_graders_are_exported_from_utils(name):
    for check_name, fn in utils.topic(name).checks.items():
        assert getattr(utils, check_name) is fn
        assert check_name in utils.topics.CHECKS


def test_unknown_topic_is_named():
    with pytest.raises(KeyError, match="the course has add, relu"):
        utils.topic("matmull")


@pytest.mark.parametrize("name", NAMES)
def test_inputs_are_seeded_and_the_reference_is_float64(name):
    spec = utils.topic(name)
    shape = spec.check_shapes(sizes_of("simulation"))[-1]
    a, b = spec.inputs(shape, seed=3), spec.inputs(shape, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], spec.inputs(shape, seed=4)[0])
    # (float inputs, and int64 indices: class targets, token ids)
    assert all(x.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64)
               and x.device.type == utils.DEVICE.type for x in a)
    ref = spec.reference(*a)
    assert ref.dtype == torch.float64
    assert ref.numel() == spec.out_numel(shape)
    # The allowed error accepts the reference rounded to float32 and rejects a clear miss.
    tol = spec.tolerance(a, ref)
    assert bool(((ref.float().double() - ref).abs() <= tol).all())
    # (a clear miss of a float16 input, as attention takes on a GPU, is larger)
    miss = ref + (1e-3 if a[0].dtype == torch.float32 else 1e-2) * (1 + ref.abs())
    assert bool(((miss - ref).abs() > tol).all())


@pytest.mark.parametrize("name", NAMES)
def test_reference_agrees_with_the_pytorch_reference(name):
    """The float64 reference of the spec is the op the kernels' ``<op>_ref`` (in the topic's
frame, ``kernels/frames/<topic>.py``) computes."""
    spec = utils.topic(name)
    inputs = spec.inputs(spec.check_shapes(sizes_of("simulation"))[-1], seed=1)
    ref_name = {"reduction": "sum_ref"}.get(name, f"{name}_ref")
    torch_ref = getattr(importlib.import_module(f"kernels.frames.{name}"), ref_name)
    torch.testing.assert_close(spec.reference(*inputs), torch_ref(*(x.double() for x in inputs)).reshape(
        spec.reference(*inputs).shape), rtol=1e-12, atol=1e-12)


def test_gelu_reference_is_the_tanh_formula():
    x = torch.linspace(-9, 9, 1001, dtype=torch.float64)
    formula = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    torch.testing.assert_close(utils.topic("gelu").reference(x), formula, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", BENCHED)
def test_benchmark_shapes_and_bytes(name, mode):
    spec, sizes = utils.topic(name), sizes_of(mode)
    for shapes in (spec.main_shapes(sizes), spec.sweep_shapes(sizes), spec.check_shapes(sizes)):
        assert shapes and all(isinstance(s, tuple) and all(int(d) >= 1 for d in s) for s in shapes)
    for shape in spec.main_shapes(sizes):
        n = math.prod(shape)
        # (M, N, K): A, B read once and C written once, 2 FLOPs per product term
        if spec.flops is not None and len(shape) == 3:
            M, N, K = shape
            assert spec.nbytes(shape) >= 2 * (M * K + K * N + M * N) and spec.flops(shape) == 2 * n
            continue
        # at least every input read once and the result written once
        assert spec.nbytes(shape) >= 4 * (n + spec.out_numel(shape))
    for target in spec.targets:
        if target.shape is not None and mode == "gpu":
            assert tuple(target.shape) in spec.main_shapes(sizes), "a target's shape is measured"


def test_targets_of_a_named_version_against_a_named_baseline(monkeypatch):
    """What a compute-bound topic needs: a target for one version (not the reference) against
    one of several baselines, at a fraction of its speed, and TFLOP/s."""
    from benchmarks import report
    from utils.topics import Target
    extra = [("softmax", Target("triton", "torch", 0.9, version="v3", baseline="compile",
                                baseline_label="torch.compile")),
             ("softmax", Target("triton", "tflops", 5.0, shape=(4, 8), version="v3"))]
    monkeypatch.setattr(report, "TARGETS", extra)
    rows = [dict(topic="softmax", lang="triton", version="v3", variant="triton v3", reference=False,
                 shape=[4, 8], gbps=950.0, tflops=6.0),
            dict(topic="softmax", lang="triton", version="v5", variant="triton v5", reference=True,
                 shape=[4, 8], gbps=2000.0, tflops=9.0),
            dict(topic="softmax", lang="torch", version="compile", variant="torch.compile", shape=[4, 8], gbps=1000.0),
            dict(topic="softmax", lang="torch", version="eager", variant="torch", shape=[4, 8], gbps=100.0)]
    ratio, tflops = report.evaluate_targets(rows, ["softmax"], {"softmax": [(4, 8)]})
    assert ratio["variant"] == "triton v3" and ratio["value"] == pytest.approx(0.95) and ratio["met"] is True
    assert ratio["goal"] == ">= 90% of torch.compile" and report._value_str(ratio) == "0.950x torch.compile"
    assert tflops["value"] == 6.0 and tflops["met"] is True and tflops["goal"] == ">= 5 TFLOP/s"


def test_result_shape_of_a_spec():
    spec = utils.topic("softmax")
    assert spec.out_shape((3, 5)) == (3, 5)
    assert utils.topic("reduction").out_shape((1000,)) == (1,)
    from dataclasses import replace
    mm = replace(spec, result_shape=lambda s: (s[0], s[1]))
    assert mm.out_shape((4, 6, 8)) == (4, 6) and mm.out_numel((4, 6, 8)) == 24
