"""A notebook cannot switch a grader off (utils/guard.py): rebinding a grader is refused, and
replacing the harness, a topic's reference or torch's comparisons makes every later check
fail with the name of what was replaced. Each scenario runs in a fresh interpreter, as a
notebook's kernel does: what one replaces must not leak into the other tests."""
import subprocess
import sys

import pytest

import utils

SCRIPT = r'''
import sys
sys.path.insert(0, ROOT)
import utils, torch, kernels
from utils import guard

relu = kernels.get("relu", "triton")

def verdict(fn=relu):
    try:
        utils.check_relu(fn)
        return "accepted"
    except utils.GradingError as e:
        return "rejected: " + str(e).splitlines()[1 if str(e).startswith("check_relu failed") else 0]

def restore():  # test-only: put the originals back and forget the attempts
    for (label, name), value in guard._originals.items():
        owner = guard._owner(label)
        if getattr(owner, name, None) is not value:
            type.__setattr__(owner, name, value) if isinstance(owner, type) else object.__setattr__(owner, name, value)
    guard._replaced.clear()

print("honest:", verdict())

try:
    utils.check_relu = lambda *a, **k: None
    print("rebind: allowed")
except guard.GraderReplacedError as e:
    print("rebind: refused:", e)
print("after rebind:", verdict())
restore()

try:
    del utils.check_softmax
    print("delete: allowed")
except guard.GraderReplacedError as e:
    print("delete: refused")
print("after delete:", verdict())
restore()

torch.allclose = lambda *a, **k: True
print("after torch.allclose:", verdict())
restore()

torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)
print("after Tensor.__eq__:", verdict())
restore()

import utils.topics.relu as t
t.relu_ref64 = lambda x: x
print("after relu_ref64:", verdict())
restore()

import utils.grading as g
g.run_cases = lambda *a, **k: 0.0
print("after run_cases:", verdict())
restore()

print("honest again:", verdict())
print("wrong kernel:", verdict(lambda x: relu(x) + 1))
'''


@pytest.fixture(scope="module")
def lines():
    r = subprocess.run([sys.executable, "-c", f"ROOT = {str(utils.ROOT)!r}\n" + SCRIPT], capture_output=True,
                       text=True, timeout=300, cwd=utils.ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)


def test_an_honest_notebook_is_graded(lines):
    assert lines["honest"] == "accepted"
    assert lines["honest again"] == "accepted"  # the guard leaves no trace once the originals are back
    assert lines["wrong kernel"].startswith("rejected: ") and "replaced" not in lines["wrong kernel"]


def test_rebinding_or_deleting_a_grader_is_refused_and_earns_nothing(lines):
    assert lines["rebind"].startswith("refused: utils.check_relu is one of the course's graders")
    assert "utils.check_relu was replaced" in lines["after rebind"] and "earns no points" in lines["after rebind"]
    assert lines["delete"] == "refused"
    assert "utils.check_softmax was replaced" in lines["after delete"]


@pytest.mark.parametrize("key, name", [
    ("after torch.allclose", "torch.allclose"),
    ("after Tensor.__eq__", "torch.Tensor.__eq__"),
    ("after relu_ref64", "utils.topics.relu.relu_ref64"),
    ("after run_cases", "utils.grading.run_cases"),
])
def test_replacing_what_a_grader_relies_on_earns_nothing(lines, key, name):
    assert lines[key].startswith("rejected: check_relu cannot grade: "), lines[key]
    assert f"{name} was replaced" in lines[key] and "earns no points" in lines[key]
