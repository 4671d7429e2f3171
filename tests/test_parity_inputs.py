"""ppkit.compare_runs and ParityRecorder without ranks: what they refuse (names, shapes, steps, kinds that do not
match, misused calls) with an error that says what to do, and the default tolerance and how it is derived."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ppkit
from ppkit.parity import Piece, default_tolerance


def model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))


def recorded(steps=(0,), what="grads", scale=1.0, **recorder) -> ppkit.ParityRun:
    net, rec = model(), ppkit.ParityRecorder(what, **recorder)
    for step in steps:
        torch.manual_seed(100 + step)
        loss = F.mse_loss(net(torch.randn(5, 4)), torch.randn(5, 2))
        loss.backward()
        for p in net.parameters():
            p.grad *= scale
        rec.record(step, net, loss)
        net.zero_grad()
    return rec.run


def as_rank(run: ppkit.ParityRun, rank: int, world_size: int = 2) -> ppkit.ParityRun:
    return ppkit.ParityRun(rank, world_size, run.kind, dict(run.losses), {s: dict(t) for s, t in run.tensors.items()},
                           dict(run.loss_dtypes), dict(run.computed), dict(run.precision))


def test_the_same_run_is_equal_and_says_what_it_compared():
    report = ppkit.compare_runs(recorded(), recorded())
    assert report.equal and bool(report) and report.first is None
    assert str(report).startswith("parity: the parallel run equals the reference (1 step(s), the loss and 4 gradients")
    assert "rtol 8.1e-06 x (1 + step)" in str(report)


def test_names_the_reference_lacks_are_refused_with_the_closest_name():
    net, rec = model(), ppkit.ParityRecorder()
    wrapped = nn.Sequential()
    wrapped.encoder = net  # "encoder.0.weight", not "0.weight"
    F.mse_loss(wrapped.encoder(torch.randn(5, 4)), torch.randn(5, 2)).backward()
    rec.record(0, wrapped)
    with pytest.raises(ppkit.ConfigError, match=r"rank 0 recorded \['encoder.0.weight'.*closest it has: "
                                                r"'0.weight'.*rename="):
        ppkit.compare_runs(recorded(), [rec.run])


def test_wrappers_names_are_left_out_and_rename_maps_the_rest():
    net = model()
    F.mse_loss(net(torch.randn(5, 4)), torch.randn(5, 2)).backward()
    names = {f"module._orig_mod.{n}": p.grad for n, p in net.named_parameters()}
    rec = ppkit.ParityRecorder(rename={"0.weight": "first.weight"})
    rec.record(0, names)
    assert list(rec.run.tensors[0]) == ["first.weight", "0.bias", "2.weight", "2.bias"]
    by_function = ppkit.ParityRecorder(rename=str.upper)
    by_function.record(0, names)
    assert list(by_function.run.tensors[0])[0] == "0.WEIGHT"


def test_a_name_no_rank_recorded_is_refused():
    run = recorded()
    del run.tensors[0]["2.bias"]
    with pytest.raises(ppkit.ConfigError, match=r"no rank recorded \['2.bias'\] at step 0.*pipeline stage records "
                                                "its own"):
        ppkit.compare_runs(recorded(), [run])


def test_a_piece_of_another_shape_asks_which_piece_it_is():
    run = recorded()
    grad = run.tensors[0]["0.weight"].value
    run.tensors[0]["0.weight"] = Piece(grad[:3])
    with pytest.raises(ppkit.ConfigError, match=r"rank 0's 0.weight has shape \[3, 4\], the reference's \[6, 4\]. "
                                                r"If this rank holds a piece of it, say which: "
                                                r"ParityRecorder\(shards="):
        ppkit.compare_runs(recorded(), [run])


def test_a_declared_piece_that_does_not_fit_is_refused():
    run = recorded()
    grad = run.tensors[0]["0.weight"].value
    run.tensors[0]["0.weight"] = Piece(grad[:3], chunk=(1, 0, 2))  # rows cut, but declared as columns
    with pytest.raises(ppkit.ConfigError, match=r"piece 0 of 2 along dim 1, shape \[3, 4\]; that piece of the "
                                                r"reference's \[6, 4\] has shape \[6, 2\]"):
        ppkit.compare_runs(recorded(), [run])
    run.tensors[0]["0.weight"] = Piece(grad[:3], chunk=(2, 0, 2))
    with pytest.raises(ppkit.ConfigError, match="names dim 2, but the reference's 0.weight has 2 dims"):
        ppkit.compare_runs(recorded(), [run])
    run.tensors[0]["0.weight"] = Piece(grad[:3], offset=(0, 0), full_shape=(7, 4))
    with pytest.raises(ppkit.ConfigError, match=r"a piece of a \[7, 4\] tensor, the reference's is \[6, 4\]"):
        ppkit.compare_runs(recorded(), [run])


def row_halves(rank: int) -> ppkit.ParityRun:
    """Rank ``rank`` of 2 holding its half of 0.weight's rows, declared with shards=."""
    run = as_rank(recorded(), rank)
    grad = run.tensors[0]["0.weight"].value
    run.tensors[0]["0.weight"] = Piece(grad.chunk(2)[rank].clone(), chunk=(0, rank, 2))
    return run


def test_declared_pieces_are_compared_with_their_part_of_the_reference():
    ref = recorded()
    halves = [row_halves(rank) for rank in (0, 1)]
    assert ppkit.compare_runs(ref, halves).equal
    halves[1].tensors[0]["0.weight"].value.mul_(3)
    report = ppkit.compare_runs(ref, halves)
    assert (report.first.name, report.first.rank) == ("0.weight", 1)
    assert "3x the reference on rank 1 only" in str(report)  # not "the sum of 3 ranks' values": 2 ranks, one wrong
    assert "rank 0's piece equals the reference" in str(report) and "summed where it should average" not in str(report)


def test_pieces_that_do_not_cover_a_tensor_are_refused():
    ref = recorded()
    halves = [row_halves(rank) for rank in (0, 1)]
    with pytest.raises(ppkit.ConfigError, match=r"rank 0 recorded pieces of 0.weight at step 0 that cover 12 of its "
                                                r"24 elements.*Rank 1 handed back nothing: return recorder.run "
                                                "from every rank"):
        ppkit.compare_runs(ref, [halves[0], None])  # `return rec.run if rank == 0 else None`
    box = halves[1].tensors[0]["0.weight"]
    halves[1].tensors[0]["0.weight"] = Piece(box.value, offset=(2, 0), full_shape=(6, 4))  # rows 2-4, not 3-5
    with pytest.raises(ppkit.ConfigError, match=r"ranks 0, 1 recorded pieces of 0.weight at step 0 that cover 20 of "
                                                "its 24 elements"):
        ppkit.compare_runs(ref, halves)
    halves[1].tensors[0]["0.weight"] = Piece(box.value, offset=(3, 0), full_shape=(6, 4))
    assert ppkit.compare_runs(ref, halves).equal


def test_steps_the_reference_did_not_record_are_refused():
    with pytest.raises(ppkit.ConfigError, match=r"rank 0 recorded steps \[2\], which the reference did not \(it has "
                                                r"steps 0-1\)"):
        ppkit.compare_runs(recorded((0, 1)), [recorded((0, 1, 2))])
    assert ppkit.compare_runs(recorded((0, 1, 2)), [recorded((0, 1))]).steps == [0, 1]  # a longer reference is fine


def test_a_step_recorded_twice_or_not_a_step_is_refused():
    net, rec = model(), ppkit.ParityRecorder()
    rec.record(0, None, 1.0)
    with pytest.raises(ppkit.ConfigError, match="step 0 was recorded twice on rank 0: call record once per step"):
        rec.record(0, None, 1.0)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ppkit.ConfigError, match="a step is a whole number from 0"):
            rec.record(bad, net)


def test_kinds_ranks_and_references_that_do_not_match_are_refused():
    ref = recorded()
    with pytest.raises(ppkit.ConfigError, match="rank 0 recorded params, the reference grads"):
        ppkit.compare_runs(ref, [recorded(what="params")])
    with pytest.raises(ppkit.ConfigError, match="two runs say they are rank 0"):
        ppkit.compare_runs(ref, [recorded(), recorded()])
    with pytest.raises(ppkit.ConfigError, match="the reference was recorded on rank 1 of 2: record it in one process"):
        ppkit.compare_runs(as_rank(ref, 1), [ref])
    with pytest.raises(ppkit.ConfigError, match="no rank recorded anything"):
        ppkit.compare_runs(ref, [None, None])
    with pytest.raises(ppkit.ConfigError, match="the reference is a dict"):
        ppkit.compare_runs({}, [ref])
    with pytest.raises(ppkit.ConfigError, match="the parallel run is a str"):
        ppkit.compare_runs(ref, "runs")
    with pytest.raises(ppkit.ConfigError, match="the parallel run's entry is a float"):
        ppkit.compare_runs(ref, [1.0])
    assert ppkit.compare_runs(ref, {0: ref}).equal and ppkit.compare_runs(ref, ref).equal


def test_a_loss_or_tensors_on_one_side_only_are_refused():
    ref = recorded()
    no_loss = recorded()
    no_loss.losses.clear()
    with pytest.raises(ppkit.ConfigError, match="the ranks recorded a loss at step 0, the reference none"):
        ppkit.compare_runs(no_loss, [ref])
    no_tensors = recorded()
    no_tensors.tensors.clear()
    with pytest.raises(ppkit.ConfigError, match="the ranks recorded tensors at step 0, the reference none"):
        ppkit.compare_runs(no_tensors, [ref])


def test_misused_recorder_arguments_are_refused():
    with pytest.raises(ppkit.ConfigError, match="record 'grads'"):
        ppkit.ParityRecorder("gradients")
    with pytest.raises(ppkit.ConfigError, match=r"shards\['w'\] = \(0, 2, 2\): give \(dim, index, count\)"):
        ppkit.ParityRecorder(shards={"w": (0, 2, 2)})
    rec = ppkit.ParityRecorder()
    with pytest.raises(ppkit.ConfigError, match=r"got a tensor of shape \[2\]: give the step's loss, one number"):
        rec.record(0, None, torch.ones(2))
    with pytest.raises(ppkit.ConfigError, match="record\\(loss=...\\) got str"):
        rec.record(0, None, "1.0")
    with pytest.raises(ppkit.ConfigError, match="record\\(model=...\\) got int"):
        rec.record(0, 3)
    clash = ppkit.ParityRecorder()
    with pytest.raises(ppkit.ConfigError, match="two tensors are called '0.weight' on rank 0"):
        clash.record(0, {"0.weight": torch.ones(1), "module.0.weight": torch.ones(1)})


def test_a_missing_gradient_a_nan_and_a_learner_tolerance():
    ref, run = recorded(), recorded()
    run.tensors[0]["2.bias"] = Piece(None)
    report = ppkit.compare_runs(ref, [run])
    assert (report.first.name, report.first.note) == ("2.bias", "no gradient")
    run = recorded()
    run.tensors[0]["2.bias"].value[0] = float("nan")
    assert "NaN or inf" in str(ppkit.compare_runs(ref, [run]))
    close = recorded(scale=1 + 1e-4)
    assert not ppkit.compare_runs(ref, [close]).equal
    assert ppkit.compare_runs(ref, [close], rtol=1e-3).equal
    assert "rtol 0.001 of a tensor's largest value" in str(ppkit.compare_runs(ref, [close], rtol=1e-3))
    with pytest.raises(ppkit.ConfigError, match=r"compare_runs\(rtol=-1\): give a number >= 0"):
        ppkit.compare_runs(ref, [close], rtol=-1)


@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float32, 8.1e-6), (torch.bfloat16, 6.3e-2),
                                             (torch.float16, 7.8e-3), (torch.float64, 1.5e-14)])
def test_the_default_tolerance_follows_the_dtype(dtype, rtol):
    tolerance = default_tolerance(dtype)
    assert tolerance.rtol == pytest.approx(rtol, rel=0.02)
    grows = 3 if dtype in (torch.float32, torch.float64) else 3 ** 0.5  # a lower precision's: as sqrt(1 + step)
    assert tolerance.at(2) == pytest.approx((grows * tolerance.rtol, grows * tolerance.atol))  # grows with the step


def test_the_default_tolerance_takes_a_reordered_sum_but_not_a_bug():
    """A sum of 4096 float32 terms in another order (as an all_reduce or a split matmul adds them) passes; the
    same sum off by 1e-4 of itself does not."""
    terms = torch.randn(4096, 64, generator=torch.Generator().manual_seed(0))
    one = terms.sum(0)
    reordered = sum(chunk.sum(0) for chunk in terms.flip(0).chunk(8))
    tolerance = default_tolerance(torch.float32)
    scale = float(one.abs().max())
    assert float((reordered - one).abs().max()) > 0  # the order did change the bits
    assert tolerance.allows(float((reordered - one).abs().max()), scale, 0)
    assert not tolerance.allows(float((one * (1 + 1e-4) - one).abs().max()), scale, 0)
    with pytest.raises(ppkit.ConfigError, match="no default tolerance for torch.int64"):
        default_tolerance(torch.int64)


def test_a_run_in_a_lower_precision_is_compared_within_that_precision():
    ref, run = recorded(), recorded()
    for name, piece in run.tensors[0].items():
        run.tensors[0][name] = Piece(piece.value.bfloat16())
    report = ppkit.compare_runs(ref, [run])
    assert report.equal and report.tolerance.dtype == "torch.bfloat16"
    run.tensors[0]["0.weight"] = Piece(run.tensors[0]["0.weight"].value.long())
    with pytest.raises(ppkit.ConfigError, match="no default tolerance for torch.int64.*pass rtol= and atol="):
        ppkit.compare_runs(ref, [run])


def test_the_report_says_what_it_compared():
    losses_only = recorded()
    losses_only.tensors.clear()
    report = ppkit.compare_runs(recorded(), [losses_only])
    assert report.equal and report.names == [] and "(1 step(s), the loss, ranks 0)" in str(report)
    tensors_only = recorded()
    tensors_only.losses.clear()
    assert "(1 step(s), 4 gradients by name, ranks 0)" in str(ppkit.compare_runs(recorded(), [tensors_only]))


def test_without_a_loss_the_report_does_not_claim_the_forward_is_right():
    """Two ranks' different parts of a gradient: with the loss recorded and equal, the words say the forward is
    right; without a loss they do not claim it."""
    ref = recorded()
    parts = [as_rank(recorded(scale=0.25), 0), as_rank(recorded(scale=0.75), 1)]
    assert "the forward is right" in str(ppkit.compare_runs(ref, parts))
    for run in parts:
        run.losses.clear()
    report = ppkit.compare_runs(ref, parts)
    assert "their sum is the reference" in str(report) and "the forward is right" not in str(report)


def test_a_gradient_the_reference_has_not_is_named():
    ref = recorded()
    ref.tensors[0]["2.bias"] = Piece(None)
    report = ppkit.compare_runs(ref, [recorded()])
    assert (report.first.name, report.first.note) == ("2.bias", "a gradient the reference has not")
    assert "rank 0 has a gradient of 2.bias, which the reference has not" in str(report)


def test_each_tensor_gets_the_tolerance_of_its_own_dtype():
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    b = torch.randn(6, generator=torch.Generator().manual_seed(2))

    def run(first, second, order):
        rec = ppkit.ParityRecorder("params")
        tensors = {"w": first, "b": second}
        rec.record(0, {n: tensors[n] for n in order})
        return rec.run

    ref = run(w, b, "wb")
    rounded = run(w, b.bfloat16(), "wb")  # fp32 first, then a bf16 tensor that is only rounded
    assert ppkit.compare_runs(ref, [rounded]).equal, str(ppkit.compare_runs(ref, [rounded]))
    wrong = run(w * 1.01, b.bfloat16(), "bw")  # bf16 first, then an fp32 tensor off by 1 %
    report = ppkit.compare_runs(ref, [wrong])
    assert [d.name for d in report.differences] == ["w"], str(report)


def test_the_tolerance_is_measured_against_the_tensor_s_largest_value():
    """A piece whose values are tiny next to the rest of the tensor: off by 1e-3 of itself, 1e-9 of the tensor."""
    full = torch.full((6, 4), 1e6)
    full[3:] = 1.0
    ref = ppkit.ParityRecorder("params")
    ref.record(0, {"w": full})
    halves = []
    for rank in (0, 1):
        piece = full.chunk(2)[rank].clone() * (1 + 1e-3 * rank)
        halves.append(ppkit.ParityRun(rank, 2, "params", {}, {0: {"w": Piece(piece, chunk=(0, rank, 2))}}))
    assert ppkit.compare_runs(ref, halves).equal


def test_hand_cut_shards_of_other_sizes_are_declared_by_where_they_start():
    full = torch.randn(10, 3, generator=torch.Generator().manual_seed(3))
    ref = ppkit.ParityRecorder("params")
    ref.record(0, {"w": full})
    starts = [0, 3, 6, 8]
    pieces = full.tensor_split(4)  # rows 3, 3, 2, 2: torch.chunk would cut 3, 3, 3, 1
    chunked = [ppkit.ParityRun(r, 4, "params", {}, {0: {"w": Piece(p.clone(), chunk=(0, r, 4))}})
               for r, p in enumerate(pieces)]
    with pytest.raises(ppkit.ConfigError, match=r"torch.chunk.*slice\("):
        ppkit.compare_runs(ref, chunked)
    runs = []
    for r, p in enumerate(pieces):
        rec = ppkit.ParityRecorder("params", shards={"w": (0, slice(starts[r], starts[r] + len(p)))})
        rec.record(0, {"w": p})
        runs.append(ppkit.ParityRun(r, 4, "params", rec.run.losses, rec.run.tensors))
    assert ppkit.compare_runs(ref, runs).equal
    runs[2].tensors[0]["w"].value.mul_(2)
    report = ppkit.compare_runs(ref, runs)
    assert (report.first.name, report.first.rank) == ("w", 2)
    with pytest.raises(ppkit.ConfigError, match=r"its piece has shape \[3, 3\], which does not hold 2 entries along "
                                                "dim 0"):
        ppkit.ParityRecorder("params", shards={"w": (0, slice(0, 2))}).record(0, {"w": pieces[0]})
    with pytest.raises(ppkit.ConfigError, match=r"or \(dim, slice\(start, stop\)\) for a piece cut otherwise"):
        ppkit.ParityRecorder(shards={"w": (0, slice(None, 3))})
    runs[3].tensors[0]["w"] = Piece(pieces[3].clone(), offset=(9, 0))  # rows 9-10 of a 10-row tensor
    with pytest.raises(ppkit.ConfigError, match=r"as the box at offset \[9, 0\] of shape \[2, 3\], which the "
                                                r"reference's \[10, 3\] does not hold there"):
        ppkit.compare_runs(ref, runs)


def test_a_loss_is_not_said_to_have_a_largest_value():
    ref, run = recorded(), recorded()
    run.losses[0] *= 1.025
    text = str(ppkit.compare_runs(ref, [run]))
    assert "largest value" not in text.split("\n")[0] and "of the reference's loss" in text, text


def test_a_precision_the_recorder_cannot_see_is_given_and_named():
    """An autocast region that ended before record, the loss passed as a number: precision= says it."""
    net, rec = model(), ppkit.ParityRecorder(precision=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(torch.randn(5, 4, generator=torch.Generator().manual_seed(100)))
    F.mse_loss(out.float(), torch.randn(5, 2)).backward()
    rec.record(0, net, 1.0)
    assert {p.dtype for p in rec.run.tensors[0].values()} == {"torch.bfloat16"}
    assert rec.run.precision == {"torch.bfloat16": "precision= given to ParityRecorder"}
    assert default_tolerance("tf32").rtol == pytest.approx(7.8e-3, rel=0.02)
    with pytest.raises(ppkit.ConfigError, match=r"ParityRecorder\(precision=torch.int64\): give the dtype"):
        ppkit.ParityRecorder(precision=torch.int64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 is a GPU's: needs CUDA")
def test_tf32_matmuls_on_a_gpu_are_judged_in_tf32():
    net, rec = model().cuda(), ppkit.ParityRecorder()
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        loss = F.mse_loss(net(torch.randn(5, 4, device="cuda")), torch.randn(5, 2, device="cuda"))
        loss.backward()
        rec.record(0, net, loss)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert {p.dtype for p in rec.run.tensors[0].values()} == {"tf32"} and "TF32" in rec.run.precision["tf32"]


def test_what_one_rank_saw_of_a_step_s_precision_holds_for_every_rank():
    """A pipeline's first stage holds no loss, so it cannot see autocast; the last stage's loss graph shows it."""
    net = model()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(torch.randn(5, 4, generator=torch.Generator().manual_seed(100)))
    loss = F.mse_loss(out.float(), torch.randn(5, 2, generator=torch.Generator().manual_seed(101)))
    loss.backward()
    first, last = ppkit.ParityRecorder(), ppkit.ParityRecorder()
    first.record(0, net)  # the stage without the loss: its gradients look float32
    last.record(0, None, loss)
    assert {p.dtype for p in first.run.tensors[0].values()} == {"torch.float32"}
    assert last.run.computed == {0: "torch.bfloat16"}
    ref = ppkit.ParityRecorder()
    net32 = model()
    loss32 = F.mse_loss(net32(torch.randn(5, 4, generator=torch.Generator().manual_seed(100))),
                        torch.randn(5, 2, generator=torch.Generator().manual_seed(101)))
    loss32.backward()
    ref.record(0, net32, loss32)
    alone = ppkit.compare_runs(ref, [as_rank(first.run, 0)])
    assert not alone.equal  # bf16 rounding, judged in float32
    report = ppkit.compare_runs(ref, [as_rank(first.run, 0), as_rank(last.run, 1)])
    assert report.equal and "bfloat16: the loss's autograd graph" in str(report), str(report)


def test_notebook_14_s_llama_under_bf16_autocast_equals_its_fp32_run():
    """The tolerance's bf16 margin, measured on the course's own model (tolerance.py: 8e-3 at step 0, 2.7e-2 at
    step 1, where 6.3e-2 and 1.3e-1 are allowed); one process, the precision the only difference."""
    from ppkit.lessons import capstone as cap
    from ppkit.models import llama

    def run(amp: bool) -> ppkit.ParityRun:
        net, rec = llama.Llama(cap.RUN.config, cap.RUN.seed), ppkit.ParityRecorder()
        opt = cap.optimizer(net.parameters(), cap.RUN)
        for step in range(2):
            x, y = cap.batch_at(cap.RUN, step)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = cap.loss_fn(net(x).float(), y)
            loss.backward()
            rec.record(step, net, loss)
            opt.step()
            opt.zero_grad()
        return rec.run

    report = ppkit.compare_runs(run(False), [run(True)])
    assert report.equal and report.tolerance.dtype == "torch.bfloat16", str(report)
