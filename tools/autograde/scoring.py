"""What a submission earned, and where it is written: the instructor's points, the sandbox's
report validated, each check cell scored (the kernel's report, and the learner's function
called again on fresh inputs and compared here: ``verify.compare``), nbgrader's gradebook and
the executed notebooks under ``autograded/``. Only the trusted side writes anything.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from pathlib import Path

import nbformat

from .feedback import cell_source, feedback_notebook, printable, safe_outputs, scrub
from .runner import MAX_NOTEBOOK_OUTPUT_CHARS, MAX_VERIFY_BYTES, RUNNER_STATUSES, nbgrader_meta
from .sandbox import MAX_RESULT_BYTES
from .submissions import STUDENT_RE
from .verify import compare

#: The statuses a check cell can have in a report.
STATUSES = ("passed", "ok", "error", "aborted", "timeout", "died", "not run", "missing", "refused", "protocol",
            "wrong")


def grade_cells(nb) -> dict[str, float]:
    """``{grade_id: points}`` of a source notebook's graded cells, in order."""
    out = {}
    for cell in nb.cells:
        m = nbgrader_meta(cell)
        if m.get("grade") and m.get("grade_id"):
            out[m["grade_id"]] = float(m.get("points", 0) or 0)
    return out


def refused_report(sources: dict, message: str, status="refused") -> dict:
    """The report of notebooks that were not run: every check cell at 0, with ``message``."""
    return {name: {gid: {"score": 0.0, "max": p, "status": status, "message": message}
                   for gid, p in grade_cells(src).items()} for name, src in sources.items()}


def clean_result(result, n_cells: int) -> dict:
    """What the sandbox reported for one notebook, with every value checked: ``{"error": str}``
    or ``{"statuses": {int: str}, "messages": {int: str}, "stopped": str|None, "executed":
    notebook|None, "verified": {int: dict}}``. Anything of the wrong type or size becomes a
    ``"protocol"`` status or an error, never an exception (``verify.compare`` checks what is
    inside each ``verified`` entry)."""
    if not isinstance(result, dict):
        return {"error": "the sandbox's result was not valid"}
    if "error" in result:
        return {"error": printable(result["error"]) if isinstance(result["error"], str)
                else "the sandbox's result was not valid"}
    statuses, messages = {}, {}
    raw = result.get("statuses")
    raw_msgs = result.get("messages") if isinstance(result.get("messages"), dict) else {}
    if not isinstance(raw, dict):
        return {"error": "the sandbox's result was not valid (no statuses)"}
    for k, v in list(raw.items())[:100000]:
        if not (isinstance(k, str) and k.isdigit() and int(k) < n_cells):
            continue
        statuses[int(k)] = v if isinstance(v, str) and v in RUNNER_STATUSES else "protocol"
        msg = raw_msgs.get(k)
        if isinstance(msg, str) and msg:
            messages[int(k)] = printable(msg)
        elif statuses[int(k)] == "protocol":
            messages[int(k)] = "the kernel's reply to this cell was not valid: this check earns no points"
    verified = {}
    raw_verified = result.get("verified") if isinstance(result.get("verified"), dict) else {}
    for k, v in list(raw_verified.items())[:10000]:
        if (isinstance(k, str) and k.isdigit() and int(k) < n_cells and isinstance(v, dict)
                and isinstance(v.get("data", ""), str) and len(v.get("data", "")) <= MAX_VERIFY_BYTES * 4 // 3 + 16):
            verified[int(k)] = v
    stopped = result.get("stopped")
    stopped = printable(stopped) if isinstance(stopped, str) else None
    executed = None
    text = result.get("executed")
    if isinstance(text, str) and len(text) <= MAX_RESULT_BYTES:
        try:
            nb = nbformat.reads(text, as_version=4)
            if isinstance(nb.get("cells"), list) and all(isinstance(c, dict) for c in nb.cells):
                executed = nb
        except Exception:  # not JSON, too deep, not a notebook
            executed = None
    return {"statuses": statuses, "messages": messages, "stopped": stopped, "executed": scrub(executed),
            "verified": verified}


def score_notebook(to_run, source, result, plan=None) -> tuple[dict, object]:
    """``({grade_id: {"score", "max", "status", "message"}}, feedback notebook or None)`` for
    the instructor's check cells. Which cell is which comes from ``to_run`` (built here), never
    from the sandbox's copy; the result is validated by ``clean_result`` first. A check cell
    with a ``plan`` (``verify.plans``) earns its points only if its function's results, from
    the new call after it, are right here too (``verify.compare``)."""
    plan = plan or {}
    points = grade_cells(source)
    scores = {gid: {"score": 0.0, "max": p, "status": "missing", "message": "the check cell is not in the submission"}
              for gid, p in points.items()}
    result = clean_result(result, len(to_run.cells))
    if "error" in result:
        for s in scores.values():
            s.update(status="not run", message=result["error"])
        return scores, None
    executed = result["executed"]
    if executed is None:
        for s in scores.values():
            s.update(status="not run", message="the sandbox sent no readable notebook")
        return scores, None
    statuses, messages = result["statuses"], result["messages"]
    same_shape = len(executed.cells) == len(to_run.cells)
    seen, notes = {}, {}
    budget = [MAX_NOTEBOOK_OUTPUT_CHARS]
    for i, cell in enumerate(to_run.cells):
        gid = nbgrader_meta(cell).get("grade_id")
        if gid not in points or not nbgrader_meta(cell).get("grade"):
            continue
        status = statuses.get(i, "not run")
        out_cell = executed.cells[i] if i < len(executed.cells) else {}
        outs, had_error = safe_outputs(out_cell.get("outputs") if isinstance(out_cell, dict) else None, [budget[0]])
        passed = (status == "ok" and not had_error and same_shape and isinstance(out_cell, dict)
                  and cell_source(out_cell) == cell_source(cell))
        message = ""
        if passed and gid in plan:
            message = compare(plan[gid], result["verified"].get(i))
            if message:
                passed, status = False, "wrong"
                messages[i] = message
        if not passed:
            errs = [o for o in outs if o.get("output_type") == "error"]
            if i in messages:
                message = messages[i]
            elif errs:
                message = printable(f"{errs[-1].get('ename')}: {errs[-1].get('evalue')}")
            elif status == "not run":
                message = result["stopped"] or "not run"
            elif status == "ok":
                message = "the check cell that ran is not the instructor's"
            else:
                message = status
            if not errs:
                notes[i] = message       # an error output says it already
        # a check cell that appears twice must pass both times
        prev = seen.get(gid, True)
        seen[gid] = prev and passed
        scores[gid].update(score=points[gid] if seen[gid] else 0.0, verified=passed and gid in plan,
                           status="passed" if seen[gid] else ("error" if status == "ok" else status),
                           message="" if seen[gid] else (message or scores[gid]["message"]))
    return scores, feedback_notebook(to_run, executed, notes)


def _course_id(course: Path) -> str:
    cfg = course / "nbgrader_config.py"
    if cfg.exists():
        m = re.search(r"course_id\s*=\s*['\"]([^'\"]*)['\"]", cfg.read_text(errors="replace"))
        if m:
            return m.group(1)
    return ""


@contextlib.contextmanager
def gradebook(db: Path, course_id: str = ""):
    """nbgrader's Gradebook on ``db``. Opening an existing one runs nbgrader's ``alembic``
    script, which lies next to this Python: that folder goes first on PATH meanwhile."""
    from nbgrader.api import Gradebook
    old = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), old or ""])
    try:
        with warnings.catch_warnings():
            # nbgrader's add_submission trips SQLAlchemy's "not in session" warnings; harmless
            warnings.filterwarnings("ignore", message=".*not in session.*")
            with Gradebook(f"sqlite:///{db}", course_id=course_id) as gb:
                yield gb
    finally:
        if old is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = old


def write_gradebook(course: Path, assignment: str, sources: dict, report: dict, course_id: str | None = None) -> Path:
    """Record every score with nbgrader's API (the trusted side only), with the cells nbgrader's
    other commands look for (solution and task cells, and each submission's comment and grade
    of each: ``nbgrader generate_feedback`` reads them). A folder name that is not a student id
    is not written."""
    from nbgrader.api import Comment, Grade, MissingEntry
    db = course / "gradebook.db"
    cid = _course_id(course) if course_id is None else course_id
    with gradebook(db, cid) as gb:
        gb.update_or_create_assignment(assignment)
        cells = {}                                          # notebook stem -> [(kind, grade_id)]
        for nb_name, source in sources.items():            # nbgrader names a notebook by its stem
            stem = Path(nb_name).stem
            gb.update_or_create_notebook(stem, assignment)
            cells[stem] = []
            for cell in source.cells:
                m = nbgrader_meta(cell)
                gid = m.get("grade_id")
                if not isinstance(gid, str):
                    continue
                kind = "code" if cell.get("cell_type") == "code" else "markdown"
                if m.get("grade"):
                    gb.update_or_create_grade_cell(gid, stem, assignment, max_score=float(m.get("points", 0) or 0),
                                                   cell_type=kind)
                    cells[stem].append(("grade", gid))
                if m.get("solution"):
                    gb.update_or_create_solution_cell(gid, stem, assignment)
                    cells[stem].append(("comment", gid))
                elif m.get("task"):
                    gb.update_or_create_task_cell(gid, stem, assignment, max_score=float(m.get("points", 0) or 0),
                                                  cell_type="markdown")
                    cells[stem] += [("comment", gid), ("grade", gid)]
        for student, notebooks in report.items():
            if not (isinstance(student, str) and STUDENT_RE.match(student)):
                continue
            gb.update_or_create_student(student)
            try:
                gb.find_submission(assignment, student)
            except MissingEntry:
                gb.add_submission(assignment, student)
            for stem, wanted in cells.items():              # (cells new since the submission was added)
                sub_nb = gb.find_submission_notebook(stem, assignment, student)
                for kind, gid in wanted:
                    try:
                        (gb.find_comment if kind == "comment" else gb.find_grade)(gid, stem, assignment, student)
                    except MissingEntry:
                        if kind == "comment":
                            try:
                                cell = gb.find_solution_cell(gid, stem, assignment)
                            except MissingEntry:
                                cell = gb.find_task_cell(gid, stem, assignment)
                            gb.db.add(Comment(cell_id=cell.id, notebook=sub_nb))
                        else:
                            try:
                                cell = gb.find_grade_cell(gid, stem, assignment)
                            except MissingEntry:
                                cell = gb.find_task_cell(gid, stem, assignment)
                            gb.db.add(Grade(cell_id=cell.id, notebook=sub_nb))
                gb.db.commit()
            for nb_name, scores in notebooks.items():
                for gid, s in scores.items():
                    grade = gb.find_grade(gid, Path(nb_name).stem, assignment, student)
                    grade.auto_score = s["score"]
                    grade.needs_manual_grade = False
        gb.db.commit()
    return db


def write_feedback(course: Path, assignment: str, feedback: dict) -> None:
    """The executed notebooks, under autograded/<student>/<assignment>/: rebuilt by
    ``score_notebook`` (markdown without HTML, outputs cut down to text and images, limited),
    validated again here; a notebook that does not validate is not written."""
    for student, nbs in feedback.items():
        if not STUDENT_RE.match(student):
            continue
        dest = Path(course) / "autograded" / student / assignment
        dest.mkdir(parents=True, exist_ok=True)
        for name, nb in nbs.items():
            if isinstance(nb, str):
                try:
                    nb = nbformat.reads(nb, as_version=4)
                except Exception:
                    continue
            try:
                nbformat.validate(nb)
            except Exception:
                continue
            (dest / name).write_text(nbformat.writes(scrub(nb)), encoding="utf-8")
