"""benchmarks/lessons/streams_and_graphs.py (lesson 13) without a GPU: the script refuses to
measure and says why, and the helpers that turn its recorded JSON into the lesson's rows,
timeline and plot give the right answers on a small hand-made result."""
from __future__ import annotations

import gzip
import json

import pytest

import utils
from benchmarks.lessons import streams_and_graphs as sg


def test_without_a_gpu_it_measures_nothing_and_exits_with_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(utils, "SIMULATE", True)  # as on a laptop, or with COURSE_SIMULATE=1 on a GPU
    assert sg.main(["--out", str(tmp_path)]) == 2
    said = capsys.readouterr().out
    assert "simulation" in said and "nothing was measured" in said and "streams-graphs.json" in said
    assert not list(tmp_path.iterdir()), "nothing is written without a GPU"


def _event(name, cat, stream, ts, dur):
    return dict(ph="X", cat=cat, name=name, pid=0, tid=stream, ts=ts, dur=dur, args={"stream": stream})


#: A profiler trace as torch writes it, cut down: one serial run on stream 7 (a copy, then two
#: matmuls), then, after a pause, one overlapped run (the copy on stream 13 beside the matmuls on
#: stream 7), and host events that are not the GPU's.
TRACE = {"traceEvents": [
    dict(ph="X", cat="cpu_op", name="aten::mm", pid=1, tid=1, ts=990.0, dur=5.0),
    dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", pid=1, tid=1, ts=995.0, dur=3.0),
    _event("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 7, 1000.0, 5000.0),
    _event("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>(cutlass_80_simt_sgemm::Params)",
           "kernel", 7, 6000.0, 2500.0),
    _event("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>(cutlass_80_simt_sgemm::Params)",
           "kernel", 7, 8500.0, 2500.0),
    _event("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 13, 20000.0, 5000.0),
    _event("sgemm", "kernel", 7, 20010.0, 2500.0),
    _event("sgemm", "kernel", 7, 22510.0, 2500.0),
    dict(ph="M", name="thread_name", pid=0, tid=7, args={"name": "stream 7"}),
]}


def test_gpu_intervals_keeps_the_gpus_work_from_the_first_start(tmp_path):
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(TRACE, f)
    for trace in (TRACE, path):
        iv = sg.gpu_intervals(trace)
        assert [i["kind"] for i in iv] == ["copy", "kernel", "kernel", "copy", "kernel", "kernel"]
        assert iv[0] == dict(name="Memcpy HtoD (Pinned -> Device)", kind="copy", stream=7, start_us=0.0,
                             end_us=5000.0)
        # no "void", no arguments, cut to 48 characters
        assert iv[1]["name"] == "cutlass::Kernel2<cutlass_80_simt_sgemm_128x12..."
        assert [i["stream"] for i in iv] == [7, 7, 7, 13, 7, 7]
        assert iv[-1]["end_us"] == 24010.0
    assert sg.gpu_intervals({"traceEvents": []}) == []
    assert sg.short_name("void k<float>(float*, int)") == "k<float>"
    assert len(sg.short_name("x" * 100, width=20)) == 20


def test_split_phases_and_timeline_show_the_overlap():
    phases = sg.split_phases(sg.gpu_intervals(TRACE), names=("serial", "overlapped"))
    assert [p["name"] for p in phases] == ["serial", "overlapped"]
    assert [len(p["intervals"]) for p in phases] == [3, 3]
    assert (phases[1]["start_us"], phases[1]["end_us"]) == (19000.0, 24010.0)
    # as many bursts as names, or else numbered
    assert [p["name"] for p in sg.split_phases(sg.gpu_intervals(TRACE), names=("a",))] == ["burst 1", "burst 2"]

    serial = sg.timeline(phases[0]["intervals"])
    assert [ln["label"] for ln in serial["lanes"]] == ["stream 7: copies and kernels"]
    assert serial["span_us"] == 10000.0 and serial["concurrent_us"] == 0.0
    assert serial["lanes"][0]["bars"][0] == (0.0, 5000.0, "Memcpy HtoD (Pinned -> Device)", "copy")

    two = sg.timeline(phases[1]["intervals"])
    assert [ln["label"] for ln in two["lanes"]] == ["stream 7: kernels", "stream 13: copies"]
    assert two["lanes"][0]["bars"][0][0] == 10.0          # from the phase's own start
    assert two["span_us"] == 5010.0
    assert two["concurrent_us"] == 4990.0                 # the copy beside the matmuls
    assert [ln["busy_us"] for ln in two["lanes"]] == [5000.0, 5000.0]
    # intervals that only touch are not concurrent; an empty list has no lanes
    touching = [dict(name="a", kind="kernel", stream=1, start_us=0.0, end_us=5.0),
                dict(name="b", kind="copy", stream=2, start_us=5.0, end_us=9.0)]
    assert sg.timeline(touching)["concurrent_us"] == 0.0
    assert sg.timeline([]) == dict(lanes=[], span_us=0.0, concurrent_us=0.0)


def test_overlap_fraction():
    assert sg.overlap_fraction(5.0, 4.0, 9.0, 5.0) == 1.0   # the shorter one hidden whole
    assert sg.overlap_fraction(5.0, 4.0, 9.0, 9.0) == 0.0   # nothing overlapped
    assert sg.overlap_fraction(5.0, 4.0, 9.0, 7.0) == 0.5


RESULT = {
    "gpu": "NVIDIA H200",
    "streams": dict(copy_ms=5.0, kernel_ms=4.6, serial_ms=9.6, overlapped_ms=5.2, overlap_fraction=0.957,
                    copy_gbps=53.7, pageable=dict(copy_ms=12.0, serial_ms=16.6, overlapped_ms=16.5)),
    "trace": dict(phases=sg.split_phases(sg.gpu_intervals(TRACE), names=sg.PHASES[:2])),
    "graphs": dict(rows=[
        dict(lang="triton", dtype="float32", shape=[64, 1024], eager_us=30.0, graph_us=5.0, host_us=28.0,
             replay_host_us=4.0),
        dict(lang="cuda", dtype="float32", shape=[4096, 4096], eager_us=60.0, graph_us=40.0, host_us=50.0,
             replay_host_us=4.0, loop_eager_us=66.0, loop_graph_us=41.25),
        dict(lang="numba", dtype="float32", shape=[4096, 4096], error="RuntimeError: boom"),
        dict(lang="cuda", dtype="bfloat16", shape=[4096, 4096], eager_us=45.0, graph_us=20.0),
    ]),
    "capture": dict(
        item=dict(captured=False, error="AcceleratorError: CUDA error: operation not permitted when stream is "
                                        "capturing", gpu_usable_after=True, randn_after="RuntimeError: Offset",
                  randn_after_a_good_capture="works"),
        numba_default_stream=dict(captured=True, replay_ran_kernel=False, warnings=[
            "The CUDA Graph is empty. This usually means that the graph was attempted to be captured on wrong ..."]),
        numba_launch=dict(captured=True, replay_ran_kernel=True),
        new_output_each_call=dict(captured=True, kept_changed=True, kept_holds="second"),
        changing_shape=dict(captured=True, new_input_shape=[128, 1024], replay_output_shape=[64, 1024],
                            replay_matches_old_input=True),
    ),
}


def test_summarize_gives_the_lessons_rows():
    s = sg.summarize(RESULT)
    assert [r["run"] for r in s["streams"]] == [
        "copy alone (side stream)", "compute alone (main stream)", "one stream: copy, then compute",
        "two streams: copy beside compute", "pageable: copy alone", "pageable: one stream", "pageable: two streams"]
    assert s["streams"][3]["ms"] == 5.2 and s["overlap_fraction"] == 0.957 and s["copy_gbps"] == 53.7
    # largest shape first, float32 before bfloat16, then by language; speedup = eager / graph
    assert [(r["launcher"], r["dtype"], r["shape"]) for r in s["graphs"]] == [
        ("cuda", "float32", "4096x4096"), ("numba", "float32", "4096x4096"), ("cuda", "bfloat16", "4096x4096"),
        ("triton", "float32", "64x1024")]
    assert s["graphs"][0]["speedup"] == 1.5 and s["graphs"][3]["speedup"] == 6.0
    assert s["graphs"][0]["loop_speedup"] == 1.6 and s["graphs"][3]["loop_speedup"] is None
    assert s["graphs"][1] == dict(launcher="numba", dtype="float32", shape="4096x4096", error="RuntimeError: boom")
    assert s["graphs"][2]["host_us"] is None
    outcomes = {r["case"]: r["outcome"] for r in s["capture"]}
    assert list(outcomes) == list(sg.CAPTURE_CASES)
    assert outcomes["item"].startswith("capture failed: AcceleratorError: CUDA error: operation not permitted")
    assert outcomes["item"].endswith("torch.randn on the GPU raised RuntimeError: Offset (until a capture succeeded)")
    assert "did not run the kernel" in outcomes["numba_default_stream"]
    assert outcomes["numba_default_stream"].endswith("(torch warned: The CUDA Graph is empty)")
    assert "runs the kernel" in outcomes["numba_launch"]
    assert "second input" in outcomes["new_output_each_call"]
    assert "128x1024" in outcomes["changing_shape"] and "still gives 64x1024" in outcomes["changing_shape"]
    assert [r["captured"] for r in s["capture"]] == [False, True, True, True, True]
    # a part that failed on the GPU is one error row; a result without it, no rows
    failed = sg.summarize(dict(streams=dict(error="RuntimeError: no"), capture=dict(error="x")))
    assert failed["streams"] == [dict(error="RuntimeError: no")] and failed["capture"] == [dict(error="x")]
    assert sg.summarize({}) == dict(streams=[], overlap_fraction=None, copy_gbps=None, graphs=[], capture=[])


def test_format_rows_lines_up_the_columns():
    text = sg.format_rows([dict(a="x", b=1.23456), dict(a="longer", c=None)])
    assert text.splitlines() == ["a       b      c", "x       1.235", "longer"]
    assert sg.format_rows([]) == "(none)"


def test_plot_streams_draws_a_lane_per_stream_and_run():
    fig = sg.plot_streams(RESULT)
    ax = fig.axes[0]
    assert len(ax.get_yticklabels()) == 3          # the serial run's stream, the overlapped run's two
    assert len(ax.patches) == 6                    # one bar per interval
    with pytest.raises(ValueError, match="no trace"):
        sg.plot_streams({})
