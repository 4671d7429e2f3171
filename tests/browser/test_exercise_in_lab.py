"""An exercise as a learner does it, in JupyterLab in chromium: run the stub, a wrong answer, a right one.

Notebook 00's exercise (``my_share``) needs nothing from the cells above it (its check imports
``workbook`` and runs in the kernel), so the test runs only the exercise cell and its check, as a
learner coming back to the exercise would.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # slow: make test-fast leaves it out

NOTEBOOK = "00_start_here.ipynb"

WRONG = '''def my_share(rank, world_size, num_items):
    """Return the list of item numbers (from range(num_items)) that this rank handles."""
    return list(range(num_items)) if rank == 0 else []
'''

RIGHT = '''def my_share(rank, world_size, num_items):
    """Return the list of item numbers (from range(num_items)) that this rank handles."""
    return list(range(rank, num_items, world_size))
'''


def _cells(nb):
    exercise = nb.page.locator(".jp-Notebook .jp-CodeCell").filter(
        has=nb.page.locator(".jp-InputArea-editor", has_text="def my_share("))
    check = nb.page.locator(".jp-Notebook .jp-CodeCell").filter(
        has=nb.page.locator(".jp-InputArea-editor", has_text='workbook.check("my_share"'))
    assert exercise.count() == 1 and check.count() == 1
    return exercise, check


def _type_answer(nb, exercise, text: str) -> None:
    """Click into the cell, select what is there and put the answer in its place (as a paste does:
    typing key by key would add the editor's auto-indentation to ours)."""
    editor = exercise.locator(".cm-content")
    editor.scroll_into_view_if_needed()
    editor.click()
    nb.page.keyboard.press("Control+a")
    nb.page.keyboard.insert_text(text)
    assert "def my_share(" in editor.inner_text()


def _run_both(nb, exercise, check) -> str:
    """Shift+Enter in the exercise cell, Shift+Enter again on the check cell below it; its output."""
    count_before = check.locator(".jp-InputPrompt").inner_text()
    exercise.locator(".cm-content").click()
    nb.page.keyboard.press("Shift+Enter")
    nb.page.keyboard.press("Shift+Enter")
    nb.page.wait_for_function(
        "([el, before]) => /\\[\\d+\\]/.test(el.innerText) && el.innerText !== before",
        arg=[check.locator(".jp-InputPrompt").element_handle(), count_before], timeout=60_000)
    nb.wait_kernel_idle()
    return check.locator(".jp-OutputArea").inner_text()


def test_learner_writes_a_wrong_then_a_right_answer(lab, open_notebook):
    if not (lab.notebook_dir / NOTEBOOK).exists():
        pytest.skip(f"notebooks/{NOTEBOOK} is not in this checkout")
    nb = open_notebook(NOTEBOOK)
    exercise, check = _cells(nb)

    shown = _run_both(nb, exercise, check)
    assert "my_share: not written yet: replace the NotImplementedError in my_share" in shown, shown
    nb.screenshot("stub", check)

    _type_answer(nb, exercise, WRONG)
    shown = _run_both(nb, exercise, check)
    assert "ExerciseFailed: my share:" in shown, shown
    assert ("world_size 2, 4 items: shares of {0: 4, 1: 0} items per rank; balanced shares differ by at "
            "most one item (here 2 each)") in shown, shown
    assert "Traceback" not in shown and "site-packages" not in shown, shown  # the explanation, not frames
    nb.screenshot("wrong", check)

    _type_answer(nb, exercise, RIGHT)
    shown = _run_both(nb, exercise, check)
    assert "my share: passed all 5 cases" in shown, shown
    assert "ExerciseFailed" not in shown
    nb.screenshot("right", check)
    nb.assert_console_clean()
