"""The backend switch, the problem sizes and the kernel loader."""
import os
import subprocess
import sys

import pytest
import torch

import kernels
import utils
from utils import config

ROOT = str(utils.ROOT)


def _run(code, **env):
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)


def test_mode_matches_the_machine():
    if os.environ.get(config.ENV_SIMULATE) == "1" or not torch.cuda.is_available():
        assert utils.SIMULATE and utils.DEVICE == torch.device("cpu") and utils.MODE == "simulation"
    else:
        assert not utils.SIMULATE and utils.DEVICE.type == "cuda" and utils.MODE == "gpu"
    # numba and triton were switched to match before they were imported
    assert os.environ["NUMBA_ENABLE_CUDASIM"] == ("1" if utils.SIMULATE else "0")
    assert os.environ["TRITON_INTERPRET"] == ("1" if utils.SIMULATE else "0")


def test_env_var_forces_simulation():
    out = _run("import utils, numba.cuda as c; "
               "print(utils.MODE, utils.DEVICE, c.simulator_enabled if hasattr(c, 'simulator_enabled') else 'sim')",
               COURSE_SIMULATE="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["simulation", "cpu"]
    from numba import config as nb_config
    assert nb_config.ENABLE_CUDASIM == (1 if utils.SIMULATE else 0)


def test_importing_numba_first_is_a_clear_error_when_modes_differ():
    # In a process where numba was imported with the opposite switch, `import utils` refuses
    # with a message that says what to do, instead of silently using the wrong backend.
    opposite = "0" if utils.SIMULATE else "1"
    out = _run("import numba, utils", NUMBA_ENABLE_CUDASIM=opposite,
               COURSE_SIMULATE="1" if utils.SIMULATE else "")
    assert out.returncode != 0
    assert "Restart the kernel and run `import utils` first" in out.stderr


def test_every_mode_has_the_same_size_keys():
    gpu, sim = config.PROBLEM_SIZES["gpu"], config.PROBLEM_SIZES["simulation"]
    assert gpu.keys() == sim.keys()
    assert vars(utils.SIZES) == config.PROBLEM_SIZES[utils.MODE]
    # simulated sizes are the small ones
    assert sim["elementwise_n"] < gpu["elementwise_n"] and sim["bench_n"] < gpu["bench_n"]


def test_describe_says_which_mode():
    assert ("SIMULATION" in utils.describe()) == utils.SIMULATE


def test_kernel_loader_errors_are_clear():
    with pytest.raises(ValueError, match="lang must be one of"):
        kernels.module("relu", "cobol")
    with pytest.raises(ModuleNotFoundError):
        kernels.module("no_such_topic", "triton")
