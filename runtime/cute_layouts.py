"""CuTe's layouts on a laptop (lesson 12): layout expressions written in C++, evaluated by CuTe.

    L = utils.cute_layout("make_layout(make_shape(4, 8), make_stride(8, 1))")
    str(L), L.shape, L.stride, L.size, L.cosize    # '(4,8):(8,1)', (4, 8), (8, 1), 32, 32
    L(1, 2), L.indices(), print(L.table())         # 10, the 4x8 array of every index, print_layout
    A, D = utils.cute_layouts("Layout<_24,_1>{}", "logical_divide(Layout<_24,_1>{}, Layout<_4,_2>{})")
    ls = utils.cute_layouts(A="Layout<_24,_1>{}", D="logical_divide(A, Layout<_4,_2>{})")  # names refer back
    utils.logical_divide(A, "Layout<_4,_2>{}")     # the algebra from Python: composition, complement, ...
    utils.thread_partition("make_layout(make_shape(4, 8))", (8, 16))   # which thread gets which element
    utils.mma_partition("SM80_16x8x16_F32F16F16F32_TN", "A")           # a TiledMMA's threads and values
    utils.draw_layout(ls["D"])                                         # the picture (utils/plots.py)

Each call writes a host program around the expressions (``runtime/cute.py`` compiles it with g++
against CuTe's headers and runs it): every shape, stride, size, index and owner here is what CuTe
printed; Python only reads it.

One program, one compile: ``cute_layouts`` evaluates all its expressions in one program, and the
algebra and partition functions return results that are evaluated when first used, together
with every other result not evaluated yet. A notebook cell that builds several and then prints
or draws them compiles once, and the same cell run again finds the binary in the cache.

SM90's warpgroup MMA atoms (``SM90_64x64x16_F32BF16BF16_SS``) compile host-side too: a TiledMMA's
thread-value layouts are plain CuTe layouts; only the instructions they stand for need a Hopper GPU.
"""
from __future__ import annotations

import functools
import re
import signal
import weakref

from . import cute
from .cute import CuteError

__all__ = ["Layout", "Partition", "cute_layout", "cute_layouts",
           "composition", "complement", "coalesce", "right_inverse", "logical_divide", "zipped_divide",
           "tiled_divide", "logical_product", "blocked_product", "raked_product",
           "thread_partition", "tile_partition", "mma_partition", "tv_partition"]

#: The file name g++ gives the program's own lines (the learner's have labels of their own).
PROGRAM = "cute_program.cpp"
#: The most indices one layout prints (a 1024x1024 layout): more is a layout too large to look at.
MAX_VALUES = 1 << 20


# ---------------------------------------------------------------------------------------
# Reading what CuTe printed
# ---------------------------------------------------------------------------------------
_TOKEN = re.compile(r"\s*(\(|\)|,|[^(),\s]+)")


@functools.lru_cache(maxsize=1 << 16)  # a partition prints each coordinate many times
def parse(text: str):
    """CuTe's print of an integer tuple as Python: ``(_4,(2,_3))`` -> ``(4, (2, 3))``; a static
    integer (``_4``) is its value; a word that is no integer stays a string."""
    tokens = _TOKEN.findall(text)
    pos = 0

    def item():
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            out = [item()]
            while tokens[pos] == ",":
                pos += 1
                out.append(item())
            pos += 1  # ")"
            return tuple(out)
        word = tok[1:] if tok.startswith("_") else tok
        try:
            return int(word)
        except ValueError:
            return tok
    value = item()
    if pos != len(tokens):
        raise ValueError(f"cannot read CuTe's output {text!r}")
    return value


def _flat(x) -> tuple:
    return tuple(v for e in x for v in _flat(e)) if isinstance(x, tuple) else (x,)


# ---------------------------------------------------------------------------------------
# Results, evaluated when first used
# ---------------------------------------------------------------------------------------
_PENDING: list = []  # weak references to the results not evaluated yet, oldest first


class _Result:
    """Something CuTe evaluates: its C++ (``expr``) now, its values on first use."""

    tier = "layout"

    def __init__(self, expr: str, what: str):
        self.expr, self._what = expr, what
        self._data = None
        self._error = None
        _PENDING.append(weakref.ref(self))

    def _get(self) -> dict:
        if self._data is None and self._error is None:
            _evaluate([self])
        if self._error is not None:
            raise self._error
        return self._data

    def _statements(self, prog: "_Program", k: int) -> None:
        raise NotImplementedError


class Layout(_Result):
    """A CuTe layout, as CuTe evaluated it.

    ``str(L)`` is CuTe's ``print(L)``, ``(4,8):(8,1)`` (static integers print as ``_4``);
    ``shape`` and ``stride`` are its nested tuples, as CuTe prints them (an integer for a rank-1
    shape; ``stride`` is None for a swizzled layout, which has none); ``size``, ``cosize``;
    ``L(i, j)`` the index at a coordinate (one integer per mode, or one integer: CuTe's 1-D
    coordinate); ``L.indices()`` all of them; ``L.table()`` CuTe's ``print_layout`` of a rank-2
    layout; ``expr`` the C++ expression it came from. A swizzle made for a shared-memory
    pointer (GMMA's ``Layout_K_SW128_Atom<T>``) is evaluated as ``print_layout`` shows it: at
    offset 0, in elements."""

    def __init__(self, expr, what: str | None = None):
        super().__init__(_expression(expr), what or "the expression")
        self.tier = cute.tier_of(self.expr)

    def _statements(self, prog, k, name=None):
        var = prog.value(self.expr, self._what, name)
        prog.line(f"course_cute::layout({k}, {var});")

    @property
    def text(self) -> str:
        return self._get()["text"]

    @property
    def shape(self):
        return self._get()["shape"]

    @property
    def stride(self):
        return self._get()["stride"]

    @property
    def size(self) -> int:
        return self._get()["size"]

    @property
    def cosize(self) -> int:
        return self._get()["cosize"]

    @property
    def modes(self) -> tuple:
        """The size of each top-level mode (CuTe's ``product_each(shape(L))``)."""
        m = self._get()["modes"]
        return m if isinstance(m, tuple) else (m,)

    @property
    def rank(self) -> int:
        """The number of top-level modes (1 for an integer shape)."""
        return len(self.modes)

    def indices(self):
        """The index at every coordinate, as a numpy array with one axis per mode (``[i, j]`` is
        ``L(i, j)``): CuTe's ``L(0) ... L(size-1)``, in CuTe's order (the first mode fastest)."""
        import numpy as np
        vals = self._get()["values"]
        if vals is None:
            raise ValueError(f"{self.text} has {self.size} indices, more than the {MAX_VALUES} a layout prints")
        if all(isinstance(v, int) for v in vals):
            return np.array(vals, dtype=np.int64).reshape(self.modes, order="F")
        out = np.empty(len(vals), dtype=object)  # a layout onto coordinates (strides such as _1@0)
        out[:] = vals
        return out.reshape(self.modes, order="F")

    def __call__(self, *coord):
        if not coord or not all(isinstance(c, int) for c in coord):
            raise TypeError(f"{self.text}: give one integer per mode ({self.rank}) or one integer (the 1-D "
                            f"coordinate), got {coord!r}")
        if len(coord) == 1:
            (i,) = coord
            if not 0 <= i < self.size:
                raise IndexError(f"{self.text}: the 1-D coordinate {i} is outside 0..{self.size - 1}")
            return self.indices().reshape(-1, order="F")[i].item()
        if len(coord) != self.rank:
            raise TypeError(f"{self.text} has {self.rank} modes, and {len(coord)} coordinates were given")
        if not all(0 <= c < m for c, m in zip(coord, self.modes)):
            raise IndexError(f"{self.text}: coordinate {coord} is outside the modes' sizes {self.modes}")
        return self.indices()[coord].item()

    def table(self) -> str:
        """CuTe's ``print_layout``: the rank-2 layout as a table of its indices."""
        t = self._get()["table"]
        if t is None:
            raise ValueError(f"print_layout draws rank-2 layouts, and {self.text} has rank {self.rank}")
        return t

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"Layout({self.text})"


class Partition(_Result):
    """Who owns each element of a tile: a thread (a copy's ``local_partition``, an MMA's
    thread-value layout) or a tile (``local_tile``), and which of its values it is.

    ``tile`` is the tile's shape; ``owner`` and ``value`` numpy arrays of that shape (each
    element's owner and its index among the owner's values; -1 where nobody owns it; where several
    own it, the first, as CuTe's ``print_latex`` draws it, and ``shared`` is True);
    ``coords[t]`` owner ``t``'s coordinates in value order; ``kind`` ``"thread"`` or ``"tile"``;
    ``text`` what CuTe printed of the partition (its TV layout, the thread layout or the tile)."""

    def __init__(self, expr: str, what: str, kind: str, build, tier: str):
        super().__init__(expr, what)
        self.kind, self._build, self.tier = kind, build, tier

    def _statements(self, prog, k, name=None):
        self._build(prog, k)

    @property
    def text(self) -> str:
        return self._get()["text"]

    @property
    def tile(self) -> tuple:
        return self._get()["tile"]

    @property
    def coords(self) -> list:
        return self._get()["coords"]

    @property
    def owners(self) -> int:
        return len(self.coords)

    @property
    def owner(self):
        return self._get()["owner"]

    @property
    def value(self):
        return self._get()["value"]

    @property
    def shared(self) -> bool:
        return self._get()["shared"]

    def __str__(self):
        per = {len(c) for c in self.coords}
        values = f"{min(per)} values each" if len(per) == 1 else "values"
        return f"{self.owners} {self.kind}s x {values} over a {'x'.join(map(str, self.tile))} tile: {self.text}"

    def __repr__(self):
        return f"Partition({self})"


# ---------------------------------------------------------------------------------------
# The program
# ---------------------------------------------------------------------------------------
_HELPERS = r"""
namespace course_cute {
using namespace cute;

template <class T> void line(char const* key, T const& x) { printf("%s ", key); print(x); printf("\n"); }

// A swizzle made for a shared-memory pointer (GMMA's Layout_K_SW128_Atom) as print_layout shows
// it: at offset 0, in elements.
template <class L> auto plain(L const& layout) { return layout; }
template <class S, int B, class L>
auto plain(ComposedLayout<S, smem_ptr_flag_bits<B>, L> const& layout) {
  return as_position_independent_swizzle_layout(layout);
}

template <class L0> void layout(int k, L0 const& given) {
  static_assert(is_layout<L0>::value, "this expression is not a CuTe layout "
                                      "(a shape? make_layout(shape) is its layout)");
  auto L = plain(given);
  printf("@@layout %d\n", k);
  line("text", given);
  line("shape", shape(L));
  if constexpr (!is_composed_layout<decltype(L)>::value) line("stride", stride(L));
  line("size", size(L));
  line("cosize", cosize(L));
  line("modes", product_each(shape(L)));
  long n = size(L);
  if (n <= %MAX%) {
    printf("values");
    for (long i = 0; i < n; ++i) { printf(" "); print(L(i)); }
    printf("\n");
  }
  if constexpr (decltype(rank(L))::value == 2) { printf("@@table\n"); print_layout(L); }
  printf("@@end\n");
}

// Owner t's elements of a tile, for every t: part(t) is a tensor of coordinates.
template <class Text, class Tile, class Part>
void partition(int k, char const* kind, Text const& text, Tile const& tile, int owners, Part const& part) {
  printf("@@partition %d %s\n", k, kind);
  line("text", text);
  line("tile", tile);
  for (int t = 0; t < owners; ++t) {
    auto p = part(t);
    printf("owner");
    for (int v = 0; v < size(p); ++v) { printf(" "); print(p(v)); }
    printf("\n");
  }
  printf("@@end\n");
}

// A tile given as a shape or as a layout: the size of each of its modes.
template <class T> auto shape_of(T const& x) {
  if constexpr (is_layout<T>::value) return product_each(shape(x)); else return product_each(x);
}
}  // namespace course_cute
"""


class _Program:
    """One host program: the learner's expressions, each under a ``#line`` label of its own
    (g++'s messages then point into the expression, and name it), and what prints the results."""

    def __init__(self, tier: str):
        self.lines = [f'#line 2 "{PROGRAM}"', *cute.includes(tier).splitlines(), "using namespace cute;",
                      *_HELPERS.replace("%MAX%", str(MAX_VALUES)).splitlines(), "int main() {"]
        self.labels: dict[str, tuple[str, str]] = {}  # label -> (what it is, the learner's text)
        self.starts: list[int] = []  # the first line of each item's statements

    def line(self, text: str) -> None:
        self.lines.append("  " + text)

    def value(self, expr: str, what: str, name: str | None = None) -> str:
        """``auto <name> = <expr>;`` in main, the expression under a label of its own; the name."""
        n = len(self.labels) + 1
        var = name or f"course_v{n}"
        label = f"course_expr{n}"
        self.labels[label] = (what, expr)
        self.lines += [f"  auto {var} =", f'#line 1 "{label}"', *expr.splitlines()]
        self.lines += [f'#line {len(self.lines) + 2} "{PROGRAM}"', "  ;"]
        return var

    def begin(self, k: int) -> None:
        self.starts.append(len(self.lines) + 1)
        self.line(f'printf("@@begin {k}\\n"); fflush(stdout);')

    def item_at(self, line: int) -> int | None:
        """The item whose statements hold this line of the program."""
        k = None
        for i, start in enumerate(self.starts):
            if start <= line:
                k = i
        return k

    def source(self) -> str:
        return "\n".join(self.lines + ["}", ""])


def _expression(expr) -> str:
    if isinstance(expr, _Result):
        return expr.expr
    if not isinstance(expr, str) or not expr.strip():
        raise TypeError("a CuTe expression is a string of C++ (such as \"make_layout(make_shape(4, 8))\"), "
                        f"got {expr!r}")
    return expr.strip().rstrip(";").strip()


def _evaluate(results: list, names: dict | None = None) -> None:
    """Evaluate ``results`` and every result still pending, in one program.

    Where g++ refuses one of ``results``, it keeps the error (``names``: all of them, as their
    expressions refer to each other) and the others stay pending, evaluated when next used; where
    it refuses another pending result, that one keeps its error, raised where it is used, and the
    rest are compiled again without it."""
    names = names or {}
    batch = list(results)
    for ref in _PENDING:
        r = ref()
        if r is not None and r._data is None and r._error is None and all(r is not b for b in batch):
            batch.append(r)
    _PENDING[:] = []
    while batch:
        prog = _Program(max((r.tier for r in batch), key=cute.TIERS.index))
        owner = {}  # label -> the result whose expression it is
        for k, r in enumerate(batch):
            before = set(prog.labels)
            prog.begin(k)
            r._statements(prog, k, names.get(id(r)))
            owner.update({lab: r for lab in set(prog.labels) - before})
        try:
            out = _run(prog)
        except CuteError as e:
            culprit = owner.get(getattr(e, "label", None))
            k = getattr(e, "item", None)
            if k is None:  # an error in the program's own lines: the item they print
                at = [prog.item_at(n) for f, n in reversed(getattr(e, "places", [])) if f == PROGRAM]
                k = next((i for i in at if i is not None), None)
            culprit = culprit if culprit is not None else (batch[k] if k is not None else None)
            if culprit is not None and getattr(e, "label", None) is None:
                e = _naming(e, culprit)
            asked = culprit is None or any(culprit is r for r in results)
            failed = (results if names or culprit is None else [culprit]) if asked else [culprit]
            for r in failed:
                r._error = e
            rest = [r for r in batch if all(r is not f for f in failed)]
            if asked:  # what was asked for failed: the others wait for their own use
                _PENDING[:0] = [weakref.ref(r) for r in rest]
                return
            batch = rest
            continue
        for k, r in enumerate(batch):
            if k in out:
                r._data = out[k]
            else:
                r._error = CuteError(f"CuTe printed nothing for {r._what}: `{r.expr}`")
        return


def _naming(err: CuteError, culprit: _Result) -> CuteError:
    """An error of the program's own lines, or of its run, told as the error of the expression
    they evaluate."""
    head, _, body = str(err).partition("\n")
    if getattr(err, "item", None) is not None:  # the program failed while evaluating it
        named = CuteError(f"CuTe's evaluation of {culprit._what} failed: `{culprit.expr}`\n{head}"
                          + (f"\n{body}" if body else ""))
    else:
        body = re.sub(rf"^{re.escape(PROGRAM)}:\d+:\d+: ", "", body, flags=re.M)
        named = CuteError(f"CuTe could not compile {culprit._what}: `{culprit.expr}`\n{body}")
    named.__dict__.update(err.__dict__)
    return named


def _run(prog: _Program) -> dict:
    """Compile (or find) the program, run it, and read what it printed."""
    proc = cute.run(prog.source(), prog.labels)
    if proc.returncode != 0:
        begun = re.findall(r"^@@begin (\d+)$", proc.stdout, re.M)
        rc = proc.returncode
        signals = {s.value: s.name for s in signal.Signals}
        how = f"was killed by {signals[-rc]}" if -rc in signals else f"stopped with exit status {rc}"
        err = CuteError(f"the program {how}"
                        + (":\n" + proc.stderr.strip()[-2000:] if proc.stderr.strip() else ""))
        err.item = int(begun[-1]) if begun else None
        raise err
    return _read(proc.stdout)


def _read(stdout: str) -> dict:
    """Each item's fields, by its number, from the program's output."""
    out, cur, table = {}, None, None
    for line in stdout.splitlines():
        if line.startswith("@@layout "):
            cur = {"stride": None, "values": None, "table": None}
            out[int(line.split()[1])] = cur
        elif line.startswith("@@partition "):
            cur = {"coords": []}
            out[int(line.split()[1])] = cur
        elif line == "@@table":
            table = []
        elif line == "@@end":
            if table is not None:
                cur["table"] = "\n".join(table)
            if "coords" in cur:
                _owners(cur)
            cur, table = None, None
        elif table is not None:
            table.append(line)
        elif cur is not None:
            key, _, rest = line.partition(" ")
            if key == "text":
                cur["text"] = rest
            elif key == "values":
                cur["values"] = [parse(v) for v in rest.split()]
            elif key == "owner":
                cur["coords"].append([c if isinstance(c, tuple) else (c,) for c in map(parse, rest.split())])
            else:
                cur[key] = parse(rest)
    return out


def _owners(d: dict) -> None:
    """The owner and value arrays of a partition from its owners' coordinates (an element's
    owner is the first owner, in order, that holds it; its value, its index among that one's)."""
    import numpy as np
    tile = d["tile"] if isinstance(d["tile"], tuple) else (d["tile"],)
    owner = np.full(tile, -1, dtype=np.int64)
    value = np.full(tile, -1, dtype=np.int64)
    flat = [_flat_coord(c) for cs in d["coords"] for c in cs]
    at = np.array(flat, dtype=np.int64).reshape(-1, len(tile)) if all(len(c) == len(tile) for c in flat) else None
    if at is None or not ((at >= 0) & (at < np.array(tile))).all():  # not coordinates of the tile: as numpy says
        seen = np.zeros(tile, dtype=np.int64)
        for t, cs in enumerate(d["coords"]):
            for v, c in enumerate(cs):
                c = _flat(c)
                if seen[c] == 0:
                    owner[c], value[c] = t, v
                seen[c] += 1
        d.update(tile=tile, owner=owner, value=value, shared=bool((seen > 1).any()))
        return
    at = np.ravel_multi_index(tuple(at.T), tile)  # each element's place in the tile, owner by owner
    counts = np.array([len(cs) for cs in d["coords"]], dtype=np.int64)
    held_by = np.repeat(np.arange(len(counts)), counts)
    index = np.arange(len(at)) - np.repeat(np.cumsum(counts) - counts, counts)  # its index among its owner's
    places, first = np.unique(at, return_index=True)  # where each element is held first
    owner.flat[places], value.flat[places] = held_by[first], index[first]
    d.update(tile=tile, owner=owner, value=value, shared=bool((np.bincount(at, minlength=owner.size) > 1).any()))


@functools.lru_cache(maxsize=1 << 16)
def _flat_coord(c) -> tuple:
    return _flat(c)


# ---------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------
_NAME = re.compile(r"[A-Za-z_]\w*$")


def cute_layout(expr) -> Layout:
    """The layout a C++ expression of CuTe makes, evaluated now (with every result of the algebra
    and partition functions not evaluated yet, in the same program)::

        L = cute_layout("make_layout(make_shape(4, 8), make_stride(8, 1))")
        L, L(1, 2)        # (4,8):(8,1), 10

    The expression is C++ after ``using namespace cute;``: ``Layout<Shape<_4,_8>>{}``,
    ``composition(Swizzle<3,4,3>{}, make_layout(make_shape(8, 64), LayoutRight{}))``,
    ``GMMA::Layout_K_SW128_Atom<half_t>{}``... A refusal raises ``CuteError`` with g++'s first
    error."""
    return cute_layouts(expr)[0]


def cute_layouts(*exprs, **named):
    """Several layouts from one program (one compile): ``cute_layouts("e1", "e2")`` is the list
    of their layouts; ``cute_layouts(A="Layout<_24,_1>{}", D="logical_divide(A, Layout<_4,_2>{})")``
    a dict by name, where each expression may use the names before it (``auto A = ...;`` in C++)."""
    if exprs and named:
        raise TypeError("cute_layouts takes expressions or name=expression pairs, not both")
    for name in named:
        if not _NAME.match(name) or name.startswith("course_"):
            raise ValueError(f"{name!r} cannot name a C++ variable here")
    items = [Layout(e) for e in exprs] or [Layout(e, name) for name, e in named.items()]
    _evaluate(items, {id(item): name for item, name in zip(items, named)})
    for item in items:
        if item._error is not None:
            raise item._error
    return dict(zip(named, items)) if named else items


def _arg(x) -> str:
    """A Python argument as C++: a Layout is its expression, a string C++ as written, an int a
    number, a tuple ``make_shape(...)`` (``make_tile(...)`` when it holds layouts)."""
    if isinstance(x, _Result):
        return x.expr
    if isinstance(x, bool) or x is None:
        raise TypeError(f"not a CuTe argument: {x!r}")
    if isinstance(x, int):
        return str(x)
    if isinstance(x, str):
        return _expression(x)
    if isinstance(x, (tuple, list)):
        inner = ", ".join(_arg(e) for e in x)
        return f"make_tile({inner})" if any(isinstance(e, (Layout, str)) for e in x) else f"make_shape({inner})"
    raise TypeError(f"not a CuTe argument: {x!r} (give a Layout, a C++ expression, an int or a tuple of ints)")


def _shape(x) -> str:
    """A tile's shape as C++: an int is a rank-1 shape."""
    return f"make_shape({x})" if isinstance(x, int) and not isinstance(x, bool) else _arg(x)


def _apply(fn: str, *args) -> Layout:
    return Layout(f"{fn}({', '.join(_arg(a) for a in args)})", fn)


def composition(a, b) -> Layout:
    """``a o b``: the layout ``i -> a(b(i))``, shaped like ``b`` (CuTe's ``composition``)."""
    return _apply("composition", a, b)


def complement(a, cotarget=None) -> Layout:
    """What ``a`` leaves out of ``0 .. cotarget-1``, in order: ``a`` and its complement side by
    side are a bijection onto it (CuTe's ``complement``; without ``cotarget``, ``cosize(a)``)."""
    return _apply("complement", a) if cotarget is None else _apply("complement", a, cotarget)


def coalesce(a) -> Layout:
    """The same function of the index with the fewest modes (CuTe's ``coalesce``)."""
    return _apply("coalesce", a)


def right_inverse(a) -> Layout:
    """The layout ``r`` with ``a(r(i)) == i`` (CuTe's ``right_inverse``)."""
    return _apply("right_inverse", a)


def logical_divide(a, tiler) -> Layout:
    """``a`` split into tiles: mode 0 is one tile (the tiler's elements of ``a``), mode 1 walks
    the tiles (CuTe's ``logical_divide``; a tuple tiler divides mode by mode)."""
    return _apply("logical_divide", a, tiler)


def zipped_divide(a, tiler) -> Layout:
    """``logical_divide`` with the tile's modes gathered in mode 0 and the rest in mode 1:
    ``((tile), (rest))`` (CuTe's ``zipped_divide``)."""
    return _apply("zipped_divide", a, tiler)


def tiled_divide(a, tiler) -> Layout:
    """``zipped_divide`` with the rest's modes unpacked: ``((tile), rest0, rest1, ...)``."""
    return _apply("tiled_divide", a, tiler)


def logical_product(a, b) -> Layout:
    """``a`` repeated as ``b`` says: mode 0 is ``a``, mode 1 lays out ``b``'s copies of it
    (CuTe's ``logical_product``)."""
    return _apply("logical_product", a, b)


def blocked_product(a, b) -> Layout:
    """A rank-2 product where ``a`` is a block and ``b`` lays the blocks out (CuTe's
    ``blocked_product``)."""
    return _apply("blocked_product", a, b)


def raked_product(a, b) -> Layout:
    """A rank-2 product where ``a``'s elements are spread out, each one a ``b`` of elements
    (CuTe's ``raked_product``)."""
    return _apply("raked_product", a, b)


# ---------------------------------------------------------------------------------------
# Partitions
# ---------------------------------------------------------------------------------------
def thread_partition(threads, data) -> Partition:
    """Which thread gets which element of a tile when each thread ``t`` takes CuTe's
    ``local_partition(tile, threads, t)``, as a copy does. ``threads`` is the thread layout
    (thread index -> its place in a grid of threads: ``make_layout(make_shape(4, 8))``), ``data``
    the tile's shape (or a layout: only its shape matters)::

        p = thread_partition("make_layout(make_shape(4, 8))", (8, 16))
        p.owner[1, 2], p.coords[0]      # 9; thread 0's elements (0, 0), (4, 0), (0, 8), (4, 8)"""
    t_expr, d_expr = _arg(threads), _shape(data)

    def build(prog, k):
        thr = prog.value(t_expr, "thread_partition's threads")
        dat = prog.value(d_expr, "thread_partition's data")
        prog.line(f"static_assert(is_layout<decltype({thr})>::value, \"the threads are a layout (thread index -> "
                  f"place in a grid of threads), such as make_layout(make_shape(4, 8)), not a shape\");")
        prog.line(f"auto course_ref{k} = make_identity_tensor(course_cute::shape_of({dat}));")
        prog.line(f'course_cute::partition({k}, "thread", {thr}, shape(course_ref{k}), int(size({thr})), '
                  f"[&](int t) {{ return local_partition(course_ref{k}, {thr}, t); }});")
    return Partition(f"local_partition(make_identity_tensor({d_expr}), {t_expr}, t)", "thread_partition",
                     "thread", build, cute.tier_of(f"{t_expr} {d_expr}"))


def tile_partition(tile, data) -> Partition:
    """Which tile each element of ``data`` (a shape, or a layout's shape) is in when block ``b``
    takes CuTe's ``local_tile(data, tile, b)``: ``owner`` is the tile (numbered as CuTe numbers the
    rest mode of ``zipped_divide``), ``value`` the element's index in it."""
    t_expr, d_expr = _shape(tile), _shape(data)

    def build(prog, k):
        til = prog.value(t_expr, "tile_partition's tile")
        dat = prog.value(d_expr, "tile_partition's data")
        prog.line(f"auto course_ref{k} = make_identity_tensor(course_cute::shape_of({dat}));")
        prog.line(f'course_cute::partition({k}, "tile", {til}, shape(course_ref{k}), '
                  f"int(size<1>(zipped_divide(course_ref{k}, {til}))), "
                  f"[&](int t) {{ return local_tile(course_ref{k}, {til}, t); }});")
    return Partition(f"local_tile(make_identity_tensor({d_expr}), {t_expr}, b)", "tile_partition", "tile", build,
                     cute.tier_of(f"{t_expr} {d_expr}"))


_GMMA_BARE = re.compile(r"^SM90_\d+x\d+x\d+_\w+_(SS|RS)$")
_TILE_OF = {"A": "select<0,2>", "B": "select<1,2>", "C": "select<0,1>"}


def mma_partition(atom: str, operand: str = "C", atoms=None):
    """Which thread holds which element of an MMA's operand: the TiledMMA of ``atom`` (a CuTe MMA
    atom, such as ``"SM80_16x8x16_F32F16F16F32_TN"``) and its thread-value layout of ``A`` (an M x K
    tile), ``B`` (N x K) or ``C`` (M x N), as CuTe's ``print_latex`` of a TiledMMA draws them.
    ``atoms`` lays atoms out over more threads: ``(2, 2, 1)`` for 2 x 2 of them (M, N, K), or a
    C++ layout. Several letters (``"ABC"``) give a tuple of partitions, from one program.

    An SM90 warpgroup atom without template arguments (``"SM90_64x64x16_F32BF16BF16_SS"``) gets
    ``<GMMA::Major::K, GMMA::Major::K>``: both operands K-major. Its ``SS`` operands A and B are
    read from shared memory, so every thread of the warpgroup maps to each of their elements
    (``shared`` is True); C is in registers, 128 threads each with its own values."""
    letters = operand.upper() if isinstance(operand, str) else ""
    if not letters or set(letters) - set("ABC"):
        raise ValueError(f"operand is 'A', 'B', 'C' or several of them ('ABC'), got {operand!r}")
    a_expr = _expression(atom)
    if _GMMA_BARE.match(a_expr):
        a_expr += "<GMMA::Major::K, GMMA::Major::K>"
    if atoms is None:
        l_expr = None
    elif isinstance(atoms, (tuple, list)) and all(isinstance(n, int) and n > 0 for n in atoms):
        l_expr = "Layout<Shape<" + ",".join(f"Int<{n}>" for n in atoms) + ">>{}"
    else:
        l_expr = _arg(atoms)
    tiled = f"make_tiled_mma({a_expr}{{}}" + ("" if l_expr is None else f", {l_expr}") + ")"

    def one(letter):
        def build(prog, k):
            at = prog.value(a_expr + "{}", "mma_partition's atom")
            args = at if l_expr is None else f"{at}, {prog.value(l_expr, 'mma_partition atoms')}"
            prog.line(f"auto course_mma{k} = make_tiled_mma({args});")
            prog.line(f"auto course_tile{k} = {_TILE_OF[letter]}(tile_shape(course_mma{k}));")
            prog.line(f"auto course_tv{k} = course_mma{k}.get_layout{letter}_TV();")
            prog.line(f"auto course_ref{k} = composition(make_identity_tensor(course_tile{k}), course_tv{k});")
            prog.line(f'course_cute::partition({k}, "thread", course_tv{k}, course_tile{k}, '
                      f"int(size<0>(course_tv{k})), [&](int t) {{ return course_ref{k}(t, _); }});")
        return Partition(f"{tiled}.get_layout{letter}_TV()", f"mma_partition({letter})", "thread", build, "mma")
    parts = tuple(one(c) for c in letters)
    return parts[0] if len(parts) == 1 else parts


def tv_partition(tv, tile) -> Partition:
    """Which thread holds which element of ``tile`` (a shape) under a thread-value layout ``tv``,
    (thread, value) -> the element's index in the tile (the first mode fastest), as CuTe's
    ``print_latex_tv`` draws it: a TiledCopy's ``get_layoutS_TV()``, or one written by hand."""
    v_expr, t_expr = _arg(tv), _shape(tile)

    def build(prog, k):
        lay = prog.value(v_expr, "tv_partition's layout")
        til = prog.value(t_expr, "tv_partition's tile")
        prog.line(f"auto course_ref{k} = composition(make_identity_tensor(course_cute::shape_of({til})), {lay});")
        prog.line(f'course_cute::partition({k}, "thread", {lay}, course_cute::shape_of({til}), int(size<0>({lay})), '
                  f"[&](int t) {{ return course_ref{k}(t, _); }});")
    return Partition(f"composition(make_identity_tensor({t_expr}), {v_expr})", "tv_partition", "thread", build,
                     cute.tier_of(f"{v_expr} {t_expr}"))
