"""``ppkit kernel install --isolated``: install the isolated Jupyter kernel (ppkit/kernel/)."""

from __future__ import annotations

HELP = "install the Jupyter kernel 'Python 3 (ppkit, isolated, no network)' for a machine shared by several users"


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["install"], help="what to do (install the kernelspec)")
    parser.add_argument("--isolated", action="store_true", required=True,
                        help="the kernel runs in a private network of its own and talks to Jupyter over Unix "
                             "sockets in a folder only you can open: no other user of this machine can reach "
                             "what it starts, an RPC world included. It has no network: !pip install fails there")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user only (~/.local/share/jupyter/kernels)")
    where.add_argument("--sys-prefix", action="store_true", help="in this Python environment (a course's venv)")
    where.add_argument("--prefix", help="under this prefix (PREFIX/share/jupyter/kernels)")


def main(args) -> int:
    from ppkit.kernel import DISPLAY_NAME
    from ppkit.kernel.kernelspec import install

    folder = install(user=args.user, prefix=args.prefix, sys_prefix=args.sys_prefix)
    print(f"Installed the kernel {DISPLAY_NAME!r} in {folder}. In JupyterLab: Kernel > Change Kernel.")
    return 0
