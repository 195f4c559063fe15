"""The setup.py project in extensions/relu builds in the current mode and passes its own tests.

The build takes tens of seconds, so it happens once (a module-scoped fixture) and in the folder
lesson 02 builds the project in, .cache/extensions/relu (git-ignored, so the repository stays
clean): whichever of the notebook and this file runs second finds the build up to date, and
utils.extension.BuildExtension lets one build at a time into the folder. The project's own test
file runs against the result in a fresh interpreter, as a user would run it.
"""
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import runtime
import utils

PROJECT = utils.ROOT / "extensions" / "relu"
#: Where lesson 02 copies the project to build it.
BUILD_COPY = runtime.paths.CACHE_DIR / "extensions" / "relu"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(utils.ROOT), env.get("PYTHONPATH", "")] if p)
    return env


def _copy_changed_files(src, dst):
    """Copy the project as lesson 02 does (with the files' times, which the build compares),
    but only the files that differ: a file rewritten while the notebook compiles it could be
    read half-written."""
    def copy_if_changed(s, d):
        if not os.path.exists(d) or Path(s).read_bytes() != Path(d).read_bytes():
            shutil.copy2(s, d)
        return d
    shutil.copytree(src, dst, dirs_exist_ok=True, copy_function=copy_if_changed,
                    ignore=shutil.ignore_patterns("build", "*.so", "__pycache__", "*.egg-info"))


@pytest.fixture(scope="module")
def built_project():
    proj = BUILD_COPY
    _copy_changed_files(PROJECT, proj)
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=proj, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"build failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return proj, r.stdout + r.stderr


def test_build_produces_objects_and_an_importable_library(built_project):
    proj, log = built_project
    # (pathlib: glob's ** skips the hidden folders of the path, .cache/ among them)
    objects = sorted(p.name for temp in (proj / "build").glob("temp.*") for p in temp.rglob("*.o"))
    # one object per source; in emulation relu_kernel.cu is first translated to relu_kernel.cu.cpp
    assert len(objects) == 2 and objects[0] == "relu.o" and objects[1].startswith("relu_kernel."), objects
    import importlib.machinery
    libs = glob.glob(str(proj / "myrelu*.so"))
    assert len(libs) == 1, libs
    assert any(libs[0].endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES), libs[0]
    assert glob.glob(str(proj / "build" / "lib.*" / "myrelu*.so")), "the library in build/lib.* is missing"
    assert not list(proj.glob("*.cu.cpp")), "the translated sources belong in the build folder"


def test_project_tests_pass(built_project):
    proj, _ = built_project
    # As a project of its own: without the course's pytest options (its build folder lies inside
    # the course, whose pyproject.toml would start two xdist workers) and notebook plugin.
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                        "-p", "no:xdist", "-p", "no:nbval", "test_relu_ext.py"],
                       cwd=proj, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout, r.stdout[-2000:]


def test_project_launches_on_pytorchs_current_stream():
    """A bare ``<<<blocks, threads>>>`` launches on the legacy default stream, out of order
    with a caller's ``torch.cuda.stream(s)`` or CUDA graph: every launch in the project must
    name PyTorch's current stream, as lesson 02 advises."""
    import re

    launches = []
    for cu in sorted(PROJECT.glob("*.cu")):
        text = re.sub(r"//[^\n]*", "", cu.read_text())  # launches, not comments about them
        launches += [(cu.name, cfg) for cfg in re.findall(r"<<<(.*?)>>>", text, flags=re.S)]
    assert launches, "no <<<...>>> launch found in the project's .cu files"
    for name, cfg in launches:
        args = [a.strip() for a in cfg.split(",")]
        assert len(args) == 4 and args[3] == "at::cuda::getCurrentCUDAStream()", (
            f"{name}: <<<{cfg}>>> does not launch on at::cuda::getCurrentCUDAStream()")
