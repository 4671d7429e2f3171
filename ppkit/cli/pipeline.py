"""``ppkit pipeline``: the PyTorch RPC pipeline tutorial's experiment, without a browser.

    ppkit pipeline                                   # the U-curve: 1 2 4 8 16 32 micro-batches of batch 32
    ppkit pipeline --cut auto                        # first measure every cut, take the most balanced
    ppkit pipeline --batch-size 120 --image-size 128 --num-batches 3 --microbatch-sizes 1 2 4 8
    ppkit pipeline --placement master:cpu,worker1:cpu --cut layer3 --plot sweep.png --verify

With the RPC schedule it measures the U-curve (ppkit/pipeline/rpc/ucurve.py): the no-overlap reference
(one micro-batch) and every count, each also with its micro-batches one at a time (no overlap at the
same size), in rounds, with each stage process on its own cores (``--stage-threads``), and ends with
one line a script can read::

    speed-up over no overlap at the same micro-batch size: 1.61x (overlap bound 1.66x); over the
    whole batch in one: 2.10x (bubble bound 1.46x, 8 micro-batches of 15)

(one line; wrapped here).

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

HELP = ("train ResNet50 pipelined over RPC workers at several numbers of micro-batches; print the "
        "U-curve and the speed-up over no overlap")

DEFAULTS = {"batch_size": 32, "image_size": 64, "num_batches": 3, "microbatch_sizes": [1, 2, 4, 8],
            "placement": "worker1:cpu,worker2:cpu"}  # sizes: the --schedule gpipe/1f1b default
TUTORIAL = "--batch-size 120 --image-size 128 --num-batches 3 --microbatch-sizes 1 2 4 8"
PLOT_FORMATS = (".png", ".pdf", ".svg")


def add_arguments(parser) -> None:
    parser.epilog = f"The tutorial's own sizes: ppkit pipeline {TUTORIAL}"
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], metavar="N",
                        help="images per batch (default %(default)s; the tutorial: 120)")
    parser.add_argument("--image-size", type=int, default=DEFAULTS["image_size"], metavar="PIXELS",
                        help="square image side (default %(default)s; the tutorial: 128)")
    parser.add_argument("--num-batches", type=int, default=DEFAULTS["num_batches"], metavar="N",
                        help="timed training steps per configuration (default %(default)s; the RPC "
                        "schedule adds one untimed warm-up step each and reports the median)")
    counts = parser.add_mutually_exclusive_group()
    counts.add_argument("--num-microbatches", type=int, nargs="+", metavar="M",
                        help="numbers of micro-batches to measure, one configuration each (default: 1 2 4 "
                        "8 16 32, up to the batch size; 1, the no-overlap reference, is always measured)")
    counts.add_argument("--microbatch-sizes", type=int, nargs="+", metavar="SIZE",
                        help="or: images per micro-batch, one configuration each (the tutorial calls "
                        "these 'number of splits'; with --schedule gpipe/1f1b the default is 1 2 4 8)")
    parser.add_argument("--stage-threads", default="auto", metavar="auto|off|N",
                        help="each stage process's share of the machine: auto splits this host's cores "
                        "between the stage processes (pinned, one thread per core; the master gets one "
                        "thread), off leaves every process as it is, N sets N threads per stage process "
                        "(default %(default)s)")
    parser.add_argument("--placement", default=DEFAULTS["placement"], metavar="NAME:DEVICE,NAME:DEVICE",
                        help="where each shard runs, in order: master (this process) or workerN, on "
                        "cpu or cuda:N (default %(default)s)")
    parser.add_argument("--cut", default=DEFAULT_CUT, metavar="STAGE",
                        help=f"the ResNet50 stage after which shard 1 ends: {', '.join(CUT_POINTS)}, or "
                        "auto: measure every cut here and take the one with the smallest slowest stage "
                        "(default %(default)s)")
    parser.add_argument("--plot", metavar="PATH", help="save the U-curve and the best count's timeline "
                        "(with --schedule gpipe/1f1b: the sweep and every timeline) to PATH (.png, .pdf or .svg)")
    parser.add_argument("--listen", metavar="ADDR:PORT",
                        help="wait on this address for the placement's workers to join from other "
                        "machines (on each: ppkit worker --connect ADDR:PORT --name workerN); "
                        "master's shards stay here")
    parser.add_argument("--launcher", choices=("local", "spawn", "slurm"), default=None,
                        help="where the workers run: this machine (local: forked, the default; spawn: fresh "
                        "interpreters) or slurm: tasks of a SLURM job on the cluster's nodes")
    parser.add_argument("--nodes", type=int, default=None, metavar="N",
                        help="with --launcher slurm: how many nodes the workers spread over (default 1)")
    parser.add_argument("--partition", default=None, help="with --launcher slurm: the SLURM partition")
    parser.add_argument("--time", default=None, metavar="LIMIT",
                        help="with --launcher slurm: the job's time limit (default 00:30:00)")
    parser.add_argument("--start-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="how long to wait for the workers to start or join (default %(default)s)")
    parser.add_argument("--schedule", choices=("rpc", "gpipe", "1f1b"), default="rpc",
                        help="rpc: the tutorial's RPC pipeline (default); gpipe or 1f1b: the same shards as "
                        "torch.distributed.pipelining stages on 2 gloo ranks (--placement is not used)")
    parser.add_argument("--verify", action="store_true",
                        help="also compare the outputs with a local torchvision ResNet50 holding the "
                        "same weights (eval mode); exit 1 if they differ by more than 1e-4 (relative to "
                        "the largest output, if above 1; with --schedule gpipe or 1f1b: the gradients, "
                        "by more than 1e-3 of the largest)")


def config_from_args(args):
    """The checked :class:`PipelineConfig` for ``args``; ConfigError if any flag is wrong."""
    import torch

    from ppkit.pipeline.rpc.config import AUTO_CUT, PipelineConfig, check_placement, parse_placement
    from ppkit.pipeline.rpc.experiment import sizes_from_args

    if args.batch_size < 1:
        raise ConfigError(f"batch_size must be a whole number >= 1, got {args.batch_size!r}.")
    config = PipelineConfig(batch_size=args.batch_size, image_size=args.image_size,
                            num_batches=args.num_batches,
                            microbatch_sizes=sizes_from_args(args, DEFAULTS["microbatch_sizes"]),
                            placement=parse_placement(args.placement), cut=args.cut,
                            stage_threads=args.stage_threads).check()
    if args.cut == AUTO_CUT and args.schedule != "rpc":
        raise ConfigError(f"--cut auto works with --schedule rpc only; name a cut ({', '.join(CUT_POINTS)}).")
    positive(getattr(args, "start_timeout", 120.0), "--start-timeout")
    if args.plot:
        path = Path(args.plot)
        if path.suffix.lower() not in PLOT_FORMATS:
            raise ConfigError(f"--plot {args.plot}: end the file name with {', '.join(PLOT_FORMATS)}.")
        if not path.parent.is_dir():
            raise ConfigError(f"--plot {args.plot}: the folder {path.parent} does not exist.")
    if args.schedule != "rpc" and (getattr(args, "listen", None) is not None or getattr(args, "launcher", None)):
        raise ConfigError("--listen and --launcher work with --schedule rpc only: the pipelining schedules run on "
                          "two local ranks.")
    if args.schedule != "rpc":
        from ppkit.pipeline.schedules.sweep import check_config

        check_config(config, args.schedule)
    # Local workers have this machine's devices: refuse cuda:3 before starting anything.
    listen = getattr(args, "listen", None)
    elsewhere = listen is not None or getattr(args, "launcher", None) == "slurm"
    if elsewhere:  # the workers are on other machines: only master's devices are known
        from ppkit.cluster.rpc.options import check_rpc

        check_rpc(max(1, config.num_workers()), **world_options(args))
        if config.num_workers() == 0:
            flag = f"--listen {listen}" if listen is not None else "--launcher slurm"
            raise ConfigError(f"{flag}: the placement puts every shard on master, so no "
                              f"worker would join; name a workerN in --placement or drop {flag.split()[0]}.")
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
    return ppkit.start_rpc(num_workers=max(1, config.num_workers()), **world_options(args))


def world_options(args) -> dict:
    """``start_rpc``'s options from the flags (those not given are left to its defaults)."""
    options = {"start_timeout": getattr(args, "start_timeout", 120.0)}
    for name in ("listen", "launcher", "nodes", "partition", "time"):
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    return options


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
    """The --schedule gpipe/1f1b sweep; returns its :class:`SweepResult` (rows via ``on_result``)."""
    from ppkit.pipeline.schedules.sweep import run_sweep as run_schedule

    return run_schedule(world, config, args.schedule, progress=progress, on_result=on_result)


def main(args) -> int:
    try:
        config = config_from_args(args)
    except PPKitError as exc:  # a wrong flag, or a torch without what --schedule needs
        print(f"ppkit pipeline: error: {exc}", file=sys.stderr)
        return 2

    from ppkit.pipeline.rpc.sweep import COLUMNS, make_batch

    rpc = args.schedule == "rpc"
    where = (f"placement {','.join(map(str, config.placement))}" if rpc else
             f"{args.schedule} schedule of torch.distributed.pipelining on 2 gloo ranks")
    steps = (f"{config.num_batches} timed steps per count (after 1 warm-up step)" if rpc else
             f"{config.num_batches} batches per configuration")
    cut = "auto (measured below)" if config.cut == "auto" else config.cut
    print(f"ResNet50 cut after {cut}, {where}, batch {config.batch_size} of "
          f"{config.image_size}x{config.image_size}, {steps}", flush=True)
    progress = Progress()
    widths = [max(len(head), 8) for _, head, _ in COLUMNS]
    if not rpc:
        print("  ".join(head.rjust(w) for (_, head, _), w in zip(COLUMNS, widths)), flush=True)

    def show(result):
        progress.clear()
        row = result.row()
        cells = ["-" if row[key] is None else fmt.format(row[key]) for key, _, fmt in COLUMNS]
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths)), flush=True)

    def say(text):
        progress.clear()
        print(text, flush=True)

    world, model = None, None
    try:
        world = start_world(args, config)
        if rpc:
            from ppkit.pipeline.rpc.experiment import run_ucurve

            result, model = run_ucurve(config, progress, say)
            config = config.replace(cut=result.cut)
        else:
            result = run(args, config, world, progress, show)
        progress.clear()
        if args.plot:
            _save_plot(result, args.plot)
            print(f"plots saved to {args.plot}")
        status = 0
        if args.verify and model is None:
            from ppkit.pipeline.schedules.sweep import verify_report

            ok, text = verify_report(world, config, args.schedule)
            print(text)
            status = 0 if ok else 1
        elif args.verify:
            from ppkit.pipeline.rpc.verify import compare, tolerance

            batches = [make_batch(config, i)[0] for i in range(config.num_batches)]
            worst, largest = compare(model, batches, config.microbatch_sizes)
            limit = tolerance(largest)
            ok = worst <= limit
            print(f"verify: max |pipeline - local torchvision ResNet50| = {worst:.2e} over "
                  f"{len(batches)} batches x micro-batch sizes {' '.join(map(str, config.microbatch_sizes))}"
                  f" (eval mode, same weights, largest output {largest:.3g}): "
                  f"{'OK' if ok else 'TOO LARGE'} (tolerance {limit:.2g})")
            status = 0 if ok else 1
        if rpc:
            print(result.summary(), flush=True)  # last: the line a script reads
        return status
    except PPKitError as exc:
        progress.clear()
        print(f"ppkit pipeline: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        progress.clear()
        if model is not None:
            model.close()
        if world is not None:
            world.close()


def _save_plot(result, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from ppkit.pipeline.plots import sweep_figure, ucurve_figure
    from ppkit.pipeline.rpc.ucurve import UCurve

    figure = ucurve_figure(result) if isinstance(result, UCurve) else sweep_figure(result, run_index=None)
    figure.savefig(path, dpi=110)
