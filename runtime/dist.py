"""Several ranks on one machine: a function run as N processes that talk through
``torch.distributed``, for lesson 13's collectives (gloo on the CPU, NCCL on GPUs).

    outs = runtime.run_ranks(fn, 4, x)               # fn(rank, world, x) in 4 processes; their returns, by rank
    outs = runtime.run_ranks(fn, 2, backend="nccl")  # one GPU a rank (fn importable: see below)

With gloo each rank is a process forked from this one, so a function defined in a notebook
runs as it is. NCCL needs a fresh process per rank (CUDA does not survive a fork), started with
``spawn``: ``fn`` and its arguments must then be importable and picklable (a function of a
module, not of a notebook). The ranks meet through a file rendezvous in a temporary folder.

What each rank returns comes back (tensors moved to the CPU). An exception in a rank comes back
as ``RankError``, which names the rank and carries its traceback. A run in which some rank is
still waiting after ``timeout_s`` seconds fails with ``RankTimeout``, which says what every rank
was doing: each point-to-point operation (``send``, ``recv``, ``isend``, ``irecv`` and their
``wait``) is recorded as it starts and ends, so the ring's typical hang (a receive that no rank
sends, a send that no rank receives, each rank waiting on the next) reads as such.

NCCL's NVLink multicast stays off in every rank (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``), whatever the environment.
"""
from __future__ import annotations

import datetime
import faulthandler
import multiprocessing as mp
import os
import pickle
import queue
import shutil
import sys
import tempfile
import time
import traceback

import torch

__all__ = ["run_ranks", "RankError", "RankTimeout", "NO_MULTICAST"]

#: Set in every rank's environment: NVLink multicast off (the lent machines' rule).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# What a rank is doing, four ints a rank in a shared array: the operation it waits in (or
# whether it finished), its peer, how many values, and the rank its last posted isend went to
# plus one (0: none outstanding).
_IDLE, _SEND, _RECV, _DONE, _FAILED = 0, 1, 2, 3, 4
_WORDS = 4


class RankError(RuntimeError):
    """An exception raised in one rank: ``rank``, the exception's type name and message, and
    its traceback (in the message)."""

    def __init__(self, rank: int, kind: str, message: str, trace: str):
        self.rank, self.kind, self.detail = rank, kind, message
        super().__init__(f"rank {rank} raised {kind}: {message}\n\n{trace}")


class RankTimeout(RuntimeError):
    """Some rank still waited after the time limit: ``waits`` maps each such rank to
    ``(operation, peer, values)`` (operation 1 a send, 2 a receive); the message says what every
    rank was doing, and why they hang where it can tell."""

    def __init__(self, message: str, waits: dict):
        self.waits = waits
        super().__init__(message)


def _describe(rank: int, op: int, peer: int, n: int) -> str:
    if op == _SEND:
        return f"rank {rank} waits to send {n} values to rank {peer}"
    if op == _RECV:
        return f"rank {rank} waits to receive {n} values from rank {peer}"
    if op == _DONE:
        return f"rank {rank} finished"
    if op == _FAILED:
        return f"rank {rank} raised an exception"
    return f"rank {rank} is not in a send or receive (computing, or in a collective)"


def _diagnosis(states: list[tuple[int, int, int, int]]) -> str:
    """Why the ranks hang, from what each waits on: an unmatched receive or send, ranks that
    disagree on their neighbours, or ranks that all wait to receive."""
    lines = []
    for r, (op, peer, _, _) in enumerate(states):
        if op not in (_SEND, _RECV) or not 0 <= peer < len(states):
            continue
        other, other_peer, _, other_sent = states[peer]
        if op == _RECV and other_sent and other_sent - 1 != r:
            lines.append(f"rank {r} waits to receive from rank {peer}, but rank {peer} sent to rank "
                         f"{other_sent - 1}: the ranks do not agree on who is next in the ring (rank r sends "
                         f"to (r + 1) % world and receives from (r - 1) % world)")
        elif op == _RECV and other == _DONE:
            lines.append(f"rank {peer} finished without sending to rank {r}: a send is missing, or went to "
                         f"another rank")
        elif op == _SEND and other == _DONE:
            lines.append(f"rank {peer} finished without receiving from rank {r}: a receive is missing, or "
                         f"came from another rank")
        elif op == _RECV and other == _SEND and other_peer != r:
            lines.append(f"rank {r} receives from rank {peer}, but rank {peer} sends to rank {other_peer}: "
                         f"the ranks do not agree on who is next in the ring")
        elif op == _RECV and other == _RECV and not other_sent:
            lines.append(f"ranks {r} and {peer} both wait to receive, and neither has posted its send: post "
                         f"the send before waiting for the receive (isend, irecv, then wait on both)")
    waiting = [s for s in states if s[0] in (_SEND, _RECV)]
    if len(waiting) > 1 and all(s[0] == _SEND for s in waiting) and all(
            states[s[1]][0] == _SEND for s in waiting if 0 <= s[1] < len(states)):
        lines.append("every rank waits in a blocking send, and no rank has posted the receive it waits for: a "
                     "blocking send returns only once its receive is posted, so post both first (isend and "
                     "irecv, then wait on both)")
    return "\n".join(dict.fromkeys(lines))


def _instrument(dist, state, rank: int):
    """Record every point-to-point operation of this rank in ``state`` while it waits."""
    base = rank * _WORDS

    def mark(op, peer=-1, n=0):
        state[base], state[base + 1], state[base + 2] = op, peer, n

    def sent(peer):  # an isend posted to `peer` (None: none outstanding)
        state[base + 3] = 0 if peer is None else peer + 1

    send, recv, isend, irecv = dist.send, dist.recv, dist.isend, dist.irecv

    def peer_of(args, kwargs, name):
        return kwargs.get(name, args[1] if len(args) > 1 else -1)

    def blocking(real, op, name):
        def call(tensor, *args, **kwargs):
            mark(op, peer_of((tensor, *args), kwargs, name), tensor.numel())
            out = real(tensor, *args, **kwargs)
            mark(_IDLE)
            return out
        return call

    class Recorded:
        """torch's Work of an isend or irecv, whose wait() is recorded."""

        def __init__(self, work, op, peer, n):
            self._work, self._op, self._peer, self._n = work, op, peer, n

        def wait(self, *args, **kwargs):
            mark(self._op, self._peer, self._n)
            out = self._work.wait(*args, **kwargs)
            mark(_IDLE)
            if self._op == _SEND:
                sent(None)
            return out

        def __getattr__(self, name):
            return getattr(self._work, name)

    def posted(real, op, name):
        def call(tensor, *args, **kwargs):
            work = real(tensor, *args, **kwargs)
            peer = peer_of((tensor, *args), kwargs, name)
            if op == _SEND:
                sent(peer)
            return Recorded(work, op, peer, tensor.numel()) if work else work
        return call

    dist.send, dist.recv = blocking(send, _SEND, "dst"), blocking(recv, _RECV, "src")
    dist.isend, dist.irecv = posted(isend, _SEND, "dst"), posted(irecv, _RECV, "src")


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _tail(path: str) -> str:
    """The last meaningful line a rank wrote to stderr (a C++ library's reason for aborting)."""
    lines = [ln.strip() for ln in _read(path).splitlines() if ln.strip()]
    why = [ln for ln in lines if "what():" in ln or "Error" in ln or "error" in ln]
    return (why or lines or ["(nothing on stderr)"])[-1]


def _stalled(state, world: int, got) -> bool:
    """Every rank without a result waits in a send or a receive."""
    pending = [r for r in range(world) if r not in got and state[r * _WORDS] != _DONE]
    return bool(pending) and all(state[r * _WORDS] in (_SEND, _RECV) for r in pending)


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    return x


def _rank_main(fn, rank, world, args, backend, init, timeout_s, state, results, err_path):
    os.environ.update(NO_MULTICAST)
    # What the rank writes to stderr, its C++ libraries' last words included, goes to a file the
    # parent shows (and quotes, for a rank that dies without a Python exception).
    sys.stderr.flush()
    faulthandler.disable()  # the parent's (pytest's) crash dump does not belong to a rank
    fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    import torch.distributed as dist
    if backend == "gloo":
        # A forked child must not enter the OpenMP pool its parent may have started (it would
        # hang); N ranks on one CPU are N processes, one thread each is what they get anyway.
        torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        # torch's own limit is later than the watchdog's, so the watchdog explains a hang first
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s + 60))
        _instrument(dist, state, rank)
        out = _to_cpu(fn(rank, world, *args))
        try:
            payload = pickle.dumps(("ok", out))
        except Exception as e:
            payload = pickle.dumps(("error", type(e).__name__, f"what rank {rank} returned cannot be sent back: {e}",
                                    traceback.format_exc()))
        results.put((rank, payload))
        state[rank * _WORDS] = _DONE
        dist.barrier()  # nobody tears the group down while a peer still talks to it
        dist.destroy_process_group()
    except BaseException as e:  # everything goes back to the parent
        state[rank * _WORDS] = _FAILED
        results.put((rank, pickle.dumps(("error", type(e).__name__, str(e), traceback.format_exc()))))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)  # no atexit handlers of the parent's (a notebook's, pytest's) in a forked rank


def run_ranks(fn, world: int, *args, backend: str = "gloo", timeout_s: float = 60.0,
              stall_s: float | None = None) -> list:
    """``[fn(0, world, *args), ..., fn(world - 1, world, *args)]``, each call in a process of its
    own joined to a process group of ``world`` ranks (``backend`` "gloo" or "nccl"). Raises
    ``RankError`` (a rank raised) or ``RankTimeout`` (some rank still waited after
    ``timeout_s`` seconds; every rank is then stopped).

    ``stall_s``: also give up, as after the time limit, once every rank that has not finished
    has waited in a send or a receive, with nothing changing, for ``stall_s`` seconds: a
    deadlock, found without waiting for ``timeout_s`` (for small transfers only: a large one
    can legitimately wait that long)."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"run_ranks: world must be a positive int (the number of ranks), got {world!r}")
    if stall_s is not None and not stall_s > 0:
        raise ValueError(f"run_ranks: stall_s must be a positive number of seconds or None, got {stall_s!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"run_ranks: backend must be 'gloo' (CPU tensors) or 'nccl' (CUDA tensors), got {backend!r}")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("run_ranks: NCCL needs NVIDIA GPUs, and none is visible here: use backend='gloo' "
                               "with CPU tensors (the same ring code runs on both)")
        if world > torch.cuda.device_count():
            raise RuntimeError(f"run_ranks: {world} NCCL ranks need {world} GPUs, this machine has "
                               f"{torch.cuda.device_count()}")
    ctx = mp.get_context("spawn" if backend == "nccl" else "fork")
    folder = tempfile.mkdtemp(prefix="course-ranks-")
    state = ctx.Array("i", world * _WORDS, lock=False)
    results = ctx.Queue()
    init = "file://" + os.path.join(folder, "rendezvous")
    errs = [os.path.join(folder, f"stderr-{r}") for r in range(world)]
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world, args, backend, init, timeout_s, state, results,
                                                  errs[r]), daemon=True) for r in range(world)]
    got: dict[int, tuple] = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        seen, since = None, time.monotonic()
        while len(got) < world:
            try:
                rank, payload = results.get(timeout=max(0.05, min(0.5, deadline - time.monotonic())))
                got[rank] = pickle.loads(payload)
                if got[rank][0] == "error":
                    break
            except queue.Empty:
                if time.monotonic() > deadline:
                    break
                if stall_s is not None:
                    now_state = tuple(state[:])
                    if now_state != seen:
                        seen, since = now_state, time.monotonic()
                    elif time.monotonic() - since > stall_s and _stalled(now_state, world, got):
                        timeout_s = time.monotonic() - (deadline - timeout_s)
                        break
                if all(not p.is_alive() for p in procs) and results.empty():
                    break
        failed = sorted(r for r, v in got.items() if v[0] == "error")
        if failed:
            # a rank killed by its C++ library (gloo aborts on a message of the wrong size) is the
            # cause; the others only see the connection it closed
            for p in procs:
                p.join(timeout=0.5)
            died = [r for r in range(world) if r not in got and (procs[r].exitcode or 0) < 0]
            if died:
                r = died[0]
                last = _tail(errs[r])
                raise RankError(r, "a crash", f"rank {r} died (signal {-procs[r].exitcode}): {last}",
                                f"rank {r}'s last words on stderr:\n{last}")
            _, kind, message, trace = got[failed[0]]
            raise RankError(failed[0], kind, message, trace)
        if len(got) < world:
            states = [tuple(state[r * _WORDS:(r + 1) * _WORDS]) for r in range(world)]
            waits = {r: s[:3] for r, s in enumerate(states) if s[0] in (_SEND, _RECV)}
            lost = [r for r in range(world) if r not in got and not procs[r].is_alive() and r not in waits]
            lines = [_describe(r, *s[:3]) for r, s in enumerate(states)]
            for r in lost:
                lines[r] = f"rank {r} ended without a result (exit code {procs[r].exitcode})"
            why = _diagnosis(states)
            raise RankTimeout(f"after {timeout_s:.3g} s not every rank had finished:\n  " + "\n  ".join(lines) +
                              (f"\n{why}" if why else ""), waits)
        return [got[r][1] for r in range(world)]
    finally:
        for p in procs:
            if p.is_alive():
                p.join(timeout=2.0 if len(got) == world else 0.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
        results.close()
        for path in errs:  # what the ranks wrote to stderr, shown where the caller sees its own
            text = _read(path)
            if text:
                sys.stderr.write(text)
        shutil.rmtree(folder, ignore_errors=True)
