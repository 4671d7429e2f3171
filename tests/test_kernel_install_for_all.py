"""An instructor installs the isolated kernel once, as root, for everyone (docs/workshop.md): a learner, a second
Unix user, must see it in Jupyter's kernel list. Before issue 41 the kernelspec folder came out 0700 and owned by
root (it was copied with the mode of a temporary folder), so no learner's Jupyter listed it."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import isolated_kernel
import pytest
from slurm_session import in_ci
from unix_users import finish, run_as, unavailable_reason, unix_user

from ppkit.kernel import KERNEL_NAME


def test_the_kernel_installed_by_root_is_listed_for_a_learner():
    reason = unavailable_reason() or isolated_kernel.refused_here()
    if reason:
        (pytest.fail if in_ci() else pytest.skip)(f"cannot test an install for all here: {reason}")
    folder = isolated_kernel.shared_folder()  # 0755, as /opt/tljh/user is
    old = os.umask(0o022)  # sudo's usual umask: the folders on the way (share/jupyter/kernels) come out 0755
    try:
        env = isolated_kernel.prepare(folder)
    finally:
        os.umask(old)
    try:
        spec_dir = folder / "share" / "jupyter" / "kernels" / KERNEL_NAME
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [spec_dir, *spec_dir.iterdir()]}
        assert modes == {KERNEL_NAME: 0o755, "kernel.json": 0o644}, modes  # as `ipykernel install` makes them
        with unix_user("ppkl") as learner:
            proc = run_as(learner, [os.sys.executable, "-m", "jupyter_client.kernelspecapp", "list", "--json"],
                          env={"JUPYTER_PATH": env["JUPYTER_PATH"], "PYTHONPATH": env["PYTHONPATH"]},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            out, err = proc.communicate(timeout=60)
            finish(proc)
        assert proc.returncode == 0, err
        listed = json.loads(out)["kernelspecs"]
        assert KERNEL_NAME in listed, f"a learner's Jupyter lists only {sorted(listed)}; stderr: {err[-500:]}"
        assert listed[KERNEL_NAME]["resource_dir"] == str(spec_dir)
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)
