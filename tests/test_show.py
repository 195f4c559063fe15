"""utils.show: a kernel of any language, its source and (CUDA C++ anywhere, the others on a GPU)
its PTX and SASS."""
import pytest

import kernels.numba.relu as numba_relu  # kernels imports utils first: simulation is set up before numba
import kernels.triton.relu as triton_relu
import runtime.config
import utils

RELU_CU = utils.KERNELS_DIR / "cuda" / "relu.cu"


@pytest.fixture(scope="module")
def relu_cuda():
    return utils.cuda_kernel(RELU_CU, "relu_kernel")


def test_source_of_each_language(relu_cuda, capsys):
    utils.show(numba_relu.relu_kernel)
    utils.show(triton_relu.relu_kernel)
    utils.show(relu_cuda)
    out = capsys.readouterr().out
    assert out.count("def relu_kernel(") == 2                 # Numba's and Triton's Python source
    assert "cuda.grid" in out and "tl.program_id" in out
    cuda = utils.kernel_text(relu_cuda)
    assert cuda.lstrip().startswith("//")                    # the comment above the kernel comes with it
    assert "__global__ void relu_kernel(" in cuda and cuda.rstrip().endswith("}")
    assert "relu_vec4_kernel" not in cuda                    # one kernel, not the whole file
    assert utils.kernel_text(RELU_CU, name="relu_kernel") == cuda


def test_cuda_ptx_and_sass_of_one_kernel(relu_cuda):
    ptx = utils.kernel_text(relu_cuda, "ptx")
    assert ptx.startswith(".entry") and ptx.count(".entry") == 1 and "relu_kernel" in ptx
    assert "ld.global" in ptx and "max.f32" in ptx
    sass = utils.kernel_text(relu_cuda, "SASS")
    assert "FMNMX" in sass and "EXIT" in sass


def test_python_functions_and_classes():
    text = utils.kernel_text(utils.bench)
    assert text.startswith("def bench(")
    assert utils.kernel_text(utils.BenchResult).startswith("@dataclass")


def test_clear_errors(relu_cuda):
    with pytest.raises(TypeError, match="name the kernel"):
        utils.show(RELU_CU)
    with pytest.raises(KeyError, match="no_such_kernel"):
        utils.show(RELU_CU, name="no_such_kernel")
    with pytest.raises(ValueError, match="what must be one of"):
        utils.show(relu_cuda, "assembly")
    with pytest.raises(ValueError, match="not 'ttir'"):
        utils.show(relu_cuda, "ttir")
    with pytest.raises(TypeError, match="Python function.*pass the kernel it launches"):
        utils.show(utils.bench, "ptx")


@pytest.mark.skipif(not utils.SIMULATE, reason="in simulation only")
def test_numba_and_triton_ptx_need_a_gpu():
    for k in (numba_relu.relu_kernel, triton_relu.relu_kernel):
        with pytest.raises(RuntimeError, match="compiles nothing.*on a GPU"):
            utils.show(k, "ptx")


class _Compiled:
    def __init__(self, ptx):
        self.asm = {"ptx": ptx, "ttir": "module {}"}


def test_what_a_gpu_shows_of_triton_and_numba(monkeypatch):
    """On a GPU: the variants Triton and Numba compiled at their launches (stand-ins here)."""
    monkeypatch.setattr(runtime.config, "SIMULATE", False)

    class JITFunction:
        __module__ = "triton.runtime.jit"
        device_caches = {0: ({"k1": _Compiled("// first"), "k2": _Compiled("// latest")}, None, None, None, None)}

    assert utils.kernel_text(JITFunction(), "ptx") == "// latest"
    assert utils.kernel_text(JITFunction(), "ttir") == "module {}"
    JITFunction.device_caches = {}
    with pytest.raises(RuntimeError, match="launch it once"):
        utils.kernel_text(JITFunction(), "ptx")

    class CUDADispatcher:
        __module__ = "numba.cuda.dispatcher"

        def inspect_asm(self):
            return {"(float32[::1],)": ".entry relu"}

    assert utils.kernel_text(CUDADispatcher(), "ptx") == "// signature (float32[::1],)\n.entry relu"


# --- recorded results as one-line tables (utils.show_results, show_targets, compare_runs) ---
def _row(variant, shape, ms, **kw):
    return {"topic": "attention", "variant": variant, "lang": variant.split()[0], "shape": shape,
            "median_ms": ms, "p20_ms": ms * 0.9, "p80_ms": ms * 1.5, "gbps": 1000 / ms, **kw}


@pytest.fixture
def results(tmp_path):
    import json
    rows = [_row(f"{v} [float16, {'causal' if c else 'full'}, forward]", [1, 2, 64, 16], ms,
                 dtype="float16", causal=c, tflops=tf, reference=v == "triton v3")
            for v, c, ms, tf in (("triton v3", False, 1.0, 400.0), ("triton v3", True, 0.6, 350.0),
                                 ("SDPA flash", False, 1.5, 300.0), ("cuda v3", False, 3.0, 117.0))]
    rows.append(_row("triton v3 [float16, full, forward]", [1, 2, 128, 16], 2.0, dtype="float16",
                     causal=False, tflops=410.0, sweep=True))
    targets = [{"topic": "attention", "variant": "cuda v3 [float16, full, forward]", "shape": [1, 2, 64, 16],
                "goal": ">= 50% of SDPA flash", "value": 0.39, "unit": "ratio_to_torch", "met": False,
                "dtype": "float16", "causal": False, "pass": "forward", "why": "no cp.async " * 20},
               {"topic": "attention", "variant": "triton v3 [float16, full, forward]", "shape": [1, 2, 64, 16],
                "goal": ">= SDPA flash", "value": 1.3, "unit": "ratio_to_torch", "met": True,
                "dtype": "float16", "causal": False, "pass": "forward"},
               {"topic": "attention", "variant": "numba v3", "shape": [1, 2, 64, 16], "goal": ">= 1%",
                "value": None, "unit": "ratio_to_torch", "met": None}]
    p = tmp_path / "h100.json"
    p.write_text(json.dumps({"machine": {"gpu": "H100"}, "date": "2026-01-01", "commit": "ab" * 20,
                             "rows": rows, "targets": targets}))
    return p


def _columns_line_up(lines):
    """Every line of a table has its column gaps where the header's separator line has them."""
    sep = next(i for i, ln in enumerate(lines) if set(ln) <= {"-", " "} and "-" in ln)
    bar = lines[sep]
    ends = [i for i, ch in enumerate(bar) if ch == "-" and (i + 1 == len(bar) or bar[i + 1] == " ")]
    for ln in lines[sep - 1:sep + 1] + [ln for ln in lines[sep + 1:] if not ln.startswith(" ")]:
        for e in ends[:-1]:
            assert ln[e + 1:e + 3] == "  ", (ln, e)


def test_show_results_one_line_per_kernel_one_column_per_configuration(results, capsys):
    utils.show_results("attention", path=results)
    lines = capsys.readouterr().out.splitlines()
    assert "TFLOP/s" in lines[0] and "commit abababababab" in lines[0]
    assert lines[1].split() == ["kernel", "full", "causal"]    # dtype and shape are the same everywhere
    body = [ln.split() for ln in lines[3:6]]
    assert body[0] == ["triton", "v3", "*", "400", "350"]     # best first, reference starred
    assert body[-1] == ["cuda", "v3", "117", "-"]             # not measured: a dash
    _columns_line_up(lines[1:6])
    utils.show_results("attention", path=results, causal=True, metric="ms")
    out = capsys.readouterr().out
    assert "causal True" in out and "0.600" in out and "cuda" not in out
    utils.show_results("attention", path=results, causal=(True, None))      # a choice of values
    assert "cuda" not in capsys.readouterr().out
    utils.show_results("attention", path=results, sweep=True)
    assert "410" in capsys.readouterr().out
    with pytest.raises(ValueError, match="metric"):
        utils.show_results("attention", path=results, metric="flops")


def test_show_targets_lines_up_and_says_why_a_target_was_missed(results, capsys):
    missed = utils.show_targets("attention", path=results)
    title, *lines = capsys.readouterr().out.splitlines()
    assert title == "attention targets, recorded on H100, 2026-01-01, commit abababababab"  # the record's GPU
    assert [t["variant"] for t in missed] == ["cuda v3 [float16, full, forward]"]
    assert lines[2].rstrip().endswith("MISSED") and "0.39x" in lines[2]
    assert lines[3].startswith("    why: no cp.async") and all(len(ln) <= 100 for ln in lines[3:6])
    assert any(ln.rstrip().endswith("not measured") for ln in lines)
    assert lines[-1] == "1 of 3 targets met, 1 missed"
    import json
    data = json.loads(results.read_text())
    data["targets"].append({**data["targets"][0], "shape": [1, 2, 128, 16]})   # the same reason again
    results.write_text(json.dumps(data))
    utils.show_targets("attention", path=results)
    out = capsys.readouterr().out
    assert out.count("why: no cp.async") == 1 and "why: as above" in out
    _columns_line_up([ln for ln in lines[:-1] if not ln.startswith("    ")])


def test_compare_runs_puts_two_files_side_by_side(results, tmp_path, capsys):
    import json
    other = tmp_path / "bench.json"     # a topic's own benchmark file: forward/backward lists
    other.write_text(json.dumps({"gpu": "H100", "date": "2026-01-02", "commit": {"commit": "cd" * 20},
                                 "forward": [{"version": "triton v3", "dtype": "float16", "shape": [1, 2, 64, 16],
                                              "ms": 0.25, "ms_p20": 0.2, "ms_p80": 0.3, "gbps": 4000.0}]}))
    rows = utils.compare_runs("attention", [results, other], shape=(1, 2, 64, 16), variants=["triton v3"],
                              causal=False)
    out = capsys.readouterr().out
    assert [r["file"] for r in rows] == ["h100.json", "bench.json"]
    assert "commit abababababab" in out and "commit cdcdcdcdcdcd" in out
    assert "900.0..1,500.0" in out and "200.0..300.0" in out    # p20..p80 in microseconds


def test_no_notebook_writes_its_own_show():
    """One way to show a kernel: lessons call utils.show instead of defining a helper of their own."""
    import json
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    own = [f"{p.relative_to(root)} cell {i}" for p in sorted(root.glob("notebooks/*.ipynb"))
           for i, c in enumerate(json.loads(p.read_text())["cells"])
           if c["cell_type"] == "code" and re.search(r"^def show\(", "".join(c["source"]), re.M)]
    assert not own, f"use utils.show(kernel) instead of a notebook's own show(): {own}"
