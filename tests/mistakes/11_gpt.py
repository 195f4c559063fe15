"""Exercise 11, your kernels in a GPT: typical mistakes as mutations of the solution (see __init__.py)."""
from mistakes import race

EB = "def embedding_backward_kernel("
CE = "def cross_entropy_kernel("
GB = "def gelu_backward_kernel("

#: The solution's read of the target's logit, and its store of a row's gradient.
X_T = "x_t = tl.load(x_row + t, mask=counted, other=0.0)"
STORE = "        tl.store(g_row + offs, grad, mask=offs < cols)"
#: The derivative of the tanh GELU, as the solution writes it.
D = "d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)"

MISTAKES = [
    # exercise 1: the embedding's backward
    race("embedding_plain_add", EB, "    tl.atomic_add(dweight_ptr + row * dim + cols, g, mask=mask)\n",
         "    old = tl.load(dweight_ptr + row * dim + cols, mask=mask, other=0.0)\n"
         "    tl.store(dweight_ptr + row * dim + cols, old + g, mask=mask)\n",
         cause=r"race.*(atomic|sort)",
         gpu="two programs must update one row at the same time to lose one, which a GPU may not do"),
    Mistake("embedding_overwrites", EB, "    tl.atomic_add(dweight_ptr + row * dim + cols, g, mask=mask)\n",
            "    tl.atomic_xchg(dweight_ptr + row * dim + cols, g, mask=mask)\n",
            cause=r"add|overwr|lost", not_words=("NaN marker",)),
    # the position i used as the row, where the row is the token's id ids[i]
    Mistake("embedding_position_as_row", EB, "    row = tl.load(ids_ptr + i).to(tl.int64)\n", "    row = i\n",
            cause=r"position.*ids\[i\]", not_words=("appears in no token",)),
    # dweight indexed column-major: the row plus the column times the stride
    Mistake("embedding_column_major", EB, "    tl.atomic_add(dweight_ptr + row * dim + cols, g, mask=mask)\n",
            "    tl.atomic_add(dweight_ptr + row + cols * dim, g, mask=mask)\n",
            cause=r"column-major.*row-major.*r \* dim \+ c",
            not_words=("at the same offsets the mask tests",)),
    # the grid's second dimension rounded down: the last dim % BLOCK columns never added
    Mistake("embedding_no_column_tail", "def embedding_backward(ids, dout, dweight):", "triton.cdiv(dim, BLOCK_D)",
            "dim // BLOCK_D", cause=r"last \d+ columns? (was|were) never added.*triton\.cdiv\(dim, BLOCK\)"),
    # exercise 2: cross entropy
    Mistake("ce_no_max", CE, "        s += tl.exp(tl.load(x_row + offs, mask=offs < cols, other=float(\"-inf\")) - mx)",
            "        s += tl.exp(tl.load(x_row + offs, mask=offs < cols, other=float(\"-inf\")))",
            cause=r"subtract the row's max", more=((CE, "    lse = mx + tl.log(tl.sum(s, axis=0))",
                                                    "    lse = tl.log(tl.sum(s, axis=0))"),)),
    Mistake("ce_loss_summed", CE, "tl.atomic_add(loss_ptr, (lse - x_t) / count, mask=counted)",
            "tl.atomic_add(loss_ptr, lse - x_t, mask=counted)", cause=r"sum over the .* rows, not their mean"),
    Mistake("ce_gradient_not_divided", CE, "scale = tl.where(counted, 1.0 / count, 0.0)",
            "scale = tl.where(counted, 1.0, 0.0)", cause=r"without the 1 / count"),
    Mistake("ce_ignored_rows_counted", "def count_kernel(", "acc += tl.where(t != -100, 1.0, 0.0)",
            "acc += tl.where(offs < rows, 1.0, 0.0)", cause=r"divided by all .* rows"),
    Mistake("ce_ignored_row_gets_gradient", CE, "scale = tl.where(counted, 1.0 / count, 0.0)",
            "scale = 1.0 / count", cause=r"ignore_index .* still gets a gradient"),
    Mistake("ce_no_onehot", CE, "grad = (tl.exp(x - lse) - tl.where(offs == t, 1.0, 0.0)) * scale",
            "grad = tl.exp(x - lse) * scale", cause=r"without the one-hot"),
    # the target's logit read from row 0 (the row stride left out), and along the other axis, x[t, row]
    Mistake("ce_target_logit_row0", CE, X_T, "x_t = tl.load(x_ptr + t, mask=counted, other=0.0)",
            cause=r"row 0.*x_row \+ t.*row stride", not_words=("only where rows are ignored",)),
    Mistake("ce_target_logit_axis", CE, X_T, "x_t = tl.load(x_ptr + t * cols + row, mask=counted, other=0.0)",
            cause=r"other axis.*x_row \+ t|x_row \+ t.*other axis",
            not_words=("only where rows are ignored", "guarded by the bounds check"),
            sim_only="undefined behaviour: x[t, row] lies far past the logits; a GPU reads whatever is there (or "
                     "stops with an illegal memory access), simulation checks every address"),
    # x[row, -100] read for an ignored row (the target's logit read without mask=counted): before the
    # row's start, and before the logits on row 0; its value is masked out of the loss
    Mistake("ce_reads_before_row", CE, X_T, "x_t = tl.load(x_row + t)",
            cause=r"x\[0, -100\].*mask=counted", not_words=("guarded by the bounds check",),
            sim_only="undefined behaviour: a read before the logits' start, whose value the loss masks out; a GPU "
                     "reads whatever lies there, simulation checks every address"),
    # the ignored rows' gradient never written (their store skipped), and skipped with a mask the
    # interpreter refuses
    Mistake("ce_ignored_rows_not_written", CE, STORE,
            "        if counted:\n            tl.store(g_row + offs, grad, mask=offs < cols)",
            cause=r"ignore_index \(-100\) were never written.*must be written",
            not_words=("every element get a thread", "last block")),
    Mistake("ce_bool_mask", CE, STORE, "        tl.store(g_row + offs, grad, mask=(offs < cols) & counted)",
            cause=r"interpreter.*tl\.where\(counted, offs < cols, False\).*still written",
            not_words=("the traceback above",)),
    # a row's last block of columns stored without the mask: into the next row (a race), past the end
    Mistake("ce_tail_race", CE, STORE, "        tl.store(g_row + offs, grad)",
            cause=r"past the row's end.*mask=offs < cols"),
    # exercise 3: GELU's backward in the model
    Mistake("gelu_no_tanh_derivative", GB,
            D, "d = 0.5 * (1.0 + t)", cause=r"first wrong operator: gelu .* backward(.|\n)*tanh's own derivative"),
    Mistake("gelu_no_chain_rule", GB, "tl.store(dx_ptr + offs, dy * d, mask=mask)",
            "tl.store(dx_ptr + offs, d, mask=mask)",
            cause=r"first wrong operator: gelu(.|\n)*multiply by the incoming gradient dy"),
    Mistake("gelu_tanh_prime", GB, "0.5 * x * (1.0 - t * t)", "0.5 * x * (1.0 - t)",
            cause=r"gelu(.|\n)*1 - tanh\(u\)\^2"),
    Mistake("gelu_cubic_derivative", GB, "(1.0 + 3.0 * 0.044715 * x * x)", "(1.0 + 0.044715 * x * x)",
            cause=r"gelu(.|\n)*derivative of x\^3 is 3 x\^2"),
    Mistake("gelu_backward_by_torch", "def gelu_backward(dy, x):",
            "    dx = torch.empty_like(x)\n    n = x.numel()\n    if n:\n"
            "        gelu_backward_kernel[(triton.cdiv(n, 1024),)](dy, x, dx, n, BLOCK=1024)\n    return dx",
            "    t = torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))\n"
            "    return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x))",
            cause=r"computed|launched no kernel"),
    # the derivative of the exact (erf) GELU, where the forward is the tanh approximation
    Mistake("gelu_erf_derivative", GB, D,
            "d = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476)) + x * tl.exp(-0.5 * x * x) * 0.3989422804014327",
            cause=r"exact \(erf\) GELU.*tanh", not_words=("3 x^2", ": PASS")),
    # dx allocated in bfloat16: the dtype is named, before any value
    Mistake("gelu_backward_bfloat16", "def gelu_backward(dy, x):", "    dx = torch.empty_like(x)\n",
            "    dx = torch.empty_like(x, dtype=torch.bfloat16)\n",
            cause=r"^check_gpt_op failed:\ndx, .*dtype torch\.bfloat16, expected torch\.float32", not_words=("3 x^2",)),
    # right, written another way: tanh through exp (lesson 03's form), the derivative factored
    Mistake("gelu_backward_sigmoid_form", GB, "    t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))\n"
            "    d = 0.5 * (1.0 + t)",
            "    t = 2.0 / (1.0 + tl.exp(-2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x))) - 1.0\n"
            "    d = 0.5 * (1.0 + t)", verdict="accepted"),
]
