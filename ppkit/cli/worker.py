"""``ppkit worker``: join a master's cluster from this machine as a named remote worker.

    PPKIT_KEY=<key the master printed> ppkit worker --connect 10.0.0.1:29600 --name worker1

Under torchrun or SLURM (``srun``), ``--name`` defaults to ``worker<RANK>`` and ``--connect`` to
``MASTER_ADDR:29600`` (``--port``), read with ``ppkit.cluster.tools.env.read_launch_env``.
"""

from __future__ import annotations

import os
import sys

from ppkit.checks import check_port, positive
from ppkit.cluster.admission import DEFAULT_PORT
from ppkit.errors import AuthenticationError, ConfigError, LaunchError
from ppkit.transport import channel

HELP = "join a master's cluster from this machine as a named remote worker"


def add_arguments(parser) -> None:
    parser.add_argument("--connect", metavar="ADDR:PORT",
                        help="the master's address, as it printed it (e.g. 10.0.0.1:29600)")
    parser.add_argument("--name", help="this worker's name in the master's placement (e.g. worker1); "
                                       "under torchrun or SLURM '{rank}' in it is this task's rank (task{rank})")
    parser.add_argument("--iface", metavar="IFACE",
                        help="network interface for gloo and TensorPipe (sets GLOO_SOCKET_IFNAME and "
                             "TP_SOCKET_IFNAME); default: the one that reaches the master")
    parser.add_argument("--key", metavar="HEX",
                        help=f"the master's key; better set {channel.KEY_ENV} (a command line is "
                             "visible to other users in ps)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long to keep trying to reach the master (default 60)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"the master's port when --connect is taken from torchrun/SLURM's "
                             f"MASTER_ADDR (default {DEFAULT_PORT})")


def resolve(args, environ=None) -> tuple[tuple[str, int], str, bytes]:
    """The address, name and key to use, from the flags and else the launcher's variables."""
    environ = os.environ if environ is None else environ
    connect, name = args.connect, args.name
    check_port(args.port, "--port")
    if connect is None or name is None or "{rank}" in name:
        launch = _launch_env(environ)
        if launch is None:
            missing = " and ".join(f for f, v in (("--connect", connect), ("--name", name)) if v is None)
            raise ConfigError(
                f"{missing} missing: say which master to join and under which name, e.g. "
                f"`ppkit worker --connect 10.0.0.1:{DEFAULT_PORT} --name worker1` (the master "
                "prints this line when it waits for workers).")
        connect = connect or f"{launch.master_addr}:{args.port}"
        name = (name or "worker{rank}").format(rank=launch.rank)
    try:
        address = channel.parse_address(connect)
    except ValueError as exc:
        raise ConfigError(
            f"--connect must be ADDR:PORT, e.g. 10.0.0.1:{DEFAULT_PORT}; "
            f"{exc}.") from exc
    key = args.key or environ.get(channel.KEY_ENV)
    if not key:
        raise ConfigError(
            f"no key: set {channel.KEY_ENV} to the key the master printed (or pass --key). The key "
            "keeps strangers from running code on your machines.")
    try:
        key_bytes = bytes.fromhex(key)
    except ValueError as exc:
        raise ConfigError(f"the key must be hex digits as the master printed it, got {len(key)} characters "
                          "that are not.") from exc
    positive(args.timeout, "--timeout")
    return address, name, key_bytes


def _launch_env(environ):
    """torchrun's or SLURM's view of this process, or None when no launcher started it."""
    if not any(k in environ for k in ("RANK", "SLURM_PROCID")):
        return None
    from ppkit.cluster.tools.env import read_launch_env

    return read_launch_env(environ)


def _node_ranks(environ) -> list[int] | None:
    """Under ppkit's SLURM launcher: the ranks of this node (one agent per node forks them all)."""
    from ppkit.cluster.slurm.layout import TASKS_ENV, node_ranks

    if not environ.get(TASKS_ENV) or "SLURM_NODEID" not in environ:
        return None
    return node_ranks(environ[TASKS_ENV], int(environ["SLURM_NODEID"]))


def main(args) -> int:
    from ppkit.transport.agent import Agent

    def say(text: str) -> None:
        print(text, flush=True)

    try:
        address, name, key = resolve(args)
        ranks = _node_ranks(os.environ)
    except ConfigError as exc:
        print(f"ppkit worker: error: {exc}", file=sys.stderr)
        return 2
    where = f"{address[0]}:{address[1]}"
    say(f"{name}: connecting to the master at {where} ...")
    try:
        agent = Agent(address, key, name, iface=args.iface, connect_timeout=args.timeout, say=say,
                      ranks=ranks)
    except (LaunchError, AuthenticationError) as exc:
        print(f"ppkit worker: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            joined = agent.join()
        except LaunchError as exc:
            print(f"ppkit worker: {exc}", file=sys.stderr)
            return 2
        addrs = " ".join(agent.hello().iface_addrs)
        say(f"{name}: joined {where} as rank {joined.rank} of the master's {joined.world_size} "
            f"worker process(es); gloo and TensorPipe use interface {agent.iface} ({addrs})")
        clean, why = agent.serve()
        say(f"{name}: {why}; exiting.")
        return 0 if clean else 1
    finally:
        agent.close()
