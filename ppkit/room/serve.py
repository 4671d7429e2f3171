"""``ppkit room --serve``: the room's progress on a page that refreshes itself, as a JupyterHub managed service.

The hub starts it (``c.JupyterHub.services``, docs/workshop.md) with JUPYTERHUB_SERVICE_PREFIX, _SERVICE_URL,
_API_TOKEN and the OAuth variables in its environment. While someone has the page open (it asked for its rows in
the last ``OPEN_S`` seconds), and only then, it collects the room (ppkit.room.progress) every ``every`` seconds in
a thread, keeping each learner's last look so that unchanged files are not fetched again and idle learners' servers
are left alone (progress_fetch.py: the room is never the reason a server escapes the idle culler). It listens on
the service URL's address, or on ``--bind`` (Z2JH: the URL names the hub's Kubernetes Service, which is no address
of the pod; bind 0.0.0.0 there). It serves, behind the hub's OAuth (only users granted
``access:services!service=<its name>`` get in; others get 403):

    {prefix}            the page (ppkit/room/live_page.py: no external resource; it fetches api/rows every 4 s)
    {prefix}api/rows    {"learners": [...], "collected": <Unix time>, "error": <why the last collection failed>}
    {prefix}oauth_callback
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import asdict

from ppkit.room.hub_api import HubClient, HubError
from ppkit.room.live_page import REFRESH_MS

SERVICE_ENV = ("JUPYTERHUB_SERVICE_PREFIX", "JUPYTERHUB_SERVICE_URL", "JUPYTERHUB_API_TOKEN")
OPEN_S = 3 * REFRESH_MS / 1000  # the page asks every REFRESH_MS: a page silent for three of those is closed


class Room:
    """The latest collection: rows as JSON-ready dicts, when, and why the last try failed (if it did); each
    learner's last look (``seen``); when the page last asked for its rows."""

    def __init__(self, hub: HubClient, names, record_path: str, stuck_after: float, idle_after: float | None = None):
        self.hub, self.names, self.record_path, self.stuck_after = hub, names, record_path, stuck_after
        self.idle_after = idle_after  # minutes; None: every learner is looked at every time
        self.learners: list[dict] = []
        self.collected: float | None = None
        self.error: str | None = None
        self.seen: dict = {}
        self.asked_at = -float("inf")  # time.monotonic() of the page's last request for rows

    def page_open(self) -> bool:
        return time.monotonic() - self.asked_at < OPEN_S

    def collect(self) -> None:
        from ppkit.room.progress import collect_progress

        try:
            rows = collect_progress(self.hub, self.names, self.record_path, self.stuck_after, seen=self.seen,
                                    idle_after=self.idle_after)
        except HubError as exc:
            self.error = str(exc)
            return
        except Exception as exc:  # noqa: BLE001 - the page says so and the next round tries again
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self.learners, self.collected, self.error = [asdict(r) for r in rows], time.time(), None

    def as_json(self) -> str:
        return json.dumps({"learners": self.learners, "collected": self.collected, "error": self.error,
                           "stuck_after_min": self.stuck_after})


def make_app(room: Room, prefix: str):
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from tornado import web

    from ppkit.room.live_page import PAGE

    class Page(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        def get(self):
            self.set_header("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; "
                            "script-src 'unsafe-inline'")
            self.set_header("Cache-Control", "no-store")
            # the hub accepts its login cookie on a script's fetch only with this token (XSRF)
            token = self.xsrf_token
            self.write(PAGE.replace("__XSRF__", json.dumps(token.decode() if isinstance(token, bytes) else token)))

    class Rows(HubOAuthenticated, web.RequestHandler):
        def get(self):  # no redirect to the login: a script fetches this; the page says to reload
            if self.current_user is None:
                raise web.HTTPError(403, "not logged in, or not allowed: reload the page")
            room.asked_at = time.monotonic()
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.write(room.as_json())

    return web.Application([
        (prefix, Page),
        (prefix + "api/rows", Rows),
        (prefix + "oauth_callback", HubOAuthCallbackHandler),
    ], cookie_secret=os.urandom(32))


async def _collect_forever(room: Room, every: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        if not room.page_open():
            await asyncio.sleep(0.25)  # nobody looks: nothing is asked of the learners' servers
            continue
        started = time.monotonic()
        await loop.run_in_executor(None, room.collect)
        await asyncio.sleep(max(0.5, every - (time.monotonic() - started)))


async def _main(room: Room, every: float, prefix: str, host: str, port: int) -> None:
    app = make_app(room, prefix)
    app.listen(port, host)
    print(f"ppkit room --serve: listening on {host}:{port}{prefix}, collecting every {every:g} s while the page "
          "is open", file=sys.stderr, flush=True)
    await _collect_forever(room, every)


def listen_address(service_url: str, bind: str | None) -> tuple[str, int]:
    """Where to listen: ``bind`` ("HOST" or "HOST:PORT", e.g. "0.0.0.0"; an IPv6 address bare, "::", or in brackets,
    "[::]:10101") over JUPYTERHUB_SERVICE_URL's host and port (the port 80 when the URL names none)."""
    from urllib.parse import urlparse

    url = urlparse(service_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    if bind:
        if bind.startswith("["):
            named, _, after = bind[1:].partition("]")
            named_port = after.removeprefix(":")
        else:
            named, _, named_port = bind.rpartition(":") if bind.count(":") == 1 else (bind, "", "")
        if named_port and not named_port.isdigit():
            raise ValueError(f"--bind {bind!r}: the port after ':' must be a number, e.g. 0.0.0.0:10101")
        host, port = named or host, int(named_port) if named_port else port
    return host, port


def serve(hub: HubClient, names, record_path: str, stuck_after: float, every: float, idle_after: float | None = None,
          bind: str | None = None) -> int:
    """Run as the hub's managed service until stopped; 2 when not started by a hub, or it cannot listen."""
    missing = [name for name in SERVICE_ENV if not os.environ.get(name)]
    if missing:
        print(f"ppkit room --serve: {', '.join(missing)} not set: it runs as a JupyterHub service, which the hub "
              "starts with these (c.JupyterHub.services with a 'command', see docs/workshop.md: The live view "
              "of the room). For a one-off look, `ppkit room --progress` prints the same table.", file=sys.stderr)
        return 2
    try:
        import jupyterhub.services.auth  # noqa: F401 - the hub's OAuth, for make_app
    except ImportError as exc:
        print(f"ppkit room --serve: cannot import jupyterhub ({exc}): the service uses the hub's OAuth; run it "
              "with a Python that has jupyterhub (the hub's, or the learners' environment on TLJH)", file=sys.stderr)
        return 2
    try:
        host, port = listen_address(os.environ["JUPYTERHUB_SERVICE_URL"], bind)
    except ValueError as exc:
        print(f"ppkit room --serve: {exc}", file=sys.stderr)
        return 2
    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    room = Room(hub, names, record_path, stuck_after, idle_after)
    try:
        asyncio.run(_main(room, every, prefix, host, port))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"ppkit room --serve: cannot listen on {host}:{port} ({exc}). When the service URL names another "
              "machine's address, as Z2JH's http://hub:PORT names the hub's Kubernetes Service, pass --bind 0.0.0.0 "
              "(docs/workshop.md: The live view of the room)", file=sys.stderr)
        return 2
    return 0
