"""Exercise 02, relu: typical mistakes as mutations of the solution (see __init__.py)."""
from mistakes import no_bounds_check, no_mask, no_tail

CU = "relu_src = r'''"
NB = "def relu_numba_kernel("
TR = "def relu_triton_kernel("
CU2 = "relu_2d_src = r'''"
BW = "def relu_backward_kernel("
V4 = "relu_vec4_src = r'''"
IT = "relu_items_src = r\"\"\""

MISTAKES = [
    no_bounds_check("cuda", CU, "    if (idx < n) {\n        y_ptr[idx] = fmaxf(x_ptr[idx], 0.0f);\n    }",
                    "    y_ptr[idx] = fmaxf(x_ptr[idx], 0.0f);"),
    no_bounds_check("numba", NB, "    if idx < n:\n        y_ptr[idx] = max(x_ptr[idx], 0.0)",
                    "    y_ptr[idx] = max(x_ptr[idx], 0.0)"),
    Mistake("numba_grid_too_small", NB, "relu_numba_kernel[cdiv(n, 256), 256]", "relu_numba_kernel[n // 256, 256]",
            cause=r"never written|grid"),
    no_mask(TR, "tl.store(y_ptr + offsets, tl.maximum(x, 0.0), mask=mask)"),
    Mistake("triton_min_not_max", TR, "tl.maximum(x, 0.0)", "tl.minimum(x, 0.0)",
            cause=r"negative|max|relu|wrong"),
    Mistake("cuda_2d_stride_ignored", CU2, "fmaxf(x_ptr[row * x_row_stride + col], 0.0f)",
            "fmaxf(x_ptr[row * cols + col], 0.0f)", cause=r"stride"),
    Mistake("backward_ge_zero", BW, "grad_out_ptr[idx] if x_ptr[idx] > 0 else 0.0",
            "grad_out_ptr[idx] if x_ptr[idx] >= 0 else 0.0", cause=r"x > 0|x == 0|zero|0"),
    no_tail(V4, "        for (long long j = start; j < n; ++j) {      // the tail: at most 3 elements\n"
                "            y_ptr[j] = fmaxf(x_ptr[j], 0.0f);\n        }\n"),
    Mistake("items_stride_by_items", IT, "int idx = t + k * threads;", "int idx = t * ITEMS + k;",
            cause=r"sectors|neighbouring",
            sim_only="efficiency: the traffic check counts the bytes a kernel needs in simulation; "
                     "Nsight Compute on a GPU gives bytes moved only, so the exercise does not grade traffic there"),
    Mistake("triton_where_ok", TR, "tl.maximum(x, 0.0)", "tl.where(x > 0, x, 0.0)", verdict="accepted"),
    Mistake("cuda_ternary_ok", CU, "y_ptr[idx] = fmaxf(x_ptr[idx], 0.0f);",
            "float v = x_ptr[idx];\n        y_ptr[idx] = v > 0.0f ? v : 0.0f;", verdict="accepted"),
]
