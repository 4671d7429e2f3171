"""``ppkit kernel install --isolated``: the kernelspec of the isolated kernel (ppkit/kernel/).

Its argv starts ipykernel through ``ppkit.kernel.netns`` (a private network), and its metadata names
the provisioner that connects Jupyter to it over Unix sockets (provisioner.py). It is installed for
this user (``~/.local/share/jupyter/kernels``), for this environment (``--sys-prefix``) or under a
prefix, as ``ipykernel install`` does; an instructor installs it once in the environment learners use.
"""

from __future__ import annotations

import json
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

from ppkit.errors import ConfigError
from ppkit.kernel import DISPLAY_NAME, KERNEL_NAME, PROVISIONER


def spec(python: str = sys.executable) -> dict:
    return {
        "argv": [python, "-m", "ppkit.kernel.netns", "--", python, "-m", "ipykernel_launcher",
                 "-f", "{connection_file}", "--ext", "ppkit.kernel.offline"],
        "display_name": DISPLAY_NAME,
        "language": "python",
        "metadata": {"debugger": True, "kernel_provisioner": {"provisioner_name": PROVISIONER}},
    }


def provisioner_registered() -> bool:
    return any(e.name == PROVISIONER for e in entry_points(group="jupyter_client.kernel_provisioners"))


def install(user: bool = False, prefix: str | None = None, sys_prefix: bool = False) -> str:
    """Install the kernelspec; the folder it went to. ConfigError if Jupyter could not use it here."""
    from jupyter_client.kernelspec import KernelSpecManager

    from ppkit.transport import private_net

    if not provisioner_registered():
        raise ConfigError(
            f"Jupyter does not know ppkit's kernel provisioner ({PROVISIONER!r}, an entry point of ppkit's "
            "pyproject.toml): this ppkit was not installed with it. Reinstall it (pip install -e . in its "
            "checkout, or pip install --force-reinstall ppkit-*.whl, the course's wheel; not PyPI's `ppkit`, "
            "another project), then run this again.")
    refused = private_net._trial() if sys.platform.startswith("linux") else f"this is {sys.platform}"
    if refused is not None:
        raise ConfigError(
            f"this machine refuses a private network ({refused}), so the isolated kernel could not start here. "
            "Unprivileged user namespaces must be allowed: see docs/isolation.md, 'When the machine refuses'.")
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "kernel.json").write_text(json.dumps(spec(), indent=1))
        # Readable by all, as `ipykernel install` makes it: the copy keeps these modes, and a temporary folder
        # is 0700, so an instructor's install under sudo was invisible to every learner.
        Path(folder).chmod(0o755)
        (Path(folder) / "kernel.json").chmod(0o644)
        return KernelSpecManager().install_kernel_spec(folder, KERNEL_NAME, user=user, prefix=prefix or
                                                       (sys.prefix if sys_prefix else None))
