"""The fork server: imports torch once, then forks a worker per rank on request.

Importing torch takes seconds; forking a process that already has it takes milliseconds. So
four workers are ready in about the time of one ``import torch``, and ``restart()`` is quick.
The zygote runs in its own session (Kernel > Interrupt does not reach it or its workers), dies
with the kernel (PR_SET_PDEATHSIG plus a parent watch), and reports every worker's exit status
so the controller can say "rank 1 was killed by SIGKILL" rather than "connection lost".

Run as ``python -m ppkit.transport.zygote`` with PPKIT_ADDR, PPKIT_KEY and PPKIT_PARENT set.
PPKIT_ISOLATION=netns (optional) moves it, before anything else, into a private user+network
namespace (private_net.py) that its workers share: what torch opens there no other user can reach;
it then reaches the controller through a Unix socket (PPKIT_ADDR=unix:PATH).
PPKIT_PRELOAD (comma-separated modules, optional) is imported once the first workers are forked,
so that later forks start with it (ppkit.spawn forks anew for every call; DDP's first use imports
torch._dynamo, one to two seconds in every fresh process).
``Shutdown(park_s=S)`` parks it instead of ending it: it leaves its controller and waits S seconds for one line of
JSON on stdin ({"addr", "key", "preload", "log"}) that hands it to the next cluster (ppkit/cluster/launchers/spare.py),
and exits if none comes.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
import traceback

from ppkit.transport.messages import Exited, ForkServerHello, Kill, Shutdown, Spawn, Spawned

PRELOAD_ENV = "PPKIT_PRELOAD"
ISOLATION_ENV = "PPKIT_ISOLATION"  # "netns": a private network for the fork server and its workers


def _reap(conn, children: dict, lock: threading.Lock, have_children: threading.Condition,
          exit_when_lost: bool = True) -> None:
    """Wait for forked workers and report each exit. If the controller is gone, the fork server
    exits (``exit_when_lost``); a remote agent's main loop sees the EOF and exits by itself, after
    ``stop_children``, for which this goes on reaping (without reports).

    A pid is reaped with ``have_children`` held (it is only peeked at before), so a pid that
    ``stop_children`` finds in ``children`` is still ours, at worst a zombie: never a number the
    system has given to another process since."""
    while True:
        with have_children:
            while not children:
                have_children.wait()
        try:
            if hasattr(os, "waitid"):  # not on macOS: there a reaped pid may be signalled
                os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
            with have_children:
                pid, status = os.waitpid(-1, 0)
                rank = children.pop(pid, None)
                have_children.notify_all()
        except ChildProcessError:
            continue
        with lock:
            try:
                conn.send(Exited(rank, pid, status))
            except OSError:
                if exit_when_lost:
                    os._exit(1)


def stop_children(children: dict, have_children: threading.Condition, grace: float = 0.5,
                  ranks: tuple[int, ...] = ()) -> None:
    """SIGTERM every worker still ours (those of ``ranks`` only, if given), wait up to ``grace`` s,
    then SIGKILL the rest (and wait up to 2 s more). Only this process may signal them: it alone
    knows which pids it has not reaped yet (see ``_reap``); the controller, which is not their
    parent, cannot tell."""
    def targets():
        return [pid for pid, rank in children.items() if not ranks or rank in ranks]

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        deadline = time.monotonic() + wait
        with have_children:
            for pid in targets():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            while targets() and time.monotonic() < deadline:
                have_children.wait(deadline - time.monotonic())
            if not targets():
                return


class _Link:
    """The fork server's connection to its controller, for the reaper thread: None while parked (no one to tell)."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, msg) -> None:
        if self.conn is not None:
            self.conn.send(msg)


def _wait_to_be_handed_on(seconds: float) -> dict:
    """A parked fork server's wait for its next controller: one line of JSON on stdin, or exit after ``seconds``
    (or at EOF: the kernel stopped it, or ended). Its output then goes to the new cluster's log."""
    import json
    import select

    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    line = sys.stdin.readline() if ready else ""
    if not line:
        os._exit(0)
    told = json.loads(line)
    log = os.open(told["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    return told


def _child(conn, address, key, rank: int, zygote_pid: int) -> None:
    from ppkit.transport import procs, worker

    code = 0
    try:
        conn.close()  # the zygote's connection is not ours to use
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # stdin: the fork server's is the kernel's pipe for handing it on (spare.py)
        os.close(devnull)
        procs.die_with_parent(zygote_pid)  # the fork server's atexit handlers stay: see interpreter_exit.py
        worker.run(address, key, rank=rank)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> None:
    from ppkit.transport import channel, private_net, procs

    # first: unshare of a user namespace needs a process with one thread (die_with_parent starts one)
    isolation = "not asked for"
    if os.environ.pop(ISOLATION_ENV, "") == "netns":
        isolation = private_net.enter() or ""
    address = channel.parse_address(os.environ.pop("PPKIT_ADDR"))
    key = bytes.fromhex(os.environ.pop(channel.KEY_ENV))
    procs.die_with_parent(int(os.environ.pop("PPKIT_PARENT")))
    preload = [name for name in os.environ.pop(PRELOAD_ENV, "").split(",") if name]

    import cloudpickle  # noqa: F401  (preloaded so that forked workers start warm)
    import torch
    import torch.distributed  # noqa: F401

    import ppkit.transport.worker  # noqa: F401

    conn = channel.connect(address, key)
    lock = threading.Lock()
    children: dict[int, int] = {}
    have_children = threading.Condition()
    conn.send(ForkServerHello(os.getpid(), isolation))
    link = _Link(conn)
    threading.Thread(target=_reap, args=(link, children, lock, have_children), daemon=True).start()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if isinstance(msg, Spawn):
            for rank in msg.ranks:
                with have_children:  # hold it across fork so the reaper cannot miss the pid
                    pid = os.fork()
                    if pid == 0:
                        _child(conn, address, key, rank, os.getppid())
                    children[pid] = rank
                    have_children.notify_all()
                with lock:
                    conn.send(Spawned(rank, pid))
            for name in preload:  # not before: the first workers need not wait for it
                try:
                    importlib.import_module(name)
                except Exception:  # noqa: BLE001 - a preload is an optimisation, never a failure
                    pass
            preload = []
        elif isinstance(msg, Kill):
            stop_children(children, have_children, ranks=msg.ranks)
        elif isinstance(msg, Shutdown) and msg.park_s > 0:  # parked: wait for the next cluster
            stop_children(children, have_children)
            with lock:
                link.conn = None
                conn.close()
            told = _wait_to_be_handed_on(msg.park_s)
            address, key = channel.parse_address(told["addr"]), bytes.fromhex(told["key"])
            preload = [name for name in told["preload"].split(",") if name]
            conn = channel.connect(address, key)
            with lock:
                link.conn = conn
            conn.send(ForkServerHello(os.getpid(), isolation))
        elif isinstance(msg, Shutdown):
            os._exit(0)


if __name__ == "__main__":
    main()
