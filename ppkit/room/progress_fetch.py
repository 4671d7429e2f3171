"""Fetch each learner's progress record and open notebooks through their own Jupyter server, no kernel started.

    fetched = fetch_room(hub.users(), token, record_path="ppkit-progress")
    # [Fetched(user="ana", server="running", texts={"record.jsonl": "...", "record.old.jsonl": None},
    #          sessions=[{...}], problems=[], now=1764240000.0), ...]

Per learner, through the hub's proxy with a token scoped ``access:servers``: ``GET /user/NAME/api/status`` (the
server's own last activity), ``/api/sessions``, the record folder's listing (``/api/contents/ppkit-progress``:
names, sizes, times) and each record file that is not over ``MAX_RECORD_BYTES`` and not unchanged since the last
look (``?type=file&format=text&content=1``). Learners are fetched in parallel (threads: each waits on the network)
within one timeout per learner, shared by that learner's requests; whatever goes wrong with one learner is written
into that learner's ``Fetched`` and never stops the others. Only the standard library, like hub_api.py.

Never the reason a server stays up (the idle culler stops a server whose hub-side last_activity is old). Each
request carries ``no_track_activity=1``, so jupyter_server does not count it as the learner's activity (its
``APIHandler.update_api_activity``); the proxy still does (configurable-http-proxy records any proxied answer under
300 as the route's activity, which the hub copies every ``last_activity_interval``). So, given the last look
(``seen``) and ``idle_after``, a learner whose server's own activity is older than that is not asked again until the
hub reports her server active after that look: her last row is kept, marked idle.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from email.utils import parsedate_to_datetime

from ppkit.room.hub_api import LearnerServer, timestamp

RECORD_FILES = ("record.old.jsonl", "record.jsonl")  # oldest first: the order their events happened
# The writer keeps each file under 256 KiB (it rotates); more than this is not a record ppkit wrote.
MAX_RECORD_BYTES = 1024 * 1024
QUIET = "no_track_activity=1"  # jupyter_server: this request is not the learner's activity
# A contents answer is the file as a JSON string: at most ~6 bytes per byte of text (\uXXXX escapes).
_MAX_ANSWER_BYTES = 6 * MAX_RECORD_BYTES + 4096


@dataclass
class Fetched:
    user: str
    server: str  # "running", "no server" or "unreachable"
    texts: dict[str, str | None] = field(default_factory=dict)  # file name -> text; None when there is none
    sessions: list[dict] | None = None  # /api/sessions, None when it could not be read
    problems: list[str] = field(default_factory=list)  # one line each: what could not be read, and why
    now: float = 0.0  # the learner's server's clock (its Date header) when fetched: ages are measured on it
    own_activity: float | None = None  # the server's own last activity (its /api/status), on its clock
    files: dict[str, tuple] = field(default_factory=dict)  # file name -> (size, last_modified) of its text here
    looked_at: float = 0.0  # this machine's clock when the look ended
    idle_s: float | None = None  # set when this is an earlier look, kept because she is idle: her idle seconds


class _Refused(Exception):
    def __init__(self, code: int, what: str):
        super().__init__(what)
        self.code = code


def _get(url: str, token: str, deadline: float, limit: int) -> tuple[bytes, float]:
    """GET url before `deadline` (time.monotonic()); the body (at most `limit` bytes, else _Refused 413) and the
    server's Date as Unix time."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the learner's time was up before this request")
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=left) as resp:
            body = resp.read(limit + 1)
            date = resp.headers.get("Date")
    except urllib.error.HTTPError as exc:
        raise _Refused(exc.code, f"answered {exc.code} {exc.reason}") from exc
    if len(body) > limit:
        raise _Refused(413, f"answered more than {limit} bytes")
    try:
        now = parsedate_to_datetime(date).timestamp() if date else time.time()
    except (TypeError, ValueError):
        now = time.time()
    return body, now


def _why(code: int, what: str, user: str) -> str:
    if code in (401, 403):
        return (f"{what}: the token may not reach {user}'s server; give it the access:servers scope "
                "(or use an admin's token)")
    if code in (502, 503, 424):
        return f"{what}: the hub has no running server behind /user/{user}/ (it stopped or is starting)"
    return what


def left_idle(learner: LearnerServer, seen: Fetched | None, idle_after: float | None) -> bool:
    """Whether to leave the learner's server alone this time: at the last look (`seen`) her server's own activity
    was older than `idle_after` seconds, and the hub has seen no activity of her server since that look (a hub that
    reports no last_activity for her: asked, not left alone for ever)."""
    if seen is None or idle_after is None or seen.server != "running" or seen.own_activity is None:
        return False
    if seen.now - seen.own_activity < idle_after:
        return False
    return learner.last_activity is not None and learner.last_activity <= seen.looked_at + 1.0


def fetch_learner(learner: LearnerServer, token: str, record_path: str = "ppkit-progress",
                  timeout: float = 10.0, seen: Fetched | None = None, idle_after: float | None = None) -> Fetched:
    """One learner's record texts and sessions within `timeout` seconds in all; problems are described in the
    result, never raised. `record_path`: relative to her server's root; ``{username}`` in it is her name. `seen`:
    the last look at her (texts whose listing did not change are kept from it); `idle_after` (seconds): see the
    module's docstring."""
    deadline = time.monotonic() + timeout
    if learner.url is None or not learner.ready:
        state = f"the hub is busy with it ({learner.pending})" if learner.pending else "not running"
        return Fetched(learner.name, "no server", problems=[f"server {state}"], now=time.time())
    if left_idle(learner, seen, idle_after):
        now = seen.now + max(0.0, time.time() - seen.looked_at)  # her server's clock, aged since that look
        return replace(seen, now=now, idle_s=now - seen.own_activity)
    base = learner.url.rstrip("/") + "/api"
    record_path = record_path.replace("{username}", learner.name)  # a shared root: one folder per learner
    folder = urllib.parse.quote(record_path.strip("/"))
    got = Fetched(learner.name, "running", now=time.time())
    try:
        body, got.now = _get(f"{base}/status?{QUIET}", token, deadline, _MAX_ANSWER_BYTES)
        got.own_activity = timestamp(json.loads(body).get("last_activity"))
        body, got.now = _get(f"{base}/sessions?{QUIET}", token, deadline, _MAX_ANSWER_BYTES)
        got.sessions = json.loads(body)
    except _Refused as exc:
        return _unreachable(got, _why(exc.code, f"GET {base}/status and /sessions: {exc}", learner.name))
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as exc:
        return _unreachable(got, f"GET {base}/status and /sessions failed: {exc}")
    try:
        got = _record_files(got, base, folder, record_path, token, deadline, seen)
    finally:
        got.looked_at = time.time()
    return got


def _record_files(got: Fetched, base: str, folder: str, record_path: str, token: str, deadline: float,
                  seen: Fetched | None) -> Fetched:
    """The record's listing, then each file whose (size, last_modified) differs from `seen`'s."""
    try:
        body, _ = _get(f"{base}/contents/{folder}?content=1&{QUIET}", token, deadline, _MAX_ANSWER_BYTES)
        listing = {item["name"]: (item.get("size"), item.get("last_modified"))
                   for item in json.loads(body).get("content") or []}
    except _Refused as exc:
        if exc.code == 404:
            got.texts = dict.fromkeys(RECORD_FILES)  # no folder: nothing recorded yet (or recording is off)
            return got
        got.problems.append(_why(exc.code, f"the record folder {record_path}/: {exc}", got.user))
        return got
    except (urllib.error.URLError, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        got.problems.append(f"the record folder {record_path}/ could not be listed: {exc}")
        return got
    for name in RECORD_FILES:
        got.texts[name] = None
        size = listing.get(name, (-1, None))[0]
        if size is None or size < 0:
            continue
        if seen is not None and seen.files.get(name) == listing[name] and seen.texts.get(name) is not None:
            got.texts[name], got.files[name] = seen.texts[name], listing[name]  # unchanged: not fetched again
            continue
        if size > MAX_RECORD_BYTES:
            got.problems.append(f"{record_path}/{name} is {size / 2**20:.1f} MiB, over the "
                                f"{MAX_RECORD_BYTES // 2**20} MiB a ppkit record can reach: not read")
            continue
        try:
            body, _ = _get(f"{base}/contents/{folder}/{name}?type=file&format=text&content=1&{QUIET}", token,
                           deadline, _MAX_ANSWER_BYTES)
            content = json.loads(body).get("content")
            if not isinstance(content, str):
                raise ValueError("the server sent no text (is it a binary file?)")
            got.texts[name], got.files[name] = content, listing[name]
        except _Refused as exc:
            got.problems.append(_why(exc.code, f"{record_path}/{name}: {exc}", got.user))
        except (urllib.error.URLError, OSError, ValueError, AttributeError) as exc:
            got.problems.append(f"{record_path}/{name} could not be read: {exc}")
    return got


def _unreachable(got: Fetched, why: str) -> Fetched:
    got.server = "unreachable"
    got.problems.append(why)
    return got


def fetch_room(learners: list[LearnerServer], token: str, record_path: str = "ppkit-progress",
               timeout: float = 10.0, parallel: int = 16, seen: dict[str, Fetched] | None = None,
               idle_after: float | None = None) -> list[Fetched]:
    """fetch_learner for every learner, `parallel` at a time, in the order given; `seen`: the last look at each,
    by name."""
    if not learners:
        return []
    seen = seen or {}
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(learners)))) as pool:
        return list(pool.map(lambda learner: fetch_learner(learner, token, record_path, timeout,
                                                           seen.get(learner.name), idle_after), learners))
