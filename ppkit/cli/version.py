"""``ppkit version``: the versions that matter when two machines must agree."""

HELP = "print the Python, torch and ppkit versions"


def add_arguments(parser) -> None:
    pass


def main(args) -> int:
    import platform

    import torch

    import ppkit

    print(f"python {platform.python_version()}  torch {torch.__version__}  ppkit {ppkit.__version__}")
    return 0
