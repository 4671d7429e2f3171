"""``ppkit pipeline``: the PyTorch RPC pipeline tutorial's experiment, without a browser.

    ppkit pipeline                                   # laptop-sized defaults
    ppkit pipeline --batch-size 120 --image-size 128 --num-batches 3 --microbatch-sizes 1 2 4 8
    ppkit pipeline --placement master:cpu,worker1:cpu --cut layer3 --plot sweep.png --verify

The command runs in three steps, each its own function so options can extend one step without
touching the others: read and check the flags (:func:`config_from_args`; nothing starts if they are
wrong), start the processes (:func:`start_world`; with --listen, remote workers join there), and run the
sweep (:func:`run`; another schedule would plug in here).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ppkit.checks import positive
from ppkit.errors import ConfigError, PPKitError
from ppkit.models.resnet import CUT_POINTS, DEFAULT_CUT

HELP = "train ResNet50 pipelined over RPC workers at several micro-batch sizes; print one row each"

DEFAULTS = {"batch_size": 32, "image_size": 64, "num_batches": 3, "microbatch_sizes": [1, 2, 4, 8],
            "placement": "worker1:cpu,worker2:cpu"}
TUTORIAL = "--batch-size 120 --image-size 128 --num-batches 3 --microbatch-sizes 1 2 4 8"
PLOT_FORMATS = (".png", ".pdf", ".svg")


def add_arguments(parser) -> None:
    parser.epilog = f"The tutorial's own sizes: ppkit pipeline {TUTORIAL}"
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], metavar="N",
                        help="images per batch (default %(default)s; the tutorial: 120)")
    parser.add_argument("--image-size", type=int, default=DEFAULTS["image_size"], metavar="PIXELS",
                        help="square image side (default %(default)s; the tutorial: 128)")
    parser.add_argument("--num-batches", type=int, default=DEFAULTS["num_batches"], metavar="N",
                        help="training batches per configuration (default %(default)s)")
    parser.add_argument("--microbatch-sizes", type=int, nargs="+", default=DEFAULTS["microbatch_sizes"],
                        metavar="SIZE", help="images per micro-batch, one configuration each "
                        "(default: 1 2 4 8; the tutorial calls these 'number of splits')")
    parser.add_argument("--placement", default=DEFAULTS["placement"], metavar="NAME:DEVICE,NAME:DEVICE",
                        help="where each shard runs, in order: master (this process) or workerN, on "
                        "cpu or cuda:N (default %(default)s)")
    parser.add_argument("--cut", default=DEFAULT_CUT, metavar="STAGE",
                        help=f"the ResNet50 stage after which shard 1 ends: {', '.join(CUT_POINTS)} "
                        "(default %(default)s)")
    parser.add_argument("--plot", metavar="PATH", help="save the sweep plot and every timeline to PATH "
                        "(.png, .pdf or .svg)")
    parser.add_argument("--listen", metavar="ADDR:PORT",
                        help="wait on this address for the placement's workers to join from other "
                        "machines (on each: ppkit worker --connect ADDR:PORT --name workerN); "
                        "master's shards stay here")
    parser.add_argument("--start-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="how long to wait for the workers to start or join (default %(default)s)")
    parser.add_argument("--schedule", choices=("rpc", "gpipe", "1f1b"), default="rpc",
                        help="rpc: the tutorial's RPC pipeline (default); gpipe or 1f1b: the same shards as "
                        "torch.distributed.pipelining stages on 2 gloo ranks (--placement is not used)")
    parser.add_argument("--verify", action="store_true",
                        help="also compare the outputs with a local torchvision ResNet50 holding the "
                        "same weights (eval mode); exit 1 if they differ by more than 1e-4 (relative to "
                        "the largest output, if above 1; with --schedule gpipe or 1f1b: the gradients, "
                        "relative to the largest)")


def config_from_args(args):
    """The checked :class:`PipelineConfig` for ``args``; ConfigError if any flag is wrong."""
    import torch

    from ppkit.pipeline.config import PipelineConfig, check_placement, parse_placement

    config = PipelineConfig(batch_size=args.batch_size, image_size=args.image_size,
                            num_batches=args.num_batches, microbatch_sizes=tuple(args.microbatch_sizes),
                            placement=parse_placement(args.placement), cut=args.cut).check()
    positive(getattr(args, "start_timeout", 120.0), "--start-timeout")
    if args.plot:
        path = Path(args.plot)
        if path.suffix.lower() not in PLOT_FORMATS:
            raise ConfigError(f"--plot {args.plot}: end the file name with {', '.join(PLOT_FORMATS)}.")
        if not path.parent.is_dir():
            raise ConfigError(f"--plot {args.plot}: the folder {path.parent} does not exist.")
    if args.schedule != "rpc" and getattr(args, "listen", None) is not None:
        raise ConfigError("--listen works with --schedule rpc only: the pipelining schedules run on "
                          "local ranks.")
    if args.schedule != "rpc":
        from ppkit.pipelining.sweep import check_config

        check_config(config, args.schedule)
    # Local workers have this machine's devices: refuse cuda:3 before starting anything.
    listen = getattr(args, "listen", None)
    if listen is not None:  # the workers are on other machines: only master's devices are known
        from ppkit.cluster.admission import parse_listen

        parse_listen(listen)
        if config.num_workers() == 0:
            raise ConfigError(f"--listen {listen}: the placement puts every shard on master, so no "
                              "worker would join; name a workerN in --placement or drop --listen.")
        here = [p for p in config.placement if p.process == "master"]
        check_placement(here, ["master"], {"master": torch.cuda.device_count()})
        return config
    local = {name: torch.cuda.device_count() for name in config.processes()}
    check_placement(config.placement, local, local)
    return config


def start_world(args, config):
    """The RPC world the placement needs: this process is master, plus workers 1..N
    (on other machines with ``--listen``: they join with ``ppkit worker``)."""
    import ppkit

    if getattr(args, "schedule", "rpc") != "rpc":
        return ppkit.Cluster(2, "gloo")  # one rank per pipelining stage
    listen = getattr(args, "listen", None)
    options = {"start_timeout": getattr(args, "start_timeout", 120.0)}
    if listen is not None:
        options["listen"] = listen
    return ppkit.start_rpc(num_workers=max(1, config.num_workers()), **options)


class Progress:
    """A one-line progress bar on a terminal's stderr, erased before each result row is printed.

    Not drawn when stderr is a file or a pipe (logs would fill with carriage returns).
    """

    def __init__(self, stream=None, width: int = 30, enabled: bool | None = None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.width, self.shown = width, False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        filled = self.width * done // total
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} batches")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * (self.width + 24) + "\r")
            self.stream.flush()
            self.shown = False


def run(args, config, world, progress, on_result):
    """Run the sweep; returns the :class:`SweepResult` and the model (left open for --verify)."""
    from ppkit.pipeline.sweep import build_model, run_sweep

    if args.schedule != "rpc":
        from ppkit.pipelining.sweep import run_sweep as run_schedule

        return run_schedule(world, config, args.schedule, progress=progress, on_result=on_result), None
    model, _ = build_model(config)
    return run_sweep(config, progress=progress, on_result=on_result, model=model), model


def main(args) -> int:
    try:
        config = config_from_args(args)
    except PPKitError as exc:  # a wrong flag, or a torch without what --schedule needs
        print(f"ppkit pipeline: error: {exc}", file=sys.stderr)
        return 2

    from ppkit.pipeline.sweep import COLUMNS, make_batch

    widths = [max(len(head), 8) for _, head, _ in COLUMNS]
    where = (f"placement {','.join(map(str, config.placement))}" if args.schedule == "rpc" else
             f"{args.schedule} schedule of torch.distributed.pipelining on 2 gloo ranks")
    print(f"ResNet50 cut after {config.cut}, {where}, batch "
          f"{config.batch_size} of {config.image_size}x{config.image_size}, {config.num_batches} "
          "batches per configuration")
    print("  ".join(head.rjust(w) for (_, head, _), w in zip(COLUMNS, widths)), flush=True)
    progress = Progress()

    def show(result):
        progress.clear()
        row = result.row()
        cells = ["-" if row[key] is None else fmt.format(row[key]) for key, _, fmt in COLUMNS]
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths)), flush=True)

    world = None
    try:
        world = start_world(args, config)
        result, model = run(args, config, world, progress, show)
        progress.clear()
        if args.plot:
            _save_plot(result, args.plot)
            print(f"plots saved to {args.plot}")
        status = 0
        if args.verify and model is None:
            from ppkit.pipelining.sweep import verify_report

            ok, text = verify_report(world, config, args.schedule)
            print(text)
            status = 0 if ok else 1
        elif args.verify:
            from ppkit.pipeline.verify import compare, tolerance

            batches = [make_batch(config, i)[0] for i in range(config.num_batches)]
            worst, largest = compare(model, batches, config.microbatch_sizes)
            limit = tolerance(largest)
            ok = worst <= limit
            print(f"verify: max |pipeline - local torchvision ResNet50| = {worst:.2e} over "
                  f"{len(batches)} batches x micro-batch sizes {' '.join(map(str, config.microbatch_sizes))}"
                  f" (eval mode, same weights, largest output {largest:.3g}): "
                  f"{'OK' if ok else 'TOO LARGE'} (tolerance {limit:.2g})")
            status = 0 if ok else 1
        if model is not None:
            model.close()
        return status
    except PPKitError as exc:
        progress.clear()
        print(f"ppkit pipeline: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        progress.clear()
        if world is not None:
            world.close()


def _save_plot(result, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from ppkit.pipeline.plots import sweep_figure

    sweep_figure(result, run_index=None).savefig(path, dpi=110)
