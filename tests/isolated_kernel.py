"""The isolated kernel (ppkit/kernel/), installed for a test: ``prepare(folder)`` returns the environment
in which Jupyter (a server, nbval, jupyter_client) finds it.

Two things go under ``folder``: the kernelspec, written by ``ppkit kernel install --isolated --prefix``,
and a tiny distribution whose only content is ppkit's kernel provisioner entry point, copied from
pyproject.toml. Jupyter finds a provisioner by its entry point only, and the checkout under test may not
be the ppkit installed in this environment (which is where pip would have put the entry point).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from exposure import HOLD_UNTIL_PROBED, cluster_pids, exposure

from ppkit.kernel import PROVISIONER

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = '[project.entry-points."jupyter_client.kernel_provisioners"]'


def prepare(folder: Path) -> dict[str, str]:
    """Install the kernel under ``folder``; the variables (PYTHONPATH, JUPYTER_PATH) that make it found."""
    block = (REPO / "pyproject.toml").read_text().split(ENTRY_POINTS)[-1].split("\n[")[0]
    group = dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]+)"', block, re.M))  # (tomllib is 3.11's; 3.10 is supported)
    if PROVISIONER not in group:
        raise AssertionError(f"pyproject.toml does not declare ppkit's kernel provisioner {PROVISIONER!r}")
    dist = folder / "site" / "ppkit_kernel_entry_point-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ppkit-kernel-entry-point\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[jupyter_client.kernel_provisioners]\n"
                                           + "".join(f"{name} = {target}\n" for name, target in group.items()))
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(folder / "site")]),
           "JUPYTER_PATH": str(folder / "share" / "jupyter")}
    done = subprocess.run([sys.executable, "-m", "ppkit", "kernel", "install", "--isolated", "--prefix", str(folder)],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"ppkit kernel install --isolated failed: {done.stdout}{done.stderr}")
    env["INSTALLED"] = done.stdout
    return env


def shared_folder() -> Path:
    """A folder every learner of a hub test can read (pytest's own are 0700 under root's)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="ppkit-isolated-kernel-"))
    folder.chmod(0o755)
    return folder


# Notebook 04's world, held in a fresh isolated kernel of one learner's server until the test has probed it.
HOLD_AN_RPC_WORLD = """
import os, time, ppkit
from torch.distributed import rpc
world = ppkit.start_rpc(2)
assert rpc.rpc_sync("worker1", max, args=(3, 4)) == 4
""" + HOLD_UNTIL_PROBED + """
print("isolation:", world.isolation)
world.close()
"""


def probe_rpc_worlds_at_once(hub, names: list[str], folder: Path, kernel_name: str) -> dict[str, list]:
    """Each learner's ``kernel_name`` kernel holds an RPC world, all at the same time; every listener of each
    (the kernel's included: its Jupyter sockets are ipc files in a 0700 folder) is tried as the next learner.
    {owner: findings}."""
    import asyncio
    import pwd
    import threading
    import time

    from ppkit.room.kernel_exec import run_code

    answers: dict[str, dict] = {name: {} for name in names}
    files = {name: (folder / f"{name}.rpc.pid", folder / f"{name}.rpc.done") for name in names}

    def in_kernel(name):
        pid_file, done_file = files[name]
        code = HOLD_AN_RPC_WORLD.format(pid_file=str(pid_file), done_file=str(done_file))
        try:
            answers[name]["out"] = asyncio.run(run_code(f"{hub.url}/user/{name}/", hub.token, code, timeout=400,
                                                        kernel_name=kernel_name))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            answers[name]["exc"] = exc

    threads = [threading.Thread(target=in_kernel, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 400
    while not all(files[n][0].exists() for n in names) and any(t.is_alive() for t in threads):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    found = {}
    try:
        for owner, prober in zip(names, names[1:] + names[:1]):
            if not files[owner][0].exists():
                raise AssertionError(f"{owner}'s {kernel_name} kernel never held its RPC world: {answers[owner]}")
            kernel = int(files[owner][0].read_text())
            other = pwd.getpwnam(prober)
            found[owner] = exposure([kernel, *cluster_pids(kernel)], other.pw_uid, other.pw_gid)
    finally:
        for _, done_file in files.values():
            done_file.touch()
        for thread in threads:
            thread.join(timeout=120)
    for name in names:
        out = answers[name].get("out")
        if out is None or out.error is not None or "isolation: private network (the isolated kernel's)" \
                not in out.stdout:
            raise AssertionError(f"{name}'s isolated kernel: {answers[name]}")
    return found


def refused_here() -> str | None:
    """Why this machine refuses the kernel a private network (None: it allows one)."""
    from ppkit.transport import private_net

    return private_net._trial() if sys.platform.startswith("linux") else f"this is {sys.platform}"
