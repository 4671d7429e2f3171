"""Notebook controls for the pipeline experiment: sizes, placement, cut, Run, table and plots.

    ui = PipelineWidget(world)      # world = ppkit.start_rpc(2)
    ui                              # shows the controls
    ui.microbatch_size.value = 4    # ... or drive it from Python, as the tests do
    ui.run_button.click()
    ui.runs[-1].seconds_per_batch
    ui.ucurve()                     # 1, 2, 4, ... micro-batches against the no-overlap reference
    ui.curve.summary()              # (the U-curve panel, ui.ucurve_panel, shows its own table and plots)

Every control has a stable description and a ``ppkit-pipeline-*`` DOM class, so a browser test can
find it. Errors (a bad size, a device that is not there, a failed stage) appear in the status line;
``run()`` and ``sweep()`` raise them instead, for scripts.
"""

from __future__ import annotations

import html

import ipywidgets as w

from ppkit.errors import ConfigError, PPKitError
from ppkit.models.resnet import CUT_POINTS, DEFAULT_CUT
from ppkit.pipeline.rpc.config import AUTO_CUT, PipelineConfig, Placement, num_microbatches
from ppkit.pipeline.rpc.resources import describe
from ppkit.pipeline.rpc.sweep import COLUMNS, build_model, format_rows, train_batches
from ppkit.widgets.pipeline_parts import hide, html_table, picture, show, styled, timeline_figure
from ppkit.widgets.pipeline_ucurve import AutoCut, UCurvePanel

IMAGE_SIZES = (32, 48, 64, 96, 128)


def _device_counts(names) -> dict[str, int]:
    """CUDA devices on every process of the RPC world (asked once, when the widget is made)."""
    import torch.distributed.rpc as rpc

    from ppkit.pipeline.rpc import stages

    futures = {name: rpc.rpc_async(name, stages.probe, args=([],), timeout=30) for name in names}
    counts = {}
    for name, future in futures.items():
        try:
            counts[name] = future.wait()["cuda"]
        except Exception:  # noqa: BLE001 - an unreachable process offers cpu only; Run reports why
            counts[name] = 0
    return counts


class PipelineWidget(w.VBox):
    """Controls and results for pipelined ResNet50 training on an RPC world."""

    def __init__(self, world, *, batch_size: int = 16, image_size: int = 64, num_batches: int = 2,
                 microbatch_size: int = 4, sweep_sizes=(1, 2, 4, 8, 16)):
        self.world = world
        self.names = list(world.names)
        self.devices = _device_counts(self.names)
        self.runs = []
        self._model = None
        self._model_key = None
        self._results_key = None

        self.batch_size = styled(w.BoundedIntText(batch_size, min=1, max=1024, description="batch size"),
                                  "batch-size")
        self.image_size = styled(w.Dropdown(options=IMAGE_SIZES, value=image_size,
                                             description="image size"), "image-size")
        self.num_batches = styled(w.BoundedIntText(num_batches, min=1, max=100,
                                                    description="batches"), "num-batches")
        self.microbatch_size = styled(w.IntSlider(min(microbatch_size, batch_size), min=1, max=batch_size,
                                                   description="micro-batch size", continuous_update=True),
                                       "microbatch")
        self.num_microbatches = styled(w.Label(), "num-microbatches")
        self.cut = styled(w.Dropdown(options=(*CUT_POINTS, AUTO_CUT), value=DEFAULT_CUT, description="cut after",
                                      tooltip="auto: time every cut here, take the smallest slowest stage"), "cut")
        self.stage_threads = styled(w.Dropdown(options=("auto", "off"), value="auto", description="stage threads",
                                                tooltip="auto: each stage process on its own cores"),
                                     "stage-threads")
        self.resources = styled(w.HTML(), "resources")
        default_processes = (self.names[1:3] if len(self.names) >= 3 else
                             self.names[:2] if len(self.names) >= 2 else self.names * 2)
        self.processes, self.device_choices = [], []
        for i, name in enumerate(default_processes):
            process = styled(w.Dropdown(options=self.names, value=name, description=f"shard {i + 1} on"),
                              f"process-{i + 1}")
            device = styled(w.Dropdown(options=self._device_options(name), value="cpu",
                                        description="device"), f"device-{i + 1}")
            process.observe(lambda change, device=device: self._update_devices(change, device), "value")
            self.processes.append(process)
            self.device_choices.append(device)
        self.sweep_sizes = styled(w.Text(" ".join(map(str, sweep_sizes)), description="sweep sizes"),
                                   "sweep-sizes")
        self.run_button = styled(w.Button(description="Run", button_style="primary",
                                           tooltip="train at the chosen micro-batch size"), "run")
        self.sweep_button = styled(w.Button(description="Sweep", tooltip="train at every sweep size"),
                                    "sweep")
        self.clear_button = styled(w.Button(description="Clear results"), "clear")
        self.progress = styled(w.IntProgress(0, min=0, max=1, description="progress"), "progress")
        self.status = styled(w.HTML(), "status")
        self.table = styled(w.HTML(), "table")
        self.sweep_plot = picture("sweep-plot")
        self.timeline_plot = picture("timeline-plot")
        self.auto_cut = AutoCut(self._release_shards, self.progress, self._say)
        self.ucurve_panel = UCurvePanel(self._prepared, self.progress, self._say)
        self.cuts_table, self.ucurve_button = self.auto_cut.table, self.ucurve_panel.button

        self.batch_size.observe(self._update_sizes, "value")
        self.microbatch_size.observe(self._update_sizes, "value")
        self.run_button.on_click(lambda _: self._guarded(self.run))
        self.sweep_button.on_click(lambda _: self._guarded(self.sweep))
        self.ucurve_button.on_click(lambda _: self._guarded(self.ucurve))
        self.clear_button.on_click(lambda _: self.clear())
        self._update_sizes()

        placement_rows = [w.HBox([p, d]) for p, d in zip(self.processes, self.device_choices)]
        super().__init__([
            w.HBox([self.batch_size, self.image_size, self.num_batches]),
            w.HBox([self.microbatch_size, self.num_microbatches]),
            *placement_rows,
            w.HBox([self.cut, self.stage_threads]),
            self.resources,
            w.HBox([self.run_button, self.sweep_sizes, self.sweep_button, self.ucurve_button,
                    self.clear_button]),
            w.HBox([self.progress, self.status]),
            self.cuts_table,
            self.table,
            self.sweep_plot,
            self.timeline_plot,
            self.ucurve_panel,
        ])
        self.add_class("ppkit-pipeline")

    # -- controls -----------------------------------------------------------------------------
    def _device_options(self, process: str) -> list[str]:
        return ["cpu"] + [f"cuda:{i}" for i in range(self.devices.get(process, 0))]

    def _update_devices(self, change, device) -> None:
        device.options = self._device_options(change["new"])
        device.value = "cpu"

    def _update_sizes(self, change=None) -> None:
        batch = max(1, self.batch_size.value)
        self.microbatch_size.max = batch
        size = self.microbatch_size.value
        count = num_microbatches(batch, size)
        self.num_microbatches.value = (f"= {count} micro-batch{'es' if count != 1 else ''} of up to "
                                       f"{size} image{'s' if size != 1 else ''}")

    def config(self, microbatch_sizes=None) -> PipelineConfig:
        """The checked configuration the controls describe (ConfigError if it cannot run)."""
        placement = tuple(Placement(p.value, d.value) for p, d in zip(self.processes, self.device_choices))
        return PipelineConfig(batch_size=self.batch_size.value, image_size=self.image_size.value,
                              num_batches=self.num_batches.value,
                              microbatch_sizes=tuple(microbatch_sizes or [self.microbatch_size.value]),
                              placement=placement, cut=self.cut.value,
                              stage_threads=self.stage_threads.value).check()

    def parse_sweep_sizes(self) -> list[int]:
        try:
            sizes = [int(part) for part in self.sweep_sizes.value.replace(",", " ").split()]
        except ValueError:
            raise ConfigError(f"sweep sizes {self.sweep_sizes.value!r}: write whole numbers, e.g. 1 2 4 8.") \
                from None
        if not sizes:
            raise ConfigError("sweep sizes: give at least one micro-batch size, e.g. 1 2 4 8.")
        return sizes

    # -- running ------------------------------------------------------------------------------
    def run(self):
        """Train at the chosen micro-batch size; returns the :class:`RunResult`."""
        return self._run_sizes(self.config())[-1]

    def sweep(self):
        """Train at every size in the sweep box; returns the list of results."""
        return self._run_sizes(self.config(self.parse_sweep_sizes()))

    def ucurve(self):
        """Measure the U-curve at this batch (the U-curve panel); returns the :class:`UCurve`."""
        return self.ucurve_panel.measure()

    @property
    def curve(self):
        """The last U-curve measured (None before, and after Clear)."""
        return self.ucurve_panel.curve

    def _prepared(self):
        """The checked configuration (its cut chosen if "auto") and its model, in a live RPC world."""
        self._ensure_world()
        config = self.auto_cut.resolve(self.config())
        return config, self._model_for(config)

    def _release_shards(self) -> None:
        self._ensure_world()
        self.close_model()

    def _run_sizes(self, config: PipelineConfig):
        self._ensure_world()
        config = self.auto_cut.resolve(config)
        key = (config.placement, config.cut, config.batch_size, config.image_size, config.num_batches,
               config.stage_threads)
        if key != self._results_key:
            self.runs = []
            self._results_key = key
        model, optimizer = self._model_for(config)
        total = config.num_batches * len(config.microbatch_sizes)
        self.progress.max, self.progress.value = total, 0
        results = []
        for n, size in enumerate(config.microbatch_sizes):
            self._say(f"training {config.num_batches} batches at micro-batch size {size} ...")
            done = n * config.num_batches
            run = train_batches(model, optimizer, config, size,
                                lambda k, _total, done=done: setattr(self.progress, "value", done + k))
            self.runs = [r for r in self.runs if r.microbatch_size != size] + [run]
            self.runs.sort(key=lambda r: r.microbatch_size)
            results.append(run)
            self._show(run)
        self._say(f"done: {len(results)} configuration{'s' if len(results) != 1 else ''}.")
        return results

    def _ensure_world(self) -> None:
        """Start a new RPC world like the old one if it was closed (e.g. by a later cell)."""
        if self.world.state != "closed":
            return
        import ppkit

        self._model = None  # its shards died with the old world
        self._say(f"the RPC world was closed; starting a new one with {len(self.names) - 1} worker(s) ...")
        self.world = ppkit.start_rpc(len(self.names) - 1)

    def _model_for(self, config: PipelineConfig):
        key = (config.placement, config.cut, config.stage_threads)
        if self._model is None or key != self._model_key:
            self.close_model()
            self._say(f"building the shards on {', '.join(map(str, config.placement))} ...")
            self._model = build_model(config)
            self._model_key = key
            self.resources.value = ("stage resources: " + html.escape(describe(self._model[0].resources)))
        return self._model

    def _guarded(self, action) -> None:
        # A button's error would otherwise only reach the kernel's log, and the learner would see
        # nothing happen: show it in the status line instead.
        try:
            action()
        except PPKitError as exc:
            self._say(f"{type(exc).__name__}: {exc}", error=True)
        except Exception as exc:  # noqa: BLE001
            self._say(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", error=True)

    def _say(self, text: str, error: bool = False) -> None:
        color = "#b00020" if error else "inherit"
        self.status.value = f'<span style="color:{color}">{html.escape(text)}</span>'

    def clear(self) -> None:
        self.runs = []
        self.table.value = ""
        hide(self.sweep_plot)
        hide(self.timeline_plot)
        self.ucurve_panel.clear()
        self.progress.value = 0
        self._say("")

    def close_model(self) -> None:
        """Release the shards (the RPC world stays up)."""
        if self._model is not None:
            self._model[0].close()
            self._model = None

    # -- results ------------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        return [run.row() for run in self.runs]

    def _show(self, run) -> None:
        self.table.value = html_table(self.rows(), COLUMNS, "ppkit-pipeline-results")
        show(self.sweep_plot, _sweep_figure(self.runs))
        show(self.timeline_plot, timeline_figure(run))

    def text_table(self) -> str:
        return format_rows(self.rows())


def _sweep_figure(runs):
    from matplotlib.figure import Figure

    from ppkit.pipeline.plots import plot_sweep

    fig = Figure(figsize=(8, 3.2), layout="constrained")
    plot_sweep(fig.subplots(), runs)
    return fig
