"""``python tests/isolated_kernel_driver.py``: start the isolated kernel as JupyterLab's server does
(jupyter_server's AsyncMappingKernelManager, the kernelspec found on JUPYTER_PATH), run the cells of
``CELLS`` in it, shut it down, and print one JSON line: what each cell printed, and what the server
side saw (transport, the socket folder's mode, the kernel's network namespace, what was left)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

CELLS = {
    "where": "import os, socket, ppkit\nprint(socket.if_nameindex(), os.getpid())",
    "start": ("c = ppkit.start(2)\npids = c.run(lambda rank, world_size: os.getpid())\n"
              "same = {os.readlink(f'/proc/{p}/ns/net') for p in pids} == {os.readlink('/proc/self/ns/net')}\n"
              "print(c.isolation, '|', c.run(lambda rank, world_size: rank * 10), '|', same)\nc.close()"),
    "spawn": ("from ppkit.cluster.spawn import call\n"
              "def hello(rank, world_size):\n    import torch.distributed as dist\n"
              "    return None\n"
              "ppkit.spawn(hello, args=(2,), nprocs=2)\nprint(call._kept[(2, 'auto')].isolation)\ncall.close()"),
    "rpc": ("from torch.distributed import rpc\nw = ppkit.start_rpc(2)\n"
            "print(w.isolation, '|', rpc.rpc_sync('worker1', max, args=(3, 4)))\nw.close()"),
    "pip": "!pip install --retries 0 --timeout 2 ppkit-no-such-package",
    "preflight": "from ppkit.cluster import isolation\nprint(isolation.kernel_words())",
}


async def main() -> dict:
    mkm = AsyncMappingKernelManager()
    kernel_id = await mkm.start_kernel(kernel_name="ppkit-isolated")
    km = mkm.get_kernel(kernel_id)
    folder = os.path.dirname(km.ip)
    seen = {"transport": km.transport, "connection": json.load(open(km.connection_file))["transport"],
            "folder_mode": oct(os.stat(folder).st_mode & 0o777)}
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    seen["sockets"] = sorted(os.listdir(folder))
    said = {}
    for name, code in CELLS.items():
        out: list[str] = []

        def hook(msg, out=out):
            content = msg["content"]
            out.append(content.get("text", "") or "\n".join(content.get("traceback", [])))

        await kc.execute_interactive(code, timeout=180, output_hook=hook)
        said[name] = "".join(out)
    pid = int(said["where"].split()[-1])
    seen["kernel_netns"] = os.readlink(f"/proc/{pid}/ns/net")
    await mkm.restart_kernel(kernel_id)  # Kernel > Restart: the same folder and socket names, a new namespace
    await kc.wait_for_ready(timeout=120)
    out = []
    await kc.execute_interactive(CELLS["where"], timeout=60, output_hook=lambda msg: out.append(
        msg["content"].get("text", "")))
    seen["restarted"] = {"said": "".join(out), "folder": os.path.dirname(km.ip) == folder,
                         "old_kernel_left": os.path.exists(f"/proc/{pid}")}
    pid = int("".join(out).split()[-1])
    kc.stop_channels()
    await mkm.shutdown_kernel(kernel_id)
    seen["folder_left"] = os.path.exists(folder)
    seen["kernel_left"] = os.path.exists(f"/proc/{pid}")
    return {"said": said, "seen": seen, "server_netns": os.readlink("/proc/self/ns/net")}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())), flush=True)
    sys.exit(0)
