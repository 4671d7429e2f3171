"""The plausible wrong answers of docs/exercises.md, one function each: every checker fails each with a message
that names the mistake, and the right answers (other than the registered solution) pass.

The wrong answers the older test files already hold (tests/test_lessons_*exercise*.py) are not repeated here;
docs/exercises.md says where each row is tested. The checkers that need ranks share one 6-rank cluster (bare6).
"""

from __future__ import annotations

import math
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch.distributed import all_reduce as imported_all_reduce

from ppkit.errors import ExerciseFailed
from ppkit.exercises import (
    check_attention,
    check_basics,
    check_debugging,
    check_launch,
    check_pipeline,
    check_sequence,
    check_sharding,
    solutions,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# -- sequence_shard_of_sum (10 §6) -----------------------------------------------------------------

def my_tokens(t):
    n, r = dist.get_world_size(), dist.get_rank()
    per = t.shape[1] // n
    return t[:, r * per:(r + 1) * per]


def all_reduce_then_slice(partial):  # imported as `from torch.distributed import all_reduce`: still counted
    imported_all_reduce(partial)
    return my_tokens(partial)


def gather_then_add(partial):
    parts = [torch.empty_like(partial) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, partial)
    return my_tokens(sum(parts))


def scatter_on(partial, op=dist.ReduceOp.SUM, back=True):
    seq_first = partial.transpose(0, 1).contiguous()
    shard = torch.empty((seq_first.shape[0] // dist.get_world_size(), *seq_first.shape[1:]))
    reduce_scatter(shard, seq_first, op=op)
    return shard.transpose(0, 1) if back else shard


def batch_split(partial):  # no transpose: dim 0 is the batch
    shard = torch.empty((partial.shape[0] // dist.get_world_size(), *partial.shape[1:]))
    reduce_scatter(shard, partial)
    return shard


def not_transposed_back(partial):
    return scatter_on(partial, back=False)


def averaged(partial):
    return scatter_on(partial) / dist.get_world_size()


def maximum(partial):
    return scatter_on(partial, op=dist.ReduceOp.MAX)


def next_ranks_tokens(partial):
    seq_first = partial.transpose(0, 1).contiguous().roll(-(partial.shape[1] // dist.get_world_size()), 0)
    shard = torch.empty((seq_first.shape[0] // dist.get_world_size(), *seq_first.shape[1:]))
    reduce_scatter(shard, seq_first)
    return shard.transpose(0, 1)


def own_tokens_only(partial):
    return my_tokens(partial)


def asynchronous(partial):
    seq_first = partial.transpose(0, 1).contiguous()
    shard = torch.empty((seq_first.shape[0] // dist.get_world_size(), *seq_first.shape[1:]))
    reduce_scatter(shard, seq_first, async_op=True).wait()
    return shard.transpose(0, 1)


def list_form(partial):
    blocks = [b.contiguous() for b in partial.chunk(dist.get_world_size(), dim=1)]
    out = torch.empty_like(blocks[0])
    dist.reduce_scatter(out, blocks)
    return out


@pytest.mark.parametrize("fn, says", [
    (all_reduce_then_slice, r"rank 0 of 2 got the right tokens, but you all-reduced the whole tensor and kept your "
                            r"slice: that sends twice what reduce_scatter sends \(288 bytes per rank against 144\)"),
    (gather_then_add, r"rank 0 of 3 got the right tokens, but gathering every rank's partial sum and adding them up "
                      r"sent 576 bytes \(all_gather of 864 bytes\) where one reduce_scatter sends 192: 3.0 times"),
    (batch_split, r"rank 1 of 2 returned batch row\(s\) 1..1 of the sum, all tokens: reduce_scatter splits dim 0"),
    (batch_split, r"rank 0 of 3: reduce_scatter cut dim 0 of its input into 3 blocks, and dim 0 is the batch"),
    (not_transposed_back, r"rank 0 of 2 returned its tokens as \(seq, batch, d_model\) \(6, 2, 3\): transpose back"),
    (averaged, r"rank 0 of 4 returned the sum divided by world_size \(4\)"),
    (maximum, r"rank 0 of 2 returned the element-wise MAX of the partial sums: reduce with op=dist.ReduceOp.SUM"),
    (next_ranks_tokens, r"rank 0 of 3 got the tokens of rank 1"),
    (own_tokens_only, r"rank 2 of 3 returned its own partial sum's tokens: the ranks' partial sums are not added"),
])
def test_sequence_shard_mistakes_are_named(bare6, fn, says):
    with pytest.raises(ExerciseFailed, match=says):
        check_sequence.check_sequence_shard_of_sum(fn, cluster=bare6)


def test_sequence_shard_right_answers_pass_asynchronous_or_in_list_form(bare6):
    for fn in (asynchronous, list_form):
        assert check_sequence.check_sequence_shard_of_sum(fn, cluster=bare6).passed


# -- ring_shift (01) and ring_all_reduce (02) ------------------------------------------------------

def the_wrong_way(rank, world_size, tensor):
    out = torch.empty_like(tensor)
    req = dist.isend(tensor, (rank - 1) % world_size)
    dist.recv(out, (rank + 1) % world_size)
    req.wait()
    return out


def no_wrap_around(rank, world_size, tensor):
    out = torch.empty_like(tensor)
    req = dist.isend(tensor, dst=rank + 1)
    dist.recv(out, (rank - 1) % world_size)
    req.wait()
    return out


def averages(rank, world_size, tensor):
    return solutions.ring_all_reduce(rank, world_size, tensor) / world_size


def reduce_scatter_half_only(rank, world_size, tensor):
    chunks = tensor.tensor_split(world_size)
    for step in range(world_size - 1):
        incoming = chunks[(rank - step - 1) % world_size]
        buffer = torch.empty_like(incoming)
        req = dist.isend(chunks[(rank - step) % world_size].contiguous(), (rank + 1) % world_size)
        dist.recv(buffer, (rank - 1) % world_size)
        req.wait()
        incoming += buffer
    return tensor


RING = [
    (check_basics.check_ring_shift, the_wrong_way,
     r"world_size 3, 1 element\(s\): rank 0 holds rank 1's tensor, its right neighbour's: the ring runs the wrong way"),
    (check_basics.check_ring_shift, no_wrap_around,
     r"ring shift: rank \d .*died during the job.*The usual cause here: a dist.send/recv \(or isend/irecv\) to a rank "
     r"outside 0..world_size-1"),
    (check_basics.check_ring_all_reduce, averages,
     r"world_size 2, 1 element\(s\): rank 0 is wrong .*\(it is the sum divided by world_size, 2"),
    (check_basics.check_ring_all_reduce, reduce_scatter_half_only,
     r"world_size 2, 7 element\(s\): rank 0 is wrong .*\(only chunk 1 holds the sum: .* the all-gather half"),
]


# -- bucketed_average (03), mean_loss (02) ---------------------------------------------------------

def never_copied_back(model):
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()


def averages_the_means(rank, world_size, losses):
    mean = torch.tensor([sum(losses) / max(len(losses), 1)], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    return mean.item()


DATA_PARALLEL = [
    (check_basics.check_bucketed_average, never_copied_back,
     r"rank 0, gradient of '.*' differs .*\(it is this rank's own gradient, unchanged: the averaged flat tensor was "
     r"never copied back"),
    (check_debugging.check_mean_loss, averages_the_means,
     r"losses per rank \[3, 2\]: rank\(s\) \[0, 1\] returned 0.71875, the mean of the ranks' own means"),
]


# -- zero2_grad_shard (09), row_parallel_forward (10) ----------------------------------------------

def gathers_every_gradient(grad, rank, world_size):
    parts = [torch.empty_like(grad) for _ in range(world_size)]
    dist.all_gather(parts, grad)
    size = grad.numel() // world_size
    return torch.stack(parts).sum(0)[rank * size:(rank + 1) * size] / world_size


def averages_the_partials(x_part, weight_part, bias):
    y = x_part @ weight_part.T
    dist.all_reduce(y)
    return y / dist.get_world_size() + bias


def gathers_the_partials(x_part, weight_part, bias):
    y = x_part @ weight_part.T
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, y)
    return sum(parts) + bias


SHARDING = [
    (check_sharding.check_zero2_grad_shard, gathers_every_gradient,
     r"world_size 2, 12 gradient values: rank 0 got the right slice but sent 48 bytes \(all_gather of 96 bytes\), "
     r"where one reduce_scatter sends 24"),
    (check_sharding.check_row_parallel_forward, averages_the_partials,
     r"world_size 2: rank 0's output is the sum of the partial products divided by world_size \(2\)"),
    (check_sharding.check_row_parallel_forward, gathers_the_partials,
     r"world_size 2: rank 0 got the right output with 0 dist.all_reduce calls \(all_gather of 120 bytes"),
]


@pytest.mark.parametrize("check, fn, says", RING + DATA_PARALLEL + SHARDING)
def test_rank_checkers_name_each_mistake(bare6, check, fn, says):
    with pytest.raises(ExerciseFailed, match=says):
        check(fn, cluster=bare6)


# -- the checkers that run in the kernel --------------------------------------------------------------

def floor_shares(rank, world_size, num_items):
    per = num_items // world_size
    return list(range(rank * per, (rank + 1) * per))


def everything_everywhere(rank, world_size, num_items):
    return list(range(num_items))


def ranks_from_one(rank, world_size, num_items):
    return list(range((rank + 1) * num_items // world_size, (rank + 2) * num_items // world_size))


def local_rank_from_procid(env):
    return {**solutions.slurm_to_torchrun(env), "LOCAL_RANK": env["SLURM_PROCID"]}


def numbers_not_strings(env):
    return {k: int(v) if v.isdigit() else v for k, v in solutions.slurm_to_torchrun(env).items()}


def channels_last(cut, batch_size, image_size):
    b, c, h, w = solutions.activation_shape(cut, batch_size, image_size)
    return b, h, w, c


def slowest_stage_turns(forward_times, backward_times, batch_size, microbatch_size):
    m = math.ceil(batch_size / microbatch_size)
    return (m + len(forward_times) - 1) * (max(forward_times) + max(backward_times))


def no_fill(forward_times, backward_times, batch_size, microbatch_size):
    return math.ceil(batch_size / microbatch_size) * (max(forward_times) + max(backward_times))


def gpipe_everywhere(schedule, num_stages, num_microbatches):
    return [num_microbatches] * num_stages


def weights_not_unsqueezed(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse) + out_b * torch.exp(lse_b - lse), lse


@pytest.mark.parametrize("check, fn, says", [
    (check_launch.check_my_share, floor_shares,
     r"world_size 2, 1 items: no rank handles item\(s\) \[0\] \(the last num_items % world_size = 1: a share of "
     r"num_items // world_size items per rank leaves the remainder out"),
    (check_launch.check_my_share, everything_everywhere,
     r"world_size 2, 1 items: item 0 is handled by ranks \[0, 1\]"),
    (check_launch.check_my_share, ranks_from_one, r"world_size 1, 4 items: item\(s\) \[4, 5, 6, 7\] do not exist"),
    (check_launch.check_slurm_to_torchrun, local_rank_from_procid,
     r"expected LOCAL_RANK='0', got '1' \(that is SLURM_PROCID, the rank in the whole job"),
    (check_launch.check_slurm_to_torchrun, numbers_not_strings,
     r"RANK is int 1; environment variables are strings \(os.environ refuses anything else\)"),
    (check_pipeline.check_activation_shape, channels_last,
     r"cut after 'stem', batch 1, 32x32 images: expected \(1, 64, 8, 8\), got \(1, 8, 8, 64\) \(that is channels "
     r"last"),
    (check_pipeline.check_pipeline_time, slowest_stage_turns,
     r"batch 16, micro-batch size 8 \(2 micro-batches\): expected 10.5 s, got 13.5 s \(that is \(m \+ S - 1\) turns"),
    (check_pipeline.check_pipeline_time, no_fill, r"expected 10.5 s, got 9 s \(that is m turns of the slowest stage "
                                                  r"with no fill"),
    (check_pipeline.check_microbatches_held, gpipe_everywhere,
     r"1f1b, 2 stages, 4 micro-batches: expected \[2, 1\], got \[4, 4\] \(that is GPipe's"),
    (check_attention.check_merge_partials, weights_not_unsqueezed,
     r"keys split 3 \+ 5: your function raised RuntimeError: .*\.unsqueeze\(-1\) the weights"),
])
def test_kernel_side_mistakes_are_named(check, fn, says):
    with pytest.raises(ExerciseFailed, match=says):
        check(fn)
