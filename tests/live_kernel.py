"""Run code in a learner's running kernel (a notebook's, from /api/sessions), as a test plays the learner.

    out = await run_in_kernel(f"{hub.url}/user/ana/", token, kernel_id, "print(1)", timeout=60)  # KernelOutput
    await run_in_kernel(url, token, kernel_id, "import time; time.sleep(600)", timeout=None)      # sent, runs on

ppkit itself never does this to a learner: ``ppkit room`` starts a fresh kernel of its own
(ppkit.room.kernel_exec.run_code) or only reads files. This lives with the tests that need it.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from ppkit.room.kernel_exec import KernelOutput, channels_url, collect_output, execute_request


async def run_in_kernel(server_url: str, token: str, kernel_id: str, code: str, timeout: float | None
                        ) -> KernelOutput | None:
    """Run `code` in the kernel `kernel_id` of the server at `server_url` and collect its stdout; timeout=None
    sends the code and returns None at once (it runs on)."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    session = uuid.uuid4().hex
    conn = await websocket_connect(HTTPRequest(channels_url(server_url, kernel_id, session),
                                               headers={"Authorization": f"token {token}"}, request_timeout=60))
    try:
        if timeout is None:
            conn.write_message(json.dumps(execute_request(code, session)))
            await asyncio.sleep(0.5)  # the message is on its way before the socket closes
            return None
        return await collect_output(conn, execute_request(code, session), timeout)
    finally:
        conn.close()
