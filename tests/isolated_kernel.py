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
