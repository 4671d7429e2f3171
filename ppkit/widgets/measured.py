"""What the lesson explorers (notebooks 11, 12 and 13) share: one measurement at a time; measure on the
cluster, then draw, or say in the panel why the settings cannot run (and whether the cluster needs a restart)."""

from __future__ import annotations

import threading
from html import escape

import ipywidgets as widgets
from IPython.display import display

from ppkit.errors import PPKitError


def measure_and_draw(explorer, measure, plot, summary_html) -> None:
    """``measure()`` (which checks the settings first), then ``plot(m)`` into ``explorer.output`` and
    ``summary_html(m)`` into ``explorer.summary``; a ``PPKitError`` is shown there instead."""
    try:
        m = measure()
    except PPKitError as err:
        explorer.error = str(err)
        broken = explorer.cluster.state == "broken"
        after = " The cluster is broken now: run cluster.restart(), then change a setting." if broken else ""
        explorer.summary.value = f"<p style='color:#b00020'><b>Not run:</b> {escape(str(err) + after)}</p>"
        return
    explorer.error, explorer.measurement = None, m
    explorer.figure = plot(m)
    explorer.summary.value = summary_html(m)
    explorer.output.clear_output(wait=True)
    with explorer.output:
        display(explorer.figure)
    explorer.redraws += 1


class OneAtATime:
    """Call ``work()`` for each request, one call at a time, the latest settings winning.

    JupyterLab with ipykernel 7 can deliver a widget change on a kernel subshell, in another thread, while a
    measurement runs, and two ``cluster.run`` at once would mix up their jobs. A request that arrives meanwhile
    returns at once; the call running then sees it and calls ``work()`` again, with the settings of that moment."""

    def __init__(self, work):
        self._work, self._wanted, self._lock = work, False, threading.Lock()

    def __call__(self) -> None:
        self._wanted = True
        while self._wanted:
            if not self._lock.acquire(blocking=False):
                return  # the thread working now sees _wanted and works again
            try:
                self._wanted = False
                self._work()
            finally:
                self._lock.release()


def tagged_panel(css: str, controls: dict, summary, output) -> widgets.VBox:
    """The controls in a row above the summary and the output, each tagged with the CSS class ``{css}-{name}``
    (what the browser tests find them by), descriptions shown whole; the panel tagged ``css``."""
    for name, w in {**controls, "summary": summary, "output": output}.items():
        w.add_class(f"{css}-{name}")
        if hasattr(w, "description"):
            w.style.description_width = "initial"
    panel = widgets.VBox([widgets.HBox(list(controls.values())), summary, output])
    panel.add_class(css)
    return panel
