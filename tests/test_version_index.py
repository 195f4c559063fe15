"""One version index per topic and language, as llm.c's dev/cuda headers are: the header
comment of the ``.cu`` file (CUDA C++) or the module docstring (Numba, Triton) lists the
versions, and every entry of the module's ``VERSIONS`` (and ``BACKWARD_VERSIONS``) appears
there as ``<name>  <description>``, word for word. Lessons, benchmarks and
``kernels.versions`` show the descriptions of ``VERSIONS``; a reader of the source sees the
same words at the top of the file."""
import re
import sys
from pathlib import Path

import pytest

import kernels
from utils.topics import TOPICS


def _cuda_header(mod) -> str:
    """The first comment block of the .cu file whose kernels the module launches."""
    source = getattr(mod, "SOURCE", None)
    if source is None:  # a topic that reuses another's kernels (matmul_fp16: matmul.cu)
        launcher = next(iter(mod.VERSIONS.values()))[1]
        source = sys.modules[launcher.__module__].SOURCE
    lines = []
    for line in Path(source).read_text().splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[2:])
    return "\n".join(lines)


def index_of(topic: str, lang: str) -> str:
    mod = kernels.module(topic, lang)
    return _cuda_header(mod) if lang == "cuda" else (mod.__doc__ or "")


def _words(text: str) -> str:
    return " ".join(text.split())


#: Every topic module of every language (a topic may have none, as the model of lesson 11).
MODULES = [(topic, lang) for topic in sorted(TOPICS) for lang in kernels.LANGUAGES
           if (Path(kernels.__file__).parent / lang / f"{topic}.py").is_file()]


def test_the_classic_topics_have_modules_in_every_language():
    for topic in ("relu", "add", "gelu", "reduction", "softmax", "matmul", "layernorm", "attention"):
        assert all((topic, lang) in MODULES for lang in kernels.LANGUAGES), topic


@pytest.mark.parametrize("topic,lang", MODULES)
def test_every_version_is_in_the_index_with_its_description(topic, lang):
    mod = kernels.module(topic, lang)
    index = _words(index_of(topic, lang))
    tables = {name: getattr(mod, name) for name in dir(mod) if name.endswith("VERSIONS")}
    assert "VERSIONS" in tables
    where = f"the header of {Path(mod.SOURCE).name}" if lang == "cuda" and hasattr(mod, "SOURCE") else \
        f"the docstring of kernels/{lang}/{topic}.py" if lang != "cuda" else "the .cu header"
    missing = [f"{table}[{name!r}]: {name}  {desc}" for table, versions in tables.items()
               for name, (desc, _) in versions.items()
               if not re.search(rf"(^| ){re.escape(name)} {re.escape(_words(desc))}( |$)", index)]
    assert not missing, f"{lang} {topic}: not in {where} word for word:\n  " + "\n  ".join(missing)
