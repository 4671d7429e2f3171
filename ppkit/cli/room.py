"""``ppkit room``: run ``ppkit preflight --json`` in every learner's server on a JupyterHub; one table."""

from __future__ import annotations

import os
import sys

HELP = "instructor: every JupyterHub learner's preflight in one table (who is not ready, and why)"


def add_arguments(parser) -> None:
    parser.add_argument("--hub-url", required=True, help="the hub's address as learners open it, "
                        "e.g. https://hub.example.org or http://127.0.0.1:8000")
    parser.add_argument("--token", default=os.environ.get("JUPYTERHUB_API_TOKEN"),
                        help="an admin's API token (the hub's Token page); default: $JUPYTERHUB_API_TOKEN")
    parser.add_argument("--users", nargs="+", metavar="NAME", help="only these users (default: every "
                        "non-admin user)")
    parser.add_argument("--start", action="store_true", help="start the servers that are not running first")
    parser.add_argument("--parallel", type=int, default=4, help="preflights at once (default 4): each starts "
                        "2 ranks and an RPC world on the hub's machine")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per learner (default 180)")
    parser.add_argument("--json", action="store_true", help="print the rows and every learner's report as JSON")
    parser.epilog = "Exit status 0 when every learner is ready (warnings allowed), 1 otherwise, 2 on a bad call."


def main(args) -> int:
    from ppkit.room.collect import collect
    from ppkit.room.hub_api import HubClient, HubError
    from ppkit.room.table import as_json, render

    if not args.token:
        print("ppkit room: no token: pass --token or set JUPYTERHUB_API_TOKEN (an admin makes one on the "
              "hub's Token page, /hub/token)", file=sys.stderr)
        return 2
    try:
        rows = collect(HubClient(args.hub_url, args.token), names=args.users, start=args.start,
                       parallel=args.parallel, timeout=args.timeout)
    except HubError as exc:
        print(f"ppkit room: {exc}", file=sys.stderr)
        return 2
    print(as_json(rows) if args.json else render(rows))
    return 0 if rows and all(r.ready for r in rows) else 1
