"""``ppkit room --serve``: the room's progress on a page that refreshes itself, as a JupyterHub managed service.

The hub starts it (``c.JupyterHub.services``, docs/workshop.md) with JUPYTERHUB_SERVICE_PREFIX, _SERVICE_URL,
_API_TOKEN and the OAuth variables in its environment. It collects the room (ppkit.room.progress) every
``every`` seconds in a thread, and serves, behind the hub's OAuth (only users granted
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

SERVICE_ENV = ("JUPYTERHUB_SERVICE_PREFIX", "JUPYTERHUB_SERVICE_URL", "JUPYTERHUB_API_TOKEN")


class Room:
    """The latest collection: rows as JSON-ready dicts, when, and why the last try failed (if it did)."""

    def __init__(self, hub: HubClient, names, record_path: str, stuck_after: float):
        self.hub, self.names, self.record_path, self.stuck_after = hub, names, record_path, stuck_after
        self.learners: list[dict] = []
        self.collected: float | None = None
        self.error: str | None = None

    def collect(self) -> None:
        from ppkit.room.progress import collect_progress

        try:
            rows = collect_progress(self.hub, self.names, self.record_path, self.stuck_after)
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
        started = time.monotonic()
        await loop.run_in_executor(None, room.collect)
        await asyncio.sleep(max(0.5, every - (time.monotonic() - started)))


async def _main(room: Room, every: float, prefix: str, host: str, port: int) -> None:
    app = make_app(room, prefix)
    app.listen(port, host)
    print(f"ppkit room --serve: listening on {host}:{port}{prefix}, collecting every {every:g} s",
          file=sys.stderr, flush=True)
    await _collect_forever(room, every)


def serve(hub: HubClient, names, record_path: str, stuck_after: float, every: float) -> int:
    """Run as the hub's managed service until stopped; 2 when not started by a hub."""
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
    from urllib.parse import urlparse

    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    room = Room(hub, names, record_path, stuck_after)
    try:
        asyncio.run(_main(room, every, prefix, url.hostname or "127.0.0.1", url.port or 80))
    except KeyboardInterrupt:
        pass
    return 0
