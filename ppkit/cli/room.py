"""``ppkit room``: every learner of a JupyterHub in one table: their preflight (default), or their progress
(``--progress``, ``--json``, ``--csv``), or a live page of it (``--serve``, as a hub service)."""

from __future__ import annotations

import os
import shutil
import sys

HELP = "instructor: every JupyterHub learner's preflight, or progress (--progress, --serve), in one table"


def add_arguments(parser) -> None:
    parser.add_argument("--hub-url", required=True, help="the hub's address as learners open it, "
                        "e.g. https://hub.example.org or http://127.0.0.1:8000")
    parser.add_argument("--token", default=os.environ.get("JUPYTERHUB_API_TOKEN"),
                        help="an admin's API token (the hub's Token page); default: $JUPYTERHUB_API_TOKEN")
    parser.add_argument("--users", nargs="+", metavar="NAME", help="only these users (default: every "
                        "non-admin user)")
    parser.add_argument("--start", action="store_true", help="start the servers that are not running first")
    parser.add_argument("--parallel", type=int, default=None, help="learners at once (default: 4 preflights, "
                        "each starts 2 ranks and an RPC world on the hub's machine; 16 progress fetches)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per learner (default 180 for a "
                        "preflight, 10 per request for --progress)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    progress = parser.add_argument_group("progress (the learners' records, read through their servers)")
    progress.add_argument("--progress", action="store_true", help="each learner's exercises, open notebooks, "
                          "busy kernels, last error, cluster and preflight; stuck learners first")
    progress.add_argument("--csv", action="store_true", help="with --progress: one CSV line per learner x "
                          "exercise (attempts, first try, minutes to pass, last failure) on stdout, and a "
                          "per-exercise summary on stderr")
    progress.add_argument("--stuck-after", type=float, default=5.0, metavar="MIN", help="a failed check with "
                          "no pass since, or a kernel busy, for this many minutes makes a learner stuck (5)")
    progress.add_argument("--record-path", default="ppkit-progress", help="the record folder relative to "
                          "the learners' server root (default ppkit-progress: ~/ppkit-progress, or its link under a "
                          "root inside the home); {username} is each learner's name, for a root they share")
    progress.add_argument("--serve", action="store_true", help="run the live page as a JupyterHub service "
                          "(see docs/workshop.md: The live view of the room)")
    progress.add_argument("--every", type=float, default=4.0, help="with --serve: seconds between "
                          "collections while the page is open (4)")
    progress.add_argument("--idle-after", type=float, default=2.0, metavar="MIN", help="with --serve: a learner "
                          "whose server did nothing for this long is not asked again until the hub sees her "
                          "active, so the idle culler can stop it (2)")
    progress.add_argument("--bind", metavar="HOST[:PORT]", help="with --serve: listen there instead of on "
                          "JUPYTERHUB_SERVICE_URL's address (Z2JH: 0.0.0.0)")
    parser.epilog = ("Exit status 0 when every learner is ready (preflight) or none is stuck (--progress), "
                     "1 otherwise, 2 on a bad call.")


def main(args) -> int:
    from ppkit.room.hub_api import HubClient, HubError

    if not args.token:
        print("ppkit room: no token: pass --token or set JUPYTERHUB_API_TOKEN (an admin makes one on the "
              "hub's Token page, /hub/token)", file=sys.stderr)
        return 2
    if args.start and (args.progress or args.serve):
        print("ppkit room: --start is for the preflight (it starts servers to run it in); --progress and --serve "
              "only read what the running servers hold", file=sys.stderr)
        return 2
    if args.csv and not args.progress:
        print("ppkit room: --csv prints the progress records: add --progress", file=sys.stderr)
        return 2
    hub = HubClient(args.hub_url, args.token)
    try:
        if args.serve:
            from ppkit.room.serve import serve

            return serve(hub, args.users, args.record_path, args.stuck_after, args.every, args.idle_after,
                         args.bind)
        if args.progress:
            return _progress(hub, args)
        from ppkit.room.collect import collect
        from ppkit.room.table import as_json, render

        rows = collect(hub, names=args.users, start=args.start, parallel=args.parallel or 4,
                       timeout=args.timeout or 180.0)
    except HubError as exc:
        print(f"ppkit room: {exc}", file=sys.stderr)
        return 2
    print(as_json(rows) if args.json else render(rows))
    return 0 if rows and all(r.ready for r in rows) else 1


def _progress(hub, args) -> int:
    from ppkit.room.progress import collect_progress
    from ppkit.room.progress_table import as_csv, as_json, exercise_summary, render

    rows = collect_progress(hub, names=args.users, record_path=args.record_path, stuck_after=args.stuck_after,
                            timeout=args.timeout or 10.0, parallel=args.parallel or 16)
    if args.csv:
        print(as_csv(rows), end="")
        print(exercise_summary(rows), file=sys.stderr)
    else:
        print(as_json(rows) if args.json else render(rows, width=shutil.get_terminal_size((160, 24)).columns))
    return 1 if any(r.state == "stuck" for r in rows) else 0
