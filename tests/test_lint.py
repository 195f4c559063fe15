"""The linter: `ruff check` over the whole course passes, with the configuration of
pyproject.toml ([tool.ruff]: pycodestyle errors E, pyflakes F, import order I, and RUF100,
no `noqa` the linter does not need). `./course test` runs it, and so CI does.

To fix what it finds: `ruff check --fix` (import order, unused imports, stale `noqa`), then
the rest by hand. Notebooks are not linted (nbval runs every cell of them)."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_passes():
    if importlib.util.find_spec("ruff") is None and not os.environ.get("CI"):
        pytest.skip("ruff is not installed in this Python (requirements.txt installs it for ./course test and CI)")
    cmd = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", str(ROOT)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, ("ruff check found problems (fix with `ruff check --fix`, then by hand):\n"
                                  f"{proc.stdout}{proc.stderr}")


def test_ruff_config_selects_the_course_rules():
    text = (ROOT / "pyproject.toml").read_text()
    lint = text.split("[tool.ruff.lint]", 1)[1].split("\n[", 1)[0]
    select = set(re.findall(r'"(\w+)"', re.search(r"^select\s*=\s*\[(.*?)\]", lint, re.M | re.S).group(1)))
    assert {"E", "F", "I", "RUF100"} <= select
