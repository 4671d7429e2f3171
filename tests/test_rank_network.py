"""Ranks reach what the kernel reaches (issue 39, item 5): an HTTP server on this machine's own non-loopback
address, fetched by a rank, in the default mode on a one-user machine (the ranks on the machine's network) and
in a forced private network (a way out through slirp4netns, nothing let in). Where a private network has no way
out, ppkit says so once; the isolated kernel's no network is tested in tests/test_isolated_kernel.py.

Whether the machine is shared is set with PPKIT_SHARED_MACHINE, not guessed: the hub and isolation tests make
Unix users while this runs, and `make test` runs everything as on a shared machine (the Makefile).
"""

from __future__ import annotations

import http.server
import os
import threading
import warnings

import psutil
import pytest
from leftovers import wait_gone
from slurm_session import in_ci

import ppkit
from ppkit.cluster import isolation
from ppkit.transport import private_net

pytestmark = pytest.mark.timeout(300)
BODY = b"served by the test, on this machine's own address"


def own_address() -> str | None:
    """An IPv4 address of one of this machine's own interfaces, not loopback nor link-local (eth0's)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not a.address.startswith(("127.", "169.254.")):
                return a.address
    return None


@pytest.fixture(scope="module")
def url():
    address = own_address()
    if address is None:
        pytest.skip("this machine has no IPv4 address besides loopback to serve from")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

        def log_message(self, *args):
            pass

    asked: list[str] = []  # the paths fetched, in order
    server = http.server.ThreadingHTTPServer((address, 0), Handler)
    server.asked = asked
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Served(f"http://{address}:{server.server_address[1]}/", asked)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class Served(str):
    """The server's URL, which also knows what was fetched from it."""

    def __new__(cls, url: str, asked: list[str]):
        served = super().__new__(cls, url)
        served.asked = asked
        return served


def fetch_in_spawn(i, url):  # ppkit.spawn's (and mp.spawn's) signature: the process index, then args
    import urllib.request

    with urllib.request.urlopen(f"{url}?rank={i}", timeout=20) as answer:
        assert answer.read() == BODY


def fetch(rank, world_size, url):
    import os
    import urllib.request

    with urllib.request.urlopen(url, timeout=20) as answer:
        return answer.read(), os.readlink("/proc/self/ns/net")


def need_slirp() -> None:
    missing = private_net.outbound_missing()
    if missing:
        (pytest.fail if in_ci() else pytest.skip)(
            f"{missing}: `make hub` installs it (scripts/install_slirp.sh)" + " (CI=true: it must run)" * in_ci())


@pytest.mark.slow
def test_by_default_on_a_one_user_machine_ranks_use_its_network(url, monkeypatch, no_leftovers):
    monkeypatch.setenv(isolation.SHARED_ENV, "0")
    monkeypatch.delenv("PPKIT_ISOLATION", raising=False)
    with ppkit.Cluster(2, "gloo") as cluster:
        answers = cluster.run(fetch, str(url))
        assert str(cluster.isolation) == f"none: {isolation.ONE_USER}"
    assert [body for body, _ in answers] == [BODY, BODY]
    assert {netns for _, netns in answers} == {os.readlink("/proc/self/ns/net")}  # the kernel's network


@pytest.mark.slow
def test_spawn_by_default_on_a_one_user_machine_reaches_this_machines_address(url, monkeypatch, no_leftovers):
    from ppkit.cluster.spawn import call as spawn_call

    monkeypatch.setenv(isolation.SHARED_ENV, "0")
    monkeypatch.delenv("PPKIT_ISOLATION", raising=False)
    spawn_call.close()  # a kept world of an earlier test may be a private one
    try:
        ppkit.spawn(fetch_in_spawn, args=(str(url),), nprocs=2, timeout=60)  # a rank's failure would raise here
    finally:
        spawn_call.close()
    assert {"/?rank=0", "/?rank=1"} <= set(url.asked), url.asked


@pytest.mark.slow
def test_a_private_network_reaches_out_through_slirp4netns_and_lets_nothing_in(url, monkeypatch, no_leftovers):
    need_slirp()
    monkeypatch.setenv("PPKIT_SPARE_S", "0")  # closed, its fork server ends: so must its slirp4netns
    with ppkit.Cluster(2, "gloo", isolation="netns") as cluster:
        if not cluster.isolation.private:
            pytest.skip(f"this machine refuses a private network: {cluster.isolation}")
        answers = cluster.run(fetch, str(url))
        fork_server = next(p.pid for p in cluster.processes() if p.role == "fork server")
        slirp = [p for p in psutil.Process(fork_server).children() if p.name() == "slirp4netns"]
        assert len(slirp) == 1 and not slirp[0].net_connections(kind="inet"), slirp  # one, listening on nothing
        assert slirp[0].environ().get("PPKIT_TEST_OWNER") is None  # none of ppkit's marks: no leftover's
        names = cluster.run(lambda rank, world_size: [name for _, name in __import__("socket").if_nameindex()])
    assert [body for body, _ in answers] == [BODY, BODY]
    (netns,) = {netns for _, netns in answers}
    assert netns != os.readlink("/proc/self/ns/net")  # the rank fetched from inside its private network
    assert names == [["lo", "tap0"]] * 2, names
    assert not wait_gone([slirp[0].pid], timeout=10), "slirp4netns outlived its fork server"


@pytest.mark.slow
def test_without_slirp4netns_a_private_network_has_only_its_loopback(url, monkeypatch, tmp_path, no_leftovers):
    bare = tmp_path / "bin"  # a PATH with no slirp4netns, for the kernel and the fork server alike
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.setenv("PPKIT_SPARE_S", "0")
    monkeypatch.setattr(isolation, "_warned_outbound", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cluster = ppkit.Cluster(2, "gloo", isolation="netns")
    with cluster:
        if not cluster.isolation.private:
            pytest.skip(f"this machine refuses a private network: {cluster.isolation}")
        with pytest.raises(ppkit.RemoteError, match="Network is unreachable"):
            cluster.run(fetch, str(url))
    said = [str(w.message) for w in caught]
    assert any("no way out (slirp4netns is not installed)" in words for words in said), said


def test_a_shared_machine_without_a_way_out_says_so_once(monkeypatch):
    monkeypatch.setenv(isolation.SHARED_ENV, "1")
    monkeypatch.delenv("PPKIT_ISOLATION", raising=False)
    monkeypatch.setattr(private_net, "outbound_missing", lambda: "slirp4netns is not installed")
    monkeypatch.setattr(isolation, "_warned_outbound", False)
    with pytest.warns(UserWarning) as caught:
        assert isolation.resolve("auto", "local")[0] == "netns"
        assert isolation.resolve("auto", "local")[0] == "netns"
    said = [str(w.message) for w in caught if "no way out" in str(w.message)]
    assert len(said) == 1, said
    assert said[0].startswith("this machine is shared (PPKIT_SHARED_MACHINE=1), so the workers run in a private")
    assert "apt-get install slirp4netns" in said[0] and "isolation='off'" in said[0]


@pytest.mark.parametrize("value, shared", [("1", True), ("yes", True), ("0", False), ("no", False)])
def test_ppkit_shared_machine_overrides_the_guess(monkeypatch, value, shared):
    monkeypatch.setenv(isolation.SHARED_ENV, value)
    monkeypatch.setenv("JUPYTERHUB_USER", "learner")  # would say shared
    assert bool(isolation.shared_machine()) is shared
    monkeypatch.delenv("PPKIT_ISOLATION", raising=False)
    monkeypatch.setattr(private_net, "outbound_missing", lambda: "")
    mode, required, reason = isolation.resolve("auto", "local")
    assert (mode, required, reason) == (("netns", False, "") if shared else ("off", False, isolation.ONE_USER))


def test_a_wrong_ppkit_shared_machine_says_what_it_takes(monkeypatch):
    monkeypatch.setenv(isolation.SHARED_ENV, "sometimes")
    with pytest.warns(UserWarning, match="PPKIT_SHARED_MACHINE='sometimes' is neither 1 nor 0, so ppkit guesses"):
        isolation.shared_machine()


def test_a_one_user_machine_reports_its_clusters_as_fine_in_preflight(monkeypatch):
    monkeypatch.setenv(isolation.SHARED_ENV, "0")
    status, words, fix = isolation.cluster_words(isolation.Isolation(False, isolation.ONE_USER))
    assert status == "ok" and fix == "" and "one user" in words


def test_a_resolver_on_the_machines_loopback_is_asked_through_slirp4netns():
    resolved = "# systemd-resolved\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lan\n"
    assert private_net.dns_view(resolved) == (
        "nameserver 10.0.2.3\n# systemd-resolved\noptions edns0 trust-ad\nsearch lan\n")
    assert private_net.dns_view("nameserver 192.0.2.53\n") is None  # reached through slirp4netns as it is
