"""The learner's progress record: what ppkit writes about the learner's own work, in their home.

    ppkit-progress/record.jsonl       exercise checks, ppkit errors raised in cells, each ppkit.spawn /
    ppkit-progress/record.old.jsonl   %%torchrun job's state, preflight verdicts: one JSON line each

in the home, for every process of the learner; under a Jupyter server rooted inside the home, ``<root>/ppkit-progress``
links to it, so that the server's contents API reaches it (format.record_dir, place.py).
It is the one store of the learner's checks (workbook.progress and ``ppkit exercises`` read it too).

``ppkit progress`` prints it; ``ppkit progress --off`` (or ``PPKIT_RECORD=off``) stops it. The kernel
never sends it anywhere: an instructor's ``ppkit room --progress`` reads the files through the learner's
own Jupyter server. format.py is the format, record.py the writer, read.py the reader (summary.py: what
the events add up to), hooks.py what records (called from the exercises, the cluster and preflight; the
cluster imports it only inside the functions that record), table.py the learner's view (``ppkit progress``).
"""

from __future__ import annotations

import sys

_failed_once = False


def note(kind: str, **fields) -> None:
    """Append one event of ``kind`` ("check", "error", "cluster", "preflight") to the record.

    Never raises: the learner's cell goes on. A failure to record prints one line on stderr, once per
    process.
    """
    global _failed_once
    try:
        from ppkit.progress import record

        record.append(kind, **fields)
    except Exception as exc:  # noqa: BLE001 - a record is never worth a learner's cell
        if not _failed_once:
            _failed_once = True
            from ppkit.progress.format import DIR_ENV, SWITCH_ENV

            print(f"(ppkit could not write your progress record: {type(exc).__name__}: {exc}. Your work is not "
                  f"affected; set {DIR_ENV} to a writable folder, or {SWITCH_ENV}=off to stop recording)",
                  file=sys.stderr)
