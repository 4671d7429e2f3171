"""The collective doctor's readings of one job's ranks (jobs.py): on demand, asking the ranks that can still
answer for their flight records (a hang, a failure, a timeout, an interrupt), and the check at the end of a last
job that completed on every rank (ppkit.spawn, torchrun), from the records the ranks sent with their answers."""

from __future__ import annotations

from ppkit.cluster import hang_doctor
from ppkit.cluster.hang_doctor import outcomes
from ppkit.transport.messages import Result


def reading(send, inbox, world_size: int, results: dict, records: dict, exited: set[int], last: bool,
            ended: dict | None = None) -> hang_doctor.Diagnosis:
    """The collective doctor's reading of every rank's flight record (ppkit/cluster/hang_doctor/)."""
    finished, failed = outcomes.of_results(results, last)
    finished.update({r: "its process exited with status 0 before its job returned" for r in exited})
    gone = set(ended or {}) | ({r for r, m in results.items() if isinstance(m, Result) and m.ok}
                               if last else set())  # their processes ended: none would answer
    records = hang_doctor.ask_records(send, inbox, [r for r in range(world_size) if r not in gone], records)
    return hang_doctor.diagnose(records, world_size, {**finished, **(ended or {})}, failed)


def look_after(records: dict, results: dict, world_size: int, last: bool, flush) -> hang_doctor.Diagnosis | None:
    """A last job (ppkit.spawn, torchrun) that completed on every rank: the doctor compares the records each
    rank sent with its answer, once, and speaks only where they show a problem. gloo checks neither the
    reduce op nor the root, so such a run completes with numbers no rank asked for. Not after a cluster's
    job: its ranks would have to be asked (measured: 0.17 s more on a job of 200 all_reduces, 35 %).
    None where it did not look; ``flush``: the job's printer's, before the doctor speaks."""
    if not last or len(records) < world_size:
        return None  # a rank's record is missing: nothing to compare it with
    if not any(record.get("calls") for record in records.values()):
        return None  # no collective: nothing to compare
    finished, failed = outcomes.of_results(results, last)
    diagnosis = hang_doctor.diagnose(dict(records), world_size, finished, failed)
    if diagnosis.problem:  # collective_doctor() afterwards gives this reading too (JobRunner.last_diagnosis)
        flush()
        print("[ppkit] every rank's job completed, but the collective doctor finds a problem in their records:\n"
              + str(diagnosis), end="", flush=True)
    return diagnosis
