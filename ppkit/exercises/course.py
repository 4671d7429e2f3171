"""The course's exercises as plain data, in course order: each one's name (also the name of the function the
learner writes), its notebook (file name without .ipynb), how the checker calls it, and its hints (from a nudge
to nearly the answer; the solution comes after them).

Only literals, no import: ``ppkit.exercises.catalog`` joins each entry to its checker and solution, and the
instructor's ``ppkit room`` reads the notebooks' exercise lists from here without importing torch or a checker.
tests/test_progress_one_record.py keeps it that way.
"""

EXERCISES = (
    {
        "name": "my_share",
        "notebook": "00_start_here",
        "signature": "my_share(rank, world_size, num_items)",
        "hints": (
            "Each rank runs the same function and can only tell itself apart by `rank`: the answer for rank r must "
            "not overlap with any other rank's, and together they must cover range(num_items).",
            "Cut range(num_items) into world_size contiguous blocks: rank r starts at r * num_items // world_size.",
            "Rank r stops where rank r + 1 starts, (r + 1) * num_items // world_size; return list(range(start, "
            "stop)). (Taking every world_size-th item from rank r on works too.)",
        ),
    },
    {
        "name": "ring_shift",
        "notebook": "01_point_to_point",
        "signature": "ring_shift(rank, world_size, tensor)",
        "hints": (
            "Every rank sends to right = (rank + 1) % world_size and receives from left = (rank - 1) % world_size "
            "into a new tensor, torch.empty_like(tensor).",
            "If every rank calls dist.send first, every rank waits for a recv nobody posted (section 3): the "
            "checker will say 'Every rank is in dist.send'. Someone has to receive first.",
            "Let even ranks send then receive, and odd ranks receive then send (or start the send with req = "
            "dist.isend(...), then dist.recv(...), then req.wait()).",
        ),
    },
    {
        "name": "ring_all_reduce",
        "notebook": "02_collectives",
        "signature": "ring_all_reduce(rank, world_size, tensor)",
        "hints": (
            "tensor.tensor_split(world_size) gives world_size views: adding into a view changes tensor itself, and "
            "it works with fewer numbers than ranks (some chunks are empty).",
            "In step s of the reduce-scatter, rank r sends chunk (r - s) % world_size to the right and adds what "
            "it receives from the left into chunk (r - s - 1) % world_size.",
            "Send with req = dist.isend(...), then dist.recv(...), then req.wait(): everyone sends at once without "
            "deadlock. The all-gather is the same loop, shifted by one chunk, copying instead of adding.",
        ),
    },
    {
        "name": "mean_loss",
        "notebook": "02_collectives",
        "signature": "mean_loss(rank, world_size, losses)",
        "hints": (
            "Every rank must make the same collective calls with tensors of the same shape, whatever its number of "
            "losses (none at all, too): all_reducing the list itself breaks that as soon as the ranks hold "
            "different numbers of losses.",
            "The mean of every loss is (sum over the ranks of their sums) / (sum over the ranks of their counts). "
            "A sum and a count are two numbers on every rank, an empty list included: sum([]) is 0.",
            "Put both in one tensor, torch.tensor([sum(losses), len(losses)], dtype=torch.float64), all_reduce it "
            "(SUM), and return (total[0] / total[1]).item().",
        ),
    },
    {
        "name": "logged_train_loop",
        "notebook": "02_collectives",
        "signature": "logged_train_loop(rank, world_size, steps)",
        "hints": (
            "Run ppkit.lessons.collective_bug.planted_loop on 4 ranks and read the collective doctor's lines: "
            "which collective does rank 0 call that the others do not?",
            "Logging the mean loss is a collective: every rank must call it, at the same steps. Only the print "
            "may stay on rank 0.",
            "Keep the gradient all_reduce and its average as they are; take `rank == 0 and` out of the logging "
            "condition, and print inside `if rank == 0:`.",
        ),
    },
    {
        "name": "bucketed_average",
        "notebook": "03_data_parallel",
        "signature": "bucketed_average(model)",
        "hints": (
            "One all_reduce means one tensor: torch.cat([p.grad.flatten() for p in model.parameters()]).",
            "After dist.all_reduce(flat) every rank holds the sum; divide by dist.get_world_size() to get the "
            "average.",
            "Walk the parameters again with an offset: p.grad.copy_(flat[offset:offset + n].view_as(p.grad)), then "
            "offset += n.",
        ),
    },
    {
        "name": "remote_sum",
        "notebook": "04_rpc_rref",
        "signature": "remote_sum(rrefs)",
        "hints": (
            "rref.to_here() copies the value an RRef points to into this process.",
            "Sum the fetched tensors: torch.stack([r.to_here() for r in rrefs]).sum(0).",
            "To fetch them all at once: futures = [r.rpc_async().clone() for r in rrefs], then "
            "torch.futures.wait_all(futures) gives the tensors.",
        ),
    },
    {
        "name": "activation_shape",
        "notebook": "05_model_parallel",
        "signature": "activation_shape(cut, batch_size, image_size)",
        "hints": (
            "The shape is (batch_size, channels, side, side); the channels after stem, layer1, layer2, layer3 are "
            "64, 256, 512, 1024.",
            "Each stride-2 step halves the side: the stem has two (convolution, max-pool), layer2 and layer3 one "
            "each; layer1 has none.",
            "A stride-2 step rounds up: side = (side + 1) // 2, so 97 becomes 49.",
        ),
    },
    {
        "name": "pipeline_time",
        "notebook": "06_pipeline",
        "signature": "pipeline_time(forward_times, backward_times, batch_size, microbatch_size)",
        "hints": (
            "First the number of micro-batches: math.ceil(batch_size / microbatch_size); the smaller last one "
            "takes a full turn.",
            "With m micro-batches the forward takes sum(forward_times) (the first micro-batch through every stage) "
            "plus (m - 1) turns of the slowest stage.",
            "The backward runs the same way in reverse: add sum(backward_times) + (m - 1) * max(backward_times).",
        ),
    },
    {
        "name": "best_num_microbatches",
        "notebook": "06_pipeline",
        "signature": "best_num_microbatches(forward, backward, fixed_seconds, overhead_seconds, candidates)",
        "hints": (
            "With m micro-batches each stage needs forward[s] / m and backward[s] / m per micro-batch: the stage "
            "times you get are for the whole batch.",
            "The bubble bound for m is predict([f / m for f in forward], [b / m for b in backward], m).total (or "
            "exercise 1's formula with m micro-batches); add fixed_seconds.",
            "Then add overhead_seconds * (m - 1) and return min(sorted(candidates), key=that time).",
        ),
    },
    {
        "name": "slurm_to_torchrun",
        "notebook": "07_two_machines",
        "signature": "slurm_to_torchrun(env)",
        "hints": (
            "RANK is SLURM_PROCID, WORLD_SIZE is SLURM_NTASKS, LOCAL_RANK is SLURM_LOCALID; every value stays a "
            "string.",
            "MASTER_PORT: SLURM picks none, so env.get('MASTER_PORT', '29500').",
            "MASTER_ADDR is the first host of SLURM_NODELIST: 'node[07-08]' -> 'node07', 'login2,cn[10-11]' -> "
            "'login2', 'n[1,3-4]' -> 'n1'. Split on the first '[' (str.partition) and look at what comes before "
            "it.",
        ),
    },
    {
        "name": "microbatches_held",
        "notebook": "08_modern_pipelining",
        "signature": "microbatches_held(schedule, num_stages, num_microbatches)",
        "hints": (
            "GPipe runs every forward before any backward: how many micro-batches does each stage hold just before "
            "its first backward?",
            "In 1F1B stage s (from 0) runs num_stages - s forwards before its first backward, then alternates one "
            "backward, one forward.",
            "A stage cannot hold more micro-batches than there are: min(num_microbatches, num_stages - s).",
        ),
    },
    {
        "name": "predict_peak",
        "notebook": "08b_step_memory",
        "signature": "predict_peak(size, seq_len, microbatch_size)",
        "hints": (
            "The peak is at the start of backward, when every activation is still kept. Which of the 4 + 4 + 8 "
            "bytes per parameter exist then? zero_grad(set_to_none=True) freed the last step's gradients.",
            "What autograd keeps: size.layers layers, each kept_formula's breakdown in fp32 with no dropout (16 "
            "sbh values, plus a s^2 b for the attention matrix; with size.attention == 'sdpa' no matrix, but the "
            "kernel's output, s b h, and a log-sum-exp, a s b). Outside the layers: the token ids and targets "
            "(int64, s b each), the final norm's and the head's inputs (s b h floats each), the log-probabilities "
            "(s b vocab floats).",
            "Backward's first operator, cross-entropy's, makes two tensors of the logits' size at once: the "
            "gradients of the log-probabilities and of the logits, 2 * 4 * s * b * vocab bytes.",
        ),
    },
    {
        "name": "predict_mfu",
        "notebook": "08c_step_speed",
        "signature": "predict_mfu(size, seq_len, tokens_per_step, recompute, step_seconds, peak_flops)",
        "hints": (
            "MFU = the model's FLOPs in the step / step_seconds / peak_flops. The model's FLOPs per token are 6N "
            "(2 forward, 4 backward) plus attention's 12 x layers x seq_len x d_model; multiply by "
            "tokens_per_step.",
            "N is the whole model's weights that multiply: each layer has qkv (3 h^2), the projection (h^2) and "
            "the MLP (8 h^2), 12 h^2 with h = size.d_model, times size.layers; add the head, h x size.vocab (Kaplan "
            "et al.'s N leaves the head out by definition; here it counts, as FlopCounterMode counts it). The "
            "embedding is a lookup, biases and norms are elementwise: none of them is in N.",
            "recompute does not change the answer: MFU counts the model's FLOPs, not what the implementation runs "
            "twice (that is HFU).",
        ),
    },
    {
        "name": "zero2_grad_shard",
        "notebook": "09_sharded_data_parallel",
        "signature": "zero2_grad_shard(grad, rank, world_size)",
        "hints": (
            "The result has grad.numel() // world_size values: make it with torch.empty(grad.numel() // "
            "world_size, dtype=grad.dtype) and let one collective fill it.",
            "dist.reduce_scatter_single(out, grad) (reduce_scatter_tensor before torch 2.14) sums every rank's "
            "grad and leaves slice r of the sum on rank r; op=dist.ReduceOp.SUM is the default.",
            "The sum is not the average yet: divide the slice by world_size. No all_reduce anywhere.",
        ),
    },
    {
        "name": "row_parallel_forward",
        "notebook": "10_tensor_parallel",
        "signature": "row_parallel_forward(x_part, weight_part, bias)",
        "hints": (
            "x @ W.T is a sum over the input features: x[:, cols] @ W[:, cols].T is this rank's share of that sum, "
            "the same shape as the full output.",
            "One dist.all_reduce of the partial products (SUM, in place) gives every rank the full x @ W.T.",
            "Add the bias after the all_reduce: added before it, it would be counted world_size times.",
        ),
    },
    {
        "name": "sequence_shard_of_sum",
        "notebook": "10_tensor_parallel",
        "signature": "sequence_shard_of_sum(partial)",
        "hints": (
            "Under TP a dist.all_reduce would give every rank the whole sum; here each rank needs only its tokens: "
            "a reduce_scatter sums and hands rank r the r-th block of the input, along dim 0.",
            "The tokens are dim 1. Move them first with partial.transpose(0, 1).contiguous(): rank r's tokens are "
            "then the r-th block of rows, which is what dist.reduce_scatter_tensor (reduce_scatter_single in torch "
            "2.14) gives rank r.",
            "Make the output torch.empty((seq // world_size, batch, d_model)), reduce_scatter into it with "
            "op=dist.ReduceOp.SUM, and transpose it back to (batch, seq // world_size, d_model).",
        ),
    },
    {
        "name": "first_bucket",
        "notebook": "10b_overlap",
        "signature": "first_bucket(params, bucket_cap_mb)",
        "hints": (
            "Backward runs from the loss back to the input: which layer's gradients exist first? A bucket's "
            "all-reduce can start as soon as every gradient in it is ready, and DDP launches its buckets in order.",
            "DDP fills its buckets in reverse parameter order, so that bucket 0 is the one ready first: walk "
            "reversed(params), adding up each parameter's bytes.",
            "A bucket closes once its bytes reach the cap, int(bucket_cap_mb * 1024 * 1024), with the parameter "
            "that crossed it inside: append the name, add its bytes, then stop when size >= cap.",
        ),
    },
    {
        "name": "merge_partials",
        "notebook": "11_context_parallel",
        "signature": "merge_partials(out_a, lse_a, out_b, lse_b)",
        "hints": (
            "exp(lse) is a row's softmax denominator over its keys. Over the keys of A and B together the "
            "denominator is exp(lse_a) + exp(lse_b), so the merged lse is log(exp(lse_a) + exp(lse_b)).",
            "out_a is A's exp-weighted values divided by A's denominator. Re-weight each part by its share of the "
            "merged one: out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse); lse has one value per row, so "
            ".unsqueeze(-1) it to multiply the (rows, head_dim) outputs.",
            "exp(lse_a) overflows float32 once lse_a passes ~88: get lse with torch.logaddexp(lse_a, lse_b) (or m "
            "= max, then m + log(exp(lse_a - m) + exp(lse_b - m))). Then both exponents, lse_a - lse and lse_b - "
            "lse, are <= 0, and a part with lse -inf simply gets weight 0.",
        ),
    },
    {
        "name": "dispatch_splits",
        "notebook": "12_expert_parallel",
        "signature": "dispatch_splits(tokens_per_expert, world_size)",
        "hints": (
            "Rank q holds a block of experts, q x n .. q x n + n - 1 with n = experts / world_size: "
            "tokens_per_expert.view(world_size, -1) has one row per rank, and each row's sum is what you send that "
            "rank: input_splits.",
            "output_splits[q] is what rank q sends you, which only rank q knows; but every rank has just computed "
            "its own input_splits. One dist.all_to_all_single(output_splits, input_splits) with the default equal "
            "splits sends entry q to rank q and puts what rank q sent in entry q.",
            "Make output_splits with torch.empty_like(input_splits) (int64, one value per rank) and return both as "
            "lists of ints: input_splits.tolist(), output_splits.tolist().",
        ),
    },
    {
        "name": "choose_mesh",
        "notebook": "13_composition",
        "signature": "choose_mesh(meshes, budget, memory_of)",
        "hints": (
            "Put the meshes in the order you would prefer them: sorted(meshes, key=...) with a key that puts a "
            "larger dp first and, for the same dp, a smaller tp first: key=lambda m: (-m[0], m[2]).",
            "Walk that order and return the first mesh whose memory_of(mesh) is at most budget: the first that "
            "fits is the best. Ask memory_of rather than the formula: it counts the activations too, and the "
            "formula spreads every parameter evenly over the stages and tp ranks, which they are not.",
            "If the loop ends without a mesh that fits, return None.",
        ),
    },
    {
        "name": "predict_step",
        "notebook": "13_composition",
        "signature": "predict_step(mesh, compute_s, optimizer_s, links, calls, sent, m)",
        "hints": (
            "Each dimension (\"dp\", \"pp\", \"tp\", in the mesh's order) whose degree n is above 1: each call "
            "name in calls[dim] costs count x links[call, n].latency_s, except a send, which goes between two "
            "ranks (links[\"send_recv\", 2]), and a recv, the other side of a send, which costs nothing more.",
            "Then each such dimension's bytes: sent[dim] / the smallest bytes_per_s of the links its calls used.",
            "Last, GPipe: m micro-batches through pp stages take m + pp - 1 slots, and a slot holds the "
            "micro-batch's forward and backward (compute_s), its tp all_reduces and its sends, so (compute_s + "
            "pp's cost + tp's cost) x (m + pp - 1) / m; Adam's step (optimizer_s) and dp's cost come once per "
            "step, added after, not stretched.",
        ),
    },
    {
        "name": "tp_mlp",
        "notebook": "14_capstone",
        "signature": "tp_mlp(x, fc1, fc2, log)",
        "hints": (
            "Read the parity report of the planted block: which gradient differs first, at which step, and do the "
            "ranks' values of it add up to the reference's? The loss at step 0 is right: the forward is not the bug.",
            "Every rank uses all of x, so the gradient of x is the sum of every rank's part. Megatron's f is the "
            "identity in forward and an all_reduce in backward: ppkit.lessons.tensor_parallel.copy_to_parallel.",
            "Make `x = copy_to_parallel(x, log, \"fc1\")` the block's first line and change nothing else: no "
            "all_reduce in forward (x is whole on every rank already) and no division by world_size.",
        ),
    },
)
