"""In the isolated kernel, a package install or a connection that fails says why: the kernel has no network.

Loaded as an IPython extension by the isolated kernelspec (``--ext ppkit.kernel.offline``). It wraps
the shell's ``system``, which both ``!pip install x`` and ``%pip install x`` go through: the command
runs as usual (an install from a local folder or wheel still works), and when one that installs or
downloads fails, a message below pip's own says what happened and what to do. A cell that fails for
want of a network (in the kernel, or on a rank: its error comes back with the rank's traceback) gets a
note below the traceback: no network here, by design (docs/isolation.md).
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

# what a connection or a name lookup says where there is no route out (the isolated kernel's network has only lo)
NO_ROUTE = ("Network is unreachable", "Temporary failure in name resolution", "Name or service not known",
            "No address associated with hostname")
NO_NETWORK = (
    "ppkit: this failed for want of a network, by design: this notebook runs in the kernel {name!r}, whose network, "
    "and so its ranks' (ppkit.start, ppkit.spawn, %%torchrun), is a private loopback that no other user of this "
    "machine can reach and that reaches nothing outside (docs/isolation.md). Download what you need from a terminal "
    "(File > New > Terminal) into a folder and read it from there, or use the ordinary Python 3 kernel (Kernel > "
    "Change Kernel), whose ranks have a network.")


def lost_for_want_of_network(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a connection or lookup that found no route out."""
    seen = 0
    while exc is not None and seen < 10:
        if any(words in str(exc) for words in NO_ROUTE):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


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

    def after(result) -> None:
        if lost_for_want_of_network(result.error_in_exec):
            print(NO_NETWORK.format(name=DISPLAY_NAME), file=sys.stderr, flush=True)

    shell.events.register("post_run_cell", after)
