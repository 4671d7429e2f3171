"""One ``Cluster.run``: send the job to every rank, gather the results, say what went wrong.

A rank that raises gives the others ``ERROR_GRACE_S`` to finish (they may be waiting for it); a
rank that dies or whose machine stops answering, a timeout and Kernel > Interrupt each end the job
with their own error (diagnostics.py), and leave the cluster broken when ranks may still be blocked.
The job's timeout and Kernel > Interrupt hold while it is being sent too (a rank that reads nothing,
e.g. stopped with SIGSTOP, would otherwise block a large job's send for ever: transport/sending.py).
"""

from __future__ import annotations

import math
import os
import signal
import socket
import time

from ppkit.cluster import diagnostics, hang_doctor, job_doctor
from ppkit.cluster.debug.sessions import Ended, Sessions, ended_error
from ppkit.cluster.hang_watch import HangWatch
from ppkit.cluster.inbox import Closed, Item, LaunchFailed
from ppkit.transport import byvalue, channel
from ppkit.transport.flight_messages import FlightRecord
from ppkit.transport.messages import Cancel, Cancelled, CellSource, Result, Run
from ppkit.transport.sending import Broadcast

ERROR_GRACE_S = 3.0  # after one rank raises, how long the others get to finish
SEND_S = 60.0  # a run without a time limit still gives up sending its job after this long
CANCEL_WAIT_S = 2.0  # after Kernel > Interrupt, how long the ranks get to stop
INTERRUPT_GRACE_S = 3.0  # a last job's ranks after their SIGINT: time for a learner's `except KeyboardInterrupt:`


class Job:
    def __init__(self, job_id: int, world_size: int, inbox, send, launcher, printer, on_break, conns=None,
                 restart=None):
        self.job_id = job_id
        self.world_size = world_size
        self._inbox = inbox
        self._send = send  # send(rank, msg) -> False if the rank is gone
        self._conns = conns if conns is not None else {}  # rank -> connection, for the job itself
        self._launcher = launcher
        self._printer = printer
        self._on_break = on_break  # on_break(reason): the cluster needs a restart
        self._restart = restart  # restart(): new workers, after a pdb quit left ranks blocked
        self.debug = Sessions(send, printer.interject, world_size=world_size)  # breakpoints on ranks
        self.results: dict[int, Result | Cancelled] = {}
        self.rendezvous: dict[int, tuple] = {}  # rank -> its rendezvous history, from its stack report
        self.records: dict[int, dict] = {}  # rank -> its flight record's last words, as it aborted (hang_doctor/)
        # the doctor's last reading: put on the job's error, or, after a last job that completed, its check at the end
        self.diagnosis: hang_doctor.Diagnosis | None = None
        self.exited: set[int] = set()  # ranks whose process exited with status 0 without answering (os._exit(0))
        self.last, self.watch, self._workers = False, None, {}  # run() sets them
        self._shown = ""  # the doctor's reading as the hang watch printed it

    def run(self, payload: bytes, sources: tuple[CellSource, ...], timeout: float | None, workers: dict,
            last: bool = False, watch: HangWatch | None = None) -> list:
        """Every rank's return value, by rank; raises the job's error otherwise.

        ``timeout`` None: no limit. ``watch`` (a HangWatch) says once where the ranks wait if they seem hung.
        ``last``: each rank's process ends with the job, so a rank whose process exits with status
        0 before it answers (``os._exit(0)``) has succeeded, returning None."""
        self.last, self.watch, self._workers = last, watch, workers
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        self._deliver(Run(self.job_id, payload, sources, last), timeout or SEND_S,
                      min(deadline, time.monotonic() + SEND_S) if timeout is None else deadline)
        interrupted = False
        try:
            self._collect(deadline, timeout, workers)
        except KeyboardInterrupt:
            interrupted = True  # handled after this block: the cell shows JobInterrupted, not it and its frames
        if interrupted:
            if self.debug.active is None:
                self._cancel()
            self._stop_debugging(Ended(self.debug.active, "interrupted", ""))
        self._printer.flush()
        errors = {r: m.value for r, m in self.results.items() if isinstance(m, Result) and not m.ok}
        if errors:
            waiting = self.waiting()
            stacks = self._stacks(waiting) if waiting else {}
            self._print_diagnosis()
            if waiting:
                self._on_break(f"rank(s) {waiting} are still blocked after rank {min(errors)} failed.")
            error = self._with_records(diagnostics.ranks_raised(errors, waiting, stacks, self.rendezvous))
            error.values = {r: byvalue.loads(m.value) for r, m in self.results.items()
                            if isinstance(m, Result) and m.ok}  # a profiled run's traces, of the ranks that returned
            raise error
        values = [byvalue.loads(self.results[r].value) for r in range(self.world_size)]
        checked = job_doctor.look_after(self.records, self.results, self.world_size, self.last, self._printer.flush)
        self.diagnosis = self.diagnosis if checked is None else checked
        return values

    def waiting(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.results]

    def _deliver(self, msg: Run, timeout: float, deadline: float) -> None:
        """Send the job to every rank before ``deadline``; Kernel > Interrupt stops the sending."""
        sending = Broadcast({rank: self._conns.get(rank) for rank in range(self.world_size)}, msg)
        try:
            sending.send(deadline)
        except KeyboardInterrupt:
            self._close(sending.partial)
            if not sending.unsent:  # every rank has it: cancel as during the job
                self._cancel()
            self._on_break(f"rank(s) {sending.unsent} never received the interrupted job.")
            for rank in sending.complete:
                self._send(rank, Cancel(self.job_id))
            raise diagnostics.interrupted_while_sending(sending.unsent, sending.size) from None
        if sending.gone:
            reason = f"rank {min(sending.gone)} is gone."
            self._on_break(reason)
            raise diagnostics.needs_restart(reason)
        if sending.unsent:
            self._close(sending.partial)
            self._on_break(f"rank(s) {sending.unsent} did not take a job within its timeout.")
            raise diagnostics.job_not_taken(timeout, sending.unsent, sending.size)

    def _close(self, ranks: list[int]) -> None:
        """Half a message is on these connections: end them (their readers see EOF)."""
        for rank in ranks:
            channel.wake_reader(self._conns[rank])

    def _collect(self, deadline: float, timeout: float, workers: dict) -> None:
        grace_ends = None
        while len(self.results) < self.world_size:
            ends = deadline if grace_ends is None else min(deadline, grace_ends)
            look_at = self.watch.due(self._inbox.last_put) if self.watch and grace_ends is None else math.inf
            switch_at = self.debug.switch_at()
            item = self._inbox.next(min(ends, look_at) if switch_at is None else min(ends, look_at, switch_at))
            paused = self.debug.paused_s
            quiet = item is None and switch_at is None and self.debug.active is None
            if quiet and self.watch and time.monotonic() < ends:
                # output is taken inside next() and moves the look: asked again, the watch says whether it came
                if self.watch.due(self._inbox.last_put) <= time.monotonic():
                    self._look_for_a_hang()  # the hang watch's time came: the run goes on
            elif item is None and switch_at is not None and time.monotonic() < ends:
                self.debug.switch()  # the active rank is blocked: on to a rank waiting at a prompt
            elif item is not None and self.debug.take(item.source, item.msg):
                pass
            elif item is None and grace_ends is not None and time.monotonic() >= grace_ends:
                if self.debug.active is None:  # a rank that stopped at a breakpoint keeps the job
                    return
                grace_ends = time.monotonic() + ERROR_GRACE_S
            elif item is None:
                waiting = self.waiting()
                stacks = self._stacks(waiting)
                self._print_diagnosis()
                self._printer.flush()
                self._on_break(f"a job timed out with rank(s) {waiting} still blocked.")
                raise self._with_records(diagnostics.job_timed_out(timeout, waiting, sorted(self.results), stacks,
                                                                   self.rendezvous))
            elif isinstance(item.msg, Closed) and not item.from_launcher and item.source in self.results:
                pass  # a rank whose job was its last: its process ended after its answer
            elif isinstance(item.msg, Closed) and not item.from_launcher and self._exited_cleanly(item.source):
                self.results[item.source] = Result(self.job_id, True, byvalue.dumps(None))
                self.exited.add(item.source)
            elif isinstance(item.msg, Closed) and not item.from_launcher:  # the fork server's ranks report for it
                rank = item.source
                self._launcher.wait_exit_status(rank)
                self._hear_the_others(rank)
                self._print_diagnosis({rank: self._launcher.describe_exit(rank)})
                self._printer.flush()
                self._on_break(f"rank {rank} died.")
                raise self._with_records(diagnostics.worker_died(
                    rank, self._launcher.rank_label(rank, workers.get(rank, {})), self._launcher.exit_status(rank),
                    self._launcher.describe_exit(rank)))
            elif isinstance(item.msg, LaunchFailed) and item.msg.rank in self.waiting():  # its machine is lost
                self._printer.flush()
                self._on_break(item.msg.reason)
                raise diagnostics.rank_lost(item.msg.rank, item.msg.reason)
            elif self._take(item) and isinstance(item.msg, Result) and not item.msg.ok:
                grace_ends = grace_ends or time.monotonic() + ERROR_GRACE_S
            pause = self.debug.paused_s - paused  # the learner's time at a prompt is not the job's
            deadline += pause
            grace_ends = grace_ends and grace_ends + pause
            if self.debug.ended:
                self._stop_debugging(self.debug.ended)

    def _hear_the_others(self, dead: int) -> None:
        """A rank died: the others' answers for ``ERROR_GRACE_S`` at most. Those blocked in a collective with it
        fail at once (gloo: "Connection closed by peer"), and gloo retires a failed call as if it completed: only
        their errors tell the doctor that the call did not complete."""
        deadline = time.monotonic() + ERROR_GRACE_S
        while [r for r in self.waiting() if r != dead] and (item := self._inbox.next(deadline)):
            self._take(item)

    def _exited_cleanly(self, rank: int) -> bool:
        """A last job's rank whose process ended with status 0 without answering (``os._exit(0)``)."""
        if not self.last:
            return False
        self._launcher.wait_exit_status(rank)
        status = self._launcher.exit_status(rank)
        return status is not None and os.waitstatus_to_exitcode(status) == 0

    def _look_for_a_hang(self) -> None:
        stacks = self._stacks(self.waiting())
        diagnosis = self._diagnosis()
        message = self.watch.look(stacks, diagnosis.records, diagnosis if diagnosis.problem else None)
        if message and diagnosis.problem:
            self._shown = str(diagnosis)  # a timeout or interrupt that reads the same does not print it again
        if message:
            self._printer.flush()  # every rank has been silent for the watch's time: a half line is whole
            print(message, end="", flush=True)

    def _stop_debugging(self, ended: Ended) -> None:
        """The learner quit pdb, interrupted it, or cannot answer: stop the job on every rank, and
        restart the ranks that stay blocked (in a collective, waiting for the one that quit)."""
        for rank in self.waiting():
            self._send(rank, Cancel(self.job_id))
        deadline = time.monotonic() + CANCEL_WAIT_S
        while self.waiting() and (item := self._inbox.next(deadline)):
            self._take(item)
        self._printer.flush()
        stuck = self.waiting()
        if stuck and self._restart is not None:
            print(f"[ppkit] rank(s) {stuck} are blocked, waiting for rank {ended.rank}: restarting every rank "
                  "(a new process group)...", flush=True)
            self._restart()
        elif stuck:
            self._on_break(f"rank(s) {stuck} were still blocked after the pdb session on rank {ended.rank} ended.")
        raise ended_error(ended, stuck, restarted=bool(stuck and self._restart))

    def _diagnosis(self, ended: dict | None = None) -> hang_doctor.Diagnosis:
        """The collective doctor's reading of every rank's flight record (job_doctor.py)."""
        return job_doctor.reading(self._send, self._inbox, self.world_size, self.results, self.records, self.exited,
                                  self.last, ended)

    def _print_diagnosis(self, ended: dict | None = None) -> None:
        diagnosis = self.diagnosis = self._diagnosis(ended)
        if diagnosis.problem:
            self._printer.flush()
            same = str(diagnosis) == self._shown
            print("[ppkit] collective doctor: the records read as they did when the hang watch showed them above.\n"
                  if same else diagnosis, end="", flush=True)

    def _with_records(self, error):
        error.diagnosis = self.diagnosis
        return error

    def _take(self, item: Item) -> bool:
        if isinstance(item.msg, FlightRecord):  # a rank's last words as gloo aborts it; a late answer: dropped
            record = hang_doctor.last_words(item, self.job_id)
            if record is not None:
                self.records[item.source] = record
            return False
        if isinstance(item.msg, (Result, Cancelled)) and item.msg.job_id == self.job_id:
            self.results[item.source] = item.msg
            return True
        return False

    def _cancel(self) -> None:
        """Cancel the job on every rank; ``JobInterrupted`` says which could not be stopped and
        where each rank was when interrupted (asked first: a cancelled rank's stack is gone)."""
        stacks = {}
        try:
            stacks = self._stacks(self.waiting())
            try:
                self._print_diagnosis()  # before the cancel: the ranks still wait where the learner saw them hang
            except KeyboardInterrupt:  # a second one: the reading is bounded (gather.WAIT_S), finish it; a third stops
                print("[ppkit] interrupted again: the collective doctor reads the ranks' records first (a few "
                      "seconds), then the job is stopped.", flush=True)
                self._print_diagnosis()
            if self.last:  # processes of ppkit.spawn or %%torchrun: Ctrl-C as torchrun passes it on
                self._interrupt(self.waiting())
            for rank in self.waiting():
                self._send(rank, Cancel(self.job_id))
            deadline = time.monotonic() + CANCEL_WAIT_S
            while self.waiting() and (item := self._inbox.next(deadline)):
                self._take(item)
        except KeyboardInterrupt:
            for rank in self.waiting():
                self._send(rank, Cancel(self.job_id))
        self._printer.flush()
        stuck = self.waiting()
        if stuck:
            self._on_break(f"rank(s) {stuck} did not stop when the job was interrupted.")
        raise self._with_records(diagnostics.interrupted(stuck, stacks))

    def _interrupt(self, ranks: list[int]) -> None:
        """SIGINT to each rank's process on this machine, as torchrun's agent sends it on Ctrl-C: Python's handler
        raises KeyboardInterrupt in the rank's main thread, so its ``except KeyboardInterrupt:`` runs (save a
        checkpoint, then exit). Its answer is awaited for ``INTERRUPT_GRACE_S``; a rank blocked outside Python
        (in a collective) runs no handler until it returns, and the cancel that follows is the fallback."""
        here = socket.gethostname()
        sent = []
        for rank in ranks:
            worker = self._workers.get(rank, {})
            if worker.get("pid") and worker.get("host") in (here, None):
                try:
                    os.kill(worker["pid"], signal.SIGINT)
                    sent.append(rank)
                except OSError:  # gone already
                    pass
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while set(sent) & set(self.waiting()) and (item := self._inbox.next(deadline)):
            self._take(item)

    def _stacks(self, ranks: list[int]) -> dict[int, str]:
        return diagnostics.ask_stacks(self._send, self._inbox, ranks, rendezvous=self.rendezvous)
