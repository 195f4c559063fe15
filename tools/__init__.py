"""The instructor's and maintainers' tools; learners never need them (their door is ``utils``).

    python -m tools.autograde ...   grade a classroom's submissions, each in a sandbox
    python -m tools.nbtools ...     strip notebooks, generate exercises/ from solutions/

``tools`` may import ``utils``; ``utils`` never imports ``tools``.
"""
from pathlib import Path

#: The course's root folder (``utils/``, ``tools/``, ``notebooks/``, ...).
ROOT = Path(__file__).resolve().parent.parent
