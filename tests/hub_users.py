"""Learner accounts for the JupyterHub testbed (tests/hub_testbed.py): real Unix users, made and removed here.

    user = Learner.create("ppkhub3f9a1ca")   # useradd -m, the course's notebooks in ~/notebooks
    user.processes()                          # every process running as that user
    user.remove()                             # kills what is left (and says so), then userdel -r

A learner's server runs as that user (the hub's LocalProcessSpawner switches to it), so the Python that
runs the tests and this checkout must be readable by every user: ``check_can_import`` says which folder
is not, rather than letting the server die with an ImportError in a log.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil
from unix_users import processes_of

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"

# The same lab settings the browser tests use: every cell in the DOM, no news or update pop-ups.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
}


class LearnerError(RuntimeError):
    """A learner account could not be made, used or removed."""


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise LearnerError(f"`{' '.join(cmd)}` exited with {done.returncode}: {done.stderr.strip()}")


def unreadable_folders(*paths: Path) -> list[str]:
    """The folders on the way to `paths` that other users cannot enter (mode lacks o+x), each once."""
    found: list[str] = []
    # both the path as named and where its links lead: a venv's bin/python links to a Python elsewhere
    for path in [q for p in paths for q in (Path(os.path.abspath(p)), p.resolve())]:
        for folder in [*reversed(path.parents), path]:
            if folder.is_dir() and not folder.stat().st_mode & 0o001 and str(folder) not in found:
                found.append(str(folder))
    return found


def grant_traverse(name: str, folders: list[str]) -> None:
    """Let user `name` (and only that user) pass through `folders`: one ACL entry each (setfacl -m u:NAME:x).

    A pyenv Python lives under /root (mode 0700); an ACL entry per learner opens it to the learners alone,
    for the test's length, instead of changing the folder's mode for every user of the machine.
    """
    for folder in folders:
        _run(["setfacl", "-m", f"u:{name}:x", folder])


def revoke_traverse(name: str, folders: list[str]) -> None:
    """Take back what grant_traverse gave; a folder left with no named entry gets its plain mode back."""
    for folder in folders:
        # no check: after a start that failed part-way the entry may never have been made
        subprocess.run(["setfacl", "-x", f"u:{name}", folder], capture_output=True, timeout=30)
        acl = subprocess.run(["getfacl", "-cp", folder], capture_output=True, text=True, timeout=30).stdout
        if not any(line.startswith(("user:", "group:")) and line.split(":")[1] for line in acl.splitlines()):
            _run(["setfacl", "-b", folder])  # only the mask was left: drop it, so `ls -l` shows no '+'


@dataclass(frozen=True)
class Learner:
    name: str
    home: Path
    uid: int

    @property
    def notebook_dir(self) -> Path:
        return self.home / "notebooks"

    @classmethod
    def create(cls, name: str) -> Learner:
        """useradd -m NAME; copy notebooks/ to ~/notebooks; write the lab settings; all owned by the user."""
        _run(["useradd", "--create-home", "--shell", "/bin/bash", "--comment", "ppkit hub test learner", name])
        entry = pwd.getpwnam(name)
        learner = cls(name, Path(entry.pw_dir), entry.pw_uid)
        try:
            shutil.copytree(NOTEBOOKS, learner.notebook_dir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
            settings = learner.home / ".jupyter" / "lab" / "user-settings"
            for rel, content in LAB_SETTINGS.items():
                path = settings / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(content))
            _run(["chown", "-R", f"{name}:{entry.pw_gid}", str(learner.home)])
        except BaseException:
            learner.remove()
            raise
        return learner

    def check_can_import(self, python: str, env: dict[str, str]) -> None:
        """As this user, import ppkit and torch with the Python and environment the hub gives its server."""
        cmd = ["runuser", "-u", self.name, "--", "env", *(f"{k}={v}" for k, v in env.items()),
               python, "-c", "import ppkit, torch, jupyterhub; print(ppkit.__file__)"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")
        if done.returncode != 0:
            closed = unreadable_folders(Path(python), REPO)
            raise LearnerError(
                f"user {self.name} cannot import ppkit, torch and jupyterhub with {python} "
                f"(exit {done.returncode}): {done.stderr.strip()[-600:]}. "
                + (f"Folders other users cannot enter: {closed}; `chmod o+x` them. " if closed else "")
                + "The learners' servers run as their own Unix users, so the venv and the checkout must be "
                "readable by all."
            )
        if Path(done.stdout.strip()).resolve().parent != (REPO / "ppkit").resolve():
            raise LearnerError(f"user {self.name} imports ppkit from {done.stdout.strip()}, not from {REPO}")

    def processes(self) -> list[psutil.Process]:
        return processes_of(self)  # tests/unix_users.py: by real or effective uid

    def describe_processes(self) -> list[str]:
        described = []
        for proc in self.processes():
            try:
                described.append(f"{proc.pid} {' '.join(proc.cmdline()[:5])}")
            except psutil.Error:  # gone while we looked: not left over
                pass
        return described

    def remove(self) -> list[str]:
        """Kill whatever still runs as the user, delete the user and the home; return what had to be killed."""
        left = self.describe_processes()
        procs = self.processes()
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)
        try:
            pwd.getpwnam(self.name)
        except KeyError:
            return left
        _run(["userdel", "--remove", self.name])
        return left


def missing_tools() -> list[str]:
    """What the accounts need that this machine lacks (root, useradd/userdel/runuser, setfacl from acl)."""
    missing = [] if os.geteuid() == 0 else ["root (to make Unix users)"]
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    tools = ("useradd", "userdel", "runuser", "setfacl", "getfacl")
    missing += [tool for tool in tools if shutil.which(tool, path=path) is None]
    return missing

