"""Real Unix users for tests, made and removed by the test (needs root, `useradd`, `userdel`).

    with unix_user("lrn") as alice:
        proc = run_as(alice, [sys.executable, "learner.py"], stdout=subprocess.PIPE)

``run_as`` starts a command as that user with this interpreter and this repository reachable: a
Python installed in a 0700 home (pyenv under /root) cannot be run by anyone else, so the command
runs in a private mount namespace of its own where each such folder is covered by a tmpfs holding
only the entries on the way (bind mounts of the real ones). Nothing of it is seen outside; it
ends with the command's processes. ``unix_user`` kills what the user still runs before removing
it, and says so (a test asserts that nothing was left).
"""

from __future__ import annotations

import itertools
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
_counter = itertools.count(1)


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str


def unavailable_reason() -> str | None:
    """Why users cannot be made here (None if they can)."""
    if not sys.platform.startswith("linux"):
        return f"real Unix users for tests need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "making Unix users needs root"
    missing = [t for t in ("useradd", "userdel", "unshare", "mount", "setpriv") if shutil.which(t) is None]
    return f"missing commands: {', '.join(missing)} (passwd, util-linux, mount)" if missing else None


def processes_of(user: User) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] and user.uid in (proc.info["uids"].real, proc.info["uids"].effective):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@contextmanager
def unix_user(prefix: str):
    """A fresh user named ``prefix`` + a unique suffix, with its own home; removed on exit."""
    name = f"{prefix}{os.getpid() % 100000}x{next(_counter)}"[:31]
    home = tempfile.mkdtemp(prefix=f"ppkit-home-{name}-")
    done = subprocess.run(["useradd", "--no-create-home", "--home-dir", home, "--shell", "/bin/sh",
                           "--user-group", name], capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        raise RuntimeError(f"useradd {name} failed: {done.stderr.strip()}")
    entry = pwd.getpwnam(name)
    user = User(name, entry.pw_uid, entry.pw_gid, home)
    os.chown(home, user.uid, user.gid)
    os.chmod(home, 0o700)
    try:
        yield user
    finally:
        for proc in processes_of(user):  # a test asserts there are none first; this is the net
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(processes_of(user), timeout=5)
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def _closed_folders(paths) -> dict[Path, set[str]]:
    """Folders on the way to ``paths`` that others may not enter -> the entries needed in each."""
    closed: dict[Path, set[str]] = {}
    for path in paths:
        path = Path(path).resolve()
        for folder in [*reversed(path.parents)][1:]:  # not "/"
            if not folder.stat().st_mode & 0o001:
                closed.setdefault(folder, set()).add(path.relative_to(folder).parts[0])
                break
    return closed


def _mount_script(closed: dict[Path, set[str]], stash: str) -> str:
    lines = ["set -e"]
    for n, (folder, entries) in enumerate(sorted(closed.items())):
        keep = f"{stash}/{n}"
        lines += [f"mkdir -p {keep}", f"mount --bind {shlex.quote(str(folder))} {keep}",
                  f"mount -t tmpfs -o mode=0755 ppkit-test {shlex.quote(str(folder))}"]
        for entry in sorted(entries):
            inside = shlex.quote(str(folder / entry))
            lines += [f"mkdir -p {inside}" if (folder / entry).is_dir() else f"touch {inside}",
                      f"mount --bind {keep}/{shlex.quote(entry)} {inside}"]
    return "\n".join(lines)


def run_as(user: User, argv: list[str], env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """Start ``argv`` as ``user`` (its uid, its group only), in a mount namespace of its own where
    this interpreter and this repository can be reached; ``env`` is its whole environment."""
    needed = [sys.executable, sys.base_prefix, sys.prefix, REPO]
    stash = tempfile.mkdtemp(prefix="ppkit-mounts-")  # only its mount points; removed by the caller's exit
    script = _mount_script(_closed_folders(needed), stash)
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": user.home, "USER": user.name,
               "LOGNAME": user.name, "PYTHONPATH": str(REPO), **(env or {})}
    switch = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--"]
    command = f"{script}\ncd {shlex.quote(user.home)}\nexec {shlex.join(switch + list(argv))}"
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", command],
                            env=environ, **popen)
    proc.stash = stash  # type: ignore[attr-defined]  (rmdir'd by finish())
    return proc


def finish(proc: subprocess.Popen, timeout: float = 30) -> None:
    """Wait for a ``run_as`` command (kill it after ``timeout``) and remove its stash of mount points."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(proc.stash, ignore_errors=True)  # type: ignore[attr-defined]
