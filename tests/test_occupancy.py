"""utils.occupancy: the CUDA occupancy calculator's rules, checked on values worked out by hand.

H100 (sm_90): 64 warps, 32 blocks, 65536 registers (4 quadrants of 16384) and 228 KiB of shared
memory per SM; registers go to warps in units of 256; the driver reserves 1 KiB per block.
"""
import pytest

import utils
from runtime.occupancy import GPUS, KIB


def test_256_threads_32_registers_is_full_and_limited_by_warps():
    # 8 warps per block: 64 / 8 = 8 blocks by warp slots. 32 x 32 = 1024 registers per warp,
    # 16384 / 1024 = 16 warps per quadrant, 64 per SM: 8 blocks by registers too (a tie, which
    # names warps: more registers per thread than 32 would start to cost).
    o = utils.occupancy(256, registers_per_thread=32)
    assert o.blocks_by == {"warps": 8, "blocks": 32, "registers": 8, "shared memory": 228}
    assert (o.active_blocks_per_sm, o.active_warps_per_sm) == (8, 64)
    assert o.theoretical == 1.0 and o.limiter == "warps"
    assert o.gpu.name == "H100" and o.why_none is None


def test_64_registers_halves_occupancy():
    # 64 x 32 = 2048 registers per warp: 8 warps per quadrant, 32 per SM, 4 blocks of 8 warps.
    o = utils.occupancy(256, registers_per_thread=64)
    assert o.blocks_by["registers"] == 4 and o.active_warps_per_sm == 32
    assert o.theoretical == 0.5 and o.limiter == "registers"


def test_255_registers_leaves_one_block():
    # 255 x 32 = 8160, rounded up to 8192 per warp: 2 warps per quadrant, 8 per SM = one block.
    o = utils.occupancy(256, registers_per_thread=255)
    assert o.registers_per_warp == 8192
    assert o.active_blocks_per_sm == 1 and o.theoretical == 0.125 and o.limiter == "registers"


def test_register_allocation_unit_rounds_up():
    # 33 registers: 1056 per warp, allocated as 1280, the same as 40 registers.
    assert utils.occupancy(64, 33).registers_per_warp == 1280 == utils.occupancy(64, 40).registers_per_warp


def test_registers_are_counted_per_quadrant():
    # 40 registers: 1280 per warp. A quadrant holds 16384 // 1280 = 12 warps, the SM 48 (not
    # 65536 // 1280 = 51): 24 blocks of 2 warps, 75 %.
    o = utils.occupancy(64, registers_per_thread=40)
    assert o.blocks_by["registers"] == 24 and o.active_warps_per_sm == 48
    assert o.theoretical == 0.75 and o.limiter == "registers"


def test_96_threads_round_down_to_whole_blocks_of_warps():
    # 3 warps per block: 64 // 3 = 21 blocks, 63 warps of 64.
    o = utils.occupancy(96)
    assert o.warps_per_block == 3 and o.active_blocks_per_sm == 21
    assert o.active_warps_per_sm == 63 and o.theoretical == pytest.approx(63 / 64)
    assert o.limiter == "warps"


def test_a_partial_warp_takes_a_whole_warp_slot():
    # 100 threads take 4 warps (28 lanes idle): 16 blocks, all 64 warp slots, 1600 threads.
    o = utils.occupancy(100)
    assert o.warps_per_block == 4 and o.active_blocks_per_sm == 16 and o.theoretical == 1.0


def test_48_kib_of_shared_memory_limits_blocks():
    # 48 KiB + 1 KiB reserved = 50176 bytes per block; 228 KiB = 233472 holds 4 of them.
    o = utils.occupancy(256, 32, shared_per_block=48 * KIB)
    assert o.shared_allocated_per_block == 50176
    assert o.blocks_by["shared memory"] == 4 and o.active_warps_per_sm == 32
    assert o.theoretical == 0.5 and o.limiter == "shared memory"
    # The A100 has 164 KiB = 167936 bytes: 3 blocks, 24 warps.
    a = utils.occupancy(256, 32, shared_per_block=48 * KIB, gpu="A100")
    assert a.active_blocks_per_sm == 3 and a.theoretical == 0.375


def test_shared_memory_rounds_up_to_the_allocation_unit():
    # 100 + 1024 bytes -> 1152 (9 x 128) on sm_90; 100 -> 256 on sm_75 (no reserve, 256 unit).
    assert utils.occupancy(32, shared_per_block=100).shared_allocated_per_block == 1152
    assert utils.occupancy(32, shared_per_block=100, gpu="T4").shared_allocated_per_block == 256


def test_a_block_of_one_thread_is_limited_by_the_block_count():
    # One warp per block, 32 blocks per SM at most: 32 of 64 warps.
    o = utils.occupancy(1)
    assert o.active_blocks_per_sm == 32 and o.theoretical == 0.5 and o.limiter == "blocks"
    # An L4 (sm_89) holds 24 blocks and 48 warps: the same 50 %.
    lo = utils.occupancy(1, gpu="L4")
    assert lo.active_blocks_per_sm == 24 and lo.theoretical == 0.5 and lo.limiter == "blocks"


def test_other_gpus():
    # T4: 32 warps per SM, 256 threads -> 4 blocks by warps; 64 registers -> 8 warps per
    # quadrant, 32 per SM -> still 4 blocks: full.
    t4 = utils.occupancy(256, 64, gpu="T4")
    assert t4.active_blocks_per_sm == 4 and t4.theoretical == 1.0 and t4.limiter == "warps"
    # RTX 4090 (sm_89, same limits as L4): 48 warps; 1024 threads -> 1 block, 32 of 48 warps.
    r = utils.occupancy(1024, 32, gpu="RTX 4090")
    assert r.gpu.arch == "sm_89" and r.active_blocks_per_sm == 1
    assert r.theoretical == pytest.approx(32 / 48) and r.limiter == "warps"


def test_carveout_as_configured_by_the_driver():
    # 16 KiB configured: 16 blocks of 1 KiB (the reserve) -> shared memory limits 1-thread blocks.
    o = utils.occupancy(1, carveout=16 * KIB)
    assert o.shared_config == 16 * KIB and o.blocks_by["shared memory"] == 16
    assert o.theoretical == 0.25 and o.limiter == "shared memory"
    # A value between steps is rounded up to the next step (20 KiB -> 32 KiB).
    assert utils.occupancy(1, carveout=20 * KIB).shared_config == 32 * KIB
    # A carveout too small for one block is raised to the step that holds it: 40 KiB + 1 KiB
    # needs 64 KiB, which holds one block.
    big = utils.occupancy(256, shared_per_block=40 * KIB, carveout=8 * KIB)
    assert big.shared_config == 64 * KIB and big.active_blocks_per_sm == 1


def test_launches_that_cannot_run_have_zero_occupancy_and_say_why():
    # 1024 threads x 128 registers = 131072 > 65536 registers per block.
    o = utils.occupancy(1024, 128)
    assert o.active_blocks_per_sm == 0 and o.theoretical == 0 and o.limiter == "registers"
    assert "launch fails" in o.why_none
    # 228 KiB + the 1 KiB reserve is more than the 227 KiB a block may opt into.
    s = utils.occupancy(32, shared_per_block=228 * KIB)
    assert s.theoretical == 0 and s.limiter == "shared memory"
    assert str(227 * KIB) in s.why_none
    # 227 KiB exactly fits: one block.
    assert utils.occupancy(32, shared_per_block=227 * KIB).active_blocks_per_sm == 1


@pytest.mark.parametrize("kwargs, words", [
    (dict(block_size=0), "block_size"),
    (dict(block_size=1025), "1024"),
    (dict(block_size=256.0), "integer"),
    (dict(block_size=True), "integer"),
    (dict(block_size=256, registers_per_thread=256), "255"),
    (dict(block_size=256, registers_per_thread=-1), "registers_per_thread"),
    (dict(block_size=256, shared_per_block=-4), "shared_per_block"),
    (dict(block_size=256, gpu="GTX 480"), "unknown GPU"),
])
def test_bad_input_is_a_clear_error(kwargs, words):
    with pytest.raises(ValueError, match=words):
        utils.occupancy(**kwargs)


def test_gpu_names_and_arches_both_work():
    assert utils.occupancy(128, gpu="sm_80").gpu.name == "A100"
    assert utils.occupancy(128, gpu="h100").gpu is utils.occupancy(128, gpu="sm90").gpu
    assert utils.occupancy(128, gpu=GPUS["T4"]).gpu.arch == "sm_75"
    assert GPUS["H100"].compute_capability == (9, 0) and GPUS["RTX 5090"].compute_capability == (12, 0)


def test_gpu_table_is_self_consistent():
    for g in GPUS.values():
        assert g.max_warps_per_sm * 32 == g.max_threads_per_sm
        assert max(g.shared_carveouts) * KIB == g.shared_per_sm
        assert g.shared_per_block <= g.shared_per_block_optin <= g.shared_per_sm
        assert g.registers_per_sm % (g.sub_partitions * g.register_allocation_unit) == 0


def test_limits_use_nsight_compute_metric_names():
    o = utils.occupancy(256, 64)
    assert o.limits == {"launch__occupancy_limit_warps": 8, "launch__occupancy_limit_blocks": 32,
                        "launch__occupancy_limit_registers": 4,
                        "launch__occupancy_limit_shared_mem": 228}
    assert o.metrics["sm__maximum_warps_per_active_cycle_pct"] == 50.0


def test_display():
    o = utils.occupancy(256, 64, gpu="A100")
    text = repr(o)
    assert "50.0 %" in text and "limited by registers" in text and "A100" in text
    assert "Block limit registers" in text
    page = o._repr_html_()
    assert page.startswith("<b>") and "<table>" in page and "Block limit shared memory" in page


def _recorded(name):
    return utils.SIMULATOR_RESULTS_DIR / name


def _recorded_ncu_cases():
    import json
    path = _recorded("ncu-h100.json")
    if not path.exists():
        return []
    rec = json.loads(path.read_text())
    return [pytest.param(c["ncu"], id=name) for name, c in rec.get("cases", {}).items()
            if "launch__occupancy_limit_warps" in c.get("ncu", {})]


def _bytes(v):
    # ncu's raw page may scale shared memory to Kbyte (1.02 for 1024 bytes): back to bytes
    return int(round(v * 1000)) if isinstance(v, float) and v != int(v) else int(v or 0)


@pytest.mark.parametrize("ncu", _recorded_ncu_cases() or [pytest.param(None, marks=pytest.mark.skip(
    reason="benchmarks/results/simulators/ncu-h100.json is not recorded in this copy"))])
def test_agrees_with_nsight_compute_on_the_h100(ncu):
    """The launches recorded under Nsight Compute on the H100: the same limits and occupancy
    from the same block size, registers and shared memory, with the shared-memory limit counted
    against the carveout the driver configured for the launch (launch__shared_mem_config_size)."""
    if "launch__block_size" not in ncu:
        pytest.skip("this recording has no launch__block_size")
    smem = _bytes(ncu.get("launch__shared_mem_per_block_static")) + \
        _bytes(ncu.get("launch__shared_mem_per_block_dynamic"))
    block, regs = int(ncu["launch__block_size"]), int(ncu["launch__registers_per_thread"])
    o = utils.occupancy(block, regs, smem, carveout=ncu.get("launch__shared_mem_config_size"))
    assert o.limits == {k: ncu[k] for k in o.limits}
    assert 100 * o.theoretical == pytest.approx(ncu["sm__maximum_warps_per_active_cycle_pct"], abs=0.1)
    # at the calculator's default (largest) carveout the shared-memory limit is never lower
    default = utils.occupancy(block, regs, smem)
    assert default.limits["launch__occupancy_limit_shared_mem"] >= ncu["launch__occupancy_limit_shared_mem"]


def _ncu_curve(text, title):
    """The values of one "Impact of Varying ..." table of Nsight Compute's occupancy section."""
    import re
    i = text.index(f"Table Name : {title}")
    body = text[text.index("(", i) + 1:text.index(")", i)]
    return [float(v) for v in re.split(r"[;\s]+", body) if v]


def test_agrees_with_nsight_compute_occupancy_curves():
    """ncu's occupancy section of sum_interleaved_kernel on the H100 (256 threads, 16 registers,
    1 KiB of dynamic shared memory, a 32 KiB carveout) tabulates the occupancy, in whole
    percent, for every register count from 0 to 256 and every block size from 0 to 1024 in
    steps of 16: the calculator must give the same at each."""
    import re
    path = _recorded("ncu-h100-sections.txt")
    if not path.exists():
        pytest.skip(f"benchmarks/results/simulators/{path.name} is not recorded in this copy")
    text = path.read_text()

    def value(label):
        return float(re.search(rf"^\s*{label}\s+(?:\S+\s+)?([\d.,]+)\s*$", text, re.M).group(1).replace(",", ""))
    block, regs = int(value("Block Size")), int(value("Registers Per Thread"))
    # ncu prints these in Kbyte (1000 bytes) with two decimals: 1.02, 32.77. Shared memory is
    # allocated in units of 128 bytes, so the nearest multiple of 128 is the exact value.
    smem = 128 * round(1000 * value("Dynamic Shared Memory Per Block") / 128)
    carveout = 128 * round(1000 * value("Shared Memory Configuration Size") / 128)
    assert (smem, carveout) == (1024, 32 * 1024)
    assert (block, regs) == (256, 16)

    def pct(b, r):
        return int(100 * utils.occupancy(b, r, smem, carveout=carveout).theoretical)
    by_regs = _ncu_curve(text, "Impact of Varying Register Count Per Thread")
    assert len(by_regs) == 257
    assert [pct(block, r) for r in range(1, 256)] == by_regs[1:256]
    by_block = _ncu_curve(text, "Impact of Varying Block Size")
    assert len(by_block) == 65
    assert [pct(16 * k, regs) for k in range(1, 65)] == by_block[1:]
