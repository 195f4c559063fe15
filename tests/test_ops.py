"""kernels/ops.py, the course's torch.library ops: one namespace, above the kernels.

* every op of the course is ``course::<name>``, registered by kernels/ops.py, and no two collide;
* no kernel module imports kernels.ops (the ops import the kernels, never the reverse), and
  kernels/ops.py imports nothing from utils/;
* ``utils.gpt_ops``, the name lesson 11 reads, is the same module;
* the fake kernels of lesson 11's ops describe what the ops return (``opcheck``); LayerNorm's
  and attention's are checked in test_layernorm.py and test_attention.py.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import import_graph
import pytest
import torch
from torch._library.custom_ops import CustomOpDef

import kernels.ops
import utils

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"
OPS_FILE = KERNELS / "ops.py"

#: The ops of the course, by their name in ``torch.ops.course``.
COURSE_OPS = {"layernorm_triton", "layernorm_triton_backward", "attention", "attention_backward", "gelu",
              "linear", "linear_backward", "embedding", "embedding_backward", "cross_entropy"}


def test_every_op_is_registered_once_in_the_course_namespace():
    defs = [v for v in vars(kernels.ops).values() if isinstance(v, CustomOpDef)]
    names = [d._qualname for d in defs]
    assert sorted(names) == sorted(f"course::{n}" for n in COURSE_OPS)
    for name in COURSE_OPS:
        assert callable(getattr(torch.ops.course, name).default), name


def test_no_op_is_registered_outside_kernels_ops():
    """A custom_op anywhere else under kernels/ would split the op layer again."""
    found = []
    for path in sorted(KERNELS.rglob("*.py")):
        if path != OPS_FILE and "custom_op(" in path.read_text(encoding="utf-8"):
            found.append(str(path.relative_to(ROOT)))
    assert not found, f"torch.library ops outside kernels/ops.py: {found}"


_KNOWN = import_graph.sources("runtime", "kernels", "utils")


def _imports(text: str, module: str, is_package: bool) -> set[str]:
    """The course's modules ``text`` imports (at module level or inside functions)."""
    return import_graph.imports(module, text, is_package, _KNOWN)


def _kernel_modules_importing_ops(sources: dict[Path, str]) -> list[str]:
    bad = []
    for path, text in sources.items():
        if path == OPS_FILE:
            continue
        names = _imports(text, import_graph.module_name(path), path.name == "__init__.py")
        if any(n == "kernels.ops" or n.startswith("kernels.ops.") for n in names):
            bad.append(str(path.relative_to(ROOT)))
    return bad


def _kernel_sources() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for p in sorted(KERNELS.rglob("*.py"))}


def test_kernel_modules_do_not_import_the_ops():
    bad = _kernel_modules_importing_ops(_kernel_sources())
    assert not bad, f"kernel modules that import kernels.ops (the ops import the kernels, not the reverse): {bad}"


@pytest.mark.parametrize("line", ["import kernels.ops", "from kernels.ops import attention_op",
                                  "from kernels import ops", "from .. import ops", "from ..ops import layernorm_op"])
def test_the_layer_check_finds_an_import_of_the_ops(line):
    sources = _kernel_sources()
    path = KERNELS / "triton" / "attention.py"
    sources[path] += f"\n\ndef _late():\n    {line}\n"
    assert _kernel_modules_importing_ops(sources) == ["kernels/triton/attention.py"]


def test_the_ops_import_nothing_from_utils():
    names = _imports(OPS_FILE.read_text(encoding="utf-8"), "kernels.ops", False)
    assert not [n for n in names if n == "utils" or n.startswith("utils.")], sorted(names)


def test_utils_gpt_ops_is_kernels_ops():
    import utils.gpt_ops
    assert utils.gpt_ops is kernels.ops
    assert sys.modules["utils.gpt_ops"] is kernels.ops
    assert importlib.import_module("utils.gpt_ops") is kernels.ops
    # what lesson 11 shows of it
    assert utils.gpt_ops._linear_op._qualname == "course::linear"
    assert utils.gpt_ops._linear_backward_op._qualname == "course::linear_backward"
    assert utils.ops_for is kernels.ops.ops_for and utils.Ops is kernels.ops.Ops


def _inputs():
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(utils.DEVICE).requires_grad_()

    ids = torch.randint(0, 10, (2, 3), generator=g).to(utils.DEVICE)
    targets = torch.randint(0, 12, (6,), generator=g).to(utils.DEVICE)
    return {
        "gelu": (randn(5, 7),),
        "linear": (randn(5, 8), randn(6, 8), randn(6)),
        "linear (no bias)": (randn(5, 8), randn(6, 8), None),
        "embedding": (ids, randn(10, 4)),
        "cross_entropy": (randn(6, 12), targets),
    }


@pytest.mark.parametrize("case", ["gelu", "linear", "linear (no bias)", "embedding", "cross_entropy"])
def test_lesson_11_ops_pass_opcheck(case):
    op = getattr(torch.ops.course, case.split()[0]).default
    with utils.race_checks_off():
        torch.library.opcheck(op, _inputs()[case],
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
