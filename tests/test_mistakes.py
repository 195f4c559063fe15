"""Every exercise's typical mistakes (tests/mistakes/NN_topic.py, mutations of the solution)
are rejected by the exercise's check with a message that names the real cause, and the right
kernels written an unusual way are accepted."""
import mistakes as M
import pytest

import utils  # before numba/triton: picks the simulator or the GPU

EXERCISES = M.exercises()
ENTRIES = M.all_mistakes()


def test_every_exercise_has_a_catalog_of_eight_mistakes():
    solutions = sorted(p.stem for p in (M.ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    missing = [ex for ex in solutions if ex not in EXERCISES]
    assert not missing, f"exercises without a mistake catalog in tests/mistakes/: {missing}"
    for ex in EXERCISES:
        wrong = [m for m in M.catalog(ex) if m.verdict == "rejected"]
        assert len(wrong) >= 8, f"{ex}: {len(wrong)} mistakes in its catalog, at least 8 wanted"
        names = [m.name for m in M.catalog(ex)]
        assert len(names) == len(set(names)), f"{ex}: duplicate names"


def test_every_mutation_still_applies():
    """A changed solution can never silently skip a mistake: each old text occurs once."""
    for ex, m in ENTRIES:
        mutated = M.mutate(ex, m)
        assert mutated and all(src for src in mutated.values())
        assert m.verdict in ("rejected", "accepted")
        assert m.verdict == "accepted" or m.cause, f"{ex}/{m.name}: a mistake needs the cause to name"


def test_mutation_must_occur_exactly_once():
    m = M.Mistake("twice", "def softmax_triton_kernel", "mask", "MASK")
    with pytest.raises(M.MutationError, match="occurs .* times"):
        M.mutate("05_softmax", m)
    m = M.Mistake("gone", "def softmax_triton_kernel", "no such text", "x")
    with pytest.raises(M.MutationError, match="occurs 0 times"):
        M.mutate("05_softmax", m)


@pytest.mark.skipif(not utils.SIMULATE, reason="grades in simulation (benchmarks/simulators/sim_vs_gpu.py on a GPU)")
@pytest.mark.parametrize("ex,m", ENTRIES, ids=[f"{ex[:2]}-{m.name}" for ex, m in ENTRIES])
def test_mistake_gets_its_cause(ex, m, request):
    if m.xfail:
        request.applymarker(pytest.mark.xfail(reason=m.xfail, strict=False))
    v = M.verdict(ex, m)
    problems = M.explain(ex, m, v)
    assert not problems, "\n".join(problems)
