"""Each check cell's verdict, decided outside the sandbox: the learner's function called again
on fresh inputs, its results compared here with the float64 reference.

A check cell runs its grader inside the kernel, where the learner's code runs too: code there
can fake a grader, a module, IPython or the kernel's replies. So the score does not rest on the
kernel's word alone. From the instructor's notebook, ``plans`` finds each check cell's grader
calls (``utils.check_relu(relu)``) whose grader is in ``VERIFIERS``; after such a cell passed,
the runner has the kernel call the learner's function (``relu``) on inputs drawn from a seed
it picks only then (``runner.VERIFY_SOURCE``), and sends the results back. ``compare``, in the
grading process, where no code of the learner's ran, draws the same inputs from that seed
itself, computes the topic's float64 reference and compares: a check cell earns its points only
when the kernel reported it passed *and* its function's results are right here.

Lesson 13's graders run the learner's function as ranks (``runtime.dist.run_ranks``): their
``RankVerifier`` has the kernel run it again as a few worlds of ranks on awkward sizes, each
rank's x drawn from the seed by the topic's own input maker, and send back every rank's x after
the call (and the chunk index a reduce-scatter returned); ``compare`` draws every rank's x
from that seed itself and checks the collective's result exactly (float64 sums of values
exact in float32).

What remains (README, "Grading and its limits"): code in the kernel can still make torch compute
the results (the grader in the kernel refuses that, but its verdict can be faked), and a grader
that is not in ``VERIFIERS`` (or a check cell that calls one with arguments other than a name)
is scored from the kernel's report only: ``unverified`` names them.
"""
from __future__ import annotations

import ast
import base64
import binascii
import importlib
import json
import struct
from dataclasses import dataclass

from .feedback import cell_source
from .runner import MAX_VERIFY_BYTES, nbgrader_meta

#: How much an element may differ from the float64 reference, as a multiple of the larger of
#: the topic's tolerance and ``utils.TOLERANCES[float32]``: wrong results (the input returned,
#: a missing tail, x + x) are off by far more; right ones in another order never are.
MARGIN = 2.0
#: The dtypes a result may have, with their sizes.
_DTYPES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Verifier:
    """How to call a grader's function again: its inputs (``make(shape, seed=, device=)``,
    the topic's input maker), the float64 reference of its result (``reference(*inputs)``),
    the shapes (a key of the simulation's ``utils.SIZES``: the sandbox always simulates), and
    the topic's tolerance ``tolerance(inputs, ref)`` (None: ``utils.TOLERANCES[float32]``).
    Each is ``"module:function"``."""
    make: str
    reference: str
    shapes: str
    tolerance: str | None = None


#: Where lesson 13's graders and their input maker live (both sides import them: the kernel to
#: build each rank's x, the grading process to build it again).
_COLLECTIVES = "utils.topics.collectives"


@dataclass(frozen=True)
class RankVerifier:
    """How to run a grader's function again as ranks (``runtime.dist.run_ranks``, gloo): the
    collective it computes (``"reduce_scatter"``, ``"all_gather"``, ``"all_reduce"``: what its
    result must be), rank r's x (``make(seed, r, n)``: integers and halves, so that every sum
    over ranks is exact in float32), the chunks (``bounds(n, world)``), the all-gather's owners
    (``owners(world, seed)``: shifted by the seed, so no fixed rule finds them) and what it
    writes into the chunks a rank does not own (``marker``), the grader's limits on a run
    (``timeout``, ``stall``), each ``"module:name"``; and the worlds and sizes run (a value
    fewer than the ranks, a few, an awkward thousand: a few seconds in all)."""
    collective: str
    make: str = f"{_COLLECTIVES}:_values"
    bounds: str = "kernels.collectives:chunk_bounds"
    owners: str = f"{_COLLECTIVES}:_owned_chunks"
    marker: str = f"{_COLLECTIVES}:MARKER"
    timeout: str = f"{_COLLECTIVES}:TIMEOUT_S"
    stall: str = f"{_COLLECTIVES}:STALL_S"
    worlds: tuple[int, ...] = (2, 3)
    sizes: tuple[int, ...] = (1, 7, 1003)


def _topic(t: str, make: str, ref: str, shapes: str, tol: str | None = None) -> Verifier:
    m = f"utils.topics.{t}"
    return Verifier(f"{m}:{make}", ref if ":" in ref else f"{m}:{ref}", shapes,
                    None if tol is None else tol if ":" in tol else f"{m}:{tol}")


#: The graders whose results are verified outside the sandbox: one result, inputs a topic's
#: input maker draws (``Verifier``), or the function run as ranks (``RankVerifier``).
VERIFIERS = {
    "check_add": _topic("add", "add_input", "add_ref64", "bench_check_sizes"),
    "check_add_2d": _topic("add", "add_input", "add_ref64", "bench_check_shapes"),
    "check_relu": _topic("relu", "relu_input", "relu_ref64", "bench_check_sizes"),
    "check_relu_2d": _topic("relu", "relu_input", "relu_ref64", "bench_check_shapes"),
    "check_gelu": _topic("gelu", "gelu_input", "gelu_tanh_ref", "bench_check_sizes"),
    "check_sum": _topic("reduction", "sum_input", "sum_ref64", "bench_check_sizes", "sum_tol"),
    "check_row_max": _topic("softmax", "softmax_input", "utils.topics.reduction:row_max_ref64",
                            "bench_check_shapes"),
    "check_softmax": _topic("softmax", "softmax_input", "softmax_ref64", "bench_check_shapes"),
    "check_matmul": _topic("matmul", "matmul_input", "matmul_ref64", "matmul_bench_check_shapes",
                           "utils.topics.matmul:SPEC.tolerance"),
    "check_reduce_scatter": RankVerifier("reduce_scatter"),
    "check_all_gather": RankVerifier("all_gather"),
    "check_all_reduce": RankVerifier("all_reduce"),
}


def _grader_calls(source: str) -> list[tuple[str, ast.Call]]:
    """Every ``utils.check_*(...)`` call in a cell's source: ``[(grader, call)]``."""
    tree = ast.parse(source)
    return [(node.func.attr, node) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "utils"
            and node.func.attr.startswith("check_")]


def _sizes():
    from runtime.config import PROBLEM_SIZES
    return PROBLEM_SIZES["simulation"]


def _shapes(key: str) -> list[list[int]]:
    return [[int(n)] if isinstance(n, int) else [int(d) for d in n] for n in _sizes()[key]]


def _plan(grader: str, fn: str, v) -> dict:
    """What the runner has the kernel call for one grader call: ``{"grader", "fn", "make",
    "shapes"}``, or for a ``RankVerifier`` ``{"grader", "fn", "kind": "ranks", "collective",
    "make", "bounds", "owners", "marker", "worlds", "sizes", "timeout_s", "stall_s"}``."""
    if isinstance(v, RankVerifier):
        return dict(grader=grader, fn=fn, kind="ranks", collective=v.collective, make=v.make, bounds=v.bounds,
                    owners=v.owners, marker=v.marker, worlds=list(v.worlds), sizes=list(v.sizes),
                    timeout_s=float(_resolve(v.timeout)), stall_s=float(_resolve(v.stall)))
    return dict(grader=grader, fn=fn, make=v.make, shapes=_shapes(v.shapes))


def plans(source_nb) -> tuple[dict, dict]:
    """``(plans, unverified)`` of an instructor's notebook: ``plans[grade_id]``, what the runner
    has the kernel call after that check cell (a list of ``_plan``), and ``unverified[grade_id]``,
    the grader calls of a check cell that are not verified outside the sandbox (a grader not in
    ``VERIFIERS``, an argument that is not a plain name)."""
    out, unverified = {}, {}
    for cell in source_nb.cells:
        m = nbgrader_meta(cell)
        gid = m.get("grade_id")
        if not (m.get("grade") and isinstance(gid, str)) or cell.get("cell_type") != "code":
            continue
        try:
            calls = _grader_calls(cell_source(cell))
        except SyntaxError:
            unverified[gid] = ["the cell is not plain Python"]
            continue
        for grader, call in calls:
            v = VERIFIERS.get(grader)
            if v is None or call.keywords or len(call.args) != 1 or not isinstance(call.args[0], ast.Name):
                unverified.setdefault(gid, []).append(ast.unparse(call))
                continue
            out.setdefault(gid, []).append(_plan(grader, call.args[0].id, v))
        if gid not in out and gid not in unverified:
            unverified[gid] = ["no grader call"]
    return out, unverified


def _resolve(spec: str):
    module, _, name = spec.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _results(data: bytes, count: int):
    """The results the kernel wrote: ``[(dtype, shape, bytes, returned)]`` (``returned``: what a
    rank's function returned, an int or the text of anything else; None where the header has
    none), or a string saying why not."""
    out, at = [], 0
    while at < len(data):
        if len(data) - at < 8:
            return "the results were cut short"
        head_len, body_len = struct.unpack_from("<II", data, at)
        at += 8
        if head_len > 1000 or at + head_len + body_len > len(data):
            return "the results were cut short"
        try:
            head = json.loads(data[at:at + head_len])
            dtype, shape = head["dtype"], [int(d) for d in head["shape"]]
            returned = head.get("returned")        # (a rank's return: an int, or the text of anything else)
            if not isinstance(dtype, str) or type(returned) not in (int, str, type(None)):
                raise TypeError(returned)
        except (ValueError, KeyError, TypeError, AttributeError):
            return "a result's description was not valid"
        at += head_len
        if dtype not in _DTYPES:
            return f"a result is a tensor of {dtype!r}, not of floating-point numbers"
        numel = 1
        for d in shape:
            numel *= max(d, 0)
        if numel * _DTYPES[dtype] != body_len:
            return "a result's size does not match its shape"
        out.append((dtype, shape, data[at:at + body_len], returned))
        at += body_len
    if len(out) != count:
        return f"{len(out)} results came back, not {count}"
    return out


def _count(call: dict) -> int:
    """How many results one grader call's plan asks for: one a shape, or one a rank, size and world."""
    if call.get("kind") == "ranks":
        return sum(call["worlds"]) * len(call["sizes"])
    return len(call["shapes"])


def _tensor(raw: bytes, dtype: str):
    import torch
    return (torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)) if raw
            else torch.empty(0, dtype=getattr(torch, dtype))).double()


def compare(calls: list, reply) -> str:
    """Why the kernel's results for one check cell are not right (``""`` when they are):
    ``calls`` is the cell's plan, ``reply`` what the runner sent back (``{"seed", "status",
    "message", "data"}``; anything else is a failure, never an exception)."""
    if not isinstance(reply, dict) or not isinstance(reply.get("seed"), int) or isinstance(reply["seed"], bool):
        return "the autograde could not call the function again on new inputs (no valid reply)"
    seed, status = reply["seed"], reply.get("status")
    names = ", ".join(dict.fromkeys(c["fn"] for c in calls))
    if status != "ok":
        why = reply.get("message") if isinstance(reply.get("message"), str) else ""
        return (f"calling {names} again on new inputs (seed {seed}) failed"
                + (f": {why[:500]}" if why else "") + ": this check earns no points")
    try:
        data = base64.b64decode(reply.get("data") or "", validate=True)
    except (binascii.Error, ValueError, TypeError):
        return "the results of the new call were not valid: this check earns no points"
    if len(data) > MAX_VERIFY_BYTES:
        return "the results of the new call were too large: this check earns no points"
    results = _results(data, sum(_count(c) for c in calls))
    if isinstance(results, str):
        return f"calling {names} again on new inputs (seed {seed}): {results}: this check earns no points"
    k = 0
    for n, call in enumerate(calls):
        v, count = VERIFIERS[call["grader"]], _count(call)
        check = _compare_ranks if isinstance(v, RankVerifier) else _compare_values
        why = check(call, v, results[k:k + count], seed + 1000 * n)
        if why:
            return why
        k += count
    return ""


def _compare_values(call: dict, v: Verifier, results: list, call_seed: int) -> str:
    """One grader call's results against the topic's float64 reference, within its tolerance."""
    import torch

    from utils.check import tolerance as float_tolerance
    f32 = float_tolerance(torch.float32)
    make, reference = _resolve(v.make), _resolve(v.reference)
    tol_fn = _resolve(v.tolerance) if v.tolerance else None
    for j, shape in enumerate(call["shapes"]):
        dtype, _, raw, _ = results[j]
        inputs = make(tuple(shape), seed=call_seed + j, device="cpu")
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        ref = reference(*inputs).double()
        what = f"{call['fn']}() on new inputs of shape {tuple(shape)} (seed {call_seed + j})"
        if len(raw) // _DTYPES[dtype] != ref.numel():
            return (f"{what} returned {len(raw) // _DTYPES[dtype]} elements, not {ref.numel()}: "
                    "this check earns no points")
        got = _tensor(raw, dtype).reshape(ref.shape)
        allowed = f32["atol"] + f32["rtol"] * ref.abs()
        if tol_fn is not None:
            allowed = torch.maximum(allowed, torch.as_tensor(tol_fn(inputs, ref), dtype=torch.float64))
        err = (got - ref).abs()
        bad = ~(err <= MARGIN * allowed) & ~(torch.isnan(got) & torch.isnan(ref))
        if bool(bad.any()):
            worst = float(torch.nan_to_num(err, nan=float("inf")).max())
            return (f"{what} is not right: {int(bad.sum())} of {ref.numel()} elements differ from the float64 "
                    f"reference (largest error {worst:.3g}), though the check cell reported no error: "
                    "this check earns no points")
    return ""


def _differ(got, want) -> str:
    """How ``got`` differs from ``want`` (float64 tensors), in words; ``""`` where it equals it."""
    import torch
    bad = got != want
    if not bool(bad.any()):
        return ""
    worst = float(torch.nan_to_num((got - want).abs(), nan=float("inf")).max())
    return f"{int(bad.sum())} of {want.numel()} values differ (largest error {worst:.3g})"


def _compare_ranks(call: dict, v: RankVerifier, results: list, seed: int) -> str:
    """One grader call run again as ranks (``results``: each rank's x after the call, by world,
    size and rank, as the kernel wrote them), against every rank's x drawn again here from
    ``seed``: the values are exact in float32, so the expected ones are exact and compared for
    equality. A reduce-scatter's ranks must return different chunks, each holding the sum of
    that chunk over every rank (its other chunks are free); an all-gather's chunks must hold
    their owner's values on every rank; an all-reduce's x the sum of every rank's x."""
    make, bounds_of, owners_of = _resolve(v.make), _resolve(v.bounds), _resolve(v.owners)
    marker = float(_resolve(v.marker))
    end = ", though the check cell reported no error: this check earns no points"
    k = 0
    for world in call["worlds"]:
        owners = owners_of(world, seed)
        for n in call["sizes"]:
            inputs = [make(seed, r, n).double() for r in range(world)]
            full = sum(inputs)
            bounds = bounds_of(n, world)
            what = f"{call['fn']}() run again as {world} ranks on {n} new values (seed {seed})"
            xs, returned = [], []
            for rank in range(world):
                dtype, shape, raw, ret = results[k]
                k += 1
                if dtype != "float32" or shape != [n]:
                    return (f"{what}: rank {rank}'s x came back as {dtype} of shape {tuple(shape)}, not float32 of "
                            f"shape ({n},): this check earns no points")
                xs.append(_tensor(raw, dtype))
                returned.append(ret)
            if v.collective == "reduce_scatter":
                for rank, ret in enumerate(returned):
                    if not isinstance(ret, int) or not 0 <= ret < world:
                        return (f"{what}: rank {rank} returned {ret!r}, not the index of a chunk (0 to {world - 1})"
                                f"{end}")
                if sorted(returned) != list(range(world)):
                    return f"{what}: the ranks returned the chunk indices {returned}: two ranks claim one chunk{end}"
            for rank, x in enumerate(xs):
                if v.collective == "reduce_scatter":
                    ret = returned[rank]
                    lo, hi = bounds[ret]
                    why = _differ(x[lo:hi], full[lo:hi])
                    if why:
                        return (f"{what}: chunk {ret}, whose index rank {rank} returned, is not the sum of that chunk "
                                f"over the ranks: {why}{end}")
                elif v.collective == "all_gather":
                    for c, (lo, hi) in enumerate(bounds):
                        owner = owners.index(c)
                        why = _differ(x[lo:hi], inputs[owner][lo:hi])
                        if why and bool((x[lo:hi] == marker).any()):
                            why += f", it still holds the marker {marker:.10g} written into it (it never arrived)"
                        if why:
                            return (f"{what}: chunk {c} on rank {rank} is not the values of its owner, rank {owner}: "
                                    f"{why}{end}")
                else:
                    why = _differ(x, full)
                    if why:
                        return f"{what}: rank {rank}'s x is not the sum of every rank's x: {why}{end}"
    return ""
