"""Lowest layer: the authenticated control channel and its messages, the worker loop, the fork
server and remote agent that start workers, the heartbeat between the controller and an agent
(heartbeat.py), the fresh-interpreter worker (fresh.py), and the process helpers.

Nothing here imports from ``ppkit.cluster``, the lessons or the package root (tests/test_layout.py).
"""
