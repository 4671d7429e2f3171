"""The records the doctor read, written as torch's flight-recorder dump files: one per rank, which
``python -m torch.distributed.flight_recorder.fr_trace FOLDER`` reads.

A rank sends the kernel a plain-JSON summary of torch's record (transport/flight_record.py); this
writes it back in the pickled form of torch's own dumps (``_dump_fr_trace``), with what fr_trace needs
and the summary lacks filled in plainly (no stack frames, record ids in order). gloo's own dumps file
the default group's config under ``''`` while their entries name it ``'0'``, which stops fr_trace with
``KeyError: ('0', 0)``; here each group's config is filed under the name its entries use.
"""

from __future__ import annotations

import os
import pickle

FORMAT = "2.10"  # the "version" field torch 2.14's flight recorder writes in its dumps
PREFIX = "rank_"  # fr_trace finds the rank in each file's name after a common prefix


def write(records: dict[int, dict], world_size: int, folder: str, prefix: str = PREFIX) -> list[str]:
    """Write ``records`` (rank -> the doctor's record) into ``folder`` as ``{prefix}{rank}``; their paths."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for rank, record in sorted(records.items()):
        path = os.path.join(folder, f"{prefix}{rank}")
        with open(path, "wb") as file:
            pickle.dump(dump(rank, record, world_size), file)
        paths.append(path)
    return paths


def dump(rank: int, record: dict, world_size: int) -> dict:
    """One rank's record as torch's dump: its groups' config and its entries."""
    config = {name: {"name": name, "desc": info.get("desc", ""), "ranks": str(list(info.get("ranks", [])))}
              for name, info in record.get("groups", {}).items()}
    calls = sorted(record.get("calls", []), key=lambda call: call["time_created_ns"])
    for call in calls:  # a group this rank no longer has (destroyed): the whole world, as the doctor assumes
        config.setdefault(call["group"], {"name": call["group"], "desc": call["desc"],
                                          "ranks": str(list(range(world_size)))})
    return {"version": FORMAT, "rank": rank, "comm_lib_version": "", "pg_config": config, "pg_status": {},
            "entries": [_entry(index, call) for index, call in enumerate(calls)]}


def _entry(index: int, call: dict) -> dict:
    return {"record_id": index, "pg_id": int(call["group"]) if call["group"].isdigit() else 0,
            "process_group": (call["group"], call["desc"]), "collective_seq_id": call["seq"],
            "p2p_seq_id": call["p2p_seq"], "op_id": call["seq"], "profiling_name": call["profiling_name"],
            "time_created_ns": call["time_created_ns"], "input_sizes": call["input_sizes"],
            "input_dtypes": call["input_dtypes"], "output_sizes": call["output_sizes"],
            "output_dtypes": call["output_dtypes"], "state": call["state"], "retired": call["done"],
            "is_p2p": call["is_p2p"], "timeout_ms": 0, "frames": _frames(call.get("at")), "thread_name": "",
            "thread_id": "",
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None}


def _frames(at: dict | None) -> list[dict]:
    """The learner's line that made the call, where the record has it, as torch's dumps give a frame."""
    if not at:
        return []
    return [{"name": at.get("func", ""), "filename": at["file"], "line": at["line"]}]
