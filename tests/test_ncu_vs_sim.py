"""The course's profiler against Nsight Compute: the simulated counters of every case of
benchmarks/simulators/ncu_patterns.py, recomputed here, agree with the H100's recorded ones
(benchmarks/results/simulators/ncu-h100.json) within 10%, exactly for the simple patterns, and
with the comparison table committed in benchmarks/results/simulators/ncu-vs-sim.json."""
import json

import pytest

import utils
from benchmarks.simulators import ncu_vs_sim as cmp
from benchmarks.simulators.ncu_patterns import CASES

pytestmark = pytest.mark.skipif(not utils.SIMULATE, reason="compares the simulation with recorded GPU counters")

RECORDED = cmp.load_ncu()
TABLE = json.loads(cmp.OUT_JSON.read_text()) if cmp.OUT_JSON.exists() else {"cases": {}}

def test_every_case_was_measured_on_the_gpu():
    assert set(CASES) <= set(RECORDED["cases"])
    assert RECORDED["gpu"].startswith("NVIDIA H100")
    assert sum(c.kind == "pattern" for c in CASES.values()) >= 12


@pytest.mark.parametrize("name", list(CASES))
def test_simulation_matches_ncu(name, request):
    case = CASES[name]
    if name in cmp.KNOWN:
        request.applymarker(pytest.mark.xfail(reason=cmp.KNOWN[name], strict=True))
    try:
        p, seconds = cmp.simulate(case)
    except NotImplementedError as e:
        pytest.skip(str(e))
    hw = cmp.ncu_values(RECORDED["cases"][name]["ncu"])
    sim = cmp.sim_values(case, p, RECORDED["cases"][name]["ncu"])
    result = cmp.compare_case(case, hw, sim)
    # the memory counters the emulator always produces for a CUDA kernel are compared, not left out
    if case.backend == "cuda":
        compared = {r["metric"] for r in result["rows"]}
        assert set(cmp.GLOBAL) <= compared, f"not compared: {set(cmp.GLOBAL) - compared}"
    bad = [f"{r['metric']}: ncu {r['ncu']}, simulation {r['sim']} ({r['verdict']})"
           for r in result["rows"] if r["verdict"].startswith("FAIL")]
    assert not bad, "\n".join(bad)
    # the committed table shows what the simulation computes now
    assert name in TABLE["cases"], ("benchmarks/results/simulators/ncu-vs-sim.json lacks this case: "
                                    "run python -m benchmarks.simulators.ncu_vs_sim")
    recorded_rows = {r["metric"]: r["sim"] for r in TABLE["cases"][name]["rows"]}
    stale = {m: (recorded_rows[m], v) for m, v in sim.items() if m in recorded_rows and recorded_rows[m] != v}
    assert not stale, f"benchmarks/results/simulators/ncu-vs-sim.json is stale for {name}: {stale}"


def test_occupancy_calculator_reproduces_every_launchs_limits():
    """Given the registers, shared memory and carveout ncu saw, utils.occupancy gives its
    four limits and its theoretical occupancy, for every recorded launch."""
    for name, rec in RECORDED["cases"].items():
        n = rec["ncu"]
        occ = cmp.occupancy_at(n["launch__block_size"], n["launch__registers_per_thread"],
                               n["launch__shared_mem_per_block_static"] + n["launch__shared_mem_per_block_dynamic"],
                               n[cmp.CONFIG])
        assert occ.limits == {k: n[k] for k in occ.limits}, name
        assert occ.theoretical * 100 == pytest.approx(n["sm__maximum_warps_per_active_cycle_pct"]), name


def test_ncu_raw_csv_rows_become_numbers():
    from benchmarks.simulators.ncu_run import parse_raw_csv
    text = "\n".join([
        "==PROF== Connected to process 1",
        '"ID","Kernel Name","l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",'
        '"smsp__thread_inst_executed_per_inst_executed.ratio"',
        '"","","sector",""',
        '"0","copy_coalesced_kernel(const float *, float *, int)","8,192","31.5"',
        '"1","relu_kernel","n/a","32"',
    ])
    rows = parse_raw_csv(text)
    assert rows == [
        {"ID": "0", "Kernel Name": "copy_coalesced_kernel(const float *, float *, int)",
         "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 8192,
         "smsp__thread_inst_executed_per_inst_executed.ratio": 31.5},
        {"ID": "1", "Kernel Name": "relu_kernel", "smsp__thread_inst_executed_per_inst_executed.ratio": 32},
    ]


def test_verdicts():
    sectors = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
    assert cmp.verdict(sectors, 100, 100, exact=True) == "exact"
    assert cmp.verdict(sectors, 100, 101, exact=True).startswith("FAIL")
    assert cmp.verdict(sectors, 100, 109, exact=False) == "ok"
    assert cmp.verdict(sectors, 100, 111, exact=False).startswith("FAIL")
    assert cmp.verdict(cmp.LANES, 18.29, 17.78, exact=True) == "ok"  # the ratio is never exact
    assert cmp.verdict(sectors, 0, 5, exact=False).startswith("FAIL")


def test_warp_aggregated_atomics_are_recognised_in_the_machine_code():
    from runtime.backends.cuda._profile import atomics_aggregated
    aggregated = """
        VOTEU.ANY UR6, UPT, PT ;
        FLO.U32 R0, UR6 ;
        POPC R9, UR6 ;
        ISETP.EQ.U32.AND P0, PT, R0, R5, PT ;
    @P0 ATOMG.E.ADD.STRONG.GPU PT, R3, desc[UR4][R2.64], R9 ;"""
    plain_float = """
        LDS R5, [UR4] ;
        REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR6][R2.64], R5 ;"""
    assert atomics_aggregated(aggregated)
    assert not atomics_aggregated(plain_float)
