"""Run a piece of code in a fresh kernel of someone's Jupyter server, over its REST API and kernel websocket.

    out = await run_code("https://hub.example.org/user/ana/", token, "print(1 + 1)", timeout=120)
    # KernelOutput(stdout="2\n", error=None)

The kernel is started with the server's default kernel spec (the learner's own Python, with the learner's
CPU and memory limits), or the one ``kernel_name`` names, and shut down afterwards whatever happened. Uses
tornado, which every Jupyter server install has.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone


class KernelRunError(RuntimeError):
    """The server could not start a kernel, or the kernel did not answer in time."""


@dataclass(frozen=True)
class KernelOutput:
    stdout: str
    error: str | None  # "ename: evalue" when the code raised


def _execute_request(code: str, session: str) -> dict:
    return {
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "ppkit-room",
                   "session": session, "date": datetime.now(timezone.utc).isoformat(), "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    }


async def _rest(client, method: str, url: str, token: str, body: dict | None = None):
    from tornado.httpclient import HTTPClientError

    try:
        resp = await client.fetch(url, method=method, headers={"Authorization": f"token {token}"},
                                  body=json.dumps(body) if body is not None else None, request_timeout=60,
                                  allow_nonstandard_methods=True)
    except HTTPClientError as exc:
        raise KernelRunError(f"{method} {url} answered {exc.code}: {exc.message}") from exc
    except OSError as exc:
        raise KernelRunError(f"cannot reach {url} ({exc})") from exc
    return json.loads(resp.body) if resp.body else None


async def run_code(server_url: str, token: str, code: str, timeout: float,
                   kernel_name: str | None = None) -> KernelOutput:
    """Start a kernel on the server at `server_url`, run `code`, collect its stdout, shut the kernel down."""
    from tornado.httpclient import AsyncHTTPClient

    base = server_url.rstrip("/")
    client = AsyncHTTPClient(force_instance=True)
    try:
        kernel = await _rest(client, "POST", f"{base}/api/kernels", token, {"name": kernel_name} if kernel_name else {})
        try:
            return await run_in_kernel(server_url, token, kernel["id"], code, timeout)
        finally:
            try:
                await _rest(client, "DELETE", f"{base}/api/kernels/{kernel['id']}", token)
            except KernelRunError:
                pass  # the server went away with its kernels; what the code printed (or why not) matters more
    finally:
        client.close()


async def run_in_kernel(server_url: str, token: str, kernel_id: str, code: str, timeout: float | None
                        ) -> KernelOutput | None:
    """Run `code` in the running kernel `kernel_id` of the server at `server_url` (e.g. a notebook's, from
    /api/sessions) and collect its stdout; timeout=None sends the code and returns None at once (it runs on)."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    session = uuid.uuid4().hex
    ws_url = server_url.rstrip("/").replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels?session_id={session}"
    conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"},
                                               request_timeout=60))
    try:
        if timeout is None:
            conn.write_message(json.dumps(_execute_request(code, session)))
            await asyncio.sleep(0.5)  # the message is on its way before the socket closes
            return None
        return await _collect(conn, _execute_request(code, session), timeout)
    finally:
        conn.close()


async def _collect(conn, request: dict, timeout: float) -> KernelOutput:
    conn.write_message(json.dumps(request))
    msg_id = request["header"]["msg_id"]
    stdout: list[str] = []
    error = None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise KernelRunError(f"the kernel did not finish within {timeout:g} s")
        try:
            raw = await asyncio.wait_for(conn.read_message(), timeout=left)
        except asyncio.TimeoutError:
            continue  # the loop's check says so
        if raw is None:
            raise KernelRunError("the server closed the kernel's websocket before the code finished")
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["header"]["msg_type"], msg.get("content", {})
        if kind == "stream" and content.get("name") == "stdout":
            stdout.append(content.get("text", ""))
        elif kind == "error":
            error = f"{content.get('ename')}: {content.get('evalue')}"
        elif kind == "status" and content.get("execution_state") == "idle":
            return KernelOutput("".join(stdout), error)
