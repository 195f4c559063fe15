"""Data parallelism written from scratch (lesson 13): every rank holds the whole model, runs its
own batch, and the ranks average their gradients before the optimizer steps, so every copy of
the model takes the same step. Then ZeRO-1: the optimizer's state split across the ranks.

    BucketedDDP(module, bucket_mb=25)    torch DDP's algorithm in Python: rank 0's weights to every rank,
                                         then gradients averaged in buckets while the backward runs
        .buckets                         the buckets (parameter names, sizes), in launch order
        .events                          the last backward, in order: ("ready", name), ("launch", bucket),
                                         ("wait", bucket)
        .finish()                        wait for the all-reduces, averages into p.grad (runs by itself
                                         at the end of every backward)
        .no_sync()                       a context: its backwards accumulate locally, no communication
    BucketedDDP(module, ring=True)       the same with kernels/collectives.py's ring (synchronous)
    ZeroAdamW(params, lr, weight_decay)  ZeRO-1 AdamW: reduce-scatter the gradients, AdamW on this
                                         rank's shard (the course's kernel), all-gather the parameters
        .step(), .zero_grad()            as a torch optimizer
        .state_bytes()                   the optimizer state this rank holds: 8 bytes x its shard

Both run inside a rank whose process group is initialised (``runtime.run_ranks``, or
``torch.distributed.init_process_group`` yourself): gloo with CPU tensors, NCCL with CUDA ones.

**Why buckets.** All-reducing each gradient on its own costs one collective's latency per
tensor (a GPT has a few hundred); all-reducing everything at the end waits for the whole
backward before the first byte moves. DDP does neither: it packs gradients into buckets of about
``bucket_mb`` megabytes and all-reduces a bucket as soon as all its gradients exist.

**Why the order is reversed, and how the overlap happens.** The backward produces gradients
roughly from the last layer to the first, so the buckets are filled with the parameters in
reverse order of registration (``module.parameters()`` reversed): the first bucket is complete
early in the backward. (torch's DDP makes the same guess when it must; by default it puts every
gradient into one bucket for the first backward, then lays its buckets out in the order the
gradients really arrived, which is the reverse order for a model whose layers are registered in
the order the forward calls them.) Each parameter has a hook
(``Tensor.register_post_accumulate_grad_hook``) that runs once its ``.grad`` holds this
backward's gradient; it copies the gradient into its bucket's flat buffer, and when the bucket's
last gradient arrives the bucket is launched, ``dist.all_reduce(buffer, async_op=True)``: the
all-reduce runs on the communication backend's own threads (gloo) or stream (NCCL) while
autograd computes the earlier layers' gradients. Buckets are launched in order (bucket i + 1
waits for bucket i to be launched), so every rank issues its collectives in the same sequence,
which collectives require. At the end of the backward ``finish`` waits for every all-reduce and
copies the averages back into the ``.grad`` tensors, so ``loss.backward()`` returns with averaged
gradients, as with torch's DDP; the optimizer needs no change.

**Why divide before summing.** The average is sum / N. torch's reducer multiplies each gradient
by 1/N while copying it into the bucket and then all-reduces a sum ("pre-division"; torch's
``allreduce_hook`` comm hook divides first too): the sum of N already-divided values cannot
overflow where the plain sum of large float16 gradients would. ``BucketedDDP`` does exactly
that, the same multiplication by the same float, so with the same all-reduce its gradients are
bit-for-bit torch's: at two ranks, where the sum of two numbers does not depend on the order,
the losses and the weights of a training run are equal to the bit
(``tests/test_data_parallel.py``). At three ranks and more the order in which gloo's ring adds
the values depends on where a value sits in the bucket, and torch lays its buckets out
differently (every gradient in one bucket for the first backward, then buckets rebuilt in the
order the gradients arrived): the results agree within float32 rounding, not to the bit.

**Parameters.** Those with ``requires_grad=False`` are broadcast at construction but get no
bucket. A parameter whose gradient never arrives in a backward (a branch the forward did not use)
raises, at the end of that backward, a ``RuntimeError`` naming it (``unused="error"``, the
default; torch's DDP complains only at the next forward); ``unused="zeros"`` counts it as
a zero gradient on that rank instead and gives it the average of the ranks' gradients (zeros if
no rank used it). Every rank must see the same parameters unused, or the ranks disagree on which
collectives to run.

**ZeRO-1.** Plain data parallelism with AdamW keeps ``exp_avg`` and ``exp_avg_sq`` for every
parameter on every rank: 2 x 4 bytes x P (float32), the same on all N ranks. ZeRO stage 1 keeps
each value's state on one rank only: the flat vector of the P parameters is cut into N chunks
(``chunk_bounds``, sizes that need not divide: the first P % N chunks hold one more value), and
a rank holds the state of its chunk, 2 x 4 x P / N bytes. Its step:

    1. reduce-scatter the flat gradient (each multiplied by 1/N first): the rank's chunk becomes
       the average gradient of its parameters, the only part of the gradient it needs
    2. AdamW on the chunk, with the course's kernel (``kernels.get("adamw", backend)``, float32)
    3. all-gather the chunks: every rank holds every updated parameter again

Steps 1 and 3 together move the same bytes as the one all-reduce of plain DDP (an all-reduce is
a reduce-scatter followed by an all-gather), so the saving is free in communication. Both run on
``kernels/collectives.py``'s ring, which takes any size as it is; ``torch.distributed``'s
``reduce_scatter_tensor`` wants N equal chunks, so it would need the vector padded to a multiple
of N. The ring's reduce-scatter leaves the sum in chunk ``(rank + 1) % N``, so that is the chunk
(``owned``) whose state a rank holds.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Iterable

import torch
from torch import nn

from kernels.collectives import chunk_bounds, ring_all_gather, ring_all_reduce, ring_reduce_scatter

__all__ = ["BucketedDDP", "Bucket", "ZeroAdamW"]

MB = 1024 * 1024  # bytes in one of bucket_mb's megabytes (torch's bucket_cap_mb counts the same way)


def _dist(op: str):
    """``torch.distributed``, once a process group exists; else a clear error."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{op}: no process group is initialised: run it inside a rank "
                           "(runtime.run_ranks(fn, world), or after torch.distributed.init_process_group)")
    return dist


def _broadcast_from_rank0(tensors: list[torch.Tensor], dist) -> None:
    """Rank 0's values into ``tensors`` on every rank: one broadcast per dtype and device (the
    tensors flattened into one buffer), not one per tensor."""
    groups: dict = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for group in groups.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        dist.broadcast(flat, src=0)
        offset = 0
        with torch.no_grad():
            for t in group:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()


@dataclasses.dataclass
class Bucket:
    """One bucket: its parameters (``names``, ``params``, each at ``offsets[i]`` in ``buffer``,
    ``numels[i]`` values), the flat buffer its gradients are averaged in, and this backward's
    state (``pending``: gradients not yet arrived; ``work``: the all-reduce in flight)."""
    index: int
    names: list[str]
    params: list[torch.Tensor]
    offsets: list[int]
    numels: list[int]
    buffer: torch.Tensor
    pending: int = 0
    work: object = None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def _check_bucket_mb(bucket_mb) -> float:
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) or not math.isfinite(bucket_mb) \
            or bucket_mb <= 0:
        raise ValueError(f"BucketedDDP: bucket_mb must be a number > 0 (megabytes of gradients a bucket holds), "
                         f"got {bucket_mb!r}")
    return float(bucket_mb)


class BucketedDDP(nn.Module):
    """``module`` data-parallel across the process group's ranks: rank 0's parameters and
    buffers copied to every rank now, gradients averaged over the ranks in buckets of about
    ``bucket_mb`` MB during each backward. ``ring=True`` sums each bucket with
    ``kernels.collectives.ring_all_reduce`` (synchronous: no overlap) instead of
    ``torch.distributed.all_reduce``. ``unused``: "error" or "zeros", what a parameter whose
    gradient never arrives does (module docstring). ``broadcast_buffers``: rank 0's buffers
    (BatchNorm's running statistics) copied to every rank at each forward, as torch's DDP does."""

    def __init__(self, module: nn.Module, bucket_mb: float = 25.0, *, ring: bool = False, unused: str = "error",
                 broadcast_buffers: bool = True):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"BucketedDDP: module must be a torch.nn.Module, got {type(module).__name__}")
        bucket_mb = _check_bucket_mb(bucket_mb)
        if unused not in ("error", "zeros"):
            raise ValueError(f"BucketedDDP: unused must be 'error' (a gradient that never arrives raises) or "
                             f"'zeros' (it counts as zeros), got {unused!r}")
        named = list(module.named_parameters())
        trained = [(n, p) for n, p in named if p.requires_grad]
        if not trained:
            raise ValueError("BucketedDDP: the module has no parameter that requires a gradient: there is nothing "
                             "to average")
        for n, p in trained:
            if p.is_sparse:
                raise ValueError(f"BucketedDDP: parameter {n} is sparse; only dense parameters are bucketed")
        dist = _dist("BucketedDDP")
        self.module = module
        self.bucket_mb, self.ring, self.unused = bucket_mb, bool(ring), unused
        self.broadcast_buffers = broadcast_buffers
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._check_same_model(named, dist)
        _broadcast_from_rank0([p.data for _, p in named] + list(module.buffers()), dist)
        self.buckets = self._make_buckets(trained, int(bucket_mb * MB))
        self._where = {}   # id(param) -> (bucket, slot)
        for b in self.buckets:
            for slot, p in enumerate(b.params):
                self._where[id(p)] = (b, slot)
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for _, p in trained]
        self._arrived: set[int] = set()
        self._in_backward = False
        self._next_bucket = 0
        self._sync = True
        self.events: list[tuple[str, object]] = []

    # -- construction -------------------------------------------------------------------------------
    def _check_same_model(self, named, dist) -> None:
        """Every rank must wrap the same architecture: same number of parameters and values."""
        device = named[0][1].device if named else torch.device("cpu")
        mine = torch.tensor([len(named), sum(p.numel() for _, p in named)], dtype=torch.float64, device=device)
        lo, hi = mine.clone(), mine.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        if not torch.equal(lo, hi):
            raise ValueError(f"BucketedDDP: the ranks wrap different models (rank {self.rank}: {len(named)} "
                             f"parameters, {int(mine[1])} values; the ranks range from {lo.tolist()} to "
                             f"{hi.tolist()})")

    @staticmethod
    def _make_buckets(trained, cap_bytes: int) -> list[Bucket]:
        """Parameters in reverse order of registration, into buckets closed once they hold
        ``cap_bytes`` or more (one open bucket per dtype and device, as torch's DDP)."""
        open_: dict = {}
        closed: list[list] = []
        for name, p in reversed(trained):
            key = (p.dtype, p.device)
            group = open_.setdefault(key, [])
            group.append((name, p))
            if sum(q.numel() * q.element_size() for _, q in group) >= cap_bytes:
                closed.append(open_.pop(key))
        closed += [g for g in open_.values() if g]
        buckets = []
        for i, group in enumerate(closed):
            numels = [p.numel() for _, p in group]
            offsets = [sum(numels[:j]) for j in range(len(numels))]
            p0 = group[0][1]
            buckets.append(Bucket(i, [n for n, _ in group], [p for _, p in group], offsets, numels,
                                  torch.zeros(sum(numels), dtype=p0.dtype, device=p0.device)))
        return buckets

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        self._in_backward = False  # a backward that raised half-way leaves nothing behind
        if self.broadcast_buffers and self.world > 1:
            buffers = list(self.module.buffers())
            if buffers:
                _broadcast_from_rank0(buffers, _dist("BucketedDDP"))
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backwards inside this block only accumulate into ``.grad`` on each rank; the first
        backward after it averages the accumulated gradients (gradient accumulation)."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    # -- backward -----------------------------------------------------------------------------------
    def _start_backward(self) -> None:
        self._in_backward = True
        self._arrived = set()
        self._next_bucket = 0
        self.events = []
        for b in self.buckets:
            b.pending, b.work = len(b.params), None
        # finish() runs when autograd has computed every gradient of this backward
        torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def _grad_ready(self, p: torch.Tensor) -> None:
        """A parameter's hook: its gradient, times 1/N, into its bucket; a full bucket launched."""
        if not self._sync:
            return
        if not self._in_backward:
            self._start_backward()
        bucket, slot = self._where[id(p)]
        name = bucket.names[slot]
        if id(p) in self._arrived:
            raise RuntimeError(f"BucketedDDP: the gradient of {name} arrived twice in one backward (reentrant "
                               "checkpointing?): each parameter may get its gradient once per backward")
        if p.grad.is_sparse:
            raise RuntimeError(f"BucketedDDP: {name} got a sparse gradient; only dense gradients are bucketed")
        self._arrived.add(id(p))
        self.events.append(("ready", name))
        o, n = bucket.offsets[slot], bucket.numels[slot]
        torch.mul(p.grad, 1.0 / self.world, out=bucket.buffer[o:o + n].view_as(p))  # pre-division, as torch
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch the complete buckets in order, from the first not yet launched."""
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].pending == 0:
            bucket = self.buckets[self._next_bucket]
            self.events.append(("launch", bucket.index))
            if self.ring:
                ring_all_reduce(bucket.buffer, self.rank, self.world)
            else:
                import torch.distributed as dist
                bucket.work = dist.all_reduce(bucket.buffer, async_op=True)
            self._next_bucket += 1

    def finish(self) -> None:
        """Wait for every bucket's all-reduce and copy the averaged gradients into ``p.grad``.
        Runs by itself at the end of each backward; calling it again does nothing."""
        if not self._in_backward:
            return
        missing = [b.names[s] for b in self.buckets for s, p in enumerate(b.params) if id(p) not in self._arrived]
        if missing and self.unused == "error":
            for b in self.buckets:
                if b.work is not None:
                    b.work.wait()
            self._in_backward = False
            raise RuntimeError(f"BucketedDDP: no gradient arrived in this backward for {', '.join(missing)}: the "
                               "forward did not use them. Pass unused='zeros' to count them as zero gradients "
                               "(the same parameters unused on every rank), or freeze them (requires_grad=False)")
        for b in self.buckets:
            for s, p in enumerate(b.params):
                if id(p) not in self._arrived:   # unused="zeros"
                    b.buffer[b.offsets[s]:b.offsets[s] + b.numels[s]].zero_()
                    b.pending -= 1
        self._launch_ready()
        with torch.no_grad():
            for b in self.buckets:
                if b.work is not None:
                    self.events.append(("wait", b.index))
                    b.work.wait()
                for p, o, n in zip(b.params, b.offsets, b.numels):
                    avg = b.buffer[o:o + n].view_as(p)
                    if p.grad is None:
                        p.grad = avg.clone()
                    else:
                        p.grad.copy_(avg)
        self._in_backward = False

    def remove_hooks(self) -> None:
        """Take the gradient hooks off the parameters (the module back to plain, unsynchronised)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _param_groups(params, lr: float, weight_decay: float) -> list[dict]:
    if isinstance(params, torch.Tensor):
        raise TypeError("ZeroAdamW: params must be an iterable of tensors or of parameter-group dicts (as "
                        "torch.optim.AdamW takes), got one tensor: wrap it in a list")
    params = list(params)
    if not params:
        raise ValueError("ZeroAdamW: got no parameters")
    groups = params if isinstance(params[0], dict) else [{"params": params}]
    out = []
    for g in groups:
        if not isinstance(g, dict) or "params" not in g:
            raise TypeError("ZeroAdamW: a parameter group is a dict with 'params' (and optional 'lr', "
                            "'weight_decay'), as torch.optim.AdamW takes")
        ps = [g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"])
        for p in ps:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"ZeroAdamW: params must be tensors, got {type(p).__name__}")
            if p.dtype != torch.float32:
                raise TypeError(f"ZeroAdamW: every parameter must be float32 (the AdamW kernel's dtype), got "
                                f"{p.dtype}: keep float32 master weights")
        out.append(dict(params=ps, lr=float(g.get("lr", lr)), weight_decay=float(g.get("weight_decay", weight_decay))))
    return out


class ZeroAdamW:
    """AdamW with its state sharded over the ranks (ZeRO stage 1). Give it the local (not yet
    averaged) gradients: its reduce-scatter averages them. ``params``: tensors or parameter
    groups (dicts with ``params`` and optional ``lr``, ``weight_decay``), float32, on one device.
    ``backend``: whose AdamW kernel updates the shard (``kernels.get("adamw", backend)``:
    "triton", "cuda" or "numba")."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, backend: str = "triton"):
        self.groups = _param_groups(params, lr, weight_decay)
        from kernels import LANGUAGES
        if backend not in LANGUAGES:
            raise ValueError(f"ZeroAdamW: backend must be one of {LANGUAGES} (whose AdamW kernel runs the "
                             f"update), got {backend!r}")
        dist = _dist("ZeroAdamW")
        self.backend, self.betas, self.eps = backend, (float(betas[0]), float(betas[1])), float(eps)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        every = [p for g in self.groups for p in g["params"]]
        devices = {p.device for p in every}
        if len(devices) != 1:
            raise ValueError(f"ZeroAdamW: the parameters must be on one device, got {sorted(map(str, devices))}")
        self.device = devices.pop()
        # the flat layout: group after group, each parameter's values at [start, start + numel)
        self._segments, self._group_ranges, start = [], [], 0
        for gi, g in enumerate(self.groups):
            g0 = start
            for p in g["params"]:
                self._segments.append((gi, p, start, p.numel()))
                start += p.numel()
            self._group_ranges.append((g0, start))
        self.numel = start
        self.owned = (self.rank + 1) % self.world          # where ring_reduce_scatter leaves the sum
        self.shard = chunk_bounds(self.numel, self.world)[self.owned]
        n = self.shard[1] - self.shard[0]
        self.exp_avg = torch.zeros(n, dtype=torch.float32, device=self.device)
        self.exp_avg_sq = torch.zeros(n, dtype=torch.float32, device=self.device)
        self.steps = 0
        self._flat = torch.empty(self.numel, dtype=torch.float32, device=self.device)
        self._adamw = None

    def state_bytes(self) -> int:
        """Bytes of optimizer state on this rank: exp_avg and exp_avg_sq of its shard, 8 per
        value (plain DDP with AdamW holds 8 x every parameter on every rank)."""
        return self.exp_avg.nbytes + self.exp_avg_sq.nbytes

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p, _, _ in self._segments:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW step on the averaged gradient: reduce-scatter, update the shard, all-gather.
        A parameter without ``.grad`` counts as a zero gradient."""
        if self._adamw is None:
            import kernels
            self._adamw = kernels.get("adamw", self.backend)
        flat, (lo, hi), inv = self._flat, self.shard, 1.0 / self.world
        # 1. the flat gradient, each value times 1/N, reduce-scattered: chunk `owned` is the average
        for _, p, o, n in self._segments:
            if p.grad is None:
                flat[o:o + n].zero_()
            else:
                torch.mul(p.grad, inv, out=flat[o:o + n].view_as(p))
        ring_reduce_scatter(flat, self.rank, self.world)
        grad = flat[lo:hi].clone()
        # 2. this rank's parameters into the flat buffer, AdamW on them (one launch per group)
        for _, p, o, n in self._segments:
            a, b = max(o, lo), min(o + n, hi)
            if a < b:
                flat[a:b] = p.detach().reshape(-1)[a - o:b - o]
        self.steps += 1
        beta1, beta2 = self.betas
        for g, (g0, g1) in zip(self.groups, self._group_ranges):
            a, b = max(g0, lo), min(g1, hi)
            if a < b:
                s = slice(a - lo, b - lo)   # the group's part of the shard, in the shard's own arrays
                self._adamw(flat[a:b], grad[s], self.exp_avg[s], self.exp_avg_sq[s], step=self.steps, lr=g["lr"],
                            beta1=beta1, beta2=beta2, eps=self.eps, weight_decay=g["weight_decay"])
        # 3. every rank's updated chunk to every rank, then back into the parameters
        ring_all_gather(flat, self.rank, self.world, self.owned)
        for _, p, o, n in self._segments:
            p.copy_(flat[o:o + n].view_as(p))
