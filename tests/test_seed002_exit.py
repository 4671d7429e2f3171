"""Seed 002's program leaves no gloo thread behind at exit (issue 30: 3 of 40 srun runs aborted at exit).

DDP's constructor imports torch._dynamo, which imports torch.distributed.nn.functional, whose defaults
(``group=group.WORLD``) pinned the live group when imported after init_process_group: destroy_process_group()
then freed nothing, gloo's threads ran into interpreter shutdown, and one that freed a tensor there called
std::terminate. seed002 imports torch.distributed.nn first. benchmarks/seed002_exit_loop.py runs it 200 times
under srun and has the smallest program that shows the cause (``--pin-demo``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ppkit.lessons.data_parallel import free_port

ROOT = Path(__file__).resolve().parents[1]
THREADS_AFTER_MAIN = """
import json, os
from ppkit.lessons import seed002
seed002.main()
print(json.dumps(sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc to list threads")
def test_seed002_frees_its_process_group_and_every_gloo_thread_with_it():
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", THREADS_AFTER_MAIN], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    record, threads = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert record["rank"] == 0 and record["same_weights_everywhere"], record
    left = [name for name in threads if name.startswith(("pt_gloo", "gloo_", "pt_tcpstore"))]
    assert not left, f"threads of the destroyed group still run at exit: {threads}"
