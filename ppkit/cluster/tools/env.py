"""Read the rank, world size and master address that a launcher (torchrun or SLURM) gave this process.

    torchrun sets   RANK  WORLD_SIZE  LOCAL_RANK     MASTER_ADDR  MASTER_PORT
    SLURM sets      SLURM_PROCID  SLURM_NTASKS  SLURM_LOCALID  SLURM_NODELIST (no port)

``read_launch_env()`` maps either onto the torchrun names, so a training script needs one code path:

    env = read_launch_env()
    dist.init_process_group("gloo", init_method=env.init_method, rank=env.rank,
                            world_size=env.world_size)

Run ``python -m ppkit.cluster.tools.env`` under a launcher to see what it reads (one JSON line per process).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from ppkit.errors import ConfigError

DEFAULT_MASTER_PORT = 29500  # torch's own default; SLURM does not choose a port for you
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SLURM_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODELIST")


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the job. ``source`` is ``"torchrun"`` or ``"slurm"``."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str
    hosts: tuple[str, ...] = field(default=())  # every node of the job, when the launcher says

    @property
    def init_method(self) -> str:
        """The ``tcp://`` address for ``init_process_group(init_method=...)``."""
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"

    def as_torchrun_env(self) -> dict[str, str]:
        """The same facts under torchrun's names, ready for ``init_method="env://"``."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(self.local_rank), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port)}


def read_launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """Read torchrun's variables, or else SLURM's, from ``environ`` (default ``os.environ``).

    torchrun's win when both are present: ``srun torchrun ...`` gives SLURM_PROCID per *node*
    (one torchrun agent per task), while torchrun's RANK is per *process*.

    >>> read_launch_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
    ...                  "SLURM_NODELIST": "gpu[03-04]"}).master_addr
    'gpu03'
    """
    env = os.environ if environ is None else environ
    if any(name in env for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return _from_torchrun(env)
    if "SLURM_PROCID" in env:
        return _from_slurm(env)
    raise ConfigError(
        "no launcher variables found: neither torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
        "MASTER_PORT) nor SLURM's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODELIST) are set. "
        "Start the script with `torchrun --nproc_per_node=N script.py` or `srun -n N python script.py`; "
        "in a notebook, use ppkit.start(N) instead.")


def _from_torchrun(env: Mapping[str, str]) -> LaunchEnv:
    missing = [name for name in TORCHRUN_VARS[:4] if not env.get(name)]
    if missing:
        present = [name for name in TORCHRUN_VARS if env.get(name)]
        raise ConfigError(
            f"torchrun-style variables are incomplete: {', '.join(present)} set but "
            f"{', '.join(missing)} missing. torchrun sets all of them; if you set them by hand, set "
            "RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR (MASTER_PORT defaults to "
            f"{DEFAULT_MASTER_PORT}).")
    world_size = _int(env, "WORLD_SIZE", minimum=1)
    rank = _int(env, "RANK", minimum=0)
    local_rank = _int(env, "LOCAL_RANK", minimum=0)
    _check_ranks(rank, local_rank, world_size, "RANK", "LOCAL_RANK", "WORLD_SIZE")
    return LaunchEnv(rank, world_size, local_rank, env["MASTER_ADDR"].strip(), _port(env), "torchrun")


def _from_slurm(env: Mapping[str, str]) -> LaunchEnv:
    nodelist_name = "SLURM_NODELIST" if env.get("SLURM_NODELIST") else "SLURM_JOB_NODELIST"
    needed = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nodelist_name)
    missing = [name for name in needed if not env.get(name)]
    if missing:
        raise ConfigError(
            f"SLURM_PROCID is set but {', '.join(missing)} missing. Inside `srun` SLURM sets "
            "SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and SLURM_NODELIST for every task; in an "
            "`sbatch` script outside `srun` only some exist. Start each process with "
            "`srun python script.py`.")
    world_size = _int(env, "SLURM_NTASKS", minimum=1)
    rank = _int(env, "SLURM_PROCID", minimum=0)
    local_rank = _int(env, "SLURM_LOCALID", minimum=0)
    _check_ranks(rank, local_rank, world_size, "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
    hosts = tuple(expand_nodelist(env[nodelist_name]))
    master_addr = env.get("MASTER_ADDR", "").strip() or _node_address(hosts[0], env)
    return LaunchEnv(rank, world_size, local_rank, master_addr, _port(env), "slurm", hosts)


def _node_address(node: str, env: Mapping[str, str]) -> str:
    """Under a real SLURM job: the node's address as SLURM's tools find it (its NodeAddr where the
    name does not resolve); elsewhere (variables written by hand) the name itself."""
    import shutil

    if not env.get("SLURM_JOB_ID") or shutil.which("scontrol") is None:
        return node
    from ppkit.cluster.slurm import hosts
    from ppkit.errors import LaunchError

    try:
        return hosts.node_address(node)
    except (LaunchError, OSError):
        return node


def _int(env: Mapping[str, str], name: str, minimum: int) -> int:
    text = env[name].strip()
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name}={env[name]!r} is not a whole number; the launcher should set "
                          f"it to one (e.g. {name}=0).") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}.")
    return value


def _check_ranks(rank, local_rank, world_size, rank_name, local_name, size_name) -> None:
    if rank >= world_size:
        raise ConfigError(
            f"{rank_name}={rank} but {size_name}={world_size}: ranks run from 0 to {world_size - 1}. "
            "The variables come from different jobs or were set by hand inconsistently.")
    if local_rank >= world_size:
        raise ConfigError(
            f"{local_name}={local_rank} but {size_name}={world_size}: a local rank counts processes "
            "on one machine, so it cannot reach the number of processes in the whole job.")


def _port(env: Mapping[str, str]) -> int:
    text = env.get("MASTER_PORT", "").strip()
    if not text:
        return DEFAULT_MASTER_PORT
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise ConfigError(f"MASTER_PORT={env['MASTER_PORT']!r} is not a TCP port (1-65535). "
                          "Pick a free port, e.g. MASTER_PORT=29500.")
    return port


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand SLURM's compact host list: ``"node[03-05,07],gpu1"`` -> node03 node04 node05 node07 gpu1.

    Zero padding is kept (``[08-10]`` gives 08 09 10), several bracket groups multiply
    (``r[1-2]n[1-2]`` gives r1n1 r1n2 r2n1 r2n2).
    """
    text = nodelist.strip()
    if not text:
        raise ConfigError("SLURM_NODELIST is empty; SLURM sets it to the job's hosts, e.g. node[01-04].")
    hosts: list[str] = []
    for item in _split_top_level(text, nodelist):
        hosts.extend(_expand_item(item, nodelist))
    return hosts


def _split_top_level(text: str, original: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"cannot read SLURM_NODELIST={original!r}: nested '['.")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"cannot read SLURM_NODELIST={original!r}: ']' without '['.")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"cannot read SLURM_NODELIST={original!r}: '[' without ']'.")
    items.append(text[start:])
    if any(not item.strip() for item in items):
        raise ConfigError(f"cannot read SLURM_NODELIST={original!r}: an empty host name between commas.")
    return [item.strip() for item in items]


def _expand_item(item: str, original: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    numbers: list[str] = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise ConfigError(f"cannot read SLURM_NODELIST={original!r}: {part!r} in [{body}] is not "
                              "a number or a range like 03-05.")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise ConfigError(f"cannot read SLURM_NODELIST={original!r}: range {part!r} runs backwards.")
        width = len(first) if first.startswith("0") else 0
        numbers.extend(str(n).zfill(width) for n in range(int(first), int(last) + 1))
    return [prefix + n + tail for n in numbers for tail in _expand_item(rest, original)]


def main() -> int:
    """Print what ``read_launch_env`` reads in this process, as one JSON line."""
    try:
        env = read_launch_env()
    except ConfigError as exc:
        print(f"ppkit: {exc}", file=sys.stderr)
        return 2
    info = asdict(env)
    info["hosts"] = list(env.hosts)
    info["pid"] = os.getpid()
    # one write() call: several processes share the launcher's pipe, and a short single write to a
    # pipe is never interleaved with another (print may write the text and the newline separately)
    sys.stdout.write(json.dumps(info) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
