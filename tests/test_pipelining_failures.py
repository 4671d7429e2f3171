"""How pipelining failures end: a clear error in time, never a hung kernel, and restart() recovers.

(Apart from test_pipelining.py because ``no_leftovers`` needs no module-wide cluster alive.)
"""

from __future__ import annotations

import pytest

import ppkit
from ppkit.pipeline.schedules import compare as cmp
from ppkit.pipeline.schedules import stage as pp
from ppkit.pipeline.schedules import verify

RUN_TIMEOUT = 180  # a pipeline error must come from p2p_timeout (3 s here), long before this


@pytest.fixture(scope="module")
def batch():
    return pp.make_batch(8, 32)


@pytest.mark.slow
def test_stages_that_disagree_end_in_a_clear_error_and_restart_recovers(batch, no_leftovers):
    def _mismatched(rank, world_size, x, y):
        # stage 1 believes the batch is cut into 2 micro-batches; stage 0 cuts it into 4
        return pp.train_step(rank, world_size, x, y, "gpipe", num_microbatches=4 if rank == 0 else 2,
                             p2p_timeout=3)

    with ppkit.Cluster(2, "gloo", timeout=60) as cluster:
        with pytest.raises(ppkit.RemoteError) as info:
            cluster.run(_mismatched, *batch, timeout=RUN_TIMEOUT)
        assert "StageTimeoutError" in info.value.exc_types.values()
        assert "cluster.restart()" in str(info.value)
        assert "num_microbatches" in str(info.value)
        cluster.restart()
        run = cmp.run_schedule(cluster, *batch, "1f1b", timeout=RUN_TIMEOUT, return_grads=False)
        assert run.loss == pytest.approx(verify.reference_step(*batch)["loss"], rel=verify.LOSS_RTOL)


@pytest.mark.slow
def test_a_failing_stage_does_not_leave_its_neighbour_hanging(batch, no_leftovers):
    def _failing_loss(rank, world_size, x, y):
        # stage 1 fails in its loss (labels out of range); stage 0 then waits for gradients
        bad = y + (10 * pp.NUM_CLASSES if rank == 1 else 0)
        return pp.train_step(rank, world_size, x, bad, "1f1b", p2p_timeout=3)

    with ppkit.Cluster(2, "gloo", timeout=60) as cluster:
        with pytest.raises(ppkit.RemoteError) as info:
            cluster.run(_failing_loss, *batch, timeout=RUN_TIMEOUT)
        assert info.value.exc_types[1] != "StageTimeoutError"  # the real cause is reported...
        assert info.value.exc_types[0] == "StageTimeoutError"  # ...and its neighbour gave up in time
        assert "stage 1 of 2 (rank 0) of the 1f1b pipeline waited more than 3 s" in str(info.value)
        assert cluster.state == "ready"


@pytest.mark.slow
def test_a_failing_stage_of_a_v_schedule_ends_in_time_and_restart_recovers(batch, no_leftovers):
    def _failing_loss(rank, world_size, x, y):
        # ZBV puts stages 1 and 4 on rank 0, so the loss (and its failure) is there; rank 1, holding
        # stages 2 and 3, then waits for the gradients of stage 4. It may start waiting only after
        # rank 0 failed (it has forwards of its own to finish first), so its p2p timeout must end
        # well within the 3 s the cluster gives the other ranks after one raised (ERROR_GRACE_S).
        bad = y + (10 * pp.NUM_CLASSES if rank == 0 else 0)
        return pp.train_step(rank, world_size, x, bad, "zbvzerobubble", p2p_timeout=1)

    with ppkit.Cluster(2, "gloo", timeout=60) as cluster:
        with pytest.raises(ppkit.RemoteError) as info:
            cluster.run(_failing_loss, *batch, timeout=RUN_TIMEOUT)
        assert info.value.exc_types[0] != "StageTimeoutError"  # the real cause is reported...
        assert info.value.exc_types[1] == "StageTimeoutError"  # ...and the other rank gave up in time
        assert "stages 2 and 3 of 4 (rank 1) of the zbvzerobubble pipeline waited more than 1 s" in str(info.value)
        cluster.restart()
        run = cmp.run_looped(cluster, *batch, "zbvzerobubble", timeout=RUN_TIMEOUT, return_grads=False)
        reference = verify.reference_step(*batch, run.cuts)
        assert run.loss == pytest.approx(reference["loss"], rel=verify.LOSS_RTOL)
