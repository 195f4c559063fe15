"""Code that nvcc compiles compiles in the course: NVRTC gets the C standard headers, and the
host code that no kernel uses is set aside (runtime/backends/cuda/nvrtc_compat.py)."""
import platform
import sys

import numpy as np
import pytest
import torch

import utils
from runtime.backends.cuda import _toolchain as tc

needs_nvrtc = pytest.mark.skipif(
    tc.nvrtc() is None and not (sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")),
    reason="NVIDIA publishes no NVRTC wheel for this platform")

# One use of each header, as a kernel would write it (both the C and the C++ name).
USES = {
    "float.h": "x[0] = FLT_MAX + FLT_EPSILON + (float)DBL_MAX + FLT_MIN;",
    "limits.h": "x[0] = INT_MAX + UINT_MAX + LLONG_MIN + CHAR_BIT;",
    "stdint.h": "uint32_t a = UINT32_MAX; int64_t b = INT64_MIN; uint8_t c = 1; x[0] = a + b + c + SIZE_MAX;",
    "stdlib.h": "int *p = (int *)malloc(4); free(p); x[0] = abs(-3) + EXIT_FAILURE + RAND_MAX;",
    "stdio.h": 'printf("%f\\n", x[0]); FILE *f = nullptr; x[0] = (f == nullptr) + EOF;',
    "string.h": "memcpy(x, x + 1, sizeof(float)); memset(x + 2, 0, sizeof(float));",
    "assert.h": "assert(x[0] == x[0]);",
    "math.h": "x[0] = M_PI + M_SQRT2 + M_E + M_LN2 + M_1_PI + sqrtf(2.0f) + isnan(x[1]) + HUGE_VALF;",
}
CXX = {"float.h": "cfloat", "limits.h": "climits", "stdint.h": "cstdint", "stdlib.h": "cstdlib",
       "stdio.h": "cstdio", "string.h": "cstring", "assert.h": "cassert", "math.h": "cmath"}


@needs_nvrtc
@pytest.mark.parametrize("header", [h for pair in CXX.items() for h in pair])
def test_nvrtc_has_each_c_header(header):
    use = USES[header] if header in USES else USES[next(c for c, cxx in CXX.items() if cxx == header)]
    src = f"#include <{header}>\n__global__ void k(float *x) {{ {use} }}\n"
    tc.nvrtc_check(src, "k", "k.cu", None)  # raised "cannot open source file" before


def test_headers_compile_and_run_in_the_emulator_and_nvrtc(tmp_path):
    # llm.c's dev/cuda/common.h includes <float.h> (and <stdlib.h>, <stdio.h>): a header of
    # the kernel's folder that includes a C header must work as well as the kernel itself.
    (tmp_path / "common_util.h").write_text(
        "#pragma once\n#include <float.h>\n#include <stdlib.h>\n#include <stdio.h>\n"
        "#include <stdint.h>\n#include <math.h>\n#define NEG_INF (-FLT_MAX)\n"
        "void host_check(int ok);  // declared for the host code of the file, defined elsewhere\n"
        "static inline void die(const char *what) { fprintf(stderr, \"%s\\n\", what); exit(1); }\n")
    (tmp_path / "k.cu").write_text(
        '#include <limits.h>\n#include <string.h>\n#include <assert.h>\n#include "common_util.h"\n'
        "__global__ void k(float *x, int32_t *n) {\n"
        "    assert(n[0] >= 0);\n"
        "    x[0] = NEG_INF; x[1] = (float)M_SQRT2; n[1] = INT_MAX; n[2] = (int32_t)(UINT32_MAX >> 1);\n"
        "}\n"
        "int main() { float *x = (float *)malloc(8); memset(x, 0, 8);"
        " if (rand() < 0) die(\"no\"); free(x); return 0; }\n")
    k = utils.cuda_kernel(tmp_path / "k.cu", "k")
    x = torch.zeros(2, device=utils.DEVICE)
    n = torch.zeros(3, dtype=torch.int32, device=utils.DEVICE)
    k[1, 1](x, n)
    assert x[0].item() == -np.finfo(np.float32).max and abs(x[1].item() - 2 ** 0.5) < 1e-7
    assert n[1:].tolist() == [2**31 - 1, 2**31 - 1]


@needs_nvrtc
def test_host_declarations_and_uncalled_definitions_are_set_aside(tmp_path):
    # cuda-samples' histogram: the header declares the sample's host functions; the .cu
    # defines them and keeps host globals, none of which a kernel uses. nvcc accepts it.
    (tmp_path / "hist_common.h").write_text(
        '#ifndef HIST_COMMON_H\n#define HIST_COMMON_H\ntypedef unsigned int uint;\n'
        'extern "C" void histogramCPU(uint *h, void *data, uint bytes);\n'
        'extern "C" void initHistogram(void);\n#endif\n')
    src = ('#include <stdlib.h>\n#include "hist_common.h"\n'
           "static uint *d_partial;\n"
           "class Timer { public: void start(); double ms() const { return 0.0; } };\n"  # host methods
           "struct __align__(8) Pair { float a, b; };\n"  # used by the kernel: kept
           "__device__ Pair swap_pair(Pair p) { return Pair{p.b, p.a}; }\n"
           "__global__ void hist_kernel(uint *h, const uint *d, uint n) {\n"
           "    uint i = blockIdx.x * blockDim.x + threadIdx.x;\n"
           "    if (i < n) atomicAdd(h + (d[i] & 255u), 1u);\n"
           "}\n"
           'extern "C" void initHistogram(void) { d_partial = (uint *)malloc(1024); }\n'
           "int host_sum(const int *v, int n) { int s = 0; for (int i = 0; i < n; ++i) s += v[i]; return s; }\n")
    (tmp_path / "hist.cu").write_text(src)
    tc.nvrtc_check(src, "hist_kernel", "hist.cu", tmp_path)


@needs_nvrtc
@pytest.mark.parametrize("helper, call_line", [
    ("int host_twice(int a) { return 2 * a; }", 1),   # defined, then called by the kernel
    ("int host_twice(int a);", 1),                   # declared, then called by the kernel
    ("#include <stdlib.h>\n#define host_twice(a) (rand() + (a))", 5),  # a C library function
])
def test_a_host_function_a_kernel_calls_is_still_refused(helper, call_line):
    src = helper + "\n\n__global__ void k(int *x) {\n    x[0] = host_twice(x[1]);\n}\n"
    with pytest.raises(utils.CudaCompileError) as info:
        tc.nvrtc_check(src, "k", "k.cu", None)
    msg = str(info.value)
    assert f"k.cu({call_line})" in msg, msg
    assert "hint:" in msg and ("host" in msg.split("hint:")[1]), msg
