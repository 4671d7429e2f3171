"""The code that the notebooks teach with; tested in tests/test_lessons_*.py. The exercises' checkers
are in ppkit/exercises/.

    seed001        the source article's functions, unchanged, to run with cluster.run
    p2p            lesson 1: a recv without a send, and a measured timeline of waiting
    collectives    lesson 2: every collective run for real, modelled in plain Python, drawn
    data_parallel  lesson 3: gradients by hand == DDP == one process; init methods; samplers
    ddp_tutorial   lesson 3: the DDP tutorial's code, unchanged but for devices, run with ppkit.spawn
    rank_variables lesson 3: what torchrun and SLURM tell each process
    timeline       spans, "who waited for whom", Gantt charts
    step_memory    lesson 8b: a small GPT, what a step holds (static part, activations kept per layer), formulas
    step_peak      lesson 8b: a step's peak by MemTracker, predicted by formula; recompute policies' step times
    step_tradeoffs lesson 8b: recomputation's and accumulation's gradients, DDP no_sync counted, bf16 autocast
    step_plots     lesson 8b: activations over s and b beside the formulas, a step's peak by part
    step_flops     lesson 8c: a step's FLOPs by formula (6N + 12 L s h) and by FlopCounterMode; peak, MFU, HFU
    step_compile   lesson 8c: torch.compile on a block: Inductor's kernels, time, memory
    loss_scaling   lesson 8c: fp16 underflow and overflow counted; GradScaler's growth and backoff
    fp8_formats    lesson 8c: e4m3fn and e5m2 measured by casting, per-tensor scaling, what runs on CPU
    cpu_threads    lesson 8c: the one torch thread its timings run with, and why
    zero           lesson 9: ZeRO-1, -2, -3 by hand from reduce_scatter and all_gather; the ZeRO formulas
    fsdp2          lesson 9: the same with torch's fully_shard on a CPU mesh; what needs CUDA
    tensor_parallel  lesson 10: column/row-parallel Linear, MLP, attention by heads; DTensor's version
    sequence_parallel  lesson 10: TP + SP by hand (norms on the shard, all_gather, reduce_scatter) vs TP and one process
    sequence_parallel_torch  lesson 10: torch's SequenceParallel plan vs the hand version; TP/SP activation formulas
    overlap          lesson 10b: DDP's buckets (reverse parameter order, all-reduced during backward), the sweep
    overlap_sharded  lesson 10b: FSDP2's forward/backward prefetch and reshard_after_forward; TP's all-reduces
    overlap_trace    lesson 10b: one step under torch.profiler per rank; compute, communication, overlap, idle
    sharding_plots   lessons 9-10: memory and traffic per rank, formula and measured
    ring_attention   lesson 11: block attention, the log-sum-exp merge, ring attention forward and backward
    context_parallel lesson 11: contiguous and zig-zag layouts, the ring vs full attention, torch's version
    context_timing   lesson 11: the ring measured per rank (compute, waits, imbalance), its pictures
    moe              lesson 12: a mixture-of-experts layer in one process (router, capacity, aux loss)
    expert_parallel  lesson 12: the experts over the ranks, all_to_all dispatch and combine, vs one process
    moe_timing       lesson 12: tokens per expert and rank, drops, bytes and step time measured, pictures
    composition      lesson 13: a tiny transformer on a 3-D mesh: TP (DTensor), pipeline stages, FSDP2 over dp
    composition_measure lesson 13: one step on the mesh vs one process; memory and bytes per dimension
    mesh_costs       lesson 13: the Playbook's formulas beside the measurement, budgets, pictures
    mesh_throughput  lesson 13: each mesh's step time predicted from measured compute and links, ranked, measured
    mesh_links       lesson 13: each kind of collective's latency and bandwidth over groups of n ranks, measured
    fault_tolerance/ lesson 15: torchft's lighthouse and replica groups as processes, a replica killed and back
"""

from __future__ import annotations

import contextlib
import inspect
import io


def show_source(obj):
    """The source of a function or module, highlighted in a notebook, so the lesson shows the very
    code that ``cluster.run`` executes rather than a copy of it."""
    from IPython.display import Code

    return Code(inspect.getsource(obj), language="python")


def rank_output(cluster, fn, *args, **kwargs) -> str:
    """Run ``fn`` on every rank and return what the ranks printed, sorted by rank.

    Ranks print concurrently, so their lines arrive in any order; sorting makes the output the
    same on every run (which is what a checked notebook cell needs).
    """
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        cluster.run(fn, *args, **kwargs)
    lines = buffer.getvalue().splitlines()
    return "\n".join(sorted(lines, key=_rank_of))


def _rank_of(line: str) -> int:
    # "[rank 3] ..." -> 3; lines are stable-sorted so each rank keeps its own order
    if line.startswith("[rank "):
        try:
            return int(line[6:line.index("]")])
        except ValueError:
            pass
    return -1
