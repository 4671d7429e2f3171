"""The isolated kernel (ppkit/kernel/, issue 33), started as JupyterLab's server starts a kernel.

`ppkit kernel install --isolated` writes the kernelspec under a temporary prefix; a subprocess
(tests/isolated_kernel_driver.py) starts it with jupyter_server's AsyncMappingKernelManager, runs
ppkit.start, ppkit.spawn, ppkit.start_rpc and `!pip install` in it, and shuts it down. One kernel
for the module: every test reads what that run saw. tests/isolated_kernel.py installs the kernel
where Jupyter finds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import isolated_kernel
import pytest
from slurm_session import in_ci

import ppkit
from ppkit.kernel import DISPLAY_NAME, KERNEL_NAME, PROVISIONER, offline

REPO = Path(__file__).parents[1]
DRIVER = Path(__file__).with_name("isolated_kernel_driver.py")

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def jupyter_env(tmp_path_factory):
    refused = isolated_kernel.refused_here()
    if refused:
        (pytest.fail if in_ci() else pytest.skip)(f"this machine refuses a private network ({refused})")
    root = tmp_path_factory.mktemp("isolated-kernel")
    found = isolated_kernel.prepare(root)
    return {**os.environ, **found, "JUPYTER_RUNTIME_DIR": str(root / "runtime"), "PPKIT_PREFIX": str(root)}


@pytest.fixture(scope="module")
def installed(jupyter_env):
    return jupyter_env["INSTALLED"], json.loads(
        (Path(jupyter_env["JUPYTER_PATH"]) / "kernels" / KERNEL_NAME / "kernel.json").read_text())


@pytest.fixture(scope="module")
def run(jupyter_env, installed):
    done = subprocess.run([sys.executable, str(DRIVER)], env=jupyter_env, capture_output=True, text=True,
                          timeout=500, cwd=jupyter_env["PPKIT_PREFIX"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_kernelspec_names_the_cost_the_namespace_and_the_provisioner(installed):
    said, spec = installed
    assert spec["display_name"] == DISPLAY_NAME == "Python 3 (ppkit, isolated, no network)"
    assert spec["argv"][1:4] == ["-m", "ppkit.kernel.netns", "--"] and "{connection_file}" in spec["argv"]
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == PROVISIONER
    assert f"Installed the kernel {DISPLAY_NAME!r}" in said


@pytest.mark.slow
def test_jupyter_reaches_the_kernel_over_unix_sockets_in_a_folder_only_its_user_opens(run):
    seen = run["seen"]
    assert (seen["transport"], seen["connection"], seen["folder_mode"]) == ("ipc", "ipc", "0o700"), seen
    assert seen["sockets"] and all(name.startswith("kernel-") for name in seen["sockets"]), seen


def test_the_kernel_runs_in_a_network_of_its_own_with_only_a_loopback(run):
    assert run["said"]["where"].startswith("[(1, 'lo')]"), run["said"]
    assert run["seen"]["kernel_netns"] != run["server_netns"]
    assert run["said"]["preflight"].startswith("kernel isolated: a private network of its own")


def test_start_spawn_and_start_rpc_run_in_the_kernels_network_with_no_second_one(run):
    said = run["said"]
    assert said["start"].strip() == "private network (the isolated kernel's) | [0, 10] | True", said["start"]
    assert said["spawn"].strip() == "private network (the isolated kernel's)", said["spawn"]
    assert said["rpc"].strip() == "private network (the isolated kernel's) | 4", said["rpc"]


def test_pip_install_fails_with_a_message_that_says_why(run):
    pip = run["said"]["pip"]
    assert f"ppkit: this notebook runs in the kernel {DISPLAY_NAME!r}, which has no network" in pip, pip
    assert "Install from a terminal instead" in pip


def test_a_restarted_kernel_is_isolated_again_over_the_same_folder(run):
    restarted = run["seen"]["restarted"]
    assert restarted["said"].startswith("[(1, 'lo')]") and restarted["folder"], restarted
    assert not restarted["old_kernel_left"], restarted


def test_shutdown_leaves_neither_the_kernel_nor_its_socket_folder(run):
    assert not run["seen"]["folder_left"] and not run["seen"]["kernel_left"], run["seen"]


@pytest.mark.parametrize("command, needs", [
    ("pip install torch", True), ("/opt/venv/bin/python -m pip install -U x", True), ("pip3 download x", True),
    ("conda install numpy", True), ("uv pip install x", True), ("wget https://x", True),
    ("git clone https://x", True), ("pip list", False), ("pip show ppkit", False), ("ls pip-install", False),
])
def test_the_commands_that_need_the_network_are_told_apart(command, needs):
    assert offline.needs_network(command) is needs


def _refusing(code: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` where nested user namespaces are forbidden (a machine that refuses private networks)."""
    script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    return subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script, "sh", *code],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_a_machine_that_refuses_a_private_network_stops_the_kernel_with_the_reason(jupyter_env):
    done = _refusing([sys.executable, "-m", "ppkit.kernel.netns", "--", "true"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"ppkit: the kernel {DISPLAY_NAME!r} did not start: this machine refused it a private network" \
        in done.stderr and "docs/isolation.md" in done.stderr, done.stderr
    done = _refusing([sys.executable, "-m", "ppkit", "kernel", "install", "--isolated", "--prefix",
                      jupyter_env["PPKIT_PREFIX"] + "/refused"], env={"PYTHONPATH": jupyter_env["PYTHONPATH"]})
    assert done.returncode == 2 and "this machine refuses a private network" in done.stderr, done.stderr


def test_slurm_and_remote_are_refused_in_the_kernel_as_it_has_no_network(jupyter_env):
    code = ("import ppkit\nfor kw in ({'launcher': 'slurm'}, {'listen': '127.0.0.1:0'}):\n"
            "    try:\n        ppkit.start(2, **kw)\n    except ppkit.ConfigError as exc:\n        print(exc)\n")
    done = subprocess.run([sys.executable, "-m", "ppkit.kernel.netns", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120, env=jupyter_env)
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all("this kernel has no network: it is the isolated kernel" in x for x in lines), \
        done.stdout + done.stderr
    assert ppkit.ConfigError  # the error a notebook catches


@pytest.mark.slow
def test_notebook_04_runs_in_the_isolated_kernel_with_the_committed_outputs(jupyter_env, installed):
    """The RPC notebook, its exercises solved (the repository's conftest.py), run by nbval in this kernel:
    every cell whose output nbval checks shows what the committed notebook shows."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "notebooks/04_rpc_rref.ipynb", "--nbval-lax", "--nbval-sanitize-with",
                           "tests/nbval_sanitize.cfg", "--nbval-kernel-name", KERNEL_NAME],
                          cwd=REPO, env=jupyter_env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]


NO_NETWORK_CELL = """
import sys
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
shell.extension_manager.load_extension("ppkit.kernel.offline")  # as the kernelspec's --ext loads it
shell.run_cell('''
import ppkit, urllib.request
def fetch(rank, world_size, url):
    return urllib.request.urlopen(url, timeout=10).read()
with ppkit.Cluster(2, "gloo") as cluster:
    print("isolation:", cluster.isolation)
    cluster.run(fetch, URL)
'''.replace("URL", repr(sys.argv[1])))
"""


def test_a_ranks_connection_out_fails_with_a_note_that_there_is_no_network_by_design(jupyter_env):
    """A rank of the isolated kernel fetches from this machine's own non-loopback address: no route (nothing leaves
    the namespace), and below the rank's traceback the kernel says why, as the IPython extension of the kernelspec
    does in a real kernel."""
    import psutil

    own = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
           if a.family.name == "AF_INET" and not a.address.startswith(("127.", "169.254."))]
    if not own:
        pytest.skip("this machine has no IPv4 address besides loopback")
    done = subprocess.run([sys.executable, "-m", "ppkit.kernel.netns", "--", sys.executable, "-c", NO_NETWORK_CELL,
                           f"http://{own[0]}:9/"], capture_output=True, text=True, timeout=300, env=jupyter_env)
    said = done.stdout + done.stderr
    assert "isolation: private network (the isolated kernel's)" in said, said
    assert "Network is unreachable" in said, said  # the rank's own error, with its traceback
    assert "ppkit: this failed for want of a network, by design" in said and "docs/isolation.md" in said, said
    assert said.index("Network is unreachable") < said.index("for want of a network"), said


def test_only_errors_that_found_no_route_get_the_note():
    try:
        try:
            raise OSError(101, "Network is unreachable")
        except OSError as exc:
            raise RuntimeError("rank 1 raised URLError") from exc  # as a rank's error comes back: chained
    except RuntimeError as exc:
        assert offline.lost_for_want_of_network(exc)
    assert offline.lost_for_want_of_network(OSError(-3, "Temporary failure in name resolution"))
    assert not offline.lost_for_want_of_network(ValueError("bad value"))
    assert not offline.lost_for_want_of_network(None)
