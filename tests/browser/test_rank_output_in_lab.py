"""Four ranks' lines that differ only in their numbers, folded into one line that names the rank that stands
out, as a learner sees it in JupyterLab and in the classic notebook (the ``notebook`` package's
page, /notebooks/...). A step of the browser session: the session's server serves both pages, and chromium.

"The classic notebook" here is Notebook 7's /notebooks/ page (Notebook 7 is built on JupyterLab's
components), not the pre-7 classic frontend, which this session does not serve. The setup cell widens
``collapse.WINDOW_S`` to 60 s, so the default 0.5 s window is never exercised in a browser (nor in the kernel test,
tests/test_torchrun_output.py, which widens it too): the window is tested on the Collapser alone, with the
clock the test gives it (tests/test_rank_output.py).
"""

from __future__ import annotations

import re
import secrets

import pytest
from test_widgets_in_lab import write_notebook

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
PAGE_TIMEOUT = 90_000  # ms, as conftest.py's: loading the page's bundle in a software-rendered browser

SETUP = """%load_ext ppkit
from ppkit.cluster.output import collapse
collapse.WINDOW_S = 60.0  # a loaded machine's ranks print seconds apart; the test is about the folded line
"""
FOUR_RANKS = """%%torchrun --nproc-per-node 4
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
print(f"step 10 loss {[2.31, 2.31, 2.91, 2.31][rank]}")
print("loss", "nan" if rank == 3 else "finite")
"""
# three equal losses and one that stands out: values more than 10% apart are never spread (fold.py's REL_TOL),
# so three near ones beside an outlier would stay four lines; equal ones fold and name the outlier
FOLDED = "[ranks 0-3] step 10 loss 2.31 (rank 2: 2.91)"
# notebook 7.6.5's page throws these itself as it starts, before any cell runs: the first on a bare
# `python -m notebook` serving a one-cell notebook, nothing of ppkit's imported (its shortcuts plugin reads
# the schema of a plugin it does not have); the second from its file browser's restore, whose command the
# notebook page does not register
NOTEBOOK_PAGE_OWN = {"uncaught: Cannot read properties of undefined (reading 'schema')",
                     "uncaught: Command 'filebrowser:open-path' not registered."}


def _output_lines(nb) -> list[str]:
    cell = nb.page.locator(".jp-Notebook .jp-CodeCell").nth(1)
    area = cell.locator(".jp-OutputArea")
    area.get_by_text("loss nan").wait_for(timeout=60_000)
    return area.inner_text().splitlines()


def _assert_folded(nb, lines: list[str]) -> None:
    assert FOLDED in lines, lines
    assert "[ranks 0-2] loss finite" in lines and "[rank 3] loss nan" in lines, lines
    assert not any(re.match(r"\[rank \d\] step 10", line) for line in lines), lines
    nb.screenshot("folded", nb.page.locator(".jp-Notebook .jp-CodeCell").nth(1))
    nb.assert_console_clean()


def test_folded_lines_read_the_same_in_jupyterlab_and_the_classic_notebook(lab, browser, open_notebook,
                                                                          notebook_class):
    in_lab = open_notebook(write_notebook(lab.notebook_dir, "rank_output_lab.ipynb", SETUP, FOUR_RANKS))
    in_lab.run_all(timeout=300)
    _assert_folded(in_lab, _output_lines(in_lab))

    name = write_notebook(lab.notebook_dir, "rank_output_classic.ipynb", SETUP, FOUR_RANKS)
    context = browser.new_context(viewport={"width": 1400, "height": 1800})
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        classic = notebook_class(page, lab, name, f"classic-{secrets.token_hex(2)}")
        page.on("console", lambda m: m.type == "error" and classic.console_errors.append(m.text))
        page.on("pageerror", lambda e: classic.console_errors.append(f"uncaught: {e}"))
        page.goto(f"{lab.url}/notebooks/{name}?token={lab.token}", timeout=PAGE_TIMEOUT)
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=PAGE_TIMEOUT)
        assert "/lab" not in page.url, page.url  # the classic notebook's own page, not JupyterLab's
        classic.wait_kernel_idle(timeout=PAGE_TIMEOUT / 1000)
        unknown = [e for e in classic.console_errors if e not in NOTEBOOK_PAGE_OWN]
        assert not unknown, f"the classic notebook's page, as it opened: {unknown}"
        classic.console_errors.clear()  # what follows must leave the console clean
        classic.run_all(timeout=300)
        _assert_folded(classic, _output_lines(classic))
    finally:
        context.close()
