"""A profile as a learner sees it in JupyterLab (issue 40): ``%%torchrun --profile``'s value drawn as one
timeline of both ranks, with nothing loaded from the network, and a hover that names an op and its duration.
A step of the browser session: the session's JupyterLab and chromium (conftest.py)."""

from __future__ import annotations

import pytest
from test_widgets_in_lab import write_notebook

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

PROFILED_STEP = """%%torchrun --nproc-per-node 2 --profile
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
for _ in range(2):
    model(torch.randn(64, 256)).sum().backward()
"""


def test_the_profile_timeline_renders_and_hovers(lab, open_notebook, tmp_path):
    name = write_notebook(lab.notebook_dir, "profile_timeline.ipynb", "%load_ext ppkit", PROFILED_STEP)
    nb = open_notebook(name)
    nb.run_all(timeout=240)
    cell = nb.page.locator(".jp-CodeCell").nth(1)
    plot = cell.locator(".ppkit-timeline .main-svg").first
    plot.wait_for(timeout=60_000)
    ticks = cell.locator(".ppkit-timeline .ytick").all_text_contents()  # SVG text: no innerText
    assert any(t.startswith("rank 0") for t in ticks) and any(t.startswith("rank 1") for t in ticks), ticks
    # hover over the widest bar: plotly's label gives the op's name and its duration
    bars = cell.locator(".ppkit-timeline .barlayer .point path")
    assert bars.count() > 10
    widths = bars.evaluate_all("els => els.map(e => e.getBoundingClientRect().width)")
    widest = bars.nth(max(range(len(widths)), key=widths.__getitem__))
    widest.scroll_into_view_if_needed()
    box = widest.bounding_box()  # plotly's drag layer lies over the bars and takes the pointer: move the mouse
    nb.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    label = cell.locator(".ppkit-timeline .hoverlayer .hovertext")
    label.first.wait_for(timeout=30_000)
    said = label.first.text_content()
    assert "µs" in said and ("::" in said or ":" in said), said
    shot = tmp_path / "profile-timeline-hover.png"
    cell.screenshot(path=str(shot))
    nb.screenshot("profile-timeline-hover", cell)
    print(f"screenshot: {shot}")
    nb.assert_console_clean()  # nothing reached outside loopback, no console errors
