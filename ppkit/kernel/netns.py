"""``python -m ppkit.kernel.netns -- COMMAND...``: run COMMAND in a private user+network namespace.

The isolated kernelspec's argv (kernelspec.py) starts ipykernel this way. The namespace is made here,
while this interpreter still has a single thread, as the fork server makes its own
(ppkit/transport/private_net.py); ``exec`` then keeps it for the kernel and everything the kernel
starts. A machine that refuses one stops the start with the reason, rather than run the kernel on
the machine's network under a name that says it is isolated.
"""

from __future__ import annotations

import os
import sys

from ppkit.kernel import DISPLAY_NAME
from ppkit.transport import private_net

OFFLINE_ENV = {"PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}  # pip fails in a second, not after five retries


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        print("usage: python -m ppkit.kernel.netns -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    refused = private_net.enter(outbound=False)  # no network, by design: no way out either
    if refused is not None:
        print(f"ppkit: the kernel {DISPLAY_NAME!r} did not start: this machine refused it a private network "
              f"({refused}). Unprivileged user namespaces must be allowed (docs/isolation.md, 'When the machine "
              "refuses'); until then use the ordinary Python 3 kernel.", file=sys.stderr, flush=True)
        return 1
    os.environ.update(OFFLINE_ENV)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"ppkit: could not run {command[0]!r} in the private network: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
