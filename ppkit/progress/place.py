"""Where the record lies: the same folder for every process of one learner.

    ~/ppkit-progress/                 the record (PPKIT_RECORD_DIR: another absolute folder), whatever the process:
                                      a kernel, a JupyterLab terminal, ssh, VS Code, ``ppkit progress --off``
    <root>/ppkit-progress -> ~/ppkit-progress
                                      a link, made by a process under a Jupyter server rooted inside the home
                                      (``c.Spawner.notebook_dir = "~/notebooks"``), so that the server's contents
                                      API (the learner's file browser, the instructor's ``ppkit room``) reaches the
                                      record: jupyter_server refuses a path outside its root by the path's
                                      ``abspath``, which a link inside the root passes (it does not resolve links)

The link is made once per process (``settle``, called by the writer and the reader). A file or folder of that
name that is not a link is the learner's: it is left as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

from ppkit.progress import format as fmt
from ppkit.progress.files import make_folder

LINK_NAME = "ppkit-progress"
_settled: set[Path] = set()


def settle(folder: Path) -> Path:
    """``folder``, settled once per process when it is the default ``~/ppkit-progress``: under a Jupyter server
    rooted inside the home, ``<root>/ppkit-progress`` made a link to it. Never raises: a failure leaves things as
    they were (the record works; only the room may not see it)."""
    if folder in _settled or os.environ.get(fmt.DIR_ENV) or folder != Path.home() / LINK_NAME:
        return folder
    _settled.add(folder)
    home = Path.home().resolve()
    root = fmt.jupyter_root()
    link = root / LINK_NAME if root is not None and root != home and root.is_relative_to(home) else None
    if link is None or link.is_symlink() or link.exists():
        return folder  # nothing to do, made already (by us, or by the learner: hers to keep), or not ours
    try:
        make_folder(folder)
        os.symlink(folder, link, target_is_directory=True)
    except OSError:  # FileExistsError: another process made it meanwhile
        pass
    return folder
