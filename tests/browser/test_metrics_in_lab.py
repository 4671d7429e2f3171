"""ppkit.log_metrics' live plot as a learner sees it in JupyterLab (issue 48, item 4): a %%torchrun cell whose two
ranks log a loss every 50 ms shows one image under the cell, redrawn while the cell runs, a panel per metric and a
line per rank; nothing is fetched (the page's own requests stay on the lab's server). A step of the browser
session: the session's JupyterLab and chromium, one notebook of its own."""

from __future__ import annotations

import time
import urllib.parse

import pytest
from test_widgets_in_lab import write_notebook

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

SETUP = "%load_ext ppkit\n"
TRAIN = """%%torchrun --nproc-per-node 2
import os, time
import ppkit
rank, step, waited = int(os.environ["RANK"]), 0, 0.0
while not os.path.exists({go!r}) and waited < 120:
    ppkit.log_metrics(step=step, loss=1.0 / (step + 1) + rank, tokens_per_s=1000.0 * (rank + 1))
    time.sleep(0.05)
    step, waited = step + 1, waited + 0.05
print("released while running:", os.path.exists({go!r}))
"""


def _plot(nb) -> str:
    """The SVG the running cell's image shows now ("" before it is drawn)."""
    image = nb.page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".jp-OutputArea img")
    if image.count() == 0:
        return ""
    src = image.first.get_attribute("src") or ""
    return urllib.parse.unquote(src.partition(",")[2]) if src.startswith("data:image/svg+xml") else ""


def _points(svg: str, rank: int) -> int:
    marker = f'data-rank="{rank}" data-points="'
    return int(svg.split(marker)[1].split('"')[0]) if marker in svg else 0


def test_the_metrics_plot_is_redrawn_in_jupyterlab_while_the_cell_runs(lab, open_notebook):
    go = lab.notebook_dir / "metrics-go"
    nb = open_notebook(write_notebook(lab.notebook_dir, "metrics_lab.ipynb", SETUP, TRAIN.format(go=str(go))))
    requests: list[str] = []
    nb.page.on("request", lambda request: requests.append(request.url))
    nb.run_all(timeout=240, hold_back_last=True)
    nb.run_last_cell(wait=False)
    seen: list[int] = []  # rank 0's points in each drawing seen while the cell runs
    deadline = time.monotonic() + 120
    while len(set(seen)) < 3:
        assert time.monotonic() < deadline, f"the plot was not redrawn three times while the cell ran: {seen}"
        points = _points(_plot(nb), 0)
        if points and (not seen or points != seen[-1]):
            seen.append(points)
        nb.page.wait_for_timeout(200)
    nb.screenshot("metrics-running", nb.page.locator(".jp-Notebook .jp-CodeCell").nth(1))
    go.touch()
    nb.wait_cells_done(120, [])
    cell = nb.page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".jp-OutputArea")
    assert "released while running: True" in cell.inner_text(), cell.inner_text()
    assert cell.locator("img").count() == 1  # one image, redrawn in place, not one per drawing
    final = _plot(nb)
    assert final.count('class="ppkit-metric"') == 2 and final.count('class="ppkit-rank"') == 4, final[:300]
    assert seen == sorted(seen) and _points(final, 0) >= seen[-1], (seen, _points(final, 0))
    elsewhere = [url for url in requests if not url.startswith(lab.url) and not url.startswith("data:")]
    assert elsewhere == [], elsewhere  # offline: the plot fetches nothing
    nb.screenshot("metrics-done", nb.page.locator(".jp-Notebook .jp-CodeCell").nth(1))
    nb.assert_console_clean()
