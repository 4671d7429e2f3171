"""Widgets as a learner sees them: each widget notebook opened in JupyterLab in chromium, run, and used.

A notebook with a learner test below is trimmed to the cells its widget stands on (keep_only: its setup,
the widget, what closes them); nbval runs every cell of every notebook, so the rest runs there once.

nbval cannot see widgets (model ids are random and the front end is not there), so this is the only check
that a learner gets working widgets rather than "Error displaying widget: model not found".
"""

from __future__ import annotations

import json
import re

import nbformat
import psutil
import pytest

# Notebooks with a learner test below; test_every_widget_notebook_has_a_learner_test_here checks the list.
LEARNER_TESTED = {"02_collectives.ipynb", "06_pipeline.ipynb", "08b_step_memory.ipynb", "08c_step_speed.ipynb",
                  "09_sharded_data_parallel.ipynb", "10_tensor_parallel.ipynb", "10b_overlap.ipynb",
                  "11_context_parallel.ipynb",
                  "12_expert_parallel.ipynb", "13_composition.ipynb"}

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # slow: make test-fast leaves it out

SMOKE_CODE = """\
import ipywidgets as widgets

size = widgets.IntSlider(value=3, min=1, max=10, description="size", _dom_classes=["smoke-size"])
square = widgets.Button(description="Square it", _dom_classes=["smoke-square"])
result = widgets.HTML("<b>not yet</b>", _dom_classes=["smoke-result"])

def on_square(_):
    result.value = f"<b>{size.value} squared is {size.value ** 2}</b>"

square.on_click(on_square)
widgets.VBox([size, square, result])
"""


# What a learner's notebook shows when the front end has no model for a widget: the kernel-side view of
# "Error displaying widget: model not found".
MISSING_MODEL_CODE = """\
from IPython.display import display

view = {"model_id": "0123456789abcdef0123456789abcdef", "version_major": 2, "version_minor": 0}
display({"application/vnd.jupyter.widget-view+json": view, "text/plain": "IntSlider(value=3)"}, raw=True)
"""

# A process that outlives its kernel, as a worker would if its clean-up failed.
STRAY_PROCESS_CODE = """\
import subprocess, sys

stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(stray.pid)
"""


def write_notebook(directory, name: str, *code: str) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Written by the browser tests")]
    nb.cells += [nbformat.v4.new_code_cell(c) for c in code]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nbformat.write(nb, directory / name)
    return name


def test_widget_round_trip(lab, open_notebook):
    """A slider and a button: front end -> kernel -> front end, the path every ppkit widget depends on."""
    nb = open_notebook(write_notebook(lab.notebook_dir, "browser_smoke.ipynb", SMOKE_CODE))
    nb.run_all(timeout=120)
    assert nb.assert_ran_cleanly_and_widgets_render() == 1
    page = nb.page
    result = page.locator(".smoke-result")
    assert result.inner_text() == "not yet"

    handle = page.locator(".smoke-size [role=slider]")
    handle.focus()
    handle.press("ArrowRight")
    handle.press("ArrowRight")
    assert page.locator(".smoke-size .widget-readout").inner_text() == "5"
    page.locator(".smoke-square").click()
    page.get_by_text("5 squared is 25").wait_for(timeout=30_000)
    nb.screenshot("after-click", page.locator(".jp-Cell-outputArea").first)
    nb.assert_console_clean()


TORCHRUN_SCRIPT = """%%torchrun --nproc-per-node 2 -- --greeting hello
import argparse
import logging

import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--greeting")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    logging.info("%s from rank %d of %d", args.greeting, dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""
TORCHRUN_FAILS = """%%torchrun --nproc-per-node 2
import os
import torch.distributed as dist

dist.init_process_group("gloo")
if os.environ["RANK"] == "1":
    raise ValueError("rank 1 cannot go on")
dist.barrier()
"""

TORCHRUN_TQDM = """%%torchrun --nproc-per-node 2
import os, time
from tqdm import tqdm

for step in tqdm(range(12), mininterval=0, desc="train"):
    if step == 6:  # half way: wait until the test has looked
        while not os.path.exists("tqdm-go"):
            time.sleep(0.1)
    time.sleep(0.1)
print("trained")
"""
PROGRESS = re.compile(r"^\[rank (\d)\] train: +\d+%.*\| (\d+)/12 ", re.M)


def test_a_torchrun_cell_as_the_learner_sees_it(lab, open_notebook, tmp_path):
    """%%torchrun in real JupyterLab: each rank's output (logging's too) under the cell, labelled; a failing rank's
    error names the rank and shows the cell's own line; the others are stopped and the kernel stays usable; a
    tqdm bar on each of 2 ranks is one line per rank, redrawn in place while the cell runs."""
    name = write_notebook(lab.notebook_dir, "torchrun_cell.ipynb", "%load_ext ppkit", TORCHRUN_SCRIPT, TORCHRUN_FAILS,
                          TORCHRUN_TQDM)
    nb = open_notebook(name)
    nb.run_all(timeout=180, hold_back_last=True)
    cells = nb.page.locator(".jp-CodeCell")
    said = cells.nth(1).locator(".jp-OutputArea").inner_text()
    assert "[ranks 0-1] INFO hello from rank 0…1 of 2" in said or all(  # folded (cluster/output/fold.py), or not
        f"[rank {rank}] INFO hello from rank {rank} of 2" in said for rank in (0, 1)), said
    error = cells.nth(2).locator(".jp-OutputArea").inner_text()
    nb.screenshot("rank-error", cells.nth(2))
    assert "ProcessRaisedError" in error and "rank 1 of 2" in error, error
    assert "ValueError: rank 1 cannot go on" in error and 'raise ValueError("rank 1 cannot go on")' in error, error
    assert "rank 0 is waiting here" in error and "dist.barrier()" in error, error

    bars = cells.nth(3)
    nb.run_last_cell(wait=False)
    output = bars.locator(".jp-OutputArea")
    nb.page.wait_for_function("el => (el.innerText.match(/\\| 6\\/12 /g) || []).length == 2",
                              arg=output.element_handle(), timeout=120_000)
    running = output.inner_text()
    bars.screenshot(path=str(tmp_path / "tqdm-running.png"))
    (lab.notebook_dir / "tqdm-go").touch()
    nb.page.wait_for_function("el => el.innerText.includes('trained')", arg=output.element_handle(), timeout=120_000)
    nb.wait_kernel_idle()
    ended = output.inner_text()
    bars.screenshot(path=str(tmp_path / "tqdm-ended.png"))
    assert sorted(PROGRESS.findall(running)) == [("0", "6"), ("1", "6")], running  # two lines, half way
    assert sorted(PROGRESS.findall(ended)) == [("0", "12"), ("1", "12")], ended  # the same two lines, redrawn
    assert "trained" in ended and "Error" not in ended, ended
    nb.assert_console_clean()


def test_checks_catch_what_they_exist_for(lab, open_notebook):
    """The render check and the leftover-process check must fail on the breakage they exist for."""
    name = write_notebook(lab.notebook_dir, "browser_broken.ipynb", MISSING_MODEL_CODE, STRAY_PROCESS_CODE)
    nb = open_notebook(name)
    nb.run_all(timeout=120)
    with pytest.raises(AssertionError, match="Error displaying widget: model not found"):
        nb.assert_ran_cleanly_and_widgets_render()
    nb.screenshot("caught", nb.page.locator(".jp-Cell-outputArea").first)
    nb.console_errors.clear()  # the widget manager logs the missing model; expected here

    saved = nbformat.read(lab.notebook_dir / name, as_version=4)
    stray = psutil.Process(int(saved.cells[2].outputs[0]["text"]))
    try:
        left = lab.shutdown_kernels(timeout=5)
        assert any(entry.startswith(f"{stray.pid} ") for entry in left), left
    finally:
        stray.kill()
        stray.wait(5)


def test_every_widget_notebook_has_a_learner_test_here(widget_notebook_names):
    """Each notebook that shows widgets is opened and played with below (nbval cannot see a widget render)."""
    missing = sorted(set(widget_notebook_names) - LEARNER_TESTED)
    assert not missing, (f"{missing} show widgets but have no browser test: add one below (see test_zero_explorer "
                         "for the shape) and add the notebook to LEARNER_TESTED")


def keep_only(notebook_dir, name: str, keep: tuple[str, ...]) -> None:
    """Trim the lab's copy of notebook ``name`` to its first and last code cells, the code cells that match
    one of the ``keep`` patterns (regular expressions, each must match a cell) and every markdown cell.

    nbval runs every cell of every notebook already; a browser test needs only the cells its widget stands
    on (the setup that starts the cluster, the widget, what closes them), taken from the notebook itself so
    that the browser still runs the learner's code, under the notebook's own name.
    """
    path = notebook_dir / name
    nb = json.loads(path.read_text())
    code = {i: "".join(c["source"]) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"}
    matched = {p: {i for i, source in code.items() if re.search(p, source, re.MULTILINE)} for p in keep}
    missing = [p for p, cells in matched.items() if not cells]
    assert not missing, f"{name}: no code cell matches {missing}; the browser test names cells that are gone"
    wanted = {min(code), max(code)}.union(*matched.values())
    nb["cells"] = [c for i, c in enumerate(nb["cells"]) if i not in code or i in wanted]
    path.write_text(json.dumps(nb))


def _open_and_run(lab, open_notebook, name: str, keep: tuple[str, ...], **run_options):
    """Open a notebook of the course trimmed to the cells in ``keep`` (see keep_only), run it and check its
    widgets; skip if this checkout lacks it."""
    if not (lab.notebook_dir / name).exists():
        pytest.skip(f"notebooks/{name} is not in this checkout")
    keep_only(lab.notebook_dir, name, keep)
    nb = open_notebook(name)
    nb.run_all(**run_options)
    nb.assert_ran_cleanly_and_widgets_render()
    return nb


def _image_sources(locator) -> list[str]:
    return locator.locator("img").evaluate_all("imgs => imgs.map(i => i.src)")


def _set_slider(page, slider, value: int) -> None:
    """Move an ipywidgets slider with the keyboard, as a learner without a mouse would."""
    handle = slider.locator("[role=slider]")
    readout = slider.locator(".widget-readout")
    handle.focus()
    for _ in range(20):
        current = int(readout.inner_text())
        if current == value:
            return
        handle.press("ArrowRight" if current < value else "ArrowLeft")
    raise AssertionError(f"slider stuck at {readout.inner_text()}, wanted {value}")


def _assert_shows_image(output) -> None:
    """A plot in a widget's Output must arrive as an image, not as "<Figure size ...>" text."""
    try:
        output.locator("img").first.wait_for(timeout=30_000)
    except Exception as e:  # playwright's TimeoutError; the message below says more
        raise AssertionError(f"no image in the plot area; it shows: {output.inner_text()[:300]!r}") from e


def test_collectives_explorer(lab, open_notebook):
    """02_collectives: pick another collective and world size; the summary and the picture follow."""
    nb = _open_and_run(lab, open_notebook, "02_collectives.ipynb", (r"^CollectivesExplorer\(",), timeout=240)
    page = nb.page
    explorer = page.locator(".ppkit-collectives").first
    explorer.scroll_into_view_if_needed()
    op = explorer.locator(".ppkit-collectives-op select")
    world = explorer.locator(".ppkit-collectives-world-size")
    summary = explorer.locator(".ppkit-collectives-summary")
    picture = explorer.locator(".ppkit-collectives-output")
    _assert_shows_image(picture)
    nb.screenshot("before", explorer)
    before_op = op.input_value()
    before_world = int(world.locator(".widget-readout").inner_text())
    before_images = _image_sources(picture)
    assert f"{before_op}" in summary.inner_text() and f"{before_world} ranks" in summary.inner_text()

    new_op = "all_gather" if before_op != "all_gather" else "broadcast"
    new_world = 6 if before_world != 6 else 3
    op.select_option(new_op)
    _set_slider(page, world, new_world)
    # The kernel redraws on each change; wait for the summary of the final choice, bounded.
    page.wait_for_function(
        "([el, op, n]) => el.innerText.includes(op) && el.innerText.includes(n + ' ranks')",
        arg=[summary.element_handle(), new_op, new_world],
        timeout=60_000,
    )
    nb.wait_kernel_idle()
    text = summary.inner_text()
    assert before_op not in text.split(",")[0], text
    ranks_listed = re.findall(r"rank (\d+):", text)
    assert ranks_listed == [str(r) for r in range(new_world)], text
    after_images = _image_sources(picture)
    assert after_images and after_images != before_images, "the picture did not change with the settings"
    nb.screenshot("after", explorer)
    nb.assert_console_clean()


def _table_rows(table) -> list[dict]:
    """The results table as one {header: cell text} dict per row."""
    return table.evaluate(
        """el => {
            const rows = [...el.querySelectorAll('tr')];
            if (!rows.length) return [];
            const heads = [...rows[0].querySelectorAll('th')].map(th => th.innerText.trim());
            return rows.slice(1).map(tr => Object.fromEntries(
                [...tr.querySelectorAll('td')].map((td, i) => [heads[i], td.innerText.trim()])));
        }"""
    )


def _pick_other(select, current: str, avoid: str) -> str:
    """Another option than `current`, preferring one that is not `avoid`."""
    options = select.locator("option").all_inner_texts()
    others = sorted((o.strip() for o in options if o.strip() != current), key=lambda o: o == avoid)
    assert others, f"only one choice ({options}); nothing to change"
    return others[0]


def test_pipeline_widget(lab, open_notebook):
    """06_pipeline: a new micro-batch size, a shard moved to another process, Run: table and plots follow."""
    # The last cell closes the RPC world the widget trains on: play first, as a learner would, then close.
    nb = _open_and_run(lab, open_notebook, "06_pipeline.ipynb", (r"build_model\(config\)", r"PipelineWidget\("),
                       timeout=360, hold_back_last=True)
    page = nb.page
    ui = page.locator(".ppkit-pipeline").first
    ui.scroll_into_view_if_needed()
    slider = ui.locator(".ppkit-pipeline-microbatch")
    shard = ui.locator(".ppkit-pipeline-process-1 select")
    status = ui.locator(".ppkit-pipeline-status")
    table = ui.locator(".ppkit-pipeline-table")
    plots = ui.locator(".ppkit-pipeline-sweep-plot, .ppkit-pipeline-timeline-plot")
    nb.screenshot("before", ui)

    batch = int(ui.locator(".ppkit-pipeline-batch-size input").input_value())
    size = int(slider.locator(".widget-readout").inner_text())
    new_size = next(s for s in (8, 2, 16, 1, 4) if s != size and s <= batch)
    expected_count = -(-batch // new_size)
    old_process = shard.input_value()
    # Another worker rather than the kernel ("master"), whose shard would also compete with the kernel.
    new_process = _pick_other(shard, old_process, avoid="master")
    other_shards = [
        s.input_value() for s in ui.locator("[class*='ppkit-pipeline-process-'] select").all()[1:]
    ]
    before_plots = plots.evaluate_all("imgs => imgs.map(i => i.src)")

    _set_slider(page, slider, new_size)
    shard.select_option(new_process)
    counted = ui.locator(".ppkit-pipeline-num-microbatches")
    page.wait_for_function(
        "([el, n]) => el.innerText.includes('= ' + n + ' micro-batch')",
        arg=[counted.element_handle(), expected_count],
        timeout=30_000,
    )
    nb.wait_kernel_idle()
    # Record every status line, so a passing "building the shards on ..." message is not missed.
    status.evaluate(
        """el => { window.ppkitStatus = [el.innerText];
                   new MutationObserver(() => window.ppkitStatus.push(el.innerText))
                       .observe(el, {subtree: true, childList: true, characterData: true}); }"""
    )
    ui.locator("button.ppkit-pipeline-run").click()
    page.wait_for_function(
        "el => /^done|Error/.test(el.innerText.trim())", arg=status.element_handle(), timeout=300_000
    )
    nb.wait_kernel_idle(timeout=120)
    final = status.inner_text().strip()
    assert final.startswith("done"), f"Run failed: {final}"

    rows = _table_rows(table)
    # A new placement is a new model: the earlier rows are gone and the one row is the new setting.
    assert [r["micro-batch size"] for r in rows] == [str(new_size)], rows
    assert rows[0]["micro-batches"] == str(expected_count), rows
    assert float(rows[0]["s / batch"]) > 0, rows
    seen = " | ".join(page.evaluate("window.ppkitStatus"))
    placed = [f"{new_process}:cpu", *(f"{p}:cpu" for p in other_shards)]
    assert all(p in seen for p in placed), f"status never named the placement {placed}: {seen}"
    after_plots = plots.evaluate_all("imgs => imgs.map(i => i.src)")
    assert len(after_plots) == 2 and all(src.startswith("blob:") or "base64" in src for src in after_plots)
    assert all(a != b for a, b in zip(after_plots, before_plots)), "the plots did not change"
    sizes = plots.evaluate_all("imgs => imgs.map(i => [i.naturalWidth, i.naturalHeight])")
    assert all(w > 100 and h > 100 for w, h in sizes), f"plots are empty images: {sizes}"
    nb.screenshot("after", ui)
    nb.assert_console_clean()

    nb.run_last_cell()
    nb.assert_ran_cleanly_and_widgets_render()


def _explore(nb, css: str, change, expect: str) -> None:
    """Change an explorer's controls as a learner would; its summary and its picture must follow."""
    page = nb.page
    explorer = page.locator(f".{css}").first
    explorer.scroll_into_view_if_needed()
    summary, picture = explorer.locator(f".{css}-summary"), explorer.locator(f".{css}-output")
    _assert_shows_image(picture)
    nb.screenshot("before", explorer)
    before_text, before_images = summary.inner_text(), _image_sources(picture)
    change(page, explorer)
    page.wait_for_function("([el, text]) => el.innerText.includes(text)",
                           arg=[summary.element_handle(), expect], timeout=60_000)
    nb.wait_kernel_idle()
    assert summary.inner_text() != before_text
    after_images = _image_sources(picture)
    assert after_images and after_images != before_images, "the picture did not change with the settings"
    nb.screenshot("after", explorer)
    nb.assert_console_clean()


def test_step_memory_explorer(lab, open_notebook):
    """08b_step_memory: full recomputation and a micro-batch of 2 measure another step; summary and picture follow."""
    nb = _open_and_run(lab, open_notebook, "08b_step_memory.ipynb", (r"^StepMemoryExplorer\(",), timeout=300)

    def change(page, explorer):
        explorer.locator(".ppkit-step-recompute select").select_option("full")
        _set_slider(page, explorer.locator(".ppkit-step-microbatch"), 2)

    _explore(nb, "ppkit-step", change, "s = 128, micro-batch 2, 1 accumulation step(s), recompute full")


def test_step_speed_explorer(lab, open_notebook):
    """08c_step_speed: full recomputation at s = 64 times other steps; the summary and the MFU/HFU bars follow."""
    nb = _open_and_run(lab, open_notebook, "08c_step_speed.ipynb",
                       (r"^peak = sf\.measure_peak\(", r"^StepSpeedExplorer\(", r"^def predict_mfu\("), timeout=300)

    def change(page, explorer):
        explorer.locator(".ppkit-speed-recompute select").select_option("full")
        explorer.locator(".ppkit-speed-seq-len select").select_option("64")

    _explore(nb, "ppkit-speed", change, "s = 64, micro-batch 4, recompute full, eager")


def test_zero_explorer(lab, open_notebook):
    """09_sharded_data_parallel: another stage and world size; summary and picture follow."""
    nb = _open_and_run(lab, open_notebook, "09_sharded_data_parallel.ipynb",
                       (r"^ZeroExplorer\(", r"^bare = ppkit\.Cluster\("), timeout=300)

    def change(page, explorer):
        explorer.locator(".ppkit-zero-stage select").select_option(label="ZeRO-3 / FSDP")
        _set_slider(page, explorer.locator(".ppkit-zero-world-size"), 4)

    # 7B parameters on 4 ranks with ZeRO-3: (4 + 4 + 8) x 7e9 / 4 = 28 GB per rank
    _explore(nb, "ppkit-zero", change, "ZeRO-3 / FSDP, 4 ranks, 7,000,000,000 parameters: each rank holds 28 GB")


def test_tensor_parallel_explorer(lab, open_notebook):
    """10_tensor_parallel: another TP degree and width; summary and picture follow."""
    nb = _open_and_run(lab, open_notebook, "10_tensor_parallel.ipynb",
                       (r"^TensorParallelExplorer\(", r"^bare = ppkit\.Cluster\("), timeout=300)

    def change(page, explorer):
        explorer.locator(".ppkit-tp-d-model select").select_option("768")
        _set_slider(page, explorer.locator(".ppkit-tp-degree"), 4)

    _explore(nb, "ppkit-tp", change, "TP degree 4, MLP 768 -> 3072 -> 768")


def test_overlap_explorer(lab, open_notebook):
    """10b_overlap: buckets of 0.05 MiB measure another DDP step (summary and timeline follow), then FSDP2."""
    # The last cell closes the cluster the explorer measures on: play first, as a learner would, then close.
    nb = _open_and_run(lab, open_notebook, "10b_overlap.ipynb", (r"^OverlapExplorer\(",), timeout=300,
                       hold_back_last=True)

    def change(page, explorer):
        explorer.locator(".ppkit-overlap-bucket-cap select").select_option("0.05")

    _explore(nb, "ppkit-overlap", change, "DDP, bucket_cap_mb=0.05, rank 0")
    explorer = nb.page.locator(".ppkit-overlap").first
    explorer.locator(".ppkit-overlap-what button", has_text="FSDP2").click()
    nb.page.wait_for_function("([el, text]) => el.innerText.includes(text)",
                              arg=[explorer.locator(".ppkit-overlap-summary").element_handle(),
                                   "all-gathers per step"], timeout=60_000)
    nb.wait_kernel_idle()
    nb.screenshot("fsdp2", explorer)
    nb.assert_console_clean()

    nb.run_last_cell()
    nb.assert_ran_cleanly_and_widgets_render()


def test_context_parallel_explorer(lab, open_notebook):
    """11_context_parallel: contiguous sharding on 2 ranks runs the ring again (summary and timeline follow);
    3 ranks with 4096 tokens is refused in the summary, and 3072 tokens then runs on the same cluster."""
    # The last cell closes the cluster the explorer measures on: play first, as a learner would, then close.
    nb = _open_and_run(lab, open_notebook, "11_context_parallel.ipynb", (r"^RingAttentionExplorer\(",),
                       timeout=300, hold_back_last=True)

    def change(page, explorer):
        explorer.locator(".ppkit-cp-sharding select").select_option("contiguous")
        _set_slider(page, explorer.locator(".ppkit-cp-ranks"), 2)

    _explore(nb, "ppkit-cp", change, "contiguous, causal, 4096 tokens over 2 ranks")
    page = nb.page
    explorer = page.locator(".ppkit-cp").first
    summary = explorer.locator(".ppkit-cp-summary")
    _set_slider(page, explorer.locator(".ppkit-cp-ranks"), 3)
    page.wait_for_function("el => el.innerText.includes('Not run')", arg=summary.element_handle(), timeout=60_000)
    assert "sequence length 4096 cannot be cut into 3 equal chunks, one per rank; pick a multiple of 3" \
        in summary.inner_text()
    nb.screenshot("refused", explorer)
    explorer.locator(".ppkit-cp-seq-len select").select_option("3072")
    page.wait_for_function("el => el.innerText.includes('contiguous, causal, 3072 tokens over 3 ranks')",
                           arg=summary.element_handle(), timeout=60_000)
    nb.wait_kernel_idle()
    nb.screenshot("after-refusal", explorer)
    nb.assert_console_clean()

    nb.run_last_cell()
    nb.assert_ran_cleanly_and_widgets_render()


def test_expert_parallel_explorer(lab, open_notebook):
    """12_expert_parallel: router skew 2 and top-1 run the layer again (summary and pictures follow); 6 experts
    on 4 ranks is refused in the summary, and 3 ranks then runs on the same cluster."""
    # The last cell closes the cluster the explorer measures on: play first, as a learner would, then close.
    nb = _open_and_run(lab, open_notebook, "12_expert_parallel.ipynb", (r"^MoEExplorer\(",),
                       timeout=300, hold_back_last=True)

    def change(page, explorer):
        skew = explorer.locator(".ppkit-moe-skew [role=slider]")
        skew.focus()
        for _ in range(4):  # 0.5 per step: skew 2
            skew.press("ArrowRight")
        _set_slider(page, explorer.locator(".ppkit-moe-top-k"), 1)

    _explore(nb, "ppkit-moe", change, "8 experts over 4 ranks, top-1, capacity factor 1.25, skew 2")
    page = nb.page
    explorer = page.locator(".ppkit-moe").first
    summary = explorer.locator(".ppkit-moe-summary")
    explorer.locator(".ppkit-moe-experts select").select_option("6")
    page.wait_for_function("el => el.innerText.includes('Not run')", arg=summary.element_handle(), timeout=60_000)
    assert ("6 experts cannot be spread evenly over 4 ranks; pick a number of experts that is a multiple of 4 "
            "(such as 4 or 8), or a number of ranks that divides 6 (1, 2, 3, 6).") in summary.inner_text()
    nb.screenshot("refused", explorer)
    _set_slider(page, explorer.locator(".ppkit-moe-ranks"), 3)
    page.wait_for_function("el => el.innerText.includes('6 experts over 3 ranks, top-1')",
                           arg=summary.element_handle(), timeout=60_000)
    nb.wait_kernel_idle()
    nb.screenshot("after-refusal", explorer)
    nb.assert_console_clean()

    nb.run_last_cell()
    nb.assert_ran_cleanly_and_widgets_render()


def test_mesh_explorer(lab, open_notebook):
    """13_composition: 1x2x4 (measured in section 6) is drawn (summary and pictures follow); 2x2x4 is refused in
    the summary, with the meshes that work, and 1x2x2 on a world of 4 then runs on the same cluster."""
    # The last cell closes the cluster the explorer measures on: play first, as a learner would, then close.
    nb = _open_and_run(lab, open_notebook, "13_composition.ipynb",
                       (r"^m = mc\.measure\(", r"^layouts = ", r"^MeshExplorer\("), timeout=600, hold_back_last=True)

    def change(page, explorer):
        explorer.locator(".ppkit-mesh-tp select").select_option("4")
        explorer.locator(".ppkit-mesh-dp select").select_option("1")

    # tp=4 first: 2x2x4 is refused on the way, then dp=1 makes it 1x2x4
    _explore(nb, "ppkit-mesh", change, "1x2x4 (dp shards: FSDP2) on 8 ranks: loss")
    page = nb.page
    explorer = page.locator(".ppkit-mesh").first
    summary = explorer.locator(".ppkit-mesh-summary")
    explorer.locator(".ppkit-mesh-dp select").select_option("2")
    page.wait_for_function("el => el.innerText.includes('Not run')", arg=summary.element_handle(), timeout=60_000)
    assert ("mesh 2x2x4 has 16 ranks, but the world has 8: dp x pp x tp must equal the world size. Meshes "
            "(dp x pp x tp) that work for 8 ranks: 1x2x4, 1x4x2, 2x1x4, 2x2x2, 2x4x1, 4x1x2, 4x2x1.") \
        in summary.inner_text()
    nb.screenshot("refused", explorer)
    explorer.locator(".ppkit-mesh-dp select").select_option("1")
    explorer.locator(".ppkit-mesh-world-size select").select_option("4")  # 1x2x4 on 4 ranks: refused
    explorer.locator(".ppkit-mesh-tp select").select_option("2")  # 1x2x2: not measured before, runs now
    page.wait_for_function("el => el.innerText.includes('1x2x2 (dp shards: FSDP2) on 4 ranks: loss')",
                           arg=summary.element_handle(), timeout=300_000)
    assert "Activations kept (most on one rank)" in summary.inner_text()
    nb.wait_kernel_idle()
    nb.screenshot("after-refusal", explorer)
    nb.assert_console_clean()

    nb.run_last_cell()
    nb.assert_ran_cleanly_and_widgets_render()
