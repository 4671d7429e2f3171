"""What the pipeline widget and its panels share: a stable DOM class on every control, pictures that
stay hidden until drawn, and the tables and figures they draw."""

from __future__ import annotations

import html
import io

import ipywidgets as w

_CELL = 'style="padding:2px 12px;text-align:right"'


def styled(widget, name: str):
    """``widget`` with the DOM class ``ppkit-pipeline-<name>`` (what the browser tests find it by)."""
    widget.add_class(f"ppkit-pipeline-{name}")
    if hasattr(widget, "style") and hasattr(widget.style, "description_width"):
        widget.style.description_width = "initial"  # "micro-batch size" is cut off otherwise
    return widget


def picture(name: str):
    """A PNG image, hidden until there is a picture: an empty Image shows as a broken-image icon."""
    return styled(w.Image(format="png", layout=w.Layout(display="none")), name)


def show(image, fig) -> None:
    image.value = png(fig)
    image.layout.display = None


def hide(image) -> None:
    image.value = b""
    image.layout.display = "none"


def html_table(rows, columns, css_class: str) -> str:
    head = "".join(f"<th {_CELL}>{html.escape(h)}</th>" for _, h, _ in columns)
    body = "".join("<tr>" + "".join(
        f"<td {_CELL}>{'-' if row[k] is None else fmt.format(row[k])}</td>" for k, _, fmt in columns)
        + "</tr>" for row in rows)
    return f'<table class="{css_class}"><tr>{head}</tr>{body}</table>'


def timeline_figure(run):
    from matplotlib.figure import Figure

    from ppkit.pipeline.plots import plot_run

    fig = Figure(figsize=(11, 3.2), layout="constrained")
    plot_run(fig.subplots(1, 2, sharey=True), run)
    return fig


def png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()
