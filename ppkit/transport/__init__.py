"""Lowest layer: the authenticated control channel and its messages, the worker loop, the fork
server and remote agent that start workers, and the process helpers.

Nothing here imports from ``ppkit.cluster``, the lessons or the package root (tests/test_layout.py).
"""
