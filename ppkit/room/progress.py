"""``ppkit room --progress``: every learner's progress record and open notebooks, one row each, in seconds.

    rows = collect_progress(HubClient(url, token), stuck_after=5)   # list[ProgressRow], stuck first

progress_fetch.py reads each learner's record and sessions through their own server (no kernel started),
progress_rows.py makes a row of it (the record parsed by ppkit.progress.read), progress_table.py prints them,
serve.py shows them on a live page.
"""

from __future__ import annotations

from ppkit.room.hub_api import HubClient
from ppkit.room.progress_fetch import Fetched, fetch_room
from ppkit.room.progress_rows import ProgressRow, row_of, sort_rows


def collect_progress(hub: HubClient, names: list[str] | None = None, record_path: str = "ppkit-progress",
                     stuck_after: float = 5.0, timeout: float = 10.0, parallel: int = 16,
                     seen: dict[str, Fetched] | None = None, idle_after: float | None = None) -> list[ProgressRow]:
    """A row for each user of the hub (or each of `names`), admins left out unless named; stuck first.

    timeout: seconds per learner's server; parallel: learners fetched at once. seen: the last look at each
    learner, by name, updated here (the live page keeps it: unchanged files are not fetched again); idle_after:
    minutes after which an idle learner's server is left alone (progress_fetch.py says why).
    """
    users = hub.users()
    known = {u.name for u in users}
    missing = [Fetched(name, "unreachable", problems=["no such user on this hub"]) for name in names or []
               if name not in known]
    users = [u for u in users if (u.name in names if names else not u.admin)]
    fetched = missing + fetch_room(users, hub.token, record_path, timeout, parallel, seen,
                                   None if idle_after is None else idle_after * 60)
    if seen is not None:
        seen.update({f.user: f for f in fetched})
    return sort_rows([row_of(f, stuck_after) for f in fetched])
