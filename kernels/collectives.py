"""Collectives written from sends and receives (lesson 13): the ring all-reduce as a
reduce-scatter followed by an all-gather, the two halves NCCL's ring algorithm runs. The same
code runs on gloo (CPU tensors: a laptop, N processes) and on NCCL (CUDA tensors, a GPU a rank).

    chunk_bounds(n, world)                     the (start, stop) of each of the world chunks of n values
    ring_reduce_scatter(x, rank, world)        in place; chunk (rank + 1) % world ends as the sum over the ranks
    ring_all_gather(x, rank, world, owned)     in place; chunk `owned` of each rank travels round the ring
    ring_all_reduce(x, rank, world)            in place: every rank's x becomes the sum of all of them
    bus_bandwidth(nbytes, seconds, world)      nccl-tests' bus bandwidth of an all-reduce: algbw * 2 (N - 1) / N

In each of the N - 1 steps of either half, rank r sends one chunk to rank (r + 1) % N and
receives one from rank (r - 1) % N. The send and the receive are posted together (``isend``,
``irecv``, then both waited on): with a blocking ``send`` first on every rank, every rank would
wait for a receive that no rank has posted yet. Each rank sends (N - 1) / N of the data in each
half, 2 (N - 1) / N in all, whatever N: the ring is bandwidth-optimal, which is why an
all-reduce's *bus* bandwidth (algbw times 2 (N - 1) / N) is compared with the links' speed.

Sizes need not divide by N: the first ``n % N`` chunks hold one value more (``chunk_bounds``),
and an empty chunk (``n < N``) is neither sent nor received, on both sides alike.
"""
from __future__ import annotations

import torch

#: dtypes the ring adds (gloo and NCCL both reduce these).
DTYPES = (torch.float32, torch.float64)


def chunk_bounds(n: int, world: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: ``world`` contiguous chunks covering ``n`` values, the first
    ``n % world`` of them one value longer (``chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]``)."""
    base, extra = divmod(n, world)
    bounds, start = [], 0
    for c in range(world):
        stop = start + base + (1 if c < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _flat(x: torch.Tensor, op: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"{op}: x must be float32 or float64, got {x.dtype}: convert it with x.float()")
    if not x.is_contiguous():
        raise ValueError(f"{op}: x must be contiguous (the ring works on it in place): pass x.contiguous() and "
                         "use the tensor you passed")
    return x.view(-1)


def _step(flat, send_chunk, recv_chunk, bounds, rank, world, add: bool):
    """One ring step: chunk ``send_chunk`` to the next rank, chunk ``recv_chunk`` from the
    previous one, added into x (``add``) or written over it."""
    import torch.distributed as dist
    s0, s1 = bounds[send_chunk]
    r0, r1 = bounds[recv_chunk]
    incoming = torch.empty(r1 - r0, dtype=flat.dtype, device=flat.device) if add else flat[r0:r1]
    works = []
    if s1 > s0:
        works.append(dist.isend(flat[s0:s1], (rank + 1) % world))
    if r1 > r0:
        works.append(dist.irecv(incoming, (rank - 1) % world))
    for w in works:
        w.wait()
    if add and r1 > r0:
        flat[r0:r1] += incoming


def ring_reduce_scatter(x: torch.Tensor, rank: int, world: int) -> int:
    """The first half of the ring all-reduce, in place: after N - 1 steps chunk
    ``(rank + 1) % world`` of x (``chunk_bounds``) is the sum of that chunk over every rank (the
    other chunks hold partial sums). Returns that chunk's index."""
    flat = _flat(x, "ring_reduce_scatter")
    bounds = chunk_bounds(flat.numel(), world)
    for step in range(world - 1):
        _step(flat, (rank - step) % world, (rank - step - 1) % world, bounds, rank, world, add=True)
    return (rank + 1) % world


def ring_all_gather(x: torch.Tensor, rank: int, world: int, owned: int | None = None) -> None:
    """The second half, in place: chunk ``owned`` (default ``(rank + 1) % world``, where
    ``ring_reduce_scatter`` leaves the sum) is this rank's to give; after N - 1 steps every
    chunk of x holds its owner's values."""
    flat = _flat(x, "ring_all_gather")
    owned = (rank + 1) % world if owned is None else owned
    bounds = chunk_bounds(flat.numel(), world)
    for step in range(world - 1):
        _step(flat, (owned - step) % world, (owned - step - 1) % world, bounds, rank, world, add=False)


def ring_all_reduce(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """x, in place, becomes the sum of every rank's x: a reduce-scatter, then an all-gather.
    Returns x."""
    owned = ring_reduce_scatter(x, rank, world)
    ring_all_gather(x, rank, world, owned)
    return x


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """The bus bandwidth of an all-reduce of ``nbytes`` that took ``seconds`` on ``world``
    ranks, in bytes a second: the algorithm bandwidth (nbytes / seconds) times 2 (N - 1) / N,
    the share of the data each rank sends, as nccl-tests reports it."""
    return nbytes / seconds * (2 * (world - 1) / world)
