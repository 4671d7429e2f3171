"""The cluster key: shown in full once, where the other machine needs it, masked everywhere else
(saved notebooks keep outputs and error texts), and refused when it is trivially guessable."""

from __future__ import annotations

import os
import socket

import pytest

import ppkit
from ppkit.cluster import admission
from ppkit.cluster.inbox import Inbox
from ppkit.cluster.launchers.remote import RemoteLauncher
from ppkit.cluster.spec import cluster_spec
from ppkit.errors import ConfigError, LaunchError
from ppkit.transport import channel

pytestmark = pytest.mark.timeout(120)

WEAK_KEYS = [
    (bytes(32), "all zeros"),
    ("00" * 32, "all zeros"),
    ("ab" * 16, r"one byte \(0xab\) repeated"),
    (b"\xff" * 64, r"one byte \(0xff\) repeated"),
    ("deadbeef" * 8, r"a 4-byte pattern \(deadbeef\) repeated"),
    ("0102" * 16, r"a 2-byte pattern \(0102\) repeated"),
    (bytes(range(32)), "a counting sequence"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("key, why", WEAK_KEYS)
def test_a_trivially_weak_key_is_refused_with_why_and_how_to_get_a_good_one(key, why):
    with pytest.raises(ConfigError, match=why) as info:
        admission.parse_key(key)
    text = str(info.value)
    assert "key=" in text and "PPKIT_KEY" in text and "anyone who can reach the port" in text
    assert "secrets.token_hex(32)" in text and "Leave key unset" in text


def test_random_keys_are_accepted():
    for _ in range(200):
        key = os.urandom(16)
        assert admission.parse_key(key) == key
        assert admission.parse_key(key.hex()) == key


@pytest.mark.parametrize("key, why", WEAK_KEYS[:3])
def test_a_weak_key_from_the_environment_is_refused_before_anything_starts(no_leftovers, monkeypatch, key, why):
    monkeypatch.setenv(channel.KEY_ENV, key.hex() if isinstance(key, bytes) else key)
    with pytest.raises(ConfigError, match=why):
        ppkit.Cluster(1, listen="127.0.0.1:0", remote=1, start_timeout=5)
    with pytest.raises(ConfigError, match=why):
        ppkit.start_rpc(1, listen="127.0.0.1:0", start_timeout=5)


def test_a_weak_key_argument_is_refused_by_start_and_the_cli(capsys):
    with pytest.raises(ConfigError, match="all zeros"):
        ppkit.start(2, listen="127.0.0.1:0", remote=1, key="00" * 32)
    from ppkit import cli

    assert cli.main(["master", "--listen", "127.0.0.1:0", "--key", "00" * 32]) == 2
    assert "ppkit master: error: the key given by key= (or $PPKIT_KEY) is all zeros" in capsys.readouterr().err


def test_mask_key_shows_four_hex_digits():
    key = bytes.fromhex("c0ffee") + os.urandom(29)
    assert admission.mask_key(key) == "c0ff..."


def test_the_full_key_is_printed_at_the_first_start_only_and_masked_after():
    key = os.urandom(32)
    spec = cluster_spec(1, listen="127.0.0.1:0", remote=["laptop"], key=key, start_timeout=5)
    launcher = RemoteLauncher(spec, Inbox(lambda item: False), key)
    launcher.bind(("127.0.0.1", 29611))
    said = []
    try:
        launcher.begin(say=lambda text, **_: said.append(text))  # the first start
        launcher.begin(say=lambda text, **_: said.append(text))  # a restart, laptop still missing
        hint = launcher.timeout_hint(set())
    finally:
        launcher.close()
    assert f"PPKIT_KEY={key.hex()} ppkit worker --connect 127.0.0.1:29611 --name laptop" in said[0]
    assert key.hex() not in said[1]
    assert (f"PPKIT_KEY={key.hex()[:4]}... (the key printed at the first start) ppkit worker --connect "
            "127.0.0.1:29611 --name laptop") in said[1]
    assert key.hex() not in hint and f"PPKIT_KEY={key.hex()[:4]}..." in hint
    assert key.hex() not in repr(launcher)


@pytest.mark.slow
def test_error_texts_and_reprs_never_hold_the_key(no_leftovers, capsys):
    port, key = free_port(), os.urandom(32)
    with pytest.raises(LaunchError) as info:
        ppkit.Cluster(1, listen=f"127.0.0.1:{port}", remote=["laptop"], key=key, start_timeout=2)
    printed = capsys.readouterr().out
    assert printed.count(key.hex()) == 1  # the join command, printed once for the other machine
    assert key.hex() not in str(info.value) and f"PPKIT_KEY={key.hex()[:4]}..." in str(info.value)
    with ppkit.Cluster(1, "gloo") as cluster:
        assert cluster._key.hex() not in repr(cluster) + cluster._repr_html_()
