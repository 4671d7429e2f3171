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


def execute_request(code: str, session: str) -> dict:
    """The Jupyter message that runs `code` (messaging protocol 5.3, as JupyterLab sends it)."""
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
            return await _execute(server_url, token, kernel["id"], code, timeout)
        finally:
            try:
                await _rest(client, "DELETE", f"{base}/api/kernels/{kernel['id']}", token)
            except KernelRunError:
                pass  # the server went away with its kernels; what the code printed (or why not) matters more
    finally:
        client.close()


async def _execute(server_url: str, token: str, kernel_id: str, code: str, timeout: float) -> KernelOutput:
    """Run `code` in run_code's fresh kernel `kernel_id` over its websocket and collect its stdout."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    session = uuid.uuid4().hex
    conn = await websocket_connect(HTTPRequest(channels_url(server_url, kernel_id, session),
                                               headers={"Authorization": f"token {token}"}, request_timeout=60))
    try:
        return await collect_output(conn, execute_request(code, session), timeout)
    finally:
        conn.close()


def channels_url(server_url: str, kernel_id: str, session: str) -> str:
    """The kernel's websocket on the server (ws:// or wss:// as the server's http:// or https://)."""
    return server_url.rstrip("/").replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels?session_id={session}"


async def collect_output(conn, request: dict, timeout: float) -> KernelOutput:
    """Send `request` on the kernel websocket `conn`; its stdout and error once the kernel is idle again."""
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
