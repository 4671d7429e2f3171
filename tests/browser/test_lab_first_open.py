"""The first notebook a learner opens in `make lab` has no box over it (issue 41).

JupyterLab asks "Would you like to get notified about official Jupyter news?" in a box over the notebook on first
use whenever its `fetchNews` setting is unset: `--LabApp.news_url=None` alone does not stop it (this test's first
version saw the box with it). `make lab` puts scripts/lab-settings/ppkit-workshop.json in this environment's
JupyterLab settings (overrides.d) and passes LAB_OPTIONS. This test starts JupyterLab from this environment with
exactly those options (`make -s lab-options`) and no user settings, as a new user's first start, opens notebook 00
in chromium and fails if the box appears. Its control, a lab with JupyterLab's own defaults (an empty settings
folder, no options), shows the box: so the test can see it, and it measures how long to watch for it.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PAGE_TIMEOUT, REPO, Lab

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

NEWS = "official Jupyter news"


def make_lab_options() -> list[str]:
    done = subprocess.run(["make", "-s", "--no-print-directory", "lab-options"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"make lab-options failed: {done.stderr}"
    return shlex.split(done.stdout)


def _first_open(browser, lab: Lab, watch: float) -> float | None:
    """Open notebook 00 as on a first visit; seconds from the notebook's first cell to the news box, None if it
    did not appear within ``watch`` seconds."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = ctx.new_page()
        page.goto(f"{lab.url}/lab/workspaces/w{secrets.token_hex(4)}/tree/00_start_here.ipynb?token={lab.token}",
                  timeout=PAGE_TIMEOUT)
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=PAGE_TIMEOUT)
        start = time.monotonic()
        try:
            page.get_by_text(NEWS).first.wait_for(state="visible", timeout=watch * 1000)
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: it never appeared
            return None
        return time.monotonic() - start
    finally:
        ctx.close()


def _lab(request, tmp_path_factory, options: list[str]) -> Lab:
    lab = Lab(tmp_path_factory.mktemp("first-open"), request.config, options=options, quiet_settings=False)
    lab.start()
    return lab


def _stop(lab: Lab) -> None:
    left = lab.shutdown_kernels() + lab.stop()
    assert not left, f"processes left after JupyterLab stopped: {left}"


def test_make_labs_first_notebook_has_no_news_box(browser, request, tmp_path_factory):
    options = make_lab_options()
    assert "--LabApp.news_url=None" in options, options
    defaults = Path(sys.prefix) / "share/jupyter/lab/settings/overrides.d/ppkit-workshop.json"
    assert defaults.is_file(), f"{defaults} is missing: `make lab` and `make test` install it (LAB_DEFAULTS)"
    empty = tmp_path_factory.mktemp("no-settings")
    control = _lab(request, tmp_path_factory, options=[f"--LabApp.app_settings_dir={empty}"])
    try:
        appeared = _first_open(browser, control, watch=60)
    finally:
        _stop(control)
    assert appeared is not None, f"the control (JupyterLab's defaults) showed no {NEWS!r} box: the test cannot see it"
    lab = _lab(request, tmp_path_factory, options=options)
    try:
        seen = _first_open(browser, lab, watch=max(10.0, 3 * appeared))
    finally:
        _stop(lab)
    assert seen is None, f"`make lab` ({' '.join(options)}) still shows the {NEWS!r} box over the first notebook"
