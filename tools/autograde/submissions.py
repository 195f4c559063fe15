"""What the sandbox gets: the submissions found, refused or copied, and merged.

Each entry of ``submitted/`` is looked at without following a link; every submission is
copied once, before any is graded, through file descriptors that never follow a link (each
folder of the path opened from the one above it), measured before a byte is read; nothing is
read from ``submitted/`` after that. Each notebook gets every locked cell of the instructor's
notebook back as the instructor wrote it, the missing ones too (``merge``). A submission that
cannot be graded raises ``SubmissionRefused``, with a message that names the student.
"""
from __future__ import annotations

import copy
import os
import re
import stat
import uuid
from pathlib import Path

import nbformat

from .feedback import cell_source, name_text, printable, scrub
from .runner import nbgrader_meta

#: A student id (a folder of ``submitted/``), and an assignment's name.
STUDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")
#: A submission: bytes (the larger of a file's size and the disk blocks it holds), entries, depth.
MAX_SUBMISSION_BYTES = 50 << 20
MAX_SUBMISSION_FILES = 2000
MAX_SUBMISSION_DEPTH = 16


class SubmissionRefused(ValueError):
    """One student's submission cannot be graded; the message says why and names the student."""


def _locked(cell) -> bool:
    m = nbgrader_meta(cell)
    return bool(m.get("locked") or m.get("grade"))


def merge(source, submitted):
    """The notebook to run: the student's cells, with every locked cell of the instructor's
    notebook (setup and check cells, locked markdown) as the instructor wrote it, whatever the
    submission's metadata says. A locked cell is found by its ``grade_id`` (the first cell that
    carries it), else by its source (a copy whose metadata was stripped); one that is not found
    is put back after the instructor's cell before it (first, if none). A cell of the submission
    that claims to be locked or graded but is not the instructor's (an unknown ``grade_id``, a
    second copy) loses that claim. Outputs are cleared; no string keeps a lone surrogate."""
    src_locked = [c for c in source.cells if _locked(c) and isinstance(nbgrader_meta(c).get("grade_id"), str)]
    by_id = {nbgrader_meta(c)["grade_id"]: k for k, c in enumerate(src_locked)}
    cells = [copy.deepcopy(c) for c in submitted.cells]
    placed = {}                                  # instructor's locked cell k -> the cell object put in
    for i, cell in enumerate(cells):
        k = by_id.get(nbgrader_meta(cell).get("grade_id"))
        if k is not None and k not in placed:
            cells[i] = placed[k] = copy.deepcopy(src_locked[k])
        elif _locked(cell) or k is not None:
            cell.metadata.pop("nbgrader", None)      # not the instructor's: an ordinary cell
    for k, orig in enumerate(src_locked):        # stripped of its metadata, source unchanged
        if k in placed:
            continue
        for i, cell in enumerate(cells):
            if (cell.get("cell_type") == orig.cell_type and cell_source(cell) == cell_source(orig)
                    and not any(cell is p for p in placed.values())):
                cells[i] = placed[k] = copy.deepcopy(orig)
                break
    for k, orig in enumerate(src_locked):        # missing: after the instructor's cell before it
        if k in placed:
            continue
        at = 0
        if k > 0:
            at = next(i for i, c in enumerate(cells) if c is placed[k - 1]) + 1
        placed[k] = copy.deepcopy(orig)
        cells.insert(at, placed[k])
    nb = copy.deepcopy(submitted)
    nb.cells = cells
    nb.metadata = copy.deepcopy(source.metadata)
    ids = set()
    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            cell.outputs = []
            cell.execution_count = None
        if "id" in cell and cell.id in ids:          # (a cell put back, beside a copy of it)
            cell.id = uuid.uuid4().hex[:8]
        ids.add(cell.get("id"))
    return scrub(nb)


def _open_dir(path, dir_fd=None, *, what: str) -> int:
    """A directory's descriptor, never through a symbolic link."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        raise SubmissionRefused(f"{what} cannot be opened ({e.strerror})") from None


def copy_submission(src, dest: Path, *, who: str = "the submission") -> list[str]:
    """Copy the regular files of ``src`` (a folder, or a descriptor of one: not its links,
    devices or dot files) to ``dest``, through descriptors that never follow a link. Everything
    is measured before a byte is read: a hard link with a name outside this submission (the
    instructor's files, another student's) or an unreadable file refuses the submission, and so
    do more than ``MAX_SUBMISSION_BYTES`` (size or disk blocks, whichever is larger: a sparse file counts by
    its size), ``MAX_SUBMISSION_FILES`` entries or ``MAX_SUBMISSION_DEPTH`` levels. Returns the
    files copied (relative paths)."""
    todo, found, opened = [], [], []          # found: (dir fd, name, relative path, stat)
    total, entries_seen, names = 0, 0, {}
    top = os.dup(src) if isinstance(src, int) else _open_dir(src, what=who)
    opened.append(top)
    todo.append((top, Path("."), 0))
    try:
        while todo:                            # 1. look, without reading a file
            dfd, rel, depth = todo.pop()
            try:
                entries = sorted(os.scandir(dfd), key=lambda e: e.name)
            except OSError as e:
                raise SubmissionRefused(f"{who}/{name_text(rel)} cannot be read ({e.strerror})") from None
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    continue
                entries_seen += 1
                if entries_seen > MAX_SUBMISSION_FILES:
                    raise SubmissionRefused(f"{who} holds more than {MAX_SUBMISSION_FILES} files and folders")
                path = rel / name
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError as e:
                    raise SubmissionRefused(f"{who}/{name_text(path)} cannot be read ({e.strerror})") from None
                if stat.S_ISDIR(st.st_mode):
                    if depth + 1 > MAX_SUBMISSION_DEPTH:
                        raise SubmissionRefused(f"{who} nests folders more than {MAX_SUBMISSION_DEPTH} deep")
                    sub = _open_dir(name, dfd, what=f"{who}/{name_text(path)}")
                    opened.append(sub)
                    if not os.path.samestat(st, os.fstat(sub)):
                        raise SubmissionRefused(f"{who}/{name_text(path)} changed while it was read")
                    todo.append((sub, path, depth + 1))
                    found.append((dfd, name, path, st))
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue                     # links, devices, sockets, pipes: not part of it
                total += max(st.st_size, st.st_blocks * 512)
                if total > MAX_SUBMISSION_BYTES:
                    raise SubmissionRefused(
                        f"{who} is larger than {MAX_SUBMISSION_BYTES >> 20} MB (at {name_text(path)}: "
                        f"{max(st.st_size, st.st_blocks * 512) / 2**20:.0f} MB)")
                names[(st.st_dev, st.st_ino)] = names.get((st.st_dev, st.st_ino), 0) + 1
                found.append((dfd, name, path, st))
        for dfd, name, path, st in found:      # 2. a hard link: every name inside this submission?
            if stat.S_ISREG(st.st_mode) and st.st_nlink > names[(st.st_dev, st.st_ino)]:
                raise SubmissionRefused(
                    f"{who}/{name_text(path)} is a hard link to a file outside the submission (the same file has "
                    f"{st.st_nlink} names): hand in a copy of the file instead")
        files = []
        for dfd, name, path, st in found:      # 3. copy
            if stat.S_ISDIR(st.st_mode):
                (dest / path).mkdir(parents=True, exist_ok=True)
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except OSError as e:
                raise SubmissionRefused(f"{who}/{name_text(path)} cannot be read ({e.strerror})") from None
            with os.fdopen(fd, "rb") as f:
                if not os.path.samestat(st, os.fstat(fd)):
                    raise SubmissionRefused(f"{who}/{name_text(path)} changed while it was read")
                try:
                    data = f.read(st.st_size + 1)
                except OSError as e:
                    raise SubmissionRefused(f"{who}/{name_text(path)} cannot be read ({e.strerror})") from None
            if len(data) != st.st_size:
                raise SubmissionRefused(f"{who}/{name_text(path)} changed while it was read")
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            (dest / path).write_bytes(data)
            files.append(str(path))
    finally:
        for fd in opened:
            os.close(fd)
    return files


def _why_not_a_folder(path: Path, where: str, *, say_absent: bool, say_not_folder: bool) -> str | None:
    """None when ``path`` is a folder of its own (not a symbolic link); otherwise why not, or ""
    where it is skipped without a word (absent, or not a folder, and not to be said)."""
    try:
        st = os.lstat(path)
    except OSError:
        return f"there is no {where}" if say_absent else ""
    if stat.S_ISLNK(st.st_mode):
        return f"{where} is a symbolic link, not the student's own folder"
    if not stat.S_ISDIR(st.st_mode):
        return f"{where} is not a folder" if say_not_folder else ""
    return None


def find_submissions(course: Path, assignment: str, students=None) -> tuple[list[str], dict[str, str]]:
    """``(students to grade, {student: why not})``. Each entry of ``submitted/`` is looked at
    without following a link: a name that is not a student id, a student or assignment folder
    that is a symbolic link (or not a folder, or resolves anywhere but where it lies) is
    refused, with a message naming that entry; the rest are graded."""
    sub_root = Path(course) / "submitted"
    explicit = students is not None
    if students is None:
        try:
            students = sorted(os.listdir(sub_root)) if sub_root.is_dir() else []
        except OSError as e:
            raise FileNotFoundError(f"{sub_root} cannot be read: {e.strerror}") from None
    real_root = os.path.realpath(sub_root)
    ok, refused = [], {}
    for name in students:
        if not isinstance(name, str) or not STUDENT_RE.match(name):
            refused[name] = (f"{ascii(name)}: not graded: the folder name is not a student id "
                             "(letters, digits and _ . @ + - only, at most 100, starting with a letter or digit)")
            continue
        where = f"submitted/{name}"
        why = _why_not_a_folder(sub_root / name, where, say_absent=explicit, say_not_folder=explicit)
        if why is None:
            where = f"{where}/{assignment}"
            why = _why_not_a_folder(sub_root / name / assignment, where, say_absent=explicit, say_not_folder=True)
        if why is None and os.path.realpath(sub_root / name / assignment) != os.path.join(real_root, name, assignment):
            why = f"{where} resolves outside submitted/{name}/"
        if why is None:
            ok.append(name)
        elif why:
            refused[name] = f"{name}: not graded: {why}"
    return ok, refused


def open_submission(course: Path, assignment: str, student: str) -> int:
    """A descriptor of ``submitted/<student>/<assignment>``, each folder opened from the one above
    it without following a link: a folder swapped for a link at any level is refused."""
    fds = []
    try:
        fds.append(_open_dir(Path(course) / "submitted", what="submitted/"))
        fds.append(_open_dir(student, fds[-1], what=f"submitted/{student}"))
        fds.append(_open_dir(assignment, fds[-1], what=f"submitted/{student}/{assignment}"))
        return os.dup(fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


def stage_submission(course: Path, assignment: str, student: str, sources: dict, into: Path):
    """``(folder, merged, problems)``: the folder the sandbox sees (a private copy, made once:
    nothing is read from ``submitted/`` after this), ``{notebook: merged notebook}`` and
    ``{notebook: why it is not run}``."""
    stage = into / student
    stage.mkdir(parents=True)
    os.chmod(stage, 0o700)                     # private until it is complete
    fd = open_submission(course, assignment, student)
    try:
        copy_submission(fd, stage, who=f"submitted/{student}/{assignment}")
    finally:
        os.close(fd)
    merged, problems = {}, {}
    for name, source in sources.items():
        path = stage / name
        if not path.is_file() or path.is_symlink():
            problems[name] = "the notebook is not in the submission"
            continue
        try:
            submitted = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
            nb = merge(source, submitted)
            path.write_text(nbformat.writes(nb), encoding="utf-8")
        except Exception as e:  # not JSON, not UTF-8, too deep, not a notebook
            problems[name] = printable(f"the notebook cannot be read: {type(e).__name__}: {e}", 300)
            continue
        merged[name] = nb
    for p in [*stage.rglob("*"), stage]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return stage, merged, problems
