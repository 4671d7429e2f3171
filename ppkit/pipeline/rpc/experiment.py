"""The RPC pipeline experiment as ``ppkit pipeline`` runs it: which counts the flags ask for, the
auto cut if asked for, then the U-curve, each result printed as soon as it is known."""

from __future__ import annotations


def sizes_from_args(args, schedule_default) -> tuple[int, ...]:
    """The micro-batch sizes the flags ask for (from --num-microbatches, --microbatch-sizes or the
    default counts), largest first for the RPC schedule's U-curve."""
    from ppkit.pipeline.rpc.ucurve import default_counts, sizes_for_counts

    if args.schedule != "rpc":
        return tuple(args.microbatch_sizes or schedule_default)
    if args.microbatch_sizes:
        for size in args.microbatch_sizes:
            if not 1 <= size <= args.batch_size:
                from ppkit.pipeline.rpc.config import check_microbatch_size

                check_microbatch_size(size, args.batch_size)
        counts = [-(-args.batch_size // size) for size in args.microbatch_sizes]
    else:
        counts = args.num_microbatches or default_counts(args.batch_size)
    return tuple(size for _, size in sizes_for_counts(args.batch_size, counts))


def run_ucurve(config, progress, say):
    """The RPC schedule: the auto cut if asked for, then the U-curve; returns (curve, model).

    ``say(line)`` prints each result as soon as it is known. The model is left open for --verify.
    """
    from ppkit.pipeline.rpc.config import AUTO_CUT
    from ppkit.pipeline.rpc.sweep import build_model
    from ppkit.pipeline.rpc.ucurve import measure_ucurve

    if config.cut == AUTO_CUT:
        from ppkit.pipeline.rpc.balance import format_candidates, measure_cuts, pick

        candidates = measure_cuts(config, rounds=config.num_batches, progress=progress)
        progress.clear()
        say("--cut auto: each cut's stages alone on the whole batch (forward + backward)")
        say(format_candidates(candidates))
        config = config.replace(cut=pick(candidates).cut)
    model, optimizer = build_model(config)
    try:
        from ppkit.pipeline.rpc.resources import describe

        say(f"stage resources: {describe(model.resources)}")
        curve = measure_ucurve(model, optimizer, config, [-(-config.batch_size // size)
                                                          for size in config.microbatch_sizes],
                               progress=progress)
    except BaseException:
        model.close()
        raise
    progress.clear()
    say(curve.format_table())
    say(curve.reference.describe())
    say(curve.overhead_line())
    return curve, model
