"""pdb on a rank, with the notebook as its terminal.

A rank has no terminal: a plain ``breakpoint()`` there reads end-of-file and quits (``BdbQuit``).
Here every way into pdb on a worker (``breakpoint()``, ``pdb.set_trace()``,
``torch.distributed.breakpoint(rank=r)``) builds a ``RankPdb`` instead, whose stdin and stdout
are the control channel: what pdb prints is kept until it asks for a line, then sent with its
prompt (``DebugPrompt``); the controller asks the learner through the kernel's stdin and sends the
answer back (``DebugLine``). The main thread waits for it in short slices, so that a cancel (an
asynchronous exception, worker.py) still lands.

``PYTHONBREAKPOINT`` keeps its meaning: "0" skips every ``breakpoint()``, another hook is called.
The exception of the last job that raised is kept for ``PostMortem`` (``cluster.debug()``) until
the next job starts.
"""

from __future__ import annotations

import code
import ctypes
import os
import pdb
import queue
import sys
import threading

from ppkit.transport.debug.messages import DebugLeft, DebugPrompt

LINE_POLL_S = 0.2  # how often the waiting main thread lets an asynchronous exception (a cancel) in
# stepping out of a job never stops in the worker's own frames, nor in ppkit.spawn's or %%torchrun's
SKIP = ["ppkit.transport.*", "ppkit.cluster.spawn.*", "ppkit.cluster.torchrun.*", "runpy"]


class _Dropped(BaseException):
    """Stands in for an asynchronous exception (a cancel) that arrived too late, so it can be dropped."""


def _checkpoint() -> None:
    """A Python call: the interpreter looks for a pending asynchronous exception on entry."""


def drop_async_exc(thread_id: int) -> None:
    """Drop a pending asynchronous exception of the calling thread ``thread_id``.

    ``PyThreadState_SetAsyncExc(id, NULL)`` drops it too, but CPython 3.11 then leaves the eval
    breaker set for good, and under a trace function every later call re-runs its first
    instruction for ever: pdb's ``n`` over a call hung on a worker that had finished a job. An
    exception raised and caught here clears the breaker as a delivered one does.
    """
    try:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(_Dropped))
        for _ in range(3):  # a call and a loop: where it lands, if not on the line above already
            _checkpoint()
    except _Dropped:
        pass


class RankDebugger:
    """This rank's end of every pdb session: ``send`` sends a message to the controller,
    ``sync_output`` returns once what the rank printed so far is on its way (it comes first)."""

    def __init__(self, rank: int, send, sync_output):
        self.rank, self._send, self._sync = rank, send, sync_output
        self._lines: queue.Queue[str] = queue.Queue()
        self.kept: BaseException | None = None  # the last job's error, for a post-mortem
        self.in_job = False  # a job runs: the notebook reads this rank's prompts

    def install(self) -> None:
        """Make ``breakpoint()``, ``pdb.set_trace()`` and torch's distributed breakpoint open a RankPdb."""
        sys.breakpointhook = self.breakpointhook
        pdb.set_trace = self.set_trace
        # pdb.Pdb().set_trace() and its subclasses' (ipdb's): a RankPdb there too, not a pdb that reads EOF
        pdb.Pdb.set_trace = lambda _debugger, frame=None: self._pdb_in_job().set_trace(frame or sys._getframe(1))
        self.patch_torch()

    def patch_torch(self) -> None:
        """``torch.distributed.breakpoint`` opens /dev/stdin (the rank has none): give it ours."""
        dist = sys.modules.get("torch.distributed")
        if dist is not None and hasattr(dist, "_make_distributed_pdb"):
            dist._make_distributed_pdb = self._pdb_in_job

    def new_pdb(self) -> RankPdb:
        return RankPdb(self)

    def _pdb_in_job(self) -> RankPdb:
        """A RankPdb for a breakpoint, if the notebook will read its prompts; a clear error if not."""
        if not self.in_job:  # e.g. a function RPC runs here: the kernel waits in rpc_sync, not in a job
            raise RuntimeError(
                f"breakpoint() on rank {self.rank} outside a cluster.run job (in a function run by RPC, or in a "
                "thread that outlived its job): nothing in the notebook reads pdb's prompt there. Debug the "
                "function with cluster.run(...) first, or skip breakpoints with PYTHONBREAKPOINT=0.")
        return self.new_pdb()

    def breakpointhook(self, *args, **kwargs):
        hook = os.environ.get("PYTHONBREAKPOINT", "")
        if hook == "0":
            return None
        if hook not in ("", "pdb.set_trace"):  # the learner's own hook, as Python would call it
            return sys.__breakpointhook__(*args, **kwargs)
        self._pdb_in_job().set_trace(sys._getframe().f_back)

    def set_trace(self, *, header=None) -> None:
        debugger = self._pdb_in_job()
        if header is not None:
            debugger.message(header)
        debugger.set_trace(sys._getframe().f_back)

    # -- talking to the controller ----------------------------------------------------------------
    def reply(self, line: str) -> None:
        """The learner's answer (the reader thread calls this)."""
        self._lines.put(line)

    def ask(self, text: str, prompt: str, where: str) -> str:
        self._sync()  # what the rank printed before (a stepped line's print) shows first
        while not self._lines.empty():  # an answer to a prompt that is gone (a cancelled session)
            self._lines.get_nowait()
        self._send(DebugPrompt(text, prompt, where))
        while True:
            try:
                return self._lines.get(timeout=LINE_POLL_S)
            except queue.Empty:
                continue

    def left(self, quit: bool, text: str = "", problem: str = "") -> None:
        self._sync()
        self._send(DebugLeft(quit, text, problem))

    # -- jobs and post-mortems --------------------------------------------------------------------
    def start_job(self) -> None:
        self.kept, self.in_job = None, True
        self.patch_torch()  # the job may be the first to import torch.distributed

    def end_job(self) -> None:
        self.in_job = False
        sys.settrace(None)  # a session that stepped out of the job: the worker's loop runs untraced

    def post_mortem(self) -> None:
        """pdb at the frame that raised the last job's error, in a thread of its own (the main
        thread may be blocked in a collective); the controller hears ``DebugLeft`` at the end."""
        threading.Thread(target=self._post_mortem, name="ppkit-post-mortem", daemon=True).start()

    def _post_mortem(self) -> None:
        exc = self.kept
        if exc is None:
            self.left(False, problem=f"rank {self.rank} keeps no error: its last job did not raise, or a job "
                                     "started since. Run the failing job again, then cluster.debug().")
            return
        tb = exc.__traceback__
        while tb.tb_next is not None and _ours(tb.tb_frame):  # the worker's call of the job, spawn's, torchrun's
            tb = tb.tb_next
        debugger = self.new_pdb()
        debugger.message(f"post-mortem on rank {self.rank}: {type(exc).__name__}: {exc}")
        debugger.reset()
        try:
            debugger.interaction(None, tb)
        finally:
            if not debugger.told:
                self.left(debugger.quitting, debugger.terminal.take())


def _ours(frame) -> bool:
    """A frame of ppkit's own machinery that runs the learner's code (not of a lesson the learner runs)."""
    return frame.f_globals.get("__name__", "").startswith(("ppkit.transport.", "ppkit.cluster.", "runpy"))


class _Terminal:
    """pdb's stdin and stdout: what pdb writes waits for its next read, and goes with the prompt."""

    def __init__(self, debugger: RankPdb):
        self._debugger = debugger
        self._text: list[str] = []

    def write(self, text: str) -> int:
        self._text.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def take(self) -> str:
        text, self._text = "".join(self._text), []
        return text

    def readline(self) -> str:
        text, prompt = self.take(), self._debugger.prompt
        if text.endswith(prompt):  # cmd.Cmd wrote the prompt just before reading
            text = text[:-len(prompt)]
        return self._debugger.ask(text, prompt) + "\n"


class RankPdb(pdb.Pdb):
    """pdb whose terminal is the notebook cell that runs the job."""

    def __init__(self, rank_debugger: RankDebugger):
        self.terminal = _Terminal(self)
        super().__init__(stdin=self.terminal, stdout=self.terminal, skip=SKIP, nosigint=True)
        self.rank_debugger = rank_debugger
        self.prompt = f"(Pdb rank {rank_debugger.rank}) "
        self.told = False  # the controller heard DebugLeft since the last prompt

    def set_trace(self, frame=None) -> None:
        """As bdb's, but the frames below the job (the worker's loop) are neither traced nor shown (w, u)."""
        frame = sys._getframe().f_back if frame is None else frame
        self.reset()
        while frame is not None and not self.is_skipped_module(frame.f_globals.get("__name__")):
            frame.f_trace = self.trace_dispatch
            self.botframe = frame
            frame = frame.f_back
        self.set_step()
        sys.settrace(self.trace_dispatch)

    def ask(self, text: str, prompt: str) -> str:
        self.told = False
        return self.rank_debugger.ask(text, prompt, self._where())

    def _where(self) -> str:
        frame = getattr(self, "curframe", None)
        if frame is None:
            return "(no frame)"
        return f"{frame.f_code.co_filename}, line {frame.f_lineno}, in {frame.f_code.co_name}"

    def _leave(self, quit: bool) -> None:
        self.told = True
        self.rank_debugger.left(quit, self.terminal.take())

    def do_continue(self, arg):
        result = super().do_continue(arg)
        self._leave(False)
        return result

    do_c = do_cont = do_continue

    def do_quit(self, arg):
        result = super().do_quit(arg)
        self._leave(True)
        return result

    do_q = do_exit = do_quit

    def do_EOF(self, arg):
        result = super().do_EOF(arg)
        self._leave(True)
        return result

    def do_interact(self, arg):
        """interact: a Python console in the current frame's namespace (exit() or quit() ends it)."""
        namespace = {**self.curframe.f_globals, **self.curframe_locals}
        _Console(self, namespace).interact(banner="*interactive* (exit() returns to pdb)", exitmsg="")


class _Console(code.InteractiveConsole):
    """``interact``'s console, reading and writing through the debugger's terminal."""

    def __init__(self, debugger: RankPdb, namespace: dict):
        super().__init__(namespace)
        self._debugger = debugger

    def write(self, data: str) -> None:
        self._debugger.terminal.write(data)

    def raw_input(self, prompt: str = "") -> str:
        line = self._debugger.ask(self._debugger.terminal.take(), prompt)
        if line.strip() in ("exit()", "quit()"):
            raise EOFError
        return line
