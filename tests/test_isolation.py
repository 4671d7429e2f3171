"""Isolation between learners on one machine (issue 24, part 2), with two real Unix users.

A learner (user A, made by the test) runs tests/learner.py: a cluster after an all_reduce, an RPC
world, or ppkit.spawn of the DDP tutorial's set-up. While it runs, another learner (user B, made by
the test) tries every TCP and Unix socket that A's processes listen on (tests/exposure.py). A's
cluster and spawn's processes must give B nothing that accepts without ppkit's key check; an RPC
world (the kernel is rank 0) cannot be isolated, and the test measures what it exposes. Afterwards
neither A's processes nor their namespaces are left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from exposure import CHALLENGE, OPEN, cluster_pids, counts, exposure, table
from leftovers import wait_gone
from slurm_session import in_ci
from unix_users import finish, processes_of, run_as, unavailable_reason, unix_user

import ppkit
from ppkit.cluster import isolation
from ppkit.errors import LaunchError

pytestmark = pytest.mark.timeout(300)
LEARNER = str(Path(__file__).with_name("learner.py"))
START_S = 120


@pytest.fixture(scope="module")
def learners():
    reason = unavailable_reason()
    if reason:
        (pytest.fail if in_ci() else pytest.skip)(f"{reason}: the isolation tests make two Unix users"
                                                  + (" (CI=true: they must run)" if in_ci() else ""))
    with unix_user("ppka") as a, unix_user("ppkb") as b:
        yield a, b


def netns_of(pids) -> set[str]:
    found = set()
    for pid in pids:
        try:
            found.add(os.readlink(f"/proc/{pid}/ns/net"))
        except OSError:
            pass
    return found


def held_by_anyone(namespaces: set[str]) -> list[int]:
    """Pids of every process on the machine still in one of ``namespaces``."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and netns_of([int(p)]) & namespaces]


def measure(learners, mode: str, kernel: bool = False, **env: str):
    """Run the learner as A in ``mode``, probe it as B; (what the learner said, findings, its
    namespaces other than this one), after checking that it ended cleanly and left nothing.
    ``kernel``: the learner runs as the isolated kernel does (ppkit/kernel/), in a private network."""
    a, b = learners
    isolated = [sys.executable, "-m", "ppkit.kernel.netns", "--"] if kernel else []
    proc = run_as(a, [*isolated, sys.executable, LEARNER, mode], env=env, stdin=subprocess.PIPE,
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        before = []  # what it printed before its JSON line (warnings)
        while not (line := proc.stdout.readline()).startswith("{") and line:
            before.append(line)
        assert line, "".join(before)
        said = {**json.loads(line), "printed": "".join(before)}
        pids = [p.pid for p in processes_of(a)]
        said["cluster_pids"] = cluster_pids(said["pid"])
        said["cluster_netns"] = netns_of(said["cluster_pids"])
        private = netns_of(pids) - netns_of([os.getpid()])
        found = exposure(pids, b.uid, b.gid)
        proc.stdin.write("\n")
        proc.stdin.flush()
        rest = proc.stdout.read()
    finally:
        finish(proc, timeout=60)
    assert proc.returncode == 0, rest
    # zombies count as gone: slirp4netns (the private network's way out) ends with its fork server and is then
    # the machine's init's to reap, which some inits (a VM's or container's) do only every second or so
    left = wait_gone([p.pid for p in processes_of(a)], timeout=10)
    assert not left, [" ".join(psutil.Process(pid).cmdline()) for pid in left]
    assert not held_by_anyone(private), "a namespace of the learner outlived its processes"
    print(f"\n{mode}{' in the isolated kernel' * kernel} {env or ''}: {counts(found)}\n{table(found)}")
    return said, found, private


@pytest.mark.slow
def test_a_cluster_exposes_nothing_unauthenticated_to_another_user(learners):
    said, found, private = measure(learners, "cluster")
    assert said["ready"] == [3.0, 3.0]
    assert said["isolation"] == "private network"
    assert len(private) == 1  # the fork server and both workers share one private network
    assert len(said["cluster_pids"]) == 3 and said["cluster_netns"] == private
    assert counts(found)[OPEN] == 0, table(found)
    assert counts(found)[CHALLENGE] == 1, table(found)  # the kernel's control channel on 127.0.0.1
    assert len(found) >= 4, table(found)  # channel, its Unix socket, each worker's gloo listener


@pytest.mark.slow
def test_spawn_exposes_nothing_unauthenticated_to_another_user(learners):
    said, found, private = measure(learners, "spawn")
    assert said["ready"] == [2.0, 2.0]
    assert said["isolation"] == "private network"
    assert counts(found)[OPEN] == 0, table(found)
    ports = {f.endpoint.port for f in found}
    assert 12355 in ports, table(found)  # the tutorial's store: listed, and out of B's reach


@pytest.mark.slow
def test_with_isolation_off_the_probe_finds_the_open_listeners(learners):
    """The measurement before the change, still there with PPKIT_ISOLATION=off: the probe counts them."""
    said, found, private = measure(learners, "cluster", PPKIT_ISOLATION="off")
    assert said["isolation"] == "none: turned off (PPKIT_ISOLATION=off)"
    assert not private
    assert counts(found)[OPEN] >= 2, table(found)  # each worker's gloo listener


@pytest.mark.slow
def test_an_rpc_world_cannot_be_isolated_and_says_so(learners):
    said, found, private = measure(learners, "rpc")
    assert said["isolation"] == f"none: {isolation.RPC_REASON}"
    assert isolation.shared_machine()  # two users made by the test, besides any others
    assert "an RPC world cannot be kept from the other users" in said["printed"], said["printed"]
    assert not private
    assert counts(found)[OPEN] >= 3, table(found)  # TensorPipe on the kernel and each worker


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cluster", "spawn", "rpc"])
def test_in_the_isolated_kernel_nothing_is_open_to_another_user_rpc_included(learners, mode):
    """Issue 33: the learner's kernel in a private network of its own (as the isolated kernel starts it)."""
    said, found, private = measure(learners, mode, kernel=True)
    assert said["isolation"] == "private network (the isolated kernel's)", said
    assert len(private) == 1 and said["cluster_netns"] <= private  # one network: the kernel's, no second one
    assert counts(found)[OPEN] == 0, table(found)
    if mode == "rpc":
        assert "cannot be kept from the other users" not in said["printed"], said["printed"]
        assert len(found) >= 3, table(found)  # TensorPipe's listeners are there, out of B's reach


def _in_a_namespace_that_forbids_more(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a user namespace whose limit of nested user namespaces is 0: a machine that
    refuses private networks, made without touching this machine's settings."""
    script = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} -c \"$0\""
    return subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script, code],
                          capture_output=True, text=True, timeout=START_S,  # "auto" asks for one where shared
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), isolation.SHARED_ENV: "1"})


REFUSED = """
import ppkit, warnings
from ppkit.errors import LaunchError
with ppkit.Cluster(2, "gloo") as cluster:
    assert cluster.run(lambda rank, world_size: rank) == [0, 1]
    print("auto:", cluster.isolation)
try:
    ppkit.Cluster(2, "gloo", isolation="netns", start_timeout=60)
except LaunchError as exc:
    print("netns:", exc)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux namespaces")
def test_a_machine_that_refuses_falls_back_or_fails_clearly():
    done = _in_a_namespace_that_forbids_more(REFUSED)
    assert done.returncode == 0, done.stdout + done.stderr
    auto = next(line for line in done.stdout.splitlines() if line.startswith("auto:"))
    assert "none: this machine refused a private network (unshare(" in auto, auto
    assert "No space left on device" in auto, auto  # the nested namespace limit the test set
    netns = next(line for line in done.stdout.splitlines() if line.startswith("netns:"))
    assert "isolation='netns' asks for the workers in a private network" in netns, netns
    assert "isolation='auto'" in netns, netns


def test_bad_isolation_values_are_config_errors(monkeypatch):
    with pytest.raises(ppkit.ConfigError, match="unknown isolation 'yes'"):
        ppkit.Cluster(2, isolation="yes")
    with pytest.raises(ppkit.ConfigError, match="needs launcher='local'"):
        ppkit.Cluster(2, launcher="spawn", isolation="netns")
    monkeypatch.setenv("PPKIT_ISOLATION", "sometimes")
    with pytest.warns(UserWarning, match="PPKIT_ISOLATION=sometimes is not one of"):
        assert isolation.resolve("auto", "local")[0] in ("netns", "off")



@pytest.mark.slow
def test_a_folder_too_deep_for_a_unix_socket_falls_back_or_fails_clearly(tmp_path, monkeypatch, no_leftovers):
    deep = tmp_path / ("d" * 110)  # a Unix socket's address holds at most 107 bytes of path
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.delenv("PPKIT_ISOLATION", raising=False)
    monkeypatch.setenv(isolation.SHARED_ENV, "1")  # "auto" asks for a private network where the machine is shared
    with ppkit.Cluster(2, "gloo") as cluster:
        assert cluster.run(lambda rank, world_size: rank) == [0, 1]
        assert str(cluster.isolation).startswith(f"none: no Unix socket for the workers at {deep}"), cluster.isolation
    with pytest.raises(LaunchError, match="isolation='netns' asks for the workers in a private network"):
        ppkit.Cluster(2, "gloo", isolation="netns")
    assert not list(deep.iterdir())  # the failed start removed its folder
