"""Simulation gives the GPU's verdicts: every catalog mistake (tests/mistakes/) and every grader
test kernel (tests/grader_kernels.py), graded here in simulation, gets the verdict recorded on
the H100 in benchmarks/results/simulators/sim-vs-gpu.json
(``python3 -m benchmarks.simulators.sim_vs_gpu --record``),
except the races and undefined behaviour that only simulation catches (listed with why)."""
import json

import pytest

import utils
from benchmarks.simulators import sim_vs_gpu as svg

recorded = pytest.mark.skipif(
    not svg.OUT_JSON.exists(), reason="no recorded GPU verdicts yet: run `python3 -m benchmarks.simulators.sim_vs_gpu "
                                      "--record` on a GPU to write benchmarks/results/simulators/sim-vs-gpu.json")
in_simulation = pytest.mark.skipif(not utils.SIMULATE, reason="compares the simulation with the recorded GPU verdicts")


def _recorded():
    return json.loads(svg.OUT_JSON.read_text())


@recorded
@in_simulation
def test_recorded_on_a_gpu_with_its_commit():
    rec = _recorded()
    assert rec["mode"] == "gpu" and rec["machine"]["gpu"].startswith("NVIDIA"), rec["machine"]
    assert rec.get("commit"), "the recorded file names no commit"


@recorded
@in_simulation
def test_every_entry_was_recorded():
    keys = {f"mistake:{ex}/{m.name}" for ex, m in svg.M.all_mistakes() if not svg.M.mode_independent(ex)}
    keys |= {f"kernel:{k}" for k in svg.grader_kernels()}
    missing = sorted(keys - set(_recorded()["verdicts"]))
    assert not missing, ("not recorded on the GPU (re-run python -m benchmarks.simulators.sim_vs_gpu --record "
                         f"there): {missing}")


@recorded
@in_simulation
def test_simulation_agrees_with_the_gpu():
    """The graders' own test kernels, graded here. The catalogs' entries are graded once, by
    tests/test_mistakes.py, which requires each entry's expected verdict in simulation; the
    next test requires the same verdict of the GPU: together, simulation agrees with it."""
    sim = svg.run(only="kernel:", log=lambda *_: None)
    assert sim and all(k.startswith("kernel:") for k in sim)
    bad = svg.disagreements(sim, _recorded()["verdicts"])
    assert not bad, "simulation and GPU disagree:\n" + "\n".join(bad)


@recorded
def test_the_gpu_gave_every_catalog_entry_its_expected_verdict():
    """Every mistake the GPU recorded got the verdict its catalog expects (what
    tests/test_mistakes.py requires of simulation), except the simulation-only catches, which a
    GPU may accept."""
    gpu = _recorded()["verdicts"]
    bad = []
    for ex, m in svg.M.all_mistakes():
        key = f"mistake:{ex}/{m.name}"
        if key not in gpu:
            continue  # test_every_entry_was_recorded names it
        got = gpu[key]["verdict"]
        if got != m.verdict and not (m.sim_only and got == "accepted"):
            bad.append(f"{key}: expected {m.verdict}, the GPU gave {got} ({gpu[key]['message'][:150]})")
    assert not bad, "\n".join(bad)


def test_sim_only_entries_are_explained():
    # Races and undefined behaviour, which a GPU may not show; besides them two kinds of entry
    # are graded in simulation only, and say so: efficiency (Nsight Compute gives no bytes
    # needed) and what only the simulator requires (utils.to_numba, so one source runs everywhere).
    for key, why in svg.sim_only_reasons().items():
        assert len(why) > 20 and any(w in why for w in ("race", "undefined", "efficiency", "simulator")), (key, why)


def test_disagreement_rules():
    """A different verdict is a disagreement, except a simulation-only catch that a GPU accepts."""
    race = next(iter(svg.SIM_ONLY_KERNELS))
    sim = {"kernel:a": {"verdict": "rejected", "message": "x"},
           f"kernel:{race}": {"verdict": "rejected", "message": "race"},
           "kernel:b": {"verdict": "accepted", "message": ""}}
    gpu = {"kernel:a": {"verdict": "accepted", "message": ""}, f"kernel:{race}": {"verdict": "accepted", "message": ""},
           "kernel:b": {"verdict": "accepted", "message": ""}}
    assert [d.split(":")[1] for d in svg.disagreements(sim, gpu)] == ["a"]
    gpu[f"kernel:{race}"]["verdict"] = "rejected"
    sim[f"kernel:{race}"]["verdict"] = "accepted"   # the other way round is a disagreement
    assert len(svg.disagreements(sim, gpu)) == 2


def test_a_mode_independent_exercise_runs_no_kernel():
    """An exercise excused from the GPU's record (``MODE_INDEPENDENT``) must hold nothing that
    runs differently on a GPU: no kernel of any language, no device."""
    import re
    excused = [ex for ex in svg.M.exercises() if svg.M.mode_independent(ex)]
    for ex in excused:
        code = "\n".join(src for _, src, _, _ in svg.M._cells(ex))
        found = re.findall(r"\b(triton|numba|cuda|DEVICE|load_inline|cuda_kernel|\.jit)\b", code)
        assert not found, f"{ex} is marked MODE_INDEPENDENT but its solution uses {sorted(set(found))}"
