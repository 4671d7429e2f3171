"""``python -m ppkit.cluster.tools.torchrun ARGS``: torchrun, with its store on ``--master_addr`` only.

torchrun's agent on node 0 hosts the rendezvous store (a TCPStore on ``--master_port``), and
torch's TCPStore server listens on every interface of the machine whatever address it is given.
ppkit runs torchrun on one machine as if it were several (``ppkit.lessons.rank_variables``), where
nothing should listen beyond 127.0.0.1. So before handing over to torchrun, node 0's agent serves
the store from a socket bound to ``--master_addr`` (ppkit.cluster.worker_setup.tcp_store); torchrun's
static rendezvous asks for a multi-tenant store on that port and reuses it. Everything else is
torchrun's own ``main``, with the same arguments.
"""

from __future__ import annotations

import sys

from ppkit.cluster import worker_setup


def _option(argv: list[str], name: str, default: str | None = None) -> str | None:
    """The value of ``--name=value`` or ``--name value`` (torchrun also spells it with dashes)."""
    spellings = {f"--{name}", f"--{name.replace('_', '-')}"}
    for i, arg in enumerate(argv):
        flag, sep, value = arg.partition("=")
        if flag in spellings:
            return value if sep else (argv[i + 1] if i + 1 < len(argv) else default)
    return default


def hold_store(argv: list[str]):
    """Node 0's store on ``--master_addr:--master_port``, or None where torchrun makes its own."""
    if _option(argv, "node_rank", "0") != "0" or _option(argv, "rdzv_backend", "static") != "static":
        return None
    host, port = _option(argv, "master_addr", "127.0.0.1"), int(_option(argv, "master_port", "29500"))
    return worker_setup.tcp_store(host, int(_option(argv, "nnodes", "1")), 300.0, port=port, multi_tenant=True)


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.run import main as torchrun

    argv = sys.argv[1:] if argv is None else argv
    store = hold_store(argv)  # noqa: F841  (kept alive while torchrun runs)
    torchrun(argv)


if __name__ == "__main__":
    main()
