"""The few JupyterHub REST calls ``ppkit room`` makes: list the users and their default servers, start one.

    hub = HubClient("https://hub.example.org", token)
    for user in hub.users():          # LearnerServer(name="ana", url="https://hub.example.org/user/ana/", ...)
        ...

Only the standard library: an instructor's machine needs nothing but ppkit to run it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime

PAGINATION = "application/jupyterhub-pagination+json"


def timestamp(iso) -> float | None:
    """An ISO 8601 time as JupyterHub and jupyter_server write it ("2026-11-29T04:41:01.123Z") as Unix time;
    None when there is none or it is not one."""
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else None
    except (AttributeError, ValueError):
        return None


class HubError(RuntimeError):
    """The hub could not be reached, refused the token, or answered something unexpected."""


@dataclass(frozen=True)
class LearnerServer:
    name: str
    url: str | None  # the default server's public URL, None when it is not running
    ready: bool
    pending: str | None  # "spawn" or "stop" while the hub is doing that
    admin: bool
    last_activity: float | None = None  # the hub's last activity of the server (Unix time), None when not given


class HubClient:
    def __init__(self, hub_url: str, token: str, timeout: float = 30.0):
        self.base = hub_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def request(self, method: str, path: str, body: dict | None = None, accept: str = "application/json"):
        """Call {hub}/hub/api{path}; the decoded JSON answer, or None for an empty one."""
        url = f"{self.base}/hub/api{path}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}", "Accept": accept})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            hint = ""
            if exc.code in (401, 403):
                hint = " " + self._refusal(path)
            elif exc.code == 404:
                hint = (f" No JupyterHub API there: is --hub-url ({self.base}) the hub's address, the one "
                        "learners open (e.g. https://hub.example.org)?")
            raise HubError(f"{method} {url} answered {exc.code} {exc.reason}: {detail}.{hint}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise HubError(f"cannot reach the hub at {url} ({exc}); check --hub-url (the address learners "
                           "open, e.g. https://hub.example.org)") from exc
        return json.loads(raw) if raw else None

    def _refusal(self, path: str) -> str:
        """Why the hub refused the token: unknown to it, or known but without a scope (GET /hub/api/user)."""
        if path == "/user":
            return ("The hub does not know this token (mistyped, expired or revoked): make a new one on the "
                    "hub's Token page (/hub/token) or use the service's JUPYTERHUB_API_TOKEN.")
        try:
            owner = self.request("GET", "/user")
        except HubError as exc:
            if " 403 " in str(exc) or " 401 " in str(exc):
                return ("The hub does not know this token (mistyped, expired or revoked): make a new one on "
                        "the hub's Token page (/hub/token) or use the service's JUPYTERHUB_API_TOKEN.")
            return f"(asking the hub whose token it is failed too: {exc})"
        who = f"{owner.get('kind', 'user')} {owner.get('name')!r}" if isinstance(owner, dict) else "its owner"
        has = sorted(owner.get("scopes") or []) if isinstance(owner, dict) else []
        return (f"The token is {who}'s, which lacks a scope this needs: give it list:users, read:users, "
                f"read:servers and access:servers (a role in the hub's config), or use an admin's token. "
                f"It has: {has}.")

    def users(self) -> list[LearnerServer]:
        """Every user with the state of their default server, by name, all pages."""
        found, offset = [], 0
        while True:
            page = self.request("GET", f"/users?offset={offset}&limit=200", accept=PAGINATION)
            items = page["items"] if isinstance(page, dict) else page  # a hub older than 2.0 sends a list
            if any("servers" not in user for user in items):  # filtered out of the model by the token's scopes
                raise HubError(f"the hub at {self.base} lists its users but not their servers to this token: give "
                               "it the scope read:servers as well (with list:users, read:users, access:servers), "
                               "or use an admin's token")
            found += [self._server_of(user) for user in items]
            following = page.get("_pagination", {}).get("next") if isinstance(page, dict) else None
            if not following:
                return sorted(found, key=lambda user: user.name)
            offset = following["offset"]

    def _server_of(self, user: dict) -> LearnerServer:
        server = (user.get("servers") or {}).get("")
        if server is None:
            return LearnerServer(user["name"], None, False, user.get("pending"), bool(user.get("admin")))
        url = urllib.parse.urljoin(self.base + "/", server["url"].lstrip("/"))
        return LearnerServer(user["name"], url, bool(server.get("ready")), server.get("pending"),
                             bool(user.get("admin")), timestamp(server.get("last_activity")))

    def start_server(self, name: str, timeout: float = 300.0) -> LearnerServer:
        """Start a user's default server (as the admin page's Start button does) and wait until it is ready."""
        try:
            self.request("POST", f"/users/{urllib.parse.quote(name)}/server")
        except HubError as exc:
            if "400" not in str(exc):  # 400: already running, which is what we want
                raise
        deadline = time.monotonic() + timeout
        while True:
            user = self._server_of(self.request("GET", f"/users/{urllib.parse.quote(name)}"))
            if user.ready or time.monotonic() > deadline:
                return user
            time.sleep(1.0)
