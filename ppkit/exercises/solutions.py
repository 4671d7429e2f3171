"""One correct solution per exercise, out of the learner's notebook but one step away.

``workbook.solution("ring_shift")`` prints one of these; ``%load -s ring_shift <this file>`` puts it in
a cell. Each function is exactly what goes into its notebook's exercise cell (the names it uses,
``torch``, ``dist``, ``math``, are the ones that notebook has imported), and
nbval runs every notebook with these in place of the stubs (``tests/solved_notebooks.py``), so a
solution and its notebook cannot drift apart.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ppkit.pipeline.bubble import predict


def my_share(rank, world_size, num_items):
    start = rank * num_items // world_size          # contiguous blocks whose sizes differ by at most 1
    stop = (rank + 1) * num_items // world_size
    return list(range(start, stop))


def ring_shift(rank, world_size, tensor):
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    received = torch.empty_like(tensor)
    if rank % 2 == 0:                                # even ranks send first, odd ranks receive first
        dist.send(tensor, dst=right)
        dist.recv(received, src=left)
    else:
        dist.recv(received, src=left)
        dist.send(tensor, dst=right)
    return received


def ring_all_reduce(rank, world_size, tensor):
    chunks = list(tensor.tensor_split(world_size))   # views: adding into a chunk updates tensor
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):               # reduce-scatter
        send_i, recv_i = (rank - step) % world_size, (rank - step - 1) % world_size
        incoming = torch.empty_like(chunks[recv_i])
        req = dist.isend(chunks[send_i], dst=right)  # isend: everyone sends at once without deadlock
        dist.recv(incoming, src=left)
        req.wait()
        chunks[recv_i] += incoming
    for step in range(world_size - 1):               # all-gather
        send_i, recv_i = (rank - step + 1) % world_size, (rank - step) % world_size
        req = dist.isend(chunks[send_i], dst=right)
        dist.recv(chunks[recv_i], src=left)
        req.wait()
    return tensor


def mean_loss(rank, world_size, losses):
    """Notebook 02: the mean of every rank's losses; the same two numbers from every rank, even one with none."""
    total = torch.tensor([sum(losses), len(losses)], dtype=torch.float64)  # this rank's sum and count
    dist.all_reduce(total)                                                 # same shape on every rank
    return (total[0] / total[1]).item()


def logged_train_loop(rank, world_size, steps):
    """Notebook 02's planted bug fixed: every rank calls the loss's all_reduce at the logged steps."""
    from ppkit.lessons.collective_bug import LOG_EVERY, LR, batch, loss_and_grad

    weights, logged = torch.zeros(3), []
    for step in range(steps):
        loss, grad = loss_and_grad(weights, *batch(rank, step))
        dist.all_reduce(grad)
        weights -= LR * grad / world_size
        if step % LOG_EVERY == 0:                      # every rank, at the same steps: the same collectives
            dist.all_reduce(loss)
            logged.append(loss.item() / world_size)
            if rank == 0:                              # only the printing is rank 0's
                print(f"step {step}: mean loss {logged[-1]:.4f}")
    return logged, weights.tolist()


def bucketed_average(model):
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.flatten() for g in grads])     # one bucket holding every gradient
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:                                    # copy each slice back where it came from
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def remote_sum(rrefs):
    futures = [r.rpc_async().clone() for r in rrefs]   # all fetches in flight at once
    return torch.stack(torch.futures.wait_all(futures)).sum(0)


def activation_shape(cut, batch_size, image_size):
    channels = {"stem": 64, "layer1": 256, "layer2": 512, "layer3": 1024}[cut]
    halvings = {"stem": 2, "layer1": 2, "layer2": 3, "layer3": 4}[cut]  # stride-2 steps before the cut
    side = image_size
    for _ in range(halvings):
        side = (side + 1) // 2  # a stride-2 step rounds up: 97 -> 49
    return (batch_size, channels, side, side)


def pipeline_time(forward_times, backward_times, batch_size, microbatch_size):
    m = math.ceil(batch_size / microbatch_size)  # the smaller last micro-batch counts too
    forward = sum(forward_times) + (m - 1) * max(forward_times)
    backward = sum(backward_times) + (m - 1) * max(backward_times)
    return forward + backward


def best_num_microbatches(forward, backward, fixed_seconds, overhead_seconds, candidates):
    def step_time(m):
        ideal = predict([f / m for f in forward], [b / m for b in backward], m).total  # the bubble bound
        return fixed_seconds + ideal + overhead_seconds * (m - 1)

    return min(sorted(candidates), key=step_time)  # sorted: the smaller count wins a tie


def slurm_to_torchrun(env):
    nodelist = env["SLURM_NODELIST"]
    prefix, _, rest = nodelist.partition("[")
    if "," in prefix:            # "login2,cn[10-11]": the first host has no brackets
        first_host = prefix.split(",")[0]
    elif rest:                   # "node[07-08]", "n[1,3-4]": the prefix and the first number inside
        first_host = prefix + rest.split("]")[0].split(",")[0].split("-")[0]
    else:                        # a single host
        first_host = prefix
    return {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_NTASKS"],
            "LOCAL_RANK": env["SLURM_LOCALID"], "MASTER_ADDR": env.get("MASTER_ADDR", first_host),
            "MASTER_PORT": env.get("MASTER_PORT", "29500")}  # SLURM chooses no port


def microbatches_held(schedule, num_stages, num_microbatches):
    if schedule == "gpipe":  # every forward before any backward
        return [num_microbatches] * num_stages
    # 1F1B: stage s runs S - s forwards before its first backward, then one backward per forward
    return [min(num_microbatches, num_stages - s) for s in range(num_stages)]


def predict_peak(size, seq_len, microbatch_size):
    """Notebook 08b: one fp32 Adam step's peak, at the start of backward: weights, Adam, activations, cross-entropy."""
    s, b, h, a, v = seq_len, microbatch_size, size.d_model, size.heads, size.vocab
    static = 12 * size.params()                    # weights 4, Adam's moments 8; no gradients yet (set_to_none)
    per_layer = 4 * 16 * s * b * h                 # fp32 values kept by one block: norms 2, attention 5, MLP 9 sbh
    if size.attention == "math":
        per_layer += 4 * a * s * s * b             # the softmax output: an s x s matrix per head
    else:
        per_layer += 4 * (s * b * h + a * s * b)   # SDPA keeps its output and a log-sum-exp per row and head
    outside = 2 * 8 * s * b + 4 * (2 * s * b * h + s * b * v)  # ids, targets, norm and head inputs, log-probs
    cross_entropy = 2 * 4 * s * b * v              # backward's start: gradients of the log-probs and the logits
    return static + size.layers * per_layer + outside + cross_entropy


def zero2_grad_shard(grad, rank, world_size):
    """Notebook 09: my slice of the gradient averaged over the ranks, by one reduce_scatter."""
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in 2.14
    shard = torch.empty(grad.numel() // world_size, dtype=grad.dtype)
    reduce_scatter(shard, grad, op=dist.ReduceOp.SUM)
    return shard / world_size


def row_parallel_forward(x_part, weight_part, bias):
    """Notebook 10: each rank's partial product, summed over the ranks, then the bias once."""
    y = x_part @ weight_part.T
    dist.all_reduce(y)
    return y + bias


def sequence_shard_of_sum(partial):
    """Notebook 10: this rank's tokens of the ranks' sum, by one reduce_scatter (half of an all_reduce)."""
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in 2.14
    n = dist.get_world_size()
    seq_first = partial.transpose(0, 1).contiguous()  # (seq, batch, d): rank r's tokens are the r-th block of rows
    shard = torch.empty((seq_first.shape[0] // n, *seq_first.shape[1:]), dtype=partial.dtype)
    reduce_scatter(shard, seq_first, op=dist.ReduceOp.SUM)
    return shard.transpose(0, 1)
def merge_partials(out_a, lse_a, out_b, lse_b):
    """Notebook 11: attention over the keys of A and B from the attention over each (log-sum-exp)."""
    lse = torch.logaddexp(lse_a, lse_b)                # log(exp(lse_a) + exp(lse_b)), with no overflow
    weight_a = torch.exp(lse_a - lse).unsqueeze(-1)    # A's share of each row's softmax denominator
    weight_b = torch.exp(lse_b - lse).unsqueeze(-1)    # both exponents are <= 0
    return out_a * weight_a + out_b * weight_b, lse


def dispatch_splits(tokens_per_expert, world_size):
    """Notebook 12: rows this rank sends to each rank, and rows it will receive from each (counts sent first)."""
    input_splits = tokens_per_expert.view(world_size, -1).sum(1)  # rank q holds the q-th block of experts
    output_splits = torch.empty_like(input_splits)
    dist.all_to_all_single(output_splits, input_splits)          # entry q arrives from rank q: what it sends me
    return input_splits.tolist(), output_splits.tolist()


def choose_mesh(meshes, budget, memory_of):
    # most data parallelism first (its traffic overlaps with compute), then the least tensor parallelism
    for mesh in sorted(meshes, key=lambda m: (-m[0], m[2])):
        if memory_of(mesh) <= budget:                # measured: state + activations, as held
            return mesh
    return None


def predict_step(mesh, compute_s, optimizer_s, links, calls, sent, m):
    """Notebook 13: a mesh's step time from its compute, each dimension's calls and bytes, and GPipe's bubble."""
    cost = {}
    for dim, n in zip(("dp", "pp", "tp"), mesh):
        cost[dim], used = 0.0, []
        for call, count in calls.get(dim, {}).items():
            if n == 1 or call == "recv":                # no group to talk to; a recv is the other side of a send
                continue
            link = links["send_recv", 2] if call == "send" else links[call, n]  # a send goes between two ranks
            cost[dim] += count * link.latency_s
            used.append(link)
        if used:
            cost[dim] += sent.get(dim, 0) / min(link.bytes_per_s for link in used)
    slots = compute_s + cost["pp"] + cost["tp"]         # what each micro-batch's slot holds: its sends, tp's calls
    once = optimizer_s + cost["dp"]                     # Adam after the flush; dp once (an approximation)
    return slots * (m + mesh[1] - 1) / m + once         # m micro-batches through pp stages: pp - 1 more slots


def first_bucket(params, bucket_cap_mb):
    cap = int(bucket_cap_mb * 1024 * 1024)
    bucket, size = [], 0
    for name, nbytes in reversed(params):  # backward makes the last layer's gradients first
        bucket.append(name)
        size += nbytes
        if size >= cap:                     # a bucket closes once it reaches the cap, with the one that crossed it
            break
    return bucket


def predict_mfu(size, seq_len, tokens_per_step, recompute, step_seconds, peak_flops):
    """Notebook 08c: the model's FLOPs of a step (6N plus attention per token) over its time and the peak."""
    h = size.d_model
    n = size.layers * 12 * h * h + h * size.vocab     # weights that multiply: qkv, proj, MLP per layer; the head
    per_token = 6 * n + 12 * size.layers * seq_len * h  # forward 2, backward 4; attention's Q K^T and weights x V
    return per_token * tokens_per_step / step_seconds / peak_flops  # recomputation is not the model's work


def tp_mlp(x, fc1, fc2, log):
    """Notebook 14's planted bug fixed: the block's input goes through Megatron's f (all_reduce in backward)."""
    import torch.nn.functional as F

    from ppkit.lessons.tensor_parallel import copy_to_parallel, reduce_from_parallel

    x = copy_to_parallel(x, log, "fc1")                        # identity forward; backward: every rank's part summed
    hidden = F.gelu(fc1(x))                                    # my hidden features only
    partial = F.linear(hidden, fc2.weight)                     # my share of the block's output
    return reduce_from_parallel(partial, log, "fc2") + fc2.bias  # summed over ranks, the bias added once
