"""tests/hub_testbed.py's failure paths: each ends with an error that says what happened, no learner account and
no process left (the working hub is tested by tests/browser/test_hub_in_lab.py)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import hub_testbed
import pytest
from hub_testbed import HubMissing, HubTestbed, HubTestbedError
from hub_users import Learner, LearnerError, unreadable_folders


@pytest.fixture
def components():
    try:
        return hub_testbed.find_components()
    except HubMissing as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{exc} CI=true, so the JupyterHub tests must run.")
        pytest.skip(str(exc))


def _acl(folder: str) -> str:
    return subprocess.run(["getfacl", "-cpn", folder], capture_output=True, text=True, timeout=30).stdout


def _gone(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return True
    return False


def test_a_learner_who_cannot_reach_the_python_is_told_which_folder(components, tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    os.chmod(closed, 0o700)
    (closed / "python").symlink_to(sys.executable)
    learner = Learner.create(f"ppkhub{os.urandom(3).hex()}x")
    try:
        assert (learner.notebook_dir / "06_pipeline.ipynb").stat().st_uid == learner.uid
        with pytest.raises(LearnerError, match=rf"cannot import ppkit.*Permission denied.*{closed}.*chmod o\+x"):
            learner.check_can_import(str(closed / "python"), {"PYTHONPATH": str(hub_testbed.REPO)})
    finally:
        assert learner.remove() == []
    assert _gone(learner.name) and not learner.home.exists()


@pytest.mark.slow
def test_a_hub_that_cannot_start_its_proxy_says_so_and_leaves_nothing(components, tmp_path, monkeypatch):
    closed = unreadable_folders(Path(sys.executable), Path(sys.prefix), hub_testbed.REPO)
    made: list[Learner] = []
    create = Learner.create
    monkeypatch.setattr(Learner, "create", lambda name: made.append(create(name)) or made[-1])
    broken = dict(components, **{"configurable-http-proxy": "/bin/false"})
    monkeypatch.setattr(hub_testbed, "find_components", lambda: broken)
    hub = HubTestbed(tmp_path / "hub", learners=1)
    exited = r"(?s)jupyterhub exited with code \d+ before it answered.*Failed to start proxy"
    with pytest.raises(HubTestbedError, match=exited):
        hub.start()
    assert hub.proc is None and hub.learners == [] and _gone(hub.names[0])
    assert len(made) == 1  # the learner was made (and let through the closed folders) before the hub failed
    assert not [f for f in closed if f"user:{made[0].uid}:" in _acl(f)]  # and those ACL entries are gone too
