"""Writes kernels/cuda/hopper_wgmma.h: the inline-PTX wrappers of wgmma.mma_async, one per
N and input type (PTX names the shape in the instruction, and inline asm names each of the
N / 2 accumulator registers of a thread). Run it after changing the list below:

    python tools/gen_wgmma.py
"""
from __future__ import annotations

from pathlib import Path

SHAPES = (16, 32, 64, 128, 256)
TYPES = (("__nv_bfloat16", "bf16"), ("__half", "f16"))
OUT = Path(__file__).resolve().parents[1] / "kernels" / "cuda" / "hopper_wgmma.h"


def wrapper(ctype: str, ptx: str, n: int) -> str:
    r = n // 2
    regs = ", ".join(f"%{i}" for i in range(r))
    cons = ",\n                       ".join(", ".join(f'"+f"(d[{i}])' for i in range(j, min(j + 8, r)))
                                              for j in range(0, r, 8))
    return f"""template <> struct Wgmma<{n}, {ctype}> {{
    __device__ __forceinline__ static void run(float (&d)[{r}], uint64_t a, uint64_t b, int scale_d) {{
        asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 2}, 0;\\n"
                     "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "
                     "{{{regs}}}, %{r}, %{r + 1}, p, 1, 1, 0, 0;\\n}}\\n"
                     : {cons}
                     : "l"(a), "l"(b), "r"(scale_d));
    }}
}};
"""


def main() -> None:
    head = ("// hopper_wgmma.h: wgmma.mma_async m64nNk16 with float accumulators, K-major A and B in\n"
            "// shared memory (descriptors), scale-d from a register. Written by tools/gen_wgmma.py;\n"
            "// included by hopper.h on a GPU (the emulator has its own wgmma).\n#pragma once\n\n")
    OUT.write_text(head + "\n".join(wrapper(c, p, n) for c, p in TYPES for n in SHAPES))


if __name__ == "__main__":
    main()
