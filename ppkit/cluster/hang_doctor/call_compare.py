"""Two ranks' calls at one sequence number compared: torch's matcher, then the API, reduce op and root."""

from __future__ import annotations

KINDS = {"COLLECTIVE_TYPE_MISMATCH": "the op differs", "SIZE_OR_SYNTAX_MISMATCH": "the sizes differ",
         "COLLECTIVE_DTYPE_MISMATCH": "the dtypes differ"}
REDUCE_OP = "the reduce op differs"
# what each of the matcher's verdicts compares: where both ranks' calls agree on it, the verdict is about one
# call on its own (torch's numel rule for all_gather_into_tensor as gloo records it), not a difference
COMPARED = {"COLLECTIVE_TYPE_MISMATCH": ("profiling_name",), "SIZE_OR_SYNTAX_MISMATCH": ("input_sizes", "output_sizes"),
            "COLLECTIVE_DTYPE_MISMATCH": ("input_dtypes", "output_dtypes")}


def _compare(a: dict, b: dict, group: str, ranks: list[int]) -> tuple[str, str]:
    """What differs between two ranks' calls at one sequence number, by torch's matcher."""
    try:
        from torch.distributed.flight_recorder.components.utils import match_one_event

        info = match_one_event(_event(a), _event(b), {group: set(ranks)}, group)
        state = info.state.name
        found = KINDS.get(state, ""), (getattr(info, "culprit", None) or "") if state in KINDS else ""
        if state in COMPARED and all(a[key] == b[key] for key in COMPARED[state]):
            found = "", ""  # the matcher's check of one call on its own (a numel rule): the ranks' calls agree
    except (ImportError, AssertionError, KeyError, IndexError, ValueError):  # an op torch's matcher does not know
        found = next(((words, "") for key, words in (("op", "the op differs"), ("input_sizes", "the sizes differ"),
                                                     ("input_dtypes", "the dtypes differ")) if a[key] != b[key]),
                     ("", ""))
    if not found[0] and a.get("api") and b.get("api") and a["api"] != b["api"]:
        return "the op differs", ""  # the learner's calls differ where the backend records the same op
    if not found[0] and a.get("reduce_op") and b.get("reduce_op") and a["reduce_op"] != b["reduce_op"]:
        return REDUCE_OP, ""
    if not found[0] and a.get("root") is not None and b.get("root") is not None and a["root"] != b["root"]:
        return "the root differs", ""
    return found


def _event(call: dict) -> dict:
    """A call as torch's matcher reads a flight-record entry (the state left out: one rank's
    collective may have failed where the other's still waits)."""
    return {"profiling_name": call["profiling_name"], "state": "scheduled",
            "process_group": (call["group"], call["desc"]), "input_sizes": call["input_sizes"],
            "output_sizes": call["output_sizes"], "collective_seq_id": call["seq"],
            "p2p_seq_id": call["p2p_seq"], "input_dtypes": call["input_dtypes"],
            "output_dtypes": call["output_dtypes"], "time_created_ns": call["time_created_ns"]}
