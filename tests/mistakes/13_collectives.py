"""Exercise 13, collectives by hand: typical mistakes as mutations of the solution (see __init__.py)."""

#: The graders run the learner's functions as gloo processes on CPU tensors, with a GPU or without:
#: no kernel, no simulator, the same verdicts in both modes.
MODE_INDEPENDENT = "collectives on gloo and CPU tensors in both modes: no kernel runs, simulated or not"

STEP = "def ring_step("
AG = "def ring_all_gather("
AR = "def ring_all_reduce("

RS_LOOP = "        ring_step(x, (rank - step) % world, (rank - step - 1) % world, rank, world, add=True)"
AG_LOOP = "        ring_step(x, (owned - step) % world, (owned - step - 1) % world, rank, world, add=False)"
ISEND = "        works.append(dist.isend(x[s0:s1], (rank + 1) % world))"
IRECV = "        works.append(dist.irecv(incoming, (rank - 1) % world))"
AR_BODY = "    owned = ring_reduce_scatter(x, rank, world)\n    ring_all_gather(x, rank, world, owned)\n    return x\n"

MISTAKES = [
    # the reduce-scatter
    Mistake("rs_received_into_wrong_chunk", STEP, RS_LOOP,
            "        ring_step(x, (rank - step) % world, (rank - step + 1) % world, rank, world, add=True)",
            cause=r"other chunks were added|chunk indices are off|disagree on the chunk"),
    Mistake("rs_sends_wrong_chunk", STEP, RS_LOOP,
            "        ring_step(x, (rank + step) % world, (rank - step - 1) % world, rank, world, add=True)",
            cause=r"other chunks were added|chunk indices are off|disagree on the chunk"),
    Mistake("rs_missing_step", STEP, "    for step in range(world - 1):\n        ring_step(x, (rank - step)",
            "    for step in range(world - 2):\n        ring_step(x, (rank - step)",
            cause=r"without rank .*step of the reduction is missing|step missing"),
    Mistake("rs_overwrites", STEP, "        x[r0:r1] += incoming", "        x[r0:r1] = incoming",
            cause=r"written over .* instead of added"),
    Mistake("rs_returns_own_rank", STEP, "    return (rank + 1) % world", "    return rank",
            cause=r"returned chunk \d+, but the full sum is in chunk"),
    Mistake("rs_chunks_without_remainder", STEP, "    bounds = chunk_bounds(x.numel(), world)",
            "    bounds = [(c * (x.numel() // world), (c + 1) * (x.numel() // world)) for c in range(world)]",
            cause=r"last n % world .* belong to no chunk"),
    # the step shared by both halves
    Mistake("receives_from_next_rank", STEP, IRECV, "        works.append(dist.irecv(incoming, (rank + 1) % world))",
            cause=r"hang.*(do not agree on who is next|finished without)"),
    Mistake("blocking_send_first", STEP, ISEND, "        dist.send(x[s0:s1], (rank + 1) % world)",
            cause=r"hang.*every rank waits in a blocking send"),
    Mistake("empty_chunk_sent", STEP, "    if s1 > s0:\n        works.append(dist.isend",
            "    if True:\n        works.append(dist.isend",
            cause=r"hang|empty chunk"),
    Mistake("added_before_wait", STEP, "    for w in works:\n        w.wait()\n    if add and r1 > r0:\n"
            "        x[r0:r1] += incoming",
            "    if add and r1 > r0:\n        x[r0:r1] += incoming\n    for w in works:\n        w.wait()",
            cause=r"wait on the irecv before|before it was received|hang|other chunks|missing"),
    # the all-gather
    Mistake("ag_adds", AG, AG_LOOP,
            "        ring_step(x, (owned - step) % world, (owned - step - 1) % world, rank, world, add=True)",
            cause=r"added to what was there before.*copies what it receives"),
    Mistake("ag_owner_from_rank", AG, AG_LOOP,
            "        ring_step(x, (rank + 1 - step) % world, (rank - step) % world, rank, world, add=False)",
            cause=r"not those of its owner.*passed as `owned`|never arrived"),
    Mistake("ag_missing_step", AG, "    for step in range(world - 1):", "    for step in range(world - 2):",
            cause=r"marker .*never arrived"),
    # the all-reduce
    Mistake("ar_torch_does_it", AR, AR_BODY, "    dist.all_reduce(x)\n    return x\n",
            cause=r"called torch\.distributed\.all_reduce"),
    Mistake("ar_mean", AR, AR_BODY, AR_BODY.replace("    return x", "    x /= world\n    return x"),
            cause=r"mean over the ranks, not their sum"),
    Mistake("ar_no_all_gather", AR, AR_BODY, "    ring_reduce_scatter(x, rank, world)\n    return x\n",
            cause=r"only chunk \d+ holds the full sum.*all-gather"),
    Mistake("ar_whole_tensor_passed", AR, AR_BODY,
            "    passing = x.clone()\n"
            "    for step in range(world - 1):\n"
            "        incoming = torch.empty_like(x)\n"
            "        works = [dist.isend(passing, (rank + 1) % world), dist.irecv(incoming, (rank - 1) % world)]\n"
            "        for w in works:\n"
            "            w.wait()\n"
            "        x += incoming\n"
            "        passing = incoming\n"
            "    return x\n",
            cause=r"sent \d+ values.*one chunk a step"),
    # right, written another way
    Mistake("blocking_by_parity", STEP,
            f"    works = []\n    if s1 > s0:\n{ISEND}\n    if r1 > r0:\n{IRECV}\n"
            "    for w in works:\n        w.wait()\n",
            "    send = (lambda: dist.send(x[s0:s1], (rank + 1) % world)) if s1 > s0 else (lambda: None)\n"
            "    recv = (lambda: dist.recv(incoming, (rank - 1) % world)) if r1 > r0 else (lambda: None)\n"
            "    for op in ((send, recv) if rank % 2 == 0 else (recv, send)):\n"
            "        op()\n",
            verdict="accepted"),
    Mistake("receive_posted_first", STEP, f"    if s1 > s0:\n{ISEND}\n    if r1 > r0:\n{IRECV}\n",
            f"    if r1 > r0:\n{IRECV}\n    if s1 > s0:\n{ISEND}\n", verdict="accepted"),
]
