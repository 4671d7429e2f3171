"""Pipeline parallelism, two ways, and what both share.

    rpc/        the RPC pipeline (notebooks 05-07): ResNet50 in two shards on two workers, micro-batches
                through RRefs, distributed autograd; its config, sweep, U-curve, balance and resources
    schedules/  the same split as stages of ``torch.distributed.pipelining`` (notebook 08): GPipe, 1F1B
                and the schedules past them, measured beside the RPC pipeline
    timeline    spans of work per stage, as both record them
    bubble      the bubble formulas and their prediction from measured stage times
    plots       Gantt charts of a timeline
"""
