"""Exercise 13, CUDA Graphs: typical mistakes as mutations of the solution (see __init__.py)."""

SAFE = "def normalize_rows_into("
GRAPHED = "def make_graphed("

NUMBA = "    utils.numba_launch(row_absmax_kernel, triton.cdiv(rows, 128), 128, x, amax)\n"
TRITON = "    scale_rows_kernel[(rows,)](x, amax, out, cols, BLOCK=triton.next_power_of_2(cols))\n"
CHECK = "        if x.shape != static_x.shape:\n            raise ValueError("

MISTAKES = [
    # exercise 1: the launcher
    Mistake("host_check_kept", SAFE, NUMBA,
            NUMBA + "    if bool((amax == 0).all()):\n        raise ValueError('every row is zero')\n",
            cause=r"could not be captured: it synchronises with the host"),
    Mistake("item_check_kept", SAFE, NUMBA, NUMBA + "    assert amax.max().item() >= 0\n",
            cause=r"could not be captured: it synchronises with the host"),
    Mistake("to_numba_raw_launch", SAFE, NUMBA,
            "    row_absmax_kernel[triton.cdiv(rows, 128), 128](utils.to_numba(x), utils.to_numba(amax))\n",
            cause=r"to_numba\(tensor\) waits for torch's stream.*numba_launch"),
    Mistake("output_of_its_own", SAFE, TRITON, "    out = torch.empty_like(x)\n" + TRITON,
            cause=r"nothing was written into out.*a tensor of its own"),
    Mistake("torch_scales_the_rows", SAFE, TRITON,
            "    out.copy_(x / torch.where(amax > 0, amax, 1.0)[:, None])\n",
            cause=r"torch\.div\).*computed|computed \(part of\) them"),
    # exercise 2: the graphed call
    Mistake("no_copy_in", GRAPHED, "        static_x.copy_(x)\n        g.replay()\n", "        g.replay()\n",
            cause=r"result for the example tensor.*copy x into it first"),
    Mistake("copy_in_after_replay", GRAPHED, "        static_x.copy_(x)\n        g.replay()\n",
            "        g.replay()\n        static_x.copy_(x)\n",
            cause=r"copy x into it first|copied in after the replay"),
    Mistake("returns_graph_output", GRAPHED, "        return static_y.clone()", "        return static_y",
            cause=r"changed at a later call.*graph's own output.*clone"),
    Mistake("calls_fn_each_time", GRAPHED,
            "        static_x.copy_(x)\n        g.replay()\n        return static_y.clone()", "        return fn(x)",
            cause=r"called fn itself.*saved nothing"),
    Mistake("no_shape_check", GRAPHED, CHECK, "        if False:\n            raise ValueError(",
            cause=r"another shape|a replay runs the shapes it captured"),
    Mistake("captures_on_the_example", GRAPHED, "    static_x = example.clone()", "    static_x = example",
            cause=r"wrote into the example tensor.*clone"),
    # right answers written another way
    Mistake("numba_launcher_object", SAFE, NUMBA,
            "    utils.NumbaLauncher(row_absmax_kernel)(triton.cdiv(rows, 128), 128, x, amax)\n",
            verdict="accepted"),
    Mistake("capture_at_first_call", GRAPHED,
            "    static_x = example.clone()\n    fn(static_x)\n    g = utils.CUDAGraph()\n    with utils.graph(g):\n"
            "        static_y = fn(static_x)\n",
            "    static_x = example.clone()\n    g = utils.CUDAGraph()\n    box = {}\n",
            verdict="accepted",
            more=((GRAPHED, "        static_x.copy_(x)\n        g.replay()\n        return static_y.clone()",
                   "        static_x.copy_(x)\n        if not box:\n            fn(static_x)\n"
                   "            with utils.graph(g):\n                box['y'] = fn(static_x)\n"
                   "        g.replay()\n        return box['y'].detach().clone()"),)),
]
