"""The course's pictures: index maps, reduction trees, bandwidth against the roofline.

Matplotlib only. Each function returns a ``matplotlib.figure.Figure``, shown inline once
at the end of a notebook cell (no server, no ``plt.show()``, with or without a trailing
``;``); tests inspect it.
Pass ``ax=`` to draw into an existing axes instead (the function then returns its figure).

    utils.plot_index_map(1000, 256)                   # who handles which element (1-D)
    utils.plot_index_map_2d((5, 7), (2, 4))           # the same for a 2-D launch
    utils.plot_reduction_tree(16, "sequential")       # which threads add what, per step
    utils.plot_bandwidth({"triton": [(4096, 50.0), ...]}, roofline_gbps=3000)
    utils.plot_recorded_bandwidth("relu")             # the recorded H100 sweep of a topic
    utils.plot_bars({"cuda v1": 1900.0, "triton": 2900.0}, roofline_gbps=3000)
"""
from __future__ import annotations

import math

__all__ = [
    "plot_index_map",
    "plot_index_map_2d",
    "plot_reduction_tree",
    "plot_bandwidth",
    "plot_recorded_bandwidth",
    "plot_bars",
]

_MASKED = "#d9d9d9"   # threads past the end: launched, but the bounds check stops them
_ACTIVE = "#ff7f0e"   # threads doing work in a reduction step
_IDLE = "#f0f0f0"
# matplotlib's tab10, and the light half of tab20 for blocks (spelled out so that
# `import utils` does not pay for importing matplotlib: it loads on the first plot).
_LINE_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22", "#17becf"]
_BLOCK_COLORS = ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
                 "#c7c7c7", "#dbdb8d", "#9edae5"]


def _mpl():
    """pyplot and the patch classes, imported on first use."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle
    return plt, Patch, Rectangle


def _inline_backend() -> bool:
    """True where pyplot figures show themselves when a notebook cell ends."""
    import matplotlib
    backend = matplotlib.get_backend().lower()
    return "inline" in backend or "ipympl" in backend or "widget" in backend


_figure_class = None


def _course_figure_class():
    """A Figure that shows exactly once in a notebook, with or without a trailing ``;``.

    In a notebook the inline backend shows every pyplot figure a cell made when the cell
    ends. A plain Figure returned as the cell's value would then show twice, and closing
    it to avoid that would make ``utils.plot_...();`` (with the semicolon) show nothing.
    This one leaves pyplot the first time it is displayed.
    """
    global _figure_class
    if _figure_class is None:
        from matplotlib.figure import Figure

        class CourseFigure(Figure):
            def _ipython_display_(self):
                # Called for the cell's value, and by the inline backend when the cell
                # ends: draw it the first time and take it out of pyplot, so that the
                # other call finds nothing left to show.
                import io

                import matplotlib.pyplot as plt
                from IPython.display import Image, display
                if plt.fignum_exists(getattr(self, "number", -1)):
                    plt.close(self)
                buf = io.BytesIO()
                self.savefig(buf, format="png", bbox_inches="tight")
                display(Image(data=buf.getvalue()))

        _figure_class = CourseFigure
    return _figure_class


def _new_axes(ax, figsize):
    if ax is not None:
        return ax.figure, ax
    plt, _, _ = _mpl()
    fig, ax = plt.subplots(figsize=figsize, layout="constrained",
                           FigureClass=_course_figure_class())
    if not _inline_backend():
        # A script or a test: nothing will show it, so keep figures made in a loop from
        # piling up in pyplot (the figure itself stays usable: savefig, inspection).
        plt.close(fig)
    return fig, ax


def _block_color(b):
    return _BLOCK_COLORS[b % len(_BLOCK_COLORS)]


def _cdiv(a, b):
    return -(-a // b)


# ---------------------------------------------------------------------------------------
# Index maps
# ---------------------------------------------------------------------------------------
def plot_index_map(n: int, block_size: int, *, unit: str = "block", show_ids: bool | None = None,
                   title: str | None = None, ax=None):
    """Which thread of which block handles each element of a length-``n`` array.

    One cell per launched thread, coloured by its block; the ``cdiv(n, block_size)``
    blocks cover ``n`` rounded up, and the threads past ``n`` in the tail block are grey
    and hatched: the ``if i < n`` (or ``mask=offs < n``) check keeps them from writing.
    ``unit="program"`` labels it the Triton way (a program owns ``BLOCK`` offsets).
    """
    _, _, Rectangle = _mpl()
    if n < 1 or block_size < 1:
        raise ValueError(f"n and block_size must be positive, got n={n}, block_size={block_size}")
    blocks = _cdiv(n, block_size)
    cells = blocks * block_size
    if cells > 2048:
        raise ValueError(f"{cells} cells are too many to draw: use a smaller n or block_size "
                         "(the picture is the same at any size)")
    if show_ids is None:
        show_ids = cells <= 64
    thread = "offset" if unit == "program" else "threadIdx.x"
    fig, ax = _new_axes(ax, (min(14, 2 + cells * 0.28), 2.4))
    for i in range(cells):
        b, t = divmod(i, block_size)
        masked = i >= n
        ax.add_patch(Rectangle((i, 0), 1, 1, facecolor=_MASKED if masked else _block_color(b),
                               edgecolor="white" if not masked else "#9e9e9e",
                               hatch="///" if masked else None,
                               linewidth=0.8 if cells <= 128 else 0,  # edges would wash out
                               gid="masked" if masked else f"{unit} {b}"))
        if show_ids:
            ax.text(i + 0.5, 0.5, str(t), ha="center", va="center", fontsize=7,
                    color="#555555" if masked else "black")
    for b in range(blocks):
        ax.text(b * block_size + block_size / 2, 1.12, f"{unit} {b}", ha="center", va="bottom",
                fontsize=9)
        if b:
            ax.axvline(b * block_size, color="black", linewidth=1.5)
    ax.set_xlim(0, cells)
    ax.set_ylim(0, 1.5)
    ax.set_yticks([])
    ax.set_xlabel(f"element i = {unit} * {'BLOCK' if unit == 'program' else 'blockDim.x'} + {thread}")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    masked_note = (f"\ngrey, hatched: {cells - n} {'lanes' if unit == 'program' else 'threads'} "
                   "with i >= n, masked off by the bounds check") if cells > n else ""
    ax.set_title(title or f"n = {n}, {unit} size {block_size}: {blocks} {unit}s, "
                          f"{cells} {'lanes' if unit == 'program' else 'threads'}{masked_note}",
                 fontsize=10)
    return fig


def plot_index_map_2d(shape, block_shape, *, show_ids: bool | None = None,
                      title: str | None = None, ax=None):
    """Which block handles each element of a ``(rows, cols)`` matrix in a 2-D launch.

    ``block_shape`` is ``(block_rows, block_cols)``, in the order of ``shape``: CUDA's
    ``blockDim.x`` is ``block_cols`` (x runs along a row) and ``blockDim.y`` is
    ``block_rows``. Cells are coloured by block; threads past the matrix edge are grey and
    hatched (the ``row < rows and col < cols`` check stops them).
    """
    _, Patch, Rectangle = _mpl()
    rows, cols = (int(s) for s in shape)
    brows, bcols = (int(s) for s in block_shape)
    if min(rows, cols, brows, bcols) < 1:
        raise ValueError(f"shape and block_shape must be positive, got {shape} and {block_shape}")
    grid_y, grid_x = _cdiv(rows, brows), _cdiv(cols, bcols)
    R, C = grid_y * brows, grid_x * bcols
    if R * C > 4096:
        raise ValueError(f"{R}x{C} cells are too many to draw: use a smaller shape")
    if show_ids is None:
        show_ids = R * C <= 144
    fig, ax = _new_axes(ax, (min(14, 4.5 + C * 0.45), min(10, 2.0 + R * 0.45)))
    for r in range(R):
        for c in range(C):
            by, bx = r // brows, c // bcols
            masked = r >= rows or c >= cols
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor=_MASKED if masked else
                                   _block_color(by * grid_x + bx), edgecolor="white",
                                   hatch="///" if masked else None, linewidth=0.6,
                                   gid="masked" if masked else f"block ({bx}, {by})"))
            if show_ids:
                ax.text(c + 0.5, r + 0.5, f"{c % bcols},{r % brows}", ha="center", va="center",
                        fontsize=6, color="#555555" if masked else "black")
    for k in range(1, grid_x):
        ax.axvline(k * bcols, color="black", linewidth=1.5)
    for k in range(1, grid_y):
        ax.axhline(k * brows, color="black", linewidth=1.5)
    ax.plot([0, cols, cols, 0, 0], [0, 0, rows, rows, 0], color="crimson", linewidth=2,
            label=f"the {rows}x{cols} matrix")
    ax.set_xlim(0, C)
    ax.set_ylim(R, 0)  # row 0 at the top, like a matrix
    ax.set_aspect("equal")
    ax.set_xlabel("col = blockIdx.x * blockDim.x + threadIdx.x")
    ax.set_ylabel("row = blockIdx.y * blockDim.y + threadIdx.y")
    handles = [ax.get_legend_handles_labels()[0][0]]
    if R * C > rows * cols:
        handles.append(Patch(facecolor=_MASKED, hatch="///", label="outside: masked off"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False,
              fontsize=8)
    ids = "\ncell text: threadIdx.x,threadIdx.y" if show_ids else ""
    ax.set_title(title or f"{rows}x{cols} matrix, {brows}x{bcols} blocks: "
                          f"grid of {grid_x} (x) by {grid_y} (y) blocks{ids}", fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------
# Reduction trees
# ---------------------------------------------------------------------------------------
def _reduction_steps(n: int, addressing: str):
    """[(stride, [(thread, dst, src), ...])] for a shared-memory tree over n elements."""
    steps = []
    if addressing == "interleaved":
        s = 1
        while s < n:  # thread t works when t % (2s) == 0: a[t] += a[t + s]
            steps.append((s, [(t, t, t + s) for t in range(0, n, 2 * s)]))
            s *= 2
    else:
        s = n // 2
        while s > 0:  # the first s threads work: a[t] += a[t + s]
            steps.append((s, [(t, t, t + s) for t in range(s)]))
            s //= 2
    return steps


def plot_reduction_tree(n: int = 16, addressing: str = "sequential", *, title: str | None = None,
                        ax=None):
    """Step by step, which threads are active and which two elements each one adds.

    ``addressing="interleaved"``: at stride s, thread t works if ``t % (2*s) == 0`` and does
    ``a[t] += a[t + s]``; the active threads spread out (divergent warps) and the stride
    grows 1, 2, 4, ... ``addressing="sequential"``: the first s threads work,
    ``a[t] += a[t + s]`` with s = n/2, n/4, ...: active threads stay packed at the front.
    Each row is shared memory after a step (and a ``syncthreads()``); a cell shows which
    inputs its value sums. Orange cells were written by an active thread in that step.
    """
    _, _, Rectangle = _mpl()
    if addressing not in ("sequential", "interleaved"):
        raise ValueError(f"addressing must be 'sequential' or 'interleaved', got {addressing!r}")
    if n < 2 or n & (n - 1) or n > 64:
        raise ValueError(f"n must be a power of two from 2 to 64, got {n}")
    steps = _reduction_steps(n, addressing)
    fig, ax = _new_axes(ax, (min(14, 2.5 + n * 0.55), 1.2 + 0.9 * (len(steps) + 1)))
    ranges = [[i] for i in range(n)]  # which inputs each cell sums

    def label(ins):
        return str(ins[0]) if len(ins) == 1 else f"{min(ins)}-{max(ins)}" \
            if sorted(ins) == list(range(min(ins), max(ins) + 1)) else f"{len(ins)}"

    def draw_row(row, written):
        for i in range(n):
            ax.add_patch(Rectangle((i, row), 0.9, 0.6, facecolor=_ACTIVE if i in written else _IDLE,
                                   edgecolor="#888888", linewidth=0.6,
                                   gid="active" if i in written else "cell"))
            ax.text(i + 0.45, row + 0.3, label(ranges[i]), ha="center", va="center",
                    fontsize=7 if n <= 16 else 5)

    draw_row(0, set())
    ax.text(-0.3, 0.3, "input", ha="right", va="center", fontsize=8)
    for k, (stride, adds) in enumerate(steps, start=1):
        for _, dst, src in adds:
            ranges[dst] = ranges[dst] + ranges[src]
            for frm in (dst, src):  # both operands flow into a[dst]
                ax.plot([frm + 0.45, dst + 0.45], [k - 0.4, k], color="#1f77b4",
                        linewidth=0.9, gid="add")
        draw_row(k, {dst for _, dst, _ in adds})
        threads = [t for t, _, _ in adds]
        shown = ", ".join(map(str, threads[:6])) + (", ..." if len(threads) > 6 else "")
        ax.text(-0.3, k + 0.3, f"step {k}: stride {stride}\nthreads {shown}", ha="right",
                va="center", fontsize=8)
    ax.set_xlim(-0.2, n)
    ax.set_ylim(len(steps) + 0.8, -0.3)
    ax.axis("off")
    note = ("active threads spread out: every warp stays busy but diverges"
            if addressing == "interleaved" else
            "active threads packed at the front: whole warps retire early")
    ax.set_title(title or f"{addressing} addressing, n = {n}: {len(steps)} steps, "
                          f"{n - 1} additions\n{note}", fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------
# Bandwidth
# ---------------------------------------------------------------------------------------
def _provenance(title, recorded_on, label_simulated):
    from .config import SIMULATE
    if label_simulated:
        return f"{title}\nsimulated on the CPU: not GPU performance"
    if recorded_on:
        here = " (this machine has no GPU: shown, not measured)" if SIMULATE else ""
        return f"{title}\nrecorded on {recorded_on}{here}"
    return title


def plot_bandwidth(results: dict, roofline_gbps: float | None = None, *,
                   title: str = "Achieved bandwidth", recorded_on: str | None = None,
                   label_simulated: bool = False, xlabel: str = "elements",
                   ax=None):
    """GB/s against problem size (log scale) for each variant, with the copy roofline.

    ``results`` is ``{variant: [(size, gbps), ...]}`` (sizes in elements, or bytes with
    ``xlabel="bytes"``), e.g. ``utils.recorded_sweep("relu")``. ``roofline_gbps`` draws
    the copy bandwidth as a dashed line. ``recorded_on="NVIDIA H100 ..."`` says in the
    title that the numbers were recorded on that GPU; ``label_simulated=True`` says they
    are simulator timings on the CPU.
    """
    fig, ax = _new_axes(ax, (7.5, 4.5))
    for k, (variant, points) in enumerate(results.items()):
        pts = sorted((float(s), float(g)) for s, g in points if g is not None)
        if not pts:
            continue
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", markersize=4, color=_LINE_COLORS[k % len(_LINE_COLORS)],
                label=variant)
    if roofline_gbps:
        ax.axhline(roofline_gbps, color="black", linestyle="--", linewidth=1.2, gid="roofline",
                   label=f"copy roofline ({roofline_gbps:,.0f} GB/s)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"problem size ({xlabel}, log scale)")
    ax.set_ylabel("GB/s (bytes moved / time)")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower right")
    ax.set_title(_provenance(title, recorded_on, label_simulated), fontsize=10)
    return fig


def plot_recorded_bandwidth(topic: str, path=None, *, variants=None, ax=None):
    """The recorded size sweep of a topic (``benchmarks/results/h100.json``) with its copy
    roofline, labelled with the GPU, the date and the commit it was recorded at. Returns
    None if nothing is recorded (a one-line note says why)."""
    from .bench import copy_roofline, recorded_label, recorded_sweep
    sweep = recorded_sweep(topic, path)
    if variants is not None:
        sweep = {k: v for k, v in sweep.items() if k in variants}
    if not sweep:
        return None
    return plot_bandwidth(sweep, copy_roofline(path), title=f"{topic}: bandwidth against size",
                          recorded_on=recorded_label(topic, path), ax=ax)


def plot_bars(values: dict, roofline_gbps: float | None = None, *, title: str = "Bandwidth by variant",
              ylabel: str = "GB/s", recorded_on: str | None = None, label_simulated: bool = False,
              highlight=None, ax=None):
    """A horizontal bar per variant (``{label: value}``, in the order given), with the
    roofline as a dashed vertical line and each value written at the end of its bar.
    ``highlight`` names labels to draw in a stronger colour (the learner's kernel)."""
    labels = list(values)
    vals = [float(values[k]) if values[k] is not None else math.nan for k in labels]
    fig, ax = _new_axes(ax, (7.5, 0.8 + 0.45 * max(1, len(labels))))
    highlight = set([highlight] if isinstance(highlight, str) else (highlight or []))
    colors = [_ACTIVE if k in highlight else _LINE_COLORS[0] for k in labels]
    bars = ax.barh(range(len(labels)), [0 if math.isnan(v) else v for v in vals], color=colors)
    ax.set_yticks(range(len(labels)), labels)
    for bar, v in zip(bars, vals):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                " n/a" if math.isnan(v) else f" {v:,.0f}", va="center", fontsize=8)
    if roofline_gbps:
        ax.axvline(roofline_gbps, color="black", linestyle="--", linewidth=1.2, gid="roofline",
                   label=f"copy roofline ({roofline_gbps:,.0f} GB/s)")
        ax.text(roofline_gbps, -0.6, f"copy roofline\n{roofline_gbps:,.0f} GB/s", ha="center",
                va="bottom", fontsize=7)
    top = max([v for v in vals if not math.isnan(v)] + [roofline_gbps or 0, 1])
    ax.set_xlim(0, top * 1.15)
    ax.set_ylim(len(labels) - 0.5, -1.2)  # room above the first bar for the roofline label
    ax.set_xlabel(ylabel)
    ax.set_title(_provenance(title, recorded_on, label_simulated), fontsize=10)
    return fig
