"""Fetch each learner's progress record and open notebooks through their own Jupyter server, no kernel started.

    fetched = fetch_room(hub.users(), token, record_path="ppkit-progress")
    # [Fetched(user="ana", server="running", texts={"record.jsonl": "...", "record.old.jsonl": None},
    #          sessions=[{...}], problems=[], now=1764240000.0), ...]

Per learner, through the hub's proxy with a token scoped ``access:servers``: the record folder's listing
(``GET /user/NAME/api/contents/ppkit-progress``: names and sizes), each record file that is not over
``MAX_RECORD_BYTES`` (``?type=file&format=text&content=1``), and ``GET /user/NAME/api/sessions``. Learners are
fetched in parallel (threads: each waits on the network) within one timeout per learner, shared by that learner's
requests; whatever goes wrong with one learner is written into that learner's ``Fetched`` and never stops the
others. Only the
standard library, like hub_api.py.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

from ppkit.room.hub_api import LearnerServer

RECORD_FILES = ("record.old.jsonl", "record.jsonl")  # oldest first: the order their events happened
# The writer keeps each file under 256 KiB (it rotates); more than this is not a record ppkit wrote.
MAX_RECORD_BYTES = 1024 * 1024
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


def fetch_learner(learner: LearnerServer, token: str, record_path: str = "ppkit-progress",
                  timeout: float = 10.0) -> Fetched:
    """One learner's record texts and sessions within `timeout` seconds in all; problems are described in the
    result, never raised."""
    deadline = time.monotonic() + timeout
    if learner.url is None or not learner.ready:
        state = f"the hub is busy with it ({learner.pending})" if learner.pending else "not running"
        return Fetched(learner.name, "no server", problems=[f"server {state}"], now=time.time())
    base = learner.url.rstrip("/") + "/api"
    folder = urllib.parse.quote(record_path.strip("/"))
    got = Fetched(learner.name, "running", now=time.time())
    try:
        body, got.now = _get(f"{base}/sessions", token, deadline, _MAX_ANSWER_BYTES)
        got.sessions = json.loads(body)
    except _Refused as exc:
        return _unreachable(got, _why(exc.code, f"GET {base}/sessions {exc}", learner.name))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return _unreachable(got, f"GET {base}/sessions failed: {exc}")
    try:
        body, _ = _get(f"{base}/contents/{folder}?content=1", token, deadline, _MAX_ANSWER_BYTES)
        listing = {item["name"]: item.get("size") for item in json.loads(body).get("content") or []}
    except _Refused as exc:
        if exc.code == 404:
            got.texts = dict.fromkeys(RECORD_FILES)  # no folder: nothing recorded yet (or recording is off)
            return got
        got.problems.append(_why(exc.code, f"the record folder {record_path}/: {exc}", learner.name))
        return got
    except (urllib.error.URLError, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        got.problems.append(f"the record folder {record_path}/ could not be listed: {exc}")
        return got
    for name in RECORD_FILES:
        got.texts[name] = None
        size = listing.get(name, -1)
        if size is None or size < 0:
            continue
        if size > MAX_RECORD_BYTES:
            got.problems.append(f"{record_path}/{name} is {size / 2**20:.1f} MiB, over the "
                                f"{MAX_RECORD_BYTES // 2**20} MiB a ppkit record can reach: not read")
            continue
        try:
            body, _ = _get(f"{base}/contents/{folder}/{name}?type=file&format=text&content=1", token, deadline,
                           _MAX_ANSWER_BYTES)
            content = json.loads(body).get("content")
            if not isinstance(content, str):
                raise ValueError("the server sent no text (is it a binary file?)")
            got.texts[name] = content
        except _Refused as exc:
            got.problems.append(_why(exc.code, f"{record_path}/{name}: {exc}", learner.name))
        except (urllib.error.URLError, OSError, ValueError, AttributeError) as exc:
            got.problems.append(f"{record_path}/{name} could not be read: {exc}")
    return got


def _unreachable(got: Fetched, why: str) -> Fetched:
    got.server = "unreachable"
    got.problems.append(why)
    return got


def fetch_room(learners: list[LearnerServer], token: str, record_path: str = "ppkit-progress",
               timeout: float = 10.0, parallel: int = 16) -> list[Fetched]:
    """fetch_learner for every learner, `parallel` at a time, in the order given."""
    if not learners:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(learners)))) as pool:
        return list(pool.map(lambda learner: fetch_learner(learner, token, record_path, timeout), learners))
