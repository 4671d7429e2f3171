"""What the Cluster says when something goes wrong: how a process ended, where each rank waits,
and the errors built from them (each says what happened, why, and what to type next)."""

from __future__ import annotations

import os
import re
import signal
import time
from html import escape

from ppkit.errors import (
    ClusterStateError,
    JobInterrupted,
    JobTimeoutError,
    LaunchError,
    RemoteError,
    WorkerDiedError,
)
from ppkit.transport.messages import AskStacks, ErrorInfo, Rendezvous, Stacks

RESTART = "Run cluster.restart() for a clean world"


def describe_status(status: int | None, oom=None) -> str:
    """A wait status in words: "it was killed by signal SIGKILL"; with ``oom`` (an ``OomWatch`` of the
    process's cgroup), a SIGKILL says whether the out-of-memory killer sent it."""
    if status is None:
        return "its connection closed" + (oom.explain(None) if oom is not None else "")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return f"it was killed by signal {name}" + (oom.explain(status) if oom is not None else "")
    return f"it exited with code {os.WEXITSTATUS(status)}"


def ask_stacks(send, inbox, ranks: list[int], wait: float = 2.0, rendezvous: dict | None = None) -> dict[int, str]:
    """Where each of ``ranks`` waits now (its main thread's stack); ``send(rank, msg)`` is False
    for a rank that is gone. ``rendezvous``, if given, gets each answering rank's rendezvous
    history (``Stacks.rendezvous``). What else arrives meanwhile (a result) is put back."""
    stacks = {rank: "(rank is gone)" for rank in ranks if not send(rank, AskStacks())}
    deadline = time.monotonic() + wait
    others = []
    while len(stacks) < len(ranks):
        item = inbox.next(deadline)
        if item is None:
            break
        if isinstance(item.msg, Stacks) and item.source in ranks:
            stacks[item.source] = item.msg.text
            if rendezvous is not None:
                rendezvous[item.source] = item.msg.rendezvous
        elif not isinstance(item.msg, Stacks):
            others.append(item)
    inbox.put_back(others)
    return {r: stacks.get(r, "(no answer)") for r in ranks}


def repeated_rendezvous(rendezvous: dict) -> tuple[list[int], Rendezvous, int] | None:
    """(ranks, rendezvous, times) where ranks' processes rendezvoused on one port more
    than once, or None. ``rendezvous``: rank -> that process's history, oldest first."""
    repeats: dict[Rendezvous, dict[int, int]] = {}
    for rank, history in rendezvous.items():
        for where in set(history):
            if history.count(where) > 1:
                repeats.setdefault(where, {})[rank] = history.count(where)
    if not repeats:
        return None
    where, counts = max(repeats.items(), key=lambda kv: (len(kv[1]), max(kv[1].values())))
    return sorted(counts), where, max(counts.values())


PERSISTENT_WORKERS_ADVICE = (
    "Run such code with ppkit.spawn(fn, args=(world_size,), nprocs=world_size), which starts fresh processes "
    "for every call as mp.spawn does, or use a new MASTER_PORT for every run "
    "(ppkit.lessons.data_parallel.free_port()).")


def reinit_note(rendezvous: dict, advice: str = PERSISTENT_WORKERS_ADVICE) -> str:
    """Why a job may hang: a process group re-created on the same port in the same process."""
    found = repeated_rendezvous(rendezvous)
    if found is None:
        return ""
    ranks, where, times = found
    scheme, host, port = where.scheme, where.host, where.port
    return (f"Rank(s) {ranks} created a process group on port {port} ({scheme}://{host}:{port}) "
            f"{times} times in the same process: a group re-created on the same port in processes "
            "that keep running can hang in its first collective or fail to connect, because it can "
            f"meet the previous group's store (PyTorch issue 74666). {advice} ")


def format_stacks(stacks: dict[int, str]) -> str:
    return "".join(f"\n--- rank {r} is waiting here ---\n{cells_named(text)}" for r, text in stacks.items())


_FRAME = re.compile(r'^([ |]*)File "([^"]+)", line (\d+)', re.MULTILINE)


def cells_named(text: str) -> str:
    """A rank's stack or traceback with each notebook cell's frame named as IPython and the collective doctor
    name it (``Cell In[4], line 5``), not by the kernel's temporary file (``/tmp/ipykernel_.../123.py``)."""
    from ppkit.cluster.hang_doctor.words import place

    def named(match: re.Match) -> str:
        cell = place(match[2])
        return f"{match[1]}{cell}, line {match[3]}" if cell.startswith("Cell In[") else match[0]

    return _FRAME.sub(named, text)


def needs_restart(reason: str) -> ClusterStateError:
    return ClusterStateError(
        f"this cluster needs a restart before it can run jobs: {reason} "
        "Run cluster.restart() (the kernel and your notebook variables stay).")


# -- while starting -----------------------------------------------------------------------------
def start_timed_out(seconds: float, what: str, hint: str) -> LaunchError:
    return LaunchError(f"timed out after {seconds:.0f} s waiting for {what}. {hint}")


def join_failed(rank: int, error: ErrorInfo, hint: str) -> LaunchError:
    hint = f"\n{hint}" if hint else ""
    return LaunchError(
        f"rank {rank} could not join the process group: {error.type}: {error.message}{hint}"
        f"\n\n--- traceback on rank {rank} ---\n{error.traceback}")


def died_while_starting(rank: int, how: str) -> LaunchError:
    """``how``: the launcher's words for how it ended (``Launcher.describe_exit``)."""
    return LaunchError(f"rank {rank} died while starting: {how}. See its output above.")


def agent_lost(name: str, host: str, silent_s: float | None) -> str:
    """Why remote worker ``name``'s agent is gone: its connection closed, or it said nothing for
    ``silent_s`` seconds (no heartbeat: its machine froze or left the network)."""
    if silent_s is None:
        why = "disconnected: its `ppkit worker` process stopped or the network between the machines failed"
    else:
        why = (f"stopped answering: nothing from its `ppkit worker` for {silent_s:g} s (that machine froze, "
               "lost power or left the network, or the network between the machines failed)")
    return f"{name} on {host} {why}. Start it again, then run cluster.restart()."


# -- during a job -------------------------------------------------------------------------------
def job_timed_out(seconds: float, waiting: list[int], done: list[int], stacks: dict,
                  rendezvous: dict | None = None) -> JobTimeoutError:
    mute = [r for r in waiting if stacks.get(r) == "(no answer)"]  # a frozen (SIGSTOPped) process says nothing
    return JobTimeoutError(
        f"the job did not finish within {seconds:g} s: rank(s) {waiting} are still waiting"
        + (f" (rank(s) {done} finished)" if done else "")
        + (f". Rank(s) {mute} did not even say where they wait: stopped, frozen or overloaded" if mute else "")
        + ". " + (reinit_note(rendezvous or {}) or "Usually a send without a matching recv, or a collective "
                  "that not every rank called. ") + f"{RESTART}; pass run(..., timeout=SECONDS) if "
        "the job is just slow.\n" + format_stacks(stacks), waiting, stacks, done, rendezvous)


def job_not_taken(seconds: float, ranks: list[int], size: int) -> JobTimeoutError:
    return JobTimeoutError(
        f"rank(s) {ranks} did not take the job ({size / 1e6:.1f} MB) within {seconds:g} s: they read "
        "nothing from the notebook, so the job could not even be sent. Usually the process is "
        "stopped (SIGSTOP, Ctrl-Z in its terminal) or its machine stopped answering. "
        f"{RESTART}; pass run(..., timeout=SECONDS) if a large job just needs longer to send.", ranks, {})


def interrupted_while_sending(ranks: list[int], size: int) -> JobInterrupted:
    return JobInterrupted(
        f"interrupted while sending the job ({size / 1e6:.1f} MB): rank(s) {ranks} had not taken it "
        f"(they read nothing: stopped, or busy outside ppkit). {RESTART}; your notebook variables stay.")


def worker_died(rank: int, label: str, status: int | None, how: str) -> WorkerDiedError:
    """``how``: the launcher's words for how it ended (``Launcher.describe_exit``)."""
    return WorkerDiedError(
        f"rank {rank} ({label}) died during the job: {how}. The other ranks "
        "may be blocked waiting for it. Run cluster.restart() to start a clean world.", [rank], status, how)


def rank_lost(rank: int, reason: str) -> WorkerDiedError:
    """``rank`` runs on a machine whose agent is gone (``reason``: agent_lost's words)."""
    return WorkerDiedError(f"rank {rank} is lost during the job: {reason}", [rank])


def ranks_raised(errors: dict[int, ErrorInfo], waiting: list[int], stacks: dict,
                 rendezvous: dict | None = None) -> RemoteError:
    """``errors``: rank -> the error of its ``Result``, for every rank that raised;
    ``rendezvous``: the waiting ranks' histories (the failed ones' come with their errors)."""
    failed = sorted(errors)
    first = errors[failed[0]]
    rendezvous = {**(rendezvous or {}), **{r: e.rendezvous for r, e in errors.items() if e.rendezvous}}
    text = (f"rank {failed[0]} raised {first.type}: {first.message}"
            if len(failed) == 1 else
            f"ranks {failed} raised an exception (rank {failed[0]}: {first.type}: "
            f"{first.message})")
    if note := reinit_note(rendezvous):
        text += f"\n{note.strip()}"
    for r in failed:
        text += f"\n\n--- traceback on rank {r} ---\n{cells_named(errors[r].traceback)}"
    if waiting:
        text += (f"\nRank(s) {waiting} are still blocked, probably waiting for the failed "
                 f"rank. {RESTART}.\n" + format_stacks(stacks))
    return RemoteError(text, failed, {r: e.traceback for r, e in errors.items()},
                       {r: e.type for r, e in errors.items()}, {r: e.message for r, e in errors.items()},
                       stacks, rendezvous)


def interrupted(stuck: list[int], stacks: dict) -> JobInterrupted:
    """``stacks``: where each rank that was running was interrupted; the message shows the
    ``stuck`` ones', which did not stop."""
    if not stuck:
        return JobInterrupted(
            "interrupted: the job was cancelled on every rank; the cluster is ready to use.", [], stacks)
    return JobInterrupted(
        f"interrupted: rank(s) {stuck} could not be stopped (they are blocked outside Python, "
        f"e.g. in a collective). {RESTART}; your notebook variables stay.\n"
        + format_stacks({r: stacks.get(r, "(no answer)") for r in stuck}), stuck, stacks)


# -- display ------------------------------------------------------------------------------------
def cluster_html(world_size: int, backend: str, state: str, workers: dict) -> str:
    rows = "".join(
        "<tr>" + "".join(f"<td>{escape(str(w.get(k)))}</td>"
                         for k in ("rank", "pid", "host", "backend", "device")) + "</tr>"
        for _, w in sorted(workers.items()))
    return (f"<p><b>ppkit cluster</b>: {world_size} rank(s), backend "
            f"<code>{escape(backend)}</code>, state <code>{escape(state)}</code></p>"
            "<table><tr><th>rank</th><th>pid</th><th>host</th><th>backend</th>"
            f"<th>device</th></tr>{rows}</table>")
