"""The collective doctor: when ranks disagree on a collective, which one and how, in plain words.

Each rank keeps torch's flight record of its collectives (ppkit/transport/flight_record.py). The
kernel gathers them over ppkit's own channel (gather.py: never a port, never torch's HTTP debug
server), matches them per process group with torch's own matcher where it fits (analysis.py) and
says (report.py): the last collective every rank completed (counted over each rank's whole
record); a difference among calls that completed; for the first call not completed, each rank's
call (the learner's API name beside the backend's op, sequence number, sizes, dtype, reduce op,
root, line) and which ranks have not reached it, and where they are instead; and send/recv waits
that form a cycle, tags included. Only each group's present lifetime counts: torch's record
outlives destroy_process_group.

It runs when the hang watch looks (hang_watch.py), when a run fails, times out or is interrupted while
ranks wait (jobs.py), once after a ppkit.spawn or torchrun run that completed (it speaks only if it finds a
problem: gloo checks neither reduce ops nor roots), and on demand: ``ppkit.collective_doctor(cluster)``
(on_demand.py). How each rank's job ended tells a rank that raised or finished from one still computing
(outcomes.py). The records it read travel on the run's error and can be written as torch's dump files
for fr_trace (fr_dumps.py).
"""

from __future__ import annotations

from ppkit.cluster.hang_doctor.analysis import Diagnosis, diagnose
from ppkit.cluster.hang_doctor.gather import WAIT_S, ask_records, last_words, parse, progress, waits_on_peers

__all__ = ["WAIT_S", "Diagnosis", "ask_records", "diagnose", "last_words", "parse", "progress", "waits_on_peers"]
