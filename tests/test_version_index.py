"""One version index per topic and language, as llm.c's dev/cuda headers are: the header
comment of the ``.cu`` file (CUDA C++) or the module docstring (Numba, Triton) lists the
versions, one line each, ``<name>  <description>``. ``VERSIONS`` (and ``BACKWARD_VERSIONS``)
are built from it by ``kernels._launch.version_index``, so a description is written once:
lessons, benchmarks and ``kernels.versions`` show the words a reader sees at the top of the
file. These tests check that every version the index lists has a launcher, that every table
was read from its index, and that a broken index is an error at import."""
import re
import sys
import types
from pathlib import Path

import pytest

import kernels
from kernels._launch import cuda_header, index_entries, version_index
from utils.topics import TOPICS

ROOT = Path(kernels.__file__).resolve().parent.parent


def index_of(table) -> tuple[str, str]:
    """(where, text): the index a version table reads, the one of the module that defines
    its launchers (matmul_fp16 reads matmul's: its kernels live there)."""
    mod = sys.modules[next(iter(table.values()))[1].__module__]
    lang = mod.__name__.split(".")[1]
    if lang == "cuda":
        return f"the header of {Path(mod.SOURCE).name}", cuda_header(mod.SOURCE)
    return f"the docstring of {mod.__name__}", mod.__doc__ or ""


#: Every topic module of every language (a topic may have none, as the model of lesson 11).
MODULES = [(topic, lang) for topic in sorted(TOPICS) for lang in kernels.LANGUAGES
           if (Path(kernels.__file__).parent / lang / f"{topic}.py").is_file()]


def _tables(mod):
    return {name: getattr(mod, name) for name in dir(mod) if name.endswith("VERSIONS")}


def test_the_classic_topics_have_modules_in_every_language():
    for topic in ("relu", "add", "gelu", "reduction", "softmax", "matmul", "layernorm", "attention"):
        assert all((topic, lang) in MODULES for lang in kernels.LANGUAGES), topic


@pytest.mark.parametrize("topic,lang", MODULES)
def test_every_version_is_read_from_the_index(topic, lang):
    mod = kernels.module(topic, lang)
    tables = _tables(mod)
    assert "VERSIONS" in tables and mod.REFERENCE in mod.VERSIONS
    for table, versions in tables.items():
        where, index = index_of(versions)
        entries = index_entries(index)
        for name, (desc, launcher) in versions.items():
            assert callable(launcher), f"{lang} {topic} {table}[{name!r}]"
            assert entries.get(name) == [desc], \
                f"{lang} {topic} {table}[{name!r}]: {desc!r}, but {where} says {entries.get(name)}"


def test_every_version_of_an_index_has_a_launcher():
    """The other way round: a vN line of an index names a version that exists (a version
    removed from ``VERSIONS`` but left in the index would tell the reader of a kernel that
    is not there). An index may serve several topics (matmul.cu: matmul and matmul_fp16)."""
    launched: dict[tuple[str, str], set] = {}
    for topic, lang in MODULES:
        for versions in _tables(kernels.module(topic, lang)).values():
            launched.setdefault(index_of(versions), set()).update(versions)
    assert len(launched) >= 3 * 8
    for (where, index), names in launched.items():
        listed = {name for name in index_entries(index) if re.fullmatch(r"v\d+", name)}
        assert listed <= names, f"{where} lists {sorted(listed - names)}, which no VERSIONS launches"


def test_a_broken_index_is_an_error():
    index = """Doc.

    v1  one thread per element           f_kernel
        details, indented deeper
    v2  a grid-stride loop
"""
    f, g = object(), object()
    assert version_index(index, v1=f, v2=g) == {"v1": ("one thread per element", f),
                                                 "v2": ("a grid-stride loop", g)}
    with pytest.raises(ValueError, match="v3 is not in the version index"):
        version_index(index, v1=f, v3=g)
    with pytest.raises(ValueError, match="v2 is more than once"):
        version_index(index + "    v2  again\n", v2=g)
    with pytest.raises(ValueError, match="no version index"):
        version_index("", v1=f)


def test_the_index_survives_python_OO():
    """``python -OO`` drops docstrings, so ``__doc__`` is None: a Numba or Triton module then
    reads its index from its source file, and has the descriptions it has without -OO. The
    module is compiled as -OO compiles it (``optimize=2``) and run in a fresh namespace."""
    for lang in ("numba", "triton"):
        mod = kernels.module("relu", lang)
        path = Path(mod.__file__)
        code = compile(path.read_text(), str(path), "exec", optimize=2)
        ns = types.ModuleType(f"{mod.__name__}_OO").__dict__  # a module's namespace: __doc__ is None
        ns["__file__"] = str(path)
        exec(code, ns)
        assert ns["__doc__"] is None
        assert [d for d, _ in ns["VERSIONS"].values()] == [d for d, _ in mod.VERSIONS.values()]
