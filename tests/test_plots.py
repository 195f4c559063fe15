"""The course's figures (utils/plots.py) and progress bars (runtime/progress.py).

Figures are checked through their artists: how many cells, bars and lines they hold,
which are marked masked or active, and what the titles say about where numbers come from.
"""
import io
import json

import matplotlib
import pytest

import utils

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle


def rects(fig, gid=None):
    ax = fig.axes[0]
    out = [p for p in ax.patches if isinstance(p, Rectangle)]
    if gid is not None:
        out = [p for p in out if (p.get_gid() or "").startswith(gid)]
    return out


def lines(fig, gid):
    return [ln for ln in fig.axes[0].lines if ln.get_gid() == gid]


# --- index maps ------------------------------------------------------------------------
def test_index_map_1d_cells_blocks_and_masked_tail():
    before = plt.get_fignums()
    fig = utils.plot_index_map(20, 8)
    assert isinstance(fig, Figure)
    assert plt.get_fignums() == before  # detached from pyplot: shown once, never leaked
    assert len(rects(fig)) == 24                      # 3 blocks of 8 threads
    assert len(rects(fig, "masked")) == 4             # threads 20..23 fail i < n
    assert len(rects(fig, "block 2")) == 4            # the tail block's working threads
    assert [r.get_x() for r in rects(fig, "masked")] == [20, 21, 22, 23]
    ax = fig.axes[0]
    assert "blockDim.x" in ax.get_xlabel()
    assert "3 blocks" in ax.get_title() and "masked" in ax.get_title()


def test_index_map_1d_triton_wording_and_exact_fit():
    fig = utils.plot_index_map(32, 16, unit="program")
    assert not rects(fig, "masked")  # 32 = 2 x 16: no tail
    assert len(rects(fig, "program 1")) == 16
    assert "BLOCK" in fig.axes[0].get_xlabel()


def test_index_map_rejects_bad_sizes():
    with pytest.raises(ValueError):
        utils.plot_index_map(0, 8)
    with pytest.raises(ValueError, match="too many"):
        utils.plot_index_map(1 << 20, 256)


def test_index_map_2d():
    fig = utils.plot_index_map_2d((5, 7), (2, 4))
    assert len(rects(fig)) == 6 * 8                  # grid 2 (x) by 3 (y) blocks of 2x4
    assert len(rects(fig, "masked")) == 6 * 8 - 5 * 7
    assert len(rects(fig, "block (1, 2)")) == 1 * 3  # bottom-right block: 1 row, 3 cols inside
    ax = fig.axes[0]
    assert "threadIdx.x" in ax.get_xlabel() and "threadIdx.y" in ax.get_ylabel()
    assert any("5x7" in t.get_text() for t in ax.get_legend().get_texts())


# --- reduction trees -------------------------------------------------------------------
@pytest.mark.parametrize("addressing", ["sequential", "interleaved"])
def test_reduction_tree_counts(addressing):
    fig = utils.plot_reduction_tree(16, addressing)
    assert len(lines(fig, "add")) == 2 * 15   # 15 additions, two operands each
    assert len(rects(fig, "active")) == 15    # each addition writes one cell
    assert len(rects(fig)) == 16 * 5          # the input row and 4 steps
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "0-15" in texts                    # the last step holds the total
    assert addressing in fig.axes[0].get_title()


def test_reduction_tree_active_threads_differ_by_addressing():
    def first_step_cells(fig):
        return sorted(r.get_x() for r in rects(fig, "active") if r.get_y() == 1)

    assert first_step_cells(utils.plot_reduction_tree(8, "sequential")) == [0, 1, 2, 3]
    assert first_step_cells(utils.plot_reduction_tree(8, "interleaved")) == [0, 2, 4, 6]


def test_reduction_tree_rejects_bad_arguments():
    with pytest.raises(ValueError, match="power of two"):
        utils.plot_reduction_tree(12)
    with pytest.raises(ValueError, match="addressing"):
        utils.plot_reduction_tree(16, "strided")


# --- bandwidth ---------------------------------------------------------------------------
SWEEP = {"triton v2": [(4096, 10.0), (1 << 16, 150.0), (1 << 20, 1800.0)],
         "cuda v1": [(4096, 8.0), (1 << 16, 120.0), (1 << 20, 1500.0)],
         "torch": [(4096, 9.0), (1 << 16, 140.0), (1 << 20, 1700.0)]}


def test_bandwidth_lines_roofline_and_log_axis():
    fig = utils.plot_bandwidth(SWEEP, roofline_gbps=3000.0, recorded_on="NVIDIA H100 80GB HBM3")
    ax = fig.axes[0]
    variant_lines = [ln for ln in ax.lines if ln.get_gid() != "roofline"]
    assert [ln.get_label() for ln in variant_lines] == list(SWEEP)
    assert list(variant_lines[0].get_xdata()) == [4096, 1 << 16, 1 << 20]
    (roof,) = lines(fig, "roofline")
    assert list(roof.get_ydata()) == [3000.0, 3000.0]
    assert ax.get_xscale() == "log"
    assert "GB/s" in ax.get_ylabel()
    assert "recorded on NVIDIA H100" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("roofline" in s for s in labels)


def test_bandwidth_simulated_label_and_no_roofline():
    fig = utils.plot_bandwidth({"numba": [(256, 0.01), (1024, 0.02)]}, label_simulated=True)
    assert "simulated on the CPU" in fig.axes[0].get_title()
    assert not lines(fig, "roofline")


def test_recorded_bandwidth_reads_the_results_file(tmp_path, capsys):
    path = tmp_path / "h100.json"
    path.write_text(json.dumps({
        "schema": 1, "machine": {"gpu": "NVIDIA H100 80GB HBM3"}, "date": "2026-01-31T12:00:00Z",
        "copy": {"gbps": 3100.0}, "rows": [],
        "sweeps": {"relu": {"triton v2": [[4096, 11.0], [65536, 160.0]],
                            "cuda v1": [[4096, 9.0], [65536, 140.0]]}}}))
    fig = utils.plot_recorded_bandwidth("relu", path)
    ax = fig.axes[0]
    assert len(lines(fig, "roofline")) == 1
    assert sorted(ln.get_label() for ln in ax.lines if ln.get_gid() != "roofline") == ["cuda v1", "triton v2"]
    assert "NVIDIA H100 80GB HBM3, 2026-01-31" in ax.get_title()
    assert utils.plot_recorded_bandwidth("relu", tmp_path / "missing.json") is None
    assert "No recorded GPU results" in capsys.readouterr().out


def test_bars():
    values = {"cuda v1": 1900.0, "triton v2": 2900.0, "numba": None, "torch": 2950.0}
    fig = utils.plot_bars(values, roofline_gbps=3200.0, highlight="triton v2", label_simulated=True)
    ax = fig.axes[0]
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(bars) == 4
    assert [b.get_width() for b in bars] == [1900.0, 2900.0, 0, 2950.0]
    assert bars[1].get_linewidth() > bars[0].get_linewidth()  # the highlighted one is outlined
    # one hue per language, PyTorch black
    assert [b.get_facecolor()[:3] for b in (bars[0], bars[3])] == [
        matplotlib.colors.to_rgb(utils.variant_color("cuda v1")), (0.0, 0.0, 0.0)]
    assert [t.get_text() for t in ax.get_yticklabels()] == list(values)
    assert len(lines(fig, "roofline")) == 1
    assert "simulated" in ax.get_title()


def test_variant_colours_one_hue_per_language_a_shade_per_version():
    import colorsys
    hue = lambda name: colorsys.rgb_to_hsv(*matplotlib.colors.to_rgb(utils.variant_color(name)))  # noqa: E731
    langs = {lang: [hue(f"{lang} v{k}") for k in (1, 2, 3, 4)] for lang in ("cuda", "numba", "triton")}
    for lang, hsv in langs.items():
        assert max(h for h, _, _ in hsv) - min(h for h, _, _ in hsv) < 0.1, lang    # one hue
        assert [v for _, _, v in hsv] == sorted((v for _, _, v in hsv), reverse=True), lang  # darker later
        assert len({utils.variant_color(f"{lang} v{k}") for k in (1, 2, 3, 4)}) == 4
    hues = sorted(hsv[0][0] for hsv in langs.values())
    assert min(b - a for a, b in zip(hues, hues[1:])) > 0.15                         # three hues
    assert utils.variant_color("torch") == "#000000"
    baselines = ["torch", "torch.compile", "torch op-by-op"]
    assert len({utils.variant_color(b) for b in baselines}) == len(baselines)
    for base in ("torch.compile", "cuBLAS"):
        assert hue(base)[1] == 0                                                    # grey
    assert utils.variant_color("triton") == utils.variant_color("Triton")


def test_drawing_into_a_given_axes():
    fig, (a, b) = plt.subplots(1, 2)
    try:
        assert utils.plot_reduction_tree(8, ax=a) is fig
        assert utils.plot_bars({"x": 1.0}, ax=b) is fig
        assert a.patches and b.patches
    finally:
        plt.close(fig)


# --- progress bars -----------------------------------------------------------------------
def test_progress_is_silent_under_pytest_but_iterates(capsys):
    assert not utils.progress_enabled()  # pytest sets PYTEST_CURRENT_TEST
    seen = list(utils.progress(range(5), desc="sweep"))
    assert seen == [0, 1, 2, 3, 4]
    with utils.progress(total=3, desc="manual") as bar:
        for _ in range(3):
            bar.update()
            bar.set_postfix(step="x")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_progress_can_be_forced_on(monkeypatch):
    monkeypatch.setenv("COURSE_PROGRESS", "1")
    assert utils.progress_enabled()
    buf = io.StringIO()
    assert list(utils.progress([1, 2, 3], desc="sizes", file=buf, mininterval=0)) == [1, 2, 3]
    assert "sizes" in buf.getvalue() and "3/3" in buf.getvalue()
    monkeypatch.setenv("COURSE_PROGRESS", "0")
    assert not utils.progress_enabled()


def test_figure_shows_once_in_a_notebook(monkeypatch):
    # In a notebook the inline backend and the cell's value both ask a figure to display
    # itself; the first request draws it and takes it out of pyplot.
    from IPython import display as ipy_display

    from utils import plots
    shown = []
    monkeypatch.setattr(plots, "_inline_backend", lambda: True)
    monkeypatch.setattr(ipy_display, "display", lambda obj, **kw: shown.append(obj))
    fig = utils.plot_bars({"a": 1.0})
    assert plt.fignum_exists(fig.number)  # left open for the inline backend
    fig._ipython_display_()
    assert len(shown) == 1 and shown[0].data[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)  # nothing left for a second display


# --- pictures of a profiled launch, from a trace shaped like utils.profile's p.trace -------
def make_trace(accesses, names):
    """A profile-like object from (block, thread, space, op, arg, offset, size, line, it)
    tuples, where `it` counts the times a thread ran that line; one warp's lanes with the same
    (line, it) form one instruction instance, as the contract's `instr` says."""
    import types

    import torch
    cols = {c: [] for c in ("block", "thread", "warp", "lane", "space", "op", "arg", "offset",
                            "size", "line", "instr")}
    instrs = {}
    for block, thread, space, op, arg, offset, size, line, it in accesses:
        key = (block, thread // 32, line, it)
        instrs.setdefault(key, len(instrs))
        for c, v in zip(cols, (block, thread, thread // 32, thread % 32, space, op, arg, offset,
                               size, line, instrs[key])):
            cols[c].append(v)
    trace = {c: torch.tensor(v, dtype=torch.int64) for c, v in cols.items()}
    return types.SimpleNamespace(trace=trace, trace_names=names, kernel="k")


def strided_copy_trace(stride, threads=64):
    # y[i] = x[i * stride]: float32 loads of x (arg 0) at line 3, stores of y (arg 1) at line 4
    acc = []
    for t in range(threads):
        acc.append((0, t, 0, 0, 0, 4 * t * stride, 4, 3, 0))
        acc.append((0, t, 0, 1, 1, 4 * t, 4, 4, 0))
    return make_trace(acc, {0: "x", 1: "y"})


def test_access_map_colours_elements_by_warp_and_leaves_gaps_for_a_stride():
    fig = utils.plot_access_map(strided_copy_trace(1), arg="x")
    assert len(rects(fig, "warp 0")) == 32 and len(rects(fig, "warp 1")) == 32
    assert not rects(fig, "untouched")               # contiguous: 64 elements, 2 full rows
    assert "64 elements" in fig.axes[0].get_title() and "2 warps" in fig.axes[0].get_title()
    fig2 = utils.plot_access_map(strided_copy_trace(2), arg=0)
    assert len(rects(fig2, "warp")) == 64 and len(rects(fig2, "untouched")) == 64  # odd ones, to the row end
    # stores of y are contiguous whatever the stride of x
    fig3 = utils.plot_access_map(strided_copy_trace(2), arg="y", op="st")
    assert len(rects(fig3, "warp")) == 64 and not rects(fig3, "untouched")


def test_access_map_marks_elements_touched_by_several_threads():
    # every thread reads x[0] (a broadcast) and its own x[1 + t]
    acc = [(0, t, 0, 0, 0, 0, 4, 3, 0) for t in range(8)]
    acc += [(0, t, 0, 0, 0, 4 + 4 * t, 4, 4, 0) for t in range(8)]
    fig = utils.plot_access_map(make_trace(acc, {0: "x"}), arg="x")
    assert len(rects(fig, "warp 0 shared")) == 1 and rects(fig, "warp 0 shared")[0].get_x() == 0


def test_access_map_errors_name_the_problem():
    p = strided_copy_trace(1)
    with pytest.raises(ValueError, match="no argument named 'z'"):
        utils.plot_access_map(p, arg="z")
    with pytest.raises(ValueError, match="no global atom"):
        utils.plot_access_map(p, arg="x", op="atom")
    import types
    with pytest.raises(ValueError, match="too large"):
        utils.plot_access_map(types.SimpleNamespace(trace=None, trace_names={}), arg=0)


def test_sectors_of_contiguous_and_strided_warp_loads():
    fig = utils.plot_sectors(strided_copy_trace(1), arg="x")
    # 32 lanes x 4 bytes = 128 bytes: 4 sectors, the fewest possible
    assert len(rects(fig, "sector")) == 4 and "as few as" in fig.axes[0].get_title()
    assert len(rects(fig, "lane")) == 32
    fig32 = utils.plot_sectors(strided_copy_trace(32), arg="x")
    # 128 bytes apart: each lane its own sector; 4 would hold the 128 bytes needed
    title = fig32.axes[0].get_title()
    assert "32 sectors" in title and "4 would hold its 128 bytes" in title
    assert len(rects(fig32, "sector")) == 32
    # warp 1 of the stride-2 copy starts at byte 256
    fig_w1 = utils.plot_sectors(strided_copy_trace(2), arg="x", warp=1)
    assert "8 sectors" in fig_w1.axes[0].get_title() and "warp 1" in fig_w1.axes[0].get_title()


def test_sectors_of_a_misaligned_load_and_of_a_partial_warp():
    acc = [(0, t, 0, 0, 0, 4 * (t + 1), 4, 3, 0) for t in range(32)]   # x[i + 1]
    fig = utils.plot_sectors(make_trace(acc, {0: "x"}))
    assert len(rects(fig, "sector")) == 5 and "4 would hold" in fig.axes[0].get_title()
    half = [(0, t, 0, 0, 0, 4 * t, 4, 3, 0) for t in range(16)]         # 16 active lanes
    fig = utils.plot_sectors(make_trace(half, {0: "x"}))
    assert len(rects(fig, "lane")) == 16 and len(rects(fig, "idle lane")) == 16
    assert len(rects(fig, "sector")) == 2


def shared_trace(word_of_lane, size=4):
    acc = [(0, lane, 1, 0, -1, 4 * w, size, 9, 0) for lane, w in enumerate(word_of_lane)]
    return make_trace(acc, {-1: "tile"})


def test_banks_without_and_with_conflicts():
    fig = utils.plot_banks(shared_trace(range(32)))                 # tile[lane]
    assert len(rects(fig, "word")) == 32 and not rects(fig, "conflict")
    assert "1 wavefront, 0 bank conflicts" in fig.axes[0].get_title()
    # tile[2 * lane]: lanes 0 and 16 both need bank 0 (words 0 and 32): 2 passes
    fig = utils.plot_banks(shared_trace([2 * k for k in range(32)]))
    assert len(rects(fig, "conflict")) == 16
    assert "2 wavefronts, 1 bank conflict, 2-way" in fig.axes[0].get_title()
    # a 32 x 32 tile read down a column: tile[lane * 32], all in bank 0: 32 passes
    fig = utils.plot_banks(shared_trace([32 * k for k in range(32)]))
    assert len(rects(fig, "conflict")) == 31 and "32 wavefronts" in fig.axes[0].get_title()
    # padded to 33 columns: tile[lane * 33], one word per bank
    fig = utils.plot_banks(shared_trace([33 * k for k in range(32)]))
    assert not rects(fig, "conflict") and "`tile`" in fig.axes[0].get_title()


def test_banks_broadcast_and_64_bit_words():
    fig = utils.plot_banks(shared_trace([0] * 32))                  # every lane reads tile[0]
    assert len(rects(fig, "word")) == 1 and not rects(fig, "conflict")
    # 8-byte accesses of consecutive doubles: 64 words, 2 per bank = the 2 passes 64-bit needs
    fig = utils.plot_banks(shared_trace([2 * k for k in range(32)], size=8))
    assert len(rects(fig, "word")) == 64 and not rects(fig, "conflict")
    assert "2 wavefronts, 0 bank conflicts" in fig.axes[0].get_title()


def test_banks_and_sectors_pick_the_nth_access_of_a_line():
    # a loop at line 9 whose step k reads tile[lane * 2^k]: step 0 conflict-free... step 2 4-way
    acc = [(0, lane, 1, 0, -1, 4 * lane * (1 << k), 4, 9, k) for k in range(3) for lane in range(32)]
    acc += [(0, lane, 1, 1, -1, 4 * lane, 4, 9, 10 + k) for k in range(3) for lane in range(32)]
    p = make_trace(acc, {-1: "tile"})
    assert "1 wavefront" in utils.plot_banks(p, line=9, op="ld").axes[0].get_title()
    assert "2 wavefronts" in utils.plot_banks(p, line=9, op="ld", nth=1).axes[0].get_title()
    assert "4 wavefronts" in utils.plot_banks(p, line=9, op="ld", nth=2).axes[0].get_title()
    assert "store" in utils.plot_banks(p, line=9, op="st", nth=2).axes[0].get_title()
    with pytest.raises(ValueError, match=r"number 3"):
        utils.plot_banks(p, line=9, op="ld", nth=3)
    g = make_trace([(0, t, 0, 0, 0, 4 * t * (k + 1), 4, 3, k) for k in range(2) for t in range(32)],
                   {0: "x"})
    assert "8 sectors" in utils.plot_sectors(g, nth=1).axes[0].get_title()


# --- profiler timelines --------------------------------------------------------------------
def chrome_trace():
    """A hand-made torch.profiler trace: one step, two ops (one nested), a launch, a kernel,
    and a host copy that waits for the kernel."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "step 0", "ts": 1000, "dur": 900, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1010, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 1020, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": 1200, "dur": 650, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1050, "dur": 5, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 1210, "dur": 600, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "kernel", "name": "sgemm", "ts": 1100, "dur": 700, "pid": 0, "tid": 7},
        {"ph": "i", "name": "marker", "ts": 1500, "pid": 1, "tid": 1},
    ]
    return {"traceEvents": ev}


def test_timeline_lanes_and_waits(tmp_path):
    fig = utils.plot_timeline(chrome_trace())
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["annotations", "host: PyTorch ops", "host: CUDA API", "GPU"]
    assert len(rects(fig, "op")) == 2               # aten::empty is nested in aten::mm
    assert len(rects(fig, "wait")) == 1 and len(rects(fig, "api")) == 1
    assert len(rects(fig, "gpu")) == 1 and len(rects(fig, "step")) == 1
    assert rects(fig, "wait")[0].get_width() == pytest.approx(0.6)   # ms
    # from a .json.gz file, as the recorded traces are stored; and a window of it
    import gzip
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(chrome_trace(), f)
    fig = utils.plot_timeline(path, start_us=0, span_us=150)
    assert not rects(fig, "wait")                     # the copy starts after the window
    assert len(utils.load_trace(path)) == 7


def test_timeline_of_a_cpu_only_trace_has_no_gpu_lane():
    ev = [e for e in chrome_trace()["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation")]
    fig = utils.plot_timeline({"traceEvents": ev})
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["annotations", "host: PyTorch ops"]
    with pytest.raises(ValueError, match="no PyTorch ops"):
        utils.plot_timeline({"traceEvents": []})


# --- lessons 09 and 10: LayerNorm's two reductions, FlashAttention's tiles -------------
def _gids(fig, prefix, ax=0):
    return [p for p in fig.axes[ax].patches if (p.get_gid() or "").startswith(prefix)]


def test_layernorm_backward_row_sums_beside_partials():
    fig = utils.plot_layernorm_backward(rows=6, cols=8, blocks=2)
    assert len(_gids(fig, "row sum", 0)) == 2 * 6          # two sums per row for dx
    assert len(_gids(fig, "partial", 1)) == 2 * 8          # a (blocks, cols) buffer for dw/db
    assert len(_gids(fig, "dw", 1)) == 8
    assert "ALONG" in fig.axes[0].get_title() and "ACROSS" in fig.axes[1].get_title()
    with pytest.raises(ValueError, match="blocks <= rows"):
        utils.plot_layernorm_backward(rows=2, blocks=3)


def _brute_kind(nq, nk, bm, bn, qt, kt):
    """What a tile needs, from its (query, key) pairs: nothing visible, all visible, or a mix."""
    qs, ks = range(qt * bm, min(nq, qt * bm + bm)), range(kt * bn, min(nk, kt * bn + bn))
    vis = [j <= i + nk - nq for i in qs for j in ks]
    return "skipped" if not any(vis) else "full" if all(vis) and len(ks) == bn else "masked"


@pytest.mark.parametrize("nq, nk", [(64, 64), (32, 64), (64, 32), (50, 37), (5, 70)])
def test_flash_tile_kinds_follow_the_mask(nq, nk):
    bm, bn = 16, 16
    kinds = utils.flash_tile_kinds(nq, nk, bm, bn)
    for qt, row in enumerate(kinds):
        for kt, kind in enumerate(row):
            want = _brute_kind(nq, nk, bm, bn, qt, kt)
            # the kernel may mask a tile it could run unmasked (its stage 2 starts at a whole tile),
            # but never skips a tile with a visible pair nor runs a tile with hidden pairs unmasked
            assert kind == want or (kind == "masked" and want == "full"), (qt, kt, kind, want)
    assert utils.flash_tile_kinds(64, 40, 16, 16, causal=False) == [["full", "full", "masked"]] * 4


def test_causal_tiles_counts_in_titles():
    fig = utils.plot_causal_tiles(((64, 64), (64, 32)), 16, 16)
    assert "6 full, 4 masked, 6 skipped" in fig.axes[0].get_title()
    assert len(_gids(fig, "skipped", 1)) == 5 and "1 full, 2 masked, 5 skipped" in fig.axes[1].get_title()
    with pytest.raises(ValueError):
        utils.flash_tile_kinds(0, 4, 16, 16)


def test_online_softmax_steps_rescale_only_when_the_max_rises():
    import math
    scores = [0.0, 1.0, 3.0, 2.0, 2.5, -1.0]
    steps = utils.online_softmax_steps(scores, 2)
    assert [s["m_new"] for s in steps] == [1.0, 3.0, 3.0]
    assert steps[1]["alpha"] == pytest.approx(math.exp(1.0 - 3.0)) and steps[2]["alpha"] == 1.0
    assert steps[-1]["l"] == pytest.approx(sum(math.exp(s - 3.0) for s in scores))
    fig = utils.plot_flash_loop(nq=64, nk=96, block_m=16, block_n=32, program=1)
    assert len(_gids(fig, "step", 0)) == 3                   # program 1 visits 3 tiles of keys
    assert len([ln for ln in fig.axes[1].lines if ln.get_gid() == "rescale"]) == 1
    t = fig.axes[1].get_title()
    assert t.split("l = ")[1][:7] == t.split("= ")[-1][:7]   # online sum == exact sum


def test_recorded_attention_sweep(tmp_path, capsys):
    rows = [{"topic": "attention", "variant": f"{v} [float16, {'causal' if c else 'full'}, forward]",
             "shape": [16384 // n, 32, n, 64], "dtype": "float16", "causal": c, "pass": "forward", "sweep": True,
             "tflops": tf * n / 1024} for v, tf in (("triton v3", 300.0), ("SDPA flash", 250.0))
            for c in (False, True) for n in (512, 1024, 2048)]
    p = tmp_path / "h100.json"
    p.write_text(json.dumps({"machine": {"gpu": "H100"}, "date": "2026-01-01", "rows": rows}))
    fig = utils.plot_recorded_attention(p)
    full, causal = fig.axes
    assert sorted(ln.get_gid() for ln in full.lines) == ["SDPA flash", "triton v3"]
    assert list(next(ln for ln in causal.lines if ln.get_gid() == "triton v3").get_xdata()) == [512, 1024, 2048]
    assert next(ln for ln in full.lines if ln.get_gid() == "SDPA flash").get_linestyle() == "--"
    assert utils.plot_recorded_attention(p, d=128) is None
    assert "No recorded attention sweep" in capsys.readouterr().out
