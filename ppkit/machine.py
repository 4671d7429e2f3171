"""What this machine has, as ``ppkit preflight`` reports it: GPUs, JupyterLab's widget front-end, a free
port (memory: ppkit/cluster/memory.py). Each helper answers without raising where the platform cannot tell."""

from __future__ import annotations

import socket
from pathlib import Path


def widget_frontend() -> str | None:
    from jupyter_core.paths import jupyter_path

    for folder in jupyter_path("labextensions"):
        if (Path(folder) / "@jupyter-widgets" / "jupyterlab-manager" / "package.json").is_file():
            return folder
    return None


def gpus() -> str:
    try:
        import torch
    except ImportError:
        return ""
    if not torch.cuda.is_available():
        return ", no GPU (the notebooks need none: gloo on the CPU)"
    return ", GPU " + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
