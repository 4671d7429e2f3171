"""Every exercise of the course, registered in one place: ``EXERCISES``.

An exercise is a checker, a solution and a list of hints. To add one:

1. write its checker, ``check_x(fn, **options) -> CheckReport``, in a ``check_*`` module of ppkit/exercises: it
   raises ``ExerciseFailed`` naming the case, what it expected and what it got
   (``ppkit.checks.check_callable`` refuses a non-function or a wrong signature for you);
2. write one solution in ``ppkit/exercises/solutions.py``, a function named like the exercise, exactly
   as it would stand in the notebook;
3. add an ``Exercise`` to ``EXERCISES`` below (name, notebook, signature, checker, solution, hints;
   ``context`` only when the checker needs something the notebook provides, such as an RPC world);
4. in the notebook: the statement in markdown, a code cell tagged ``exercise`` holding the stub
   (the signature, a docstring, ``raise NotImplementedError(...)``), and a cell
   ``workbook.check("x", x)`` whose output, "x: not written yet: ...", is kept with
   ``# NBVAL_CHECK_OUTPUT``.

``tests/test_lessons_workbook.py`` then runs the checker against the solution and
nbval runs the notebook with the solution in the exercise cell (``tests/solved_notebooks.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from ppkit.errors import ConfigError, ExerciseFailed
from ppkit.exercises import (
    check_attention,
    check_basics,
    check_composition,
    check_debugging,
    check_launch,
    check_memory,
    check_moe,
    check_overlap,
    check_pipeline,
    check_sequence,
    check_sharding,
    check_speed,
    check_throughput,
    solutions,
)
from ppkit.lessons import rpc_basics


@dataclass(frozen=True)
class Exercise:
    name: str                   # also the name of the function the learner writes
    notebook: str               # file name without .ipynb
    signature: str              # how the checker calls it: "ring_shift(rank, world_size, tensor)"
    checker: Callable           # checker(fn, **options) -> CheckReport; raises ExerciseFailed
    solution: Callable          # one correct answer, from ppkit.exercises.solutions
    hints: tuple[str, ...]      # from a nudge to nearly the answer; the solution comes after them
    context: Callable | None = None  # () -> context manager yielding the checker's options outside
    #                                   the notebook (e.g. an RPC world's worker names)


@contextmanager
def _rpc_world():
    from ppkit.cluster.rpc.world import start_rpc

    world = start_rpc(2)
    try:
        yield {"owners": world.worker_names}
    finally:
        world.close()


def _check_remote_sum(fn, owners):
    """rpc_basics' checker in the common shape: ExerciseFailed on a wrong answer, the summary printed."""
    try:
        summary = rpc_basics.check_remote_sum(fn, owners)
    except ExerciseFailed:
        raise
    except AssertionError as err:
        raise ExerciseFailed(f"remote sum: {err}", [str(err)]) from None
    print(summary)
    return summary


EXERCISES = (
    Exercise(
        "my_share", "00_start_here", "my_share(rank, world_size, num_items)",
        check_launch.check_my_share, solutions.my_share,
        ("Each rank runs the same function and can only tell itself apart by `rank`: the answer for "
         "rank r must not overlap with any other rank's, and together they must cover range(num_items).",
         "Cut range(num_items) into world_size contiguous blocks: rank r starts at "
         "r * num_items // world_size.",
         "Rank r stops where rank r + 1 starts, (r + 1) * num_items // world_size; return "
         "list(range(start, stop)). (Taking every world_size-th item from rank r on works too.)")),
    Exercise(
        "ring_shift", "01_point_to_point", "ring_shift(rank, world_size, tensor)",
        check_basics.check_ring_shift, solutions.ring_shift,
        ("Every rank sends to right = (rank + 1) % world_size and receives from "
         "left = (rank - 1) % world_size into a new tensor, torch.empty_like(tensor).",
         "If every rank calls dist.send first, every rank waits for a recv nobody posted (section 3): "
         "the checker will say 'Every rank is in dist.send'. Someone has to receive first.",
         "Let even ranks send then receive, and odd ranks receive then send (or start the send "
         "with req = dist.isend(...), then dist.recv(...), then req.wait()).")),
    Exercise(
        "ring_all_reduce", "02_collectives", "ring_all_reduce(rank, world_size, tensor)",
        check_basics.check_ring_all_reduce, solutions.ring_all_reduce,
        ("tensor.tensor_split(world_size) gives world_size views: adding into a view changes tensor "
         "itself, and it works with fewer numbers than ranks (some chunks are empty).",
         "In step s of the reduce-scatter, rank r sends chunk (r - s) % world_size to the right and "
         "adds what it receives from the left into chunk (r - s - 1) % world_size.",
         "Send with req = dist.isend(...), then dist.recv(...), then req.wait(): everyone sends at "
         "once without deadlock. The all-gather is the same loop, shifted by one chunk, copying "
         "instead of adding.")),
    Exercise(
        "mean_loss", "02_collectives", "mean_loss(rank, world_size, losses)",
        check_debugging.check_mean_loss, solutions.mean_loss,
        ("Every rank must make the same collective calls with tensors of the same shape, whatever its number of "
         "losses (none at all, too): all_reducing the list itself breaks that as soon as the ranks hold different "
         "numbers of losses.",
         "The mean of every loss is (sum over the ranks of their sums) / (sum over the ranks of their counts). "
         "A sum and a count are two numbers on every rank, an empty list included: sum([]) is 0.",
         "Put both in one tensor, torch.tensor([sum(losses), len(losses)], dtype=torch.float64), all_reduce it "
         "(SUM), and return (total[0] / total[1]).item().")),
    Exercise(
        "bucketed_average", "03_data_parallel", "bucketed_average(model)",
        check_basics.check_bucketed_average, solutions.bucketed_average,
        ("One all_reduce means one tensor: torch.cat([p.grad.flatten() for p in model.parameters()]).",
         "After dist.all_reduce(flat) every rank holds the sum; divide by dist.get_world_size() to "
         "get the average.",
         "Walk the parameters again with an offset: p.grad.copy_(flat[offset:offset + n].view_as(p.grad)), "
         "then offset += n.")),
    Exercise(
        "remote_sum", "04_rpc_rref", "remote_sum(rrefs)",
        _check_remote_sum, solutions.remote_sum,
        ("rref.to_here() copies the value an RRef points to into this process.",
         "Sum the fetched tensors: torch.stack([r.to_here() for r in rrefs]).sum(0).",
         "To fetch them all at once: futures = [r.rpc_async().clone() for r in rrefs], then "
         "torch.futures.wait_all(futures) gives the tensors."),
        context=_rpc_world),
    Exercise(
        "activation_shape", "05_model_parallel", "activation_shape(cut, batch_size, image_size)",
        check_pipeline.check_activation_shape, solutions.activation_shape,
        ("The shape is (batch_size, channels, side, side); the channels after stem, layer1, layer2, "
         "layer3 are 64, 256, 512, 1024.",
         "Each stride-2 step halves the side: the stem has two (convolution, max-pool), layer2 and "
         "layer3 one each; layer1 has none.",
         "A stride-2 step rounds up: side = (side + 1) // 2, so 97 becomes 49.")),
    Exercise(
        "pipeline_time", "06_pipeline",
        "pipeline_time(forward_times, backward_times, batch_size, microbatch_size)",
        check_pipeline.check_pipeline_time, solutions.pipeline_time,
        ("First the number of micro-batches: math.ceil(batch_size / microbatch_size); the smaller "
         "last one takes a full turn.",
         "With m micro-batches the forward takes sum(forward_times) (the first micro-batch through "
         "every stage) plus (m - 1) turns of the slowest stage.",
         "The backward runs the same way in reverse: add sum(backward_times) + (m - 1) * "
         "max(backward_times).")),
    Exercise(
        "best_num_microbatches", "06_pipeline",
        "best_num_microbatches(forward, backward, fixed_seconds, overhead_seconds, candidates)",
        check_pipeline.check_best_num_microbatches, solutions.best_num_microbatches,
        ("With m micro-batches each stage needs forward[s] / m and backward[s] / m per micro-batch: "
         "the stage times you get are for the whole batch.",
         "The bubble bound for m is predict([f / m for f in forward], [b / m for b in backward], m).total "
         "(or exercise 1's formula with m micro-batches); add fixed_seconds.",
         "Then add overhead_seconds * (m - 1) and return min(sorted(candidates), key=that time).")),
    Exercise(
        "slurm_to_torchrun", "07_two_machines", "slurm_to_torchrun(env)",
        check_launch.check_slurm_to_torchrun, solutions.slurm_to_torchrun,
        ("RANK is SLURM_PROCID, WORLD_SIZE is SLURM_NTASKS, LOCAL_RANK is SLURM_LOCALID; every value "
         "stays a string.",
         "MASTER_PORT: SLURM picks none, so env.get('MASTER_PORT', '29500').",
         "MASTER_ADDR is the first host of SLURM_NODELIST: 'node[07-08]' -> 'node07', "
         "'login2,cn[10-11]' -> 'login2', 'n[1,3-4]' -> 'n1'. Split on the first '[' "
         "(str.partition) and look at what comes before it.")),
    Exercise(
        "microbatches_held", "08_modern_pipelining", "microbatches_held(schedule, num_stages, num_microbatches)",
        check_pipeline.check_microbatches_held, solutions.microbatches_held,
        ("GPipe runs every forward before any backward: how many micro-batches does each stage hold "
         "just before its first backward?",
         "In 1F1B stage s (from 0) runs num_stages - s forwards before its first backward, then "
         "alternates one backward, one forward.",
         "A stage cannot hold more micro-batches than there are: min(num_microbatches, num_stages - s).")),
    Exercise(
        "predict_peak", "08b_step_memory", "predict_peak(size, seq_len, microbatch_size)",
        check_memory.check_predict_peak, solutions.predict_peak,
        ("The peak is at the start of backward, when every activation is still kept. Which of the 4 + 4 + 8 "
         "bytes per parameter exist then? zero_grad(set_to_none=True) freed the last step's gradients.",
         "What autograd keeps: size.layers layers, each kept_formula's breakdown in fp32 with no dropout (16 sbh "
         "values, plus a s^2 b for the attention matrix; with size.attention == 'sdpa' no matrix, but the "
         "kernel's output, s b h, and a log-sum-exp, a s b). Outside the layers: the token ids and targets "
         "(int64, s b each), the final norm's and the head's inputs (s b h floats each), the log-probabilities "
         "(s b vocab floats).",
         "Backward's first operator, cross-entropy's, makes two tensors of the logits' size at once: the "
         "gradients of the log-probabilities and of the logits, 2 * 4 * s * b * vocab bytes.")),
    Exercise(
        "predict_mfu", "08c_step_speed",
        "predict_mfu(size, seq_len, tokens_per_step, recompute, step_seconds, peak_flops)",
        check_speed.check_predict_mfu, solutions.predict_mfu,
        ("MFU = the model's FLOPs in the step / step_seconds / peak_flops. The model's FLOPs per token are 6N "
         "(2 forward, 4 backward) plus attention's 12 x layers x seq_len x d_model; multiply by tokens_per_step.",
         "N is the whole model's weights that multiply: each layer has qkv (3 h^2), the projection (h^2) and the "
         "MLP (8 h^2), 12 h^2 with h = size.d_model, times size.layers; add the head, h x size.vocab. The "
         "embedding is a lookup, biases and norms are elementwise: none of them is in N.",
         "recompute does not change the answer: MFU counts the model's FLOPs, not what the implementation runs "
         "twice (that is HFU).")),
    Exercise(
        "zero2_grad_shard", "09_sharded_data_parallel", "zero2_grad_shard(grad, rank, world_size)",
        check_sharding.check_zero2_grad_shard, solutions.zero2_grad_shard,
        ("The result has grad.numel() // world_size values: make it with torch.empty(grad.numel() // "
         "world_size, dtype=grad.dtype) and let one collective fill it.",
         "dist.reduce_scatter_single(out, grad) (reduce_scatter_tensor before torch 2.14) sums every "
         "rank's grad and leaves slice r of the sum on rank r; op=dist.ReduceOp.SUM is the default.",
         "The sum is not the average yet: divide the slice by world_size. No all_reduce anywhere.")),
    Exercise(
        "row_parallel_forward", "10_tensor_parallel", "row_parallel_forward(x_part, weight_part, bias)",
        check_sharding.check_row_parallel_forward, solutions.row_parallel_forward,
        ("x @ W.T is a sum over the input features: x[:, cols] @ W[:, cols].T is this rank's share of "
         "that sum, the same shape as the full output.",
         "One dist.all_reduce of the partial products (SUM, in place) gives every rank the full x @ W.T.",
         "Add the bias after the all_reduce: added before it, it would be counted world_size times.")),
    Exercise(
        "sequence_shard_of_sum", "10_tensor_parallel", "sequence_shard_of_sum(partial)",
        check_sequence.check_sequence_shard_of_sum, solutions.sequence_shard_of_sum,
        ("Under TP a dist.all_reduce would give every rank the whole sum; here each rank needs only its tokens: "
         "a reduce_scatter sums and hands rank r the r-th block of the input, along dim 0.",
         "The tokens are dim 1. Move them first with partial.transpose(0, 1).contiguous(): rank r's tokens are "
         "then the r-th block of rows, which is what dist.reduce_scatter_tensor (reduce_scatter_single in torch "
         "2.14) gives rank r.",
         "Make the output torch.empty((seq // world_size, batch, d_model)), reduce_scatter into it with "
         "op=dist.ReduceOp.SUM, and transpose it back to (batch, seq // world_size, d_model).")),
    Exercise(
        "first_bucket", "10b_overlap", "first_bucket(params, bucket_cap_mb)",
        check_overlap.check_first_bucket, solutions.first_bucket,
        ("Backward runs from the loss back to the input: which layer's gradients exist first? A bucket's "
         "all-reduce can start as soon as every gradient in it is ready, and DDP launches its buckets in order.",
         "DDP fills its buckets in reverse parameter order, so that bucket 0 is the one ready first: walk "
         "reversed(params), adding up each parameter's bytes.",
         "A bucket closes once its bytes reach the cap, int(bucket_cap_mb * 1024 * 1024), with the parameter "
         "that crossed it inside: append the name, add its bytes, then stop when size >= cap.")),
    Exercise(
        "merge_partials", "11_context_parallel", "merge_partials(out_a, lse_a, out_b, lse_b)",
        check_attention.check_merge_partials, solutions.merge_partials,
        ("exp(lse) is a row's softmax denominator over its keys. Over the keys of A and B together the "
         "denominator is exp(lse_a) + exp(lse_b), so the merged lse is log(exp(lse_a) + exp(lse_b)).",
         "out_a is A's exp-weighted values divided by A's denominator. Re-weight each part by its share "
         "of the merged one: out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse); lse has one value "
         "per row, so .unsqueeze(-1) it to multiply the (rows, head_dim) outputs.",
         "exp(lse_a) overflows float32 once lse_a passes ~88: get lse with torch.logaddexp(lse_a, lse_b) "
         "(or m = max, then m + log(exp(lse_a - m) + exp(lse_b - m))). Then both exponents, lse_a - lse and "
         "lse_b - lse, are <= 0, and a part with lse -inf simply gets weight 0.")),
    Exercise(
        "dispatch_splits", "12_expert_parallel", "dispatch_splits(tokens_per_expert, world_size)",
        check_moe.check_dispatch_splits, solutions.dispatch_splits,
        ("Rank q holds a block of experts, q x n .. q x n + n - 1 with n = experts / world_size: "
         "tokens_per_expert.view(world_size, -1) has one row per rank, and each row's sum is what you send "
         "that rank: input_splits.",
         "output_splits[q] is what rank q sends you, which only rank q knows; but every rank has just computed "
         "its own input_splits. One dist.all_to_all_single(output_splits, input_splits) with the default equal "
         "splits sends entry q to rank q and puts what rank q sent in entry q.",
         "Make output_splits with torch.empty_like(input_splits) (int64, one value per rank) and return both "
         "as lists of ints: input_splits.tolist(), output_splits.tolist().")),
    Exercise(
        "choose_mesh", "13_composition", "choose_mesh(meshes, budget, memory_of)",
        check_composition.check_choose_mesh, solutions.choose_mesh,
        ("Put the meshes in the order you would prefer them: sorted(meshes, key=...) with a key that puts "
         "a larger dp first and, for the same dp, a smaller tp first: key=lambda m: (-m[0], m[2]).",
         "Walk that order and return the first mesh whose memory_of(mesh) is at most budget: the first that "
         "fits is the best. Ask memory_of rather than the formula: it counts the activations too, and "
         "the formula spreads every parameter evenly over the stages and tp ranks, which they are not.",
         "If the loop ends without a mesh that fits, return None.")),
    Exercise(
        "predict_step", "13_composition", "predict_step(mesh, compute_s, links, calls, sent, m)",
        check_throughput.check_predict_step, solutions.predict_step,
        ("Start from the compute: GPipe sends m micro-batches through pp stages in m + pp - 1 slots, so the step "
         "takes compute_s x (m + pp - 1) / m; with pp = 1 that is compute_s.",
         "Then each dimension (\"dp\", \"pp\", \"tp\", in the mesh's order) whose degree n is above 1: each call "
         "name in calls[dim] costs count x links[call, n].latency_s, except a send, which goes between two ranks "
         "(links[\"send_recv\", 2]), and a recv, the other side of a send, which costs nothing more.",
         "Last, each such dimension's bytes: sent[dim] / the smallest bytes_per_s of the links its calls used.")),
)

BY_NAME = {exercise.name: exercise for exercise in EXERCISES}


def get(name: str) -> Exercise:
    """The exercise called ``name``; a ConfigError listing the names otherwise."""
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise ConfigError(f"there is no exercise called {name!r}; the exercises are "
                          f"{', '.join(BY_NAME)}.") from None
