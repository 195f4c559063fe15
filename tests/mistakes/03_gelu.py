"""Exercise 03, gelu: typical mistakes as mutations of the solution (see __init__.py)."""
from mistakes import no_bounds_check, no_mask, no_tail

CU = "GELU_SOURCE = r'''"
NB = "def gelu_kernel_numba("
TR = "def gelu_kernel_triton("
V4 = "GELU_VEC4_SOURCE = r'''"

MISTAKES = [
    no_bounds_check("cuda", CU, "    if (i < n) {\n        float v", "    {\n        float v", index="i"),
    Mistake("cuda_cube_forgotten", CU, "0.044715f * v * v * v", "0.044715f * v * v",
            cause=r"formula|tanh|gelu|wrong"),
    Mistake("cuda_no_half", CU, "y_ptr[i] = 0.5f * v * (1.0f + tanhf(u));", "y_ptr[i] = v * (1.0f + tanhf(u));",
            cause=r"formula|0\.5|twice|gelu|wrong"),
    Mistake("numba_grid_too_small", NB,
            "blocks = (n + 255) // 256\n        gelu_kernel_numba", "blocks = n // 256\n        gelu_kernel_numba",
            cause=r"never written|grid"),
    no_bounds_check("numba", NB, "    if i < n:\n        v = x[i]\n        y[i]",
                    "    if True:\n        v = x[i]\n        y[i]", index="i"),
    Mistake("triton_sign_of_exp", TR, "tl.exp(-2.0 * u)", "tl.exp(2.0 * u)",
            cause=r"formula|exp|sign|wrong"),
    no_mask(TR, "tl.store(y_ptr + offsets, v / (1.0 + tl.exp(-2.0 * u)), mask=mask)"),
    no_tail(V4, "    if (tail < n) {\n        y_ptr[tail] = gelu_tanh(x_ptr[tail]);\n    }\n"),
    Mistake("vec4_tail_unguarded", V4, "    if (tail < n) {\n        y_ptr[tail] = gelu_tanh(x_ptr[tail]);\n    }\n",
            "    y_ptr[tail] = gelu_tanh(x_ptr[tail]);\n", cause=r"past the end|tail"),
    Mistake("triton_sigmoid_form_ok", TR, "v / (1.0 + tl.exp(-2.0 * u))", "v * tl.sigmoid(2.0 * u)",
            verdict="accepted"),
    Mistake("cuda_erf_is_not_tanh", CU, "y_ptr[i] = 0.5f * v * (1.0f + tanhf(u));",
            "y_ptr[i] = 0.5f * v * (1.0f + erff(v * 0.70710678f));",
            cause=r"erf|tanh|exact|formula|wrong"),
]
