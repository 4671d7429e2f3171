"""What the lesson explorers (notebooks 11 and 12) share: measure on the cluster, then draw, or say
in the panel why the settings cannot run (and whether the cluster needs a restart)."""

from __future__ import annotations

from html import escape

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
