"""In the isolated kernel, a package install that fails says why: the kernel has no network.

Loaded as an IPython extension by the isolated kernelspec (``--ext ppkit.kernel.offline``). It wraps
the shell's ``system``, which both ``!pip install x`` and ``%pip install x`` go through: the command
runs as usual (an install from a local folder or wheel still works), and when one that installs or
downloads fails, a message below pip's own says what happened and what to do.
"""

from __future__ import annotations

import re
import sys

from ppkit.kernel import DISPLAY_NAME

NEEDS_NETWORK = re.compile(r"(^|[\s/;&|])(pip3?|conda|mamba|micromamba|uv)(\s+pip)?\s+(install|download)\b"
                           r"|(^|[\s/;&|])-m\s+pip\s+(install|download)\b|(^|[\s/;&|])(wget|curl|git\s+clone)\b")
MESSAGE = (
    "ppkit: this notebook runs in the kernel {name!r}, which has no network: it runs in a private network "
    "of its own so that no other user of this machine can reach what it starts (an RPC world included; "
    "docs/isolation.md). `{command}` failed, and here it cannot reach the internet. Install from a terminal instead "
    "(File > New > Terminal: the same user and the same Python, e.g. `{python} -m pip install ...`), then "
    "restart this kernel: what you installed is seen here too.")


def needs_network(command: str) -> bool:
    return NEEDS_NETWORK.search(command) is not None


def explain(command: str) -> str:
    return MESSAGE.format(name=DISPLAY_NAME, command=" ".join(command.split())[:80], python=sys.executable)


def load_ipython_extension(shell) -> None:
    plain = shell.system

    def system(cmd, *args, **kwargs):
        result = plain(cmd, *args, **kwargs)
        if needs_network(str(cmd)) and shell.user_ns.get("_exit_code", 0) != 0:
            print(explain(str(cmd)), file=sys.stderr, flush=True)
        return result

    shell.system = system
