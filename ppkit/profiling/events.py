"""A rank's ``torch.profiler`` events, rebuilt in the kernel from its trace, as torch's own EventList.

``prof.events()`` on the rank would send the same, but it costs most of what profiling costs: building
it took 0.8 s per rank for 30 small DDP steps, and pickling it 6 MB (docs/benchmarks.md). A rank sends
only its Chrome trace; the EventList is built from it when ``Profile.ranks[r]`` is first read, so
``key_averages()``, ``table()`` and ``self_cpu_time_total`` work as on the rank."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping

KINDS = {"cpu_op": {}, "user_annotation": {"is_user_annotation": True},
         "python_function": {"is_python_function": True}}


def event_list(trace: dict):
    """torch's EventList of the trace's CPU ops, nested by time on each thread as the profiler nests them;
    its ``export_chrome_trace(path)`` writes what the list holds: the rank's own trace, as the rank's profiler
    would have, while it holds every op; a list filtered or cut down, only the ops it holds (``_Source``)."""
    from torch.autograd.profiler_util import FunctionEvent

    built, source = [], _Source(trace)
    for raw in trace.get("traceEvents", []):
        if raw.get("ph") != "X" or raw.get("cat") not in KINDS:
            continue
        args = raw.get("args", {})
        start = float(raw["ts"])
        built.append(FunctionEvent(
            id=len(built), name=str(raw.get("name", "")), thread=int(raw.get("tid", 0)), start_us=start,
            end_us=start + float(raw.get("dur", 0.0)), input_shapes=args.get("Input Dims"), stack=[],
            sequence_nr=int(args.get("Sequence number", -1)), **KINDS[raw["cat"]]))
        built[-1].ppkit_source = (source, raw)
    source.count = len(built)
    events = _rank_event_list()(built)
    events._build_tree()  # children and self times, by time on each thread
    return events


class _Source:
    """The trace that events were rebuilt from, and how many were (each event holds it with its raw event)."""

    def __init__(self, trace: dict):
        self.trace, self.count = trace, 0

    def written(self, raws: list[dict]) -> dict:
        """The trace to write for a list that holds ``raws``: the whole trace where they are all its ops (in
        any order), else its metadata (threads' names, ``distributedInfo``) and only these ops; flows and
        instant events are left out, as they may join ops the list no longer holds."""
        if len({id(raw) for raw in raws}) == len(raws) == self.count:
            return self.trace
        kept = [e for e in self.trace.get("traceEvents", []) if e.get("ph") == "M"]
        return {**self.trace, "traceEvents": kept + raws}


@functools.cache
def _rank_event_list():
    """torch's EventList whose ``export_chrome_trace`` writes the ops it holds from the trace they were rebuilt
    from (torch's own writes only the events it made itself, and of these rebuilt ones an empty list: ``[``)."""
    from torch.autograd.profiler_util import EventList

    class RankEventList(EventList):
        def export_chrome_trace(self, path):
            sources = [getattr(event, "ppkit_source", None) for event in self]
            if not sources:
                written = {"traceEvents": []}
            elif None in sources or len({id(source) for source, _ in sources}) > 1:
                raise ValueError(
                    "this event list holds events that were not rebuilt from one rank's trace (events of "
                    "several ranks, or events made elsewhere), so no one trace says what it holds. Export each "
                    "rank's list on its own: prof.ranks[r].export_chrome_trace(path), or a list filtered from it.")
            else:
                written = sources[0][0].written([raw for _, raw in sources])
            with open(path, "w", encoding="utf-8") as file:
                json.dump(written, file)

    return RankEventList


class RankEvents(Mapping):
    """``Profile.ranks``: rank -> its EventList, built on first read."""

    def __init__(self, traces: dict[int, dict]):
        self._traces = dict(sorted(traces.items()))
        self._built: dict[int, object] = {}

    def __getitem__(self, rank: int):
        if rank not in self._built:
            self._built[rank] = event_list(self._traces[rank])
        return self._built[rank]

    def __iter__(self):
        return iter(self._traces)

    def __len__(self) -> int:
        return len(self._traces)

    def __repr__(self) -> str:
        return f"<the torch.profiler events of ranks {list(self._traces)}: ranks[r].key_averages().table()>"
