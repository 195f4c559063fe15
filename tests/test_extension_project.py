"""The setup.py project in extensions/relu builds in the current mode and passes its own tests.

The build takes tens of seconds, so it happens once (a module-scoped fixture, in a temporary
copy of the project so the repository stays clean), and the project's own test file runs
against the result in a fresh interpreter, as a user would run it.
"""
import glob
import os
import shutil
import subprocess
import sys

import pytest

import utils

PROJECT = utils.ROOT / "extensions" / "relu"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(utils.ROOT), env.get("PYTHONPATH", "")] if p)
    return env


@pytest.fixture(scope="module")
def built_project(tmp_path_factory):
    proj = tmp_path_factory.mktemp("myrelu") / "relu"
    shutil.copytree(PROJECT, proj, ignore=shutil.ignore_patterns("build", "*.so", "__pycache__", "*.egg-info"))
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=proj, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"build failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return proj, r.stdout + r.stderr


def test_build_produces_objects_and_an_importable_library(built_project):
    proj, log = built_project
    objects = sorted(os.path.basename(p) for p in glob.glob(str(proj / "build" / "temp.*" / "**" / "*.o"),
                                                            recursive=True))
    # one object per source; in emulation relu_kernel.cu is first translated to relu_kernel.cu.cpp
    assert len(objects) == 2 and objects[0] == "relu.o" and objects[1].startswith("relu_kernel."), objects
    import importlib.machinery
    libs = glob.glob(str(proj / "myrelu*.so"))
    assert len(libs) == 1, libs
    assert any(libs[0].endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES), libs[0]
    assert glob.glob(str(proj / "build" / "lib.*" / "myrelu*.so")), "the library in build/lib.* is missing"


def test_project_tests_pass(built_project):
    proj, _ = built_project
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_relu_ext.py"],
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
