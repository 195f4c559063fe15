"""Theoretical occupancy: how many warps of a kernel one SM can hold at once, and what stops more.

    runtime.occupancy(256, registers_per_thread=64)            # H100: 50 %, limited by registers
    runtime.occupancy(128, 32, shared_per_block=48 * 1024, gpu="A100")
    utils.GPUS["H100"].max_warps_per_sm                        # the limits of one GPU

An SM holds as many blocks as all four of its budgets allow at once: warp slots, blocks, registers
and shared memory. The smallest of the four is the limiter; occupancy is the warps of those blocks
over the most warps the SM can hold. It is a ceiling ("theoretical"): the achieved occupancy that
Nsight Compute measures is lower when blocks finish unevenly or the grid is too small to fill the
GPU.

The rules are those of the CUDA occupancy calculator as Nsight Compute's occupancy section and the
CUDA runtime's ``cudaOccupancyMaxActiveBlocksPerMultiprocessor`` apply them:
  - Nsight Compute, "Occupancy Calculator":
    https://docs.nvidia.com/nsight-compute/NsightCompute/index.html#occupancy-calculator
  - ``include/cuda_occupancy.h`` in the CUDA toolkit (the calculator's reference implementation;
    the per-architecture allocation rules below follow it);
  - CUDA C++ Programming Guide, "Compute Capabilities", table of technical specifications (the
    per-SM limits in ``GPUS``).
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

__all__ = ["occupancy", "Occupancy", "GPU", "GPUS"]

KIB = 1024
WARP_SIZE = 32


@dataclass(frozen=True)
class GPU:
    """The per-SM limits that decide occupancy on one GPU (one compute capability)."""

    name: str
    arch: str                          # "sm_90"
    max_threads_per_sm: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int              # 32-bit registers in the SM's register file
    max_registers_per_block: int
    max_registers_per_thread: int      # ptxas never assigns more
    register_allocation_unit: int      # registers are handed to a warp in chunks of this many
    register_allocation_granularity: str   # "warp": each warp gets its own rounded-up chunk
    sub_partitions: int                # an SM is 4 quadrants, each with a quarter of the registers
    warp_allocation_granularity: int   # warps of a block, rounded up to this for the register check
    shared_per_sm: int                 # bytes, at the largest carveout
    shared_carveouts: tuple            # the shared-memory sizes (KiB) the driver can configure
    shared_per_block: int              # bytes a block may use without opting in
    shared_per_block_optin: int        # bytes with cudaFuncSetAttribute(MaxDynamicSharedMemorySize)
    reserved_shared_per_block: int     # bytes the driver keeps per block (sm_80 and later: 1 KiB)
    shared_allocation_unit: int        # a block's shared memory is rounded up to this many bytes
    max_threads_per_block: int = 1024
    also: tuple = field(default=())    # other GPUs of the same compute capability

    @property
    def compute_capability(self) -> tuple:
        digits = self.arch.split("_")[1]
        return int(digits[:-1]), int(digits[-1])


_CARVEOUTS_HOPPER = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)
_CARVEOUTS_A100 = (0, 8, 16, 32, 64, 100, 132, 164)
_CARVEOUTS_100K = (0, 8, 16, 32, 64, 100)


def _gpu(name, arch, threads, blocks, shared_kib, carveouts, optin_kib, reserved, alloc_unit,
         also=()):
    return GPU(name=name, arch=arch, max_threads_per_sm=threads, max_warps_per_sm=threads // WARP_SIZE,
               max_blocks_per_sm=blocks, registers_per_sm=64 * KIB, max_registers_per_block=64 * KIB,
               max_registers_per_thread=255, register_allocation_unit=256,
               register_allocation_granularity="warp", sub_partitions=4,
               warp_allocation_granularity=4, shared_per_sm=shared_kib * KIB,
               shared_carveouts=carveouts, shared_per_block=48 * KIB,
               shared_per_block_optin=optin_kib * KIB, reserved_shared_per_block=reserved,
               shared_allocation_unit=alloc_unit, also=also)


# One row per compute capability. Threads, blocks and shared memory per SM, and the per-block
# opt-in maximum, are the Programming Guide's; carveout steps, allocation units and the driver's
# reserved 1 KiB per block (Ampere and later) are cuda_occupancy.h's.
GPUS = {g.name: g for g in (
    _gpu("V100", "sm_70", 2048, 32, 96, (0, 8, 16, 32, 64, 96), 96, 0, 256),
    _gpu("T4", "sm_75", 1024, 16, 64, (32, 64), 64, 0, 256, also=("RTX 2080",)),
    _gpu("A100", "sm_80", 2048, 32, 164, _CARVEOUTS_A100, 163, KIB, 128, also=("A30",)),
    _gpu("RTX 3090", "sm_86", 1536, 16, 100, _CARVEOUTS_100K, 99, KIB, 128, also=("A10", "A40")),
    _gpu("L4", "sm_89", 1536, 24, 100, _CARVEOUTS_100K, 99, KIB, 128,
         also=("RTX 4090", "L40S", "L40")),
    _gpu("H100", "sm_90", 2048, 32, 228, _CARVEOUTS_HOPPER, 227, KIB, 128, also=("H200", "GH200")),
    _gpu("B200", "sm_100", 2048, 32, 228, _CARVEOUTS_HOPPER, 227, KIB, 128, also=("GB200",)),
    _gpu("RTX 5090", "sm_120", 1536, 24, 100, _CARVEOUTS_100K, 99, KIB, 128),
)}


def _lookup(gpu) -> GPU:
    if isinstance(gpu, GPU):
        return gpu
    key = str(gpu).strip().lower().replace("-", " ")
    for g in GPUS.values():
        names = [g.name, g.arch, g.arch.replace("_", ""), *g.also]
        if key in (n.lower() for n in names):
            return g
    known = ", ".join(f"{g.name} ({g.arch})" for g in GPUS.values())
    raise ValueError(f"unknown GPU {gpu!r}: the occupancy table knows {known}")


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def _carveout_for(nbytes: int, g: GPU) -> int:
    """The smallest shared-memory size (bytes) the SM can be configured to that holds nbytes."""
    for kib in g.shared_carveouts:
        if kib * KIB >= nbytes:
            return kib * KIB
    return g.shared_per_sm


LIMITERS = ("warps", "blocks", "registers", "shared memory")   # ties: the first one named wins
_METRIC = {"warps": "launch__occupancy_limit_warps", "blocks": "launch__occupancy_limit_blocks",
           "registers": "launch__occupancy_limit_registers",
           "shared memory": "launch__occupancy_limit_shared_mem"}


@dataclass(frozen=True)
class Occupancy:
    """The result of ``runtime.occupancy``: blocks per SM allowed by each budget, and their minimum."""

    gpu: GPU
    block_size: int
    registers_per_thread: int
    shared_per_block: int              # bytes the kernel asked for (static + dynamic)
    warps_per_block: int
    registers_per_warp: int            # after rounding up to the allocation unit
    shared_allocated_per_block: int    # with the driver's reserved bytes, rounded to the unit
    shared_config: int                 # bytes of shared memory per SM the limit was computed with
    blocks_by: dict                    # {"warps": n, "blocks": n, "registers": n, "shared memory": n}
    active_blocks_per_sm: int
    limiter: str
    why_none: str | None = None        # why not even one block fits (the launch would fail)

    @property
    def active_warps_per_sm(self) -> int:
        return self.active_blocks_per_sm * self.warps_per_block

    @property
    def theoretical(self) -> float:
        return self.active_warps_per_sm / self.gpu.max_warps_per_sm

    @property
    def limits(self) -> dict:
        """The four limits under Nsight Compute's metric names (blocks per SM)."""
        return {_METRIC[k]: self.blocks_by[k] for k in LIMITERS}

    @property
    def metrics(self) -> dict:
        """The limits plus theoretical occupancy (%) under Nsight Compute's metric names."""
        return {**self.limits, "sm__maximum_warps_per_active_cycle_pct": 100.0 * self.theoretical}

    def _rows(self):
        g = self.gpu
        return [
            ("Block size", f"{self.block_size} threads = {self.warps_per_block} warps"),
            ("Registers per thread", f"{self.registers_per_thread} "
                                     f"({self.registers_per_warp} per warp, allocated in units of "
                                     f"{g.register_allocation_unit})"),
            ("Shared memory per block", f"{self.shared_per_block} B requested, "
                                        f"{self.shared_allocated_per_block} B allocated"),
            *((f"Block limit {k}", str(self.blocks_by[k])) for k in LIMITERS),
            ("Active blocks per SM", str(self.active_blocks_per_sm)),
            ("Active warps per SM", f"{self.active_warps_per_sm} of {g.max_warps_per_sm}"),
            ("Theoretical occupancy", f"{100 * self.theoretical:.1f} %"),
            ("Limiter", self.limiter),
        ]

    def __str__(self):
        head = (f"Theoretical occupancy on {self.gpu.name} ({self.gpu.arch}): "
                f"{100 * self.theoretical:.1f} %, limited by {self.limiter}")
        if self.why_none:
            head += f" -- {self.why_none}"
        return head

    def __repr__(self):
        width = max(len(k) for k, _ in self._rows())
        return "\n".join([str(self)] + [f"  {k:<{width}}  {v}" for k, v in self._rows()])

    def _repr_html_(self):
        rows = "".join(f"<tr><td style='text-align:left'>{html.escape(k)}</td>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
                       for k, v in self._rows())
        return f"<b>{html.escape(str(self))}</b><table>{rows}</table>"


def _check_int(name, value, lo):
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")


def occupancy(block_size: int, registers_per_thread: int = 32, shared_per_block: int = 0,
              gpu="H100", *, carveout: int | None = None) -> Occupancy:
    """Theoretical occupancy of blocks of ``block_size`` threads, each thread using
    ``registers_per_thread`` registers (``utils.cuda_resources`` tells) and each block
    ``shared_per_block`` bytes of shared memory (static plus dynamic), on ``gpu`` (a name of
    ``utils.GPUS``, one of their ``also`` names, or an arch such as ``"sm_80"``).

    ``carveout``: the bytes of shared memory per SM the driver configured (Nsight Compute's
    ``launch__shared_mem_config_size``). Left out, the calculator's default applies: the largest
    carveout, so the shared-memory limit is the most blocks that could ever fit. The driver may
    configure less for a launch that does not need it; Nsight Compute's shared-memory block limit
    then reads lower, while the occupancy it reaches stays the same.
    """
    g = _lookup(gpu)
    _check_int("block_size", block_size, 1)
    _check_int("registers_per_thread", registers_per_thread, 0)
    _check_int("shared_per_block", shared_per_block, 0)
    if block_size > g.max_threads_per_block:
        raise ValueError(f"block_size {block_size} is more than the {g.max_threads_per_block} "
                         f"threads a block can have")
    if registers_per_thread > g.max_registers_per_thread:
        raise ValueError(f"registers_per_thread {registers_per_thread}: a thread has at most "
                         f"{g.max_registers_per_thread} (ptxas spills the rest to local memory)")

    why_none = None
    # A block's threads occupy whole warps: 96 threads and 100 threads both take 4 warp slots.
    warps = -(-block_size // WARP_SIZE)
    by_warps = g.max_warps_per_sm // warps

    # Registers go to warps, in units of 256; each of the SM's 4 quadrants (sub-partitions) has a
    # quarter of the register file and holds whole warps, so the SM holds 4 x (what one quadrant
    # holds) warps, which can be fewer than register file / registers per warp.
    regs_per_warp = _round_up(registers_per_thread * WARP_SIZE, g.register_allocation_unit)
    if regs_per_warp == 0:
        by_regs = g.max_blocks_per_sm       # no registers: this budget does not limit
    else:
        per_quadrant = (g.registers_per_sm // g.sub_partitions) // regs_per_warp
        by_regs = per_quadrant * g.sub_partitions // warps
        # The launch check assumes a block's warps spread over all quadrants (rounded up to 4).
        assumed = regs_per_warp * _round_up(warps, g.warp_allocation_granularity)
        if max(assumed, regs_per_warp * warps) > g.max_registers_per_block:
            by_regs = 0
            why_none = (f"{block_size} threads x {registers_per_thread} registers is more than the "
                        f"{g.max_registers_per_block} registers a block may have: the launch fails "
                        f"(too many resources requested)")

    # Shared memory: the driver adds its reserved bytes to every block and rounds up to the
    # allocation unit; the SM's shared memory is the configured carveout.
    smem = _round_up(shared_per_block + g.reserved_shared_per_block, g.shared_allocation_unit)
    config = g.shared_per_sm if carveout is None else _carveout_for(carveout, g)
    if smem > g.shared_per_block_optin + g.reserved_shared_per_block:
        by_smem = 0
        why_none = (f"{shared_per_block} bytes of shared memory is more than the "
                    f"{g.shared_per_block_optin} a block may have on {g.name}")
    elif smem == 0:
        by_smem = g.max_blocks_per_sm       # no shared memory: this budget does not limit
    else:
        # A carveout too small for one block is raised to the next step that holds it.
        config = max(config, _carveout_for(smem, g))
        by_smem = config // smem

    blocks_by = {"warps": by_warps, "blocks": g.max_blocks_per_sm, "registers": by_regs,
                 "shared memory": by_smem}
    active = min(blocks_by.values())
    limiter = next(k for k in LIMITERS if blocks_by[k] == active)
    return Occupancy(gpu=g, block_size=block_size, registers_per_thread=registers_per_thread,
                     shared_per_block=shared_per_block, warps_per_block=warps,
                     registers_per_warp=regs_per_warp, shared_allocated_per_block=smem,
                     shared_config=config, blocks_by=blocks_by, active_blocks_per_sm=active,
                     limiter=limiter, why_none=why_none)
