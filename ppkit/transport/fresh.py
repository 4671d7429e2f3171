"""One worker as a fresh interpreter: the ``spawn`` start method (no fork anywhere).

``python -m ppkit.transport.fresh`` with PPKIT_ADDR, PPKIT_KEY, PPKIT_PARENT and PPKIT_RANK set
imports torch by itself, connects to the controller and serves jobs as rank PPKIT_RANK, speaking
the same messages as a forked worker (messages.py). Slower to start than a fork of the fork server
(each rank pays its own ``import torch``) but safe where forking a process that imported torch is
not (macOS) or impossible (Windows).

Orphan protection needs no PR_SET_PDEATHSIG here: a parent watch thread exits when the kernel that
started this process is gone, from the first line on, and once connected the worker also exits on
the control connection's EOF (worker.py).
"""

from __future__ import annotations

import os


def main() -> None:
    from ppkit.transport import channel, procs, worker

    procs.watch_parent(int(os.environ.pop("PPKIT_PARENT")))
    address = channel.parse_address(os.environ.pop("PPKIT_ADDR"))
    key = bytes.fromhex(os.environ.pop(channel.KEY_ENV))
    rank = int(os.environ.pop("PPKIT_RANK"))
    worker.run(address, key, rank=rank)


if __name__ == "__main__":
    main()
