"""The course in a real browser: JupyterLab, driven by headless Chromium through Playwright.

A notebook can pass nbval and still fail a learner in JupyterLab (a plot that does not
render, a cell that expects another working directory, a folder the file browser cannot
reach). This test starts the course the way the README does, ``./course lab`` (on
127.0.0.1, a random free port, a token, no browser, a throw-away config so it cannot touch
the user's), opens an exercise from JupyterLab's file browser, opens the welcome notebook
and the first solution notebook, runs all cells through the menu (Run > Run All Cells) and
checks what a learner would see:

* every code cell ran and none shows an error;
* the grader's success line is on the page (solutions);
* at least one plot rendered as an image (if neither notebook draws one, the first lesson
  that does is run as well).

Screenshots go to ``artifacts/`` (git-ignored). ``test_browser_reports_failing_cell`` runs
a deliberately broken copy of a notebook, from a temporary directory, and asserts that the
same checks catch it. Without Chromium the tests are skipped, or fail under ``CI=true``:
run ``bash .ci/install-browser.sh`` (Debian's ``chromium``; a browser download does not
work here).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = os.environ.get("COURSE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# What a grader prints on success: "check_relu: correct on 9 inputs (...), max error 0".
GRADER_OK = re.compile(r"\bcorrect on \d+ inputs?\b")

# Every wait is bounded (seconds).
SERVER_START_S = 60
PAGE_LOAD_S = 60
KERNEL_IDLE_S = 60
RUN_ALL_S = float(os.environ.get("COURSE_BROWSER_RUN_S", "240"))

pytestmark = pytest.mark.timeout(600)


def _missing_browser_reason() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed (pip install playwright)"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"Chromium is not installed at {CHROMIUM} (bash .ci/install-browser.sh)"
    return None


def _require_browser() -> None:
    reason = _missing_browser_reason()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"The browser test cannot run in CI: {reason}.", pytrace=False)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


class Lab:
    """A running ``jupyter lab`` with its own config, data and runtime directories."""

    def __init__(self, root: Path, home: Path):
        self.root, self.home = root, home
        self.port, self.token = _free_port(), secrets.token_hex(16)
        cfg = home / "config"
        # Keep every cell in the page (no virtual scrolling), no news or update pop-ups, and
        # no autosave: the notebooks run in place and must stay as committed (no outputs).
        settings = cfg / "lab" / "user-settings" / "@jupyterlab"
        _write_json(settings / "docmanager-extension" / "plugin.jupyterlab-settings",
                    {"autosave": False})
        _write_json(settings / "notebook-extension" / "tracker.jupyterlab-settings",
                    {"windowingMode": "none"})
        _write_json(settings / "apputils-extension" / "notification.jupyterlab-settings",
                    {"fetchNews": "false", "checkForUpdates": False})
        self.env = dict(os.environ, JUPYTER_CONFIG_DIR=str(cfg), JUPYTER_DATA_DIR=str(home / "data"),
                        JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"),
                        MPLCONFIGDIR=str(home / "mpl"))
        # The kernels must see the course the way a learner's do: plots inline, not Agg.
        self.env.pop("MPLBACKEND", None)
        self.log_path = home / "jupyter.log"
        self.proc: subprocess.Popen | None = None

    def url(self, rel: str) -> str:
        return f"http://127.0.0.1:{self.port}/lab/tree/{rel}?reset&token={self.token}"

    def start(self) -> None:
        # The README's own command, so the test sees the folder it serves and what it opens.
        cmd = [str(self.root / "course"), "lab", "--no-browser", "--ip=127.0.0.1",
               f"--port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--LabApp.news_url=",
               # Checkpoints JupyterLab makes on opening a notebook stay out of the repository.
               f"--FileCheckpoints.root_dir={self.home / 'checkpoints'}"]
        # ./course runs jupyter from the virtual environment running these tests.
        self.env["COURSE_VENV"] = sys.prefix
        self.log = open(self.log_path, "w")
        # A session of its own, so that teardown can stop the server and its kernels at once.
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with code {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{self.port}/api/status?token={self.token}", timeout=2):
                    return
            except OSError:
                time.sleep(0.25)
        raise RuntimeError(f"jupyter lab did not answer within {SERVER_START_S} s:\n{self.tail()}")

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text()[-n:]
        except OSError:
            return ""

    def _children(self) -> list[int]:
        """PIDs whose parent is the server: its kernels (each in a process group of its own)."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == self.proc.pid:
                pids.append(int(stat.parent.name))
        return pids

    def stop(self) -> None:
        if self.proc is None:
            return
        # Kernels first (each is in a process group of its own): a server asked to stop
        # would otherwise wait for each kernel to shut down politely.
        for pid in self._children() if self.proc.poll() is None else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the server shuts its kernels down
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
            except ProcessLookupError:
                pass
        self.log.close()


def _require_course_venv() -> None:
    """``./course lab`` reinstalls the packages when the venv was not set up by ``./course``
    (or requirements.txt changed since): that is a setup step, not something to test here."""
    want = hashlib.sha256((ROOT / "requirements.txt").read_bytes()).hexdigest()
    stamp = Path(sys.prefix) / ".requirements.sha256"
    have = stamp.read_text().strip() if stamp.is_file() else ""
    if want != have:
        reason = (f"the tests' virtual environment ({sys.prefix}) was not set up by ./course "
                  "for this requirements.txt: run the tests with ./course test")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"The browser test cannot run in CI: {reason}.", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    _require_browser()
    _require_course_venv()
    home = tmp_path_factory.mktemp("jupyter-home")
    server = Lab(ROOT, home)
    try:
        t0 = time.monotonic()
        server.start()
        print(f"jupyter lab answered after {time.monotonic() - t0:.1f} s")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                               timeout=60_000)
        try:
            yield b
        finally:
            b.close()


# --------------------------------------------------------------------------------------
# Driving JupyterLab
# --------------------------------------------------------------------------------------
# Each open notebook is a panel; only the current tab's panel is not hidden.
_PANEL_JS = "document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)')"

_STATE_JS = r"""() => {
  const panel = PANEL;
  const cells = panel ? [...panel.querySelectorAll('.jp-Cell.jp-CodeCell')] : [];
  const ind = panel && panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return {
    status: ind ? ind.dataset.status : null,
    cells: cells.map(c => {
      const prompt = c.querySelector('.jp-InputArea-prompt');
      const editor = c.querySelector('.jp-InputArea-editor');
      return {
        prompt: prompt ? prompt.textContent.trim() : '',
        source: editor ? editor.textContent : '',
        outputs: [...c.querySelectorAll('.jp-OutputArea-output')].map(o => ({
          mime: o.dataset.mimeType || '',
          text: o.innerText || '',
          images: [...o.querySelectorAll('img')].filter(i => i.complete && i.naturalWidth > 0).length,
        })),
      };
    }),
  };
}"""

_DONE_JS = r"""() => {
  const panel = PANEL;
  if (!panel) return false;
  const ind = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
      .map(p => p.textContent);
  return !!ind && ind.dataset.status === 'idle' && prompts.length > 0
      && !prompts.some(p => p.includes('*')) && prompts.some(p => /\[\d+\]/.test(p));
}"""


_KERNEL_READY_JS = r"""() => [...document.querySelectorAll('.jp-StatusBar-Item')]
    .some(e => /\|\s*Idle\s*$/.test(e.textContent.trim()))"""

_STARTED_JS = r"""() => { const panel = PANEL; return !!panel &&
    [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
    .some(p => /\[(\*|\d+)\]/.test(p.textContent)); }"""

_OPENED_JS = r"""(name) => { const panel = PANEL; return !!panel
    && !!panel.querySelector('.jp-CodeCell')
    && [...document.querySelectorAll('.lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel')]
       .some(t => t.textContent.trim() === name); }"""

_STATE_JS, _DONE_JS, _STARTED_JS, _OPENED_JS = (
    js.replace("PANEL", _PANEL_JS) for js in (_STATE_JS, _DONE_JS, _STARTED_JS, _OPENED_JS))


@pytest.fixture(scope="module")
def page(lab, browser):
    """One JupyterLab page for all notebooks: the lab loads once (seconds on 2 cores)."""
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.set_default_timeout(PAGE_LOAD_S * 1000)
    try:
        pg.goto(f"http://127.0.0.1:{lab.port}/lab?reset&token={lab.token}", wait_until="domcontentloaded")
        t0 = time.monotonic()
        pg.wait_for_selector(".lm-MenuBar-itemLabel", timeout=PAGE_LOAD_S * 1000)
        print(f"JupyterLab loaded in the browser after {time.monotonic() - t0:.1f} s")
        yield pg
    finally:
        pg.close()


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(menu)}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).click()


def run_notebook(page, rel: str, shot: str) -> dict:
    """Open ``rel`` in JupyterLab (File > Open from Path), Run > Run All Cells, wait until
    it is done, and return what the page shows."""
    t_open = time.monotonic()
    _menu(page, "File", "Open from Path…")
    box = page.locator(".jp-Dialog input")
    box.fill(rel)
    box.press("Enter")
    page.wait_for_function(_OPENED_JS, arg=Path(rel).name, timeout=PAGE_LOAD_S * 1000, polling=250)
    # The kernel is ready when the status bar says "Python 3 (ipykernel) | Idle"; the
    # toolbar's indicator already reads idle before a kernel is connected.
    t_kernel = time.monotonic()
    page.wait_for_function(_KERNEL_READY_JS, timeout=KERNEL_IDLE_S * 1000, polling=250)
    for attempt in range(3):
        _menu(page, "Run", "Run All Cells")
        try:  # some cell is queued, running or done: the run has started
            page.wait_for_function(_STARTED_JS, timeout=20_000, polling=250)
            break
        except Exception as e:
            if "Timeout" not in type(e).__name__ or attempt == 2:
                raise
    t0 = time.monotonic()
    # Done: the kernel is idle, no cell is queued or running ([*]), at least one ran.
    # Checked twice a second apart: between two cells the kernel is briefly idle too.
    while True:
        remaining = RUN_ALL_S - (time.monotonic() - t0)
        try:
            if remaining <= 0:
                raise TimeoutError
            page.wait_for_function(_DONE_JS, timeout=max(1000, remaining * 1000), polling=500)
        except Exception as e:  # playwright's TimeoutError, or ours
            if not isinstance(e, TimeoutError) and "Timeout" not in type(e).__name__:
                raise
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{shot}-timeout.png"))
            st = page.evaluate(_STATE_JS)
            raise AssertionError(
                f"{rel}: not finished after {RUN_ALL_S:.0f} s (kernel {st['status']}, prompts "
                f"{[c['prompt'] for c in st['cells']]}; screenshot artifacts/{shot}-timeout.png)"
            ) from None
        page.wait_for_timeout(1000)
        if page.evaluate(_DONE_JS):
            break
    state = page.evaluate(_STATE_JS)
    state["seconds"] = time.monotonic() - t0
    state["open_s"], state["kernel_s"] = t_kernel - t_open, t0 - t_kernel
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{shot}.png"))
    first_img = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output img").first
    if first_img.count():
        first_img.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"{shot}-plot.png"))
    return state


def problems(state: dict) -> list[str]:
    """What a learner would see go wrong, one line per cell."""
    out = []
    for i, cell in enumerate(state["cells"], 1):
        if not cell["source"].strip():
            continue
        for o in cell["outputs"]:
            # IPython shows an exception as a traceback; a SyntaxError has no "Traceback"
            # header, only its last line, "SyntaxError: ...".
            if "Traceback (most recent call last)" in o["text"] or (
                    o["mime"] == "application/vnd.jupyter.stderr"
                    and re.search(r"^\w*(Error|Exception)\b", o["text"], re.M)):
                last = [s for s in o["text"].strip().splitlines() if s.strip()][-1:]
                out.append(f"code cell {i} shows an error: {last[0] if last else '?'}")
                break
        if not re.fullmatch(r"\[\d+\]:?", cell["prompt"]):
            out.append(f"code cell {i} did not run (prompt {cell['prompt']!r})")
    return out


def _texts(state: dict) -> str:
    return "\n".join(o["text"] for c in state["cells"] for o in c["outputs"])


def _images(state: dict) -> int:
    return sum(o["images"] for c in state["cells"] for o in c["outputs"])


def _first_solution() -> str | None:
    for name in ("02_relu.ipynb",):
        if (ROOT / "solutions" / name).exists():
            return f"solutions/{name}"
    found = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    return f"solutions/{found[0].name}" if found else None


# --------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------
def _timing(state: dict) -> str:
    return (f"opened in {state['open_s']:.1f} s, kernel ready after {state['kernel_s']:.1f} s, "
            f"all cells ran in {state['seconds']:.1f} s")


def _has_plot_cell(rel: str) -> bool:
    import nbformat

    nb = nbformat.read(ROOT / rel, as_version=4)
    return any(c.cell_type == "code" and re.search(r"\bplot_|\bplt\.|\.plot\(", c.source)
               for c in nb.cells)


@pytest.fixture(scope="module")
def course_runs(page) -> dict:
    """The welcome notebook and the first solution, each run once: ``{path: page state}``.

    If neither draws a plot, the first lesson that does is run as well, so the test always
    sees whether plots render in the lab.
    """
    runs = {}
    for rel in ("notebooks/00_welcome.ipynb", _first_solution()):
        if rel and (ROOT / rel).exists():
            runs[rel] = run_notebook(page, rel, "browser-" + rel.replace("/", "-")[:-6])
            print(f"{rel}: {_timing(runs[rel])}")
    if not runs:
        pytest.skip("neither notebooks/00_welcome.ipynb nor a solution notebook exists yet")
    if not any(_images(s) for s in runs.values()):
        lesson = next((f"notebooks/{p.name}" for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
                       if _has_plot_cell(f"notebooks/{p.name}")), None)
        if lesson and lesson not in runs:
            runs[lesson] = run_notebook(page, lesson, "browser-" + lesson.replace("/", "-")[:-6])
            print(f"{lesson} (for its plots): {_timing(runs[lesson])}")
    return runs


def _welcome_url(lab) -> str:
    """The page ``./course lab`` opens in the learner's browser: Jupyter writes it into its
    runtime folder (``jpserver-file-to-run-<pid>-open.html``) for the browser it starts."""
    found = sorted((lab.home / "runtime").glob("jpserver-file-to-run-*-open.html"))
    assert found, f"./course lab names no file to open in the browser:\n{lab.tail()}"
    m = re.search(r'href="([^"]+)"', found[-1].read_text())
    assert m, found[-1].read_text()
    return m.group(1)


def _open_in_file_browser(page, *names: str) -> None:
    """Double-click through JupyterLab's file browser from the served root: what a learner does."""
    if not page.locator(".jp-FileBrowser .jp-DirListing").first.is_visible():
        _menu(page, "View", "File Browser")
    page.locator(".jp-FileBrowser .jp-BreadCrumbs-home").first.click()
    for name in names:
        item = page.locator(".jp-FileBrowser .jp-DirListing-item",
                            has=page.locator(".jp-DirListing-itemText", has_text=re.compile(f"^{re.escape(name)}$")))
        item.first.wait_for(state="visible", timeout=PAGE_LOAD_S * 1000)
        item.first.dblclick()


def test_course_lab_serves_the_course_and_opens_the_welcome_notebook(lab, page):
    """``./course lab`` serves the course root, so exercises/ and solutions/ are in the file
    browser, and opens the welcome notebook, which sends the learner to them."""
    log = lab.tail(20_000)
    served = re.findall(r"Serving notebooks from local directory: (.*?)\s*$", log, re.M)
    assert served == [str(ROOT)], log
    url = _welcome_url(lab)  # http://127.0.0.1:<port>/lab/tree/...?token=...
    assert urllib.parse.urlsplit(url).path == "/lab/tree/notebooks/00_welcome.ipynb", url
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_function(_OPENED_JS, arg="00_welcome.ipynb", timeout=PAGE_LOAD_S * 1000, polling=250)

    exercise = next(iter(sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))), None)
    if exercise is None:
        pytest.skip("no exercise notebook exists yet")
    _open_in_file_browser(page, "exercises", exercise.name)
    page.wait_for_function(_OPENED_JS, arg=exercise.name, timeout=PAGE_LOAD_S * 1000, polling=250)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser-exercise-from-file-browser.png"))
    sources = [c["source"] for c in page.evaluate(_STATE_JS)["cells"]]
    assert any("# Check your answer" in src for src in sources), (
        f"{exercise.name} opened from the file browser shows no check cell: {sources[:3]}")


def test_notebooks_run_in_jupyterlab_without_errors(course_runs):
    found = [f"{rel}: {p}" for rel, state in course_runs.items() for p in problems(state)]
    assert not found, "\n".join(found)


def test_grader_success_line_is_visible(course_runs):
    solutions = {rel: s for rel, s in course_runs.items() if rel.startswith("solutions/")}
    if not solutions:
        pytest.skip("no solution notebook exists yet")
    for rel, state in solutions.items():
        assert GRADER_OK.search(_texts(state)), f"{rel}: no grader success line on the page"


def test_a_plot_rendered_as_an_image(course_runs):
    counts = {rel: _images(state) for rel, state in course_runs.items()}
    assert sum(counts.values()) >= 1, f"no plot rendered as an image: {counts}"


def test_browser_reports_failing_cell(page):
    """The checks above catch a cell that raises: a broken copy of a notebook, in a
    temporary directory inside the server's root (artifacts/, git-ignored)."""
    import nbformat

    src = ROOT / "notebooks" / "00_welcome.ipynb"
    if not src.exists():
        src = next(iter(sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))), None)
    if src is None:
        pytest.skip("no lesson notebook exists yet")
    ARTIFACTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ARTIFACTS, prefix="broken-") as tmp:
        nb = nbformat.read(src, as_version=4)
        code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        # The copy lives elsewhere: point its setup line at the course root.
        nb.cells[code[0]].source = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\nimport utils")
        broken = nbformat.v4.new_code_cell(
            'print("this cell raises on purpose")\nraise RuntimeError("deliberately broken cell")')
        nb.cells.insert(code[0] + 1, broken)
        nb.cells.append(nbformat.v4.new_code_cell('print("never reached")'))
        path = Path(tmp) / "broken_copy.ipynb"
        nbformat.write(nb, path)
        rel = path.relative_to(ROOT).as_posix()
        state = run_notebook(page, rel, "browser-broken-copy")
    found = problems(state)
    assert any("shows an error" in p and "deliberately broken cell" in p for p in found), found
    # Run All stops at the error: the cells after it never ran.
    assert any("did not run" in p for p in found), found
