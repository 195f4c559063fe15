"""What reaches the instructor, rebuilt on the trusted side, never taken as it came.

Messages for the terminal (``terminal``: one line of printable ASCII, whatever the names in
it hold) and for reports (``printable``), and the executed notebooks (``feedback_notebook``):
markdown that can make no HTML and no link, outputs rebuilt from plain values (text and
PNG/JPEG images only) and cut down per output, per cell and per notebook, no lone surrogate
anywhere (``scrub``), so that the notebook can always be written as UTF-8.
"""
from __future__ import annotations

import base64
import binascii
import copy
import re

from nbformat.v4 import new_output

from .runner import MAX_CELL_OUTPUT_CHARS, MAX_NOTEBOOK_OUTPUT_CHARS, MAX_OUTPUTS_PER_CELL, nbgrader_meta

#: What reaches the executed notebook besides the runner's caps on a cell and a notebook: each
#: text output, each image.
MAX_OUTPUT_CHARS = 20000
MAX_IMAGE_BYTES = 2 << 20
#: A message from the sandbox, or a file name, in the instructor's terminal.
MAX_MESSAGE_CHARS = 1000


def _escape(c: str) -> str:
    code = ord(c)
    if c in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text, limit=MAX_MESSAGE_CHARS) -> str:
    """A string from the sandbox or a file name, safe to keep in a report: lines, and printable
    characters; every other character (controls, escapes, lone surrogates) written as an escape."""
    text = text if isinstance(text, str) else repr(text)
    text = "".join(c if c.isprintable() or c == "\n" else _escape(c) for c in text)
    return text if len(text) <= limit else text[:limit] + " ..."


def terminal(text, limit=2 * MAX_MESSAGE_CHARS) -> str:
    """One line for the instructor's terminal: printable ASCII only (a newline, a control
    character or a letter outside ASCII is written as its escape), so that no name can forge a
    line and any terminal encoding can print it."""
    text = text if isinstance(text, str) else repr(text)
    text = "".join(c if " " <= c <= "~" else _escape(c) for c in text)
    return text if len(text) <= limit else text[:limit] + " ..."


def name_text(name) -> str:
    """A file or folder name inside a message: every character that is not printable ASCII
    escaped (``\\n``, ``\\xe9``), so that it reads the same in any terminal."""
    return terminal(str(name), limit=300)


_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub(value):
    """``value`` (a notebook, a dict, a list, a string) with every lone surrogate replaced by
    U+FFFD, in place where it can be: what a kernel sends may hold one (a JSON escape), and it
    cannot be written as UTF-8."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    stack = [value]
    while stack:
        v = stack.pop()
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, item in list(items):
            if isinstance(item, str):
                if _SURROGATE.search(item):
                    v[k] = _SURROGATE.sub("\ufffd", item)
            elif isinstance(item, (dict, list)):
                stack.append(item)
            if isinstance(v, dict) and isinstance(k, str) and _SURROGATE.search(k):
                v[_SURROGATE.sub("\ufffd", k)] = v.pop(k)
    return value


def cell_source(cell) -> str:
    """A cell's source as one string (nbformat allows a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


_SCHEME_RE = re.compile(
    "(?i)(" + "|".join("[\\s\\x00-\\x1f]*".join(w) for w in ("javascript", "vbscript", "livescript", "data"))
    + r")[\s\x00-\x1f]*:")
_B64_RE = re.compile(r"^[A-Za-z0-9+/=\s]*$")


def safe_markdown(text: str) -> str:
    """A student's markdown that makes no HTML and no link or image, however it is spelled:
    every ``<`` and ``&`` escaped (no tag, entity or autolink survives), and every ``[`` and
    ``]`` written as an entity (no inline link, image, reference link or definition can form:
    each needs a bracket), so no URL of the student's reaches an ``href`` or ``src``; and a
    ``javascript:``/``vbscript:``/``data:`` in the text gets a full-width colon."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace("[", "&#91;").replace("]", "&#93;")
    return _SCHEME_RE.sub(lambda m: m.group(1) + "\uff1a", text)


def _text(value) -> str:
    if isinstance(value, list):
        value = "".join(v for v in value if isinstance(v, str))
    return value if isinstance(value, str) else ""


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = max(0, limit // 2 - 40)
    return text[:half] + f"\n... ({len(text) - 2 * half} characters cut) ...\n" + text[-half:] if half else ""


def _image(value) -> str | None:
    value = _text(value)
    if not value or len(value) > MAX_IMAGE_BYTES * 4 // 3 + 16 or not _B64_RE.match(value):
        return None
    try:
        base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        return None
    return value


def safe_outputs(outputs, budget: list[int]) -> tuple[list, bool]:
    """The outputs of one cell, rebuilt from plain values: streams, errors, text and PNG/JPEG
    images only (no HTML, JavaScript, SVG or markdown from a sandbox); consecutive streams of
    one name merged; each text cut to ``MAX_OUTPUT_CHARS``, the cell to
    ``MAX_CELL_OUTPUT_CHARS`` and ``MAX_OUTPUTS_PER_CELL`` outputs, the notebook to
    ``budget[0]`` characters (decreased here). Errors are always kept (cut): they explain the
    score. Returns ``(outputs, had_error)``: whether any output, kept or not, was an error."""
    items, had_error = [], False           # (kind, fields), streams merged, before any limit
    for o in outputs if isinstance(outputs, list) else []:
        if not isinstance(o, dict):
            continue
        kind = o.get("output_type")
        if kind == "error":
            had_error = True
            tb = o.get("traceback")
            tb = tb[-20:] if isinstance(tb, list) else []
            tb = [_cut(t, MAX_OUTPUT_CHARS // 4) for t in tb if isinstance(t, str)]
            items.append(("error", dict(ename=_cut(_text(o.get("ename")), 200),
                                        evalue=_cut(_text(o.get("evalue")), 2000), traceback=tb)))
        elif kind == "stream":
            name = o.get("name") if o.get("name") in ("stdout", "stderr") else "stdout"
            text = _text(o.get("text"))
            if items and items[-1][0] == "stream" and items[-1][1]["name"] == name:
                prev = items[-1][1]
                prev["size"] += len(text)
                if len(prev["text"]) < 2 * MAX_OUTPUT_CHARS:
                    prev["text"] += text[:2 * MAX_OUTPUT_CHARS]
                prev["tail"] = (prev["tail"] + text)[-MAX_OUTPUT_CHARS:]
            else:
                items.append(("stream", dict(name=name, text=text[:2 * MAX_OUTPUT_CHARS],
                                             tail=text[-MAX_OUTPUT_CHARS:], size=len(text))))
        elif kind in ("execute_result", "display_data"):
            data = o.get("data") if isinstance(o.get("data"), dict) else {}
            keep = {}
            if isinstance(data.get("text/plain"), (str, list)):
                keep["text/plain"] = _cut(_text(data["text/plain"]), MAX_OUTPUT_CHARS)
            for mime in ("image/png", "image/jpeg"):
                img = _image(data.get(mime))
                if img is not None:
                    keep[mime] = img
            if keep:
                count = o.get("execution_count")
                count = count if isinstance(count, int) and not isinstance(count, bool) else None
                items.append((kind, dict(data=keep, execution_count=count)))
    outs, cut = [], False
    left = min(MAX_CELL_OUTPUT_CHARS, max(0, budget[0]))
    for kind, f in items:
        if kind == "error":
            size = len(f["ename"]) + len(f["evalue"]) + sum(map(len, f["traceback"]))
            outs.append(new_output("error", **f))
        elif len(outs) >= MAX_OUTPUTS_PER_CELL or left <= 200:
            cut = True
            continue
        elif kind == "stream":
            limit = min(MAX_OUTPUT_CHARS, left)
            if f["size"] <= limit and len(f["text"]) == f["size"]:
                text = f["text"]
            else:
                half = limit // 2
                text = f["text"][:half] + f"\n... ({f['size'] - 2 * half} characters cut) ...\n" + f["tail"][-half:]
                cut = cut or f["size"] > MAX_OUTPUT_CHARS
            size = len(text)
            outs.append(new_output("stream", name=f["name"], text=text))
        else:
            data = dict(f["data"])
            if "text/plain" in data:
                data["text/plain"] = _cut(data["text/plain"], left)
            size = len(data.get("text/plain", "")) + sum(len(v) for k, v in data.items() if k != "text/plain") // 20
            if size > left:
                data = {k: v for k, v in data.items() if k == "text/plain"}
                size = len(data.get("text/plain", ""))
                cut = True
                if not data:
                    continue
            outs.append(new_output(kind, data=data, **({"execution_count": f["execution_count"]}
                                                        if kind == "execute_result" else {})))
        left -= size
        budget[0] -= size
    if cut:
        outs.append(new_output("stream", name="stderr", text=(
            f"\n[autograde] output was cut: at most {MAX_OUTPUT_CHARS} characters an output, "
            f"{MAX_CELL_OUTPUT_CHARS} and {MAX_OUTPUTS_PER_CELL} outputs a cell, "
            f"{MAX_NOTEBOOK_OUTPUT_CHARS} characters a notebook\n")))
    return outs, had_error


def feedback_notebook(to_run, executed, notes: dict[int, str]):
    """The executed notebook the instructor and the student see, built from ``to_run`` (the
    trusted merge: cells, sources, metadata) with the sandbox's outputs re-validated, markdown
    without HTML, raw cells that no exporter renders, and ``notes[i]`` (why check cell ``i``
    earned nothing) added to the cells."""
    nb = copy.deepcopy(to_run)
    out_cells = executed.cells if executed is not None and len(executed.cells) == len(nb.cells) else None
    budget = [MAX_NOTEBOOK_OUTPUT_CHARS]
    for i, cell in enumerate(nb.cells):
        grader = nbgrader_meta(cell)
        cell.metadata = {"nbgrader": copy.deepcopy(grader)} if grader else {}
        if cell.cell_type == "markdown" and not grader.get("locked"):   # (locked: the instructor's, put back)
            cell.source = safe_markdown(cell_source(cell))
            atts = cell.get("attachments")
            if isinstance(atts, dict):
                cell.attachments = {k: {m: v for m, v in a.items() if m in ("image/png", "image/jpeg") and _image(v)}
                                    for k, a in atts.items() if isinstance(k, str) and isinstance(a, dict)}
        elif cell.cell_type == "raw":
            cell.source = cell_source(cell)
        elif cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            if out_cells is not None and out_cells[i].get("cell_type") == "code":
                cell.outputs, _ = safe_outputs(out_cells[i].get("outputs"), budget)
                count = out_cells[i].get("execution_count")
                cell.execution_count = count if isinstance(count, int) and not isinstance(count, bool) else None
            if i in notes:
                cell.outputs.append(new_output("stream", name="stderr", text=f"[autograde] {notes[i]}\n"))
    return scrub(nb)
