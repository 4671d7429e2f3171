"""ppkit's launchers against accelerate's ``notebook_launcher``: the first call of a session and warm calls.

    python benchmarks/bench_launchers.py                       # 12 calls, pauses 0 and 2 s
    python benchmarks/bench_launchers.py --accelerate /tmp/accel --calls 12 --pauses 0 5 --without-prestart

Each tool runs alone in a fresh interpreter, as in a fresh kernel: ``import torch``, its own setup
(``import ppkit`` and ``%load_ext ppkit`` through IPython's InteractiveShell; ``from accelerate import
notebook_launcher``), then a pause (the learner writing the next cell; 0 = the call comes at once), then
``--calls`` calls of the same work, 2 processes doing ``init_process_group("gloo")``, one ``all_reduce``,
``destroy_process_group()``. Each child reports its own times; the tools run one after another, so
the shared machine's load can differ between them: compare ratios from one run of this script.

``--accelerate DIR``: a folder with accelerate and what it needs beyond this venv (``pip install
--target DIR accelerate``); it is appended to ``sys.path`` in accelerate's child only. accelerate's
calls use ``fork`` (its notebook_launcher's choice on CPU) and a fresh port each.
Target (the first-call issue): ppkit's first call at most 2x accelerate's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = {"ppkit.spawn": "ppkit.spawn(main, args=(port,), nprocs=2)",
         "import ppkit": "ppkit.spawn(main, args=(port,), nprocs=2) in a Jupyter kernel after `import ppkit` only",
         "ppkit.torchrun": "ppkit.torchrun(main, nproc_per_node=2)",
         "%%torchrun": "`%%torchrun --nproc-per-node 2` cell",
         "accelerate": "accelerate.notebook_launcher(main, num_processes=2)"}
CELL = """%%torchrun --nproc-per-node 2
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
dist.destroy_process_group()
"""


def main(rank: int | None = None, port: str = "") -> None:
    """The work of each process: torchrun's environment, or mp.spawn's ``rank`` and a port for ppkit.spawn."""
    import torch
    import torch.distributed as dist

    if rank is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()


def free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def child(tool: str, calls: int, pause: float, accelerate: str | None) -> None:
    import torch  # noqa: F401 - a kernel that teaches distributed training has it imported

    if tool == "accelerate":
        sys.path.append(accelerate)  # appended: its folder must not shadow this venv's packages
        from accelerate import notebook_launcher

        def call():
            notebook_launcher(main, num_processes=2, use_port=free_port())
    else:
        sys.path.insert(0, str(REPO))
        from IPython.core.interactiveshell import InteractiveShell

        import ppkit

        shell = InteractiveShell.instance()
        shell.run_cell("%load_ext ppkit", store_history=False)
        if tool == "%%torchrun":
            def call():
                if not shell.run_cell(CELL, store_history=False).success:
                    raise SystemExit("%%torchrun failed")
        elif tool == "ppkit.torchrun":
            def call():
                ppkit.torchrun(main, nproc_per_node=2)
        else:
            def call():
                ppkit.spawn(main, args=(free_port(),), nprocs=2)
    time.sleep(pause)
    import threading

    starting = any(t.name == "ppkit-spawn-prestart" for t in threading.enumerate())
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    print("RESULT " + json.dumps({"times": times, "starting": starting}), flush=True)


KERNEL_SETUP = """
import json, socket, sys, threading, time
import torch
import ppkit
"""  # then main and free_port, defined in the kernel as a learner's cell defines them
KERNEL_CALLS = """
time.sleep({pause})
starting = any(t.name == "ppkit-spawn-prestart" for t in threading.enumerate())
times = []
for _ in range({calls}):
    started = time.perf_counter()
    ppkit.spawn(main, args=(free_port(),), nprocs=2)
    times.append(time.perf_counter() - started)
print("RESULT " + json.dumps({{"times": times, "starting": starting}}), flush=True)
"""


def run_in_kernel(calls: int, pause: float, prestart: bool) -> dict:
    """A real Jupyter kernel, where ``import ppkit`` alone prestarts the fork server (never in a script)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(REPO),
                              env={**os.environ, "PPKIT_PRESTART": "1" if prestart else "0"})
    texts: list[str] = []
    try:
        import inspect

        defined = inspect.getsource(main) + "\n" + inspect.getsource(free_port)
        for code in (KERNEL_SETUP, defined, KERNEL_CALLS.format(pause=pause, calls=calls)):
            reply = kc.execute_interactive(code, timeout=600, output_hook=lambda msg: texts.append(
                msg["content"].get("text", "")))
            if reply["content"]["status"] != "ok":
                raise SystemExit(f"the kernel failed: {reply['content'].get('evalue')}\n{''.join(texts)[-2000:]}")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    lines = [line for line in "".join(texts).splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):])


def run_child(tool: str, calls: int, pause: float, accelerate: str | None, prestart: bool = True) -> dict:
    if tool == "import ppkit":
        return run_in_kernel(calls, pause, prestart)
    env = {**os.environ, "PPKIT_PRESTART": "1" if prestart else "0"}
    command = [sys.executable, __file__, "--child", tool, "--calls", str(calls), "--pauses", str(pause)]
    if accelerate:
        command += ["--accelerate", accelerate]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{tool} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=12, help="calls in each session (default 12)")
    parser.add_argument("--pauses", type=float, nargs="+", default=[0.0, 2.0],
                        help="seconds between the setup and the first call (default 0 and 2)")
    parser.add_argument("--accelerate", help="folder holding accelerate (pip install --target DIR accelerate)")
    parser.add_argument("--without-prestart", action="store_true",
                        help="also run ppkit's tools with PPKIT_PRESTART=0 (%%load_ext ppkit starts nothing ahead)")
    parser.add_argument("--tools", nargs="+", choices=list(TOOLS), default=list(TOOLS))
    parser.add_argument("--child", choices=list(TOOLS), help=argparse.SUPPRESS)
    return parser.parse_args()


def report() -> None:
    options = parse()
    if options.child:
        child(options.child, options.calls, options.pauses[0], options.accelerate)
        return
    tools = [t for t in options.tools if t != "accelerate" or options.accelerate]
    rows = []
    for pause in options.pauses:
        for tool, prestart in [(t, True) for t in tools] + [(t, False) for t in tools
                                                              if options.without_prestart and t != "accelerate"]:
            found = run_child(tool, options.calls, pause, options.accelerate, prestart)
            times, starting = found["times"], found["starting"]
            name = tool if prestart else f"{tool} (PPKIT_PRESTART=0)"
            rows.append((pause, name, times[0], statistics.median(times[1:] or times), starting))
    load = os.getloadavg()[0]
    print(f"\n{options.calls} calls per fresh interpreter, 2 processes, init + all_reduce + destroy; Python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, load average {load:.1f} at the end\n")
    print("| pause before the first call (s) | tool | first call (s) | median warm call (s) | "
          "fork server still starting at the first call |\n|---|---|---|---|---|")
    for pause, tool, first, warm, starting in rows:
        still = "-" if tool == "accelerate" or "=0" in tool else ("yes" if starting else "no")
        label = TOOLS[tool.split(" (")[0]] + (", PPKIT_PRESTART=0" if "=0" in tool else "")
        print(f"| {pause:g} | {label} | {first:.2f} | {warm:.3f} | {still} |")
    peer = {pause: first for pause, tool, first, _, _ in rows if tool == "accelerate"}
    for pause, tool, first, _, _ in rows:
        if tool != "accelerate" and pause in peer:
            print(f"pause {pause:g} s: {tool}'s first call is {first / peer[pause]:.1f}x accelerate's (target <= 2x)")


if __name__ == "__main__":
    report()
