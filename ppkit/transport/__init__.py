"""Lowest layer: the authenticated control channel, the worker loop and the process helpers.

Nothing here imports from ``ppkit.cluster`` or the lessons.
"""
