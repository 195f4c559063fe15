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
    p = utils.profile(k, grid, block, *args)          # then, from its trace:
    utils.plot_access_map(p, arg="x")                 # which thread touched which element
    utils.plot_sectors(p, arg="x")                    # the 32-byte sectors of one warp's load
    utils.plot_banks(p)                               # the banks of one shared access
    utils.plot_timeline("trace.json")                 # a torch.profiler trace, host and GPU
    utils.plot_ring_all_reduce(4)                     # the ring all-reduce, chunk by chunk, step by step
    utils.draw_layout(utils.cute_layout("make_layout(make_shape(4, 8), make_stride(8, 1))"))
    utils.draw_layout(utils.mma_partition("SM80_16x8x16_F32F16F16F32_TN", "A"))   # CuTe's threads and values
"""
from __future__ import annotations

import math

__all__ = [
    "plot_index_map",
    "plot_index_map_2d",
    "draw_layout",
    "plot_reduction_tree",
    "plot_bandwidth",
    "plot_recorded_bandwidth",
    "plot_bars",
    "variant_color",
    "plot_access_map",
    "plot_sectors",
    "plot_banks",
    "plot_timeline",
    "load_trace",
    "plot_layernorm_backward",
    "flash_tile_kinds",
    "plot_causal_tiles",
    "online_softmax_steps",
    "plot_flash_loop",
    "plot_recorded_attention",
    "ring_steps",
    "plot_ring_all_reduce",
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


# One hue per language, a shade per version (darker = later version); PyTorch and other
# baselines are black or grey, so a chart reads by language first and version second.
_LANG_SHADES = {
    "cuda": ["#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"],      # blues
    "numba": ["#a1d99b", "#74c476", "#41ab5d", "#238b45", "#006d2c", "#00441b"],     # greens
    "triton": ["#fdae6b", "#fd8d3c", "#f16913", "#d94801", "#a63603", "#7f2704"],    # oranges
}
_BASELINES = {"torch": "#000000", "torch.compile": "#969696", "torch op-by-op": "#525252"}
_OTHER_BASELINES = ["#737373", "#bdbdbd", "#3b3b3b"]   # cuBLAS and other references


def variant_color(name: str) -> str:
    """The colour of a variant such as ``"cuda v3"``, ``"triton"`` or ``"torch.compile"``.

    CUDA C++ is blue, Numba green, Triton orange, each version a darker shade of its
    language's hue (``v1`` lightest); ``torch`` is black and other baselines
    (``torch.compile``, ``cuBLAS``, anything not named after a course language) grey.
    """
    words = str(name).lower().replace("_", " ").split()
    lang = words[0] if words else ""
    if lang in _LANG_SHADES:
        shades = _LANG_SHADES[lang]
        version = next((w[1:] for w in words[1:] if w[:1] == "v" and w[1:].isdigit()), None)
        if version is None:   # the language alone: its middle shade
            return shades[3]
        # v1 starts at the second shade: the lightest one is too pale on white
        return shades[min(int(version), len(shades) - 1)]
    full = " ".join(words)
    if full in _BASELINES:
        return _BASELINES[full]
    return _OTHER_BASELINES[sum(map(ord, full)) % len(_OTHER_BASELINES)]


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
# CuTe's layouts
# ---------------------------------------------------------------------------------------
# CuTe's print_latex colours a thread-value layout by thread % 8, in these eight.
_TV_COLORS = ["#afafff", "#afffaf", "#ffffaf", "#ffafaf", "#d2d2ff", "#d2ffd2", "#ffffd2", "#ffd2d2"]


def _mode_period(shape_of_mode) -> int:
    """How many rows (or columns) the first sub-mode of a nested mode spans: ``(2,4)`` -> 2."""
    if not isinstance(shape_of_mode, tuple) or len(shape_of_mode) < 2:
        return 0
    first = shape_of_mode[0]
    return math.prod(_flat_ints(first))


def _flat_ints(x):
    return [v for e in x for v in _flat_ints(e)] if isinstance(x, tuple) else [x]


def draw_layout(layout, *, color=None, show_ids: bool | None = None, title: str | None = None, ax=None):
    """A CuTe layout or partition as a grid, as CuTe's ``print_latex`` draws it.

    A ``Layout`` (``utils.cute_layout``, the algebra functions): one cell per coordinate,
    rows are mode 0 and columns mode 1 (a rank-1 layout is one row), each cell labelled with
    the index CuTe computed there and coloured by it (a light-to-dark ramp over the codomain).
    ``color=f`` colours by ``f(index)`` instead, one of the course's block colours per value:
    ``color=lambda i: i // 8 % 8`` shows which 16-byte chunk of a row of halves each element of a
    swizzled tile lands in. Black lines mark the inner modes of a nested mode: in
    ``((2,4),(4,2))`` every 2 rows and every 4 columns.

    A ``Partition`` (``utils.thread_partition``, ``utils.tile_partition``, ``utils.mma_partition``,
    ``utils.tv_partition``): each element labelled ``T<thread>`` / ``V<value>`` and coloured by its
    thread (CuTe's eight colours, thread % 8), or by its tile for ``local_tile``; elements nobody
    owns are grey.
    """
    from runtime.cute_layouts import Layout, Partition
    _, _, Rectangle = _mpl()
    if isinstance(layout, Partition):
        grid, kind = layout.owner, "partition"
    elif isinstance(layout, Layout):
        if layout.rank > 2:
            raise ValueError(f"draw_layout draws rank-1 and rank-2 layouts, and {layout} has rank {layout.rank}: "
                             "group its modes into two (CuTe's group<...> or a rank-2 shape)")
        grid, kind = layout.indices(), "layout"
    else:
        raise TypeError(f"draw_layout draws a Layout or a Partition (utils.cute_layout, utils.mma_partition, ...), "
                        f"got {type(layout).__name__}")
    if grid.ndim == 1:
        grid = grid.reshape(1, -1)
    if grid.ndim != 2:
        raise ValueError(f"draw_layout draws 1-D and 2-D tiles, and this one has {grid.ndim} dimensions")
    rows, cols = grid.shape
    if rows * cols > 4096:
        raise ValueError(f"{rows}x{cols} cells are too many to draw: take a smaller tile")
    if show_ids is None:
        show_ids = rows * cols <= 1024
    fig, ax = _new_axes(ax, (min(16, 1.5 + cols * 0.5), min(16, 1.2 + rows * 0.5)))
    size = 8 if max(rows, cols) <= 16 else 6 if max(rows, cols) <= 32 else 4
    if kind == "layout":
        import numpy as np
        if grid.dtype == object:
            raise ValueError(f"{layout} maps to coordinates, not indices: draw_layout colours by an integer index")
        span = max(int(grid.max()) + 1, 1)
        if color is None:
            from matplotlib import colormaps
            ramp = colormaps["YlGnBu"]
            fill = {int(i): ramp(0.08 + 0.6 * int(i) / span) for i in np.unique(grid)}
        else:
            fill = {int(i): _block_color(int(color(int(i)))) for i in np.unique(grid)}
    for r in range(rows):
        for c in range(cols):
            if kind == "layout":
                idx = int(grid[r, c])
                face, gid, text = fill[idx], f"index {idx}", str(idx)
            else:
                o = int(layout.owner.reshape(rows, cols)[r, c])
                v = int(layout.value.reshape(rows, cols)[r, c])
                if o < 0:
                    face, gid, text = _MASKED, "nobody", ""
                elif layout.kind == "tile":
                    face, gid, text = _block_color(o), f"tile {o} V{v}", f"tile {o}\n{v}"
                else:
                    face, gid, text = _TV_COLORS[o % 8], f"T{o} V{v}", f"T{o}\nV{v}"
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor=face, edgecolor="#555555", linewidth=0.5, gid=gid))
            if show_ids and text:
                ax.text(c + 0.5, r + 0.5, text, ha="center", va="center", fontsize=size)
    if kind == "layout" and layout.rank == 2:  # the inner modes of nested modes
        shape = layout.shape
        for axis, period in ((0, _mode_period(shape[0])), (1, _mode_period(shape[1]))):
            for k in range(period, (rows, cols)[axis], period) if period else ():
                if axis == 0:
                    ax.axhline(k, color="black", linewidth=1.6)
                else:
                    ax.axvline(k, color="black", linewidth=1.6)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)  # row 0 at the top, as CuTe draws it
    ax.set_aspect("equal")
    step = 1 if max(rows, cols) <= 32 else 8
    ax.set_xticks([c + 0.5 for c in range(0, cols, step)], [str(c) for c in range(0, cols, step)], fontsize=size)
    ax.set_yticks([r + 0.5 for r in range(0, rows, step)], [str(r) for r in range(0, rows, step)], fontsize=size)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    if title is None:
        title = str(layout.text) if kind == "layout" else f"{layout.owners} {layout.kind}s: {layout.text}"
        if kind == "partition" and layout.shared:
            title += f"\nseveral {layout.kind}s share an element (in shared memory): the first is shown"
    ax.set_title(title, fontsize=9)
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
    from runtime.config import SIMULATE
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
        ax.plot(xs, ys, marker="o", markersize=4, color=variant_color(variant), label=variant)
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
    """The recorded size sweep of a topic (the most recent record that has one, or ``path``)
    with that run's copy roofline, labelled with the GPU, the date and the commit it was
    recorded at. Returns None if nothing is recorded (a one-line note says why)."""
    from .bench import copy_roofline, recorded_file, recorded_label, recorded_sweep
    path = recorded_file(topic, path, sweep=True) or path  # the sweep's run: its copy and its label
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
    colors = [variant_color(k) for k in labels]
    bars = ax.barh(range(len(labels)), [0 if math.isnan(v) else v for v in vals], color=colors,
                   edgecolor=[_CONFLICT if k in highlight else "none" for k in labels],
                   linewidth=[2.5 if k in highlight else 0 for k in labels])
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


# ---------------------------------------------------------------------------------------
# Pictures of a profiled launch (``p = utils.profile(...)``), drawn from ``p.trace``
# ---------------------------------------------------------------------------------------
_SECTOR = 32        # bytes: the unit global memory moves between L1/L2 and DRAM
_LINE = 128         # bytes: a cache line, 4 sectors
_BANKS = 32         # shared memory banks, each 4 bytes wide
_OPS = {"ld": 0, "st": 1, "atom": 2}
_OP_WORDS = {0: "load", 1: "store", 2: "atomic"}
_CONFLICT = "#d62728"


def _trace_of(p) -> dict:
    """The trace columns as Python lists (a Profile, or a dict shaped like ``p.trace``)."""
    trace = p.get("trace", p) if isinstance(p, dict) else getattr(p, "trace", None)
    if trace is None:
        raise ValueError("this profile has no trace (the launch was too large to record every "
                         "access): profile a smaller launch, e.g. one or two blocks, to draw it")
    cols = ("block", "thread", "warp", "lane", "space", "op", "arg", "offset", "size", "line",
            "instr")
    missing = [c for c in cols if c not in trace]
    if missing:
        raise ValueError(f"the trace lacks the columns {missing}")
    out = {c: [int(v) for v in (trace[c].tolist() if hasattr(trace[c], "tolist") else trace[c])]
           for c in cols}
    if len({len(v) for v in out.values()}) != 1:
        raise ValueError("the trace's columns differ in length")
    return out


def _trace_names(p) -> dict:
    names = p.get("trace_names") if isinstance(p, dict) else getattr(p, "trace_names", None)
    return dict(names or {})


def _arg_index(p, arg) -> int:
    """An argument given by name or by index, as its index in the trace."""
    names = _trace_names(p)
    if isinstance(arg, str):
        for k, v in names.items():
            if v == arg and isinstance(k, int) and k >= 0:
                return k
        known = sorted(v for k, v in names.items() if isinstance(k, int) and k >= 0)
        raise ValueError(f"no argument named {arg!r} in this trace (it has {known})")
    return int(arg)


def _arg_name(p, arg: int) -> str:
    return str(_trace_names(p).get(arg, f"argument {arg}"))


def _rows(t, keep):
    """Indices of the trace rows for which keep(row dict) is true."""
    n = len(t["block"])
    return [i for i in range(n) if keep({c: t[c][i] for c in t})]


def _one_instance(t, space, block, warp, instr, line, arg, op=None, nth=0):
    """The rows of one warp-wide access: ``instr`` if given, else the ``nth`` (from 0)
    instruction instance of (block, warp) in this space (at ``line``, on ``arg``, of kind ``op``
    if given), in the order of the trace's ``instr`` ids. The emulator numbers the executions
    of each access site in order, site after site, so in a loop ``nth=k`` is step k of the
    first matching site."""
    op_code = None if op is None else _OPS[op]

    def match(r):
        return (r["space"] == space and (arg is None or r["arg"] == arg)
                and (line is None or r["line"] == line)
                and (op_code is None or r["op"] == op_code)
                and (instr is not None or (r["block"] == block and r["warp"] == warp)))
    rows = _rows(t, match)
    if instr is None and rows:
        instrs = sorted({t["instr"][i] for i in rows})
        instr = instrs[nth] if nth < len(instrs) else None
    rows = [i for i in rows if t["instr"][i] == instr]
    if not rows:
        where = "shared" if space == 1 else "global"
        raise ValueError(f"no {where} {op or 'access'} of block {block}, warp {warp}"
                         f"{'' if line is None else f' at line {line}'}"
                         f"{f' (number {nth})' if nth else ''} in this trace")
    return rows


def _warp_color(w):
    return _LINE_COLORS[w % len(_LINE_COLORS)]


def plot_access_map(p, arg=0, *, op=None, elem_size=None, per_row=32, show_ids=None,
                    title=None, ax=None):
    """Which thread touched which element of argument ``arg`` (a name or an index), coloured
    by warp, from the trace of a profiled launch (``utils.profile``).

    One cell per element, ``per_row`` to a row (32 four-byte elements make a row of one
    128-byte line); the number in a cell is the thread (``threadIdx.x``) that touched it, and
    its colour that thread's warp. Elements nobody touched stay white, so a strided access
    shows as gaps. ``op="ld"`` or ``"st"`` keeps loads or stores only. ``elem_size``: bytes
    per element (default: the smallest access, e.g. 4 for float32).
    """
    _, Patch, Rectangle = _mpl()
    t = _trace_of(p)
    a = _arg_index(p, arg)
    op_code = None if op is None else _OPS[op]
    rows = _rows(t, lambda r: r["space"] == 0 and r["arg"] == a
                 and (op_code is None or r["op"] == op_code))
    name = _arg_name(p, a)
    if not rows:
        raise ValueError(f"the trace has no global {op or 'access'} of `{name}`")
    esize = elem_size or min(t["size"][i] for i in rows)
    wpb = max(t["warp"]) + 1
    touched = {}        # element -> [(global warp, thread, block)]
    for i in rows:
        gw = t["block"][i] * wpb + t["warp"][i]
        first, last = t["offset"][i] // esize, (t["offset"][i] + t["size"][i] - 1) // esize
        for e in range(first, last + 1):
            who = (gw, t["thread"][i], t["block"][i])
            if who not in touched.setdefault(e, []):
                touched[e].append(who)
    top = max(touched) + 1
    start = (min(touched) // per_row) * per_row
    cells = top - start
    if cells > 4096:
        raise ValueError(f"the accesses span {cells} elements, too many to draw: profile a "
                         "smaller launch")
    nrows = _cdiv(cells, per_row)
    if show_ids is None:
        show_ids = per_row <= 32 and nrows <= 16
    fig, ax = _new_axes(ax, (min(14, 1.5 + per_row * 0.36), 1.4 + 0.36 * nrows))
    warps_seen, shared_cells = [], 0
    for e in range(start, start + nrows * per_row):
        r, c = divmod(e - start, per_row)
        who = touched.get(e)
        if who is None:
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor="white", edgecolor="#bbbbbb",
                                   linewidth=0.5, gid="untouched"))
            continue
        gw, thread, _ = who[0]
        if gw not in warps_seen:
            warps_seen.append(gw)
        many = len({w[1:] for w in who}) > 1
        shared_cells += many
        ax.add_patch(Rectangle((c, r), 1, 1, facecolor=_warp_color(gw), edgecolor="black"
                               if many else "white", linewidth=1.2 if many else 0.5,
                               hatch="xx" if many else None, alpha=0.85,
                               gid=f"warp {gw}" if not many else f"warp {gw} shared"))
        if show_ids:
            ax.text(c + 0.5, r + 0.5, str(thread), ha="center", va="center", fontsize=6)
    if _SECTOR % esize == 0 and per_row % (_SECTOR // esize) == 0:
        # 32-byte sector boundaries: every element between two lines moves together
        for c in range(_SECTOR // esize, per_row, _SECTOR // esize):
            ax.plot([c, c], [0, nrows], color="black", linewidth=1.2, gid="sector boundary")
    ax.set_xlim(0, per_row)
    ax.set_ylim(nrows, 0)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([k + 0.5 for k in range(nrows)], [str(start + k * per_row) for k in range(nrows)],
                  fontsize=7)
    ax.set_ylabel("first element of the row", fontsize=8)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    handles = [Patch(facecolor=_warp_color(w), label=f"block {w // wpb}, warp {w % wpb}")
               for w in warps_seen[:10]]
    if shared_cells:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="xx",
                             label="touched by several threads"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False,
              fontsize=7)
    what = {None: "accesses", "ld": "loads", "st": "stores", "atom": "atomics"}[op]
    threads = len({(t["block"][i], t["thread"][i]) for i in rows})
    ax.set_title(title or f"{what} of `{name}`: {len(touched)} elements of {esize} bytes "
                          f"touched by {threads} threads in {len(warps_seen)} warps\n"
                          f"cell: the element, its number: threadIdx.x, colour: the warp; "
                          f"black lines: 32-byte sectors",
                 fontsize=9)
    return fig


def _sector_slots(sectors):
    """Sectors to draw, in order, with runs of more than 4 untouched ones shown as one gap
    (None)."""
    slots = []
    for s in sorted(sectors):
        if slots:
            gap = s - slots[-1] - 1
            if gap > 4:
                slots.append(None)
            else:
                slots.extend(range(slots[-1] + 1, s))
        slots.append(s)
    return slots


def plot_sectors(p, arg=None, *, block=0, warp=0, line=None, op=None, nth=0, instr=None,
                 title=None, ax=None):
    """The 32-byte sectors one warp-wide global access touches (one request).

    Top: the 32 lanes of the warp; bottom: memory, in 32-byte sectors (thick marks at the
    128-byte line boundaries); a line joins each active lane to the sector its address falls
    in. Touched sectors are coloured; the title compares them with the fewest that would hold
    the same bytes. The access is the first one of ``block``/``warp`` (on argument ``arg``, at
    source ``line``, a load or store by ``op``; ``nth=k`` for the k-th such access instead, in
    the order of the trace's ``instr`` ids), or the instruction instance ``instr`` of the trace.
    """
    _, _, Rectangle = _mpl()
    t = _trace_of(p)
    a = None if arg is None else _arg_index(p, arg)
    rows = _one_instance(t, 0, block, warp, instr, line, a, op, nth)
    a = t["arg"][rows[0]]
    name = _arg_name(p, a)
    lane_sectors = {}
    needed = set()
    for i in rows:
        off, size = t["offset"][i], t["size"][i]
        lane_sectors[t["lane"][i]] = sorted({b // _SECTOR for b in (off, off + size - 1)})
        needed.update(range(off, off + size))
    sectors = sorted({s for ss in lane_sectors.values() for s in ss})
    ideal = _cdiv(len(needed), _SECTOR)
    slots = _sector_slots(sectors)
    width = max(32, len(slots))
    fig, ax = _new_axes(ax, (min(14, 2 + width * 0.3), 3.4))
    lane_w = width / 32
    for lane in range(32):
        active = lane in lane_sectors
        ax.add_patch(Rectangle((lane * lane_w, 2.2), lane_w * 0.9, 0.6,
                               facecolor=_LINE_COLORS[0] if active else _IDLE,
                               edgecolor="#888888", linewidth=0.5,
                               gid="lane" if active else "idle lane"))
        if lane % 4 == 0 or width <= 40:
            ax.text((lane + 0.45) * lane_w, 2.95, str(lane), ha="center", fontsize=6)
    x_of = {}
    sw = width / len(slots)          # few sectors are drawn wide, under the lanes they serve
    for k, s in enumerate(slots):
        if s is None:
            ax.text((k + 0.45) * sw, 0.3, "...", ha="center", va="center", fontsize=9)
            continue
        x_of[s] = k * sw
        used = s in sectors
        ax.add_patch(Rectangle((k * sw, 0), 0.9 * sw, 0.6, facecolor=_ACTIVE if used else "white",
                               edgecolor="#888888", linewidth=0.5,
                               gid="sector" if used else "unused sector"))
        if (s * _SECTOR) % _LINE == 0:
            ax.plot([k * sw - 0.05, k * sw - 0.05], [-0.15, 0.75], color="black", linewidth=1.5,
                    gid="line boundary")
        if len(slots) <= 40 or (s * _SECTOR) % _LINE == 0:
            ax.text((k + 0.45) * sw, -0.25, str(s * _SECTOR), ha="center", va="top",
                    fontsize=7 if len(slots) <= 16 else 5, rotation=0 if len(slots) <= 16 else 90)
    for lane, ss in lane_sectors.items():
        for s in ss:
            ax.plot([(lane + 0.45) * lane_w, x_of[s] + 0.45 * sw], [2.2, 0.6],
                    color=_LINE_COLORS[0], linewidth=0.6, alpha=0.7, gid="lane to sector")
    ax.text(-0.3, 2.5, "lanes", ha="right", va="center", fontsize=8)
    ax.text(-0.3, 0.3, "sectors", ha="right", va="center", fontsize=8)
    ax.set_xlim(-0.2, width)
    ax.set_ylim(-1.4, 3.3)
    ax.axis("off")
    what = _OP_WORDS.get(t["op"][rows[0]], "access")
    blk, wp = t["block"][rows[0]], t["warp"][rows[0]]
    verdict = "as few as can hold its bytes" if len(sectors) <= ideal else \
        f"{ideal} would hold its {len(needed)} bytes"
    ax.set_title(title or f"block {blk}, warp {wp}: {what} of `{name}` (line {t['line'][rows[0]]}) "
                          f"touches {len(sectors)} sectors of 32 bytes; {verdict}\n"
                          f"byte offsets below; thick marks: 128-byte line boundaries",
                 fontsize=9)
    return fig


def _bank_rows(t, rows):
    """{bank: [(word, [lanes])]} for one shared access: the distinct 4-byte words each bank
    serves, with the lanes that asked for each (several lanes on one word: a broadcast)."""
    banks = {}
    for i in rows:
        off, size = t["offset"][i], t["size"][i]
        for word in range(off // 4, (off + size - 1) // 4 + 1):
            words = banks.setdefault(word % _BANKS, {})
            words.setdefault(word, []).append(t["lane"][i])
    return {b: sorted(ws.items()) for b, ws in banks.items()}


def plot_banks(p, *, block=0, warp=0, line=None, op=None, nth=0, instr=None, title=None,
               ax=None):
    """The 32 banks of one warp-wide shared-memory access, conflicts marked.

    A column per bank (bank = (byte address / 4) % 32); a cell per distinct 4-byte word the
    bank must deliver, labelled with the lanes that asked for it (lanes on the same word get
    it in one go: a broadcast). A bank can deliver one word per pass (wavefront), so the
    tallest column is the number of wavefronts; red cells are the extra passes, the bank
    conflicts. The access is the first shared one of ``block``/``warp`` (at source ``line``, a
    load or store by ``op``; ``nth=k`` for the k-th such access in the order of the trace's
    ``instr`` ids: step k of a loop), or the instruction instance ``instr``.
    """
    _, Patch, Rectangle = _mpl()
    t = _trace_of(p)
    rows = _one_instance(t, 1, block, warp, instr, line, None, op, nth)
    banks = _bank_rows(t, rows)
    size = max(t["size"][i] for i in rows)
    ideal = max(1, size // 4)      # 64-bit accesses take 2 passes at best, 128-bit 4
    wavefronts = max(len(ws) for ws in banks.values())
    conflicts = max(0, wavefronts - ideal)
    fig, ax = _new_axes(ax, (10, 1.6 + 0.32 * max(wavefronts, 2)))
    for b in range(_BANKS):
        ax.text(b + 0.45, -0.15, str(b), ha="center", va="bottom", fontsize=6)
        for k, (word, lanes) in enumerate(banks.get(b, [])):
            extra = k >= ideal
            ax.add_patch(Rectangle((b, k), 0.9, 0.9, facecolor=_CONFLICT if extra else
                                   _LINE_COLORS[0], alpha=0.85, edgecolor="white",
                                   gid="conflict" if extra else "word"))
            label = str(lanes[0]) if len(lanes) == 1 else f"{lanes[0]}+{len(lanes) - 1}"
            ax.text(b + 0.45, k + 0.45, label, ha="center", va="center", fontsize=6,
                    color="white")
    ax.set_xlim(-0.2, _BANKS)
    ax.set_ylim(max(wavefronts, 1) + 0.1, -0.6)
    ax.set_xticks([])
    ax.set_yticks([k + 0.45 for k in range(wavefronts)], [f"pass {k + 1}" for k in range(wavefronts)],
                  fontsize=7)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("bank (cell: the lane(s) reading one 4-byte word; 3+2 = lane 3 and 2 more)",
                  fontsize=8)
    handles = [Patch(facecolor=_LINE_COLORS[0], label="served in the passes it needs")]
    if conflicts:
        handles.append(Patch(facecolor=_CONFLICT, label="extra pass: bank conflict"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False,
              fontsize=7)
    what = _OP_WORDS.get(t["op"][rows[0]], "access")
    name = _trace_names(p).get(-1, "shared memory")
    worst = f", {wavefronts}-way" if conflicts else ""
    ax.set_title(title or f"block {t['block'][rows[0]]}, warp {t['warp'][rows[0]]}: {what} of "
                          f"`{name}` (line {t['line'][rows[0]]}): {wavefronts} wavefront"
                          f"{'s' if wavefronts > 1 else ''}, {conflicts} bank conflict"
                          f"{'s' if conflicts != 1 else ''}{worst}", fontsize=9)
    return fig


# ---------------------------------------------------------------------------------------
# A profiler timeline (torch.profiler's Chrome trace, the format Perfetto opens)
# ---------------------------------------------------------------------------------------
_LANES = ("annotations", "host: PyTorch ops", "host: CUDA API", "GPU")
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_API_CATS = ("cuda_runtime", "cuda_driver")
#: CUDA calls in which the host waits for the GPU (a copy to the host waits for the kernels
#: queued before it, as ``loss.item()`` does)
_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
          "cudaMemcpy", "cudaMemcpyAsync")


def load_trace(trace) -> list:
    """The complete events (``"ph": "X"``) of a Chrome trace: a path (``.json`` or
    ``.json.gz``, as ``prof.export_chrome_trace`` writes and Perfetto opens) or its dict."""
    import gzip
    import json
    if not isinstance(trace, (dict, list)):
        path = str(trace)
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            trace = json.load(f)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def _lane(e) -> str | None:
    cat = e.get("cat", "")
    if cat in _GPU_CATS:
        return "GPU"
    if cat in _API_CATS:
        return "host: CUDA API"
    if cat == "cpu_op":
        return "host: PyTorch ops"
    if cat == "user_annotation":
        return "annotations"
    return None


def _top_level(events):
    """Events not nested in an earlier one of the same lane and thread (nested ops would hide
    their parents)."""
    out, end = [], {}
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        key = (e.get("pid"), e.get("tid"))
        if e["ts"] >= end.get(key, -math.inf):
            out.append(e)
            end[key] = e["ts"] + e["dur"]
    return out


def plot_timeline(trace, *, start_us=None, span_us=None, title=None, ax=None):
    """A profiler trace as lanes over time: the spans you annotated (``record_function``, and
    PyTorch's own, such as an optimizer step), the host's PyTorch ops, its CUDA API calls and the
    GPU's kernels and copies. CUDA calls in which the host waits for the GPU (synchronize, a copy
    to the host) are red: during them the host does nothing else. ``start_us``/``span_us`` pick
    a window, in microseconds from the first event. ``trace``: a path to a Chrome trace
    (``prof.export_chrome_trace``), or its dict.
    """
    _, Patch, Rectangle = _mpl()
    events = [e for e in load_trace(trace) if _lane(e)]
    if not events:
        raise ValueError("the trace has no PyTorch ops, CUDA calls, kernels or annotations")
    t0 = min(e["ts"] for e in events)
    lo = t0 + (start_us or 0)
    hi = lo + span_us if span_us else max(e["ts"] + e["dur"] for e in events)
    events = [e for e in events if e["ts"] < hi and e["ts"] + e["dur"] > lo]
    lanes = [ln for ln in _LANES if any(_lane(e) == ln for e in events)]
    fig, ax = _new_axes(ax, (11, 0.9 + 0.55 * len(lanes)))
    waited = 0.0
    for row, lane in enumerate(lanes):
        mine = [e for e in events if _lane(e) == lane]
        if lane in ("host: PyTorch ops", "annotations"):
            mine = _top_level(mine)
        for k, e in enumerate(sorted(mine, key=lambda e: e["ts"])):
            x0 = (max(e["ts"], lo) - t0) / 1e3
            w = (min(e["ts"] + e["dur"], hi) - max(e["ts"], lo)) / 1e3
            wait = lane == "host: CUDA API" and e.get("name", "").split("(")[0] in _WAITS
            waited += w if wait else 0
            color = (_CONFLICT if wait else _LINE_COLORS[2] if lane == "GPU" else
                     _BLOCK_COLORS[k % 2] if lane == "annotations" else _LINE_COLORS[0])
            gid = ("wait" if wait else {"GPU": "gpu", "annotations": "step", "host: CUDA API": "api"}
                   .get(lane, "op"))
            ax.add_patch(Rectangle((x0, row + 0.1), max(w, 1e-4), 0.8, facecolor=color,
                                   edgecolor="white", linewidth=0.3, gid=gid))
            if lane == "annotations" and w >= 0.12 * (hi - lo) / 1e3:   # room for its name
                ax.text(x0 + w / 2, row + 0.5, e.get("name", ""), ha="center", va="center",
                        fontsize=7)
    ax.set_xlim((lo - t0) / 1e3, (hi - t0) / 1e3)
    ax.set_ylim(len(lanes), 0)
    ax.set_yticks([r + 0.5 for r in range(len(lanes))], lanes, fontsize=8)
    ax.set_xlabel("time (ms from the first event)")
    handles = []
    if waited:
        handles.append(Patch(facecolor=_CONFLICT, label="host waits for the GPU"))
    if "GPU" in lanes:
        handles.append(Patch(facecolor=_LINE_COLORS[2], label="GPU kernel or copy"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False,
                  fontsize=7)
    ax.set_title(title or "profiler timeline (the same trace opens in ui.perfetto.dev)",
                 fontsize=9)
    return fig


# ---------------------------------------------------------------------------------------
# Lesson 09: the two reductions of LayerNorm's backward
# ---------------------------------------------------------------------------------------
def _new_figure(ncols: int, figsize, **kw):
    """A figure of ``ncols`` axes side by side, shown once (see ``_new_axes``)."""
    plt, _, _ = _mpl()
    fig, axes = plt.subplots(1, ncols, figsize=figsize, layout="constrained",
                             FigureClass=_course_figure_class(), squeeze=False, **kw)
    if not _inline_backend():
        plt.close(fig)
    return fig, list(axes[0])


def _arrow(ax, start, end, color="#444444", text=None, **kw):
    ax.annotate(text or "", xy=end, xytext=start, fontsize=8, ha="center", va="center",
                arrowprops=dict(arrowstyle="->", color=color, lw=1.2, shrinkA=0, shrinkB=0), **kw)


def plot_layernorm_backward(rows: int = 6, cols: int = 8, blocks: int = 2):
    """LayerNorm's backward as two pictures of the same ``rows x cols`` gradient ``dy``.

    Left, ``dx``: each row reduces *along itself* (the means of ``g = dy * w`` and of
    ``g * x̂``), and then that row's ``dx`` can be written: one block per row, no other
    block involved. Right, ``dw`` and ``db``: each column reduces *across all rows*. Every
    block adds its own rows (block b owns rows b, b + blocks, ...) into its row of a
    ``(blocks, cols)`` buffer of partial sums, and a second kernel adds the partials down
    each column. Rows are coloured by the block that owns them in both pictures.
    """
    _, _, Rectangle = _mpl()
    if not (1 <= blocks <= rows <= 16 and 2 <= cols <= 16):
        raise ValueError(f"need 1 <= blocks <= rows <= 16 and 2 <= cols <= 16, got rows={rows}, "
                         f"cols={cols}, blocks={blocks}")
    fig, (left, right) = _new_figure(2, (11.5, 0.9 + 0.42 * (rows + blocks + 4)))

    def grid(ax, y0, nrows, color_of, gid, label=None):
        for r in range(nrows):
            for c in range(cols):
                ax.add_patch(Rectangle((c, y0 + r), 0.92, 0.82, facecolor=color_of(r), edgecolor="#777777",
                                       linewidth=0.5, gid=f"{gid} {r}"))
        if label:
            ax.text(-0.3, y0 + nrows / 2, label, ha="right", va="center", fontsize=8)

    owner = [r % blocks for r in range(rows)]
    # dx: row reductions
    grid(left, 0, rows, lambda r: _block_color(owner[r]), "dy row", "dy\n(rows)")
    for r in range(rows):
        _arrow(left, (cols + 0.1, r + 0.41), (cols + 1.1, r + 0.41))
        for k, name in enumerate((r"$\bar g$", r"$\overline{g\hat x}$")):
            left.add_patch(Rectangle((cols + 1.2 + 1.3 * k, r), 1.2, 0.82, facecolor=_ACTIVE, edgecolor="#777777",
                                     linewidth=0.5, gid=f"row sum {r}"))
            left.text(cols + 1.8 + 1.3 * k, r + 0.41, name, ha="center", va="center", fontsize=9)
    left.text(cols + 2.4, -0.35, "2 sums per row", ha="center", fontsize=8)
    left.text(cols / 2, rows + 0.6,
              r"$dx_{ij} = \mathrm{rstd}_i\,(g_{ij} - \bar g_i - \hat x_{ij}\,\overline{g\hat x}_i)$"
              "\neach block reduces its own row, then writes that row of dx:\nno block waits for another",
              ha="center", va="top", fontsize=8)
    left.set_xlim(-1.8, cols + 4)
    left.set_ylim(rows + 2.2, -0.9)
    left.axis("off")
    left.set_title("dx: a reduction ALONG each row", fontsize=10)

    # dw, db: column reductions through per-block partials
    grid(right, 0, rows, lambda r: _block_color(owner[r]), "dy row", r"$dy\cdot\hat x$" + "\n(rows)")
    for r in range(rows):
        right.text(cols + 0.15, r + 0.41, f"block {owner[r]}", va="center", fontsize=7)
    top = rows + 1.2
    grid(right, top, blocks, _block_color, "partial", f"partials\n({blocks} x cols)")
    for c in range(cols):
        _arrow(right, (c + 0.46, rows - 0.1), (c + 0.46, top - 0.05), color="#888888")
    final = top + blocks + 1.0
    for c in range(cols):
        right.add_patch(Rectangle((c, final), 0.92, 0.82, facecolor=_ACTIVE, edgecolor="#777777", linewidth=0.5,
                                  gid="dw"))
        _arrow(right, (c + 0.46, top + blocks - 0.1), (c + 0.46, final - 0.05), color="#888888")
    right.text(-0.3, final + 0.41, "dw", ha="right", va="center", fontsize=8)
    right.text(cols / 2, final + 1.0, "db: the same, with dy in place of dy · x̂", ha="center", va="top", fontsize=8)
    right.text(cols + 0.15, rows / 2 + top / 2 - 0.1, "kernel 1: each block adds\nits rows into its partial row",
               va="center", fontsize=7)
    right.text(cols + 0.15, top + blocks + 0.45, "kernel 2: sum each\ncolumn of the partials",
               va="center", fontsize=7)
    right.set_xlim(-1.8, cols + 4)
    right.set_ylim(final + 1.6, -0.9)
    right.axis("off")
    right.set_title("dw, db: a reduction ACROSS rows (per column)", fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------
# Lesson 10: FlashAttention's tiles
# ---------------------------------------------------------------------------------------
def flash_tile_kinds(nq: int, nk: int, block_m: int, block_n: int, causal: bool = True) -> list[list[str]]:
    """What the course's FlashAttention forward (Triton v3) does with each tile of scores:
    ``kinds[i][j]`` for query tile i and key tile j is ``"full"`` (computed with no mask),
    ``"masked"`` (computed, with the causal or the bounds mask) or ``"skipped"`` (never visited).

    The same arithmetic as the kernel: with ``diag = nk - nq`` (key j is visible to query i when
    ``j <= i + diag``), the program of queries ``[m0, m0 + block_m)`` runs its key tiles below
    ``lo = min((max(m0 + diag + 1, 0) // block_n) * block_n, full)`` unmasked, the tiles from
    ``lo`` up to ``hi = min(nk, max(m0 + block_m + diag, 0))`` masked, and skips the rest
    (``full``: the keys in whole tiles). Without the causal mask, ``lo = full`` and ``hi = nk``.
    """
    for name, v in (("nq", nq), ("nk", nk), ("block_m", block_m), ("block_n", block_n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    diag, full = nk - nq, (nk // block_n) * block_n
    kinds = []
    for qt in range(_cdiv(nq, block_m)):
        m0 = qt * block_m
        if causal:
            lo = min((max(m0 + diag + 1, 0) // block_n) * block_n, full)
            hi = min(nk, max(m0 + block_m + diag, 0))
        else:
            lo, hi = full, nk
        row = []
        for kt in range(_cdiv(nk, block_n)):
            start = kt * block_n
            row.append("full" if start < lo else "masked" if start < hi else "skipped")
        kinds.append(row)
    return kinds


_TILE_COLORS = {"full": "#74c476", "masked": "#fdae6b", "skipped": "#f0f0f0"}


def plot_causal_tiles(shapes=((64, 64), (32, 64), (64, 32)), block_m: int = 16, block_n: int = 16,
                      *, causal: bool = True):
    """The score matrix of causal attention, one panel per ``(nq, nk)`` in ``shapes``, cut
    into ``block_m x block_n`` tiles: green tiles are computed with no mask, orange ones with
    the mask (they cross the diagonal ``j = i + nk - nq``, or hold the last, partial tile of
    keys), grey ones are skipped: their loads and products are never done. Inside, the dark
    cells are the (query, key) pairs the mask lets through. With ``nq > nk`` the first
    ``nq - nk`` queries see no key at all."""
    plt, Patch, Rectangle = _mpl()
    shapes = [tuple(s) for s in shapes]
    if not shapes or any(len(s) != 2 for s in shapes):
        raise ValueError(f"shapes must be a list of (nq, nk) pairs, got {shapes!r}")
    if max(max(s) for s in shapes) > 512:
        raise ValueError("at most 512 queries or keys: a picture of larger shapes shows nothing more")
    fig, axes = _new_figure(len(shapes), (4.0 * len(shapes), 4.6))
    for ax, (nq, nk) in zip(axes, shapes):
        kinds = flash_tile_kinds(nq, nk, block_m, block_n, causal)
        counts = {"full": 0, "masked": 0, "skipped": 0}
        for qt, row in enumerate(kinds):
            for kt, kind in enumerate(row):
                counts[kind] += 1
                w, h = min(block_n, nk - kt * block_n), min(block_m, nq - qt * block_m)
                ax.add_patch(Rectangle((kt * block_n, qt * block_m), w, h, facecolor=_TILE_COLORS[kind],
                                       edgecolor="#333333", linewidth=1.0, zorder=1, gid=kind))
        # the (query, key) pairs the mask removes, washed out over their tiles
        hidden = [[(0, 0, 0, 0) if (not causal) or j <= i + nk - nq else (1, 1, 1, 0.72) for j in range(nk)]
                  for i in range(nq)]
        ax.imshow(hidden, interpolation="nearest", extent=(0, nk, nq, 0), aspect="auto", zorder=2)
        for qt in range(len(kinds)):          # tile edges above the wash
            for kt in range(len(kinds[0])):
                ax.add_patch(Rectangle((kt * block_n, qt * block_m), min(block_n, nk - kt * block_n),
                                       min(block_m, nq - qt * block_m), facecolor="none", edgecolor="#333333",
                                       linewidth=1.0, zorder=3))
        if causal:
            # the last visible key of query i is i + nk - nq: the mask's edge
            i0 = max(0, nq - nk)
            ax.plot([i0 + nk - nq, nk], [i0, nk - (nk - nq)], color="#d62728", lw=1.3, zorder=4, gid="diagonal")
        ax.set_xlim(0, nk)
        ax.set_ylim(nq, 0)
        ax.set_xlabel(f"key j (Nk = {nk}), tiles of BLOCK_N = {block_n}", fontsize=8)
        ax.set_ylabel(f"query i (Nq = {nq}), tiles of BLOCK_M = {block_m}", fontsize=8)
        total = sum(counts.values())
        ax.set_title(f"Nq = {nq}, Nk = {nk}: of {total} tiles\n{counts['full']} full, "
                     f"{counts['masked']} masked, {counts['skipped']} skipped", fontsize=9)
        ax.tick_params(labelsize=7)
    axes[-1].legend(handles=[Patch(facecolor=_TILE_COLORS[k], edgecolor="#333333", label=k)
                             for k in ("full", "masked", "skipped")] + ([
                        plt.Line2D([], [], color="#d62728", label="edge of the mask: j = i + Nk − Nq")]
                        if causal else []),
                    fontsize=7, loc="upper right", framealpha=0.9)
    fig.suptitle(("causal" if causal else "no mask") + " attention: which tiles of scores the programs compute "
                 "(washed out: pairs the mask removes)", fontsize=10)
    return fig


def online_softmax_steps(scores, block: int) -> list[dict]:
    """The online softmax of one row of ``scores`` taken ``block`` at a time, step by step:
    for each tile its max, the running max ``m`` before and after, the rescale factor
    ``alpha = exp(m_old - m_new)`` applied to what was summed so far, and the running sum
    ``l`` of ``exp(s - m)`` after the tile."""
    scores = [float(s) for s in scores]
    if not scores or block < 1:
        raise ValueError("need at least one score and a block of at least 1")
    m, run_sum, out = -math.inf, 0.0, []
    for t in range(0, len(scores), block):
        tile = scores[t:t + block]
        m_new = max(m, max(tile))
        alpha = math.exp(m - m_new) if m != -math.inf else 0.0
        run_sum = alpha * run_sum + sum(math.exp(s - m_new) for s in tile)
        out.append({"tile": t // block, "tile_max": max(tile), "m_old": m, "m_new": m_new, "alpha": alpha,
                    "l": run_sum})
        m = m_new
    return out


def plot_flash_loop(nq: int = 64, nk: int = 96, block_m: int = 16, block_n: int = 32, *, program: int = 1,
                    scores=None):
    """FlashAttention's loop, and the rescale that makes it exact.

    Left: the ``nq x nk`` scores cut into tiles. Program ``program`` owns one tile of queries
    (a row of tiles) and visits the tiles of keys left to right, numbered in that order; only
    the ``block_m x block_n`` tile it is working on exists, on chip. Each step multiplies its
    Q tile by one K tile, rescales, and adds P V. Right: one query row of that program,
    ``scores`` (default: an example whose largest score comes in the second tile), as bars
    coloured by tile; the step line is the running max ``m`` after each tile. Where a tile
    raises ``m``, the sum and the output accumulated so far are multiplied by
    ``alpha = exp(m_old - m_new)``; where it does not, ``alpha = 1``.
    """
    plt, Patch, Rectangle = _mpl()
    n_tiles = _cdiv(nk, block_n)
    if not 0 <= program < _cdiv(nq, block_m):
        raise ValueError(f"program must be a query tile from 0 to {_cdiv(nq, block_m) - 1}, got {program}")
    if scores is None:
        import random
        rnd = random.Random(3)
        peaks = [1.0, 3.0, 2.0, 2.5]
        scores = [peaks[(j // block_n) % len(peaks)] - 2.5 * rnd.random() for j in range(nk)]
    scores = list(scores)
    if len(scores) != nk:
        raise ValueError(f"scores must hold one value per key ({nk}), got {len(scores)}")
    steps = online_softmax_steps(scores, block_n)
    fig, (left, right) = _new_figure(2, (12, 4.4), width_ratios=[1, 1.35])

    for qt in range(_cdiv(nq, block_m)):
        for kt in range(n_tiles):
            mine = qt == program
            left.add_patch(Rectangle((kt * block_n, qt * block_m), min(block_n, nk - kt * block_n),
                                     min(block_m, nq - qt * block_m),
                                     facecolor=_BLOCK_COLORS[kt % len(_BLOCK_COLORS)] if mine else "#f7f7f7",
                                     edgecolor="#555555", linewidth=0.8, gid="step" if mine else "tile"))
            if mine:
                left.text(kt * block_n + min(block_n, nk - kt * block_n) / 2, qt * block_m + block_m / 2,
                          f"step {kt + 1}", ha="center", va="center", fontsize=8)
    _arrow(left, (0, (program + 1) * block_m + block_m * 0.35), (nk, (program + 1) * block_m + block_m * 0.35))
    left.text(nk / 2, (program + 1) * block_m + block_m * 0.55,
              "for each K, V tile: S = Q Kᵀ · scale;  m_new = max(m, rowmax S)\n"
              "α = exp(m − m_new);  P = exp(S − m_new)\nl = α·l + rowsum P;  acc = α·acc + P V",
              ha="center", va="top", fontsize=8, family="monospace",
              bbox=dict(facecolor="white", edgecolor="#999999", boxstyle="round,pad=0.3"))
    left.set_xlim(0, nk)
    left.set_ylim(nq, 0)
    left.set_yticks([(qt + 0.5) * block_m for qt in range(_cdiv(nq, block_m))],
                    [f"program {qt}" for qt in range(_cdiv(nq, block_m))])
    left.set_xticks([(kt + 0.5) * block_n for kt in range(n_tiles)], [f"K, V tile {kt}" for kt in range(n_tiles)])
    left.set_xlabel(f"keys: {nk} in tiles of BLOCK_N = {block_n}", fontsize=8)
    left.set_ylabel(f"queries: {nq} in tiles of BLOCK_M = {block_m}", fontsize=8)
    left.tick_params(labelsize=7, length=0)
    left.set_title(f"program {program} walks its row of tiles, one step each;\n"
                   "a tile of S and P exists only on chip, during its step", fontsize=9)

    low = min(scores) - 0.2
    right.bar(range(nk), [s - low for s in scores], bottom=low, width=0.85, edgecolor="none", gid="score",
              color=[_BLOCK_COLORS[(j // block_n) % len(_BLOCK_COLORS)] for j in range(nk)])
    xs, ms = [], []
    for st in steps:
        lo, hi = st["tile"] * block_n - 0.5, min(nk, (st["tile"] + 1) * block_n) - 0.5
        xs += [lo, hi]
        ms += [st["m_new"], st["m_new"]]
        rises = st["m_old"] != -math.inf and st["m_new"] > st["m_old"]
        note = ("first tile: m = its max" if st["m_old"] == -math.inf else
                f"m rises: α = e^(m_old − m_new) = {st['alpha']:.2f}\nl and acc so far × α" if rises else
                "m unchanged: α = 1")
        right.text((lo + hi) / 2, st["m_new"] + 0.25, note, ha="center", va="bottom", fontsize=7,
                   color="#d62728" if rises else "#333333")
        if rises:
            right.axvline(lo, color="#d62728", lw=0.8, ls=":", gid="rescale")
    right.plot(xs, ms, color="#d62728", lw=1.8, drawstyle="steps-post", gid="running max")
    exact = sum(math.exp(s - max(scores)) for s in scores)
    right.set_ylim(min(scores) - 0.3, max(scores) + 1.3)
    right.set_xlim(-0.5, nk - 0.5)
    right.set_xlabel("key j of one query row (bars: its scores, coloured by tile)", fontsize=8)
    right.set_ylabel("score s_j", fontsize=8)
    right.tick_params(labelsize=7)
    right.set_title(f"one query row: the running max m (red) and the rescale\nafter the last tile "
                    f"l = {steps[-1]['l']:.4f}; the exact Σ exp(s − max s) = {exact:.4f}", fontsize=9)
    return fig


def plot_recorded_attention(path=None, *, d: int = 64, pass_: str = "forward", dtype: str = "float16"):
    """The recorded attention sweep: TFLOP/s against the sequence length N (B x N fixed), one
    panel without the mask and one causal. The course's kernels are solid lines in their
    language's colour, PyTorch's backends dashed or dotted in greys. Prints a line and returns
    None when nothing is recorded."""
    from .bench import recorded_label, recorded_rows
    rows = [r for r in recorded_rows("attention", path) if r.get("sweep") and r.get("pass") == pass_
            and r.get("dtype") == dtype and (r.get("shape") or [0] * 4)[3] == d]
    if not rows:
        print(f"No recorded attention sweep ({pass_}, {dtype}, d = {d}) to plot yet.")
        return None
    fig, axes = _new_figure(2, (11, 4), sharey=True)
    styles: dict = {}
    for ax, causal in zip(axes, (False, True)):
        for variant in sorted({r["variant"] for r in rows if r.get("causal") == causal}):
            name = variant.split(" [")[0]
            pts = sorted((r["shape"][2], r["tflops"]) for r in rows
                         if r["variant"] == variant and r.get("causal") == causal)
            ours = name.split()[0] in _LANG_SHADES
            style = "-" if ours else styles.setdefault(name, ("--", ":", "-.")[len(styles) % 3])
            ax.plot(*zip(*pts), style, marker="o", ms=3, color=variant_color(name), label=name, gid=name)
        tokens = rows[0]["shape"][0] * rows[0]["shape"][2]
        ax.set(xscale="log", xlabel=f"sequence length N (B x N = {tokens} tokens)",
               title=f"{pass_}, {dtype}, d = {d}, {'causal' if causal else 'no mask'}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"recorded on {recorded_label('attention', path)}", fontsize=9)
    return fig


# ---------------------------------------------------------------------------------------
# The ring all-reduce (lesson 13)
# ---------------------------------------------------------------------------------------
def ring_steps(world: int) -> list[dict]:
    """The ring all-reduce of ``world`` ranks, as ``kernels/collectives.py`` runs it, symbolically:
    before any step and after each of the ``2 (world - 1)`` steps, which ranks' values every
    chunk of every rank sums (``state[rank][chunk]``, a frozenset), and the messages of the step
    (``(src, dst, chunk)``). The first ``world - 1`` steps are the reduce-scatter, the others the
    all-gather."""
    if not isinstance(world, int) or isinstance(world, bool) or not 1 <= world <= 8:
        raise ValueError(f"ring_steps: world must be an int from 1 to 8, got {world!r}")
    state = [[frozenset({r}) for _ in range(world)] for r in range(world)]
    out = [{"phase": "start", "step": 0, "state": [row[:] for row in state], "messages": []}]
    for half in ("reduce-scatter", "all-gather"):
        for step in range(world - 1):
            messages = []
            for r in range(world):
                first = r if half == "reduce-scatter" else (r + 1) % world
                messages.append((r, (r + 1) % world, (first - step) % world))
            new = [row[:] for row in state]
            for src, dst, c in messages:
                new[dst][c] = state[dst][c] | state[src][c] if half == "reduce-scatter" else state[src][c]
            state = new
            out.append({"phase": half, "step": step + 1, "state": [row[:] for row in state], "messages": messages})
    return out


def plot_ring_all_reduce(world: int = 4, *, ax=None):
    """The ring all-reduce of ``world`` ranks, one panel a step: a row per rank, a column per
    chunk; a cell lists the ranks whose values it sums (dark: all of them), an arrow each
    chunk sent in the step. Reduce-scatter first (each step adds one rank), then all-gather
    (each step copies one finished chunk on)."""
    plt, _, Rectangle = _mpl()
    steps = ring_steps(world)
    if ax is not None:
        raise ValueError("plot_ring_all_reduce draws one panel a step: it makes its own figure (no ax=)")
    cols = min(len(steps), 4)
    rows = math.ceil(len(steps) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.9 * cols, 0.55 * world * rows + 0.9 * rows), squeeze=False)
    for k, (s, a) in enumerate(zip(steps, axes.flat)):
        for r in range(world):
            for c in range(world):
                ranks = s["state"][r][c]
                full = len(ranks) == world
                color = "#08519c" if full else _BLOCK_COLORS[min(len(ranks), len(_BLOCK_COLORS)) - 1]
                a.add_patch(Rectangle((c, r), 0.92, 0.8, facecolor=color, edgecolor="#888888", linewidth=0.5,
                                      gid="full" if full else "partial"))
                a.text(c + 0.46, r + 0.4, "+".join(map(str, sorted(ranks))) if len(ranks) < world else "all",
                       ha="center", va="center", fontsize=7, color="white" if full else "black")
        for src, dst, c in s["messages"]:
            a.annotate("", xy=(c + 0.85, dst + 0.4), xytext=(c + 0.85, src + 0.4),
                       arrowprops=dict(arrowstyle="->", color="#d62728", lw=0.8,
                                       connectionstyle="arc3,rad=0.3"), gid="send")
        a.set_xlim(-0.1, world)
        a.set_ylim(world, -0.1)
        a.set_xticks([c + 0.46 for c in range(world)], [f"chunk {c}" for c in range(world)], fontsize=6)
        a.set_yticks([r + 0.4 for r in range(world)], [f"rank {r}" for r in range(world)], fontsize=6)
        a.tick_params(length=0)
        for side in a.spines.values():
            side.set_visible(False)
        title = "start: each rank its own x" if s["phase"] == "start" else f"{s['phase']} step {s['step']}"
        a.set_title(title, fontsize=8)
    for a in list(axes.flat)[len(steps):]:
        a.axis("off")
    fig.suptitle(f"Ring all-reduce of {world} ranks: {2 * (world - 1)} steps, each rank sends one chunk a step "
                 f"({2 * (world - 1)}/{world} of x in all)", fontsize=10)
    fig.tight_layout()
    return fig
