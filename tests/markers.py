"""Markers by kind, set at collection, so that a run can pick tests by what they start:
``pytest -m "not browser and not hub"``, ``-m notebook``, ``-m "unit"``.

A test gets every kind that applies (a notebook test is also ``kernel`` and ``cluster``):
- ``hub``, ``browser``, ``slurm``, ``netns`` (two hosts in network namespaces), ``notebook``: as
  tests/timing.py's kinds (the component a test starts for real);
- ``kernel``: it starts a Jupyter kernel (the test or a fixture it uses names tests/kernels.py or live_kernel);
- ``cluster``: it starts ppkit ranks (the test or a fixture it uses: a cluster fixture, ppkit.Cluster, spawn,
  torchrun, an RPC world);
- ``packaging``: it builds or installs the package (a wheel, a venv, a kernelspec for all users);
- ``unit``: none of the above.
``slow`` stays as it is (set by hand, on tests over ~1.5 s); `make test-fast` is ``not slow`` without the
browser, hub and SLURM kinds.
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from pathlib import PurePosixPath

import pytest

KINDS = ("hub", "browser", "slurm", "netns", "notebook", "kernel", "cluster", "packaging", "unit")
_TIMING_KIND = {"hub": "hub", "browser": "browser", "SLURM": "slurm", "two-host": "netns", "notebooks": "notebook"}
_KERNEL = re.compile(r"\b(live_kernel|kernels|isolated_kernel|KernelManager|start_new_kernel)\b")
_CLUSTER = re.compile(r"\b(cluster2|cluster4|bare6|fresh|ppkit\.Cluster|Cluster\(|ppkit\.spawn|spawn\(|"
                      r"ppkit\.torchrun|torchrun|start_rpc|two_hosts|%%ranks|killed_run)\b|"
                      r"\b(run_replicas\(\d|Lighthouse\()")  # lessons/fault_tolerance: torchft replicas, lighthouse
_PACKAGING = {"test_packaging.py", "test_course_wheel.py", "test_course_build.py", "test_kernel_install_for_all.py"}


def register(config: pytest.Config) -> None:
    for kind in KINDS:
        config.addinivalue_line("markers", f"{kind}: set by tests/markers.py (what the test starts)")


def kinds_of(item: pytest.Item, timing_kind: str) -> list[str]:
    path = PurePosixPath(item.nodeid.split("::", 1)[0])
    kinds = [_TIMING_KIND[timing_kind]] if timing_kind in _TIMING_KIND else []
    if path.suffix == ".ipynb":
        kinds += ["kernel", "cluster"]
    else:
        source = "\n".join(_source_of(fn) for fn in _functions(item))
        if _KERNEL.search(source):
            kinds.append("kernel")
        if _CLUSTER.search(source):
            kinds.append("cluster")
        if path.name in _PACKAGING:
            kinds.append("packaging")
    return list(dict.fromkeys(kinds)) or ["unit"]


def _functions(item) -> list:
    """The test function and every fixture it asks for (its whole closure), but not the suite's autouse
    housekeeping (garbage, leftover checks, the RPC capacity world), which every test has."""
    found = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in (getattr(info, "name2fixturedefs", None) or {}).values():
        found += [getattr(d, "func", None) for d in defs if not getattr(d, "_autouse", False)]
    return [fn for fn in found if fn is not None]


@cache
def _source_of(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def mark(items, kind_of) -> None:
    for item in items:
        for kind in kinds_of(item, kind_of(item)):
            item.add_marker(kind)


