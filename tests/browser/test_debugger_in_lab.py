"""pdb on a rank as a learner meets it in JupyterLab in chromium: notebook 00's pdb cell shows an input box
under the cell, `p x` there prints rank 1's value, and `c` finishes the job with its result.

The learner runs the cells the pdb cell stands on (the imports and checks, ``ppkit.start``), then the pdb cell
itself (nbval skips it: it needs these answers).
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]  # slow: make test-fast leaves it out

NOTEBOOK = "00_start_here.ipynb"


def _code_cell(nb, text: str):
    cell = nb.page.locator(".jp-Notebook .jp-CodeCell").filter(
        has=nb.page.locator(".jp-InputArea-editor", has_text=text))
    assert cell.count() == 1, text
    return cell


def _run(nb, cell, wait: bool = True) -> None:
    """Click into the cell and press Ctrl+Enter (run, stay on the cell); wait for its count unless told not to."""
    before = cell.locator(".jp-InputPrompt").inner_text()
    editor = cell.locator(".cm-content")
    editor.scroll_into_view_if_needed()
    editor.click()
    nb.page.keyboard.press("Control+Enter")
    if wait:
        nb.page.wait_for_function(
            "([el, before]) => /\\[\\d+\\]/.test(el.innerText) && el.innerText !== before",
            arg=[cell.locator(".jp-InputPrompt").element_handle(), before], timeout=180_000)


def _answer(nb, cell, prompt: str, line: str, asked: int) -> None:
    """Type ``line`` into the input box that shows ``prompt``, after ``asked`` answered ones, and press Enter."""
    box = cell.locator(".jp-Stdin-input").nth(asked)  # answered prompts keep their box: the new one is last
    box.wait_for(state="visible", timeout=60_000)
    assert prompt in cell.locator(".jp-Stdin-prompt").nth(asked).inner_text()
    box.fill(line)
    box.press("Enter")


def test_a_learner_steps_through_rank_1_in_the_input_box(lab, open_notebook):
    if not (lab.notebook_dir / NOTEBOOK).exists():
        pytest.skip(f"notebooks/{NOTEBOOK} is not in this checkout")
    nb = open_notebook(NOTEBOOK)
    _run(nb, _code_cell(nb, "from ppkit.preflight import run_in_subprocess"))
    _run(nb, _code_cell(nb, "cluster = ppkit.start(4)"))
    pdb_cell = _code_cell(nb, "def look_at_rank_1(")
    _run(nb, pdb_cell, wait=False)

    _answer(nb, pdb_cell, "(Pdb rank 1)", "p x", asked=0)
    output = pdb_cell.locator(".jp-OutputArea")
    nb.page.wait_for_function("el => el.innerText.includes('tensor([1.])')", arg=output.element_handle(),
                              timeout=60_000)
    nb.screenshot("at_the_prompt", pdb_cell)
    _answer(nb, pdb_cell, "(Pdb rank 1)", "c", asked=1)
    nb.page.wait_for_function("el => el.innerText.includes('[60.0, 60.0, 60.0, 60.0]')",
                              arg=output.element_handle(), timeout=60_000)
    nb.wait_kernel_idle()
    shown = output.inner_text()
    assert "rank 1 stopped at" in shown and "[60.0, 60.0, 60.0, 60.0]" in shown, shown
    assert "Error" not in shown, shown
    _run(nb, _code_cell(nb, "cluster.close()"))
