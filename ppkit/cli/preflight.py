"""``ppkit preflight``: check this machine for the course, one line per check, then a summary line."""

from __future__ import annotations

HELP = "check this machine for the course in a minute: versions, widgets, cores, ports, cluster, RPC, pipeline"


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (every check, the summary, user and host) on stdout; the "
                             "check lines go to stderr. `ppkit room` collects it from every learner of a hub")
    parser.epilog = ("The last line is one an instructor can collect, e.g. "
                     "'ppkit preflight: 11/11 ok (python 3.11.7, torch 2.14.1, linux, 2 cores)'. "
                     "Exit status 0 when no check failed (warnings allowed), 1 otherwise.")


def main(args) -> int:
    if args.json:
        from ppkit.preflight_report import run_report

        report = run_report()
        print(report.to_json(), flush=True)
        return 0 if report.ok else 1
    from ppkit.preflight import main as preflight

    return preflight()
