"""Collectives written by hand (lesson 13): the graders of the ring reduce-scatter, all-gather
and all-reduce, run as 2, 3 and 4 processes joined by ``torch.distributed`` (gloo on the CPU,
``runtime.run_ranks``), on awkward sizes, against float64 sums and ``torch.distributed``'s own
all-reduce.

    check_reduce_scatter(fn)    fn(x, rank, world) -> the index of the chunk that ends as the full sum
    check_all_gather(fn)        fn(x, rank, world, owned): every chunk of x ends as its owner's
    check_all_reduce(fn)        fn(x, rank, world): x ends as the sum of every rank's x

Chunks are ``kernels.collectives.chunk_bounds(n, world)``: contiguous, the first ``n % world``
one value longer. Each function works on ``x`` in place (a flat float32 tensor).

A grader reads what each rank did as well as what it computed: the values each rank sent to
each peer (a ring sends to the next rank only, ``(N - 1) / N`` of x in each half), any
collective of ``torch.distributed`` run, however it was reached (``dist.all_reduce``, the process
group's own ``allreduce``, the functional collectives: all meet at the dispatcher, where a
dispatch mode records them; it would do the work), and, when the ranks hang,
who waits on whom (``runtime.RankTimeout``). A wrong result is named by what it holds: the
sum of the wrong chunk, a sum missing some rank's values, one rank's values written over the
sum, the mean instead of the sum, values past the last whole chunk never reduced.
"""
from __future__ import annotations

import itertools

import torch

from kernels.collectives import chunk_bounds
from runtime.backends.launches import without_dynamo_import
from runtime.dist import RankError, RankTimeout, run_ranks

from .. import guard as _guard
from ..grading import GradingError, _fresh_seed

__all__ = ["check_reduce_scatter", "check_all_gather", "check_all_reduce"]

#: The worlds every grader runs, and the sizes at each: one value (fewer than the ranks: empty
#: chunks), a few, an awkward thousand, and one large enough that a blocking send waits for
#: its receive.
WORLDS = (2, 3, 4)
SIZES = (1, 7, 1003, 65539)
#: The order the results are judged in: a mid size first, whose wrong values say the most.
GRADE_ORDER = (1003, 7, 65539, 1)
#: Seconds before a run is given up; a deadlock is given up sooner, once every unfinished rank
#: has waited in a send or receive with nothing changing for STALL_S seconds.
TIMEOUT_S, STALL_S = 20.0, 2.0
#: What the all-gather's grader writes into the chunks a rank does not own: a value no sum of
#: the inputs takes (they are integers and halves near multiples of 1024), exact in float32.
MARKER = -777777.25
#: The operators of torch.distributed's process groups (namespaces ``c10d`` and
#: ``_c10d_functional``) a learner's ring may run: point-to-point messages and a barrier. Every
#: other one is a collective computing the answer itself, however it was reached
#: (``dist.all_reduce``, the process group's ``allreduce``, the functional collectives).
P2P_OPS = {"send", "recv_", "recv_any_source_", "barrier", "monitored_barrier_"}
#: A collective operator's name in torch.distributed, for the message (others go by their own).
COLLECTIVE_NAMES = {"allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce_coalesced",
                    "all_reduce": "all_reduce", "allgather_": "all_gather",
                    "_allgather_base_": "all_gather_into_tensor",
                    "all_gather_into_tensor": "all_gather_into_tensor", "reduce_scatter_": "reduce_scatter",
                    "_reduce_scatter_base_": "reduce_scatter_tensor", "reduce_scatter_tensor": "reduce_scatter_tensor",
                    "broadcast_": "broadcast", "reduce_": "reduce", "alltoall_": "all_to_all",
                    "alltoall_base_": "all_to_all_single", "gather_": "gather", "scatter_": "scatter"}
HINT_RING = ("in step s of either half, rank r sends one chunk to rank (r + 1) % world and receives one from "
             "rank (r - 1) % world")


def _values(seed: int, rank: int, n: int) -> torch.Tensor:
    """Rank ``rank``'s x of ``n`` values: integers and halves of mixed sign, so that every sum
    over ranks is exact in float32 and a result can be matched with the ranks it adds."""
    g = torch.Generator().manual_seed(seed * 1009 + rank * 7919 + n)
    return (torch.randint(-512, 512, (n,), generator=g) / 2 + (rank + 1) * 1024).float()


def _owned_chunks(world: int, shift: int) -> list[int]:
    return [(r + shift) % world for r in range(world)]


def _rank_side(rank, world, fn, kind, seed, shift):
    """What a rank runs: the learner's function on each size, with every send counted and
    every collective recorded. Returns ``[(x after, returned, sent), ...], collectives``."""
    from torch.utils._python_dispatch import TorchDispatchMode
    called: list[str] = []
    sent: dict[int, int] = {}

    class Collectives(TorchDispatchMode):
        """Records the values every send carries and every collective operator the learner's
        function runs, at the dispatcher, where every way of reaching one meets."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name
            space, _, op = name.partition("::")
            if name == "c10d::send":  # (tensors, process group, destination, tag): the values sent, by peer
                peer = int(args[2])
                sent[peer] = sent.get(peer, 0) + sum(t.numel() for t in args[0])
            elif space in ("c10d", "_c10d_functional") and op not in P2P_OPS and not op.startswith("wait"):
                called.append(f"torch.distributed.{COLLECTIVE_NAMES.get(op, op)} ({name})")
            return func(*args, **(kwargs or {}))

    without_dynamo_import(Collectives)  # a forked rank would import torch._dynamo at its first operator
    owned = _owned_chunks(world, shift)[rank]
    out = []
    for n in SIZES:
        x = _values(seed, rank, n)
        if kind == "all_gather":
            bounds = chunk_bounds(n, world)
            keep = x[bounds[owned][0]:bounds[owned][1]].clone()
            x.fill_(MARKER)
            x[bounds[owned][0]:bounds[owned][1]] = keep
        before = dict(sent)
        with Collectives():
            ret = fn(x, rank, world, owned) if kind == "all_gather" else fn(x, rank, world)
        if isinstance(ret, torch.Tensor) and ret.numel() == 1 and kind == "reduce_scatter":
            ret = int(ret)
        elif isinstance(ret, torch.Tensor):
            ret = ret.detach().clone()
        elif not isinstance(ret, (int, type(None))):
            ret = repr(ret)[:80]
        out.append((x, ret, {p: v - before.get(p, 0) for p, v in sent.items() if v - before.get(p, 0)}))
    return out, called


def _run(name, fn, kind, world, seed, shift):
    try:
        return run_ranks(_rank_side, world, fn, kind, seed, shift, timeout_s=TIMEOUT_S, stall_s=STALL_S)
    except RankTimeout as e:
        raise GradingError(f"{name} failed at world {world}: the ranks hang.\n{e}\nHint: {HINT_RING}; post the send "
                           "and the receive of a step together (dist.isend, dist.irecv, then .wait() on both), "
                           "and skip an empty chunk on both sides alike.") from None
    except RankError as e:
        if e.kind == "NotImplementedError" or "not solved yet" in e.detail:
            raise GradingError(e.detail if "not solved yet" in e.detail else f"not solved yet: {e.detail}") from None
        if "doesn't match expected size" in e.detail:
            raise GradingError(
                f"{name} failed at world {world}: {e.detail}\nRank {e.rank} received a message of another size than "
                f"the buffer it posted: the sender and the receiver disagree on the chunk.\nHint: the chunk received "
                f"at step s is the one the previous rank sends at step s: chunk (r - s - 1) % world for rank r, "
                f"sent as chunk (r' - s) % world by r' = r - 1.") from None
        raise GradingError(f"{name} failed at world {world}: rank {e.rank} raised {e.kind}: {e.detail}\n"
                           f"{_trace_tail(str(e))}") from None


def _trace_tail(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[-6:])


def _fail(name, world, n, rank, what, hint):
    raise GradingError(f"{name} failed at world {world}, {n} values, on rank {rank}:\n{what}\nHint: {hint}")


def _refuse_collectives(name, world, results):
    for r, (_, called) in enumerate(results):
        if called:
            raise GradingError(
                f"{name} failed at world {world}: rank {r} called {called[0]}, a collective that computes the "
                f"answer itself.\nHint: write it from point-to-point messages only (dist.isend and dist.irecv, or "
                f"dist.send and dist.recv): {HINT_RING}.")


def _subset_sum(chunks: list[torch.Tensor], got: torch.Tensor):
    """The ranks whose chunks add up to ``got`` (exactly: the values are exact in float32), or None."""
    world = len(chunks)
    for k in range(1, world + 1):
        for ranks in itertools.combinations(range(world), k):
            if torch.equal(sum(chunks[r].double() for r in ranks), got.double()):
                return ranks
    return None


def _describe_chunk(inputs, bounds, c, got, world, rank):
    """What chunk ``c`` of a result holds instead of the full sum, in words, or None."""
    lo, hi = bounds[c]
    full = sum(x[lo:hi].double() for x in inputs)
    if hi > lo and torch.allclose(got.double() * world, full, rtol=1e-6, atol=0):
        return ("it holds the mean over the ranks, not their sum: an all-reduce adds (data parallel training "
                "divides by the number of ranks itself, before or after)")
    for other in range(world):
        olo, ohi = bounds[other]
        if other != c and ohi - olo == hi - lo and torch.equal(got.double(), sum(x[olo:ohi].double() for x in inputs)):
            return (f"it holds the full sum of chunk {other}, not of chunk {c}: the chunk indices are off: at step s "
                    f"rank r sends chunk (r - s) % world and receives, and adds into, chunk (r - s - 1) % world")
    ranks = _subset_sum([x[lo:hi] for x in inputs], got)
    if ranks is None:
        return (f"its values are no sum of chunk {c} over any set of ranks: values of other chunks were added "
                f"into it. The chunk received at step s is the one the previous rank sent, (r - s - 1) % world for "
                f"rank r: add it into that chunk, not into another")
    if ranks == (rank,) and world > 1:
        return (f"it holds this rank's own values: nothing received was added into it (the reduce-scatter needs "
                f"world - 1 = {world - 1} steps, each adding one more rank's values; is a step missing?)")
    if len(ranks) == 1:
        return (f"it holds rank {ranks[0]}'s values alone: the received chunk was written over the local one "
                f"instead of added to it (a reduce-scatter adds what it receives: x[chunk] += incoming)")
    missing = sorted(set(range(world)) - set(ranks))
    return (f"it holds the sum over ranks {', '.join(map(str, ranks))} only, without rank "
            f"{', '.join(map(str, missing))}'s values: a step of the reduction is missing (the reduce-scatter "
            f"needs world - 1 = {world - 1} steps, each adding one more rank's values)")


def _check_bounds_hint(bounds, c, bad: torch.Tensor, n, world):
    idx = torch.nonzero(bad).flatten()
    first = int(idx[0]) + bounds[c][0]
    if n // world and n % world and first >= world * (n // world):
        return (f"the wrong values start at index {first}, past the {world} x {n // world} values of whole chunks: "
                f"the last n % world = {n % world} values belong to no chunk. Use chunk_bounds(n, world): the first "
                f"n % world chunks hold one value more")
    return None


def _compare(name, world, n, rank, inputs, bounds, c, got, what_chunk):
    lo, hi = bounds[c]
    want = sum(x[lo:hi].double() for x in inputs)
    if torch.isnan(got).any():
        i = int(torch.nonzero(torch.isnan(got)).flatten()[0]) + lo
        _fail(name, world, n, rank, f"{what_chunk} (chunk {c}, values {lo}..{hi - 1}) holds NaN at index {i}, "
              "though every input is finite.", "a buffer was added or copied before it was received: wait on "
              "the irecv before reading what it receives")
    if torch.equal(got.double(), want):
        return
    bad = got.double() != want
    why = _check_bounds_hint(bounds, c, bad, n, world) or _describe_chunk(inputs, bounds, c, got, world, rank)
    i = int(torch.nonzero(bad).flatten()[0])
    _fail(name, world, n, rank, f"{what_chunk} (chunk {c}, values {lo}..{hi - 1}) is wrong: at index {lo + i} it holds "
          f"{float(got[i]):g}, the sum over the ranks is {float(want[i]):g}.", why or HINT_RING)


def _check_traffic(name, world, n, rank, sent, bounds, halves: int):
    """A ring sends only to the next rank, and each half (N - 1) / N of x at the most."""
    others = sorted(p for p in sent if p != (rank + 1) % world)
    if others:
        _fail(name, world, n, rank, f"rank {rank} sent {sent[others[0]]} values to rank {others[0]}.",
              f"in a ring, rank r sends to rank (r + 1) % world only ({HINT_RING})")
    most = halves * (world - 1) * max(hi - lo for lo, hi in bounds)
    total = sum(sent.values())
    if total > most:
        _fail(name, world, n, rank, f"rank {rank} sent {total} values; a ring sends (world - 1) chunks a half, "
              f"{most} values at the most here.",
              "send one chunk a step, not the whole tensor: the ring is bandwidth-optimal because every rank sends "
              "(N - 1) / N of x in each half")


def _grade(name, fn, kind, seed, shift=1):
    if not callable(fn):
        raise TypeError(f"{name} expects your function, got {type(fn).__name__}")
    _guard.verify(name)  # graders, the harness and torch as `import utils` found them
    seed = _fresh_seed() if seed is None else int(seed)
    for world in WORLDS:
        results = _run(name, fn, kind, world, seed, shift)
        _refuse_collectives(name, world, results)
        owners = _owned_chunks(world, shift)
        for i in sorted(range(len(SIZES)), key=lambda i: GRADE_ORDER.index(SIZES[i])):
            n = SIZES[i]
            inputs = [_values(seed, r, n) for r in range(world)]
            bounds = chunk_bounds(n, world)
            returned = [results[r][0][i][1] for r in range(world)]
            for rank in range(world):
                x, ret, sent = results[rank][0][i]
                if x.shape != (n,) or x.dtype != torch.float32:
                    _fail(name, world, n, rank, f"x became {x.dtype} of shape {tuple(x.shape)}.",
                          "work on x in place: write into its chunks (x[lo:hi] += incoming), do not rebind it")
                _check_traffic(name, world, n, rank, sent, bounds, 2 if kind == "all_reduce" else 1)
                if kind == "reduce_scatter":
                    _grade_reduce_scatter(name, world, n, rank, x, ret, returned, inputs, bounds)
                elif kind == "all_gather":
                    for c in range(world):
                        owner = owners.index(c)
                        lo, hi = bounds[c]
                        got, want = x[lo:hi], inputs[owner][lo:hi]
                        if not torch.equal(got, want):
                            _gather_fail(name, world, n, rank, c, owner, got, want, inputs, bounds)
                else:
                    if isinstance(ret, torch.Tensor) and ret.shape == x.shape and not torch.equal(ret, x):
                        _fail(name, world, n, rank, "the tensor returned differs from x after the call.",
                              "the all-reduce works on x in place and returns x itself")
                    full = [torch.equal(x[lo:hi].double(), sum(v[lo:hi].double() for v in inputs))
                            for lo, hi in bounds if hi > lo]
                    if world > 1 and len(full) == world and sum(full) == 1:
                        _fail(name, world, n, rank, f"only chunk {full.index(True)} holds the full sum; the other "
                              "chunks hold partial sums.", "that is where the reduce-scatter leaves x: the "
                              "all-gather of the chunk it returned must follow, to give every chunk to every rank")
                    for c in range(world):
                        _compare(name, world, n, rank, inputs, bounds, c, x[bounds[c][0]:bounds[c][1]],
                                 "x after the all-reduce")
    return seed


def _grade_reduce_scatter(name, world, n, rank, x, ret, returned, inputs, bounds):
    if not isinstance(ret, int) or isinstance(ret, bool) or not 0 <= ret < world:
        _fail(name, world, n, rank, f"it returned {ret!r}, not the index of the chunk it owns.",
              "return the index of the chunk whose full sum this rank holds: (rank + 1) % world in the ring")
    if sorted(returned) != list(range(world)):
        _fail(name, world, n, rank, f"the ranks returned the chunk indices {returned}: two ranks claim one chunk.",
              "each rank owns a different chunk at the end: (rank + 1) % world")
    lo, hi = bounds[ret]
    want = sum(v[lo:hi].double() for v in inputs)
    got = x[lo:hi]
    if hi > lo and not torch.equal(got.double(), want):
        for c in range(world):
            clo, chi = bounds[c]
            if c != ret and chi > clo and torch.equal(x[clo:chi].double(),
                                                                 sum(v[clo:chi].double() for v in inputs)):
                _fail(name, world, n, rank, f"it returned chunk {ret}, but the full sum is in chunk {c}.",
                      "after N - 1 steps the rank's last received chunk, (rank - (N - 2) - 1) % world = "
                      "(rank + 1) % world, is the complete one: return that index")
    _compare(name, world, n, rank, inputs, bounds, ret, got, "the chunk it returned")


def _gather_fail(name, world, n, rank, c, owner, got, want, inputs, bounds):
    lo, hi = bounds[c]
    if (got == MARKER).any():
        i = int(torch.nonzero(got == MARKER).flatten()[0]) + lo
        _fail(name, world, n, rank, f"chunk {c} (values {lo}..{hi - 1}, owned by rank {owner}) still holds the "
              f"grader's marker {MARKER:g} at index {i}: it never arrived (the grader writes it into the chunks a "
              "rank does not own).",
              f"world - 1 steps, starting from the chunk passed as `owned` (the grader's owners are not (rank + 1) "
              f"% world): at step s, send chunk (owned - s) % world and receive chunk (owned - s - 1) % world; "
              f"{HINT_RING}")
    for other in range(world):
        if other != owner and torch.equal(got, inputs[other][lo:hi]):
            _fail(name, world, n, rank, f"chunk {c} holds rank {other}'s values, not those of its owner, rank "
                  f"{owner}.", "start from the chunk passed as `owned`, not from one computed from the rank: the "
                  "grader passes owners in an order of its own")
    if torch.equal(got.double(), want.double() + MARKER) or torch.equal(got.double(), want.double() * 2):
        _fail(name, world, n, rank, f"chunk {c} holds its owner's values added to what was there before: "
              f"{float(got[0]):g} where rank {owner} gave {float(want[0]):g}.",
              "an all-gather copies what it receives (x[chunk] = incoming, or irecv straight into x's chunk); "
              "only the reduce-scatter adds")
    i = int(torch.nonzero(got != want).flatten()[0])
    _fail(name, world, n, rank, f"chunk {c} is wrong at index {lo + i}: {float(got[i]):g}, its owner rank "
          f"{owner} has {float(want[i]):g}.", HINT_RING)


def check_reduce_scatter(fn, *, seed=None):
    """``fn(x, rank, world)``, in place: afterwards the chunk whose index it returns holds the
    sum of that chunk over every rank, and the ranks own different chunks."""
    seed = _grade("check_reduce_scatter", fn, "reduce_scatter", seed)
    print(f"check_reduce_scatter: correct at world {', '.join(map(str, WORLDS))} on sizes "
          f"{', '.join(map(str, SIZES))}; each rank sent (N - 1) / N of x to the next rank (seed {seed})")


def check_all_gather(fn, *, seed=None):
    """``fn(x, rank, world, owned)``, in place: afterwards every chunk of x on every rank holds
    the values of the rank that owned it (the grader picks the owners;
    the others start as its marker)."""
    seed = _grade("check_all_gather", fn, "all_gather", seed, shift=2)
    print(f"check_all_gather: correct at world {', '.join(map(str, WORLDS))} on sizes "
          f"{', '.join(map(str, SIZES))}, owners chosen by the grader (seed {seed})")


def check_all_reduce(fn, *, seed=None):
    """``fn(x, rank, world)``, in place: afterwards every rank's x is the sum of all of them,
    equal to what ``torch.distributed.all_reduce`` gives."""
    seed = _grade("check_all_reduce", fn, "all_reduce", seed)
    ok = run_ranks(_torch_agrees, 3, fn, seed, timeout_s=TIMEOUT_S, stall_s=STALL_S)
    if not all(ok):
        raise GradingError("check_all_reduce failed: at world 3 your all-reduce differs from "
                           "torch.distributed.all_reduce's on float32 values of mixed magnitude.\n"
                           "Hint: add the chunks in the ring's order; do not convert x to another dtype")
    print(f"check_all_reduce: correct at world {', '.join(map(str, WORLDS))} on sizes "
          f"{', '.join(map(str, SIZES))}, equal to torch.distributed.all_reduce (seed {seed})")


def _torch_agrees(rank, world, fn, seed):
    """Whether fn's all-reduce of random float32 values agrees with torch.distributed's within
    float32 rounding (the orders of the additions differ)."""
    import torch.distributed as dist
    g = torch.Generator().manual_seed(seed + rank)
    x = torch.randn(4099, generator=g) * 10.0 ** torch.randint(-3, 4, (4099,), generator=g)
    ref, magnitude = x.clone(), x.abs()
    dist.all_reduce(ref)
    dist.all_reduce(magnitude)   # the sum of |x| over the ranks bounds the rounding of any order
    fn(x, rank, world)
    return bool(((x - ref).abs() <= 2 * world * 2.0 ** -24 * magnitude).all())
