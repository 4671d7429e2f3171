"""A learner ran ``torch.cuda.*`` in the kernel, then starts ranks (issue 49, item 5): ``ppkit.start`` (fork
server and spawn launchers), ``ppkit.spawn`` and ``%%torchrun`` still work, no process is forked from the kernel
once CUDA is initialised there, and ppkit's own kernel-side code initialises no CUDA.

There is no GPU here (``torch.cuda.init()`` raises), so one real kernel plays a GPU machine's: its cell calls
``torch.cuda.is_available()`` (torch here is a CUDA build: its cudaGetDeviceCount arms torch's fork poisoning, so a
process forked from the kernel is in torch's "bad fork", as on a GPU machine, which the fixture checks), sets
``torch.cuda._initialized`` (what ``torch.cuda._lazy_init`` sets after ``torch._C._cuda_init()``), records with an
audit hook (``sys.addaudithook``) every ``os.fork``/``os.forkpty``/``os.posix_spawn``/``subprocess.Popen`` of the
kernel process, and wraps the ``torch.cuda`` functions that initialise CUDA (``_lazy_init``, which every device
query and ``set_device`` goes through, and ``is_available``, whose ``cudaGetDeviceCount`` runs ``cuInit`` and
arms torch's fork poisoning), and ``device_count`` (NVML's count, cudaGetDeviceCount where NVML fails), under
every name torch's modules hold for them (``torch.cuda.memory`` and ``torch.cuda.random`` import ``_lazy_init``
for themselves), to record the ppkit frame (a file under ppkit's package folder) that called them.
A rank forked from this kernel would inherit ``_initialized = True`` and be in a bad fork: each rank reports
both, and its parent's pid.
"""

from __future__ import annotations

import inspect
import json
import os

import pytest
from kernels import kernel_in
from test_torchrun_output import run_cell


def is_ppkit_frame(filename: str, ppkit_dir: str) -> bool:
    """Whether a stack frame's file is ppkit's own code (``ppkit_dir``: the folder of ppkit's ``__init__.py``)."""
    return os.path.abspath(filename).startswith(ppkit_dir)

pytestmark = pytest.mark.slow  # a kernel, and four sets of fresh ranks

FAKE_CUDA_IN_KERNEL = inspect.getsource(is_ppkit_frame) + r'''
import importlib.util, json, os, sys, traceback
import torch
torch.cuda.is_available()  # the learner's own: cudaGetDeviceCount arms torch's fork poisoning in this process

kernel_events = []   # (event, what), in order, from this process only
ppkit_cuda_calls = []  # (torch.cuda function, the ppkit frame that called it)

def _audit(event, args):
    if event in ("os.fork", "os.forkpty", "os.posix_spawn"):
        kernel_events.append((event, repr(args)[:200]))
    elif event == "subprocess.Popen":
        kernel_events.append((event, str(args[0] or args[1])[:200]))  # fork+exec in C: safe

sys.addaudithook(_audit)
PPKIT_DIR = os.path.dirname(importlib.util.find_spec("ppkit").origin) + os.sep  # found, not imported yet

def _recording(name, fn):
    def wrapper(*args, **kwargs):
        ppkit_frames = [f"{f.filename.removeprefix(PPKIT_DIR)}:{f.lineno} {f.name}"
                        for f in traceback.extract_stack()[:-1] if is_ppkit_frame(f.filename, PPKIT_DIR)]
        if ppkit_frames:
            caller = traceback.extract_stack()[-2]
            ppkit_cuda_calls.append((name, ppkit_frames[-1], caller.filename.split("/site-packages/")[-1]))
        return fn(*args, **kwargs)
    return wrapper

# torch.cuda.memory and torch.cuda.random hold their own names for _lazy_init (and random for device_count,
# from "from . import ..."): every torch module's name for one of these is wrapped, not torch.cuda's alone
import torch.cuda.memory, torch.cuda.random  # noqa: E401
for _name in ("_lazy_init", "init", "is_available", "device_count"):
    _original = getattr(torch.cuda, _name)
    _wrapped = _recording(_name, _original)
    for _module in [m for n, m in list(sys.modules.items()) if n.startswith("torch") and m is not None]:
        if getattr(_module, _name, None) is _original:
            setattr(_module, _name, _wrapped)
print("_lazy_init wrapped in:", sorted(n for n, m in sys.modules.items()
                                      if getattr(m, "_lazy_init", None) is torch.cuda._lazy_init))
torch.cuda._initialized = True   # as after the learner's torch.cuda.init() on a GPU machine
print("initialised:", torch.cuda.is_initialized(), "kernel pid", os.getpid())
%load_ext ppkit
import ppkit
'''

RANK_FACTS = '''
def facts(rank, world_size):
    import os, torch
    return {"rank": rank, "cuda_initialized": torch.cuda._initialized, "bad_fork": torch.cuda._is_in_bad_fork(),
            "parent": os.getppid()}
'''

TORCHRUN_FACTS = """%%torchrun --nproc-per-node 2 --no-collapse
import json, os, torch
print("FACTS", json.dumps({"rank": int(os.environ["RANK"]), "cuda_initialized": torch.cuda._initialized,
                           "bad_fork": torch.cuda._is_in_bad_fork(), "parent": os.getppid()}))
"""


@pytest.fixture(scope="module")
def kc(tmp_path_factory):
    with kernel_in(tmp_path_factory.mktemp("notebook"), expect_processes=True) as (km, client):
        cell = run_cell(client, FAKE_CUDA_IN_KERNEL + RANK_FACTS)
        assert cell.error is None and "initialised: True" in cell.text, cell.shown()
        wrapped = cell.text.split("_lazy_init wrapped in:", 1)[1].splitlines()[0]
        assert "'torch.cuda.memory'" in wrapped and "'torch.cuda.random'" in wrapped, wrapped
        # the kernel is what a GPU machine's would be after torch.cuda.*: a fork of it is in torch's "bad fork"
        cell = run_cell(client, "pid = os.fork()\nif pid == 0: os._exit(7 if torch.cuda._is_in_bad_fork() else 0)\n"
                                "print('fork of the kernel:', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
                                "kernel_events.clear()")
        assert "fork of the kernel: 7" in cell.text, cell.shown()
        client.kernel_pid = km.provisioner.process.pid
        yield client


def _value(kc, expression: str):
    cell = run_cell(kc, f"print(json.dumps({expression}))")
    assert cell.error is None, cell.shown()
    return json.loads(cell.text.strip().splitlines()[-1])


def _check_ranks(kc, ranks: list[dict], world_size: int, fork_server: bool = True) -> None:
    """Each rank started clean: not a fork of the kernel (which would carry ``_initialized``), and, where a fork
    server starts them, not the kernel's child at all (the spawn launcher's fresh interpreters are, by exec)."""
    assert sorted(r["rank"] for r in ranks) == list(range(world_size)), ranks
    assert [r for r in ranks if r["cuda_initialized"] or r["bad_fork"] or fork_server and r["parent"] == kc.kernel_pid
            ] == [], (
        f"a rank was forked from the kernel (pid {kc.kernel_pid}), after CUDA was initialised there: {ranks}")


def _counted_gpus(call: list) -> bool:
    """ppkit's one kernel-side GPU count, ``worker_setup.gpu_count``: ``device_count`` counts through NVML
    before CUDA is initialised (cudaGetDeviceCount only where NVML fails); any other caller is reported."""
    return call[0] == "device_count" and call[1].startswith("cluster/worker_setup.py:") and call[1].endswith(
        " gpu_count")


def _no_fork_and_no_cuda(kc, torch_may_ask: str = "") -> None:
    """No fork in the kernel, and no torch.cuda call that initialises CUDA (or runs cuInit) under ppkit's code,
    but ``worker_setup.gpu_count``'s ``device_count`` and those that ``torch_may_ask``, a torch file, makes itself
    (then the list is emptied for the next test)."""
    events = _value(kc, "kernel_events")
    assert [e for e in events if e[0] != "subprocess.Popen"] == [], f"the kernel forked after CUDA: {events}"
    calls = _value(kc, "ppkit_cuda_calls")
    assert [c for c in calls if not _counted_gpus(c) and (not torch_may_ask or c[2] != torch_may_ask)] == [], (
        "ppkit's kernel-side code called a torch.cuda function that initialises CUDA (or runs cuInit)")
    if calls:
        run_cell(kc, "ppkit_cuda_calls.clear()")


@pytest.mark.parametrize("launcher", ["local", "spawn"])
def test_ppkit_start_after_cuda_in_the_kernel(kc, launcher):
    cell = run_cell(kc, f'''
        cluster = ppkit.start(2, launcher="{launcher}")
        print(json.dumps(cluster.run(facts)))
        print(cluster.backend)
        cluster.close()''')
    assert cell.error is None, cell.shown()
    lines = cell.text.strip().splitlines()
    _check_ranks(kc, json.loads(lines[-2]), 2, fork_server=launcher == "local")
    assert lines[-1] == "gloo"  # no GPU here: CPU ranks
    _no_fork_and_no_cuda(kc)


def test_ppkit_spawn_after_cuda_in_the_kernel(kc):
    cell = run_cell(kc, '''
        def spawned(i):
            print("FACTS", json.dumps(facts(i, 2)))
        ppkit.spawn(spawned, nprocs=2)''')
    assert cell.error is None, cell.shown()
    ranks = [json.loads(line.split("FACTS", 1)[1]) for line in cell.text.splitlines() if "FACTS" in line]
    _check_ranks(kc, ranks, 2)
    _no_fork_and_no_cuda(kc)


def test_torchrun_after_cuda_in_the_kernel(kc):
    cell = run_cell(kc, TORCHRUN_FACTS)
    assert cell.error is None, cell.shown()
    ranks = [json.loads(line.split("FACTS", 1)[1]) for line in cell.text.splitlines() if "FACTS" in line]
    _check_ranks(kc, ranks, 2)
    _no_fork_and_no_cuda(kc)


def test_lessons_that_ask_about_gpus_ask_outside_the_kernel(kc):
    """03's DataParallel cell and 08c's FP8 survey: with GPUs, either would have made a CUDA context in the kernel."""
    cell = run_cell(kc, '''
        from ppkit.lessons import data_parallel as dp, fp8_formats as f8
        print(json.dumps([dp.data_parallel_here()["output_device"], f8.what_runs_here(64)[
            "a GPU with FP8 tensor cores (compute capability 8.9+: Ada, H100)"]]))''')
    assert cell.error is None, cell.shown()
    assert json.loads(cell.text.strip().splitlines()[-1]) == ["cpu", "none here"]
    _no_fork_and_no_cuda(kc)


def test_start_rpc_after_cuda_in_the_kernel(kc):
    """04's RPC world makes the kernel rank 0 (torch's TensorPipe set-up runs in the kernel); its workers are
    still forked by the fork server, and each answers an rpc_sync from the kernel."""
    cell = run_cell(kc, '''
        import torch.distributed.rpc as rpc
        world = ppkit.start_rpc(2)
        print(json.dumps([rpc.rpc_sync(f"worker{r}", facts, args=(r, 3)) for r in (1, 2)]))
        world.close()''')
    assert cell.error is None, cell.shown()
    ranks = json.loads(cell.text.strip().splitlines()[-1])
    _check_ranks(kc, [{**r, "rank": r["rank"] - 1} for r in ranks], 2)
    # torch's TensorPipe set-up asks torch.accelerator.is_available() in rank 0, the kernel: cuInit, no context
    _no_fork_and_no_cuda(kc, torch_may_ask="torch/accelerator/__init__.py")


@pytest.mark.parametrize(("filename", "ppkit_s"), [
    ("/home/u/ppkit/ppkit/cluster/start.py", True),
    ("/home/u/ppkit/ppkit/__init__.py", True),
    # a clone named ppkit with its venv inside: torch's and ipykernel's frames are not ppkit's
    ("/home/u/ppkit/.venv/lib/python3.11/site-packages/torch/cuda/__init__.py", False),
    ("/home/u/ppkit/.venv/lib/python3.11/site-packages/ipykernel/ipkernel.py", False),
    ("/home/u/ppkit/tests/test_cuda_in_kernel.py", False),
    ("/home/u/ppkit/ppkit_extra/x.py", False),
])
def test_a_frame_is_ppkit_s_only_inside_ppkit_s_package(filename, ppkit_s):
    assert is_ppkit_frame(filename, "/home/u/ppkit/ppkit" + os.sep) is ppkit_s
