"""``ppkit room``: every learner's ``ppkit preflight --json`` on a JupyterHub, gathered into one table.

The instructor's hub API token (an admin's, from the hub's Token page, or a service's with the scopes
``list:users``, ``read:users``, ``read:servers``, ``access:servers`` and, for ``--start``, ``admin:servers``)
lists the users (:mod:`ppkit.room.hub_api`); for each running server a fresh kernel is started through the
hub's proxy, runs the preflight there, as that learner with that learner's limits, and is shut down again
(:mod:`ppkit.room.kernel_exec`); :mod:`ppkit.room.collect` turns each answer into a row and
:mod:`ppkit.room.table` prints them, not-ready learners first.

``ppkit room --progress`` reads each learner's progress record (ppkit/progress/) and open notebooks through their
server instead, no kernel started (:mod:`ppkit.room.progress`); ``--serve`` shows it live as a hub service
(:mod:`ppkit.room.serve`).
"""
