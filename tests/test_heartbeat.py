"""How long a silent peer is waited for: 12 s, or PPKIT_SILENT_AFTER_S (the fault tests use 5 s)."""

from __future__ import annotations

import pytest

from ppkit.transport import heartbeat


def test_the_default_is_twelve_seconds_with_a_heartbeat_every_two():
    assert heartbeat.silent_after_from({}) == 12.0
    assert heartbeat.SILENT_AFTER_S / heartbeat.HEARTBEAT_EVERY_S == 6  # six beats missed before giving up


def test_the_variable_sets_it():
    assert heartbeat.silent_after_from({heartbeat.SILENT_ENV: "30"}) == 30.0


@pytest.mark.parametrize("raw", ["soon", "0.5", "-3", "nan"])
def test_a_bad_value_is_named_and_the_default_kept(raw):
    with pytest.warns(UserWarning, match=rf"PPKIT_SILENT_AFTER_S='{raw}' is not a number of seconds >= 1"):
        assert heartbeat.silent_after_from({heartbeat.SILENT_ENV: raw}) == 12.0
