"""The Cluster: a world of worker processes driven from the notebook kernel.

The kernel is the *controller*: it listens on an authenticated control channel, a fork server
(zygote) forks one worker per rank, and every worker connects back. All printing happens in the
thread that called ``start``/``run``, so output lands in the right notebook cell.
"""

from __future__ import annotations

import atexit
import itertools
import linecache
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

import cloudpickle

from ppkit.cluster import launch
from ppkit.cluster.output import RankPrinter
from ppkit.errors import (
    ClusterStateError,
    ConfigError,
    JobInterrupted,
    JobTimeoutError,
    LaunchError,
    RemoteError,
    WorkerDiedError,
)
from ppkit.transport import channel, procs

DEFAULT_TIMEOUT_S = 60.0
ERROR_GRACE_S = 3.0  # after one rank raises, how long the others get to finish
_live_clusters: weakref.WeakSet[Cluster] = weakref.WeakSet()


def _describe_status(status: int | None) -> str:
    if status is None:
        return "its connection closed"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return f"it was killed by signal {name}"
    return f"it exited with code {os.WEXITSTATUS(status)}"


class Cluster:
    """A world of ``world_size`` ranks, each a background worker process.

    >>> with Cluster(2) as cluster:
    ...     cluster.run(lambda rank, world_size: rank * 10)
    [0, 10]

    ``run(fn, *args)`` calls ``fn(rank, world_size, *args)`` on every rank at once; ``fn`` may be
    defined in a notebook cell (it is shipped by value with cloudpickle).
    """

    def __init__(self, world_size: int, backend: str = "auto", *, timeout: float = DEFAULT_TIMEOUT_S,
                 start_timeout: float = 120.0, process_group: bool = True,
                 env: dict[str, str] | None = None, labels: list[str] | None = None):
        self.world_size = launch.check_world_size(world_size)
        self.backend = launch.resolve_backend(backend, self.world_size)
        self.timeout = _check_timeout(timeout, "timeout")
        self.start_timeout = _check_timeout(start_timeout, "start_timeout")
        self.process_group = bool(process_group)
        self._env = {**launch.local_env(), **(env or {})}
        self.state = "starting"
        self.workers: dict[int, dict] = {}
        self._key = channel.new_key()
        self._inbox: queue.Queue = queue.Queue()
        self._conns: dict[int, object] = {}
        self._generation = 0
        self._job_ids = itertools.count(1)
        self._printer = RankPrinter(labels)  # labels: how output is prefixed, "rank N" by default
        self._zygote = None
        self._zygote_conn = None
        self._exit_status: dict[int, int] = {}  # pid -> wait status, as the fork server reports
        self._spawned: dict[int, int] = {}  # rank -> pid of this generation's process
        self._broken_reason = ""
        self._tmpdir = Path(tempfile.mkdtemp(prefix="ppkit-"))
        self._server = channel.ChannelServer("127.0.0.1", 0, self._key, self._on_connect)
        self.address = self._server.address
        _live_clusters.add(self)
        try:
            self._start_workers()
        except BaseException:
            self.close()
            raise

    # -- connections (called from the channel's threads) -----------------------------------
    def _on_connect(self, conn) -> None:
        threading.Thread(target=self._reader, args=(conn,), daemon=True).start()

    def _reader(self, conn) -> None:
        try:
            first = conn.recv()
        except (EOFError, OSError):
            conn.close()
            return
        if first[0] == "zygote":
            self._inbox.put(("zygote", None, first, conn))
            source = "zygote"
            generation = None
        elif first[0] == "hello":
            generation = self._generation
            rank = first[1].get("rank")
            if not isinstance(rank, int) or not 0 <= rank < self.world_size:
                conn.send(("reject", f"this cluster has ranks 0..{self.world_size - 1}, not {rank!r}"))
                conn.close()
                return
            conn.send(("init", self._init_config(rank)))
            self._conns[rank] = conn
            self._inbox.put(("hello", rank, first, generation))
            source = rank
        else:
            conn.close()
            return
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self._inbox.put(("eof", source, None, generation))
                return
            self._inbox.put(("msg", source, msg, generation))

    def _init_config(self, rank: int) -> dict:
        store = self._tmpdir / f"store-{self._generation}"
        device = f"cuda:{rank}" if self.backend == "nccl" else "cpu"
        return {
            "rank": rank, "world_size": self.world_size, "backend": self.backend, "device": device,
            "store": ("file", str(store)), "process_group": self.process_group,
            # the kernel's sys.path too, so functions imported from modules the notebook can
            # import (sys.path.append("..") in a cell, pytest's test dirs) unpickle on the workers
            "env": self._env, "cwd": os.getcwd(), "sys_path": [os.getcwd(), *filter(None, sys.path)],
            "join_timeout": self.start_timeout, "pg_timeout": 1800,
        }

    # -- start, restart, close ---------------------------------------------------------------
    def _start_workers(self) -> None:
        self.state = "starting"
        self.workers = {}
        self._exit_status = {}
        self._spawned = {}
        self._sources_sent: set[str] = set()
        deadline = time.monotonic() + self.start_timeout
        if self._zygote is None or self._zygote.poll() is not None:
            self._zygote = launch.start_zygote(self.address, self._key, self._tmpdir / "zygote.log")
            while self._zygote_conn is None:
                kind, source, msg, extra = self._next(deadline, waiting_for="the fork server")
                if kind == "zygote":
                    self._zygote_conn = extra
        self._zygote_conn.send(("spawn", list(range(self.world_size))))
        ready: set[int] = set()
        while len(ready) < self.world_size:
            kind, source, msg, generation = self._next(deadline, waiting_for=self._missing(ready))
            if kind == "msg" and source != "zygote" and generation == self._generation:
                if msg[0] == "ready":
                    self.workers[source] = msg[1]
                    ready.add(source)
                elif msg[0] == "failed":
                    self._printer.flush()
                    raise LaunchError(
                        f"rank {source} could not join the process group: {msg[1]['type']}: "
                        f"{msg[1]['message']}\n\n--- traceback on rank {source} ---\n"
                        f"{msg[1]['traceback']}")
            elif kind == "eof" and source == "zygote":
                raise LaunchError(
                    "the fork server that starts the workers exited before they were ready.\n"
                    f"Its log ({self._tmpdir / 'zygote.log'}) ends with:\n{self._zygote_log()}")
            elif kind == "eof" and generation == self._generation:
                time.sleep(0.2)
                self._drain()
                raise LaunchError(
                    f"rank {source} died while starting: "
                    f"{_describe_status(self._status_of(source))}. See its output above.")
        self.workers = dict(sorted(self.workers.items()))
        self._printer.flush()
        self.state = "ready"

    def _missing(self, ready: set[int]) -> str:
        missing = [r for r in range(self.world_size) if r not in ready]
        return f"rank(s) {missing} to join"

    def _zygote_log(self) -> str:
        try:
            return (self._tmpdir / "zygote.log").read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def restart(self) -> Cluster:
        """Kill every worker and start a clean world with the same settings (the kernel stays)."""
        if self.state == "closed":
            raise ClusterStateError("this cluster is closed; start a new one with ppkit.start(...).")
        self._kill_workers()
        self._generation += 1
        try:
            self._start_workers()
        except BaseException:
            self.close()
            raise
        return self

    def _kill_workers(self, quiet: bool = False) -> None:
        """Stop this generation's workers; ``quiet`` drops what they print while dying."""
        if quiet:
            self._generation += 1
        for conn in list(self._conns.values()):
            try:
                conn.send(("shutdown",))
            except OSError:
                pass
        pids = [w["pid"] for w in self.workers.values()]
        procs.stop_pids(pids, grace=0.5)
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        self._drain()

    def close(self) -> None:
        """Stop every worker and the fork server. Safe to call twice."""
        if self.state == "closed":
            return
        self.state = "closed"
        self._kill_workers()
        if self._zygote is not None:
            try:
                self._zygote_conn and self._zygote_conn.send(("shutdown",))
            except OSError:
                pass
            procs.stop_pids([self._zygote.pid], grace=1.0)
            self._zygote.wait()
        if self._zygote_conn is not None:
            self._zygote_conn.close()
        self._server.close()
        shutil.rmtree(self._tmpdir, ignore_errors=True)
        _live_clusters.discard(self)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the inbox ---------------------------------------------------------------------------
    def _next(self, deadline: float, waiting_for: str):
        """The next message that is not output, printing output as it comes."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._printer.flush()
                raise LaunchError(
                    f"timed out after {self.start_timeout:.0f} s waiting for {waiting_for}. "
                    "The machine may be overloaded; close other notebooks or raise start_timeout."
                    f"\nFork server log:\n{self._zygote_log()}")
            try:
                item = self._inbox.get(timeout=min(left, 0.1))
            except queue.Empty:
                continue
            if self._handle_common(item):
                continue
            return item

    def _handle_common(self, item) -> bool:
        """Deal with output and exit reports; return True if ``item`` needs nothing more."""
        kind, source, msg, generation = item
        if kind == "zygote":
            return False
        if kind == "msg" and msg[0] == "out":
            if generation == self._generation:
                self._printer.write(source, msg[1], msg[2])
            return True
        if kind == "msg" and source == "zygote" and msg[0] == "exited":
            # keyed by pid: a previous generation's worker may be reported after restart()
            self._exit_status[msg[2]] = msg[3]
            return True
        if kind == "msg" and source == "zygote" and msg[0] == "spawned":
            self._spawned[msg[1]] = msg[2]
            return True
        if kind == "msg" and source == "zygote":
            return True
        return generation is not None and generation != self._generation

    def _drain(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if self._handle_common(item) or item[0] != "eof" or item[1] == "zygote":
                continue
            if self.state == "ready":  # a rank died between jobs (killed, OOM): say so now
                rank = item[1]
                self._wait_exit_status(rank)
                self._break(f"rank {rank} (pid {self.workers.get(rank, {}).get('pid')}) died while "
                            f"no job was running: {_describe_status(self._status_of(rank))}.")

    # -- running jobs ------------------------------------------------------------------------
    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """Run ``fn(rank, world_size, *args, **kwargs)`` on every rank; return results by rank.

        Raises ``RemoteError`` if any rank raised, ``WorkerDiedError`` if a rank died and
        ``JobTimeoutError`` (with where each rank waits) after ``timeout`` seconds.
        """
        if not callable(fn):
            raise ConfigError(
                f"run() needs a function to call on every rank, got {type(fn).__name__} "
                f"{fn!r:.60}. Pass the function itself: cluster.run(my_fn), not cluster.run(my_fn()).")
        timeout = self.timeout if timeout is None else _check_timeout(timeout, "timeout")
        self._check_usable()
        try:
            payload = cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:
            raise ConfigError(
                f"cannot send {getattr(fn, '__name__', fn)!r} and its arguments to the workers: "
                f"{exc}. Pass data (tensors, numbers, lists), not open files, locks or "
                "process handles.") from exc
        return self._run_payload(payload, timeout)

    def _check_usable(self) -> None:
        if self.state == "closed":
            raise ClusterStateError(
                "this cluster is closed. Start a new one: cluster = ppkit.start(N).")
        self._drain()
        if self.state == "broken":
            raise ClusterStateError(
                f"this cluster needs a restart before it can run jobs: {self._broken_reason} "
                "Run cluster.restart() (the kernel and your notebook variables stay).")

    def _run_payload(self, payload: bytes, timeout: float) -> list:
        job_id = next(self._job_ids)
        sources = self._cell_sources()
        for rank in range(self.world_size):
            try:
                self._conns[rank].send(("run", job_id, payload, sources))
            except (OSError, KeyError):
                self._break(f"rank {rank} is gone.")
                self._check_usable()
        results: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        first_error_at = None
        try:
            while len(results) < self.world_size:
                now = time.monotonic()
                if first_error_at is not None and now > first_error_at + ERROR_GRACE_S:
                    break
                if now > deadline:
                    self._raise_timeout(job_id, results, timeout)
                try:
                    item = self._inbox.get(timeout=0.1)
                except queue.Empty:
                    continue
                if self._handle_common(item):
                    continue
                kind, source, msg, _ = item
                if kind == "eof":
                    self._raise_died(source, job_id, results)
                if kind == "msg" and msg[0] in ("result", "cancelled") and msg[1] == job_id:
                    results[source] = msg
                    if msg[0] == "result" and not msg[2] and first_error_at is None:
                        first_error_at = time.monotonic()
        except KeyboardInterrupt:
            self._cancel(job_id, results)
        self._printer.flush()
        failed = sorted(r for r, m in results.items() if m[0] == "result" and not m[2])
        if failed:
            self._raise_remote(job_id, results, failed)
        return [cloudpickle.loads(results[r][3]) for r in range(self.world_size)]

    def _cell_sources(self) -> dict:
        """Notebook cells' source the workers have not had yet.

        IPython keeps each cell's code in ``linecache`` only (mtime None), not on disk; without it
        a remote traceback or stack would name the cell's line but not show it.
        """
        new = {name: entry for name, entry in list(linecache.cache.items())
               if len(entry) == 4 and entry[1] is None and name not in self._sources_sent}
        self._sources_sent.update(new)
        return new

    def _break(self, reason: str) -> None:
        self.state = "broken"
        self._broken_reason = reason

    def _waiting(self, results) -> list[int]:
        return [r for r in range(self.world_size) if r not in results]

    def _stacks(self, ranks: list[int], wait: float = 2.0) -> dict[int, str]:
        stacks: dict[int, str] = {}
        for rank in ranks:
            try:
                self._conns[rank].send(("stacks", rank))
            except (OSError, KeyError):
                stacks[rank] = "(rank is gone)"
        deadline = time.monotonic() + wait
        while len(stacks) < len(ranks) and time.monotonic() < deadline:
            try:
                item = self._inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            if self._handle_common(item):
                continue
            kind, source, msg, _ = item
            if kind == "msg" and msg[0] == "stacks":
                stacks[source] = msg[3]
        return {r: stacks.get(r, "(no answer)") for r in ranks}

    @staticmethod
    def _format_stacks(stacks: dict[int, str]) -> str:
        return "".join(f"\n--- rank {r} is waiting here ---\n{text}" for r, text in stacks.items())

    def _raise_timeout(self, job_id, results, timeout) -> None:
        waiting = self._waiting(results)
        stacks = self._stacks(waiting)
        self._printer.flush()
        done = sorted(results)
        self._break(f"a job timed out with rank(s) {waiting} still blocked.")
        raise JobTimeoutError(
            f"the job did not finish within {timeout:g} s: rank(s) {waiting} are still waiting"
            + (f" (rank(s) {done} finished)" if done else "")
            + ". Usually a send without a matching recv, or a collective that not every rank "
            "called. Run cluster.restart() for a clean world; pass run(..., timeout=SECONDS) if "
            "the job is just slow.\n" + self._format_stacks(stacks), waiting, stacks)

    def _status_of(self, rank) -> int | None:
        pid = self._spawned.get(rank, self.workers.get(rank, {}).get("pid"))
        return self._exit_status.get(pid)

    def _wait_exit_status(self, rank, wait: float = 1.0) -> None:
        """Give the fork server a moment to report how ``rank`` ended."""
        deadline = time.monotonic() + wait
        while self._status_of(rank) is None and time.monotonic() < deadline:
            try:
                self._handle_common(self._inbox.get(timeout=0.05))
            except queue.Empty:
                pass

    def _raise_died(self, rank, job_id, results) -> None:
        self._wait_exit_status(rank)
        self._printer.flush()
        how = _describe_status(self._status_of(rank))
        pid = self.workers.get(rank, {}).get("pid")
        self._break(f"rank {rank} died.")
        raise WorkerDiedError(
            f"rank {rank} (pid {pid}) died during the job: {how}. The other ranks may be "
            "blocked waiting for it. Run cluster.restart() to start a clean world.", [rank])

    def _raise_remote(self, job_id, results, failed) -> None:
        waiting = self._waiting(results)
        tracebacks = {r: results[r][3]["traceback"] for r in failed}
        types = {r: results[r][3]["type"] for r in failed}
        first = results[failed[0]][3]
        text = (f"rank {failed[0]} raised {first['type']}: {first['message']}"
                if len(failed) == 1 else
                f"ranks {failed} raised an exception (rank {failed[0]}: {first['type']}: "
                f"{first['message']})")
        for r in failed:
            text += f"\n\n--- traceback on rank {r} ---\n{tracebacks[r]}"
        if waiting:
            stacks = self._stacks(waiting)
            self._printer.flush()
            self._break(f"rank(s) {waiting} are still blocked after rank {failed[0]} failed.")
            text += (f"\nRank(s) {waiting} are still blocked, probably waiting for the failed "
                     "rank. Run cluster.restart() for a clean world.\n"
                     + self._format_stacks(stacks))
        raise RemoteError(text, failed, tracebacks, types)

    def _cancel(self, job_id, results) -> None:
        for rank in self._waiting(results):
            try:
                self._conns[rank].send(("cancel", job_id))
            except (OSError, KeyError):
                pass
        deadline = time.monotonic() + 2.0
        while self._waiting(results) and time.monotonic() < deadline:
            try:
                item = self._inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            except KeyboardInterrupt:
                break
            if self._handle_common(item):
                continue
            kind, source, msg, _ = item
            if kind == "msg" and msg[0] in ("result", "cancelled") and msg[1] == job_id:
                results[source] = msg
        self._printer.flush()
        stuck = self._waiting(results)
        if not stuck:
            raise JobInterrupted(
                "interrupted: the job was cancelled on every rank; the cluster is ready to use.")
        stacks = self._stacks(stuck)
        self._break(f"rank(s) {stuck} did not stop when the job was interrupted.")
        raise JobInterrupted(
            f"interrupted: rank(s) {stuck} could not be stopped (they are blocked outside Python, "
            "e.g. in a collective). Run cluster.restart() for a clean world; your notebook "
            "variables stay.\n" + self._format_stacks(stacks))

    # -- display -----------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"<ppkit.Cluster world_size={self.world_size} backend={self.backend!r} "
                f"state={self.state!r}>")

    def _repr_html_(self) -> str:
        from html import escape

        rows = "".join(
            "<tr>" + "".join(f"<td>{escape(str(w.get(k)))}</td>"
                             for k in ("rank", "pid", "host", "backend", "device")) + "</tr>"
            for _, w in sorted(self.workers.items()))
        return (f"<p><b>ppkit cluster</b>: {self.world_size} rank(s), backend "
                f"<code>{escape(self.backend)}</code>, state <code>{escape(self.state)}</code></p>"
                "<table><tr><th>rank</th><th>pid</th><th>host</th><th>backend</th>"
                f"<th>device</th></tr>{rows}</table>")


def _check_timeout(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}.")
    return float(value)


@atexit.register
def _close_all() -> None:
    for cluster in list(_live_clusters):
        cluster.close()
