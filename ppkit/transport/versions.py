"""The versions that must agree between a controller and its workers: Python, torch, ppkit."""

from __future__ import annotations

import platform
from importlib import metadata

from ppkit.transport.messages import Versions


def ppkit_version() -> str:
    """This installation's ppkit version, as pyproject.toml (the one place it is written) set it."""
    try:
        return metadata.version("ppkit")
    except metadata.PackageNotFoundError:  # a source tree that was never pip-installed
        return "0+unknown"


def torch_version() -> str:
    """The installed torch's version, from its package metadata: checking versions at admission
    then costs no ``import torch`` (seconds) on either side; torch itself where there is none."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # a source checkout on sys.path
        import torch

        return str(torch.__version__)  # str(): a TorchVersion would need torch to unpickle


def versions() -> Versions:
    return Versions(python=platform.python_version(), torch=torch_version(), ppkit=ppkit_version())
