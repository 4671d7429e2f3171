"""Steps per second of one DDP training script under ``torchrun`` and under ``%torchrun`` in a kernel.

    python benchmarks/bench_training_steps.py                  # 3 rounds, 600 steps each
    python benchmarks/bench_training_steps.py --rounds 5 --steps 1000
    python benchmarks/bench_training_steps.py --latency --rounds 8 --steps 4000   # issue 48's latency-bound run

``--latency``: issue 48's latency-bound run, a 64-wide MLP at batch 8 (about 470 steps/s here), in two
variants measured side by side in each round: the printed line per step alone, and the printed line plus
``ppkit.log_metrics(step=..., loss=..., steps_per_s=...)`` every step (under plain torchrun the call keeps
the values in the process; under ``%torchrun`` it sends them to the kernel's live plot).

The script trains a small MLP with DDP (2 ranks, gloo, CPU) and prints one line per step on every
rank, as a learner's first training loop does. Rank 0 times its own steps after a warm-up (its own
clock: the launchers' start-up is not counted) and prints ``STEPS_PER_S x``. Each round runs it
twice, in alternating order so that the shared machine's load falls on both alike:

- ``torchrun --nproc-per-node 2 train.py`` as a subprocess, its output read from a pipe;
- ``%torchrun --nproc-per-node 2 train.py`` in a real Jupyter kernel (jupyter_client), with what
  a learner has on: live output, the hang watch and the collapsing of identical lines.

Prints a markdown table and the ratio of the medians. Target (issue 39): within 2% of torchrun.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = """\
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

steps, warmup = int(sys.argv[1]), 50
width, batch, report = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "metrics"
if report:
    import ppkit
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(batch, width), torch.randn(batch, 1)
last = time.perf_counter()
for step in range(warmup + steps):
    if step == warmup:
        dist.barrier()
        started = time.perf_counter()
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    value = loss.item()
    print(f"step {step} loss {value:.4f}", flush=True)
    if report:
        now = time.perf_counter()
        ppkit.log_metrics(step=step, loss=value, steps_per_s=1.0 / (now - last))
        last = now
if rank == 0:
    print(f"STEPS_PER_S {steps / (time.perf_counter() - started):.2f}", flush=True)
dist.destroy_process_group()
"""


def steps_per_s(text: str) -> float:
    lines = [line for line in text.splitlines() if "STEPS_PER_S " in line]
    if not lines:
        raise SystemExit(f"no STEPS_PER_S in the output:\n{text[-3000:]}")
    return float(lines[-1].split("STEPS_PER_S ")[1].split()[0])


def under_torchrun(script: Path, args: list[str]) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script),
                           *args], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode:
        raise SystemExit(f"torchrun failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return steps_per_s(done.stdout)


def in_kernel(kc, script: Path, args: list[str]) -> float:
    texts: list[str] = []

    def keep(msg) -> None:  # what the cell shows: its stream and its per-rank displays
        content = msg["content"]
        texts.append(content.get("text", "") or content.get("data", {}).get("text/plain", "") + "\n")

    reply = kc.execute_interactive(f"%torchrun --nproc-per-node 2 {script} {' '.join(args)}", timeout=900,
                                   output_hook=keep)
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"%torchrun failed: {reply['content'].get('evalue')}\n{''.join(texts)[-2000:]}")
    return steps_per_s("".join(texts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--width", type=int, default=int(os.environ.get("BENCH_WIDTH", "512")))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--latency", action="store_true",
                        help="issue 48's run: width 64, batch 8, the printed line alone and with ppkit.log_metrics")
    options = parser.parse_args()
    if options.latency:
        options.width, options.batch = 64, 8
    variants = ["print", "metrics"] if options.latency else ["print"]
    from jupyter_client.manager import start_new_kernel

    folder = Path(tempfile.mkdtemp(prefix="ppkit-bench-steps-"))
    script = folder / "train.py"
    script.write_text(SCRIPT)
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(folder))
    try:
        kc.execute_interactive("import ppkit\n%load_ext ppkit", timeout=120)
        in_kernel(kc, script, ["50", str(options.width), str(options.batch), variants[-1]])  # warm, as in a session
        rows = {variant: [] for variant in variants}
        for round_ in range(options.rounds):
            for variant in variants:
                args = [str(options.steps), str(options.width), str(options.batch), variant]
                order = ["torchrun", "%torchrun"] if round_ % 2 == 0 else ["%torchrun", "torchrun"]
                found = {}
                for how in order:
                    found[how] = under_torchrun(script, args) if how == "torchrun" else in_kernel(kc, script, args)
                rows[variant].append(found)
                print(f"round {round_ + 1} ({variant}): torchrun {found['torchrun']:.1f} steps/s, %torchrun "
                      f"{found['%torchrun']:.1f} steps/s ({found['%torchrun'] / found['torchrun']:.3f}x)", flush=True)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    print(f"\nPython {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the "
          f"end; 2 ranks, gloo, an MLP of width {options.width} at batch {options.batch}, {options.steps} timed "
          "steps, a line printed per step on each rank")
    for variant in variants:
        print(f"\n{'with ppkit.log_metrics every step' if variant == 'metrics' else 'the printed line'}:\n")
        print("| round | torchrun (steps/s) | %torchrun in a kernel (steps/s) | ratio |\n|---|---|---|---|")
        for i, r in enumerate(rows[variant], 1):
            print(f"| {i} | {r['torchrun']:.1f} | {r['%torchrun']:.1f} | {r['%torchrun'] / r['torchrun']:.3f} |")
        plain = statistics.median(r["torchrun"] for r in rows[variant])
        cell = statistics.median(r["%torchrun"] for r in rows[variant])
        ratios = statistics.median(r["%torchrun"] / r["torchrun"] for r in rows[variant])
        print(f"| median | {plain:.1f} | {cell:.1f} | {cell / plain:.3f} (median of the rounds' ratios {ratios:.3f}) |")


if __name__ == "__main__":
    main()
