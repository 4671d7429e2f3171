"""``ppkit preflight``: is this machine ready for the course? One line per check, then one summary line.

    $ ppkit preflight
    ok    python         3.11.7 (tested: 3.11)
    ...
    ppkit preflight: 11/11 ok (python 3.11.7, torch 2.14.1, linux, 2 cores)

The first checks only read versions and the machine; the last three start what the notebooks start (a 2-rank
gloo cluster with one all_reduce, an RPC world, one tiny pipeline step checked against a local ResNet50) and close
it again; the first two also say whether other users of the machine could reach them (docs/isolation.md). A failed
check says what to do; one that needs an earlier one (nothing runs without torch) is skipped with the reason. Every
socket is on 127.0.0.1. In a notebook, :func:`run_in_subprocess` runs the same in a fresh process, so the RPC
world it starts leaves the kernel's own untouched (torch allows one per process).
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import threading
import time

from ppkit import machine
from ppkit.checklist import Check, Checklist
from ppkit.cluster import isolation
from ppkit.cluster.admission import DEFAULT_PORT
from ppkit.cluster.budget import read_budget
from ppkit.course import where_docs
from ppkit.progress import hooks as progress

# The versions CI runs the whole course with (constraints.txt). Others may work; they are not tested.
TESTED = {"python": ("3.10", "3.11", "3.12", "3.13"), "torch": ("2.12.1", "2.14.1"),  # docs/versions.md
          "torchvision": ("0.27.1", "0.29.1")}
# a learner with the wheel has no clone, no constraints.txt, no make: the pinned pip command first
INSTALL_TESTED = (f"pip install 'torch=={TESTED['torch'][-1]}' 'torchvision=={TESTED['torchvision'][-1]}' "
                  "(from a clone: pip install -c constraints.txt -e . in it, or make lab)")
MIN_CORES = 2
PPKIT_PORT = DEFAULT_PORT  # ppkit's default for two machines (ppkit master / ppkit worker)
RUN_TIMEOUT_S = 30.0
START_TIMEOUT_S = 40.0


def line(check: Check) -> str:
    """How preflight prints a check: status, name, detail, and the fix under it."""
    text = f"{check.status:<5} {check.name:<14} {check.detail}"
    return text + (f"\n{'':<20}fix: {check.fix}" if check.fix else "")


class Preflight(Checklist):
    """Runs the checks in order; each is a method that returns a :class:`Check` (ppkit/checklist.py:
    ``ok``, ``warn``, ``FAIL``, or ``skip`` when a check it needs failed)."""

    def __init__(self, emit=print):
        super().__init__()
        self.emit = emit
        self.facts: dict[str, str] = {}

    # -- running -----------------------------------------------------------------------------
    def run(self) -> list[Check]:
        steps = [self.python, self.torch, self.torchvision, self.backends, self.widgets,
                 self.machine, self.memory, self.ports, self.cluster, self.rpc_world, self.pipeline]
        for step in steps:
            name = step.__name__.replace("_", " ")
            needs = self._missing_prerequisite(step)
            if needs:
                check = Check(name, "skip", f"needs {needs}, which failed above")
            else:
                started = time.monotonic()
                try:
                    check = step()
                except Exception as exc:  # noqa: BLE001 - any failure becomes a FAIL line with its cause
                    check = Check(name, "FAIL", f"{type(exc).__name__}: {_first_line(exc)}",
                                  fix=_fix_for(step.__name__))
                if step in (self.cluster, self.rpc_world, self.pipeline):
                    check.detail += f" ({time.monotonic() - started:.1f} s)"
            self.checks.append(check)
            self.emit(line(check))
        if any("docs/" in line(check) for check in self.checks):  # a pip-installed learner has no clone
            self.emit(where_docs())
        self.emit(self.summary())
        progress.preflight_done(self.checks, self.summary())  # the learner's record (ppkit/progress/)
        return self.checks

    def _missing_prerequisite(self, step) -> str | None:
        needs = {"torchvision": ["torch"], "backends": ["torch"], "cluster": ["torch", "backends"],
                 "rpc_world": ["torch", "backends"], "pipeline": ["torchvision", "rpc world"]}
        for need in needs.get(step.__name__, []):
            if any(c.name == need and not c.fine for c in self.checks):
                return need
        return None

    def summary(self) -> str:
        good = sum(c.fine for c in self.checks)
        warned = sum(c.status == "warn" for c in self.checks)
        verdict = "ok" if good == len(self.checks) else f"ok, {len(self.checks) - good} not ok"
        extra = f", {warned} warning{'s' * (warned != 1)}" if warned else ""
        facts = ", ".join(f"{k} {v}" for k, v in self.facts.items() if k in ("python", "torch"))
        where = f"{sys.platform if sys.platform != 'darwin' else 'macos'}, {read_budget().cores:g} cores"
        return f"ppkit preflight: {good}/{len(self.checks)} {verdict}{extra} ({facts}, {where})"

    # -- versions ----------------------------------------------------------------------------
    def python(self) -> Check:
        version = platform.python_version()
        self.facts["python"] = version
        return _against_tested("python", version, "install Python 3.10 to 3.13, make a venv with it "
                               "(python3.12 -m venv ~/ppkit-venv) and pip install the course's wheel (ppkit-*.whl) "
                               "there; from a clone: make lab")

    def torch(self) -> Check:
        import torch

        self.facts["torch"] = torch.__version__.split("+")[0]
        return _against_tested("torch", torch.__version__, INSTALL_TESTED)

    def torchvision(self) -> Check:
        import torchvision

        return _against_tested("torchvision", torchvision.__version__, INSTALL_TESTED)

    def backends(self) -> Check:
        import torch.distributed as dist

        if not dist.is_available():
            return Check("backends", "FAIL", "this torch build has no torch.distributed",
                         fix="install a torch wheel from PyPI: " + INSTALL_TESTED)
        from torch.distributed import rpc

        missing = [name for name, there in (("gloo", dist.is_gloo_available()),
                                            ("rpc", rpc.is_available())) if not there]
        if missing:
            return Check("backends", "FAIL", f"this torch build lacks {' and '.join(missing)}",
                         fix="install a torch wheel from PyPI (it has both): " + INSTALL_TESTED)
        return Check("backends", "ok", "gloo and torch.distributed.rpc available")

    def widgets(self) -> Check:
        try:
            import ipywidgets
        except ImportError:
            return Check("widgets", "FAIL", "ipywidgets is not installed in this Python",
                         fix="pip install 'ipywidgets>=8' in the environment that runs JupyterLab")
        found = machine.widget_frontend()
        if found is None:
            return Check("widgets", "FAIL", f"ipywidgets {ipywidgets.__version__}, but JupyterLab's widget "
                         "front-end (@jupyter-widgets/jupyterlab-manager) is missing: widgets would show "
                         "as text", fix="pip install jupyterlab_widgets in the environment that runs "
                         "JupyterLab, then restart JupyterLab")
        return Check("widgets", "ok", f"ipywidgets {ipywidgets.__version__}, front-end in {found}")

    # -- the machine -------------------------------------------------------------------------
    def machine(self) -> Check:
        from ppkit.cluster.budget import read_budget

        budget = read_budget()  # a share of a shared server, not the machine's core count
        detail = f"CPU budget {budget}" + machine.gpus() + "".join(f"; {note}" for note in budget.notes)
        if budget.cores < MIN_CORES:
            return Check("machine", "warn", detail + ": two ranks will share one core, so nothing "
                         "runs in parallel and timings mean little", fix="use a machine (or VM) with 2+ cores")
        return Check("machine", "ok", detail)

    def memory(self) -> Check:
        from ppkit.preflight_memory import memory_verdict

        verdict = memory_verdict()  # the limit and /dev/shm against each notebook's measured need
        return Check("memory", verdict.status, verdict.detail, verdict.fix)

    def ports(self) -> Check:
        socks = []
        try:
            for _ in range(8):  # each cluster needs a few: its control channel, gloo, the RPC store
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", 0))
                sock.listen(1)
        except OSError as exc:
            return Check("ports", "FAIL", f"cannot listen on 127.0.0.1 ({exc})",
                         fix="check that the loopback interface is up and no firewall blocks it")
        finally:
            for sock in socks:
                sock.close()
        if not machine.port_free(PPKIT_PORT):
            return Check("ports", "warn", f"127.0.0.1 free ports ok; {PPKIT_PORT} (ppkit master's default) is "
                         "in use", fix=f"stop what listens on {PPKIT_PORT}, or give ppkit master another port")
        return Check("ports", "ok", f"127.0.0.1 takes new listeners; {PPKIT_PORT} is free; {isolation.kernel_words()}")

    # -- what the notebooks start -----------------------------------------------------------
    def cluster(self) -> Check:
        from ppkit.cluster.controller import Cluster

        with Cluster(2, "gloo", timeout=RUN_TIMEOUT_S, start_timeout=START_TIMEOUT_S) as cluster:
            sums = cluster.run(_all_reduce_ranks)
        if sums != [1.0, 1.0]:
            return Check("cluster", "FAIL", f"all_reduce of ranks 0 and 1 gave {sums}, expected [1.0, 1.0]",
                         fix="report this with the output of `ppkit doctor`")
        status, words, fix = isolation.cluster_words(cluster.isolation)  # docs/isolation.md
        return Check("cluster", status, f"2 gloo ranks started; all_reduce of their ranks = 1 on both; {words}", fix)

    def rpc_world(self) -> Check:
        from torch.distributed import rpc

        from ppkit.cluster.rpc.world import RpcWorld

        world = RpcWorld(2, rpc_timeout=RUN_TIMEOUT_S, start_timeout=START_TIMEOUT_S)
        try:
            answers = [rpc.rpc_sync(name, os.getpid, timeout=RUN_TIMEOUT_S) for name in ("worker1", "worker2")]
            self._world = world  # kept open for the pipeline check
        except BaseException:
            world.close()
            raise
        if len(set(answers)) != 2 or os.getpid() in answers:
            return Check("rpc world", "FAIL", f"worker1 and worker2 answered from pids {answers}",
                         fix="report this with the output of `ppkit doctor`")
        status, words, fix = isolation.rpc_words([os.getpid(), *answers], world.cluster.address)  # the fallback
        return Check("rpc world", status, f"master + worker1 + worker2; rpc_sync reached both; {words}", fix)

    def pipeline(self) -> Check:
        import torch

        from ppkit.pipeline.rpc.model import PipelineModel
        from ppkit.pipeline.rpc.verify import compare, tolerance

        world = getattr(self, "_world", None)
        try:
            with PipelineModel("worker1:cpu,worker2:cpu", microbatch_size=2, num_classes=10,
                               timeout=RUN_TIMEOUT_S) as model:
                batch = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
                worst, largest = compare(model, [batch])
        finally:
            if world is not None:
                world.close()
        if worst > tolerance(largest):
            return Check("pipeline", "FAIL", f"2-shard ResNet50 differs from the local one by {worst:.2e}",
                         fix="report this with the output of `ppkit doctor` and your torch version")
        return Check("pipeline", "ok", f"2-shard ResNet50, 2 micro-batches of 2: equal to the local model "
                     f"(max diff {worst:.1e})")


def _all_reduce_ranks(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def _against_tested(name: str, version: str, fix: str) -> Check:
    plain, tested = version.split("+")[0], TESTED[name]
    if any(plain == t or plain.startswith(t + ".") for t in tested):
        return Check(name, "ok", f"{version} (tested: {', '.join(tested)})")
    return Check(name, "warn", f"{version} is not a tested version (tested: {', '.join(tested)}); "
                 "the notebooks may still work", fix=fix)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip() or "(no message)").splitlines()[0]


def _fix_for(step: str) -> str:
    if step in ("torch", "torchvision"):
        return INSTALL_TESTED + "; torch and torchvision must be a matching pair"
    if step in ("cluster", "rpc_world", "pipeline"):
        return "run `ppkit doctor` and the failing notebook cell; the error above says which part failed"
    return "see the error above"


def main() -> int:
    """Run every check, printing as it goes; 0 when none failed."""
    checks = Preflight()
    checks.run()
    return 0 if checks.ok else 1


def run_in_subprocess(timeout: float = 120.0) -> int:
    """Run ``ppkit preflight`` in a fresh Python (for notebooks); print its lines; return its exit code.

    The RPC world it starts lives in that process, so this kernel can still start its own.
    """
    proc = subprocess.Popen([sys.executable, "-m", "ppkit", "preflight"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(timeout, proc.kill)  # a line-by-line read cannot watch the clock itself
    timer.start()
    try:
        for line in proc.stdout:
            print(line, end="", flush=True)
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode < 0:
        print(f"ppkit preflight did not finish within {timeout:g} s and was stopped: run "
              "`ppkit preflight` in a terminal to see where it waits.")
    return proc.returncode
