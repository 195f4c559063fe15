"""The graders reject the usual wrong kernels, with the right diagnosis, and accept right
kernels written in unusual ways. The kernels are real (Triton, Numba, CUDA C++): see
``tests/grader_kernels.py``. The same tests run in simulation and on a GPU."""
import math
import re

import grader_kernels as K
import pytest
import torch

import kernels
import utils

needs_cuda_kernel = pytest.mark.skipif(
    not K.have_cuda_kernel(), reason="utils.cuda_kernel (the CUDA C++ loader/emulator) is not available")
simulation_only = pytest.mark.skipif(
    not utils.SIMULATE, reason="on a GPU a missing barrier shows only when warps happen to interleave, "
                               "so no grader can promise to catch it every time")


def rejects(grader, fn, *patterns, seed=None):
    """Run ``grader(fn)``, expect a GradingError whose message matches every pattern."""
    with pytest.raises(utils.GradingError) as info:
        grader(fn, seed=seed)
    msg = str(info.value)
    for p in patterns:
        assert re.search(p, msg, re.IGNORECASE | re.DOTALL), f"{p!r} not in:\n{msg}"
    return msg


def accepts(grader, fn, capsys, seed=None):
    grader(fn, seed=seed)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(grader.__name__ + ": correct on"), out


# --------------------------------------------------------------------------------------
# Right kernels, including unusual ones
# --------------------------------------------------------------------------------------
RIGHT = [
    ("check_relu", "relu_ok"),
    ("check_relu", "relu_zeros_out_ok"),        # output from torch.zeros, written in place
    ("check_relu", "relu_grid_stride_ok"),      # grid-stride loop over a fixed grid
    ("check_relu", "relu_multi_ok"),            # several blocks' worth per program
    ("check_relu", "nb_relu_grid_stride_ok"),   # Numba, grid-stride
    ("check_relu", "relu_two_launches_ok"),     # the output written in two launches
    ("check_relu", "nb_relu_device_arrays_ok"),  # Numba device arrays, copied back to the host
    ("check_add", "add_ok"),
    ("check_add_2d", "add_2d_ok"),              # Triton 2-D launch
    ("check_add_2d", "nb_add_2d_ok"),           # Numba 2-D launch, cuda.grid(2)
    ("check_relu_2d", "relu_2d_ok"),
    ("check_relu_backward", "relu_backward_ok"),
    ("check_gelu", "gelu_exp_ok"),              # tanh written with exp
    ("check_gelu", "gelu_exp_ratio_ok"),        # (e - 1) / (e + 1), as in the source material
    ("check_gelu", "gelu_sigmoid_ok"),          # tanh through sigmoid
    ("check_gelu", "gelu_fast_exp_ok"),         # inexact fast exp
    ("check_sum", "sum_atomic_ok"),             # per-block tl.sum + atomic_add
    ("check_sum", "sum_two_pass_ok"),           # partial sums in torch.empty, then passes
    ("check_sum", "nb_sum_ok"),                 # Numba shared-memory tree + atomics
    ("check_row_max", "row_max_ok"),
    ("check_softmax", "softmax_ok"),            # one row per program
    ("check_softmax", "softmax_online_ok"),     # online softmax over 32-wide chunks
]


@pytest.mark.parametrize("grader,kernel", RIGHT)
def test_accepts_right_kernel(grader, kernel, capsys):
    accepts(getattr(utils, grader), getattr(K, kernel), capsys)


def test_success_line(capsys):
    utils.check_relu(K.relu_ok)
    line = capsys.readouterr().out.strip()
    sizes = utils.SIZES.grader_sizes
    assert line == f"check_relu: correct on {len(sizes)} inputs (sizes {min(sizes)} .. {max(sizes)}), max error 0"


# --------------------------------------------------------------------------------------
# Wrong kernels, with their diagnosis
# --------------------------------------------------------------------------------------
#: (grader, kernel of grader_kernels.py, the patterns its message must match), by test id.
WRONG = {
    # simulator: an IndexError; GPU: the write lands in the guard
    "missing_bounds_check_numba": ("check_relu", "nb_relu_nocheck", [r"idx < n"]),
    "grid_rounded_down_misses_tail": ("check_relu", "relu_grid_rounded_down", [r"never written", r"launched"]),
    "off_by_one_index": ("check_relu", "relu_off_by_one", [r"off-by-one"]),
    "in_place_modification": ("check_relu", "relu_in_place", [r"changed its input x"]),
    "wrong_dtype": ("check_relu", "relu_wrong_dtype", [r"dtype torch\.float64, expected torch\.float32"]),
    "add_2d_rows_and_columns_swapped": ("check_add_2d", "add_2d_swapped", [
        r"never written", r"rows and columns look swapped", r"blockIdx\.x for the row"]),
    "relu_2d_ignores_row_stride": ("check_relu_2d", "relu_2d_ignores_stride", [
        r"the first row is right but the others are not: is the row stride used\?"]),
    "relu_backward_at_zero": ("check_relu_backward", "relu_backward_ge", [r"x > 0, not x >= 0"]),
    "gelu_erf": ("check_gelu", "gelu_erf", [r"looks like the erf GELU", r"tanh approximation"]),
    "sum_first_block_only": ("check_sum", "sum_first_block_only", [
        r"sum of the first 256 elements only", r"every block"]),
    "sum_misses_tail": ("check_sum", "sum_misses_tail", [r"cdiv"]),
    # the NaN marker survives in the interpreter; a GPU's atomicAdd turns it into another NaN
    "sum_accumulates_into_empty": ("check_sum", "sum_empty_accumulator", [r"never written|is NaN", r"torch\.zeros"]),
    "row_max_started_at_zero": ("check_row_max", "row_max_zero_init", [
        r"all negative came out as 0", r"-INFINITY"]),
    "softmax_without_max_subtraction": ("check_softmax", "softmax_no_max", [
        r"got inf/nan on rows with large values: subtract the row max before exp"]),
    "softmax_over_wrong_dim": ("check_softmax", "softmax_dim0", [r"looks like softmax over dim 0"]),
    "softmax_statistics_of_first_chunk_only": ("check_softmax", "softmax_first_chunk_sum", [r"rows do not sum to 1"]),
}


@pytest.mark.parametrize("grader,kernel,patterns", WRONG.values(), ids=WRONG.keys())
def test_rejects_wrong_kernel(grader, kernel, patterns):
    rejects(getattr(utils, grader), getattr(K, kernel), *patterns)


def test_missing_bounds_check_triton():
    if utils.SIMULATE:  # the interpreter stops at the first access past the end: the load of x
        rejects(utils.check_relu, K.relu_nomask, r"loads x_ptr \+ 1025 .* past the end of `x_ptr`",
                r"mask=offs < n", r"idx < n")
    else:  # the store past the end lands in the memory the grader guards around y
        rejects(utils.check_relu, K.relu_nomask, r"past the end of the output", r"idx < n")


def test_only_first_block_works():
    # Every program stores the first block: simulation reports the race between programs; on a
    # GPU the grader sees the unwritten elements and names the same fix.
    if utils.SIMULATE:
        rejects(utils.check_relu, K.relu_first_block_only, r"data race", r"program \(0, 0, 0\)",
                r"program \(1, 0, 0\)", r"pid \* BLOCK")
    else:
        rejects(utils.check_relu, K.relu_first_block_only, r"never written", r"pid \* BLOCK")


def test_stub_is_not_solved_yet():
    msg = rejects(utils.check_relu, K.relu_stub, r"^not solved yet: launch relu_kernel")
    assert "Traceback" not in msg


def test_stub_without_text():
    def stub(x):
        raise NotImplementedError
    rejects(utils.check_relu, stub, r"^not solved yet")


@pytest.mark.parametrize("grader", ["check_add", "check_add_2d", "check_relu_2d", "check_relu_backward",
                                    "check_gelu", "check_sum", "check_row_max", "check_softmax"])
def test_every_grader_reports_stubs(grader):
    def stub(*args):
        raise NotImplementedError("not solved yet: write the kernel")
    rejects(getattr(utils, grader), stub, r"^not solved yet: write the kernel")


def test_returning_none_or_wrong_shape():
    rejects(utils.check_relu, lambda x: None, r"returned None")
    rejects(utils.check_relu, lambda x: torch.relu(x).reshape(-1, 1), r"shape", r"reshape")


def test_other_exceptions_become_grading_errors():
    def broken(x):
        raise ValueError("boom")
    rejects(utils.check_relu, broken, r"raised ValueError: boom")


def test_add_2d_transposed_result():
    rejects(utils.check_add_2d, lambda a, b: (a + b).t().contiguous().reshape(a.shape),
            r"rows and columns look swapped")


def test_gelu_erf_torch_is_rejected():
    rejects(utils.check_gelu, lambda x: torch.nn.functional.gelu(x), r"erf GELU")


def test_sum_first_block_only_when_partial_sums_coincide():
    # with this seed the sum of the first 256 inputs equals the sum of the first 532: the grader
    # must still say which elements were added (it asks the kernel, with ones as input)
    rejects(utils.check_sum, K.sum_first_block_only, r"sum of the first 256 elements only", seed=875040)


def test_sum_double_counting():
    rejects(utils.check_sum, lambda x: x.sum().reshape(1) + x[:256].sum(), r"added more than once")


@simulation_only
def test_sum_missing_barrier_numba():
    rejects(utils.check_sum, K.nb_sum_no_barrier, r"data race", r"Fix: a cuda\.sync(threads|warp)\(\)",
            r"between line \d+ and line \d+")


def test_softmax_unnormalised():
    rejects(utils.check_softmax, lambda x: torch.exp(x - x.amax(dim=1, keepdim=True)), r"do not sum to 1")


# --------------------------------------------------------------------------------------
# The machinery: seeds, poison, guards, races
# --------------------------------------------------------------------------------------
def test_failure_names_the_seed_and_the_seed_repeats_inputs():
    msg1 = rejects(utils.check_relu, K.relu_off_by_one, r"seed (\d+)")
    seed = int(re.search(r"seed=(\d+)", msg1).group(1))
    msg2 = rejects(utils.check_relu, K.relu_off_by_one, seed=seed)
    assert msg1 == msg2


def test_fresh_inputs_each_call():
    seen = []

    def spy(x):
        seen.append(x.detach().cpu().clone())
        return K.relu_ok(x)
    utils.check_relu(spy)
    utils.check_relu(spy)
    half = len(seen) // 2
    big = [i for i in range(half) if seen[i].numel() > 100][0]
    assert not torch.equal(seen[big], seen[big + half])


def test_inputs_are_awkward_sizes_with_zeros_and_negatives():
    seen = []

    def spy(x):
        seen.append(x.detach().cpu().clone())
        assert x.is_contiguous() and x.dtype == torch.float32 and x.device.type == utils.DEVICE.type
        return K.relu_ok(x)
    utils.check_relu(spy)
    assert sorted({t.numel() for t in seen}) == sorted(utils.SIZES.grader_sizes)
    big = torch.cat(seen)
    assert bool((big == 0).any()) and bool((big < 0).any())


def test_reads_past_the_end_see_nan():
    """The grader's inputs sit in NaN-guarded buffers: an unmasked read gets NaN."""
    def peek(x):
        n = x.numel()
        raw = x.as_strided((n + 1,), (1,))          # one element past the end
        assert raw[n].item() != raw[n].item()       # NaN (torch.isnan would count as computing)
        return K.relu_ok(x)
    utils.check_relu(peek)


def test_outputs_are_poisoned_while_fn_runs():
    fresh = []

    def look(x):
        y = torch.empty_like(x)
        z = torch.empty(3, device=x.device)
        w = x.new_empty(x.shape)
        fresh.extend(t.clone() for t in (y, z, w))  # looked at after the graded call
        y.copy_(K.relu_ok(x))
        return y
    utils.check_relu(look)
    assert fresh and all(bool(torch.isnan(t).all()) for t in fresh)
    assert not torch.isnan(torch.empty(100).fill_(1)).any()   # patches removed afterwards
    assert torch.empty is utils.grading._ORIG["empty"]


def test_write_before_the_start():
    def before(x):
        y = torch.empty_like(x)
        y.copy_(K.relu_ok(x))
        y.as_strided((1,), (1,), y.storage_offset() - 1).fill_(0)
        return y
    rejects(utils.check_relu, before, r"before the start of the output", r"off-by-one")


def test_race_detected_when_results_change_between_runs():
    seen = set()

    def flaky(x):
        key = (x.numel(), float(x.sum()))
        y = K.relu_ok(x)
        if key in seen and x.numel() > 1:   # the second run of the same input differs
            y[-1] += 1.0
        seen.add(key)
        return y
    rejects(utils.check_relu, flaky, r"the result changes between runs: a race\?", r"syncthreads")


def test_race_check_uses_the_emulator_random_schedule(monkeypatch):
    import contextlib

    import runtime.backends.cuda as cuda_backend  # where the harness finds the emulator's schedule
    used = []

    @contextlib.contextmanager
    def schedule(kind, seed=None):
        used.append((kind, seed))
        yield
    monkeypatch.setattr(cuda_backend, "emulation_schedule", schedule)
    utils.check_relu(K.relu_ok)
    if utils.SIMULATE:
        assert used and all(kind == "random" for kind, _ in used)


# --------------------------------------------------------------------------------------
# CUDA C++ (utils.cuda_kernel: nvrtc on a GPU, the emulator without one)
# --------------------------------------------------------------------------------------
@needs_cuda_kernel
def test_cuda_float4_with_scalar_tail_accepted(capsys):
    accepts(utils.check_relu, K.cu_relu_float4_ok, capsys)


@needs_cuda_kernel
def test_cuda_tree_sum_accepted(capsys):
    accepts(utils.check_sum, K.cu_sum_ok, capsys)


@needs_cuda_kernel
def test_cuda_float4_without_scalar_tail():
    msg = rejects(utils.check_relu, K.cu_relu_float4_no_tail, r"element 1024 was never written",
                  r"n % 4", r"scalar code")
    assert "rounded up" not in msg


@needs_cuda_kernel
def test_cuda_missing_bounds_check():
    rejects(utils.check_relu, K.cu_relu_nocheck, r"idx < n|past the end|outside")


@needs_cuda_kernel
@simulation_only
def test_cuda_missing_barrier_random_schedule():
    rejects(utils.check_sum, K.cu_sum_no_barrier, r"race|__syncthreads")


@needs_cuda_kernel
@simulation_only
def test_cuda_divergent_barrier_keeps_the_emulator_message():
    msg = rejects(utils.check_relu, K.cu_relu_barrier_in_branch, r"the kernel faulted", r"Hint: .*__syncthreads")
    assert "relu_barrier_in_branch_kernel" in msg      # the emulator's own words are kept


@needs_cuda_kernel
@simulation_only
def test_cuda_more_threads_than_the_shared_array_holds():
    # 512 threads fill a 256-float shared array: on a GPU a silent corruption (or a crash)
    msg = rejects(utils.check_sum, K.cu_sum_too_many_threads, r"past the end of the __shared__ array `sh`",
                  r"Hint: .*at most BLOCK threads")
    assert "sh[256]" in msg


@needs_cuda_kernel
@simulation_only
def test_cuda_shared_bytes_counted_in_elements():
    rejects(utils.check_sum, K.cu_sum_shared_bytes_in_elements, r"asked for 256 bytes",
            r"Hint: .*n_elements \* 4")


@needs_cuda_kernel
def test_cuda_dynamic_shared_sum_is_accepted(capsys):
    accepts(utils.check_sum, K.cu_sum_dynamic_ok, capsys)


@needs_cuda_kernel
def test_cuda_stub_is_not_solved_yet():
    rejects(utils.check_relu, K.cu_relu_stub, r"^not solved yet")


def test_sum_nan_result_names_the_usual_causes():
    msg = rejects(utils.check_sum, lambda x: torch.full((1,), float("nan"), device=x.device), r"is NaN")
    assert "torch.zeros" in msg and "idx < n" in msg and "__syncthreads" in msg


def test_relu_wrong_on_negatives_only():
    rejects(utils.check_relu, lambda x: torch.where(x < 0, -0.01 * x, x), r"only negative inputs are wrong")


def test_show_rejection_prints_the_diagnosis_and_refuses_a_right_kernel(capsys):
    err = utils.show_rejection(utils.check_relu, lambda x: torch.zeros_like(x))
    assert isinstance(err, utils.GradingError) and "REJECTED:" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="accepted a kernel that is wrong on purpose"):
        utils.show_rejection(utils.check_relu, K.relu_ok)


def test_a_stub_inside_a_triton_kernel_is_not_solved_yet():
    # Triton's interpreter (and a GPU compile) wrap the stub's NotImplementedError in an
    # error of their own; the grader still says "not solved yet", not "your function raised".
    # (The kernel lives in a module: on a GPU, Triton resolves `tl` from the kernel's globals.)
    with pytest.raises(utils.GradingError, match=r"^not solved yet: write relu_kernel \(about 5 lines\)$"):
        utils.check_relu(K.relu_triton_stub)


# --------------------------------------------------------------------------------------
# In Jupyter a GradingError shows its diagnosis, not the grader's frames
# --------------------------------------------------------------------------------------
def _ipython_output(code, capsys):
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.user_ns.update(utils=utils, K=K)
    capsys.readouterr()
    shell.run_cell(code)
    return capsys.readouterr().out


def test_grading_error_shows_the_diagnosis_alone_in_ipython(capsys, monkeypatch):
    monkeypatch.delenv("COURSE_FULL_TRACEBACK", raising=False)
    short = _ipython_output("utils.check_relu(K.relu_nomask, seed=1)", capsys)
    assert "GradingError: check_relu failed" in short and "Hint:" in short
    assert "grading.py" not in short and "run_cases" not in short
    monkeypatch.setenv("COURSE_FULL_TRACEBACK", "1")
    full = _ipython_output("utils.check_relu(K.relu_nomask, seed=1)", capsys)
    assert "grading.py" in full and "check_relu failed" in full
    assert len(short.splitlines()) + 10 < len(full.splitlines())


def test_grading_error_keeps_the_learners_own_frames():
    def launcher(x):
        return helper(x)

    def helper(x):
        raise RuntimeError("boom in my code")

    with pytest.raises(utils.GradingError) as info:
        utils.check_relu(launcher)
    lines = info.value._render_traceback_()
    text = "\n".join(lines)
    assert "RuntimeError raised in your code" in text and "in helper" in text and "in launcher" in text
    assert "grading.py" not in text
    assert lines[-1].startswith("GradingError: check_relu failed") or "GradingError: check_relu failed" in text


# --------------------------------------------------------------------------------------
# Mistakes that look alike at one size: the grader asks the kernel again to tell them apart
# --------------------------------------------------------------------------------------
def test_forgotten_block_offset_with_a_large_block(monkeypatch):
    # BLOCK = 1024: at n = 1025 only the last element is missing, as with a rounded-down grid.
    # In simulation the race checker sees the two programs storing to the same elements first,
    # and its report names the same fix; without it (on a GPU) the grader's second size does.
    if utils.SIMULATE:
        msg = rejects(utils.check_relu, K.relu_no_pid_big_block, r"data race", r"pid \* BLOCK")
        assert "rounded up" not in msg
        import runtime.backends.triton.interpreter as ts
        monkeypatch.setattr(ts, "RACECHECK", False)
    msg = rejects(utils.check_relu, K.relu_no_pid_big_block, r"element 1024 was never written",
                  r"whatever n is", r"pid \* BLOCK")
    assert "rounded up" not in msg


def test_sum_without_mask_is_told_to_mask():
    msg = rejects(utils.check_sum, K.sum_nomask, r"reads past the end of x", r"mask=offs < n")
    assert "torch.zeros" not in msg and "never written" not in msg


@pytest.mark.parametrize("kernel", ["sum_fixed_grid", "sum_one_pass"])
def test_sum_over_a_fixed_number_of_elements(kernel):
    # 4 x 256 or 1 x 1024 elements whatever n is: not a rounded-down grid, not a lost atomicAdd
    msg = rejects(utils.check_sum, getattr(K, kernel), r"first 1024 elements only, whatever n is",
                  r"grid-stride")
    assert "misses the last" not in msg


def test_row_max_losing_partial_maxima_is_told_about_barriers():
    # what a tree without __syncthreads() often returns: a value of the row, not its maximum
    def lost_steps(x):
        return x[:, ::2].amax(dim=1)
    msg = rejects(utils.check_row_max, lost_steps, r"one of its own values", r"__syncthreads\(\)")
    assert "blockIdx" not in msg


@needs_cuda_kernel
def test_row_max_ok_cuda(capsys):
    accepts(utils.check_row_max, K.cu_row_max_ok, capsys)


@needs_cuda_kernel
@simulation_only
def test_row_max_missing_barrier_cuda():
    msg = rejects(utils.check_row_max, K.cu_row_max_no_barrier, r"__syncthreads\(\)")
    assert "row = blockIdx.x" not in msg


# --------------------------------------------------------------------------------------
# A race detector's report (a KernelFault) is the diagnosis, not a barrier hint
# --------------------------------------------------------------------------------------
class _RaceReport(utils.KernelFault):
    pass


def test_race_report_is_the_diagnosis():
    report = ("sum_kernel: data race on `out[0]` (global memory): a write by block 1 thread 0 at line 12 "
              "and a write by block 0 thread 0 at line 12; fix: use atomicAdd")

    def racy(x):
        raise _RaceReport(report)

    msg = rejects(utils.check_sum, racy, r"has a race", re.escape(report))
    assert "Hint:" not in msg and "reached the same __syncthreads" not in msg


def test_race_report_wrapped_by_the_interpreter_is_found():
    report = "data race in kernel `k` on x[3] (shared memory): add a __syncthreads() between line 4 and line 6"

    def racy(x):
        try:
            raise _RaceReport(report)
        except _RaceReport as inner:
            raise RuntimeError("the interpreter's own wrapper") from inner

    rejects(utils.check_relu, racy, r"has a race", re.escape(report))


# --------------------------------------------------------------------------------------
# Torch doing the work, or the course's own reference: refused by every grader, by name
# --------------------------------------------------------------------------------------
def _sdpa_backward(q, k, v, o, lse, do, causal=False):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)
    return q.grad, k.grad, v.grad


def _layernorm_backward_torch(dy, x, w, mean, rstd):
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * w
    dx = (g - xhat * (g * xhat).mean(1, keepdim=True) - g.mean(1, keepdim=True)) * rstd[:, None]
    return dx, (dy * xhat).sum(0), dy.sum(0)


def _adamw_torch(p, g, m, v, *, step, lr, beta1, beta2, eps, weight_decay):
    p.mul_(1 - lr * weight_decay)
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    p.addcdiv_(m, (v / (1 - beta2 ** step)).sqrt() + eps, value=-lr / (1 - beta1 ** step))


def _gelu_backward_autograd(dy, x, b=None):
    h = (x if b is None else x + b).detach().requires_grad_()
    torch.nn.functional.gelu(h, approximate="tanh").backward(dy)
    return h.grad


def _gelu_backward_formula(dy, x):
    c = math.sqrt(2 / math.pi)
    t = torch.tanh(c * (x + 0.044715 * x ** 3))
    return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x))


def _cross_entropy_autograd(logits, targets):
    z = logits.detach().requires_grad_()
    loss = torch.nn.functional.cross_entropy(z, targets.long())
    loss.backward()
    return loss.detach(), z.grad


_SPECS = utils.topics.TOPICS
_LN = utils.topics.layernorm
_AT = utils.topics.attention
def _torch_reduce_scatter(x, rank, world):
    import torch.distributed as dist
    dist.all_reduce(x)  # the whole sum: every chunk holds it
    return (rank + 1) % world


def _torch_all_gather(x, rank, world, owned):
    import torch.distributed as dist
    bounds = utils.chunk_bounds(x.numel(), world)
    lo, hi = bounds[owned]
    parts = [torch.zeros(max(b - a for a, b in bounds)) for _ in range(world)]
    mine = torch.zeros(max(b - a for a, b in bounds))
    mine[:hi - lo] = x[lo:hi]
    dist.all_gather(parts, mine)
    owners = [None] * world
    dist.all_gather_object(owners, owned)
    for part, c in zip(parts, owners):
        a, b = bounds[c]
        x[a:b] = part[:b - a]


def _torch_all_reduce(x, rank, world):
    import torch.distributed as dist
    dist.all_reduce(x)
    return x


def _torch_normalize_rows(x, amax, out):
    a = x.abs().amax(dim=1, keepdim=True)
    out.copy_(torch.where(a > 0, x / a, 0.0))


#: grader -> (torch's answer, the operator its message must name); the efficiency checks get a
#: function where a kernel belongs, lesson 07's operator grader torch's own operator.
TORCH_ANSWERS = {
    "check_add": (lambda x, y: x + y, r"\+ \(torch\.add\) \(aten\.add\)"),
    "check_add_2d": (lambda a, b: a + b, r"aten\.add"),
    "check_relu": (torch.relu, r"torch\.relu \(aten\.relu\)"),
    "check_relu_2d": (torch.relu, r"torch\.relu \(aten\.relu\)"),
    "check_relu_backward": (lambda g, x: g * (x > 0), r"aten\.(gt|mul)"),
    "check_gelu": (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), r"torch\.nn\.functional\.gelu"),
    "check_sum": (lambda x: x.sum().reshape(1), r"torch\.sum \(aten\.sum\)"),
    "check_row_max": (lambda x: x.amax(dim=1), r"torch\.amax \(aten\.amax\)"),
    "check_softmax": (lambda x: torch.softmax(x, -1), r"torch\.softmax \(aten\._softmax\)"),
    "check_matmul": (lambda a, b: a @ b, r"torch\.mm\) \(aten\.mm\)"),
    "check_matmul_fp16": (lambda a, b: a @ b, r"torch\.mm\) \(aten\.mm\)"),
    "check_layernorm": (lambda x, w, b: (torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, 1e-5),
                                         x.mean(1), torch.rsqrt(x.var(1, unbiased=False) + 1e-5)),
                        r"torch\.nn\.functional\.layer_norm \(aten\.native_layer_norm\)"),
    "check_layernorm_backward": (_layernorm_backward_torch, r"\* \(torch\.mul\) \(aten\.mul\)"),
    "check_rmsnorm": (lambda x, w: (torch.nn.functional.rms_norm(x, (x.shape[1],), w, 1e-5),
                                    torch.rsqrt((x * x).mean(1) + 1e-5)), r"rms_norm|aten\.(mul|mean|rsqrt)"),
    "check_attention": (lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v),
                        r"torch\.nn\.functional\.scaled_dot_product_attention \(aten\._scaled_dot_product"),
    "check_attention_backward": (_sdpa_backward, r"the backward of torch\.nn\.functional\.scaled_dot_product_"
                                                 r"attention, run by autograd"),
    "check_adamw": (_adamw_torch, r"aten\.(mul|add|addcmul|addcdiv)_?\)"),
    "check_grad_norm": (lambda g: torch.linalg.vector_norm(g), r"aten\.linalg_vector_norm"),
    "check_bias_gelu": (lambda x, b: torch.nn.functional.gelu(x + b, approximate="tanh"), r"aten\.(add|gelu)"),
    "check_bias_gelu_backward": (_gelu_backward_autograd, r"the backward of torch\.nn\.functional\.gelu, run by "
                                                          r"autograd"),
    "check_cross_entropy": (_cross_entropy_autograd, r"aten\._?(log_softmax|nll_loss)"),
    "check_embedding": (lambda ids, w: torch.nn.functional.embedding(ids, w), r"aten\.embedding"),
    "check_embedding_backward": (lambda ids, dout, dw: dw.index_add_(0, ids.reshape(-1), dout.reshape(-1, dw.shape[1])),
                                 r"aten\.index_add"),
    "check_residual_layernorm": (lambda x, r, w, b: (x + r, torch.nn.functional.layer_norm(x + r, (x.shape[1],), w, b,
                                                                                            1e-5)),
                                 r"aten\.(add|native_layer_norm)"),
    "check_gpt_op": ((lambda x: torch.nn.functional.gelu(x, approximate="tanh"), _gelu_backward_formula),
                     r"torch\.nn\.functional\.gelu \(aten\.gelu\)|torch\.tanh \(aten\.tanh\)"),
    "check_custom_op": (torch.ops.aten.relu.default, r"torch's own operator aten\.relu"),
    "check_reduce_scatter": (_torch_reduce_scatter, r"called torch\.distributed\.all_reduce"),
    "check_all_gather": (_torch_all_gather, r"called torch\.distributed\.all_gather"),
    "check_all_reduce": (_torch_all_reduce, r"called torch\.distributed\.all_reduce"),
    "check_graph_safe": (_torch_normalize_rows, r"aten\.(abs|amax|div|where)"),
    "check_make_graphed": (lambda fn, example: lambda x: torch.softmax(x, -1), r"torch\.softmax \(aten\._softmax\)"),
    "check_tma_transpose": (lambda x: x.t() * 1, r"aten\.mul"),
    "check_wgmma_tile": (lambda a, b: torch.nn.functional.linear(a, b), r"aten\.(mm|linear|addmm|matmul)"),
    "check_hopper_gemm": (lambda a, b: a @ b.T, r"aten\.(mm|linear|addmm|matmul)"),
    "check_traffic": (torch.relu, r"is not one: torch\.relu \(aten\.relu\) computed its values"),
    "check_shared": (torch.relu, r"is not one: torch\.relu \(aten\.relu\) computed its values"),
}
#: The course's own float64 reference returned.
REFERENCE_ANSWERS = {
    "check_hopper_gemm": lambda a, b: _SPECS["hopper"].reference(a, b).float(),
    "check_relu": lambda x: _SPECS["relu"].reference(x).float(),
    "check_softmax": lambda x: _SPECS["softmax"].reference(x).float(),
    "check_layernorm": lambda x, w, b: (_LN.layernorm_ref64(x, w, b).float(),)
    + tuple(t.float() for t in _LN.layernorm_stats64(x)),
    "check_layernorm_backward": lambda dy, x, w, mean, rstd: tuple(
        t.float() for t in _LN.layernorm_backward_ref64(dy, x, w, mean=mean, rstd=rstd)),
    "check_attention": lambda q, k, v: (_AT.attention_ref64(q, k, v).to(q.dtype), _AT.attention_lse64(q, k).float()),
    "check_attention_backward": lambda q, k, v, o, lse, do: tuple(
        t.to(q.dtype) for t in _AT.attention_backward_ref64(q, k, v, do)),
}


def test_every_grader_is_in_the_table_of_torch_answers():
    graders = {n for n in dir(utils) if n.startswith("check_") and callable(getattr(utils, n))} - {"check_input"}
    assert graders == set(TORCH_ANSWERS), ("a grader without torch's answer in TORCH_ANSWERS (or one that is gone): "
                                           f"{sorted(graders ^ set(TORCH_ANSWERS))}")


def _grade(name, fn, **kwargs):
    grader = getattr(utils, name)
    if name == "check_custom_op":
        return grader(fn, torch.relu)
    if name == "check_gpt_op":
        return grader("gelu", *fn, seed=1)
    if name in ("check_traffic", "check_shared"):
        return grader(fn, 1, 32, torch.randn(32, device=utils.DEVICE), reject=True)
    return grader(fn, seed=1, **kwargs)


def _gelu_backward_kernel(dy, x):
    """GELU's backward with lesson 11's bias + GELU kernel and a zero bias, for tensors of any shape."""
    d = x.shape[-1]
    backward = kernels.module("bias_gelu", "triton").bias_gelu_backward
    return backward(dy.reshape(-1, d), x.reshape(-1, d), torch.zeros(d, device=x.device)).reshape(x.shape)


def _right_kernel(grader):
    """The first right kernel of ``RIGHT`` for ``grader``."""
    return getattr(K, next(kernel for g, kernel in RIGHT if g == grader))


def _triton(topic, name=None):
    """The reference version of a topic's Triton launchers (``name``: another launcher of its module)."""
    return kernels.get(topic, "triton") if name is None else getattr(kernels.module(topic, "triton"), name)


#: A right launcher for every grader that grades a launcher (``utils.topics.CHECKS`` and
#: ``check_gpt_op``): grader -> (a function that returns the launcher, the grader's keyword
#: arguments). The first kernel of ``RIGHT`` where it has one, else the course's reference
#: version (``kernels/``), as each topic's own tests grade it. ``check_custom_op`` grades an
#: operator's registrations, and ``check_traffic`` / ``check_shared`` one launch's profile.
REFERENCE_LAUNCHERS = {
    **{grader: (lambda grader=grader: _right_kernel(grader), {}) for grader, _ in RIGHT},
    "check_matmul": (lambda: _triton("matmul"), {}),
    "check_matmul_fp16": (lambda: kernels.get("matmul_fp16", "cuda"), {}),
    "check_layernorm": (lambda: lambda x, w, b: _triton("layernorm")(x, w, b, stats=True), {}),
    "check_layernorm_backward": (lambda: _triton("layernorm", "layernorm_backward_partials"), {}),
    "check_rmsnorm": (lambda: lambda x, w: _triton("layernorm", "rmsnorm")(x, w, stats=True), {}),
    "check_attention": (lambda: _triton("attention", "attention_forward"), dict(lse=True)),
    "check_attention_backward": (lambda: _triton("attention", "attention_backward"), {}),
    "check_cross_entropy": (lambda: _triton("cross_entropy"), {}),
    "check_embedding": (lambda: _triton("embedding", "embedding"), {}),
    "check_embedding_backward": (lambda: _triton("embedding"), {}),
    "check_adamw": (lambda: _triton("adamw"), {}),
    "check_grad_norm": (lambda: _triton("adamw", "grad_norm"), {}),
    "check_bias_gelu": (lambda: _triton("bias_gelu"), {}),
    "check_bias_gelu_backward": (lambda: _triton("bias_gelu", "bias_gelu_backward"), {}),
    "check_residual_layernorm": (lambda: _triton("residual_layernorm"), {}),
    "check_gpt_op": (lambda: (_triton("gelu"), _gelu_backward_kernel), {}),
    "check_tma_transpose": (lambda: K.cu_tma_transpose_ok, {}),
    "check_wgmma_tile": (lambda: kernels.get("hopper", "cuda", "v1"), {}),
    "check_hopper_gemm": (lambda: _triton("hopper", "hopper_gemm_v1"), {}),
}


def grade_reference(name):
    """Run grader ``name`` on its right launcher of ``REFERENCE_LAUNCHERS`` (seed 1)."""
    launcher, kwargs = REFERENCE_LAUNCHERS[name]
    return _grade(name, launcher(), **kwargs)


def test_every_grader_has_a_reference_launcher():
    want = set(utils.topics.CHECKS) | {"check_gpt_op"}
    assert set(REFERENCE_LAUNCHERS) == want, f"add a right launcher: {sorted(want ^ set(REFERENCE_LAUNCHERS))}"


@pytest.mark.parametrize("name", sorted(TORCH_ANSWERS))
def test_every_grader_refuses_torch_doing_the_work(name):
    fn, operator = TORCH_ANSWERS[name]
    with pytest.raises(utils.GradingError) as info:
        _grade(name, fn)
    msg = str(info.value)
    assert re.search(operator, msg), f"{name}: the operator /{operator}/ is not named in:\n{msg}"


#: Graders of a kernel's memory traffic, not of values: nothing to compute on the host.
_NOT_VALUES = ("check_traffic", "check_shared")


def _host_answer(torch_fn, form):
    """``torch_fn``'s answer computed where no recording sees it (as numpy on the host would),
    with one Triton launch beside it: ``"nothing"`` launches a kernel that does nothing and
    returns the host's tensors moved to the device; ``"reads"`` launches one that only reads
    its input, and copies the host's values into outputs of its own."""
    from torch.utils._python_dispatch import _disable_current_modes

    def cheat(*args, **kwargs):
        first = next(a for a in args if isinstance(a, torch.Tensor))
        with _disable_current_modes():
            out = torch_fn(*args, **kwargs)
            outs = out if isinstance(out, tuple) else (out,)
            host = [o.detach().cpu().clone() if isinstance(o, torch.Tensor) else o for o in outs]
        if form == "nothing":
            K.nothing_kernel[(1,)](first)
            moved = [h.to(first.device) if isinstance(h, torch.Tensor) else h for h in host]
        else:
            K.read_only_kernel[(1,)](first, first.numel(), BLOCK=128)
            moved = [torch.empty(h.shape, dtype=h.dtype, device=first.device).copy_(h)
                     if isinstance(h, torch.Tensor) else h for h in host]
        return tuple(moved) if isinstance(out, tuple) else moved[0]
    return cheat


def _host_op(form):
    """A ``torch.library.custom_op`` whose values are computed on the host (see ``_host_answer``)."""
    name = f"host_cheat_test::relu_{form}"
    if not hasattr(_host_op, name):
        cheat = _host_answer(torch.relu, form)

        def relu(x: torch.Tensor) -> torch.Tensor:
            return cheat(x)
        op = torch.library.custom_op(name, mutates_args=())(relu)
        op.register_fake(lambda x: torch.empty_like(x))
        setattr(_host_op, name, op)
    return getattr(_host_op, name)


#: Graders of collectives (lesson 13): their answer is messages between processes, not a
#: kernel's stores; what torch's collectives compute is refused by name in each rank instead.
_COLLECTIVES = ("check_reduce_scatter", "check_all_gather", "check_all_reduce")
#: Graders of CUDA Graphs (lesson 13): the launcher writes into buffers it is given (a value
#: returned is not its answer), or is a function that wraps a launcher; torch's answer is refused
#: through the launch recording, in the table above.
_GRAPHS = ("check_graph_safe", "check_make_graphed")


@pytest.mark.parametrize("form", ["nothing", "reads"])
@pytest.mark.parametrize("name", sorted(set(TORCH_ANSWERS) - set(_NOT_VALUES) - set(_COLLECTIVES) - set(_GRAPHS)))
def test_every_grader_refuses_values_computed_on_the_host(name, form):
    """Values computed outside any kernel, beside a kernel that does nothing or only reads: the
    recording sees a launch and no torch operator, so only the store tracker can refuse them."""
    fn, _ = TORCH_ANSWERS[name]
    if name == "check_custom_op":
        cheat = _host_op(form)
    elif name == "check_gpt_op":
        cheat = tuple(_host_answer(f, form) for f in fn)
    else:
        cheat = _host_answer(fn, form)
    with pytest.raises(utils.GradingError) as info:
        _grade(name, cheat)
    msg = str(info.value)
    assert re.search(r"the kernel you launched (stored nothing|wrote (none|\d+ of \d+) of the values)", msg), msg
    assert re.search(r"outside any kernel \(on the host", msg), msg


@pytest.mark.parametrize("fn, wrote", [
    (K.relu_half_on_host, r"wrote \d+ of \d+ of the values of the result; \d+ of its \d+ values were written "
                          r"outside any kernel"),
    (K.relu_python_loop, r"wrote none of the values of the result"),
])
def test_values_written_on_the_host_are_counted(fn, wrote):
    rejects(utils.check_relu, fn, wrote, r"on the host: with numpy or Python, or copied from a host buffer")


@pytest.mark.parametrize("name", sorted(REFERENCE_ANSWERS))
def test_graders_refuse_the_course_reference_returned(name):
    with pytest.raises(utils.GradingError) as info:
        _grade(name, REFERENCE_ANSWERS[name])
    assert re.search(r"the course's own reference utils\.topics\.\w+\.\w+64", str(info.value)), str(info.value)


def test_a_nan_the_kernel_wrote_is_not_never_written():
    def nan_kernel(q, k, v):              # every element written, with NaN (a fill is no computation)
        return torch.empty_like(q).fill_(float("nan")), torch.zeros(q.shape[:3], device=q.device)

    def no_kernel(q, k, v):               # nothing written at all
        return torch.empty_like(q), torch.empty(q.shape[:3], device=q.device)
    rejects(lambda fn, seed: utils.check_attention(fn, dtype=torch.float16, seed=seed), nan_kernel,
            r"your kernel produced NaN at 256 of 256 values of o .*first at o\[0, 0, 0, 0\]", r"Hint: .*-inf")
    msg = rejects(lambda fn, seed: utils.check_attention(fn, dtype=torch.float16, seed=seed), no_kernel,
                  r"never written \(still the grader's NaN marker")
    assert "produced NaN" not in msg
