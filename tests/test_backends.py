"""The backends' interface (runtime/backends/) and the shape of the house: no import circles
anywhere in the course's packages, and every import points down a floor (runtime, kernels,
utils, then the tools and benchmarks that use them)."""
from __future__ import annotations

from pathlib import Path

import import_graph
import pytest
import torch

import utils

ROOT = Path(__file__).resolve().parent.parent
#: The course's packages from the bottom floor up: a module imports its own floor or lower ones.
FLOORS = {"runtime": 0, "kernels": 1, "utils": 2, "extensions": 3, "tools": 3, "benchmarks": 3, "tests": 4}


# --------------------------------------------------------------------------------------
# No import circles, no import that climbs
# --------------------------------------------------------------------------------------
def _sources(packages=tuple(FLOORS)) -> dict[str, tuple[str, bool]]:
    return import_graph.sources(*packages)


_import_graph, _cycles = import_graph.graph, import_graph.cycles


def test_no_import_circles_anywhere():
    cycles = _cycles(_import_graph(_sources()))
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _climbing(graph) -> list[str]:
    floor = lambda m: FLOORS[m.partition(".")[0]]  # noqa: E731
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if floor(d) > floor(m)
                  or (floor(d) == floor(m) and d.partition(".")[0] != m.partition(".")[0]))


def test_every_import_points_down():
    """runtime imports nothing of the course above it, kernels only the runtime, utils (the
    learner's front door) the two below it; tools and benchmarks stand on all three."""
    climbing = _climbing(_import_graph(_sources()))
    assert not climbing, "imports that climb a floor:\n" + "\n".join(climbing)


@pytest.mark.parametrize("module, lazy_import", [
    # circles the layout removed, put back as the lazy imports they would be
    ("runtime.backends.numba.races", "from .simulator import _describe_site"),
    ("kernels.frames.layernorm", "import utils"),  # utils.topics.layernorm reads its EPS
    ("utils.gpt", "import utils"),
])
def test_the_circle_check_finds_a_lazy_import_that_closes_a_circle(module, lazy_import):
    sources = _sources()
    text, is_pkg = sources[module]
    sources[module] = (text + f"\n\ndef _late():\n    {lazy_import}\n", is_pkg)
    cycles = _cycles(_import_graph(sources))
    assert any(module in c for c in cycles), cycles


@pytest.mark.parametrize("module, upward", [
    ("runtime.config", "import kernels"),
    ("kernels.cuda.relu", "from utils.topics import relu"),
    ("utils.bench", "from benchmarks import sources"),
])
def test_the_floor_check_finds_an_import_that_climbs(module, upward):
    sources = _sources()
    text, is_pkg = sources[module]
    sources[module] = (text + f"\n\ndef _late():\n    {upward}\n", is_pkg)
    assert any(c.startswith(module + " -> ") for c in _climbing(_import_graph(sources)))


#: The kernels' languages: each has a folder kernels/<lang>/ of topic modules.
LANGUAGES = ("cuda", "numba", "triton")


def _crossings(graph) -> list[str]:
    """Imports that break the kernels' layout: a frame (``kernels.frames.*``) that imports more of
    the course than the runtime, ``kernels._launch`` and other frames, or a language's module
    that imports another language's module (a frame is imported from ``kernels.frames``)."""
    out = []
    for m, deps in graph.items():
        parts = m.split(".")
        if parts[0] != "kernels" or len(parts) < 2:
            continue
        for d in deps:
            dparts = d.split(".")
            if parts[1] == "frames":
                ok = dparts[0] == "runtime" or d == "kernels._launch" or dparts[:2] == ["kernels", "frames"]
            elif parts[1] in LANGUAGES:
                ok = not (dparts[0] == "kernels" and len(dparts) > 1 and dparts[1] in LANGUAGES
                          and dparts[1] != parts[1])
            else:
                ok = True
            if not ok:
                out.append(f"{m} -> {d}")
    return sorted(out)


def test_frames_are_language_neutral():
    """A topic's frame (kernels/frames/<topic>.py: input rules, the steps around the kernels,
    shared constants, references) stands on the runtime and ``kernels._launch`` only; the CUDA
    C++, Numba and Triton modules take it from there, never from another language's module."""
    sources = _sources(("kernels",))
    assert "kernels.frames.softmax" in sources
    crossings = _crossings(_import_graph(sources))
    assert not crossings, "imports across the kernels' languages:\n" + "\n".join(crossings)


@pytest.mark.parametrize("module, crossing", [
    ("kernels.frames.softmax", "from kernels.cuda.softmax import kernel"),
    ("kernels.frames.attention", "import kernels.triton.attention"),
    ("kernels.numba.softmax", "from kernels.cuda.softmax import softmax_frame"),
    ("kernels.triton.layernorm", "from kernels.numba import layernorm"),
])
def test_the_frame_check_finds_an_import_across_languages(module, crossing):
    sources = _sources(("kernels",))
    text, is_pkg = sources[module]
    sources[module] = (text + f"\n\ndef _late():\n    {crossing}\n", is_pkg)
    assert any(c.startswith(module + " -> ") for c in _crossings(_import_graph(sources)))


def test_the_moved_modules_keep_the_flat_api():
    for name in ("cuda_kernel", "load_inline", "emulation_schedule", "race_detection", "KernelFault",
                 "SimulatorRaceError", "profile", "Profile", "check_relu", "check_softmax", "GradingError",
                 "to_numba", "triton_compat", "record_launches", "backend_of"):
        assert hasattr(utils, name), name


# --------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------
from copy_kernels import copy_kernel, copy_tl_kernel  # noqa: E402

import triton  # noqa: E402  (after utils: it sets up the simulators)
import triton.language as tl  # noqa: E402


@triton.jit
def all_write_one(y_ptr):
    tl.store(y_ptr + tl.arange(0, 2) * 0, tl.program_id(0) + tl.zeros((2,), tl.float32))


def test_backend_of_names_each_kind_and_refuses_a_plain_function():
    assert utils.backend_of(copy_kernel).name == "numba"
    assert utils.backend_of(copy_tl_kernel).name == "triton"
    for b in utils.BACKENDS:
        assert isinstance(b, utils.Backend)
    with pytest.raises(TypeError, match="utils.cuda_kernel, numba.cuda.jit or triton.jit"):
        utils.backend_of(lambda x: x)
    with pytest.raises(TypeError, match="profile\\(\\) takes a kernel"):
        utils.profile(lambda x: x, 1, 1)


def test_launch_and_record_through_the_interface():
    x = torch.arange(40, dtype=torch.float32, device=utils.DEVICE)
    y1, y2 = torch.zeros_like(x), torch.zeros_like(x)
    with utils.record_launches() as seen:
        utils.backend_of(copy_kernel).launch(copy_kernel, 2, 32, utils.to_numba(x), utils.to_numba(y1), 40)
        utils.backend_of(copy_tl_kernel).launch(copy_tl_kernel, (3,), x, y2, 40, BLOCK_SIZE=16)
    assert [(k.backend, k.name) for k in seen.kernels] == [("numba", "copy_kernel"), ("triton", "copy_tl_kernel")]
    assert torch.equal(y1, x) and torch.equal(y2, x)
    # what the simulators do with the tensors inside a launch is not the caller's torch work
    assert not seen.computing_ops(), seen
    # nothing is recorded outside the block
    copy_tl_kernel[(3,)](x, y2, 40, BLOCK_SIZE=16)
    assert len(seen.kernels) == 2


def test_race_detection_switch_of_the_simulators():
    y = torch.zeros(1, device=utils.DEVICE)
    b = utils.backend_of(all_write_one)
    if not utils.SIMULATE:
        pytest.skip("race detection runs in simulation")
    with pytest.raises(utils.SimulatorRaceError):
        with b.race_detection(True):
            b.launch(all_write_one, (2,), y)
    with b.race_detection(False):
        b.launch(all_write_one, (2,), y)  # the same race, unchecked


def _layout_rows() -> list[str]:
    """The paths in CONTRIBUTING.md's layout table and its module tables (first column)."""
    import re
    text = (ROOT / "CONTRIBUTING.md").read_text()
    layout = text[text.index("## Layout"):text.index("\n## ", text.index("## Layout") + 1)]
    rows = []
    for section, folder in ((layout.split("### The house")[0], ""),
                            (layout.split("#### The runtime, `runtime/`")[1].split("####")[0], "runtime/"),
                            (layout.split("#### The front door, `utils/`")[1].split("###")[0], "utils/")):
        for line in section.splitlines():
            m = re.match(r"\| (`[^|]*`) \|", line)
            if m:
                rows += [folder + p for p in re.findall(r"`([^`]+)`", m.group(1))]
    return rows


def test_the_layout_tables_match_the_tree():
    """Every path CONTRIBUTING.md's layout tables name exists (``<topic>`` and ``NN_topic``: at
    least one file fits), and every package of the house has a row."""
    rows = _layout_rows()
    assert len(rows) > 30, rows
    missing = []
    for p in rows:
        pattern = p.replace("<topic>", "*").replace("NN_topic", "[0-9][0-9]_*").replace("{cuda,numba,triton}", "*")
        if not list(ROOT.glob(pattern.rstrip("/"))):
            missing.append(p)
    assert not missing, f"CONTRIBUTING.md names paths that are not in the tree: {missing}"
    named = {p.split("/")[0] for p in rows}
    assert set(FLOORS) - {"tests"} <= named, set(FLOORS) - named
    for pkg in ("runtime", "utils"):
        modules = {p.name for p in (ROOT / pkg).iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
        listed = {r.split("/")[1] for r in rows if r.startswith(pkg + "/") and r.count("/") >= 1}
        unlisted = sorted(modules - listed - {"__init__.py"})
        assert not unlisted, f"{pkg}/ modules missing from CONTRIBUTING's tables: {unlisted}"
