"""Jupyter's side of the isolated kernel: a kernel provisioner that connects over Unix sockets.

A kernel in a private network cannot be reached on 127.0.0.1 from the Jupyter server, which runs
on the machine's network. Unix sockets bound to paths can: a path reaches across network namespaces
for whoever may open its folder. So before the kernel starts, this provisioner switches its
KernelManager (the one jupyter_server, nbclient or jupyter_client makes for a kernel whose
kernelspec names it) to the ``ipc`` transport, with the socket files in a fresh 0700 folder, and
removes that folder when the kernel ends. Everything else is Jupyter's own LocalProvisioner.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from jupyter_client.provisioning import LocalProvisioner

SOCKET_PREFIX = "kernel"  # the files are <folder>/kernel-1 ... kernel-5, one per channel


class IsolatedProvisioner(LocalProvisioner):
    """LocalProvisioner over the ``ipc`` transport, its sockets in a folder only this user can open."""

    folder: str | None = None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        km = self.parent
        if km is not None:
            if self.folder is None or not os.path.isdir(self.folder):  # a restart keeps the folder and names
                self.folder = tempfile.mkdtemp(prefix="ppkit-kernel-")  # mode 0700
                km.transport, km.cache_ports = "ipc", False
                km.ip = os.path.join(self.folder, SOCKET_PREFIX)
                km.shell_port = km.iopub_port = km.stdin_port = km.hb_port = km.control_port = 0
        return await super().pre_launch(**kwargs)

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart)
        if not restart and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    async def get_provisioner_info(self) -> dict[str, Any]:
        return {**await super().get_provisioner_info(), "folder": self.folder}

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.folder = provisioner_info.get("folder")
