"""A real JupyterLab driven by a real browser (Debian's chromium through Playwright).

Fixtures: `chromium` (path to the browser; skips outside CI when it is missing, fails in CI), `lab` (a
JupyterLab server on loopback serving a temporary copy of notebooks/), `browser` (one headless chromium) and
`open_notebook` (opens a notebook in a fresh page and returns a `Notebook` to drive like a learner).

Screenshots go to artifacts/browser/ (git-ignored). Playwright must never download a browser of its own.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
ARTIFACTS = REPO / "artifacts" / "browser"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

LAB_START_TIMEOUT = 120  # s; a loaded 2-core machine can take a while to import jupyterlab
PAGE_TIMEOUT = 90_000  # ms; loading the JupyterLab bundle in a software-rendered browser
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root, where chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-dev-shm-usage",  # Debian's wrapper decides this with a check that breaks on some mounts
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Nothing but loopback: every other host name fails to resolve.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE localhost",
]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def find_chromium() -> str | None:
    explicit = os.environ.get("PPKIT_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _missing(reason: str):
    """Outside CI a missing browser is a skip; in CI the browser tests are required, so it is a failure."""
    if in_ci():
        pytest.fail(f"{reason} CI=true, so the browser tests must run: `make browser` installs chromium.")
    pytest.skip(
        f"{reason} Install it with `make browser` (runs apt-get install chromium) to run these tests."
    )


def _parent_conftest(config):
    path = REPO / "tests" / "conftest.py"
    for plugin in config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) and Path(plugin.__file__).resolve() == path:
            return plugin
    raise RuntimeError(f"{path} is not loaded; run pytest from the repository root")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


# --- processes


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after ``timeout`` s. Polled, not psutil.wait_procs: its pidfd_open
    raised FileNotFoundError for a process that ended while it looked (a fresh-clone run, 27 November)."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _alive(p)]
    return alive


def _describe(procs: list[psutil.Process]) -> list[str]:
    described = []
    for p in procs:
        try:
            described.append(f"{p.pid} {' '.join(p.cmdline()[:4])}")
        except psutil.Error:  # gone while we looked: not a leftover
            pass
    return described


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """One JupyterLab server on 127.0.0.1 with a random token, serving a temporary copy of notebooks/."""

    # What keeps JupyterLab's own pop-ups (Jupyter news, a newer version) away; the first-open test passes
    # `make lab`'s options instead (and none, as its control), with no user settings that would hide them.
    QUIET = ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]

    def __init__(self, root: Path, config, options: list[str] | None = None, quiet_settings: bool = True):
        self.options = self.QUIET if options is None else options
        self.quiet_settings = quiet_settings
        self.root = root
        self.notebook_dir = root / "notebooks"
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "jupyterlab.log"
        self.seen: dict[
            int, psutil.Process
        ] = {}  # every process the server ever started, for the final check
        self._ppkit_children = _parent_conftest(config).ppkit_children
        self.proc: subprocess.Popen | None = None

    # ---------------------------------------------------------------- start / stop
    def start(self) -> None:
        if NOTEBOOKS.is_dir():
            shutil.copytree(NOTEBOOKS, self.notebook_dir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        else:
            self.notebook_dir.mkdir()
        settings = self.root / "user-settings"
        _write_settings(settings, quiet=self.quiet_settings)
        env = dict(os.environ)
        env.pop("JUPYTER_TOKEN", None)
        env.update(
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
            JUPYTER_CONFIG_DIR=str(self.root / "config"),
            JUPYTER_RUNTIME_DIR=str(self.root / "runtime"),
            IPYTHONDIR=str(self.root / "ipython"),
            PPKIT_TEST_LAB=str(self.port),  # what this server's kernels start inherits it: see stop()
        )
        cmd = [
            sys.executable, "-m", "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.notebook_dir}",
            "--ServerApp.terminals_enabled=False",
            f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={self.root / 'workspaces'}",
            "--LabApp.extension_manager=readonly",
            *self.options,
        ]  # fmt: skip
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        with open(self.log_path, "w") as log:
            # Own session: nothing we start here shares a process group with pytest.
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + LAB_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"JupyterLab exited with code {self.proc.returncode} before it served a "
                    f"request. Its log ({self.log_path}):\n{self.log_tail()}"
                )
            try:
                self.api("GET", "/api/status")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        raise RuntimeError(
            f"JupyterLab did not answer on {self.url} within {LAB_START_TIMEOUT} s. "
            f"Its log ({self.log_path}):\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def note_processes(self) -> None:
        if self.proc is not None:
            for p in _descendants(self.proc.pid):
                self.seen.setdefault(p.pid, p)

    def shutdown_kernels(self, timeout: float = 30.0) -> list[str]:
        """Shut every kernel down as a learner's "Shut Down All Kernels" would; return what survived it."""
        self.note_processes()
        before = _descendants(self.proc.pid) if self.proc else []
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}")
        for kernel in self.api("GET", "/api/kernels"):
            self.api("DELETE", f"/api/kernels/{kernel['id']}")
        return _describe(_wait_gone(before, timeout))

    def stop(self) -> list[str]:
        """Stop the server politely (REST shutdown), then firmly; describe any process left behind."""
        if self.proc is None:
            return []
        self.note_processes()
        if self.proc.poll() is None:
            try:
                self.api("POST", "/api/shutdown")
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
        tracked = list(self.seen.values())
        left = _wait_gone(tracked, timeout=10)
        owned = [p for p in self._ppkit_children() if p.pid != self.proc.pid and _from_lab(p, self.port)]
        left += _wait_gone(owned, timeout=5)
        report = _describe(left)
        for p in left:
            try:
                p.kill()  # leave the machine clean even though the test fails
            except psutil.Error:
                pass
        self.proc = None
        return report

    # ---------------------------------------------------------------- REST
    def api(self, method: str, path: str):
        req = urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None


def _write_settings(settings: Path, quiet: bool = True) -> None:
    """User settings for a reproducible lab: every cell attached to the DOM, and (quiet) no news or update pop-ups."""
    files = {
        # 'none' attaches every cell, so a widget below the fold is rendered and can be checked.
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    }
    if quiet:
        files["@jupyterlab/apputils-extension/notification.jupyterlab-settings"] = {
            "fetchNews": "false",
            "checkForUpdates": False,
        }
    for rel, content in files.items():
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))


# --- fixtures


@pytest.fixture(scope="session")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        where = os.environ.get("PPKIT_CHROMIUM") or "/usr/bin/chromium and chromium on PATH"
        _missing(f"chromium is not installed (looked for {where}).")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("the playwright Python package is not installed (pip install -e '.[test]').")
    return path


def _from_lab(proc: psutil.Process, port: int) -> bool:
    """Whether ``proc`` was started under the lab server on ``port`` (the others are other tests' business)."""
    try:
        return proc.environ().get("PPKIT_TEST_LAB") == str(port)
    except psutil.Error:
        return False


# One server and one browser for every browser test of the session (each test shuts its kernels down after it,
# so what runs beside them is the server alone, which the leftover checks do not count).
@pytest.fixture(scope="session")
def lab(chromium, tmp_path_factory, request):
    server = Lab(tmp_path_factory.mktemp("lab"), request.config)
    try:
        server.start()
        yield server
    finally:
        left = server.stop()
        assert not left, f"processes left after JupyterLab stopped: {left}"


@pytest.fixture(scope="session")
def browser(chromium, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # launch() gives every run a fresh, temporary user-data dir.
        b = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield b
        finally:
            b.close()


class Notebook:
    """A notebook open in JupyterLab, with what a learner does to it and what the test checks."""

    def __init__(self, page, lab: Lab, name: str, shots: str):
        self.page = page
        self.lab = lab
        self.name = name
        self.shots = shots
        self.console_errors: list[str] = []
        self.blocked: list[str] = []
        self.held_back = False  # the last code cell was deliberately left unrun (see run_all)

    # ---------------------------------------------------------------- learner actions
    def run_all(self, timeout: float = 240, hold_back_last: bool = False) -> None:
        """Run > Run All Cells from the menu bar, then wait until every code cell has run.

        hold_back_last: select the last code cell and use Run > Run All Above Selected Cell instead, as a
        learner does who wants to play with a widget before the last cell closes the cluster behind it.
        """
        before = self._prompts()
        if hold_back_last:
            self._select_last_code_cell()
        self._menu("Run", "notebook:run-all-above" if hold_back_last else "runmenu:run-all")
        self.held_back = hold_back_last
        self.wait_cells_done(timeout, before, upto=len(before) - 1 if hold_back_last else None)

    def run_last_cell(self, timeout: float = 120, wait: bool = True) -> None:
        """Select the last code cell and Run > Run Selected Cell (``wait=False``: return while it runs)."""
        before = self._prompts()
        self._select_last_code_cell()
        self._menu("Run", "runmenu:run")
        self.held_back = False
        if wait:
            self.wait_cells_done(timeout, before)

    def _select_last_code_cell(self) -> None:
        prompt = self.page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").last
        prompt.scroll_into_view_if_needed()
        prompt.click()

    def _menu(self, menu: str, command: str) -> None:
        self.page.locator(".lm-MenuBar-item", has_text=re.compile(f"^{menu}$")).click()
        self.page.locator(f".lm-Menu-item[data-command='{command}']").click()

    def _prompts(self) -> list[str]:
        return [
            t.strip()
            for t in self.page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").all_inner_texts()
        ]

    def wait_cells_done(self, timeout: float, before: list[str], upto: int | None = None) -> None:
        """Wait until the first `upto` code cells (all by default) show an execution count."""
        deadline = time.monotonic() + timeout
        stalled_since = None
        started = False
        while True:
            texts = self._prompts()[:upto]
            # Cells show [*] while queued or running; a change from `before` also proves the run began.
            started = started or texts != before[:upto] or any("*" in t for t in texts)
            done = [bool(re.fullmatch(r"\[\d+\]:", t)) for t in texts]
            if started and texts and all(done):
                break
            if started and any(done) and not any("*" in t for t in texts):
                # run-all stops at the first error (and skips empty cells): nothing is queued any more
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 3:
                    break
            else:
                stalled_since = None
            if time.monotonic() > deadline:
                self.screenshot("timeout")
                raise AssertionError(f"{self.name}: cells still running after {timeout:.0f} s: {texts}")
            self.page.wait_for_timeout(500)
        self.wait_kernel_idle(timeout=max(10.0, deadline - time.monotonic()))

    def wait_kernel_idle(self, timeout: float = 60) -> None:
        """Idle twice in a row, a moment apart: a widget callback may keep the kernel busy after a click."""
        deadline = time.monotonic() + timeout
        idle_count = 0
        while idle_count < 2:
            states = [
                s["kernel"]["execution_state"]
                for s in self.lab.api("GET", "/api/sessions")
                if s.get("path", "").endswith(self.name)
            ]
            idle_count = idle_count + 1 if states and all(s == "idle" for s in states) else 0
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: kernel not idle after {timeout:.0f} s (states {states})")
            self.page.wait_for_timeout(500)

    def save(self) -> dict:
        """File > Save Notebook, and return what was written to disk."""
        path = self.lab.notebook_dir / self.name
        before = path.stat().st_mtime_ns
        self._menu("File", "docmanager:save")
        deadline = time.monotonic() + 30
        while path.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: File > Save did not write the notebook within 30 s")
            self.page.wait_for_timeout(200)
        self.page.wait_for_timeout(300)  # let the write finish
        return json.loads(path.read_text())

    # ---------------------------------------------------------------- checks
    def assert_ran_cleanly_and_widgets_render(self) -> int:
        """Every cell ran without error, every widget output rendered, the console stayed clean.

        Returns the number of widgets shown at the top level of cell outputs.
        """
        saved = self.save()
        errors = [
            f"cell {i}: {o.get('ename')}: {o.get('evalue')}"
            for i, cell in enumerate(saved["cells"])
            for o in cell.get("outputs", [])
            if o.get("output_type") == "error"
        ]
        assert not errors, f"{self.name}: cells raised: {errors}"
        cells = saved["cells"]
        code = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        if self.held_back:
            code = code[:-1]
        unrun = [i for i in code if cells[i].get("execution_count") is None]
        assert not unrun, f"{self.name}: code cells {unrun} did not run"
        expected = sum(WIDGET_VIEW in o.get("data", {}) for c in saved["cells"] for o in c.get("outputs", []))
        # Widgets attach asynchronously after the kernel is idle: wait for all of them, bounded.
        found = self._top_level_widgets()
        deadline = time.monotonic() + 30
        while len(found) < expected and time.monotonic() < deadline:
            self.page.wait_for_timeout(500)
            found = self._top_level_widgets()
        broken = self.page.locator(".jp-Notebook").get_by_text(
            re.compile("Error displaying widget|model not found")
        )
        assert broken.count() == 0, f"{self.name}: {broken.all_inner_texts()}"
        assert len(found) == expected, (
            f"{self.name}: {expected} widget outputs in the notebook but {len(found)} rendered as widgets: "
            "the JupyterLab widget extension (jupyterlab_widgets) may not match ipywidgets"
        )
        invisible = [f for f in found if not (f["width"] > 0 and f["height"] > 0)]
        assert not invisible, f"{self.name}: widgets with no size: {invisible}"
        self.assert_no_broken_images()
        self.assert_console_clean()
        return expected

    def assert_no_broken_images(self) -> None:
        """No output shows the browser's broken-image icon (an empty or undecodable image)."""
        images = self.page.locator(".jp-Notebook .jp-OutputArea-output img")
        self.page.wait_for_function(
            "imgs => imgs.every(i => i.complete)", arg=images.element_handles(), timeout=30_000
        )
        broken = images.evaluate_all(
            """imgs => imgs
                .filter(i => i.naturalWidth === 0 && i.getBoundingClientRect().width > 0)
                .map(i => (i.closest('[class*="ppkit-"]') || i.parentElement).className)"""
        )
        assert not broken, f"{self.name}: {len(broken)} image(s) shown broken, in elements {broken}"

    def _top_level_widgets(self) -> list[dict]:
        return self.page.locator(
            ".jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output"
        ).evaluate_all(
            """outs => outs
                .map(o => o.classList.contains('jupyter-widgets')
                          ? o : o.querySelector(':scope > .jupyter-widgets'))
                .filter(w => w)
                .map(w => ({cls: w.className, width: w.getBoundingClientRect().width,
                            height: w.getBoundingClientRect().height}))"""
        )

    def assert_console_clean(self) -> None:
        assert not self.blocked, f"{self.name}: the page tried to reach outside loopback: {self.blocked}"
        assert not self.console_errors, f"{self.name}: browser console errors: {self.console_errors}"

    def screenshot(self, step: str, locator=None) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{self.shots}-{step}.png"
        if locator is not None:
            locator.scroll_into_view_if_needed()
            locator.screenshot(path=str(path))
        else:
            self.page.screenshot(path=str(path))
        return path


@pytest.fixture
def open_notebook(lab, browser, request):
    """open_notebook("06_pipeline.ipynb") -> Notebook, in a fresh browser context, cleaned up afterwards."""
    contexts = []
    opened: list[Notebook] = []

    def _open(name: str) -> Notebook:
        # Tall, so that a whole widget fits in one screenshot (the notebook scrolls inside the page).
        ctx = browser.new_context(viewport={"width": 1400, "height": 1800})
        contexts.append(ctx)
        page = ctx.new_page()
        page.set_default_timeout(30_000)
        shots = re.sub(r"[^\w.-]+", "_", request.node.name)
        nb = Notebook(page, lab, name, shots)
        opened.append(nb)

        def outside(route):
            nb.blocked.append(route.request.url)
            route.abort()

        # Matched in the driver, so requests to the lab never wait for this (blocked) Python thread.
        ctx.route(re.compile(r"^(https?|wss?)://(?!(127\.0\.0\.1|localhost)[:/])"), outside)
        page.on("console", lambda m: m.type == "error" and nb.console_errors.append(m.text))
        page.on("pageerror", lambda e: nb.console_errors.append(f"uncaught: {e}"))
        # A workspace of its own, so the lab does not reopen notebooks from an earlier test.
        workspace = f"w{secrets.token_hex(4)}"
        page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{name}?token={lab.token}", timeout=PAGE_TIMEOUT)
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=PAGE_TIMEOUT)
        nb.wait_kernel_idle(timeout=PAGE_TIMEOUT / 1000)
        return nb

    yield _open
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    for nb in opened:
        if failed:
            try:
                nb.screenshot("failure")
            except Exception as e:  # noqa: BLE001 - a screenshot must not hide the real failure
                print(f"no failure screenshot of {nb.name}: {e}")
    for ctx in contexts:
        ctx.close()
    left = lab.shutdown_kernels()
    assert not left, f"processes left after the kernels were shut down: {left}"


def widget_notebooks() -> list[str]:
    """Notebooks whose code uses ipywidgets (directly or through ppkit.widgets)."""
    found = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        try:
            cells = json.loads(path.read_text())["cells"]
        except (OSError, ValueError, KeyError):
            continue
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        if re.search(
            r"\bipywidgets\b|\bppkit\.widgets\b|from ppkit import[^\n]*\bwidgets\b|\binteract\(", code
        ):
            found.append(path.name)
    return found


@pytest.fixture(scope="session")
def widget_notebook_names() -> list[str]:
    return widget_notebooks()


@pytest.fixture(scope="session")
def notebook_class():
    """The Notebook class, for a test that opens its pages itself (tests/browser/test_hub_in_lab.py)."""
    return Notebook
