"""Notebook 13's explorer: a world size, a mesh shape (dp x pp x tp) and a memory budget -> one step measured.

    from ppkit.widgets import MeshExplorer
    MeshExplorer(cluster)     # cluster = ppkit.start(8): every change runs one step of the 3-D model on
                              # the mesh chosen, on ranks 0 .. world size - 1, checks it against one process,
                              # and draws what each rank held (model state and activations) and sent,
                              # beside the Playbook's formulas and the budget

A mesh whose product is not the world size (or that the model cannot take) is refused in the kernel before
anything runs: the summary says which value and which meshes would work, the last picture stays, and the
cluster is untouched. Moving the budget only redraws. For tests: controls and outputs carry CSS classes
``ppkit-mesh-{world-size,dp,pp,tp,shard,budget,summary,output}``; ``.measurement`` and ``.figure`` are the last run
and drawing, ``.error`` the last refusal (None after a run), ``.redraws`` counts runs.
"""

from __future__ import annotations

from html import escape

import ipywidgets as widgets

from ppkit.lessons import composition as comp
from ppkit.lessons import mesh_costs as mc
from ppkit.widgets.measured import OneAtATime, measure_and_draw

DEGREES = (1, 2, 4, 8)
CSS = "ppkit-mesh"


class MeshExplorer:
    """Controls, a summary and the measured memory and traffic of one mesh shape on ``cluster``."""

    def __init__(self, cluster, mesh=(2, 2, 2), shard_dp: bool = True, budget: int = 90_000, known=()):
        """``known``: measurements made already (``mesh_costs.measure``), reused rather than run again."""
        self.cluster, self.size = cluster, comp.SIZE
        world = mesh[0] * mesh[1] * mesh[2] if len(mesh) == 3 and all(isinstance(n, int) for n in mesh) else 0
        comp.check_mesh(comp.check_world(world, cluster.world_size) if world else cluster.world_size, mesh,
                        self.size)  # refuse before drawing anything
        self.world = widgets.Dropdown(options=tuple(range(1, cluster.world_size + 1)), value=world,
                                      description="world size")
        self.dims = {d: widgets.Dropdown(options=DEGREES if n in DEGREES else tuple(sorted({*DEGREES, n})), value=n,
                                         description=d) for d, n in zip(comp.DIMS, mesh)}
        self.shard = widgets.Checkbox(value=shard_dp, description="dp shards (FSDP2); off: whole replicas")
        self.budget = widgets.IntSlider(value=budget, min=10_000, max=200_000, step=2_000,
                                        description="budget (bytes per rank)", continuous_update=False)
        self.summary, self.output = widgets.HTML(), widgets.Output()
        named = {"world-size": self.world, **self.dims, "shard": self.shard, "budget": self.budget,
                 "summary": self.summary, "output": self.output}
        for name, w in named.items():
            w.add_class(f"{CSS}-{name}")
            if hasattr(w, "description"):
                w.style.description_width = "initial"
        self.widget = widgets.VBox([widgets.HBox([self.world, *self.dims.values(), self.shard]), self.budget,
                                    self.summary, self.output])
        self.widget.add_class(CSS)
        self.measurement = self.figure = self.error = None
        self.measured = {(m.mesh, m.shard_dp): m for m in known}  # for the budget table, and not to run twice
        self.redraws, self._one_at_a_time = 0, OneAtATime(self._measure_and_draw)
        for w in (self.world, *self.dims.values(), self.shard, self.budget):
            w.observe(lambda _change: self.redraw(), names="value")
        self.redraw()

    def mesh(self) -> tuple[int, int, int]:
        return tuple(self.dims[d].value for d in comp.DIMS)

    def redraw(self) -> None:
        """Measure the chosen mesh (or reuse its measurement) and draw it; or say why it cannot run.
        One at a time, as in ``MoEExplorer.redraw``: a change arriving meanwhile is measured right after."""
        self._one_at_a_time()

    def _measure_and_draw(self) -> None:
        mesh, shard, budget, world = self.mesh(), self.shard.value, self.budget.value, self.world.value

        def measure():
            mesh_ok = comp.check_mesh(world, mesh, self.size)
            if (mesh_ok, shard) not in self.measured:
                self.summary.value = "<p>measuring...</p>"
                self.measured[mesh_ok, shard] = mc.measure(self.cluster, mesh_ok, shard, self.size, world)
            return self.measured[mesh_ok, shard]

        measure_and_draw(self, measure, lambda m: mc.plot(m, budget), lambda m: self._summary_html(m, budget))

    def _summary_html(self, m: mc.Measurement, budget: int) -> str:
        worst = max(m.memory())
        fits = "fits" if worst <= budget else "<b>does not fit</b>"
        state, acts = mc.memory_formula(m.mesh, m.size, m.shard_dp), mc.activations_formula(m.mesh, m.size)
        formula = mc.comm_formula(m.mesh, m.size, m.shard_dp)
        traffic = ", ".join(f"{d} {m.sent(d):,.0f} (formula {formula[d]:,.0f})" for d in comp.DIMS)
        cell = "<td style='padding: 0 1.2em 0 0'>"
        rows = "".join(
            f"<tr>{cell}{'x'.join(map(str, mesh))}</td>{cell}{mem:,.0f}</td>{cell}"
            f"{self._measured_memory(mesh, m.shard_dp)}</td>{cell}{'yes' if ok else 'no'}</td></tr>"
            for mesh, mem, ok in mc.budget_table(len(m.ranks), budget, m.size, m.shard_dp))
        head = "".join(f"<th style='padding: 0 1.2em 0 0; text-align: left'>{h}</th>" for h in (
            "mesh dp x pp x tp", "formula bytes per rank (state + activations)", "measured (busiest rank)",
            "formula fits"))
        return (f"<p><b>{escape(m.title())}</b> on {len(m.ranks)} ranks: loss {m.loss:.6f}, one process "
                f"{m.reference_loss:.6f}; largest "
                f"gradient difference {m.grad_error:.1e} (tolerance {mc.cm.TOLERANCE:g}): "
                f"{'equal' if m.equal else '<b>NOT equal</b>'}.<br>Model state + activations of the busiest rank "
                f"{worst:,} bytes (formula {state:,.0f} + {acts:,.0f}): {fits} in {budget:,}. Activations kept "
                f"(most on one rank): {max(m.activations()):,} bytes measured, formula {acts:,.0f}.<br>"
                f"Bytes sent per step by the busiest rank: {traffic}.</p><table><tr>{head}</tr>{rows}</table>")

    def _measured_memory(self, mesh, shard: bool) -> str:
        m = self.measured.get((mesh, shard))
        return f"{max(m.memory()):,}" if m else "not measured yet"

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
