"""CUDA Graphs (lesson 13): the graders of a launcher made graph-safe and of a launcher wrapped in
a captured graph, the same in simulation (``runtime.graphs``' capture model) and on a GPU
(``torch.cuda.graph``).

    check_graph_safe(fn)       fn(x, amax, out): out = each row of x over its largest |value|
                               (amax, the row maxima, its workspace), written into the tensors
                               it is given, with no host synchronisation, every launch on torch's
                               stream: captured once, then replayed on new inputs
    check_make_graphed(make)   make(fn, example) -> run: run(x) replays a graph of fn captured
                               on a copy of example, and returns a result of its own

Each reads the outcome as a GPU shows it: a capture that fails (a host synchronisation, Numba's
``to_numba``), a capture that records nothing, a replay that leaves ``out`` as it was (the
launcher wrote into memory of its own) or that reads row maxima of the input at capture time
(a launch the capture did not record), a result that the next call overwrites, a graph replayed
on the input it was captured with, a call of the launcher instead of a replay, a shape the graph
was not captured for.
"""
from __future__ import annotations

import warnings

import torch

from runtime import graphs as _graphs
from runtime.backends.launches import record_launches
from runtime.config import DEVICE, SIMULATE

from .. import check as _check
from ..grading import (
    Case,
    Grader,
    GradingError,
    label_shape,
    launch_verdict,
    run_cases,
    shapes_text,
    success,
    tail_hint,
)

__all__ = ["check_graph_safe", "check_make_graphed", "normalize_rows_ref"]

#: The shapes graded in each mode (rows, columns): awkward ones, a row of one value, a short tall one.
SHAPES = {True: [(37, 300), (1, 1), (5, 1000), (64, 33)], False: [(1000, 3000), (1, 1), (4099, 517), (64, 33)]}
#: The shape the graph is captured at; a row of zeros included.
GRAPH_SHAPE = {True: (29, 211), False: (2048, 1531)}
HINT_SAFE = ("a graph-safe launcher writes into the tensors it is given (amax, out), launches every kernel on "
             "torch's stream (utils.numba_launch for Numba) and never reads a value on the host")


def normalize_rows_ref(x: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` divided by its largest absolute value, in float64; a row of zeros stays zeros."""
    x = x.double()
    amax = x.abs().amax(dim=1, keepdim=True)
    return torch.where(amax > 0, x / torch.where(amax > 0, amax, 1.0), 0.0)


def _rows(gen, rows, cols, zero_rows=True):
    x = torch.randn(rows, cols, generator=gen) * torch.exp(torch.randn(rows, 1, generator=gen))
    if zero_rows and rows > 2:
        x[rows // 2] = 0.0  # a row of zeros: the kernel's case, not a reason for the host to look
    return x


def _shapes():
    return SHAPES[SIMULATE]


def _fresh(t: torch.Tensor) -> torch.Tensor:
    return t.to(DEVICE).contiguous()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def _messages(e: BaseException) -> str:
    """The messages of ``e`` and of the exceptions it was raised during or from: on a GPU the end of a
    failed capture raises again ("operation failed due to a previous error during capture")."""
    seen, out = set(), []
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(str(e))
        e = e.__cause__ or e.__context__
    return "\n".join(out)


def _capture_failure(name: str, e: BaseException, what: str) -> GradingError:
    msg = _messages(e)
    if "to_numba" in msg:
        return GradingError(
            f"{name} failed: {what} could not be captured: utils.to_numba(tensor) waits for torch's stream (for a "
            f"launch on Numba's own stream), a host synchronisation a capture cannot contain.\n({_first_line(e)})\n"
            "Hint: launch the Numba kernel with utils.numba_launch(kernel, blocks, threads, x, amax): it takes torch "
            "tensors as they are and launches on torch's stream, which the graph captures.")
    if "capturing" in msg or "capture" in msg:
        return GradingError(
            f"{name} failed: {what} could not be captured: it synchronises with the host while the stream is "
            f"capturing.\n({_first_line(e)})\nHint: a capture records launches without running them, so nothing in "
            "it may read a value on the host: no bool(tensor) or `if` on a tensor, .item(), float(), .tolist(), "
            ".cpu() or print(tensor). Leave the check out (a row of zeros is the kernel's case: it writes zeros) or "
            "make it before capturing.")
    return GradingError(f"{name} failed: {what} raised {_first_line(e)} while it was captured.\nHint: {HINT_SAFE}.")


def check_graph_safe(fn, *, seed=None):
    """``fn(x, amax, out)`` writes each row of ``x`` divided by its largest absolute value into
    ``out`` (a row of zeros gives zeros), with ``amax`` (one float32 a row) as its workspace; it
    must run inside a CUDA Graph's capture and give the right result at every replay."""
    name = "check_graph_safe"
    g = Grader(name, fn, seed)
    fn = g.fn

    def eager(x):
        amax = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
        out = torch.empty_like(x)
        fn(x, amax, out)
        return out

    g.fn = eager  # the grading loop calls it: poisoned memory, races, the kernels' own stores

    # First the capture (what this exercise is about): once on static tensors, after a warm-up.
    rows, cols = GRAPH_SHAPE[SIMULATE]
    sx = _fresh(_rows(g.gen, rows, cols))
    amax = torch.empty(rows, device=DEVICE, dtype=torch.float32)
    out = torch.empty(rows, cols, device=DEVICE, dtype=torch.float32)
    graph, where = None, f"on {rows}x{cols}"
    try:
        fn(sx, amax, out)  # a warm-up, as before any capture: first calls compile and allocate
        _sync()
        warm = True
    except Exception:
        warm = False       # the grading loop below says what is wrong with the launcher itself
    if warm:
        at_capture = sx.clone()
        out.fill_(float("nan"))
        amax.fill_(float("nan"))
        graph = _graphs.CUDAGraph()
        with warnings.catch_warnings(record=True) as caught, record_launches() as seen:
            warnings.simplefilter("always")
            _, err = _graphs.capture(graph, fn, sx, amax, out)
        if err is not None:
            raise _capture_failure(name, err, f"your launcher {where}") from None
        if any("Graph is empty" in str(w.message) for w in caught):
            raise GradingError(f"{name} failed {where}: the capture recorded no launch (torch: \"The CUDA Graph is "
                               f"empty\"): every kernel ran on another stream than torch's.\nHint: {HINT_SAFE}.")

    # Then the launcher called as usual, through the grading loop.
    cases = []
    for r, c in _shapes():
        x = _rows(g.gen, r, c)
        cases.append(Case(label_shape((r, c)), (x,), normalize_rows_ref(x)))
    worst = run_cases(g, cases, names=("x",), shape_of=lambda c: c.expected.shape,
                      unwritten_hint=_unwritten_hint, diagnose=lambda case, got, bad: None)
    if graph is None:
        raise GradingError(f"{name} failed {where}: your launcher raised before its capture, though not in the "
                           f"grading loop.\nHint: {HINT_SAFE}.")
    why = launch_verdict(seen, need_kernel=True, fn=fn)
    if why:
        raise GradingError(f"{name} failed {where}, in the capture: {why}")

    # Last the replays, on new inputs copied into the captured one.
    for k in range(2):
        new = _fresh(_rows(g.gen, rows, cols))
        sx.copy_(new)
        out.fill_(float("nan"))
        graph.replay()
        _sync()
        want = normalize_rows_ref(new)
        got = out.double()
        tol = _check.tolerance(torch.float32)
        if torch.allclose(got, want, **tol, equal_nan=False):
            continue
        if bool(torch.isnan(out).all()):
            raise GradingError(
                f"{name} failed {where}: after the graph's replay `out` was never written (it still holds the "
                "grader's NaN): your launcher wrote its result into a tensor it made itself.\nHint: a replay runs the "
                "captured launches on the memory they were captured with; write into the `out` you are given, not "
                "into a new tensor (no torch.empty_like(x) for the result).")
        stale = at_capture.double().abs().amax(dim=1, keepdim=True)
        stale_out = torch.where(stale > 0, new.double() / torch.where(stale > 0, stale, 1.0), 0.0)
        if torch.allclose(got, stale_out, **tol):
            raise GradingError(
                f"{name} failed {where}: at replay {k + 1} each row was divided by the row maxima of the input at "
                "capture time: the row-max kernel ran during the capture and was not recorded, so the replay did not "
                "run it.\nHint: a Numba launch without a stream goes to Numba's own stream, which torch's capture "
                "does not see: launch it with utils.numba_launch(kernel, blocks, threads, x, amax).")
        bad = ~torch.isclose(got, want, **tol)
        raise GradingError(
            f"{name} failed {where}: at replay {k + 1} of the graph, {int(bad.sum())} of {bad.numel()} values of out "
            f"are wrong (largest error {float((got - want).abs().nan_to_num(float('inf')).max()):.3g}), though the "
            f"call before the capture was right.\nHint: {HINT_SAFE}.")
    success(name, line=f"{name}: correct on {len(cases)} inputs ({shapes_text(_shapes())}), max error {worst:.3g}; "
                       f"captured in a CUDA Graph at {rows}x{cols} and right at 2 replays on new inputs")


def _unwritten_hint(case, mask, grader=None):
    if bool(mask.all()):
        return ("nothing was written into out: did your launcher write into a tensor of its own "
                "(torch.empty_like(x)) instead of the `out` it is given? A graph replays into the memory it captured, "
                "so a graph-safe launcher writes into the buffers it is handed")
    return tail_hint(case, mask, grader)


def _sync():
    if not SIMULATE:
        torch.cuda.synchronize()


def _softmax_launcher():
    import kernels
    return kernels.get("softmax", "triton")


def check_make_graphed(make, *, seed=None):
    """``make(fn, example)`` returns ``run``: ``run(x)`` copies ``x`` into the graph's own input,
    replays a CUDA Graph of ``fn`` captured on a copy of ``example``, and returns a result the
    next call does not change; a tensor of another shape is refused (an exception). ``fn`` here
    is the course's Triton softmax launcher (``fn(x)`` returns a new tensor); the graph may be
    captured in ``make`` or at the first call of ``run``."""
    name = "check_make_graphed"
    g = Grader(name, make, seed)
    launcher = _softmax_launcher()
    calls = [0]

    def fn(x):
        calls[0] += 1
        return launcher(x)

    rows, cols = GRAPH_SHAPE[SIMULATE]
    example = _fresh(torch.randn(rows, cols, generator=g.gen))
    kept = example.clone()
    tol = _check.tolerance(torch.float32)

    def same(got, x):
        return isinstance(got, torch.Tensor) and got.shape == x.shape and bool(
            torch.allclose(got.double(), _ref_softmax(x), **tol))

    def call(run, x, what):
        try:
            with record_launches() as seen:
                got = run(x)
                _sync()
        except Exception as e:
            if isinstance(e, GradingError):
                raise
            hint = _capture_failure(name, e, what) if "captur" in _messages(e) else None
            if hint is not None:
                raise hint from None
            g.fail(f"{what} raised {_first_line(e)}.", "run(x) copies x into the captured input, replays, and "
                   "returns a copy of the captured output")
        why = launch_verdict(seen, need_kernel=False, fn=run)
        if why:
            g.fail(f"{what}: {why}")
        if not isinstance(got, torch.Tensor):
            g.fail(f"{what} returned {type(got).__name__}, not a tensor.", "return the captured output's copy")
        return got

    try:
        run = make(fn, example)
    except Exception as e:
        if "captur" in _messages(e):
            raise _capture_failure(name, e, "make_graphed(fn, example)") from None
        g.fail(f"make_graphed(fn, example) raised {_first_line(e)}.")
    if not callable(run):
        g.fail(f"make_graphed returned {type(run).__name__}, not a function run(x).")
    xs = [_fresh(torch.randn(rows, cols, generator=g.gen) * 3) for _ in range(3)]
    results = []
    for k, x in enumerate(xs):
        before = calls[0]
        got = call(run, x, f"run(x) (call {k + 1}, on {rows}x{cols})")
        if k > 0 and calls[0] > before:
            g.fail(f"run(x) called fn itself at call {k + 1}: the launcher ran again from Python, so the graph saved "
                   "nothing.", "capture once (in make_graphed, or at the first call), then each call copies x in and "
                   "calls g.replay(): the host's work is one replay, whatever the number of launches inside")
        if not same(got, x):
            if same(got, example) or same(got, kept):
                g.fail(f"call {k + 1} returned the result for the example tensor the graph was captured with, not "
                       "for x.", "a replay reads the captured input's memory: copy x into it first "
                       "(static_x.copy_(x)), then replay")
            if k > 0 and same(got, xs[k - 1]):
                g.fail(f"call {k + 1} returned the result for the input of call {k}: x was copied in after the "
                       "replay.", "copy x into the captured input first, then g.replay()")
            g.fail(f"call {k + 1} returned wrong values for x.", "copy x into the graph's input, replay, "
                   "return a copy of the graph's output")
        if not torch.equal(example, kept):
            g.fail("run(x) wrote into the example tensor you were given: the graph was captured on it, and "
                   "each call copies x there, so the caller's tensor changes.",
                   "capture on a copy of your own (static_x = example.clone())")
        results.append((got, got.clone()))
    for k, (got, snapshot) in enumerate(results[:-1]):
        if not torch.equal(got, snapshot):
            g.fail(f"the result of call {k + 1} changed at a later call: run returned the graph's own output "
                   "tensor, which every replay overwrites.", "return a copy: static_y.clone()")
    other = _fresh(torch.randn(1, cols, generator=g.gen))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = run(other)
            _sync()
    except Exception:
        got = None
    if got is not None:
        g.fail(f"run(x) on a tensor of shape {tuple(other.shape)} returned a result of shape "
               f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}, though the graph was "
               f"captured for {rows}x{cols}: a replay runs the shapes it captured (here the one row was copied into "
               "every row of the captured input).",
               "refuse another shape: if x.shape != static_x.shape: raise ValueError(...) (or capture a graph for "
               "each shape)")
    print(f"{name}: correct: 3 calls on new {rows}x{cols} inputs, each a replay with a result of its own; "
          f"the example left as it was; another shape refused (seed {g.seed})")


def _ref_softmax(x):
    return torch.softmax(x.double(), dim=-1)
