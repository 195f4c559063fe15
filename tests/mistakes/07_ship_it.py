"""Exercise 07, shipping a kernel as a PyTorch operator: typical mistakes (see __init__.py)."""


def prepare(source, tag):
    # torch.library keeps operators for the whole process: each graded mutation gets its own
    return source.replace("exercise07::", f"exercise07_{tag}::")


FAKE = "def relu_op(x: torch.Tensor)"
CTX = "def setup_context(ctx, inputs, output):"

MISTAKES = [
    Mistake("fake_returns_input", FAKE, "    return torch.empty_like(x)\n    ### END", "    return x\n    ### END",
            cause=r"new tensor|empty_like|alias", not_words=("True != False",)),
    Mistake("fake_ignores_dtype", FAKE, "    return torch.empty_like(x)\n    ### END",
            "    return torch.empty(x.shape, device=x.device)\n    ### END",
            cause=r"dtype"),
    Mistake("fake_wrong_shape", FAKE, "    return torch.empty_like(x)\n    ### END",
            "    return torch.empty(x.numel(), dtype=x.dtype, device=x.device)\n    ### END",
            cause=r"shape"),
    Mistake("fake_calls_kernel", FAKE, "    return torch.empty_like(x)\n    ### END",
            "    return relu_triton(x)\n    ### END",
            cause=r"fake|meta|data"),
    Mistake("fake_new_empty_ok", FAKE, "    return torch.empty_like(x)\n    ### END",
            "    return x.new_empty(x.shape)\n    ### END", verdict="accepted"),
    Mistake("save_output_ok", CTX, "    (x,) = inputs\n    ctx.save_for_backward(x)",
            "    ctx.save_for_backward(output)", verdict="accepted"),
    Mistake("save_nothing", CTX, "    (x,) = inputs\n    ctx.save_for_backward(x)", "    pass",
            cause=r"save_for_backward|saved"),
    Mistake("backward_wrong_order", "def backward(ctx, grad_out):",
            "return relu_backward_op(grad_out, x)\n    ### END", "return relu_backward_op(x, grad_out)\n    ### END",
            cause=r"grad|backward"),
    Mistake("backward_returns_grad_out", "def backward(ctx, grad_out):",
            "return relu_backward_op(grad_out, x)\n    ### END", "return grad_out\n    ### END",
            cause=r"grad|backward"),
    Mistake("backward_relu_of_grad", "def backward(ctx, grad_out):",
            "return relu_backward_op(grad_out, x)\n    ### END", "return relu_op(grad_out)\n    ### END",
            cause=r"grad|backward"),
    Mistake("fake_float64", FAKE, "    return torch.empty_like(x)\n    ### END",
            "    return torch.empty_like(x, dtype=torch.float64)\n    ### END", cause=r"dtype"),
    Mistake("fake_zeros_like_ok", FAKE, "    return torch.empty_like(x)\n    ### END",
            "    return torch.zeros_like(x)\n    ### END", verdict="accepted"),
]