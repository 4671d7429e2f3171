"""The isolated Jupyter kernel: a kernel started in a private user+network namespace, talking to
Jupyter over Unix sockets (the ``ipc`` transport) in a folder only its user can open.

On a machine shared by several Unix users (a JupyterHub with a user per learner), torch's listeners
accept anyone who connects, and an RPC world (``ppkit.start_rpc``) makes the kernel itself rank 0,
so it cannot be moved into a private network once it runs (docs/isolation.md). Started in one, the
kernel holds the whole world, kernel included, where no other user can reach it.

- ``netns.py``: ``python -m ppkit.kernel.netns -- COMMAND...`` runs COMMAND in a private network;
- ``provisioner.py``: Jupyter's side: the ipc transport, sockets in a 0700 folder;
- ``kernelspec.py``: ``ppkit kernel install --isolated`` writes the kernelspec that uses both;
- ``offline.py``: in that kernel, ``!pip install`` and ``%pip install`` say why they cannot work.
"""

DISPLAY_NAME = "Python 3 (ppkit, isolated, no network)"
KERNEL_NAME = "ppkit-isolated"
PROVISIONER = "ppkit-isolated-provisioner"  # its entry point (pyproject.toml)
