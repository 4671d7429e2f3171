"""The merged timeline as an interactive plotly figure: a row per rank and thread (and, with CUDA, per
GPU stream, below the rank's threads), compute and communication in two colours, hover for the op's
name, shapes, duration and size, zoom and pan.

plotly.js is inlined in the notebook (nothing is loaded from the network): in full the first time
this kernel shows a timeline, after which later timelines of the page use it (docs/profiling.md)."""

from __future__ import annotations

import json
import uuid

from ppkit.profiling.classify import COMMUNICATION, COMPUTE
from ppkit.profiling.merge import is_stream

COLOURS = {COMPUTE: "#4C78A8", COMMUNICATION: "#F58518"}
MAX_DEPTH = 4  # nested ops drawn below this depth would be thinner than a pixel row
MAX_BARS = 20_000  # beyond this the longest ops are drawn (a browser slows down past some tens of thousands)
_shown_js = [False]  # plotly.js already put in this kernel's page


def depths(events: list[dict]) -> list[int]:
    """Each event's nesting depth on its thread (events sorted by rank, thread, start)."""
    out, stack, thread = [], [], None
    for event in events:
        if (event["rank"], event["tid"]) != thread:
            stack, thread = [], (event["rank"], event["tid"])
        while stack and stack[-1] <= event["start_us"]:
            stack.pop()
        out.append(len(stack))
        stack.append(event["start_us"] + event["dur_us"])
    return out


NOT_RECORDED = "size not in the trace (recorded unless profile=dict(record_shapes=False))"
NO_DATA = "no data: a barrier"  # gloo:barrier takes no tensor


def size_text(event: dict) -> str:
    """The hover's size line: bytes where the trace says (sizes.py), else elements (a c10d op's tensor
    list has no dtype), else, for a collective, why it is missing."""
    if event.get("bytes"):
        return f"{event['bytes']:,} bytes"
    if event.get("elements"):
        return f"{event['elements']:,} elements"
    if event["kind"] != COMMUNICATION:
        return ""
    return NO_DATA if event["name"].endswith("barrier") else NOT_RECORDED


def _hover(event: dict) -> list[str]:
    shapes = event["args"].get("Input Dims")
    return [event["name"], f"{event['dur_us']:,.1f} µs", f"shapes {shapes}" if shapes else "",
            size_text(event), event["kind"]]


def figure(merged, title: str = "ppkit profile: every rank on one clock"):
    """The plotly Figure of ``merged`` (merge.Merged)."""
    import plotly.graph_objects as go

    events = merged.events
    levels = depths(events)
    chosen = [(e, d) for e, d in zip(events, levels) if d < MAX_DEPTH]
    if len(chosen) > MAX_BARS:
        chosen = sorted(chosen, key=lambda item: -item[0]["dur_us"])[:MAX_BARS]
    rows = sorted({(e["rank"], e["tid"]) for e in events},  # each rank: main, its other threads, its GPU streams
                  key=lambda key: (key[0], is_stream(key[1]), merged.threads.get(key) != "main", key[1]))
    label = {key: f"rank {key[0]} · {merged.threads.get(key, key[1])}" for key in rows}
    fig = go.Figure()
    for kind in (COMPUTE, COMMUNICATION):
        mine = [(e, d) for e, d in chosen if e["kind"] == kind]
        fig.add_trace(go.Bar(
            name=kind, orientation="h", marker_color=COLOURS[kind], marker_line_width=0,
            y=[label[(e["rank"], e["tid"])] for e, _ in mine], x=[e["dur_us"] / 1000 for e, _ in mine],
            base=[e["start_us"] / 1000 for e, _ in mine], width=[0.8 * 0.75 ** d for _, d in mine],
            customdata=[_hover(e) for e, _ in mine],
            hovertemplate="<b>%{customdata[0]}</b><br>%{customdata[1]}<br>%{customdata[2]}<br>%{customdata[3]}"
                          "<extra>%{y}: %{customdata[4]}</extra>"))
    fig.update_layout(title=title, barmode="overlay", height=140 + 48 * len(rows), margin={"l": 10, "r": 10, "t": 50},
                      xaxis_title="ms since the first op (the kernel's clock)", dragmode="zoom",
                      legend={"orientation": "h", "y": 1.08, "x": 1, "xanchor": "right"})
    fig.update_yaxes(categoryorder="array", categoryarray=[label[k] for k in reversed(rows)], autorange=True)
    return fig


class Timeline:
    """``Profile.timeline()``: shows itself in a notebook; ``.figure`` is the plotly Figure, ``.html()``
    a page of its own (plotly.js inlined) for a file or a browser."""

    def __init__(self, merged):
        self.figure = figure(merged)

    def html(self, full: bool = True) -> str:
        """The timeline's HTML with plotly.js inlined; ``full``: a whole page, else a fragment."""
        return self.figure.to_html(full_html=full, include_plotlyjs=True, config={"displaylogo": False})

    def _repr_html_(self) -> str:
        inline, _shown_js[0] = not _shown_js[0], True
        return fragment(self.figure, inline)


def plotly_js() -> str:
    """plotly.js as one inline script that defines ``window.Plotly``, in JupyterLab and in the classic
    notebook alike (where RequireJS's ``define`` would otherwise take the module and leave no global)."""
    from plotly.offline import get_plotlyjs

    return ("<script type='text/javascript'>(function(define, module, exports) {\n" + get_plotlyjs()
            + "\n}).call(window);</script>")


def fragment(fig, inline: bool) -> str:
    """The figure's div and the script that draws it once ``window.Plotly`` is there: with ``inline``,
    plotly.js itself comes first; without, an earlier timeline of the page brought it."""
    import plotly.io

    div = f"ppkit-timeline-{uuid.uuid4().hex}"
    spec = plotly.io.to_json(fig, validate=False)
    config = json.dumps({"displaylogo": False, "responsive": True, "scrollZoom": True})
    missing = ("plotly.js is not on this page: the first timeline shown in this kernel brings it, and its output "
               "was cleared or not trusted. Show the profile again in a new kernel, or save it: "
               "open(path, 'w').write(prof.timeline().html()).")
    draw = (f"<div id='{div}' class='ppkit-timeline'></div><script type='text/javascript'>"
            f"(function draw(tries) {{ var el = document.getElementById('{div}'); if (!el) return;"
            f" if (window.Plotly) {{ var fig = {spec}; window.Plotly.newPlot(el, fig.data, fig.layout, {config}); }}"
            f" else if (tries < 200) {{ setTimeout(function () {{ draw(tries + 1); }}, 50); }}"
            f" else {{ el.textContent = {json.dumps(missing)}; }} }})(0);</script>")
    return (plotly_js() if inline else "") + draw
