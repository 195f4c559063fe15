"""Exercise 11, your kernels in a GPT: typical mistakes as mutations of the solution (see __init__.py)."""
from mistakes import race

EB = "def embedding_backward_kernel("
CE = "def cross_entropy_kernel("
GB = "def gelu_backward_kernel("

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
    # exercise 3: GELU's backward in the model
    Mistake("gelu_no_tanh_derivative", GB,
            "d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)",
            "d = 0.5 * (1.0 + t)", cause=r"first wrong operator: gelu .* backward(.|\n)*tanh's own derivative"),
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
    # right, written another way: tanh through exp (lesson 03's form), the derivative factored
    Mistake("gelu_backward_sigmoid_form", GB, "    t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))\n"
            "    d = 0.5 * (1.0 + t)",
            "    t = 2.0 / (1.0 + tl.exp(-2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x))) - 1.0\n"
            "    d = 0.5 * (1.0 + t)", verdict="accepted"),
]
