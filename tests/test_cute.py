"""CuTe's layouts on a laptop (runtime/cute.py, runtime/cute_layouts.py, utils.draw_layout): every
value CuTe computes is checked against one derived by hand from CuTe's documentation (the layout
function, its algebra, local_partition and local_tile, the MMA fragments of PTX's ISA and the
128-byte swizzle), and a refusal's message, the cache and the batching are checked too.

The valid expressions are evaluated in one program (``evaluated``): g++ compiles CuTe's headers
once for all of them, which is most of this file's time; the other programs read them
precompiled (``cute.precompiled_header``, made by the first)."""
import platform
import subprocess
import sys
import time

import matplotlib
import pytest

import utils
from runtime import cute

matplotlib.use("Agg")
from matplotlib.patches import Rectangle


def _missing() -> str | None:
    """Why CuTe cannot run here: no host compiler, or a platform NVIDIA has no wheels for (on
    Linux x86-64 and arm64 the headers must be there, and a test fails loudly without them)."""
    try:
        cute.compiler()
    except utils.CuteUnavailable:
        return "CuTe's layouts are compiled by a host C++ compiler, and there is none"
    if not (sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")):
        try:
            cute.cute_include_dirs()
        except utils.CuteUnavailable:
            return "NVIDIA publishes CuTe's and CCCL's header wheels for Linux only"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))

ROW_MAJOR = "make_layout(make_shape(4, 8), make_stride(8, 1))"
# The docs' examples with static integers: CuTe's complement (and so its products), coalesce and
# right_inverse need static strides beyond rank 1.
BLOCK, BLOCKS = "Layout<Shape<_2,_5>,Stride<_5,_1>>{}", "Layout<Shape<_3,_4>,Stride<_1,_3>>{}"
A_6x2, B_4x3 = "Layout<Shape<_6,_2>,Stride<_8,_2>>{}", "Layout<Shape<_4,_3>,Stride<_3,_1>>{}"


def _batch() -> dict:
    """Every valid expression of the tests below (evaluated at the first use of one)."""
    r = {
        "complement": utils.complement("make_layout(4, 2)", 24),
        "complement2": utils.complement("Layout<Shape<_2,_2>,Stride<_1,_6>>{}", "Int<24>{}"),
        "divide": utils.logical_divide("Layout<_24,_1>{}", "Layout<_4,_2>{}"),
        "zipped": utils.zipped_divide("make_layout(make_shape(8, 8))", (2, 4)),
        "tiled": utils.tiled_divide("make_layout(make_shape(8, 8))", (2, 4)),
        "composition": utils.composition(A_6x2, B_4x3),
        "product": utils.logical_product("Layout<Shape<_2,_2>,Stride<_4,_1>>{}", "Layout<_6,_1>{}"),
        "blocked": utils.blocked_product(BLOCK, BLOCKS),
        "raked": utils.raked_product(BLOCK, BLOCKS),
        "coalesce": utils.coalesce("Layout<Shape<_2,Shape<_1,_6>>,Stride<_1,Stride<_6,_2>>>{}"),
        "inverse": utils.right_inverse("Layout<Shape<_4,_8>,Stride<_8,_1>>{}"),
        "threads": utils.thread_partition("make_layout(make_shape(2, 4))", (4, 8)),
        "tiles": utils.tile_partition((2, 4), (4, 8)),
        "tv": utils.tv_partition("make_layout(make_shape(8, 4), make_stride(4, 1))", (4, 8)),
    }
    r["sm80_a"], r["sm80_c"] = utils.mma_partition("SM80_16x8x16_F32F16F16F32_TN", "AC")
    r["sm90_a"], r["sm90_c"] = utils.mma_partition("SM90_64x64x16_F32BF16BF16_SS", "AC")
    r.update(utils.cute_layouts(row=ROW_MAJOR, nested="make_layout(make_shape(2, make_shape(2, 2)), "
                                                      "make_stride(4, make_stride(2, 1)))",
                                sw128="GMMA::Layout_K_SW128_Atom<half_t>{}", row_again="row"))
    return r


def _counting_programs(monkeypatch) -> list:
    """The programs built from now on (compiled, or found in the cache)."""
    programs, build = [], cute.build

    def counting(source, labels=None):
        programs.append(source)
        return build(source, labels)
    monkeypatch.setattr(cute, "build", counting)
    return programs


@pytest.fixture(scope="module")
def evaluated():
    with pytest.MonkeyPatch.context() as mp:
        programs = _counting_programs(mp)
        r = _batch()
    return dict(r, programs=programs)


# --- the layout function --------------------------------------------------------------
def test_a_layout_is_what_cute_prints(evaluated):
    L = evaluated["row"]
    assert str(L) == "(4,8):(8,1)"
    assert (L.shape, L.stride, L.size, L.cosize, L.rank) == ((4, 8), (8, 1), 32, 32, 2)
    assert L(1, 2) == 10  # 1*8 + 2*1
    assert L(5) == 9      # the 1-D coordinate 5 is (1, 1): the first mode runs fastest
    idx = L.indices()
    assert idx.shape == (4, 8)
    assert all(idx[i, j] == 8 * i + j for i in range(4) for j in range(8))
    assert evaluated["row_again"].text == L.text  # a name refers back to an earlier one
    assert L.expr == ROW_MAJOR


def test_a_nested_mode_takes_its_coordinate_first_mode_fastest(evaluated):
    L = evaluated["nested"]  # (2,(2,2)):(4,(2,1)); column j is (j % 2, j // 2) in the inner modes
    assert (L.shape, L.stride, L.modes) == ((2, (2, 2)), (4, (2, 1)), (2, 4))
    assert all(L(i, j) == 4 * i + 2 * (j % 2) + j // 2 for i in range(2) for j in range(4))
    assert L(1, 3) == 7


def test_print_layout_is_cutes_table(evaluated):
    table = evaluated["row"].table().splitlines()
    assert table[0] == "(4,8):(8,1)"
    row1 = next(line for line in table if line.startswith(" 1  |"))
    assert [int(v) for v in row1.split("|")[1:-1]] == list(range(8, 16))


def test_coordinates_outside_the_layout_are_refused(evaluated):
    L = evaluated["row"]
    with pytest.raises(IndexError, match="outside"):
        L(4, 0)
    with pytest.raises(TypeError, match="one integer per mode"):
        L((1, 0), 2)
    with pytest.raises(ValueError, match="rank-2"):
        evaluated["tiled"].table()


# --- the algebra (CuTe's docs, "CuTe Layout Algebra") -----------------------------------
def test_complement(evaluated):
    c = evaluated["complement"]  # 4:2 covers 0,2,4,6; what is left of 0..23: (2,3):(1,8)
    assert (c.shape, c.stride) == ((2, 3), (1, 8))
    c2 = evaluated["complement2"]  # (2,2):(1,6) covers 0,1,6,7: (3,2):(2,12)
    assert (c2.shape, c2.stride) == ((3, 2), (2, 12))


def test_logical_divide_of_24_by_4_2(evaluated):
    d = evaluated["divide"]  # 24:1 o (4:2, complement(4:2, 24)) = (4,(2,3)):(2,(1,8))
    assert (d.shape, d.stride) == ((4, (2, 3)), (2, (1, 8)))
    assert [d(t, 0) for t in range(4)] == [0, 2, 4, 6]           # the first tile
    assert sorted(d(0, r) for r in range(6)) == [0, 1, 8, 9, 16, 17]  # where each tile starts


def test_zipped_and_tiled_divide(evaluated):
    z = evaluated["zipped"]  # (8,8):(1,8) by (2,4): tiles of 2x4, 4x2 of them
    assert (z.shape, z.stride) == (((2, 4), (4, 2)), ((1, 8), (2, 32)))
    t = evaluated["tiled"]
    assert (t.shape, t.stride, t.rank) == (((2, 4), 4, 2), ((1, 8), 2, 32), 3)


def test_composition(evaluated):
    r = evaluated["composition"]  # A = (6,2):(8,2), B = (4,3):(3,1): R = ((2,2),3):((24,2),8)
    assert (r.shape, r.stride) == (((2, 2), 3), ((24, 2), 8))

    def a(x):
        return (x % 6) * 8 + (x // 6) * 2

    def b(i):
        return (i % 4) * 3 + i // 4
    assert [r(i) for i in range(12)] == [a(b(i)) for i in range(12)]


def test_products(evaluated):
    p = evaluated["product"]  # (2,2):(4,1) times 6:1
    assert (p.shape, p.stride) == (((2, 2), (2, 3)), ((4, 1), (2, 8)))
    bl = evaluated["blocked"]  # (2,5):(5,1) blocks laid out (3,4):(1,3)
    assert (bl.shape, bl.stride) == (((2, 3), (5, 4)), ((5, 10), (1, 30)))
    rk = evaluated["raked"]
    assert (rk.shape, rk.stride) == (((3, 2), (4, 5)), ((10, 5), (30, 1)))
    assert sorted(bl.indices().ravel()) == sorted(rk.indices().ravel()) == list(range(120))  # 12 blocks of 10


def test_coalesce_and_right_inverse(evaluated):
    c = evaluated["coalesce"]  # (2,(1,6)):(1,(6,2)) is 12:1
    assert (c.shape, c.stride) == (12, 1)
    inv = evaluated["inverse"]  # of (4,8):(8,1): index k = 8i + j comes from coordinate i + 4j
    assert [inv(k) for k in range(32)] == [k // 8 + 4 * (k % 8) for k in range(32)]


def test_the_128_byte_swizzle_of_a_gmma_tile(evaluated):
    sw = evaluated["sw128"]  # 8 rows of 64 halves (128 bytes): row r's 16-byte chunks XOR r
    assert sw.text.startswith("Sw<3,4,3>") and sw.stride is None and sw.shape == (8, 64)
    assert all(sw(r, c) == r * 64 + ((c // 8) ^ r) * 8 + c % 8 for r in range(8) for c in range(64))


# --- partitions ------------------------------------------------------------------------
def test_local_partition_gives_each_thread_a_strided_share(evaluated):
    p = evaluated["threads"]  # 2x4 threads (column-major) over a 4x8 tile
    assert (p.tile, p.owners, p.kind, p.shared) == ((4, 8), 8, "thread", False)
    assert all(p.owner[m, n] == m % 2 + 2 * (n % 4) and p.value[m, n] == m // 2 + 2 * (n // 4)
               for m in range(4) for n in range(8))
    assert p.coords[0] == [(0, 0), (2, 0), (0, 4), (2, 4)]


def test_local_tile_gives_each_block_a_contiguous_tile(evaluated):
    p = evaluated["tiles"]  # 2x4 tiles of a 4x8 tile, numbered down the rest mode first
    assert (p.owners, p.kind) == (4, "tile")
    assert all(p.owner[m, n] == m // 2 + 2 * (n // 4) and p.value[m, n] == m % 2 + 2 * (n % 4)
               for m in range(4) for n in range(8))


def test_a_hand_written_tv_layout(evaluated):
    p = evaluated["tv"]  # (8,4):(4,1) over 4x8: thread t's value v is index 4t + v, so (v, t)
    assert all(p.owner[m, n] == n and p.value[m, n] == m for m in range(4) for n in range(8))


def test_sm80_mma_fragments_are_ptxs(evaluated):
    # PTX ISA, mma.m16n8k16 with .f16: lane = 4 * groupID + threadID_in_group; A's a0..a7 are
    # (groupID + 8*(i//2 % 2), 2*threadID_in_group + i%2 + 8*(i//4)); C's c0..c3 (groupID + 8*(i//2), ...)
    a, c = evaluated["sm80_a"], evaluated["sm80_c"]
    assert (a.tile, a.owners, c.tile, c.owners) == ((16, 16), 32, (16, 8), 32)
    assert all(a.owner[m, k] == 4 * (m % 8) + (k % 8) // 2 and a.value[m, k] == k % 2 + 2 * (m // 8) + 4 * (k // 8)
               for m in range(16) for k in range(16))
    assert all(c.owner[m, n] == 4 * (m % 8) + n // 2 and c.value[m, n] == n % 2 + 2 * (m // 8)
               for m in range(16) for n in range(8))
    assert not a.shared and not c.shared


def test_sm90_warpgroup_mma_compiles_on_the_host(evaluated):
    # PTX ISA, wgmma m64nNk16's accumulator: warp w holds rows 16w..16w+15, laid out as mma.m16n8's C
    c = evaluated["sm90_c"]
    assert (c.tile, c.owners, len(c.coords[0])) == ((64, 64), 128, 32)
    assert all(c.owner[m, n] == 32 * (m // 16) + 4 * (m % 8) + (n % 8) // 2
               and c.value[m, n] == n % 2 + 2 * ((m % 16) // 8) + 4 * (n // 8)
               for m in range(64) for n in range(64))
    a = evaluated["sm90_a"]  # SS: A is read from shared memory, every thread maps to all of it
    assert a.shared and a.tile == (64, 16) and a.owners == 128 and len(a.coords[5]) == 64 * 16


# --- one program, the cache, refusals ----------------------------------------------------
def test_everything_above_came_from_one_program(evaluated):
    assert len(evaluated["programs"]) == 1
    assert all(r._data is not None for k, r in evaluated.items() if k != "programs")


def _compiles(monkeypatch):
    """The programs g++ compiles from now on (not the precompiled headers it makes)."""
    runs = []
    real = subprocess.run

    def spy(cmd, *args, **kwargs):
        if cmd and cmd[0] == cute.compiler() and "c++-header" not in cmd:
            runs.append(cmd)
        return real(cmd, *args, **kwargs)
    monkeypatch.setattr(cute.subprocess, "run", spy)
    return runs


def test_a_refusal_names_the_expression_and_gives_gccs_first_error(monkeypatch):
    pending = utils.complement("make_layout(4, 2)", 24)  # not used yet: it joins the next program
    runs = _compiles(monkeypatch)
    with pytest.raises(utils.CuteError) as e:
        utils.cute_layout("make_layout(make_shape(4, 8), make_strid(8, 1))")
    msg = str(e.value)
    assert msg.startswith("CuTe could not compile the expression: `make_layout(make_shape(4, 8), make_strid(8, 1))`")
    assert "‘make_strid’ was not declared" in msg or "'make_strid' was not declared" in msg
    assert "| make_layout(make_shape(4, 8), make_strid(8, 1))" in msg  # g++'s quote of the line
    assert len(msg.splitlines()) < 10
    assert len(runs) <= 1  # none when this refusal is in the cache already
    if runs and "Free Software Foundation" in cute._toolchain.compiler_version(cute.compiler()):
        assert "-include" in runs[0]  # CuTe's headers came precompiled, and the message is as without them
    # the pending result was not to blame: it waits, and is evaluated when used
    assert pending._error is None and pending._data is None
    assert (pending.shape, pending.stride) == ((2, 3), (1, 8))


def test_an_error_inside_cute_points_at_the_learners_expression_not_the_backtrace():
    with pytest.raises(utils.CuteError) as e:  # dynamic strides: CuTe's complement refuses them at rank 2
        str(utils.logical_product("make_layout(make_shape(2, 2), make_stride(4, 1))", "make_layout(6, 1)"))
    msg = str(e.value)
    assert msg.startswith("CuTe could not compile logical_product: `logical_product(")
    assert "Dynamic-stride complement only for rank-1 layouts" in msg
    assert "required from the expression, line 1, column" in msg
    assert "In instantiation of" not in msg and "required from ‘" not in msg and len(msg.splitlines()) < 12
    assert len(e.value.log.splitlines()) > 3 * len(msg.splitlines())  # what was left out


def test_the_same_cell_again_compiles_nothing(evaluated, monkeypatch):
    runs, programs = _compiles(monkeypatch), _counting_programs(monkeypatch)
    start = time.perf_counter()
    again = _batch()
    took = time.perf_counter() - start
    assert runs == [] and len(programs) == 1 and took < 5  # the binary ran again; parsing its output is most of it
    assert programs == evaluated["programs"]
    assert all(str(again[k]) == str(evaluated[k]) and again[k] is not evaluated[k] for k in again)
    binary = cute.binary_path(programs[0])
    assert binary.is_file() and binary.parent == cute.cache_dir()


def test_cute_run_runs_statements():
    out = utils.cute_run("print(complement(make_layout(4, 2), 24)); print(\"\\n\");")
    assert out.strip() == "(2,3):(_1,8)"


def test_bad_arguments_are_refused_before_compiling():
    with pytest.raises(TypeError, match="string of C"):
        utils.cute_layout(42)
    with pytest.raises(ValueError, match="operand"):
        utils.mma_partition("SM80_16x8x16_F32F16F16F32_TN", "D")
    with pytest.raises(TypeError, match="not both"):
        utils.cute_layouts("Layout<_4>{}", A="Layout<_4>{}")


# --- the pictures ----------------------------------------------------------------------
def _cells(fig):
    return {(int(p.get_y()), int(p.get_x())): p.get_gid() for p in fig.axes[0].patches if isinstance(p, Rectangle)}


def test_draw_layout_labels_every_cell_with_its_index(evaluated):
    cells = _cells(utils.draw_layout(evaluated["row"]))
    assert len(cells) == 32 and all(cells[i, j] == f"index {8 * i + j}" for i in range(4) for j in range(8))
    sw = _cells(utils.draw_layout(evaluated["sw128"], color=lambda i: i // 8 % 8, show_ids=False))
    assert sw[1, 0] == "index 72"  # row 1's first chunk is its second: 64 + 8


def test_draw_layout_colours_a_partition_by_thread(evaluated):
    fig = utils.draw_layout(evaluated["sm80_a"])
    cells = _cells(fig)
    assert len(cells) == 256 and cells[8, 0] == "T0 V2" and cells[0, 2] == "T1 V0"
    shared = utils.draw_layout(evaluated["sm90_a"], show_ids=False)
    assert "share" in shared.axes[0].get_title()


def test_draw_layout_refuses_what_it_cannot_draw(evaluated):
    with pytest.raises(ValueError, match="rank 3"):
        utils.draw_layout(evaluated["tiled"])
    with pytest.raises(TypeError, match="Layout or a Partition"):
        utils.draw_layout("(4,8):(8,1)")
