"""The checker of notebook 12's exercise passes the solution (and the lesson's own function), reports a
stub as not written, and names the mistake of wrong split sizes, on real ranks."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import ppkit
from ppkit.errors import ExerciseFailed
from ppkit.exercises import check_moe as ex
from ppkit.exercises import solutions
from ppkit.lessons import expert_parallel

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def bare():
    with ppkit.Cluster(4, "gloo", process_group=False, timeout=30) as cluster:
        yield cluster


def stub(tokens_per_expert, world_size):
    raise NotImplementedError("write the split sizes here")


def lessons_own(tokens_per_expert, world_size):
    return expert_parallel.dispatch_splits(tokens_per_expert, world_size)


def as_tensors(tokens_per_expert, world_size):
    return tuple(torch.tensor(v) for v in solutions.dispatch_splits(tokens_per_expert, world_size))


def per_expert(tokens_per_expert, world_size):
    received = torch.empty_like(tokens_per_expert)
    dist.all_to_all_single(received, tokens_per_expert)
    return tokens_per_expert.tolist(), received.tolist()


def round_robin(tokens_per_expert, world_size):
    sends = torch.stack([tokens_per_expert[q::world_size].sum() for q in range(world_size)])
    received = torch.empty_like(sends)
    dist.all_to_all_single(received, sends)
    return sends.tolist(), received.tolist()


def no_exchange(tokens_per_expert, world_size):
    sends = tokens_per_expert.view(world_size, -1).sum(1).tolist()
    return sends, sends


def reversed_sources(tokens_per_expert, world_size):
    sends, received = solutions.dispatch_splits(tokens_per_expert, world_size)
    return sends, received[::-1]


def as_floats(tokens_per_expert, world_size):
    sends, received = solutions.dispatch_splits(tokens_per_expert, world_size)
    return torch.tensor(sends, dtype=torch.float32), received


def only_input(tokens_per_expert, world_size):
    return tokens_per_expert.view(world_size, -1).sum(1).tolist()


def rank_zero_skips_the_exchange(tokens_per_expert, world_size):
    if dist.get_rank() == 0:
        return no_exchange(tokens_per_expert, world_size)
    return solutions.dispatch_splits(tokens_per_expert, world_size)


def test_the_solution_and_the_lessons_own_pass(bare, capsys):
    for fn in (solutions.dispatch_splits, lessons_own, as_tensors):
        report = ex.check_dispatch_splits(fn, cluster=bare)
        assert report.passed and len(report.cases) == 6
    assert "dispatch split sizes: passed all 6 cases (world_size 2, 12 experts (6 per rank);" in capsys.readouterr().out


def test_a_stub_is_not_written_yet(bare, capsys):
    assert ex.check_dispatch_splits(stub, cluster=bare) is None
    assert "not written yet: replace the NotImplementedError in stub" in capsys.readouterr().out


@pytest.mark.parametrize("fn, says", [
    (per_expert, "world_size 2, 12 experts (6 per rank): rank 0: input_splits has 12 values, one per expert; "
                 "all_to_all_single wants one per rank (2): add up the counts of the 6 experts each rank holds"),
    (round_robin, "world_size 2, 12 experts (6 per rank): rank 0: input_splits [18, 12] deals the experts out "
                  "round-robin (expert e on rank e % 2); here rank q holds the block of experts q x 6 .. q x 6 + 5 "
                  "(e // 6), so input_splits is [13, 17]"),
    (no_exchange, "world_size 2, 12 experts (6 per rank): rank 0: output_splits equals input_splits ([13, 17]), "
                  "but what this rank receives is what the others send it ([13, 0]), which only they know: "
                  "exchange the counts first with dist.all_to_all_single"),
    (reversed_sources, "world_size 2, 12 experts (6 per rank): rank 0: output_splits [0, 13] adds up to the right "
                       "total, 13, but entry q must be what rank q sends this rank: [13, 0]"),
    (as_floats, "rank 0: input_splits is a torch.float32 tensor of shape (2,); all_to_all_single takes split sizes "
                "as whole numbers"),
    (only_input, "rank 0: expected a pair (input_splits, output_splits), got list [13, 17]: return both"),
])
def test_mistakes_are_named(bare, fn, says):
    with pytest.raises(ExerciseFailed) as info:
        ex.check_dispatch_splits(fn, cluster=bare, world_sizes=(2, 4))
    assert says in str(info.value), str(info.value)
    assert bare.state == "ready"


def test_a_rank_that_skips_the_exchange_is_reported_and_the_cluster_stays_usable(bare):
    """Rank 0 never joins the all_to_all: rank 1 waits in it until rank 0 leaves the group."""
    with pytest.raises(ExerciseFailed) as info:
        ex.check_dispatch_splits(rank_zero_skips_the_exchange, cluster=bare, world_sizes=(2,), timeout=5)
    assert "world_size 2: rank 1 raised RuntimeError" in str(info.value) or "did not finish within 5 s" in str(
        info.value), str(info.value)
    assert bare.state == "ready"
    assert ex.check_dispatch_splits(solutions.dispatch_splits, cluster=bare, world_sizes=(2,)).passed


def test_a_raising_answer_is_reported(bare):
    def breaks(tokens_per_expert, world_size):
        raise ValueError("shapes")
    with pytest.raises(ExerciseFailed, match="world_size 2: rank 0 raised ValueError: shapes"):
        ex.check_dispatch_splits(breaks, cluster=bare, world_sizes=(2,))


def test_cases_leave_ranks_with_nothing_to_send():
    for k in (2, 3, 4):
        (_, spread), (_, single) = ex.split_cases(k)
        assert ex.expected(spread, 1)[0][0] == 0 and ex.expected(single, 0)[0] == [0] * k


# -- a case's process group, whatever the case before it did (issue 46, item 21) ----------------------------------
# A wrong answer that calls no collective (no_exchange, only_input) let rank 0 end its job and close its gloo
# connections while rank 1 was still making its own: rank 1's init_process_group then failed ("Gloo connectFullMesh
# failed ... Connection closed by peer"), and torch's count of process groups on rank 1 stayed one ahead, so every
# later group it joined waited for keys the others never wrote. The checker reported that, not the mistake.

def _slow_to_join(seconds):
    """On rank 1: init_process_group returns ``seconds`` late (as on a loaded machine), and notes when."""
    import time

    real = dist.init_process_group

    def init_process_group(*args, **kwargs):
        real(*args, **kwargs)
        time.sleep(seconds)
        dist.ppkit_test_joined_at = time.monotonic()

    init_process_group.ppkit_test_real = real
    return init_process_group


def _patch_rank_1(rank, world_size, seconds):
    if rank == 1:
        dist.init_process_group = _slow_to_join(seconds)


def _unpatch(rank, world_size):
    dist.init_process_group = getattr(dist.init_process_group, "ppkit_test_real", dist.init_process_group)
    dist.__dict__.pop("ppkit_test_joined_at", None)


def _starts(rank, k):
    import time

    return time.monotonic(), getattr(dist, "ppkit_test_joined_at", None)


def test_no_rank_starts_a_case_before_every_rank_has_joined_its_group(bare):
    from ppkit.exercises.subworld import SubworldRunner

    bare.run(_patch_rank_1, 1.0)
    runner = SubworldRunner((2,), 30, bare)
    try:
        results, problem = runner.run(2, _starts)
    finally:
        runner.close()
        bare.run(_unpatch)
    assert problem is None, problem
    (rank0_started, _), (_, rank1_joined) = results
    assert rank1_joined is not None
    assert rank0_started >= rank1_joined, f"rank 0 began {rank1_joined - rank0_started:.2f} s before rank 1 had joined"


def _break_the_join(rank, world_size):
    """Every rank's barrier in the case's group fails, and so does the clean-up after it."""
    real_destroy = dist.destroy_process_group

    def barrier(*args, **kwargs):
        raise RuntimeError("a barrier that failed")

    def destroy(*args, **kwargs):
        real_destroy(*args, **kwargs)
        raise RuntimeError("a destroy_process_group that failed")

    barrier.ppkit_test_real, destroy.ppkit_test_real = dist.barrier, real_destroy
    dist.barrier, dist.destroy_process_group = barrier, destroy


def _rank(rank, k):
    return rank


def _made_again_after(bare, breaker):
    """A 2-rank case run after ``breaker`` ran on every rank: its group is made again on restarted ranks
    (once) and the case's results come back. Returns the runner, still open."""
    from ppkit.exercises.subworld import SubworldRunner

    bare.run(breaker)
    generation = bare.generation
    runner = SubworldRunner((2,), 30, bare)
    try:
        results, problem = runner.run(2, _rank)
        assert problem is None and results == [0, 1], problem  # not the learner's function's fault
        assert bare.generation == generation + 1
    except BaseException:
        runner.close()
        if bare.state == "ready":
            bare.restart()  # no patched rank left for the next test
        raise
    return runner


def test_a_clean_up_that_fails_after_a_failed_join_is_still_a_group_not_made_and_is_retried(bare, capsys):
    _made_again_after(bare, _break_the_join).close()
    assert "[ppkit] the case's group could not be made (rank 0 could not join the case's 2-rank process group: " \
        "a barrier that failed): restarting the ranks, try 2 of 3" in capsys.readouterr().out


def _die_joining(rank, world_size):
    import os

    if rank == 1:
        dist.init_process_group = lambda *args, **kwargs: os._exit(3)


def _die_in_the_job(rank, k):
    import os

    if rank == 1:
        os._exit(3)
    return rank


def test_a_rank_that_dies_joining_the_group_is_retried_and_one_that_dies_in_the_function_is_not(bare, capsys):
    from ppkit.errors import WorkerDiedError

    runner = _made_again_after(bare, _die_joining)
    try:
        assert "try 2 of 3" in capsys.readouterr().out
        with pytest.raises(WorkerDiedError):  # the learner's function ended the rank: not the group's fault
            runner.run(2, _die_in_the_job)
    finally:
        runner.close()
    assert bare.state == "ready"


def _fail_a_rendezvous(rank, world_size, path):
    """What a failed init_process_group leaves behind on rank 1: torch counted a group that never was."""
    from datetime import timedelta

    if rank != 1:
        return None
    try:
        dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=1, world_size=2,
                                timeout=timedelta(seconds=1))
    except Exception as exc:  # no rank 0 ever comes: gloo's connectFullMesh times out
        return type(exc).__name__
    dist.destroy_process_group()
    return "joined"


@pytest.mark.slow
def test_a_rank_left_behind_by_a_failed_rendezvous_still_gets_the_named_mistake(bare, tmp_path):
    assert bare.run(_fail_a_rendezvous, str(tmp_path / "store"))[1] != "joined"
    with pytest.raises(ExerciseFailed) as info:
        ex.check_dispatch_splits(no_exchange, cluster=bare, world_sizes=(2, 4), timeout=10)
    assert "rank 0: output_splits equals input_splits ([13, 17])" in str(info.value), str(info.value)
    assert bare.state == "ready"


@pytest.mark.slow
def test_the_wrong_answers_are_named_twenty_times_in_a_row(bare):
    answers = {per_expert: "input_splits has 12 values, one per expert", round_robin: "deals the experts out",
               no_exchange: "output_splits equals input_splits", reversed_sources: "adds up to the right total",
               as_floats: "input_splits is a torch.float32 tensor", only_input: "expected a pair"}
    unnamed = []
    for round_ in range(20):
        for fn, says in answers.items():
            try:
                ex.check_dispatch_splits(fn, cluster=bare, world_sizes=(2, 4))
            except ExerciseFailed as exc:
                if says not in str(exc):
                    unnamed.append(f"round {round_}, {fn.__name__}: {exc}")
            else:
                unnamed.append(f"round {round_}, {fn.__name__}: passed")
    assert unnamed == [], "\n".join(unnamed)


@pytest.mark.slow
def test_a_group_that_cannot_be_made_says_so_and_not_that_the_answer_is_wrong(bare, monkeypatch, tmp_path):
    from ppkit.exercises import subworld

    nowhere = tmp_path / "a-file"
    nowhere.write_text("")  # the stores' folder is a file: no rank can make its FileStore there
    monkeypatch.setattr(subworld, "stores_folder", lambda: nowhere)
    generation = bare.generation
    with pytest.raises(ExerciseFailed) as info:
        ex.check_dispatch_splits(solutions.dispatch_splits, cluster=bare, world_sizes=(2,))
    text = str(info.value)
    assert (f"world_size 2: the case's 2-rank process group could not be made in {subworld.JOIN_TRIES} tries "
            "(last: rank 0 could not join the case's 2-rank process group:") in text, text
    assert "This is not about your function: run the check again, or restart the kernel" in text, text
    assert bare.generation == generation + subworld.JOIN_TRIES and bare.state == "ready"  # restarted after each try
